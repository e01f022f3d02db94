//! CloudHub (module `cloudhub`, group `cloudhub`): the cloud end of the edge WebSockets.
//!
//! - [`server`]: the actix-web WebSocket server edges connect to (headers `node_id`,
//!   `project_id`, `ConnectionUse: msg`, any path).
//! - [`session`]: one [`NodeSession`] actor per connection: frames in, frames out, keepalive.
//! - [`pool`]: what each node still has to receive, kept outside sessions and outside the
//!   [`CloudHub`] actor so it survives reconnects and restarts.
//! - [`CloudHub`]: routes downstream messages into pools and drives delivery (one ACK-lane
//!   message in flight per node, resent until ACKed), and dispatches upstream frames the way
//!   KubeEdge's DispatchUpstream does.
//!
//! - [`certs`], [`token`], [`tls`], [`certserver`]: the cloud CA, join tokens, mutual TLS and
//!   the HTTPS certificate server edges bootstrap from; [`auth`]: which upstream messages a
//!   node may send.
//!
//! Start it with [`start_cloudhub_with`] (or [`start_cloudhub`] for plain `ws://`).

pub mod auth;
pub mod certs;
pub mod certserver;
pub mod mirror;
pub mod pool;
pub mod server;
pub mod session;
pub mod tls;
pub mod token;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use actix_ws::CloseCode;
use edgehive_protocols::{
    encode, node_of, prefix_for_cloud, trim_for_edge, Group, Message, ModuleName, Operation,
    DEFAULT_MAX_FRAME_BYTES,
};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use serde::Serialize;

use crate::hive::{Envelope, Hive, HiveError, Module};
use pool::{Enqueued, NodePool, PoolLimits};
pub use server::{start_cloudhub, start_cloudhub_with, CloudHubError, CloudHubServer};
pub use session::NodeSession;
use session::{CloseSession, WriteFrame};

/// The module name other modules address CloudHub by.
pub const CLOUDHUB_MODULE: &str = "cloudhub";
/// CloudHub's group.
pub const CLOUDHUB_GROUP: &str = "cloudhub";

/// How CloudHub authenticates nodes and scopes what they send. [`Default`] is plain `ws://`
/// with no checks, which only tests and explicitly insecure configs use.
#[derive(Clone, Default)]
pub struct CloudHubSecurity {
    /// Mutual TLS on the WebSocket port; `None` serves plain `ws://`.
    pub tls: Option<Arc<tls::CloudTls>>,
    /// Refuse upstream messages about objects not bound to the sending node (see [`auth`]).
    pub authorize: bool,
    /// The cluster, for the binding checks of [`auth`]; without it only what CloudHub has sent
    /// to the node counts as bound.
    pub view: Option<Arc<dyn auth::BindingView>>,
}

impl std::fmt::Debug for CloudHubSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudHubSecurity")
            .field("tls", &self.tls.is_some())
            .field("authorize", &self.authorize)
            .field("view", &self.view.is_some())
            .finish()
    }
}

/// CloudHub's settings; [`Default`] is KubeEdge's cloudcore default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudHubOptions {
    /// Address the WebSocket server listens on.
    pub address: String,
    /// Port of the WebSocket server; 0 picks a free port.
    pub port: u16,
    /// A session with no keepalive for this long is closed.
    pub keepalive_interval: Duration,
    /// Most nodes connected at once; more are refused with a Policy close frame.
    pub node_limit: usize,
    /// Largest frame (or reassembled fragmented message) accepted from an edge; a bigger one
    /// closes that connection with a Size close frame.
    pub max_frame_bytes: usize,
    /// Time between resends of an unACKed message.
    pub ack_retry_interval: Duration,
    /// How often an ACK-lane message is written before it is requeued with backoff.
    pub ack_max_sends: u32,
    /// Most distinct objects waiting for delivery per node (see [`PoolLimits`]).
    pub ack_queue_capacity: usize,
    /// Most no-ACK messages waiting per node (see [`PoolLimits`]).
    pub noack_queue_capacity: usize,
}

impl Default for CloudHubOptions {
    fn default() -> Self {
        CloudHubOptions {
            address: "0.0.0.0".into(),
            port: 10000,
            keepalive_interval: Duration::from_secs(30),
            node_limit: 500,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            ack_retry_interval: Duration::from_secs(5),
            ack_max_sends: 5,
            ack_queue_capacity: 10_000,
            noack_queue_capacity: 1024,
        }
    }
}

