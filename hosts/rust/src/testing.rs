//! Helpers for tests of code that runs under the policy: a fake clock whose
//! sleeps return at once (and are recorded), and the documented fixed entropy
//! source (SplitMix64 from a seed, the same sequence in every host).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::future::BoxFuture;

use crate::entropy::EntropySource;
use crate::time_source::TimeSource;

/// A clock that starts at `start_ms` and moves only when slept on: a sleep
/// advances it by its length at once and is recorded.
#[derive(Debug, Default)]
pub struct FakeClock {
    now_ms: AtomicU64,
    sleeps: Mutex<Vec<u64>>,
}

impl FakeClock {
    pub fn new(start_ms: u64) -> Self {
        FakeClock { now_ms: AtomicU64::new(start_ms), sleeps: Mutex::new(Vec::new()) }
    }

    /// Moves the clock on without a sleep (time spent elsewhere).
    pub fn advance(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Every sleep asked for, in ms, in order.
    pub fn sleeps(&self) -> Vec<u64> {
        self.sleeps.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl TimeSource for FakeClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    fn sleep(&self, ms: u64) -> BoxFuture<'_, ()> {
        self.sleeps.lock().unwrap_or_else(|p| p.into_inner()).push(ms);
        self.advance(ms);
        Box::pin(std::future::ready(()))
    }
}

/// The fixed entropy source of every host's tests: SplitMix64 from `seed`
/// (Python `fixed_entropy(seed)`, Node `fixedEntropy(seed)`).
pub fn fixed_entropy(seed: u64) -> EntropySource {
    EntropySource::seeded(seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_sleep_moves_the_fake_clock_at_once_and_is_recorded() {
        let clock = FakeClock::new(1_700_000_000_000);
        let started = std::time::Instant::now();
        clock.sleep(3_600_000).await;
        clock.sleep(5).await;
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(clock.now_ms(), 1_700_000_000_000 + 3_600_005);
        assert_eq!(clock.sleeps(), vec![3_600_000, 5]);
    }

    #[test]
    fn the_fixed_source_replays() {
        let (a, b) = (fixed_entropy(7), fixed_entropy(7));
        let first: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        assert_eq!(first, (0..4).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_eq!(fixed_entropy(0).next_u64(), 0xE220_A839_7B1D_CDAF, "SplitMix64's reference value");
    }
}
