//! One actor per edge node: it owns the node's message pool, its retry deadline and its
//! current connection, and is driven only by events.
//!
//! ```text
//! CloudHub ──ToNodes──▶ NodeCell (pool, connection; outlives actor and connections)
//!                          │ wake (coalesced: at most one Drive waits in the mailbox)
//!                          ▼
//!                       NodeActor ──WriteFrame──▶ NodeSession ──▶ WebSocket
//!                          ▲
//!      NodeSession ──FromEdge (ACKs, requests)
//! ```
//!
//! The [`NodeCell`] is the recipe's state: the pool, the bound objects and the connection
//! handle live there, so a panicking node actor is restarted (by its [`NodeRecipe`], under
//! CloudHub) with everything it had queued. The actor itself holds only its deadline timer.
//!
//! Events: a message queued for the node, an ACK or request from the edge, a connection
//! opening or closing, or its own deadline (the in-flight message's resend, or a backoff
//! ending). Keepalives never reach the node actor: the session notes them itself, so an idle
//! connected node makes no actor handle anything.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use actix_ws::CloseCode;
use edgehive_protocols::object::unix_ms;
use edgehive_protocols::{Message, Operation};

use super::auth::{self, binds};
use super::context::{HubContext, RECORDS_WAIT};
use super::dispatch;
use super::limits::{self, WriteBudget};
use super::link::{CloseSession, SessionHandle, WriteFrame};
use super::pool::{Enqueued, NodePool};
use crate::cloud::contract::application::SessionEnded;
use crate::cloud::contract::extension;
use crate::cloud::contract::{route, Acked, NodeMessage, ResyncNode, StoreSeen};
use crate::cloud::ownership::{NodeOwnerInfo, Ownership};
use crate::hive::locks;
use crate::hive::log::{clip, WarnBudget};
use crate::hive::{ChildInfo, HiveError, ModuleState, Recipe, RefusalKind, Refused};

/// Mailbox of a node actor. Senders never overrun it by much: wakes are coalesced,
/// connection events are one per connection, and a session whose frame finds the mailbox full
/// stops reading its socket until the node actor has handled that frame.
pub(crate) const NODE_MAILBOX_CAPACITY: usize = 64;

/// How many times (a second apart) an ACK event SyncController's full mailbox refused is
/// offered again.
const ACK_EVENT_RETRIES: u32 = 60;

/// How soon a node tries again when its session's mailbox was full.
const SESSION_FULL_RETRY: Duration = Duration::from_millis(10);

/// Counters of one connection, shared by its session, its node and the keepalive wheel.
#[derive(Debug)]
pub(crate) struct ConnectionStats {
    /// Frames received on it.
    pub(crate) frames_in: AtomicU64,
    /// Frames written to it.
    pub(crate) frames_out: AtomicU64,
    /// When it last showed it is alive (opened, or a keepalive), in [`clock_ms`].
    alive_ms: AtomicU64,
    /// Its session ended.
    ended: AtomicBool,
}

impl ConnectionStats {
    /// The counters of a connection opened now.
    pub(crate) fn new() -> Self {
        ConnectionStats {
            frames_in: AtomicU64::new(0),
            frames_out: AtomicU64::new(0),
            alive_ms: AtomicU64::new(clock_ms()),
            ended: AtomicBool::new(false),
        }
    }

    /// Notes a keepalive.
    pub(crate) fn alive(&self) {
        self.alive_ms.store(clock_ms(), Ordering::Relaxed);
    }

    /// When the connection last showed it is alive, in [`clock_ms`].
    pub(crate) fn alive_ms(&self) -> u64 {
        self.alive_ms.load(Ordering::Relaxed)
    }

    /// Notes that the connection's session ended.
    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::Relaxed);
    }

    /// Whether the connection's session ended.
    pub(crate) fn has_ended(&self) -> bool {
        self.ended.load(Ordering::Relaxed)
    }
}

/// Milliseconds on a monotonic clock that starts with the first call in the process.
pub(crate) fn clock_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The node's current connection.
struct Connection {
    id: u64,
    session: SessionHandle,
    since: SystemTime,
    stats: Arc<ConnectionStats>,
}

struct NodeState {
    pool: NodePool,
    connection: Option<Connection>,
    /// A connection admitted and started, not yet taken over by the node's actor (kept here,
    /// not in a message, so an actor restarting meanwhile still finds it).
    incoming: Option<Connection>,
    /// Why the connection is to be closed, when the cloud decided it (an operator, a node
    /// deleted from the cluster).
    close_reason: Option<String>,
    /// Pods, configmaps, secrets and devices the node has ACKed a controller's push of
    /// (`{ns}/{type}/{name}`), for [`auth`]; at most [`auth::MAX_BOUND_PER_NODE`], beyond which
    /// the cluster view decides.
    bound: HashSet<String>,
    /// The identity of the edge's store on its last connection (edgehive edges send it).
    store_id: Option<String>,
    /// A store change was seen and EdgeController has not yet taken the node's resync: every
    /// connection asks again until one is taken (set and cleared under the lock, so a
    /// connection racing the failed ask cannot miss it).
    resync_owed: bool,
    /// The node's store was replaced before its records (what it acknowledged to an earlier
    /// cloud) were read: when they come they are not taken, the edge no longer has it.
    ignore_records: bool,
    /// What the node may still write now (see [`limits`]).
    writes: WriteBudget,
    /// Pod inserts let through that the cluster may not show yet (see [`limits::check_quota`]).
    pending_pods: limits::PendingPods,
}

