//! [`BindingMirror`]: which pods sit on which node, kept in memory from any cluster port, so
//! CloudHub's synchronous authorization checks ([`BindingView`]) work on clusters that can
//! only be read asynchronously (the `kube` adapter). The embedded cluster answers directly and
//! needs no mirror.
//!
//! The mirror is eventually consistent: it follows Pods and Nodes with the cloud's one watch
//! machinery ([`KindWatcher`]: a list, then the watch, a list again after a lag or a failure). A check that lands between a change in the cluster
//! and its watch event sees the previous state; CloudHub also admits objects it has itself
//! sent to the node, so a freshly delivered pod is never refused because of that lag.

use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock, Weak};

use super::auth::{is_mirror_pod, pod_references, pod_uses, service_account_of, BindingView};
use crate::cloud::cluster::{EventType, SharedCluster, WatchEvent};
use crate::cloud::watcher::{KindWatcher, WatchMetrics};
use crate::hive::locks;
use edgehive_protocols::object::is_self_registered;

/// The `module` label of its watches' metrics.
const MIRROR: &str = "binding_mirror";

#[derive(Debug, Default)]
struct Bindings {
    /// `(namespace, name)` → the parts of the pod's spec the checks read.
    pods: HashMap<(String, String), Value>,
    /// Node names, each with whether the edge registered it itself.
    nodes: HashMap<String, bool>,
}

/// A local copy of the cluster's Pod bindings and Node names; see the module docs.
#[derive(Debug, Clone)]
pub struct BindingMirror {
    bindings: Arc<RwLock<Bindings>>,
}

impl BindingMirror {
    /// Starts following `cluster`'s Pods and Nodes on the current arbiter, counting relists
    /// in `metrics`. The followers end when the last clone of the mirror is dropped.
    pub fn start(cluster: SharedCluster, metrics: WatchMetrics) -> Self {
        let mirror = BindingMirror {
            bindings: Arc::default(),
        };
        for kind in ["Pod", "Node"] {
            actix::spawn(follow(
                cluster.clone(),
                kind,
                Arc::downgrade(&mirror.bindings),
                metrics.clone(),
            ));
        }
        mirror
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Bindings> {
        // Every write replaces whole entries, so a panic cannot leave one half-written.
        locks::read(&self.bindings)
    }
}

impl BindingView for BindingMirror {
    fn pod_node(&self, namespace: &str, name: &str) -> Option<String> {
        let bindings = self.read();
        let pod = bindings
            .pods
            .get(&(namespace.to_owned(), name.to_owned()))?;
        pod["spec"]["nodeName"].as_str().map(str::to_owned)
    }

    fn referenced_on_node(&self, node: &str, kind: &str, namespace: &str, name: &str) -> bool {
        self.read().pods.iter().any(|((pod_namespace, _), pod)| {
            pod_namespace == namespace
                && pod["spec"]["nodeName"] == node
                && pod_references(pod, kind, name)
        })
    }

    fn node_exists(&self, name: &str) -> bool {
        self.read().nodes.contains_key(name)
    }

    fn node_known(&self, name: &str) -> bool {
        self.read().nodes.get(name) == Some(&false)
    }

    fn pod_service_account(&self, namespace: &str, name: &str) -> Option<String> {
        let bindings = self.read();
        let pod = bindings
            .pods
            .get(&(namespace.to_owned(), name.to_owned()))?;
        service_account_of(pod).map(str::to_owned)
    }

    fn mirror_pods_on_node(&self, node: &str) -> usize {
        self.read()
            .pods
            .values()
            .filter(|pod| pod["spec"]["nodeName"] == node && pod["mirror"] == true)
            .count()
    }

    fn used_on_node(&self, node: &str) -> HashSet<(&'static str, String, String)> {
        let mut used = HashSet::new();
        for ((namespace, _), pod) in self.read().pods.iter() {
            if pod["spec"]["nodeName"] == node {
                // The pruned pod lacks its namespace: give it back for `pod_uses`.
                let mut pod = pod.clone();
                pod["metadata"]["namespace"] = Value::from(namespace.as_str());
                pod_uses(&pod, &mut used);
            }
        }
        used
    }

