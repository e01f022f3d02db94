//! The egress server: the API server's own way to reach nodes through a proxy, its egress
//! selector (`--egress-selector-config-file`, egress `cluster`, `proxyProtocol: HTTPConnect`)
//! pointed at the cloud, instead of KubeEdge's iptables DNAT to the stream port.
//!
//! The API server sends `CONNECT HOST:PORT HTTP/1.1` for every connection it opens to a node,
//! pod or service, waits for `200` and then speaks to the target over the connection. A HOST
//! that is an edge node with a stream tunnel (its name, or the internal IP its edge reported,
//! the stream server's lookups) is connected to the stream server on loopback, which then does
//! what it does for a DNAT'd connection (TLS, the API server's client certificate, the `Host`
//! picking the tunnel); any other HOST:PORT is dialled and piped both ways as it is.
//!
//! Not an open proxy: over TCP the client must present a certificate from the stream CA
//! (`tlsStreamCAFile`, the API server's kubelet client certificate), over a Unix socket the
//! socket is 0600 in a 0700 folder; direct CONNECTs never reach the cloud host's loopback
//! (unless allowed), link-local, multicast or unspecified addresses ([`proxyable`]). Bounds:
//! connections before their CONNECT head hold the TLS ports' kind of places (`gate::Slots`:
//! per source and in all, a newcomer from an address holding fewer evicting the largest
//! holder's oldest; the handshake and head within the handshake timeout, a head of at most
//! [`MAX_HEAD`] bytes); piped ones are at most `max_connections`; a piped connection silent
//! both ways for `streamIdleTimeout` is closed. Refusals are counted in
//! `edgehive_cloudstream_refused_total{reason="egress_*"}`.
//!
//! The server runs on an arbiter (thread) of its own: the bytes it pipes and the TLS it ends
//! do not share the actix system's thread.

use std::cell::Cell;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix_rt::ArbiterHandle;
use actix_service::{Service, ServiceFactory};
use actix_tls::accept::rustls_0_23::{Acceptor, TlsStream};
use actix_tls::accept::TlsError;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::sync::watch;
use tokio::time::Instant;

use super::context::StreamContext;
use crate::cloud::cloudhub::gate::{source_of, Eviction, HandshakeLimits, Refused, Slot, Slots};
use crate::hive::{Hive, RefusalKind};
use crate::identity::private_files::create_private_dir;

/// The largest CONNECT head (request line and headers) read.
pub(crate) const MAX_HEAD: usize = 8 * 1024;
/// Bytes read at a time from each side of a piped connection.
const PIPE_BUFFER: usize = 16 * 1024;
/// How long an error answer may take to write.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// Label of the connections counter: where a CONNECT went.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    /// `tunnel` (an edge node, through the stream server) or `direct`.
    route: String,
}

/// The egress server's own metrics (its refusals are CloudStream's).
#[derive(Clone, Default)]
struct EgressMetrics {
    open: Gauge,
    opened: Family<RouteLabels, Counter>,
}

impl EgressMetrics {
    fn register(hive: &Hive) -> Self {
        let metrics = EgressMetrics::default();
        let registry = hive.metrics();
        registry.register(
            "edgehive_cloudstream_egress_connections",
            "Connections the API server's egress selector has open through the cloud (after CONNECT)",
            metrics.open.clone(),
        );
        registry.register(
            "edgehive_cloudstream_egress_connections_opened",
            "Connections opened through the egress server, by route (tunnel: an edge node through its stream tunnel; direct)",
            metrics.opened.clone(),
        );
        metrics
    }
}

/// Connections piped at once (after their CONNECT), all clients together: they are the
/// authenticated API server's, so one bound in all; a [`Piped`] gives its place back when
/// dropped.
struct PipedLimit {
    limit: usize,
    open: Arc<AtomicUsize>,
}

struct Piped(Arc<AtomicUsize>);

