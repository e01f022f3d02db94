//! MetaManager (module `metamanager`, group `meta`): the edge's copy of cloud objects.
//!
//! Objects pushed by the cloud are written to SQLite and only then acknowledged, so an ACK
//! the cloud sees means the object survives an edge restart. Local modules query the same
//! table, which keeps cloud data readable while the edge is offline. Queries for the types in
//! [`REMOTE_TYPES`](super::remote::REMOTE_TYPES) go to the cloud while connected (the answer
//! is stored, then the cloud's reply is acknowledged) and fall back to the stored copy when
//! disconnected or when the cloud does not answer within `remoteQueryTimeout`.
//! Device and DeviceModel objects are stored, then handed to the `twin` group; the ACK waits
//! for twin to commit them too. Whether the cloud is connected is EdgeHub's
//! [`CloudConnection`], read at each decision.

use std::sync::OnceLock;
use std::time::Duration;

use actix::{Actor, Context, Handler, ResponseFuture};
use edgehive_protocols::{EdgeResource, Group, Message, ModuleName, Operation, ResourceType};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::{json, Value};

use super::contract::{request_cloud, route, CloudConnection, CloudRequestError, ConnectionState};
use super::deliver::send_with_retry;
use super::remote::{is_remote_type, read_reply, ReplyContent};
use super::store::{MetaStore, StoreError, Upsert};
use crate::hive::{Envelope, Hive, Module};

/// beehive name of the module.
pub const MODULE_NAME: &str = route::METAMANAGER;
/// beehive group of the module.
pub const GROUP: &str = route::META_GROUP;
/// The module ACKs are sent to (edgehub).
const HUB_MODULE: &str = route::EDGEHUB;
/// The group Device and DeviceModel objects are handed to (DeviceTwin).
const TWIN_GROUP: &str = route::TWIN_GROUP;
/// KubeEdge's default `remoteQueryTimeout`.
pub const DEFAULT_REMOTE_QUERY_TIMEOUT: Duration = Duration::from_secs(60);
/// How much longer than `remoteQueryTimeout` a remote query waits for EdgeHub's own answer
/// (which is a timeout error at `remoteQueryTimeout`); see `Ctx::remote`.
const REMOTE_CALL_MARGIN: Duration = Duration::from_secs(1);
/// How long twin may take to commit a device object before the ACK is withheld (the cloud
/// then resends it, and the second delivery is idempotent).
const TWIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The counters MetaManager adds to `/metrics`; registered once per process.
#[derive(Debug, Clone, Default)]
struct MetaMetrics {
    written: Counter,
    stale: Counter,
    deletes: Counter,
    store_errors: Counter,
    ignored: Counter,
    remote_queries: Counter,
    remote_fallbacks: Counter,
    refused: Family<ReasonLabels, Counter>,
}

/// Label set of `edgehive_metamanager_refused_writes_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

impl MetaMetrics {
    fn register(hive: &Hive) -> MetaMetrics {
        let metrics = MetaMetrics::default();
        let registry = hive.metrics();
        registry.register(
            "edgehive_metamanager_rows_written",
            "Cloud objects written to the edge database",
            metrics.written.clone(),
        );
        registry.register(
            "edgehive_metamanager_stale_writes",
            "Cloud objects not written because the stored resourceVersion is newer (still ACKed)",
            metrics.stale.clone(),
        );
        registry.register(
            "edgehive_metamanager_deletes",
            "Cloud deletes applied to the edge database",
            metrics.deletes.clone(),
        );
        registry.register(
            "edgehive_metamanager_store_errors",
            "Store operations that failed (no ACK sent, the cloud resends)",
            metrics.store_errors.clone(),
        );
        registry.register(
            "edgehive_metamanager_ignored",
            "Messages MetaManager does not handle",
            metrics.ignored.clone(),
        );
        registry.register(
            "edgehive_metamanager_remote_queries",
            "Queries answered by the cloud",
            metrics.remote_queries.clone(),
        );
        registry.register(
            "edgehive_metamanager_refused_writes",
            "Cloud writes the edge refused to store because it could not use them, by reason \
             (answered with an error, not ACKed)",
            metrics.refused.clone(),
        );
        registry.register(
            "edgehive_metamanager_remote_fallbacks",
            "Remote queries answered from the store because the cloud did not answer in time",
            metrics.remote_fallbacks.clone(),
        );
        metrics
    }
}