impl CloudHubOptions {
    fn pool_limits(&self) -> PoolLimits {
        PoolLimits {
            ack_capacity: self.ack_queue_capacity,
            noack_capacity: self.noack_queue_capacity,
        }
    }
}

/// Label set of CloudHub's reason-labelled counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why the frame or message was counted.
    pub reason: String,
}

/// CloudHub's metrics; registered once per hive by [`CloudHubModule::new`].
#[derive(Debug, Clone, Default)]
pub struct CloudHubMetrics {
    /// Nodes with an open session.
    pub connected_nodes: Gauge,
    /// Frames received from edges (valid or not).
    pub frames_in: Counter,
    /// Frames written to edges.
    pub frames_out: Counter,
    /// ACKs matched to an in-flight message.
    pub acks: Counter,
    /// Resends of unACKed messages.
    pub resends: Counter,
    /// Frames that were not valid messages, by reason.
    pub malformed: Family<ReasonLabels, Counter>,
    /// Connections refused because the node limit was reached.
    pub refused: Counter,
    /// Messages dropped (pool overflow, stale, unroutable, ...), by reason.
    pub dropped: Family<ReasonLabels, Counter>,
    /// Connections and messages refused for identity or authorization, by reason.
    pub denied: Family<ReasonLabels, Counter>,
}

impl CloudHubMetrics {
    fn register(&self, hive: &Hive) {
        let m = hive.metrics();
        m.register(
            "edgehive_cloudhub_connected_nodes",
            "Edge nodes with an open WebSocket session",
            self.connected_nodes.clone(),
        );
        m.register(
            "edgehive_cloudhub_frames_received",
            "WebSocket frames received from edges",
            self.frames_in.clone(),
        );
        m.register(
            "edgehive_cloudhub_frames_sent",
            "WebSocket frames written to edges",
            self.frames_out.clone(),
        );
        m.register(
            "edgehive_cloudhub_acks",
            "Edge ACKs matched to an in-flight message",
            self.acks.clone(),
        );
        m.register(
            "edgehive_cloudhub_resends",
            "Resends of messages the edge did not ACK in time",
            self.resends.clone(),
        );
        m.register(
            "edgehive_cloudhub_malformed_frames",
            "Frames from edges that were not valid messages",
            self.malformed.clone(),
        );
        m.register(
            "edgehive_cloudhub_nodes_refused",
            "Connections refused because the node limit was reached",
            self.refused.clone(),
        );
        m.register(
            "edgehive_cloudhub_dropped_messages",
            "Messages CloudHub dropped, by reason",
            self.dropped.clone(),
        );
        m.register(
            "edgehive_cloudhub_denied",
            "Connections and upstream messages refused for node identity or authorization, by reason",
            self.denied.clone(),
        );
    }

