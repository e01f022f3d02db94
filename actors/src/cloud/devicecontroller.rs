//! DeviceController (module `devicecontroller`, group `devicecontroller`): KubeEdge devices
//! (`devices.kubeedge.io/v1beta1`) between the cluster and edge nodes (facts §9).
//!
//! Downstream, from the Device and DeviceModel watches:
//! - a Device with `spec.nodeName` added: a membership update (group `twin`, resource
//!   `node/{node}/membership`, `added_devices`), its DeviceModel (insert) if no other device of
//!   that node and namespace uses the model yet, then the Device (insert);
//! - a Device changed: the Device (update); a changed `nodeName` is a removal from the old
//!   node and an addition to the new one;
//! - a Device deleted: membership update with `removed_devices`, its DeviceModel (delete) if
//!   no other device of the node uses it, the Device (delete);
//! - a DeviceModel added or changed: sent (insert/update) to the nodes whose devices use it.
//!
//! Upstream, from edges' devicetwin (source `twin`): `device/{ns}/{name}/twin/edge_updated`
//! writes the reported (`actual`) and observed desired (`expected`) values of the twins the
//! Device declares into its DeviceStatus (HEAD's separate CRD, created with the Device),
//! `device/{ns}/{name}/state/update` writes `state` and `lastOnlineTime`; both are answered
//! `"OK"` (group `twin`, resource `node/{node}/twin`). `membership/detail` is answered with the
//! node's devices (KubeEdge ignores it, which makes real edges ask again every minute or so).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use edgehive_protocols::{CloudResource, Group, Message, ModuleName, Operation, ResourceType};
use futures_util::StreamExt;
use prometheus_client::metrics::counter::Counter;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use super::cluster::{ClusterError, EventType, SharedCluster, WatchError, WatchEvent};
use super::edgecontroller::outbox::{offer_message, Outbox};
use crate::hive::{Envelope, Hive, Module};
use edgehive_protocols::object::is_newer;

/// The module name.
pub const DEVICECONTROLLER_MODULE: &str = super::contract::route::DEVICECONTROLLER;
/// The module group (CloudHub sends devicetwin's messages here).
pub const DEVICECONTROLLER_GROUP: &str = super::contract::route::DEVICECONTROLLER;
/// The devices API version.
pub const DEVICES_API_VERSION: &str = "devices.kubeedge.io/v1beta1";
/// Twin reports written at once (KubeEdge's updateDeviceStatusWorkers).
pub const STATUS_WORKERS: usize = 1;
/// Twin reports that may wait for the worker. Overflow policy: a report beyond it is dropped,
/// logged and counted (`edgehive_devicecontroller_busy_total`); devicetwin resends
/// unconfirmed reports itself.
pub const WAITING_CAPACITY: usize = 1024;

const RETRY_INTERVAL: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Default)]
struct Metrics {
    sent: Counter,
    overflow: Counter,
    unhandled: Counter,
    busy: Counter,
    status_updates: Counter,
}

/// DeviceController's module recipe.
pub struct DeviceControllerModule {
    cluster: SharedCluster,
    metrics: Metrics,
    workers: Arc<Semaphore>,
    waiting: Arc<Semaphore>,
}

impl DeviceControllerModule {
    /// A recipe on `cluster`; registers the module's metrics with `hive` (one per hive).
    pub fn new(hive: &Hive, cluster: impl Into<SharedCluster>) -> Self {
        let metrics = Metrics::default();
        let registry = hive.metrics();
        registry.register(
            "edgehive_devicecontroller_messages_sent",
            "Messages DeviceController handed to CloudHub",
            metrics.sent.clone(),
        );
        registry.register(
            "edgehive_devicecontroller_buffer_overflow",
            "Messages dropped because CloudHub stayed unavailable and the buffer was full",
            metrics.overflow.clone(),
        );
        registry.register(
            "edgehive_devicecontroller_unhandled",
            "Upstream messages DeviceController does not handle",
            metrics.unhandled.clone(),
        );
        registry.register(
            "edgehive_devicecontroller_busy",
            "Twin reports refused because too many were waiting",
            metrics.busy.clone(),
        );
        registry.register(
            "edgehive_devicecontroller_status_updates",
            "DeviceStatus updates written from twin and state reports",
            metrics.status_updates.clone(),
        );
        DeviceControllerModule {
            cluster: cluster.into(),
            metrics,
            workers: Arc::new(Semaphore::new(STATUS_WORKERS)),
            waiting: Arc::new(Semaphore::new(WAITING_CAPACITY)),
        }
    }
}

