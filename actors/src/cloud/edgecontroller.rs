//! EdgeController (module `edgecontroller`, group `edgecontroller`): turns cluster changes
//! into messages for edge nodes.
//!
//! It keeps the set of edge nodes (Nodes labelled `node-role.kubernetes.io/edge`) and watches
//! Pods. A pod bound to an edge node becomes a `node/{node}/{ns}/pod/{name}` message (insert,
//! update or delete, resourceversion = the pod's) sent to CloudHub. A node that becomes an
//! edge node later gets its existing pods as inserts. Upstream messages from edges are not
//! handled yet: they are logged and counted.
//!
//! The watch loop runs as a future of the actor, so a restarted actor lists and watches
//! again; CloudHub's pools skip what the edge already ACKed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use actix::prelude::*;
use edgehive_protocols::{CloudResource, Group, Message, ModuleName, Operation, ResourceType};
use prometheus_client::metrics::counter::Counter;
use serde_json::Value;

use super::cloudhub::pool::is_newer;
use super::cloudhub::{CloudHub, Downstream, CLOUDHUB_MODULE};
use super::cluster::{EmbeddedCluster, EventType, WatchError, WatchEvent};
use crate::hive::{Envelope, Hive, Module};

/// The module name.
pub const EDGECONTROLLER_MODULE: &str = "edgecontroller";
/// The module group.
pub const EDGECONTROLLER_GROUP: &str = "edgecontroller";
/// The label that marks a Node as an edge node.
pub const EDGE_NODE_LABEL: &str = "node-role.kubernetes.io/edge";

/// Messages kept while CloudHub is full or restarting. Overflow policy: the oldest message
/// is dropped, logged and counted (`edgehive_edgecontroller_buffer_overflow_total`).
pub const BUFFER_CAPACITY: usize = 1024;
/// How often buffered messages are offered to CloudHub again.
const RETRY_INTERVAL: Duration = Duration::from_millis(100);

/// EdgeController's metrics.
#[derive(Debug, Clone, Default)]
struct Metrics {
    unhandled: Counter,
    sent: Counter,
    overflow: Counter,
}

/// EdgeController's module recipe.
pub struct EdgeControllerModule {
    cluster: EmbeddedCluster,
    metrics: Metrics,
}

impl EdgeControllerModule {
    /// A recipe reading `cluster`; registers the module's metrics with `hive` (one per hive).
    pub fn new(hive: &Hive, cluster: EmbeddedCluster) -> Self {
        let metrics = Metrics::default();
        let registry = hive.metrics();
        registry.register(
            "edgehive_edgecontroller_unhandled",
            "Upstream messages EdgeController does not handle yet",
            metrics.unhandled.clone(),
        );
        registry.register(
            "edgehive_edgecontroller_messages_sent",
            "Messages EdgeController handed to CloudHub",
            metrics.sent.clone(),
        );
        registry.register(
            "edgehive_edgecontroller_buffer_overflow",
            "Messages dropped because CloudHub stayed unavailable and the buffer was full",
            metrics.overflow.clone(),
        );
        EdgeControllerModule { cluster, metrics }
    }
}

impl Module for EdgeControllerModule {
    type Actor = EdgeController;

    fn name(&self) -> &str {
        EDGECONTROLLER_MODULE
    }

    fn group(&self) -> &str {
        EDGECONTROLLER_GROUP
    }