/// Everything a node has that outlives its actor and its connections.
pub(crate) struct NodeCell {
    name: String,
    state: Mutex<NodeState>,
    addr: Mutex<Option<Addr<NodeActor>>>,
    /// A `Drive` is waiting in the mailbox (so another wake adds nothing).
    wake_pending: AtomicBool,
    /// The admitted connection's id; 0 when none.
    admitted: AtomicU64,
    running: AtomicBool,
    /// The node was deleted: its actor stops for good and is not restarted.
    retired: AtomicBool,
    restarts: AtomicU64,
    handled: AtomicU64,
    depth: AtomicI64,
    /// Unix ms of the last keepalive on the current connection; 0 when none yet.
    last_keepalive_ms: AtomicU64,
    /// A replica's session waits for the node's records to be read (what the edge
    /// acknowledged to another replica) before anything is written to it.
    held: AtomicBool,
}

/// One node as the admin endpoint shows it.
#[derive(Debug, Clone, serde::Serialize, PartialEq, Eq)]
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
    /// Objects parked after their deliveries kept ending the connection.
    pub parked: usize,
    /// Frames written.
    pub sent: u64,
    /// ACKs received.
    pub acked: u64,
    /// Resends.
    pub resends: u64,
    /// Restarts of the node's actor.
    pub restarts: u64,
    /// Messages waiting in the node actor's mailbox.
    pub mailbox_depth: i64,
    /// The replica serving the node, when this process is one of several.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<NodeOwnerInfo>,
}

impl NodeInfo {
    /// Troubled first: disconnected, then parked objects, deep queues, restarts; then by
    /// name. What the status page and `?limit=` show first.
    pub fn by_trouble(a: &NodeInfo, b: &NodeInfo) -> std::cmp::Ordering {
        let trouble = |n: &NodeInfo| {
            (
                !n.connected,
                n.parked,
                n.ack_queue + n.no_ack_queue,
                n.restarts,
            )
        };
        trouble(b)
            .cmp(&trouble(a))
            .then_with(|| a.node.cmp(&b.node))
    }
}

impl NodeCell {
    pub(crate) fn new(name: &str, hub: &HubContext) -> Arc<Self> {
        Arc::new(NodeCell {
            name: name.to_owned(),
            state: Mutex::new(NodeState {
                pool: NodePool::new(hub.options.pool_limits()),
                connection: None,
                incoming: None,
                close_reason: None,
                store_id: None,
                resync_owed: false,
                ignore_records: false,
                writes: WriteBudget::new(&hub.options.write_limits),
                pending_pods: limits::PendingPods::default(),
                bound: HashSet::new(),
            }),
            addr: Mutex::new(None),
            wake_pending: AtomicBool::new(false),
            admitted: AtomicU64::new(0),
            running: AtomicBool::new(true),
            retired: AtomicBool::new(false),
            restarts: AtomicU64::new(0),
            handled: AtomicU64::new(0),
            depth: AtomicI64::new(0),
            last_keepalive_ms: AtomicU64::new(0),
            held: AtomicBool::new(false),
        })
    }

