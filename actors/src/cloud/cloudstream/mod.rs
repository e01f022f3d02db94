//! CloudStream: `kubectl logs`, `exec`, `attach` and the kubelet metrics paths for pods on
//! edge nodes, through the node's stream tunnel (KubeEdge's CloudStream, for edgecore's
//! EdgeStream and edgehive's `edge::edgestream`).
//!
//! Two TLS ports: the tunnel server (`tunnel`, KubeEdge's `tunnelPort` 10004) where edges
//! keep one WebSocket each, and the stream server (`streams`, `streamPort` 10003) where the
//! API server calls the kubelet API paths. A request picks the node's tunnel, sends a
//! `*_CONNECT` with the request as the edge replays it to its kubelet API, and pipes the
//! edge's DATA messages into the response (`session` says how memory stays bounded); exec and
//! attach upgrades are served on the connection itself (`connection`, `upgrade`).
//!
//! Both ports use the TLS ports' handshake gate of CloudHub (`cloudhub::gate`) and the cloud's
//! server certificate. Port-forward is 404 (as with cloudcore).
//!
//! A third, optional server (`egress`) is the API server's egress selector (HTTP CONNECT): it
//! connects the API server to the stream server for edge nodes and straight through for the
//! rest, so the API server needs no DNAT.
//!
//! Among cloud replicas (`modules.cloudHub.replica`), a fourth: the forward server
//! (`forwardPort`), where another replica sends a request for a node whose edge is here
//! (`hop` forwards out, `inbound` checks what comes in; mutual TLS with replica certificates
//! from the shared CA). A forwarded request is never forwarded again.

mod connection;
mod context;
mod egress;
mod hop;
mod inbound;
mod metrics;
mod session;
mod streams;
mod tunnel;
mod upgrade;
mod view;

use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::dev::ServerHandle;
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse};
use edgehive_protocols::tunnel::TUNNEL_PATH;

use crate::cloud::cloudhub::gate::{self, Gate, GateMetrics};
use crate::hive::Hive;
use crate::identity::tls::{CloudTls, TlsError};
use context::StreamContext;
pub use context::{CloudStreamOptions, EgressOptions, Forwarding, NodeAdmin};
pub(crate) use metrics::CloudStreamMetrics;
pub use view::{NodeStreams, StreamsView};

/// Worker threads of each server.
const WORKERS: usize = 1;

/// Why CloudStream could not start.
#[derive(Debug, thiserror::Error)]
pub enum CloudStreamError {
    /// TLS could not be configured.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// A port could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// `address:port`.
        address: String,
        /// The operating system's reason.
        source: std::io::Error,
    },
}

/// The running tunnel and stream servers.
pub struct CloudStreamServer {
    tunnel_addr: SocketAddr,
    stream_addr: SocketAddr,
    handles: Vec<ServerHandle>,
    context: Arc<StreamContext>,
    egress: Option<egress::EgressServer>,
    forward_addr: Option<SocketAddr>,
}

/// Forwards node admin requests to the node's owner ([`CloudStreamServer::node_admin`]).
#[derive(Clone)]
pub struct NodeAdminForwarder {
    context: Arc<StreamContext>,
}

impl std::fmt::Debug for NodeAdminForwarder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeAdminForwarder").finish_non_exhaustive()
    }
}

impl NodeAdminForwarder {
    /// Where `GET /api/v1/sync/{node}` is answered: here, by the node's owner (asked over the
    /// forward path, counted `edgehive_cloud_forwarded_total{kind="admin"}`), or nowhere.
    pub async fn route(&self, node: &str) -> NodeAdminRoute {
        match hop::admin_route(&self.context, node) {
            hop::Route::Here => NodeAdminRoute::Here,
            hop::Route::Refused(refusal) => {
                hop::record(&self.context, "admin", &refusal, None);
                NodeAdminRoute::Refused {
                    status: refusal.status,
                    text: refusal.text,
                }
            }
            hop::Route::Owner(owner) => match hop::forward_admin(&self.context, &owner).await {
                Ok((status, body)) => NodeAdminRoute::Answered {
                    replica: owner.replica,
                    status,
                    body,
                },
                Err(refusal) => {
                    refusal.record(&self.context, None);
                    NodeAdminRoute::Refused {
                        status: refusal.status,
                        text: refusal.text,
                    }
                }
            },
        }
    }
}

/// Where a node admin request is answered ([`CloudStreamServer::node_admin`]).
#[derive(Debug)]
pub enum NodeAdminRoute {
    /// Here: this process serves the node (or is no replica).
    Here,
    /// By the node's owner, another replica: its status and body.
    Answered {
        /// The owner's identity.
        replica: String,
        /// Its answer's status.
        status: StatusCode,
        /// Its answer's body (JSON).
        body: actix_web::web::Bytes,
    },
    /// Nowhere: why (the node has no owner, the owner is dead, forwarding failed).
    Refused {
        /// The status to answer.
        status: StatusCode,
        /// What to tell the caller.
        text: String,
    },
}

