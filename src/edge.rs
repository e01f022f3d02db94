//! The edge process: EdgeHub and MetaManager on one hive, the SQLite store, and the admin
//! endpoint with the stored metadata.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, HttpResponse};
use anyhow::Context as _;
use edgehive_actors::edge::edgehub::{
    self, EdgeHub, EdgeHubModule, EdgeHubStatus, GetEdgeHubStatus,
};
use edgehive_actors::edge::metamanager::MetaManagerModule;
use edgehive_actors::edge::store::MetaStore;
use edgehive_actors::hive::Hive;
use serde::Deserialize;
use serde_json::json;

use crate::admin::AdminServer;
use crate::config::EdgeConfig;

/// A running edge process.
#[derive(Debug)]
pub struct EdgeProcess {
    hive: Hive,
    store: MetaStore,
    admin: AdminServer,
    node_name: String,
}

impl EdgeProcess {
    /// Starts the edge described by `config`; must run inside an actix system.
    pub async fn start(config: &EdgeConfig) -> anyhow::Result<Self> {
        Self::start_with(config, |_| Ok(())).await
    }

    /// Starts the edge, then lets `plug` start extension modules on its hive.
    pub async fn start_with(
        config: &EdgeConfig,
        plug: impl FnOnce(&Hive) -> anyhow::Result<()>,
    ) -> anyhow::Result<Self> {
        let node_name = config.node_name().to_owned();
        let hive = Hive::new(&node_name);
        let store = MetaStore::open(&config.database.data_source)
            .with_context(|| format!("edge {node_name}: cannot open the store"))?;
        if config.modules.meta_manager.enable {
            hive.start_module(
                MetaManagerModule::new(store.clone())
                    .with_remote_query_timeout(config.remote_query_timeout()),
            )?;
        }
        if config.modules.edge_hub.websocket.enable {
            hive.start_module(EdgeHubModule::new(config.edge_hub_options()))?;
        }
        plug(&hive)?;
        let routes_store = store.clone();
        let routes_hive = hive.clone();
        let admin = AdminServer::start(
            &config.admin.bind_address,
            hive.clone(),
            Arc::new(move |routes: &mut web::ServiceConfig| {
                routes
                    .app_data(web::Data::new(routes_store.clone()))
                    .app_data(web::Data::new(routes_hive.clone()))
                    .route("/api/v1/meta", web::get().to(list_meta))
                    .route("/api/v1/meta/{ns}/{type}/{name}", web::get().to(get_meta))
                    .route("/api/v1/edgehub", web::get().to(edgehub_status));
            }),
        )?;
        tracing::info!(node = %node_name, admin = %admin.addr(), "edge started");
        Ok(EdgeProcess {
            hive,
            store,
            admin,
            node_name,
        })
    }

    /// The node name this edge connects as.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// The edge's hive.
    pub fn hive(&self) -> &Hive {
        &self.hive
    }

    /// The edge's SQLite store.
    pub fn store(&self) -> &MetaStore {
        &self.store
    }

    /// Where the admin endpoint listens.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.addr()
    }

    /// EdgeHub's connection state.
    pub async fn status(&self) -> anyhow::Result<EdgeHubStatus> {
        Ok(hub_status(&self.hive).await?)
    }

    /// Stops the modules (closing the connection to the cloud) and the admin endpoint.
    pub async fn stop(self) {
        self.hive.shutdown();
        self.admin.stop().await;
    }
}

async fn hub_status(hive: &Hive) -> Result<EdgeHubStatus, edgehive_actors::hive::HiveError> {
    hive.call::<EdgeHub, _>(
        edgehub::MODULE_NAME,
        GetEdgeHubStatus,
        Duration::from_secs(5),
    )
    .await
}

#[derive(Deserialize)]
struct MetaQuery {
    #[serde(rename = "type")]
    resource_type: Option<String>,
}

/// `GET /api/v1/meta[?type=pod]`: the stored objects.
async fn list_meta(store: web::Data<MetaStore>, query: web::Query<MetaQuery>) -> HttpResponse {
    match store.list(query.into_inner().resource_type).await {
        Ok(rows) => HttpResponse::Ok().json(json!({ "items": rows })),
        Err(error) => HttpResponse::InternalServerError().body(format!("store: {error}\n")),
    }
}

/// `GET /api/v1/meta/{ns}/{type}/{name}`: one stored object.
async fn get_meta(
    store: web::Data<MetaStore>,
    path: web::Path<(String, String, String)>,
) -> HttpResponse {
    let (namespace, resource_type, name) = path.into_inner();
    let key = format!("{namespace}/{resource_type}/{name}");
    match store.get(key.clone()).await {
        Ok(Some(row)) => HttpResponse::Ok().json(row),
        Ok(None) => HttpResponse::NotFound().body(format!("{key} is not stored\n")),
        Err(error) => HttpResponse::InternalServerError().body(format!("store: {error}\n")),
    }
}

/// `GET /api/v1/edgehub`: the connection to the cloud.
async fn edgehub_status(hive: web::Data<Hive>) -> HttpResponse {
    match hub_status(&hive).await {
        Ok(status) => HttpResponse::Ok().json(status),
        Err(error) => HttpResponse::ServiceUnavailable().body(format!("{error}\n")),
    }
}
