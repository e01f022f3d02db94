//! Restarting modules that stop or panic.
//!
//! actix's own `Supervisor` restarts actors that stop but not ones that panic: a panic ends
//! the actor's task and drops its context. So each module instance gets a *life guard*: a
//! oneshot sender parked in a never-ending future spawned into the actor's context. Whatever
//! ends the actor (stop or panic), its context and with it the guard is dropped, the watcher
//! wakes, and starts a fresh actor from the module's recipe after a backoff. The same future
//! ends, and stops its actor, when the hive shuts down.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, ActorContext, ActorFutureExt, Addr, ArbiterHandle, AsyncContext};
use tokio::sync::oneshot;

use super::metrics::ModuleStats;
use super::{Hive, Module, ModuleState};

/// First restart delay; doubled per consecutive failure.
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// Longest restart delay.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// A module that ran this long before failing starts again from the first delay.
const STABLE_AFTER: Duration = Duration::from_secs(10);

/// The watcher of one module, to be spawned once the module is registered.
pub(super) struct Watch<M: Module> {
    hive: Hive,
    module: Arc<M>,
    stats: Arc<ModuleStats>,
    arbiter: ArbiterHandle,
    died: oneshot::Receiver<()>,
}

/// Starts the first instance of `module` on the current arbiter.
pub(super) fn start<M: Module>(
    hive: Hive,
    module: Arc<M>,
    stats: Arc<ModuleStats>,
) -> (Addr<M::Actor>, Watch<M>) {
    let arbiter = actix::Arbiter::current();
    let (addr, died) = spawn_instance(&hive, &module, &arbiter);
    let watch = Watch {
        hive,
        module,
        stats,
        arbiter,
        died,
    };
    (addr, watch)
}

fn spawn_instance<M: Module>(
    hive: &Hive,
    module: &Arc<M>,
    arbiter: &ArbiterHandle,
) -> (Addr<M::Actor>, oneshot::Receiver<()>) {
    let (guard, died) = oneshot::channel::<()>();
    let recipe = module.clone();
    let hive = hive.clone();
    let capacity = module.mailbox_capacity();
    let stopped = hive.stopped();
    let addr = M::Actor::start_in_arbiter(arbiter, move |ctx| {
        ctx.set_mailbox_capacity(capacity);
        let life = actix::fut::wrap_future::<_, M::Actor>(async move {
            let _guard = guard;
            stopped.await
        });
        ctx.spawn(life.map(|(), _actor, ctx| ctx.stop()));
        recipe.create(&hive)
    });
    (addr, died)
}

fn backoff(consecutive_failures: u32) -> Duration {
    FIRST_BACKOFF
        .saturating_mul(2u32.saturating_pow(consecutive_failures))
        .min(MAX_BACKOFF)
}

impl<M: Module> Watch<M> {
    pub(super) fn spawn(self) {
        actix::spawn(self.run());
    }

    async fn run(mut self) {
        let mut failures = 0u32;
        loop {
            let started = Instant::now();
            // Err means the guard was dropped: the instance is gone, whatever the reason.
            let _ = (&mut self.died).await;
            if self.hive.is_shutting_down() {
                self.stats.set_state(ModuleState::Stopped);
                return;
            }
            if started.elapsed() >= STABLE_AFTER {
                failures = 0;
            }
            let delay = backoff(failures);
            failures = failures.saturating_add(1);
            self.stats.restarts.inc();
            self.stats.set_state(ModuleState::Restarting);
            tracing::warn!(
                module = %self.stats.name,
                restarts = self.stats.restarts.get(),
                ?delay,
                "module stopped or panicked; restarting"
            );
            tokio::time::sleep(delay).await;
            if self.hive.is_shutting_down() {
                self.stats.set_state(ModuleState::Stopped);
                return;
            }
            let (addr, died) = spawn_instance(&self.hive, &self.module, &self.arbiter);
            self.hive.replace_addr(&self.stats.name, addr);
            self.died = died;
            self.stats.set_state(ModuleState::Running);
        }
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