impl PipedLimit {
    fn new(limit: usize) -> Self {
        PipedLimit {
            limit,
            open: Arc::default(),
        }
    }

    /// A place, if fewer than the limit are taken.
    fn enter(&self) -> Option<Piped> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < self.limit).then_some(open + 1)
            })
            .ok()
            .map(|_| Piped(self.open.clone()))
    }
}

impl Drop for Piped {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Where the egress server listens.
enum Listening {
    Tcp(std::net::TcpListener, Box<rustls::ServerConfig>),
    Unix(std::os::unix::net::UnixListener),
}

/// A listener that could not be opened.
#[derive(Debug)]
pub(super) struct BindFailed {
    /// `address:port` or the socket's path.
    pub(super) address: String,
    /// The operating system's reason.
    pub(super) source: io::Error,
}

/// The running egress server.
pub(super) struct EgressServer {
    addr: Option<SocketAddr>,
    uds: Option<PathBuf>,
    shutdown: watch::Sender<bool>,
    arbiter: ArbiterHandle,
}

impl EgressServer {
    /// Its TLS address (none on a Unix socket).
    pub(super) fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// Stops accepting, ends every connection and removes the Unix socket.
    pub(super) fn stop(&self) {
        self.shutdown.send_replace(true);
        self.arbiter.stop();
        if let Some(path) = &self.uds {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// What every connection of the server shares (on its arbiter).
struct Egress {
    context: Arc<StreamContext>,
    metrics: EgressMetrics,
    /// The stream server, as reached from here (loopback when it binds every interface).
    stream_server: SocketAddr,
    limits: HandshakeLimits,
    /// Connections before their CONNECT head: the TLS ports' bounds, with their fair
    /// eviction (`cloudhub::gate`).
    pending: Slots,
    established: PipedLimit,
    dial_timeout: Duration,
    idle_timeout: Duration,
    allow_loopback: bool,
}

/// Opens the egress listener (the Unix socket `egress.uds_name`, else TLS on `address` and
/// `egress.port`, the cloud's server certificate, client certificates checked against the
/// stream CA by `tls`) and serves it on an arbiter of its own.
pub(super) fn start(
    hive: &Hive,
    context: Arc<StreamContext>,
    tls: rustls::ServerConfig,
    stream_addr: SocketAddr,
) -> Result<EgressServer, BindFailed> {
    let options = &context.options;
    let (listening, addr, uds) = match &options.egress.uds_name {
        Some(path) => {
            let listener = bind_unix(path).map_err(|source| BindFailed {
                address: path.display().to_string(),
                source,
            })?;
            (Listening::Unix(listener), None, Some(path.clone()))
        }
        None => {
            let address = format!("{}:{}", options.address, options.egress.port);
            let failed = |source| BindFailed {
                address: address.clone(),
                source,
            };
            let listener =
                crate::cloud::cloudhub::gate::listener(&options.address, options.egress.port)
                    .map_err(failed)?;
            listener.set_nonblocking(true).map_err(failed)?;
            let local = listener.local_addr().map_err(failed)?;
            (Listening::Tcp(listener, Box::new(tls)), Some(local), None)
        }
    };
    let limits = options.handshake_limits;
    let egress = Egress {
        metrics: EgressMetrics::register(hive),
        stream_server: reachable(stream_addr),
        limits,
        pending: Slots::new(limits.per_source, limits.total),
        established: PipedLimit::new(options.egress.max_connections),
        dial_timeout: options.egress.dial_timeout,
        idle_timeout: options.idle_timeout,
        allow_loopback: options.egress.allow_loopback,
        context,
    };
    let (shutdown, stopped) = watch::channel(false);
    let arbiter = actix_rt::Arbiter::try_new().map_err(|source| BindFailed {
        address: "a thread for the egress server".to_owned(),
        source,
    })?;
    let handle = arbiter.handle();
    let egress = Arc::new(egress);
    // The accept loop holds the TLS acceptor (not `Send`): made on the arbiter's thread.
    handle.spawn_fn(move || {
        actix_rt::spawn(serve(egress, listening, stopped));
    });
    match (&addr, &uds) {
        (Some(addr), _) => tracing::info!(%addr, "cloudstream egress server listening"),
        (_, Some(uds)) => {
            tracing::info!(socket = %uds.display(), "cloudstream egress server listening")
        }
        _ => {}
    }
    Ok(EgressServer {
        addr,
        uds,
        shutdown,
        arbiter: handle,
    })
}

/// The address to dial for a server bound to `addr` (loopback for "every interface").
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, addr.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, addr.port()).into(),
        _ => addr,
    }
}

/// The Unix socket at `path`, 0600, in a folder created 0700 when missing; a socket left
/// from an earlier run is replaced, any other file there is an error.
fn bind_unix(path: &Path) -> io::Result<std::os::unix::net::UnixListener> {
    if let Some(dir) = path.parent() {
        create_private_dir(dir)?;
        if let Ok(metadata) = std::fs::metadata(dir) {
            if metadata.permissions().mode() & 0o077 != 0 {
                tracing::warn!(
                    folder = %dir.display(),
                    "the egress socket's folder is open to other users; the socket itself is 0600"
                );
            }
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if metadata.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "a file that is not a socket is in the way",
            ))
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(error),
    }
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// The accept loop, on the egress arbiter.
async fn serve(egress: Arc<Egress>, listening: Listening, mut stopped: watch::Receiver<bool>) {
    match listening {
        Listening::Tcp(listener, tls) => {
            let listener = match TcpListener::from_std(listener) {
                Ok(listener) => listener,
                Err(error) => {
                    tracing::error!(%error, "cloudstream egress server cannot listen");
                    return;
                }
            };
            let mut acceptor = Acceptor::new(*tls);
            acceptor.set_handshake_timeout(egress.limits.timeout);
            let Ok(acceptor) = ServiceFactory::<TcpStream>::new_service(&acceptor, ()).await else {
                tracing::error!("cloudstream egress server: no TLS acceptor");
                return;
            };
            let acceptor = Rc::new(acceptor);
            loop {
                tokio::select! {
                    _ = stopped.wait_for(|stop| *stop) => return,
                    accepted = listener.accept() => match accepted {
                        Ok((tcp, peer)) => {
                            actix_rt::spawn(serve_tls(
                                egress.clone(),
                                acceptor.clone(),
                                tcp,
                                peer,
                            ));
                        }
                        Err(error) => accept_failed(error).await,
                    },
                }
            }
        }
        Listening::Unix(listener) => {
            let listener = match UnixListener::from_std(listener) {
                Ok(listener) => listener,
                Err(error) => {
                    tracing::error!(%error, "cloudstream egress server cannot listen");
                    return;
                }
            };
            loop {
                tokio::select! {
                    _ = stopped.wait_for(|stop| *stop) => return,
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => {
                            let egress = egress.clone();
                            actix_rt::spawn(async move {
                                let Some(pending) = egress.enter(None) else {
                                    return;
                                };
                                let deadline = Instant::now() + egress.limits.timeout;
                                egress.serve_connect(stream, None, pending, deadline).await;
                            });
                        }
                        Err(error) => accept_failed(error).await,
                    },
                }
            }
        }
    }
}

