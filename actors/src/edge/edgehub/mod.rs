//! EdgeHub (module `websocket`, group `hub`): the edge's WebSocket link to CloudHub.
//!
//! One async task, owned by the actor's context, dials the cloud, then serves the connection:
//! it reads cloud frames and routes them to the edge modules, writes the heartbeat, and drains
//! the outbox of messages the modules sent to `websocket`. It publishes the connection state
//! ([`CloudConnection`], the edge's one copy, which the modules follow) and tells extension
//! modules with `node/connection`; when the connection ends it waits a jittered, doubling
//! backoff and dials again.
//!
//! It types each cloud message once, on entry, for the built-in modules (the contract's
//! [`MetaRequest`](crate::edge::contract::MetaRequest),
//! [`TwinMessage`](crate::edge::contract::TwinMessage), a waiter's reply), and builds the
//! beehive message of what they send up ([`ToCloud`], [`CloudAsk`]). Modules reach it by name
//! with those typed messages ([`GetEdgeHubStatus`] too), never by its actor type; extension
//! modules may still send it envelopes and ask with [`CloudRequest`].
//!
//! What must survive a restart of the actor (the outbox, pending cloud requests, counters)
//! lives in [`EdgeHubModule`], so a restarted EdgeHub resends what was still queued.
//!
//! With [`EdgeHubOptions::tls`] set, the link is `wss://` with the node's client certificate,
//! which [`certmanager`](super::certmanager) loads or bootstraps with the join token before the
//! first dial; without it the link is plain `ws://` (explicitly insecure configs and tests).
//! Module messages go up through a token bucket (`messageQPS`, `messageBurst`), as in
//! KubeEdge; keepalives and ACK-less control frames are not throttled.
//!
//! - [`options`]: its settings; `link`: the dial–serve–reconnect loop; `bucket`: the
//!   upstream rate limit.

mod bucket;
mod link;
pub mod options;

use link::Link;
pub use options::{events_url, EdgeHubOptions};

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use actix::{Actor, AsyncContext, Context, Handler, MessageResult};
use edgehive_protocols::{Message, Operation};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{oneshot, Notify};

use crate::edge::certmanager::EdgeIdentity;
use crate::edge::contract::{route, CloudConnection, ConnectionState};
pub use crate::edge::contract::{
    CloudAsk, CloudRequest, EdgeHubError, EdgeHubStatus, GetEdgeHubStatus, PendingReply, ToCloud,
};
use crate::edge::deliver::send_with_retry;
use crate::hive::locks::lock;
use crate::hive::{Accepts, Envelope, Hive, Module};

/// beehive name of the module.
pub const MODULE_NAME: &str = route::EDGEHUB;
/// beehive group of the module.
pub const GROUP: &str = route::EDGEHUB_GROUP;
/// KubeEdge's default `projectID`.
pub const DEFAULT_PROJECT_ID: &str = "e632aba927ea4ac2b575ec1603d56f10";
/// How long the WebSocket handshake may take (edgehub's `handshakeTimeout`).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one frame write may take before the connection is considered dead
/// (edgehub's `writeDeadline`).
const WRITE_TIMEOUT: Duration = Duration::from_secs(15);
/// Shortest wait between dials, whatever the options say, so a zero setting cannot spin.
const MIN_RECONNECT: Duration = Duration::from_millis(10);
/// Most requests to the cloud awaiting a reply at once; more are refused at once.
pub const MAX_PENDING_REQUESTS: usize = 1024;

#[derive(Debug, Clone, Default)]
struct HubMetrics {
    malformed: Counter,
    outbox_dropped: Counter,
    unroutable: Counter,
    undelivered: Counter,
    connects: Counter,
    connected: Gauge,
    outbox: Gauge,
}

impl HubMetrics {
    fn register(hive: &Hive) -> HubMetrics {
        let metrics = HubMetrics::default();
        let registry = hive.metrics();
        registry.register(
            "edgehive_edgehub_malformed_frames",
            "Cloud frames that were not a valid message (the connection stays up when it can)",
            metrics.malformed.clone(),
        );
        registry.register(
            "edgehive_edgehub_outbox_dropped",
            "Messages to the cloud dropped because the outbox was full (oldest first)",
            metrics.outbox_dropped.clone(),
        );
        registry.register(
            "edgehive_edgehub_unroutable",
            "Cloud messages with a group no edge module serves",
            metrics.unroutable.clone(),
        );
        registry.register(
            "edgehive_edgehub_undelivered",
            "Cloud messages dropped because an edge module stayed full or was down",
            metrics.undelivered.clone(),
        );
        registry.register(
            "edgehive_edgehub_connects",
            "Successful WebSocket connects to the cloud",
            metrics.connects.clone(),
        );
        registry.register(
            "edgehive_edgehub_connected",
            "1 while connected to the cloud",
            metrics.connected.clone(),
        );
        registry.register(
            "edgehive_edgehub_outbox",
            "Messages waiting to be written to the cloud",
            metrics.outbox.clone(),
        );
        metrics
    }
}

