//! LocationCache: which edge nodes use which ConfigMaps and Secrets.
//!
//! A pod uses a ConfigMap or Secret through volumes (`configMap`, `secret`, and the sources of
//! `projected` volumes), `envFrom`, `env[].valueFrom` (`configMapKeyRef`, `secretKeyRef`) of
//! its containers, init containers and ephemeral containers, and `imagePullSecrets`.
//!
//! **The rule for pods that go away** (where edgehive differs from KubeEdge on purpose):
//! KubeEdge never removes a node from an entry until the ConfigMap/Secret itself is deleted,
//! so a node keeps receiving a ConfigMap that none of its pods uses any more. edgehive counts
//! the pods: a node is in an entry while at least one pod bound to it uses the object. When a
//! node gains its first user, it is sent the object (so an edge has it before its pod asks);
//! when it loses its last user, it is sent a delete of the object, so the edge neither keeps a
//! stale copy nor receives later changes. An operator reads the set of nodes holding a
//! ConfigMap straight from the pods that use it.

use std::collections::{BTreeSet, HashMap};

use edgehive_protocols::object::{namespaced_key, pod_references};
use serde_json::Value;

pub use edgehive_protocols::object::RefKind;

/// A referenced object: kind, namespace, name.
pub(crate) type ObjectRef = (RefKind, String, String);

/// How the node set of a referenced object changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// (object, node): the node has its first pod using the object.
    pub gained: Vec<(ObjectRef, String)>,
    /// (object, node): the node's last pod using the object is gone.
    pub lost: Vec<(ObjectRef, String)>,
}

/// See the [module docs](self).
#[derive(Debug, Default)]
pub(crate) struct LocationCache {
    /// (namespace, pod name) -> (node, what it references).
    pods: HashMap<(String, String), (String, BTreeSet<ObjectRef>)>,
    /// object -> node -> how many pods on that node use it.
    users: HashMap<ObjectRef, HashMap<String, usize>>,
}

impl LocationCache {
    /// Records `pod` (bound to a node or not); returns the nodes that gained or lost users.
    pub(crate) fn set_pod(&mut self, pod: &Value) -> Changes {
        let key = pod_key(pod);
        let mut changes = self.remove_key(&key);
        let Some(node) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) else {
            return changes;
        };
        let refs = references(pod);
        for object in &refs {
            let count = self
                .users
                .entry(object.clone())
                .or_default()
                .entry(node.to_owned())
                .or_default();
            *count += 1;
            if *count == 1 {
                let pair = (object.clone(), node.to_owned());
                // A pod replaced by itself: it lost and regained the same reference.
                if let Some(at) = changes.lost.iter().position(|lost| *lost == pair) {
                    changes.lost.remove(at);
                } else {
                    changes.gained.push(pair);
                }
            }
        }
        self.pods.insert(key, (node.to_owned(), refs));
        changes
    }

    /// Forgets `pod`; returns the nodes that lost their last user of an object.
    pub(crate) fn remove_pod(&mut self, pod: &Value) -> Changes {
        self.remove_key(&pod_key(pod))
    }

    fn remove_key(&mut self, key: &(String, String)) -> Changes {
        let mut changes = Changes::default();
        let Some((node, refs)) = self.pods.remove(key) else {
            return changes;
        };
        for object in refs {
            let Some(nodes) = self.users.get_mut(&object) else {
                continue;
            };
            if let Some(count) = nodes.get_mut(&node) {
                *count -= 1;
                if *count == 0 {
                    nodes.remove(&node);
                    changes.lost.push((object.clone(), node.clone()));
                }
            }
            if nodes.is_empty() {
                self.users.remove(&object);
            }
        }
        changes
    }

    /// The nodes with a pod using the object, sorted.
    pub(crate) fn nodes_for(&self, object: &ObjectRef) -> Vec<String> {
        let mut nodes: Vec<String> = self
            .users
            .get(object)
            .map(|nodes| nodes.keys().cloned().collect())
            .unwrap_or_default();
        nodes.sort();
        nodes
    }

    /// The objects some pod on `node` uses, sorted.
    pub(crate) fn objects_on(&self, node: &str) -> Vec<ObjectRef> {
        let mut objects: Vec<ObjectRef> = self
            .users
            .iter()
            .filter(|(_, nodes)| nodes.contains_key(node))
            .map(|(object, _)| object.clone())
            .collect();
        objects.sort();
        objects
    }
}

