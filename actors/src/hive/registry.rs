use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::task::Poll;
use std::time::Duration;

use actix::dev::channel::AddressSender;
use actix::dev::{SendError, ToEnvelope};
use actix::{Actor, Addr, Handler, MailboxError};
use edgehive_protocols::Message;
use futures_util::future::join_all;
use serde::Serialize;
use tokio::sync::oneshot;

use super::envelope::Payload;
use super::locks;
use super::metrics::{ModuleState, ModuleStats, Slot};
use super::{Envelope, HiveError, HiveMetrics, RefusalLog};

/// A module as the admin endpoint shows it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModuleInfo {
    /// beehive module name.
    pub name: String,
    /// beehive group.
    pub group: String,
    /// The supervisor of this module (the process name).
    pub parent: String,
    /// Running, restarting or stopped.
    pub state: ModuleState,
    /// Restarts after a stop or a panic since the process started.
    pub restarts: u64,
    /// Envelopes the hive put into its mailbox.
    pub messages_routed: u64,
    /// Envelopes its handlers finished with.
    pub messages_handled: u64,
    /// Envelopes refused (mailbox full, module down).
    pub messages_dropped: u64,
    /// Envelopes waiting in its mailbox now.
    pub mailbox_depth: i64,
    /// Its mailbox capacity.
    pub mailbox_capacity: usize,
    /// The actors it supervises (CloudHub: one per edge node), if it has any; the first ones
    /// by name when [`Hive::modules_with`] was given a limit.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<ChildInfo>,
    /// How many actors it supervises (more than `children` holds when a limit cut them).
    #[serde(skip_serializing_if = "is_zero")]
    pub children_total: usize,
}

fn is_zero(count: &usize) -> bool {
    *count == 0
}

/// An actor supervised by a module (or by another child), as the admin endpoint shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ChildInfo {
    /// Its name under its parent (a node name, a connection's id).
    pub name: String,
    /// What it is (`node`, `connection`, …).
    pub kind: String,
    /// Running or restarting.
    pub state: ModuleState,
    /// Restarts after a panic or a stop.
    pub restarts: u64,
    /// Messages its handlers finished with.
    pub messages_handled: u64,
    /// Messages waiting in its mailbox.
    pub mailbox_depth: i64,
    /// The actors it supervises in turn.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<ChildInfo>,
}

/// How a module reports the actors it supervises (see [`Hive::set_children`]): given a limit,
/// the first that many by name, and how many there are in all.
pub(crate) type ChildrenView = Arc<dyn Fn(usize) -> (Vec<ChildInfo>, usize) + Send + Sync>;

/// The typed messages a module accepts by name (see [`Module::accepts`](super::Module::accepts)).
pub struct Accepts<A: Actor> {
    routes: Vec<(TypeId, RecipientFactory<A>)>,
}

type RecipientFactory<A> =
    Box<dyn Fn(&AddressSender<A>) -> Box<dyn Any + Send + Sync> + Send + Sync>;
/// Builds a module's typed mailboxes (an `Arc<dyn TypedMailbox<M>>` per accepted `M`) from its
/// current mailbox (a type-erased `AddressSender<A>`).
type TypedRoutes =
    Arc<dyn Fn(&dyn Any) -> HashMap<TypeId, Box<dyn Any + Send + Sync>> + Send + Sync>;

impl<A: Actor> Accepts<A> {
    /// No typed messages yet.
    pub(super) fn new() -> Self {
        Accepts { routes: Vec::new() }
    }

    /// The module handles `M`.
    pub fn message<M>(&mut self) -> &mut Self
    where
        A: Handler<M>,
        A::Context: ToEnvelope<A, M>,
        M: actix::Message + Send + 'static,
        M::Result: Send,
    {
        self.routes.push((
            TypeId::of::<M>(),
            Box::new(|mailbox: &AddressSender<A>| {
                let typed: Arc<dyn TypedMailbox<M>> = Arc::new(mailbox.clone());
                Box::new(typed)
            }),
        ));
        self
    }

    fn into_routes(self) -> TypedRoutes {
        let routes = self.routes;
        Arc::new(move |mailbox: &dyn Any| {
            let Some(mailbox) = mailbox.downcast_ref::<AddressSender<A>>() else {
                return HashMap::new();
            };
            routes
                .iter()
                .map(|(type_id, make)| (*type_id, make(mailbox)))
                .collect()
        })
    }
}

