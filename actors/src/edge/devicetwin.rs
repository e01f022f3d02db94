//! DeviceTwin (module `twin`, group `twin`): the edge's devices and their twins.
//!
//! - Membership updates from the cloud (group `twin`, resource `membership`) add and remove
//!   devices; Device objects arrive through MetaManager, which stores them in `meta` and asks
//!   twin to commit them to the device tables before it ACKs. The desired value of each twin
//!   is the Device's `spec.properties[].desired.value`.
//! - A mapper's reading ([`ReportTwin`]) or device state ([`ReportState`]) is stored, then
//!   sent up as `device/{ns}/{name}/twin/edge_updated` or `.../state/update` (source `twin`,
//!   group `resource`, operation `update`). Each upload stays in the confirm list until a
//!   cloud message whose `parent_msg_id` is its id arrives, and is resent after every
//!   reconnect and every `RESEND_INTERVAL` while connected. Reports are kept in the store
//!   too (before they are sent) and taken back when the process starts again.
//! - After each connect, twin asks for `membership/detail` (operation `get`) as a real edge
//!   does, reusing the same message while it is unanswered. Connects are EdgeHub's
//!   [`CloudConnection`], which twin follows from the start of each actor.
//!   The answer's device list is the full set, except for devices added, changed or removed
//!   after the request was made (the answer may be older: it travels on the no-ACK lane,
//!   which Device inserts overtake); its confirmation is counted once it is applied.
//! - What it commits (a reading, a Device object, a membership change) it tells on the
//!   hive's [`TwinChanges`], which EventBus follows to publish deltas and membership updates.
//! - It takes [`TwinMessage`]s, typed by EdgeHub (or from an extension's envelope, with the
//!   same function) and by MetaManager for Device objects; its uploads are the contract's
//!   `Upload`s, which EdgeHub writes.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use actix::{Actor, AsyncContext, Context, Handler, ResponseFuture, StreamHandler};
use edgehive_protocols::object::now_rfc3339;
use edgehive_protocols::Message;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use serde_json::Value;

use super::contract::{
    changes, route, twin_document, CloudConnection, ConnectionState, ToCloud, TwinBody, TwinChange,
    TwinChanges, TwinMessage, TwinReply, Upload,
};
use super::deliver::tell_with_retry;
use super::store::StoreError;
use super::twin_store::{DeviceSpec, ReportedTwin, TwinStore};
use crate::hive::locks;
use crate::hive::{Accepts, Envelope, Hive, Module};

/// beehive name of the module.
pub const MODULE_NAME: &str = route::TWIN;
/// beehive group of the module.
pub(crate) const GROUP: &str = route::TWIN_GROUP;
/// Uploads awaiting the cloud's confirmation, at most. Overflow policy: the oldest is dropped
/// (and counted): a newer reading of the same device supersedes it in the cloud anyway.
pub const MAX_UNCONFIRMED: usize = 1024;
/// How often unconfirmed uploads are resent while connected (KubeEdge: after 60 s idle).
pub(crate) const RESEND_INTERVAL: Duration = Duration::from_secs(60);
const HUB_MODULE: &str = route::EDGEHUB;

/// Why a report was refused.
#[derive(Debug, thiserror::Error)]
pub enum TwinError {
    /// No device with that id is on this edge.
    #[error("device {0} is not on this edge")]
    UnknownDevice(String),
    /// The device has no twin for that property.
    #[error("device {0} has no property {1}")]
    UnknownProperty(String, String),
    /// The edge database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Too many reports are still waiting for the cloud's confirmation; try again later.
    #[error("{MAX_UNCONFIRMED} reports are waiting for the cloud's confirmation; try again later")]
    Busy,
}

/// A mapper reports the value it read for one property of a device.
#[derive(Debug)]
pub struct ReportTwin {
    /// `{namespace}/{name}`.
    pub id: String,
    /// The property (twin) name.
    pub property: String,
    /// The value as text, as twins carry it.
    pub value: String,
}

impl actix::Message for ReportTwin {
    type Result = Result<Message, TwinError>;
}

/// A mapper's twin update on MQTT: readings of several properties of one device, each taken
/// as a [`ReportTwin`] is (stored, sent up), in order, stopping at the first refused. The
/// answer is the update's twin document (KubeEdge's `{property: {last, current}}`), which
/// EventBus publishes after its result with the update's `event_id`, then the delta, as
/// edgecore does; so DeviceTwin tells nothing of it on [`TwinChanges`] (a [`ReportTwin`]'s
/// document and delta it does).
#[derive(Debug)]
pub struct ReportTwins {
    /// `{namespace}/{name}`.
    pub id: String,
    /// `(property, value)`, values as text.
    pub readings: Vec<(String, String)>,
}

