//! CloudHub's settings and security choices.

use std::sync::Arc;
use std::time::Duration;

use edgehive_protocols::DEFAULT_MAX_FRAME_BYTES;

use super::auth;
pub use super::gate::HandshakeLimits;
pub use super::limits::WriteLimits;
use super::pool::PoolLimits;
use crate::identity::tls;

/// How CloudHub authenticates nodes and scopes what they send. [`Default`] is plain `ws://`
/// with no checks, which only tests and explicitly insecure configs use.
#[derive(Clone, Default)]
pub struct CloudHubSecurity {
    /// Mutual TLS on the WebSocket port; `None` serves plain `ws://`.
    pub tls: Option<Arc<tls::CloudTls>>,
    /// Refuse upstream messages about objects not bound to the sending node (see `auth.rs`).
    pub authorize: bool,
    /// The cluster, for the binding checks of `auth.rs`; without it only what the node has
    /// ACKed of the controllers' pushes counts as bound.
    pub view: Option<Arc<dyn auth::BindingView>>,
}

impl std::fmt::Debug for CloudHubSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudHubSecurity")
            .field("tls", &self.tls.is_some())
            .field("authorize", &self.authorize)
            .field("view", &self.view.is_some())
            .finish()
    }
}

/// CloudHub's settings; [`Default`] is KubeEdge's cloudcore default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudHubOptions {
    /// Address the WebSocket server listens on.
    pub address: String,
    /// Port of the WebSocket server; 0 picks a free port.
    pub port: u16,
    /// A session with no keepalive for this long is closed.
    pub keepalive_interval: Duration,
    /// Most nodes connected at once; more are refused with a Policy close frame.
    pub node_limit: usize,
    /// Largest frame (or reassembled fragmented message) accepted from an edge; a bigger one
    /// closes that connection with a Size close frame.
    pub max_frame_bytes: usize,
    /// Time between resends of an unACKed message.
    pub ack_retry_interval: Duration,
    /// How often an ACK-lane message is written before it is requeued with backoff.
    pub ack_max_sends: u32,
    /// Most distinct objects waiting for delivery per node (see `PoolLimits`).
    pub ack_queue_capacity: usize,
    /// Most no-ACK messages waiting per node (see `PoolLimits`).
    pub noack_queue_capacity: usize,
    /// What one node may write (see [`WriteLimits`]).
    pub write_limits: WriteLimits,
    /// Bounds on TLS handshakes in progress (see [`HandshakeLimits`]).
    pub handshake_limits: HandshakeLimits,
    /// Refuse (403) a connection from a node the cluster has no Node object for. Off: such
    /// nodes are admitted, after the known ones when the node limit is reached.
    pub refuse_unknown_nodes: bool,
}

impl Default for CloudHubOptions {
    fn default() -> Self {
        CloudHubOptions {
            address: "0.0.0.0".into(),
            port: 10000,
            keepalive_interval: Duration::from_secs(30),
            node_limit: 500,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            ack_retry_interval: Duration::from_secs(5),
            ack_max_sends: 5,
            ack_queue_capacity: 10_000,
            noack_queue_capacity: 1024,
            write_limits: WriteLimits::default(),
            handshake_limits: HandshakeLimits::default(),
            refuse_unknown_nodes: false,
        }
    }
}

impl CloudHubOptions {
    pub(crate) fn pool_limits(&self) -> PoolLimits {
        PoolLimits {
            ack_capacity: self.ack_queue_capacity,
            noack_capacity: self.noack_queue_capacity,
        }
    }
}