    pub(crate) fn deny(&self, reason: &str) {
        self.denied
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub(crate) fn drop_reason(&self, reason: &str) {
        self.dropped
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub(crate) fn malformed(&self, reason: &str) {
        self.malformed
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }
}

struct SessionHandle {
    id: u64,
    addr: Addr<NodeSession>,
    since: SystemTime,
}

struct NodeEntry {
    pool: NodePool,
    session: Option<SessionHandle>,
    last_keepalive: Option<SystemTime>,
    /// Pods, configmaps and secrets sent to this node (`{ns}/{type}/{name}`), for [`auth`];
    /// at most [`auth::MAX_BOUND_PER_NODE`], beyond which the cluster view decides.
    bound: HashSet<String>,
}

/// State that outlives the [`CloudHub`] actor: pools and the sessions' addresses.
struct HubState {
    nodes: HashMap<String, NodeEntry>,
}

/// What the module recipe keeps for every incarnation of the actor.
#[derive(Clone)]
pub(crate) struct Shared {
    options: CloudHubOptions,
    pub(crate) security: CloudHubSecurity,
    state: Arc<Mutex<HubState>>,
    pub(crate) metrics: CloudHubMetrics,
    pub(crate) next_session_id: Arc<AtomicU64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, HubState> {
        // Handlers never leave the map half-updated across a panic point.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// CloudHub's module recipe; its shared state survives actor restarts.
pub struct CloudHubModule {
    shared: Shared,
}

impl CloudHubModule {
    /// A recipe for `hive` with `options`; registers CloudHub's metrics with the hive (create
    /// one per hive).
    pub fn new(hive: &Hive, options: CloudHubOptions) -> Self {
        Self::with_security(hive, options, CloudHubSecurity::default())
    }

    /// A recipe with `security` (mutual TLS, message scoping).
    pub fn with_security(
        hive: &Hive,
        options: CloudHubOptions,
        security: CloudHubSecurity,
    ) -> Self {
        let metrics = CloudHubMetrics::default();
        metrics.register(hive);
        CloudHubModule {
            shared: Shared {
                options,
                security,
                state: Arc::new(Mutex::new(HubState {
                    nodes: HashMap::new(),
                })),
                metrics,
                next_session_id: Arc::new(AtomicU64::new(1)),
            },
        }
    }

    pub(crate) fn shared(&self) -> Shared {
        self.shared.clone()
    }
}

impl Module for CloudHubModule {
    type Actor = CloudHub;

    fn name(&self) -> &str {
        CLOUDHUB_MODULE
    }

    fn group(&self) -> &str {
        CLOUDHUB_GROUP
    }

    fn create(&self, hive: &Hive) -> CloudHub {
        CloudHub {
            hive: hive.clone(),
            shared: self.shared.clone(),
        }
    }
}

/// The CloudHub actor: see the [module docs](self).
pub struct CloudHub {
    hive: Hive,
    shared: Shared,
}

/// A message for an edge node, in cloud form (`node/{node}/...`).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Downstream(pub Message);

/// A new WebSocket session for `node` wants in.
#[derive(Debug, Message)]
#[rtype(result = "Admission")]
pub struct SessionOpened {
    /// The node from the `node_id` header.
    pub node: String,
    /// Unique per connection.
    pub session_id: u64,
    /// The session actor.
    pub addr: Addr<NodeSession>,
}

/// CloudHub's answer to [`SessionOpened`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, MessageResponse)]
pub enum Admission {
    /// The session is now the node's connection.
    Accepted,
    /// The node limit is reached; the session must close.
    NodeLimitReached,
}

/// A session ended (ignored if that session had already been replaced).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct SessionClosed {
    /// The node.
    pub node: String,
    /// The ended session.
    pub session_id: u64,
}

/// A valid frame from an edge.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Upstream {
    /// The node it came from.
    pub node: String,
    /// The session it came on.
    pub session_id: u64,
    /// The decoded message (resource still in edge form).
    pub message: Message,
}

/// Asks for every known node's connection and delivery state.
#[derive(Debug, Message)]
#[rtype(result = "Vec<NodeInfo>")]
pub struct ListNodes;

/// Closes `node`'s connection; answers whether it had one.
#[derive(Debug, Message)]
#[rtype(result = "bool")]
pub struct DisconnectNode {
    /// The node to disconnect.
    pub node: String,
}

/// One node as the admin endpoint shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeInfo {
    /// Node name.
    pub node: String,
    /// Whether a session is open.
    pub connected: bool,
    /// When the current session opened (Unix ms).
    pub connected_since: Option<u64>,
    /// When its last keepalive arrived (Unix ms).
    pub last_keepalive: Option<u64>,
    /// Objects waiting in the ACK lane.
    pub ack_queue: usize,
    /// Messages waiting in the no-ACK lane.
    pub no_ack_queue: usize,
    /// msg_id of the message waiting for its ACK.
    pub in_flight: Option<String>,
    /// Objects with a recorded ACKed resourceVersion.
    pub acked_objects: usize,
    /// Frames written.
    pub sent: u64,
    /// ACKs received.
    pub acked: u64,
    /// Resends.
    pub resends: u64,
}

fn unix_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Cloud modules whose upstream messages CloudHub drops (they would be loops).
const CLOUD_MODULES: [&str; 5] = [
    "cloudhub",
    "cloudStream",
    "devicecontroller",
    "edgecontroller",
    "synccontroller",
];

impl Actor for CloudHub {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let tick = (self.shared.options.ack_retry_interval / 4)
            .clamp(Duration::from_millis(5), Duration::from_millis(250));
        ctx.run_interval(tick, |hub, _| hub.tick());
        // A restarted hub picks up where the previous one stopped.
        self.tick();
    }
}