/// An accept error (out of file descriptors, say): logged, and a pause before the next.
async fn accept_failed(error: io::Error) {
    tracing::warn!(%error, "cloudstream egress server: accept failed");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

const TOO_MANY: &str = "too many connections to the egress server";

/// Why the handshake or head phase ended early.
enum Cut {
    /// The handshake timeout passed.
    Timeout,
    /// A connection from an address holding fewer places took this one's.
    Evicted,
}

/// `work`, until `deadline` or until the place is evicted.
async fn bounded<F: std::future::Future>(
    deadline: Instant,
    eviction: &mut Eviction,
    work: F,
) -> Result<F::Output, Cut> {
    tokio::select! {
        biased;
        _ = eviction => Err(Cut::Evicted),
        done = tokio::time::timeout_at(deadline, work) => done.map_err(|_| Cut::Timeout),
    }
}

const EVICTED: &str =
    "evicted before its CONNECT: the places were full and another address held fewer";

/// Why a target could not be connected.
enum DialError {
    /// Only addresses the egress server does not connect to.
    Forbidden,
    Io(io::Error),
}

/// Whether a direct CONNECT may reach `ip`: not the cloud host itself (loopback, unless
/// allowed), nor link-local (a cloud's metadata service), multicast or unspecified addresses;
/// the API server's own proxy refuses these for nodes, pods and services too.
fn proxyable(ip: IpAddr, allow_loopback: bool) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    };
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    };
    (allow_loopback || !ip.is_loopback())
        && !ip.is_unspecified()
        && !ip.is_multicast()
        && !link_local
}

