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
//!
//! - `downstream`: the Device and DeviceModel watches; `upstream`: the edge twin's reports
//!   and membership requests.

mod downstream;
mod index;
mod upstream;

use crate::cloud::outbox::RETRY_INTERVAL;
use downstream::DeviceWatcher;
use index::DeviceIndex;

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use edgehive_protocols::{Message, Operation, ResourceType};
use prometheus_client::metrics::counter::Counter;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::cloud::cluster::{ClusterError, EventType, SharedCluster, WatchEvent};
use crate::cloud::outbox::{deliver_reply, offer_message, Outbox};
use crate::hive::locks;
use crate::hive::{Accepts, Envelope, Hive, Module};
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
            devices: Arc::new(std::sync::Mutex::new(DeviceIndex::default())),
        }
    }

    fn accepts(&self, accepts: &mut Accepts<DeviceController>) {
        use crate::cloud::contract::twin::{TwinRequest, TwinUnhandled};
        accepts.message::<TwinRequest>().message::<TwinUnhandled>();
    }
}

/// Devices as last seen, by (namespace, name); shared by the watch loop and the upstream
/// handlers (membership/detail, twin names).
type Devices = Arc<std::sync::Mutex<DeviceIndex>>;

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
        let metrics = crate::cloud::watcher::WatchMetrics::of(&self.hive);
        ctx.spawn(actix::fut::wrap_future(watcher.run(metrics)));
    }
}

/// Every writer finishes its update of the index before anything can panic (see
/// [`locks`]).
fn lock(devices: &Devices) -> std::sync::MutexGuard<'_, DeviceIndex> {
    locks::lock(devices)
}

fn key_of(obj: &Value) -> (String, String) {
    edgehive_protocols::object::namespaced_key(obj)
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
