//! Restarting actors that stop or panic: modules, and the children a module supervises (for
//! example CloudHub's per-node actors).
//!
//! actix's own `Supervisor` restarts actors that stop but not ones that panic: a panic ends
//! the actor's task and drops its context. So each supervised instance gets a *life guard*: a
//! oneshot sender parked in a never-ending future spawned into the actor's context. Whatever
//! ends the actor (stop or panic), its context and with it the guard is dropped, the watcher
//! wakes, and starts a fresh actor from the [`Recipe`] after a backoff. The same future ends,
//! and stops its actor, when the hive shuts down.
//!
//! A watcher is one parked future per supervised actor: it costs memory, never CPU, until
//! its actor dies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::dev::channel::{self, AddressSender};
use actix::{Actor, ActorContext, ActorFutureExt, Addr, ArbiterHandle, AsyncContext, Context};
use tokio::sync::{oneshot, watch};

use super::metrics::ModuleState;
use super::metrics::ModuleStats;
use super::{Accepts, Hive, HiveError, Module};

/// First restart delay; doubled per consecutive failure.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// Longest restart delay.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// An actor that ran this long before failing starts again from the first delay.
const STABLE_AFTER: Duration = Duration::from_secs(10);

/// How a supervised actor is built, and what its supervisor does when it fails.
///
/// State that must outlive a failure belongs to the recipe (or to something it holds), never
/// to the actor: [`Recipe::create`] is called again after every failure.
pub(crate) trait Recipe: 'static {
    /// The supervised actor.
    type Actor: Actor<Context = Context<Self::Actor>>;

    /// A fresh actor, on the supervisor's arbiter.
    fn create(&mut self) -> Self::Actor;

    /// Its mailbox capacity (actix's; the hive's own bounds are kept by the senders).
    fn mailbox_capacity(&self) -> usize {
        super::DEFAULT_MAILBOX_CAPACITY
    }

    /// The actor failed; a new one starts after `delay`.
    fn failed(&mut self, delay: Duration) {
        let _ = delay;
    }

    /// A new actor replaced the failed one.
    fn restarted(&mut self, addr: &Addr<Self::Actor>) {
        let _ = addr;
    }

    /// [`Recipe::restarted`], given the sending end of the new actor's mailbox (the hive's
    /// modules keep it to send envelopes through).
    fn restarted_with(&mut self, mailbox: &AddressSender<Self::Actor>) {
        self.restarted(&Addr::new(mailbox.clone()));
    }

    /// The actor stopped for good (the hive shuts down, or [`Recipe::retired`] said so).
    fn stopped(&mut self) {}

    /// Whether a failed actor should stay down (checked before each restart).
    fn retired(&self) -> bool {
        false
    }
}

/// Starts the actor of `recipe` on the current arbiter and supervises it until `hive` shuts
/// down (or the recipe retires). Must be called inside a running actix system.
/// Returns the sending end of its mailbox (an `Addr` is `Addr::new` of a clone).
pub(super) fn supervise<R: Recipe>(hive: &Hive, mut recipe: R) -> AddressSender<R::Actor> {
    let (mailbox, died) = spawn_instance(hive, &mut recipe);
    actix::spawn(watch(hive.clone(), recipe, died));
    mailbox
}

/// [`supervise`] on another arbiter: the actor, and every actor that replaces it, runs on
/// `arbiter`'s thread, and so does its watcher. The address is ready at once (messages wait in
/// the mailbox until the actor starts there). How a module spreads many children (CloudHub's
/// node actors) over the cores, and how a busy module gets a thread of its own.
#[cfg(feature = "cloud")] // CloudHub's node actors
pub(crate) fn supervise_on<R>(arbiter: &ArbiterHandle, hive: &Hive, recipe: R) -> Addr<R::Actor>
where
    R: Recipe + Send,
    R::Actor: Send,
{
    Addr::new(supervise_mailbox_on(arbiter, hive, recipe))
}

/// [`supervise_on`], returning the sending end of the actor's mailbox.
fn supervise_mailbox_on<R>(
    arbiter: &ArbiterHandle,
    hive: &Hive,
    mut recipe: R,
) -> AddressSender<R::Actor>
where
    R: Recipe + Send,
    R::Actor: Send,
{
    let (mailbox, died, start) = instance(hive, &mut recipe);
    arbiter.spawn_fn(move || start.run());
    // Restarts (spawn_instance on the current arbiter) then happen on `arbiter` too.
    arbiter.spawn(watch(hive.clone(), recipe, died));
    mailbox
}

/// Starts an instance of `recipe` on the current arbiter.
fn spawn_instance<R: Recipe>(hive: &Hive, recipe: &mut R) -> (AddressSender<R::Actor>, Died) {
    let (mailbox, died, start) = instance(hive, recipe);
    start.run();
    (mailbox, died)
}

/// A fresh actor from `recipe`, not started yet: [`Start::run`] runs it on the current arbiter.
struct Start<A: Actor> {
    receiver: channel::AddressReceiver<A>,
    actor: A,
    /// Held by the actor's context: dropped when the actor is gone, whatever the reason.
    guard: oneshot::Sender<()>,
    /// Turns `true` when the hive shuts down.
    stop: watch::Receiver<bool>,
}

impl<A: Actor<Context = Context<A>>> Start<A> {
    /// As actix's `Actor::create`, with the mailbox made in [`instance`].
    fn run(self) {
        let mut ctx = Context::with_receiver(self.receiver);
        ctx.spawn(life_guard::<A>(self.guard, self.stop));
        actix::spawn(ctx.into_future(self.actor));
    }
}

