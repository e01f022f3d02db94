use actix::{Actor, Context, Handler};

use super::{Accepts, Envelope, Hive};

/// Mailbox capacity of a module unless it says otherwise: beehive's channel size.
pub(crate) const DEFAULT_MAILBOX_CAPACITY: usize = 1024;

/// The recipe of a module: its beehive identity and how to build its actor.
///
/// The hive calls [`Module::create`] once at start and again after every failure, so an actor
/// must not rely on anything but what `create` gives it. State that must outlive a failure
/// (a node's queued messages, the edge's store) lives outside the actor and is handed in.
///
/// ```
/// use edgehive_actors::hive::{Envelope, Hive, Module};
/// use edgehive_protocols::Message;
///
/// struct Counter { seen: u64 }
/// impl actix::Actor for Counter { type Context = actix::Context<Self>; }
/// impl actix::Handler<Envelope> for Counter {
///     type Result = Option<Message>;
///     fn handle(&mut self, _: Envelope, _: &mut Self::Context) -> Option<Message> {
///         self.seen += 1;
///         None
///     }
/// }
///
/// struct CounterModule;
/// impl Module for CounterModule {
///     type Actor = Counter;
///     fn name(&self) -> &str { "counter" }
///     fn group(&self) -> &str { "user" }
///     fn create(&self, _hive: &Hive) -> Counter { Counter { seen: 0 } }
/// }
/// ```
pub trait Module: Send + Sync + 'static {
    /// The actor that does the module's work.
    type Actor: Actor<Context = Context<Self::Actor>> + Handler<Envelope>;

    /// The beehive module name other modules address it by (for example `metamanager`).
    fn name(&self) -> &str;

    /// The beehive group it belongs to (for example `meta`).
    fn group(&self) -> &str;

    /// How many messages may wait in its mailbox before senders are refused.
    fn mailbox_capacity(&self) -> usize {
        DEFAULT_MAILBOX_CAPACITY
    }

    /// Builds a fresh actor; called on the module's arbiter at start and on every restart.
    fn create(&self, hive: &Hive) -> Self::Actor;

    /// The typed messages other modules may send it by name with [`Hive::tell`] and
    /// [`Hive::ask`] (besides [`Envelope`]s), knowing only the message type, never the actor.
    fn accepts(&self, accepts: &mut Accepts<Self::Actor>) {
        let _ = accepts;
    }
}