/// A typed message [`Hive::tell`] could not deliver, given back with the reason.
#[derive(Debug)]
pub struct Refused<M> {
    /// Why.
    pub error: HiveError,
    /// The message, untouched.
    pub message: M,
}

/// How a group broadcast went.
///
/// Member names are shared with the registry (a reference count each, no copy).
#[derive(Debug, Default)]
pub struct GroupDelivery {
    /// Members whose mailbox accepted the message.
    pub delivered: Vec<Arc<str>>,
    /// Members that refused it, and why.
    pub failed: Vec<(Arc<str>, HiveError)>,
}

struct Entry {
    /// The module's name (the registry's key), shared with [`GroupDelivery`]s.
    name: Arc<str>,
    /// Its beehive group.
    group: String,
    /// Where envelopes go: resolved here once per send, shared by every sender.
    route: Arc<Route>,
    /// The current `Addr<M::Actor>`, for typed sends.
    addr: Box<dyn Any + Send + Sync>,
    capacity: usize,
    children: Option<ChildrenView>,
    /// `Arc<dyn TypedMailbox<M>>` per accepted typed message, for the current actor.
    typed: HashMap<TypeId, Box<dyn Any + Send + Sync>>,
    retype: TypedRoutes,
}

/// A module's envelope route: the current actor's mailbox, and its counters and slots.
struct Route {
    mailbox: Box<dyn Mailbox>,
    stats: Arc<ModuleStats>,
}

/// The sending end of a module's mailbox for envelopes, whatever its actor type: one sender
/// per actor instance, kept by its [`Route`] (cloning an actix sender costs three allocations).
trait Mailbox: Send + Sync {
    /// Puts `envelope` in the mailbox (the hive's slots bound it, not actix's capacity), or
    /// gives it back when the actor is gone.
    fn push(&self, envelope: Envelope) -> Result<(), Box<Envelope>>;

    /// Puts `envelope` in the mailbox with a channel for the handler's reply.
    fn ask(&self, envelope: Envelope) -> Result<oneshot::Receiver<Option<Message>>, Box<Envelope>>;
}

/// The sending end of a module's mailbox for typed `M`: one per actor instance and accepted
/// type, shared by every sender ([`Hive::tell`], [`Hive::ask`]); cloning an actix `Recipient`
/// per message cost three allocations.
trait TypedMailbox<M: actix::Message>: Send + Sync {
    /// Whether the actor is still there.
    fn connected(&self) -> bool;

    /// Puts `message` in the mailbox with a channel for the handler's result, or gives it
    /// back when the actor is gone.
    fn send_typed(&self, message: M) -> Result<oneshot::Receiver<M::Result>, M>;
}

impl<A, M> TypedMailbox<M> for AddressSender<A>
where
    A: Actor + Handler<M>,
    A::Context: ToEnvelope<A, M>,
    M: actix::Message + Send + 'static,
    M::Result: Send,
{
    fn connected(&self) -> bool {
        AddressSender::connected(self)
    }

    fn send_typed(&self, message: M) -> Result<oneshot::Receiver<M::Result>, M> {
        match self.send(message) {
            Ok(result) => Ok(result),
            // Parked by actix's own capacity (see `Mailbox::ask`): a fresh sender is not, and
            // puts it in now, so messages from one sender keep their order.
            Err(SendError::Full(message)) => {
                self.clone().send(message).map_err(|error| match error {
                    SendError::Full(message) | SendError::Closed(message) => message,
                })
            }
            Err(SendError::Closed(message)) => Err(message),
        }
    }
}

/// The envelope a failed actix send gives back.
fn given_back(error: SendError<Envelope>) -> Box<Envelope> {
    match error {
        SendError::Full(envelope) | SendError::Closed(envelope) => Box::new(envelope),
    }
}

impl<A> Mailbox for AddressSender<A>
where
    A: Actor + Handler<Envelope>,
    A::Context: ToEnvelope<A, Envelope>,
{
    fn push(&self, envelope: Envelope) -> Result<(), Box<Envelope>> {
        // `do_send` never parks the sender and, unlike `Addr::do_send`, says when the mailbox
        // is closed.
        self.do_send(envelope).map_err(given_back)
    }

    fn ask(&self, envelope: Envelope) -> Result<oneshot::Receiver<Option<Message>>, Box<Envelope>> {
        match self.send(envelope) {
            Ok(reply) => Ok(reply),
            // This sender was parked by actix's own capacity (other senders filled it): a
            // fresh sender, as every request used before, is never parked.
            Err(SendError::Full(envelope)) => self.clone().send(envelope).map_err(given_back),
            Err(SendError::Closed(envelope)) => Err(Box::new(envelope)),
        }
    }
}

