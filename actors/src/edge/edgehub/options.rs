//! EdgeHub's settings (edgecore's `modules.edgeHub`) and the URL it dials.

use std::time::Duration;

use edgehive_protocols::DEFAULT_MAX_FRAME_BYTES;

use crate::edge::certmanager::EdgeTlsOptions;

/// KubeEdge's default `projectID`.
pub const DEFAULT_PROJECT_ID: &str = "e632aba927ea4ac2b575ec1603d56f10";

/// EdgeHub's settings (edgecore's `modules.edgeHub`).
#[derive(Debug, Clone)]
pub struct EdgeHubOptions {
    /// CloudHub's WebSocket address, `host:port` (one cloud, or a load balancer or VIP in
    /// front of several); dialed alone when [`servers`](Self::servers) is empty.
    pub server: String,
    /// Several clouds' WebSocket addresses, `host:port`, dialed in turn: a failed dial or a
    /// lost connection moves to the next, one round of them per backoff. Empty: `server`.
    pub servers: Vec<String>,
    /// `projectID`, part of the URL and sent as the `project_id` header.
    pub project_id: String,
    /// This edge node's name, part of the URL and sent as the `node_id` header.
    pub node_name: String,
    /// Keepalive period; the cloud drops a session silent for 30 s.
    pub heartbeat: Duration,
    /// First reconnect delay, and the delay after a connection that had succeeded.
    pub reconnect_min: Duration,
    /// Longest reconnect delay.
    pub reconnect_max: Duration,
    /// Largest cloud frame accepted. A larger frame cannot be skipped on a WebSocket stream,
    /// so it ends the connection (counted as malformed) and the edge reconnects.
    pub max_frame_bytes: usize,
    /// Messages to the cloud that may wait while disconnected; the oldest is dropped beyond.
    pub outbox_capacity: usize,
    /// How long a [`CloudRequest`](crate::edge::contract::CloudRequest) waits for the cloud's reply (metamanager's
    /// `remoteQueryTimeout`).
    pub request_timeout: Duration,
    /// Mutual TLS and certificate bootstrap; `None` dials plain `ws://`.
    pub tls: Option<EdgeTlsOptions>,
    /// Sustained rate of messages written to the cloud (`messageQPS`).
    pub message_qps: u32,
    /// Messages that may be written at once after a quiet spell (`messageBurst`).
    pub message_burst: u32,
    /// The store's identity, sent in the handshake ([`edgehive_protocols::STORE_ID_HEADER`]).
    pub store_id: Option<String>,
}

impl Default for EdgeHubOptions {
    fn default() -> Self {
        EdgeHubOptions {
            server: "127.0.0.1:10000".to_owned(),
            servers: Vec::new(),
            project_id: DEFAULT_PROJECT_ID.to_owned(),
            node_name: default_node_name(),
            heartbeat: Duration::from_secs(15),
            reconnect_min: Duration::from_secs(1),
            reconnect_max: Duration::from_secs(30),
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            outbox_capacity: 1024,
            request_timeout: Duration::from_secs(60),
            tls: None,
            message_qps: 30,
            message_burst: 60,
            store_id: None,
        }
    }
}

/// edgecore's default node name: the host name.
fn default_node_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "edge-node".to_owned())
}

impl EdgeHubOptions {
    /// The addresses EdgeHub dials in turn: [`servers`](Self::servers), or `server` alone.
    pub(crate) fn addresses(&self) -> Vec<String> {
        if self.servers.is_empty() {
            vec![self.server.clone()]
        } else {
            self.servers.clone()
        }
    }
}

/// The URL EdgeHub dials at `server`: `wss://` with TLS, `ws://` without. CloudHub accepts
/// any path; identity travels in headers (and, with TLS, in the client certificate).
pub(crate) fn events_url(options: &EdgeHubOptions, server: &str) -> String {
    let scheme = if options.tls.is_some() { "wss" } else { "ws" };
    format!(
        "{scheme}://{server}/{}/{}/events",
        options.project_id, options.node_name
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_carries_project_and_node() {
        let options = EdgeHubOptions {
            server: "10.0.0.1:10000".into(),
            node_name: "edge-1".into(),
            ..EdgeHubOptions::default()
        };
        assert_eq!(
            events_url(&options, &options.server),
            "ws://10.0.0.1:10000/e632aba927ea4ac2b575ec1603d56f10/edge-1/events"
        );
    }

    #[test]
    fn the_list_replaces_the_one_server() {
        let one = EdgeHubOptions {
            server: "10.0.0.1:10000".into(),
            ..EdgeHubOptions::default()
        };
        assert_eq!(one.addresses(), ["10.0.0.1:10000"]);
        let several = EdgeHubOptions {
            servers: vec!["10.0.0.2:10000".into(), "10.0.0.3:10000".into()],
            ..one
        };
        assert_eq!(several.addresses(), ["10.0.0.2:10000", "10.0.0.3:10000"]);
    }
}
