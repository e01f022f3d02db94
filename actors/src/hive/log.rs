//! Logging what peers send without letting them fill the log: untrusted text is clipped, and
//! a peer's warnings are rate-limited with the number held back reported.

use std::borrow::Cow;
use std::time::{Duration, Instant};

/// Characters of untrusted text a log line keeps.
pub(crate) const CLIP_CHARS: usize = 128;

/// `text` as a log line may carry it: at most [`CLIP_CHARS`] characters, then how long it was.
pub(crate) fn clip(text: &str) -> Cow<'_, str> {
    match text.char_indices().nth(CLIP_CHARS) {
        None => Cow::Borrowed(text),
        Some((cut, _)) => Cow::Owned(format!("{}… ({} bytes)", &text[..cut], text.len())),
    }
}

// Only the cloud budgets its peers' warnings today.
#[cfg_attr(not(feature = "cloud"), allow(dead_code))]
/// Warnings one peer may cause per [`WarnBudget::WINDOW`].
pub(crate) const WARNINGS_PER_WINDOW: u32 = 20;

/// A peer's allowance of warning lines: [`WARNINGS_PER_WINDOW`] per [`WarnBudget::WINDOW`],
/// the rest held back and counted.
#[derive(Debug)]
#[cfg_attr(not(feature = "cloud"), allow(dead_code))]
pub(crate) struct WarnBudget {
    window_start: Instant,
    used: u32,
    held_back: u64,
    limit: u32,
}

impl Default for WarnBudget {
    fn default() -> Self {
        WarnBudget::with_limit(WARNINGS_PER_WINDOW)
    }
}

#[cfg_attr(not(feature = "cloud"), allow(dead_code))]
impl WarnBudget {
    /// The length of one window.
    pub(crate) const WINDOW: Duration = Duration::from_secs(10);

    /// A budget of `limit` warnings per [`WarnBudget::WINDOW`] (for many peers together).
    pub(crate) fn with_limit(limit: u32) -> Self {
        WarnBudget {
            window_start: Instant::now(),
            used: 0,
            held_back: 0,
            limit,
        }
    }

    /// Whether the budget is as new at `now`: its window is over and nothing is held back, so
    /// forgetting it loses nothing.
    pub(crate) fn is_idle(&self, now: Instant) -> bool {
        self.held_back == 0 && now.saturating_duration_since(self.window_start) >= Self::WINDOW
    }

    /// Whether a warning may be logged at `now`: `Some(n)` with the number held back since
    /// the last one logged (for the line to report), `None` when it is held back.
    pub(crate) fn take(&mut self, now: Instant) -> Option<u64> {
        if now.saturating_duration_since(self.window_start) >= Self::WINDOW {
            self.window_start = now;
            self.used = 0;
        }
        if self.used < self.limit {
            self.used += 1;
            Some(std::mem::take(&mut self.held_back))
        } else {
            self.held_back += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_clipped_and_says_how_long_it_was() {
        assert_eq!(clip("short"), "short");
        let long = "é".repeat(1000);
        let clipped = clip(&long);
        assert!(clipped.starts_with(&"é".repeat(CLIP_CHARS)));
        assert!(clipped.ends_with("… (2000 bytes)"), "{clipped}");
    }

    #[test]
    fn warnings_beyond_the_budget_are_held_back_and_reported_later() {
        let mut budget = WarnBudget::default();
        let start = Instant::now();
        for _ in 0..WARNINGS_PER_WINDOW {
            assert_eq!(budget.take(start), Some(0));
        }
        assert_eq!(budget.take(start), None);
        assert_eq!(budget.take(start), None);
        assert_eq!(budget.take(start + WarnBudget::WINDOW), Some(2));
    }
}
