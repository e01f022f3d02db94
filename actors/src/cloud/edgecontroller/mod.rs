//! EdgeController (module `edgecontroller`, group `edgecontroller`): the cluster's side of
//! KubeEdge's edge nodes.
//!
//! - `downstream`: pods, ConfigMaps, Secrets and Nodes from the cluster's watches become
//!   messages for the edge nodes that need them (`location` decides which ConfigMaps and
//!   Secrets go where).
//! - `upstream`: what edges send (node and pod status, queries, leases, events, ...) becomes
//!   a typed `EdgeRequest`, run against the cluster with a concurrency limit per kind, and
//!   answered the way KubeEdge answers.
//!
//! The controller reads and writes the cluster only through the [`ClusterPort`](crate::cloud::cluster::ClusterPort), so it runs
//! the same on the embedded cluster and on a real API server.

mod downstream;
pub(crate) mod location;
mod upstream;

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use edgehive_protocols::Message;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::Semaphore;

use crate::cloud::cluster::SharedCluster;
use crate::cloud::contract::{ResyncNode, StoreSeen};
use crate::cloud::outbox::{deliver_reply, offer_message, Outbox};
use crate::cloud::watcher::WatchMetrics;
use crate::hive::{Accepts, Envelope, Hive, Module};
use downstream::{StoreNote, Watcher};
pub use upstream::Request;
pub(crate) use upstream::{EdgeRequest, ParseError, RequestKind, Unparsed};

/// The module name.
pub(crate) const EDGECONTROLLER_MODULE: &str = crate::cloud::contract::route::EDGECONTROLLER;
/// The module group.
pub(crate) const EDGECONTROLLER_GROUP: &str = crate::cloud::contract::route::EDGECONTROLLER;

/// Requests of one kind that may wait for a worker. Overflow policy: a request beyond it is
/// refused at once, answered with an error text (when its kind is answered) and counted with
/// outcome `busy`; the edge retries as it does after any error.
pub(crate) const WAITING_CAPACITY: usize = 1024;

/// Labels of `edgehive_edgecontroller_requests_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    /// The request kind ([`RequestKind::as_str`]).
    pub kind: String,
    /// `ok`, `error`, `busy`, `malformed`.
    pub outcome: String,
}

/// EdgeController's metrics.
#[derive(Debug, Clone, Default)]
struct Metrics {
    unhandled: Counter,
    sent: Counter,
    overflow: Counter,
    requests: Family<RequestLabels, Counter>,
}

impl Metrics {
    fn request(&self, kind: RequestKind, outcome: &str) {
        self.requests
            .get_or_create(&RequestLabels {
                kind: kind.as_str().into(),
                outcome: outcome.into(),
            })
            .inc();
    }
}

/// The per-kind limits: workers running, and room to wait for one.
#[derive(Debug, Clone)]
struct Limit {
    workers: Arc<Semaphore>,
    waiting: Arc<Semaphore>,
}

/// EdgeController's module recipe.
pub struct EdgeControllerModule {
    cluster: SharedCluster,
    metrics: Metrics,
    limits: Arc<HashMap<RequestKind, Limit>>,
    node_updates: bool,
}

impl From<crate::cloud::cluster::EmbeddedCluster> for SharedCluster {
    fn from(cluster: crate::cloud::cluster::EmbeddedCluster) -> Self {
        Arc::new(cluster)
    }
}

impl EdgeControllerModule {
    /// A recipe on `cluster`; registers the module's metrics with `hive` (one per hive).
    pub fn new(hive: &Hive, cluster: impl Into<SharedCluster>) -> Self {
        let metrics = Metrics::default();
        let registry = hive.metrics();
        registry.register(
            "edgehive_edgecontroller_unhandled",
            "Upstream messages EdgeController does not handle (logged and dropped, as in KubeEdge)",
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
        registry.register(
            "edgehive_edgecontroller_requests",
            "Edge requests by kind and outcome (ok, error, busy, malformed)",
            metrics.requests.clone(),
        );
        let limits = RequestKind::ALL
            .into_iter()
            .map(|kind| {
                (
                    kind,
                    Limit {
                        workers: Arc::new(Semaphore::new(kind.workers())),
                        waiting: Arc::new(Semaphore::new(WAITING_CAPACITY)),
                    },
                )
            })
            .collect();
        EdgeControllerModule {
            cluster: cluster.into(),
            metrics,
            limits: Arc::new(limits),
            node_updates: false,
        }
    }

    /// Whether edge nodes are sent their Node object on Added/Modified (KubeEdge HEAD) or
    /// not (v1.22.0, the default).
    pub fn with_node_updates(mut self, on: bool) -> Self {
        self.node_updates = on;
        self
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
            limits: self.limits.clone(),
            node_updates: self.node_updates,
            resync: None,
        }
    }

    fn accepts(&self, accepts: &mut Accepts<EdgeController>) {
        accepts
            .message::<EdgeRequest>()
            .message::<Unparsed>()
            .message::<ResyncNode>()
            .message::<StoreSeen>();
    }
}

/// The EdgeController actor; see the [module docs](self).
pub struct EdgeController {
    hive: Hive,
    cluster: SharedCluster,
    metrics: Metrics,
    limits: Arc<HashMap<RequestKind, Limit>>,
    node_updates: bool,
    /// Nodes whose store was replaced (for the watch loop to send everything again) or seen
    /// for the first time (to compare with the Node's record).
    resync: Option<tokio::sync::mpsc::Sender<StoreNote>>,
}