/// How a CONNECT head failed to arrive.
enum HeadError {
    Closed,
    TooLarge,
    Io(io::Error),
}

/// A parsed `CONNECT HOST:PORT HTTP/1.x` head.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Connect {
    /// The host, an IP address without brackets or a name.
    pub(crate) host: String,
    /// The port.
    pub(crate) port: u16,
}

/// Where a CONNECT goes.
enum Route {
    /// An edge node, through the stream server.
    Tunnel(String),
    /// Anywhere else.
    Direct,
}

impl Egress {
    /// A place before the CONNECT head for `source` (see [`Slots`]), or the refusal counted.
    fn enter(&self, peer: Option<SocketAddr>) -> Option<(Slot, Eviction)> {
        match self.pending.enter(peer.map(|peer| source_of(peer.ip()))) {
            Ok((slot, eviction, _)) => Some((slot, eviction)),
            Err(Refused(bound)) => {
                let text = format!("{TOO_MANY} (before their CONNECT; the {bound} bound)");
                self.refused("egress_too_many", None, peer, &text);
                None
            }
        }
    }

    /// Counts and warns of a refusal (no answer: the connection is closed).
    fn refused(&self, reason: &str, node: Option<&str>, peer: Option<SocketAddr>, text: &str) {
        self.context
            .metrics()
            .refuse(RefusalKind::Connection, reason, node, peer, text);
        self.context.warn(peer, text);
    }

    /// Counts a refusal and answers it with `status` before closing.
    async fn refuse<S: AsyncWrite + Unpin>(
        &self,
        client: &mut S,
        reason: &str,
        node: Option<&str>,
        peer: Option<SocketAddr>,
        status: &str,
        text: &str,
    ) {
        self.refused(reason, node, peer, text);
        let body = format!("{text}\n");
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = tokio::time::timeout(ANSWER_TIMEOUT, async {
            client.write_all(head.as_bytes()).await?;
            client.write_all(body.as_bytes()).await?;
            client.shutdown().await
        })
        .await;
    }