impl CloudHub {
    /// Drives every node: forgets dead sessions, resends and sends what is due.
    fn tick(&mut self) {
        let shared = self.shared.clone();
        let mut state = shared.lock();
        let now = Instant::now();
        for (node, entry) in state.nodes.iter_mut() {
            if entry
                .session
                .as_ref()
                .is_some_and(|session| !session.addr.connected())
            {
                tracing::debug!(%node, "session actor gone; marking node disconnected");
                entry.session = None;
            }
            self.drive(node, entry, now);
        }
        self.update_gauge(&state);
    }

    fn update_gauge(&self, state: &HubState) {
        let connected = state
            .nodes
            .values()
            .filter(|entry| entry.session.is_some())
            .count();
        self.shared.metrics.connected_nodes.set(connected as i64);
    }

    /// Writes what `entry`'s pool has ready, if the node is connected.
    fn drive(&self, node: &str, entry: &mut NodeEntry, now: Instant) {
        let Some(session) = &entry.session else {
            return;
        };
        let metrics = &self.shared.metrics;
        while let Some(message) = entry.pool.front_noack() {
            match session.addr.try_send(WriteFrame(frame_for(message))) {
                Ok(()) => {
                    entry.pool.pop_noack();
                    metrics.frames_out.inc();
                }
                // The session's mailbox is full: the rest waits in the pool for the next tick.
                Err(SendError::Full(_)) => return,
                Err(SendError::Closed(_)) => {
                    entry.session = None;
                    return;
                }
            }
        }
        let options = &self.shared.options;
        let resends_before = entry.pool.stats.resends;
        if let Some(message) =
            entry
                .pool
                .poll_ack_lane(now, options.ack_retry_interval, options.ack_max_sends)
        {
            metrics
                .resends
                .inc_by(entry.pool.stats.resends - resends_before);
            tracing::debug!(%node, msg_id = message.id(), resource = message.resource(), "writing ACK-lane message");
            // A lost write is repaired by the resend timer, so Full is not an error here.
            match session.addr.try_send(WriteFrame(frame_for(&message))) {
                Ok(()) => {
                    metrics.frames_out.inc();
                }
                Err(SendError::Full(_)) => {}
                Err(SendError::Closed(_)) => entry.session = None,
            }
        }
    }

