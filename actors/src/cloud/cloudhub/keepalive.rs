//! The keepalive deadlines of every session, on one coarse timer wheel.
//!
//! A session that gets no keepalive for `keepaliveInterval` is closed (Away, "keepalive
//! timeout"). With a timer per session, each keepalive cancelled one timer and made another
//! (an allocation, two changes to the runtime's timer wheel, and the timer's box kept for as
//! long as the session): at a million nodes sending one every 15 s, 66,667 of each a second.
//! Here a keepalive only stores the time in the connection's [`ConnectionStats`]; one task
//! looks at each session about once per interval, in slots of `interval / 8` (at most a
//! second): a session not heard from in time is closed through its node's cell, any other is
//! put back in the slot of its new deadline. A session is closed between `interval` and
//! `interval` plus one slot after its last keepalive.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::node::{clock_ms, ConnectionStats, NodeCell};
use crate::hive::locks;

/// One session on the wheel.
struct Watched {
    cell: Arc<NodeCell>,
    stats: Arc<ConnectionStats>,
    session: u64,
}

struct Slots {
    /// Sessions by the tick of their deadline, modulo the number of slots.
    slots: Vec<Vec<Watched>>,
    /// The last tick looked at.
    done: u64,
}

/// The wheel; see the [module docs](self).
pub(crate) struct KeepaliveWheel {
    interval_ms: u64,
    tick_ms: u64,
    slots: Mutex<Slots>,
}

impl KeepaliveWheel {
    /// A wheel for sessions closed after `interval` without a keepalive, turned by a task on
    /// the current arbiter for as long as the wheel lives.
    pub(crate) fn start(interval: Duration) -> Arc<KeepaliveWheel> {
        let interval_ms = u64::try_from(interval.as_millis())
            .unwrap_or(u64::MAX / 4)
            .max(1);
        let tick_ms = (interval_ms / 8).clamp(1, 1000);
        // Every deadline (at most one interval ahead) has a slot of its own tick.
        let count = usize::try_from(interval_ms / tick_ms + 2).unwrap_or(usize::MAX);
        let wheel = Arc::new(KeepaliveWheel {
            interval_ms,
            tick_ms,
            slots: Mutex::new(Slots {
                slots: (0..count).map(|_| Vec::new()).collect(),
                done: clock_ms() / tick_ms,
            }),
        });
        actix::spawn(turn(Arc::downgrade(&wheel)));
        wheel
    }

    /// Tracks connection `session` of `cell` from now on (its stats say when it was last
    /// heard from), until its session ends.
    pub(crate) fn track(&self, cell: Arc<NodeCell>, stats: Arc<ConnectionStats>, session: u64) {
        let due = stats.alive_ms().saturating_add(self.interval_ms);
        let watched = Watched {
            cell,
            stats,
            session,
        };
        let mut slots = locks::lock(&self.slots);
        self.put(&mut slots, watched, due);
    }

    fn put(&self, slots: &mut Slots, watched: Watched, due_ms: u64) {
        // Never into a tick already looked at: the next one at the earliest.
        let tick = due_ms.div_ceil(self.tick_ms).max(slots.done + 1);
        let count = slots.slots.len() as u64;
        slots.slots[(tick % count) as usize].push(watched);
    }

    /// Looks at the sessions of every tick up to now: ended ones are dropped, silent ones
    /// closed, the others put back at their deadline.
    fn advance(&self) {
        let now = clock_ms();
        let now_tick = now / self.tick_ms;
        let mut expired = Vec::new();
        {
            let mut slots = locks::lock(&self.slots);
            let count = slots.slots.len() as u64;
            // Behind by more than a turn: every slot once is all there is to look at.
            let first = slots.done.max(now_tick.saturating_sub(count)) + 1;
            for tick in first..=now_tick {
                let taken = std::mem::take(&mut slots.slots[(tick % count) as usize]);
                slots.done = tick;
                for watched in taken {
                    if watched.stats.has_ended() {
                        continue;
                    }
                    let due = watched.stats.alive_ms().saturating_add(self.interval_ms);
                    if due <= now {
                        expired.push(watched);
                    } else {
                        self.put(&mut slots, watched, due);
                    }
                }
            }
            slots.done = slots.done.max(now_tick);
        }
        // Outside the lock: closing goes through the node's cell.
        for watched in expired {
            watched.cell.keepalive_missed(watched.session);
        }
    }
}

/// Turns the wheel every tick until it is dropped.
async fn turn(wheel: Weak<KeepaliveWheel>) {
    let Some(tick) = wheel
        .upgrade()
        .map(|wheel| Duration::from_millis(wheel.tick_ms))
    else {
        return;
    };
    let mut ticks = tokio::time::interval(tick);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(wheel) = wheel.upgrade() else {
            return;
        };
        wheel.advance();
    }
}
