//! The lab's own tests: the model's accounting, the policies' mechanics, and the
//! component's delays. No test asserts on wall time.

use agent_retry_host::{PolicyComponent, default_wasm_path};
use agent_retry_lab::contention::{self, NoBackoff, Strategy};
use agent_retry_lab::faults::{Clears, FaultMix};
use agent_retry_lab::lab::{self, Answer, Server};

fn component() -> PolicyComponent {
    PolicyComponent::from_file(&default_wasm_path()).expect("the component: run `make wasm` first")
}

fn mix_with(fault: &str) -> FaultMix {
    FaultMix::from_json(&format!(
        r#"{{"description": "one run", "step-budget": 30, "replan-limit": 2, "attempt-ms": 200, "model-turn-ms": 1000,
            "workflow": [{{"tool": "issue_refund", "effect": "write", "takes-key": true, "status-check": "list_refunds", "is-refund": true}}],
            "runs": [{{"id": "CASE-1", "fault": {fault}}}]}}"#
    ))
    .unwrap()
}

const APPLIED_TIMEOUT: &str = r#"{"tool": "issue_refund", "failure": {"kind": "timeout", "applied": true}, "clears": {"after-attempts": 1}}"#;

#[test]
fn an_unkeyed_resend_after_an_applied_timeout_is_a_doubled_refund() {
    let mix = mix_with(APPLIED_TIMEOUT);
    let mut server = Server::new(&mix, &mix.runs[0]);
    assert!(matches!(server.attempt(0, 0, None, 0), Answer::Failure(_)));
    assert_eq!(server.doubled_refunds(), 0);
    assert!(matches!(server.attempt(0, 0, None, 1000), Answer::Success));
    assert_eq!(server.doubled_refunds(), 1);
    assert_eq!(server.calls, 2);
}

#[test]
fn a_keyed_resend_is_applied_once() {
    let mix = mix_with(APPLIED_TIMEOUT);
    let mut server = Server::new(&mix, &mix.runs[0]);
    server.attempt(0, 0, Some("k"), 0);
    assert!(matches!(server.attempt(0, 0, Some("k"), 1000), Answer::Success));
    assert_eq!(server.doubled_refunds(), 0);
    assert!(server.status_check(0), "the first attempt applied it");
}

