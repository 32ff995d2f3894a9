//! Properties of budgets and backoff over arbitrary outcome sequences (issue 11),
//! with proptest. The fuzz targets (`fuzz/`) check the same promises on
//! libFuzzer's inputs; these state them as properties a reader can check:
//!
//! - a full-jitter delay is within `[0, min(cap, base × 2^(n-1))]`, or exactly the
//!   hint when the hint is larger, and the draw is monotone in the entropy;
//! - any outcome sequence keeps a run within its budgets (attempts per call,
//!   retries, replans, steps), its counters only grow, and every retry's delay is
//!   that full-jitter draw;
//! - a persistent transient failure escalates at exactly the attempt the
//!   narrowest budget allows, naming that budget; so do repeated replans;
//! - the account budget is never asked for more than a bucket holds, and never
//!   refunded more than was taken.
//!
//! Overflow checks are on in test builds: a counter that wrapped would panic.

use std::collections::BTreeMap;
use std::sync::Arc;

use agent_retry_policy::account::{AccountBudget, Bucket, NoAccountBudget, Reservation};
use agent_retry_policy::backoff::{ceiling_ms, full_jitter, next_delay_ms};
use agent_retry_policy::config::{Config, ONE_DAY_MS};
use agent_retry_policy::readable;
use agent_retry_policy::run::{At, Run};
use agent_retry_policy::types::{Action, Admission, CallRequest, Decision, EscalationReason, Failure, FailureKind, Outcome, StatusCheckResult, TransportError};
use proptest::prelude::*;

/// `min(cap, base × 2^(n-1))` in u128: the doc's formula, independently.
fn ceiling_u128(base: u64, cap: u64, retry: u32) -> u64 {
    let doublings = retry.max(1) - 1;
    let uncapped = if doublings >= 64 { u128::MAX } else { u128::from(base) << doublings };
    uncapped.min(u128::from(cap)) as u64
}

fn config(base: u64, cap: u64, attempts: u32, retries: u32, replans: u32, steps: u32, max_hint: u64) -> Arc<Config> {
    let text = format!(
        r#"{{"base-delay-ms": {base}, "max-delay-ms": {cap}, "max-attempts-per-call": {attempts}, "max-retries-per-run": {retries},
            "max-replans-per-run": {replans}, "max-steps-per-run": {steps}, "max-hint-ms": {max_hint}, "default-effect": "write"}}"#
    );
    Arc::new(Config::from_json(&text).expect("a valid configuration"))
}

fn failure(kind: FailureKind, headers: Vec<(String, String)>) -> Outcome {
    Outcome::Failure(Failure { kind, headers, body: String::new(), structured_content: None, session_id_sent: false, delivery: Default::default() })
}

/// Outcomes a tool call may have, with the hints servers send.
fn any_outcome() -> impl Strategy<Value = Outcome> {
    let status = prop_oneof![Just(429u16), Just(503), Just(500), Just(502), Just(504), Just(400), Just(404), Just(403), Just(501), 0u16..700];
    let hint = prop_oneof![
        Just(Vec::new()),
        (0u64..200_000).prop_map(|ms| vec![("retry-after-ms".to_string(), ms.to_string())]),
        (0u64..100).prop_map(|s| vec![("Retry-After".to_string(), s.to_string())]),
        Just(vec![("x-should-retry".to_string(), "false".to_string())]),
        Just(vec![("retry-after".to_string(), "garbage".to_string())]),
    ];
    let transport = prop_oneof![
        Just(TransportError::Timeout),
        Just(TransportError::ConnectionReset),
        Just(TransportError::ConnectionRefused),
        Just(TransportError::StreamClosed),
        Just(TransportError::Other),
    ];
    prop_oneof![
        4 => (status, hint).prop_map(|(s, h)| failure(FailureKind::HttpStatus(s), h)),
        2 => transport.prop_map(|t| failure(FailureKind::Transport(t), Vec::new())),
        1 => prop_oneof![Just(-32603), Just(-32602), Just(-32700), any::<i32>()].prop_map(|c| failure(FailureKind::ProtocolError(c), Vec::new())),
        1 => Just(Outcome::Success),
        1 => Just(Outcome::EmptyResult(String::new())),
        1 => prop_oneof![Just(StatusCheckResult::Found), Just(StatusCheckResult::Absent), Just(StatusCheckResult::Unknown)].prop_map(Outcome::StatusCheck),
    ]
}

/// A step of a run: begin a call (with or without a key), or report an outcome
/// of the latest call's current attempt.
#[derive(Clone, Debug)]
enum Step {
    Begin { keyed: bool },
    Record { outcome: Outcome, entropy: u64, dt_ms: u64 },
}

