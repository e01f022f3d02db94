//! The cloud process: the cluster (embedded, or a Kubernetes API server when
//! `kubeAPIConfig` says so), CloudHub with its WebSocket server (mutual TLS unless
//! `insecurePlaintext`) and certificate server, EdgeController and DeviceController, and the
//! admin endpoint with the connected nodes.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, HttpResponse};
use anyhow::Context as _;
use edgehive_actors::cloud::cloudhub::BindingMirror;
use edgehive_actors::cloud::cloudhub::BindingView;
use edgehive_actors::cloud::cloudhub::CertServer;
use edgehive_actors::cloud::cloudhub::{
    start_cloudhub_with, CloudHubSecurity, CloudHubServer, ListNodes, NodeInfo, CLOUDHUB_MODULE,
};
use edgehive_actors::cloud::cluster::kube::{KubeCluster, DEVICE_KINDS, NODE_GROUP_KINDS};
use edgehive_actors::cloud::cluster::{ClusterError, EmbeddedCluster, SharedCluster};
use edgehive_actors::cloud::controllermanager::NodeGroupControllerModule;
use edgehive_actors::cloud::devicecontroller::DeviceControllerModule;
use edgehive_actors::cloud::dynamiccontroller::DynamicControllerModule;
use edgehive_actors::cloud::edgecontroller::EdgeControllerModule;
use edgehive_actors::cloud::synccontroller::{
    SyncControllerModule, SyncView, WriteRecords, SYNCCONTROLLER_MODULE,
};
use edgehive_actors::hive::{Hive, HiveError};
use edgehive_actors::identity::tls::CloudTls;
use edgehive_actors::identity::token;
use serde_json::json;

use crate::admin::{AdminAccess, AdminRefusals, AdminServer};
use crate::cloud_secrets;
use crate::config::CloudConfig;
use crate::plug::Plug;

/// Starts CloudStream when `modules.cloudStream.enable` is on: it needs the cloud's TLS (the
/// node is its certificate) and the API server's client CA (`tlsStreamCAFile`).
fn start_cloud_stream(
    hive: &Hive,
    config: &CloudConfig,
    tls: Option<&CloudTls>,
    hub: &CloudHubServer,
) -> anyhow::Result<Option<edgehive_actors::cloud::cloudstream::CloudStreamServer>> {
    let stream = &config.modules.cloud_stream;
    if !stream.enable {
        return Ok(None);
    }
    let Some(tls) = tls else {
        anyhow::bail!(
            "modules.cloudStream.enable needs TLS: it cannot run with modules.cloudHub.websocket.insecurePlaintext"
        );
    };
    let ca = edgehive_actors::identity::certs::read_pem(&stream.tls_stream_ca_file, "CERTIFICATE")
        .with_context(|| {
            format!(
                "modules.cloudStream.tlsStreamCAFile: cannot read the API server's client CA {}",
                stream.tls_stream_ca_file.display()
            )
        })?;
    let options = stream.options(config.modules.cloud_hub.handshake_limits());
    let server = edgehive_actors::cloud::cloudstream::start_cloudstream_with(
        hive,
        options,
        tls,
        &ca,
        hub.gate_metrics(),
        forwarding(hive, config, tls)?,
    )
    .context("cannot start cloudstream")?;
    Ok(Some(server))
}

/// A replica's forwarding (`modules.cloudHub.replica.forwardPort`, not 0): its certificate
/// from the shared CA, made now, and its bounds. `None` for a process alone or with the
/// forward port 0.
fn forwarding(
    hive: &Hive,
    config: &CloudConfig,
    tls: &CloudTls,
) -> anyhow::Result<Option<edgehive_actors::cloud::cloudstream::Forwarding>> {
    let replica = &config.modules.cloud_hub.replica;
    let ownership = edgehive_actors::cloud::ownership::Ownership::of(hive);
    let Some(identity) = ownership.identity() else {
        return Ok(None);
    };
    if replica.forward_port == 0 {
        return Ok(None);
    }
    let credentials = edgehive_actors::identity::tls::ReplicaCredentials::issue(&tls.ca, identity)
        .context("cannot make this replica's certificate from the cloud CA")?;
    let admin_hive = hive.clone();
    Ok(Some(edgehive_actors::cloud::cloudstream::Forwarding {
        credentials: Arc::new(credentials),
        port: replica.forward_port,
        max_forwards: replica.max_forwards,
        dial_timeout: Duration::from_secs(replica.forward_dial_timeout_seconds),
        node_admin: Arc::new(move |node: String| {
            let hive = admin_hive.clone();
            Box::pin(async move {
                let (status, body) = local_sync_view(&hive, Some(node)).await;
                (status, web::Bytes::from(body))
            })
        }),
    }))
}