impl actix::Message for ReportTwins {
    type Result = Result<serde_json::Map<String, Value>, TwinError>;
}

/// A mapper reports a device's state (`online`, `offline`, ...).
#[derive(Debug)]
pub struct ReportState {
    /// `{namespace}/{name}`.
    pub id: String,
    /// The state.
    pub state: String,
}

impl actix::Message for ReportState {
    type Result = Result<Message, TwinError>;
}

#[derive(Debug, Clone, Default)]
struct TwinMetrics {
    uploads: Counter,
    resends: Counter,
    confirmed: Counter,
    dropped: Counter,
    refused: Counter,
    unconfirmed: Gauge,
}

impl TwinMetrics {
    fn register(hive: &Hive) -> TwinMetrics {
        let metrics = TwinMetrics::default();
        let registry = hive.metrics();
        registry.register(
            "edgehive_twin_uploads",
            "Twin and state reports sent to the cloud (first sends)",
            metrics.uploads.clone(),
        );
        registry.register(
            "edgehive_twin_resends",
            "Unconfirmed uploads sent again",
            metrics.resends.clone(),
        );
        registry.register(
            "edgehive_twin_confirmed",
            "Uploads the cloud confirmed",
            metrics.confirmed.clone(),
        );
        registry.register(
            "edgehive_twin_reports_refused",
            "Mapper reports refused because too many wait for the cloud's confirmation",
            metrics.refused.clone(),
        );
        registry.register(
            "edgehive_twin_unconfirmed_dropped",
            "Unconfirmed uploads dropped because the confirm list was full (oldest first)",
            metrics.dropped.clone(),
        );
        registry.register(
            "edgehive_twin_unconfirmed",
            "Uploads waiting for the cloud's confirmation",
            metrics.unconfirmed.clone(),
        );
        metrics
    }
}

/// Uploads waiting for confirmation, oldest first.
#[derive(Debug, Default)]
struct Unconfirmed {
    order: VecDeque<String>,
    messages: HashMap<String, Upload>,
    /// The pending `membership/detail` request's id, if any.
    detail: Option<String>,
}

impl Unconfirmed {
    fn insert(&mut self, message: Upload, metrics: &TwinMetrics) {
        while self.order.len() >= MAX_UNCONFIRMED {
            if let Some(oldest) = self.order.pop_front() {
                self.messages.remove(&oldest);
                metrics.dropped.inc();
            }
        }
        self.order.push_back(message.id().to_owned());
        self.messages.insert(message.id().to_owned(), message);
        metrics.unconfirmed.set(self.order.len() as i64);
    }

    fn confirm(&mut self, id: &str, metrics: &TwinMetrics) -> Option<Upload> {
        let message = self.messages.remove(id)?;
        self.order.retain(|pending| pending != id);
        if self.detail.as_deref() == Some(id) {
            self.detail = None;
        }
        metrics.unconfirmed.set(self.order.len() as i64);
        Some(message)
    }

    fn all(&self) -> Vec<Upload> {
        self.order
            .iter()
            .filter_map(|id| self.messages.get(id).cloned())
            .collect()
    }
}

/// State that outlives a restart of the actor.
#[derive(Debug)]
struct Shared {
    store: TwinStore,
    node_name: String,
    /// EdgeHub's connection state.
    connection: Arc<CloudConnection>,
    unconfirmed: Mutex<Unconfirmed>,
    /// The kept uploads were read back (see `load_kept`).
    loaded: AtomicBool,
    /// Devices added, changed or removed since the pending `membership/detail` request was
    /// made: its answer may have been computed before, so it does not undo them.
    settled: Arc<Mutex<HashSet<String>>>,
    metrics: TwinMetrics,
    /// Where committed changes are told (EventBus follows them).
    changes: Arc<TwinChanges>,
}

impl Shared {
    fn unconfirmed(&self) -> MutexGuard<'_, Unconfirmed> {
        // Critical sections only move map entries; a panic cannot leave them torn.
        locks::lock(&self.unconfirmed)
    }

    fn connected(&self) -> bool {
        self.connection.current().is_connected()
    }

    /// Notes that the edge learned about device `id` now, after any pending
    /// `membership/detail` request was sent. Called before the change is written, so an
    /// answer that sees the write sees the note too.
    fn settle(&self, id: &str) {
        locks::lock(&self.settled).insert(id.to_owned());
    }
}

