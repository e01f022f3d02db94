//! A node's message pool: what CloudHub still has to deliver to one edge node.
//!
//! Unlike KubeEdge, whose pool lives and dies with a connection (messages queued while the
//! node is offline are lost there and only ObjectSync resends repair it), the pool belongs to
//! the node's recipe: it survives disconnects, reconnects and restarts of the node's actor.
//!
//! Two lanes, chosen by [`needs_ack`] (KubeEdge's DispatchDownstream rules) when the
//! [`NodeMessage`] was built:
//! - the ACK lane: one entry per object (keyed by `content.metadata.uid`, else the resource
//!   string), newer resourceVersions replace older pending ones, sent one at a time and
//!   resent until the edge ACKs;
//! - the no-ACK lane: a bounded FIFO written once.
//!
//! Entries are `Arc<NodeMessage>`: the frame was encoded once for every node that gets it,
//! and a resend writes the same bytes.
//!
//! The pool also remembers the resourceVersion each object was last ACKed at (what KubeEdge
//! keeps in ObjectSync), so an object the edge already has is not sent again.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cloud::contract::{Lane, NodeMessage};
use edgehive_protocols::object::is_newer;

/// Longest wait before a message that was never ACKed is tried again.
pub(super) const MAX_REQUEUE_BACKOFF: Duration = Duration::from_secs(60);

/// Connections lost while a message was on the wire after which it is parked: it is then
/// tried only every [`PARKED_RETRY`], counted and shown, and never blocks the rest (an
/// object the edge cannot take, e.g. larger than its frame limit, ends every connection).
pub(super) const PARK_AFTER: u32 = 5;

/// How often a parked message is tried again.
pub(super) const PARKED_RETRY: Duration = Duration::from_secs(600);

/// How big a pool may grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PoolLimits {
    /// Most distinct objects waiting in the ACK lane. Overflow policy: a message for a new
    /// object is refused and counted ([`Enqueued::AckQueueFull`]); updates of objects already
    /// waiting still replace their entry, so the newest state of those is never lost.
    pub ack_capacity: usize,
    /// Most messages waiting in the no-ACK lane. Overflow policy: the oldest is dropped and
    /// counted ([`Enqueued::NoAckOldestDropped`]).
    pub noack_capacity: usize,
}

/// What [`NodePool::enqueue`] did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Enqueued {
    /// Queued in the no-ACK lane.
    NoAck,
    /// Queued in the no-ACK lane after dropping its oldest message (lane full).
    NoAckOldestDropped,
    /// Queued in the ACK lane as a new entry.
    Ack,
    /// Replaced an older pending message for the same object.
    Replaced,
    /// Dropped: not newer than what is pending or in flight for the object.
    Stale,
    /// Dropped: a delete of the object is already pending or in flight.
    DeletePending,
    /// Dropped: the edge already ACKed this or a newer version of the object.
    AlreadyAcked,
    /// Dropped: a non-delete message without a resourceVersion cannot be ordered.
    NoResourceVersion,
    /// Dropped: the ACK lane is full (see [`PoolLimits::ack_capacity`]).
    AckQueueFull,
}

impl Enqueued {
    /// Whether the message is now waiting to be sent.
    pub(crate) fn is_queued(self) -> bool {
        matches!(
            self,
            Enqueued::NoAck | Enqueued::NoAckOldestDropped | Enqueued::Ack | Enqueued::Replaced
        )
    }
}

#[derive(Debug, Clone)]
struct Pending {
    message: Arc<NodeMessage>,
    not_before: Option<Instant>,
    failures: u32,
    /// Connections that ended while it was on the wire.
    lost_connections: u32,
}

/// The ACK-lane message currently on the wire, waiting for its ACK.
#[derive(Debug, Clone)]
pub(super) struct InFlight {
    /// The message exactly as written (resent with the same msg_id and bytes).
    pub message: Arc<NodeMessage>,
    /// How often it was written on the current session.
    pub sends: u32,
    /// When it is due again (resend or give up).
    pub due: Instant,
    failures: u32,
    lost_connections: u32,
}

