//! The WebSocket server edges dial: actix-web on `address:port`, any path.
//!
//! A connection must carry `node_id` (a valid Kubernetes node name), `project_id` and
//! `ConnectionUse: msg`. KubeEdge upgrades and then ignores a connection without them; we
//! answer HTTP 400 with the reason instead, so a misconfigured edge learns why (counted as
//! `bad_headers` in `edgehive_cloudhub_denied_total`).
//!
//! A WebSocket upgrade request is answered on the connection itself (actix-http hands it over
//! with the request): the checks below, the 101, then the session reads and writes frames on
//! the connection through [`super::socket`] and actix-http's dispatcher, its buffers and the
//! connection's task are gone. Any other request gets the same checks and then the handshake
//! error actix-web would give it.
//!
//! With TLS (see [`crate::identity::tls`]) the edge must present a client certificate signed by the
//! cloud CA whose CN is `system:node:{node_id}`; a certificate for another node (or none that
//! names a node) is answered 403 and counted (`edgehive_cloudhub_denied_total`).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use actix_codec::{AsyncRead, AsyncWrite, Encoder, Framed};
use actix_http::body::{BodySize, BoxBody, MessageBody};
use actix_http::{h1, ws, HttpMessage as _, HttpService, Request, Response};
use actix_service::{fn_service, map_config, IntoServiceFactory, ServiceFactoryExt};
use actix_web::dev::{AppConfig, ServerHandle};
use actix_web::http::header::HeaderMap;
use actix_web::http::StatusCode;
use actix_web::web::{Bytes, BytesMut};
use actix_web::{web, App, HttpRequest, HttpResponse};
use actix_ws::{CloseCode, CloseReason};
use tokio::io::AsyncWriteExt;

use super::gate::{self, Gate, GateMetrics};
use super::hub::{Admit, AdmitAbandoned, CloudHub, CloudHubModule, Shared, CLOUDHUB_MODULE};
use super::keepalive::KeepaliveWheel;
#[cfg(feature = "test-hooks")]
use super::memory::{edge_link, EdgeInbox, EdgeLink, MemoryLink};
use super::node::NodeCell;
use super::options::{CloudHubOptions, CloudHubSecurity};
use super::session::{Link, NodeSession, SessionConfig};
use super::socket::SocketLink;
use crate::hive::log::{clip, WarnBudget};
use crate::hive::{Hive, HiveError, RefusalKind};
use crate::identity::check_node_name;
use crate::identity::tls::{certificate_node, PeerCertificate};

/// Worker threads of the WebSocket server.
const WORKERS: usize = 2;
/// How long a new connection waits for CloudHub to admit it.
const ADMISSION_TIMEOUT: Duration = Duration::from_secs(5);

/// Why CloudHub could not start.
#[derive(Debug, thiserror::Error)]
pub enum CloudHubError {
    /// The CloudHub module could not be registered (e.g. started twice).
    #[error("cannot start the cloudhub module: {0}")]
    Module(#[from] HiveError),
    /// TLS could not be configured from the cloud's certificates.
    #[error(transparent)]
    Tls(#[from] crate::identity::tls::TlsError),
    /// The WebSocket listener could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// `address:port` as configured.
        address: String,
        /// The operating system's reason.
        source: std::io::Error,
    },
}

/// A running CloudHub WebSocket server.
#[derive(Debug)]
pub struct CloudHubServer {
    local_addr: SocketAddr,
    handle: ServerHandle,
    gate_metrics: GateMetrics,
    #[cfg(feature = "test-hooks")]
    memory: MemoryConnector,
}

impl CloudHubServer {
    /// The address the server is bound to (the real port when 0 was configured).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The TLS gates' metrics of this process, for the certificate server's gate.
    pub fn gate_metrics(&self) -> GateMetrics {
        self.gate_metrics.clone()
    }

