//! What one source (and everyone together) may make the certificate server do: sign
//! certificates at a bounded rate, and write a bounded number of warning lines.
//!
//! Sources are IPv4 addresses or IPv6 /64s (as for the handshake gate). The per-source maps
//! are bounded: entries that are as new are forgotten when a map grows past
//! [`MAX_SOURCES`], and while it is still full a new source shares the global allowance only.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::hive::log::WarnBudget;

/// Sources remembered at most by each per-source map.
pub(super) const MAX_SOURCES: usize = 16_384;

/// Warning lines the certificate server writes per [`WarnBudget::WINDOW`] for all sources
/// together (each source has its own [`crate::hive::log::WARNINGS_PER_WINDOW`] too).
pub(super) const WARNINGS_IN_ALL: u32 = 100;

/// How fast certificates may be signed; see `certlimits.rs`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SigningLimits {
    /// Certificates one source may get a minute, sustained.
    pub per_source_per_minute: u32,
    /// Certificates one source may get at once after a quiet spell.
    pub per_source_burst: u32,
    /// Certificates signed a second in all (also the burst).
    pub per_second: u32,
}

impl Default for SigningLimits {
    fn default() -> Self {
        SigningLimits {
            per_source_per_minute: 10,
            per_source_burst: 20,
            per_second: 50,
        }
    }
}

/// A token bucket: `capacity` tokens, refilled at `rate` a second.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(capacity: f64, now: Instant) -> Self {
        Bucket {
            tokens: capacity,
            at: now,
        }
    }

    fn refill(&mut self, capacity: f64, rate: f64, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(capacity);
        self.at = now;
    }

    /// How long until a token is there (zero: now).
    fn wait(&self, rate: f64) -> Duration {
        if self.tokens >= 1.0 {
            Duration::ZERO
        } else if rate <= 0.0 {
            Duration::MAX
        } else {
            Duration::from_secs_f64((1.0 - self.tokens) / rate)
        }
    }
}

/// Why a certificate may not be signed now, and when to ask again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RateLimited {
    /// `true`: this source's allowance; `false`: everyone's.
    pub per_source: bool,
    /// Whole seconds to wait (at least 1): the `Retry-After` header.
    pub retry_after_secs: u64,
}

/// The certificate server's signing rate; see [`SigningLimits`].
#[derive(Debug)]
pub(super) struct SigningRate {
    limits: SigningLimits,
    global: Bucket,
    per_source: HashMap<IpAddr, Bucket>,
    /// When the map was last pruned (at most once a second: pruning walks it all).
    pruned: Option<Instant>,
}

impl SigningRate {
    /// Every allowance full.
    pub(super) fn new(limits: SigningLimits, now: Instant) -> Self {
        SigningRate {
            limits,
            global: Bucket::full(f64::from(limits.per_second), now),
            per_source: HashMap::new(),
            pruned: None,
        }
    }

    fn source_capacity(&self) -> f64 {
        f64::from(self.limits.per_source_burst.max(1))
    }

    fn source_rate(&self) -> f64 {
        f64::from(self.limits.per_source_per_minute) / 60.0
    }

    /// Takes one signing for `source` at `now`, or says why not: its own allowance first,
    /// then everyone's (a source refused its own takes none of everyone's).
    pub(super) fn take(&mut self, source: Option<IpAddr>, now: Instant) -> Result<(), RateLimited> {
        let (capacity, rate) = (self.source_capacity(), self.source_rate());
        if source.is_some_and(|source| !self.per_source.contains_key(&source))
            && self.per_source.len() >= MAX_SOURCES
            && due(&mut self.pruned, now)
        {
            self.per_source.retain(|_, bucket| {
                bucket.refill(capacity, rate, now);
                bucket.tokens < capacity
            });
        }
        let mut own = source.and_then(|source| match self.per_source.get(&source) {
            Some(bucket) => Some(*bucket),
            None if self.per_source.len() < MAX_SOURCES => Some(Bucket::full(capacity, now)),
            None => None,
        });
        if let Some(bucket) = own.as_mut() {
            bucket.refill(capacity, rate, now);
            let wait = bucket.wait(rate);
            if !wait.is_zero() {
                return Err(RateLimited {
                    per_source: true,
                    retry_after_secs: whole_seconds(wait),
                });
            }
        }
        let global_rate = f64::from(self.limits.per_second);
        self.global.refill(global_rate.max(1.0), global_rate, now);
        let wait = self.global.wait(global_rate);
        if !wait.is_zero() {
            return Err(RateLimited {
                per_source: false,
                retry_after_secs: whole_seconds(wait),
            });
        }
        self.global.tokens -= 1.0;
        if let (Some(source), Some(mut bucket)) = (source, own) {
            bucket.tokens -= 1.0;
            self.per_source.insert(source, bucket);
        }
        Ok(())
    }
}

