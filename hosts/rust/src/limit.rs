//! How long a call may still wait: the nearer of its own and its run's time
//! limits, and the caller's cancellation. Every wait of the wrapper (an
//! attempt, a backoff, a status check, a reconnection) goes through it.

use std::future::Future;

use tokio_util::sync::CancellationToken;

use super::answer::StopCause;
use super::clock::Clock;

pub(crate) struct Limit<'a> {
    /// Policy time (ms since the epoch) the nearer limit passes, and which it is.
    pub deadline_ms: Option<(u64, StopCause)>,
    pub cancel: &'a CancellationToken,
    pub clock: Clock,
}

impl Limit<'_> {
    /// Waits for `work` unless the limit passes or the call is cancelled first.
    pub async fn within<T>(&self, work: impl Future<Output = T>) -> Result<T, StopCause> {
        let until_deadline = async {
            match self.deadline_ms {
                Some((deadline, _)) => self.clock.sleep(deadline.saturating_sub(self.clock.now_ms())).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            done = work => Ok(done),
            () = until_deadline => Err(self.deadline_ms.map_or(StopCause::Cancelled, |(_, cause)| cause)),
            () = self.cancel.cancelled() => Err(StopCause::Cancelled),
        }
    }

    /// Sleeps a backoff, unless it would end past the limit (then it is not
    /// slept at all) or the call is cancelled.
    pub async fn pause(&self, delay_ms: u64) -> Result<(), StopCause> {
        if let Some((deadline, cause)) = self.deadline_ms
            && self.clock.now_ms().saturating_add(delay_ms) > deadline
        {
            return Err(cause);
        }
        self.within(self.clock.sleep(delay_ms)).await
    }
}
