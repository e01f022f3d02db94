use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Metric, Registry};

use serde::Serialize;
use tokio::sync::{AcquireError, Semaphore};

use super::locks;

/// Where a module is in its life, as the supervisor sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModuleState {
    /// Its actor is running and receiving messages.
    Running = 0,
    /// Its actor failed; the supervisor starts a new one after a backoff.
    Restarting = 1,
    /// The process is shutting down; it is not restarted.
    Stopped = 2,
}

impl ModuleState {
    pub(super) fn from_u8(value: u8) -> Self {
        match value {
            0 => ModuleState::Running,
            1 => ModuleState::Restarting,
            _ => ModuleState::Stopped,
        }
    }
}

/// The label set of every per-module metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ModuleLabels {
    /// The beehive module name.
    pub module: String,
}

/// The process's Prometheus registry and the hive's own per-module metric families.
///
/// Modules add their own metrics with [`HiveMetrics::register`]; the admin endpoint serves
/// [`HiveMetrics::encode`] at `/metrics`.
///
/// ```
/// use edgehive_actors::hive::HiveMetrics;
/// use prometheus_client::metrics::counter::Counter;
///
/// let metrics = HiveMetrics::new();
/// let frames: Counter = Counter::default();
/// metrics.register("edgehive_example_frames", "Frames seen by the example", frames.clone());
/// frames.inc();
/// assert!(metrics.encode().contains("edgehive_example_frames_total 1"));
/// ```
#[derive(Debug)]
pub struct HiveMetrics {
    registry: Mutex<Registry>,
    routed: Family<ModuleLabels, Counter>,
    handled: Family<ModuleLabels, Counter>,
    dropped: Family<ModuleLabels, Counter>,
    restarts: Family<ModuleLabels, Counter>,
    mailbox_depth: Family<ModuleLabels, Gauge>,
}

impl Default for HiveMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl HiveMetrics {
    /// A registry holding the hive's metric families under the `edgehive_` prefix.
    pub fn new() -> Self {
        let metrics = HiveMetrics {
            registry: Mutex::new(Registry::default()),
            routed: Family::default(),
            handled: Family::default(),
            dropped: Family::default(),
            restarts: Family::default(),
            mailbox_depth: Family::default(),
        };
        metrics.register(
            "edgehive_messages_routed",
            "Messages the hive put into a module's mailbox",
            metrics.routed.clone(),
        );
        metrics.register(
            "edgehive_messages_handled",
            "Messages a module's handler finished with",
            metrics.handled.clone(),
        );
        metrics.register(
            "edgehive_messages_dropped",
            "Messages refused because the module's mailbox was full or the module was down",
            metrics.dropped.clone(),
        );
        metrics.register(
            "edgehive_module_restarts",
            "Times the supervisor started a module again after it stopped or panicked",
            metrics.restarts.clone(),
        );
        metrics.register(
            "edgehive_mailbox_depth",
            "Messages waiting in a module's mailbox",
            metrics.mailbox_depth.clone(),
        );
        metrics
    }

    /// Adds a metric to the registry served at `/metrics`.
    pub fn register(&self, name: &str, help: &str, metric: impl Metric) {
        locks::lock(&self.registry).register(name, help, metric);
    }

    /// The whole registry in Prometheus text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        let registry = locks::lock(&self.registry);
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &registry);
        text
    }

    /// The counters of module `name`, with a mailbox of `capacity` slots.
    pub(super) fn module_stats(&self, name: &str, group: &str, capacity: usize) -> ModuleStats {
        let labels = ModuleLabels {
            module: name.to_owned(),
        };
        ModuleStats {
            name: name.to_owned(),
            group: group.to_owned(),
            state: AtomicU8::new(ModuleState::Running as u8),
            routed: self.routed.get_or_create(&labels).clone(),
            handled: self.handled.get_or_create(&labels).clone(),
            dropped: self.dropped.get_or_create(&labels).clone(),
            restarts: self.restarts.get_or_create(&labels).clone(),
            depth: self.mailbox_depth.get_or_create(&labels).clone(),
            slots: Semaphore::new(capacity),
        }
    }
}

/// One module's live counters: handles onto the same atomics `/metrics` reads.
#[derive(Debug)]
pub(super) struct ModuleStats {
    pub(super) name: String,
    pub(super) group: String,
    state: AtomicU8,
    pub(super) routed: Counter,
    pub(super) handled: Counter,
    pub(super) dropped: Counter,
    pub(super) restarts: Counter,
    pub(super) depth: Gauge,
    /// One permit per mailbox slot, held as a [`Slot`]. actix's own capacity cannot bound the
    /// hive's sends (`Recipient::try_send` never refuses, and every sender clone gets a slot of
    /// its own), so the hive holds the bound itself: a message keeps its slot until handled.
    slots: Semaphore,
}

impl ModuleStats {
    /// A ticket was issued: the message is on its way into the mailbox.
    pub(super) fn enqueued(&self) {
        self.depth.inc();
    }

    /// The mailbox accepted the message.
    pub(super) fn delivered(&self) {
        self.routed.inc();
    }

    pub(super) fn handled(&self) {
        self.handled.inc();
        self.depth.dec();
    }

    pub(super) fn rejected(&self) {
        self.dropped.inc();
        self.depth.dec();
    }

    pub(super) fn state(&self) -> ModuleState {
        ModuleState::from_u8(self.state.load(Ordering::Relaxed))
    }

    pub(super) fn set_state(&self, state: ModuleState) {
        self.state.store(state as u8, Ordering::Relaxed);
    }
}

/// One of a module's mailbox slots, given back when dropped.
///
/// It holds the module's counters too, so a message in flight costs one reference count
/// (a tokio `OwnedSemaphorePermit` beside the counters would be a second).
#[derive(Debug)]
pub(super) struct Slot(Arc<ModuleStats>);

impl Slot {
    /// A free slot of the module `stats` counts, if there is one now.
    pub(super) fn try_take(stats: &Arc<ModuleStats>) -> Option<Slot> {
        let permit = stats.slots.try_acquire().ok()?;
        permit.forget();
        Some(Slot(Arc::clone(stats)))
    }

    /// Waits for a slot, fairly (first come, first served). Fails only if the slots are
    /// closed, which the hive never does.
    pub(super) async fn wait(stats: &Arc<ModuleStats>) -> Result<Slot, AcquireError> {
        stats.slots.acquire().await?.forget();
        Ok(Slot(Arc::clone(stats)))
    }

    /// The counters of the module whose slot this is.
    pub(super) fn stats(&self) -> &ModuleStats {
        &self.0
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.slots.add_permits(1);
    }
}
