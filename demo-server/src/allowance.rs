//! The account allowance: at most `limit` tool calls per fixed window, shared by
//! every client of the server. Past it, a call is answered 429 with `Retry-After`
//! and a `RateLimit` header, before it runs.

use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Allowance {
    limit: u32,
    window: Duration,
    started: Instant,
    window_index: u64,
    used: u32,
    /// Calls admitted in each window so far, by window index (for tests).
    pub admitted_per_window: Vec<u32>,
    /// Calls refused with 429.
    pub refused: u32,
}

impl Allowance {
    pub fn new(limit: u32, window: Duration) -> Self {
        Allowance { limit, window, started: Instant::now(), window_index: 0, used: 0, admitted_per_window: vec![0], refused: 0 }
    }

    /// Admits a call now, or says how long until the window resets.
    pub fn admit(&mut self) -> Result<(), Duration> {
        let elapsed = self.started.elapsed();
        let index = (elapsed.as_nanos() / self.window.as_nanos().max(1)) as u64;
        if index != self.window_index {
            self.window_index = index;
            self.used = 0;
        }
        while self.admitted_per_window.len() <= index as usize {
            self.admitted_per_window.push(0);
        }
        if self.used < self.limit {
            self.used += 1;
            self.admitted_per_window[index as usize] += 1;
            Ok(())
        } else {
            self.refused += 1;
            let window_end = self.window * (index as u32 + 1);
            Err(window_end.saturating_sub(elapsed))
        }
    }
}
