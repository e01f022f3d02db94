//! The edge process: EdgeHub, MetaManager, DeviceTwin and EventBus on one hive, the SQLite store, and
//! the admin endpoint with the edge's local API:
//!
//! | route | what |
//! | --- | --- |
//! | `GET /api/v1/meta?type=pod` | stored objects (`items`: key, resource_type, value) |
//! | `GET /api/v1/meta?type=pod&watch=true` | newline-delimited JSON events: ADDED for each stored object, then ADDED/MODIFIED/DELETED as the store commits; a watcher that falls behind gets an ERROR line and the stream ends |
//! | `GET /api/v1/meta/{ns}/{type}/{name}` | one stored object |
//! | `GET /api/v1/devices`, `GET /api/v1/devices/{ns}/{name}` | devices with their twins |
//! | `PUT /api/v1/devices/{ns}/{name}/twins/{property}` | a mapper reports a value (body: the value) |
//! | `PUT /api/v1/devices/{ns}/{name}/state` | a mapper reports the device state (body: the state) |
//! | `GET /api/v1/eventbus` | EventBus's MQTT broker connection: state (`connecting`, `connected`, `disconnected`), broker, connects, last error, topics |
//! | `GET /api/v1/node` | the node module: registered, last status and lease renewal, reports waiting |
//! | `PUT /api/v1/pods/{ns}/{name}/status` | a runtime reports a pod's status (body: a PodStatus); 202, sent up as `podstatus` |
//! | `DELETE /api/v1/pods/{ns}/{name}` | a runtime confirms a terminating pod is gone; 202, the cloud then removes it from the cluster |
//!
//! With `modules.metaManager.metaServer.enable`, MetaServer serves the node's applications
//! the Kubernetes API's reads on `metaServer.server` (see docs/metaserver.md).
//!
//! The same routes are served on the Unix socket `admin.unixSocket` (0660) with no token; over
//! TCP, `/api/v1/meta…` and every write need the admin token (`admin.tokenFile`), unless
//! `admin.insecureTCPLocalAPI` (see [`crate::admin::AdminAccess`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::web::Bytes;
use actix_web::{web, HttpResponse};
use anyhow::Context as _;
use edgehive_actors::edge::devicetwin::{DeviceTwinModule, ReportState, ReportTwin, TwinError};
use edgehive_actors::edge::edged;
use edgehive_actors::edge::edged::{
    ConfirmPodDeletion, GetNodeStatus, NodeError, NodeModule, ReportPodStatus,
};
use edgehive_actors::edge::edgehub::{self, EdgeHubModule, EdgeHubStatus, GetEdgeHubStatus};
use edgehive_actors::edge::eventbus::{self, EventBusModule, GetEventBusStatus};
use edgehive_actors::edge::metamanager::MetaManagerModule;
use edgehive_actors::edge::metaserver::MetaServer;
use edgehive_actors::edge::store::MetaStore;
use edgehive_actors::edge::twin_store::TwinStore;
use edgehive_actors::edge::watch::watch_lines;
use edgehive_actors::hive::{Hive, HiveError};
use futures_util::StreamExt as _;
use serde::Deserialize;
use serde_json::json;

use crate::admin::{AdminAccess, AdminServer, Readiness};
use crate::config::EdgeConfig;
use crate::plug::Plug;

/// A running edge process.
#[derive(Debug)]
pub struct EdgeProcess {
    hive: Hive,
    /// Set when the process stops, so open watch streams end instead of holding the admin
    /// endpoint's graceful shutdown.
    stopping: tokio::sync::watch::Sender<bool>,
    store: MetaStore,
    admin: AdminServer,
    node_name: String,
    socket: std::path::PathBuf,
    /// `modules.edgeStream`, when enabled; dropped (stopped) with the process.
    _edge_stream: Option<edgehive_actors::edge::edgestream::EdgeStream>,
    /// `modules.metaManager.metaServer`, when enabled.
    meta_server: Option<MetaServer>,
}

