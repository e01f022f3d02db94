//! What DeviceTwin changed, for the modules that tell the node's devices about it (EventBus
//! publishes deltas, twin documents and membership updates on MQTT). One broadcast per hive,
//! written only by DeviceTwin; no beehive message crosses it.

use std::sync::Arc;

use serde_json::{Map, Value};
use tokio::sync::broadcast;

use crate::hive::Hive;

/// Changes a slow follower may fall behind by before it misses some (it is told how many).
const CAPACITY: usize = 256;

/// A change DeviceTwin committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TwinChange {
    /// A device's twins changed (desired values from the cloud, or a reading on the local
    /// API; a mapper's MQTT update is answered by EventBus itself): `{namespace}/{name}`.
    Device(String),
    /// A device's twin document: for each property whose twin changed, KubeEdge's TwinDoc
    /// `{"last": twin | null, "current": twin | null}` (a twin as [`twin_document`] takes
    /// it; `null` where the twin did not exist before, or no longer does). Told before the
    /// [`TwinChange::Device`] of the same change, as edgecore publishes the document before
    /// the delta.
    Document {
        /// `{namespace}/{name}`.
        id: String,
        /// The document's `twin`.
        twin: Map<String, Value>,
    },
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

/// What tells two twins apart in a document: the desired and reported values, the type and
/// `optional` (not the values' timestamps, which every write of a Device renews).
fn twin_key(twin: &Value) -> [Option<&Value>; 4] {
    [
        twin.pointer("/expected/value"),
        twin.pointer("/actual/value"),
        twin.pointer("/metadata/type"),
        twin.get("optional"),
    ]
}

/// KubeEdge's twin document's `twin` between two states of a device's twins (by property,
/// each KubeEdge's MsgTwin without versions: `{expected, actual, optional, metadata}`): one
/// `{"last", "current"}` per property added, removed or changed; empty when nothing changed.
pub fn twin_document(
    before: &Map<String, Value>,
    after: &Map<String, Value>,
) -> Map<String, Value> {
    let mut document = Map::new();
    for (property, current) in after {
        let last = before.get(property);
        if last.map(twin_key) != Some(twin_key(current)) {
            document.insert(
                property.clone(),
                serde_json::json!({"last": last, "current": current}),
            );
        }
    }
    for (property, last) in before {
        if !after.contains_key(property) {
            document.insert(
                property.clone(),
                serde_json::json!({"last": last, "current": null}),
            );
        }
    }
    document
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn twins(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn a_document_names_the_twins_that_changed_with_their_last_and_current_states() {
        let before = twins(json!({
            "t": {"expected": {"value": "20", "metadata": {"timestamp": 1}}, "optional": true,
                  "metadata": {"type": "int"}},
            "h": {"expected": {"value": "5", "metadata": {"timestamp": 1}}, "optional": true,
                  "metadata": {"type": "int"}},
            "gone": {"optional": true, "metadata": {"type": "string"}},
        }));
        let after = twins(json!({
            "t": {"expected": {"value": "20", "metadata": {"timestamp": 1}},
                  "actual": {"value": "21", "metadata": {"timestamp": 2}}, "optional": true,
                  "metadata": {"type": "int"}},
            // Only the timestamp moved: not a change.
            "h": {"expected": {"value": "5", "metadata": {"timestamp": 9}}, "optional": true,
                  "metadata": {"type": "int"}},
            "new": {"expected": {"value": "x"}, "optional": true, "metadata": {"type": "string"}},
        }));
        let document = twin_document(&before, &after);
        assert_eq!(document.len(), 3, "{document:?}");
        assert_eq!(document["t"]["last"], before["t"]);
        assert_eq!(document["t"]["current"]["actual"]["value"], "21");
        assert_eq!(document["new"]["last"], Value::Null);
        assert_eq!(document["new"]["current"], after["new"]);
        assert_eq!(document["gone"]["last"], before["gone"]);
        assert_eq!(document["gone"]["current"], Value::Null);
        assert!(twin_document(&after, &after).is_empty());
    }
}