    /// A connection to the TLS port: the handshake, the client certificate, then the CONNECT.
    async fn serve_tls_inner(
        &self,
        acceptor: &actix_tls::accept::rustls_0_23::AcceptorService,
        tcp: TcpStream,
        peer: SocketAddr,
    ) {
        let Some((pending, mut eviction)) = self.enter(Some(peer)) else {
            return;
        };
        let deadline = Instant::now() + self.limits.timeout;
        let stream: TlsStream<TcpStream> = match bounded(
            deadline,
            &mut eviction,
            acceptor.call(tcp),
        )
        .await
        {
            Ok(Ok(stream)) => stream,
            Ok(Err(TlsError::Tls(error))) => {
                let bad_certificate = error
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                    .is_some_and(|inner| {
                        matches!(
                            inner,
                            rustls::Error::InvalidCertificate(_)
                                | rustls::Error::NoCertificatesPresented
                        )
                    });
                let (reason, text) = if bad_certificate {
                    (
                            "egress_bad_certificate",
                            format!("the client certificate is not from the stream CA (tlsStreamCAFile): {error}"),
                        )
                } else {
                    (
                        "egress_tls_failed",
                        format!("TLS handshake failed: {error}"),
                    )
                };
                self.refused(reason, None, Some(peer), &text);
                return;
            }
            Ok(Err(TlsError::Service(never))) => match never {},
            Err(Cut::Evicted) => {
                self.refused("egress_evicted", None, Some(peer), EVICTED);
                return;
            }
            Ok(Err(TlsError::Timeout)) | Err(Cut::Timeout) => {
                self.refused(
                    "egress_timeout",
                    None,
                    Some(peer),
                    "no TLS handshake and CONNECT within the handshake timeout",
                );
                return;
            }
        };
        let mut stream = stream;
        let leaf = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .map(|leaf| leaf.to_vec());
        if let Some(Err(refusal)) = leaf
            .as_deref()
            .map(|leaf| super::streams::check_caller(Some(leaf)))
        {
            // A node's certificate from the stream CA (the cluster's CA signs kubelets'):
            // no proxy into the cluster, nor to other nodes' streams, for a node.
            self.refuse(
                &mut stream,
                "egress_node_certificate",
                None,
                Some(peer),
                "403 Forbidden",
                &refusal.text,
            )
            .await;
            return;
        }
        if leaf.is_none() {
            self.refuse(
                &mut stream,
                "egress_anonymous",
                None,
                Some(peer),
                "403 Forbidden",
                "a client certificate from the stream CA (tlsStreamCAFile) is required",
            )
            .await;
            return;
        }
        self.serve_connect(stream, Some(peer), (pending, eviction), deadline)
            .await;
    }