    /// The node's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    fn lock(&self) -> MutexGuard<'_, NodeState> {
        // Every critical section finishes its update of the pool or the connection before
        // anything can panic, so a poisoned lock holds consistent state.
        locks::lock(&self.state)
    }

    /// The node actor's current address. A session keeps the one it got (its own sender, so
    /// actix can make it wait when the mailbox is full) until the actor is replaced.
    pub(crate) fn addr(&self) -> Option<Addr<NodeActor>> {
        locks::lock(&self.addr).clone()
    }

    pub(crate) fn set_addr(&self, addr: Addr<NodeActor>) {
        *locks::lock(&self.addr) = Some(addr);
    }

    /// Posts a control message; these are few (one per connection event, one coalesced wake)
    /// so they may pass a full mailbox. Lost only while the actor restarts, and the restarted
    /// actor drives the node from its cell anyway.
    /// Says whether the message reached a mailbox.
    fn post<M>(&self, message: M) -> bool
    where
        M: actix::Message<Result = ()> + Send + 'static,
        NodeActor: Handler<M>,
    {
        let Some(addr) = self.addr() else {
            return false;
        };
        match addr.try_send(message) {
            Ok(()) => {
                self.depth.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(SendError::Full(message)) => {
                self.depth.fetch_add(1, Ordering::Relaxed);
                addr.do_send(message);
                true
            }
            Err(SendError::Closed(_)) => false,
        }
    }

    /// Asks the node's actor to write what is ready; at most one such request waits. A wake
    /// that finds the actor gone (it is restarting, on its own thread) leaves no request
    /// pending, so the next wake is posted to the new actor.
    pub(crate) fn wake(&self) {
        if !self.wake_pending.swap(true, Ordering::AcqRel) && !self.post(Drive) {
            self.wake_pending.store(false, Ordering::Release);
        }
    }

    /// Queues `message` for the node and wakes its actor if it can be sent now; says what
    /// the pool did with it.
    pub(crate) fn enqueue(&self, message: Arc<NodeMessage>, hub: &HubContext) -> Enqueued {
        let bound = auth::bound_key(message.resource());
        self.enqueue_bound(message, bound.as_deref(), hub)
    }

    /// [`NodeCell::enqueue`] with the message's [`auth::bound_key`] worked out by the caller,
    /// once for every node a message goes to.
    pub(crate) fn enqueue_bound(
        &self,
        message: Arc<NodeMessage>,
        bound: Option<&str>,
        hub: &HubContext,
    ) -> Enqueued {
        let outcome = {
            let mut state = self.lock();
            let outcome = state.pool.enqueue(message.clone());
            // A delete on its way takes the object from the node's bound set at once; an
            // object is added only when the node ACKs a controller's push of it
            // (`NodeActor::on_edge_message`), never because a message was queued: replies and
            // refusals name the object the node asked about, and must not grant it.
            if let Some(key) = bound.filter(|_| message.is_delete()) {
                state.bound.remove(key);
            }
            outcome
        };
        let node = &self.name;
        let resource = message.resource();
        match outcome {
            Enqueued::Ack | Enqueued::Replaced | Enqueued::NoAck => {}
            Enqueued::NoAckOldestDropped => {
                tracing::warn!(%node, "no-ACK queue full; dropped its oldest message");
                hub.metrics.drop_reason("noack_queue_full");
            }
            Enqueued::AckQueueFull => {
                tracing::warn!(%node, %resource, "ACK queue full; message refused");
                hub.metrics.drop_reason("ack_queue_full");
            }
            Enqueued::NoResourceVersion => {
                tracing::warn!(%node, %resource, "message without resourceversion dropped");
                hub.metrics.drop_reason("no_resource_version");
            }
            Enqueued::Stale | Enqueued::DeletePending | Enqueued::AlreadyAcked => {
                tracing::debug!(%node, %resource, ?outcome, "message superseded");
                hub.metrics.drop_reason("superseded");
            }
        }
        if outcome.is_queued() && self.admitted.load(Ordering::Acquire) != 0 {
            self.wake();
        }
        outcome
    }

    /// Admits connection `id` as the node's current one, unless `limit` other nodes are
    /// connected. A replaced connection is closed by the node actor when `id` attaches.
    pub(crate) fn admit(&self, id: u64, hub: &HubContext, limit: usize) -> bool {
        loop {
            let previous = self.admitted.load(Ordering::Acquire);
            if previous == 0 && hub.connected.load(Ordering::Acquire) >= limit {
                return false;
            }
            // A session of this node may end on another thread meanwhile: only the one that
            // swaps the id it saw wins, so the count moves exactly once per transition.
            if self
                .admitted
                .compare_exchange(previous, id, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                if previous == 0 {
                    hub.connected_changed(true);
                }
                return true;
            }
        }
    }

    /// Hands connection `id` to the node's actor. `store_id` is the identity of the edge's
    /// store: another one than on the last connection means the edge lost what it had, so
    /// the ACKed versions are forgotten and EdgeController sends everything again. The first
    /// one this process sees of the node goes to EdgeController, which compares it with the
    /// one recorded on the Node (a store replaced while no cloud, or another one, ran).
    pub(crate) fn attach(
        &self,
        id: u64,
        session: SessionHandle,
        stats: Arc<ConnectionStats>,
        store_id: Option<String>,
        hub: &HubContext,
    ) {
        let (replaced, new_store, resync, first_seen) = {
            let mut state = self.lock();
            let (new_store, first_seen) = match (&state.store_id, &store_id) {
                (Some(known), Some(now)) => (known != now, None),
                (None, Some(now)) => (false, Some(now.clone())),
                (_, None) => (false, None),
            };
            if store_id.is_some() {
                state.store_id = store_id.clone();
            }
            if new_store {
                state.resync_owed = true;
            }
            let resync = state.resync_owed;
            let replaced = state.incoming.replace(Connection {
                id,
                session,
                since: SystemTime::now(),
                stats,
            });
            (replaced, new_store, resync, first_seen)
        };
        // A replica records that it serves the node (one write per session start), and
        // writes to it once it knows what the edge acknowledged elsewhere (`records_read`).
        // A process alone that has not yet read its records at start waits for them too:
        // its pool starts empty, though the edge may hold all it would send.
        if hub.ownership.is_replica() {
            self.held.store(true, Ordering::Release);
        } else if hub.awaits_records() {
            self.held.store(true, Ordering::SeqCst);
            // The records came between the look and the hold: nothing is left to wait for.
            if !hub.records_pending.load(Ordering::SeqCst) {
                self.held.store(false, Ordering::SeqCst);
            }
        }
        if new_store {
            // After the hold is decided: records still to come are the lost store's.
            self.forget_store();
        }
        hub.ownership.session_opened(&self.name, id);
        if let Some(replaced) = replaced {
            close(&replaced, "replaced by a new connection");
        }
        if resync {
            tracing::warn!(node = %self.name, "the edge's store is not the one it had: sending everything bound to it again");
            self.ask_resync(store_id.as_deref().unwrap_or_default(), hub);
        }
        if let Some(store_id) = first_seen {
            let seen = StoreSeen {
                node: self.name.clone(),
                store_id,
            };
            match hub.hive.tell(route::EDGECONTROLLER, seen) {
                Ok(())
                | Err(Refused {
                    error: HiveError::UnknownModule(_),
                    ..
                }) => {}
                Err(refused) => {
                    // Unknown again, so the node's next connection asks again.
                    self.lock().store_id = None;
                    hub.metrics.drop_reason("store_check_undelivered");
                    tracing::warn!(node = %self.name, error = %refused.error, "cannot ask EdgeController about the node's store; asking on the next connection");
                }
            }
        }
        self.post(Attach);
    }

    /// Forgets what the node acknowledged: now, and in its records if they are still to come
    /// (the session waits for them).
    fn forget_store(&self) {
        let mut state = self.lock();
        state.pool.forget_acked();
        if self.held.load(Ordering::Acquire) {
            state.ignore_records = true;
        }
    }

    /// The Node records another store than the one the node connected with (`store_id`):
    /// unless another store connected since, what it acknowledged is forgotten (and its
    /// records, if still to come, are not taken) and EdgeController sends everything again.
    /// Says whether it did.
    pub(crate) fn store_replaced(&self, store_id: &str, hub: &HubContext) -> bool {
        {
            let mut state = self.lock();
            if state.store_id.as_deref() != Some(store_id) {
                return false;
            }
            state.resync_owed = true;
        }
        self.forget_store();
        tracing::warn!(node = %self.name, "the edge's store is not the one the cluster recorded: sending everything bound to it again");
        self.ask_resync(store_id, hub)
    }

    /// Asks EdgeController to send everything bound to the node again (its store is now
    /// `store_id`), counted; the resync stays owed, so the node's next connection asks again,
    /// until EdgeController takes one. Says whether it did.
    fn ask_resync(&self, store_id: &str, hub: &HubContext) -> bool {
        hub.metrics.stores_replaced.inc();
        let resync = ResyncNode {
            node: self.name.clone(),
            store_id: store_id.to_owned(),
        };
        match hub.hive.tell(route::EDGECONTROLLER, resync) {
            Ok(()) => {
                self.lock().resync_owed = false;
                true
            }
            Err(refused) => {
                tracing::warn!(node = %self.name, error = %refused.error, "cannot ask EdgeController to send everything again; asking on the next connection");
                false
            }
        }
    }

    /// The session `id` ended (closed by either side, or its actor stopped).
    pub(crate) fn session_ended(&self, id: u64, hub: &HubContext) {
        if self
            .admitted
            .compare_exchange(id, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            hub.connected_changed(false);
            self.last_keepalive_ms.store(0, Ordering::Relaxed);
        }
        hub.ownership.session_ended(&self.name, id);
        // The node's watches (MetaServer applications) end with the connection that made
        // them. Not running, or full: its next application drops what older connections
        // registered (see dynamiccontroller).
        let ended = SessionEnded {
            node: self.name.clone(),
            session: id,
        };
        if let Err(refused) = hub.hive.tell(route::DYNAMICCONTROLLER, ended) {
            if !matches!(refused.error, HiveError::UnknownModule(_)) {
                hub.metrics.drop_reason("session_event_undelivered");
            }
        }
        self.post(Detach);
    }

    /// The node's records were read (a replica came to serve it, or a process alone read
    /// them at start): what they say the edge acknowledged is not sent again; the session is
    /// written to from now on.
    pub(crate) fn records_read(&self, acked: &[(String, String)]) {
        {
            let mut state = self.lock();
            if std::mem::take(&mut state.ignore_records) {
                tracing::info!(node = %self.name, records = acked.len(), "the node's records are of a store it no longer has: not taken");
            } else {
                for (key, version) in acked {
                    state.pool.note_acked(key, version);
                }
            }
            // Under the lock, so a store found replaced meanwhile sees the records as read.
            self.held.store(false, Ordering::Release);
        }
        self.wake();
    }

    /// Whether the session waits for the node's records (see [`NodeCell::records_read`]).
    pub(crate) fn is_held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// Whether the node has an admitted connection.
    pub(crate) fn is_admitted(&self) -> bool {
        self.admitted.load(Ordering::Acquire) != 0
    }

    /// Closes the node's connection, if it has one; says whether it had.
    pub(crate) fn disconnect(&self, reason: &str, hub: &HubContext) -> bool {
        if self.admitted.swap(0, Ordering::AcqRel) == 0 {
            return false;
        }
        hub.connected_changed(false);
        self.last_keepalive_ms.store(0, Ordering::Relaxed);
        self.lock().close_reason = Some(reason.to_owned());
        // The next drive writes what is queued, then closes the connection.
        self.wake();
        true
    }

    /// Closes connection `id` if it is still the node's admitted one; says whether it was.
    pub(crate) fn disconnect_session(&self, id: u64, reason: &str, hub: &HubContext) -> bool {
        if id == 0
            || self
                .admitted
                .compare_exchange(id, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return false;
        }
        hub.connected_changed(false);
        self.last_keepalive_ms.store(0, Ordering::Relaxed);
        self.lock().close_reason = Some(reason.to_owned());
        self.wake();
        true
    }

    /// The node was deleted from the cluster: its connection is closed after what is queued
    /// (the node delete) is written, and its actor stops for good, pool and all.
    pub(crate) fn retire(&self, hub: &HubContext) {
        self.retired.store(true, Ordering::Release);
        self.disconnect("node deleted", hub);
        self.post(Retire);
    }

    /// Notes a keepalive from the edge (the session calls this; no actor is involved).
    pub(crate) fn keepalive(&self) {
        self.last_keepalive_ms
            .store(unix_ms(SystemTime::now()), Ordering::Relaxed);
    }

    /// Connection `session` sent no keepalive in time (the keepalive wheel says so): it is
    /// closed (Away, "keepalive timeout"). A session the cell no longer holds is being closed
    /// already.
    pub(crate) fn keepalive_missed(&self, session: u64) {
        let handle = {
            let state = self.lock();
            let mut found = None;
            for connection in state.connection.iter().chain(&state.incoming) {
                if connection.id == session {
                    found = Some(connection.session.close.clone());
                }
            }
            found
        };
        if let Some(close) = handle {
            tracing::warn!(node = %self.name, session, "no keepalive in time; closing the session");
            close.do_send(CloseSession {
                code: CloseCode::Away,
                reason: "keepalive timeout".to_owned(),
            });
        }
    }

    /// Counts a frame a session put into the node's mailbox.
    pub(crate) fn queued_one(&self) {
        self.depth.fetch_add(1, Ordering::Relaxed);
    }

    /// Panics the node's actor on purpose (supervision drills and tests).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn crash(&self) {
        self.post(Crash);
    }

    pub(crate) fn info(&self, ownership: &Ownership) -> NodeInfo {
        let state = self.lock();
        let keepalive = self.last_keepalive_ms.load(Ordering::Relaxed);
        NodeInfo {
            node: self.name.clone(),
            connected: state.connection.is_some(),
            connected_since: state.connection.as_ref().map(|c| unix_ms(c.since)),
            last_keepalive: (keepalive != 0).then_some(keepalive),
            ack_queue: state.pool.ack_len(),
            no_ack_queue: state.pool.noack_len(),
            in_flight: state
                .pool
                .in_flight()
                .map(|flight| flight.message.id().to_owned()),
            acked_objects: state.pool.acked_objects(),
            parked: state.pool.parked(),
            sent: state.pool.stats.sent,
            acked: state.pool.stats.acked,
            resends: state.pool.stats.resends,
            restarts: self.restarts.load(Ordering::Relaxed),
            mailbox_depth: self.depth.load(Ordering::Relaxed).max(0),
            owner: ownership.owner(&self.name),
        }
    }

    pub(crate) fn child_info(&self) -> ChildInfo {
        let state = self.lock();
        let connection = state.connection.as_ref().map(|c| ChildInfo {
            name: format!("connection-{}", c.id),
            kind: "connection".into(),
            state: ModuleState::Running,
            restarts: 0,
            messages_handled: c.stats.frames_in.load(Ordering::Relaxed),
            mailbox_depth: 0,
            children: Vec::new(),
        });
        ChildInfo {
            name: self.name.clone(),
            kind: "node".into(),
            state: if self.running.load(Ordering::Relaxed) {
                ModuleState::Running
            } else {
                ModuleState::Restarting
            },
            restarts: self.restarts.load(Ordering::Relaxed),
            messages_handled: self.handled.load(Ordering::Relaxed),
            mailbox_depth: self.depth.load(Ordering::Relaxed).max(0),
            children: connection.into_iter().collect(),
        }
    }
}

