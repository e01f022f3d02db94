//! The CloudHub module itself: its recipe (the node directory and the context every node
//! shares, kept across restarts), its actor (admission, the directory, delivery of
//! [`ToNodes`] to the nodes' pools) and the messages it takes. Above the node files; only
//! the server and `mod.rs` use it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use actix::prelude::*;
use edgehive_protocols::Message;

use super::auth;
use super::context::{HubContext, RECORDS_WAIT};
use super::metrics::CloudHubMetrics;
use super::node::{NodeCell, NodeInfo, NodeRecipe};
use super::options::{CloudHubOptions, CloudHubSecurity};
use super::pool::Enqueued;
use crate::cloud::contract::ownership::{
    HandOver, NodeOwner, RecordsLoaded, RecordsRead, ReplicaActing,
};
use crate::cloud::contract::{
    route, DisconnectNode, Lane, NodeDeleted, Queued, StoreReplaced, ToNodes,
};
use crate::cloud::ownership::Ownership;
use crate::hive::locks;
use crate::hive::{
    supervise_on, Accepts, ChildInfo, Envelope, Hive, HiveError, Module, RefusalKind, Refused,
};

/// The module name other modules address CloudHub by.
pub const CLOUDHUB_MODULE: &str = route::CLOUDHUB;
/// CloudHub's group.
pub(crate) const CLOUDHUB_GROUP: &str = route::CLOUDHUB;

/// What the module recipe keeps for every incarnation of the CloudHub actor: the context
/// node actors share, and the directory of node cells.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) hub: Arc<HubContext>,
    nodes: Arc<Mutex<HashMap<String, Arc<NodeCell>>>>,
    pub(crate) next_session_id: Arc<AtomicU64>,
    /// The arbiters node actors run on (made with the first node), taken in turn.
    node_arbiters: Arc<OnceLock<Vec<actix::Arbiter>>>,
}

/// Arbiters (threads) CloudHub's node actors are spread over, as many as its WebSocket
/// workers: the nodes' work (pools, ACKs, requests) uses every core instead of sharing
/// the system arbiter with the controllers and the cluster.
pub(crate) const NODE_ARBITERS: usize = 2;

impl Shared {
    fn nodes(&self) -> MutexGuard<'_, HashMap<String, Arc<NodeCell>>> {
        // Only inserts happen under the lock; a panic cannot leave the map half-written.
        locks::lock(&self.nodes)
    }

    /// The cell of `node`, with its actor started the first time the node is named, on the
    /// next of the [`NODE_ARBITERS`] in turn. Must run inside the actix system.
    fn node(&self, node: &str) -> Arc<NodeCell> {
        let mut nodes = self.nodes();
        if let Some(cell) = nodes.get(node) {
            return cell.clone();
        }
        let cell = NodeCell::new(node, &self.hub);
        nodes.insert(node.to_owned(), cell.clone());
        let turn = nodes.len();
        drop(nodes);
        self.hub.metrics.node_actors.inc();
        let recipe = NodeRecipe {
            cell: cell.clone(),
            hub: self.hub.clone(),
        };
        let arbiters = self
            .node_arbiters
            .get_or_init(|| (0..NODE_ARBITERS).map(|_| actix::Arbiter::new()).collect());
        let arbiter = arbiters[turn % arbiters.len()].handle();
        let addr = supervise_on(&arbiter, &self.hub.hive, recipe);
        cell.set_addr(addr);
        cell
    }

    fn cells(&self) -> Vec<Arc<NodeCell>> {
        let mut cells: Vec<_> = self.nodes().values().cloned().collect();
        cells.sort_by(|a, b| a.name().cmp(b.name()));
        cells
    }

    /// The supervision tree below CloudHub, for `/api/v1/modules`: the first `limit` nodes by
    /// name, and how many there are.
    pub(crate) fn children(&self, limit: usize) -> (Vec<ChildInfo>, usize) {
        let mut cells: Vec<_> = self.nodes().values().cloned().collect();
        let total = cells.len();
        if limit < total {
            cells.select_nth_unstable_by(limit, |a, b| a.name().cmp(b.name()));
            cells.truncate(limit);
        }
        cells.sort_by(|a, b| a.name().cmp(b.name()));
        (cells.iter().map(|cell| cell.child_info()).collect(), total)
    }
}

/// CloudHub's module recipe; its shared state survives actor restarts.
pub(crate) struct CloudHubModule {
    shared: Shared,
}

