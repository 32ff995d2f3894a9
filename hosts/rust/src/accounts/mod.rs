//! The account budget the component imports: an atomic take-or-wait on a token
//! bucket per account, shared by every worker of the account ("Retry and Backoff for Agent-Driven MCP Calls", step 4).
//!
//! Two backends with the same semantics (GCRA, below), proven by the same tests:
//! - [`EmbeddedAccounts`]: one process, in memory (the default);
//! - [`RedisAccounts`]: workers in many processes or on many machines, the
//!   take-or-wait atomic on the server (a Lua script), with
//!   [`SharedAccounts`] falling back to a local share when Redis is unreachable.

mod embedded;
pub(crate) mod redis;
mod shared;

pub use embedded::EmbeddedAccounts;
pub use redis::{AccountsError, REDIS_TIMEOUT, RedisAccounts};
pub use shared::SharedAccounts;

/// The bucket's shape, as the policy's configuration gives it on every call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    pub capacity: u32,
    pub refill_interval_ms: u64,
}

/// The answer to `reserve`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reservation {
    /// Taken; wait this many ms before using them.
    Granted(u64),
    /// Not taken; room would come in this many ms.
    Refused(u64),
}

/// A shared account budget. `reserve` and `refund` must be atomic across every caller.
pub trait AccountBudgetBackend: Send + Sync {
    fn reserve(&self, account_id: &str, tokens: u32, bucket: Bucket, max_wait_ms: u64, now_ms: u64) -> Reservation;
    /// Gives tokens back, never past a full bucket.
    fn refund(&self, account_id: &str, tokens: u32, bucket: Bucket, now_ms: u64);
}

/// GCRA (the generic cell rate algorithm): a token bucket kept as one number per
/// account, the theoretical arrival time (TAT) of the next token. A bucket of
/// capacity C refilling one token every T ms admits C at once, then one per T.
/// Taking 0 tokens is granted at once and changes nothing.
pub fn gcra(stored_tat_ms: u64, tokens: u32, bucket: Bucket, max_wait_ms: u64, now_ms: u64) -> (Reservation, u64) {
    if tokens == 0 {
        return (Reservation::Granted(0), stored_tat_ms);
    }
    let emission = bucket.refill_interval_ms;
    let tolerance = u64::from(bucket.capacity).saturating_mul(emission);
    let tat = stored_tat_ms.max(now_ms);
    let new_tat = tat.saturating_add(u64::from(tokens).saturating_mul(emission));
    let allowed_at = new_tat.saturating_sub(tolerance);
    let wait_ms = allowed_at.saturating_sub(now_ms);
    if wait_ms > max_wait_ms { (Reservation::Refused(wait_ms), stored_tat_ms) } else { (Reservation::Granted(wait_ms), new_tat) }
}

