//! End to end: the wrapper, the policy component and a real MCP server (the demo
//! server, rmcp) on 127.0.0.1 over streamable HTTP, and over stdio. Every test
//! checks the server's side too: the calls it received and its ledger.

use std::sync::Arc;
use std::time::Duration;

use agent_retry_demo_server::faults::{Fault, rule, rule_when};
use agent_retry_demo_server::{DemoState, FaultScript, HttpServer, serve_http};
use agent_retry_host::component::types::EscalationReason;
use agent_retry_host::mcp::{CallError, Clock, ListedCheck, Metrics, RetryingToolCaller, RetryingToolCallerOptions, ToolAnswer, connect_http, connect_stdio};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};
use serde_json::{Map, Value, json};

/// Policy time runs 20× faster than real time: a 2 s wait takes 100 ms.
const SCALE: f64 = 0.05;

const CONFIG: &str = r#"{"base-delay-ms": 200, "max-delay-ms": 2000}"#;

fn args(value: Value) -> Map<String, Value> {
    value.as_object().cloned().unwrap()
}

fn component() -> PolicyComponent {
    PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first")
}

struct Setup {
    server: HttpServer,
    caller: RetryingToolCaller,
    _client: agent_retry_host::mcp::connect::McpClient,
}

async fn setup(faults: Vec<agent_retry_demo_server::FaultRule>, config: &str, options: RetryingToolCallerOptions) -> Setup {
    let state = DemoState::new(FaultScript::new(faults), None);
    let server = serve_http("127.0.0.1:0".parse().unwrap(), state).await.unwrap();
    let client = connect_http(&server.url).await.unwrap();
    let instance = component().instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(1))).unwrap();
    let caller = RetryingToolCaller::start(client.peer().clone(), instance, config, "run-e2e", options, Arc::new(Metrics::new())).await.unwrap();
    Setup { server, caller, _client: client }
}

fn options() -> RetryingToolCallerOptions {
    RetryingToolCallerOptions { attempt_timeout_ms: Some(4000), key_argument: "idempotency_key".into(), clock: Clock::scaled(SCALE), ..Default::default() }
}

fn http(status: u16, headers: &[(&str, &str)]) -> Fault {
    Fault::Http { status, headers: headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(), body: format!("scripted {status}") }
}

/// Checks a refund the way an operator would: list the order's refunds.
fn refund_status_check() -> agent_retry_host::mcp::StatusCheck {
    ListedCheck::new("list_refunds", &["order_id"], "refunds", &["order_id", "amount_paise"]).into_check()
}

#[tokio::test]
async fn a_503_then_success_is_retried_and_the_model_sees_only_the_success() {
    let mut s = setup(vec![rule("lookup_order", Some(1), http(503, &[]))], CONFIG, options()).await;
    let answer = s.caller.call("lookup_order", args(json!({"order_id": "ORD-1"}))).await.unwrap();
    match answer {
        ToolAnswer::Done { result: Some(result), note: None } => assert_eq!(result.structured_content.unwrap()["customer"], "Hansini"),
        other => panic!("{other:?}"),
    }
    let calls = s.server.state.calls_to("lookup_order");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].fault.as_deref(), Some("http-503"));
    assert_eq!(s.caller.report().unwrap().retries, 1);
    s.server.stop().await;
}

#[tokio::test]
async fn a_429_with_retry_after_2_waits_at_least_2_seconds_of_policy_time() {
    let mut s = setup(vec![rule("lookup_order", Some(1), http(429, &[("Retry-After", "2")]))], CONFIG, options()).await;
    s.caller.call("lookup_order", args(json!({"order_id": "ORD-1"}))).await.unwrap();
    let calls = s.server.state.calls_to("lookup_order");
    assert_eq!(calls.len(), 2);
    // 2 s of policy time at scale 0.05 is 100 ms of real time between the calls.
    let gap_ms = calls[1].at_ms - calls[0].at_ms;
    assert!(gap_ms >= 100, "the retry came {gap_ms} ms after the 429");
    let report = s.caller.report().unwrap();
    assert!(report.waited_ms >= 2000, "waited {} ms", report.waited_ms);
    s.server.stop().await;
}