/// Whether a walk over a full map may run at `now` (once a second), noting it when so.
fn due(last: &mut Option<Instant>, now: Instant) -> bool {
    let due = last.is_none_or(|last| now.saturating_duration_since(last) >= Duration::from_secs(1));
    if due {
        *last = Some(now);
    }
    due
}

fn whole_seconds(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.clamp(1, 24 * 3600)
}

/// The certificate server's warning lines: a budget per source and one for all.
#[derive(Debug)]
pub(super) struct Warnings {
    per_source: HashMap<IpAddr, WarnBudget>,
    all: WarnBudget,
    pruned: Option<Instant>,
}

impl Default for Warnings {
    fn default() -> Self {
        Warnings {
            per_source: HashMap::new(),
            all: WarnBudget::with_limit(WARNINGS_IN_ALL),
            pruned: None,
        }
    }
}

impl Warnings {
    /// Whether a warning caused by `source` may be logged at `now`: `Some(n)` with the
    /// number held back before it (from this source, or in all when that is larger),
    /// `None` when it is held back.
    pub(super) fn take(&mut self, source: Option<IpAddr>, now: Instant) -> Option<u64> {
        if let Some(source) = source {
            if !self.per_source.contains_key(&source)
                && self.per_source.len() >= MAX_SOURCES
                && due(&mut self.pruned, now)
            {
                self.per_source.retain(|_, budget| !budget.is_idle(now));
            }
            if self.per_source.len() < MAX_SOURCES || self.per_source.contains_key(&source) {
                let budget = self.per_source.entry(source).or_default();
                let own = budget.take(now)?;
                // Within its own budget; everyone's must allow it too.
                return self.all.take(now).map(|all| all.max(own));
            }
        }
        self.all.take(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_gets_its_burst_then_its_rate_and_everyone_shares_the_global_rate() {
        let start = Instant::now();
        let mut rate = SigningRate::new(SigningLimits::default(), start);
        let a = IpAddr::from([10, 0, 0, 1]);
        for _ in 0..20 {
            rate.take(Some(a), start).unwrap();
        }
        let refused = rate.take(Some(a), start).unwrap_err();
        assert_eq!(
            refused,
            RateLimited {
                per_source: true,
                retry_after_secs: 6
            }
        );
        // Refused again and again, and in another second only when a token is back.
        assert!(rate.take(Some(a), start).is_err());
        assert!(rate.take(Some(a), start + Duration::from_secs(5)).is_err());
        rate.take(Some(a), start + Duration::from_secs(6)).unwrap();
        // 50 in all a second: the 30 other sources' tokens run out first.
        let later = start + Duration::from_secs(6);
        let mut granted = 1;
        let mut global = None;
        for i in 0..100u8 {
            match rate.take(Some(IpAddr::from([10, 0, 1, i])), later) {
                Ok(()) => granted += 1,
                Err(limited) => {
                    global = Some(limited);
                    break;
                }
            }
        }
        assert_eq!(granted, 50);
        assert_eq!(
            global,
            Some(RateLimited {
                per_source: false,
                retry_after_secs: 1
            })
        );
    }

    #[test]
    fn many_sources_cannot_grow_the_maps_without_bound() {
        let start = Instant::now();
        let mut rate = SigningRate::new(
            SigningLimits {
                per_second: u32::MAX,
                ..SigningLimits::default()
            },
            start,
        );
        let mut warnings = Warnings::default();
        for i in 0..(MAX_SOURCES as u32 + 1000) {
            let source = IpAddr::from(i.to_be_bytes());
            let _ = rate.take(Some(source), start);
            let _ = warnings.take(Some(source), start);
        }
        assert!(rate.per_source.len() <= MAX_SOURCES);
        assert!(warnings.per_source.len() <= MAX_SOURCES);
        // A minute later the full buckets are forgotten to make room.
        let later = start + Duration::from_secs(3600);
        rate.take(Some(IpAddr::from([192, 0, 2, 1])), later)
            .unwrap();
        assert!(rate.per_source.len() < 10, "{}", rate.per_source.len());
    }

    #[test]
    fn one_source_writes_twenty_warnings_a_window_and_all_sources_a_hundred() {
        let start = Instant::now();
        let mut warnings = Warnings::default();
        let a = IpAddr::from([10, 0, 0, 1]);
        let logged = (0..1000)
            .filter(|_| warnings.take(Some(a), start).is_some())
            .count();
        assert_eq!(logged, 20);
        let logged = (0..1000u32)
            .filter(|i| {
                let source = IpAddr::from((0x0b00_0000 + i / 5).to_be_bytes());
                warnings.take(Some(source), start).is_some()
            })
            .count();
        assert_eq!(logged, 80, "100 in all, 20 used by the first source");
        let next = warnings.take(Some(a), start + WarnBudget::WINDOW + Duration::from_secs(1));
        assert_eq!(next, Some(980), "says how many were held back in all");
    }
}
