//! The host's clock. The policy reads no clock: the host passes `now-ms` in. A
//! scale below 1 runs time faster (tests and the demo wait 2 s of policy time in
//! 2 s × scale of real time) while the policy sees consistent wall-clock time.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Clone, Copy, Debug)]
pub struct Clock {
    epoch_ms_at_start: u64,
    started: Instant,
    /// Real seconds per policy second.
    scale: f64,
}

impl Clock {
    /// Real time (scale 1).
    pub fn real() -> Self {
        Self::scaled(1.0)
    }

    /// Policy time runs `1 / scale` times faster than real time.
    pub fn scaled(scale: f64) -> Self {
        let epoch_ms_at_start = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        Clock { epoch_ms_at_start, started: Instant::now(), scale: scale.clamp(1e-6, 1.0) }
    }

    /// Policy time: ms since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        let elapsed = self.started.elapsed().as_secs_f64() / self.scale;
        self.epoch_ms_at_start + (elapsed * 1000.0) as u64
    }

    /// Real time that `ms` of policy time takes; any `ms` (up to u64::MAX)
    /// is safe: tokio's timers cap a far deadline themselves.
    pub fn real_duration(&self, ms: u64) -> Duration {
        Duration::try_from_secs_f64(ms as f64 / 1000.0 * self.scale).unwrap_or(Duration::MAX)
    }

    /// Sleeps `ms` of policy time; cancellable by dropping the future.
    pub async fn sleep(&self, ms: u64) {
        if ms > 0 {
            tokio::time::sleep(self.real_duration(ms)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wait_of_any_length_neither_overflows_nor_ends_early() {
        let clock = Clock::real();
        assert!(clock.real_duration(u64::MAX) >= Duration::from_secs(u64::MAX / 1000 - 1));
        let waited = tokio::select! {
            () = clock.sleep(u64::MAX) => true,
            () = tokio::task::yield_now() => false,
        };
        assert!(!waited, "a wait of u64::MAX ms is still waiting");
    }
}