/// Per-node delivery counters, kept with the pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct PoolStats {
    /// Frames written (first sends, resends and no-ACK messages).
    pub sent: u64,
    /// ACKs matched.
    pub acked: u64,
    /// Resends of an unACKed message.
    pub resends: u64,
    /// Messages dropped by the pool (overflow, stale, no resourceVersion).
    pub dropped: u64,
    /// Messages parked (see [`PARK_AFTER`]).
    pub parked: u64,
}

/// One node's pending messages; see the module docs.
#[derive(Debug)]
pub(super) struct NodePool {
    limits: PoolLimits,
    pending: HashMap<String, Pending>,
    /// Send order of the pending keys; each key appears once.
    order: VecDeque<String>,
    in_flight: Option<InFlight>,
    /// Object key -> resourceVersion the edge ACKed last (grows with the objects on the
    /// node; deletes remove their entry).
    acked: HashMap<String, String>,
    noack: VecDeque<Arc<NodeMessage>>,
    /// Delivery counters.
    pub stats: PoolStats,
}

impl NodePool {
    /// An empty pool.
    pub(super) fn new(limits: PoolLimits) -> Self {
        NodePool {
            limits,
            pending: HashMap::new(),
            order: VecDeque::new(),
            in_flight: None,
            acked: HashMap::new(),
            noack: VecDeque::new(),
            stats: PoolStats::default(),
        }
    }

    /// Queues `message` according to the rules in the module docs.
    pub(super) fn enqueue(&mut self, message: Arc<NodeMessage>) -> Enqueued {
        let outcome = match message.lane() {
            Lane::NoAck => self.push_noack(message),
            Lane::Ack => self.enqueue_ack(message),
        };
        if !outcome.is_queued() || outcome == Enqueued::NoAckOldestDropped {
            self.stats.dropped += 1;
        }
        outcome
    }

    fn push_noack(&mut self, message: Arc<NodeMessage>) -> Enqueued {
        let mut outcome = Enqueued::NoAck;
        if self.noack.len() >= self.limits.noack_capacity.max(1) {
            self.noack.pop_front();
            outcome = Enqueued::NoAckOldestDropped;
        }
        self.noack.push_back(message);
        outcome
    }

    fn enqueue_ack(&mut self, message: Arc<NodeMessage>) -> Enqueued {
        let exempt = message.is_deleting() || message.is_response();
        let rv = message.resource_version().unwrap_or_default();
        if rv.is_empty() && !exempt {
            return Enqueued::NoResourceVersion;
        }
        let key = message.key();
        if let Some(flight) = &self.in_flight {
            if flight.message.key() == key {
                if flight.message.is_delete() {
                    return Enqueued::DeletePending;
                }
                if !exempt && !at_least(&message, rv, flight.message.resource_version()) {
                    return Enqueued::Stale;
                }
            }
        }
        if let Some(pending) = self.pending.get_mut(key) {
            if pending.message.is_delete() {
                return Enqueued::DeletePending;
            }
            if !exempt && !at_least(&message, rv, pending.message.resource_version()) {
                return Enqueued::Stale;
            }
            pending.message = message;
            if pending.lost_connections >= PARK_AFTER {
                // A new version gets a fresh chance.
                pending.lost_connections = 0;
                pending.failures = 0;
                pending.not_before = None;
            }
            return Enqueued::Replaced;
        }
        if !exempt && !message.is_delete() && !message.is_resend() && !message.is_refresh() {
            if let Some(acked) = self.acked.get(key) {
                if !is_newer(rv, acked) {
                    return Enqueued::AlreadyAcked;
                }
            }
        }
        if self.pending.len() >= self.limits.ack_capacity.max(1) {
            return Enqueued::AckQueueFull;
        }
        let key = key.to_owned();
        self.pending.insert(
            key.clone(),
            Pending {
                message,
                not_before: None,
                failures: 0,
                lost_connections: 0,
            },
        );
        self.order.push_back(key);
        Enqueued::Ack
    }