impl Module for DeviceControllerModule {
    type Actor = DeviceController;

    fn name(&self) -> &str {
        DEVICECONTROLLER_MODULE
    }

    fn group(&self) -> &str {
        DEVICECONTROLLER_GROUP
    }

    fn create(&self, hive: &Hive) -> DeviceController {
        DeviceController {
            hive: hive.clone(),
            cluster: self.cluster.clone(),
            metrics: self.metrics.clone(),
            workers: self.workers.clone(),
            waiting: self.waiting.clone(),
            devices: Arc::new(std::sync::Mutex::new(HashMap::new())),
        }
    }
}

/// Devices as last seen, by (namespace, name); shared by the watch loop and the upstream
/// handlers (membership/detail, twin names).
type Devices = Arc<std::sync::Mutex<HashMap<(String, String), Value>>>;

/// The DeviceController actor; see the [module docs](self).
pub struct DeviceController {
    hive: Hive,
    cluster: SharedCluster,
    metrics: Metrics,
    workers: Arc<Semaphore>,
    waiting: Arc<Semaphore>,
    devices: Devices,
}

impl Actor for DeviceController {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let watcher = DeviceWatcher {
            cluster: self.cluster.clone(),
            outbox: Outbox::new(
                self.hive.clone(),
                self.metrics.sent.clone(),
                self.metrics.overflow.clone(),
            ),
            devices: self.devices.clone(),
            models: HashMap::new(),
        };
        ctx.spawn(actix::fut::wrap_future(watcher.run()));
    }
}

