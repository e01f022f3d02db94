//! The door of CloudHub's TLS ports (the WebSocket port and the certificate server): it
//! bounds the TLS handshakes in progress, per source address and in all, before rustls reads
//! a byte, so idle or slow connections from one place cannot keep edges from elsewhere out.
//!
//! Policy: a connection is refused at once (closed, counted) when its source address already
//! has [`HandshakeLimits::per_source`] handshakes in progress, or when
//! [`HandshakeLimits::total`] are in progress; a handshake not finished within
//! [`HandshakeLimits::timeout`] is dropped (counted). Established connections are not
//! counted: the limits bound only what a peer without credentials can hold. A request that
//! does not come within the timeout after the handshake is dropped too (actix-http's client
//! request timeout).

use std::any::Any;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_codec::Framed;
use actix_http::{h1, HttpService, Protocol, Request};
use actix_service::{
    fn_factory, fn_service, map_config, IntoServiceFactory, ServiceFactory, ServiceFactoryExt,
};
use actix_tls::accept::rustls_0_23::{Acceptor, TlsStream};
use actix_tls::accept::TlsError;
use actix_web::body::MessageBody;
use actix_web::dev::{AppConfig, Extensions, Server, Service};
use actix_web::rt::net::TcpStream;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use rustls::ServerConfig;

use super::metrics::ReasonLabels;
use crate::hive::{Hive, RefusalKind, RefusalLog};
use crate::identity::tls::record_peer_certificate;

/// The bounds; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeLimits {
    /// Longest a TLS handshake (and then the first request) may take.
    pub timeout: Duration,
    /// Most handshakes in progress from one source address.
    pub per_source: usize,
    /// Most handshakes in progress in all.
    pub total: usize,
}

impl Default for HandshakeLimits {
    fn default() -> Self {
        HandshakeLimits {
            timeout: Duration::from_secs(3),
            per_source: 32,
            total: 1024,
        }
    }
}

/// Labels of the gate's metrics: the port and, for refusals, why.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PortReason {
    port: String,
    reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PortLabel {
    port: String,
}

/// Metrics of every gate of a process (one family each, a `port` label per gate), and the
/// certificate server's refusals.
#[derive(Debug, Clone, Default)]
pub struct GateMetrics {
    pending: Family<PortLabel, Gauge>,
    refused: Family<PortReason, Counter>,
    certificates_refused: Family<ReasonLabels, Counter>,
    /// Where refusals are recorded beside their counters (the hive's log once registered).
    refusals: RefusalLog,
}

impl GateMetrics {
    /// Registers them with `hive`'s registry (once per process); refusals also go to the
    /// hive's [`RefusalLog`].
    pub fn register(hive: &Hive) -> Self {
        let metrics = GateMetrics {
            refusals: hive.refusals().clone(),
            ..GateMetrics::default()
        };
        let registry = hive.metrics();
        registry.register(
            "edgehive_tls_handshakes_pending",
            "TLS handshakes in progress, per port",
            metrics.pending.clone(),
        );
        registry.register(
            "edgehive_certserver_refused",
            "Certificate requests refused, by reason (no_token, bad_token, wrong_subject, invalid_node_name, unsupported_key, invalid_csr)",
            metrics.certificates_refused.clone(),
        );
        registry.register(
            "edgehive_tls_handshakes_refused",
            "Connections closed before or during the TLS handshake, per port and reason (per_source, total, timeout, failed)",
            metrics.refused.clone(),
        );
        metrics
    }
}

impl GateMetrics {
    /// Counts a refused certificate request (and records it: the node it named, if any,
    /// the peer, and what was wrong).
    pub fn certificate_refused(
        &self,
        reason: &str,
        node: &str,
        peer: Option<SocketAddr>,
        detail: &str,
    ) {
        self.certificates_refused
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
        let node = (!node.is_empty()).then_some(node);
        self.refusals
            .record(RefusalKind::Certificate, reason, node, peer, detail);
    }
}

struct GateState {
    per_source: HashMap<IpAddr, usize>,
    total: usize,
}

/// One port's gate. Cheap to clone; clones share the counts (all workers of a server).
#[derive(Clone)]
pub struct Gate {
    port: String,
    limits: HandshakeLimits,
    state: Arc<Mutex<GateState>>,
    metrics: GateMetrics,
}

/// A handshake in progress; leaving frees its place.
struct Place {
    gate: Gate,
    source: Option<IpAddr>,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut state = self.gate.lock();
        state.total = state.total.saturating_sub(1);
        if let Some(source) = self.source {
            if let Some(count) = state.per_source.get_mut(&source) {
                *count -= 1;
                if *count == 0 {
                    state.per_source.remove(&source);
                }
            }
        }
        self.gate.pending().dec();
    }
}

