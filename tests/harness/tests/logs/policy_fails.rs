//! The MCP wrapper when the policy itself fails (a trap, out of fuel or memory,
//! a broken contract, an unusable instance): the safe fallback, as the Python
//! (`test_when_the_policy_fails_the_mcp_wrapper_does_not_retry_and_escalates_saying_so`)
//! and Node ("when the policy fails, the MCP wrapper…") wrappers take it: the
//! call is not retried, one `escalate` attempt line names the policy and says
//! why, and the escalation's note says the retry policy failed. The Rust
//! account budget backend cannot fail (its trait is infallible; Redis falls
//! back to local buckets), so the fault here is the sandbox's: a fuel tank that
//! holds connecting, listing and admitting a call but not reading a long tool
//! error.

use crate::capture::capture;

use std::sync::Arc;

use agent_retry_demo_server::faults::{Fault, rule};
use agent_retry_demo_server::{DemoState, FaultScript, serve_http};
use agent_retry_host::component::types::{EscalationReason, FailureKind, Observation, ToolHints};
use agent_retry_host::mcp::{CallError, Metrics, RetryingToolCaller, RetryingToolCallerOptions, connect_http};
use agent_retry_host::{Admission, Outcome};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};
use serde_json::{Value, json};

const CONFIG: &str = r#"{"base-delay-ms": 50, "max-delay-ms": 200}"#;

fn services() -> HostServices {
    HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(3))
}

/// A tool error no rule reads quickly: 8 KB of words the policy scans.
fn long_tool_error() -> String {
    "upstream said something unusual about the order ".repeat(170)
}

/// Fuel that holds everything the wrapper asks before the failure (loading,
/// starting, `tools/list`, admitting the call) but not `record-failure` of the
/// long tool error: measured on this component, so that it stays true when the
/// policy changes.
fn fuel_that_runs_out_on_the_long_error(component: &PolicyComponent) -> u64 {
    let mut instance = component.instantiate(services()).unwrap();
    let policy = instance.load_policy(CONFIG).unwrap().unwrap();
    let run = instance.start_run(&policy, "calibrate").unwrap().unwrap();
    let mut cheap = instance.fuel_used_by_last_call();
    let read = ToolHints { read_only: Some(true), destructive: Some(false), idempotent: Some(true) };
    let ask = |instance: &mut agent_retry_host::PolicyInstance, outcome: &Outcome| {
        let Admission::Send(ticket) = instance.begin(&run, None, "lookup_order", None, Some(read), 1).unwrap().unwrap() else { panic!("admitted") };
        let admitted = instance.fuel_used_by_last_call();
        instance.record(&run, ticket.call_id, 1, outcome, None, 1, None).unwrap().unwrap();
        let recorded = instance.fuel_used_by_last_call();
        // The wrapper reads the decision's words too.
        instance.last_decision(&run, ticket.call_id).unwrap();
        (admitted, recorded.max(instance.fuel_used_by_last_call()))
    };
    let (admitted, succeeded) = ask(&mut instance, &Outcome::Success);
    cheap = cheap.max(admitted).max(succeeded);
    let failure = Outcome::Failure(Observation::new(FailureKind::ToolError(None), &[], long_tool_error()));
    let (admitted, read_the_error) = ask(&mut instance, &failure);
    cheap = cheap.max(admitted);
    let fuel = cheap * 4;
    println!("fuel: at most {cheap} before the failure, {read_the_error} to read it; the tank: {fuel}");
    assert!(read_the_error > fuel * 2, "reading the long error ({read_the_error}) must cost well above the tank ({fuel})");
    fuel
}