    fn entry<'a>(&self, state: &'a mut HubState, node: &str) -> &'a mut NodeEntry {
        state
            .nodes
            .entry(node.to_owned())
            .or_insert_with(|| NodeEntry {
                pool: NodePool::new(self.shared.options.pool_limits()),
                session: None,
                last_keepalive: None,
                bound: HashSet::new(),
            })
    }

    fn enqueue(&self, node: &str, message: Message) {
        let shared = self.shared.clone();
        let mut state = shared.lock();
        let entry = self.entry(&mut state, node);
        let resource = message.resource().to_owned();
        if let Some(key) = auth::bound_key(&trim_for_edge(&resource)) {
            if message.operation() == Some(&Operation::Delete) {
                entry.bound.remove(&key);
            } else if entry.bound.len() < auth::MAX_BOUND_PER_NODE {
                entry.bound.insert(key);
            }
        }
        let outcome = entry.pool.enqueue(message);
        match outcome {
            Enqueued::Ack | Enqueued::Replaced | Enqueued::NoAck => {}
            Enqueued::NoAckOldestDropped => {
                tracing::warn!(%node, "no-ACK queue full; dropped its oldest message");
                self.shared.metrics.drop_reason("noack_queue_full");
            }
            Enqueued::AckQueueFull => {
                tracing::warn!(%node, %resource, "ACK queue full; message refused");
                self.shared.metrics.drop_reason("ack_queue_full");
            }
            Enqueued::NoResourceVersion => {
                tracing::warn!(%node, %resource, "message without resourceversion dropped");
                self.shared.metrics.drop_reason("no_resource_version");
            }
            Enqueued::Stale | Enqueued::DeletePending | Enqueued::AlreadyAcked => {
                tracing::debug!(%node, %resource, ?outcome, "message superseded");
                self.shared.metrics.drop_reason("superseded");
            }
        }
        self.drive(node, entry, Instant::now());
    }

    /// Queues a reply that must not wait for (or need) an ACK, whatever its operation.
    fn enqueue_noack(&self, node: &str, message: Message) {
        let shared = self.shared.clone();
        let mut state = shared.lock();
        let entry = self.entry(&mut state, node);
        if entry.pool.enqueue_noack(message) == Enqueued::NoAckOldestDropped {
            self.shared.metrics.drop_reason("noack_queue_full");
        }
        self.drive(node, entry, Instant::now());
    }

    fn dispatch_upstream(&mut self, node: &str, mut message: Message) {
        let operation = message.operation().cloned();
        match operation {
            Some(Operation::Keepalive) => {
                let mut state = self.shared.lock();
                self.entry(&mut state, node).last_keepalive = Some(SystemTime::now());
                return;
            }
            Some(Operation::Response) => {
                let parent = message.parent_id().unwrap_or_default().to_owned();
                let shared = self.shared.clone();
                let mut state = shared.lock();
                let entry = self.entry(&mut state, node);
                if entry.pool.ack(&parent).is_some() {
                    self.shared.metrics.acks.inc();
                    self.drive(node, entry, Instant::now());
                } else {
                    tracing::debug!(%node, %parent, "response matches no in-flight message; ignored");
                }
                return;
            }
            Some(Operation::Error) => {
                tracing::warn!(%node, parent = message.parent_id(), content = %message.content, "edge reported an error");
                return;
            }
            _ => {}
        }
        if self.shared.security.authorize {
            let verdict = {
                let mut state = self.shared.lock();
                let bound = &self.entry(&mut state, node).bound;
                auth::authorize(node, &message, bound, self.shared.security.view.as_deref())
            };
            if let Err(reason) = verdict {
                tracing::warn!(%node, id = message.id(), resource = message.resource(), %reason, "upstream message refused");
                self.shared.metrics.deny("not_bound_to_node");
                let mut reply = Message::error_to(&message, reason);
                reply.route.source = Some(ModuleName::CloudHub);
                reply.route.group = Some(Group::Resource);
                reply.route.resource = prefix_for_cloud(node, message.resource());
                self.enqueue_noack(node, reply);
                return;
            }
        }
        if message.resource() == "k8s/ca.crt" {
            // No cluster CA exists yet; KubeEdge answers "" in the same situation.
            let mut reply =
                Message::response_to(&message, serde_json::Value::String(String::new()));
            reply.route.source = Some(ModuleName::CloudHub);
            reply.route.group = Some(Group::Resource);
            reply.route.resource = prefix_for_cloud(node, "k8s/ca.crt");
            self.enqueue(node, reply);
            return;
        }
        message.route.resource = prefix_for_cloud(node, message.resource());
        let source = message.source().map(|s| s.as_str().to_owned());
        if source
            .as_deref()
            .is_some_and(|source| CLOUD_MODULES.contains(&source))
        {
            tracing::debug!(%node, ?source, "upstream message claims a cloud source; dropped");
            self.shared.metrics.drop_reason("cloud_source");
            return;
        }
        let is_upload =
            operation == Some(Operation::Upload) && message.group() == Some(&Group::User);
        let is_task = matches!(
            operation,
            Some(Operation::Prepull | Operation::Upgrade | Operation::UpdateNodeActionStatus)
        );
        let result = if is_upload {
            self.hive.send("router", message).map(|()| None)
        } else if is_task {
            self.hive.send_to_group("taskmanager", message).map(Some)
        } else if source.as_deref() == Some("twin") {
            self.hive
                .send_to_group("devicecontroller", message)
                .map(Some)
        } else {
            self.hive.send_to_group("edgecontroller", message).map(Some)
        };
        let failure = match result {
            Ok(Some(delivery)) => delivery.failed.into_iter().next().map(|(_, err)| err),
            Ok(None) => None,
            Err(err) => Some(err),
        };
        if let Some(err) = failure {
            tracing::warn!(%node, error = %err, "upstream message not delivered");
            let reason = match err {
                HiveError::UnknownGroup(_) | HiveError::UnknownModule(_) => "no_route",
                _ => "route_unavailable",
            };
            self.shared.metrics.drop_reason(reason);
        }
    }
}

/// The frame for `message`: resource trimmed to edge form, Go-compatible JSON.
fn frame_for(message: &Message) -> String {
    let mut wire = message.clone();
    wire.route.resource = trim_for_edge(&wire.route.resource);
    wire.header.sync = false;
    encode(&wire)
}

impl Handler<Envelope> for CloudHub {
    type Result = Option<Message>;

    /// Beehive-style sends to `cloudhub` are downstream messages.
    fn handle(&mut self, envelope: Envelope, ctx: &mut Context<Self>) -> Option<Message> {
        self.handle(Downstream(envelope.into_message()), ctx);
        None
    }
}

impl Handler<Downstream> for CloudHub {
    type Result = ();

