//! CloudStream's metrics: one set per hive. No per-node series (100,000 nodes would make
//! 100,000 of them): the gauges are totals, the admin endpoint's refusal log names the node.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::hive::{Hive, RefusalKind, RefusalLog};

/// Label set of the reason-labelled counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    /// Why it was counted.
    pub reason: String,
}

/// Label set of the byte counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct DirectionLabels {
    /// `to_apiserver` (from the edge's tunnel to an HTTP response) or `to_edge`.
    pub direction: String,
}

/// Label set of the forwarding counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ForwardLabels {
    /// `stream` (logs, exec, attach, metrics) or `admin` (a node's admin request).
    pub kind: String,
    /// What became of it (`forwarded`, `served`, or why not).
    pub outcome: String,
}

/// CloudStream's metrics.
#[derive(Debug, Clone, Default)]
pub(crate) struct CloudStreamMetrics {
    /// Nodes with an open tunnel.
    pub tunnels: Gauge,
    /// Streams open now, all nodes together.
    pub open_streams: Gauge,
    /// Streams opened since start.
    pub streams_opened: Counter,
    /// Streams that ended, by how.
    pub streams_closed: Family<ReasonLabels, Counter>,
    /// Stream payload bytes, by direction.
    pub bytes: Family<DirectionLabels, Counter>,
    /// Connections, requests and tunnel messages refused, by reason.
    pub refused: Family<ReasonLabels, Counter>,
    /// Tunnels replaced by a newer connection of the same node.
    pub tunnels_replaced: Counter,
    /// Requests for nodes on another replica, by kind and outcome.
    pub forwarded: Family<ForwardLabels, Counter>,
    /// Forwarded connections open now, out to owners and in from replicas.
    pub forwards_open: Gauge,
    refusals: RefusalLog,
}

impl CloudStreamMetrics {
    /// Registers the metrics with `hive`'s registry.
    pub(crate) fn register(hive: &Hive) -> Self {
        let metrics = CloudStreamMetrics {
            refusals: hive.refusals().clone(),
            ..CloudStreamMetrics::default()
        };
        let m = hive.metrics();
        m.register(
            "edgehive_cloudstream_tunnels",
            "Edge nodes with an open stream tunnel",
            metrics.tunnels.clone(),
        );
        m.register(
            "edgehive_cloudstream_open_streams",
            "Streams (logs, exec, attach, metrics) open through the tunnels, all nodes together",
            metrics.open_streams.clone(),
        );
        m.register(
            "edgehive_cloudstream_streams_opened",
            "Streams opened through the tunnels",
            metrics.streams_opened.clone(),
        );
        m.register(
            "edgehive_cloudstream_streams_closed",
            "Streams that ended, by reason (edge_done, client_gone, idle_timeout, slow_reader, tunnel_closed, tunnel_busy, and the upgrade refusals)",
            metrics.streams_closed.clone(),
        );
        m.register(
            "edgehive_cloudstream_bytes",
            "Stream payload bytes through the tunnels, by direction",
            metrics.bytes.clone(),
        );
        m.register(
            "edgehive_cloudstream_refused",
            "Tunnel connections, stream requests and tunnel messages refused, by reason",
            metrics.refused.clone(),
        );
        m.register(
            "edgehive_cloudstream_tunnels_replaced",
            "Tunnels replaced by a newer connection of the same node",
            metrics.tunnels_replaced.clone(),
        );
        m.register(
            "edgehive_cloud_forwarded",
            "Requests for a node whose edge is on another cloud replica, by kind (stream, admin) \
             and outcome: forwarded (sent to the owner), served (forwarded here and served), \
             owner_refused, dial_failed, busy, forwarding_off, and no_owner, owner_dead, \
             owner_self_no_tunnel (nobody to forward to)",
            metrics.forwarded.clone(),
        );
        m.register(
            "edgehive_cloud_forwards_open",
            "Forwarded connections open now, out to owners and in from replicas",
            metrics.forwards_open.clone(),
        );
        metrics
    }

    pub(crate) fn forward(&self, kind: &str, outcome: &str) {
        self.forwarded
            .get_or_create(&ForwardLabels {
                kind: kind.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Counts a refusal and records it in the hive's refusal log.
    pub(crate) fn refuse(
        &self,
        kind: RefusalKind,
        reason: &str,
        node: Option<&str>,
        peer: Option<std::net::SocketAddr>,
        detail: &str,
    ) {
        self.refused
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
        self.refusals.record(kind, reason, node, peer, detail);
    }

    pub(crate) fn closed(&self, reason: &str) {
        self.streams_closed
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub(crate) fn add_bytes(&self, direction: &str, bytes: usize) {
        self.bytes
            .get_or_create(&DirectionLabels {
                direction: direction.to_owned(),
            })
            .inc_by(bytes as u64);
    }
}