/// A running cloud process.
pub struct CloudProcess {
    hive: Hive,
    /// The embedded cluster, when the controllers run on it.
    embedded: Option<EmbeddedCluster>,
    /// What the controllers read and write.
    cluster: SharedCluster,
    hub: CloudHubServer,
    admin: AdminServer,
    tls: Option<Arc<CloudTls>>,
    cert_server: Option<CertServer>,
    /// CloudStream's tunnel and stream servers (`modules.cloudStream.enable`).
    cloud_stream: Option<edgehive_actors::cloud::cloudstream::CloudStreamServer>,
    token_refresh: Duration,
    /// SyncController's thread, kept for the process's life.
    _sync_arbiter: Option<actix::Arbiter>,
}

impl std::fmt::Debug for CloudProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudProcess")
            .field("cluster", &self.cluster.adapter())
            .field("hub", &self.hub)
            .field("admin", &self.admin)
            .finish_non_exhaustive()
    }
}

impl CloudProcess {
    /// Starts the cloud described by `config`: on the Kubernetes API server its
    /// `kubeAPIConfig` names, or else on the embedded cluster seeded from the manifests in
    /// `manifests` if given; must run inside an actix system.
    ///
    /// Fails before anything listens if the API server is unreachable or lacks a CRD the
    /// enabled controllers need; the error says which and how to install it.
    pub async fn start(config: &CloudConfig, manifests: Option<&Path>) -> anyhow::Result<Self> {
        Self::start_with(config, manifests, |_| Ok(())).await
    }