/// The MetaManager recipe. It holds everything that must outlive a restart of the actor: the
/// store handle and the metric handles.
#[derive(Debug)]
pub struct MetaManagerModule {
    store: MetaStore,
    remote_query_timeout: Duration,
    metrics: OnceLock<MetaMetrics>,
}

impl MetaManagerModule {
    /// A MetaManager over `store`, with KubeEdge's default `remoteQueryTimeout` of 60 s.
    pub fn new(store: MetaStore) -> Self {
        MetaManagerModule {
            store,
            remote_query_timeout: DEFAULT_REMOTE_QUERY_TIMEOUT,
            metrics: OnceLock::new(),
        }
    }

    /// Sets `modules.metaManager.remoteQueryTimeout`: how long a remote query waits for the
    /// cloud before the stored copy is served instead.
    pub fn with_remote_query_timeout(mut self, timeout: Duration) -> Self {
        self.remote_query_timeout = timeout;
        self
    }
}

impl Module for MetaManagerModule {
    type Actor = MetaManager;

    fn name(&self) -> &str {
        MODULE_NAME
    }

    fn group(&self) -> &str {
        GROUP
    }

    fn create(&self, hive: &Hive) -> MetaManager {
        MetaManager {
            ctx: Ctx {
                hive: hive.clone(),
                store: self.store.clone(),
                connection: CloudConnection::of(hive),
                remote_query_timeout: self.remote_query_timeout,
                metrics: self
                    .metrics
                    .get_or_init(|| MetaMetrics::register(hive))
                    .clone(),
            },
        }
    }
}

/// The MetaManager actor; see the [module docs](self).
#[derive(Debug)]
pub struct MetaManager {
    ctx: Ctx,
}

impl Actor for MetaManager {
    type Context = Context<Self>;
}

/// What every operation needs; cloned into the handler's futures.
#[derive(Debug, Clone)]
struct Ctx {
    hive: Hive,
    store: MetaStore,
    /// EdgeHub's connection state.
    connection: std::sync::Arc<CloudConnection>,
    remote_query_timeout: Duration,
    metrics: MetaMetrics,
}

/// Where a message's object lives in the `meta` table.
#[derive(Debug, Clone)]
struct Target {
    /// `{ns}/{type}/{name}`, or `{ns}/{type}` for a list.
    key: String,
    /// The type token (`pod`, `configmap`, `k8s/ca.crt`, ...).
    kind: String,
    /// Whether the resource names one object.
    named: bool,
}