    fn create(&self, hive: &Hive) -> EdgeController {
        EdgeController {
            hive: hive.clone(),
            cluster: self.cluster.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

/// The EdgeController actor; see the [module docs](self).
pub struct EdgeController {
    hive: Hive,
    cluster: EmbeddedCluster,
    metrics: Metrics,
}

impl Actor for EdgeController {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let watcher = Watcher {
            hive: self.hive.clone(),
            cluster: self.cluster.clone(),
            metrics: self.metrics.clone(),
            edge_nodes: HashSet::new(),
            pods: HashMap::new(),
            buffer: VecDeque::new(),
        };
        ctx.spawn(actix::fut::wrap_future(watcher.run()));
    }
}

impl Handler<Envelope> for EdgeController {
    type Result = Option<Message>;

    fn handle(&mut self, envelope: Envelope, _: &mut Context<Self>) -> Option<Message> {
        let message = envelope.message();
        tracing::debug!(
            resource = message.resource(),
            operation = message.operation().map(|op| op.as_str()),
            "upstream message not handled yet"
        );
        self.metrics.unhandled.inc();
        None
    }
}

/// What was last seen of a pod.
struct PodSeen {
    rv: String,
    uid: String,
    node: Option<String>,
    /// metadata (without resourceVersion, generation, managedFields) and spec.
    fingerprint: Value,
}

fn fingerprint(pod: &Value) -> Value {
    let mut metadata = pod["metadata"].clone();
    if let Some(map) = metadata.as_object_mut() {
        for field in ["resourceVersion", "generation", "managedFields"] {
            map.remove(field);
        }
    }
    serde_json::json!([metadata, pod["spec"]])
}

fn str_at<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj["metadata"][field].as_str().unwrap_or_default()
}

fn is_edge_node(node: &Value) -> bool {
    node["metadata"]["labels"].get(EDGE_NODE_LABEL).is_some()
}

struct Watcher {
    hive: Hive,
    cluster: EmbeddedCluster,
    metrics: Metrics,
    edge_nodes: HashSet<String>,
    pods: HashMap<(String, String), PodSeen>,
    buffer: VecDeque<Message>,
}

impl Watcher {
    async fn run(mut self) {
        // Watch before listing so no change falls between the two.
        let mut node_watch = self.cluster.watch("Node");
        let mut pod_watch = self.cluster.watch("Pod");
        self.relist_nodes();
        self.relist_pods();
        let mut retry = tokio::time::interval(RETRY_INTERVAL);
        loop {
            tokio::select! {
                event = node_watch.recv() => match event {
                    Ok(event) => self.on_node(event),
                    Err(WatchError::Lagged { skipped }) => {
                        tracing::warn!(skipped, "node watch lagged; listing again");
                        self.relist_nodes();
                    }
                    Err(WatchError::Closed) => return,
                },
                event = pod_watch.recv() => match event {
                    Ok(event) => self.on_pod(event),
                    Err(WatchError::Lagged { skipped }) => {
                        tracing::warn!(skipped, "pod watch lagged; listing again");
                        self.relist_pods();
                    }
                    Err(WatchError::Closed) => return,
                },
                _ = retry.tick(), if !self.buffer.is_empty() => self.flush(),
            }
        }
    }

    fn relist_nodes(&mut self) {
        let (nodes, _) = self.cluster.list("Node");
        let now: HashSet<String> = nodes
            .iter()
            .filter(|node| is_edge_node(node))
            .map(|node| str_at(node, "name").to_owned())
            .collect();
        let added: Vec<String> = now.difference(&self.edge_nodes).cloned().collect();
        self.edge_nodes = now;
        for node in added {
            self.node_became_edge(&node);
        }
    }

    fn on_node(&mut self, event: WatchEvent) {
        let name = str_at(&event.object, "name").to_owned();
        let edge = event.event_type != EventType::Deleted && is_edge_node(&event.object);
        if edge {
            if self.edge_nodes.insert(name.clone()) {
                tracing::info!(node = %name, "edge node added");
                self.node_became_edge(&name);
            }
        } else if self.edge_nodes.remove(&name) {
            tracing::info!(node = %name, "no longer an edge node");
        }
    }

    /// Sends the pods already bound to a node that just became an edge node.
    fn node_became_edge(&mut self, node: &str) {
        let (pods, _) = self.cluster.list("Pod");
        for pod in pods {
            if pod["spec"]["nodeName"].as_str() == Some(node) {
                self.remember(&pod);
                self.send_pod(node, &pod, Operation::Insert);
            }
        }
    }

    fn remember(&mut self, pod: &Value) -> Option<PodSeen> {
        let key = (
            str_at(pod, "namespace").to_owned(),
            str_at(pod, "name").to_owned(),
        );
        self.pods.insert(
            key,
            PodSeen {
                rv: str_at(pod, "resourceVersion").to_owned(),
                uid: str_at(pod, "uid").to_owned(),
                node: pod["spec"]["nodeName"].as_str().map(str::to_owned),
                fingerprint: fingerprint(pod),
            },
        )
    }

    fn edge_node_of(&self, pod: &Value) -> Option<String> {
        pod["spec"]["nodeName"]
            .as_str()
            .filter(|node| self.edge_nodes.contains(*node))
            .map(str::to_owned)
    }