    /// [`Self::start`], then lets `plug` start extension modules on the cloud's hive once the
    /// built-in modules run, each reading its section `modules.<name>` ([`Plug`]); fails if the
    /// config has an extension section none of them reads. Extensions talk to edges through
    /// `edgehive_actors::cloud::contract::extension` (docs/extending.md).
    pub async fn start_with(
        config: &CloudConfig,
        manifests: Option<&Path>,
        plug: impl FnOnce(&Plug) -> anyhow::Result<()>,
    ) -> anyhow::Result<Self> {
        let kube_options = config.kube_api_config.kube_options();
        let (embedded, cluster): (Option<EmbeddedCluster>, SharedCluster) = match &kube_options {
            Some(options) => {
                if manifests.is_some() {
                    anyhow::bail!(
                        "--manifests seeds the embedded cluster, but kubeAPIConfig points at a \
                             Kubernetes API server: apply them with kubectl instead"
                    );
                }
                let mut required: Vec<&str> = Vec::new();
                if config.modules.device_controller.enable {
                    required.extend_from_slice(DEVICE_KINDS);
                }
                if config.modules.node_group_controller.enable {
                    required.extend_from_slice(NODE_GROUP_KINDS);
                }
                if config.modules.sync_controller.enable {
                    // KubeEdge's reliable-sync CRDs, as cloudcore needs them.
                    required.extend_from_slice(&["ObjectSync", "ClusterObjectSync"]);
                }
                let kube = KubeCluster::connect(options, &required)
                    .await
                    .context("cannot start on the Kubernetes API server")?;
                (None, std::sync::Arc::new(kube))
            }
            None => {
                let database = &config.embedded_cluster.database;
                let cluster = if database.as_os_str().is_empty() {
                    EmbeddedCluster::new()
                } else {
                    let cluster = EmbeddedCluster::open(database).with_context(|| {
                        format!(
                            "cannot open the embedded cluster's datastore {} \
                                 (embeddedCluster.database)",
                            database.display()
                        )
                    })?;
                    tracing::info!(objects = cluster.len(), database = %database.display(), "embedded cluster opened");
                    cluster
                };
                cluster.set_event_retention(config.embedded_cluster.event_retention());
                cluster.set_limits(
                    config
                        .embedded_cluster
                        .store_limits(&config.modules.cloud_hub),
                );
                let sweeper = cluster.clone();
                actix_rt::spawn(async move {
                    // Events past their time go even when no new one is created.
                    let mut every = tokio::time::interval(EVENT_SWEEP);
                    loop {
                        every.tick().await;
                        sweeper.expire_events();
                    }
                });
                if let Some(dir) = manifests {
                    let loaded = cluster
                        .load_manifests(dir)
                        .with_context(|| format!("cannot load manifests from {}", dir.display()))?;
                    tracing::info!(objects = loaded, dir = %dir.display(), "manifests loaded");
                }
                (Some(cluster.clone()), std::sync::Arc::new(cluster))
            }
        };
        let hive = Hive::new("cloud");
        let hub_config = &config.modules.cloud_hub;
        // The embedded cluster answers authorization checks directly and exactly; a real API
        // server is read asynchronously, so CloudHub gets a mirror of its pod bindings.
        let view: Arc<dyn BindingView> = match &embedded {
            Some(embedded) => Arc::new(embedded.clone()),
            None => Arc::new(BindingMirror::start(
                cluster.clone(),
                edgehive_actors::cloud::watcher::WatchMetrics::of(&hive),
            )),
        };
        let tls = if hub_config.websocket.insecure_plaintext {
            tracing::warn!("modules.cloudHub.websocket.insecurePlaintext: edges connect over plain ws:// with no certificates");
            None
        } else {
            let ips = hub_config.advertise_ips().map_err(|message| {
                anyhow::anyhow!("modules.cloudHub.advertiseAddress: {message}")
            })?;
            let files = hub_config.tls_files();
            // cloudcore's Secrets first, so a cloud replacing cloudcore keeps its CA.
            let (ca_from, cert_from) =
                cloud_secrets::adopt(&cluster, &files, &ips, &hub_config.dns_names)
                    .await
                    .context("cannot take the CA from cloudcore's Secrets")?;
            let tls = CloudTls::load_or_create(&files, &ips, &hub_config.dns_names)
                .context("cannot set up the cloud's certificates")?;
            tracing::info!(ca = ?ca_from, server_cert = ?cert_from, "cloud certificates ready");
            // ... and back into them, so cloudcore (or another edgehive) can take over.
            if let Err(error) =
                cloud_secrets::publish(&cluster, &files, hub_config.token_refresh()).await
            {
                tracing::warn!(
                    error = format!("{error:#}"),
                    "cannot write the CA, certificate and token to the kubeedge namespace's \
                     Secrets (casecret, cloudcoresecret, tokensecret); edges still join, but \
                     cloudcore could not take over from this cloud"
                );
            }
            cloud_secrets::keep_token_fresh(cluster.clone(), files, hub_config.token_refresh());
            Some(Arc::new(tls))
        };
        // One replica of several: it serves the nodes whose sessions open here (started before
        // CloudHub admits anyone, so no session is served without its claim).
        let replica = hub_config
            .replica_options()
            .map_err(|message| anyhow::anyhow!("modules.cloudHub.replica: {message}"))?;
        if let Some(options) = replica {
            if embedded.is_some() {
                anyhow::bail!(
                    "modules.cloudHub.replica.enable needs kubeAPIConfig: replicas share a \
                     Kubernetes cluster, and the embedded cluster belongs to one process"
                );
            }
            // The replica's own Lease on a client of its own (its own kept-alive connection),
            // so a renewal never waits behind the node-Lease and record writes on `cluster`'s.
            let lease_cluster: SharedCluster = match &kube_options {
                Some(kube) => std::sync::Arc::new(KubeCluster::connect(kube, &[]).await.context(
                    "cannot open the replica's Lease connection to the Kubernetes API server",
                )?),
                None => cluster.clone(),
            };
            edgehive_actors::cloud::ownership::start_replica(
                &hive,
                cluster.clone(),
                lease_cluster,
                options,
            )
            .await?;
        }
        let security = CloudHubSecurity {
            tls: tls.clone(),
            authorize: hub_config.authorization.enable,
            view: Some(view.clone()),
        };
        let hub = start_cloudhub_with(&hive, hub_config.options(), security)
            .await
            .context("cannot start cloudhub")?;
        let cert_server = match &tls {
            Some(tls) if hub_config.https.enable => Some(
                CertServer::start(
                    tls,
                    &hub_config.cert_server_options(hub.gate_metrics()),
                    Some(view.clone()),
                )
                .context("cannot start the certificate server")?,
            ),
            _ => None,
        };
        let cloud_stream = start_cloud_stream(&hive, config, tls.as_deref(), &hub)?;
        if config.modules.edge_controller.enable {
            hive.start_module(EdgeControllerModule::new(&hive, cluster.clone()))?;
        }
        if config.modules.device_controller.enable {
            hive.start_module(DeviceControllerModule::new(&hive, cluster.clone()))?;
        }
        if config.modules.node_group_controller.enable {
            hive.start_module(NodeGroupControllerModule::new(&hive, cluster.clone()))?;
        }
        let dynamic = &config.modules.dynamic_controller;
        if dynamic.enable {
            // It judges what a node may read by CloudHub's view of the bindings.
            let module = DynamicControllerModule::new(
                &hive,
                cluster.clone(),
                view.clone(),
                &dynamic.options(),
            )?;
            hive.start_module(module)?;
        }
        let sync = &config.modules.sync_controller;
        // SyncController on a thread of its own: its record writes (SQLite commits on the
        // embedded cluster, API calls on a real one) and its reconcile runs then never hold up
        // the thread that routes every delivery (CloudHub, the other controllers).
        let sync_arbiter = sync.enable.then(actix::Arbiter::new);
        if let Some(arbiter) = &sync_arbiter {
            hive.start_module_on(
                &arbiter.handle(),
                SyncControllerModule::new(
                    &hive,
                    cluster.clone(),
                    Duration::from_secs(sync.reconcile_interval),
                ),
            )?;
        }
        let extensions = Plug::new(&hive, &config.modules.extensions).with_cluster(cluster.clone());
        plug(&extensions)?;
        extensions.finish()?;
        let routes_hive = hive.clone();
        let routes_cluster = embedded.clone();
        let routes_streams = CloudStreams(cloud_stream.as_ref().map(|stream| stream.view()));
        let routes_node_admin = NodeAdmin(cloud_stream.as_ref().map(|stream| stream.node_admin()));
        let routes_groups = NodeGroupsView(
            config
                .modules
                .node_group_controller
                .enable
                .then(|| cluster.clone()),
        );
        let monitor = &config.common_config.monitor_server;
        let access = AdminAccess {
            allowed_hosts: monitor.allowed_hosts.clone(),
            token: AdminAccess::read_token(
                &monitor.token_file,
                "commonConfig.monitorServer.tokenFile",
            )?,
            guarded: None,
            unix_socket: None,
        };
        let listings = Listings(Arc::new(tokio::sync::Semaphore::new(LISTINGS_IN_FLIGHT)));
        let admin = AdminServer::start(
            &monitor.bind_address,
            hive.clone(),
            access,
            Arc::new(move |routes: &mut web::ServiceConfig| {
                routes
                    .app_data(web::Data::new(routes_hive.clone()))
                    .app_data(web::Data::new(routes_streams.clone()))
                    .app_data(web::Data::new(routes_node_admin.clone()))
                    .app_data(web::Data::new(routes_groups.clone()))
                    .route("/api/v1/nodes", web::get().to(list_nodes))
                    .route("/api/v1/nodegroups", web::get().to(list_node_groups))
                    .route("/api/v1/streams", web::get().to(list_streams))
                    .route("/api/v1/sync", web::get().to(sync_view))
                    .route("/api/v1/sync/{node}", web::get().to(sync_view));
                match &routes_cluster {
                    Some(cluster) => routes
                        .app_data(web::Data::new(cluster.clone()))
                        .app_data(web::Data::new(listings.clone()))
                        .app_data(web::PayloadConfig::new(MAX_APPLY_BYTES))
                        .route("/api/v1/apply", web::post().to(apply))
                        .route("/api/v1/objects/{kind}", web::get().to(list_objects))
                        .route(
                            "/api/v1/objects/{kind}/{namespace}/{name}",
                            web::delete().to(delete_object),
                        ),
                    None => routes
                        .route("/api/v1/apply", web::post().to(use_kubectl))
                        .route("/api/v1/objects/{kind}", web::get().to(use_kubectl))
                        .route(
                            "/api/v1/objects/{kind}/{namespace}/{name}",
                            web::delete().to(use_kubectl),
                        ),
                };
            }),
        )?;
        tracing::info!(websocket = %hub.local_addr(), admin = %admin.addr(), cluster = cluster.adapter(), "cloud started");
        Ok(CloudProcess {
            hive,
            embedded,
            cluster,
            hub,
            admin,
            tls,
            cert_server,
            cloud_stream,
            token_refresh: hub_config.token_refresh(),
            _sync_arbiter: sync_arbiter,
        })
    }