impl std::fmt::Debug for CloudStreamServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudStreamServer")
            .field("tunnel_addr", &self.tunnel_addr)
            .field("stream_addr", &self.stream_addr)
            .finish_non_exhaustive()
    }
}

impl CloudStreamServer {
    /// Where edges dial their tunnel.
    pub fn tunnel_addr(&self) -> SocketAddr {
        self.tunnel_addr
    }

    /// Where the API server calls the kubelet API paths.
    pub fn stream_addr(&self) -> SocketAddr {
        self.stream_addr
    }

    /// Where the API server's egress selector connects over TLS (`egress.port`; none when the
    /// egress server is off or on a Unix socket).
    pub fn egress_addr(&self) -> Option<SocketAddr> {
        self.egress.as_ref().and_then(egress::EgressServer::addr)
    }

    /// Where other replicas forward to this one (`modules.cloudHub.replica.forwardPort`; none
    /// when no forward server runs).
    pub fn forward_addr(&self) -> Option<SocketAddr> {
        self.forward_addr
    }

    /// Where node admin requests are answered (for the admin endpoint).
    pub fn node_admin(&self) -> NodeAdminForwarder {
        NodeAdminForwarder {
            context: self.context.clone(),
        }
    }

    /// The tunnels and their streams, for the admin endpoint.
    pub fn view(&self) -> StreamsView {
        StreamsView {
            context: self.context.clone(),
        }
    }

    /// Streams open on `node` now (0 without a tunnel).
    pub fn open_streams(&self, node: &str) -> usize {
        self.context
            .sessions
            .by_name(node)
            .map_or(0, |tunnel| tunnel.open_streams())
    }

    /// Stops both servers; every tunnel is closed and its streams end with an error.
    pub async fn stop(&self) {
        if let Some(egress) = &self.egress {
            egress.stop();
        }
        self.context.sessions.shutdown_all();
        for handle in &self.handles {
            handle.stop(false).await;
        }
    }
}

/// Starts CloudStream's two servers over TLS with the cloud's certificates: edges must
/// present a node certificate from the cloud CA on the tunnel port; the API server a client
/// certificate from `stream_client_ca_der` (PEM-decoded `tlsStreamCAFile`) on the stream port.
/// Must be called inside a running actix system.
pub fn start_cloudstream(
    hive: &Hive,
    options: CloudStreamOptions,
    tls: &CloudTls,
    stream_client_ca_der: &[u8],
    gate_metrics: GateMetrics,
) -> Result<CloudStreamServer, CloudStreamError> {
    start_cloudstream_with(hive, options, tls, stream_client_ca_der, gate_metrics, None)
}