    fn service_account_on_node(&self, node: &str, namespace: &str, account: &str) -> bool {
        self.read().pods.iter().any(|((pod_namespace, _), pod)| {
            pod_namespace == namespace
                && pod["spec"]["nodeName"] == node
                && service_account_of(pod) == Some(account)
        })
    }
}

/// Follows `kind` ([`KindWatcher`]: listed, then watched, listed again after a lag or a
/// failure, only differences told) and applies its changes, for as long as the mirror lives.
async fn follow(
    cluster: SharedCluster,
    kind: &'static str,
    bindings: Weak<RwLock<Bindings>>,
    metrics: WatchMetrics,
) {
    let mut watcher = KindWatcher::new(cluster, MIRROR, kind).counted(metrics);
    loop {
        let change = watcher.next().await;
        let Some(bindings) = bindings.upgrade() else {
            return;
        };
        if let Some(event) = change.into_event() {
            apply(&bindings, kind, &event);
        }
    }
}

fn apply(bindings: &RwLock<Bindings>, kind: &str, event: &WatchEvent) {
    let mut bindings = locks::write(bindings);
    let deleted = matches!(event.event_type, EventType::Deleted);
    match kind {
        "Pod" => {
            let Some(key) = pod_key(&event.object) else {
                return;
            };
            if deleted {
                bindings.pods.remove(&key);
            } else {
                bindings.pods.insert(key, pruned(&event.object));
            }
        }
        _ => {
            let Some(name) = event.object["metadata"]["name"].as_str() else {
                return;
            };
            if deleted {
                bindings.nodes.remove(name);
            } else {
                bindings
                    .nodes
                    .insert(name.to_owned(), is_self_registered(&event.object));
            }
        }
    }
}

fn pod_key(pod: &Value) -> Option<(String, String)> {
    let name = pod["metadata"]["name"].as_str()?;
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    Some((namespace.to_owned(), name.to_owned()))
}

/// Only what the checks read: the node and the spec fields that reference configmaps and
/// secrets (a pod's full spec and status would multiply the mirror's memory).
fn pruned(pod: &Value) -> Value {
    let spec = &pod["spec"];
    let containers = |field: &str| -> Value {
        spec[field]
            .as_array()
            .map(|containers| {
                containers
                    .iter()
                    .map(|container| json!({"env": container["env"], "envFrom": container["envFrom"]}))
                    .collect()
            })
            .unwrap_or_default()
    };
    json!({"mirror": is_mirror_pod(pod), "spec": {
        "nodeName": spec["nodeName"],
        "serviceAccountName": spec["serviceAccountName"],
        "volumes": spec["volumes"],
        "imagePullSecrets": spec["imagePullSecrets"],
        "containers": containers("containers"),
        "initContainers": containers("initContainers"),
        "ephemeralContainers": containers("ephemeralContainers"),
    }})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::cluster::EmbeddedCluster;
    use std::time::Duration;

    fn pod(name: &str, node: &str, config: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x",
                "envFrom": [{"configMapRef": {"name": config}}]}]}})
    }

    async fn eventually(what: &str, check: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !check() {
            assert!(std::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The mirror agrees with the cluster it follows: existing objects, then watched changes.
    #[actix_rt::test]
    async fn mirror_follows_pods_and_nodes_through_the_port() {
        let cluster = EmbeddedCluster::new();
        cluster.apply(pod("before", "edge-a", "cfg-a")).unwrap();
        cluster
            .apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "edge-a"}}))
            .unwrap();
        let mirror = BindingMirror::start(Arc::new(cluster.clone()), WatchMetrics::default());
        eventually("listed objects", || {
            mirror.pod_node("default", "before").as_deref() == Some("edge-a")
                && mirror.node_exists("edge-a")
        })
        .await;
        assert!(mirror.referenced_on_node("edge-a", "configmap", "default", "cfg-a"));
        assert!(!mirror.referenced_on_node("edge-b", "configmap", "default", "cfg-a"));
        assert!(!mirror.referenced_on_node("edge-a", "secret", "default", "cfg-a"));
        // The same, read once for a whole list, agrees with the cluster's own answer.
        let used = mirror.used_on_node("edge-a");
        assert!(used.contains(&("configmap", "default".to_owned(), "cfg-a".to_owned())));
        assert_eq!(used, cluster.used_on_node("edge-a"));
        assert!(mirror.used_on_node("edge-b").is_empty());

        cluster.apply(pod("after", "edge-b", "cfg-b")).unwrap();
        eventually("watched add", || {
            mirror.referenced_on_node("edge-b", "configmap", "default", "cfg-b")
        })
        .await;
        cluster.delete("Pod", Some("default"), "before").unwrap();
        eventually("watched delete", || {
            mirror.pod_node("default", "before").is_none()
        })
        .await;
        assert!(!mirror.node_exists("edge-z"));
    }
}
