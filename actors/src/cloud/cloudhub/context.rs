//! What CloudHub shares with every node actor and session: the hive, the options, the
//! metrics and the count of connected nodes. Below the node and session files, which both
//! read it, and [`super::dispatch`], which routes with it.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::metrics::CloudHubMetrics;
use super::options::{CloudHubOptions, CloudHubSecurity};
use crate::cloud::ownership::Ownership;
use crate::hive::Hive;

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
}

impl HubContext {
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