/// Closes `connection` with a Normal close frame saying `reason`. `do_send` on purpose: a
/// close must not be refused by a full mailbox, and it is one message per connection.
fn close(connection: &Connection, reason: &str) {
    connection.session.close.do_send(CloseSession {
        code: CloseCode::Normal,
        reason: reason.to_owned(),
    });
}

/// Write what is ready.
#[derive(Message)]
#[rtype(result = "()")]
struct Drive;

/// A connection was admitted (it waits in the cell's `incoming`).
#[derive(Message)]
#[rtype(result = "()")]
struct Attach;

/// A connection ended (the cell's `admitted` says which one is current).
#[derive(Message)]
#[rtype(result = "()")]
struct Detach;

/// A frame from the edge (resource in edge form): an ACK, an error, or a request.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct FromEdge(pub(crate) Message, pub(crate) usize);

/// Panic, for supervision drills.
#[cfg(feature = "test-hooks")]
#[derive(Message)]
#[rtype(result = "()")]
struct Crash;

/// Write what is left, close, and stop for good (the node was deleted).
#[derive(Message)]
#[rtype(result = "()")]
struct Retire;

/// How CloudHub starts, and restarts, a node's actor.
pub(crate) struct NodeRecipe {
    pub(crate) cell: Arc<NodeCell>,
    pub(crate) hub: Arc<HubContext>,
}