    /// Reads the CONNECT head by `deadline`, routes it, dials, answers 200 and pipes.
    async fn serve_connect<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        mut client: S,
        peer: Option<SocketAddr>,
        pending: (Slot, Eviction),
        deadline: Instant,
    ) {
        let (pending, mut eviction) = pending;
        let (head, rest) = match bounded(deadline, &mut eviction, read_head(&mut client)).await {
            Ok(Ok(read)) => read,
            Ok(Err(HeadError::TooLarge)) => {
                let text = format!("the CONNECT head is over {MAX_HEAD} bytes");
                self.refuse(
                    &mut client,
                    "egress_bad_request",
                    None,
                    peer,
                    "431 Request Header Fields Too Large",
                    &text,
                )
                .await;
                return;
            }
            Ok(Err(HeadError::Closed)) => {
                self.refused(
                    "egress_bad_request",
                    None,
                    peer,
                    "the connection closed before a whole CONNECT head",
                );
                return;
            }
            Ok(Err(HeadError::Io(error))) => {
                let text = format!("reading the CONNECT head failed: {error}");
                self.refused("egress_bad_request", None, peer, &text);
                return;
            }
            Err(Cut::Evicted) => {
                self.refused("egress_evicted", None, peer, EVICTED);
                return;
            }
            Err(Cut::Timeout) => {
                self.refuse(
                    &mut client,
                    "egress_timeout",
                    None,
                    peer,
                    "408 Request Timeout",
                    "no whole CONNECT head within the handshake timeout",
                )
                .await;
                return;
            }
        };
        let connect = match parse_connect(&head) {
            Ok(connect) => connect,
            Err(text) => {
                self.refuse(
                    &mut client,
                    "egress_bad_request",
                    None,
                    peer,
                    "400 Bad Request",
                    &text,
                )
                .await;
                return;
            }
        };
        drop((pending, eviction));
        let Some(_established) = self.established.enter() else {
            let text = format!(
                "{TOO_MANY} (modules.cloudStream.egress.maxConnections {})",
                self.established.limit
            );
            self.refuse(
                &mut client,
                "egress_too_many",
                None,
                peer,
                "503 Service Unavailable",
                &text,
            )
            .await;
            return;
        };
        let route = match self.route(&connect.host) {
            Ok(route) => route,
            Err(text) => {
                self.refuse(
                    &mut client,
                    "egress_dial_failed",
                    None,
                    peer,
                    "502 Bad Gateway",
                    &text,
                )
                .await;
                return;
            }
        };
        let dialled = match &route {
            Route::Tunnel(_) => {
                tokio::time::timeout(self.dial_timeout, async {
                    TcpStream::connect(self.stream_server)
                        .await
                        .map_err(DialError::Io)
                })
                .await
            }
            Route::Direct => {
                tokio::time::timeout(self.dial_timeout, self.dial(&connect.host, connect.port))
                    .await
            }
        };
        let node = match &route {
            Route::Tunnel(node) => Some(node.as_str()),
            Route::Direct => None,
        };
        let target = match &route {
            Route::Tunnel(node) => format!("node {node}'s stream tunnel"),
            Route::Direct => format!("{}:{}", connect.host, connect.port),
        };
        let mut upstream = match dialled {
            Ok(Ok(upstream)) => upstream,
            Ok(Err(DialError::Forbidden)) => {
                let text = format!(
                    "{target} is a loopback, link-local, multicast or unspecified address; the \
                     egress server does not connect there (as the API server's own proxy does \
                     not; modules.cloudStream.egress.allowLoopback for loopback)"
                );
                self.refuse(
                    &mut client,
                    "egress_forbidden_target",
                    node,
                    peer,
                    "403 Forbidden",
                    &text,
                )
                .await;
                return;
            }
            Ok(Err(DialError::Io(error))) => {
                let text = format!("cannot connect to {target}: {error}");
                self.refuse(
                    &mut client,
                    "egress_dial_failed",
                    node,
                    peer,
                    "502 Bad Gateway",
                    &text,
                )
                .await;
                return;
            }
            Err(_) => {
                let text = format!(
                    "cannot connect to {target} within {} s",
                    self.dial_timeout.as_secs()
                );
                self.refuse(
                    &mut client,
                    "egress_dial_failed",
                    node,
                    peer,
                    "504 Gateway Timeout",
                    &text,
                )
                .await;
                return;
            }
        };
        let _ = upstream.set_nodelay(true);
        let ready = async {
            client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await?;
            client.flush().await?;
            upstream.write_all(&rest).await
        };
        if tokio::time::timeout(ANSWER_TIMEOUT, ready).await.is_err() {
            return;
        }
        let route_label = match route {
            Route::Tunnel(_) => "tunnel",
            Route::Direct => "direct",
        };
        self.metrics
            .opened
            .get_or_create(&RouteLabels {
                route: route_label.to_owned(),
            })
            .inc();
        self.metrics.open.inc();
        pipe(client, upstream, self.idle_timeout).await;
        self.metrics.open.dec();
    }

    /// Connects to `host:port` (a name is resolved first), to its first address that
    /// answers among those allowed (see [`proxyable`]).
    async fn dial(&self, host: &str, port: u16) -> Result<TcpStream, DialError> {
        let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(DialError::Io)?
            .filter(|address| proxyable(address.ip(), self.allow_loopback))
            .collect();
        if addresses.is_empty() {
            return Err(DialError::Forbidden);
        }
        let mut last = None;
        for address in addresses {
            match TcpStream::connect(address).await {
                Ok(stream) => return Ok(stream),
                Err(error) => last = Some(error),
            }
        }
        Err(DialError::Io(last.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "no address")
        })))
    }

    /// An edge node's tunnel for `host` (its name, or the one node that claimed the address),
    /// else a direct connection.
    fn route(&self, host: &str) -> Result<Route, String> {
        let sessions = &self.context.sessions;
        if let Ok(ip) = host.parse::<IpAddr>() {
            return match sessions.by_ip(ip) {
                Ok(tunnel) => Ok(Route::Tunnel(tunnel.node.clone())),
                Err(0) => Ok(Route::Direct),
                Err(_) => Err(format!(
                    "more than one node with a stream tunnel claims the address {ip}"
                )),
            };
        }
        Ok(match sessions.by_name(host) {
            Some(tunnel) => Route::Tunnel(tunnel.node.clone()),
            // A node some cloud replica served (its Lease): the stream server forwards it to
            // its owner, or says why it cannot.
            None if self.context.ownership.owner(host).is_some() => Route::Tunnel(host.to_owned()),
            None => Route::Direct,
        })
    }
}

