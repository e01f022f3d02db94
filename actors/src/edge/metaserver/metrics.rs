//! MetaServer's counters: requests served by verb and source, and refusals by reason.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::hive::Hive;

/// Labels of `edgehive_metaserver_requests_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RequestLabels {
    /// `list`, `get`, `watch`, `discovery`.
    pub(super) verb: String,
    /// `cloud` or `local`.
    pub(super) source: String,
}

/// Labels of `edgehive_metaserver_refused_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReasonLabels {
    pub(super) reason: String,
}

/// Where an answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// DynamicController, through EdgeHub.
    Cloud,
    /// The edge's store.
    Local,
}

/// The handles, registered once per server.
#[derive(Debug, Clone, Default)]
pub(super) struct Metrics {
    requests: Family<RequestLabels, Counter>,
    refused: Family<ReasonLabels, Counter>,
    pub(super) watches: Gauge,
    pub(super) cloud_fallbacks: Counter,
    pub(super) watch_retries: Counter,
}

impl Metrics {
    pub(super) fn register(hive: &Hive) -> Metrics {
        let metrics = Metrics::default();
        let registry = hive.metrics();
        registry.register(
            "edgehive_metaserver_requests",
            "MetaServer requests answered, by verb and by source (cloud: DynamicController; \
             local: the edge's store)",
            metrics.requests.clone(),
        );
        registry.register(
            "edgehive_metaserver_refused",
            "MetaServer requests refused, by reason (write, too_large, bad_request, \
             bad_selector, secret, too_many_watches, busy, expired, watch_lagged)",
            metrics.refused.clone(),
        );
        registry.register(
            "edgehive_metaserver_watches",
            "MetaServer watches open",
            metrics.watches.clone(),
        );
        registry.register(
            "edgehive_metaserver_cloud_fallbacks",
            "Lists and gets answered from the store because the cloud did not answer in time \
             or the link dropped",
            metrics.cloud_fallbacks.clone(),
        );
        registry.register(
            "edgehive_metaserver_watch_retries",
            "Watch applications sent to the cloud again after it refused them as busy (503)",
            metrics.watch_retries.clone(),
        );
        metrics
    }

    pub(super) fn served(&self, verb: &str, source: Source) {
        let source = match source {
            Source::Cloud => "cloud",
            Source::Local => "local",
        };
        self.requests
            .get_or_create(&RequestLabels {
                verb: verb.to_owned(),
                source: source.to_owned(),
            })
            .inc();
    }

    pub(super) fn refused(&self, reason: &str) {
        self.refused
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }
}
