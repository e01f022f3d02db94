//! EdgeController's downstream half: cluster watches -> messages for edge nodes.
//!
//! - Pods bound to an edge node: Added -> insert (update if already being deleted), Modified
//!   -> update only if metadata (other than resourceVersion, generation, managedFields) or spec
//!   changed, Deleted -> delete.
//! - ConfigMaps (Added insert, Modified update, Deleted delete) and Secrets (Added and
//!   Modified update, Deleted delete) to the nodes the [`LocationCache`] names; a node that
//!   gains its first pod using one is sent it, a node that loses its last is sent a delete
//!   (see [`super::location`] for why).
//! - Edge nodes (label [`super::EDGE_NODE_LABEL`]): Deleted -> delete without content
//!   (`node/{n}/null/node/{n}`, no ACK), then the node's session is closed. Added/Modified ->
//!   update with the Node when its metadata or spec changed (status changes come from the
//!   edge itself) only if node updates are on: KubeEdge HEAD pushes them, v1.22.0 (what the
//!   golden frames show and what edgehive matches by default) does not.
//!
//! The loop runs as a future of the actor, so a restarted actor lists and watches again;
//! CloudHub's pools skip what the edges already ACKed.

use std::collections::{HashMap, HashSet};

use edgehive_protocols::{CloudResource, Group, Message, ModuleName, Operation, ResourceType};
use futures_util::StreamExt;
use serde_json::Value;

use super::location::{LocationCache, ObjectRef, RefKind};
use super::EDGE_NODE_LABEL;
use crate::cloud::cluster::{EventType, SharedCluster, Watch, WatchError, WatchEvent};
use crate::cloud::contract::{NodeMessage, ToNodes};
use crate::cloud::outbox::{Outbox, RETRY_INTERVAL};
use edgehive_protocols::object::{is_newer, meta_str, namespaced_key};