/// What a message asks MetaManager to do.
enum Action {
    /// A cloud push to store and ACK.
    Write(Target),
    /// A cloud delete to apply and ACK.
    Delete(Target),
    /// A query: from the cloud when `remote` and connected, else from the database.
    Query { target: Target, remote: bool },
    /// A cloud reply nobody waits for any more (e.g. after a remote query timed out).
    LateReply(Target),
    /// A local module's write that the cloud must see (update, patch), stored first.
    LocalWrite(Target),
    /// A local module's message that only the cloud handles (event, pod delete, insert).
    Forward,
    /// A `node/connection` announcement: meant for extensions; MetaManager follows
    /// [`CloudConnection`].
    Connection(Result<ConnectionState, String>),
    /// A cloud write whose resource names no object the edge could store: refused with an
    /// error reply (counted as `bad_key`), so the cloud hears why it gets no ACK.
    Refuse(&'static str),
    /// Not ours; the reason is logged.
    Ignore(&'static str),
}

fn target_of(resource: &str) -> Result<Target, &'static str> {
    if resource == ResourceType::K8sCaCrt.as_str() {
        return Ok(Target {
            key: resource.to_owned(),
            kind: resource.to_owned(),
            named: true,
        });
    }
    let parsed =
        EdgeResource::parse(resource).map_err(|_| "resource is not {namespace}/{type}[/{name}]")?;
    Ok(Target {
        key: parsed.key(),
        kind: parsed.resource_type.as_str().to_owned(),
        named: parsed.name.is_some(),
    })
}

fn classify(msg: &Message) -> Action {
    let Some(operation) = msg.operation() else {
        return Action::Ignore("no operation");
    };
    if let Some(state) = ConnectionState::of(msg) {
        return Action::Connection(state);
    }
    let from_cloud = matches!(msg.group(), Some(Group::Resource) | Some(Group::Func));
    let cloud_write = from_cloud
        && matches!(
            operation,
            Operation::Insert | Operation::Update | Operation::Delete
        );
    let target = match target_of(msg.resource()) {
        Ok(target) => target,
        Err(reason) if cloud_write => return Action::Refuse(reason),
        Err(reason) => return Action::Ignore(reason),
    };
    let is_event = target.kind == ResourceType::Event.as_str();
    match operation {
        Operation::Query => {
            let remote = is_remote_type(&target.kind);
            Action::Query { target, remote }
        }
        Operation::Response if from_cloud && target.named => Action::LateReply(target),
        Operation::Insert | Operation::Update | Operation::Delete
            if cloud_write && !target.named =>
        {
            Action::Refuse("a write must name an object: {namespace}/{type}/{name}")
        }
        Operation::Insert | Operation::Update | Operation::Delete | Operation::Patch
            if !target.named =>
        {
            Action::Ignore("write without an object name")
        }
        Operation::Insert | Operation::Update if from_cloud => Action::Write(target),
        Operation::Delete if from_cloud => Action::Delete(target),
        _ if from_cloud => Action::Ignore("operation not handled"),
        Operation::Insert | Operation::Update | Operation::Patch if is_event => Action::Forward,
        Operation::Update | Operation::Patch => Action::LocalWrite(target),
        Operation::Insert | Operation::Delete => Action::Forward,
        _ => Action::Ignore("operation not handled"),
    }
}

/// Kinds whose content must be a Kubernetes object (a JSON object with metadata).
const OBJECT_KINDS: [&str; 7] = [
    "pod",
    "configmap",
    "secret",
    "node",
    "device",
    "devicemodel",
    "lease",
];

/// Why the edge cannot use a cloud write of `value` under `target` (reason label, text), or
/// `Ok` when it can: a key with empty, `.` or `..` segments, an object kind whose content is
/// not an object, or an object whose own name is another than the one in the key.
fn unusable(target: &Target, value: &Value) -> Result<(), (&'static str, String)> {
    if target
        .key
        .split('/')
        .any(|part| part == ".." || part == "." || part.is_empty())
    {
        return Err((
            "bad_key",
            "a resource key may not have empty, '.' or '..' segments".into(),
        ));
    }
    if !OBJECT_KINDS.contains(&target.kind.as_str()) {
        return Ok(());
    }
    if !value.is_object() {
        return Err((
            "not_an_object",
            format!("a {} must be a JSON object", target.kind),
        ));
    }
    let name = target.key.rsplit('/').next().unwrap_or_default();
    if let Some(own) = value["metadata"]["name"].as_str() {
        if own != name {
            return Err((
                "name_mismatch",
                format!(
                    "the {} is named {own:?} but stored as {name:?}",
                    target.kind
                ),
            ));
        }
    }
    // A Node has no namespace; every other kind here lives in the namespace of its key.
    let namespace = target.key.split('/').next().unwrap_or_default();
    match value["metadata"]["namespace"].as_str() {
        Some(own) if target.kind != "node" && own != namespace => Err((
            "namespace_mismatch",
            format!(
                "the {} is in namespace {own:?} but stored under {namespace:?}",
                target.kind
            ),
        )),
        _ => Ok(()),
    }
}

/// Device objects go on to DeviceTwin after they are stored.
fn is_device_object(msg: &Message, kind: &str) -> bool {
    msg.source() == Some(&ModuleName::DeviceController)
        && (kind == ResourceType::Device.as_str() || kind == ResourceType::DeviceModel.as_str())
}

impl Handler<Envelope> for MetaManager {
    type Result = ResponseFuture<Option<Message>>;