/// Serves one TLS connection (spawned per connection on the egress arbiter).
async fn serve_tls(
    egress: Arc<Egress>,
    acceptor: Rc<actix_tls::accept::rustls_0_23::AcceptorService>,
    tcp: TcpStream,
    peer: SocketAddr,
) {
    egress.serve_tls_inner(&acceptor, tcp, peer).await;
}

/// Reads up to the head's blank line; returns the head and any bytes read after it.
async fn read_head<S: AsyncRead + Unpin>(client: &mut S) -> Result<(Vec<u8>, Vec<u8>), HeadError> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        let read = client.read(&mut chunk).await.map_err(HeadError::Io)?;
        if read == 0 {
            return Err(HeadError::Closed);
        }
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..read]);
        if let Some(at) = head[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            let end = from + at + 4;
            if end > MAX_HEAD {
                return Err(HeadError::TooLarge);
            }
            let rest = head.split_off(end);
            return Ok((head, rest));
        }
        if head.len() >= MAX_HEAD {
            return Err(HeadError::TooLarge);
        }
    }
}

/// A CONNECT head: `CONNECT HOST:PORT HTTP/1.1`, header lines, a `Host` header (HTTP/1.1).
pub(crate) fn parse_connect(head: &[u8]) -> Result<Connect, String> {
    let text = std::str::from_utf8(head).map_err(|_| "the request head is not text".to_owned())?;
    let mut lines = text.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("the request line is not METHOD TARGET VERSION".to_owned());
    };
    if method != "CONNECT" {
        return Err(format!(
            "only CONNECT is served here (the API server's egress selector, HTTPConnect), not {:?}",
            crate::hive::log::clip(method)
        ));
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Err("the request is not HTTP/1.1".to_owned());
    }
    let mut host = false;
    for line in lines.filter(|line| !line.is_empty()) {
        let Some((name, _)) = line.split_once(':') else {
            return Err("a header line has no colon".to_owned());
        };
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("a header name is not a token".to_owned());
        }
        host |= name.eq_ignore_ascii_case("host");
    }
    if !host && version == "HTTP/1.1" {
        return Err("the CONNECT has no Host header".to_owned());
    }
    parse_authority(target)
}

/// `HOST:PORT` of a CONNECT: a name, an IPv4 address or a bracketed IPv6 address, and a port.
fn parse_authority(target: &str) -> Result<Connect, String> {
    let bad = || {
        format!(
            "the CONNECT target {:?} is not HOST:PORT",
            crate::hive::log::clip(target)
        )
    };
    let (host, port) = if let Some(rest) = target.strip_prefix('[') {
        let (ip, port) = rest.split_once("]:").ok_or_else(bad)?;
        ip.parse::<Ipv6Addr>().map_err(|_| bad())?;
        (ip, port)
    } else {
        target.rsplit_once(':').ok_or_else(bad)?
    };
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|port| *port != 0)
        .ok_or_else(bad)?;
    let valid_name = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_' || b == b':');
    if !valid_name || (host.contains(':') && host.parse::<Ipv6Addr>().is_err()) {
        return Err(bad());
    }
    Ok(Connect {
        host: host.to_owned(),
        port,
    })
}