    /// The current join token for edges (`None` on plain `ws://`, where none is needed).
    pub fn join_token(&self) -> Option<String> {
        let tls = self.tls.as_ref()?;
        Some(token::join_token(
            &tls.ca,
            std::time::SystemTime::now(),
            self.token_refresh,
        ))
    }

    /// Where the certificate server listens, if it runs.
    pub fn cert_server_addr(&self) -> Option<SocketAddr> {
        self.cert_server.as_ref().map(CertServer::local_addr)
    }

    /// CloudStream's servers, when `modules.cloudStream.enable` is on.
    pub fn cloud_stream(&self) -> Option<&edgehive_actors::cloud::cloudstream::CloudStreamServer> {
        self.cloud_stream.as_ref()
    }

    /// Whether the WebSocket port requires mutual TLS.
    pub fn uses_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The embedded cluster the controllers read; `None` when they run on a Kubernetes API
    /// server (use [`Self::shared_cluster`] for either).
    pub fn cluster(&self) -> Option<&EmbeddedCluster> {
        self.embedded.as_ref()
    }

    /// The cluster the controllers read and write, whichever adapter it is.
    pub fn shared_cluster(&self) -> &SharedCluster {
        &self.cluster
    }

    /// The cloud's hive.
    pub fn hive(&self) -> &Hive {
        &self.hive
    }