    /// Store calls are issued in mailbox order: each future reaches the store's FIFO channel
    /// on its first poll, and the arbiter polls new futures in spawn order. Futures run
    /// concurrently, so a remote query waiting for the cloud blocks nothing else.
    fn handle(&mut self, envelope: Envelope, _: &mut Context<Self>) -> Self::Result {
        let ctx = self.ctx.clone();
        let msg = envelope.message();
        match classify(msg) {
            Action::Write(target) => Box::pin(async move {
                ctx.write(envelope.message(), target).await;
                None
            }),
            Action::Delete(target) => Box::pin(async move {
                ctx.delete(envelope.message(), target).await;
                None
            }),
            Action::Query { target, remote } => Box::pin(async move {
                let msg = envelope.message();
                if remote && ctx.connected() {
                    if let Some(reply) = ctx.remote(msg, &target).await {
                        return Some(reply);
                    }
                    ctx.metrics.remote_fallbacks.inc();
                }
                Some(ctx.query(msg, &target).await)
            }),
            Action::LateReply(target) => Box::pin(async move {
                ctx.late_reply(envelope.message(), &target).await;
                None
            }),
            Action::LocalWrite(target) => {
                Box::pin(async move { Some(ctx.local_write(envelope.message(), &target).await) })
            }
            Action::Forward => Box::pin(async move {
                let msg = envelope.message();
                if !ctx.connected() {
                    return Some(error_reply(msg, "connection lost"));
                }
                ctx.to_cloud(msg).await;
                None
            }),
            Action::Connection(state) => {
                self.ctx.metrics.ignored.inc();
                tracing::debug!(
                    ?state,
                    "node/connection ignored; metamanager follows edgehub's connection state"
                );
                Box::pin(async { None })
            }
            Action::Refuse(reason) => {
                let ctx = self.ctx.clone();
                Box::pin(async move {
                    let msg = envelope.message();
                    ctx.refuse(msg, msg.resource(), "bad_key", reason).await;
                    None
                })
            }
            Action::Ignore(reason) => {
                self.ctx.metrics.ignored.inc();
                tracing::debug!(
                    id = msg.id(),
                    operation = ?msg.operation().map(Operation::as_str),
                    resource = msg.resource(),
                    reason,
                    "metamanager ignores message"
                );
                Box::pin(async { None })
            }
        }
    }
}

impl Ctx {
    /// Whether EdgeHub is connected to the cloud now.
    fn connected(&self) -> bool {
        self.connection.current().is_connected()
    }

    /// Refuses a cloud write the edge cannot use: counted by `reason`, answered with an error
    /// saying why instead of the ACK.
    async fn refuse(&self, msg: &Message, key: &str, reason: &str, text: &str) {
        tracing::warn!(key = %key.chars().take(256).collect::<String>(), reason, "cloud write refused: {text}");
        self.metrics
            .refused
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
        let refusal = Message::error_to(msg, text.to_owned());
        self.to_cloud(&refusal).await;
    }

    /// Stores a cloud push, hands device objects to twin, then ACKs. Nothing is ACKed unless
    /// everything was committed; the cloud then resends and the retry is idempotent.
    async fn write(&self, msg: &Message, target: Target) {
        let value = msg.content_json().unwrap_or_else(|_| msg.content.clone());
        if let Err((reason, text)) = unusable(&target, &value) {
            self.refuse(msg, &target.key, reason, &text).await;
            return;
        }
        let stored = self
            .store
            .upsert(target.key.clone(), target.kind.clone(), value)
            .await;
        match stored {
            Ok(Upsert::Written) => {
                self.metrics.written.inc();
            }
            Ok(Upsert::Stale { stored_rv }) => {
                self.metrics.stale.inc();
                tracing::debug!(key = target.key, stored_rv, "kept newer stored object");
            }
            Err(error) => return self.store_failed(&target.key, &error),
        }
        if is_device_object(msg, &target.kind) && !self.to_twin(msg).await {
            return;
        }
        self.ack(msg).await;
    }

