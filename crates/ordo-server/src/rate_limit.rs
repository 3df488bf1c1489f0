//! A token bucket: the per-connection request budget of HTTP and WebSocket.

use std::time::Instant;

pub struct TokenBucket {
    tokens: f64,
    updated: Instant,
    per_second: f64,
    burst: f64,
}

impl TokenBucket {
    /// Starts full: a new connection may send `burst` requests at once.
    pub fn new(per_second: u32, burst: u32) -> TokenBucket {
        TokenBucket {
            tokens: burst as f64,
            updated: Instant::now(),
            per_second: per_second as f64,
            burst: burst as f64,
        }
    }

    /// Takes one token if there is one.
    pub fn try_take(&mut self) -> bool {
        let now = Instant::now();
        self.tokens = (self.tokens + (now - self.updated).as_secs_f64() * self.per_second).min(self.burst);
        self.updated = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}
