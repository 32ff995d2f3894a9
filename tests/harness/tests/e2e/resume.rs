//! An escalation a person resumes (contract 0.9.0), end to end with the demo
//! server and its ledger: the snapshot the wrapper takes, each answer through
//! a new caller on a new connection, and a tampered snapshot refused.

use std::sync::Arc;

use agent_retry_demo_server::faults::{Fault, rule};
use agent_retry_demo_server::{DemoState, FaultScript, HttpServer, serve_http};
use agent_retry_host::component::types::{EscalationReason, ResumeAnswer, SnapshotErrorKind};
use agent_retry_host::events::{Event, RetryHooks};
use agent_retry_host::mcp::{CallError, Clock, McpConnection, Metrics, RetryingToolCaller, RetryingToolCallerOptions, ToolAnswer};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};
use serde_json::{Map, Value, json};

/// One attempt a call: the first timeout escalates (`call-attempts-spent`).
const CONFIG: &str = r#"{"max-attempts-per-call": 1, "tools": {"issue_refund": {"effect": "write"}}}"#;

fn args(value: Value) -> Map<String, Value> {
    value.as_object().cloned().unwrap()
}

/// Every `agent_retry.resume` line: (answer, action).
#[derive(Default)]
struct Resumes(std::sync::Mutex<Vec<(String, String)>>);

impl RetryHooks for Resumes {
    fn on_event(&self, event: &Event) {
        if let Event::Resume(e) = event {
            self.0.lock().unwrap().push((e.answer.to_string(), e.action.to_string()));
        }
    }
}

async fn caller(server: &HttpServer, hooks: Option<Arc<Resumes>>) -> RetryingToolCaller {
    let component = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    let instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(7))).unwrap();
    let mut options =
        RetryingToolCallerOptions { attempt_timeout_ms: Some(4000), key_argument: "idempotency_key".into(), clock: Clock::scaled(0.05), ..Default::default() };
    if let Some(hooks) = hooks {
        options = options.hooks(ResumesRef(hooks));
    }
    RetryingToolCaller::connect(McpConnection::http(&server.url), instance, CONFIG, "run-resume", options, Arc::new(Metrics::new())).await.unwrap()
}

struct ResumesRef(Arc<Resumes>);

impl RetryHooks for ResumesRef {
    fn on_event(&self, event: &Event) {
        self.0.on_event(event);
    }
}

/// A keyed refund applied on the server, whose answer never comes in time: the run escalates, and its snapshot.
async fn escalated_refund() -> (HttpServer, String) {
    let fault = Fault::TimeoutAfterApply { delay_ms: 1500 };
    let state = DemoState::new(FaultScript::new(vec![rule("issue_refund", Some(1), fault)]), None);
    let server = serve_http("127.0.0.1:0".parse().unwrap(), state).await.unwrap();
    let mut first = caller(&server, None).await;
    let escalated = first.call("issue_refund", args(json!({"order_id": "ORD-9", "amount_paise": 120_000}))).await;
    match escalated {
        Err(CallError::Escalated(e)) => {
            assert_eq!(e.reason, EscalationReason::CallAttemptsSpent);
            assert!(e.note.contains("retry (safe)"), "a keyed write is safe to resend: {}", e.note);
        }
        other => panic!("{other:?}"),
    }
    let snapshot = first.snapshot().unwrap();
    assert!(snapshot.contains("\"answers\":{\"retry\":\"safe\""), "{snapshot}");
    (server, snapshot)
}