    /// Applies a cloud delete; an object is only deleted if the stored one has the UID the
    /// cloud names (when it names one), so a late delete of an old object cannot remove its
    /// same-named successor.
    async fn delete(&self, msg: &Message, target: Target) {
        let deleted = if target.kind == ResourceType::Pod.as_str() {
            self.store
                .delete_pod_with_uid(target.key.clone(), pod_uid(msg))
                .await
        } else {
            self.store
                .delete_with_uid(target.key.clone(), pod_uid(msg))
                .await
        };
        match deleted {
            Ok(_) => {
                self.metrics.deletes.inc();
            }
            Err(error) => return self.store_failed(&target.key, &error),
        }
        if is_device_object(msg, &target.kind) && !self.to_twin(msg).await {
            return;
        }
        self.ack(msg).await;
    }

    /// Hands a device object to the twin group and waits for it to be committed there.
    /// `true` when done or when no twin runs (the object is stored; nothing else to do).
    async fn to_twin(&self, msg: &Message) -> bool {
        let Some(twin) = self.hive.group_members(TWIN_GROUP).into_iter().next() else {
            return true;
        };
        match self.hive.request(&twin, msg.clone(), TWIN_TIMEOUT).await {
            Ok(reply) if reply.operation() != Some(&Operation::Error) => true,
            Ok(reply) => {
                tracing::warn!(resource = msg.resource(), error = %reply.content, "twin refused a device object; not acknowledged");
                false
            }
            Err(error) => {
                tracing::warn!(resource = msg.resource(), %error, "twin did not take a device object; not acknowledged");
                false
            }
        }
    }

    fn store_failed(&self, key: &str, error: &StoreError) {
        self.metrics.store_errors.inc();
        tracing::error!(key, %error, "edge database write failed; not acknowledged, the cloud will resend");
    }

    /// Acknowledges a stored cloud message through edgehub. If edgehub cannot take it, the
    /// ACK is lost and the cloud resends the object, whose second write is idempotent.
    async fn ack(&self, msg: &Message) {
        let mut reply = Message::response_to(msg, json!("OK"));
        // A real v1.22 edge ACKs device and devicemodel inserts and deletes as source "meta",
        // group "twin" (golden frames); updates keep the request's route.
        let kind = target_of(msg.resource()).map(|target| target.kind);
        if matches!(msg.operation(), Some(Operation::Insert | Operation::Delete))
            && kind.is_ok_and(|kind| is_device_object(msg, &kind))
        {
            reply.route.source = Some(ModuleName::Meta);
            reply.route.group = Some(Group::Twin);
        }
        self.to_cloud(&reply).await;
    }

    async fn to_cloud(&self, msg: &Message) {
        if let Err(error) = send_with_retry(&self.hive, HUB_MODULE, msg).await {
            tracing::warn!(id = msg.id(), resource = msg.resource(), %error, "message not handed to edgehub");
        }
    }

    /// Asks the cloud; stores what it answers; ACKs the answer; returns it re-parented to the
    /// original request. `None` when the cloud did not answer in time (the caller serves the
    /// stored copy).
    async fn remote(&self, msg: &Message, target: &Target) -> Option<Message> {
        let mut ask = msg.clone();
        ask.header.id = uuid::Uuid::new_v4().to_string();
        ask.header.parent_id.clear();
        ask.header.timestamp = Message::keepalive().header.timestamp;
        // EdgeHub times the request out itself (its request timeout is this one) and forgets
        // it before answering, so a reply that arrives later is routed to MetaManager and
        // still stored and ACKed. The call's own deadline is only a backstop, a little later:
        // were it first, as it was when both timers had the same length, a reply arriving in
        // between went to EdgeHub's waiter for a caller already gone, and was lost.
        let call = request_cloud(
            &self.hive,
            ask,
            self.remote_query_timeout + REMOTE_CALL_MARGIN,
        );
        let reply = match call.await {
            Ok(reply) => reply,
            Err(CloudRequestError::Cloud(error)) => {
                tracing::info!(resource = msg.resource(), %error, "remote query failed; serving the stored copy");
                return None;
            }
            Err(CloudRequestError::Hub(error)) => {
                tracing::info!(resource = msg.resource(), %error, "edgehub unavailable; serving the stored copy");
                return None;
            }
        };
        self.metrics.remote_queries.inc();
        self.store_reply(&reply, target).await;
        // The cloud resends ACK-required replies (configmap, secret) until acknowledged.
        self.to_cloud(&Message::response_to(&reply, json!("OK")))
            .await;
        let mut answer = reply;
        answer.header.parent_id = msg.id().to_owned();
        Some(answer)
    }