/// The DeviceTwin recipe.
#[derive(Debug)]
pub struct DeviceTwinModule {
    store: TwinStore,
    node_name: String,
    shared: OnceLock<Arc<Shared>>,
}

impl DeviceTwinModule {
    /// DeviceTwin for node `node_name` over the device tables in `store`.
    pub fn new(store: TwinStore, node_name: impl Into<String>) -> Self {
        DeviceTwinModule {
            store,
            node_name: node_name.into(),
            shared: OnceLock::new(),
        }
    }
}

impl Module for DeviceTwinModule {
    type Actor = DeviceTwin;

    fn name(&self) -> &str {
        MODULE_NAME
    }

    fn group(&self) -> &str {
        GROUP
    }

    fn accepts(&self, accepts: &mut Accepts<DeviceTwin>) {
        accepts
            .message::<TwinMessage>()
            .message::<ReportTwin>()
            .message::<ReportTwins>()
            .message::<ReportState>();
    }

    fn create(&self, hive: &Hive) -> DeviceTwin {
        let shared = self
            .shared
            .get_or_init(|| {
                Arc::new(Shared {
                    store: self.store.clone(),
                    node_name: self.node_name.clone(),
                    connection: CloudConnection::of(hive),
                    unconfirmed: Mutex::new(Unconfirmed::default()),
                    loaded: AtomicBool::new(false),
                    settled: Arc::default(),
                    metrics: TwinMetrics::register(hive),
                    changes: TwinChanges::of(hive),
                })
            })
            .clone();
        // Subscribed here, not when the actor starts: a connect in between is not missed.
        let connection = Some(shared.connection.subscribe());
        DeviceTwin {
            hive: hive.clone(),
            shared,
            connection,
        }
    }
}

/// The DeviceTwin actor; see the [module docs](self).
#[derive(Debug)]
pub struct DeviceTwin {
    hive: Hive,
    shared: Arc<Shared>,
    /// Taken when the actor starts, to follow the connection.
    connection: Option<tokio::sync::watch::Receiver<ConnectionState>>,
}

impl Actor for DeviceTwin {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if let Some(connection) = self.connection.take() {
            ctx.add_stream(changes(connection));
        }
        let shared = self.shared.clone();
        ctx.spawn(actix::fut::wrap_future(async move {
            load_kept(&shared).await;
        }));
        ctx.run_interval(RESEND_INTERVAL, |twin, ctx| {
            let (hive, shared) = (twin.hive.clone(), twin.shared.clone());
            ctx.spawn(actix::fut::wrap_future(async move {
                resend_all(&hive, &shared).await;
            }));
        });
    }
}

impl StreamHandler<ConnectionState> for DeviceTwin {
    /// Each (re)connect: ask for the membership detail and send every unconfirmed upload.
    fn handle(&mut self, state: ConnectionState, ctx: &mut Context<Self>) {
        if state.is_connected() {
            let (hive, shared) = (self.hive.clone(), self.shared.clone());
            ctx.spawn(actix::fut::wrap_future(async move {
                on_connected(&hive, &shared).await;
            }));
        }
    }

    /// The state ends with the hive; the actor stays until the hive stops it.
    fn finished(&mut self, _: &mut Context<Self>) {}
}

impl Handler<TwinMessage> for DeviceTwin {
    type Result = ResponseFuture<Option<TwinReply>>;

    fn handle(&mut self, message: TwinMessage, _: &mut Context<Self>) -> Self::Result {
        let shared = self.shared.clone();
        Box::pin(async move { on_message(&shared, message).await })
    }
}

impl Handler<Envelope> for DeviceTwin {
    type Result = ResponseFuture<Option<Message>>;

    /// An extension module's message: typed as EdgeHub types the cloud's, then served alike.
    fn handle(&mut self, envelope: Envelope, _: &mut Context<Self>) -> Self::Result {
        let shared = self.shared.clone();
        let typed = TwinMessage::from_message(envelope.into_message());
        Box::pin(async move {
            let reply = on_message(&shared, typed?).await?;
            Some(reply.into_message())
        })
    }
}

impl Handler<ReportTwin> for DeviceTwin {
    type Result = ResponseFuture<Result<Message, TwinError>>;

