//! What EdgeHub's actor, its link task and the pending requests share, and which outlives a
//! restart of the actor: the outbox, the pending requests, the counters, the node's identity.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edgehive_protocols::{Message, Operation};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{oneshot, Notify};

use super::options::failover_order;
use crate::edge::certmanager::EdgeIdentity;
use crate::edge::contract::{CloudConnection, ConnectionState, EdgeHubError, EdgeHubStatus};
use crate::hive::locks::lock;
use crate::hive::Hive;

/// How long the WebSocket handshake may take (edgehub's `handshakeTimeout`).
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one frame write may take before the connection is considered dead
/// (edgehub's `writeDeadline`).
pub(super) const WRITE_TIMEOUT: Duration = Duration::from_secs(15);
/// Shortest wait between dials, whatever the options say, so a zero setting cannot spin.
pub(super) const MIN_RECONNECT: Duration = Duration::from_millis(10);
/// Most requests to the cloud awaiting a reply at once; more are refused at once.
pub(super) const MAX_PENDING_REQUESTS: usize = 1024;

#[derive(Debug, Clone, Default)]
pub(super) struct HubMetrics {
    pub(super) malformed: Counter,
    pub(super) outbox_dropped: Counter,
    pub(super) unroutable: Counter,
    pub(super) undelivered: Counter,
    pub(super) connects: Counter,
    pub(super) switches: Counter,
    pub(super) connected: Gauge,
    pub(super) outbox: Gauge,
    pub(super) requests_cut: Counter,
}

impl HubMetrics {
    pub(super) fn register(hive: &Hive) -> HubMetrics {
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
            "edgehive_edgehub_server_switches",
            "Connects to another cloud address than the one connected to before",
            metrics.switches.clone(),
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
        registry.register(
            "edgehive_edgehub_requests_connection_lost",
            "Requests failed at once because the connection they were written on was lost",
            metrics.requests_cut.clone(),
        );
        metrics
    }
}

#[derive(Debug, Default)]
pub(super) struct HubState {
    pub(super) connects: u64,
    /// The number of the last connection made ([`Shared::connected_to`]); a request written
    /// on a connection is failed when that connection ends.
    pub(super) connection: u64,
    pub(super) last_error: Option<String>,
    /// The cloud address of the connection up now.
    pub(super) server: Option<String>,
    /// The cloud address of the last connection (up or not): a connect elsewhere is a switch.
    pub(super) last_server: Option<String>,
    /// Connects to another address than the last one.
    pub(super) switches: u64,
    /// Where in the address list the next round of dials starts: the address that worked.
    pub(super) next_server: usize,
    /// The address whose connection was lost (none since a connect): the next round dials
    /// the others first, from a place of this edge's own, and it last.
    pub(super) lost_server: Option<usize>,
    /// Overflow policy: when full, the oldest message is dropped and counted. The cloud
    /// resends what the edge has not acknowledged, so the newest messages are the valuable ones.
    pub(super) outbox: VecDeque<Message>,
    /// ACKs and error replies: written before the outbox and not throttled by the rate
    /// limit (a report upload must never delay an ACK until the cloud resends). Same bound
    /// and policy as the outbox.
    pub(super) replies: VecDeque<Message>,
}

/// State shared by the actor, its connection task and pending requests; outlives restarts.
/// Every critical section of its locks is a few field updates, so a panic cannot leave them
/// torn (see [`lock`]).
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) state: Mutex<HubState>,
    pub(super) outbox_ready: Notify,
    pub(super) replies_ready: Notify,
    /// Requests awaiting a cloud reply, by request id; bounded by [`MAX_PENDING_REQUESTS`].
    pub(super) pending: Mutex<HashMap<String, Waiter>>,
    pub(super) metrics: HubMetrics,
    pub(super) outbox_capacity: usize,
    /// The node's TLS identity once loaded or bootstrapped.
    pub(super) identity: Mutex<Option<EdgeIdentity>>,
    /// The connection state, the edge's one copy: written here only.
    pub(super) connection: Arc<CloudConnection>,
}

