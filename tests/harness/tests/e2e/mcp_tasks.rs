//! The MCP 2026-07-28 kinds of answer through the wrapper, against the demo
//! server on 127.0.0.1 (its ledger and its record of `tasks/*` requests show
//! every effect): per-tool idle timeouts restarted by progress, continuations
//! (`input_required`) answered by the application's handler or escalated, and
//! tasks polled as the policy decides. The clock is real: a task's age is read
//! against the server's `createdAt`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_retry_demo_server::faults::{Fault, rule};
use agent_retry_demo_server::{DemoState, FaultRule, FaultScript, HttpServer, Timings, serve_http};
use agent_retry_host::component::types::{ActionKind, EscalationReason};
use agent_retry_host::mcp::{CallError, McpConnection, Metrics, RetryingToolCaller, RetryingToolCallerOptions, ToolAnswer};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};
use rmcp::model::{ElicitRequestParams, ElicitResult, ElicitationAction};
use rmcp::service::RequestContext;
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

fn args(value: Value) -> Map<String, Value> {
    value.as_object().cloned().unwrap()
}

/// A client handler that accepts every elicitation with `content`, counting them.
#[derive(Clone, Default)]
struct Approver {
    asked: Arc<Mutex<Vec<String>>>,
}

impl ClientHandler for Approver {
    async fn create_elicitation(&self, request: ElicitRequestParams, _context: RequestContext<RoleClient>) -> Result<ElicitResult, ErrorData> {
        let message = serde_json::to_value(&request).ok().and_then(|v| v.get("message").and_then(Value::as_str).map(str::to_string)).unwrap_or_default();
        self.asked.lock().unwrap().push(message);
        Ok(ElicitResult::new(ElicitationAction::Accept).with_content(json!({"confirm": true, "approve": true})))
    }
}

/// The verdicts the wrapper acted on, as (tool, attempt, action).
type Seen = Arc<Mutex<Vec<(String, u32, ActionKind)>>>;

struct Setup {
    server: HttpServer,
    caller: RetryingToolCaller,
    verdicts: Seen,
    progress: Arc<Mutex<Vec<f64>>>,
}

async fn setup(faults: Vec<FaultRule>, timings: Timings, config: &str, handler: Option<Approver>) -> Setup {
    setup_with(faults, timings, config, handler, RetryingToolCallerOptions::default()).await
}

/// [`setup`] on `options` (a call timeout...), the hooks added.
async fn setup_with(faults: Vec<FaultRule>, timings: Timings, config: &str, handler: Option<Approver>, options: RetryingToolCallerOptions) -> Setup {
    let state = DemoState::new(FaultScript::new(faults), None);
    state.set_timings(timings);
    let server = serve_http("127.0.0.1:0".parse().unwrap(), state).await.unwrap();
    let mut connection = McpConnection::http(&server.url);
    if let Some(handler) = handler {
        connection = connection.with_handler(Arc::new(handler.into_dyn()));
    }
    let component = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    let instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(7))).unwrap();
    let verdicts: Seen = Arc::default();
    let progress: Arc<Mutex<Vec<f64>>> = Arc::default();
    let (v, p) = (Arc::clone(&verdicts), Arc::clone(&progress));
    let options = options.on_verdict(move |tool, attempt, verdict| v.lock().unwrap().push((tool.to_string(), attempt, verdict.action))).on_progress(
        move |tool, progress, _total, _message| {
            assert_eq!(tool, "export_report");
            p.lock().unwrap().push(progress);
        },
    );
    let caller = RetryingToolCaller::connect(connection, instance, config, "run-tasks", options, Arc::new(Metrics::new())).await.unwrap();
    Setup { server, caller, verdicts, progress }
}

impl Setup {
    /// The verdicts on `tool`'s reports.
    fn verdicts_on(&self, tool: &str) -> Vec<(u32, ActionKind)> {
        self.verdicts.lock().unwrap().iter().filter(|(t, ..)| t == tool).map(|(_, a, k)| (*a, *k)).collect()
    }
}

fn timings(progress_interval_ms: u64) -> Timings {
    Timings { progress_interval_ms, ..Timings::default() }
}

/// The export's idle timeout is 1 s, set for the tool in the policy's configuration.
const EXPORT_CONFIG: &str = r#"{"max-attempts-per-call": 2, "base-delay-ms": 10, "tools": {"export_report": {"idle-timeout-ms": 1000}}}"#;

