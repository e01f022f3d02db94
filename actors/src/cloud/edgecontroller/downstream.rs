//! EdgeController's downstream half: cluster watches -> messages for edge nodes.
//!
//! - Pods bound to an edge node: Added -> insert (update if already being deleted), Modified
//!   -> update only if metadata (other than resourceVersion, generation, managedFields) or spec
//!   changed, Deleted -> delete.
//! - ConfigMaps (Added insert, Modified update, Deleted delete) and Secrets (Added and
//!   Modified update, Deleted delete) to the nodes the [`LocationCache`] names; a node that
//!   gains its first pod using one is sent it, a node that loses its last is sent a delete
//!   (see [`super::location`] for why).
//! - Edge nodes (label [`EDGE_NODE_LABEL`]): Deleted -> delete without content
//!   (`node/{n}/null/node/{n}`, no ACK), then the node's session is closed. Added/Modified ->
//!   update with the Node when its metadata or spec changed (status changes come from the
//!   edge itself) only if node updates are on: KubeEdge HEAD pushes them, v1.22.0 (what the
//!   golden frames show and what edgehive matches by default) does not.
//!
//! The loop runs as a future of the actor, so a restarted actor lists and watches again;
//! CloudHub's pools skip what the edges already ACKed. Each kind is followed by the one
//! watch machinery ([`crate::cloud::watcher`]): a list after a lag, a closed watch or a
//! failed list gives only the differences with what was seen.

use std::collections::HashMap;

use edgehive_protocols::{Operation, ResourceType};
use serde_json::Value;

use super::location::{LocationCache, ObjectRef, RefKind};
use crate::cloud::cluster::{EventType, SharedCluster, WatchEvent};
use crate::cloud::contract::{
    downstream, route, NodeMessage, StoreReplaced, ToNodes, STORE_ID_ANNOTATION,
};
use crate::cloud::outbox::{Outbox, RETRY_INTERVAL};
use crate::cloud::watcher::{keep_all, Keep, KindWatcher, WatchMetrics};
use crate::hive::{Hive, HiveError, Refused};
use edgehive_protocols::object::{is_newer, meta_str, namespaced_key};

/// The label that marks a Node as an edge node.
const EDGE_NODE_LABEL: &str = "node-role.kubernetes.io/edge";

/// Most store checks waiting for their Node to be seen (an edge connects before it
/// registers its Node). Overflow policy: a check beyond it is dropped and logged; the node's
/// store is then checked on the next cloud start (a bound no node can pass by reconnecting,
/// as each node waits at most once).
const UNSEEN_CAPACITY: usize = 4096;

/// What the watch loop hears about the edges' stores (see [`STORE_ID_ANNOTATION`]).
#[derive(Debug)]
pub(crate) enum StoreNote {
    /// The first store this process saw of the node: compared with the Node's record.
    Seen {
        /// The node.
        node: String,
        /// Its store's identity.
        store_id: String,
    },
    /// The node's store was replaced (CloudHub forgot what it acknowledged): everything
    /// bound to it goes again, and the store is recorded.
    Resync {
        /// The node.
        node: String,
        /// Its new store's identity.
        store_id: String,
    },
}

/// What was last seen of a pod. Kept as text, not `Value` trees: a small pod's tree is a few
/// KiB of maps and strings, its text a few hundred bytes, and this is kept for every pod.
struct PodSeen {
    rv: String,
    node: Option<String>,
    /// [`fingerprint`] of the pod.
    fingerprint: Box<str>,
    /// The pod itself as JSON, for a node that becomes an edge node later (boxed: exactly
    /// its length, where the `String` it was written into has up to twice that).
    object: Box<str>,
}

/// metadata (without resourceVersion, generation, managedFields) and spec: what an edge
/// cares about, as JSON text with every object's keys sorted (two fingerprints are equal when
/// the values are, whatever order their keys came in).
fn fingerprint(obj: &Value) -> Box<str> {
    let mut metadata = obj["metadata"].clone();
    if let Some(map) = metadata.as_object_mut() {
        for field in ["resourceVersion", "generation", "managedFields"] {
            map.remove(field);
        }
    }
    let mut text = String::new();
    sorted_json(&serde_json::json!([metadata, obj["spec"]]), &mut text);
    text.into_boxed_str()
}