fn pod_key(pod: &Value) -> (String, String) {
    namespaced_key(pod)
}

/// Every ConfigMap and Secret `pod` uses, with the pod's namespace; see the
/// [module docs](self).
pub fn references(pod: &Value) -> BTreeSet<ObjectRef> {
    let (namespace, _) = namespaced_key(pod);
    pod_references(pod)
        .into_iter()
        .map(|(kind, name)| (kind, namespace.clone(), name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, node: &str, spec: Value) -> Value {
        let mut spec = spec;
        spec["nodeName"] = json!(node);
        json!({"kind": "Pod", "metadata": {"name": name, "namespace": "ns"}, "spec": spec})
    }

    fn cm(name: &str) -> ObjectRef {
        (RefKind::ConfigMap, "ns".into(), name.into())
    }

    fn secret(name: &str) -> ObjectRef {
        (RefKind::Secret, "ns".into(), name.into())
    }

    #[test]
    fn every_way_of_referencing_is_found() {
        let pod = pod(
            "p",
            "n",
            json!({
                "volumes": [
                    {"name": "a", "configMap": {"name": "vol-cm"}},
                    {"name": "b", "secret": {"secretName": "vol-secret"}},
                    {"name": "c", "projected": {"sources": [
                        {"configMap": {"name": "proj-cm"}}, {"secret": {"name": "proj-secret"}},
                        {"serviceAccountToken": {"path": "t"}}]}},
                ],
                "initContainers": [{"name": "i", "envFrom": [{"configMapRef": {"name": "from-cm"}}]}],
                "containers": [{"name": "c",
                    "envFrom": [{"secretRef": {"name": "from-secret"}}],
                    "env": [
                        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "key-cm", "key": "x"}}},
                        {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "key-secret", "key": "y"}}},
                        {"name": "Z", "value": "plain"}]}],
                "imagePullSecrets": [{"name": "pull"}],
            }),
        );
        let found = references(&pod);
        let expected: BTreeSet<ObjectRef> = [
            cm("vol-cm"),
            cm("proj-cm"),
            cm("from-cm"),
            cm("key-cm"),
            secret("vol-secret"),
            secret("proj-secret"),
            secret("from-secret"),
            secret("key-secret"),
            secret("pull"),
        ]
        .into_iter()
        .collect();
        assert_eq!(found, expected);
    }

    #[test]
    fn nodes_are_counted_per_pod_and_lost_with_the_last_one() {
        let mut cache = LocationCache::default();
        let uses = json!({"volumes": [{"name": "v", "configMap": {"name": "cfg"}}]});
        let gained = cache.set_pod(&pod("a1", "a", uses.clone())).gained;
        assert_eq!(gained, vec![(cm("cfg"), "a".to_owned())]);
        assert!(cache
            .set_pod(&pod("a2", "a", uses.clone()))
            .gained
            .is_empty());
        cache.set_pod(&pod("b1", "b", uses.clone()));
        assert_eq!(cache.nodes_for(&cm("cfg")), vec!["a", "b"]);

        // Re-recording a pod unchanged changes nothing.
        assert_eq!(
            cache.set_pod(&pod("b1", "b", uses.clone())),
            Changes::default()
        );
        assert!(cache
            .remove_pod(&pod("a1", "a", uses.clone()))
            .lost
            .is_empty());
        assert_eq!(
            cache.remove_pod(&pod("b1", "b", uses.clone())).lost,
            vec![(cm("cfg"), "b".to_owned())]
        );
        assert_eq!(cache.nodes_for(&cm("cfg")), vec!["a"]);
        // A pod that stops using it.
        let lost = cache.set_pod(&pod("a2", "a", json!({}))).lost;
        assert_eq!(lost, vec![(cm("cfg"), "a".to_owned())]);
        assert!(cache.nodes_for(&cm("cfg")).is_empty());
    }
}
