//! What an attempt costs the shared account, in two verbs: `withdraw` before an
//! attempt is sent (the allowance, and for a retry the retry quota first), and
//! `deposit` when a call succeeds (the retry quota's refill). The buckets live
//! in the host behind [`AccountBudget`]; this module decides the tokens.
//!
//! The retry quota is AWS standard retry mode's ("Retry behavior", AWS SDKs and
//! Tools Reference Guide): retries draw from a second bucket per account, 14
//! tokens after a transient failure and 5 after a throttle; a success refills
//! it with what its last retry took, or 1. When it is empty a retry fails fast.
//! The allowance is never refunded, so the quota cannot push calls past it.
//!
//! The ratio retry budget (`ratio.rs`), if configured, counts every first
//! attempt and is asked before a retry takes anything.

use alloc::string::String;

use crate::account::{AccountBudget, Bucket, Reservation};
use crate::cat::cat;
use crate::config::{AccountBudgetConfig, Config, RetryQuotaConfig};
use crate::ratio;
use crate::types::EscalationReason;

/// What an attempt is about to spend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spend {
    /// A call's first attempt.
    FirstAttempt,
    /// A retry; `throttled` if the failure was a throttle (it costs less).
    Retry { throttled: bool },
}

/// Tokens taken: wait `wait_ms` before sending; `quota_taken` went to the retry quota.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Withdrawn {
    pub wait_ms: u64,
    pub quota_taken: u32,
}

/// Nothing taken: escalate for `reason`; room returns in `resets_in_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused {
    pub reason: EscalationReason,
    pub resets_in_ms: u64,
}

fn allowance(account: &AccountBudgetConfig) -> Bucket {
    Bucket { capacity: account.capacity, refill_interval_ms: account.refill_interval_ms }
}

/// The retry quota's bucket: its id (`<account-id>/retry-quota`), shape and costs.
fn quota(config: &Config) -> Option<(String, Bucket, &RetryQuotaConfig)> {
    let account = config.account_budget.as_ref()?;
    let quota = account.retry_quota.as_ref()?;
    let bucket = Bucket { capacity: quota.capacity, refill_interval_ms: quota.refill_interval_ms };
    Some((cat!(account.account_id, "/retry-quota"), bucket, quota))
}

/// Takes what `spend` costs. A free spend (cost 0, or no account budget) is not
/// held back by the bucket's debt. If the allowance refuses a retry, the quota
/// tokens it took go back: nothing is taken for a retry that is not made.
/// `time_left_ms`, the time to the call's or the run's deadline, caps the wait
/// the allowance may grant: room after the deadline is refused
/// (`deadline-too-near`) and nothing is booked.
pub fn withdraw(config: &Config, spend: Spend, time_left_ms: Option<u64>, now_ms: u64, host: &mut dyn AccountBudget) -> Result<Withdrawn, Refused> {
    let Some(account) = config.account_budget.as_ref() else {
        return Ok(Withdrawn { wait_ms: 0, quota_taken: 0 });
    };
    if let Some(ratio) = &account.retry_ratio {
        // Asked first: a retry past the share is refused before any token is taken.
        // (A retry the allowance then refuses stays counted: the budget errs strict.)
        let retry = matches!(spend, Spend::Retry { .. });
        if let ratio::Verdict::Refused { resets_in_ms } = ratio::take(host, &account.account_id, ratio, retry, now_ms) {
            return Err(Refused { reason: EscalationReason::RetryBudgetExhausted, resets_in_ms });
        }
    }
    let mut quota_taken = 0;
    if let Spend::Retry { throttled } = spend
        && let Some((id, bucket, quota)) = quota(config)
    {
        let tokens = if throttled { quota.throttled_retry_cost } else { quota.retry_cost };
        if tokens > 0 {
            match host.reserve(&id, tokens, bucket, 0, now_ms) {
                Reservation::Granted(_) => quota_taken = tokens,
                Reservation::Refused(wait) => return Err(Refused { reason: EscalationReason::RetryQuotaExhausted, resets_in_ms: wait }),
            }
        }
    }
    let cost = match spend {
        Spend::FirstAttempt => account.attempt_cost,
        Spend::Retry { throttled: true } => account.throttled_retry_cost,
        Spend::Retry { throttled: false } => account.retry_cost,
    };
    if cost == 0 {
        return Ok(Withdrawn { wait_ms: 0, quota_taken });
    }
    let max_wait_ms = time_left_ms.map_or(account.max_wait_ms, |left| left.min(account.max_wait_ms));
    match host.reserve(&account.account_id, cost, allowance(account), max_wait_ms, now_ms) {
        Reservation::Granted(wait_ms) => Ok(Withdrawn { wait_ms, quota_taken }),
        Reservation::Refused(wait) => {
            if let Some((id, bucket, _)) = quota(config).filter(|_| quota_taken > 0) {
                host.refund(&id, quota_taken, bucket, now_ms);
            }
            // Room within max-wait-ms, but not before the deadline.
            let capped = max_wait_ms < account.max_wait_ms && wait <= account.max_wait_ms;
            let reason = if capped { EscalationReason::DeadlineTooNear } else { EscalationReason::AccountBudgetExhausted };
            Err(Refused { reason, resets_in_ms: wait })
        }
    }
}

