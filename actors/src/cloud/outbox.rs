//! The way cloud controllers (EdgeController, DeviceController) hand messages to CloudHub
//! without losing them when CloudHub's mailbox is full or it is restarting. What travels is the contract's [`ToNodes`]: a
//! message encoded once, with the nodes that get it.

use std::collections::VecDeque;

use edgehive_protocols::Message;
use prometheus_client::metrics::counter::Counter;

use crate::cloud::contract::{route, NodeDeleted, ToNodes};
use crate::hive::Hive;

/// Messages kept while CloudHub is full or restarting. Overflow policy: the oldest message
/// is dropped, logged and counted in the owner's overflow counter.
pub const BUFFER_CAPACITY: usize = 1024;

/// A bounded buffer in front of CloudHub; see [`BUFFER_CAPACITY`].
#[derive(Debug)]
pub struct Outbox {
    hive: Hive,
    buffer: VecDeque<ToNodes>,
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

    /// Sends `message` (resource in cloud form, naming its node) now, or keeps it (behind
    /// anything already kept, to keep the order).
    pub fn send(&mut self, message: Message) {
        let resource = message.resource().to_owned();
        match ToNodes::from_message(message) {
            Some(to_nodes) => self.send_to(to_nodes),
            None => tracing::warn!(%resource, "message names no node; dropped"),
        }
    }

    /// Sends `to_nodes` now, or keeps it (behind anything already kept, to keep the order).
    pub fn send_to(&mut self, message: ToNodes) {
        if self.buffer.is_empty() {
            if let Some(message) = offer(&self.hive, &self.sent, message) {
                self.keep(message);
            }
        } else {
            self.keep(message);
        }
    }

    /// Closes `node`'s session after everything queued before has reached CloudHub, and has
    /// CloudHub forget it: a deleted node must not stay connected, nor keep a pool.
    pub fn disconnect(&mut self, node: &str) {
        self.flush();
        if !self.buffer.is_empty() {
            tracing::warn!(%node, "cloudhub busy; node deleted but its session stays open until it reconnects");
            return;
        }
        let disconnect = NodeDeleted {
            node: node.to_owned(),
        };
        if self.hive.tell(route::CLOUDHUB, disconnect).is_err() {
            tracing::warn!(%node, "cloudhub busy; could not close the deleted node's session");
        }
    }

    fn keep(&mut self, message: ToNodes) {
        if self.buffer.len() >= BUFFER_CAPACITY {
            if let Some(lost) = self.buffer.pop_front() {
                tracing::warn!(
                    resource = lost.message.resource(),
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
pub fn offer(hive: &Hive, sent: &Counter, message: ToNodes) -> Option<ToNodes> {
    match hive.tell(route::CLOUDHUB, message) {
        Ok(()) => {
            sent.inc();
            None
        }
        Err(refused) => Some(refused.message),
    }
}

/// [`offer`] for a message whose cloud-form resource names its node; `Err` gives back what
/// CloudHub did not take, `Ok(false)` means the message named no node.
pub fn offer_message(hive: &Hive, sent: &Counter, message: Message) -> Result<bool, ToNodes> {
    match ToNodes::from_message(message) {
        Some(to_nodes) => offer(hive, sent, to_nodes).map_or(Ok(true), Err),
        None => Ok(false),
    }
}