/// What was last seen of a pod.
struct PodSeen {
    rv: String,
    uid: String,
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

pub use crate::cloud::contract::object_message;

/// The watch loop's state.
pub struct Watcher {
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

/// Logs a watch that must be listed again: a warning when events were lost, quietly when the
/// watch only (re)listed (the `kube` adapter's watcher does so at its start, which is not a
/// fault).
fn lagged(kind: &str, skipped: u64) {
    if skipped > 0 {
        tracing::warn!(kind, skipped, "watch lagged; listing again");
    } else {
        tracing::debug!(kind, "watch listed; comparing with what was seen");
    }
}

/// The next event of `watch`, or `None` when it ended.
async fn next(watch: &mut Watch) -> Option<Result<WatchEvent, WatchError>> {
    watch.next().await
}

impl Watcher {
    /// A watcher with nothing seen yet.
    /// `node_updates`: whether edge nodes get their Node object (KubeEdge HEAD) or not
    /// (v1.22.0).
    pub fn new(cluster: SharedCluster, outbox: Outbox, node_updates: bool) -> Self {
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

    /// Lists and watches until the cluster goes away; a node name on `resyncs` (its edge came
    /// back with another store) is sent everything bound to it again.
    pub async fn run(mut self, mut resyncs: tokio::sync::mpsc::Receiver<String>) {
        // Watch before listing so no change falls between the two.
        let mut node_watch = self.cluster.watch("Node");
        let mut pod_watch = self.cluster.watch("Pod");
        let mut cm_watch = self.cluster.watch("ConfigMap");
        let mut secret_watch = self.cluster.watch("Secret");
        // Objects first, so a node gaining a user can be sent the object at once.
        self.relist_objects(RefKind::ConfigMap).await;
        self.relist_objects(RefKind::Secret).await;
        self.relist_nodes().await;
        self.relist_pods().await;
        let mut retry = tokio::time::interval(RETRY_INTERVAL);
        loop {
            // No event is taken while CloudHub has not taken what the last ones produced.
            self.outbox.room().await;
            // Biased: of changes that are all ready, nodes, ConfigMaps and Secrets go
            // first, so an object written before a pod that uses it reaches the node first.
            tokio::select! {
                biased;
                event = next(&mut node_watch) => match event {
                    Some(Ok(event)) => self.on_node(event),
                    Some(Err(WatchError::Lagged { skipped })) => {
                        lagged("node", skipped);
                        self.relist_nodes().await;
                    }
                    Some(Err(WatchError::Closed)) | None => return,
                },
                event = next(&mut cm_watch) => match event {
                    Some(Ok(event)) => self.on_object(RefKind::ConfigMap, event),
                    Some(Err(WatchError::Lagged { skipped })) => {
                        lagged("configmap", skipped);
                        self.relist_objects(RefKind::ConfigMap).await;
                    }
                    Some(Err(WatchError::Closed)) | None => return,
                },
                event = next(&mut secret_watch) => match event {
                    Some(Ok(event)) => self.on_object(RefKind::Secret, event),
                    Some(Err(WatchError::Lagged { skipped })) => {
                        lagged("secret", skipped);
                        self.relist_objects(RefKind::Secret).await;
                    }
                    Some(Err(WatchError::Closed)) | None => return,
                },
                event = next(&mut pod_watch) => match event {
                    Some(Ok(event)) => self.on_pod(event),
                    Some(Err(WatchError::Lagged { skipped })) => {
                        lagged("pod", skipped);
                        self.relist_pods().await;
                    }
                    Some(Err(WatchError::Closed)) | None => return,
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

    async fn list(&self, kind: &str) -> Option<(Vec<Value>, String)> {
        match self.cluster.list(kind).await {
            Ok(listed) => Some(listed),
            Err(error) => {
                tracing::warn!(kind, %error, "cannot list; keeping what was seen");
                None
            }
        }
    }

    // ---- nodes ----

    async fn relist_nodes(&mut self) {
        let Some((nodes, _)) = self.list("Node").await else {
            return;
        };
        let mut present = HashSet::new();
        for node in nodes {
            self.outbox.room().await;
            present.insert(meta_str(&node, "name").to_owned());
            self.on_node(WatchEvent {
                event_type: EventType::Modified,
                object: node,
            });
        }
        let gone: Vec<String> = self
            .edge_nodes
            .keys()
            .filter(|name| !present.contains(*name))
            .cloned()
            .collect();
        for name in gone {
            self.outbox.room().await;
            self.node_deleted(&name);
        }
    }

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
        let resource = CloudResource::new(name, "null", ResourceType::Node, Some(name.to_owned()));
        self.outbox.send(Message::new(
            ModuleName::EdgeController,
            Group::Resource,
            Operation::Delete,
            resource.to_string(),
            Value::Null,
        ));
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
                uid: meta_str(pod, "uid").to_owned(),
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

    /// Lists pods again and sends what changed since they were last seen (after a lagged
    /// watch, or at start when nothing was seen).
    async fn relist_pods(&mut self) {
        let Some((pods, list_rv)) = self.list("Pod").await else {
            return;
        };
        let mut present = HashSet::new();
        for pod in &pods {
            self.outbox.room().await;
            let key = namespaced_key(pod);
            present.insert(key.clone());
            let event_type = match self.pods.get(&key) {
                None => EventType::Added,
                Some(seen) if is_newer(meta_str(pod, "resourceVersion"), &seen.rv) => {
                    EventType::Modified
                }
                Some(_) => continue,
            };
            self.on_pod(WatchEvent {
                event_type,
                object: pod.clone(),
            });
        }
        let gone: Vec<(String, String)> = self
            .pods
            .keys()
            .filter(|key| !present.contains(*key))
            .cloned()
            .collect();
        for key in gone {
            self.outbox.room().await;
            let Some(seen) = self.pods.get(&key) else {
                continue;
            };
            // The pod's last state is gone with the missed events; its identity is enough
            // for the edge to delete it.
            let pod = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": key.1, "namespace": key.0, "uid": seen.uid,
                             "resourceVersion": list_rv},
                "spec": {"nodeName": seen.node},
            });
            self.on_pod(WatchEvent {
                event_type: EventType::Deleted,
                object: pod,
            });
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

    async fn relist_objects(&mut self, kind: RefKind) {
        let Some((objects, list_rv)) = self.list(kind.kind()).await else {
            return;
        };
        let mut present = HashSet::new();
        for obj in objects {
            self.outbox.room().await;
            let object = Self::object_ref(kind, &obj);
            present.insert(object.clone());
            let event_type = match self.objects.get(&object) {
                None => EventType::Added,
                Some(seen)
                    if is_newer(
                        meta_str(&obj, "resourceVersion"),
                        meta_str(seen, "resourceVersion"),
                    ) =>
                {
                    EventType::Modified
                }
                Some(_) => continue,
            };
            self.on_object(
                kind,
                WatchEvent {
                    event_type,
                    object: obj,
                },
            );
        }
        let gone: Vec<ObjectRef> = self
            .objects
            .keys()
            .filter(|object| object.0 == kind && !present.contains(*object))
            .cloned()
            .collect();
        for object in gone {
            self.outbox.room().await;
            if let Some(mut obj) = self.objects.get(&object).cloned() {
                obj["metadata"]["resourceVersion"] = Value::from(list_rv.clone());
                self.on_object(
                    kind,
                    WatchEvent {
                        event_type: EventType::Deleted,
                        object: obj,
                    },
                );
            }
        }
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