    fn handle(&mut self, report: ReportTwin, _: &mut Context<Self>) -> Self::Result {
        let (hive, shared) = (self.hive.clone(), self.shared.clone());
        Box::pin(async move {
            let (sent, reported) =
                report_reading(&hive, &shared, &report.id, report.property, report.value).await?;
            let mut twin = serde_json::Map::new();
            twin.insert(
                reported.property,
                serde_json::json!({"last": reported.last, "current": reported.twin}),
            );
            shared.changes.send(TwinChange::Document {
                id: report.id.clone(),
                twin,
            });
            shared.changes.send(TwinChange::Device(report.id));
            Ok(sent.into_message())
        })
    }
}

impl Handler<ReportTwins> for DeviceTwin {
    type Result = ResponseFuture<Result<serde_json::Map<String, Value>, TwinError>>;

    fn handle(&mut self, report: ReportTwins, _: &mut Context<Self>) -> Self::Result {
        let (hive, shared) = (self.hive.clone(), self.shared.clone());
        Box::pin(async move {
            let mut document = serde_json::Map::new();
            let mut outcome = Ok(());
            for (property, value) in report.readings {
                match report_reading(&hive, &shared, &report.id, property, value).await {
                    Ok((_, reported)) => {
                        document.insert(
                            reported.property,
                            serde_json::json!({"last": reported.last, "current": reported.twin}),
                        );
                    }
                    Err(error) => {
                        outcome = Err(error);
                        break;
                    }
                }
            }
            // EventBus publishes this update's document and delta itself, after its result
            // (edgecore's one of each): nothing to tell the followers.
            outcome.map(|()| document)
        })
    }
}

/// A reading stored and sent up (until confirmed): the upload and what it changed.
async fn report_reading(
    hive: &Hive,
    shared: &Shared,
    id: &str,
    property: String,
    value: String,
) -> Result<(Upload, ReportedTwin), TwinError> {
    refuse_when_full(shared)?;
    let reported = shared
        .store
        .set_actual(id.to_owned(), property.clone(), value)
        .await?;
    let Some(reported) = reported else {
        return Err(match shared.store.get(id.to_owned()).await? {
            None => TwinError::UnknownDevice(id.to_owned()),
            Some(_) => TwinError::UnknownProperty(id.to_owned(), property),
        });
    };
    let sent = Upload::twin_reported(
        id,
        &reported.property,
        reported.twin.clone(),
        &uuid::Uuid::new_v4().to_string(),
        now_ms(),
    );
    upload(hive, shared, sent.clone()).await?;
    Ok((sent, reported))
}

impl Handler<ReportState> for DeviceTwin {
    type Result = ResponseFuture<Result<Message, TwinError>>;

    fn handle(&mut self, report: ReportState, _: &mut Context<Self>) -> Self::Result {
        let (hive, shared) = (self.hive.clone(), self.shared.clone());
        Box::pin(async move {
            refuse_when_full(&shared)?;
            let now = now_rfc3339();
            if !shared
                .store
                .set_state(report.id.clone(), report.state.clone(), now.clone())
                .await?
            {
                return Err(TwinError::UnknownDevice(report.id));
            }
            let sent = Upload::device_state(
                &report.id,
                &report.state,
                &now,
                &uuid::Uuid::new_v4().to_string(),
                now_ms(),
            );
            upload(&hive, &shared, sent.clone()).await?;
            Ok(sent.into_message())
        })
    }
}

/// A report is refused, not accepted and later dropped, while the confirm list is full.
fn refuse_when_full(shared: &Shared) -> Result<(), TwinError> {
    if shared.unconfirmed().order.len() >= MAX_UNCONFIRMED {
        shared.metrics.refused.inc();
        return Err(TwinError::Busy);
    }
    Ok(())
}

/// Remembers `message` until confirmed, in memory and in the store (so it survives a
/// restart of the process), and sends it now if connected (else at reconnect).
async fn upload(hive: &Hive, shared: &Shared, message: Upload) -> Result<(), TwinError> {
    shared.store.keep_upload(&message).await?;
    shared
        .unconfirmed()
        .insert(message.clone(), &shared.metrics);
    shared.metrics.uploads.inc();
    if shared.connected() {
        to_cloud(hive, &message).await;
    }
    Ok(())
}

