//! The run-time guard (issue 24) through the real wrapper: the liar component
//! (`target/hostile/liar.wasm`, `make hostile`: the real policy plus the lies
//! of `"x-liar"` in its configuration) against the demo server. Each lie is
//! something a policy past the update gate could say at run time; the wrapper
//! must stop it from what it already knows: the call ends with the
//! policy-failure escalation naming the invariant, nothing more is sent, and
//! the rest of the run escalates at once. Counts come from the server's call
//! log, the lines from the process's subscriber (capture.rs; at INFO the
//! wrapper reads every decision's words).

use crate::capture::{Captured, capture};

use std::path::PathBuf;
use std::sync::Arc;

use agent_retry_demo_server::faults::{Fault, rule, rule_first};
use agent_retry_demo_server::{DemoState, Era, FaultScript, HttpOptions, HttpServer, serve_http, serve_http_options};
use agent_retry_host::component::types::{Escalation, EscalationReason};
use agent_retry_host::limits::MAX_LIFTED_TEXT_BYTES;
use agent_retry_host::live::{Integrity, LivePolicy, PolicySource};
use agent_retry_host::mcp::{CallError, McpConnection, Metrics, RetryingToolCaller, RetryingToolCallerOptions};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};
use serde_json::{Map, Value, json};

fn liar_path() -> PathBuf {
    default_wasm_path().parent().and_then(|p| p.parent()).expect("target/").join("hostile/liar.wasm")
}

fn liar() -> PolicyComponent {
    PolicyComponent::from_file(&liar_path()).unwrap_or_else(|e| panic!("{}: {e} (run `make hostile`)", liar_path().display()))
}

fn args(value: Value) -> Map<String, Value> {
    value.as_object().cloned().unwrap()
}

fn refund() -> Map<String, Value> {
    args(json!({"order_id": "ORD-1", "amount_paise": 1000}))
}

async fn server(rules: Vec<agent_retry_demo_server::FaultRule>) -> HttpServer {
    serve_http("127.0.0.1:0".parse().unwrap(), DemoState::new(FaultScript::new(rules), None)).await.unwrap()
}

/// The liar's lies in a configuration with short waits for the real policy.
fn config(lies: Value) -> String {
    json!({"base-delay-ms": 10, "max-delay-ms": 50, "x-liar": lies}).to_string()
}

async fn caller(component: &PolicyComponent, server: &HttpServer, config: &str, options: RetryingToolCallerOptions) -> RetryingToolCaller {
    let instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(5))).unwrap();
    let connection = McpConnection::http(&server.url);
    RetryingToolCaller::connect(connection, instance, config, "run-liar", options, Arc::new(Metrics::new())).await.expect("connects")
}

fn escalation(error: CallError) -> Escalation {
    match error {
        CallError::Escalated(escalation) => escalation,
        other => panic!("expected the policy-failure escalation, got {other:?}"),
    }
}

/// The call ended with the policy-failure escalation naming `invariant`.
fn assert_refused(escalation: &Escalation, invariant: &str) {
    assert_eq!(escalation.reason, EscalationReason::UnclassifiedFailure, "{escalation:?}");
    let cause = format!("(boundary-violation: the policy broke the contract at the boundary: invariant {invariant}: ");
    assert!(escalation.note.starts_with("the retry policy failed ") && escalation.note.contains(&cause), "{}", escalation.note);
}

/// The last attempt line that names an invariant.
fn invariant_line(captured: &Captured) -> Option<Map<String, Value>> {
    captured.attempts().into_iter().rfind(|line| line.contains_key("invariant"))
}

#[tokio::test]
async fn a_403_retried_by_the_liar_is_sent_once_and_the_rest_of_the_run_sends_nothing() {
    let capture = capture();
    let captured = &capture.captured;
    let server = server(vec![rule("issue_refund", None, Fault::Http { status: 403, headers: vec![], body: "needs approval".into() })]).await;
    let mut caller = caller(&liar(), &server, &config(json!({"retry": true, "tools": ["issue_refund"]})), RetryingToolCallerOptions::default()).await;

    let first = escalation(caller.call("issue_refund", refund()).await.unwrap_err());
    assert_refused(&first, "client-error-repeated");
    assert_eq!(server.state.calls_to("issue_refund").len(), 1, "the 403 is not sent again");
    let line = invariant_line(captured).expect("the escalate line names the invariant");
    assert_eq!(line["invariant"], "client-error-repeated");
    assert_eq!(line["action"], "escalate");

    let later = escalation(caller.call("lookup_order", args(json!({"order_id": "ORD-1"}))).await.unwrap_err());
    assert_eq!(later.note, first.note, "the rest of the run escalates with the same note");
    assert!(server.state.calls_to("lookup_order").is_empty(), "nothing is sent after a violation");
    server.stop().await;
}