impl Recipe for NodeRecipe {
    type Actor = NodeActor;

    fn create(&mut self) -> NodeActor {
        NodeActor {
            cell: self.cell.clone(),
            hub: self.hub.clone(),
            warnings: WarnBudget::default(),
            timer: None,
        }
    }

    fn mailbox_capacity(&self) -> usize {
        NODE_MAILBOX_CAPACITY
    }

    fn failed(&mut self, delay: Duration) {
        let restarts = self.cell.restarts.fetch_add(1, Ordering::Relaxed) + 1;
        self.cell.running.store(false, Ordering::Relaxed);
        self.hub.metrics.node_restarts.inc();
        tracing::warn!(node = %self.cell.name, restarts, ?delay, "node actor stopped or panicked; restarting with its pool");
    }

    fn retired(&self) -> bool {
        self.cell.retired.load(Ordering::Acquire)
    }

    fn stopped(&mut self) {
        self.hub.metrics.node_actors.dec();
        tracing::info!(node = %self.cell.name, "node actor retired");
    }

    fn restarted(&mut self, addr: &Addr<NodeActor>) {
        // What waited in the dead mailbox is gone: the new actor drives from the cell, which
        // holds the pool and the connections; frames from the edge that waited are counted.
        let lost = self.cell.depth.swap(0, Ordering::Relaxed);
        if lost > 0 {
            self.hub
                .metrics
                .dropped
                .get_or_create(&super::metrics::ReasonLabels {
                    reason: "node_restarting".into(),
                })
                .inc_by(lost as u64);
        }
        // The address first: a wake from another thread in between then reaches the new
        // actor (which drives from the cell when it starts anyway).
        self.cell.set_addr(addr.clone());
        self.cell.wake_pending.store(false, Ordering::Release);
        self.cell.running.store(true, Ordering::Relaxed);
    }
}