fn lock(devices: &Devices) -> std::sync::MutexGuard<'_, HashMap<(String, String), Value>> {
    // Every writer finishes its map update before anything can panic.
    devices
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn key_of(obj: &Value) -> (String, String) {
    (
        obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned(),
        obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

fn node_of(device: &Value) -> Option<String> {
    device["spec"]["nodeName"]
        .as_str()
        .filter(|node| !node.is_empty())
        .map(str::to_owned)
}

fn model_of(device: &Value) -> Option<String> {
    device["spec"]["deviceModelRef"]["name"]
        .as_str()
        .filter(|model| !model.is_empty())
        .map(str::to_owned)
}

/// The device as membership messages carry it: `{id, name, description}` (description from
/// the label `description`, omitted when absent).
pub fn membership_device(device: &Value) -> Value {
    let (namespace, name) = key_of(device);
    let mut entry = json!({"id": format!("{namespace}/{name}"), "name": name});
    if let Some(description) = device["metadata"]["labels"]["description"].as_str() {
        entry["description"] = json!(description);
    }
    entry
}

struct DeviceWatcher {
    cluster: SharedCluster,
    outbox: Outbox,
    devices: Devices,
    /// DeviceModels as last seen, by (namespace, name).
    models: HashMap<(String, String), Value>,
}

impl DeviceWatcher {
    async fn run(mut self) {
        let mut model_watch = self.cluster.watch("DeviceModel");
        let mut device_watch = self.cluster.watch("Device");
        self.relist("DeviceModel").await;
        self.relist("Device").await;
        let mut retry = tokio::time::interval(RETRY_INTERVAL);
        loop {
            // Biased: a model written before its device is known when the device arrives.
            tokio::select! {
                biased;
                event = model_watch.next() => match event {
                    Some(Ok(event)) => self.on_model(event),
                    Some(Err(WatchError::Lagged { .. })) => self.relist("DeviceModel").await,
                    Some(Err(WatchError::Closed)) | None => return,
                },
                event = device_watch.next() => match event {
                    Some(Ok(event)) => self.on_device(event).await,
                    Some(Err(WatchError::Lagged { .. })) => self.relist("Device").await,
                    Some(Err(WatchError::Closed)) | None => return,
                },
                _ = retry.tick(), if !self.outbox.is_empty() => self.outbox.flush(),
            }
        }
    }

    async fn relist(&mut self, kind: &str) {
        let (objects, _) = match self.cluster.list(kind).await {
            Ok(listed) => listed,
            Err(error) => {
                tracing::warn!(kind, %error, "cannot list; keeping what was seen");
                return;
            }
        };
        let seen: HashMap<(String, String), Value> = if kind == "Device" {
            lock(&self.devices).clone()
        } else {
            self.models.clone()
        };
        let mut present = std::collections::HashSet::new();
        for obj in objects {
            let key = key_of(&obj);
            present.insert(key.clone());
            let event_type = match seen.get(&key) {
                None => EventType::Added,
                Some(old)
                    if is_newer(
                        obj["metadata"]["resourceVersion"].as_str().unwrap_or(""),
                        old["metadata"]["resourceVersion"].as_str().unwrap_or(""),
                    ) =>
                {
                    EventType::Modified
                }
                Some(_) => continue,
            };
            let event = WatchEvent {
                event_type,
                object: obj,
            };
            if kind == "Device" {
                self.on_device(event).await;
            } else {
                self.on_model(event);
            }
        }
        for (key, old) in seen {
            if present.contains(&key) {
                continue;
            }
            let event = WatchEvent {
                event_type: EventType::Deleted,
                object: old,
            };
            if kind == "Device" {
                self.on_device(event).await;
            } else {
                self.on_model(event);
            }
        }
    }

    /// Whether another device than `except` on `node` in `namespace` uses `model`.
    fn model_used(&self, node: &str, namespace: &str, model: &str, except: &str) -> bool {
        lock(&self.devices).values().any(|device| {
            let (ns, name) = key_of(device);
            ns == namespace
                && name != except
                && node_of(device).as_deref() == Some(node)
                && model_of(device).as_deref() == Some(model)
        })
    }

    fn send_object(&mut self, node: &str, kind: &str, obj: &Value, operation: Operation) {
        let (namespace, name) = key_of(obj);
        let resource_type = if kind == "Device" {
            ResourceType::Device
        } else {
            ResourceType::DeviceModel
        };
        let mut content = obj.clone();
        content["apiVersion"] = json!(DEVICES_API_VERSION);
        content["kind"] = json!(kind);
        let message = Message::new(
            ModuleName::DeviceController,
            Group::Resource,
            operation,
            CloudResource::new(node, namespace, resource_type, Some(name)).to_string(),
            content,
        )
        .with_resource_version(obj["metadata"]["resourceVersion"].as_str().unwrap_or(""));
        self.outbox.send(message);
    }

    fn send_membership(&mut self, node: &str, added: Option<&Value>, removed: Option<&Value>) {
        let list = |device: Option<&Value>| match device {
            Some(device) => json!([membership_device(device)]),
            None => Value::Null,
        };
        self.outbox.send(Message::new(
            ModuleName::DeviceController,
            Group::Twin,
            Operation::Update,
            format!("node/{node}/membership"),
            json!({
                "event_id": uuid::Uuid::new_v4().to_string(),
                "timestamp": edgehive_protocols::object::now_ms(),
                "added_devices": list(added),
                "removed_devices": list(removed),
            }),
        ));
    }

    fn add_to_node(&mut self, node: &str, device: &Value) {
        let (namespace, name) = key_of(device);
        self.send_membership(node, Some(device), None);
        if let Some(model) = model_of(device) {
            if !self.model_used(node, &namespace, &model, &name) {
                if let Some(obj) = self.models.get(&(namespace.clone(), model)).cloned() {
                    self.send_object(node, "DeviceModel", &obj, Operation::Insert);
                }
            }
        }
        self.send_object(node, "Device", device, Operation::Insert);
    }

    fn remove_from_node(&mut self, node: &str, device: &Value) {
        let (namespace, name) = key_of(device);
        self.send_membership(node, None, Some(device));
        if let Some(model) = model_of(device) {
            if !self.model_used(node, &namespace, &model, &name) {
                if let Some(obj) = self.models.get(&(namespace.clone(), model)).cloned() {
                    self.send_object(node, "DeviceModel", &obj, Operation::Delete);
                }
            }
        }
        self.send_object(node, "Device", device, Operation::Delete);
    }

    async fn on_device(&mut self, event: WatchEvent) {
        let device = event.object;
        let key = key_of(&device);
        let old = lock(&self.devices).get(&key).cloned();
        match event.event_type {
            EventType::Deleted => {
                lock(&self.devices).remove(&key);
                if let Some(node) = node_of(&device) {
                    self.remove_from_node(&node, &device);
                }
            }
            EventType::Added | EventType::Modified => {
                if let Some(old) = &old {
                    if !is_newer(
                        device["metadata"]["resourceVersion"].as_str().unwrap_or(""),
                        old["metadata"]["resourceVersion"].as_str().unwrap_or(""),
                    ) {
                        return;
                    }
                }
                let old_node = old.as_ref().and_then(node_of);
                let new_node = node_of(&device);
                if old.is_none() {
                    self.ensure_status(&device).await;
                }
                if old_node != new_node {
                    if let (Some(node), Some(old)) = (&old_node, &old) {
                        // Forget it first so the model counts as unused on the old node.
                        lock(&self.devices).remove(&key);
                        self.remove_from_node(node, old);
                    }
                    lock(&self.devices).insert(key.clone(), device.clone());
                    if let Some(node) = &new_node {
                        self.add_to_node(node, &device);
                    }
                } else {
                    lock(&self.devices).insert(key.clone(), device.clone());
                    let changed = old.as_ref().is_some_and(|old| {
                        old["spec"] != device["spec"]
                            || old["metadata"]["labels"] != device["metadata"]["labels"]
                    });
                    if let (Some(node), true) = (&new_node, changed) {
                        self.send_object(node, "Device", &device, Operation::Update);
                    }
                }
            }
        }
    }

    /// Creates the Device's DeviceStatus (same name, owner-referenced) if it has none.
    async fn ensure_status(&self, device: &Value) {
        let (namespace, name) = key_of(device);
        let status = json!({
            "apiVersion": DEVICES_API_VERSION,
            "kind": "DeviceStatus",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "ownerReferences": [{
                    "apiVersion": DEVICES_API_VERSION, "kind": "Device", "name": name,
                    "uid": device["metadata"]["uid"], "controller": true,
                }],
            },
            "status": {},
        });
        match self.cluster.create(status).await {
            Ok(_) | Err(ClusterError::AlreadyExists { .. }) => {}
            Err(error) => {
                tracing::warn!(%namespace, %name, %error, "cannot create the DeviceStatus")
            }
        }
    }

    fn on_model(&mut self, event: WatchEvent) {
        let model = event.object;
        let key = key_of(&model);
        let operation = match event.event_type {
            EventType::Deleted => {
                // KubeEdge sends model deletes only with the last device of a node.
                self.models.remove(&key);
                return;
            }
            EventType::Added | EventType::Modified => {
                let first = self.models.insert(key.clone(), model.clone()).is_none();
                if first {
                    Operation::Insert
                } else {
                    Operation::Update
                }
            }
        };
        let mut nodes: Vec<String> = lock(&self.devices)
            .values()
            .filter(|device| {
                key_of(device).0 == key.0 && model_of(device).as_deref() == Some(&key.1)
            })
            .filter_map(node_of)
            .collect();
        nodes.sort();
        nodes.dedup();
        for node in nodes {
            self.send_object(&node, "DeviceModel", &model, operation.clone());
        }
    }
}

/// A twin report turned into a DeviceStatus change.
enum Report {
    Twins(Value),
    State(Value),
}

impl Handler<Envelope> for DeviceController {
    type Result = Option<Message>;

    fn handle(&mut self, envelope: Envelope, ctx: &mut Context<Self>) -> Option<Message> {
        let message = envelope.into_message();
        let resource = message.resource().to_owned();
        let tokens: Vec<&str> = resource.split('/').collect();
        let Some(node) = tokens.get(1).map(|node| (*node).to_owned()) else {
            self.metrics.unhandled.inc();
            return None;
        };
        let rest = tokens.get(2..).unwrap_or_default().join("/");
        if rest == "membership/detail" {
            self.answer_detail(&node, &message);
            return None;
        }
        let report = match (tokens.get(2), tokens.get(5..)) {
            (Some(&"device"), Some(["twin", "edge_updated"])) => message
                .content_json()
                .ok()
                .filter(Value::is_object)
                .map(Report::Twins),
            (Some(&"device"), Some(["state", "update"])) => message
                .content_json()
                .ok()
                .filter(Value::is_object)
                .map(Report::State),
            _ => {
                tracing::debug!(%resource, "device message not handled");
                self.metrics.unhandled.inc();
                return None;
            }
        };
        let (Some(report), Some(namespace), Some(name)) = (report, tokens.get(3), tokens.get(4))
        else {
            tracing::warn!(%resource, "device report with unreadable content; dropped");
            self.metrics.unhandled.inc();
            return None;
        };
        let Ok(waiting) = self.waiting.clone().try_acquire_owned() else {
            tracing::warn!(%resource, "too many device reports waiting; dropped");
            self.metrics.busy.inc();
            return None;
        };
        let (namespace, name) = ((*namespace).to_owned(), (*name).to_owned());
        let cluster = self.cluster.clone();
        let workers = self.workers.clone();
        let hive = self.hive.clone();
        let metrics = self.metrics.clone();
        let device = lock(&self.devices)
            .get(&(namespace.clone(), name.clone()))
            .cloned();
        ctx.spawn(actix::fut::wrap_future(async move {
            let Ok(_worker) = workers.acquire_owned().await else {
                return;
            };
            drop(waiting);
            let Some(device) = device else {
                tracing::warn!(%namespace, %name, "report for an unknown device; dropped");
                return;
            };
            match write_report(&cluster, &device, report).await {
                Ok(()) => {
                    metrics.status_updates.inc();
                    let mut reply = Message::response_to(&message, json!("OK"));
                    reply.route.source = Some(ModuleName::DeviceController);
                    reply.route.group = Some(Group::Twin);
                    reply.route.resource = format!("node/{node}/twin");
                    if offer_message(&hive, &metrics.sent, &reply).is_err() {
                        metrics.overflow.inc();
                    }
                }
                Err(error) => {
                    tracing::warn!(%namespace, %name, %error, "cannot update the DeviceStatus")
                }
            }
        }));
        None
    }
}

impl DeviceController {
    fn answer_detail(&self, node: &str, request: &Message) {
        let mut devices: Vec<Value> = lock(&self.devices)
            .values()
            .filter(|device| node_of(device).as_deref() == Some(node))
            .map(membership_device)
            .collect();
        devices.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
        let mut reply = Message::response_to(
            request,
            json!({
                "event_id": uuid::Uuid::new_v4().to_string(),
                "timestamp": edgehive_protocols::object::now_ms(),
                "devices": devices,
            }),
        );
        reply.route.source = Some(ModuleName::DeviceController);
        reply.route.group = Some(Group::Twin);
        reply.route.resource = format!("node/{node}/membership/detail");
        if offer_message(&self.hive, &self.metrics.sent, &reply).is_err() {
            self.metrics.overflow.inc();
        }
    }
}

/// A twin value as the DeviceStatus stores it: `{value, metadata {timestamp, type}}`.
fn status_value(twin_value: &Value, twin_type: &Value) -> Value {
    let mut metadata = json!({});
    match &twin_value["metadata"]["timestamp"] {
        Value::Number(n) => metadata["timestamp"] = json!(n.to_string()),
        Value::String(s) => metadata["timestamp"] = json!(s),
        _ => {}
    }
    if let Some(kind) = twin_type.as_str() {
        metadata["type"] = json!(kind);
    }
    json!({"value": twin_value["value"].as_str().unwrap_or_default(), "metadata": metadata})
}

async fn write_report(
    cluster: &SharedCluster,
    device: &Value,
    report: Report,
) -> Result<(), ClusterError> {
    let (namespace, name) = key_of(device);
    let status = match cluster.get("DeviceStatus", Some(&namespace), &name).await {
        Ok(status) => status,
        Err(ClusterError::NotFound { .. }) => {
            cluster
                .create(
                    json!({"apiVersion": DEVICES_API_VERSION, "kind": "DeviceStatus",
                    "metadata": {"name": name, "namespace": namespace}, "status": {}}),
                )
                .await?
        }
        Err(error) => return Err(error),
    };
    let patch = match report {
        Report::Twins(content) => {
            let declared: Vec<&str> = device["spec"]["properties"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p["name"].as_str())
                .collect();
            let mut twins: Vec<Value> = status["status"]["twins"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let Some(reported) = content["twin"].as_object() else {
                return Ok(());
            };
            for (property, twin) in reported {
                if !declared.contains(&property.as_str()) {
                    continue;
                }
                let at = match twins
                    .iter()
                    .position(|t| t["propertyName"].as_str() == Some(property))
                {
                    Some(at) => at,
                    None => {
                        twins.push(json!({"propertyName": property}));
                        twins.len() - 1
                    }
                };
                let kind = &twin["metadata"]["type"];
                if twin["actual"].is_object() {
                    twins[at]["reported"] = status_value(&twin["actual"], kind);
                }
                if twin["expected"].is_object() {
                    twins[at]["observedDesired"] = status_value(&twin["expected"], kind);
                }
            }
            json!({"status": {"twins": twins}})
        }
        Report::State(content) => {
            let device = &content["device"];
            json!({"status": {
                "state": device["state"],
                "lastOnlineTime": device["lastOnlineTime"],
            }})
        }
    };
    cluster
        .patch("DeviceStatus", Some(&namespace), &name, patch, true)
        .await
        .map(|_| ())
}
