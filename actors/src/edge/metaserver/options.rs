//! MetaServer's settings (`modules.metaManager.metaServer` and its limits).

use std::time::Duration;

/// KubeEdge's default `modules.metaManager.metaServer.server`.
pub const DEFAULT_SERVER: &str = "127.0.0.1:10550";

/// How MetaServer listens, whom it answers for, and its bounds.
#[derive(Debug, Clone)]
pub struct MetaServerOptions {
    /// `host:port` to listen on, plain HTTP as edgecore serves it (`metaServer.server`).
    pub server: String,
    /// The node: the `Nodename` of every Application sent to the cloud.
    pub node_name: String,
    /// How long a list or get waits for the cloud before it is answered from the store
    /// (`modules.metaManager.remoteQueryTimeout`).
    pub remote_query_timeout: Duration,
    /// Watches open at once; more are refused with 429 (`maxWatches`).
    pub max_watches: usize,
    /// Lists and gets waiting for the cloud at once; more are refused with 429
    /// (`maxRequestsInFlight`).
    pub max_requests_in_flight: usize,
    /// The longest request target (path and query) taken, in bytes; longer is refused with
    /// 414 (`maxRequestBytes`).
    pub max_request_bytes: usize,
    /// Connections open at once (`maxConnections`).
    pub max_connections: usize,
    /// The longest a watch stays open; a `timeoutSeconds` above it is cut to it, and a watch
    /// without one ends then (`maxWatchSeconds`).
    pub max_watch_seconds: u64,
    /// Whether Secrets are served (`serveSecrets`). Any local process reaches MetaServer
    /// without a token, while the edge's local API serves the stored Secrets only on its
    /// socket or with the token: off, Secrets are answered 403.
    pub serve_secrets: bool,
    /// Events the watch history keeps, so a watch from a recent resourceVersion replays what
    /// it missed; older is 410 Expired.
    pub history: usize,
}

impl MetaServerOptions {
    /// KubeEdge's defaults, for `node_name`.
    pub fn new(node_name: &str) -> Self {
        MetaServerOptions {
            server: DEFAULT_SERVER.to_owned(),
            node_name: node_name.to_owned(),
            remote_query_timeout: Duration::from_secs(60),
            max_watches: 256,
            max_requests_in_flight: 64,
            max_request_bytes: 8 * 1024,
            max_connections: 1024,
            max_watch_seconds: 1800,
            serve_secrets: false,
            history: 1024,
        }
    }
}