    /// CloudHub's WebSocket server (and its in-process connector).
    pub fn hub(&self) -> &CloudHubServer {
        &self.hub
    }

    /// The address CloudHub's WebSocket server listens on.
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

    /// Stops the WebSocket server, CloudStream, the modules and the admin endpoint. The sync
    /// records not yet written are written first (for at most [`RECORDS_WRITE_WAIT`]), while
    /// this process still serves its nodes: whoever serves them next learns from those
    /// records what their edges hold, and deletes there what the cluster deleted meanwhile.
    pub async fn stop(self) {
        match self
            .hive
            .ask(SYNCCONTROLLER_MODULE, WriteRecords, RECORDS_WRITE_WAIT)
            .await
        {
            Ok(()) => tracing::info!("sync records written"),
            Err(error) => {
                tracing::warn!(%error, "stopping with sync records not written: the edges may keep objects deleted meanwhile")
            }
        }
        self.hub.stop(false).await;
        if let Some(cert_server) = &self.cert_server {
            cert_server.stop().await;
        }
        if let Some(cloud_stream) = &self.cloud_stream {
            cloud_stream.stop().await;
        }
        self.hive.shutdown();
        self.admin.stop().await;
    }
}

async fn nodes(hive: &Hive) -> Result<Vec<NodeInfo>, HiveError> {
    hive.ask(CLOUDHUB_MODULE, ListNodes, Duration::from_secs(5))
        .await
}

/// What `GET /api/v1/nodes` may be asked for.
#[derive(Debug, serde::Deserialize)]
struct NodesQuery {
    /// Only nodes whose name contains this (case-insensitive).
    filter: Option<String>,
    /// At most this many, troubled first ([`NodeInfo::by_trouble`]); all, by name, without.
    limit: Option<usize>,
}

/// `GET /api/v1/nodes[?filter=TEXT][&limit=N]`: nodes with their queues, in-flight message
/// and last keepalive, and how many there are (`total`, `connected`, `matched`), so a page
/// of 100,000 nodes can ask for the few it shows.
async fn list_nodes(
    hive: web::Data<Hive>,
    streams: web::Data<CloudStreams>,
    query: web::Query<NodesQuery>,
) -> HttpResponse {
    let mut nodes = match nodes(&hive).await {
        Ok(nodes) => nodes,
        Err(error) => return HttpResponse::ServiceUnavailable().body(format!("{error}\n")),
    };
    let total = nodes.len();
    let connected = nodes.iter().filter(|node| node.connected).count();
    if let Some(needle) = query.filter.as_deref().map(str::to_lowercase) {
        nodes.retain(|node| node.node.to_lowercase().contains(&needle));
    }
    let matched = nodes.len();
    if let Some(limit) = query.limit {
        nodes.sort_unstable_by(NodeInfo::by_trouble);
        nodes.truncate(limit);
    }
    let nodes: Vec<serde_json::Value> = nodes
        .into_iter()
        .map(|node| {
            let tunnel = streams.0.as_ref().map(|view| view.node(&node.node));
            let mut value = json!(node);
            if let (Some(object), Some(tunnel)) = (value.as_object_mut(), tunnel) {
                // Only with CloudStream on: null for a node without a stream tunnel.
                object.insert(
                    "streams".to_owned(),
                    json!(tunnel.map(|tunnel| json!({
                        "open": tunnel.open_streams,
                        "bytesToApiserver": tunnel.bytes_to_apiserver,
                    }))),
                );
            }
            value
        })
        .collect();
    HttpResponse::Ok().json(json!({
        "nodes": nodes,
        "total": total,
        "connected": connected,
        "matched": matched,
    }))
}

/// CloudStream's tunnels for the admin routes (`None` when `modules.cloudStream` is off).
#[derive(Clone)]
struct CloudStreams(Option<edgehive_actors::cloud::cloudstream::StreamsView>);

/// What `GET /api/v1/streams` may be asked for.
#[derive(Debug, serde::Deserialize)]
struct StreamsQuery {
    /// At most this many nodes, most open streams first (default 500).
    limit: Option<usize>,
}

/// The cluster the NodeGroups are read from, when the NodeGroup controller runs.
#[derive(Clone)]
struct NodeGroupsView(Option<SharedCluster>);

/// How long a stopping cloud waits for its sync records to be written (an API server that
/// refuses them does not hold the stop longer).
pub const RECORDS_WRITE_WAIT: Duration = Duration::from_secs(5);

/// The most nodes `GET /api/v1/nodegroups` lists per group (the counts cover them all).
const NODES_PER_GROUP: usize = 100;