/// The actor of one edge node; see the [module docs](self).
pub struct NodeActor {
    cell: Arc<NodeCell>,
    hub: Arc<HubContext>,
    /// How many warnings about what this node sends may be logged.
    warnings: WarnBudget,
    /// The pending deadline and its timer.
    timer: Option<(Instant, SpawnHandle)>,
}

impl Actor for NodeActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // A restarted actor picks up where the failed one stopped.
        self.drive(ctx);
    }
}

impl NodeActor {
    fn handled(&self) {
        self.cell.handled.fetch_add(1, Ordering::Relaxed);
        self.hub.metrics.node_messages_handled.inc();
        self.cell.depth.fetch_sub(1, Ordering::Relaxed);
    }

    /// Takes over an admitted connection waiting in the cell (closing the one it replaces);
    /// closes one that is no longer the admitted one.
    fn take_incoming(&self, state: &mut NodeState) {
        let Some(incoming) = state.incoming.take() else {
            return;
        };
        let node = &self.cell.name;
        if incoming.id != self.cell.admitted.load(Ordering::Acquire) {
            close(&incoming, "replaced by a new connection");
            return;
        }
        if let Some(old) = state.connection.take() {
            tracing::info!(%node, old = old.id, new = incoming.id, "node reconnected; closing its previous session");
            close(&old, "replaced by a new connection");
            self.connection_ended(state);
        }
        tracing::info!(%node, session = incoming.id, "node connected");
        state.connection = Some(incoming);
        state.pool.restart_in_flight(Instant::now());
    }

    /// A connection of the node ended: what was on the wire counts a failed delivery.
    fn connection_ended(&self, state: &mut NodeState) {
        let retry = self.hub.options.ack_retry_interval;
        if state.pool.connection_lost(Instant::now(), retry) {
            tracing::warn!(node = %self.cell.name, "a message ended {} connections of this node; parked (tried again every {:?})", super::pool::PARK_AFTER, super::pool::PARKED_RETRY);
            self.hub.metrics.parked.inc();
        }
    }

    /// Closes the connection if it is no longer the admitted one (it ended, or the node was
    /// disconnected): after what was queued before has been written to it.
    fn close_stale(&self, state: &mut NodeState) -> bool {
        let admitted = self.cell.admitted.load(Ordering::Acquire);
        let reason = state.close_reason.take();
        if state.connection.as_ref().is_some_and(|c| c.id != admitted) {
            if let Some(old) = state.connection.take() {
                tracing::info!(node = %self.cell.name, session = old.id, "node disconnected");
                close(&old, reason.as_deref().unwrap_or("disconnected"));
                self.connection_ended(state);
            }
            return true;
        }
        false
    }

