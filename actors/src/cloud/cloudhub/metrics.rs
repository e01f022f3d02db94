//! CloudHub's metrics: one set per hive, shared by the hub, the node actors and the sessions.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::hive::{Hive, RefusalKind, RefusalLog};

/// Label set of CloudHub's reason-labelled counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why the frame or message was counted.
    pub reason: String,
}

/// CloudHub's metrics; registered once per hive by [`CloudHubModule::with_security`](super::hub::CloudHubModule::with_security).
#[derive(Debug, Clone, Default)]
pub(crate) struct CloudHubMetrics {
    /// Nodes with an open session.
    pub connected_nodes: Gauge,
    /// Frames received from edges (valid or not).
    pub frames_in: Counter,
    /// Frames written to edges.
    pub frames_out: Counter,
    /// ACKs matched to an in-flight message.
    pub acks: Counter,
    /// Resends of unACKed messages.
    pub resends: Counter,
    /// Frames that were not valid messages, by reason.
    pub malformed: Family<ReasonLabels, Counter>,
    /// Connections refused because the node limit was reached.
    pub refused: Counter,
    /// Per-node actors restarted after a panic or a stop.
    pub node_restarts: Counter,
    /// Warnings about what an edge sent that were not logged (over its budget).
    pub warnings_held_back: Counter,
    /// Messages parked because their deliveries kept ending the node's connection.
    pub parked: Counter,
    /// Edges that came back with another store than before and were sent everything again.
    pub stores_replaced: Counter,
    /// Nodes CloudHub has an actor for (connected or not).
    pub node_actors: Gauge,
    /// Messages the per-node actors handled (all nodes together).
    pub node_messages_handled: Counter,
    /// Messages dropped (pool overflow, stale, unroutable, ...), by reason.
    pub dropped: Family<ReasonLabels, Counter>,
    /// Connections and messages refused for identity or authorization, by reason.
    pub denied: Family<ReasonLabels, Counter>,
    /// The last refusals, beside their counters (the hive's log once registered).
    pub refusals: RefusalLog,
}

impl CloudHubMetrics {
    /// Registers the metrics with `hive`'s registry and records refusals in its log.
    pub(crate) fn register(&mut self, hive: &Hive) {
        self.refusals = hive.refusals().clone();
        let m = hive.metrics();
        m.register(
            "edgehive_cloudhub_parked_messages",
            "Messages parked because their deliveries kept ending the node's connection (retried every 10 minutes)",
            self.parked.clone(),
        );
        m.register(
            "edgehive_cloudhub_stores_replaced",
            "Edges that came back with a new or replaced store and were sent everything again",
            self.stores_replaced.clone(),
        );
        m.register(
            "edgehive_cloudhub_warnings_held_back",
            "Warnings about what an edge sent that were not logged, over the per-connection budget",
            self.warnings_held_back.clone(),
        );
        m.register(
            "edgehive_cloudhub_node_actors",
            "Edge nodes CloudHub has an actor for, connected or not",
            self.node_actors.clone(),
        );
        m.register(
            "edgehive_cloudhub_node_messages_handled",
            "Messages the per-node actors handled, all nodes together",
            self.node_messages_handled.clone(),
        );
        m.register(
            "edgehive_cloudhub_node_restarts",
            "Times a node's actor was started again after it panicked or stopped (its pool kept)",
            self.node_restarts.clone(),
        );
        m.register(
            "edgehive_cloudhub_connected_nodes",
            "Edge nodes with an open WebSocket session",
            self.connected_nodes.clone(),
        );
        m.register(
            "edgehive_cloudhub_frames_received",
            "WebSocket frames received from edges",
            self.frames_in.clone(),
        );
        m.register(
            "edgehive_cloudhub_frames_sent",
            "WebSocket frames written to edges",
            self.frames_out.clone(),
        );
        m.register(
            "edgehive_cloudhub_acks",
            "Edge ACKs matched to an in-flight message",
            self.acks.clone(),
        );
        m.register(
            "edgehive_cloudhub_resends",
            "Resends of messages the edge did not ACK in time",
            self.resends.clone(),
        );
        m.register(
            "edgehive_cloudhub_malformed_frames",
            "Frames from edges that were not valid messages",
            self.malformed.clone(),
        );
        m.register(
            "edgehive_cloudhub_nodes_refused",
            "Connections refused because the node limit was reached",
            self.refused.clone(),
        );
        m.register(
            "edgehive_cloudhub_dropped_messages",
            "Messages CloudHub dropped, by reason",
            self.dropped.clone(),
        );
        m.register(
            "edgehive_cloudhub_denied",
            "Connections and upstream messages refused for node identity or authorization, by reason",
            self.denied.clone(),
        );
    }

    pub(crate) fn deny(&self, reason: &str) {
        self.denied
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Records a refusal in the hive's log (the counter is the caller's).
    pub(crate) fn record_refusal(
        &self,
        kind: RefusalKind,
        reason: &str,
        node: Option<&str>,
        peer: Option<std::net::SocketAddr>,
        detail: &str,
    ) {
        self.refusals.record(kind, reason, node, peer, detail);
    }

    pub(crate) fn drop_reason(&self, reason: &str) {
        self.dropped
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub(crate) fn malformed(&self, reason: &str) {
        self.malformed
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }
}