#[tokio::test]
async fn a_403_retried_on_a_new_session_is_sent_once() {
    // A session id was sent, but a 403 refuses the caller, not its session: a new one changes nothing.
    let capture = capture();
    let captured = &capture.captured;
    let rules = vec![rule("issue_refund", None, Fault::Http { status: 403, headers: vec![], body: "refunds above 5000 rupees need a person".into() })];
    let state = DemoState::new(FaultScript::new(rules), None);
    let options = HttpOptions { sessions: true, era: Era::Handshake, tls: None };
    let server = serve_http_options("127.0.0.1:0".parse().unwrap(), state, options).await.unwrap();
    let lies = json!({"retry": true, "reconnect": true, "tools": ["issue_refund"]});
    let mut caller = caller(&liar(), &server, &config(lies), RetryingToolCallerOptions::default()).await;

    let error = escalation(caller.call("issue_refund", refund()).await.unwrap_err());
    assert_refused(&error, "client-error-repeated");
    assert_eq!(server.state.calls_to("issue_refund").len(), 1, "the 403 is not sent again");
    let lines = captured.attempts();
    assert_eq!(lines.iter().filter(|l| l["tool"] == "initialize").count(), 1, "no new session either");
    // The violation's line names the call (after initialize and tools/list) and the attempt the verdict answered.
    let line = invariant_line(captured).expect("the escalate line names the invariant");
    assert_eq!(
        (&line["tool"], &line["call"], &line["attempt"], &line["invariant"]),
        (&json!("issue_refund"), &json!(3), &json!(1), &json!("client-error-repeated"))
    );
    server.stop().await;
}

#[tokio::test]
async fn an_unkeyed_write_that_timed_out_is_not_resent_on_the_liars_word() {
    let _capture = capture(); // its lines must not reach the test holding the turn
    let server = server(vec![rule("record_note", Some(1), Fault::TimeoutAfterApply { delay_ms: 3_000 })]).await;
    let options = RetryingToolCallerOptions { attempt_timeout_ms: Some(300), ..Default::default() };
    let mut caller = caller(&liar(), &server, &config(json!({"retry": true})), options).await;

    let error = escalation(caller.call("record_note", args(json!({"order_id": "ORD-1", "text": "call back"}))).await.unwrap_err());
    assert_refused(&error, "unknown-write-resent");
    assert_eq!(server.state.calls_to("record_note").len(), 1, "the note is written once");
    server.stop().await;
}

#[tokio::test]
async fn a_retry_after_a_month_or_an_hour_is_refused_without_waiting() {
    let _capture = capture(); // its lines must not reach the test holding the turn
    for delay_ms in [2_592_000_000_u64, 3_600_000] {
        let server = server(vec![rule("lookup_order", None, Fault::Http { status: 503, headers: vec![], body: String::new() })]).await;
        let lies = json!({"retry": true, "delay-ms": delay_ms, "tools": ["lookup_order"]});
        // No run deadline: it alone would stop the wait (as a timeout, not this escalation).
        let options = RetryingToolCallerOptions { run_timeout_ms: None, ..Default::default() };
        let mut caller = caller(&liar(), &server, &config(lies), options).await;
        let error = escalation(caller.call("lookup_order", args(json!({"order_id": "ORD-1"}))).await.unwrap_err());
        assert_refused(&error, "delay-over-cap");
        assert!(error.note.contains(&format!("after {delay_ms} ms; the cap is 50 ms")), "{}", error.note);
        assert_eq!(server.state.calls_to("lookup_order").len(), 1, "one send, no wait");
        server.stop().await;
    }
}

