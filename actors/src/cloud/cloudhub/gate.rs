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
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_codec::Framed;
use actix_http::{h1, HttpService, KeepAlive, Protocol, Request};
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
use tokio::sync::oneshot;

use super::metrics::ReasonLabels;
use crate::hive::locks;
use crate::hive::{Hive, RefusalKind, RefusalLog};
use crate::identity::tls::record_peer_certificate;

/// The bounds; see `gate.rs`.
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
    /// The certificate server's warnings not logged (over a budget).
    certificate_warnings_held_back: Counter,
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
            "Certificate requests refused, by reason (no_node_name, no_token, bad_token, rate_limited, wrong_subject, invalid_node_name, unsupported_key, invalid_csr, lifetime, timeout)",
            metrics.certificates_refused.clone(),
        );
        registry.register(
            "edgehive_certserver_warnings_held_back",
            "Warnings about certificate requests that were not logged, over the per-source or overall budget",
            metrics.certificate_warnings_held_back.clone(),
        );
        registry.register(
            "edgehive_tls_handshakes_refused",
            "Connections closed by a TLS port's gate, per port and reason (per_source, total, evicted, timeout, failed; certificates port: connections_per_source, connections, connection_evicted)",
            metrics.refused.clone(),
        );
        metrics
    }
}

impl GateMetrics {
    /// Counts a certificate server warning that was not logged.
    pub(crate) fn certificate_warning_held_back(&self) {
        self.certificate_warnings_held_back.inc();
    }