    fn handle(&mut self, Downstream(message): Downstream, _: &mut Context<Self>) {
        let Some(node) = node_of(message.resource()).map(str::to_owned) else {
            tracing::warn!(
                resource = message.resource(),
                "downstream message names no node; dropped"
            );
            self.shared.metrics.drop_reason("no_node");
            return;
        };
        self.enqueue(&node, message);
    }
}

impl Handler<SessionOpened> for CloudHub {
    type Result = Admission;

    fn handle(&mut self, opened: SessionOpened, _: &mut Context<Self>) -> Admission {
        let shared = self.shared.clone();
        let mut state = shared.lock();
        let connected = state
            .nodes
            .iter()
            .filter(|(node, entry)| *node != &opened.node && entry.session.is_some())
            .count();
        if connected >= self.shared.options.node_limit {
            tracing::warn!(node = %opened.node, limit = self.shared.options.node_limit, "node limit reached; connection refused");
            self.shared.metrics.refused.inc();
            return Admission::NodeLimitReached;
        }
        let entry = self.entry(&mut state, &opened.node);
        if let Some(old) = entry.session.take() {
            tracing::info!(node = %opened.node, old = old.id, new = opened.session_id, "node reconnected; closing its previous session");
            // do_send on purpose: a close must not be refused by a full mailbox, and it is one
            // message per connection.
            old.addr.do_send(CloseSession {
                code: CloseCode::Normal,
                reason: "replaced by a new connection".into(),
            });
        }
        entry.session = Some(SessionHandle {
            id: opened.session_id,
            addr: opened.addr,
            since: SystemTime::now(),
        });
        entry.last_keepalive = None;
        tracing::info!(node = %opened.node, session = opened.session_id, "node connected");
        let now = Instant::now();
        entry.pool.restart_in_flight(now);
        self.drive(&opened.node, entry, now);
        self.update_gauge(&state);
        Admission::Accepted
    }
}

impl Handler<SessionClosed> for CloudHub {
    type Result = ();

    fn handle(&mut self, closed: SessionClosed, _: &mut Context<Self>) {
        let shared = self.shared.clone();
        let mut state = shared.lock();
        if let Some(entry) = state.nodes.get_mut(&closed.node) {
            if entry
                .session
                .as_ref()
                .is_some_and(|session| session.id == closed.session_id)
            {
                tracing::info!(node = %closed.node, session = closed.session_id, "node disconnected");
                entry.session = None;
            }
        }
        self.update_gauge(&state);
    }
}

impl Handler<Upstream> for CloudHub {
    type Result = ();

    fn handle(&mut self, upstream: Upstream, _: &mut Context<Self>) {
        self.dispatch_upstream(&upstream.node, upstream.message);
    }
}

impl Handler<ListNodes> for CloudHub {
    type Result = MessageResult<ListNodes>;

    fn handle(&mut self, _: ListNodes, _: &mut Context<Self>) -> Self::Result {
        let state = self.shared.lock();
        let mut nodes: Vec<NodeInfo> = state
            .nodes
            .iter()
            .map(|(node, entry)| NodeInfo {
                node: node.clone(),
                connected: entry.session.is_some(),
                connected_since: entry.session.as_ref().map(|s| unix_ms(s.since)),
                last_keepalive: entry.last_keepalive.map(unix_ms),
                ack_queue: entry.pool.ack_len(),
                no_ack_queue: entry.pool.noack_len(),
                in_flight: entry.pool.in_flight().map(|f| f.message.id().to_owned()),
                acked_objects: entry.pool.acked_objects(),
                sent: entry.pool.stats.sent,
                acked: entry.pool.stats.acked,
                resends: entry.pool.stats.resends,
            })
            .collect();
        nodes.sort_by(|a, b| a.node.cmp(&b.node));
        MessageResult(nodes)
    }
}

impl Handler<DisconnectNode> for CloudHub {
    type Result = bool;

    fn handle(&mut self, request: DisconnectNode, _: &mut Context<Self>) -> bool {
        let mut state = self.shared.lock();
        let Some(session) = state
            .nodes
            .get_mut(&request.node)
            .and_then(|entry| entry.session.take())
        else {
            return false;
        };
        // do_send on purpose, as for replaced sessions: one close per connection.
        session.addr.do_send(CloseSession {
            code: CloseCode::Normal,
            reason: "disconnected by the operator".into(),
        });
        self.update_gauge(&state);
        true
    }
}
