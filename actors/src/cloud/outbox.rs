//! The way cloud controllers (EdgeController, DeviceController) hand messages to CloudHub
//! without losing them when CloudHub's mailbox is full or it is restarting. What travels is the contract's [`ToNodes`]: a
//! message encoded once, with the nodes that get it.

use std::collections::VecDeque;

use edgehive_protocols::Message;
use prometheus_client::metrics::counter::Counter;

use crate::cloud::contract::{route, NodeDeleted, ToNodes};
use crate::hive::Hive;

/// Messages kept while CloudHub is full or restarting. A controller waits for
/// [`Outbox::room`] before taking its next cluster event, so the buffer holds at most this
/// many plus what one event produces; a watch that falls behind meanwhile is relisted.
pub(crate) const BUFFER_CAPACITY: usize = 1024;

/// The last resort, never reached while the controllers wait for room: past this many kept
/// messages the oldest is dropped, logged and counted in the owner's overflow counter (the
/// reconcile repairs what it carried).
pub(crate) const BUFFER_LIMIT: usize = 16 * BUFFER_CAPACITY;

/// How long a controller waits before offering kept messages to CloudHub again.
pub(crate) const RETRY_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// What waits in the buffer, in order.
#[derive(Debug)]
enum Kept {
    Message(ToNodes),
    /// A node deleted from the cluster: its session is closed after what came before.
    Disconnect(String),
}

/// A bounded buffer in front of CloudHub; see [`BUFFER_CAPACITY`].
#[derive(Debug)]
pub(crate) struct Outbox {
    hive: Hive,
    buffer: VecDeque<Kept>,
    sent: Counter,
    overflow: Counter,
}

impl Outbox {
    /// An empty outbox counting into `sent` and `overflow`.
    pub(crate) fn new(hive: Hive, sent: Counter, overflow: Counter) -> Self {
        Outbox {
            hive,
            buffer: VecDeque::new(),
            sent,
            overflow,
        }
    }

    /// Whether messages wait for CloudHub.
    pub(crate) fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }

    /// Whether the buffer is at [`BUFFER_CAPACITY`]: take no more cluster events until
    /// [`Outbox::room`].
    pub(crate) fn is_full(&self) -> bool {
        self.buffer.len() >= BUFFER_CAPACITY
    }

    /// Waits until CloudHub has taken enough of what is kept for the buffer to be below
    /// [`BUFFER_CAPACITY`]: the backpressure that keeps a burst of cluster events (a list of
    /// 100,000 pods) from overflowing it.
    pub(crate) async fn room(&mut self) {
        loop {
            self.flush();
            if !self.is_full() {
                return;
            }
            tokio::time::sleep(RETRY_INTERVAL).await;
        }
    }

    /// Sends `message` (resource in cloud form, naming its node) now, or keeps it (behind
    /// anything already kept, to keep the order).
    pub(crate) fn send(&mut self, message: Message) {
        let resource = message.resource().to_owned();
        match ToNodes::from_message(message) {
            Some(to_nodes) => self.send_to(to_nodes),
            None => tracing::warn!(%resource, "message names no node; dropped"),
        }
    }

    /// Sends `to_nodes` now, or keeps it (behind anything already kept, to keep the order).
    pub(crate) fn send_to(&mut self, message: ToNodes) {
        self.send_kept(Kept::Message(message));
    }

    /// Closes `node`'s session after everything queued before has reached CloudHub, and has
    /// CloudHub forget it: a deleted node must not stay connected, nor keep a pool.
    pub(crate) fn disconnect(&mut self, node: &str) {
        self.send_kept(Kept::Disconnect(node.to_owned()));
    }

    fn send_kept(&mut self, kept: Kept) {
        if self.buffer.is_empty() {
            if let Some(kept) = self.offer_kept(kept) {
                self.keep(kept);
            }
        } else {
            self.keep(kept);
        }
    }

    /// Hands `kept` to CloudHub; gives it back if CloudHub is full or not running.
    fn offer_kept(&self, kept: Kept) -> Option<Kept> {
        match kept {
            Kept::Message(message) => offer(&self.hive, &self.sent, message).map(Kept::Message),
            Kept::Disconnect(node) => match self.hive.tell(route::CLOUDHUB, NodeDeleted { node }) {
                Ok(()) => None,
                Err(refused) => Some(Kept::Disconnect(refused.message.node)),
            },
        }
    }

    fn keep(&mut self, kept: Kept) {
        if self.buffer.len() >= BUFFER_LIMIT {
            if let Some(lost) = self.buffer.pop_front() {
                match lost {
                    Kept::Message(lost) => tracing::warn!(
                        resource = lost.message.resource(),
                        "cloudhub unavailable and buffer at its limit; oldest message dropped"
                    ),
                    Kept::Disconnect(node) => tracing::warn!(
                        %node,
                        "cloudhub unavailable and buffer at its limit; a deleted node's session stays open until it reconnects"
                    ),
                }
                self.overflow.inc();
            }
        }
        self.buffer.push_back(kept);
    }

    /// Offers the kept messages to CloudHub again, in order, until one is refused.
    pub(crate) fn flush(&mut self) {
        while let Some(kept) = self.buffer.pop_front() {
            if let Some(kept) = self.offer_kept(kept) {
                self.buffer.push_front(kept);
                return;
            }
        }
    }
}

/// Hands `message` to CloudHub; gives it back if CloudHub is full or not running.
pub(crate) fn offer(hive: &Hive, sent: &Counter, message: ToNodes) -> Option<ToNodes> {
    match hive.tell(route::CLOUDHUB, message) {
        Ok(()) => {
            sent.inc();
            None
        }
        Err(refused) => Some(refused.message),
    }
}