impl Route {
    fn new<A>(mailbox: AddressSender<A>, stats: Arc<ModuleStats>) -> Self
    where
        A: Actor + Handler<Envelope>,
        A::Context: ToEnvelope<A, Envelope>,
    {
        Route {
            mailbox: Box::new(mailbox),
            stats,
        }
    }

    fn name(&self) -> &str {
        &self.stats.name
    }

    /// [`Hive::send`] once the module is found.
    fn send(&self, message: Payload) -> Result<(), HiveError> {
        let Some(slot) = Slot::try_take(&self.stats) else {
            self.stats.dropped.inc();
            return Err(HiveError::MailboxFull(self.name().to_owned()));
        };
        let envelope = Envelope::counted(message, slot);
        match self.mailbox.push(envelope) {
            Ok(()) => {
                self.stats.delivered();
                Ok(())
            }
            Err(envelope) => {
                envelope.undeliverable();
                Err(HiveError::ModuleDown(self.name().to_owned()))
            }
        }
    }

    /// [`Hive::request`] once the module is found.
    async fn request(&self, message: Payload, timeout: Duration) -> Result<Message, HiveError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let slot = match Slot::try_take(&self.stats) {
            Some(slot) => slot,
            None => wait_for_slot(&self.stats, deadline, timeout).await?,
        };
        let envelope = Envelope::counted(message, slot);
        let reply = match self.mailbox.ask(envelope) {
            Ok(reply) => reply,
            Err(envelope) => {
                envelope.undeliverable();
                return Err(HiveError::ModuleDown(self.name().to_owned()));
            }
        };
        self.stats.delivered();
        match until(deadline, reply).await {
            Some(Ok(Some(reply))) => Ok(reply),
            Some(Ok(None)) => Err(HiveError::NoReply(self.name().to_owned())),
            // The reply channel closed unanswered: the actor died with the message queued.
            Some(Err(_)) => {
                self.stats.dropped.inc();
                Err(HiveError::ModuleDown(self.name().to_owned()))
            }
            None => Err(HiveError::Timeout {
                module: self.name().to_owned(),
                timeout,
            }),
        }
    }
}

type TypedTarget<M> = (Arc<dyn TypedMailbox<M>>, Arc<ModuleStats>);
type AddrTarget<A> = (Addr<A>, Arc<ModuleStats>);

struct Inner {
    process: String,
    modules: RwLock<BTreeMap<String, Entry>>,
    metrics: HiveMetrics,
    refusals: RefusalLog,
    shutting_down: AtomicBool,
    /// Flips to `true` once; every module instance stops when it does.
    stop_signal: tokio::sync::watch::Sender<bool>,
    /// One value per type, made on first use (see [`Hive::shared`]).
    shared: std::sync::Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

/// The registry and router of one process's modules. Cheap to clone; all clones are one hive.
///
/// See the [module docs](super) for an example.
#[derive(Clone)]
pub struct Hive {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Hive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hive")
            .field("process", &self.inner.process)
            .finish_non_exhaustive()
    }
}