    /// The oldest no-ACK message, left in place until [`NodePool::pop_noack`] confirms it
    /// was handed to the session.
    pub(super) fn front_noack(&self) -> Option<&Arc<NodeMessage>> {
        self.noack.front()
    }

    /// Removes the oldest no-ACK message after it was written.
    pub(super) fn pop_noack(&mut self) -> Option<Arc<NodeMessage>> {
        let message = self.noack.pop_front();
        if message.is_some() {
            self.stats.sent += 1;
        }
        message
    }

    /// Decides what the ACK lane writes at `now`.
    ///
    /// An in-flight message that is due is resent (same msg_id) until it has been written
    /// `max_sends` times; when it is due after that, it goes back into the queue with a
    /// backoff of `retry × 2^failures` (at most [`MAX_REQUEUE_BACKOFF`]) so the next object
    /// gets its turn. With nothing in flight, the next pending object whose backoff is over
    /// is taken. Returns the message to write now (first send or resend), if any; the pool
    /// counts it as written.
    pub(super) fn poll_ack_lane(
        &mut self,
        now: Instant,
        retry: Duration,
        max_sends: u32,
    ) -> Option<Arc<NodeMessage>> {
        loop {
            match &mut self.in_flight {
                Some(flight) if now < flight.due => return None,
                Some(flight) if flight.sends < max_sends.max(1) => {
                    if flight.sends > 0 {
                        self.stats.resends += 1;
                    }
                    flight.sends += 1;
                    flight.due = now + retry;
                    self.stats.sent += 1;
                    return Some(flight.message.clone());
                }
                Some(_) => {
                    self.requeue_in_flight(now, retry, false);
                }
                None => {
                    if !self.take_next(now) {
                        return None;
                    }
                }
            }
        }
    }

    /// When the ACK lane next has something to do on its own (a resend, a give-up, a backoff
    /// that ends); `None` when only a new message or an ACK can make it act.
    pub(super) fn next_due(&self) -> Option<Instant> {
        if let Some(flight) = &self.in_flight {
            return Some(flight.due);
        }
        self.order
            .iter()
            .filter_map(|key| self.pending.get(key))
            .map(|pending| pending.not_before)
            .min_by(|a, b| match (a, b) {
                (None, _) => std::cmp::Ordering::Less,
                (_, None) => std::cmp::Ordering::Greater,
                (Some(a), Some(b)) => a.cmp(b),
            })
            .map(|not_before| not_before.unwrap_or_else(Instant::now))
    }

    /// The in-flight message that [`NodePool::poll_ack_lane`] just returned could not be
    /// written: it does not count as sent, and is due again at `retry_at`.
    pub(super) fn unsend(&mut self, retry_at: Instant) {
        if let Some(flight) = &mut self.in_flight {
            if flight.sends > 1 {
                self.stats.resends = self.stats.resends.saturating_sub(1);
            }
            flight.sends = flight.sends.saturating_sub(1);
            flight.due = retry_at;
            self.stats.sent = self.stats.sent.saturating_sub(1);
        }
    }

    /// Makes the in-flight message due at once with a fresh send budget (a new session).
    pub(super) fn restart_in_flight(&mut self, now: Instant) {
        if let Some(flight) = &mut self.in_flight {
            flight.sends = 0;
            flight.due = now;
        }
    }

    /// Whether the message in flight (waiting for its ACK) is `id`.
    pub(super) fn in_flight_is(&self, id: &str) -> bool {
        self.in_flight
            .as_ref()
            .is_some_and(|flight| flight.message.id() == id)
    }

    /// The edge ACKed `parent_id`. Returns the message it ACKed if that is the one in flight
    /// (anything else is ignored, as KubeEdge does).
    pub(super) fn ack(&mut self, parent_id: &str) -> Option<Arc<NodeMessage>> {
        if !self.in_flight_is(parent_id) {
            return None;
        }
        let flight = self.in_flight.take()?;
        self.stats.acked += 1;
        let key = flight.message.key();
        if flight.message.is_delete() {
            self.acked.remove(key);
        } else if let Some(rv) = flight.message.resource_version() {
            let newer = self.acked.get(key).is_none_or(|old| is_newer(rv, old));
            if newer {
                self.acked.insert(key.to_owned(), rv.to_owned());
            }
        }
        Some(flight.message)
    }

