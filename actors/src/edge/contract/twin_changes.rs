//! What DeviceTwin changed, for the modules that tell the node's devices about it (EventBus
//! publishes deltas and membership updates on MQTT). One broadcast per hive, written only by
//! DeviceTwin; no beehive message crosses it.

use std::sync::Arc;

use tokio::sync::broadcast;

use crate::hive::Hive;

/// Changes a slow follower may fall behind by before it misses some (it is told how many).
const CAPACITY: usize = 256;

/// A change DeviceTwin committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TwinChange {
    /// A device's twins changed (desired values from the cloud, or a mapper's report):
    /// `{namespace}/{name}`.
    Device(String),
    /// Devices were added to or removed from this node (ids `{namespace}/{name}`).
    Membership {
        /// Added.
        added: Vec<String>,
        /// Removed.
        removed: Vec<String>,
    },
}

/// The edge's feed of [`TwinChange`]s; [`TwinChanges::of`] a hive.
#[derive(Debug)]
pub struct TwinChanges {
    sender: broadcast::Sender<TwinChange>,
}

impl Default for TwinChanges {
    fn default() -> Self {
        TwinChanges {
            sender: broadcast::channel(CAPACITY).0,
        }
    }
}

impl TwinChanges {
    /// The feed of `hive`'s edge, whichever module asks first.
    pub fn of(hive: &Hive) -> Arc<TwinChanges> {
        hive.shared::<TwinChanges>()
    }

    /// A receiver of the changes made from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<TwinChange> {
        self.sender.subscribe()
    }

    /// DeviceTwin's: tells the followers (none may be listening).
    pub(in crate::edge) fn send(&self, change: TwinChange) {
        let _ = self.sender.send(change);
    }
}
