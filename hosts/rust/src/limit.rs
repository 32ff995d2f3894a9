//! How long a call may still wait: the nearer of its own and its run's time
//! limits, and the caller's cancellation. Every wait of a wrapper (an
//! attempt, a backoff, a status check, a reconnection) goes through it.

use std::future::Future;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::mcp::answer::StopCause;
use crate::time_source::TimeSource;

pub(crate) struct Limit<'a> {
    /// Policy time (ms since the epoch) the nearer limit passes, and which it is.
    pub deadline_ms: Option<(u64, StopCause)>,
    pub cancel: &'a CancellationToken,
    pub clock: Arc<dyn TimeSource>,
}

impl Limit<'_> {
    /// Waits for `work` unless the limit passes or the call is cancelled first.
    pub async fn within<T>(&self, work: impl Future<Output = T>) -> Result<T, StopCause> {
        let until_deadline = async {
            match self.deadline_ms {
                Some((deadline, _)) => self.clock.timer(deadline.saturating_sub(self.clock.now_ms())).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // Work that is done wins over a deadline that passed at the same time.
            biased;
            done = work => Ok(done),
            () = until_deadline => Err(self.deadline_ms.map_or(StopCause::Cancelled, |(_, cause)| cause)),
            () = self.cancel.cancelled() => Err(StopCause::Cancelled),
        }
    }
}