    /// Stores the object a cloud reply carries, if any, under the query's key.
    async fn store_reply(&self, reply: &Message, target: &Target) {
        if !target.named {
            return;
        }
        if let ReplyContent::Object(value) = read_reply(reply, &target.kind) {
            match self
                .store
                .upsert(target.key.clone(), target.kind.clone(), value)
                .await
            {
                Ok(Upsert::Written) => {
                    self.metrics.written.inc();
                }
                Ok(Upsert::Stale { .. }) => {
                    self.metrics.stale.inc();
                }
                Err(error) => {
                    self.metrics.store_errors.inc();
                    tracing::error!(key = target.key, %error, "could not store a remote query answer");
                }
            }
        }
    }

    /// A reply that arrived after its requester gave up: still worth storing, and the cloud
    /// still wants its ACK (a plain `"OK"` needs none).
    async fn late_reply(&self, msg: &Message, target: &Target) {
        if msg.content_str() == Some("OK") {
            return;
        }
        self.store_reply(msg, target).await;
        self.to_cloud(&Message::response_to(msg, json!("OK"))).await;
    }

    /// A local module's update or patch: stored, then sent to the cloud; without a connection
    /// the caller is told at once (KubeEdge's "connection lost").
    async fn local_write(&self, msg: &Message, target: &Target) -> Message {
        let value = msg.content_json().unwrap_or_else(|_| msg.content.clone());
        if let Err(error) = self
            .store
            .upsert(target.key.clone(), target.kind.clone(), value)
            .await
        {
            self.metrics.store_errors.inc();
            return error_reply(msg, &error.to_string());
        }
        if msg.operation() == Some(&Operation::Patch) && !self.connected() {
            return error_reply(msg, "connection lost");
        }
        self.to_cloud(msg).await;
        let mut reply = Message::response_to(msg, json!("OK"));
        reply.route.source = Some(ModuleName::MetaManager);
        reply
    }

    /// Answers a query from the database: KubeEdge's reply content is a JSON array of the
    /// stored objects, each as a JSON string. A list is by type only (KubeEdge ignores the
    /// namespace).
    async fn query(&self, msg: &Message, target: &Target) -> Message {
        let rows = if target.named {
            self.store
                .get(target.key.clone())
                .await
                .map(|row| row.into_iter().collect::<Vec<_>>())
        } else {
            self.store.list(Some(target.kind.clone())).await
        };
        match rows {
            Ok(rows) => {
                let values: Vec<Value> = rows
                    .iter()
                    .map(|row| Value::String(row.value.to_string()))
                    .collect();
                let mut reply = Message::response_to(msg, Value::Array(values));
                reply.route.source = Some(ModuleName::MetaManager);
                reply
            }
            Err(error) => {
                self.metrics.store_errors.inc();
                tracing::error!(resource = msg.resource(), %error, "edge database query failed");
                error_reply(msg, &error.to_string())
            }
        }
    }
}

/// KubeEdge's error reply: operation `error`, source `metamanager`, the request's group.
fn error_reply(msg: &Message, text: &str) -> Message {
    let mut reply = Message::error_to(msg, text);
    reply.route.source = Some(ModuleName::MetaManager);
    reply.route.group = msg.group().cloned();
    reply
}

/// The UID a pod delete names: `metadata.uid` of the object, or the content itself when it is
/// a bare UID string.
fn pod_uid(msg: &Message) -> Option<String> {
    match &msg.content {
        Value::String(text) if !text.is_empty() && !text.starts_with('{') => Some(text.clone()),
        _ => msg
            .content_json()
            .ok()?
            .pointer("/metadata/uid")?
            .as_str()
            .map(str::to_owned),
    }
}