impl EdgeProcess {
    /// Starts the edge described by `config`; must run inside an actix system.
    pub async fn start(config: &EdgeConfig) -> anyhow::Result<Self> {
        Self::start_with(config, |_| Ok(())).await
    }

    /// Starts the edge, then lets `plug` start extension modules on its hive, each reading
    /// its section `modules.<name>` ([`Plug`]); fails if the config has an extension section
    /// none of them reads.
    pub async fn start_with(
        config: &EdgeConfig,
        plug: impl FnOnce(&Plug) -> anyhow::Result<()>,
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
        let twins = if config.modules.device_twin.enable {
            let twins = TwinStore::open(store.clone())
                .await
                .with_context(|| format!("edge {node_name}: cannot create the device tables"))?;
            hive.start_module(DeviceTwinModule::new(twins.clone(), node_name.clone()))?;
            Some(twins)
        } else {
            None
        };
        // EventBus serves DeviceTwin's topics: without DeviceTwin it has nothing to serve.
        let event_bus = match (config.event_bus_options(), &twins) {
            (Some(options), Some(twins)) => {
                hive.start_module(EventBusModule::new(
                    options,
                    twins.clone(),
                    node_name.clone(),
                ))?;
                true
            }
            (Some(_), None) => {
                tracing::warn!("modules.eventBus is enabled but modules.deviceTwin is not: EventBus not started");
                false
            }
            _ => false,
        };
        if let Some(options) = config.service_bus_options() {
            hive.start_module(edgehive_actors::edge::servicebus::ServiceBusModule::new(
                options,
                store.clone(),
            ))?;
        }
        let node_module = config.modules.edged.enable;
        if node_module {
            hive.start_module(NodeModule::new(config.node_options(), store.clone()))?;
        }
        if config.modules.edge_hub.websocket.enable {
            let mut options = config.edge_hub_options();
            options.store_id = Some(store.id().to_owned());
            hive.start_module(EdgeHubModule::new(options))?;
        }
        let extensions = Plug::new(&hive, &config.modules.extensions);
        plug(&extensions)?;
        extensions.finish()?;
        let edge_stream = config.modules.edge_stream.enable.then(|| {
            use edgehive_actors::edge::edgestream::{EdgeStream, EdgeStreamMetrics};
            EdgeStream::start(
                config.edge_stream_options(),
                EdgeStreamMetrics::register(&hive),
            )
        });
        let meta_server = if config.modules.meta_manager.meta_server.enable {
            Some(
                MetaServer::start(config.meta_server_options(), &hive, store.clone())
                    .await
                    .with_context(|| format!("edge {node_name}: cannot start metaServer"))?,
            )
        } else {
            None
        };
        let (stopping, stop_signal) = tokio::sync::watch::channel(false);
        let routes_store = store.clone();
        let routes_hive = hive.clone();
        let access = AdminAccess {
            allowed_hosts: config.admin.allowed_hosts.clone(),
            token: AdminAccess::read_token(&config.admin.token_file, "admin.tokenFile")?,
            guarded: (!config.admin.insecure_tcp_local_api).then_some(local_api_route as _),
            unix_socket: Some(config.admin_socket()),
        };
        let admin = AdminServer::start(
            &config.admin.bind_address,
            hive.clone(),
            access,
            Arc::new(move |routes: &mut web::ServiceConfig| {
                let store = routes_store.clone();
                let readiness = Readiness(Arc::new(move || {
                    if !store.is_writable() {
                        return Some(format!(
                            "store: {} was deleted or replaced while in use; writes are refused until the edge restarts",
                            store.path().display()
                        ));
                    }
                    store
                        .last_write_error()
                        .map(|error| format!("store: the last write failed: {error}"))
                }));
                routes
                    .app_data(web::Data::new(readiness))
                    .app_data(web::Data::new(routes_store.clone()))
                    .app_data(web::Data::new(routes_hive.clone()))
                    .app_data(web::Data::new(stop_signal.clone()))
                    .route("/api/v1/meta", web::get().to(list_meta))
                    .route("/api/v1/meta/{ns}/{type}/{name}", web::get().to(get_meta))
                    .route("/api/v1/edgehub", web::get().to(edgehub_status));
                if event_bus {
                    routes.route("/api/v1/eventbus", web::get().to(eventbus_status));
                }
                if node_module {
                    routes
                        .route("/api/v1/node", web::get().to(node_status))
                        .route(
                            "/api/v1/pods/{ns}/{name}/status",
                            web::put().to(report_pod_status),
                        )
                        .route(
                            "/api/v1/pods/{ns}/{name}",
                            web::delete().to(confirm_deletion),
                        );
                }
                if let Some(twins) = &twins {
                    routes
                        .app_data(web::Data::new(twins.clone()))
                        .app_data(web::PayloadConfig::new(MAX_REPORT_BYTES))
                        .route("/api/v1/devices", web::get().to(list_devices))
                        .route("/api/v1/devices/{ns}/{name}", web::get().to(get_device))
                        .route(
                            "/api/v1/devices/{ns}/{name}/twins/{property}",
                            web::put().to(report_twin),
                        )
                        .route(
                            "/api/v1/devices/{ns}/{name}/state",
                            web::put().to(report_state),
                        );
                }
            }),
        )?;
        tracing::info!(node = %node_name, admin = %admin.addr(), "edge started");
        Ok(EdgeProcess {
            hive,
            stopping,
            store,
            admin,
            node_name,
            socket: config.admin_socket(),
            _edge_stream: edge_stream,
            meta_server,
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

    /// Where MetaServer listens, when enabled.
    pub fn meta_server_addr(&self) -> Option<SocketAddr> {
        self.meta_server.as_ref().map(MetaServer::addr)
    }

    /// The Unix socket serving the local API (`admin.unixSocket`).
    pub fn admin_socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// EdgeHub's connection state.
    pub async fn status(&self) -> anyhow::Result<EdgeHubStatus> {
        Ok(hub_status(&self.hive).await?)
    }

    /// Stops the modules (closing the connection to the cloud) and the admin endpoint.
    pub async fn stop(self) {
        let _ = self.stopping.send(true);
        if let Some(meta_server) = self.meta_server {
            meta_server.stop().await;
        }
        self.hive.shutdown();
        self.admin.stop().await;
    }
}

/// The local API's routes that over TCP need the admin token (or, without one, are served on
/// the Unix socket only): the stored objects (Secrets among them) and every write.
fn local_api_route(method: &actix_web::http::Method, path: &str) -> bool {
    let reading = method == actix_web::http::Method::GET || method == actix_web::http::Method::HEAD;
    !reading || path == "/api/v1/meta" || path.starts_with("/api/v1/meta/")
}

async fn hub_status(hive: &Hive) -> Result<EdgeHubStatus, edgehive_actors::hive::HiveError> {
    hive.ask(
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
    #[serde(default)]
    watch: bool,
}

/// `GET /api/v1/meta[?type=pod][&watch=true]`: the stored objects, or a watch stream.
async fn list_meta(
    store: web::Data<MetaStore>,
    stop_signal: web::Data<tokio::sync::watch::Receiver<bool>>,
    query: web::Query<MetaQuery>,
) -> HttpResponse {
    let MetaQuery {
        resource_type,
        watch,
    } = query.into_inner();
    // Subscribed before listing, so no change falls between the list and the stream.
    let changes = watch.then(|| store.subscribe());
    match (store.list(resource_type.clone()).await, changes) {
        (Ok(rows), None) => HttpResponse::Ok().json(json!({ "items": rows })),
        (Ok(rows), Some(changes)) => {
            let mut stop_signal = stop_signal.get_ref().clone();
            let stopped = async move {
                let _ = stop_signal.wait_for(|stopping| *stopping).await;
            };
            HttpResponse::Ok()
                .content_type("application/x-ndjson")
                .streaming(watch_lines(rows, changes, resource_type).take_until(stopped))
        }
        (Err(error), _) => HttpResponse::InternalServerError().body(format!("store: {error}\n")),
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

/// `GET /api/v1/eventbus`: EventBus's connection to the node's MQTT broker.
async fn eventbus_status(hive: web::Data<Hive>) -> HttpResponse {
    match hive
        .ask(
            eventbus::MODULE_NAME,
            GetEventBusStatus,
            Duration::from_secs(5),
        )
        .await
    {
        Ok(status) => HttpResponse::Ok().json(status),
        Err(error) => HttpResponse::ServiceUnavailable().body(format!("{error}\n")),
    }
}

/// Largest body a mapper may PUT.
const MAX_REPORT_BYTES: usize = 64 * 1024;

/// `GET /api/v1/devices`: every device on this edge with its twins.
async fn list_devices(twins: web::Data<TwinStore>) -> HttpResponse {
    match twins.list().await {
        Ok(devices) => HttpResponse::Ok().json(json!({ "items": devices })),
        Err(error) => HttpResponse::InternalServerError().body(format!("store: {error}\n")),
    }
}

/// `GET /api/v1/devices/{ns}/{name}`.
async fn get_device(
    twins: web::Data<TwinStore>,
    path: web::Path<(String, String)>,
) -> HttpResponse {
    let (namespace, name) = path.into_inner();
    let id = format!("{namespace}/{name}");
    match twins.get(id.clone()).await {
        Ok(Some(device)) => HttpResponse::Ok().json(device),
        Ok(None) => HttpResponse::NotFound().body(format!("device {id} is not on this edge\n")),
        Err(error) => HttpResponse::InternalServerError().body(format!("store: {error}\n")),
    }
}

/// A reported value: the body as text, or a JSON string. Empty or not UTF-8 is refused.
fn report_value(body: &Bytes) -> Result<String, String> {
    let text = std::str::from_utf8(body)
        .map_err(|_| "the body must be UTF-8 text: the value".to_owned())?
        .trim();
    let value = if text.starts_with('"') {
        serde_json::from_str::<String>(text).map_err(|error| {
            format!("the body starts with a quote but is not a JSON string: {error}")
        })?
    } else {
        text.to_owned()
    };
    if value.is_empty() {
        return Err("the body must be the value; it is empty".to_owned());
    }
    Ok(value)
}

fn twin_response(
    outcome: Result<
        Result<edgehive_protocols::Message, TwinError>,
        edgehive_actors::hive::HiveError,
    >,
) -> HttpResponse {
    match outcome {
        Ok(Ok(sent)) => HttpResponse::Ok().json(json!({
            "sent": { "msg_id": sent.id(), "resource": sent.resource(), "content": sent.content },
        })),
        Ok(Err(error @ (TwinError::UnknownDevice(_) | TwinError::UnknownProperty(..)))) => {
            HttpResponse::NotFound().body(format!("{error}\n"))
        }
        Ok(Err(error @ TwinError::Busy)) => HttpResponse::TooManyRequests()
            .insert_header(("Retry-After", "5"))
            .body(format!("{error}\n")),
        Ok(Err(error)) => HttpResponse::InternalServerError().body(format!("{error}\n")),
        Err(error) => HttpResponse::ServiceUnavailable().body(format!("{error}\n")),
    }
}

/// `PUT /api/v1/devices/{ns}/{name}/twins/{property}`: a mapper reports a reading; it is
/// stored and sent to the cloud as `twin/edge_updated` until confirmed.
async fn report_twin(
    hive: web::Data<Hive>,
    path: web::Path<(String, String, String)>,
    body: Bytes,
) -> HttpResponse {
    let (namespace, name, property) = path.into_inner();
    let value = match report_value(&body) {
        Ok(value) => value,
        Err(problem) => return HttpResponse::BadRequest().body(format!("{problem}\n")),
    };
    let report = ReportTwin {
        id: format!("{namespace}/{name}"),
        property,
        value,
    };
    twin_response(
        hive.ask(
            edgehive_actors::edge::devicetwin::MODULE_NAME,
            report,
            Duration::from_secs(10),
        )
        .await,
    )
}

/// `PUT /api/v1/devices/{ns}/{name}/state`: a mapper reports the device state.
async fn report_state(
    hive: web::Data<Hive>,
    path: web::Path<(String, String)>,
    body: Bytes,
) -> HttpResponse {
    let (namespace, name) = path.into_inner();
    let state = match report_value(&body) {
        Ok(state) => state,
        Err(problem) => return HttpResponse::BadRequest().body(format!("{problem}\n")),
    };
    let report = ReportState {
        id: format!("{namespace}/{name}"),
        state,
    };
    twin_response(
        hive.ask(
            edgehive_actors::edge::devicetwin::MODULE_NAME,
            report,
            Duration::from_secs(10),
        )
        .await,
    )
}

/// How long the admin endpoint waits for the node module.
const NODE_MODULE_TIMEOUT: Duration = Duration::from_secs(5);

/// `GET /api/v1/node`: what the node module has done.
async fn node_status(hive: web::Data<Hive>) -> HttpResponse {
    match hive
        .ask(edged::MODULE_NAME, GetNodeStatus, NODE_MODULE_TIMEOUT)
        .await
    {
        Ok(status) => HttpResponse::Ok().json(status),
        Err(error) => HttpResponse::ServiceUnavailable().body(format!("{error}\n")),
    }
}

fn node_response(result: Result<Result<(), NodeError>, HiveError>) -> HttpResponse {
    match result {
        Ok(Ok(())) => HttpResponse::Accepted().json(json!({"accepted": true})),
        Ok(Err(error @ NodeError::UnknownPod(_))) => {
            HttpResponse::NotFound().body(format!("{error}\n"))
        }
        Ok(Err(error @ NodeError::NotTerminating(_))) => {
            HttpResponse::Conflict().body(format!("{error}\n"))
        }
        Ok(Err(error @ NodeError::Busy)) => {
            HttpResponse::TooManyRequests().body(format!("{error}\n"))
        }
        Ok(Err(error)) => HttpResponse::InternalServerError().body(format!("{error}\n")),
        Err(error) => HttpResponse::ServiceUnavailable().body(format!("{error}\n")),
    }
}

/// `PUT /api/v1/pods/{ns}/{name}/status`: a runtime reports a pod's status.
async fn report_pod_status(
    hive: web::Data<Hive>,
    path: web::Path<(String, String)>,
    body: Bytes,
) -> HttpResponse {
    let (namespace, name) = path.into_inner();
    let status = match serde_json::from_slice::<serde_json::Value>(&body) {
        Ok(status) if status.is_object() => status,
        Ok(_) => return HttpResponse::BadRequest().body("expected a PodStatus object\n"),
        Err(error) => {
            return HttpResponse::BadRequest().body(format!("the body is not JSON: {error}\n"))
        }
    };
    let report = ReportPodStatus {
        namespace,
        name,
        status,
    };
    node_response(
        hive.ask(edged::MODULE_NAME, report, NODE_MODULE_TIMEOUT)
            .await,
    )
}

/// `DELETE /api/v1/pods/{ns}/{name}`: a runtime confirms that a terminating pod is gone.
async fn confirm_deletion(
    hive: web::Data<Hive>,
    path: web::Path<(String, String)>,
) -> HttpResponse {
    let (namespace, name) = path.into_inner();
    node_response(
        hive.ask(
            edged::MODULE_NAME,
            ConfirmPodDeletion { namespace, name },
            NODE_MODULE_TIMEOUT,
        )
        .await,
    )
}