/// What a request awaiting the cloud's reply leaves in [`Shared::pending`].
#[derive(Debug)]
pub(super) struct Waiter {
    /// Tells the request's task the reply, or why none will come.
    pub(super) reply: oneshot::Sender<Result<Message, EdgeHubError>>,
    /// This registration's own number: the request's task removes the entry only while it is
    /// still its own (a caller that sends the same message again after
    /// [`EdgeHubError::ConnectionLost`] registers the same id anew).
    pub(super) token: u64,
    /// The connection the request was written on; `None` while it waits in the outbox.
    pub(super) written_on: Option<u64>,
}

/// Whether `message` answers the cloud (an ACK or an error), rather than telling it something.
pub(super) fn is_reply(message: &Message) -> bool {
    matches!(
        message.operation(),
        Some(Operation::Response | Operation::Error)
    )
}

impl Shared {
    pub(super) fn enqueue(&self, message: Message) {
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
        let mut dropped_ids = Vec::new();
        while state.outbox.len() >= self.outbox_capacity.max(1) {
            if let Some(dropped) = state.outbox.pop_front() {
                self.metrics.outbox_dropped.inc();
                tracing::warn!(
                    id = dropped.id(),
                    resource = dropped.resource(),
                    "edgehub outbox full; dropped the oldest message"
                );
                dropped_ids.push(dropped.id().to_owned());
            }
        }
        state.outbox.push_back(message);
        self.metrics.outbox.set(state.outbox.len() as i64);
        drop(state);
        self.outbox_ready.notify_one();
        self.dropped_from_outbox(&dropped_ids);
    }

    /// Messages `ids` were dropped from the full outbox, never written: those that are
    /// requests awaiting a reply fail now with [`EdgeHubError::DroppedFromOutbox`] (their
    /// callers fall back, or send them again) instead of waiting out the request timeout for
    /// a reply that cannot come. Returns how many failed.
    pub(super) fn dropped_from_outbox(&self, ids: &[String]) -> usize {
        if ids.is_empty() {
            return 0;
        }
        let failed: Vec<Waiter> = {
            let mut pending = lock(&self.pending);
            let mut failed = Vec::new();
            for id in ids {
                // Still queued, never written (a request written on a connection is that
                // connection's to fail).
                if pending
                    .get(id.as_str())
                    .is_some_and(|waiter| waiter.written_on.is_none())
                {
                    failed.extend(pending.remove(id.as_str()));
                }
            }
            failed
        };
        let count = failed.len();
        if count > 0 {
            tracing::warn!(
                requests = count,
                "requests dropped from the full outbox while the cloud was away failed; their callers may send them again"
            );
        }
        for waiter in failed {
            // The caller may have given up already; nobody else wants the outcome.
            let _ = waiter.reply.send(Err(EdgeHubError::DroppedFromOutbox));
        }
        count
    }

