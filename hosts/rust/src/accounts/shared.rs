//! The account budget for workers on many machines: Redis while it answers, a
//! local share of the allowance while it does not.
//!
//! When Redis fails, each worker falls back to its share of the allowance,
//! capacity ÷ workers and refill ÷ workers (the rule of "Retry and Backoff for Agent-Driven MCP Calls" for workers that
//! cannot share state), logs the switch once, and tries Redis again every
//! `retry_interval`; when Redis answers, it goes back, and first charges the
//! shared bucket with what it took locally meanwhile (before its own next
//! reservation there), so that the calls made on
//! local shares and the calls made on Redis after it returns (possibly empty,
//! after a restart) do not add up past the allowance. Every reservation is
//! answered by exactly one backend, so no call is lost or sent twice; a Redis
//! exchange that failed after the script ran may have taken tokens there as
//! well as locally, which errs on the side of the shared allowance.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{AccountBudgetBackend, Bucket, EmbeddedAccounts, RedisAccounts, Reservation};

enum Mode {
    Redis,
    /// Local share since Redis failed; try Redis again after `retry_at`.
    Local {
        retry_at: Instant,
    },
}

pub struct SharedAccounts {
    redis: RedisAccounts,
    local: EmbeddedAccounts,
    workers: u32,
    retry_interval: Duration,
    mode: Mutex<Mode>,
    fallbacks: AtomicU64,
    recoveries: AtomicU64,
    /// Per account, tokens taken on the local share since the fallback, and the
    /// account's (whole) bucket: charged to Redis when it answers again.
    taken_locally: Mutex<HashMap<String, (u64, Bucket)>>,
}

impl SharedAccounts {
    /// `workers`: how many workers share the account (their local share is 1/workers).
    pub fn new(redis: RedisAccounts, workers: u32) -> Self {
        SharedAccounts {
            redis,
            local: EmbeddedAccounts::new(),
            workers: workers.max(1),
            retry_interval: Duration::from_secs(1),
            mode: Mutex::new(Mode::Redis),
            fallbacks: AtomicU64::new(0),
            recoveries: AtomicU64::new(0),
            taken_locally: Mutex::new(HashMap::new()),
        }
    }

    /// How often to try Redis again while on the local share.
    pub fn with_retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = interval;
        self
    }

    /// Switches to the local share so far.
    pub fn fallbacks(&self) -> u64 {
        self.fallbacks.load(Ordering::Relaxed)
    }

    /// Returns to Redis so far.
    pub fn recoveries(&self) -> u64 {
        self.recoveries.load(Ordering::Relaxed)
    }

    /// This worker's share of the bucket.
    pub fn local_share(&self, bucket: Bucket) -> Bucket {
        Bucket { capacity: (bucket.capacity / self.workers).max(1), refill_interval_ms: bucket.refill_interval_ms.saturating_mul(u64::from(self.workers)) }
    }
}

impl SharedAccounts {
    /// Takes from the shared bucket, whatever the wait, the tokens this worker
    /// took on its local share while Redis was away. `Err` when Redis failed;
    /// what was not charged stays owed for the next try. A charged account keeps
    /// its entry, at 0, until the return to Redis is whole: without it, the next
    /// local reservation would count as the first since the fallback and empty
    /// the share again at every retry.
    fn charge_local_takes(&self) -> Result<u64, String> {
        let mut taken = self.taken_locally.lock().unwrap_or_else(|p| p.into_inner());
        let mut charged = 0;
        for (account_id, entry) in taken.iter_mut() {
            let owed = u32::try_from(entry.0).unwrap_or(u32::MAX);
            if owed > 0 {
                self.redis.try_reserve(account_id, owed, entry.1, u64::MAX)?;
            }
            entry.0 = 0;
            charged += u64::from(owed);
        }
        Ok(charged)
    }
}

impl AccountBudgetBackend for SharedAccounts {
    fn reserve(&self, account_id: &str, tokens: u32, bucket: Bucket, max_wait_ms: u64, now_ms: u64) -> Reservation {
        let (try_redis, recovering) = match *self.mode.lock().unwrap_or_else(|p| p.into_inner()) {
            Mode::Redis => (true, false),
            Mode::Local { retry_at } => (Instant::now() >= retry_at, true),
        };
        // Back on Redis, the local takes are charged first, so that this
        // reservation (and the other workers') sees a bucket that holds them.
        let charged = if try_redis && recovering { self.charge_local_takes() } else { Ok(0) };
        if try_redis {
            match charged.and_then(|charged| self.redis.try_reserve(account_id, tokens, bucket, max_wait_ms).map(|r| (charged, r))) {
                Ok((charged, reservation)) => {
                    if recovering {
                        // Back on Redis: everything taken locally is charged; a
                        // later fallback starts its shares afresh.
                        self.taken_locally.lock().unwrap_or_else(|p| p.into_inner()).clear();
                        *self.mode.lock().unwrap_or_else(|p| p.into_inner()) = Mode::Redis;
                        self.recoveries.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(target: "agent_retry", redis = self.redis.url(), charged,
                                       "account budget: Redis answers again; back to the shared bucket, charged with the tokens taken locally meanwhile");
                    }
                    return reservation;
                }
                Err(reason) => {
                    let mut mode = self.mode.lock().unwrap_or_else(|p| p.into_inner());
                    if let Mode::Redis = *mode {
                        self.fallbacks.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(target: "agent_retry", redis = self.redis.url(), %reason, workers = self.workers,
                                       "account budget: Redis unavailable; using this worker's local share until it answers");
                    }
                    *mode = Mode::Local { retry_at: Instant::now() + self.retry_interval };
                }
            }
        }
        let share = self.local_share(bucket);
        let mut taken = self.taken_locally.lock().unwrap_or_else(|p| p.into_inner());
        if !taken.contains_key(account_id) {
            // The first local reservation of this account since the fallback. The
            // share starts empty, not full: the shared bucket was being drawn on
            // until now (a full share on every worker added a burst of capacity).
            // And it starts behind the shared schedule as last seen: the calls
            // Redis granted before it failed, to any worker, are still to come
            // (without this, a restart let 55 calls into a second that allows 48).
            let behind = self.redis.last_seen_backlog_ms(account_id).div_ceil(share.refill_interval_ms.max(1));
            let owed = u32::try_from(behind).unwrap_or(u32::MAX).max(share.capacity);
            self.local.reserve(account_id, owed, share, u64::MAX, now_ms);
        }
        let reservation = self.local.reserve(account_id, tokens, share, max_wait_ms, now_ms);
        let entry = taken.entry(account_id.to_string()).or_insert((0, bucket));
        if let Reservation::Granted(_) = reservation {
            *entry = (entry.0.saturating_add(u64::from(tokens)), bucket);
        }
        reservation
    }

    /// A refund goes where reservations go now: to Redis, or to the local share.
    fn refund(&self, account_id: &str, tokens: u32, bucket: Bucket, now_ms: u64) {
        let on_redis = matches!(*self.mode.lock().unwrap_or_else(|p| p.into_inner()), Mode::Redis);
        if on_redis && self.redis.try_refund(account_id, tokens, bucket).is_ok() {
            return;
        }
        self.local.refund(account_id, tokens, self.local_share(bucket), now_ms);
    }
}
