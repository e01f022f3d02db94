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
    /// Several clouds' WebSocket addresses, `host:port`, dialed in turn: a failed dial moves
    /// to the next; a lost connection to the others first, starting at a place derived from
    /// the node's name (so a dead cloud's edges spread over the rest); one round of them per
    /// backoff. Empty: `server`.
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

impl EdgeHubOptions {
    /// This edge's place among the other addresses after a lost connection ([`spread`]).
    pub(crate) fn spread(&self) -> usize {
        spread(&self.node_name)
    }
}

/// A node's place among the other cloud addresses after a lost connection: a stable hash of
/// its name (FNV-1a, finished with murmur3's mix so similar names like `edge-1`, `edge-2`
/// differ in every bit), so the edges of a dead cloud spread over the survivors and an edge
/// goes to the same survivor each time.
pub fn spread(node_name: &str) -> usize {
    let hash = node_name
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
    let mut mixed = hash ^ (hash >> 33);
    mixed = mixed.wrapping_mul(0xff51_afd7_ed55_8ccd);
    mixed ^= mixed >> 33;
    mixed = mixed.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    mixed ^= mixed >> 33;
    // Only picks among at most 16 addresses: any bits will do.
    mixed as usize
}

/// The order a round dials `count` addresses in after the connection to the one at `lost`
/// ended: each once, the others first, starting `spread` places after the lost one (counted
/// among the others), and the lost one last.
pub fn failover_order(lost: usize, count: usize, spread: usize) -> Vec<usize> {
    let count = count.max(1);
    let lost = lost % count;
    let others = count - 1;
    if others == 0 {
        return vec![lost];
    }
    let offset = spread % others;
    (0..others)
        .map(|step| (lost + 1 + (offset + step) % others) % count)
        .chain(std::iter::once(lost))
        .collect()
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
    fn similar_node_names_spread_over_the_survivors() {
        let spreads: Vec<usize> = (0..20)
            .map(|index| {
                EdgeHubOptions {
                    node_name: format!("edge-{index}"),
                    ..EdgeHubOptions::default()
                }
                .spread()
            })
            .collect();
        let odd = spreads.iter().filter(|spread| *spread % 2 == 1).count();
        assert!((5..=15).contains(&odd), "{odd} of 20 odd");
        let named = EdgeHubOptions {
            node_name: "edge-7".into(),
            ..EdgeHubOptions::default()
        };
        assert_eq!(named.spread(), spreads[7], "the same name, the same place");
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