impl Actor for EdgeController {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let outbox = Outbox::new(
            self.hive.clone(),
            self.metrics.sent.clone(),
            self.metrics.overflow.clone(),
        );
        let (resync, resyncs) = tokio::sync::mpsc::channel(RESYNC_CAPACITY);
        self.resync = Some(resync);
        let watcher = Watcher::new(
            self.hive.clone(),
            self.cluster.clone(),
            outbox,
            self.node_updates,
        );
        let metrics = WatchMetrics::of(&self.hive);
        ctx.spawn(actix::fut::wrap_future(watcher.run(resyncs, metrics)));
    }
}

impl EdgeController {
    fn send(&self, message: Message) {
        if let Err(lost) = offer_message(&self.hive, &self.metrics.sent, message) {
            // A reply is not kept: the edge's request times out and is asked again.
            tracing::warn!(
                resource = lost.message.resource(),
                "cloudhub unavailable; reply dropped"
            );
            self.metrics.overflow.inc();
        }
    }
}

impl Handler<Envelope> for EdgeController {
    type Result = Option<Message>;

    /// Beehive messages from extensions: typed here, as CloudHub types what edges send.
    fn handle(&mut self, envelope: Envelope, ctx: &mut Context<Self>) -> Option<Message> {
        match EdgeRequest::from_message(envelope.into_message()) {
            Ok(request) => self.handle(request, ctx),
            Err(unparsed) => self.handle(*unparsed, ctx),
        }
        None
    }
}

/// Nodes waiting to be sent everything again or to have their store checked. Overflow
/// policy: a note beyond it is logged and dropped (the node is not resent until its store
/// changes again, or checked until the next cloud start): a bound no edge can reach by
/// reconnecting, as each node sends at most one note per store change and cloud start.
const RESYNC_CAPACITY: usize = 4096;

impl EdgeController {
    fn note_store(&self, note: StoreNote) {
        let Some(resync) = &self.resync else { return };
        if let Err(error) = resync.try_send(note) {
            tracing::warn!(%error, "cannot queue a node's store note");
        }
    }
}

impl Handler<ResyncNode> for EdgeController {
    type Result = ();

    fn handle(&mut self, ResyncNode { node, store_id }: ResyncNode, _: &mut Context<Self>) {
        self.note_store(StoreNote::Resync { node, store_id });
    }
}

impl Handler<StoreSeen> for EdgeController {
    type Result = ();

    fn handle(&mut self, StoreSeen { node, store_id }: StoreSeen, _: &mut Context<Self>) {
        self.note_store(StoreNote::Seen { node, store_id });
    }
}

impl Handler<Unparsed> for EdgeController {
    type Result = ();

    fn handle(&mut self, Unparsed { message, error }: Unparsed, _: &mut Context<Self>) {
        match &error {
            ParseError::Unhandled(what) => {
                tracing::debug!(resource = message.resource(), %what, "upstream message not handled");
                self.metrics.unhandled.inc();
            }
            ParseError::Malformed { kind, .. } => {
                tracing::warn!(resource = message.resource(), %error, "malformed edge request");
                self.metrics.request(*kind, "malformed");
                if *kind != RequestKind::Event {
                    self.send(upstream::reply_on(
                        &message,
                        message.resource().to_owned(),
                        serde_json::Value::String(error.to_string()),
                    ));
                }
            }
        }
    }
}

impl Handler<EdgeRequest> for EdgeController {
    type Result = ();

    fn handle(&mut self, request: EdgeRequest, ctx: &mut Context<Self>) {
        let kind = request.kind();
        let Some(limit) = self.limits.get(&kind).cloned() else {
            return;
        };
        let Ok(waiting) = limit.waiting.try_acquire_owned() else {
            tracing::warn!(kind = kind.as_str(), "too many waiting requests; refused");
            self.metrics.request(kind, "busy");
            if request.expects_reply() {
                self.send(request.reply(serde_json::Value::String(format!(
                    "edgecontroller busy: more than {WAITING_CAPACITY} {} requests waiting",
                    kind.as_str()
                ))));
            }
            return;
        };
        let cluster = self.cluster.clone();
        let hive = self.hive.clone();
        let metrics = self.metrics.clone();
        ctx.spawn(actix::fut::wrap_future(async move {
            let Ok(_worker) = limit.workers.acquire_owned().await else {
                return; // the semaphore is never closed
            };
            drop(waiting);
            let resource = request.message.resource().to_owned();
            let outcome = request.execute(cluster).await;
            let failed = outcome.error.is_some()
                || outcome
                    .reply
                    .as_ref()
                    .is_some_and(|reply| reply.content_str() != Some("OK") && is_error(reply));
            if let Some(error) = &outcome.error {
                tracing::warn!(%resource, %error, "edge request failed");
            }
            metrics.request(kind, if failed { "error" } else { "ok" });
            for message in outcome.reply.into_iter().chain(outcome.extra) {
                if !deliver_reply(&hive, &metrics.sent, message).await {
                    tracing::warn!(%resource, "cloudhub unavailable; reply dropped");
                    metrics.overflow.inc();
                }
            }
        }));
    }
}

/// Whether a reply reports a failure (error text, a status, or an ObjectResp with Err).
fn is_error(reply: &Message) -> bool {
    match &reply.content {
        serde_json::Value::String(text) => text != "OK",
        content => content.get("ErrStatus").is_some() || !content["Err"].is_null(),
    }
}
