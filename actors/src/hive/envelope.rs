use std::sync::Arc;

use edgehive_protocols::Message;

use super::metrics::Slot;

/// A beehive [`Message`] in transit to a module.
///
/// The handler's return value is the reply: `Some(message)` answers a [`Hive::request`]
/// (ignored for a plain send), `None` means "no reply".
///
/// An envelope sent through the hive carries a ticket that keeps the target's mailbox depth
/// and handled count true: the message counts as queued until the handler drops the envelope.
///
/// The members of a group broadcast ([`Hive::send_to_group`]) share one message: a handler
/// that reads it ([`Envelope::message`]) copies nothing; one that takes it
/// ([`Envelope::into_message`]) gets a copy unless it is the last holder.
///
/// [`Hive::request`]: super::Hive::request
/// [`Hive::send_to_group`]: super::Hive::send_to_group
#[derive(Debug)]
pub struct Envelope {
    message: Payload,
    ticket: Option<Ticket>,
}

/// The message of an envelope: its own, or one shared by the members of a group.
///
/// Boxed either way: a `Message` is about 300 bytes, and an envelope is moved five or six
/// times between the sender and the handler (into actix's own box among them); copying a
/// pointer instead costs one allocation and is cheaper (BENCHMARKS.md, Hive).
#[derive(Debug)]
pub(super) enum Payload {
    Owned(Box<Message>),
    Shared(Arc<Message>),
}

impl Payload {
    fn get(&self) -> &Message {
        match self {
            Payload::Owned(message) => message,
            Payload::Shared(message) => message,
        }
    }

    fn into_message(self) -> Message {
        match self {
            Payload::Owned(message) => *message,
            Payload::Shared(message) => Arc::unwrap_or_clone(message),
        }
    }
}

impl actix::Message for Envelope {
    type Result = Option<Message>;
}

impl Envelope {
    /// Wraps a message for a direct send to a known address (not counted by the hive).
    pub fn new(message: Message) -> Self {
        Envelope {
            message: Payload::Owned(Box::new(message)),
            ticket: None,
        }
    }

    /// An envelope holding one of the target's mailbox slots until its handler is done.
    pub(super) fn counted(message: Payload, slot: Slot) -> Self {
        slot.stats().enqueued();
        Envelope {
            message,
            ticket: Some(Ticket {
                slot,
                reached_handler: true,
            }),
        }
    }

    /// Marks a message that never reached a handler (mailbox full or closed).
    pub(super) fn undeliverable(mut self) {
        if let Some(mut ticket) = self.ticket.take() {
            ticket.reached_handler = false;
            ticket.slot.stats().rejected();
        }
    }

    /// The message inside.
    pub fn message(&self) -> &Message {
        self.message.get()
    }

    /// Takes the message out (a copy when other members of a group still share it).
    pub fn into_message(self) -> Message {
        self.message.into_message()
    }
}

/// Proof that a message holds a slot in a module's mailbox; dropped (freeing the slot) when
/// the handler is done with it, or when a dead actor's mailbox is discarded.
#[derive(Debug)]
struct Ticket {
    /// Given back after the counters are updated (a field is dropped after `drop` ran).
    slot: Slot,
    reached_handler: bool,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.reached_handler {
            self.slot.stats().handled();
        }
    }
}
