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

mod controller;
mod device;
mod downstream;
mod index;
mod upstream;

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::cloud::cluster::SharedCluster;
use crate::hive::{Accepts, Hive, Module};
use controller::{DeviceController, Metrics};
use index::DeviceIndex;

/// The module name.
pub(crate) const DEVICECONTROLLER_MODULE: &str = super::contract::route::DEVICECONTROLLER;
/// The module group (CloudHub sends devicetwin's messages here).
pub(crate) const DEVICECONTROLLER_GROUP: &str = super::contract::route::DEVICECONTROLLER;
/// Twin reports written at once (KubeEdge's updateDeviceStatusWorkers).
pub(crate) const STATUS_WORKERS: usize = 1;
/// Twin reports that may wait for the worker. Overflow policy: a report beyond it is dropped,
/// logged and counted (`edgehive_devicecontroller_busy_total`); devicetwin resends
/// unconfirmed reports itself.
pub(crate) const WAITING_CAPACITY: usize = 1024;

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
