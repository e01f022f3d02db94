//! A node's message pool: what CloudHub still has to deliver to one edge node.
//!
//! Unlike KubeEdge, whose pool lives and dies with a connection (messages queued while the
//! node is offline are lost there and only ObjectSync resends repair it), the pool is owned
//! outside the session: it survives disconnects, reconnects and CloudHub restarts.
//!
//! Two lanes, chosen by [`needs_ack`] (KubeEdge's DispatchDownstream rules):
//! - the ACK lane: one entry per object (keyed by `content.metadata.uid`, else the resource
//!   string), newer resourceVersions replace older pending ones, sent one at a time and
//!   resent until the edge ACKs;
//! - the no-ACK lane: a bounded FIFO written once.
//!
//! The pool also remembers the resourceVersion each object was last ACKed at (what KubeEdge
//! keeps in ObjectSync), so an object the edge already has is not sent again.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use edgehive_protocols::{CloudResource, Group, Message, ModuleName, Operation, ResourceType};

/// Longest wait before a message that was never ACKed is tried again.
pub const MAX_REQUEUE_BACKOFF: Duration = Duration::from_secs(60);

/// Whether `message` goes to the ACK lane (`true`) or is written once without ACK (`false`).
///
/// No ACK, as in KubeEdge's cloudhub, if any of: the resource mentions `podlist`,
/// `membership`, `twin/cloud_updated`, `serviceaccounttoken` or `k8s/ca.crt`; the operation is
/// a CSI volume operation or `applicationResponse`; the group is `user`; the source is
/// `taskmanager` or `nodeupgradejobcontroller`; it is a `response` whose content is the string
/// `"OK"`; or the source is `edgecontroller` and the resource type is node (unless the
/// operation is update), lease, nodepatch, podpatch, podstatus, certificatesigningrequest, or
/// pod with operation `response`. (KubeEdge also treats a response carrying a Go error as
/// no-ACK; a Go error has no wire form we can recognise, so such replies take the ACK lane.)
pub fn needs_ack(message: &Message) -> bool {
    const NO_ACK_RESOURCES: [&str; 5] = [
        "podlist",
        "membership",
        "twin/cloud_updated",
        "serviceaccounttoken",
        "k8s/ca.crt",
    ];
    let resource = message.resource();
    if NO_ACK_RESOURCES.iter().any(|part| resource.contains(part)) {
        return false;
    }
    let operation = message.operation();
    if matches!(
        operation,
        Some(
            Operation::CreateVolume
                | Operation::DeleteVolume
                | Operation::ControllerPublishVolume
                | Operation::ControllerUnpublishVolume
                | Operation::ApplicationResponse
        )
    ) {
        return false;
    }
    if message.group() == Some(&Group::User) {
        return false;
    }
    if let Some(source) = message.source() {
        if matches!(source, ModuleName::TaskManager)
            || source.as_str() == "nodeupgradejobcontroller"
        {
            return false;
        }
    }
    let is_response = operation == Some(&Operation::Response);
    if is_response && message.content_str() == Some("OK") {
        return false;
    }
    if message.source() == Some(&ModuleName::EdgeController) {
        if let Ok(parsed) = CloudResource::parse(resource) {
            let no_ack = match parsed.resource_type {
                ResourceType::Node => operation != Some(&Operation::Update),
                ResourceType::Lease
                | ResourceType::NodePatch
                | ResourceType::PodPatch
                | ResourceType::PodStatus
                | ResourceType::CertificateSigningRequest => true,
                ResourceType::Pod => is_response,
                _ => false,
            };
            if no_ack {
                return false;
            }
        }
    }
    true
}

/// Whether resourceVersion `new` is newer than `old`, comparing them as unsigned integers.
///
/// A version that is not a number is never newer (and never makes anything panic).
pub fn is_newer(new: &str, old: &str) -> bool {
    match (new.parse::<u64>(), old.parse::<u64>()) {
        (Ok(new), Ok(old)) => new > old,
        _ => false,
    }
}

/// The ACK-lane key of a message: the object's UID, or the resource string when the content
/// has none (responses, device messages).
pub fn ack_key(message: &Message) -> String {
    message.content["metadata"]["uid"]
        .as_str()
        .filter(|uid| !uid.is_empty())
        .map(str::to_owned)
        .unwrap_or_else(|| message.resource().to_owned())
}

fn is_delete_op(message: &Message) -> bool {
    message.operation() == Some(&Operation::Delete)
}

/// Deleting objects may travel without a resourceVersion (SyncController's deletes do).
fn is_deleting(message: &Message) -> bool {
    is_delete_op(message) || !message.content["metadata"]["deletionTimestamp"].is_null()
}

/// How big a pool may grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLimits {
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
pub enum Enqueued {
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
    pub fn is_queued(self) -> bool {
        matches!(
            self,
            Enqueued::NoAck | Enqueued::NoAckOldestDropped | Enqueued::Ack | Enqueued::Replaced
        )
    }
}