#[tokio::test]
async fn a_400_is_not_retried_and_the_model_gets_its_message() {
    let fault = Fault::Http { status: 400, headers: vec![], body: "amount must be an integer number of paise".into() };
    let mut s = setup(vec![rule("issue_refund", None, fault)], CONFIG, options()).await;
    let answer = s.caller.call("issue_refund", args(json!({"order_id": "ORD-1", "amount_paise": "2450"}))).await.unwrap();
    match answer {
        ToolAnswer::Replan(message) => assert!(message.contains("amount must be an integer number of paise"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.server.state.calls_to("issue_refund").len(), 1);
    s.server.stop().await;
}

#[tokio::test]
async fn a_403_escalates_at_once() {
    let mut s = setup(vec![], CONFIG, options()).await;
    // Refunds above 5000 rupees need a person: the server answers isError with status 403.
    let error = s.caller.call("issue_refund", args(json!({"order_id": "ORD-9", "amount_paise": 900_000}))).await.unwrap_err();
    match error {
        CallError::Escalated(e) => {
            assert_eq!(e.reason, EscalationReason::PermissionDenied);
            assert!(e.note.contains("need a person"), "{}", e.note);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.server.state.calls_to("issue_refund").len(), 1);
    s.server.stop().await;
}

#[tokio::test]
async fn a_timeout_after_an_applied_refund_with_a_key_does_not_double_it() {
    let fault = Fault::TimeoutAfterApply { delay_ms: 1500 };
    let mut opts = options();
    opts.attempt_timeout_ms = Some(4000); // 200 ms real: the held-back answer never arrives in time
    let mut s = setup(vec![rule("issue_refund", Some(1), fault)], CONFIG, opts).await;
    let answer = s.caller.call("issue_refund", args(json!({"order_id": "ORD-2", "amount_paise": 245_000}))).await.unwrap();
    assert!(matches!(answer, ToolAnswer::Done { result: Some(_), .. }), "{answer:?}");
    let calls = s.server.state.calls_to("issue_refund");
    assert_eq!(calls.len(), 2, "one timeout, one retry");
    assert_eq!(calls[0].arguments["idempotency_key"], calls[1].arguments["idempotency_key"], "the retry reuses the key");
    {
        let ledger = agent_retry_demo_server::tools::lock(&s.server.state.ledger);
        assert_eq!(ledger.refunds.len(), 1);
        assert_eq!(ledger.duplicate_refunds(), 0);
    }
    s.server.stop().await;
}

#[tokio::test]
async fn a_timeout_after_an_applied_refund_without_a_key_checks_status_and_does_not_double_it() {
    let fault = Fault::TimeoutAfterApply { delay_ms: 1500 };
    let mut opts = options();
    opts.key_argument = "request_id".into(); // no tool has it: calls go out without a key
    let s = setup(vec![rule("issue_refund", Some(1), fault)], CONFIG, opts).await;
    let mut caller = s.caller.with_status_check("issue_refund", refund_status_check());
    let answer = caller.call("issue_refund", args(json!({"order_id": "ORD-3", "amount_paise": 245_000}))).await.unwrap();
    match answer {
        ToolAnswer::Done { result: None, note: Some(note) } => assert!(note.contains("already applied"), "{note}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.server.state.calls_to("issue_refund").len(), 1, "never resent");
    assert_eq!(s.server.state.calls_to("list_refunds").len(), 1, "one status check");
    assert_eq!(agent_retry_demo_server::tools::lock(&s.server.state.ledger).refunds.len(), 1);
    assert_eq!(caller.report().unwrap().status_checks, 1);
    s.server.stop().await;
}

#[tokio::test]
async fn a_delete_of_a_missing_asset_succeeds() {
    // MCP annotations cannot say "delete" (destructive + idempotent fits an overwrite
    // too), so the configuration's tool table does.
    let config = r#"{"base-delay-ms": 200, "tools": {"delete_asset": {"effect": "delete"}}}"#;
    let mut s = setup(vec![], config, options()).await;
    let answer = s.caller.call("delete_asset", args(json!({"asset_id": "logo-7"}))).await.unwrap();
    match answer {
        ToolAnswer::Done { note: Some(note), .. } => assert!(note.contains("already deleted"), "{note}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.server.state.calls_to("delete_asset").len(), 1);
    s.server.stop().await;
}

#[tokio::test]
async fn a_persistent_503_ends_in_an_escalation_naming_the_run_budget_and_the_refunds_made() {
    let config = r#"{"base-delay-ms": 100, "max-delay-ms": 400, "max-attempts-per-call": 10, "max-retries-per-run": 3}"#;
    let mut s = setup(vec![rule("lookup_order", None, http(503, &[]))], config, options()).await;
    let refund = s.caller.call("issue_refund", args(json!({"order_id": "ORD-4", "amount_paise": 1000}))).await.unwrap();
    assert!(matches!(refund, ToolAnswer::Done { .. }));
    let key = s.server.state.calls_to("issue_refund")[0].arguments["idempotency_key"].as_str().unwrap().to_string();
    let error = s.caller.call("lookup_order", args(json!({"order_id": "ORD-4"}))).await.unwrap_err();
    let CallError::Escalated(e) = error else { panic!("{error:?}") };
    assert_eq!(e.reason, EscalationReason::RunRetriesSpent);
    assert!(e.note.contains("retry budget"), "{}", e.note);
    // Call 1 is the wrapper's tools/list.
    assert!(e.note.contains(&format!("issue_refund (call 2, key {key}): applied")), "{}", e.note);
    assert_eq!(s.server.state.calls_to("lookup_order").len(), 4, "1 attempt + 3 retries, then stop");
    s.server.stop().await;
}

#[tokio::test]
async fn a_dropped_connection_on_a_read_is_retried() {
    let mut s = setup(vec![rule("lookup_order", Some(1), Fault::Drop)], CONFIG, options()).await;
    let answer = s.caller.call("lookup_order", args(json!({"order_id": "ORD-5"}))).await.unwrap();
    assert!(matches!(answer, ToolAnswer::Done { result: Some(_), .. }), "{answer:?}");
    assert_eq!(s.server.state.calls_to("lookup_order").len(), 2);
    s.server.stop().await;
}

#[tokio::test]
async fn rate_limit_headers_reach_the_policy() {
    let fault = http(429, &[("RateLimit", "\"demo\";r=0;t=3")]);
    let mut s = setup(vec![rule("lookup_order", Some(1), fault)], CONFIG, options()).await;
    s.caller.call("lookup_order", args(json!({"order_id": "ORD-6"}))).await.unwrap();
    assert!(s.caller.report().unwrap().waited_ms >= 3000);
    s.server.stop().await;
}

#[tokio::test]
async fn json_rpc_errors_and_empty_results_go_to_the_model() {
    let faults = vec![
        rule_when("lookup_order", json!({"order_id": "A"}), None, Fault::JsonRpcError { code: -32602, message: "order_id: bad format".into(), data: None }),
        rule_when("lookup_order", json!({"order_id": "B"}), None, Fault::Empty),
    ];
    let mut s = setup(faults, CONFIG, options()).await;
    let a = s.caller.call("lookup_order", args(json!({"order_id": "A"}))).await.unwrap();
    assert!(matches!(&a, ToolAnswer::Replan(m) if m.contains("JSON-RPC error -32602: order_id: bad format")), "{a:?}");
    let b = s.caller.call("lookup_order", args(json!({"order_id": "B"}))).await.unwrap();
    assert!(matches!(&b, ToolAnswer::Replan(m) if m.contains("empty")), "{b:?}");
    assert_eq!(s.server.state.calls_to("lookup_order").len(), 2);
    s.server.stop().await;
}

#[tokio::test]
async fn over_stdio_a_transient_tool_error_is_retried_and_a_bad_argument_replanned() {
    let dir = std::env::temp_dir().join(format!("agent-retry-stdio-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("faults.json");
    std::fs::write(
        &script,
        r#"[{"tool": "lookup_order", "call": 1, "fault": {"kind": "http", "status": 503, "body": "upstream down"}},
            {"tool": "issue_refund", "fault": {"kind": "json-rpc-error", "code": -32602, "message": "amount_paise must be an integer"}}]"#,
    )
    .unwrap();
    let program = env!("CARGO_BIN_EXE_demo-serve");
    let client = connect_stdio(program, &["--stdio".into(), "--faults".into(), script.display().to_string()]).await.unwrap();
    let instance = component().instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(2))).unwrap();
    let mut caller = RetryingToolCaller::start(client.peer().clone(), instance, CONFIG, "run-stdio", options(), Arc::new(Metrics::new())).await.unwrap();
    let order = caller.call("lookup_order", args(json!({"order_id": "ORD-7"}))).await.unwrap();
    assert!(matches!(order, ToolAnswer::Done { result: Some(_), .. }), "{order:?}");
    let refund = caller.call("issue_refund", args(json!({"order_id": "ORD-7", "amount_paise": 10}))).await.unwrap();
    assert!(matches!(&refund, ToolAnswer::Replan(m) if m.contains("amount_paise must be an integer")), "{refund:?}");
    let report = caller.report().unwrap();
    // tools/list is the run's first call (the wrapper lists the tools through the policy).
    assert_eq!((report.attempts, report.retries, report.replans), (4, 1, 1));
    let _ = client.cancel().await;
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// Most MCP servers relay an upstream failure as `isError` text, with no status
/// or headers: the policy reads the text, and decides as if the status had come.
fn relayed(text: &str) -> Fault {
    Fault::ToolText { text: text.into(), structured: None }
}

#[tokio::test]
async fn a_relayed_503_is_retried_and_the_model_sees_only_the_success() {
    let fault = relayed("Error executing tool lookup_order: upstream returned HTTP 503 Service Unavailable");
    let mut s = setup(vec![rule("lookup_order", Some(1), fault)], CONFIG, options()).await;
    let answer = s.caller.call("lookup_order", args(json!({"order_id": "ORD-1"}))).await.unwrap();
    assert!(matches!(answer, ToolAnswer::Done { result: Some(_), .. }), "{answer:?}");
    assert_eq!(s.server.state.calls_to("lookup_order").len(), 2);
    let report = s.caller.report().unwrap();
    assert_eq!((report.retries, report.replans), (1, 0));
    s.server.stop().await;
}

#[tokio::test]
async fn a_relayed_rate_limit_waits_what_its_text_asks() {
    let fault = relayed("Rate limit reached for gpt-4o on tokens per min (TPM). Please try again in 1s.");
    let mut s = setup(vec![rule("lookup_order", Some(1), fault)], CONFIG, options()).await;
    s.caller.call("lookup_order", args(json!({"order_id": "ORD-1"}))).await.unwrap();
    let calls = s.server.state.calls_to("lookup_order");
    assert_eq!(calls.len(), 2);
    // 1 s of policy time at scale 0.05 is 50 ms of real time.
    let gap_ms = calls[1].at_ms - calls[0].at_ms;
    assert!(gap_ms >= 50, "the retry came {gap_ms} ms after the relayed 429");
    assert!(s.caller.report().unwrap().waited_ms >= 1000);
    s.server.stop().await;
}

#[tokio::test]
async fn a_relayed_permission_error_escalates_without_reaching_the_model() {
    let fault = relayed("403 Forbidden: Resource not accessible by integration");
    let mut s = setup(vec![rule("lookup_order", None, fault)], CONFIG, options()).await;
    let error = s.caller.call("lookup_order", args(json!({"order_id": "ORD-1"}))).await.unwrap_err();
    assert!(matches!(&error, CallError::Escalated(e) if e.reason == EscalationReason::PermissionDenied), "{error:?}");
    assert_eq!(s.server.state.calls_to("lookup_order").len(), 1);
    s.server.stop().await;
}

#[tokio::test]
async fn a_provider_error_type_in_structured_content_is_retried() {
    let structured = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    let fault = Fault::ToolText { text: "Overloaded".into(), structured: Some(structured) };
    let mut s = setup(vec![rule("lookup_order", Some(1), fault)], CONFIG, options()).await;
    let answer = s.caller.call("lookup_order", args(json!({"order_id": "ORD-1"}))).await.unwrap();
    assert!(matches!(answer, ToolAnswer::Done { .. }), "{answer:?}");
    assert_eq!(s.server.state.calls_to("lookup_order").len(), 2);
    s.server.stop().await;
}

#[tokio::test]
async fn relayed_text_that_is_not_a_failure_class_goes_to_the_model() {
    let fault = relayed("Cannot reserve 429 items: only 200 left in stock");
    let mut s = setup(vec![rule("issue_refund", None, fault)], CONFIG, options()).await;
    let answer = s.caller.call("issue_refund", args(json!({"order_id": "ORD-1", "amount_paise": 10}))).await.unwrap();
    assert!(matches!(&answer, ToolAnswer::Replan(m) if m.contains("429 items")), "{answer:?}");
    assert_eq!(s.server.state.calls_to("issue_refund").len(), 1);
    assert_eq!(agent_retry_demo_server::tools::lock(&s.server.state.ledger).refunds.len(), 0);
    s.server.stop().await;
}