    /// The message in flight, if any.
    pub(super) fn in_flight(&self) -> Option<&InFlight> {
        self.in_flight.as_ref()
    }

    /// Objects waiting in the ACK lane (not counting the one in flight).
    pub(super) fn ack_len(&self) -> usize {
        self.pending.len()
    }

    /// Messages waiting in the no-ACK lane.
    pub(super) fn noack_len(&self) -> usize {
        self.noack.len()
    }

    /// Objects with a recorded ACKed resourceVersion.
    pub(super) fn acked_objects(&self) -> usize {
        self.acked.len()
    }

    /// The resourceVersion at which the edge last ACKed object `key`.
    #[cfg(test)]
    pub(crate) fn acked_version(&self, key: &str) -> Option<&str> {
        self.acked.get(key).map(String::as_str)
    }

    fn take_next(&mut self, now: Instant) -> bool {
        let mut index = 0;
        while index < self.order.len() {
            let key = &self.order[index];
            let ready = self
                .pending
                .get(key)
                .is_none_or(|p| p.not_before.is_none_or(|t| t <= now));
            if !ready {
                index += 1;
                continue;
            }
            let Some(key) = self.order.remove(index) else {
                return false;
            };
            let Some(pending) = self.pending.remove(&key) else {
                continue;
            };
            let message = pending.message;
            // A resend goes even at a version the pool has seen ACKed: the record that asked
            // for it says otherwise, and only the edge's ACK settles it.
            if !message.is_deleting()
                && !message.is_response()
                && !message.is_resend()
                && !message.is_refresh()
            {
                if let (Some(rv), Some(acked)) = (message.resource_version(), self.acked.get(&key))
                {
                    if !is_newer(rv, acked) {
                        self.stats.dropped += 1;
                        continue;
                    }
                }
            }
            self.in_flight = Some(InFlight {
                message,
                sends: 0,
                due: now,
                failures: pending.failures,
                lost_connections: pending.lost_connections,
            });
            return true;
        }
        false
    }

    /// The node's connection ended. A message written on it and not ACKed counts a lost
    /// connection and goes to the back of the queue, so what waits behind it gets its turn
    /// first (no backoff: a flapping link must not delay delivery); after [`PARK_AFTER`] of
    /// those it is parked. Returns whether it was parked
    /// just now.
    pub(super) fn connection_lost(&mut self, now: Instant, retry: Duration) -> bool {
        if self
            .in_flight
            .as_ref()
            .is_some_and(|flight| flight.sends > 0)
        {
            return self.requeue_in_flight(now, retry, true);
        }
        false
    }

    /// The edge acknowledged `version` of object `key` (to another replica: its record says
    /// so): a version not newer waiting here is not sent.
    pub(super) fn note_acked(&mut self, key: &str, version: &str) {
        let newer = self
            .acked
            .get(key)
            .is_none_or(|acked| is_newer(version, acked));
        if newer {
            self.acked.insert(key.to_owned(), version.to_owned());
        }
    }

    /// Forgets which versions the edge ACKed (its store was replaced): everything is sent
    /// again.
    pub(super) fn forget_acked(&mut self) {
        self.acked.clear();
    }

    /// Objects parked (see [`PARK_AFTER`]).
    pub(super) fn parked(&self) -> usize {
        self.pending
            .values()
            .filter(|pending| pending.lost_connections >= PARK_AFTER)
            .count()
    }