/// `GET /api/v1/nodegroups`: each NodeGroup (by name) with how many nodes it selects, how
/// many are ready and selected, and its first [`NODES_PER_GROUP`] `status.nodeStatuses`
/// (not-ready and failed first); `enabled: false` when the NodeGroup controller is off.
async fn list_node_groups(view: web::Data<NodeGroupsView>) -> HttpResponse {
    let Some(cluster) = &view.0 else {
        return HttpResponse::Ok().json(json!({"enabled": false, "groups": []}));
    };
    let (mut groups, _) = match cluster.list("NodeGroup").await {
        Ok(listed) => listed,
        Err(error) => {
            return HttpResponse::ServiceUnavailable()
                .json(json!({"enabled": true, "error": error.to_string()}))
        }
    };
    groups.sort_by(|a, b| {
        a["metadata"]["name"]
            .as_str()
            .cmp(&b["metadata"]["name"].as_str())
    });
    let groups: Vec<serde_json::Value> = groups
        .iter()
        .map(|group| {
            let mut nodes: Vec<serde_json::Value> = group["status"]["nodeStatuses"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let ready = |node: &serde_json::Value| node["readyStatus"] == "Ready";
            let selected = |node: &serde_json::Value| node["selectionStatus"] == "Succeeded";
            let total = nodes.len();
            let ready_count = nodes.iter().filter(|n| ready(n)).count();
            let failed = nodes.iter().filter(|n| !selected(n)).count();
            nodes.sort_by_key(|node| (ready(node) && selected(node), node["nodeName"].to_string()));
            nodes.truncate(NODES_PER_GROUP);
            json!({
                "name": group["metadata"]["name"],
                "total": total,
                "ready": ready_count,
                "failed": failed,
                "nodes": nodes,
            })
        })
        .collect();
    HttpResponse::Ok().json(json!({"enabled": true, "groups": groups}))
}

/// `GET /api/v1/streams[?limit=N]`: each node with a stream tunnel (CloudStream), its open
/// streams and the bytes it has sent the API server, most streams first; `enabled: false`
/// when CloudStream is off.
async fn list_streams(
    streams: web::Data<CloudStreams>,
    query: web::Query<StreamsQuery>,
) -> HttpResponse {
    let Some(view) = &streams.0 else {
        return HttpResponse::Ok().json(json!({"enabled": false, "nodes": [], "tunnels": 0}));
    };
    let mut nodes = view.nodes();
    let tunnels = nodes.len();
    let open: usize = nodes.iter().map(|node| node.open_streams).sum();
    nodes.truncate(query.limit.unwrap_or(500));
    HttpResponse::Ok().json(json!({
        "enabled": true,
        "tunnels": tunnels,
        "openStreams": open,
        "nodes": nodes,
    }))
}

/// Where a replica's node admin requests are answered (`None` without CloudStream).
#[derive(Clone)]
struct NodeAdmin(Option<edgehive_actors::cloud::cloudstream::NodeAdminForwarder>);

/// `GET /api/v1/sync[/{node}]`: SyncController's records per node (with a node: its records
/// and their versions); 503 when SyncController is not running. On a replica, a node whose
/// edge is on another live replica is answered by that replica (forwarded, header
/// `Edgehive-Served-By`), and a node no live replica serves gets 502 saying why.
async fn sync_view(
    hive: web::Data<Hive>,
    forwarder: web::Data<NodeAdmin>,
    node: Option<web::Path<String>>,
) -> HttpResponse {
    use edgehive_actors::cloud::cloudstream::NodeAdminRoute;
    let node = node.map(web::Path::into_inner);
    if let (Some(node), Some(forwarder)) = (&node, &forwarder.0) {
        match forwarder.route(node).await {
            NodeAdminRoute::Here => {}
            NodeAdminRoute::Answered {
                replica,
                status,
                body,
            } => {
                return HttpResponse::build(status)
                    .content_type("application/json")
                    .insert_header(("Edgehive-Served-By", replica))
                    .body(body)
            }
            NodeAdminRoute::Refused { status, text } => {
                return HttpResponse::build(status)
                    .content_type("text/plain; charset=utf-8")
                    .body(text + "\n")
            }
        }
    }
    let (status, body) = local_sync_view(&hive, node).await;
    HttpResponse::build(status)
        .content_type(if status.is_success() {
            "application/json"
        } else {
            "text/plain; charset=utf-8"
        })
        .body(body)
}

/// This process's SyncController view (with a node: its records): the status and body.
async fn local_sync_view(
    hive: &Hive,
    node: Option<String>,
) -> (actix_web::http::StatusCode, Vec<u8>) {
    match hive
        .ask(
            SYNCCONTROLLER_MODULE,
            SyncView { node },
            Duration::from_secs(5),
        )
        .await
    {
        Ok(view) => match serde_json::to_vec(&view) {
            Ok(body) => (actix_web::http::StatusCode::OK, body),
            Err(error) => (
                actix_web::http::StatusCode::INTERNAL_SERVER_ERROR,
                format!("{error}\n").into_bytes(),
            ),
        },
        Err(error) => (
            actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
            format!("{error}\n").into_bytes(),
        ),
    }
}

/// How often the embedded cluster deletes events past `embeddedCluster.eventTTL`.
const EVENT_SWEEP: Duration = Duration::from_secs(60);

/// Largest body `POST /api/v1/apply` accepts.
pub const MAX_APPLY_BYTES: usize = 4 * 1024 * 1024;

fn cluster_error(error: &ClusterError) -> HttpResponse {
    let status = actix_web::http::StatusCode::from_u16(error.status())
        .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR);
    HttpResponse::build(status).json(json!({"error": error.to_string()}))
}

