//! The cloud process: the embedded cluster, CloudHub with its WebSocket server,
//! EdgeController, and the admin endpoint with the connected nodes.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, HttpResponse};
use anyhow::Context as _;
use edgehive_actors::cloud::cloudhub::{
    start_cloudhub, CloudHub, CloudHubServer, ListNodes, NodeInfo, CLOUDHUB_MODULE,
};
use edgehive_actors::cloud::cluster::EmbeddedCluster;
use edgehive_actors::cloud::edgecontroller::EdgeControllerModule;
use edgehive_actors::hive::{Hive, HiveError};
use serde_json::json;

use crate::admin::AdminServer;
use crate::config::CloudConfig;

/// A running cloud process.
#[derive(Debug)]
pub struct CloudProcess {
    hive: Hive,
    cluster: EmbeddedCluster,
    hub: CloudHubServer,
    admin: AdminServer,
}

impl CloudProcess {
    /// Starts the cloud described by `config` on the embedded cluster, seeded from the
    /// manifests in `manifests` if given; must run inside an actix system.
    pub async fn start(config: &CloudConfig, manifests: Option<&Path>) -> anyhow::Result<Self> {
        let cluster = EmbeddedCluster::new();
        if let Some(dir) = manifests {
            let loaded = cluster
                .load_manifests(dir)
                .with_context(|| format!("cannot load manifests from {}", dir.display()))?;
            tracing::info!(objects = loaded, dir = %dir.display(), "manifests loaded");
        }
        let hive = Hive::new("cloud");
        let hub = start_cloudhub(&hive, config.modules.cloud_hub.options())
            .await
            .context("cannot start cloudhub")?;
        if config.modules.edge_controller.enable {
            hive.start_module(EdgeControllerModule::new(&hive, cluster.clone()))?;
        }
        let routes_hive = hive.clone();
        let admin = AdminServer::start(
            &config.common_config.monitor_server.bind_address,
            hive.clone(),
            Arc::new(move |routes: &mut web::ServiceConfig| {
                routes
                    .app_data(web::Data::new(routes_hive.clone()))
                    .route("/api/v1/nodes", web::get().to(list_nodes));
            }),
        )?;
        tracing::info!(websocket = %hub.local_addr(), admin = %admin.addr(), "cloud started");
        Ok(CloudProcess {
            hive,
            cluster,
            hub,
            admin,
        })
    }

    /// The cluster the controllers read (the embedded one).
    pub fn cluster(&self) -> &EmbeddedCluster {
        &self.cluster
    }

    /// The cloud's hive.
    pub fn hive(&self) -> &Hive {
        &self.hive
    }

    /// Where edges connect.
    pub fn websocket_addr(&self) -> SocketAddr {
        self.hub.local_addr()
    }

    /// Where the admin endpoint listens.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.addr()
    }

    /// Every node CloudHub knows: connected ones and ones with queued messages.
    pub async fn nodes(&self) -> Result<Vec<NodeInfo>, HiveError> {
        nodes(&self.hive).await
    }

    /// Stops the WebSocket server, the modules and the admin endpoint.
    pub async fn stop(self) {
        self.hub.stop(false).await;
        self.hive.shutdown();
        self.admin.stop().await;
    }
}

async fn nodes(hive: &Hive) -> Result<Vec<NodeInfo>, HiveError> {
    hive.call::<CloudHub, _>(CLOUDHUB_MODULE, ListNodes, Duration::from_secs(5))
        .await
}

/// `GET /api/v1/nodes`: nodes with their queues, in-flight message and last keepalive.
async fn list_nodes(hive: web::Data<Hive>) -> HttpResponse {
    match nodes(&hive).await {
        Ok(nodes) => HttpResponse::Ok().json(json!({ "nodes": nodes })),
        Err(error) => HttpResponse::ServiceUnavailable().body(format!("{error}\n")),
    }
}