    /// Counts a refused certificate request (and records it: the node it named, if any,
    /// the peer, and what was wrong).
    pub(crate) fn certificate_refused(
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

/// One place: its id (ids grow in the order places are taken), and how to close its
/// connection if evicted.
struct Held {
    id: u64,
    cancel: Option<oneshot::Sender<()>>,
}

#[derive(Default)]
struct SlotsState {
    /// Places per source, oldest first.
    per_source: HashMap<IpAddr, VecDeque<Held>>,
    /// Places in all (those without a known source included).
    total: usize,
    next_id: u64,
}

/// A bounded set of places (handshakes in progress, or connections), per source and in all,
/// shared by every worker of a port. When it is full, a newcomer whose source holds fewer
/// than the source holding the most evicts that source's oldest place instead of being
/// refused: a flood from many addresses can fill the set, but not keep a new address out
/// (not even one place from each of `total` addresses does), since each address's share
/// shrinks as addresses are added. Sources of equal size never evict each other.
#[derive(Clone)]
pub(crate) struct Slots {
    per_source: usize,
    total: usize,
    state: Arc<Mutex<SlotsState>>,
}

/// Why a place was refused (the `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused(pub(crate) &'static str);

/// A place taken; dropping it gives it back (unless it was evicted already).
pub(crate) struct Slot {
    slots: Slots,
    source: Option<IpAddr>,
    id: u64,
    on_release: Option<Gauge>,
    /// A place without a source cannot be evicted: its eviction's sender is kept here, so
    /// that the eviction never resolves.
    _never_evicted: Option<oneshot::Sender<()>>,
}

/// Resolves when the place was evicted (or its set dropped).
pub(crate) type Eviction = oneshot::Receiver<()>;

impl Slots {
    pub(crate) fn new(per_source: usize, total: usize) -> Self {
        Slots {
            per_source,
            total,
            state: Arc::new(Mutex::new(SlotsState::default())),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SlotsState> {
        // Counts only; a panic cannot leave them half-written.
        locks::lock(&self.state)
    }

    /// A place for `source` (already reduced to its source, see [`source_of`]), evicting
    /// another source's oldest when full and fair (see the type's docs). Returns the place,
    /// how its eviction is noticed, and whether another place was evicted for it.
    pub(crate) fn enter(&self, source: Option<IpAddr>) -> Result<(Slot, Eviction, bool), Refused> {
        let mut state = self.lock();
        let mine = source
            .and_then(|source| state.per_source.get(&source))
            .map_or(0, VecDeque::len);
        if source.is_some() && mine >= self.per_source {
            return Err(Refused("per_source"));
        }
        let mut evicted = false;
        if state.total >= self.total {
            // Cheap enough: at most `total` sources to look at, only when full.
            let victim = source.and_then(|_| {
                state
                    .per_source
                    .iter()
                    .map(|(ip, held)| {
                        (
                            held.len(),
                            std::cmp::Reverse(held.front().map(|h| h.id)),
                            *ip,
                        )
                    })
                    .max()
                    .filter(|(most, _, _)| *most > mine)
                    .map(|(_, _, ip)| ip)
            });
            let Some(victim) = victim else {
                return Err(Refused("total"));
            };
            let state = &mut *state;
            if let Some(held) = state.per_source.get_mut(&victim) {
                if let Some(mut oldest) = held.pop_front() {
                    if let Some(cancel) = oldest.cancel.take() {
                        let _ = cancel.send(());
                    }
                    state.total -= 1;
                    evicted = true;
                }
                if held.is_empty() {
                    state.per_source.remove(&victim);
                }
            }
        }
        let id = state.next_id;
        state.next_id += 1;
        let (cancel, eviction) = oneshot::channel();
        let mut never_evicted = None;
        match source {
            Some(source) => state.per_source.entry(source).or_default().push_back(Held {
                id,
                cancel: Some(cancel),
            }),
            None => never_evicted = Some(cancel),
        }
        state.total += 1;
        Ok((
            Slot {
                slots: self.clone(),
                source,
                id,
                on_release: None,
                _never_evicted: never_evicted,
            },
            eviction,
            evicted,
        ))
    }

    #[cfg(test)]
    fn held(&self, source: IpAddr) -> usize {
        self.lock().per_source.get(&source).map_or(0, VecDeque::len)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.slots.lock();
        let present = match self.source {
            None => true,
            Some(source) => {
                let mut present = false;
                if let Some(held) = state.per_source.get_mut(&source) {
                    if let Some(at) = held.iter().position(|h| h.id == self.id) {
                        held.remove(at);
                        present = true;
                    }
                    if held.is_empty() {
                        state.per_source.remove(&source);
                    }
                }
                present
            }
        };
        if present {
            state.total = state.total.saturating_sub(1);
        }
        drop(state);
        // An evicted place's gauge unit went to the place that evicted it.
        if let Some(gauge) = self.on_release.as_ref().filter(|_| present) {
            gauge.dec();
        }
    }
}

/// Bounds on the certificate server's connections, from accept to close (handshake
/// included): it serves one short request per connection, so a connection that lives longer
/// is a slow or idle client holding a file descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Longest a connection may stay open after its TLS handshake (request head and body
    /// arriving, answer going out).
    pub request_timeout: Duration,
    /// Most open connections from one source address.
    pub per_source: usize,
    /// Most open connections in all (a newcomer evicts the oldest connection of the source
    /// holding the most, as for handshakes).
    pub total: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            request_timeout: Duration::from_secs(10),
            per_source: 32,
            total: 512,
        }
    }
}

/// One port's gate. Cheap to clone; clones share the counts (all workers of a server).
#[derive(Clone)]
pub(crate) struct Gate {
    port: String,
    limits: HandshakeLimits,
    handshakes: Slots,
    /// For the certificate server: bounds on whole connections.
    connections: Option<(ConnectionLimits, Slots)>,
    metrics: GateMetrics,
}

impl Gate {
    /// The gate of port `port` (a metrics label: `websocket`, `certificates`).
    pub(crate) fn new(port: &str, limits: HandshakeLimits, metrics: GateMetrics) -> Self {
        Gate {
            port: port.to_owned(),
            limits,
            handshakes: Slots::new(limits.per_source, limits.total),
            connections: None,
            metrics,
        }
    }

