//! The ratio retry budget: an account's retries may be at most `percent` of its
//! calls over a sliding window, plus `min-retries-per-second` times the
//! window's seconds, shared by every worker (Finagle's `RetryBudget`,
//! Linkerd's `retryBudget`, Gateway API GEP-3388 `retryConstraint`). Unlike
//! the retry quota it needs no tuning of token costs: "a fifth more load at
//! most" is the whole rule. The counts live in the host's shared state
//! (`shared.rs`), one short text per account, changed with compare-and-set.
//!
//! The window is two fixed windows, the older weighted by how much of it still
//! overlaps the sliding one (as the breakers' ratio, `breaker.rs`).

use alloc::string::String;

use crate::arith::mul_saturating;
use crate::cat::cat;
use crate::config::RetryRatioConfig;
use crate::shared::SharedState;

/// How often a store that keeps refusing a compare-and-set is asked again.
const MAX_TRIES: usize = 4;

/// The counts of one account, as stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// When the current fixed window began (store clock, ms).
    pub window_start: u64,
    pub calls: u64,
    pub retries: u64,
    pub prev_calls: u64,
    pub prev_retries: u64,
}

impl Counts {
    /// `r1 <window-start> <calls> <retries> <prev-calls> <prev-retries>`.
    pub fn encode(&self) -> String {
        cat!("r1 ", self.window_start, " ", self.calls, " ", self.retries, " ", self.prev_calls, " ", self.prev_retries)
    }

    /// The counts, or `None` for a text this module did not write.
    pub fn decode(text: &str) -> Option<Counts> {
        let mut parts = text.split(' ');
        if parts.next()? != "r1" {
            return None;
        }
        let mut next = || parts.next().and_then(|p| if p.bytes().all(|b| b.is_ascii_digit()) { p.parse::<u64>().ok() } else { None });
        let counts = Counts { window_start: next()?, calls: next()?, retries: next()?, prev_calls: next()?, prev_retries: next()? };
        parts.next().is_none().then_some(counts)
    }

    /// Moves the windows on to the one holding `now_ms`.
    fn roll(&mut self, config: &RetryRatioConfig, now_ms: u64) {
        let window = config.window_ms;
        if now_ms < self.window_start {
            // A clock behind the stored window (another worker's store clock,
            // or a text from the future): start again rather than trust it.
            *self = Counts { window_start: now_ms, ..Counts::default() };
            return;
        }
        let passed = (now_ms - self.window_start) / window;
        if passed == 0 {
            return;
        }
        (self.prev_calls, self.prev_retries) = if passed == 1 { (self.calls, self.retries) } else { (0, 0) };
        (self.calls, self.retries) = (0, 0);
        self.window_start = self.window_start.saturating_add(passed.saturating_mul(window));
    }

    /// The older window's share still inside the sliding window, applied to `count`.
    fn weighted(&self, config: &RetryRatioConfig, now_ms: u64, previous: u64, current: u64) -> u64 {
        let into = now_ms.saturating_sub(self.window_start).min(config.window_ms);
        let left = config.window_ms - into;
        // u64, saturating: u128 division would cost the component a kilobyte.
        current.saturating_add(mul_saturating(previous, left) / config.window_ms)
    }

    /// The retries the window allows now.
    pub fn allowed(&self, config: &RetryRatioConfig, now_ms: u64) -> u64 {
        let calls = self.weighted(config, now_ms, self.prev_calls, self.calls);
        let share = mul_saturating(calls, config.percent.into()) / 100;
        let floor = mul_saturating(config.min_retries_per_second.into(), config.window_ms) / 1000;
        share.saturating_add(floor)
    }
}

/// The store key of an account's counts; the id's length first, as the breakers'.
pub fn key(account_id: &str) -> String {
    cat!("retry-ratio:", account_id.len(), ":", account_id)
}

/// What the ratio says of a retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// Past the share: room returns when the current window ends, in ms.
    Refused {
        resets_in_ms: u64,
    },
}

