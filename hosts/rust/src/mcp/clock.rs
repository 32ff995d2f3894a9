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

    /// Real time that `ms` of policy time takes.
    pub fn real_duration(&self, ms: u64) -> Duration {
        Duration::from_secs_f64(ms as f64 / 1000.0 * self.scale)
    }

    /// Sleeps `ms` of policy time; cancellable by dropping the future.
    pub async fn sleep(&self, ms: u64) {
        if ms > 0 {
            tokio::time::sleep(self.real_duration(ms)).await;
        }
    }
}
