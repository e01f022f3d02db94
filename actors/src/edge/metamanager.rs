//! MetaManager (module `metamanager`, group `meta`): the edge's copy of cloud objects.
//!
//! Objects pushed by the cloud are written to SQLite and only then acknowledged, so an ACK
//! the cloud sees means the object survives an edge restart. Local modules query the same
//! table, which keeps cloud data readable while the edge is offline. Queries for the types in
//! `REMOTE_TYPES` go to the cloud while connected (the answer
//! is stored, then the cloud's reply is acknowledged) and fall back to the stored copy when
//! disconnected or when the cloud does not answer within `remoteQueryTimeout`.
//! Device and DeviceModel objects are stored, then handed to the `twin` group; the ACK waits
//! for twin to commit them too. Whether the cloud is connected is EdgeHub's
//! [`CloudConnection`], read at each decision.
//!
//! It takes `MetaRequest`s, typed by EdgeHub from the cloud's messages (or from an
//! extension's envelope, with the same function), and sends the cloud `ToCloud` through
//! EdgeHub by name; it never reads or builds a beehive message itself.

use std::sync::OnceLock;
use std::time::Duration;

use actix::{Actor, Context, Handler, ResponseFuture};
use edgehive_protocols::{Message, ResourceType};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use serde_json::Value;

use super::contract::{
    ask_cloud, route, Ask, CloudConnection, CloudObject, CloudReply, CloudRequestError, LocalReply,
    LocalWrite, MetaRequest, Origin, Query, Target, ToCloud, TwinMessage, TwinReply,
};
use super::deliver::tell_with_retry;
use super::remote::{read_reply, ReplyContent};
use super::store::{MetaStore, StoreError, Upsert};
use crate::hive::{Accepts, Envelope, Hive, HiveError, Module};