    /// This gate, also bounding whole connections (see [`ConnectionLimits`]).
    pub(crate) fn with_connection_limits(mut self, limits: ConnectionLimits) -> Self {
        self.connections = Some((limits, Slots::new(limits.per_source, limits.total)));
        self
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
    fn enter(&self, source: Option<IpAddr>) -> Result<(Slot, Eviction), &'static str> {
        let (mut slot, eviction, evicted) = self
            .handshakes
            .enter(source.map(source_of))
            .map_err(|Refused(reason)| reason)?;
        let pending = self.pending();
        if !evicted {
            pending.inc();
        }
        slot.on_release = Some(pending);
        Ok((slot, eviction))
    }

    /// TCP connection -> TLS stream, through the gate.
    pub(crate) fn tls(
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
                        let (place, eviction) = match gate.enter(peer.map(|p| p.ip())) {
                            Ok(place) => place,
                            Err(reason) => {
                                gate.refuse(reason, peer);
                                return Err(());
                            }
                        };
                        let accepted = tokio::select! {
                            accepted = acceptor.call(io) => accepted,
                            _ = eviction => {
                                // Its place went to a source holding fewer.
                                gate.refuse("evicted", peer);
                                return Err(());
                            }
                        };
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

impl Gate {
    /// `inner` (TLS and HTTP of one connection) within the gate's [`ConnectionLimits`], when
    /// it has some: a place per connection from accept to close, and a deadline.
    fn bounded<F>(
        &self,
        inner: F,
    ) -> impl ServiceFactory<TcpStream, Config = (), Response = (), Error = (), InitError = ()>
    where
        F: ServiceFactory<TcpStream, Config = (), Response = (), Error = (), InitError = ()>
            + 'static,
        F::Service: 'static,
    {
        let gate = self.clone();
        fn_factory(move || {
            let gate = gate.clone();
            let creating = inner.new_service(());
            async move {
                let service = Rc::new(creating.await?);
                Ok::<_, ()>(fn_service(move |io: TcpStream| {
                    let gate = gate.clone();
                    let service = service.clone();
                    async move {
                        let Some((limits, slots)) = gate.connections.clone() else {
                            return service.call(io).await;
                        };
                        let peer = io.peer_addr().ok();
                        let (slot, eviction, _) =
                            match slots.enter(peer.map(|peer| source_of(peer.ip()))) {
                                Ok(place) => place,
                                Err(Refused(reason)) => {
                                    gate.refuse(
                                        match reason {
                                            "per_source" => "connections_per_source",
                                            _ => "connections",
                                        },
                                        peer,
                                    );
                                    return Err(());
                                }
                            };
                        let lifetime = gate.limits.timeout + limits.request_timeout;
                        let served = tokio::select! {
                            served = service.call(io) => served,
                            _ = eviction => {
                                gate.refuse("connection_evicted", peer);
                                Err(())
                            }
                            _ = tokio::time::sleep(lifetime) => {
                                gate.metrics.certificate_refused(
                                    "timeout",
                                    "",
                                    peer,
                                    &format!("request not complete within {} s of its handshake", limits.request_timeout.as_secs()),
                                );
                                Err(())
                            }
                        };
                        drop(slot);
                        served
                    }
                }))
            }
        })
    }
}

/// The source a connection counts against: its IPv4 address, or its IPv6 /64 (one host
/// commonly holds a whole /64, so counting single IPv6 addresses would bound nothing).
pub(crate) fn source_of(ip: IpAddr) -> IpAddr {
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
pub(crate) fn listener(address: &str, port: u16) -> std::io::Result<std::net::TcpListener> {
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
pub(crate) fn serve<F, I, S, B>(
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
    // With connection limits, one request per connection: its deadline is the request's.
    let keep_alive = if gate.connections.is_some() {
        KeepAlive::Disabled
    } else {
        KeepAlive::default()
    };
    Ok(Server::build()
        .workers(workers)
        .disable_signals()
        .listen(name, listener, move || {
            let http = HttpService::build()
                .client_request_timeout(timeout)
                .keep_alive(keep_alive)
                .on_connect_ext(|io: &TlsStream<TcpStream>, extensions: &mut Extensions| {
                    record_peer_certificate(io as &dyn Any, extensions)
                })
                .finish(map_config(
                    app()
                        .into_factory()
                        .map_err(|err| err.into().error_response()),
                    |_| AppConfig::default(),
                ));
            gate.bounded(gate.tls(tls.clone()).and_then(http.map_err(|_| ())))
        })?
        .run())
}

/// As [`serve`], and a request for a WebSocket upgrade goes to the service `upgrade` makes,
/// with its connection (actix-http's `HttpService::upgrade`) instead of to `app`.
pub(crate) fn serve_upgrading<F, I, S, B, G, U>(
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
pub(crate) fn with_alpn(mut tls: ServerConfig) -> Arc<ServerConfig> {
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
        let third = gate.enter(Some(other)).unwrap();
        assert!(
            gate.enter(Some(other)).is_ok(),
            "full: `other` holds fewer than the /64, whose oldest place gives way"
        );
        drop(third);
        let _third = gate.enter(Some(other)).unwrap();
        drop(first);
        assert!(
            gate.enter(Some(a)).is_ok(),
            "a place given back is free again"
        );
    }

    #[test]
    fn one_place_from_each_of_as_many_sources_as_places_does_not_keep_a_newcomer_out() {
        let limits = HandshakeLimits {
            per_source: 4,
            total: 8,
            ..HandshakeLimits::default()
        };
        let gate = Gate::new("test", limits, GateMetrics::default());
        let source = |i: u8| Some(IpAddr::from([127, 0, 0, i]));
        let held: Vec<_> = (1..=8).map(|i| gate.enter(source(i)).unwrap()).collect();
        // A new address gets in (an old address's place gives way), again and again.
        let newcomers: Vec<_> = (9..=20).map(|i| gate.enter(source(i)).unwrap()).collect();
        // An address that already holds one does not evict another that holds one.
        let _second = gate.enter(source(21)).unwrap();
        assert_eq!(gate.enter(source(21)).err(), Some("total"));
        drop((held, newcomers));
    }

    #[test]
    fn when_full_a_new_source_evicts_the_oldest_place_of_the_largest_holder() {
        let slots = Slots::new(40, 1024);
        let source = |i: u8| IpAddr::from([127, 0, 0, i]);
        // 49 sources x 40 idle connections, as in the red team's flood: the set fills up.
        let mut held = Vec::new();
        let mut refused = 0;
        for _round in 0..40 {
            for i in 2..51 {
                match slots.enter(Some(source(i))) {
                    Ok(place) => held.push(place),
                    Err(_) => refused += 1,
                }
            }
        }
        assert!(refused > 0 || held.iter().any(|(_, _, evicted)| *evicted));
        assert_eq!(slots.lock().total, 1024);
        // Every source holds its fair share, give or take one.
        for i in 2..51 {
            let n = slots.held(source(i));
            assert!((20..=22).contains(&n), "127.0.0.{i} holds {n}");
        }
        // A new source gets in, and again and again (an edge's retries, other edges).
        for i in 100..110 {
            let (place, mut eviction, evicted) = slots.enter(Some(source(i))).unwrap();
            assert!(evicted);
            assert!(eviction.try_recv().is_err(), "the newcomer is not evicted");
            held.push((place, eviction, evicted));
        }
        assert_eq!(slots.lock().total, 1024);
        // The evicted places were the oldest of the largest holders: told so, and their
        // giving back does not count twice.
        let evicted: Vec<_> = held
            .iter_mut()
            .filter_map(|(place, eviction, _)| eviction.try_recv().is_ok().then_some(place.id))
            .collect();
        assert!(evicted.len() >= 10, "{evicted:?}");
        // A place without a known source is never told it was evicted.
        drop(held.pop());
        let (_unsourced, mut eviction, _) = slots.enter(None).unwrap();
        assert!(matches!(
            eviction.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        ));
        held.clear();
        drop(_unsourced);
        assert_eq!(slots.lock().total, 0);
        assert!(slots.lock().per_source.is_empty());
    }
}