/// A call succeeded: the retry quota gets back what its last retry took, or
/// `success-refund` if it succeeded at its first attempt.
pub fn deposit(config: &Config, retried: bool, quota_taken: u32, now_ms: u64, host: &mut dyn AccountBudget) {
    if let Some((id, bucket, quota)) = quota(config) {
        let tokens = if retried { quota_taken } else { quota.success_refund };
        if tokens > 0 {
            host.refund(&id, tokens, bucket, now_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::BTreeMap;
    use alloc::format;
    use alloc::string::ToString;

    /// Plain token counts per account, no refill: enough to see what is taken.
    #[derive(Default)]
    struct Counts(BTreeMap<String, u32>);

    impl crate::shared::SharedState for Counts {}

    impl AccountBudget for Counts {
        fn reserve(&mut self, id: &str, tokens: u32, bucket: Bucket, _: u64, _: u64) -> Reservation {
            let left = self.0.entry(id.to_string()).or_insert(bucket.capacity);
            if *left >= tokens {
                *left -= tokens;
                Reservation::Granted(0)
            } else {
                Reservation::Refused(1000)
            }
        }

        fn refund(&mut self, id: &str, tokens: u32, bucket: Bucket, _: u64) {
            let left = self.0.entry(id.to_string()).or_insert(bucket.capacity);
            *left = (*left + tokens).min(bucket.capacity);
        }
    }

    fn config(capacity: u32, quota: Option<u32>) -> Config {
        let quota = quota.map(|q| format!(r#", "retry-quota": {{"capacity": {q}}}"#)).unwrap_or_default();
        let text =
            format!(r#"{{"account-budget": {{"account-id": "a", "capacity": {capacity}, "refill-interval-ms": 1000, "throttled-retry-cost": 0{quota}}}}}"#);
        Config::from_json(&text).unwrap()
    }

    #[test]
    fn no_account_budget_costs_nothing() {
        let mut host = Counts::default();
        assert_eq!(withdraw(&Config::default(), Spend::FirstAttempt, None, 0, &mut host), Ok(Withdrawn { wait_ms: 0, quota_taken: 0 }));
        assert!(host.0.is_empty());
    }

    #[test]
    fn retries_draw_on_the_quota_first_and_a_success_refills_it() {
        let config = config(10, Some(20));
        let mut host = Counts::default();
        let taken = withdraw(&config, Spend::Retry { throttled: false }, None, 0, &mut host).unwrap();
        assert_eq!(taken.quota_taken, 14);
        assert_eq!((host.0["a"], host.0["a/retry-quota"]), (9, 6));
        // The quota has 6 left: the next transient retry fails fast.
        let refused = withdraw(&config, Spend::Retry { throttled: false }, None, 0, &mut host).unwrap_err();
        assert_eq!(refused.reason, EscalationReason::RetryQuotaExhausted);
        deposit(&config, true, taken.quota_taken, 0, &mut host);
        assert_eq!(host.0["a/retry-quota"], 20);
        // A throttled retry costs 5 of the quota and, configured so, nothing of the allowance.
        assert_eq!(withdraw(&config, Spend::Retry { throttled: true }, None, 0, &mut host).unwrap().quota_taken, 5);
        assert_eq!(host.0["a"], 9);
    }

    #[test]
    fn a_refused_allowance_gives_the_quota_tokens_back() {
        let config = config(1, Some(100));
        let mut host = Counts::default();
        withdraw(&config, Spend::FirstAttempt, None, 0, &mut host).unwrap();
        let refused = withdraw(&config, Spend::Retry { throttled: false }, None, 0, &mut host).unwrap_err();
        assert_eq!(refused, Refused { reason: EscalationReason::AccountBudgetExhausted, resets_in_ms: 1000 });
        assert_eq!(host.0["a/retry-quota"], 100);
    }

    #[test]
    fn a_first_attempt_success_refunds_success_refund() {
        let config = config(10, Some(20));
        let mut host = Counts::default();
        withdraw(&config, Spend::Retry { throttled: false }, None, 0, &mut host).unwrap();
        deposit(&config, false, 0, 0, &mut host);
        assert_eq!(host.0["a/retry-quota"], 7);
    }
}