/// How long a reply to an edge's request waits for room in CloudHub's mailbox before it is
/// given up (logged and counted by the caller).
pub(crate) const REPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Hands a reply to an edge's request (resource in cloud form, naming its node) to CloudHub,
/// waiting up to [`REPLY_WAIT`] for a slot in its mailbox. A burst of requests fills that
/// mailbox in a moment, and a reply refused there would leave the edge waiting its whole
/// request timeout; the caller holds a worker permit meanwhile, so what waits is bounded.
/// `false` when CloudHub did not take it (not running, or full that long) or it names no node.
pub(crate) async fn deliver_reply(hive: &Hive, sent: &Counter, message: Message) -> bool {
    let Some(to_nodes) = ToNodes::from_message(message) else {
        return false;
    };
    match hive.ask(route::CLOUDHUB, to_nodes, REPLY_WAIT).await {
        Ok(()) => {
            sent.inc();
            true
        }
        Err(_) => false,
    }
}

/// [`offer`] for a message whose cloud-form resource names its node; `Err` gives back what
/// CloudHub did not take, `Ok(false)` means the message named no node.
pub(crate) fn offer_message(
    hive: &Hive,
    sent: &Counter,
    message: Message,
) -> Result<bool, ToNodes> {
    match ToNodes::from_message(message) {
        Some(to_nodes) => offer(hive, sent, to_nodes).map_or(Ok(true), Err),
        None => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hive::{Accepts, Envelope, Module};
    use actix::{Actor, Context, Handler};
    use edgehive_protocols::{Group, ModuleName, Operation};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// Stands in for CloudHub: notes the (edge-form) resource of every message it takes.
    struct Hub(Arc<Mutex<Vec<String>>>);
    impl Actor for Hub {
        type Context = Context<Self>;
    }
    impl Handler<Envelope> for Hub {
        type Result = Option<Message>;
        fn handle(&mut self, _: Envelope, _: &mut Context<Self>) -> Option<Message> {
            None
        }
    }
    impl Handler<ToNodes> for Hub {
        type Result = ();
        fn handle(&mut self, message: ToNodes, _: &mut Context<Self>) {
            if let Ok(mut taken) = self.0.lock() {
                taken.push(message.message.resource().to_owned());
            }
        }
    }
    struct HubModule(Arc<Mutex<Vec<String>>>);
    impl Module for HubModule {
        type Actor = Hub;
        fn name(&self) -> &str {
            route::CLOUDHUB
        }
        fn group(&self) -> &str {
            "cloudhub"
        }
        fn mailbox_capacity(&self) -> usize {
            256
        }
        fn create(&self, _: &Hive) -> Hub {
            Hub(self.0.clone())
        }
        fn accepts(&self, accepts: &mut Accepts<Hub>) {
            accepts.message::<ToNodes>();
        }
    }

    fn pod(index: usize) -> Message {
        Message::new(
            ModuleName::EdgeController,
            Group::Resource,
            Operation::Update,
            format!("node/edge-1/default/pod/p{index}"),
            serde_json::Value::Null,
        )
    }

    #[actix_rt::test]
    async fn replies_wait_for_room_in_cloudhubs_mailbox_instead_of_being_dropped() {
        let hive = Hive::new("test");
        let sent = Counter::default();
        // No CloudHub: given up at once.
        assert!(!deliver_reply(&hive, &sent, pod(0)).await);
        let taken = Arc::new(Mutex::new(Vec::new()));
        hive.start_module(HubModule(taken.clone())).unwrap();
        // Eight times its mailbox at once: an offer would have had most of them refused.
        let replies = 8 * 256;
        let all = (0..replies).map(|index| {
            let (hive, sent) = (hive.clone(), sent.clone());
            async move { deliver_reply(&hive, &sent, pod(index)).await }
        });
        let delivered = futures_util::future::join_all(all).await;
        assert!(delivered.iter().all(|ok| *ok), "every reply taken");
        assert_eq!(sent.get(), replies as u64);
        assert_eq!(taken.lock().unwrap().len(), replies);
    }

    #[actix_rt::test]
    async fn a_burst_while_cloudhub_is_away_waits_for_room_and_loses_nothing() {
        let hive = Hive::new("test");
        let overflow = Counter::default();
        let mut outbox = Outbox::new(hive.clone(), Counter::default(), overflow.clone());
        // CloudHub is not running: a burst bigger than the buffer is kept whole.
        let burst = BUFFER_CAPACITY + 100;
        for index in 0..burst {
            outbox.send(pod(index));
        }
        assert!(outbox.is_full());
        assert_eq!(overflow.get(), 0, "nothing dropped below the limit");
        // The controller would now wait for room; there is none while CloudHub is away.
        assert!(
            tokio::time::timeout(Duration::from_millis(300), outbox.room())
                .await
                .is_err(),
            "room while CloudHub is away"
        );
        // CloudHub starts (with a mailbox smaller than the burst): room comes, and everything arrives in order.
        let taken = Arc::new(Mutex::new(Vec::new()));
        hive.start_module(HubModule(taken.clone())).unwrap();
        outbox.room().await;
        while !outbox.is_empty() {
            outbox.room().await;
            outbox.flush();
            tokio::time::sleep(RETRY_INTERVAL).await;
        }
        let expected: Vec<String> = (0..burst)
            .map(|index| format!("default/pod/p{index}"))
            .collect();
        while taken.lock().unwrap().len() < burst {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let taken = taken.lock().unwrap().clone();
        assert!(taken == expected, "all {burst}, in order");
        assert_eq!(overflow.get(), 0);
    }
}
