//! What the admin endpoint and the status page show of CloudStream: each node's tunnel with
//! its open streams and the bytes it has sent the API server (no per-node metric series: these
//! are read from the tunnel registry when asked).

use std::net::IpAddr;
use std::sync::Arc;

use serde::Serialize;

use super::context::StreamContext;
use super::session::Tunnel;

/// One node's stream tunnel now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStreams {
    /// The node (its certificate's name).
    pub node: String,
    /// The internal IP its edge reported, if any.
    pub internal_ip: Option<IpAddr>,
    /// Streams (`kubectl logs`) open through the tunnel now.
    pub open_streams: usize,
    /// Stream payload bytes sent towards the API server since the tunnel opened.
    pub bytes_to_apiserver: u64,
}

impl NodeStreams {
    fn of(tunnel: &Tunnel) -> Self {
        NodeStreams {
            node: tunnel.node.clone(),
            internal_ip: tunnel.internal_ip,
            open_streams: tunnel.open_streams(),
            bytes_to_apiserver: tunnel.bytes_to_apiserver(),
        }
    }
}

/// A handle on CloudStream's tunnels for the admin endpoint: cheap to clone, usable from any
/// thread.
#[derive(Clone)]
pub struct StreamsView {
    pub(super) context: Arc<StreamContext>,
}

impl std::fmt::Debug for StreamsView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamsView").finish_non_exhaustive()
    }
}

impl StreamsView {
    /// Every node with a tunnel: most open streams first, then by name.
    pub fn nodes(&self) -> Vec<NodeStreams> {
        let mut nodes: Vec<NodeStreams> = self
            .context
            .sessions
            .tunnels()
            .iter()
            .map(|tunnel| NodeStreams::of(tunnel))
            .collect();
        nodes.sort_unstable_by(|a, b| {
            b.open_streams
                .cmp(&a.open_streams)
                .then_with(|| a.node.cmp(&b.node))
        });
        nodes
    }

    /// Node `name`'s tunnel, if it has one.
    pub fn node(&self, name: &str) -> Option<NodeStreams> {
        self.context
            .sessions
            .by_name(name)
            .map(|tunnel| NodeStreams::of(&tunnel))
    }
}