#[derive(Debug, Clone)]
struct Pending {
    message: Message,
    not_before: Option<Instant>,
    failures: u32,
}

/// The ACK-lane message currently on the wire, waiting for its ACK.
#[derive(Debug, Clone)]
pub struct InFlight {
    /// Its ACK-lane key.
    pub key: String,
    /// The message exactly as written (resent with the same msg_id).
    pub message: Message,
    /// How often it was written on the current session.
    pub sends: u32,
    /// When it is due again (resend or give up).
    pub due: Instant,
    failures: u32,
}

/// Per-node delivery counters, kept with the pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Frames written (first sends, resends and no-ACK messages).
    pub sent: u64,
    /// ACKs matched.
    pub acked: u64,
    /// Resends of an unACKed message.
    pub resends: u64,
    /// Messages dropped by the pool (overflow, stale, no resourceVersion).
    pub dropped: u64,
}

/// One node's pending messages; see the module docs.
#[derive(Debug)]
pub struct NodePool {
    limits: PoolLimits,
    pending: HashMap<String, Pending>,
    /// Send order of the pending keys; each key appears once.
    order: VecDeque<String>,
    in_flight: Option<InFlight>,
    /// Object key -> resourceVersion the edge ACKed last (grows with the objects on the
    /// node; deletes remove their entry).
    acked: HashMap<String, String>,
    noack: VecDeque<Message>,
    /// Delivery counters.
    pub stats: PoolStats,
}

impl NodePool {
    /// An empty pool.
    pub fn new(limits: PoolLimits) -> Self {
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
    pub fn enqueue(&mut self, message: Message) -> Enqueued {
        let outcome = self.enqueue_inner(message);
        if !outcome.is_queued() || outcome == Enqueued::NoAckOldestDropped {
            self.stats.dropped += 1;
        }
        outcome
    }

    /// Queues `message` in the no-ACK lane whatever [`needs_ack`] says (CloudHub's own
    /// replies, e.g. an `error` for a refused request).
    pub fn enqueue_noack(&mut self, message: Message) -> Enqueued {
        let mut outcome = Enqueued::NoAck;
        if self.noack.len() >= self.limits.noack_capacity.max(1) {
            self.noack.pop_front();
            outcome = Enqueued::NoAckOldestDropped;
            self.stats.dropped += 1;
        }
        self.noack.push_back(message);
        outcome
    }

    fn enqueue_inner(&mut self, message: Message) -> Enqueued {
        if !needs_ack(&message) {
            let mut outcome = Enqueued::NoAck;
            if self.noack.len() >= self.limits.noack_capacity.max(1) {
                self.noack.pop_front();
                outcome = Enqueued::NoAckOldestDropped;
            }
            self.noack.push_back(message);
            return outcome;
        }
        let delete = is_delete_op(&message);
        let exempt = is_deleting(&message) || message.is_response();
        let rv = message.resource_version().unwrap_or_default().to_owned();
        if rv.is_empty() && !exempt {
            return Enqueued::NoResourceVersion;
        }
        let key = ack_key(&message);
        if let Some(flight) = &self.in_flight {
            if flight.key == key {
                if is_delete_op(&flight.message) {
                    return Enqueued::DeletePending;
                }
                if !exempt && !is_newer(&rv, flight.message.resource_version().unwrap_or("")) {
                    return Enqueued::Stale;
                }
            }
        }
        if let Some(pending) = self.pending.get_mut(&key) {
            if is_delete_op(&pending.message) {
                return Enqueued::DeletePending;
            }
            if !exempt && !is_newer(&rv, pending.message.resource_version().unwrap_or("")) {
                return Enqueued::Stale;
            }
            pending.message = message;
            return Enqueued::Replaced;
        }
        if !exempt && !delete {
            if let Some(acked) = self.acked.get(&key) {
                if !is_newer(&rv, acked) {
                    return Enqueued::AlreadyAcked;
                }
            }
        }
        if self.pending.len() >= self.limits.ack_capacity.max(1) {
            return Enqueued::AckQueueFull;
        }
        self.pending.insert(
            key.clone(),
            Pending {
                message,
                not_before: None,
                failures: 0,
            },
        );
        self.order.push_back(key);
        Enqueued::Ack
    }

    /// The oldest no-ACK message, left in place until [`NodePool::pop_noack`] confirms it
    /// was handed to the session.
    pub fn front_noack(&self) -> Option<&Message> {
        self.noack.front()
    }

    /// Removes the oldest no-ACK message after it was written.
    pub fn pop_noack(&mut self) -> Option<Message> {
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
    pub fn poll_ack_lane(
        &mut self,
        now: Instant,
        retry: Duration,
        max_sends: u32,
    ) -> Option<Message> {
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
                Some(_) => self.requeue_in_flight(now, retry),
                None => {
                    if !self.take_next(now) {
                        return None;
                    }
                }
            }
        }
    }

