//! What CloudStream's two servers share: their settings and the handlers' context (the tunnel
//! registry, the refusal-warning budget).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::web::Bytes;
use futures_util::future::LocalBoxFuture;

use super::metrics::CloudStreamMetrics;
use super::session::Sessions;
use crate::cloud::cloudhub::gate::HandshakeLimits;
use crate::cloud::ownership::Ownership;
use crate::hive::log::{clip, WarnBudget};
use crate::identity::tls::ReplicaCredentials;

/// Refusal warnings logged per [`WarnBudget::WINDOW`], all peers together.
const WARNINGS_PER_WINDOW: u32 = 50;
/// The idle read timeout's default: edgecore pings every 5 s.
pub(super) const DEFAULT_TUNNEL_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// CloudStream's settings (`modules.cloudStream`).
#[derive(Debug, Clone)]
pub struct CloudStreamOptions {
    /// Address both servers bind.
    pub address: String,
    /// The tunnel server's port (`tunnelPort`, 10004).
    pub tunnel_port: u16,
    /// The stream server's port (`streamPort`, 10003).
    pub stream_port: u16,
    /// Streams open at once per node (`maxStreamsPerNode`).
    pub max_streams_per_node: usize,
    /// A stream with no data for this long ends (`streamIdleTimeout`; kubelet's
    /// `streamingConnectionIdleTimeout` is 4 h).
    pub idle_timeout: Duration,
    /// How long the tunnel waits for a stream's reader before cutting that stream.
    pub slow_reader_timeout: Duration,
    /// A tunnel with nothing from the edge (not even a ping) for this long is closed.
    pub tunnel_read_timeout: Duration,
    /// The largest tunnel message (WebSocket frame) accepted from an edge.
    pub max_message_bytes: usize,
    /// Where the edge replays requests (edged's kubelet API; cloudcore's fixed
    /// `127.0.0.1:10350`).
    pub kubelet_endpoint: String,
    /// TLS handshake bounds of both ports (and of the egress server's connections until
    /// their CONNECT head is read).
    pub handshake_limits: HandshakeLimits,
    /// The API server's egress selector (`egress`).
    pub egress: EgressOptions,
}

/// The egress server's settings (`modules.cloudStream.egress`): the API server's
/// `--egress-selector-config-file` pointed at the cloud (`egress.rs`).
#[derive(Debug, Clone)]
pub struct EgressOptions {
    /// Whether the egress server runs.
    pub enable: bool,
    /// Its TLS port (on `address`), when `uds_name` is not set.
    pub port: u16,
    /// A Unix socket instead of the TLS port (the API server's `uds.udsName`).
    pub uds_name: Option<PathBuf>,
    /// Connections open at once after their CONNECT (all clients together).
    pub max_connections: usize,
    /// Longest a connection to a CONNECT target may take to open.
    pub dial_timeout: Duration,
    /// Whether a CONNECT may reach loopback addresses (the cloud host's own services);
    /// link-local, multicast and unspecified addresses are refused regardless.
    pub allow_loopback: bool,
}

impl Default for EgressOptions {
    fn default() -> Self {
        EgressOptions {
            enable: false,
            port: 10005,
            uds_name: None,
            max_connections: 1024,
            dial_timeout: Duration::from_secs(10),
            allow_loopback: false,
        }
    }
}

impl Default for CloudStreamOptions {
    fn default() -> Self {
        CloudStreamOptions {
            address: "0.0.0.0".to_owned(),
            tunnel_port: 10004,
            stream_port: 10003,
            max_streams_per_node: 64,
            idle_timeout: Duration::from_secs(4 * 3600),
            slow_reader_timeout: Duration::from_secs(30),
            tunnel_read_timeout: DEFAULT_TUNNEL_READ_TIMEOUT,
            max_message_bytes: 1024 * 1024,
            kubelet_endpoint: "127.0.0.1:10350".to_owned(),
            handshake_limits: HandshakeLimits::default(),
            egress: EgressOptions::default(),
        }
    }
}

