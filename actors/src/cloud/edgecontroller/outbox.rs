//! The way cloud controllers hand messages to CloudHub without losing them when CloudHub's
//! mailbox is full or it is restarting.

use std::collections::VecDeque;

use edgehive_protocols::Message;
use prometheus_client::metrics::counter::Counter;

use crate::cloud::cloudhub::{CloudHub, DisconnectNode, Downstream, CLOUDHUB_MODULE};
use crate::hive::Hive;

/// Messages kept while CloudHub is full or restarting. Overflow policy: the oldest message
/// is dropped, logged and counted in the owner's overflow counter.
pub const BUFFER_CAPACITY: usize = 1024;

/// A bounded buffer in front of CloudHub; see [`BUFFER_CAPACITY`].
#[derive(Debug)]
pub struct Outbox {
    hive: Hive,
    buffer: VecDeque<Message>,
    sent: Counter,
    overflow: Counter,
}

impl Outbox {
    /// An empty outbox counting into `sent` and `overflow`.
    pub fn new(hive: Hive, sent: Counter, overflow: Counter) -> Self {
        Outbox {
            hive,
            buffer: VecDeque::new(),
            sent,
            overflow,
        }
    }

    /// Whether messages wait for CloudHub.
    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }

    /// Sends `message` now, or keeps it (behind anything already kept, to keep the order).
    pub fn send(&mut self, message: Message) {
        if self.buffer.is_empty() {
            if let Some(message) = offer(&self.hive, &self.sent, message) {
                self.keep(message);
            }
        } else {
            self.keep(message);
        }
    }

    /// Closes `node`'s session after everything queued before has reached CloudHub: a
    /// deleted node must not stay connected.
    pub fn disconnect(&mut self, node: &str) {
        self.flush();
        if !self.buffer.is_empty() {
            tracing::warn!(%node, "cloudhub busy; node deleted but its session stays open until it reconnects");
            return;
        }
        if let Ok(hub) = self.hive.addr::<CloudHub>(CLOUDHUB_MODULE) {
            if hub
                .try_send(DisconnectNode {
                    node: node.to_owned(),
                })
                .is_err()
            {
                tracing::warn!(%node, "cloudhub busy; could not close the deleted node's session");
            }
        }
    }

    fn keep(&mut self, message: Message) {
        if self.buffer.len() >= BUFFER_CAPACITY {
            if let Some(lost) = self.buffer.pop_front() {
                tracing::warn!(
                    resource = lost.resource(),
                    "cloudhub unavailable and buffer full; oldest message dropped"
                );
                self.overflow.inc();
            }
        }
        self.buffer.push_back(message);
    }

    /// Offers the kept messages to CloudHub again, in order, until one is refused.
    pub fn flush(&mut self) {
        while let Some(message) = self.buffer.pop_front() {
            if let Some(message) = offer(&self.hive, &self.sent, message) {
                self.buffer.push_front(message);
                return;
            }
        }
    }
}

/// Hands `message` to CloudHub; gives it back if CloudHub is full or not running.
pub fn offer(hive: &Hive, sent: &Counter, message: Message) -> Option<Message> {
    let Ok(hub) = hive.addr::<CloudHub>(CLOUDHUB_MODULE) else {
        return Some(message);
    };
    match hub.try_send(Downstream(message)) {
        Ok(()) => {
            sent.inc();
            None
        }
        Err(err) => Some(err.into_inner().0),
    }
}
