//! The controller manager's counters.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// How often writes that failed are tried again (only while some are owed).
pub(super) const RETRY_INTERVAL: Duration = Duration::from_secs(5);

/// The controllers' counters.
#[derive(Debug, Clone, Default)]
pub(super) struct Metrics {
    /// Writes to the cluster by `what` (`label`, `status`, `workload`, `delete`, `event`)
    /// and `result` (`ok`, `failed`).
    pub(super) writes: Family<Vec<(String, String)>, Counter>,
    /// EdgeApplication manifests refused, by `reason` (`kind`, `api_version`, `name`,
    /// `namespace`; for a target's Deployment `predicate`, `label_selector`;
    /// `workloads::Refused`), each counted once per application.
    pub(super) refused: Family<Vec<(String, String)>, Counter>,
}

impl Metrics {
    /// Counts one write of `what` that succeeded or not.
    pub(super) fn count(&self, what: &str, ok: bool) {
        self.count_as(what, if ok { "ok" } else { "failed" }, 1);
    }

    /// Counts one manifest refused for `reason`.
    pub(super) fn refused(&self, reason: &str) {
        self.refused
            .get_or_create(&vec![("reason".to_owned(), reason.to_owned())])
            .inc();
    }

    /// Counts `n` writes of `what` with `result`.
    pub(super) fn count_as(&self, what: &str, result: &str, n: u64) {
        self.writes
            .get_or_create(&vec![
                ("what".to_owned(), what.to_owned()),
                ("result".to_owned(), result.to_owned()),
            ])
            .inc_by(n);
    }
}