/// Takes back the uploads kept by an earlier run of the process (once per process: a
/// restarted actor still has them in memory).
async fn load_kept(shared: &Shared) {
    if shared.loaded.swap(true, Ordering::AcqRel) {
        return;
    }
    match shared.store.kept_uploads(MAX_UNCONFIRMED).await {
        Ok(kept) if !kept.is_empty() => {
            tracing::info!(
                uploads = kept.len(),
                "twin uploads kept from an earlier run; sending them again"
            );
            let mut unconfirmed = shared.unconfirmed();
            for message in kept {
                if !unconfirmed.messages.contains_key(message.id()) {
                    unconfirmed.insert(message, &shared.metrics);
                }
            }
        }
        Ok(_) => {}
        Err(error) => {
            shared.loaded.store(false, Ordering::Release);
            tracing::error!(%error, "cannot read the kept twin uploads");
        }
    }
}

async fn to_cloud(hive: &Hive, message: &Upload) {
    let told = tell_with_retry(hive, HUB_MODULE, ToCloud::Upload(message.clone())).await;
    if let Err((error, _)) = told {
        // Still unconfirmed, so it goes again after the next connect or interval.
        tracing::warn!(id = message.id(), resource = message.resource(), %error, "twin upload not handed to edgehub");
    }
}

async fn resend_all(hive: &Hive, shared: &Shared) {
    if !shared.connected() {
        return;
    }
    let pending = shared.unconfirmed().all();
    for message in pending {
        shared.metrics.resends.inc();
        to_cloud(hive, &message).await;
    }
}

/// The `membership/detail` request a real edge sends after connecting.
fn membership_detail(node_name: &str) -> Upload {
    Upload::membership_detail(node_name, &uuid::Uuid::new_v4().to_string(), now_ms())
}

async fn on_connected(hive: &Hive, shared: &Shared) {
    let has_detail = shared.unconfirmed().detail.is_some();
    if !has_detail {
        let detail = membership_detail(&shared.node_name);
        locks::lock(&shared.settled).clear();
        let mut unconfirmed = shared.unconfirmed();
        unconfirmed.detail = Some(detail.id().to_owned());
        unconfirmed.insert(detail, &shared.metrics);
    }
    resend_all(hive, shared).await;
}

async fn on_message(shared: &Shared, msg: TwinMessage) -> Option<TwinReply> {
    if let Some(parent) = msg.reply_to.as_deref() {
        if let Some(error) = &msg.error {
            // Refused (a limit, a busy cloud): not a confirmation; it goes again later.
            if shared.unconfirmed().messages.contains_key(parent) {
                tracing::warn!(%parent, %error, "the cloud refused a twin upload; sending it again later");
                return None;
            }
        }
        let confirmed = shared.unconfirmed().confirm(parent, &shared.metrics);
        if let Some(request) = confirmed {
            if let Err(error) = shared.store.confirmed(parent.to_owned()).await {
                // Kept, so sent again after a restart: the cloud takes a report twice.
                tracing::warn!(%error, "cannot forget a confirmed twin upload");
            }
            if request.is_membership_detail() {
                apply_detail(shared, msg.devices).await;
            }
            // Counted once applied: a confirmed membership answer has taken effect.
            shared.metrics.confirmed.inc();
            return None;
        }
    }
    match msg.body {
        TwinBody::Membership { added, removed } => {
            for id in added
                .iter()
                .filter_map(|device| device.get("id")?.as_str())
                .chain(removed.iter().map(String::as_str))
            {
                shared.settle(id);
            }
            apply_membership(shared, added, removed).await;
            None
        }
        TwinBody::Device {
            id,
            model,
            delete,
            object,
        } => {
            // From MetaManager, which waits for this reply before it ACKs.
            let outcome = if model {
                Ok(())
            } else {
                shared.settle(&id);
                let before = shared.store.get(id.clone()).await.ok().flatten();
                let existed = before.is_some();
                let applied = apply_device_object(shared, id.clone(), delete, object).await;
                if applied.is_ok() {
                    if !delete {
                        tell_document(shared, &id, before.map(|device| device.twin)).await;
                    }
                    tell_device_change(shared, id, existed, delete);
                }
                applied
            };
            Some(match outcome {
                Ok(()) => TwinReply::Done(msg.origin),
                Err(error) => TwinReply::Failed {
                    of: msg.origin,
                    text: error.to_string(),
                },
            })
        }
        TwinBody::Invalid(reason) => {
            tracing::warn!(id = msg.origin.id(), "{reason}");
            None
        }
        TwinBody::Other(reason) => {
            tracing::debug!(
                id = msg.origin.id(),
                resource = msg.origin.resource(),
                reason,
                "twin ignores message"
            );
            None
        }
    }
}

