//! Where a wrapper reads the time and sleeps: the real clock by default
//! ([`crate::mcp::Clock`]), a fake one in tests ([`crate::testing::FakeClock`]).

use futures::future::BoxFuture;

/// Policy time and sleeping in it. The policy reads no clock: the wrapper
/// passes `now_ms` in and sleeps the delays it is given.
pub trait TimeSource: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
    /// Sleeps `ms` of this clock's time; cancellable by dropping the future.
    fn sleep(&self, ms: u64) -> BoxFuture<'_, ()>;
    /// Fires once `ms` of this clock's time have passed, without moving the
    /// clock: the deadline raced against an attempt. By default a sleep; a
    /// fake clock, which moves only when slept on, never fires it (its
    /// deadlines are checked before each wait instead).
    fn timer(&self, ms: u64) -> BoxFuture<'_, ()> {
        self.sleep(ms)
    }
}

impl TimeSource for crate::mcp::Clock {
    fn now_ms(&self) -> u64 {
        crate::mcp::Clock::now_ms(self)
    }

    fn sleep(&self, ms: u64) -> BoxFuture<'_, ()> {
        Box::pin(crate::mcp::Clock::sleep(self, ms))
    }
}