impl Hive {
    /// An empty hive for the process `process` (`cloud`, `edge`, …), the root of its tree.
    pub fn new(process: &str) -> Self {
        Hive {
            inner: Arc::new(Inner {
                process: process.to_owned(),
                modules: RwLock::new(BTreeMap::new()),
                metrics: HiveMetrics::new(),
                refusals: RefusalLog::default(),
                shutting_down: AtomicBool::new(false),
                stop_signal: tokio::sync::watch::Sender::new(false),
                shared: std::sync::Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The process name given to [`Hive::new`].
    pub fn process(&self) -> &str {
        &self.inner.process
    }

    /// The process's metrics registry.
    pub fn metrics(&self) -> &HiveMetrics {
        &self.inner.metrics
    }

    /// The process's last refusals (connections, messages, certificate requests), kept where
    /// they are counted and shown on the admin endpoint.
    pub fn refusals(&self) -> &RefusalLog {
        &self.inner.refusals
    }

    /// The process's one `T`, made with `T::default()` the first time anyone asks, the same
    /// `Arc` ever after: state that modules share without naming each other's actors (the
    /// edge's connection to the cloud, `edge::contract::CloudConnection`), whichever module
    /// starts first.
    pub(crate) fn shared<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut shared = locks::lock(&self.inner.shared);
        let entry = shared
            .entry(TypeId::of::<T>())
            .or_insert_with(|| Arc::new(T::default()));
        match Arc::clone(entry).downcast::<T>() {
            Ok(value) => value,
            // Keyed by its own type, so this cannot happen; were it to, start over.
            Err(_) => {
                let value = Arc::new(T::default());
                shared.insert(TypeId::of::<T>(), value.clone());
                value
            }
        }
    }

    /// Registers the module `name` of `group`, which handles `accepts` besides envelopes,
    /// with the actor `start` starts and supervises (given the module's stats).
    pub(super) fn register<A>(
        &self,
        name: String,
        group: &str,
        capacity: usize,
        accepts: Accepts<A>,
        start: impl FnOnce(&Hive, Arc<ModuleStats>) -> AddressSender<A>,
    ) -> Result<Addr<A>, HiveError>
    where
        A: Actor<Context = actix::Context<A>> + Handler<Envelope>,
    {
        if self.read_modules().contains_key(&name) {
            return Err(HiveError::AlreadyRegistered(name));
        }
        let stats = Arc::new(self.inner.metrics.module_stats(&name, group, capacity));
        let retype = accepts.into_routes();
        // The first actor is built here, outside the registry's lock: a module's `create` may
        // look up other modules.
        let mailbox = start(self, stats.clone());
        let addr = Addr::new(mailbox.clone());
        let mut modules = self.write_modules();
        if modules.contains_key(&name) {
            return Err(HiveError::AlreadyRegistered(name));
        }
        modules.insert(
            name.clone(),
            Entry {
                name: Arc::from(name),
                group: group.to_owned(),
                typed: retype(&mailbox),
                route: Arc::new(Route::new(mailbox, stats)),
                addr: Box::new(addr.clone()),
                capacity,
                children: None,
                retype,
            },
        );
        Ok(addr)
    }

    /// Points `name` at the actor the supervisor just started in place of a failed one.
    pub(super) fn replace_addr<A>(&self, name: &str, mailbox: &AddressSender<A>)
    where
        A: Actor + Handler<Envelope>,
        A::Context: ToEnvelope<A, Envelope>,
    {
        let addr = Addr::new(mailbox.clone());
        if let Some(entry) = self.write_modules().get_mut(name) {
            let stats = entry.route.stats.clone();
            entry.route = Arc::new(Route::new(mailbox.clone(), stats));
            entry.typed = (entry.retype)(mailbox);
            entry.addr = Box::new(addr);
        }
    }

    /// Whether the process is stopping (supervisors then let modules stay down).
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.inner.shutting_down.load(Ordering::Relaxed)
    }

    /// Stops every module of this hive for good: none is restarted any more.
    ///
    /// Other hives in the same actix system (several edges in one demo) keep running.
    pub fn shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::Relaxed);
        self.inner.stop_signal.send_replace(true);
    }

