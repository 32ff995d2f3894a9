//! The embedded backend: one bucket per account in this process's memory.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::{AccountBudgetBackend, Bucket, Reservation, gcra, gcra_refund};

/// How far a caller's `now-ms` may be from this process's clock before the
/// backend stops believing it: a day covers every sane host clock, and the
/// demo's sped-up policy time; a clock in µs (1,000× ahead), one in the past or 0 is far outside.
pub const MAX_CLOCK_SKEW_MS: u64 = 24 * 60 * 60 * 1000;

/// One bucket per account, in this process: shared by every run and every
/// component instance that holds the same `EmbeddedAccounts`.
///
/// The buckets are kept in this process's time, as the Redis backend keeps
/// them in the server's: a `now-ms` more than [`MAX_CLOCK_SKEW_MS`] from the
/// process's clock (a worker passing µs, a clock in the past, 0) is not
/// believed; that call uses the process's clock instead, so one bad clock
/// cannot move the account's state for every worker. Simulations that run
/// every worker on one simulated clock use [`EmbeddedAccounts::on_host_clock`].
pub struct EmbeddedAccounts {
    tats: Mutex<HashMap<String, u64>>,
    trust_host_clock: bool,
    warned: AtomicBool,
}

impl Default for EmbeddedAccounts {
    fn default() -> Self {
        Self::new()
    }
}

impl EmbeddedAccounts {
    /// Buckets in this process's time (see the type's documentation).
    pub fn new() -> Self {
        EmbeddedAccounts { tats: Mutex::new(HashMap::new()), trust_host_clock: false, warned: AtomicBool::new(false) }
    }

    /// Buckets in whatever time the callers pass: for simulations and test
    /// vectors in which every caller shares one simulated clock.
    pub fn on_host_clock() -> Self {
        EmbeddedAccounts { trust_host_clock: true, ..Self::new() }
    }

    /// The time to keep the buckets in for a call that says `host_now_ms`.
    fn now_ms(&self, host_now_ms: u64) -> u64 {
        if self.trust_host_clock {
            return host_now_ms;
        }
        let own = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        if host_now_ms.abs_diff(own) <= MAX_CLOCK_SKEW_MS {
            return host_now_ms;
        }
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                target: "agent_retry",
                host_now_ms,
                process_now_ms = own,
                "the account budget got a time far from this process's clock (µs instead of ms? a clock in the past?): \
                 that call used the process's clock; said once"
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