/// A node-scoped admin request a replica answers for another (`GET /api/v1/sync/{node}`):
/// given the node, the status and JSON body this replica's admin endpoint would answer.
pub type NodeAdmin =
    Arc<dyn Fn(String) -> LocalBoxFuture<'static, (StatusCode, Bytes)> + Send + Sync>;

/// Forwarding between cloud replicas (`modules.cloudHub.replica.forwardPort`): a request for a
/// node whose edge is on another live replica is sent there over mutual TLS.
#[derive(Clone)]
pub struct Forwarding {
    /// This replica's certificate from the shared CA.
    pub credentials: Arc<ReplicaCredentials>,
    /// The forward server's port (on CloudStream's `address`); 0: no forward server, and
    /// requests for other replicas' nodes are refused (`forwarding_off`).
    pub port: u16,
    /// Forwarded connections open at once, each way (out to owners, in from replicas).
    pub max_forwards: usize,
    /// Longest the connection to the owner (TCP and TLS) and its answer may take.
    pub dial_timeout: Duration,
    /// Answers node admin requests forwarded here.
    pub node_admin: NodeAdmin,
}

impl std::fmt::Debug for Forwarding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forwarding")
            .field("identity", &self.credentials.identity)
            .field("port", &self.port)
            .field("max_forwards", &self.max_forwards)
            .finish_non_exhaustive()
    }
}

/// What both servers' handlers share.
pub(super) struct StreamContext {
    pub(super) options: CloudStreamOptions,
    pub(super) sessions: Sessions,
    /// Who serves which node (a process alone: every node is its own).
    pub(super) ownership: Arc<Ownership>,
    /// Forwarding to other replicas, with its bounds (none: a process alone).
    pub(super) forwarding: Option<Forwarding>,
    /// Forwarded connections out to owners (`max_forwards`).
    pub(super) forwards_out: Arc<tokio::sync::Semaphore>,
    /// Forwarded connections in from replicas (`max_forwards`).
    pub(super) forwards_in: Arc<tokio::sync::Semaphore>,
    warnings: Mutex<WarnBudget>,
}

impl StreamContext {
    /// The context of servers with `options` that count into `metrics`.
    pub(super) fn new(
        options: CloudStreamOptions,
        metrics: CloudStreamMetrics,
        ownership: Arc<Ownership>,
        forwarding: Option<Forwarding>,
    ) -> Self {
        let permits = forwarding
            .as_ref()
            .map_or(0, |forwarding| forwarding.max_forwards);
        StreamContext {
            options,
            sessions: Sessions::new(metrics),
            ownership,
            forwarding,
            forwards_out: Arc::new(tokio::sync::Semaphore::new(permits)),
            forwards_in: Arc::new(tokio::sync::Semaphore::new(permits)),
            warnings: Mutex::new(WarnBudget::with_limit(WARNINGS_PER_WINDOW)),
        }
    }

    pub(super) fn metrics(&self) -> &CloudStreamMetrics {
        &self.sessions.metrics
    }

    /// A refused request: counted (with the refusal log), warned within the budget, and
    /// answered with `status` and `text`.
    pub(super) fn refuse(
        &self,
        req: &actix_web::HttpRequest,
        node: Option<&str>,
        reason: &str,
        status: actix_web::http::StatusCode,
        text: String,
    ) -> actix_web::HttpResponse {
        self.metrics().refuse(
            crate::hive::RefusalKind::Connection,
            reason,
            node,
            req.peer_addr(),
            &text,
        );
        self.warn(req.peer_addr(), &text);
        actix_web::HttpResponse::build(status)
            .content_type("text/plain; charset=utf-8")
            .body(text + "\n")
    }

    pub(super) fn warn(&self, peer: Option<SocketAddr>, text: &str) {
        let held_back = crate::hive::locks::lock(&self.warnings).take(std::time::Instant::now());
        if let Some(held_back) = held_back {
            tracing::warn!(?peer, reason = %clip(text), held_back, "cloudstream refused");
        }
    }
}