/// [`start_cloudstream`] on a cloud replica: with `forwarding`, requests for nodes on other
/// live replicas are forwarded there, and the forward server (its `port`, unless 0) serves
/// what they forward here.
pub fn start_cloudstream_with(
    hive: &Hive,
    options: CloudStreamOptions,
    tls: &CloudTls,
    stream_client_ca_der: &[u8],
    gate_metrics: GateMetrics,
    forwarding: Option<Forwarding>,
) -> Result<CloudStreamServer, CloudStreamError> {
    let tunnel_tls = tls.websocket_config()?;
    let stream_tls = tls.stream_server_config(stream_client_ca_der)?;
    let forward_tls = match &forwarding {
        Some(forwarding) if forwarding.port != 0 => Some(forwarding.credentials.server_config()?),
        _ => None,
    };
    let context = Arc::new(StreamContext::new(
        options.clone(),
        CloudStreamMetrics::register(hive),
        crate::cloud::ownership::Ownership::of(hive),
        forwarding.clone(),
    ));
    let data = web::Data::from(context.clone());
    let bind = |port: u16| {
        let address = format!("{}:{port}", options.address);
        let error = |source| CloudStreamError::Bind {
            address: address.clone(),
            source,
        };
        let listener = gate::listener(&options.address, port).map_err(error)?;
        let local = listener.local_addr().map_err(error)?;
        Ok::<_, CloudStreamError>((listener, local, address))
    };
    let (listener, tunnel_addr, address) = bind(options.tunnel_port)?;
    let tunnel_data = data.clone();
    let tunnel_server = gate::serve(
        "cloudstream-tunnel",
        listener,
        WORKERS,
        tunnel_tls,
        Gate::new("tunnel", options.handshake_limits, gate_metrics.clone()),
        move || {
            App::new()
                .app_data(tunnel_data.clone())
                .route(TUNNEL_PATH, web::get().to(tunnel::connect))
        },
    )
    .map_err(|source| CloudStreamError::Bind { address, source })?;
    let (listener, stream_addr, address) = bind(options.stream_port)?;
    let stream_data = data.clone();
    let stream_server = connection::serve(
        "cloudstream-stream",
        listener,
        WORKERS,
        stream_tls,
        Gate::new("stream", options.handshake_limits, gate_metrics.clone()),
        context.clone(),
        connection::Hop::Direct,
        move || {
            App::new()
                .app_data(stream_data.clone())
                .configure(stream_routes)
        },
    )
    .map_err(|source| CloudStreamError::Bind { address, source })?;
    let mut handles = vec![tunnel_server.handle(), stream_server.handle()];
    let mut servers = vec![("tunnel", tunnel_server), ("stream", stream_server)];
    let mut forward_addr = None;
    if let (Some(forward_tls), Some(forwarding)) = (forward_tls, &forwarding) {
        let (listener, addr, address) = match bind(forwarding.port) {
            Ok(bound) => bound,
            Err(error) => {
                for handle in handles {
                    actix::spawn(async move { handle.stop(false).await });
                }
                return Err(error);
            }
        };
        let forward_data = data.clone();
        let forward_server = connection::serve(
            "cloudstream-forward",
            listener,
            WORKERS,
            forward_tls,
            Gate::new("forward", options.handshake_limits, gate_metrics),
            context.clone(),
            connection::Hop::Forwarded,
            move || {
                App::new()
                    .app_data(forward_data.clone())
                    .app_data(streams::ForwardedApp)
                    .configure(stream_routes)
            },
        );
        let forward_server = match forward_server {
            Ok(server) => server,
            Err(source) => {
                for handle in handles {
                    actix::spawn(async move { handle.stop(false).await });
                }
                return Err(CloudStreamError::Bind { address, source });
            }
        };
        handles.push(forward_server.handle());
        servers.push(("forward", forward_server));
        forward_addr = Some(addr);
    }
    for (name, server) in servers {
        actix::spawn(async move {
            if let Err(err) = server.await {
                tracing::error!(error = %err, server = name, "cloudstream server failed");
            }
        });
    }
    let egress = if options.egress.enable {
        let started = tls
            .stream_server_config(stream_client_ca_der)
            .map_err(CloudStreamError::from)
            .and_then(|mut egress_tls| {
                // The API server's egress client offers no ALPN; CONNECT is HTTP/1.1 anyway.
                egress_tls.alpn_protocols.clear();
                egress::start(hive, context.clone(), egress_tls, stream_addr).map_err(|failed| {
                    CloudStreamError::Bind {
                        address: failed.address,
                        source: failed.source,
                    }
                })
            });
        match started {
            Ok(egress) => Some(egress),
            Err(error) => {
                for handle in handles.clone() {
                    actix::spawn(async move { handle.stop(false).await });
                }
                return Err(error);
            }
        }
    } else {
        None
    };
    tracing::info!(%tunnel_addr, %stream_addr, ?forward_addr, "cloudstream listening");
    Ok(CloudStreamServer {
        tunnel_addr,
        stream_addr,
        handles,
        context,
        egress,
        forward_addr,
    })
}

/// The kubelet API paths the stream server (and the forward server) serve.
fn stream_routes(routes: &mut web::ServiceConfig) {
    routes
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            web::get().to(streams::container_logs),
        )
        .route("/metrics", web::get().to(streams::kubelet_metrics))
        .route(
            "/metrics/{tail:.*}",
            web::get().to(streams::kubelet_metrics),
        )
        .route("/stats", web::get().to(streams::kubelet_metrics))
        .route("/stats/{tail:.*}", web::get().to(streams::kubelet_metrics))
        .default_service(web::to(not_served));
}

/// Every other path: anonymous callers are refused as on the logs path; exec and attach
/// that reach actix-web were not upgrades (`connection` serves the upgrades); the rest,
/// port-forward included (cloudcore has none either), is 404.
async fn not_served(req: HttpRequest, context: web::Data<StreamContext>) -> HttpResponse {
    if let Err(refusal) = streams::check_request(&req) {
        return refusal.respond(&context, &req);
    }
    let path = req.path();
    if path.starts_with("/exec/") || path.starts_with("/attach/") {
        return upgrade::not_upgraded(&req).respond(&context, &req);
    }
    HttpResponse::build(StatusCode::NOT_FOUND)
        .content_type("text/plain; charset=utf-8")
        .body("404 page not found\n")
}