#[derive(Debug, Default)]
struct HubState {
    connects: u64,
    last_error: Option<String>,
    /// Overflow policy: when full, the oldest message is dropped and counted. The cloud
    /// resends what the edge has not acknowledged, so the newest messages are the valuable ones.
    outbox: VecDeque<Message>,
    /// ACKs and error replies: written before the outbox and not throttled by the rate
    /// limit (a report upload must never delay an ACK until the cloud resends). Same bound
    /// and policy as the outbox.
    replies: VecDeque<Message>,
}

/// State shared by the actor, its connection task and pending requests; outlives restarts.
/// Every critical section of its locks is a few field updates, so a panic cannot leave them
/// torn (see [`lock`]).
#[derive(Debug)]
struct Shared {
    state: Mutex<HubState>,
    outbox_ready: Notify,
    replies_ready: Notify,
    /// Requests awaiting a cloud reply, by request id; bounded by [`MAX_PENDING_REQUESTS`].
    pending: Mutex<HashMap<String, oneshot::Sender<Message>>>,
    metrics: HubMetrics,
    outbox_capacity: usize,
    /// The node's TLS identity once loaded or bootstrapped.
    identity: Mutex<Option<EdgeIdentity>>,
    /// The connection state, the edge's one copy: written here only.
    connection: Arc<CloudConnection>,
}

/// Whether `message` answers the cloud (an ACK or an error), rather than telling it something.
fn is_reply(message: &Message) -> bool {
    matches!(
        message.operation(),
        Some(Operation::Response | Operation::Error)
    )
}

impl Shared {
    fn enqueue(&self, message: Message) {
        let mut state = lock(&self.state);
        if is_reply(&message) {
            if state.replies.len() >= self.outbox_capacity.max(1) {
                state.replies.pop_front();
                self.metrics.outbox_dropped.inc();
            }
            state.replies.push_back(message);
            drop(state);
            self.replies_ready.notify_one();
            return;
        }
        while state.outbox.len() >= self.outbox_capacity.max(1) {
            if let Some(dropped) = state.outbox.pop_front() {
                self.metrics.outbox_dropped.inc();
                tracing::warn!(
                    id = dropped.id(),
                    resource = dropped.resource(),
                    "edgehub outbox full; dropped the oldest message"
                );
            }
        }
        state.outbox.push_back(message);
        self.metrics.outbox.set(state.outbox.len() as i64);
        drop(state);
        self.outbox_ready.notify_one();
    }

    /// Waits for the next message to write. Cancel-safe: the pop and the return happen in one
    /// poll, so a message is never lost when the caller's `select!` picks another branch.
    async fn next_outgoing(&self) -> Message {
        loop {
            {
                let mut state = lock(&self.state);
                if let Some(message) = state.outbox.pop_front() {
                    self.metrics.outbox.set(state.outbox.len() as i64);
                    return message;
                }
            }
            self.outbox_ready.notified().await;
        }
    }

    /// Waits for the next reply to write (cancel-safe like [`Shared::next_outgoing`]).
    async fn next_reply(&self) -> Message {
        loop {
            if let Some(message) = lock(&self.state).replies.pop_front() {
                return message;
            }
            self.replies_ready.notified().await;
        }
    }

    /// Puts back a message whose write failed, ahead of everything else of its lane.
    fn requeue(&self, message: Message) {
        let mut state = lock(&self.state);
        if is_reply(&message) {
            state.replies.push_front(message);
            return;
        }
        state.outbox.push_front(message);
        self.metrics.outbox.set(state.outbox.len() as i64);
    }

    /// Records a connect or a disconnect and publishes it to the modules; `true` when the
    /// state changed.
    fn set_connected(&self, connected: bool, error: Option<String>) -> bool {
        let mut state = lock(&self.state);
        if connected {
            state.connects += 1;
            self.metrics.connects.inc();
        }
        if error.is_some() {
            state.last_error = error;
        }
        self.metrics.connected.set(i64::from(connected));
        let now = if connected {
            ConnectionState::Connected
        } else {
            ConnectionState::Disconnected
        };
        // Under the state's lock, so the status and the published state never disagree.
        self.connection.publish(now)
    }

    fn record_error(&self, error: String) {
        lock(&self.state).last_error = Some(error);
    }

    fn status(&self) -> EdgeHubStatus {
        let state = lock(&self.state);
        EdgeHubStatus {
            connected: self.connection.current().is_connected(),
            connects: state.connects,
            outbox: state.outbox.len(),
            last_error: state.last_error.clone(),
        }
    }
}

/// The EdgeHub recipe: options plus the state that outlives a restart of the actor.
#[derive(Debug)]
pub struct EdgeHubModule {
    /// The settings the hub dials with.
    pub options: EdgeHubOptions,
    shared: OnceLock<Arc<Shared>>,
}

impl EdgeHubModule {
    /// An EdgeHub with `options`; it starts dialing as soon as the hive starts it.
    pub fn new(options: EdgeHubOptions) -> Self {
        EdgeHubModule {
            options,
            shared: OnceLock::new(),
        }
    }
}