    /// Writes what the pool has ready, closes a connection that is no longer admitted, and
    /// sets the deadline for what is due later.
    fn drive(&mut self, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let options = &self.hub.options;
        let metrics = &self.hub.metrics;
        let mut state = self.cell.lock();
        self.take_incoming(&mut state);
        let mut due = None;
        let mut lost = false;
        // Only the replica serving the node writes to it (always so for a process alone); one
        // that stepped down or lost the node keeps its pool and writes nothing.
        let serving = state.connection.is_some()
            && !self.cell.is_held()
            && self.hub.ownership.serves(&self.cell.name);
        if let (Some(connection), true) = (&state.connection, serving) {
            let session = connection.session.write.clone();
            let stats = connection.stats.clone();
            let write = |frame: &NodeMessage| session.try_send(WriteFrame(frame.frame().clone()));
            while let Some(message) = state.pool.front_noack() {
                match write(message) {
                    Ok(()) => {
                        state.pool.pop_noack();
                        metrics.frames_out.inc();
                        stats.frames_out.fetch_add(1, Ordering::Relaxed);
                    }
                    // The session's mailbox is full: the rest waits a moment in the pool.
                    Err(SendError::Full(_)) => {
                        due = Some(now + SESSION_FULL_RETRY);
                        break;
                    }
                    Err(SendError::Closed(_)) => {
                        lost = true;
                        break;
                    }
                }
            }
            if !lost {
                let resends_before = state.pool.stats.resends;
                let polled = state.pool.poll_ack_lane(
                    now,
                    options.ack_retry_interval,
                    options.ack_max_sends,
                );
                if let Some(message) = polled {
                    tracing::debug!(node = %self.cell.name, msg_id = message.id(), resource = message.resource(), "writing ACK-lane message");
                    match write(&message) {
                        Ok(()) => {
                            metrics.frames_out.inc();
                            stats.frames_out.fetch_add(1, Ordering::Relaxed);
                        }
                        // Not written: it does not use up a send, and is tried again shortly.
                        Err(SendError::Full(_)) => {
                            state.pool.unsend(now + SESSION_FULL_RETRY);
                        }
                        Err(SendError::Closed(_)) => lost = true,
                    }
                }
                metrics
                    .resends
                    .inc_by(state.pool.stats.resends.saturating_sub(resends_before));
                let pool_due = state.pool.next_due();
                due = match (due, pool_due) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
        if lost {
            tracing::debug!(node = %self.cell.name, "session actor gone; node disconnected");
            state.connection = None;
            self.connection_ended(&mut state);
        }
        if lost || self.close_stale(&mut state) {
            due = None;
        }
        drop(state);
        self.arm(due, ctx);
    }

    /// Keeps exactly one timer, for `due`; none when nothing is due.
    fn arm(&mut self, due: Option<Instant>, ctx: &mut Context<Self>) {
        if self.timer.as_ref().map(|(at, _)| *at) == due {
            return;
        }
        if let Some((_, handle)) = self.timer.take() {
            ctx.cancel_future(handle);
        }
        if let Some(at) = due {
            let delay = at.saturating_duration_since(Instant::now());
            let handle = ctx.run_later(delay, |node, ctx| {
                node.timer = None;
                node.drive(ctx);
            });
            self.timer = Some((at, handle));
        }
    }

    /// Whether a warning about what the node sent may be logged now (see [`WarnBudget`]).
    fn warning(&mut self) -> Option<u64> {
        let allowed = self.warnings.take(Instant::now());
        if allowed.is_none() {
            self.hub.metrics.warnings_held_back.inc();
        }
        allowed
    }

    /// Tells SyncController (if one runs) what the edge now has.
    fn publish_ack(&self, acked: &NodeMessage) {
        if !acked.is_tracked() {
            // A watch's push: owed only while the watch lasts, not a record.
            return;
        }
        let event = Acked {
            node: self.cell.name.clone(),
            key: acked.key().to_owned(),
            resource: acked.resource().to_owned(),
            resource_version: acked.resource_version().map(str::to_owned),
            deleted: acked.is_delete(),
            object: acked.object().cloned(),
        };
        match self.hub.hive.tell(route::SYNCCONTROLLER, event) {
            Ok(())
            | Err(Refused {
                error: HiveError::UnknownModule(_),
                ..
            }) => {}
            Err(Refused {
                error: HiveError::MailboxFull(_),
                message,
            }) => {
                // SyncController is alive but behind: its record must still learn of this
                // ACK (the reconcile trusts what the pool holds), so the event is offered
                // again, a second apart, for a while.
                self.hub.metrics.drop_reason("ack_event_retried");
                let (hive, node) = (self.hub.hive.clone(), self.cell.name.clone());
                let metrics = self.hub.metrics.clone();
                actix::spawn(async move {
                    let mut event = message;
                    for _ in 0..ACK_EVENT_RETRIES {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        match hive.tell(route::SYNCCONTROLLER, event) {
                            Ok(()) => return,
                            Err(Refused {
                                error: HiveError::MailboxFull(_),
                                message,
                            }) => event = message,
                            Err(_) => break,
                        }
                    }
                    tracing::warn!(%node, "ACK event not delivered to SyncController");
                    metrics.drop_reason("ack_event_undelivered");
                });
            }
            Err(refused) => {
                // SyncController is restarting: it reads the records again, and the reconcile
                // repairs what they miss.
                tracing::warn!(node = %self.cell.name, error = %refused.error, "ACK event not delivered");
                self.hub.metrics.drop_reason("ack_event_undelivered");
            }
        }
    }

    /// Whether `response` is not an ACK but an answer for the extension that claimed its
    /// group: its parent is not the message in flight.
    fn for_an_extension(&self, response: &Message) -> bool {
        if extension::claimant(&self.hub.hive, response).is_none() {
            return false;
        }
        let parent = response.parent_id().unwrap_or_default();
        !self.cell.lock().pool.in_flight_is(parent)
    }

    /// Handles what the edge sent (`bytes`: its frame's length).
    fn on_edge_message(&mut self, message: Message, bytes: usize, ctx: &mut Context<Self>) {
        let cell = self.cell.clone();
        let node = cell.name.as_str();
        match message.operation() {
            // An answer to a message of the cloud's: an ACK, unless it matches nothing in
            // flight and an extension claimed its group (the Router's servicebus answers,
            // KubeEdge's `router_servicebus` responses): then it goes upstream like any
            // message of that group, below.
            Some(Operation::Response) if !self.for_an_extension(&message) => {
                let parent = message.parent_id().unwrap_or_default();
                let acked = {
                    let mut state = self.cell.lock();
                    let acked = state.pool.ack(parent);
                    if let Some(key) = acked.as_deref().and_then(binds) {
                        if state.bound.len() < auth::MAX_BOUND_PER_NODE {
                            state.bound.insert(key);
                        }
                    }
                    acked
                };
                if let Some(acked) = acked {
                    self.hub.metrics.acks.inc();
                    self.publish_ack(&acked);
                    self.drive(ctx);
                } else {
                    tracing::debug!(%node, %parent, "response matches no in-flight message; ignored");
                }
            }
            Some(Operation::Error) => {
                if let Some(held_back) = self.warning() {
                    let content = message.content.to_string();
                    tracing::warn!(%node, parent = %clip(message.parent_id().unwrap_or_default()), content = %clip(&content), held_back, "edge reported an error");
                }
            }
            _ => {
                let verdict = {
                    let mut state = self.cell.lock();
                    let limited = if limits::is_write(&message) {
                        let limits = &self.hub.options.write_limits;
                        state
                            .writes
                            .check(limits, node, &message, bytes, Instant::now())
                    } else {
                        Ok(())
                    };
                    let view = self.hub.security.view.as_deref();
                    limited
                        .and_then(|()| {
                            if self.hub.security.authorize {
                                auth::authorize(node, &message, &state.bound, view)
                            } else {
                                Ok(())
                            }
                        })
                        .and_then(|()| {
                            limits::check_quota(
                                &self.hub.options.write_limits,
                                node,
                                &message,
                                view,
                                &mut state.pending_pods,
                                Instant::now(),
                            )
                        })
                };
                match verdict {
                    Ok(()) => {
                        let session = self.cell.admitted.load(Ordering::Acquire);
                        if let Some(reply) = dispatch::upstream(&self.hub, node, session, message) {
                            self.cell.enqueue(reply, &self.hub);
                        }
                    }
                    Err(denied) => {
                        if let Some(held_back) = self.warning() {
                            tracing::warn!(%node, id = %clip(message.id()), reason = %clip(&denied.text), held_back, "upstream message refused");
                        }
                        self.hub.metrics.deny(denied.reason);
                        self.hub.metrics.record_refusal(
                            RefusalKind::Message,
                            denied.reason,
                            Some(node),
                            None,
                            &denied.text,
                        );
                        let reply = dispatch::refusal(node, &message, denied.text);
                        self.cell.enqueue(reply, &self.hub);
                    }
                }
            }
        }
    }
}

impl Handler<Drive> for NodeActor {
    type Result = ();

    fn handle(&mut self, _: Drive, ctx: &mut Context<Self>) {
        self.handled();
        self.cell.wake_pending.store(false, Ordering::Release);
        self.drive(ctx);
    }
}

impl Handler<Attach> for NodeActor {
    type Result = ();

    fn handle(&mut self, _: Attach, ctx: &mut Context<Self>) {
        self.handled();
        // Alone, a session waits for the records read at start no longer than a replica's
        // (whose wait CloudHub bounds once the node is its own).
        if !self.hub.ownership.is_replica() && self.cell.is_held() {
            ctx.run_later(RECORDS_WAIT, |act, _| {
                if act.cell.is_held() {
                    tracing::warn!(node = %act.cell.name, wait = ?RECORDS_WAIT, "the sync records were not read in time; serving the node without them");
                    act.cell.records_read(&[]);
                }
            });
        }
        self.drive(ctx);
    }
}

impl Handler<Detach> for NodeActor {
    type Result = ();

    fn handle(&mut self, _: Detach, ctx: &mut Context<Self>) {
        self.handled();
        self.drive(ctx);
    }
}

impl Handler<FromEdge> for NodeActor {
    type Result = ();

    fn handle(&mut self, FromEdge(message, bytes): FromEdge, ctx: &mut Context<Self>) {
        self.handled();
        self.on_edge_message(message, bytes, ctx);
    }
}

impl Handler<Retire> for NodeActor {
    type Result = ();

    fn handle(&mut self, _: Retire, ctx: &mut Context<Self>) {
        self.handled();
        self.drive(ctx);
        ctx.stop();
    }
}

#[cfg(feature = "test-hooks")]
impl Handler<Crash> for NodeActor {
    type Result = ();

    fn handle(&mut self, _: Crash, _: &mut Context<Self>) {
        self.handled();
        panic!("node {} told to crash (supervision drill)", self.cell.name);
    }
}