    /// Turns `true` once [`Hive::shutdown`] was called.
    pub(super) fn stop_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.stop_signal.subscribe()
    }

    /// The current typed address of module `name`.
    pub fn addr<A: Actor>(&self, name: &str) -> Result<Addr<A>, HiveError> {
        let modules = self.read_modules();
        let entry = modules
            .get(name)
            .ok_or_else(|| HiveError::UnknownModule(name.to_owned()))?;
        entry
            .addr
            .downcast_ref::<Addr<A>>()
            .cloned()
            .ok_or_else(|| HiveError::WrongType(name.to_owned()))
    }

    /// Names of the modules in `group`, in name order.
    pub fn group_members(&self, group: &str) -> Vec<String> {
        self.read_modules()
            .iter()
            .filter(|(_, entry)| entry.group == group)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Sends `message` to module `name` without waiting for a reply.
    ///
    /// Overflow policy: when the module already holds `mailbox_capacity` unhandled envelopes,
    /// the message is rejected at once with [`HiveError::MailboxFull`] and counted as dropped;
    /// the caller keeps the decision (retry, keep it queued, or give up).
    pub fn send(&self, name: &str, message: Message) -> Result<(), HiveError> {
        // Under the registry's read lock: putting an envelope in a mailbox never waits.
        self.read_modules()
            .get(name)
            .ok_or_else(|| HiveError::UnknownModule(name.to_owned()))?
            .route
            .send(Payload::Owned(Box::new(message)))
    }

    /// Sends `message` to module `name` and waits up to `timeout` for the handler's reply.
    ///
    /// A full mailbox makes the caller wait for a free slot (within the same timeout), so
    /// requests are never dropped for load and at most `mailbox_capacity` of them are queued; the reply travels back on the request's own channel and
    /// cannot reach anyone else or be lost.
    pub async fn request(
        &self,
        name: &str,
        message: Message,
        timeout: Duration,
    ) -> Result<Message, HiveError> {
        let route = self.route(name)?;
        route
            .request(Payload::Owned(Box::new(message)), timeout)
            .await
    }

    /// Sends a typed message to module `name` (by its actor type `A`) and waits up to
    /// `timeout` for its result. Bounded like [`Hive::ask`]: it waits for one of the module's
    /// mailbox slots within the same timeout and holds it until the reply is back.
    pub async fn call<A, M>(
        &self,
        name: &str,
        message: M,
        timeout: Duration,
    ) -> Result<M::Result, HiveError>
    where
        A: Actor + Handler<M>,
        A::Context: ToEnvelope<A, M>,
        M: actix::Message + Send + 'static,
        M::Result: Send,
    {
        let (addr, stats) = self.addr_target::<A>(name)?;
        let deadline = tokio::time::Instant::now() + timeout;
        let slot = wait_for_slot(&stats, deadline, timeout).await?;
        // Counted like an envelope: queued until the reply is back (the handler is done then),
        // or until the caller gives up; the slot is held as long.
        stats.enqueued();
        stats.delivered();
        let outcome = tokio::time::timeout_at(deadline, addr.send(message))
            .await
            .ok();
        drop(slot);
        settle(outcome, &stats, name, timeout)
    }

    /// Sends `message` to every module of `group`, each under [`Hive::send`]'s policy.
    ///
    /// The members share the one message (see [`Envelope`]): a broadcast copies no content.
    pub fn send_to_group(&self, group: &str, message: Message) -> Result<GroupDelivery, HiveError> {
        let message = Arc::new(message);
        let mut delivery = GroupDelivery::default();
        // Under the registry's read lock, as `send`.
        for entry in self.read_modules().values() {
            if entry.group != group {
                continue;
            }
            match entry.route.send(Payload::Shared(Arc::clone(&message))) {
                Ok(()) => delivery.delivered.push(Arc::clone(&entry.name)),
                Err(error) => delivery.failed.push((Arc::clone(&entry.name), error)),
            }
        }
        if delivery.delivered.is_empty() && delivery.failed.is_empty() {
            return Err(HiveError::UnknownGroup(group.to_owned()));
        }
        Ok(delivery)
    }

    /// Sends `message` to every module of `group` and collects each member's reply.
    ///
    /// The members share the one message, as in [`Hive::send_to_group`].
    pub async fn request_group(
        &self,
        group: &str,
        message: Message,
        timeout: Duration,
    ) -> Result<Vec<(String, Result<Message, HiveError>)>, HiveError> {
        let members: Vec<(String, Arc<Route>)> = self
            .read_modules()
            .iter()
            .filter(|(_, entry)| entry.group == group)
            .map(|(name, entry)| (name.clone(), entry.route.clone()))
            .collect();
        if members.is_empty() {
            return Err(HiveError::UnknownGroup(group.to_owned()));
        }
        let message = Arc::new(message);
        let replies = join_all(
            members
                .iter()
                .map(|(_, route)| route.request(Payload::Shared(Arc::clone(&message)), timeout)),
        )
        .await;
        Ok(members
            .into_iter()
            .map(|(name, _)| name)
            .zip(replies)
            .collect())
    }

    /// Every registered module with its supervision state and counters, in name order.
    pub fn modules(&self) -> Vec<ModuleInfo> {
        self.modules_with(usize::MAX)
    }

    /// [`Hive::modules`] with at most `children` children per module (CloudHub has one per
    /// node; a page showing a few need not build 100,000).
    pub fn modules_with(&self, children: usize) -> Vec<ModuleInfo> {
        self.read_modules()
            .iter()
            .map(|(name, entry)| {
                let (children, children_total) = entry
                    .children
                    .as_ref()
                    .map(|view| view(children))
                    .unwrap_or_default();
                (name, entry, children, children_total)
            })
            .map(|(name, entry, children, children_total)| ModuleInfo {
                name: name.clone(),
                group: entry.route.stats.group.clone(),
                parent: self.inner.process.clone(),
                state: entry.route.stats.state(),
                restarts: entry.route.stats.restarts.get(),
                messages_routed: entry.route.stats.routed.get(),
                messages_handled: entry.route.stats.handled.get(),
                messages_dropped: entry.route.stats.dropped.get(),
                mailbox_depth: entry.route.stats.depth.get(),
                mailbox_capacity: entry.capacity,
                children,
                children_total,
            })
            .collect()
    }

    /// Lets module `name` show the actors it supervises under it in [`Hive::modules`].
    #[cfg_attr(not(feature = "cloud"), allow(dead_code))] // CloudHub's node actors
    pub(crate) fn set_children(&self, name: &str, view: ChildrenView) -> Result<(), HiveError> {
        let mut modules = self.write_modules();
        let entry = modules
            .get_mut(name)
            .ok_or_else(|| HiveError::UnknownModule(name.to_owned()))?;
        entry.children = Some(view);
        Ok(())
    }

    /// Sends typed `message` to module `name`, which must accept `M` (see
    /// [`Module::accepts`](super::Module::accepts)), without waiting for the handler.
    ///
    /// Bounded like [`Hive::send`]: it takes one of the module's mailbox slots until the
    /// handler is done, and is refused at once ([`HiveError::MailboxFull`], the message given
    /// back in [`Refused`]) when none is free. Messages from one sender arrive in order.
    /// Counted as routed, then handled when the handler returns. Must be called inside the
    /// actix system (a small task waits for the handler, to count it and free the slot).
    pub fn tell<M>(&self, name: &str, message: M) -> Result<(), Refused<M>>
    where
        M: actix::Message + Send + 'static,
        M::Result: Send,
    {
        let (mailbox, stats) = match self.typed_target::<M>(name) {
            Ok(target) => target,
            Err(error) => return Err(Refused { error, message }),
        };
        if !mailbox.connected() {
            stats.dropped.inc();
            return Err(Refused {
                error: HiveError::ModuleDown(name.to_owned()),
                message,
            });
        }
        let Some(slot) = Slot::try_take(&stats) else {
            stats.dropped.inc();
            return Err(Refused {
                error: HiveError::MailboxFull(name.to_owned()),
                message,
            });
        };
        drop(stats);
        slot.stats().enqueued();
        // `send_typed` puts the message in the mailbox now (so order holds); the task only
        // waits for the handler, to count it and free the slot.
        let handled = match mailbox.send_typed(message) {
            Ok(handled) => handled,
            Err(message) => {
                slot.stats().rejected();
                return Err(Refused {
                    error: HiveError::ModuleDown(name.to_owned()),
                    message,
                });
            }
        };
        slot.stats().delivered();
        actix::spawn(async move {
            let outcome = handled.await;
            let stats = slot.stats();
            match outcome {
                Ok(_) => stats.handled(),
                Err(_) => stats.rejected(),
            }
        });
        Ok(())
    }

    /// Sends typed `message` to module `name` (which must accept `M`) and waits up to
    /// `timeout` for the handler's result; waits for a mailbox slot within the same timeout.
    pub async fn ask<M>(
        &self,
        name: &str,
        message: M,
        timeout: Duration,
    ) -> Result<M::Result, HiveError>
    where
        M: actix::Message + Send + 'static,
        M::Result: Send,
    {
        let (mailbox, stats) = self.typed_target::<M>(name)?;
        let deadline = tokio::time::Instant::now() + timeout;
        let slot = wait_for_slot(&stats, deadline, timeout).await?;
        stats.enqueued();
        let Ok(result) = mailbox.send_typed(message) else {
            stats.rejected();
            return Err(HiveError::ModuleDown(name.to_owned()));
        };
        stats.delivered();
        let outcome = until(deadline, result).await;
        drop(slot);
        // The result channel closed unanswered: the actor died with the message queued.
        let outcome = outcome.map(|result| result.map_err(|_| MailboxError::Closed));
        settle(outcome, &stats, name, timeout)
    }

    fn typed_target<M>(&self, name: &str) -> Result<TypedTarget<M>, HiveError>
    where
        M: actix::Message + Send + 'static,
        M::Result: Send,
    {
        let modules = self.read_modules();
        let entry = modules
            .get(name)
            .ok_or_else(|| HiveError::UnknownModule(name.to_owned()))?;
        let mailbox = entry
            .typed
            .get(&TypeId::of::<M>())
            .and_then(|mailbox| mailbox.downcast_ref::<Arc<dyn TypedMailbox<M>>>())
            .cloned()
            .ok_or_else(|| HiveError::WrongType(name.to_owned()))?;
        Ok((mailbox, entry.route.stats.clone()))
    }

    fn addr_target<A: Actor>(&self, name: &str) -> Result<AddrTarget<A>, HiveError> {
        let modules = self.read_modules();
        let entry = modules
            .get(name)
            .ok_or_else(|| HiveError::UnknownModule(name.to_owned()))?;
        let addr = entry
            .addr
            .downcast_ref::<Addr<A>>()
            .cloned()
            .ok_or_else(|| HiveError::WrongType(name.to_owned()))?;
        Ok((addr, entry.route.stats.clone()))
    }

    fn route(&self, name: &str) -> Result<Arc<Route>, HiveError> {
        self.read_modules()
            .get(name)
            .map(|entry| entry.route.clone())
            .ok_or_else(|| HiveError::UnknownModule(name.to_owned()))
    }

    fn read_modules(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Entry>> {
        // A panic while holding the lock cannot leave the map half-written: every write is a
        // single insert or field assignment.
        locks::read(&self.inner.modules)
    }

    fn write_modules(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Entry>> {
        locks::write(&self.inner.modules)
    }
}

/// `reply`'s output, or `None` once `deadline` has passed.
///
/// The timer is armed only when the reply is not there at the second poll: the first poll
/// asks to be polled again at once, and a module on the requester's thread has answered by
/// then (the runtime runs it in between). A tokio timer entry takes the runtime's timer lock
/// twice (armed, then dropped), about a twentieth of a round trip (BENCHMARKS.md, Hive).
async fn until<F: Future + Unpin>(
    deadline: tokio::time::Instant,
    mut reply: F,
) -> Option<F::Output> {
    let mut polled = false;
    let early = std::future::poll_fn(|cx| match Pin::new(&mut reply).poll(cx) {
        Poll::Ready(output) => Poll::Ready(Some(output)),
        Poll::Pending if !polled => {
            polled = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
        Poll::Pending => Poll::Ready(None),
    })
    .await;
    match early {
        Some(output) => Some(output),
        None => tokio::time::timeout_at(deadline, reply).await.ok(),
    }
}

/// Counts how a typed request to module `name` ended and turns it into the hive's result.
fn settle<R>(
    outcome: Option<Result<R, MailboxError>>,
    stats: &ModuleStats,
    name: &str,
    timeout: Duration,
) -> Result<R, HiveError> {
    match outcome {
        Some(Ok(result)) => {
            stats.handled();
            Ok(result)
        }
        Some(Err(MailboxError::Closed)) => {
            stats.rejected();
            Err(HiveError::ModuleDown(name.to_owned()))
        }
        Some(Err(MailboxError::Timeout)) | None => {
            stats.rejected();
            Err(HiveError::Timeout {
                module: name.to_owned(),
                timeout,
            })
        }
    }
}

/// Waits until `deadline` for one of the mailbox slots of the module `stats` counts.
async fn wait_for_slot(
    stats: &Arc<ModuleStats>,
    deadline: tokio::time::Instant,
    timeout: Duration,
) -> Result<Slot, HiveError> {
    match tokio::time::timeout_at(deadline, Slot::wait(stats)).await {
        Ok(Ok(slot)) => Ok(slot),
        // The slots are never closed; treat it like a module that is gone.
        Ok(Err(_)) => Err(HiveError::ModuleDown(stats.name.clone())),
        Err(_) => Err(HiveError::Timeout {
            module: stats.name.clone(),
            timeout,
        }),
    }
}