/// A fresh actor from `recipe`, with a mailbox of the recipe's capacity: the sending end of
/// the mailbox (made here, not by actix, so the hive keeps a sender of its own), the receiver
/// that learns when the instance is gone, and what starts it.
fn instance<R: Recipe>(
    hive: &Hive,
    recipe: &mut R,
) -> (AddressSender<R::Actor>, Died, Start<R::Actor>) {
    let (guard, died) = oneshot::channel::<()>();
    let (mailbox, receiver) = channel::channel(recipe.mailbox_capacity());
    let start = Start {
        receiver,
        actor: recipe.create(),
        guard,
        stop: hive.stop_signal(),
    };
    (mailbox, died, start)
}

/// Resolves (with an error) when the instance whose life guard it belongs to is gone.
type Died = oneshot::Receiver<()>;

/// The future that holds the guard and stops its actor when the hive shuts down.
fn life_guard<A: Actor<Context = Context<A>>>(
    guard: oneshot::Sender<()>,
    mut stop: watch::Receiver<bool>,
) -> impl actix::ActorFuture<A, Output = ()> {
    actix::fut::wrap_future::<_, A>(async move {
        let _guard = guard;
        // An error means the hive is gone, which also means: stop.
        let _ = stop.wait_for(|stopped| *stopped).await;
    })
    .map(|(), _actor, ctx: &mut Context<A>| ctx.stop())
}

fn backoff(consecutive_failures: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(2u32.saturating_pow(consecutive_failures))
        .min(MAX_BACKOFF)
}

async fn watch<R: Recipe>(hive: Hive, mut recipe: R, mut died: oneshot::Receiver<()>) {
    let mut failures = 0u32;
    loop {
        let started = Instant::now();
        // Err means the guard was dropped: the instance is gone, whatever the reason.
        let _ = (&mut died).await;
        if hive.is_shutting_down() || recipe.retired() {
            recipe.stopped();
            return;
        }
        if started.elapsed() >= STABLE_AFTER {
            failures = 0;
        }
        let delay = backoff(failures);
        failures = failures.saturating_add(1);
        recipe.failed(delay);
        tokio::time::sleep(delay).await;
        if hive.is_shutting_down() || recipe.retired() {
            recipe.stopped();
            return;
        }
        let (mailbox, next) = spawn_instance(&hive, &mut recipe);
        recipe.restarted_with(&mailbox);
        died = next;
    }
}

/// Modules: registered with the hive and supervised with a `ModuleRecipe`.
impl Hive {
    /// Starts `module` on the current arbiter, registers it and supervises it.
    ///
    /// Must be called from inside a running actix system.
    pub fn start_module<M: Module>(&self, module: M) -> Result<Addr<M::Actor>, HiveError> {
        self.register_module(module, supervise)
    }

    /// [`Hive::start_module`] on `arbiter`'s thread: for a module whose work should not
    /// share a thread with the others (the actor is built here, then moved there; restarts
    /// happen there).
    pub fn start_module_on<M>(
        &self,
        arbiter: &actix::ArbiterHandle,
        module: M,
    ) -> Result<Addr<M::Actor>, HiveError>
    where
        M: Module,
        M::Actor: Send,
    {
        self.register_module(module, |hive, recipe| {
            supervise_mailbox_on(arbiter, hive, recipe)
        })
    }

    /// Registers `module` with the actor `supervise` starts from its recipe.
    fn register_module<M: Module>(
        &self,
        module: M,
        supervise: impl FnOnce(&Hive, ModuleRecipe<M>) -> AddressSender<M::Actor>,
    ) -> Result<Addr<M::Actor>, HiveError> {
        let name = module.name().to_owned();
        let group = module.group().to_owned();
        let capacity = module.mailbox_capacity();
        let mut accepts = Accepts::new();
        module.accepts(&mut accepts);
        self.register(name, &group, capacity, accepts, |hive, stats| {
            supervise(
                hive,
                ModuleRecipe {
                    hive: hive.clone(),
                    module: Arc::new(module),
                    stats,
                },
            )
        })
    }
}

/// The recipe the hive supervises a registered [`Module`] with.
struct ModuleRecipe<M: Module> {
    hive: Hive,
    module: Arc<M>,
    stats: Arc<ModuleStats>,
}

impl<M: Module> Recipe for ModuleRecipe<M> {
    type Actor = M::Actor;

    fn create(&mut self) -> M::Actor {
        self.module.create(&self.hive)
    }

    fn mailbox_capacity(&self) -> usize {
        self.module.mailbox_capacity()
    }

    fn failed(&mut self, delay: Duration) {
        self.stats.restarts.inc();
        self.stats.set_state(ModuleState::Restarting);
        tracing::warn!(
            module = %self.stats.name,
            restarts = self.stats.restarts.get(),
            ?delay,
            "module stopped or panicked; restarting"
        );
    }

    fn restarted_with(&mut self, mailbox: &AddressSender<M::Actor>) {
        self.hive.replace_addr(&self.stats.name, mailbox);
        self.stats.set_state(ModuleState::Running);
    }

    fn stopped(&mut self) {
        self.stats.set_state(ModuleState::Stopped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_then_caps() {
        assert_eq!(backoff(0), FIRST_BACKOFF);
        assert_eq!(backoff(1), FIRST_BACKOFF * 2);
        assert_eq!(backoff(3), FIRST_BACKOFF * 8);
        assert_eq!(backoff(40), MAX_BACKOFF);
    }
}