/// beehive name of the module.
pub const MODULE_NAME: &str = route::METAMANAGER;
/// beehive group of the module.
pub(crate) const GROUP: &str = route::META_GROUP;
/// The module ACKs are sent to (edgehub).
const HUB_MODULE: &str = route::EDGEHUB;
/// The module Device and DeviceModel objects are handed to (DeviceTwin).
const TWIN_MODULE: &str = route::TWIN;
/// KubeEdge's default `remoteQueryTimeout`.
pub(crate) const DEFAULT_REMOTE_QUERY_TIMEOUT: Duration = Duration::from_secs(60);
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

    fn accepts(&self, accepts: &mut Accepts<MetaManager>) {
        accepts.message::<MetaRequest>();
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

impl Handler<MetaRequest> for MetaManager {
    type Result = ResponseFuture<Option<LocalReply>>;

    /// Store calls are issued in mailbox order: each future reaches the store's FIFO channel
    /// on its first poll, and the arbiter polls new futures in spawn order. Futures run
    /// concurrently, so a remote query waiting for the cloud blocks nothing else.
    fn handle(&mut self, request: MetaRequest, _: &mut Context<Self>) -> Self::Result {
        self.ctx.clone().serve(request)
    }
}

impl Handler<Envelope> for MetaManager {
    type Result = ResponseFuture<Option<Message>>;

    /// An extension module's message: typed as EdgeHub types the cloud's, then served alike.
    fn handle(&mut self, envelope: Envelope, _: &mut Context<Self>) -> Self::Result {
        let served = self
            .ctx
            .clone()
            .serve(MetaRequest::from_message(envelope.into_message()));
        Box::pin(async move { served.await.map(LocalReply::into_message) })
    }
}

impl Ctx {
    /// Serves one request; the reply goes to a local requester.
    fn serve(self, request: MetaRequest) -> ResponseFuture<Option<LocalReply>> {
        let ctx = self;
        match request {
            MetaRequest::Store(object) => Box::pin(async move {
                ctx.write(object).await;
                None
            }),
            MetaRequest::Delete(object) => Box::pin(async move {
                ctx.delete(object).await;
                None
            }),
            MetaRequest::Query(query) => Box::pin(async move {
                if query.remote && ctx.connected() {
                    if let Some(reply) = ctx.remote(&query).await {
                        return Some(reply);
                    }
                    ctx.metrics.remote_fallbacks.inc();
                }
                Some(ctx.query(query).await)
            }),
            MetaRequest::LateReply { target, reply } => Box::pin(async move {
                ctx.late_reply(reply, &target).await;
                None
            }),
            MetaRequest::LocalWrite(write) => {
                Box::pin(async move { Some(ctx.local_write(write).await) })
            }
            MetaRequest::Forward(origin) => Box::pin(async move {
                if !ctx.connected() {
                    return Some(LocalReply::Error {
                        of: origin,
                        text: "connection lost".into(),
                    });
                }
                ctx.to_cloud(ToCloud::Forward(origin)).await;
                None
            }),
            MetaRequest::Connection(state) => {
                ctx.metrics.ignored.inc();
                tracing::debug!(
                    ?state,
                    "node/connection ignored; metamanager follows edgehub's connection state"
                );
                Box::pin(async { None })
            }
            MetaRequest::Refuse { reason, origin } => Box::pin(async move {
                let key = origin.resource().to_owned();
                ctx.refuse(origin, &key, "bad_key", reason).await;
                None
            }),
            MetaRequest::Ignore { reason, origin } => {
                ctx.metrics.ignored.inc();
                tracing::debug!(
                    id = origin.id(),
                    operation = origin.operation(),
                    resource = origin.resource(),
                    reason,
                    "metamanager ignores message"
                );
                Box::pin(async { None })
            }
        }
    }

    /// Whether EdgeHub is connected to the cloud now.
    fn connected(&self) -> bool {
        self.connection.current().is_connected()
    }

    /// Refuses a cloud write the edge cannot use: counted by `reason`, answered with an error
    /// saying why instead of the ACK.
    async fn refuse(&self, of: Origin, key: &str, reason: &str, text: &str) {
        tracing::warn!(key = %key.chars().take(256).collect::<String>(), reason, "cloud write refused: {text}");
        self.metrics
            .refused
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
        self.to_cloud(ToCloud::Refuse {
            of,
            text: text.to_owned(),
        })
        .await;
    }

    /// Stores a cloud push, hands device objects to twin, then ACKs. Nothing is ACKed unless
    /// everything was committed; the cloud then resends and the retry is idempotent.
    async fn write(&self, object: CloudObject) {
        let target = &object.target;
        if let Err((reason, text)) = unusable(target, &object.value) {
            let key = target.key.clone();
            self.refuse(object.origin, &key, reason, &text).await;
            return;
        }
        let stored = self
            .store
            .upsert(
                target.key.clone(),
                target.kind.clone(),
                object.value.clone(),
            )
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
        if object.device && !self.to_twin(&object, false).await {
            return;
        }
        self.to_cloud(ToCloud::Ack(object.origin)).await;
    }

    /// Applies a cloud delete; an object is only deleted if the stored one has the UID the
    /// cloud names (when it names one), so a late delete of an old object cannot remove its
    /// same-named successor.
    async fn delete(&self, object: CloudObject) {
        let target = &object.target;
        let deleted = self
            .store
            .delete_object(
                target.key.clone(),
                object.uid.clone(),
                target.kind == ResourceType::Pod.as_str(),
                object.value.clone(),
            )
            .await;
        match deleted {
            Ok(_) => {
                self.metrics.deletes.inc();
            }
            Err(error) => return self.store_failed(&target.key, &error),
        }
        if object.device && !self.to_twin(&object, true).await {
            return;
        }
        self.to_cloud(ToCloud::Ack(object.origin)).await;
    }

    /// Hands a device object to DeviceTwin and waits for it to be committed there. `true`
    /// when done or when no twin runs (the object is stored; nothing else to do).
    async fn to_twin(&self, object: &CloudObject, delete: bool) -> bool {
        let message = TwinMessage::device(object, delete);
        let resource = object.origin.resource();
        match self.hive.ask(TWIN_MODULE, message, TWIN_TIMEOUT).await {
            Ok(Some(reply)) if reply.is_done() => true,
            Ok(Some(TwinReply::Failed { text, .. })) => {
                tracing::warn!(resource, error = %text, "twin refused a device object; not acknowledged");
                false
            }
            Ok(_) => true,
            Err(HiveError::UnknownModule(_)) => true,
            Err(error) => {
                tracing::warn!(resource, %error, "twin did not take a device object; not acknowledged");
                false
            }
        }
    }

    fn store_failed(&self, key: &str, error: &StoreError) {
        self.metrics.store_errors.inc();
        tracing::error!(key, %error, "edge database write failed; not acknowledged, the cloud will resend");
    }

    /// Hands `message` to EdgeHub. If EdgeHub cannot take it, an ACK is lost and the cloud
    /// resends the object, whose second write is idempotent.
    async fn to_cloud(&self, message: ToCloud) {
        if let Err((error, message)) = tell_with_retry(&self.hive, HUB_MODULE, message).await {
            tracing::warn!(?message, %error, "message not handed to edgehub");
        }
    }

    /// Asks the cloud; stores what it answers; ACKs the answer; returns it re-parented to the
    /// original request. `None` when the cloud did not answer in time (the caller serves the
    /// stored copy).
    async fn remote(&self, query: &Query) -> Option<LocalReply> {
        let resource = query.origin.resource();
        // EdgeHub times the request out itself (its request timeout is this one) and forgets
        // it before answering, so a reply that arrives later is routed to MetaManager and
        // still stored and ACKed. The call's own deadline is only a backstop, a little later:
        // were it first, as it was when both timers had the same length, a reply arriving in
        // between went to EdgeHub's waiter for a caller already gone, and was lost.
        let call = ask_cloud(
            &self.hive,
            Ask::Query(query.origin.clone()),
            self.remote_query_timeout + REMOTE_CALL_MARGIN,
        );
        let reply = match call.await {
            Ok(reply) => reply,
            Err(CloudRequestError::Cloud(error)) => {
                tracing::info!(resource, %error, "remote query failed; serving the stored copy");
                return None;
            }
            Err(CloudRequestError::Hub(error)) => {
                tracing::info!(resource, %error, "edgehub unavailable; serving the stored copy");
                return None;
            }
        };
        self.metrics.remote_queries.inc();
        self.store_reply(&reply, &query.target).await;
        // The cloud resends ACK-required replies (configmap, secret) until acknowledged.
        self.to_cloud(ToCloud::Ack(reply.origin())).await;
        Some(LocalReply::Remote {
            of: query.origin.clone(),
            reply: Box::new(reply),
        })
    }

    /// Stores the object a cloud reply carries, if any, under the query's key.
    async fn store_reply(&self, reply: &CloudReply, target: &Target) {
        if !target.named() {
            return;
        }
        if let ReplyContent::Object(value) = read_reply(reply.content(), &target.kind) {
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
    async fn late_reply(&self, reply: CloudReply, target: &Target) {
        if reply.is_ok_text() {
            return;
        }
        self.store_reply(&reply, target).await;
        self.to_cloud(ToCloud::Ack(reply.origin())).await;
    }

    /// A local module's update or patch: stored, then sent to the cloud; without a connection
    /// the caller is told at once (KubeEdge's "connection lost").
    async fn local_write(&self, write: LocalWrite) -> LocalReply {
        let target = &write.target;
        if let Err(error) = self
            .store
            .upsert(target.key.clone(), target.kind.clone(), write.value.clone())
            .await
        {
            self.metrics.store_errors.inc();
            return LocalReply::Error {
                of: write.origin,
                text: error.to_string(),
            };
        }
        if write.patch && !self.connected() {
            return LocalReply::Error {
                of: write.origin,
                text: "connection lost".into(),
            };
        }
        self.to_cloud(ToCloud::Forward(write.origin.clone())).await;
        LocalReply::Done(write.origin)
    }

    /// Answers a query from the database: KubeEdge's reply content is a JSON array of the
    /// stored objects, each as a JSON string. A list is by type only (KubeEdge ignores the
    /// namespace).
    async fn query(&self, query: Query) -> LocalReply {
        let target = &query.target;
        let rows = if target.named() {
            self.store
                .get(target.key.clone())
                .await
                .map(|row| row.into_iter().collect::<Vec<_>>())
        } else {
            self.store.list(Some(target.kind.clone())).await
        };
        match rows {
            Ok(rows) => LocalReply::Rows {
                of: query.origin,
                values: rows.into_iter().map(|row| row.value).collect(),
            },
            Err(error) => {
                self.metrics.store_errors.inc();
                tracing::error!(resource = query.origin.resource(), %error, "edge database query failed");
                LocalReply::Error {
                    of: query.origin,
                    text: error.to_string(),
                }
            }
        }
    }
}