    fn requeue_in_flight(&mut self, now: Instant, retry: Duration, lost_connection: bool) -> bool {
        let Some(flight) = self.in_flight.take() else {
            return false;
        };
        // A lost connection is not the edge failing to ACK: no backoff for it (the edge's
        // reconnect backoff paces the retries), only the count that parks a message that
        // keeps ending connections. An ACK that never came backs off.
        let failures = flight.failures.saturating_add(u32::from(!lost_connection));
        let lost_connections = flight
            .lost_connections
            .saturating_add(u32::from(lost_connection));
        let parked_now = lost_connections == PARK_AFTER && lost_connection;
        let factor = 2u32.saturating_pow(failures.min(16));
        let not_before = if lost_connections >= PARK_AFTER {
            Some(now + PARKED_RETRY)
        } else if lost_connection {
            None
        } else {
            Some(now + retry.saturating_mul(factor).min(MAX_REQUEUE_BACKOFF))
        };
        if parked_now {
            self.stats.parked += 1;
        }
        let key = flight.message.key().to_owned();
        match self.pending.get_mut(&key) {
            // A newer message for the object arrived meanwhile: it gets a fresh chance, with
            // the backoff of an ordinary retry.
            Some(newer) => {
                newer.not_before = (!lost_connection)
                    .then(|| now + retry.saturating_mul(factor).min(MAX_REQUEUE_BACKOFF));
                newer.failures = failures;
            }
            None => {
                self.pending.insert(
                    key.clone(),
                    Pending {
                        message: flight.message,
                        not_before,
                        failures,
                        lost_connections,
                    },
                );
                self.order.push_back(key);
            }
        }
        parked_now
    }
}