/// Tells the followers the twin document of a cloud change to device `id` (its twins were
/// `before`, none if it is new), if a twin changed; told before the delta's change, as
/// edgecore publishes the document before the delta.
async fn tell_document(shared: &Shared, id: &str, before: Option<serde_json::Map<String, Value>>) {
    let after = match shared.store.get(id.to_owned()).await {
        Ok(Some(device)) => device.twin,
        Ok(None) => return,
        Err(error) => {
            tracing::warn!(%error, id, "cannot read a changed device for its twin document");
            return;
        }
    };
    let twin = twin_document(&before.unwrap_or_default(), &after);
    if !twin.is_empty() {
        shared.changes.send(TwinChange::Document {
            id: id.to_owned(),
            twin,
        });
    }
}

/// Tells the followers what a committed Device object changed.
fn tell_device_change(shared: &Shared, id: String, existed: bool, delete: bool) {
    let change = match (existed, delete) {
        (true, true) => TwinChange::Membership {
            added: Vec::new(),
            removed: vec![id],
        },
        (false, true) => return,
        (false, false) => {
            shared.changes.send(TwinChange::Membership {
                added: vec![id.clone()],
                removed: Vec::new(),
            });
            TwinChange::Device(id)
        }
        (true, false) => TwinChange::Device(id),
    };
    shared.changes.send(change);
}

async fn apply_membership(shared: &Shared, added: Vec<Value>, removed: Vec<String>) {
    let added: Vec<DeviceSpec> = added
        .iter()
        .filter_map(DeviceSpec::from_membership)
        .collect();
    let added_ids: Vec<String> = added.iter().map(|device| device.id.clone()).collect();
    if let Err(error) = shared.store.upsert_devices(added).await {
        tracing::error!(%error, "could not store added devices");
    }
    // Reports about a device no longer on this edge will never be confirmed: drop them.
    let stale: Vec<String> = {
        let mut unconfirmed = shared.unconfirmed();
        let ids: Vec<String> = unconfirmed
            .all()
            .iter()
            .filter(|upload| removed.iter().any(|id| upload.is_about(id)))
            .map(|upload| upload.id().to_owned())
            .collect();
        for id in &ids {
            unconfirmed.confirm(id, &shared.metrics);
        }
        ids
    };
    for id in stale {
        if let Err(error) = shared.store.confirmed(id).await {
            tracing::warn!(%error, "cannot forget an upload of a removed device");
        }
    }
    if let Err(error) = shared.store.remove_devices(removed.clone()).await {
        tracing::error!(%error, "could not remove devices");
    }
    if !added_ids.is_empty() || !removed.is_empty() {
        // The membership first: a mapper learns of a device before its delta.
        shared.changes.send(TwinChange::Membership {
            added: added_ids.clone(),
            removed,
        });
        for id in added_ids {
            shared.changes.send(TwinChange::Device(id));
        }
    }
}

/// A cloud answer to `membership/detail` with a `devices` list is the full device set, but
/// for the devices the edge learned about after asking: the cloud may have computed the
/// answer before them, and it travels on the no-ACK lane, which Device inserts (ACK lane)
/// overtake. Those keep what the edge stored.
async fn apply_detail(shared: &Shared, devices: Option<Vec<Value>>) {
    let Some(devices) = devices else {
        return;
    };
    let devices = devices
        .iter()
        .filter_map(DeviceSpec::from_membership)
        .collect();
    let settled = shared.settled.clone();
    let is_settled = move |id: &str| locks::lock(&settled).contains(id);
    if let Err(error) = shared.store.replace_devices(devices, is_settled).await {
        tracing::error!(%error, "could not store the membership detail");
    }
}

async fn apply_device_object(
    shared: &Shared,
    id: String,
    delete: bool,
    object: Value,
) -> Result<(), StoreError> {
    if delete {
        return shared.store.remove_devices(vec![id]).await;
    }
    match DeviceSpec::from_object(&object) {
        Some(device) => shared.store.upsert_devices(vec![device]).await,
        None => {
            tracing::warn!(
                id,
                "Device object without metadata.name; only stored in meta"
            );
            Ok(())
        }
    }
}

fn now_ms() -> i64 {
    i64::try_from(edgehive_protocols::object::now_ms()).unwrap_or(i64::MAX)
}
