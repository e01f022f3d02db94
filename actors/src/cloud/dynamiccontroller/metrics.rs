//! DynamicController's metrics: requests by verb and outcome, refusals by reason, open
//! subscriptions, pushes.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::cloud::cloudhub::ReasonLabels;
use crate::hive::{Hive, RefusalKind, RefusalLog};

/// `verb` and `outcome` (`approved`, `rejected`) of an application.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RequestLabels {
    verb: String,
    outcome: String,
}

/// `kind` of an upstream watch.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KindLabels {
    pub(super) kind: String,
}

/// `outcome` of the service-topology filter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OutcomeLabels {
    outcome: String,
}

/// DynamicController's counters, registered once per hive.
#[derive(Debug, Clone, Default)]
pub(super) struct Metrics {
    requests: Family<RequestLabels, Counter>,
    refused: Family<ReasonLabels, Counter>,
    /// Watches registered now, over all nodes.
    pub(super) subscriptions: Gauge,
    /// Watches of the cluster running now, by kind (1 per watched kind, however many nodes
    /// watch it; 0 once its last subscription ends).
    pub(super) upstream_watches: Family<KindLabels, Gauge>,
    /// Objects pushed to watching nodes.
    pub(super) pushes: Counter,
    /// Messages handed to CloudHub (answers and pushes).
    pub(super) sent: Counter,
    /// Pushes dropped because CloudHub stayed unavailable.
    pub(super) overflow: Counter,
    /// Views of the service-topology filter, by outcome.
    topology: Family<OutcomeLabels, Counter>,
    /// Backends the service-topology filter left out of what edges were sent.
    pub(super) topology_dropped: Counter,
    refusals: RefusalLog,
}

impl Metrics {
    /// Registers them with `hive`.
    pub(super) fn register(hive: &Hive) -> Self {
        let metrics = Metrics {
            refusals: hive.refusals().clone(),
            ..Metrics::default()
        };
        let m = hive.metrics();
        m.register(
            "edgehive_dynamiccontroller_requests",
            "MetaServer applications answered, by verb and outcome (approved, rejected)",
            metrics.requests.clone(),
        );
        m.register(
            "edgehive_dynamiccontroller_refused",
            "MetaServer applications refused, by reason",
            metrics.refused.clone(),
        );
        m.register(
            "edgehive_dynamiccontroller_subscriptions",
            "Watches edges' MetaServers have registered",
            metrics.subscriptions.clone(),
        );
        m.register(
            "edgehive_dynamiccontroller_upstream_watches",
            "Watches of the cluster DynamicController runs, by kind (one per kind, shared by every node watching it)",
            metrics.upstream_watches.clone(),
        );
        m.register(
            "edgehive_dynamiccontroller_pushes",
            "Watched objects' changes pushed to nodes",
            metrics.pushes.clone(),
        );
        m.register(
            "edgehive_dynamiccontroller_messages_sent",
            "Messages DynamicController handed to CloudHub",
            metrics.sent.clone(),
        );
        m.register(
            "edgehive_dynamiccontroller_buffer_overflow",
            "Pushes dropped because CloudHub stayed unavailable and the buffer was full",
            metrics.overflow.clone(),
        );
        m.register(
            "edgehive_dynamiccontroller_topology_views",
            "Endpoints and EndpointSlices of range-nodegroup Services shown to edges, by outcome: filtered (another group's backends left out), withheld (its Service not seen yet), corrected (sent again because a node changed group or the Service its annotation)",
            metrics.topology.clone(),
        );
        m.register(
            "edgehive_dynamiccontroller_topology_backends_dropped",
            "Backends the service-topology filter left out of what edges were sent",
            metrics.topology_dropped.clone(),
        );
        metrics
    }

    /// Counts a view of the service-topology filter.
    pub(super) fn topology(&self, outcome: &'static str) {
        self.topology
            .get_or_create(&OutcomeLabels {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Counts `n` views of the service-topology filter with one outcome (a group's nodes).
    pub(super) fn topology_n(&self, outcome: &'static str, n: usize) {
        if n > 0 {
            self.topology
                .get_or_create(&OutcomeLabels {
                    outcome: outcome.to_owned(),
                })
                .inc_by(n as u64);
        }
    }

    /// Counts an answered application.
    pub(super) fn answered(&self, verb: &str, approved: bool) {
        self.requests
            .get_or_create(&RequestLabels {
                verb: verb.to_owned(),
                outcome: if approved { "approved" } else { "rejected" }.to_owned(),
            })
            .inc();
    }

    /// Counts a refusal and records it in the hive's refusal log.
    pub(super) fn refused(&self, reason: &str, node: &str, detail: &str) {
        self.refused
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
        self.refusals
            .record(RefusalKind::Message, reason, Some(node), None, detail);
    }
}