#[tokio::test]
async fn a_resumed_keyed_write_sends_the_same_key_and_the_ledger_shows_one_refund() {
    let (server, snapshot) = escalated_refund().await;
    let resumes = Arc::new(Resumes::default());
    let mut second = caller(&server, Some(Arc::clone(&resumes))).await;
    let answer = second.resume(&snapshot, ResumeAnswer::Retry).await.unwrap();
    assert!(matches!(answer, ToolAnswer::Done { result: Some(_), .. }), "{answer:?}");
    let calls = server.state.calls_to("issue_refund");
    assert_eq!(calls.len(), 2, "the first attempt, and the person's retry");
    assert_eq!(calls[0].arguments["idempotency_key"], calls[1].arguments["idempotency_key"], "the same key");
    assert_eq!(calls[1].arguments["order_id"], "ORD-9", "the same arguments, from the snapshot");
    {
        let ledger = agent_retry_demo_server::tools::lock(&server.state.ledger);
        assert_eq!((ledger.refunds.len(), ledger.duplicate_refunds()), (1, 0), "one effect");
    }
    let report = second.report().unwrap();
    // The first run's 3 attempts (its initialize and tools/list, the refund) and the person's retry.
    assert_eq!((report.attempts, report.retries, report.escalation), (4, 1, None), "the budgets spent before the snapshot are kept");
    assert_eq!(resumes.0.lock().unwrap().clone(), vec![("retry".to_string(), "send".to_string())]);
    server.stop().await;
}

#[tokio::test]
async fn done_skip_and_abort_answer_without_sending() {
    let (server, snapshot) = escalated_refund().await;
    let mut done = caller(&server, None).await;
    match done.resume(&snapshot, ResumeAnswer::Done(Some("refund R-1 issued".into()))).await.unwrap() {
        ToolAnswer::Done { result: Some(result), .. } => assert!(format!("{result:?}").contains("refund R-1 issued"), "{result:?}"),
        other => panic!("{other:?}"),
    }
    let mut skip = caller(&server, None).await;
    match skip.resume(&snapshot, ResumeAnswer::Skip).await.unwrap() {
        ToolAnswer::Replan(message) => assert!(message.contains("A person chose to skip this call of issue_refund"), "{message}"),
        other => panic!("{other:?}"),
    }
    let mut abort = caller(&server, None).await;
    match abort.resume(&snapshot, ResumeAnswer::Abort).await {
        Err(CallError::Escalated(e)) => assert_eq!(e.reason, EscalationReason::Aborted),
        other => panic!("{other:?}"),
    }
    assert_eq!(server.state.calls_to("issue_refund").len(), 1, "no answer but retry sends anything");
    server.stop().await;
}

#[tokio::test]
async fn a_tampered_or_foreign_snapshot_is_refused_and_nothing_is_sent() {
    let (server, snapshot) = escalated_refund().await;
    let mut second = caller(&server, None).await;
    // A counter edited (its digest not recomputed).
    let tampered = snapshot.replacen("\"counters\":{\"attempts\":", "\"counters\":{\"attempts\":1", 1);
    assert_ne!(tampered, snapshot);
    match second.resume(&tampered, ResumeAnswer::Retry).await {
        Err(CallError::Snapshot(e)) => assert_eq!(e.kind, SnapshotErrorKind::Tampered, "{}", e.message),
        other => panic!("{other:?}"),
    }
    let foreign = snapshot.replacen("\"contract\":\"0.9.0\"", "\"contract\":\"0.8.0\"", 1);
    match second.resume(&foreign, ResumeAnswer::Retry).await {
        Err(CallError::Snapshot(e)) => {
            assert_eq!(e.kind, SnapshotErrorKind::OtherContract);
            assert!(e.message.contains("0.8.0") && e.message.contains("0.9.0"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    let huge = " ".repeat(agent_retry_host::limits::MAX_SNAPSHOT_BYTES + 1);
    match second.resume(&huge, ResumeAnswer::Retry).await {
        Err(CallError::Snapshot(e)) => assert_eq!(e.kind, SnapshotErrorKind::TooLarge, "refused before it crosses"),
        other => panic!("{other:?}"),
    }
    match second.snapshot() {
        Err(CallError::Snapshot(e)) => assert_eq!(e.kind, SnapshotErrorKind::NotEscalated),
        other => panic!("{other:?}"),
    }
    assert_eq!(server.state.calls_to("issue_refund").len(), 1);
    server.stop().await;
}