/// Counts a call (`retry` false) or asks for a retry (`retry` true), counting it
/// if allowed. A store that keeps refusing, or holds a text this module did
/// not write, does not stop retries: the budget fails open, as the breakers do.
pub fn take(store: &mut dyn SharedState, account_id: &str, config: &RetryRatioConfig, retry: bool, now_ms: u64) -> Verdict {
    let key = key(account_id);
    // Kept for two windows: the sliding window reads the older one.
    let ttl_ms = config.window_ms.saturating_mul(2).saturating_add(1000);
    for _ in 0..MAX_TRIES {
        let loaded = store.load(&key, now_ms);
        let now = loaded.now_ms;
        let mut counts = loaded.value.as_deref().and_then(Counts::decode).unwrap_or(Counts { window_start: now, ..Counts::default() });
        counts.roll(config, now);
        if retry {
            let retries = counts.weighted(config, now, counts.prev_retries, counts.retries);
            if retries >= counts.allowed(config, now) {
                let resets_in_ms = counts.window_start.saturating_add(config.window_ms).saturating_sub(now);
                return Verdict::Refused { resets_in_ms };
            }
            counts.retries = counts.retries.saturating_add(1);
        } else {
            counts.calls = counts.calls.saturating_add(1);
        }
        if store.store_if(&key, loaded.version, &counts.encode(), ttl_ms) {
            return Verdict::Allowed;
        }
    }
    Verdict::Allowed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::MemoryState;

    const NOW: u64 = 1_764_460_800_000;

    fn config(percent: u32, floor: u32) -> RetryRatioConfig {
        RetryRatioConfig { percent, min_retries_per_second: floor, window_ms: 10_000 }
    }

    #[test]
    fn retries_are_a_share_of_the_calls_plus_a_floor() {
        let c = config(20, 0);
        let mut store = MemoryState::default();
        for _ in 0..10 {
            assert_eq!(take(&mut store, "acme", &c, false, NOW), Verdict::Allowed);
        }
        assert_eq!(take(&mut store, "acme", &c, true, NOW), Verdict::Allowed);
        assert_eq!(take(&mut store, "acme", &c, true, NOW + 1), Verdict::Allowed);
        assert_eq!(take(&mut store, "acme", &c, true, NOW + 2), Verdict::Refused { resets_in_ms: 9998 }, "20 % of 10 calls is 2");
        // Another account has its own counts; a floor of 1 a second allows 10 in 10 s with no calls.
        let floor = config(20, 1);
        for i in 0..10 {
            assert_eq!(take(&mut store, "other", &floor, true, NOW + i), Verdict::Allowed, "{i}");
        }
        assert!(matches!(take(&mut store, "other", &floor, true, NOW + 10), Verdict::Refused { .. }));
    }

    #[test]
    fn the_older_window_fades_out() {
        let c = config(50, 0);
        let mut store = MemoryState::default();
        for _ in 0..10 {
            take(&mut store, "a", &c, false, NOW);
        }
        for _ in 0..5 {
            assert_eq!(take(&mut store, "a", &c, true, NOW), Verdict::Allowed);
        }
        assert!(matches!(take(&mut store, "a", &c, true, NOW), Verdict::Refused { .. }));
        // Half-way through the next window half the old counts remain: 5 calls allow 2, and 2 are used...
        assert!(matches!(take(&mut store, "a", &c, true, NOW + 15_000), Verdict::Refused { .. }));
        // ...until new calls come: 15 allow 7.
        for _ in 0..10 {
            take(&mut store, "a", &c, false, NOW + 15_000);
        }
        assert_eq!(take(&mut store, "a", &c, true, NOW + 15_000), Verdict::Allowed);
        // Two windows later nothing is left of them: with no calls there is no room.
        assert!(matches!(take(&mut store, "a", &c, true, NOW + 30_000), Verdict::Refused { .. }));
    }

    #[test]
    fn a_text_it_did_not_write_is_dropped_and_a_clock_behind_starts_again() {
        for bad in ["", "r1", "r2 0 0 0 0 0", "r1 0 0 0 0", "r1 0 0 0 0 0 0", "r1 -1 0 0 0 0", "r1 0 0 x 0 0", "r1 +1 0 0 0 0"] {
            assert_eq!(Counts::decode(bad), None, "{bad:?}");
        }
        let stored = Counts { window_start: NOW + 60_000, calls: 0, retries: 1_000_000, prev_calls: 0, prev_retries: 0 };
        assert_eq!(Counts::decode(&stored.encode()), Some(stored));
        let mut store = MemoryState::default();
        store.store_if(&key("a"), 0, &stored.encode(), 1000);
        assert_eq!(take(&mut store, "a", &config(20, 1), true, NOW), Verdict::Allowed, "a window from the future is not trusted");
    }
}