impl Gate {
    /// The gate of port `port` (a metrics label: `websocket`, `certificates`).
    pub fn new(port: &str, limits: HandshakeLimits, metrics: GateMetrics) -> Self {
        Gate {
            port: port.to_owned(),
            limits,
            state: Arc::new(Mutex::new(GateState {
                per_source: HashMap::new(),
                total: 0,
            })),
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        // Counts only; a panic cannot leave them half-written.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn pending(&self) -> Gauge {
        self.metrics
            .pending
            .get_or_create(&PortLabel {
                port: self.port.clone(),
            })
            .clone()
    }

    fn refuse(&self, reason: &str, peer: Option<SocketAddr>) {
        self.metrics
            .refused
            .get_or_create(&PortReason {
                port: self.port.clone(),
                reason: reason.to_owned(),
            })
            .inc();
        let detail = format!("{} port", self.port);
        self.metrics
            .refusals
            .record(RefusalKind::Handshake, reason, None, peer, &detail);
    }

    /// A place for a handshake from `source`, or why there is none.
    fn enter(&self, source: Option<IpAddr>) -> Result<Place, &'static str> {
        let source = source.map(source_of);
        let mut state = self.lock();
        if state.total >= self.limits.total {
            return Err("total");
        }
        if let Some(source) = source {
            let count = state.per_source.entry(source).or_insert(0);
            if *count >= self.limits.per_source {
                return Err("per_source");
            }
            *count += 1;
        }
        state.total += 1;
        drop(state);
        self.pending().inc();
        Ok(Place {
            gate: self.clone(),
            source,
        })
    }

    /// TCP connection -> TLS stream, through the gate.
    fn tls(
        &self,
        config: Arc<ServerConfig>,
    ) -> impl ServiceFactory<
        TcpStream,
        Config = (),
        Response = (TlsStream<TcpStream>, Protocol, Option<SocketAddr>),
        Error = (),
        InitError = (),
    > {
        let gate = self.clone();
        fn_factory(move || {
            let gate = gate.clone();
            let mut acceptor = Acceptor::new((*config).clone());
            acceptor.set_handshake_timeout(gate.limits.timeout);
            async move {
                let acceptor = Rc::new(
                    ServiceFactory::<TcpStream>::new_service(&acceptor, ())
                        .await
                        .map_err(|_| ())?,
                );
                Ok::<_, ()>(fn_service(move |io: TcpStream| {
                    let gate = gate.clone();
                    let acceptor = acceptor.clone();
                    async move {
                        let peer = io.peer_addr().ok();
                        let place = match gate.enter(peer.map(|p| p.ip())) {
                            Ok(place) => place,
                            Err(reason) => {
                                gate.refuse(reason, peer);
                                return Err(());
                            }
                        };
                        let accepted = acceptor.call(io).await;
                        drop(place);
                        match accepted {
                            Ok(tls) => {
                                let _ = tls.get_ref().0.set_nodelay(true);
                                Ok((tls, Protocol::Http1, peer))
                            }
                            Err(TlsError::Timeout) => {
                                gate.refuse("timeout", peer);
                                Err(())
                            }
                            Err(_) => {
                                gate.refuse("failed", peer);
                                Err(())
                            }
                        }
                    }
                }))
            }
        })
    }
}

/// The source a connection counts against: its IPv4 address, or its IPv6 /64 (one host
/// commonly holds a whole /64, so counting single IPv6 addresses would bound nothing).
fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut segments = v6.segments();
                segments[4..].fill(0);
                IpAddr::V6(segments.into())
            }
        },
    }
}

/// A listening socket for `address` with a deep accept queue (actix-web's default, 2048).
pub fn listener(address: &str, port: u16) -> std::io::Result<std::net::TcpListener> {
    let ip: IpAddr = address.parse().map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("not an IP address: {address}"),
        )
    })?;
    let addr = SocketAddr::new(ip, port);
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(2048)?.into_std()
}