#[tokio::test]
async fn progress_every_200_ms_keeps_a_3_second_export_alive_past_a_1_second_idle_timeout() {
    let mut s = setup(vec![], timings(200), EXPORT_CONFIG, None).await;
    let answer = s.caller.call("export_report", args(json!({"seconds": 3}))).await.unwrap();
    assert!(matches!(&answer, ToolAnswer::Done { result: Some(_), .. }), "{answer:?}");
    let reports = s.server.state.ledger.lock().unwrap().reports.clone();
    assert_eq!(reports.len(), 1, "one run of the export: {reports:?}");
    assert!(reports[0].finished && reports[0].progress_token.is_some(), "{reports:?}");
    assert_eq!(s.verdicts_on("export_report"), vec![(1, ActionKind::Succeed)], "one attempt");
    let told = s.progress.lock().unwrap().clone();
    // The last notification may race the answer (rmcp hands notifications to the client's handler on a task of their own).
    assert!(told.len() as u32 + 1 >= reports[0].notifications && told.len() >= 10, "on_progress heard the notifications: {told:?}");
    assert!(told.windows(2).all(|w| w[0] < w[1]), "in order: {told:?}");
    s.server.stop().await;
}

#[tokio::test]
async fn a_silent_export_is_cut_by_the_tools_idle_timeout() {
    // Progress every 10 s: silent for longer than the 1 s idle timeout.
    let mut s = setup(vec![], timings(10_000), EXPORT_CONFIG, None).await;
    let error = s.caller.call("export_report", args(json!({"seconds": 3}))).await.unwrap_err();
    assert!(matches!(&error, CallError::Escalated(_)), "{error}");
    let verdicts = s.verdicts_on("export_report");
    assert_eq!(verdicts, vec![(1, ActionKind::Retry), (2, ActionKind::Escalate)], "both attempts timed out");
    let reports = s.server.state.ledger.lock().unwrap().reports.clone();
    assert_eq!(reports.len(), 2, "{reports:?}");
    assert!(reports.iter().all(|r| !r.finished && r.notifications == 0), "{reports:?}");
    assert!(s.progress.lock().unwrap().is_empty());
    s.server.stop().await;
}

#[tokio::test]
async fn a_continuation_the_handler_answers_is_one_attempt_and_confirms_once() {
    let approver = Approver::default();
    let mut s = setup(vec![], Timings::default(), "{}", Some(approver.clone())).await;
    let before = s.caller.report().unwrap().attempts;
    let answer = s.caller.call("confirm_order", args(json!({"order_id": "ORD-1"}))).await.unwrap();
    assert!(matches!(&answer, ToolAnswer::Done { result: Some(_), .. }), "{answer:?}");
    assert_eq!(approver.asked.lock().unwrap().clone(), vec!["Confirm order ORD-1?".to_string()]);
    let (confirmed, rounds) = {
        let ledger = s.server.state.ledger.lock().unwrap();
        (ledger.confirmed("ORD-1"), ledger.confirmations.len())
    };
    assert_eq!((confirmed, rounds), (1, 2), "asked, then confirmed once");
    assert_eq!(s.verdicts_on("confirm_order"), vec![(1, ActionKind::Succeed)], "no attempt spent");
    assert_eq!(s.caller.report().unwrap().attempts - before, 1);
    s.server.stop().await;
}

#[tokio::test]
async fn a_continuation_nobody_answers_escalates_input_required_with_the_question() {
    let mut s = setup(vec![], Timings::default(), "{}", None).await;
    let error = s.caller.call("confirm_order", args(json!({"order_id": "ORD-2"}))).await.unwrap_err();
    match error {
        CallError::Escalated(e) => {
            assert_eq!(e.reason, EscalationReason::InputRequired);
            assert!(e.note.contains("Confirm order ORD-2?"), "{}", e.note);
        }
        other => panic!("{other}"),
    }
    let (confirmed, rounds) = {
        let ledger = s.server.state.ledger.lock().unwrap();
        (ledger.confirmed("ORD-2"), ledger.confirmations.len())
    };
    assert_eq!((confirmed, rounds), (0, 1), "asked once, never sent again");
    s.server.stop().await;
}

/// Tasks poll every 100 ms (the server's interval) and work 300 ms.
const TASK_CONFIG: &str = r#"{"task-poll-base-delay-ms": 50, "task-poll-max-delay-ms": 200}"#;

