//! The embedded backend: one bucket per account in this process's memory.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::{AccountBudgetBackend, Bucket, Reservation, gcra, gcra_refund};

/// How far a caller's `now-ms` may be from this process's clock before the
/// backend warns (once) that the caller's clock is off: a skewed worker, a
/// clock stepped back, µs instead of ms, 0. The buckets never use it.
pub const MAX_CLOCK_SKEW_MS: u64 = 5_000;

/// One bucket per account, in this process: shared by every run and every
/// component instance that holds the same `EmbeddedAccounts`.
///
/// The buckets are kept on this process's monotonic clock (the wall clock when
/// the backend was made, plus the time since), as the Redis backend keeps them
/// on the server's. A caller's `now-ms` is not used: a step of the wall clock
/// moves nothing, and a worker whose clock is an hour off can neither lock the
/// account for the others nor take more than its share (a wait is a duration,
/// the same on any clock). Simulations that run every worker on one simulated
/// clock use [`EmbeddedAccounts::on_host_clock`].
pub struct EmbeddedAccounts {
    tats: Mutex<HashMap<String, u64>>,
    trust_host_clock: bool,
    warned: AtomicBool,
    /// The wall clock (ms since the epoch) at `started`.
    epoch_ms_at_start: u64,
    started: Instant,
}

impl Default for EmbeddedAccounts {
    fn default() -> Self {
        Self::new()
    }
}

impl EmbeddedAccounts {
    /// Buckets in this process's time (see the type's documentation).
    pub fn new() -> Self {
        let epoch_ms_at_start = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        EmbeddedAccounts {
            tats: Mutex::new(HashMap::new()),
            trust_host_clock: false,
            warned: AtomicBool::new(false),
            epoch_ms_at_start,
            started: Instant::now(),
        }
    }

    /// Buckets in whatever time the callers pass: for simulations and test
    /// vectors in which every caller shares one simulated clock.
    pub fn on_host_clock() -> Self {
        EmbeddedAccounts { trust_host_clock: true, ..Self::new() }
    }

    /// The time to keep the buckets in for a call that says `host_now_ms`: its
    /// own on the host's clock, else the process's.
    fn now_ms(&self, host_now_ms: u64) -> u64 {
        if self.trust_host_clock {
            return host_now_ms;
        }
        let own = self.epoch_ms_at_start.saturating_add(self.started.elapsed().as_millis() as u64);
        if host_now_ms.abs_diff(own) > MAX_CLOCK_SKEW_MS && !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                target: "agent_retry",
                host_now_ms,
                process_now_ms = own,
                "the account budget got a time more than {MAX_CLOCK_SKEW_MS} ms from this process's clock (a skewed or stepped clock? µs instead of ms?); \
                 the buckets keep the process's clock; said once"
            );
        }
        own
    }
}

impl AccountBudgetBackend for EmbeddedAccounts {
    fn reserve(&self, account_id: &str, tokens: u32, bucket: Bucket, max_wait_ms: u64, now_ms: u64) -> Reservation {
        let now_ms = self.now_ms(now_ms);
        let mut tats = self.tats.lock().unwrap_or_else(|p| p.into_inner());
        let stored = tats.get(account_id).copied().unwrap_or(0);
        let (reservation, new_tat) = gcra(stored, tokens, bucket, max_wait_ms, now_ms);
        if new_tat != stored {
            tats.insert(account_id.to_string(), new_tat);
        }
        reservation
    }

    fn refund(&self, account_id: &str, tokens: u32, bucket: Bucket, now_ms: u64) {
        let now_ms = self.now_ms(now_ms);
        let mut tats = self.tats.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tat) = tats.get_mut(account_id) {
            *tat = gcra_refund(*tat, tokens, bucket, now_ms);
        }
    }
}