#[tokio::test]
async fn when_the_policy_fails_the_mcp_wrapper_does_not_retry_and_escalates_saying_so() {
    let capture = capture();
    let captured = &capture.captured;

    let component = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    let fuel = fuel_that_runs_out_on_the_long_error(&component);
    let starved = PolicyComponent::from_file(&default_wasm_path()).unwrap().with_fuel_per_call(fuel);
    let error_text = long_tool_error();
    let fault = Fault::ToolText { text: error_text.clone(), structured: None };
    let server = serve_http("127.0.0.1:0".parse().unwrap(), DemoState::new(FaultScript::new(vec![rule("lookup_order", None, fault)]), None)).await.unwrap();
    let client = connect_http(&server.url).await.unwrap();
    let metrics = Arc::new(Metrics::new());
    let options = RetryingToolCallerOptions { policy_identity: Some("generation 7 (test)".into()), ..Default::default() };
    let instance = starved.instantiate(services()).unwrap();
    let mut caller = RetryingToolCaller::start(client.peer().clone(), instance, CONFIG, "run-fails", options, Arc::clone(&metrics)).await.unwrap();
    let before = captured.attempts();
    assert!(!before.is_empty(), "the tools/list pseudo-call was logged");

    let order = json!({"order_id": "ORD-1"}).as_object().cloned().unwrap();
    let error = caller.call("lookup_order", order.clone()).await.unwrap_err();
    let CallError::Escalated(escalation) = &error else { panic!("the safe fallback is an escalation, got {error:?}") };
    assert_eq!(escalation.reason, EscalationReason::UnclassifiedFailure);
    assert!(
        escalation.note.starts_with("the retry policy failed (out-of-fuel: the policy ran out of fuel"),
        "the note says the policy failed, and how: {}",
        escalation.note
    );
    assert!(escalation.note.contains("; not retried. Last outcome of lookup_order: tool error."), "{}", escalation.note);
    assert!(escalation.note.contains("check before sending again"), "{}", escalation.note);
    assert_eq!(escalation.last_error.as_deref(), Some("tool error"));
    assert_eq!(server.state.calls_to("lookup_order").len(), 1, "not retried");

    // One line for the fallback, with the fields of every attempt line.
    let after = captured.attempts();
    assert_eq!(after.len(), before.len() + 1, "one line for the call: {after:?}");
    let line = after.last().unwrap();
    let text = |name: &str| line.get(name).and_then(Value::as_str).unwrap_or_default().to_string();
    assert_eq!(text("action"), "escalate");
    assert_eq!(text("escalation"), "unclassified-failure");
    assert_eq!(text("policy"), "generation 7 (test)", "the line names the policy");
    assert_eq!(text("run"), "run-fails");
    assert_eq!(text("tool"), "lookup_order");
    assert_eq!(text("outcome"), "tool error");
    assert_eq!(text("reason"), escalation.note);
    assert_eq!(line.get("step").and_then(Value::as_u64), Some(1));
    // The attempt whose verdict failed (as in Python and Node), counted as the run report counts it.
    assert_eq!(line.get("attempt").and_then(Value::as_u64), Some(1));
    for name in ["event", "run", "policy", "tool", "attempt", "outcome", "action", "reason"] {
        assert!(before[0].contains_key(name) && line.contains_key(name), "both lines have {name}: {before:?} / {line:?}");
    }
    assert_eq!(metrics.snapshot().escalations_by_reason.get("unclassified-failure"), Some(&1));

    // The broken instance refuses the next call the same way; nothing is sent.
    let again = caller.call("lookup_order", order.clone()).await.unwrap_err();
    let CallError::Escalated(again) = again else { panic!("{again:?}") };
    assert!(again.note.starts_with("the retry policy failed (instance-unusable:"), "{}", again.note);
    assert!(again.note.contains("Last outcome of lookup_order: not sent."), "{}", again.note);
    assert_eq!(server.state.calls_to("lookup_order").len(), 1, "nothing sent on a broken instance");
    assert_eq!(captured.attempts().last().and_then(|l| l.get("outcome").cloned()), Some(json!("not sent")));

    // A fresh instance (the default tank) serves the next run: it reads the error and decides.
    let fresh = component.instantiate(services()).unwrap();
    let mut next = RetryingToolCaller::start(client.peer().clone(), fresh, CONFIG, "run-next", RetryingToolCallerOptions::default(), Arc::new(Metrics::new()))
        .await
        .unwrap();
    match next.call("lookup_order", order).await {
        Err(CallError::Escalated(e)) => assert!(!e.note.contains("the retry policy failed"), "{}", e.note),
        Err(other) => panic!("{other:?}"),
        Ok(_) => {}
    }
    assert!(server.state.calls_to("lookup_order").len() >= 2, "the fresh instance let the call through");
    server.stop().await;
}