/// Copies both ways until both sides have ended (or one fails), or nothing moved either way
/// for `idle`.
pub(super) async fn pipe<A, B>(client: A, upstream: B, idle: Duration)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut upstream_read, mut upstream_write) = tokio::io::split(upstream);
    let last = Cell::new(Instant::now());
    let both = futures_util::future::try_join(
        copy(&mut client_read, &mut upstream_write, &last),
        copy(&mut upstream_read, &mut client_write, &last),
    );
    let idle_out = async {
        loop {
            let due = last.get() + idle;
            if Instant::now() >= due {
                return;
            }
            tokio::time::sleep_until(due).await;
        }
    };
    tokio::select! {
        _ = both => {}
        () = idle_out => {}
    }
}

async fn copy<R, W>(from: &mut R, to: &mut W, last: &Cell<Instant>) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buffer = vec![0u8; PIPE_BUFFER];
    loop {
        let read = from.read(&mut buffer).await?;
        if read == 0 {
            return to.shutdown().await;
        }
        to.write_all(&buffer[..read]).await?;
        last.set(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cloud_host_link_local_and_multicast_addresses_are_not_proxied() {
        for ip in [
            "127.0.0.1",
            "127.9.9.9",
            "::1",
            "::ffff:127.0.0.1",
            "0.0.0.0",
            "::",
            "169.254.169.254",
            "fe80::1",
            "224.0.0.1",
            "ff02::1",
        ] {
            assert!(!proxyable(ip.parse().unwrap(), false), "{ip}");
        }
        for ip in ["10.0.0.5", "192.0.2.2", "2001:db8::1", "8.8.8.8"] {
            assert!(proxyable(ip.parse().unwrap(), false), "{ip}");
        }
        assert!(proxyable("127.0.0.1".parse().unwrap(), true));
        assert!(!proxyable("169.254.169.254".parse().unwrap(), true));
    }

    #[test]
    fn connect_heads_as_the_api_server_writes_them_parse_and_others_do_not() {
        let parsed = parse_connect(b"CONNECT 192.0.2.2:10350 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
        assert_eq!(
            parsed,
            Ok(Connect {
                host: "192.0.2.2".into(),
                port: 10350
            })
        );
        let parsed = parse_connect(b"CONNECT [2001:db8::1]:10250 HTTP/1.1\r\nhost: x\r\n\r\n");
        assert_eq!(parsed.map(|c| c.host), Ok("2001:db8::1".to_owned()));
        assert_eq!(
            parse_connect(b"CONNECT edge-1:10250 HTTP/1.0\r\n\r\n").map(|c| c.port),
            Ok(10250)
        );
        for bad in [
            &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
            b"CONNECT edge-1:10250 HTTP/1.1\r\n\r\n",
            b"CONNECT edge-1 HTTP/1.1\r\nHost: x\r\n\r\n",
            b"CONNECT edge-1:0 HTTP/1.1\r\nHost: x\r\n\r\n",
            b"CONNECT edge-1:99999 HTTP/1.1\r\nHost: x\r\n\r\n",
            b"CONNECT :10250 HTTP/1.1\r\nHost: x\r\n\r\n",
            b"CONNECT a/b:10250 HTTP/1.1\r\nHost: x\r\n\r\n",
            b"CONNECT [::1:10250 HTTP/1.1\r\nHost: x\r\n\r\n",
            b"CONNECT a:b:10250 HTTP/1.1\r\nHost: x\r\n\r\n",
            b"CONNECT edge-1:10250 HTTP/2\r\nHost: x\r\n\r\n",
            b"CONNECT edge-1:10250 HTTP/1.1\r\nno colon\r\n\r\n",
            b"CONNECT  edge-1:10250 HTTP/1.1\r\nHost: x\r\n\r\n",
            b"\xff\xfe\r\n\r\n",
        ] {
            assert!(
                parse_connect(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