#[tokio::test]
async fn a_refund_answered_by_a_task_is_polled_to_completion_once() {
    let mut s = setup(vec![], Timings::default(), TASK_CONFIG, None).await;
    let before = s.caller.report().unwrap().attempts;
    let answer = s.caller.call("issue_refund", args(json!({"order_id": "ORD-3", "amount_paise": 245_000}))).await.unwrap();
    assert!(matches!(&answer, ToolAnswer::Done { result: Some(_), .. }), "{answer:?}");
    let state = &s.server.state;
    let task = state.task_of("issue_refund", 0).expect("the call made a task");
    assert!(!state.task_requests("tasks/get", &task.task_id).is_empty());
    assert!(state.task_requests("tasks/cancel", &task.task_id).is_empty());
    assert_eq!(state.ledger.lock().unwrap().refunds.len(), 1);
    assert_eq!(state.calls_to("issue_refund").len(), 1, "the tool was called once");
    let report = s.caller.report().unwrap();
    assert_eq!((report.attempts - before, report.tasks), (1, 1), "one attempt (connecting and listing are the others)");
    assert!(report.polls >= 1);
    let verdicts = s.verdicts_on("issue_refund");
    assert!(verdicts.iter().all(|(attempt, _)| *attempt == 1), "{verdicts:?}");
    assert_eq!(verdicts.last(), Some(&(1, ActionKind::Succeed)));
    s.server.stop().await;
}

#[tokio::test]
async fn a_poll_whose_connection_is_cut_is_polled_again_and_the_refund_is_applied_once() {
    let faults = vec![rule("tasks/get", Some(1), Fault::Drop), rule("tasks/get", Some(2), Fault::Http { status: 503, headers: vec![], body: "busy".into() })];
    let mut s = setup(faults, Timings::default(), TASK_CONFIG, None).await;
    let before = s.caller.report().unwrap().attempts;
    let answer = s.caller.call("issue_refund", args(json!({"order_id": "ORD-4", "amount_paise": 1_000}))).await.unwrap();
    assert!(matches!(&answer, ToolAnswer::Done { result: Some(_), .. }), "{answer:?}");
    let state = &s.server.state;
    let task = state.task_of("issue_refund", 0).expect("the call made a task");
    let polls = state.task_requests("tasks/get", &task.task_id);
    assert_eq!(polls[0].fault.as_deref(), Some("drop"), "{polls:?}");
    assert_eq!(polls[1].fault.as_deref(), Some("http-503"), "{polls:?}");
    assert!(polls.len() >= 3, "{polls:?}");
    assert_eq!(state.ledger.lock().unwrap().refunds.len(), 1);
    assert_eq!(state.calls_to("issue_refund").len(), 1, "never called again");
    // The tool's one attempt, and the `initialize` of the new session the cut poll called for
    // (a cut stream leaves an HTTP session suspect).
    assert_eq!(s.caller.report().unwrap().attempts - before, 2);
    assert!(s.verdicts_on("issue_refund").iter().all(|(attempt, _)| *attempt == 1));
    s.server.stop().await;
}

#[tokio::test]
async fn a_task_past_its_ttl_is_cancelled_and_escalated() {
    // The task works 5 s and lives 600 ms.
    let timings = Timings { task_work_ms: 5_000, task_ttl_ms: 600, ..Timings::default() };
    let mut s = setup(vec![], timings, TASK_CONFIG, None).await;
    let error = s.caller.call("issue_refund", args(json!({"order_id": "ORD-5", "amount_paise": 1_000}))).await.unwrap_err();
    assert!(matches!(&error, CallError::Escalated(e) if e.reason == EscalationReason::TaskExpired), "{error}");
    let state = &s.server.state;
    let task = state.task_of("issue_refund", 0).expect("the call made a task");
    assert_eq!(state.task_requests("tasks/cancel", &task.task_id).len(), 1, "tasks/cancel was sent");
    assert!(state.ledger.lock().unwrap().refunds.is_empty());
    assert_eq!(state.calls_to("issue_refund").len(), 1);
    s.server.stop().await;
}

#[tokio::test]
async fn a_task_asking_for_approval_is_answered_by_the_handler_through_tasks_update() {
    let approver = Approver::default();
    let mut s = setup(vec![], Timings::default(), TASK_CONFIG, Some(approver.clone())).await;
    // Above 5000 rupees the task asks a person.
    let answer = s.caller.call("issue_refund", args(json!({"order_id": "ORD-6", "amount_paise": 900_000}))).await.unwrap();
    assert!(matches!(&answer, ToolAnswer::Done { result: Some(_), .. }), "{answer:?}");
    assert_eq!(approver.asked.lock().unwrap().len(), 1);
    let state = &s.server.state;
    let task = state.task_of("issue_refund", 0).expect("the call made a task");
    assert_eq!(state.task_requests("tasks/update", &task.task_id).len(), 1);
    assert_eq!(state.ledger.lock().unwrap().refunds.len(), 1);
    s.server.stop().await;
}

