//! The DeviceController actor: its state, and the watch loop it starts.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::Semaphore;

use super::downstream::DeviceWatcher;
use super::index::Devices;
use crate::cloud::cluster::SharedCluster;
use crate::cloud::outbox::Outbox;
use crate::hive::Hive;

/// DeviceController's counters.
#[derive(Debug, Clone, Default)]
pub(super) struct Metrics {
    pub(super) sent: Counter,
    pub(super) overflow: Counter,
    pub(super) unhandled: Counter,
    pub(super) busy: Counter,
    pub(super) status_updates: Counter,
}

/// The DeviceController actor; see the [module docs](super).
pub struct DeviceController {
    pub(super) hive: Hive,
    pub(super) cluster: SharedCluster,
    pub(super) metrics: Metrics,
    pub(super) workers: Arc<Semaphore>,
    pub(super) waiting: Arc<Semaphore>,
    pub(super) devices: Devices,
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