impl CloudHubModule {
    /// A recipe for `hive` with `options` and `security` (mutual TLS, message scoping);
    /// registers CloudHub's metrics with the hive (create one per hive).
    pub(crate) fn with_security(
        hive: &Hive,
        options: CloudHubOptions,
        security: CloudHubSecurity,
    ) -> Self {
        let mut metrics = CloudHubMetrics::default();
        metrics.register(hive);
        CloudHubModule {
            shared: Shared {
                hub: Arc::new(HubContext {
                    hive: hive.clone(),
                    options,
                    security,
                    metrics,
                    connected: AtomicUsize::new(0),
                    records_pending: AtomicBool::new(!Ownership::of(hive).is_replica()),
                    ownership: Ownership::of(hive),
                }),
                nodes: Arc::default(),
                next_session_id: Arc::new(AtomicU64::new(1)),
                node_arbiters: Arc::default(),
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

    fn create(&self, _: &Hive) -> CloudHub {
        CloudHub {
            shared: self.shared.clone(),
        }
    }

    fn accepts(&self, accepts: &mut Accepts<CloudHub>) {
        accepts
            .message::<ToNodes>()
            .message::<DisconnectNode>()
            .message::<NodeDeleted>()
            .message::<NodeOwner>()
            .message::<RecordsRead>()
            .message::<RecordsLoaded>()
            .message::<ReplicaActing>()
            .message::<HandOver>()
            .message::<StoreReplaced>()
            .message::<ListNodes>();
        #[cfg(feature = "test-hooks")]
        accepts.message::<CrashNode>();
    }
}

/// The CloudHub actor: see the [module docs](super).
pub struct CloudHub {
    shared: Shared,
}

impl Actor for CloudHub {
    type Context = Context<Self>;
}

impl CloudHub {
    /// At the node limit, a node the cluster has a Node object for (one the node did not
    /// register itself) is admitted before nodes it has none for: one of those is
    /// disconnected to make room. Without a cluster view every node counts as known.
    fn make_room_for_known_node(&self, node: &str, limit: usize) {
        let hub = &self.shared.hub;
        let Some(view) = hub.security.view.as_deref() else {
            return;
        };
        if hub.connected.load(Ordering::Acquire) < limit || !view.node_known(node) {
            return;
        }
        let already = self
            .shared
            .nodes()
            .get(node)
            .is_some_and(|cell| cell.is_admitted());
        if already {
            return;
        }
        // At the limit only: a scan of the directory for a connected stranger (no copy or
        // sort of the directory, as for the admin views).
        let stranger = self
            .shared
            .nodes()
            .values()
            .find(|cell| cell.is_admitted() && !view.node_known(cell.name()))
            .cloned();
        if let Some(stranger) = stranger {
            tracing::warn!(node = %stranger.name(), for_node = %node, "node limit reached: disconnecting a node the cluster does not know");
            hub.metrics.refused.inc();
            hub.metrics.record_refusal(
                RefusalKind::Connection,
                "node_limit",
                Some(stranger.name()),
                None,
                &format!("node limit reached: disconnected to make room for {node}, a node the cluster knows"),
            );
            stranger.disconnect(
                "node limit reached: room made for a node known to the cluster",
                hub,
            );
        }
    }

    fn deliver(&self, ToNodes { nodes, message }: ToNodes) {
        let hub = &self.shared.hub;
        // Nodes whose pool now holds (a newer version of) an object: SyncController records
        // them, also for offline nodes (see `Queued`).
        let record = message.object().filter(|_| {
            message.lane() == Lane::Ack && !message.is_deleting() && message.is_tracked()
        });
        let bound = auth::bound_key(message.resource());
        let mut queued = Vec::new();
        for node in nodes {
            let outcome =
                self.shared
                    .node(&node)
                    .enqueue_bound(message.clone(), bound.as_deref(), hub);
            if record.is_some() && matches!(outcome, Enqueued::Ack | Enqueued::Replaced) {
                queued.push(node);
            }
        }
        if let (Some(object), false) = (record, queued.is_empty()) {
            let event = Queued {
                nodes: queued,
                object: object.clone(),
                resource_version: message.resource_version().map(str::to_owned),
            };
            match hub.hive.tell(route::SYNCCONTROLLER, event) {
                Ok(())
                | Err(Refused {
                    error: HiveError::UnknownModule(_),
                    ..
                }) => {}
                Err(refused) => {
                    // SyncController catches up: the record is made on the ACK instead.
                    tracing::debug!(error = %refused.error, "queued event not delivered");
                    hub.metrics.drop_reason("sync_event_undelivered");
                }
            }
        }
    }

    fn deliver_message(&self, message: Message) {
        let resource = message.resource().to_owned();
        match ToNodes::from_message(message) {
            Some(to_nodes) => self.deliver(to_nodes),
            None => {
                tracing::warn!(%resource, "downstream message names no node; dropped");
                self.shared.hub.metrics.drop_reason("no_node");
            }
        }
    }
}

/// A message for an edge node, in cloud form (`node/{node}/...`), as a beehive message (for
/// extensions; built-in controllers send [`ToNodes`]).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Downstream(pub Message);

/// A new connection for `node` wants in: admitted (the node's cell, for its session) or
/// refused because the node limit is reached.
#[derive(Debug, Message)]
#[rtype(result = "Option<Arc<NodeCell>>")]
pub(crate) struct Admit {
    pub(crate) node: String,
    pub(crate) session_id: u64,
    /// Where the connection comes from, for the refusal log.
    pub(crate) peer: Option<std::net::SocketAddr>,
}

/// The server gave up waiting for the answer to its [`Admit`]: if the connection was
/// admitted, it never started, so it must not hold the node's slot.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct AdmitAbandoned {
    pub(crate) node: String,
    pub(crate) session_id: u64,
}

/// Asks for every known node's connection and delivery state, in name order.
#[derive(Debug, Message)]
#[rtype(result = "Vec<NodeInfo>")]
pub struct ListNodes;

/// Panics `node`'s actor on purpose, for supervision drills; answers whether the node is
/// known. Its supervisor restarts it with its pool and connection intact. Only with the
/// `test-hooks` feature (tests); the product binary has no way to crash a node.
#[cfg(feature = "test-hooks")]
#[derive(Debug, Message)]
#[rtype(result = "bool")]
pub struct CrashNode {
    /// The node whose actor panics.
    pub node: String,
}

impl Handler<Envelope> for CloudHub {
    type Result = Option<Message>;

    /// Beehive-style sends to `cloudhub` are downstream messages.
    fn handle(&mut self, envelope: Envelope, _: &mut Context<Self>) -> Option<Message> {
        self.deliver_message(envelope.into_message());
        None
    }
}

impl Handler<Downstream> for CloudHub {
    type Result = ();

    fn handle(&mut self, Downstream(message): Downstream, _: &mut Context<Self>) {
        self.deliver_message(message);
    }
}

impl Handler<ToNodes> for CloudHub {
    type Result = ();

    fn handle(&mut self, to_nodes: ToNodes, _: &mut Context<Self>) {
        self.deliver(to_nodes);
    }
}

impl Handler<Admit> for CloudHub {
    type Result = Option<Arc<NodeCell>>;

    fn handle(&mut self, admit: Admit, _: &mut Context<Self>) -> Self::Result {
        let limit = self.shared.hub.options.node_limit;
        // A refused node gets no cell: connections over the limit leave nothing behind.
        self.make_room_for_known_node(&admit.node, limit);
        let known = self.shared.nodes().get(&admit.node).cloned();
        let admitted = match known {
            Some(cell) => cell
                .admit(admit.session_id, &self.shared.hub, limit)
                .then_some(cell),
            None if self.shared.hub.connected.load(Ordering::Relaxed) >= limit => None,
            None => {
                let cell = self.shared.node(&admit.node);
                cell.admit(admit.session_id, &self.shared.hub, limit)
                    .then_some(cell)
            }
        };
        let Some(cell) = admitted else {
            tracing::warn!(node = %admit.node, limit, "node limit reached; connection refused");
            self.shared.hub.metrics.refused.inc();
            self.shared.hub.metrics.record_refusal(
                RefusalKind::Connection,
                "node_limit",
                Some(&admit.node),
                admit.peer,
                &format!("node limit ({limit}) reached"),
            );
            return None;
        };
        Some(cell)
    }
}

impl Handler<AdmitAbandoned> for CloudHub {
    type Result = ();

    fn handle(&mut self, abandoned: AdmitAbandoned, _: &mut Context<Self>) {
        let cell = self.shared.nodes().get(&abandoned.node).cloned();
        if let Some(cell) = cell {
            cell.session_ended(abandoned.session_id, &self.shared.hub);
        }
    }
}

impl Handler<ListNodes> for CloudHub {
    type Result = MessageResult<ListNodes>;

    fn handle(&mut self, _: ListNodes, _: &mut Context<Self>) -> Self::Result {
        let ownership = &self.shared.hub.ownership;
        MessageResult(
            self.shared
                .cells()
                .iter()
                .map(|cell| cell.info(ownership))
                .collect(),
        )
    }
}

impl Handler<DisconnectNode> for CloudHub {
    type Result = bool;

    fn handle(&mut self, request: DisconnectNode, _: &mut Context<Self>) -> bool {
        let cell = self.shared.nodes().get(&request.node).cloned();
        cell.is_some_and(|cell| cell.disconnect("disconnected by the operator", &self.shared.hub))
    }
}

impl Handler<NodeDeleted> for CloudHub {
    type Result = bool;

    fn handle(&mut self, request: NodeDeleted, _: &mut Context<Self>) -> bool {
        let cell = self.shared.nodes().remove(&request.node);
        cell.map(|cell| cell.retire(&self.shared.hub)).is_some()
    }
}

impl Handler<NodeOwner> for CloudHub {
    type Result = ();

    /// A replica now serves the node (its waiting messages go out), or another one does: its
    /// session here, if any, is closed (its edge is on the other replica now).
    fn handle(&mut self, owner: NodeOwner, ctx: &mut Context<Self>) {
        let cell = self.shared.nodes().get(&owner.node).cloned();
        let Some(cell) = cell else {
            return;
        };
        if owner.mine {
            cell.wake();
            // The records normally come within the moment; a SyncController that cannot read
            // them does not keep the node waiting for ever (what it then sends again, the
            // edge already has: it stores it once more).
            ctx.run_later(RECORDS_WAIT, move |_, _| {
                if cell.is_held() {
                    tracing::warn!(node = %cell.name(), wait = ?RECORDS_WAIT, "the node's sync records were not read in time; serving it without them");
                    cell.records_read(&[]);
                }
            });
        } else if cell.disconnect(
            "the node is served by another cloud replica",
            &self.shared.hub,
        ) {
            tracing::info!(node = %owner.node, "closed this replica's session: another replica serves the node");
        }
    }
}

impl Handler<RecordsRead> for CloudHub {
    type Result = ();

    fn handle(&mut self, read: RecordsRead, _: &mut Context<Self>) {
        let cell = self.shared.nodes().get(&read.node).cloned();
        if let Some(cell) = cell {
            cell.records_read(&read.acked);
        }
    }
}

impl Handler<RecordsLoaded> for CloudHub {
    type Result = ();

    /// Alone on the cluster: the pools take what the records read at start say the edges
    /// acknowledged (a node's pool is made if it has none yet: what EdgeController queues for
    /// it is then dropped as acknowledged), then the sessions that waited for it are written
    /// to. The records go first, so no session is written to before its node's are in.
    fn handle(&mut self, loaded: RecordsLoaded, _: &mut Context<Self>) {
        let nodes = loaded.nodes.len();
        let mut versions = 0;
        for read in loaded.nodes {
            versions += read.acked.len();
            self.shared.node(&read.node).records_read(&read.acked);
        }
        self.shared
            .hub
            .records_pending
            .store(false, Ordering::SeqCst);
        for cell in self.shared.cells() {
            if cell.is_held() {
                cell.records_read(&[]);
            }
        }
        tracing::info!(
            nodes,
            versions,
            "what the edges acknowledged is known: none of it is sent again"
        );
    }
}

impl Handler<ReplicaActing> for CloudHub {
    type Result = ();

    /// Back from a step-down: every connected node drives again (one wake each, once per
    /// renewal after a step-down, never on a timer).
    fn handle(&mut self, acting: ReplicaActing, _: &mut Context<Self>) {
        if acting.acting {
            let cells: Vec<_> = self.shared.nodes().values().cloned().collect();
            for cell in cells.iter().filter(|cell| cell.is_admitted()) {
                cell.wake();
            }
        }
    }
}

/// Why a stepped-down replica closes a session (the edge then dials the other addresses of its list).
const HANDED_OVER: &str =
    "this cloud replica cannot renew its Lease (API server unreachable): try another replica";

impl Handler<StoreReplaced> for CloudHub {
    type Result = ();

    /// EdgeController found another store recorded on the Node than the one the node
    /// connected with (this process had not seen the node's store before).
    fn handle(&mut self, replaced: StoreReplaced, _: &mut Context<Self>) {
        let cell = self.shared.nodes().get(&replaced.node).cloned();
        if let Some(cell) = cell {
            cell.store_replaced(&replaced.store_id, &self.shared.hub);
        }
    }
}

impl Handler<HandOver> for CloudHub {
    type Result = ();

    /// Stepped down for too long: the session is closed (if it is still the node's) so its
    /// edge moves to another replica.
    fn handle(&mut self, hand_over: HandOver, _: &mut Context<Self>) {
        let cell = self.shared.nodes().get(&hand_over.node).cloned();
        if let Some(cell) = cell {
            cell.disconnect_session(hand_over.session, HANDED_OVER, &self.shared.hub);
        }
    }
}

#[cfg(feature = "test-hooks")]
impl Handler<CrashNode> for CloudHub {
    type Result = bool;

    fn handle(&mut self, request: CrashNode, _: &mut Context<Self>) -> bool {
        let cell = self.shared.nodes().get(&request.node).cloned();
        cell.map(|cell| cell.crash()).is_some()
    }
}
