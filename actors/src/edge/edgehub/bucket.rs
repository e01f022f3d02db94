//! The upstream rate limit: a token bucket of `messageQPS`, `messageBurst`, as KubeEdge's.

use std::time::Duration;

/// KubeEdge's upstream rate limit: `qps` tokens a second, at most `burst` saved up.
#[derive(Debug)]
pub(super) struct TokenBucket {
    tokens: f64,
    burst: f64,
    per_token: Duration,
    last: tokio::time::Instant,
}

impl TokenBucket {
    pub(super) fn new(qps: u32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            tokens: burst,
            burst,
            per_token: Duration::from_secs_f64(1.0 / f64::from(qps.max(1))),
            last: tokio::time::Instant::now(),
        }
    }

    fn refill(&mut self) {
        let now = tokio::time::Instant::now();
        let earned = now.duration_since(self.last).as_secs_f64() / self.per_token.as_secs_f64();
        self.tokens = (self.tokens + earned).min(self.burst);
        self.last = now;
    }

    /// When the next token is there (now if one is).
    pub(super) fn next_available(&mut self) -> tokio::time::Instant {
        self.refill();
        if self.tokens >= 1.0 {
            self.last
        } else {
            self.last + self.per_token.mul_f64(1.0 - self.tokens)
        }
    }

    /// Spends a token (the caller waited for [`Self::next_available`]).
    pub(super) fn take(&mut self) {
        self.refill();
        self.tokens = (self.tokens - 1.0).max(0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[actix_rt::test]
    async fn bucket_allows_a_burst_then_the_sustained_rate() {
        let mut bucket = TokenBucket::new(30, 60);
        for _ in 0..60 {
            assert!(bucket.next_available() <= tokio::time::Instant::now());
            bucket.take();
        }
        // The 61st waits about 1/30 s.
        let wait = bucket
            .next_available()
            .duration_since(tokio::time::Instant::now());
        assert!(
            wait > Duration::from_millis(25) && wait <= Duration::from_millis(34),
            "{wait:?}"
        );
    }
}