fn summary(obj: &serde_json::Value) -> serde_json::Value {
    json!({
        "kind": obj["kind"],
        "namespace": obj["metadata"]["namespace"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "resourceVersion": obj["metadata"]["resourceVersion"],
    })
}

/// `POST /api/v1/apply`: creates or replaces the objects in the body (YAML, several
/// documents and `kind: List` allowed, or JSON) in the embedded cluster.
async fn apply(cluster: web::Data<EmbeddedCluster>, body: web::Bytes) -> HttpResponse {
    let Ok(text) = std::str::from_utf8(&body) else {
        return HttpResponse::BadRequest().json(json!({"error": "the body is not UTF-8"}));
    };
    // YAML reads JSON too, but a JSON body gets JSON's error messages.
    let is_json = text.trim_start().starts_with('{');
    match cluster.apply_text(text, "request body", is_json) {
        Ok(applied) => {
            let applied: Vec<_> = applied.iter().map(summary).collect();
            HttpResponse::Ok().json(json!({ "applied": applied }))
        }
        Err(error) => cluster_error(&error),
    }
}

/// `POST /api/v1/apply` and `DELETE /api/v1/objects/...` when the cloud runs on a Kubernetes
/// API server: the cluster is changed with kubectl there, not through edgehive.
async fn use_kubectl() -> HttpResponse {
    HttpResponse::Conflict().json(json!({
        "error": "the cloud runs on a Kubernetes API server (kubeAPIConfig); change objects with kubectl"
    }))
}

/// How many listings (`GET /api/v1/objects/{kind}`) may be answered at once, their pages
/// still being sent included; beyond, 429 (counted as `busy`).
pub const LISTINGS_IN_FLIGHT: usize = 4;

/// Objects in a page of a listing when `?limit` is not given.
pub const DEFAULT_PAGE: usize = 500;

/// The most objects a page of a listing holds, whatever `?limit` asks.
pub const MAX_PAGE: usize = 1000;

/// A page ends once its objects reach this many bytes (of JSON), so a page of large objects
/// stays small too; `metadata.continue` goes on from there.
pub const MAX_PAGE_BYTES: usize = 8 * 1024 * 1024;

/// Permits for listings in flight.
#[derive(Clone)]
struct Listings(Arc<tokio::sync::Semaphore>);

/// What `GET /api/v1/objects/{kind}` may be asked for, as a Kubernetes list is.
#[derive(Debug, serde::Deserialize)]
struct ListQuery {
    /// At most this many objects (default [`DEFAULT_PAGE`], at most [`MAX_PAGE`]).
    limit: Option<usize>,
    /// `metadata.continue` of the previous page: the objects after its last one.
    #[serde(rename = "continue")]
    continue_token: Option<String>,
}

/// The continue token after the object `namespace/name`: the key, hex-encoded, so it passes in
/// a query string as it is.
fn continue_token(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
        .bytes()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// The `(namespace, name)` a continue token names, if it is one.
fn parse_continue(token: &str) -> Option<(String, String)> {
    if !token.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..token.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(token.get(at..at + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    let key = String::from_utf8(bytes).ok()?;
    let (namespace, name) = key.split_once('/')?;
    Some((namespace.to_owned(), name.to_owned()))
}

/// A response body that holds a listing's permit until it is sent (or the client leaves).
struct HeldBody {
    chunk: Option<web::Bytes>,
    size: u64,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl actix_web::body::MessageBody for HeldBody {
    type Error = std::convert::Infallible;

    fn size(&self) -> actix_web::body::BodySize {
        actix_web::body::BodySize::Sized(self.size)
    }

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<web::Bytes, Self::Error>>> {
        std::task::Poll::Ready(self.chunk.take().map(Ok))
    }
}

/// `GET /api/v1/objects/{kind}[?limit=N][&continue=TOKEN]`: a page of the objects of a kind in
/// the embedded cluster (kind without case, singular or plural), by namespace then name, as
/// `{"items": [...], "resourceVersion": ..., "metadata": {"continue": TOKEN}}`; `continue` is
/// there while more objects follow.
async fn list_objects(
    cluster: web::Data<EmbeddedCluster>,
    listings: web::Data<Listings>,
    refused: web::Data<AdminRefusals>,
    kind: web::Path<String>,
    query: web::Query<ListQuery>,
) -> HttpResponse {
    let Ok(permit) = listings.0.clone().try_acquire_owned() else {
        refused.count("busy");
        return HttpResponse::TooManyRequests()
            .insert_header(("Retry-After", "1"))
            .json(json!({"error": format!(
                "{LISTINGS_IN_FLIGHT} listings are being answered; try again"
            )}));
    };
    let after = match query.continue_token.as_deref() {
        None | Some("") => None,
        Some(token) => match parse_continue(token) {
            Some(after) => Some(after),
            None => {
                return HttpResponse::BadRequest()
                    .json(json!({"error": "continue is not a token this endpoint gave"}))
            }
        },
    };
    let limit = query
        .limit
        .filter(|limit| *limit > 0)
        .unwrap_or(DEFAULT_PAGE)
        .min(MAX_PAGE);
    let kind = kind.into_inner();
    let (items, next, resource_version) = match cluster.resolve_kind(&kind) {
        Some(resolved) => cluster.list_page(&resolved, after, limit, MAX_PAGE_BYTES),
        None => (Vec::new(), None, String::new()),
    };
    let mut metadata = json!({ "resourceVersion": resource_version });
    if let Some((namespace, name)) = next {
        metadata["continue"] = json!(continue_token(&namespace, &name));
    }
    let page = json!({
        "items": items,
        "resourceVersion": resource_version,
        "metadata": metadata,
    });
    let chunk = match serde_json::to_vec(&page) {
        Ok(bytes) => web::Bytes::from(bytes),
        Err(error) => return HttpResponse::InternalServerError().body(format!("{error}\n")),
    };
    drop(page);
    HttpResponse::Ok()
        .content_type("application/json")
        .body(HeldBody {
            size: chunk.len() as u64,
            chunk: Some(chunk),
            _permit: permit,
        })
}

/// `DELETE /api/v1/objects/{kind}/{namespace}/{name}`: deletes one object of the embedded
/// cluster; `kind` is matched without case and may be plural; the namespace is ignored for
/// cluster-scoped kinds.
/// `?gracePeriodSeconds=N`: as on a Kubernetes API server, a pod bound to a node is then
/// only marked terminating (`deletionTimestamp`, `deletionGracePeriodSeconds`) and stays until
/// its node confirms the deletion. Without it the embedded cluster deletes at once, since it
/// has no kubelets to wait for.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeleteOptions {
    grace_period_seconds: Option<u64>,
}

async fn delete_object(
    cluster: web::Data<EmbeddedCluster>,
    path: web::Path<(String, String, String)>,
    options: web::Query<DeleteOptions>,
) -> HttpResponse {
    let (kind, namespace, name) = path.into_inner();
    let Some(resolved) = cluster.resolve_kind(&kind) else {
        return cluster_error(&ClusterError::NotFound {
            kind,
            key: format!("{namespace}/{name}"),
        });
    };
    let grace = options.grace_period_seconds.filter(|grace| *grace > 0);
    let bound = cluster
        .get(&resolved, Some(&namespace), &name)
        .is_some_and(|pod| {
            pod["spec"]["nodeName"]
                .as_str()
                .is_some_and(|n| !n.is_empty())
        });
    if let (Some(grace), true, "Pod") = (grace, bound, resolved.as_str()) {
        let marked = cluster.modify(&resolved, Some(&namespace), &name, |pod| {
            let metadata = &mut pod["metadata"];
            if metadata["deletionTimestamp"].is_null() {
                metadata["deletionTimestamp"] = json!(edgehive_protocols::object::rfc3339(
                    edgehive_protocols::object::now_ms() / 1000 + grace
                ));
                metadata["deletionGracePeriodSeconds"] = json!(grace);
            }
            Ok(())
        });
        return match marked {
            Ok(pod) => HttpResponse::Ok().json(json!({ "terminating": summary(&pod) })),
            Err(error) => cluster_error(&error),
        };
    }
    match cluster.delete(&resolved, Some(&namespace), &name) {
        Ok(deleted) => HttpResponse::Ok().json(json!({ "deleted": summary(&deleted) })),
        Err(error) => cluster_error(&error),
    }
}
