//! Devices as last seen, indexed for the questions the controller asks on every event: which
//! devices a node has (`membership/detail`, asked by every edge on connect), how many of a
//! node's devices use a model (whether to send or delete the DeviceModel), which nodes use a
//! model (a changed DeviceModel). Each is answered without walking every device, so an event
//! costs the same with 10 devices as with 100,000.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;

use super::device::{model_of, node_of};
use crate::hive::locks;

/// A device's key: (namespace, name).
pub(super) type DeviceKey = (String, String);

/// See the [module docs](self).
#[derive(Debug, Default)]
pub(super) struct DeviceIndex {
    devices: HashMap<DeviceKey, Value>,
    /// The keys of each node's devices.
    by_node: HashMap<String, BTreeSet<DeviceKey>>,
    /// For each (namespace, model): how many devices of each node use it.
    by_model: HashMap<DeviceKey, HashMap<String, usize>>,
}

impl DeviceIndex {
    /// The device at `key`.
    pub(super) fn get(&self, key: &DeviceKey) -> Option<&Value> {
        self.devices.get(key)
    }

    /// Keeps `device` at `key`, replacing what was there.
    pub(super) fn insert(&mut self, key: DeviceKey, device: Value) {
        self.remove(&key);
        if let Some(node) = node_of(&device) {
            if let Some(model) = model_of(&device) {
                *self
                    .by_model
                    .entry((key.0.clone(), model))
                    .or_default()
                    .entry(node.clone())
                    .or_default() += 1;
            }
            self.by_node.entry(node).or_default().insert(key.clone());
        }
        self.devices.insert(key, device);
    }

    /// Forgets the device at `key`, giving it back.
    pub(super) fn remove(&mut self, key: &DeviceKey) -> Option<Value> {
        let device = self.devices.remove(key)?;
        if let Some(node) = node_of(&device) {
            if let Some(keys) = self.by_node.get_mut(&node) {
                keys.remove(key);
                if keys.is_empty() {
                    self.by_node.remove(&node);
                }
            }
            if let Some(model) = model_of(&device) {
                let model_key = (key.0.clone(), model);
                if let Some(nodes) = self.by_model.get_mut(&model_key) {
                    if let Some(count) = nodes.get_mut(&node) {
                        *count = count.saturating_sub(1);
                        if *count == 0 {
                            nodes.remove(&node);
                        }
                    }
                    if nodes.is_empty() {
                        self.by_model.remove(&model_key);
                    }
                }
            }
        }
        Some(device)
    }

    /// The devices bound to `node`, by key.
    pub(super) fn on_node<'a>(&'a self, node: &str) -> impl Iterator<Item = &'a Value> + 'a {
        self.by_node
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|key| self.devices.get(key))
    }

    /// Whether a device of `node` in `namespace` other than the one named `except` uses
    /// `model`.
    pub(super) fn model_used(
        &self,
        node: &str,
        namespace: &str,
        model: &str,
        except: &str,
    ) -> bool {
        let model_key = (namespace.to_owned(), model.to_owned());
        let users = self
            .by_model
            .get(&model_key)
            .and_then(|nodes| nodes.get(node))
            .copied()
            .unwrap_or(0);
        let except_counted = self
            .devices
            .get(&(namespace.to_owned(), except.to_owned()))
            .is_some_and(|device| {
                node_of(device).as_deref() == Some(node)
                    && model_of(device).as_deref() == Some(model)
            });
        users > usize::from(except_counted)
    }

    /// The nodes with a device in `namespace` that uses `model`, sorted.
    pub(super) fn nodes_using(&self, namespace: &str, model: &str) -> Vec<String> {
        let mut nodes: Vec<String> = self
            .by_model
            .get(&(namespace.to_owned(), model.to_owned()))
            .into_iter()
            .flat_map(|nodes| nodes.keys().cloned())
            .collect();
        nodes.sort();
        nodes
    }
}

/// Devices as last seen, by (namespace, name); shared by the watch loop and the upstream
/// handlers (membership/detail, twin names).
pub(super) type Devices = Arc<Mutex<DeviceIndex>>;

/// Every writer finishes its update of the index before anything can panic (see
/// [`locks`](crate::hive::locks)).
pub(super) fn lock(devices: &Devices) -> MutexGuard<'_, DeviceIndex> {
    locks::lock(devices)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn device(name: &str, node: Option<&str>, model: Option<&str>) -> Value {
        let mut spec = json!({});
        if let Some(node) = node {
            spec["nodeName"] = json!(node);
        }
        if let Some(model) = model {
            spec["deviceModelRef"] = json!({"name": model});
        }
        json!({"metadata": {"namespace": "default", "name": name}, "spec": spec})
    }

    /// The answers as a walk over every device would give them.
    fn walked(
        index: &DeviceIndex,
        node: &str,
        model: &str,
        except: &str,
    ) -> (Vec<String>, bool, Vec<String>) {
        let all = index.devices.clone();
        let mut on_node: Vec<String> = all
            .iter()
            .filter(|(_, d)| node_of(d).as_deref() == Some(node))
            .map(|(key, _)| key.1.clone())
            .collect();
        on_node.sort();
        let used = all.iter().any(|(key, d)| {
            key.1 != except
                && node_of(d).as_deref() == Some(node)
                && model_of(d).as_deref() == Some(model)
        });
        let mut nodes: Vec<String> = all
            .values()
            .filter(|d| model_of(d).as_deref() == Some(model))
            .filter_map(node_of)
            .collect();
        nodes.sort();
        nodes.dedup();
        (on_node, used, nodes)
    }

    fn indexed(
        index: &DeviceIndex,
        node: &str,
        model: &str,
        except: &str,
    ) -> (Vec<String>, bool, Vec<String>) {
        let on_node: Vec<String> = index
            .on_node(node)
            .map(|d| {
                d["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        (
            on_node,
            index.model_used(node, "default", model, except),
            index.nodes_using("default", model),
        )
    }

    #[test]
    fn the_indexes_answer_as_a_walk_over_every_device_would() {
        let nodes = [None, Some("n1"), Some("n2"), Some("n3")];
        let models = [None, Some("m1"), Some("m2")];
        let mut index = DeviceIndex::default();
        // A fixed pseudo-random walk of inserts, moves, model changes and removals.
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |bound: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % bound as u64) as usize
        };
        for step in 0..2_000 {
            let name = format!("d{}", next(12));
            let key = ("default".to_owned(), name.clone());
            if next(4) == 0 {
                index.remove(&key);
            } else {
                index.insert(key, device(&name, nodes[next(4)], models[next(3)]));
            }
            for node in ["n1", "n2", "n3"] {
                for model in ["m1", "m2"] {
                    let except = format!("d{}", next(12));
                    assert_eq!(
                        indexed(&index, node, model, &except),
                        walked(&index, node, model, &except),
                        "step {step}, {node}, {model}, except {except}"
                    );
                }
            }
        }
        // Everything removed: nothing left in any index.
        for n in 0..12 {
            index.remove(&("default".to_owned(), format!("d{n}")));
        }
        assert!(index.by_node.is_empty() && index.by_model.is_empty());
    }
}