    /// Makes the in-flight message due at once with a fresh send budget (a new session).
    pub fn restart_in_flight(&mut self, now: Instant) {
        if let Some(flight) = &mut self.in_flight {
            flight.sends = 0;
            flight.due = now;
        }
    }

    /// The edge ACKed `parent_id`. Returns the message it ACKed if that is the one in flight
    /// (anything else is ignored, as KubeEdge does).
    pub fn ack(&mut self, parent_id: &str) -> Option<Message> {
        let matches = self
            .in_flight
            .as_ref()
            .is_some_and(|flight| flight.message.id() == parent_id);
        if !matches {
            return None;
        }
        let flight = self.in_flight.take()?;
        self.stats.acked += 1;
        if is_delete_op(&flight.message) {
            self.acked.remove(&flight.key);
        } else if let Some(rv) = flight.message.resource_version() {
            let newer = self
                .acked
                .get(&flight.key)
                .is_none_or(|old| is_newer(rv, old));
            if newer {
                self.acked.insert(flight.key.clone(), rv.to_owned());
            }
        }
        Some(flight.message)
    }

    /// The message in flight, if any.
    pub fn in_flight(&self) -> Option<&InFlight> {
        self.in_flight.as_ref()
    }

    /// Objects waiting in the ACK lane (not counting the one in flight).
    pub fn ack_len(&self) -> usize {
        self.pending.len()
    }

    /// Messages waiting in the no-ACK lane.
    pub fn noack_len(&self) -> usize {
        self.noack.len()
    }

    /// Objects with a recorded ACKed resourceVersion.
    pub fn acked_objects(&self) -> usize {
        self.acked.len()
    }

    /// The resourceVersion at which the edge last ACKed object `key`.
    pub fn acked_version(&self, key: &str) -> Option<&str> {
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
            if !is_deleting(&message) && !message.is_response() {
                if let (Some(rv), Some(acked)) = (message.resource_version(), self.acked.get(&key))
                {
                    if !is_newer(rv, acked) {
                        self.stats.dropped += 1;
                        continue;
                    }
                }
            }
            self.in_flight = Some(InFlight {
                key,
                message,
                sends: 0,
                due: now,
                failures: pending.failures,
            });
            return true;
        }
        false
    }

    fn requeue_in_flight(&mut self, now: Instant, retry: Duration) {
        let Some(flight) = self.in_flight.take() else {
            return;
        };
        let failures = flight.failures.saturating_add(1);
        let factor = 2u32.saturating_pow(failures.min(16));
        let backoff = retry.saturating_mul(factor).min(MAX_REQUEUE_BACKOFF);
        let not_before = Some(now + backoff);
        match self.pending.get_mut(&flight.key) {
            // A newer message for the object arrived meanwhile; it inherits the backoff.
            Some(newer) => {
                newer.not_before = not_before;
                newer.failures = failures;
            }
            None => {
                self.pending.insert(
                    flight.key.clone(),
                    Pending {
                        message: flight.message,
                        not_before,
                        failures,
                    },
                );
                self.order.push_back(flight.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const LIMITS: PoolLimits = PoolLimits {
        ack_capacity: 3,
        noack_capacity: 2,
    };
    const RETRY: Duration = Duration::from_millis(100);

    fn pod(uid: &str, rv: &str, op: Operation) -> Message {
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

    fn written(action: Option<Message>) -> Message {
        action.expect("expected a write")
    }

    #[test]
    fn ack_rules_follow_kubeedge() {
        assert!(needs_ack(&pod("a", "1", Operation::Insert)));
        let ok = Message::response_to(&pod("a", "1", Operation::Insert), json!("OK"));
        assert!(!needs_ack(&ok));
        let reply = Message::response_to(&pod("a", "1", Operation::Query), json!({"x": 1}));
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

    #[test]
    fn versions_compare_as_integers_and_never_panic() {
        assert!(is_newer("10", "9"));
        assert!(!is_newer("9", "10"));
        assert!(!is_newer("abc", "1"));
        assert!(!is_newer("2", ""));
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
        let ok = |n: &str| Message::response_to(&pod(n, "1", Operation::Insert), json!("OK"));
        assert_eq!(pool.enqueue(ok("1")), Enqueued::NoAck);
        assert_eq!(pool.enqueue(ok("2")), Enqueued::NoAck);
        assert_eq!(pool.enqueue(ok("3")), Enqueued::NoAckOldestDropped);
        assert_eq!(pool.front_noack().unwrap().resource(), ok("2").resource());
        assert_eq!(pool.noack_len(), 2);
        assert_eq!(pool.stats.dropped, 2);
    }
}