/// `value` as compact JSON with the keys of every object in order.
fn sorted_json(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push('{');
            for (index, (key, item)) in entries.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(&Value::from(key.as_str()).to_string());
                out.push(':');
                sorted_json(item, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                sorted_json(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

fn is_edge_node(node: &Value) -> bool {
    node["metadata"]["labels"].get(EDGE_NODE_LABEL).is_some()
}

pub(crate) use crate::cloud::contract::object_message;

/// The watch loop's state.
pub(crate) struct Watcher {
    hive: Hive,
    cluster: SharedCluster,
    outbox: Outbox,
    node_updates: bool,
    /// Edge node name -> fingerprint last sent.
    edge_nodes: HashMap<String, Box<str>>,
    pods: HashMap<(String, String), PodSeen>,
    location: LocationCache,
    /// The ConfigMaps and Secrets as last seen (what a node gaining a user is sent).
    objects: HashMap<ObjectRef, Value>,
    /// Every Node seen, with the store recorded on it (or written since).
    stores: HashMap<String, Option<String>>,
    /// Stores seen of nodes whose Node is not seen yet, checked when it is.
    unseen: HashMap<String, String>,
}

/// What a Deleted found by a list carries of a pod: its identity and node, enough for the
/// edge to delete it.
fn pod_tombstone(pod: &Value) -> Value {
    let (namespace, name) = namespaced_key(pod);
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": meta_str(pod, "uid")},
        "spec": {"nodeName": pod["spec"]["nodeName"]},
    })
}

impl Watcher {
    /// A watcher with nothing seen yet.
    /// `node_updates`: whether edge nodes get their Node object (KubeEdge HEAD) or not
    /// (v1.22.0).
    pub(crate) fn new(
        hive: Hive,
        cluster: SharedCluster,
        outbox: Outbox,
        node_updates: bool,
    ) -> Self {
        Watcher {
            hive,
            cluster,
            outbox,
            node_updates,
            edge_nodes: HashMap::new(),
            pods: HashMap::new(),
            location: LocationCache::default(),
            objects: HashMap::new(),
            stores: HashMap::new(),
            unseen: HashMap::new(),
        }
    }

    /// Follows Nodes, Pods, ConfigMaps and Secrets (each with [`KindWatcher`]: listed, then
    /// watched, listed again after a lag or a failure) for as long as the actor lives; the
    /// notes on `stores` say which nodes came back with another store (sent everything bound
    /// to them again) and which stores to check against the Node's record.
    pub(crate) async fn run(
        mut self,
        mut stores: tokio::sync::mpsc::Receiver<StoreNote>,
        metrics: WatchMetrics,
    ) {
        let follow = |kind: &str, keep: Option<Keep>| {
            let watcher = KindWatcher::new(self.cluster.clone(), route::EDGECONTROLLER, kind)
                .counted(metrics.clone());
            match keep {
                Some(keep) => watcher.keeping(keep),
                None => watcher,
            }
        };
        // A node's delete needs only its name; a pod's, its identity and node; a ConfigMap's
        // or Secret's is sent with its last content.
        let mut nodes = follow("Node", None);
        let mut pods = follow("Pod", Some(pod_tombstone));
        let mut config_maps = follow("ConfigMap", Some(keep_all));
        let mut secrets = follow("Secret", Some(keep_all));
        let mut retry = tokio::time::interval(RETRY_INTERVAL);
        loop {
            // No event is taken while CloudHub has not taken what the last ones produced
            // (a list's differences come one at a time too).
            self.outbox.room().await;
            // Biased: of changes that are all ready, nodes, ConfigMaps and Secrets go
            // first, so an object written before a pod that uses it reaches the node first
            // (and at start every object is known before the first pod).
            tokio::select! {
                biased;
                change = nodes.next() => if let Some(event) = change.into_event() {
                    self.on_node(event);
                },
                change = config_maps.next() => if let Some(event) = change.into_event() {
                    self.on_object(RefKind::ConfigMap, event);
                },
                change = secrets.next() => if let Some(event) = change.into_event() {
                    self.on_object(RefKind::Secret, event);
                },
                change = pods.next() => if let Some(event) = change.into_event() {
                    self.on_pod(event);
                },
                Some(note) = stores.recv() => self.on_store(note),
                _ = retry.tick(), if !self.outbox.is_empty() => self.outbox.flush(),
            }
        }
    }

    // ---- stores ----

    fn on_store(&mut self, note: StoreNote) {
        match note {
            StoreNote::Seen { node, store_id } => {
                if self.stores.contains_key(&node) {
                    self.check_store(&node, store_id);
                } else if self.unseen.len() < UNSEEN_CAPACITY || self.unseen.contains_key(&node) {
                    self.unseen.insert(node, store_id);
                } else {
                    tracing::warn!(%node, "too many store checks wait for their Node; this one is dropped");
                }
            }
            StoreNote::Resync { node, store_id } => {
                if self.edge_nodes.contains_key(&node) {
                    tracing::info!(%node, "sending everything bound to the node again");
                    self.node_became_edge(&node);
                }
                self.record_store(&node, store_id);
            }
        }
    }

    /// The first store this process saw of `node`, against the one recorded on its Node:
    /// none recorded, it is recorded (nothing is resent: a node first seen, or coming from
    /// cloudcore); the same, nothing; another, CloudHub forgets what the node acknowledged
    /// and asks for everything again ([`StoreNote::Resync`], which records it).
    fn check_store(&mut self, node: &str, store_id: String) {
        let recorded = self.stores.get(node).cloned().flatten();
        match recorded {
            None => self.record_store(node, store_id),
            Some(recorded) if recorded == store_id => {}
            Some(_) => {
                tracing::warn!(%node, "the node's store is not the one recorded on its Node");
                let replaced = StoreReplaced {
                    node: node.to_owned(),
                    store_id,
                };
                match self.hive.tell(route::CLOUDHUB, replaced) {
                    Ok(())
                    | Err(Refused {
                        error: HiveError::UnknownModule(_),
                        ..
                    }) => {}
                    Err(refused) => {
                        tracing::warn!(%node, error = %refused.error, "cannot tell CloudHub the node's store was replaced");
                    }
                }
            }
        }
    }

    /// Records `store_id` on `node`'s Node if it is not what the Node holds: one merge patch
    /// per store change. A Node not seen yet is left alone (its check waits for it).
    fn record_store(&mut self, node: &str, store_id: String) {
        let Some(recorded) = self.stores.get_mut(node) else {
            return;
        };
        if recorded.as_deref() == Some(store_id.as_str()) {
            return;
        }
        *recorded = Some(store_id.clone());
        let patch =
            serde_json::json!({"metadata": {"annotations": {STORE_ID_ANNOTATION: store_id}}});
        let write = self.cluster.patch("Node", None, node, patch, false);
        let node = node.to_owned();
        actix::spawn(async move {
            match write.await {
                Ok(_) => tracing::info!(%node, "recorded the edge's store on its Node"),
                // The next cloud start compares with the older record and sends everything
                // again: more than needed, never less.
                Err(error) => {
                    tracing::warn!(%node, %error, "cannot record the edge's store on its Node")
                }
            }
        });
    }

    // ---- nodes ----

    fn on_node(&mut self, event: WatchEvent) {
        let node = &event.object;
        let name = meta_str(node, "name").to_owned();
        if event.event_type == EventType::Deleted {
            self.stores.remove(&name);
            self.unseen.remove(&name);
            if self.edge_nodes.contains_key(&name) {
                self.node_deleted(&name);
            }
            return;
        }
        let recorded = node["metadata"]["annotations"][STORE_ID_ANNOTATION]
            .as_str()
            .map(str::to_owned);
        self.stores.insert(name.clone(), recorded);
        if let Some(store_id) = self.unseen.remove(&name) {
            self.check_store(&name, store_id);
        }
        if !is_edge_node(node) {
            if self.edge_nodes.remove(&name).is_some() {
                tracing::info!(node = %name, "no longer an edge node");
            }
            return;
        }
        let print = fingerprint(node);
        match self.edge_nodes.insert(name.clone(), print.clone()) {
            None => {
                tracing::info!(node = %name, "edge node added");
                self.send_node(&name, node);
                self.node_became_edge(&name);
            }
            Some(old) if old != print => self.send_node(&name, node),
            Some(_) => {}
        }
    }

    fn send_node(&mut self, name: &str, node: &Value) {
        if !self.node_updates {
            return;
        }
        self.outbox.send(object_message(
            name,
            ResourceType::Node,
            "v1",
            "Node",
            node,
            Operation::Update,
        ));
    }

    fn node_deleted(&mut self, name: &str) {
        self.edge_nodes.remove(name);
        tracing::info!(node = %name, "edge node deleted; ending its session");
        self.outbox.send(downstream::node_delete(name));
        self.outbox.disconnect(name);
    }

    /// Sends what a node that just became an edge node needs: the ConfigMaps and Secrets
    /// its pods use, then the pods.
    fn node_became_edge(&mut self, node: &str) {
        for object in self.location.objects_on(node) {
            self.send_object_to(&object, node, true);
        }
        let pods: Vec<Value> = self
            .pods
            .values()
            .filter(|seen| seen.node.as_deref() == Some(node))
            // Text this watcher wrote from a Value: it parses.
            .filter_map(|seen| serde_json::from_str(&seen.object).ok())
            .collect();
        for pod in pods {
            self.send_pod(node, &pod, Operation::Insert);
        }
    }

    // ---- pods ----

    fn remember(&mut self, pod: &Value) -> Option<PodSeen> {
        self.pods.insert(
            namespaced_key(pod),
            PodSeen {
                rv: meta_str(pod, "resourceVersion").to_owned(),
                node: pod["spec"]["nodeName"].as_str().map(str::to_owned),
                fingerprint: fingerprint(pod),
                object: pod.to_string().into_boxed_str(),
            },
        )
    }

    fn edge_node_of(&self, pod: &Value) -> Option<String> {
        pod["spec"]["nodeName"]
            .as_str()
            .filter(|node| self.edge_nodes.contains_key(*node))
            .map(str::to_owned)
    }

    fn on_pod(&mut self, event: WatchEvent) {
        let pod = &event.object;
        let key = namespaced_key(pod);
        let rv = meta_str(pod, "resourceVersion");
        if event.event_type != EventType::Deleted {
            // Already seen through the initial list (or a relist): nothing new.
            if let Some(seen) = self.pods.get(&key) {
                if !is_newer(rv, &seen.rv) {
                    return;
                }
            }
        }
        match event.event_type {
            EventType::Added | EventType::Modified => {
                let changes = self.location.set_pod(pod);
                for (object, node) in changes.gained {
                    self.send_object_to(&object, &node, true);
                }
                let old = self.remember(pod);
                let changed = old
                    .as_ref()
                    .is_none_or(|old| old.fingerprint != fingerprint(pod));
                if changed {
                    if let Some(node) = self.edge_node_of(pod) {
                        let operation = match old {
                            None if pod["metadata"]["deletionTimestamp"].is_null() => {
                                Operation::Insert
                            }
                            _ => Operation::Update,
                        };
                        self.send_pod(&node, pod, operation);
                    }
                }
                for (object, node) in changes.lost {
                    self.send_object_to(&object, &node, false);
                }
            }
            EventType::Deleted => {
                self.pods.remove(&key);
                if let Some(node) = self.edge_node_of(pod) {
                    self.send_pod(&node, pod, Operation::Delete);
                }
                for (object, node) in self.location.remove_pod(pod).lost {
                    self.send_object_to(&object, &node, false);
                }
            }
        }
    }

    fn send_pod(&mut self, node: &str, pod: &Value, operation: Operation) {
        let message = object_message(node, ResourceType::Pod, "v1", "Pod", pod, operation);
        tracing::debug!(%node, resource = message.resource(), op = ?message.operation(), "pod change for an edge node");
        self.outbox.send(message);
    }

    // ---- configmaps and secrets ----

    fn object_ref(kind: RefKind, obj: &Value) -> ObjectRef {
        let (namespace, name) = namespaced_key(obj);
        (kind, namespace, name)
    }

    fn on_object(&mut self, kind: RefKind, event: WatchEvent) {
        let object = Self::object_ref(kind, &event.object);
        if event.event_type == EventType::Deleted {
            self.objects.remove(&object);
        } else {
            if let Some(seen) = self.objects.get(&object) {
                if !is_newer(
                    meta_str(&event.object, "resourceVersion"),
                    meta_str(seen, "resourceVersion"),
                ) {
                    return;
                }
            }
            self.objects.insert(object.clone(), event.object.clone());
        }
        let operation = match (kind, event.event_type) {
            (_, EventType::Deleted) => Operation::Delete,
            (RefKind::ConfigMap, EventType::Added) => Operation::Insert,
            _ => Operation::Update,
        };
        let nodes: Vec<String> = self
            .location
            .nodes_for(&object)
            .into_iter()
            .filter(|node| self.edge_nodes.contains_key(node))
            .collect();
        self.send_object_to_nodes(kind, nodes, &event.object, operation);
    }

    /// Sends `object` to `node` because the node gained (`true`) or lost its use of it.
    fn send_object_to(&mut self, object: &ObjectRef, node: &str, gained: bool) {
        if !self.edge_nodes.contains_key(node) {
            return;
        }
        let Some(obj) = self.objects.get(object).cloned() else {
            return; // not created yet: its Added event will reach the node
        };
        let operation = match (gained, object.0) {
            (false, _) => Operation::Delete,
            (true, RefKind::ConfigMap) => Operation::Insert,
            (true, RefKind::Secret) => Operation::Update,
        };
        self.send_object(object.0, node, &obj, operation);
    }

    fn send_object(&mut self, kind: RefKind, node: &str, obj: &Value, operation: Operation) {
        self.send_object_to_nodes(kind, vec![node.to_owned()], obj, operation);
    }

    /// One change of a ConfigMap or Secret for every node in `nodes`: built and encoded once,
    /// the bytes shared by all of them.
    fn send_object_to_nodes(
        &mut self,
        kind: RefKind,
        nodes: Vec<String>,
        obj: &Value,
        operation: Operation,
    ) {
        let Some(first) = nodes.first() else {
            return;
        };
        let resource_type = match kind {
            RefKind::ConfigMap => ResourceType::ConfigMap,
            RefKind::Secret => ResourceType::Secret,
        };
        let message = object_message(first, resource_type, "v1", kind.kind(), obj, operation);
        self.outbox.send_to(ToNodes {
            nodes,
            message: NodeMessage::from_owned(message),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_is_what_an_edge_cares_about_whatever_the_key_order() {
        let pod: Value = serde_json::from_str(
            r#"{"kind":"Pod","metadata":{"name":"p","namespace":"default","resourceVersion":"5",
                "labels":{"a":"1","b":"2"}},"spec":{"nodeName":"n","containers":[{"name":"c","image":"i"}]},
                "status":{"phase":"Running"}}"#,
        )
        .unwrap();
        let reordered: Value = serde_json::from_str(
            r#"{"spec":{"containers":[{"image":"i","name":"c"}],"nodeName":"n"},"status":{},
                "metadata":{"labels":{"b":"2","a":"1"},"resourceVersion":"9","namespace":"default","name":"p"}}"#,
        )
        .unwrap();
        assert_eq!(fingerprint(&pod), fingerprint(&reordered));
        let mut relabelled = pod.clone();
        relabelled["metadata"]["labels"]["a"] = "3".into();
        assert_ne!(fingerprint(&pod), fingerprint(&relabelled));
        let mut moved = pod.clone();
        moved["spec"]["containers"][0]["image"] = "j".into();
        assert_ne!(fingerprint(&pod), fingerprint(&moved));
        // Keys and strings are written as JSON, escapes included.
        let mut odd = pod.clone();
        odd["metadata"]["labels"]["q\"uote"] = "\n".into();
        let text = fingerprint(&odd);
        assert!(serde_json::from_str::<Value>(&text).is_ok(), "{text}");
    }
}