    /// Links edges over channels in this process instead of sockets (the load tool's
    /// in-process mode; `test-hooks` feature).
    #[cfg(feature = "test-hooks")]
    pub fn memory_connector(&self) -> MemoryConnector {
        self.memory.clone()
    }

    /// Stops accepting connections and shuts the server down (open connections are dropped
    /// when `graceful` is false).
    pub async fn stop(&self, graceful: bool) {
        self.handle.stop(graceful).await;
    }
}

/// Starts the CloudHub module in `hive` and its WebSocket server on plain `ws://`, with no
/// node identity checks: for tests and local development (see [`start_cloudhub_with`]).
///
/// Must be called inside a running actix system; the server runs on `WORKERS` worker
/// threads and the module on the current arbiter.
pub async fn start_cloudhub(
    hive: &Hive,
    options: CloudHubOptions,
) -> Result<CloudHubServer, CloudHubError> {
    start_cloudhub_with(hive, options, CloudHubSecurity::default()).await
}

/// Starts CloudHub with `security`: mutual TLS on the WebSocket port when it has a
/// [`CloudTls`](crate::identity::tls::CloudTls), and upstream messages scoped to the sending node when
/// `authorize` is set.
pub async fn start_cloudhub_with(
    hive: &Hive,
    options: CloudHubOptions,
    security: CloudHubSecurity,
) -> Result<CloudHubServer, CloudHubError> {
    let tls_config = match &security.tls {
        Some(tls) => Some(tls.websocket_config()?),
        None => None,
    };
    let gate_metrics = GateMetrics::register(hive);
    let module = CloudHubModule::with_security(hive, options.clone(), security);
    let shared = module.shared();
    let context_tls = shared.hub.security.tls.is_some();
    hive.start_module(module)?;
    let tree = shared.clone();
    hive.set_children(CLOUDHUB_MODULE, Arc::new(move |limit| tree.children(limit)))?;
    let address = format!("{}:{}", options.address, options.port);
    let context = web::Data::new(ServerContext {
        hive: hive.clone(),
        shared,
        warnings: Arc::new(std::sync::Mutex::new(WarnBudget::with_limit(
            REFUSAL_WARNINGS_PER_WINDOW,
        ))),
        keepalives: KeepaliveWheel::start(options.keepalive_interval),
    });
    #[cfg(feature = "test-hooks")]
    let memory = MemoryConnector {
        context: context.clone(),
    };
    let bind_error = |source: std::io::Error| CloudHubError::Bind {
        address: address.clone(),
        source,
    };
    let (server, local_addr) = match tls_config {
        // TLS: actix-web's parts behind the handshake gate (see `gate`).
        Some(config) => {
            let listener = gate::listener(&options.address, options.port).map_err(bind_error)?;
            let local_addr = listener.local_addr().map_err(bind_error)?;
            let door = Gate::new("websocket", options.handshake_limits, gate_metrics.clone());
            let app_context = context.clone();
            let server = gate::serve_upgrading(
                "cloudhub-websocket",
                listener,
                WORKERS,
                config,
                door,
                move || {
                    App::new()
                        .app_data(app_context.clone())
                        .default_service(web::to(not_upgraded))
                },
                upgrade_factory(context.clone()),
            )
            .map_err(bind_error)?;
            (server, local_addr)
        }
        // Plain ws:// (development and tests only): the same parts without TLS.
        None => {
            let listener = gate::listener(&options.address, options.port).map_err(bind_error)?;
            let local_addr = listener.local_addr().map_err(bind_error)?;
            let timeout = options.handshake_limits.timeout;
            let app_context = context.clone();
            let upgrade = upgrade_factory(context.clone());
            let server = actix_web::dev::Server::build()
                .workers(WORKERS)
                .disable_signals()
                .listen("cloudhub-websocket", listener, move || {
                    let app_context = app_context.clone();
                    HttpService::build()
                        .client_request_timeout(timeout)
                        .upgrade(upgrade())
                        .finish(map_config(
                            App::new()
                                .app_data(app_context)
                                .default_service(web::to(not_upgraded))
                                .into_factory()
                                .map_err(|err| err.error_response()),
                            |_| AppConfig::default(),
                        ))
                        .tcp()
                })
                .map_err(bind_error)?
                .run();
            (server, local_addr)
        }
    };
    let handle = server.handle();
    actix::spawn(async move {
        if let Err(err) = server.await {
            tracing::error!(error = %err, "cloudhub WebSocket server failed");
        }
    });
    tracing::info!(%local_addr, tls = context_tls, "cloudhub listening");
    Ok(CloudHubServer {
        local_addr,
        handle,
        gate_metrics,
        #[cfg(feature = "test-hooks")]
        memory,
    })
}

struct ServerContext {
    hive: Hive,
    shared: Shared,
    /// Warning lines for refused connections, for all peers together (each refusal is
    /// counted and recorded whatever the budget says).
    warnings: Arc<std::sync::Mutex<WarnBudget>>,
    /// Every session's keepalive deadline.
    keepalives: Arc<KeepaliveWheel>,
}

/// Refused-connection warnings logged per [`WarnBudget::WINDOW`], all peers together.
const REFUSAL_WARNINGS_PER_WINDOW: u32 = 50;

impl ServerContext {
    /// Logs a refused connection (clipped), unless the budget holds it back.
    fn warn_refused(&self, peer: Option<SocketAddr>, node: &str, text: &str) {
        let held_back = crate::hive::locks::lock(&self.warnings).take(std::time::Instant::now());
        if let Some(held_back) = held_back {
            tracing::warn!(?peer, node = %clip(node), reason = %clip(text), held_back, "edge connection refused");
        }
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// The node name from the headers, or why the request is refused.
fn check_headers(headers: &HeaderMap) -> Result<String, String> {
    let node = header(headers, "node_id").unwrap_or_default();
    if node.is_empty() {
        return Err("missing node_id header".into());
    }
    check_node_name(node).map_err(|reason| format!("invalid node_id: {reason}"))?;
    if header(headers, "project_id").is_none_or(str::is_empty) {
        return Err("missing project_id header".into());
    }
    match header(headers, "ConnectionUse") {
        Some("msg") => Ok(node.to_owned()),
        Some(other) => Err(format!(
            "unsupported ConnectionUse {other:?}: expected \"msg\""
        )),
        None => Err("missing ConnectionUse header (expected \"msg\")".into()),
    }
}

/// A request that passed the checks before its handshake.
struct Checked {
    node: String,
    store_id: Option<String>,
    hub: Addr<CloudHub>,
}

/// The checks every request to the WebSocket port gets, in order (headers, the client
/// certificate's node, [`before_handshake`]), each refusal counted and recorded.
fn check_request(
    context: &ServerContext,
    headers: &HeaderMap,
    certificate: Option<&PeerCertificate>,
    peer: Option<SocketAddr>,
) -> Result<Checked, Refused> {
    let node = match check_headers(headers) {
        Ok(node) => node,
        Err(reason) => {
            context.warn_refused(peer, "", &reason);
            context.shared.hub.metrics.deny("bad_headers");
            context.shared.hub.metrics.record_refusal(
                RefusalKind::Connection,
                "bad_headers",
                None,
                peer,
                &reason,
            );
            return Err(Refused {
                status: StatusCode::BAD_REQUEST,
                text: reason,
            });
        }
    };
    let hub_context = &context.shared.hub;
    // An edgehive edge's store identity (a UUID); anything else is ignored.
    let store_id = header(headers, edgehive_protocols::STORE_ID_HEADER)
        .filter(|id| id.len() <= 64 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
        .map(str::to_owned);
    if hub_context.security.tls.is_some() {
        let refusal = match certificate_node(certificate) {
            Some(cert_node) if cert_node == node => None,
            Some(cert_node) => Some((
                "cert_mismatch",
                format!(
                    "node_id {node:?} does not match the client certificate's node {cert_node:?}"
                ),
            )),
            None => Some((
                "no_node_certificate",
                "the client certificate does not name a node (CN system:node:{name})".to_owned(),
            )),
        };
        if let Some((reason, text)) = refusal {
            context.warn_refused(peer, &node, &text);
            hub_context.metrics.deny(reason);
            hub_context.metrics.record_refusal(
                RefusalKind::Connection,
                reason,
                Some(&node),
                peer,
                &text,
            );
            return Err(Refused {
                status: StatusCode::FORBIDDEN,
                text,
            });
        }
    }
    let hub = before_handshake(context, &node, peer)?;
    Ok(Checked {
        node,
        store_id,
        hub,
    })
}

/// A request that is not a WebSocket upgrade (actix-http hands those to [`upgrade`]): the
/// same checks, then the handshake's own error.
async fn not_upgraded(
    req: HttpRequest,
    context: web::Data<ServerContext>,
) -> actix_web::Result<HttpResponse> {
    if let Err(refused) = check_request(
        &context,
        req.headers(),
        req.conn_data::<PeerCertificate>(),
        req.peer_addr(),
    ) {
        return Ok(refused.response());
    }
    // A request whose headers pass the handshake's checks but that actix-http did not take
    // for an upgrade (an `Upgrade` header naming more than `websocket`) cannot be upgraded
    // here: it is answered as one without the header.
    ws::verify_handshake(req.head())?;
    Err(ws::HandshakeError::NoWebsocketUpgrade.into())
}

/// The service actix-http calls with a WebSocket upgrade request and its connection, on the
/// connection's worker.
fn upgrade_factory<T>(
    context: web::Data<ServerContext>,
) -> impl Fn() -> UpgradeFactory<T> + Send + Clone + 'static
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
{
    move || {
        let context = context.clone();
        actix_service::boxed::factory(fn_service(
            move |(req, framed): (Request, Framed<T, h1::Codec>)| {
                upgrade(context.clone(), req, framed)
            },
        ))
    }
}

/// What [`upgrade_factory`] makes.
pub(crate) type UpgradeFactory<T> = actix_service::boxed::BoxServiceFactory<
    (),
    (Request, Framed<T, h1::Codec>),
    (),
    actix_web::Error,
    (),
>;

/// Answers a WebSocket upgrade request on its connection and, when admitted, starts its
/// session there. It returns once the session is started (or the connection answered), so
/// the connection's HTTP task ends and only the session's reader and writer remain; the
/// session lives on this worker's arbiter and ends with it.
async fn upgrade<T>(
    context: web::Data<ServerContext>,
    req: Request,
    framed: Framed<T, h1::Codec>,
) -> Result<(), actix_web::Error>
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let parts = framed.into_parts();
    let mut io = parts.io;
    let mut codec = parts.codec;
    // Frames the client sent right behind its request; the HTTP buffers go now.
    let leftover = BytesMut::from(&parts.read_buf[..]);
    let mut out = BytesMut::from(&parts.write_buf[..]);
    drop(parts.read_buf);
    drop(parts.write_buf);
    let peer = req.peer_addr();
    let checked = match check_request(
        &context,
        req.headers(),
        req.conn_data::<PeerCertificate>(),
        peer,
    ) {
        Ok(checked) => checked,
        Err(refused) => {
            let (head, body) = refused.parts();
            answer(&mut io, &mut codec, out, head, body).await;
            return Ok(());
        }
    };
    let accept = match ws::handshake(req.head()) {
        Ok(mut accept) => accept.finish().drop_body(),
        Err(err) => {
            let (head, body) = Response::<BoxBody>::from(err).into_parts();
            let body = body.try_into_bytes().unwrap_or_default();
            answer(&mut io, &mut codec, out, head, body).await;
            return Ok(());
        }
    };
    // The client cannot send frames before it has the 101, so the session is attached to its
    // node before anything it sends is read.
    let admitted = admit(&context, checked.hub, &checked.node, peer).await;
    if let Err(err) = codec.encode(h1::Message::Item((accept, BodySize::None)), &mut out) {
        tracing::debug!(?peer, error = %err, "cannot encode the handshake answer");
    }
    match admitted {
        Ok((cell, session_id)) => {
            // A connection that fails here ends its session at the first read.
            if let Err(err) = write_out(&mut io, &out).await {
                tracing::debug!(?peer, error = %err, "handshake answer not written");
            }
            drop(out);
            let max_frame_bytes = context.shared.hub.options.max_frame_bytes;
            let link = SocketLink::new(io, leftover, max_frame_bytes);
            start_session(
                &context,
                cell,
                session_id,
                Link::Socket(link),
                checked.store_id,
            );
        }
        Err(refusal) => {
            // No session: the close frame is all this connection gets.
            let close = ws::Message::Close(Some(refusal));
            if ws::Codec::new().encode(close, &mut out).is_ok() {
                let _ = write_out(&mut io, &out).await;
            }
            let _ = io.shutdown().await;
        }
    }
    Ok(())
}

/// Writes `bytes` and flushes them.
async fn write_out<T: AsyncWrite + Unpin>(io: &mut T, bytes: &[u8]) -> std::io::Result<()> {
    io.write_all(bytes).await?;
    io.flush().await
}

/// Answers an upgrade request with `head` and `body` (as actix-http's dispatcher would: the
/// request asked for `Connection: upgrade`, so the connection ends after the answer).
async fn answer<T: AsyncWrite + Unpin>(
    io: &mut T,
    codec: &mut h1::Codec,
    mut out: BytesMut,
    head: Response<()>,
    body: Bytes,
) {
    let size = BodySize::Sized(body.len() as u64);
    let encoded = codec
        .encode(h1::Message::Item((head, size)), &mut out)
        .and_then(|()| {
            if body.is_empty() {
                Ok(())
            } else {
                codec.encode(h1::Message::Chunk(Some(body)), &mut out)
            }
        })
        .and_then(|()| codec.encode(h1::Message::Chunk(None), &mut out));
    if encoded.is_ok() && write_out(io, &out).await.is_ok() {
        let _ = io.shutdown().await;
    }
}

/// A connection refused before its WebSocket handshake: the HTTP answer.
struct Refused {
    status: StatusCode,
    text: String,
}

impl Refused {
    fn response(self) -> HttpResponse {
        HttpResponse::build(self.status)
            .content_type("text/plain; charset=utf-8")
            .body(self.text)
    }

    /// The same answer as [`Refused::response`], as a head and a body to encode.
    fn parts(self) -> (Response<()>, Bytes) {
        let head = Response::build(self.status)
            .content_type("text/plain; charset=utf-8")
            .finish()
            .drop_body();
        (head, Bytes::from(self.text))
    }
}

/// The checks before a session is asked for (the node must be in the cluster when
/// `refuseUnknownNodes` says so, CloudHub must be running): CloudHub's address, or the
/// refusal, counted.
fn before_handshake(
    context: &ServerContext,
    node: &str,
    peer: Option<SocketAddr>,
) -> Result<Addr<CloudHub>, Refused> {
    let hub_context = &context.shared.hub;
    if hub_context.options.refuse_unknown_nodes {
        let known = hub_context
            .security
            .view
            .as_deref()
            .is_none_or(|view| view.node_exists(node));
        if !known {
            context.warn_refused(peer, node, "no such Node in the cluster");
            hub_context.metrics.deny("unknown_node");
            hub_context.metrics.record_refusal(
                RefusalKind::Connection,
                "unknown_node",
                Some(node),
                peer,
                "no such Node in the cluster (modules.cloudHub.refuseUnknownNodes)",
            );
            return Err(Refused {
                status: StatusCode::FORBIDDEN,
                text: format!(
                    "node {node} is not in the cluster (modules.cloudHub.refuseUnknownNodes)"
                ),
            });
        }
    }
    context
        .hive
        .addr::<CloudHub>(CLOUDHUB_MODULE)
        .map_err(|err| Refused {
            status: StatusCode::SERVICE_UNAVAILABLE,
            text: format!("cloudhub unavailable: {err}"),
        })
}

/// Asks CloudHub to admit a session for `node` (the node limit): its cell and session
/// number, or the close frame that refuses it.
async fn admit(
    context: &ServerContext,
    hub: Addr<CloudHub>,
    node: &str,
    peer: Option<SocketAddr>,
) -> Result<(Arc<NodeCell>, u64), CloseReason> {
    let session_id = context
        .shared
        .next_session_id
        .fetch_add(1, Ordering::Relaxed);
    let admit = Admit {
        node: node.to_owned(),
        session_id,
        peer,
    };
    match tokio::time::timeout(ADMISSION_TIMEOUT, hub.send(admit)).await {
        Ok(Ok(Some(cell))) => Ok((cell, session_id)),
        Ok(Ok(None)) => Err(CloseReason {
            code: CloseCode::Policy,
            description: Some("node limit reached".into()),
        }),
        Ok(Err(_)) | Err(_) => {
            // It may have been admitted after all: give the node's slot back.
            hub.do_send(AdmitAbandoned {
                node: node.to_owned(),
                session_id,
            });
            Err(CloseReason {
                code: CloseCode::Again,
                description: Some("cloudhub unavailable".into()),
            })
        }
    }
}

/// Starts an admitted session on the current arbiter and attaches it to its node.
fn start_session(
    context: &ServerContext,
    cell: Arc<NodeCell>,
    session_id: u64,
    link: Link,
    store_id: Option<String>,
) {
    let hub_context = &context.shared.hub;
    let config = SessionConfig {
        max_frame_bytes: hub_context.options.max_frame_bytes,
    };
    let (addr, stats) =
        NodeSession::start(cell.clone(), hub_context.clone(), session_id, config, link);
    context
        .keepalives
        .track(cell.clone(), stats.clone(), session_id);
    cell.attach(session_id, addr.into(), stats, store_id, hub_context);
}

/// Links edges to a running CloudHub over channels in this process (see `cloudhub/memory.rs`).
#[cfg(feature = "test-hooks")]
#[derive(Clone)]
pub struct MemoryConnector {
    context: web::Data<ServerContext>,
}

#[cfg(feature = "test-hooks")]
impl std::fmt::Debug for MemoryConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryConnector").finish_non_exhaustive()
    }
}

/// Why CloudHub did not link an edge: the same reasons a socket would be refused for.
#[cfg(feature = "test-hooks")]
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct MemoryRefused(String);

#[cfg(feature = "test-hooks")]
impl MemoryConnector {
    /// Links edge `node` as a WebSocket connection would be admitted, with its session on the
    /// current arbiter. The cloud's frames for it go to `to_edge` tagged with `tag`; what the
    /// edge sends goes into the returned sender (one message per send, as a text frame), and
    /// dropping it is the connection ending.
    pub async fn connect(
        &self,
        node: &str,
        tag: u32,
        to_edge: EdgeInbox,
    ) -> Result<EdgeLink, MemoryRefused> {
        check_node_name(node)
            .map_err(|reason| MemoryRefused(format!("invalid node name {node:?}: {reason}")))?;
        let hub = before_handshake(&self.context, node, None)
            .map_err(|refused| MemoryRefused(refused.text))?;
        let (cell, session_id) = admit(&self.context, hub, node, None)
            .await
            .map_err(|close| MemoryRefused(close.description.unwrap_or_default()))?;
        let (sender, from_edge) = edge_link();
        let link = Link::Memory(MemoryLink {
            from_edge,
            to_edge,
            tag,
        });
        start_session(&self.context, cell, session_id, link, None);
        Ok(sender)
    }
}