    fn on_pod(&mut self, event: WatchEvent) {
        let pod = &event.object;
        let key = (
            str_at(pod, "namespace").to_owned(),
            str_at(pod, "name").to_owned(),
        );
        let rv = str_at(pod, "resourceVersion");
        if event.event_type != EventType::Deleted {
            // Already seen through the initial list (or a relist): nothing new.
            if let Some(seen) = self.pods.get(&key) {
                if !is_newer(rv, &seen.rv) {
                    return;
                }
            }
        }
        match event.event_type {
            EventType::Added => {
                self.remember(pod);
                if let Some(node) = self.edge_node_of(pod) {
                    self.send_pod(&node, pod, added_operation(pod));
                }
            }
            EventType::Modified => {
                let changed = self
                    .remember(pod)
                    .is_none_or(|old| old.fingerprint != fingerprint(pod));
                if changed {
                    if let Some(node) = self.edge_node_of(pod) {
                        self.send_pod(&node, pod, Operation::Update);
                    }
                }
            }
            EventType::Deleted => {
                self.pods.remove(&key);
                if let Some(node) = self.edge_node_of(pod) {
                    self.send_pod(&node, pod, Operation::Delete);
                }
            }
        }
    }

    /// Lists pods again and sends what changed since they were last seen (after a lagged
    /// watch, or at start when nothing was seen).
    fn relist_pods(&mut self) {
        let (pods, list_rv) = self.cluster.list("Pod");
        let mut present = HashSet::new();
        for pod in &pods {
            let key = (
                str_at(pod, "namespace").to_owned(),
                str_at(pod, "name").to_owned(),
            );
            present.insert(key.clone());
            let event_type = match self.pods.get(&key) {
                None => EventType::Added,
                Some(seen) if is_newer(str_at(pod, "resourceVersion"), &seen.rv) => {
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
            let Some(seen) = self.pods.remove(&key) else {
                continue;
            };
            let Some(node) = seen.node.filter(|node| self.edge_nodes.contains(node)) else {
                continue;
            };
            // The pod's last state is gone with the missed events; its identity is enough
            // for the edge to delete it.
            let pod = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": key.1, "namespace": key.0, "uid": seen.uid,
                             "resourceVersion": list_rv},
            });
            self.send_pod(&node, &pod, Operation::Delete);
        }
    }

    fn send_pod(&mut self, node: &str, pod: &Value, operation: Operation) {
        let namespace = str_at(pod, "namespace");
        let name = str_at(pod, "name");
        let resource = CloudResource::new(
            node,
            if namespace.is_empty() {
                "default"
            } else {
                namespace
            },
            ResourceType::Pod,
            Some(name.to_owned()),
        );
        let mut content = pod.clone();
        content["apiVersion"] = Value::from("v1");
        content["kind"] = Value::from("Pod");
        let message = Message::new(
            ModuleName::EdgeController,
            Group::Resource,
            operation,
            resource.to_string(),
            content,
        )
        .with_resource_version(str_at(pod, "resourceVersion"));
        tracing::debug!(%node, resource = %resource, op = ?message.operation(), "pod change for an edge node");
        if self.buffer.is_empty() {
            if let Some(message) = self.offer(message) {
                self.keep(message);
            }
        } else {
            self.keep(message);
        }
    }

    /// Hands `message` to CloudHub; gives it back if CloudHub is full or not running.
    fn offer(&self, message: Message) -> Option<Message> {
        let Ok(hub) = self.hive.addr::<CloudHub>(CLOUDHUB_MODULE) else {
            return Some(message);
        };
        match hub.try_send(Downstream(message)) {
            Ok(()) => {
                self.metrics.sent.inc();
                None
            }
            Err(err) => Some(err.into_inner().0),
        }
    }

    fn keep(&mut self, message: Message) {
        if self.buffer.len() >= BUFFER_CAPACITY {
            if let Some(lost) = self.buffer.pop_front() {
                tracing::warn!(
                    resource = lost.resource(),
                    "cloudhub unavailable and buffer full; oldest message dropped"
                );
                self.metrics.overflow.inc();
            }
        }
        self.buffer.push_back(message);
    }

    fn flush(&mut self) {
        while let Some(message) = self.buffer.pop_front() {
            if let Some(message) = self.offer(message) {
                self.buffer.push_front(message);
                return;
            }
        }
    }
}

/// An Added pod that is already being deleted is an update for the edge.
fn added_operation(pod: &Value) -> Operation {
    if pod["metadata"]["deletionTimestamp"].is_null() {
        Operation::Insert
    } else {
        Operation::Update
    }
}