/// Gives `tokens` back: the TAT moves back by `tokens` intervals, but not before
/// `now` (a TAT at or before now is a full bucket). Returns the TAT to store.
pub fn gcra_refund(stored_tat_ms: u64, tokens: u32, bucket: Bucket, now_ms: u64) -> u64 {
    let back = u64::from(tokens).saturating_mul(bucket.refill_interval_ms);
    stored_tat_ms.saturating_sub(back).max(now_ms.min(stored_tat_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_one_per_interval() {
        let accounts = EmbeddedAccounts::on_host_clock();
        let bucket = Bucket { capacity: 3, refill_interval_ms: 100 };
        let take = |now| accounts.reserve("a", 1, bucket, 250, now);
        assert_eq!([take(0), take(0), take(0)], [Reservation::Granted(0); 3]);
        assert_eq!(take(0), Reservation::Granted(100));
        assert_eq!(take(0), Reservation::Granted(200));
        assert_eq!(take(0), Reservation::Refused(300)); // over max-wait: nothing taken
        assert_eq!(take(0), Reservation::Refused(300));
        assert_eq!(take(300), Reservation::Granted(0));
        // Another account has its own bucket.
        assert_eq!(accounts.reserve("b", 3, bucket, 0, 0), Reservation::Granted(0));
    }

    #[test]
    fn refunds_never_overfill() {
        let bucket = Bucket { capacity: 3, refill_interval_ms: 100 };
        let accounts = EmbeddedAccounts::on_host_clock();
        for _ in 0..3 {
            accounts.reserve("q", 1, bucket, 0, 0);
        }
        assert_eq!(accounts.reserve("q", 1, bucket, 0, 0), Reservation::Refused(100));
        accounts.refund("q", 1, bucket, 0);
        assert_eq!(accounts.reserve("q", 1, bucket, 0, 0), Reservation::Granted(0));
        accounts.refund("q", 50, bucket, 0); // far more than was taken: just full
        for _ in 0..3 {
            assert_eq!(accounts.reserve("q", 1, bucket, 0, 0), Reservation::Granted(0));
        }
        assert_eq!(accounts.reserve("q", 1, bucket, 0, 0), Reservation::Refused(100));
        assert_eq!(gcra_refund(1000, 2, bucket, 900), 900);
        assert_eq!(gcra_refund(1000, 1, bucket, 0), 900);
        assert_eq!(gcra_refund(500, 1, bucket, 900), 500);
    }

    fn process_now_ms() -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
    }

    /// One worker passing µs, a clock in the past or 0 does not move the bucket
    /// for the others (it once made every worker escalate "room returns at 57883-07-15").
    #[test]
    fn a_bad_clock_cannot_poison_the_account_for_every_worker() {
        let bucket = Bucket { capacity: 2, refill_interval_ms: 1_000 };
        for bad in [process_now_ms() * 1_000, process_now_ms() - 400 * 24 * 3_600_000, 0] {
            let accounts = EmbeddedAccounts::new();
            assert_eq!(accounts.reserve("acct", 1, bucket, 0, bad), Reservation::Granted(0), "a bad clock is served in the process's time");
            // The good workers see one token taken, as they should, and nothing else.
            // (Each reads the clock afresh: the bad call was served at the time
            // it ran, and an earlier reading is 1 ms short when the ms turns.)
            assert_eq!(accounts.reserve("acct", 1, bucket, 0, process_now_ms()), Reservation::Granted(0));
            assert!(matches!(accounts.reserve("acct", 1, bucket, 0, process_now_ms()), Reservation::Refused(w) if w <= 1_000), "room within one interval");
            // A refund with a bad clock cannot overfill or empty it either.
            accounts.refund("acct", 1, bucket, bad);
            assert_eq!(accounts.reserve("acct", 1, bucket, 0, process_now_ms()), Reservation::Granted(0));
        }
        // The same µs clock poisons a backend that trusts its callers' clock: why the default does not.
        let trusting = EmbeddedAccounts::on_host_clock();
        trusting.reserve("acct", 2, bucket, 0, process_now_ms() * 1_000);
        assert!(matches!(trusting.reserve("acct", 1, bucket, 0, process_now_ms()), Reservation::Refused(w) if w > 1_000_000_000));
    }

    /// Issue 24, row 7: one worker's clock an hour ahead once refused every worker
    /// of the process for the hour ("resets in 3,600,050 ms") and overran the
    /// limit itself; an hour behind, or every caller's clock stepped back an
    /// hour, must not lock or widen the account either.
    #[test]
    fn a_clock_an_hour_off_neither_locks_the_account_nor_widens_it() {
        const HOUR_MS: u64 = 3_600_000;
        let bucket = Bucket { capacity: 40, refill_interval_ms: 60_000 };
        let take_all = |accounts: &EmbeddedAccounts, skewed: &dyn Fn() -> u64| {
            (0..100).filter(|_| matches!(accounts.reserve("acct", 1, bucket, 0, skewed()), Reservation::Granted(_))).count()
        };
        for (what, skewed) in [("an hour ahead", &(|| process_now_ms() + HOUR_MS) as &dyn Fn() -> u64), ("an hour behind", &|| process_now_ms() - HOUR_MS)] {
            // The skewed worker first: it gets the burst, no more.
            let accounts = EmbeddedAccounts::new();
            assert_eq!(take_all(&accounts, skewed), 40, "{what}: the skewed worker takes the burst");
            // A worker on the right clock then finds the bucket empty for one interval, not an hour.
            match accounts.reserve("acct", 1, bucket, 0, process_now_ms()) {
                Reservation::Refused(wait) => assert!(wait <= bucket.refill_interval_ms, "{what}: room in {wait} ms, not an hour"),
                granted => panic!("{what}: the burst was spent, yet {granted:?}"),
            }
            // The right clock first: the skewed worker then gets nothing more (40 in the window, not 80).
            let accounts = EmbeddedAccounts::new();
            assert_eq!(take_all(&accounts, &process_now_ms), 40);
            assert_eq!(take_all(&accounts, skewed), 0, "{what}: the skewed worker finds the bucket as the others left it");
        }
        // The process's wall clock stepped back an hour halfway: every caller's
        // time jumps back, the account goes on as it was.
        let accounts = EmbeddedAccounts::new();
        let first = (0..20).filter(|_| matches!(accounts.reserve("acct", 1, bucket, 0, process_now_ms()), Reservation::Granted(_))).count();
        let stepped_back = || process_now_ms() - HOUR_MS;
        assert_eq!((first, take_all(&accounts, &stepped_back)), (20, 20), "the burst is 40 across the step");
        assert!(matches!(accounts.reserve("acct", 1, bucket, 0, stepped_back()), Reservation::Refused(wait) if wait <= bucket.refill_interval_ms));
    }

    #[test]
    fn saturates() {
        let bucket = Bucket { capacity: u32::MAX, refill_interval_ms: u64::MAX };
        let (r, _) = gcra(u64::MAX, u32::MAX, bucket, u64::MAX, u64::MAX);
        assert_eq!(r, Reservation::Granted(0));
    }
}
