//! The controller manager's counters.

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

/// How often writes that failed are tried again (only while some are owed); an
/// application's workload writes that keep failing wait twice as long each time, up to
/// [`MAX_RETRY_INTERVAL`].
pub(super) const RETRY_INTERVAL: Duration = Duration::from_secs(5);

/// The longest wait before an application's failing writes are tried again.
pub(super) const MAX_RETRY_INTERVAL: Duration = Duration::from_secs(300);

/// The controllers' counters.
#[derive(Debug, Clone, Default)]
pub(super) struct Metrics {
    /// Writes to the cluster by `what` (`label`, `status`, `workload`, `delete`, `event`)
    /// and `result` (`ok`, `failed`; `refused` for a workload the API server refused with a
    /// 4xx that a retry cannot fix).
    pub(super) writes: Family<Vec<(String, String)>, Counter>,
    /// EdgeApplication manifests refused, by `reason` (`kind`, `api_version`, `name`,
    /// `namespace`; for a target's Deployment `predicate`, `label_selector`;
    /// `workloads::Refused`), each counted once per application; and workload writes the API
    /// server refused (`invalid`: 422, e.g. an immutable field changed; `rejected`: another
    /// 4xx a retry cannot fix), counted once per refused write.
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