    /// Waits for the next message to write. Cancel-safe: the pop and the return happen in one
    /// poll, so a message is never lost when the caller's `select!` picks another branch.
    pub(super) async fn next_outgoing(&self) -> Message {
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
    pub(super) async fn next_reply(&self) -> Message {
        loop {
            if let Some(message) = lock(&self.state).replies.pop_front() {
                return message;
            }
            self.replies_ready.notified().await;
        }
    }

    /// Puts back a message whose write failed, ahead of everything else of its lane.
    pub(super) fn requeue(&self, message: Message) {
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
    pub(super) fn set_connected(&self, connected: bool, error: Option<String>) -> bool {
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

    /// The order the next round dials a list of `count` addresses in: each once, in turn,
    /// from the address that worked. Once its connection was lost, the others come first,
    /// starting `spread` places after it (counted among the others, so each edge of a fleet
    /// picks its own survivor and a dead cloud's edges spread over the rest), and the lost
    /// one last.
    pub(super) fn round_order(&self, count: usize, spread: usize) -> Vec<usize> {
        let count = count.max(1);
        let state = lock(&self.state);
        match state.lost_server {
            Some(lost) => failover_order(lost, count, spread),
            None => {
                let start = state.next_server % count;
                (0..count).map(|step| (start + step) % count).collect()
            }
        }
    }

    /// Records a connect to `server`, the address at `index` of the list; a connect to
    /// another address than the last one counts as a switch. Returns the connection's number.
    pub(super) fn connected_to(&self, index: usize, server: &str) -> u64 {
        let mut state = lock(&self.state);
        state.connection += 1;
        if state
            .last_server
            .as_deref()
            .is_some_and(|last| last != server)
        {
            state.switches += 1;
            self.metrics.switches.inc();
        }
        state.next_server = index;
        state.lost_server = None;
        state.server = Some(server.to_owned());
        state.last_server = Some(server.to_owned());
        state.connection
    }

    /// `message` was written on connection `connection`: if it is a request awaiting a
    /// reply, that connection's loss fails it ([`Shared::connection_lost`]).
    pub(super) fn written(&self, message: &Message, connection: u64) {
        if let Some(waiter) = lock(&self.pending).get_mut(message.id()) {
            waiter.written_on = Some(connection);
        }
    }

    /// Connection `connection` is gone: the requests written on it get no reply, so each
    /// fails now with [`EdgeHubError::ConnectionLost`] (its caller may send it again) instead
    /// of waiting out the request timeout. Requests still in the outbox stay, for the next
    /// connection. Returns how many failed.
    pub(super) fn connection_lost(&self, connection: u64) -> usize {
        let cut: Vec<Waiter> = {
            let mut pending = lock(&self.pending);
            let ids: Vec<String> = pending
                .iter()
                .filter(|(_, waiter)| waiter.written_on == Some(connection))
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter().filter_map(|id| pending.remove(id)).collect()
        };
        let count = cut.len();
        self.metrics.requests_cut.inc_by(count as u64);
        for waiter in cut {
            // The caller may have given up already; nobody else wants the outcome.
            let _ = waiter.reply.send(Err(EdgeHubError::ConnectionLost));
        }
        count
    }

    /// Records that the connection to the address at `index` ended: the next round dials
    /// the others first ([`round_order`](Self::round_order)).
    pub(super) fn lost(&self, index: usize) {
        let mut state = lock(&self.state);
        state.server = None;
        state.next_server = index;
        state.lost_server = Some(index);
    }

    pub(super) fn record_error(&self, error: String) {
        lock(&self.state).last_error = Some(error);
    }

    pub(super) fn status(&self) -> EdgeHubStatus {
        let state = lock(&self.state);
        EdgeHubStatus {
            connected: self.connection.current().is_connected(),
            connects: state.connects,
            outbox: state.outbox.len(),
            last_error: state.last_error.clone(),
            server: state.server.clone(),
            server_switches: state.switches,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared() -> Shared {
        Shared {
            state: Mutex::new(HubState::default()),
            outbox_ready: Notify::new(),
            replies_ready: Notify::new(),
            pending: Mutex::new(HashMap::new()),
            metrics: HubMetrics::default(),
            outbox_capacity: 8,
            identity: Mutex::new(None),
            connection: Arc::new(CloudConnection::default()),
        }
    }

    /// A request of module `x` numbered `n`.
    fn request(n: u64) -> Message {
        Message::new(
            edgehive_protocols::ModuleName::from("x"),
            edgehive_protocols::Group::User,
            Operation::Upload,
            format!("default/x/{n}"),
            serde_json::Value::Null,
        )
    }

    /// Registers a waiter for `message` (not yet written), as `request` does; its answer.
    fn await_reply(
        hub: &Shared,
        message: &Message,
        token: u64,
    ) -> oneshot::Receiver<Result<Message, EdgeHubError>> {
        let (reply, answer) = oneshot::channel();
        lock(&hub.pending).insert(
            message.id().to_owned(),
            Waiter {
                reply,
                token,
                written_on: None,
            },
        );
        answer
    }

    #[test]
    fn a_lost_connection_fails_the_requests_written_on_it_and_keeps_the_queued_ones() {
        let hub = shared();
        let (written, queued, earlier) = (request(1), request(2), request(3));
        let mut answers = Vec::new();
        for (token, message) in [&written, &queued, &earlier].into_iter().enumerate() {
            answers.push(await_reply(&hub, message, token as u64));
        }
        let first = hub.connected_to(0, "a:1");
        hub.written(&earlier, first);
        hub.lost(0);
        let second = hub.connected_to(0, "a:1");
        assert_eq!(second, first + 1, "each connection its own number");
        hub.written(&written, second);
        // The earlier connection's loss was handled when it ended; ending it again fails it
        // once, and leaves the others.
        assert_eq!(hub.connection_lost(first), 1);
        assert_eq!(hub.connection_lost(second), 1);
        assert_eq!(hub.connection_lost(second), 0);
        let mut answers = answers.into_iter();
        let written_answer = answers.next().unwrap();
        let mut queued_answer = answers.next().unwrap();
        assert_eq!(
            written_answer.blocking_recv().unwrap(),
            Err(EdgeHubError::ConnectionLost)
        );
        assert!(
            queued_answer.try_recv().is_err(),
            "the queued one still waits"
        );
        assert!(lock(&hub.pending).contains_key(queued.id()));
        assert_eq!(hub.metrics.requests_cut.get(), 2);
    }

    #[test]
    fn a_request_pushed_out_of_the_full_outbox_fails_at_once_and_the_newer_ones_wait() {
        let hub = shared();
        let requests: Vec<Message> = (0..10).map(request).collect();
        let mut answers = Vec::new();
        for (token, message) in requests.iter().enumerate() {
            answers.push(await_reply(&hub, message, token as u64));
            hub.enqueue(message.clone());
        }
        // Capacity 8: the two oldest were pushed out and failed; the eight newer wait.
        for (n, mut answer) in answers.into_iter().enumerate() {
            if n < 2 {
                assert_eq!(
                    answer.try_recv().unwrap(),
                    Err(EdgeHubError::DroppedFromOutbox)
                );
                assert!(!lock(&hub.pending).contains_key(requests[n].id()));
            } else {
                assert!(answer.try_recv().is_err(), "request {n} still waits");
                assert!(lock(&hub.pending).contains_key(requests[n].id()));
            }
        }
        assert_eq!(hub.metrics.outbox_dropped.get(), 2);
        assert_eq!(hub.status().outbox, 8);
    }

    #[test]
    fn rounds_start_where_a_connection_worked_and_move_on_once_it_is_lost() {
        let hub = shared();
        assert_eq!(hub.round_order(2, 0), [0, 1], "the first address first");
        // The first is dead; the second answers: no switch, that is where we are.
        hub.connected_to(1, "b:1");
        assert_eq!(hub.round_order(2, 0), [1, 0]);
        assert_eq!(hub.status().server.as_deref(), Some("b:1"));
        assert_eq!(hub.status().server_switches, 0);
        // Lost: the next round starts with the other one, the lost one last.
        hub.lost(1);
        assert_eq!(hub.round_order(2, 0), [0, 1]);
        assert_eq!(hub.round_order(2, 7), [0, 1]);
        assert_eq!(hub.status().server, None);
        hub.connected_to(0, "a:1");
        assert_eq!(hub.status().server_switches, 1);
        assert_eq!(hub.metrics.switches.get(), 1);
        // Back on the same address after a loss: no switch.
        hub.lost(0);
        hub.connected_to(0, "a:1");
        assert_eq!(hub.status().server_switches, 1);
        // One address (a VIP): always it.
        hub.lost(0);
        assert_eq!(hub.round_order(1, 3), [0]);
    }

    #[test]
    fn after_a_loss_each_edge_starts_at_its_own_survivor_and_dials_every_address() {
        let hub = shared();
        hub.connected_to(1, "b:1");
        hub.lost(1);
        // Four addresses, the second lost: the spread picks where among the other three the
        // round starts; every address is dialed once, the lost one last.
        assert_eq!(hub.round_order(4, 0), [2, 3, 0, 1]);
        assert_eq!(hub.round_order(4, 1), [3, 0, 2, 1]);
        assert_eq!(hub.round_order(4, 2), [0, 2, 3, 1]);
        assert_eq!(hub.round_order(4, 5), [0, 2, 3, 1]);
        // A connect ends it: the next round starts where it worked.
        hub.connected_to(3, "d:1");
        assert_eq!(hub.round_order(4, 1), [3, 0, 1, 2]);
    }
}