fn any_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => any::<bool>().prop_map(|keyed| Step::Begin { keyed }),
        4 => (any_outcome(), any::<u64>(), 0u64..100_000).prop_map(|(outcome, entropy, dt_ms)| Step::Record { outcome, entropy, dt_ms }),
    ]
}

/// An account budget that counts tokens (no refill): it checks that the core
/// never asks for more than a bucket holds and never refunds more than it took.
#[derive(Default)]
struct Counted {
    left: BTreeMap<String, u32>,
    taken: BTreeMap<String, u64>,
    refunded: BTreeMap<String, u64>,
}

impl agent_retry_policy::shared::SharedState for Counted {}

impl AccountBudget for Counted {
    fn reserve(&mut self, id: &str, tokens: u32, bucket: Bucket, _max_wait_ms: u64, _now_ms: u64) -> Reservation {
        assert!(tokens <= bucket.capacity, "asked {tokens} tokens of a bucket of {}", bucket.capacity);
        let left = self.left.entry(id.to_string()).or_insert(bucket.capacity);
        if *left >= tokens {
            *left -= tokens;
            *self.taken.entry(id.to_string()).or_default() += u64::from(tokens);
            Reservation::Granted(0)
        } else {
            Reservation::Refused(1000)
        }
    }

    fn refund(&mut self, id: &str, tokens: u32, bucket: Bucket, _now_ms: u64) {
        let left = self.left.entry(id.to_string()).or_insert(bucket.capacity);
        *left = left.saturating_add(tokens).min(bucket.capacity);
        *self.refunded.entry(id.to_string()).or_default() += u64::from(tokens);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn full_jitter_stays_within_the_ceiling_unless_a_hint_is_longer(
        base in 1u64..=ONE_DAY_MS, extra in 0u64..=ONE_DAY_MS, retry in any::<u32>(), hint in proptest::option::of(any::<u64>()), entropy in any::<u64>()
    ) {
        let cap = (base + extra).min(ONE_DAY_MS);
        let ceiling = ceiling_u128(base, cap, retry);
        prop_assert_eq!(ceiling_ms(base, cap, retry), ceiling);
        let delay = next_delay_ms(base, cap, retry, hint, entropy);
        let jitter = full_jitter(ceiling, entropy);
        prop_assert!(jitter <= ceiling);
        prop_assert_eq!(jitter as u128, (u128::from(entropy) * (u128::from(ceiling) + 1)) >> 64);
        prop_assert_eq!(delay, jitter.max(hint.unwrap_or(0)));
        prop_assert!(delay <= ceiling || Some(delay) == hint, "delay {} above ceiling {} without a hint", delay, ceiling);
        prop_assert!(delay <= cap.max(hint.unwrap_or(0)));
        prop_assert_eq!(full_jitter(ceiling, u64::MAX), ceiling);
        prop_assert_eq!(full_jitter(ceiling, 0), 0);
    }

    #[test]
    fn draws_are_monotone_in_entropy_and_ceilings_in_the_retry(
        base in 1u64..=ONE_DAY_MS, cap_extra in 0u64..=ONE_DAY_MS, retry in 0u32..200, a in any::<u64>(), b in any::<u64>()
    ) {
        let cap = (base + cap_extra).min(ONE_DAY_MS);
        let (lo, hi) = (a.min(b), a.max(b));
        prop_assert!(next_delay_ms(base, cap, retry, None, lo) <= next_delay_ms(base, cap, retry, None, hi));
        prop_assert!(ceiling_ms(base, cap, retry) <= ceiling_ms(base, cap, retry + 1));
    }

    #[test]
    fn any_outcome_sequence_stays_within_the_budgets(
        base in 1u64..5000, cap_extra in 0u64..60_000, attempts in 1u32..8, retries in 0u32..12, replans in 0u32..4, steps in 1u32..40,
        max_hint in prop_oneof![Just(0u64), Just(10_000), Just(60_000), Just(ONE_DAY_MS)],
        sequence in proptest::collection::vec(any_step(), 0..80),
    ) {
        let c = config(base, base + cap_extra, attempts, retries, replans, steps, max_hint);
        let mut run = Run::new(Arc::clone(&c), "prop");
        let mut budget = NoAccountBudget;
        let mut now = 1_764_460_800_000u64;
        let mut latest: Option<(u32, u32)> = None; // (call id, its current attempt)
        let mut previous = run.report();
        let mut ended = false;
        let mut waited: u64 = 0;
        for step in sequence {
            match step {
                Step::Begin { keyed } => {
                    let request = CallRequest { server: None, tool: "t".into(), idempotency_key: keyed.then(|| "k".to_string()), hints: None };
                    match readable::begin_call(&mut run, &request, now, &mut budget) {
                        Ok(Admission::Send(ticket)) => latest = Some((ticket.call_id, 1)),
                        Ok(Admission::Escalate(e)) => {
                            prop_assert_eq!(e.reason, EscalationReason::RunStepsSpent);
                            ended = true;
                        }
                        Ok(Admission::Replan(_)) => prop_assert!(false, "no breaker is configured"),
                        Err(_) => prop_assert!(ended, "a call refused while the run is open"),
                    }
                }
                Step::Record { outcome, entropy, dt_ms } => {
                    now += dt_ms;
                    let Some((call_id, attempt)) = latest else { continue };
                    match readable::record_outcome(&mut run, call_id, attempt, &outcome, At { now_ms: now, time_left_ms: None, entropy }, &mut budget) {
                        Ok(Decision { action: Action::Retry(plan), attempt: n, hint_ms, .. }) => {
                            let ceiling = ceiling_u128(c.base_delay_ms, c.max_delay_ms, n);
                            let jitter = full_jitter(ceiling, entropy);
                            prop_assert_eq!(plan.delay_ms, jitter.max(hint_ms.unwrap_or(0)));
                            prop_assert!(plan.delay_ms <= c.max_delay_ms || Some(plan.delay_ms) == hint_ms);
                            prop_assert!(hint_ms.unwrap_or(0) <= c.max_hint_ms, "a retry honours a hint above max-hint-ms");
                            prop_assert!(plan.attempt <= c.max_attempts_per_call);
                            waited += plan.delay_ms;
                            latest = Some((call_id, plan.attempt));
                        }
                        Ok(Decision { action: Action::Escalate(_), .. }) => ended = true,
                        Ok(Decision { action: Action::CheckStatus, .. }) => {}
                        Ok(_) => latest = None,
                        Err(_) => {}
                    }
                }
            }
            let r = run.report();
            prop_assert!(r.attempts + r.status_checks <= c.max_steps_per_run, "{} steps of {}", r.attempts + r.status_checks, c.max_steps_per_run);
            prop_assert!(r.retries <= c.max_retries_per_run && r.replans <= c.max_replans_per_run);
            prop_assert!(r.attempts >= previous.attempts && r.retries >= previous.retries && r.replans >= previous.replans);
            prop_assert!(r.status_checks >= previous.status_checks && r.waited_ms >= previous.waited_ms);
            prop_assert_eq!(r.waited_ms, waited);
            prop_assert_eq!(r.escalation.is_some(), ended);
            previous = r;
        }
    }

    #[test]
    fn a_persistent_transient_failure_escalates_at_the_narrowest_budget(
        attempts in 1u32..10, retries in 0u32..10, steps in 1u32..12, status in prop_oneof![Just(503u16), Just(500), Just(502), Just(504), Just(429)],
        entropy in any::<u64>(), with_key in any::<bool>(),
    ) {
        let c = config(100, 1000, attempts, retries, 2, steps, 60_000);
        let mut run = Run::new(Arc::clone(&c), "prop");
        let request = CallRequest { server: None, tool: "t".into(), idempotency_key: with_key.then(|| "k".to_string()), hints: None };
        let Ok(Admission::Send(ticket)) = readable::begin_call(&mut run, &request, 0, &mut NoAccountBudget) else { panic!("not admitted") };
        // A 429 is never ambiguous; a 5xx on a write without a key asks for a status check first.
        let checks = status != 429 && !with_key;
        let mut attempt = 1;
        let reason = loop {
            let decision = readable::record_outcome(&mut run, ticket.call_id, attempt, &failure(FailureKind::HttpStatus(status), Vec::new()), At { now_ms: 0, time_left_ms: None, entropy }, &mut NoAccountBudget).unwrap();
            let decision = if checks && matches!(decision.action, Action::CheckStatus) {
                readable::record_outcome(&mut run, ticket.call_id, attempt, &Outcome::StatusCheck(StatusCheckResult::Absent), At { now_ms: 0, time_left_ms: None, entropy }, &mut NoAccountBudget).unwrap()
            } else {
                decision
            };
            match decision.action {
                Action::Retry(plan) => attempt = plan.attempt,
                Action::Escalate(e) => break e.reason,
                other => panic!("a persistent {status} gave {other:?}"),
            }
            prop_assert!(attempt <= 100, "no escalation after 100 attempts");
        };
        // Attempt k fails: the call's budget if k ≥ A, else the run's retries if
        // k - 1 ≥ R, else its steps if the steps taken (k attempts, and k status
        // checks when each attempt needs one) reach S.
        let steps_at = |k: u32| if checks { 2 * k } else { k };
        let k = (1..).find(|&k| k >= attempts || k > retries || steps_at(k) >= steps).unwrap();
        // With status checks, the check after failure k is refused first when the
        // 2k - 1 steps taken already reach S.
        let expected = if checks && 2 * k > steps {
            EscalationReason::RunStepsSpent
        } else if k >= attempts {
            EscalationReason::CallAttemptsSpent
        } else if k > retries {
            EscalationReason::RunRetriesSpent
        } else {
            EscalationReason::RunStepsSpent
        };
        prop_assert_eq!((attempt, reason), (k, expected));
        let r = run.report();
        prop_assert!(r.attempts + r.status_checks <= c.max_steps_per_run);
    }

    #[test]
    fn replans_escalate_after_the_replan_budget(replans in 0u32..6, calls in 1usize..12) {
        let c = config(100, 1000, 4, 10, replans, 1000, 60_000);
        let mut run = Run::new(Arc::clone(&c), "prop");
        for i in 0..calls {
            let request = CallRequest { server: None, tool: "t".into(), idempotency_key: None, hints: None };
            let Ok(Admission::Send(ticket)) = readable::begin_call(&mut run, &request, 0, &mut NoAccountBudget) else {
                prop_assert!(i as u32 > replans, "a call refused before the replans were spent");
                break;
            };
            let d = readable::record_outcome(&mut run, ticket.call_id, 1, &failure(FailureKind::HttpStatus(400), Vec::new()), At { now_ms: 0, time_left_ms: None, entropy: 0 }, &mut NoAccountBudget).unwrap();
            match d.action {
                Action::Replan(_) => prop_assert!((i as u32) < replans),
                Action::Escalate(e) => {
                    prop_assert_eq!((i as u32, e.reason), (replans, EscalationReason::ReplansSpent));
                    break;
                }
                other => panic!("a 400 gave {other:?}"),
            }
        }
        prop_assert!(run.report().replans <= replans);
    }

    #[test]
    fn the_account_budget_is_never_overdrawn_nor_overfilled(
        capacity in 1u32..30, quota in proptest::option::of(1u32..60), costs in (0u32..4, 0u32..4, 0u32..4),
        sequence in proptest::collection::vec(any_step(), 0..60),
    ) {
        let (attempt_cost, retry_cost, throttled_cost) = (costs.0.min(capacity), costs.1.min(capacity), costs.2.min(capacity));
        let quota = quota.map(|q| format!(r#", "retry-quota": {{"capacity": {q}, "retry-cost": {}, "throttled-retry-cost": {}}}"#, 14.min(q), 5.min(q))).unwrap_or_default();
        let text = format!(
            r#"{{"max-steps-per-run": 1000, "max-retries-per-run": 1000, "max-attempts-per-call": 20, "account-budget": {{"account-id": "a", "capacity": {capacity},
                "refill-interval-ms": 1000, "attempt-cost": {attempt_cost}, "retry-cost": {retry_cost}, "throttled-retry-cost": {throttled_cost}{quota}}}}}"#
        );
        let c = Arc::new(Config::from_json(&text).unwrap());
        let mut run = Run::new(Arc::clone(&c), "prop");
        let mut budget = Counted::default();
        let mut latest: Option<(u32, u32)> = None;
        for step in sequence {
            match step {
                Step::Begin { keyed } => {
                    let request = CallRequest { server: None, tool: "t".into(), idempotency_key: keyed.then(|| "k".to_string()), hints: None };
                    if let Ok(Admission::Send(ticket)) = readable::begin_call(&mut run, &request, 0, &mut budget) {
                        latest = Some((ticket.call_id, 1));
                    }
                }
                Step::Record { outcome, entropy, .. } => {
                    let Some((call_id, attempt)) = latest else { continue };
                    match readable::record_outcome(&mut run, call_id, attempt, &outcome, At { now_ms: 0, time_left_ms: None, entropy }, &mut budget) {
                        Ok(Decision { action: Action::Retry(plan), .. }) => latest = Some((call_id, plan.attempt)),
                        Ok(Decision { action: Action::CheckStatus, .. }) | Err(_) => {}
                        Ok(_) => latest = None,
                    }
                }
            }
        }
        // The allowance is never refunded; the retry quota gets back at most what
        // retries took plus one success-refund per call.
        prop_assert_eq!(budget.refunded.get("a").copied().unwrap_or(0), 0);
        let calls = u64::from(run.report().calls);
        let quota_taken = budget.taken.get("a/retry-quota").copied().unwrap_or(0);
        prop_assert!(budget.refunded.get("a/retry-quota").copied().unwrap_or(0) <= quota_taken + calls);
    }
}
