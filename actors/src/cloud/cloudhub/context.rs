//! What CloudHub shares with every node actor and session: the hive, the options, the
//! metrics and the count of connected nodes. Below the node and session files, which both
//! read it, and [`super::dispatch`], which routes with it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use super::metrics::CloudHubMetrics;
use super::options::{CloudHubOptions, CloudHubSecurity};
use crate::cloud::contract::route;
use crate::cloud::ownership::Ownership;
use crate::hive::Hive;

/// How long a new session waits for the node's records (what its edge acknowledged, read by
/// SyncController) before it is written to all the same: a replica's session of a node it
/// came to serve, and a session opened before a process alone read its records at start.
pub(crate) const RECORDS_WAIT: Duration = Duration::from_secs(5);

/// What every node actor shares with CloudHub.
pub(crate) struct HubContext {
    pub(crate) hive: Hive,
    pub(crate) options: CloudHubOptions,
    pub(crate) security: CloudHubSecurity,
    pub(crate) metrics: CloudHubMetrics,
    /// Nodes with an admitted connection (see [`NodeCell::admit`](super::node::NodeCell::admit)).
    pub(crate) connected: AtomicUsize,
    /// Which nodes this process serves (all of them unless it is one replica of several).
    pub(crate) ownership: std::sync::Arc<Ownership>,
    /// A process alone on its cluster whose SyncController has not yet said what the edges
    /// acknowledged ([`RecordsLoaded`](crate::cloud::contract::ownership::RecordsLoaded)).
    pub(crate) records_pending: AtomicBool,
}

impl HubContext {
    /// Whether a session opened now waits for the records read at start: alone on the
    /// cluster, before SyncController (if it runs) said what the edges acknowledged.
    pub(crate) fn awaits_records(&self) -> bool {
        self.records_pending.load(Ordering::SeqCst)
            && !self.hive.group_members(route::SYNCCONTROLLER).is_empty()
    }

    pub(crate) fn connected_changed(&self, connected: bool) {
        if connected {
            self.connected.fetch_add(1, Ordering::AcqRel);
            self.metrics.connected_nodes.inc();
        } else {
            self.connected.fetch_sub(1, Ordering::AcqRel);
            self.metrics.connected_nodes.dec();
        }
    }
}