#[tokio::test]
async fn a_task_asking_for_approval_nobody_gives_is_cancelled_and_escalated_input_required() {
    let mut s = setup(vec![], Timings::default(), TASK_CONFIG, None).await;
    let error = s.caller.call("issue_refund", args(json!({"order_id": "ORD-7", "amount_paise": 900_000}))).await.unwrap_err();
    match &error {
        CallError::Escalated(e) => {
            assert_eq!(e.reason, EscalationReason::InputRequired);
            assert!(e.note.contains("Approve a refund"), "{}", e.note);
        }
        other => panic!("{other}"),
    }
    let state = &s.server.state;
    let task = state.task_of("issue_refund", 0).expect("the call made a task");
    assert_eq!(state.task_requests("tasks/cancel", &task.task_id).len(), 1, "tasks/cancel was sent");
    assert!(state.ledger.lock().unwrap().refunds.is_empty());
    s.server.stop().await;
}

/// The task ids `tasks/cancel` named at the server, waited for up to 2 s: a
/// stopped call sends it on a task of its own.
async fn cancels_seen(state: &DemoState, task_id: &str) -> usize {
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        let seen = state.task_requests("tasks/cancel", task_id).len();
        if seen > 0 || Instant::now() >= until {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The server takes `tasks/cancel` but holds its answer back 8 s.
fn held_cancel() -> Vec<FaultRule> {
    vec![rule("tasks/cancel", Some(1), Fault::TimeoutAfterApply { delay_ms: 8_000 })]
}

#[tokio::test]
async fn a_call_cancelled_while_its_task_lives_sends_tasks_cancel_and_returns_at_once() {
    // The task works 5 s; the caller gives up after 500 ms.
    let timings = Timings { task_work_ms: 5_000, ..Timings::default() };
    let mut s = setup(held_cancel(), timings, TASK_CONFIG, None).await;
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        trigger.cancel();
    });
    let started = Instant::now();
    let error = s.caller.call_until("issue_refund", args(json!({"order_id": "ORD-8", "amount_paise": 1_000})), &cancel).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(&error, CallError::Cancelled(_)), "{error}");
    // Not after the cancel's answer (8 s) nor the idle timeout (30 s).
    assert!(took < Duration::from_millis(2_500), "the call returned after {took:?}");
    let state = &s.server.state;
    let task = state.task_of("issue_refund", 0).expect("the call made a task");
    assert_eq!(cancels_seen(state, &task.task_id).await, 1, "tasks/cancel was sent");
    assert!(state.ledger.lock().unwrap().refunds.is_empty());
}

#[tokio::test]
async fn a_call_at_its_deadline_cancels_its_task_without_waiting_past_the_deadline() {
    // The task works 5 s; the call may take 1.5 s.
    let timings = Timings { task_work_ms: 5_000, ..Timings::default() };
    let options = RetryingToolCallerOptions { call_timeout_ms: Some(1_500), ..RetryingToolCallerOptions::default() };
    let mut s = setup_with(held_cancel(), timings, TASK_CONFIG, None, options).await;
    let started = Instant::now();
    let error = s.caller.call("issue_refund", args(json!({"order_id": "ORD-10", "amount_paise": 1_000}))).await.unwrap_err();
    let took = started.elapsed();
    // Whichever stops it: the policy (no time for the next poll: escalate
    // with cancel-task) or the wrapper at the deadline.
    assert!(matches!(&error, CallError::TimedOut(_) | CallError::Escalated(_)), "{error}");
    assert!(took < Duration::from_millis(2_500), "the call returned after {took:?}");
    let state = &s.server.state;
    let task = state.task_of("issue_refund", 0).expect("the call made a task");
    assert_eq!(cancels_seen(state, &task.task_id).await, 1, "tasks/cancel was sent");
    assert!(state.ledger.lock().unwrap().refunds.is_empty());
}

#[tokio::test]
async fn a_cancel_task_verdict_waits_for_the_cancel_no_longer_than_the_time_left() {
    // The task works 5 s and lives 600 ms: the policy escalates task-expired
    // with cancel-task well before the call's 2.5 s are up.
    let timings = Timings { task_work_ms: 5_000, task_ttl_ms: 600, ..Timings::default() };
    let options = RetryingToolCallerOptions { call_timeout_ms: Some(2_500), ..RetryingToolCallerOptions::default() };
    let mut s = setup_with(held_cancel(), timings, TASK_CONFIG, None, options).await;
    let started = Instant::now();
    let error = s.caller.call("issue_refund", args(json!({"order_id": "ORD-9", "amount_paise": 1_000}))).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(&error, CallError::Escalated(e) if e.reason == EscalationReason::TaskExpired), "{error}");
    assert!(took < Duration::from_millis(4_500), "the call returned after {took:?}");
    let state = &s.server.state;
    let task = state.task_of("issue_refund", 0).expect("the call made a task");
    assert_eq!(cancels_seen(state, &task.task_id).await, 1, "tasks/cancel was sent");
}