#[tokio::test]
async fn words_that_disagree_with_the_verdict_are_refused_whatever_they_say() {
    let capture = capture();
    let captured = &capture.captured;
    // The real policy escalates a 403; the liar's last-decision says retry.
    let server = server(vec![rule("issue_refund", None, Fault::Http { status: 403, headers: vec![], body: String::new() })]).await;
    let mut caller =
        caller(&liar(), &server, &config(json!({"decision-action": "retry", "tools": ["issue_refund"]})), RetryingToolCallerOptions::default()).await;
    let error = escalation(caller.call("issue_refund", refund()).await.unwrap_err());
    assert_refused(&error, "verdict-disagrees");
    assert_eq!(server.state.calls_to("issue_refund").len(), 1, "nothing resent");
    assert_eq!(invariant_line(captured).expect("logged")["invariant"], "verdict-disagrees");
    server.stop().await;
}

#[tokio::test]
async fn a_retry_plan_naming_another_key_is_refused() {
    let _capture = capture(); // its lines must not reach the test holding the turn
    let server = server(vec![rule_first("issue_refund", 1, Fault::Http { status: 503, headers: vec![], body: String::new() })]).await;
    let mut caller =
        caller(&liar(), &server, &config(json!({"decision-key": "forged", "tools": ["issue_refund"]})), RetryingToolCallerOptions::default()).await;
    let error = escalation(caller.call("issue_refund", refund()).await.unwrap_err());
    assert_refused(&error, "key-changed");
    let sent = server.state.calls_to("issue_refund");
    assert_eq!(sent.len(), 1, "the retry is not sent");
    assert_ne!(sent[0].arguments["idempotency_key"], "forged");
    server.stop().await;
}

#[tokio::test]
async fn a_20_mb_note_is_cut_before_it_is_logged_or_returned() {
    let capture = capture();
    let captured = &capture.captured;
    let server = server(vec![rule("issue_refund", None, Fault::Http { status: 403, headers: vec![], body: String::new() })]).await;
    // Fuel and memory enough for the liar to pad its words to 20 MB, so that
    // they reach the host (the default sandbox cuts the call off first).
    let roomy = liar().with_fuel_per_call(4_000_000_000).with_max_memory_bytes(1 << 30);
    let mut caller =
        caller(&roomy, &server, &config(json!({"reason-bytes": 20_971_520, "tools": ["issue_refund"]})), RetryingToolCallerOptions::default()).await;
    let error = escalation(caller.call("issue_refund", refund()).await.unwrap_err());
    assert_eq!(
        error.reason,
        EscalationReason::PermissionDenied,
        "the real policy's escalation, its words cut: {}",
        error.note.chars().take(200).collect::<String>()
    );
    let bound = MAX_LIFTED_TEXT_BYTES + " … [cut: 20971520 bytes]".len();
    assert!(error.note.len() <= bound && error.note.contains(" … [cut: "), "the note is {} bytes", error.note.len());
    let line = captured.attempts().into_iter().find(|l| l["tool"] == "issue_refund").expect("the call's line");
    let reason = line["reason"].as_str().unwrap();
    assert!(reason.len() <= bound && reason.contains(" … [cut: "), "the logged reason is {} bytes", reason.len());
    server.stop().await;
}

#[tokio::test]
async fn the_liar_passes_the_update_gate_and_the_wrapper_still_stops_it() {
    let _capture = capture(); // its lines must not reach the test holding the turn
    let dir = std::env::temp_dir().join(format!("agent-retry-guard-liar-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (wasm, config_path) = (dir.join("policy.wasm"), dir.join("policy.json"));
    std::fs::copy(liar_path(), &wasm).unwrap();
    let text = config(json!({"retry": true, "tools": ["issue_refund"]}));
    std::fs::write(&config_path, &text).unwrap();
    let source = PolicySource { wasm, config: config_path, integrity: Integrity::Unchecked, vectors: None, gate_vectors: Vec::new() };
    let live = LivePolicy::open(source).expect("the liar passes gate.json: the gate alone is not enough");
    let loaded = live.current();

    let server = server(vec![rule("issue_refund", None, Fault::Http { status: 403, headers: vec![], body: String::new() })]).await;
    let options = RetryingToolCallerOptions { policy_identity: Some(loaded.identity.to_string()), ..Default::default() };
    let mut caller = caller(&loaded.component, &server, &loaded.config_json, options).await;
    let error = escalation(caller.call("issue_refund", refund()).await.unwrap_err());
    assert_refused(&error, "client-error-repeated");
    assert_eq!(server.state.calls_to("issue_refund").len(), 1);
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
