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
use crate::cloud::contract::{downstream, route, NodeMessage, ToNodes};
use crate::cloud::outbox::{Outbox, RETRY_INTERVAL};
use crate::cloud::watcher::{keep_all, Keep, KindWatcher, WatchMetrics};
use edgehive_protocols::object::{is_newer, meta_str, namespaced_key};

/// The label that marks a Node as an edge node.
const EDGE_NODE_LABEL: &str = "node-role.kubernetes.io/edge";

/// What was last seen of a pod.
struct PodSeen {
    rv: String,
    node: Option<String>,
    fingerprint: Value,
    /// The pod itself, for a node that becomes an edge node later.
    object: Value,
}

/// metadata (without resourceVersion, generation, managedFields) and spec: what an edge
/// cares about.
fn fingerprint(obj: &Value) -> Value {
    let mut metadata = obj["metadata"].clone();
    if let Some(map) = metadata.as_object_mut() {
        for field in ["resourceVersion", "generation", "managedFields"] {
            map.remove(field);
        }
    }
    serde_json::json!([metadata, obj["spec"]])
}

fn is_edge_node(node: &Value) -> bool {
    node["metadata"]["labels"].get(EDGE_NODE_LABEL).is_some()
}

pub(crate) use crate::cloud::contract::object_message;

/// The watch loop's state.
pub(crate) struct Watcher {
    cluster: SharedCluster,
    outbox: Outbox,
    node_updates: bool,
    /// Edge node name -> fingerprint last sent.
    edge_nodes: HashMap<String, Value>,
    pods: HashMap<(String, String), PodSeen>,
    location: LocationCache,
    /// The ConfigMaps and Secrets as last seen (what a node gaining a user is sent).
    objects: HashMap<ObjectRef, Value>,
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
    pub(crate) fn new(cluster: SharedCluster, outbox: Outbox, node_updates: bool) -> Self {
        Watcher {
            cluster,
            outbox,
            node_updates,
            edge_nodes: HashMap::new(),
            pods: HashMap::new(),
            location: LocationCache::default(),
            objects: HashMap::new(),
        }
    }

    /// Follows Nodes, Pods, ConfigMaps and Secrets (each with [`KindWatcher`]: listed, then
    /// watched, listed again after a lag or a failure) for as long as the actor lives; a node
    /// name on `resyncs` (its edge came back with another store) is sent everything bound to
    /// it again.
    pub(crate) async fn run(
        mut self,
        mut resyncs: tokio::sync::mpsc::Receiver<String>,
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
                Some(node) = resyncs.recv() => {
                    if self.edge_nodes.contains_key(&node) {
                        tracing::info!(%node, "sending everything bound to the node again");
                        self.node_became_edge(&node);
                    }
                }
                _ = retry.tick(), if !self.outbox.is_empty() => self.outbox.flush(),
            }
        }
    }

    // ---- nodes ----

    fn on_node(&mut self, event: WatchEvent) {
        let node = &event.object;
        let name = meta_str(node, "name").to_owned();
        if event.event_type == EventType::Deleted {
            if self.edge_nodes.contains_key(&name) {
                self.node_deleted(&name);
            }
            return;
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
            .map(|seen| seen.object.clone())
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
                object: pod.clone(),
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
