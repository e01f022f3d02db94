use std::sync::Arc;

use edgehive_protocols::Message;
use tokio::sync::OwnedSemaphorePermit;

use super::metrics::ModuleStats;

/// A beehive [`Message`] in transit to a module.
///
/// The handler's return value is the reply: `Some(message)` answers a [`Hive::request`]
/// (ignored for a plain send), `None` means "no reply".
///
/// An envelope sent through the hive carries a ticket that keeps the target's mailbox depth
/// and handled count true: the message counts as queued until the handler drops the envelope.
///
/// [`Hive::request`]: super::Hive::request
#[derive(Debug)]
pub struct Envelope {
    message: Message,
    ticket: Option<Ticket>,
}

impl actix::Message for Envelope {
    type Result = Option<Message>;
}

impl Envelope {
    /// Wraps a message for a direct send to a known address (not counted by the hive).
    pub fn new(message: Message) -> Self {
        Envelope {
            message,
            ticket: None,
        }
    }

    /// An envelope holding one of the target's mailbox slots until its handler is done.
    pub(super) fn counted(
        message: Message,
        stats: Arc<ModuleStats>,
        slot: OwnedSemaphorePermit,
    ) -> Self {
        stats.enqueued();
        Envelope {
            message,
            ticket: Some(Ticket {
                stats,
                reached_handler: true,
                _slot: slot,
            }),
        }
    }

    /// Marks a message that never reached a handler (mailbox full or closed).
    pub(super) fn undeliverable(mut self) -> Message {
        if let Some(mut ticket) = self.ticket.take() {
            ticket.reached_handler = false;
            ticket.stats.rejected();
        }
        self.message
    }

    /// The message inside.
    pub fn message(&self) -> &Message {
        &self.message
    }

    /// Takes the message out.
    pub fn into_message(self) -> Message {
        self.message
    }
}

/// Proof that a message holds a slot in a module's mailbox; dropped (freeing the slot) when
/// the handler is done with it, or when a dead actor's mailbox is discarded.
#[derive(Debug)]
struct Ticket {
    stats: Arc<ModuleStats>,
    reached_handler: bool,
    _slot: OwnedSemaphorePermit,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.reached_handler {
            self.stats.handled();
        }
    }
}