#[test]
fn repeating_a_request_bound_failure_is_wasted_and_a_changed_request_is_not() {
    let mix = mix_with(r#"{"tool": "issue_refund", "failure": {"kind": "http", "status": 400, "body": "paise"}, "clears": {"after-fixes": 1}}"#);
    let mut server = Server::new(&mix, &mix.runs[0]);
    server.attempt(0, 0, None, 0);
    server.attempt(0, 0, None, 0);
    server.attempt(0, 0, None, 0);
    assert_eq!(server.wasted, 2);
    assert!(matches!(server.attempt(0, 1, None, 0), Answer::Success));
    assert_eq!(server.wasted, 2);
    assert!(Clears::NeedsPerson.request_bound() && !Clears::Never.request_bound());
}

#[test]
fn a_retry_before_the_servers_hint_is_early_and_fails_again() {
    let mix =
        mix_with(r#"{"tool": "issue_refund", "failure": {"kind": "http", "status": 429, "headers": {"Retry-After": "5"}}, "clears": {"after-ms": 5000}}"#);
    let mut server = Server::new(&mix, &mix.runs[0]);
    server.attempt(0, 0, Some("k"), 0);
    assert!(matches!(server.attempt(0, 0, Some("k"), 1000), Answer::Failure(_)));
    assert_eq!(server.early, 1);
    assert!(matches!(server.attempt(0, 0, Some("k"), 7000), Answer::Success));
    assert_eq!(server.early, 1);
}

#[test]
fn a_fault_on_a_tool_outside_the_workflow_is_refused() {
    let text = r#"{"description": "", "step-budget": 30, "replan-limit": 2, "attempt-ms": 1, "model-turn-ms": 1,
        "workflow": [{"tool": "lookup_order", "effect": "read"}],
        "runs": [{"id": "R", "fault": {"tool": "issue_refund", "failure": {"kind": "reset"}, "clears": "never"}}]}"#;
    let error = FaultMix::from_json(text).unwrap_err().to_string();
    assert!(error.contains("issue_refund"), "{error}");
}

#[test]
fn retry_everything_doubles_the_three_applied_timeouts_and_keys_remove_them() {
    let component = component();
    let mix = FaultMix::builtin();
    let policies = lab::policies();
    let (no_keys, _) = lab::run_policy(&component, &mix, &policies[0], 42).unwrap();
    let (keys, _) = lab::run_policy(&component, &mix, &policies[1], 42).unwrap();
    assert_eq!((no_keys.doubled, keys.doubled), (3, 0));
    assert_eq!(no_keys.wasted, keys.wasted, "keys change nothing else");
    assert_eq!(no_keys.looped, 6);
}

#[test]
fn the_component_classifies_without_duplicates_or_wasted_calls() {
    let component = component();
    let mix = FaultMix::builtin();
    let policy = lab::policies().into_iter().find(|p| p.name.starts_with("classify + run retry budget")).unwrap();
    let (totals, runs) = lab::run_policy(&component, &mix, &policy, 42).unwrap();
    assert_eq!((totals.completed, totals.doubled, totals.wasted, totals.looped, totals.escalated), (34, 0, 0, 0, 6));
    assert_eq!(totals.early, 0, "no retry before a server's hint");
    assert_eq!(totals.escalations.get("permission-denied"), Some(&5));
    let outage = runs.iter().find(|r| r.id == "CASE-5031").unwrap();
    assert_eq!(outage.calls, 6, "two reads, then the refund's 4 attempts");
    // Seeded: the same row twice gives the same totals.
    assert_eq!(lab::run_policy(&component, &mix, &policy, 42).unwrap().0, totals);
}

#[test]
fn full_jitter_delays_from_the_component_are_uniform_on_zero_to_cap() {
    let component = component();
    let delays = contention::component_delays(&component, 9, 10_000, 3).unwrap();
    assert!(delays.iter().all(|d| *d <= 2000), "a delay above the cap");
    let mut bins = [0u32; 10];
    for d in &delays {
        bins[(*d as usize / 200).min(9)] += 1;
    }
    for (i, n) in bins.iter().enumerate() {
        assert!((850..=1150).contains(n), "bin {i} has {n} of 10,000 draws (expected about 1,000): {bins:?}");
    }
    // The first retry's ceiling is base-delay-ms (10 ms): Brooker's expo(1).
    assert!(contention::component_delays(&component, 1, 1000, 3).unwrap().iter().all(|d| *d <= 10));
}

#[test]
fn the_simulation_counts_writes_and_is_seeded() {
    let one = contention::simulate(1, &mut NoBackoff, 0, 9).unwrap();
    assert_eq!((one.calls, one.completed), (1, 1));
    assert!(one.time_ms > 0.0);
    let a = contention::simulate(20, &mut NoBackoff, 0, 9).unwrap();
    let b = contention::simulate(20, &mut NoBackoff, 0, 9).unwrap();
    assert_eq!((a.calls, a.completed, a.time_ms), (b.calls, b.completed, b.time_ms));
    assert!(a.calls > 20, "20 clients at once conflict");
    assert_eq!(a.completed, 20);
}

#[test]
fn an_account_budget_of_one_token_spaces_the_first_attempts() {
    let component = component();
    let extra = r#""account-budget": {"account-id": "sim-{sim}", "capacity": 1, "refill-interval-ms": 20, "max-wait-ms": 10000}"#;
    let mut strategy = contention::ComponentStrategy::new(&component, extra, agent_retry_host::EntropySource::seeded(1)).unwrap();
    strategy.begin(3, 0).unwrap();
    let waits: Vec<Option<f64>> = (0..3).map(|c| strategy.admit(c, 0.0).unwrap()).collect();
    assert_eq!(waits, vec![Some(0.0), Some(20.0), Some(40.0)]);
    strategy.end().unwrap();
}