/// Serves the actix-web app `app` over TLS on `listener`, behind `gate`, on `workers`
/// threads; the peer's client certificate is recorded for the handlers (as actix-web's
/// `on_connect` did).
pub fn serve<F, I, S, B>(
    name: &str,
    listener: std::net::TcpListener,
    workers: usize,
    tls: ServerConfig,
    gate: Gate,
    app: F,
) -> std::io::Result<Server>
where
    F: Fn() -> I + Send + Clone + 'static,
    I: IntoServiceFactory<S, Request>,
    S: ServiceFactory<Request, Config = AppConfig> + 'static,
    S::Error: Into<actix_web::Error> + 'static,
    S::InitError: std::fmt::Debug,
    S::Response: Into<actix_web::dev::Response<B>> + 'static,
    <S::Service as Service<Request>>::Future: 'static,
    S::Service: 'static,
    B: MessageBody + 'static,
{
    let tls = with_alpn(tls);
    let timeout = gate.limits.timeout;
    Ok(Server::build()
        .workers(workers)
        .disable_signals()
        .listen(name, listener, move || {
            let http = HttpService::build()
                .client_request_timeout(timeout)
                .on_connect_ext(|io: &TlsStream<TcpStream>, extensions: &mut Extensions| {
                    record_peer_certificate(io as &dyn Any, extensions)
                })
                .finish(map_config(
                    app()
                        .into_factory()
                        .map_err(|err| err.into().error_response()),
                    |_| AppConfig::default(),
                ));
            gate.tls(tls.clone()).and_then(http.map_err(|_| ()))
        })?
        .run())
}

/// As [`serve`], and a request for a WebSocket upgrade goes to the service `upgrade` makes,
/// with its connection (actix-http's `HttpService::upgrade`) instead of to `app`.
pub fn serve_upgrading<F, I, S, B, G, U>(
    name: &str,
    listener: std::net::TcpListener,
    workers: usize,
    tls: ServerConfig,
    gate: Gate,
    app: F,
    upgrade: G,
) -> std::io::Result<Server>
where
    F: Fn() -> I + Send + Clone + 'static,
    I: IntoServiceFactory<S, Request>,
    S: ServiceFactory<Request, Config = AppConfig> + 'static,
    S::Error: Into<actix_web::Error> + 'static,
    S::InitError: std::fmt::Debug,
    S::Response: Into<actix_web::dev::Response<B>> + 'static,
    <S::Service as Service<Request>>::Future: 'static,
    S::Service: 'static,
    B: MessageBody + 'static,
    G: Fn() -> U + Send + Clone + 'static,
    U: ServiceFactory<
            (Request, Framed<TlsStream<TcpStream>, h1::Codec>),
            Config = (),
            Response = (),
            Error = actix_web::Error,
            InitError = (),
        > + 'static,
    U::Future: 'static,
    U::Service: 'static,
    <U::Service as Service<(Request, Framed<TlsStream<TcpStream>, h1::Codec>)>>::Future: 'static,
{
    let tls = with_alpn(tls);
    let timeout = gate.limits.timeout;
    Ok(Server::build()
        .workers(workers)
        .disable_signals()
        .listen(name, listener, move || {
            let http = HttpService::build()
                .client_request_timeout(timeout)
                .on_connect_ext(|io: &TlsStream<TcpStream>, extensions: &mut Extensions| {
                    record_peer_certificate(io as &dyn Any, extensions)
                })
                .upgrade(upgrade())
                .finish(map_config(
                    app()
                        .into_factory()
                        .map_err(|err| err.into().error_response()),
                    |_| AppConfig::default(),
                ));
            gate.tls(tls.clone()).and_then(http.map_err(|_| ()))
        })?
        .run())
}

/// What actix-web's HttpServer offers over TLS (no HTTP/2 here).
fn with_alpn(mut tls: ServerConfig) -> Arc<ServerConfig> {
    tls.alpn_protocols.insert(0, b"http/1.1".to_vec());
    Arc::new(tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ipv6_source_is_its_slash_64_and_places_are_given_back() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(source_of(a), source_of(b));
        assert_ne!(source_of(a), source_of(other));
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(source_of(mapped), "10.0.0.1".parse::<IpAddr>().unwrap());

        let limits = HandshakeLimits {
            per_source: 2,
            total: 3,
            ..HandshakeLimits::default()
        };
        let gate = Gate::new("test", limits, GateMetrics::default());
        let first = gate.enter(Some(a)).unwrap();
        let _second = gate.enter(Some(b)).unwrap();
        assert_eq!(gate.enter(Some(a)).err(), Some("per_source"), "same /64");
        let _third = gate.enter(Some(other)).unwrap();
        assert_eq!(
            gate.enter(Some("10.0.0.9".parse().unwrap())).err(),
            Some("total")
        );
        drop(first);
        assert!(
            gate.enter(Some(a)).is_ok(),
            "a place given back is free again"
        );
    }
}