/// Whether `message` at `rv` may take the place of one at `old`: a newer version, or, for a
/// watch's corrected view ([`NodeMessage::is_refresh`]), the same one.
fn at_least(message: &NodeMessage, rv: &str, old: Option<&str>) -> bool {
    let old = old.unwrap_or("");
    is_newer(rv, old) || (message.is_refresh() && rv == old)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::contract::needs_ack;
    use edgehive_protocols::{trim_for_edge, Group, Message, ModuleName, Operation};
    use serde_json::json;

    const LIMITS: PoolLimits = PoolLimits {
        ack_capacity: 3,
        noack_capacity: 2,
    };
    const RETRY: Duration = Duration::from_millis(100);

    fn msg(uid: &str, rv: &str, op: Operation) -> Message {
        let msg = Message::new(
            ModuleName::EdgeController,
            Group::Resource,
            op,
            format!("node/edge-1/default/pod/{uid}"),
            json!({"kind": "Pod", "metadata": {"name": uid, "uid": uid, "resourceVersion": rv}}),
        );
        if rv.is_empty() {
            msg
        } else {
            msg.with_resource_version(rv)
        }
    }

    fn pod(uid: &str, rv: &str, op: Operation) -> Arc<NodeMessage> {
        NodeMessage::new(&msg(uid, rv, op))
    }

    fn written(action: Option<Arc<NodeMessage>>) -> Arc<NodeMessage> {
        action.expect("expected a write")
    }

    #[test]
    fn ack_rules_follow_kubeedge() {
        assert!(needs_ack(&msg("a", "1", Operation::Insert)));
        let ok = Message::response_to(&msg("a", "1", Operation::Insert), json!("OK"));
        assert!(!needs_ack(&ok));
        let reply = Message::response_to(&msg("a", "1", Operation::Query), json!({"x": 1}));
        assert!(!needs_ack(&reply), "edgecontroller pod+response is no-ACK");
        let ca = Message::new(
            ModuleName::CloudHub,
            Group::Resource,
            Operation::Response,
            "node/edge-1/k8s/ca.crt",
            json!(""),
        );
        assert!(!needs_ack(&ca));
        let membership = Message::new(
            ModuleName::DeviceController,
            Group::Twin,
            Operation::Update,
            "node/edge-1/membership",
            json!({}),
        );
        assert!(!needs_ack(&membership));
        let status = Message::new(
            ModuleName::EdgeController,
            Group::Resource,
            Operation::Update,
            "node/edge-1/default/podstatus/p",
            json!("OK"),
        );
        assert!(!needs_ack(&status));
        let node_update = Message::new(
            ModuleName::EdgeController,
            Group::Resource,
            Operation::Update,
            "node/edge-1/null/node/edge-1",
            json!({}),
        );
        assert!(needs_ack(&node_update));
    }

    /// A reply an edge waits for is written once whatever its group: an `error` reply (no
    /// resourceVersion, nothing the edge ACKs) and a reply without a group used to take the
    /// ACK lane, which dropped the error (`no_resource_version`) and resent the other until
    /// a timeout. A reply with an object in group `resource` (a remote query's configmap,
    /// which MetaManager stores and ACKs) stays in the ACK lane, as in KubeEdge.
    #[test]
    fn a_reply_no_edge_acks_is_written_once_whatever_its_group() {
        let request = Message::new(
            ModuleName::from("gadget"),
            Group::from("gadget"),
            Operation::from("get"),
            "node/edge-1/default/gadget/g1",
            json!("which"),
        );
        let mut pool = NodePool::new(LIMITS);
        let refusal = Message::error_to(&request, "no such gadget");
        assert_eq!(refusal.group(), None);
        assert!(!needs_ack(&refusal));
        assert_eq!(pool.enqueue(NodeMessage::new(&refusal)), Enqueued::NoAck);
        let mut grouped = refusal.clone();
        grouped.route.group = Some(Group::Resource);
        grouped.route.source = Some(ModuleName::EdgeController);
        assert!(!needs_ack(&grouped), "an error is never ACKed");
        let mut bare = Message::response_to(&request, json!({"gadget": "g1"}));
        bare.route.group = None;
        assert!(!needs_ack(&bare));
        bare.route.group = Some(Group::from(""));
        assert!(!needs_ack(&bare));
        assert_eq!(pool.enqueue(NodeMessage::new(&bare)), Enqueued::NoAck);
        // Still ACK lane: a query's answer with its object, and a push that is no reply.
        let query = Message::new(
            ModuleName::Edged,
            Group::Meta,
            Operation::Query,
            "node/edge-1/default/configmap/cm",
            json!(null),
        );
        let mut answer = Message::response_to(&query, json!({"kind": "ConfigMap"}));
        answer.route.source = Some(ModuleName::EdgeController);
        answer.route.group = Some(Group::Resource);
        assert!(needs_ack(&answer));
        let mut push = msg("a", "1", Operation::Update);
        push.route.group = None;
        assert!(needs_ack(&push), "not a reply: no parent");
    }

    #[test]
    fn newer_version_replaces_pending_and_older_is_dropped() {
        let mut pool = NodePool::new(LIMITS);
        assert_eq!(
            pool.enqueue(pod("a", "5", Operation::Insert)),
            Enqueued::Ack
        );
        assert_eq!(
            pool.enqueue(pod("a", "4", Operation::Update)),
            Enqueued::Stale
        );
        assert_eq!(
            pool.enqueue(pod("a", "x", Operation::Update)),
            Enqueued::Stale
        );
        assert_eq!(
            pool.enqueue(pod("a", "6", Operation::Update)),
            Enqueued::Replaced
        );
        assert_eq!(pool.ack_len(), 1);
        let sent = written(pool.poll_ack_lane(Instant::now(), RETRY, 5));
        assert_eq!(sent.resource_version(), Some("6"));
    }

    #[test]
    fn pending_delete_is_never_replaced_and_missing_versions_are_dropped() {
        let mut pool = NodePool::new(LIMITS);
        assert_eq!(
            pool.enqueue(pod("a", "", Operation::Update)),
            Enqueued::NoResourceVersion
        );
        assert_eq!(pool.enqueue(pod("a", "", Operation::Delete)), Enqueued::Ack);
        assert_eq!(
            pool.enqueue(pod("a", "9", Operation::Update)),
            Enqueued::DeletePending
        );
        assert_eq!(
            pool.enqueue(pod("a", "", Operation::Delete)),
            Enqueued::DeletePending
        );
        assert_eq!(pool.stats.dropped, 3);
    }

    #[test]
    fn acked_versions_are_not_sent_again() {
        let mut pool = NodePool::new(LIMITS);
        let now = Instant::now();
        pool.enqueue(pod("a", "5", Operation::Insert));
        let sent = written(pool.poll_ack_lane(now, RETRY, 5));
        assert_eq!(pool.ack("not-it"), None);
        assert!(pool.ack(sent.id()).is_some());
        assert_eq!(pool.acked_version("a"), Some("5"));
        assert_eq!(
            pool.enqueue(pod("a", "5", Operation::Insert)),
            Enqueued::AlreadyAcked
        );
        assert_eq!(
            pool.enqueue(pod("a", "6", Operation::Update)),
            Enqueued::Ack
        );
        // The delete clears the record.
        written(pool.poll_ack_lane(now, RETRY, 5));
        let flight = pool.in_flight().unwrap().message.clone();
        pool.ack(flight.id());
        pool.enqueue(pod("a", "", Operation::Delete));
        let delete = written(pool.poll_ack_lane(now, RETRY, 5));
        pool.ack(delete.id());
        assert_eq!(pool.acked_objects(), 0);
    }

    #[test]
    fn unacked_message_is_resent_then_requeued_with_backoff() {
        let mut pool = NodePool::new(LIMITS);
        let t0 = Instant::now();
        pool.enqueue(pod("a", "1", Operation::Insert));
        pool.enqueue(pod("b", "2", Operation::Insert));
        let first = written(pool.poll_ack_lane(t0, RETRY, 2));
        assert_eq!(pool.poll_ack_lane(t0, RETRY, 2), None);
        let again = written(pool.poll_ack_lane(t0 + RETRY, RETRY, 2));
        assert_eq!(again, first, "a resend is the same frame");
        // Two sends used up: "a" goes back with a backoff and "b" gets its turn.
        let next = written(pool.poll_ack_lane(t0 + RETRY * 2, RETRY, 2));
        assert_eq!(next.resource_version(), Some("2"));
        assert_eq!(pool.stats.resends, 1);
        pool.ack(next.id());
        assert_eq!(pool.poll_ack_lane(t0 + RETRY * 2, RETRY, 2), None);
        let retried = written(pool.poll_ack_lane(t0 + RETRY * 4, RETRY, 2));
        assert_eq!(retried.id(), first.id());
    }

    #[test]
    fn a_message_that_keeps_ending_connections_is_parked_not_dropped() {
        let mut pool = NodePool::new(LIMITS);
        let mut now = Instant::now();
        pool.enqueue(pod("big", "1", Operation::Insert));
        pool.enqueue(pod("next", "2", Operation::Insert));
        for lost in 1..=PARK_AFTER {
            // Written (after its backoff), then the connection dies before any ACK.
            now += MAX_REQUEUE_BACKOFF;
            let big = written(pool.poll_ack_lane(now, RETRY, 5));
            assert_eq!(big.key(), "big", "round {lost}");
            assert_eq!(pool.connection_lost(now, RETRY), lost == PARK_AFTER);
            // What waited behind it gets its turn meanwhile.
            if lost == 1 {
                let next = written(pool.poll_ack_lane(now, RETRY, 5));
                assert_eq!(next.key(), "next");
                pool.ack(next.id());
            }
        }
        assert_eq!((pool.parked(), pool.stats.parked), (1, 1));
        // Parked: not tried before PARKED_RETRY, but not gone.
        assert_eq!(
            pool.poll_ack_lane(now + MAX_REQUEUE_BACKOFF, RETRY, 5),
            None
        );
        let again = written(pool.poll_ack_lane(now + PARKED_RETRY, RETRY, 5));
        assert_eq!(again.key(), "big");
        // A newer version gets a fresh chance.
        assert!(
            !pool.connection_lost(now + PARKED_RETRY, RETRY),
            "parked once only"
        );
        assert_eq!(
            pool.enqueue(pod("big", "9", Operation::Update)),
            Enqueued::Replaced
        );
        assert_eq!(pool.parked(), 0);
    }

    #[test]
    fn a_corrected_view_goes_at_the_version_acked_pending_or_in_flight() {
        let mut pool = NodePool::new(LIMITS);
        let now = Instant::now();
        pool.enqueue(pod("a", "5", Operation::Insert));
        let first = written(pool.poll_ack_lane(now, RETRY, 5));
        // In flight at 5: the corrected view waits behind it instead of being dropped.
        let refresh = NodeMessage::refresh(msg("a", "5", Operation::Update));
        assert_eq!(pool.enqueue(refresh.clone()), Enqueued::Ack);
        // Pending at 5: a later correction at 5 replaces it.
        let again = NodeMessage::refresh(msg("a", "5", Operation::Update));
        assert_eq!(pool.enqueue(again.clone()), Enqueued::Replaced);
        // A plain push at 5 does not replace it.
        assert_eq!(
            pool.enqueue(pod("a", "5", Operation::Update)),
            Enqueued::Stale
        );
        pool.ack(first.id());
        let sent = written(pool.poll_ack_lane(now, RETRY, 5));
        assert_eq!(sent.id(), again.id(), "the last correction is written");
        pool.ack(sent.id());
        // ACKed at 5: a correction still goes.
        let third = NodeMessage::refresh(msg("a", "5", Operation::Update));
        assert_eq!(pool.enqueue(third.clone()), Enqueued::Ack);
        assert_eq!(written(pool.poll_ack_lane(now, RETRY, 5)).id(), third.id());
    }

    #[test]
    fn a_resend_goes_even_at_a_version_already_acked() {
        let mut pool = NodePool::new(LIMITS);
        let now = Instant::now();
        pool.enqueue(pod("a", "5", Operation::Insert));
        let first = written(pool.poll_ack_lane(now, RETRY, 5));
        pool.ack(first.id());
        assert_eq!(
            pool.enqueue(pod("a", "5", Operation::Update)),
            Enqueued::AlreadyAcked
        );
        let resend = NodeMessage::resend(msg("a", "5", Operation::Update));
        assert_eq!(pool.enqueue(resend.clone()), Enqueued::Ack);
        let sent = written(pool.poll_ack_lane(now, RETRY, 5));
        assert_eq!(
            sent.id(),
            resend.id(),
            "written, not dropped as already ACKed"
        );
    }

    #[test]
    fn a_lost_connection_requeues_at_the_back_without_delay() {
        let mut pool = NodePool::new(LIMITS);
        let now = Instant::now();
        pool.enqueue(pod("a", "1", Operation::Insert));
        pool.enqueue(pod("b", "2", Operation::Insert));
        let a = written(pool.poll_ack_lane(now, RETRY, 5));
        assert_eq!(a.key(), "a");
        assert!(!pool.connection_lost(now, RETRY));
        pool.restart_in_flight(now);
        // On the next connection, at once: first what waited behind it, then it.
        let b = written(pool.poll_ack_lane(now, RETRY, 5));
        assert_eq!(b.key(), "b");
        pool.ack(b.id());
        let again = written(pool.poll_ack_lane(now, RETRY, 5));
        assert_eq!(again.id(), a.id());
    }

    #[test]
    fn lanes_are_bounded() {
        let mut pool = NodePool::new(LIMITS);
        for uid in ["a", "b", "c"] {
            assert_eq!(
                pool.enqueue(pod(uid, "1", Operation::Insert)),
                Enqueued::Ack
            );
        }
        assert_eq!(
            pool.enqueue(pod("d", "1", Operation::Insert)),
            Enqueued::AckQueueFull
        );
        assert_eq!(
            pool.enqueue(pod("a", "2", Operation::Update)),
            Enqueued::Replaced
        );
        let ok = |n: &str| Message::response_to(&msg(n, "1", Operation::Insert), json!("OK"));
        assert_eq!(pool.enqueue(NodeMessage::new(&ok("1"))), Enqueued::NoAck);
        assert_eq!(pool.enqueue(NodeMessage::new(&ok("2"))), Enqueued::NoAck);
        assert_eq!(
            pool.enqueue(NodeMessage::new(&ok("3"))),
            Enqueued::NoAckOldestDropped
        );
        assert_eq!(
            pool.front_noack().unwrap().resource(),
            trim_for_edge(ok("2").resource())
        );
        assert_eq!(pool.noack_len(), 2);
        assert_eq!(pool.stats.dropped, 2);
    }
}