impl Module for EdgeHubModule {
    type Actor = EdgeHub;

    fn name(&self) -> &str {
        MODULE_NAME
    }

    fn group(&self) -> &str {
        GROUP
    }

    fn accepts(&self, accepts: &mut Accepts<EdgeHub>) {
        accepts
            .message::<CloudRequest>()
            .message::<CloudAsk>()
            .message::<ToCloud>()
            .message::<GetEdgeHubStatus>();
    }

    fn create(&self, hive: &Hive) -> EdgeHub {
        let shared = self
            .shared
            .get_or_init(|| {
                Arc::new(Shared {
                    state: Mutex::new(HubState::default()),
                    outbox_ready: Notify::new(),
                    replies_ready: Notify::new(),
                    pending: Mutex::new(HashMap::new()),
                    metrics: HubMetrics::register(hive),
                    outbox_capacity: self.options.outbox_capacity,
                    identity: Mutex::new(None),
                    connection: CloudConnection::of(hive),
                })
            })
            .clone();
        // A new actor has no connection yet, whatever its predecessor had: the modules hear
        // so now (its link will say `Connected` again once it has dialed).
        shared.set_connected(false, None);
        EdgeHub {
            link: Link {
                hive: hive.clone(),
                options: self.options.clone(),
                shared,
            },
        }
    }
}

/// The EdgeHub actor; see the [module docs](self).
#[derive(Debug)]
pub struct EdgeHub {
    link: Link,
}

impl Actor for EdgeHub {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Spawned into the context: the task ends with the actor, and a restarted actor
        // starts a fresh one.
        let link = self.link.clone();
        ctx.spawn(actix::fut::wrap_future(async move { link.run().await }));
    }
}

impl Handler<Envelope> for EdgeHub {
    type Result = Option<Message>;

    /// An extension module's messages for the cloud: queued and written in order.
    /// Fire-and-forget; use [`CloudRequest`] to wait for the cloud's reply.
    fn handle(&mut self, envelope: Envelope, _: &mut Context<Self>) -> Option<Message> {
        self.link.shared.enqueue(envelope.into_message());
        None
    }
}

impl Handler<ToCloud> for EdgeHub {
    type Result = ();

    /// The built-in modules' messages for the cloud (ACKs, refusals, forwarded local
    /// messages, uploads): built here, queued and written in order (replies first).
    fn handle(&mut self, message: ToCloud, _: &mut Context<Self>) {
        self.link.shared.enqueue(message.into_message());
    }
}

impl Handler<CloudAsk> for EdgeHub {
    type Result = Result<PendingReply, EdgeHubError>;

    /// A built-in module's request: built here, then as a [`CloudRequest`].
    fn handle(&mut self, ask: CloudAsk, _: &mut Context<Self>) -> Self::Result {
        self.request(ask.0.into_message())
    }
}

impl Handler<CloudRequest> for EdgeHub {
    type Result = Result<PendingReply, EdgeHubError>;

    fn handle(&mut self, request: CloudRequest, _: &mut Context<Self>) -> Self::Result {
        self.request(request.0)
    }
}

impl EdgeHub {
    /// Registers the waiter and queues the request; the wait runs on a task of its own, so
    /// the request leaves the mailbox at once and EdgeHub forgets it after its request
    /// timeout whether or not the caller still waits.
    fn request(&mut self, request: Message) -> Result<PendingReply, EdgeHubError> {
        let shared = self.link.shared.clone();
        let timeout = self.link.options.request_timeout;
        let id = request.id().to_owned();
        let (reply, answer) = oneshot::channel();
        {
            let mut pending = lock(&shared.pending);
            if pending.len() >= MAX_PENDING_REQUESTS {
                return Err(EdgeHubError::TooManyPending(MAX_PENDING_REQUESTS));
            }
            if pending.contains_key(&id) {
                return Err(EdgeHubError::DuplicateId(id));
            }
            pending.insert(id.clone(), reply);
        }
        shared.enqueue(request);
        let (outcome_tx, outcome_rx) = oneshot::channel();
        actix::spawn(async move {
            let outcome = tokio::time::timeout(timeout, answer).await;
            // Removed on reply by the reader; on timeout here. Either way, gone before the
            // caller hears of it.
            lock(&shared.pending).remove(&id);
            let outcome = match outcome {
                Ok(Ok(reply)) => Ok(reply),
                Ok(Err(_)) | Err(_) => Err(EdgeHubError::Timeout(timeout)),
            };
            // The caller may have given up; then nobody wants the outcome.
            let _ = outcome_tx.send(outcome);
        });
        Ok(PendingReply::new(outcome_rx))
    }
}

impl Handler<GetEdgeHubStatus> for EdgeHub {
    type Result = MessageResult<GetEdgeHubStatus>;

    fn handle(&mut self, _: GetEdgeHubStatus, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.link.shared.status())
    }
}
