//! The demo server's MCP 2026-07-28 answers, driven by rmcp's own client over
//! streamable HTTP and over a byte stream (what `--stdio` serves): tasks
//! (SEP-2663) polled, cancelled, expired, answered through `tasks/update` and
//! faulted while polling; a continuation (`input_required`); progress. Each
//! test asserts on the ledger and on what the server recorded.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_retry_demo_server::continuation::CONFIRM_KEY;
use agent_retry_demo_server::faults::rule;
use agent_retry_demo_server::ledger::RoundOutcome;
use agent_retry_demo_server::tasks::APPROVAL_KEY;
use agent_retry_demo_server::tools::tool_list;
use agent_retry_demo_server::{DemoServer, DemoState, Fault, FaultScript, HttpServer, Timings, serve_http};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ClientCapabilities, ClientConfig, DetailedTask, ElicitRequestParams,
    ElicitResult, ElicitationAction, ErrorCode, GetTaskParams, Implementation, InputResponses, ProgressNotificationParam, ProtocolVersion, Task, TaskPayload,
    TaskStatus, UpdateTaskParams,
};
use rmcp::service::{NotificationContext, RequestContext, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, ErrorData, RoleClient, ServiceError, ServiceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A client: declares the tasks extension or not, answers elicitations
/// (accepting unless told to decline), and keeps the progress it is sent.
#[derive(Clone, Default)]
struct Client {
    tasks: bool,
    decline: bool,
    progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
}

impl Client {
    fn with_tasks() -> Self {
        Client { tasks: true, ..Client::default() }
    }
}

impl ClientHandler for Client {
    fn get_info(&self) -> ClientConfig {
        let capabilities = if self.tasks {
            ClientCapabilities::builder().enable_elicitation().enable_tasks().build()
        } else {
            ClientCapabilities::builder().enable_elicitation().build()
        };
        ClientConfig::new(capabilities, Implementation::new("demo-server-tests", "0"))
    }

    async fn create_elicitation(&self, _request: ElicitRequestParams, _context: RequestContext<RoleClient>) -> Result<ElicitResult, ErrorData> {
        Ok(if self.decline {
            ElicitResult::new(ElicitationAction::Decline)
        } else {
            ElicitResult::new(ElicitationAction::Accept).with_content(json!({ "confirm": true, "approve": true }))
        })
    }

    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        self.progress.lock().unwrap().push(params);
    }
}

type Connected = RunningService<RoleClient, Client>;

fn modern() -> ClientLifecycleMode {
    ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] }
}

async fn over_http(url: &str, client: Client) -> Connected {
    client.serve_with_lifecycle(StreamableHttpClientTransport::from_uri(url.to_string()), modern()).await.expect("connected over HTTP")
}

/// The server on one end of a byte stream, as `agent-retry serve --stdio` serves it.
async fn over_stream(state: Arc<DemoState>, client: Client) -> Connected {
    let (server_end, client_end) = tokio::io::duplex(1 << 16);
    tokio::spawn(async move {
        if let Ok(service) = DemoServer::new(state).serve(server_end).await {
            let _ = service.waiting().await;
        }
    });
    client.serve_with_lifecycle(client_end, modern()).await.expect("connected over a stream")
}

fn fast() -> Timings {
    Timings { task_work_ms: 200, task_poll_interval_ms: 20, task_ttl_ms: 10_000, progress_interval_ms: 50 }
}

fn state(faults: FaultScript, timings: Timings) -> Arc<DemoState> {
    let state = DemoState::new(faults, None);
    state.set_timings(timings);
    state
}

async fn server(faults: FaultScript, timings: Timings) -> HttpServer {
    serve_http("127.0.0.1:0".parse().unwrap(), state(faults, timings)).await.unwrap()
}

fn call(name: &'static str, arguments: Value) -> CallToolRequestParams {
    CallToolRequestParams::new(name).with_arguments(arguments.as_object().cloned().unwrap())
}

async fn start_task(client: &Connected, name: &'static str, arguments: Value) -> Task {
    match client.call_tool_once(call(name, arguments)).await.expect("tools/call answered") {
        CallToolResponse::Task(created) => created.task,
        other => panic!("{name}: not a task: {other:?}"),
    }
}

async fn get(client: &Connected, task_id: &str) -> Result<DetailedTask, ServiceError> {
    Ok(client.peer().get_task(GetTaskParams::new(task_id)).await?.task)
}

/// Polls every 20 ms until `done` says so (10 s at most); the polls made and the task.
async fn poll_until(client: &Connected, task_id: &str, done: impl Fn(&DetailedTask) -> bool) -> (usize, DetailedTask) {
    for polls in 1..=500 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let task = get(client, task_id).await.expect("tasks/get answered");
        if done(&task) {
            return (polls, task);
        }
    }
    panic!("task {task_id} never got there");
}

fn terminal(task: &DetailedTask) -> bool {
    task.status().is_terminal()
}

fn completed_result(task: &DetailedTask) -> CallToolResult {
    match &task.payload {
        TaskPayload::Completed { result } => serde_json::from_value(Value::Object(result.clone())).expect("a CallToolResult"),
        other => panic!("not completed: {other:?}"),
    }
}

fn text(result: &CallToolResult) -> String {
    result.content.iter().filter_map(|c| c.as_text()).map(|t| t.text.clone()).collect()
}

fn refunds(state: &DemoState, order_id: &str) -> usize {
    state.ledger.lock().unwrap().refunds.iter().filter(|r| r.order_id == order_id).count()
}

fn mcp_code(error: ServiceError) -> (i32, Option<Value>) {
    match error {
        ServiceError::McpError(e) => (e.code.0, e.data),
        other => panic!("not a JSON-RPC error: {other:?}"),
    }
}

#[tokio::test]
async fn a_refund_task_is_polled_to_completed_and_refunds_once() {
    let server = server(FaultScript::default(), fast()).await;
    let client = over_http(&server.url, Client::with_tasks()).await;
    let task = start_task(&client, "issue_refund", json!({"order_id": "T-1", "amount_paise": 1000})).await;
    assert_eq!(task.status, TaskStatus::Working);
    assert_eq!((task.poll_interval_ms, task.ttl_ms), (Some(20), Some(10_000)), "the server's timings");
    assert_eq!(refunds(&server.state, "T-1"), 0, "the refund waits for the task's work");

    let (polls, done) = poll_until(&client, &task.task_id, terminal).await;
    let result = completed_result(&done);
    assert_eq!(result.structured_content.as_ref().unwrap()["refund"]["order_id"], "T-1", "{result:?}");
    // Polls after the end apply nothing more.
    for _ in 0..2 {
        assert_eq!(get(&client, &task.task_id).await.unwrap().status(), TaskStatus::Completed);
    }

    let state = &server.state;
    assert_eq!(refunds(state, "T-1"), 1, "one refund");
    assert_eq!(state.calls_to("issue_refund").len(), 1, "one tools/call");
    let created = state.tasks_created();
    assert_eq!((created.len(), created[0].tool.as_str(), created[0].task_id.as_str()), (1, "issue_refund", task.task_id.as_str()));
    let seen = state.task_requests("tasks/get", &task.task_id);
    assert_eq!(seen.len(), polls + 2, "every poll recorded");
    assert!(seen.iter().all(|e| e.fault.is_none()));
    assert_eq!(seen[polls - 1].answer.as_deref(), Some("completed"));
    assert!(seen[..polls - 1].iter().all(|e| e.answer.as_deref() == Some("working")), "{seen:?}");
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_client_without_the_extension_gets_answers_not_tasks() {
    let server = server(FaultScript::default(), fast()).await;
    let plain = over_http(&server.url, Client::default()).await;
    match plain.call_tool_once(call("issue_refund", json!({"order_id": "T-2", "amount_paise": 1000}))).await.unwrap() {
        CallToolResponse::Complete(result) => assert_eq!(result.is_error, Some(false), "{result:?}"),
        other => panic!("not a plain answer: {other:?}"),
    }
    assert_eq!(refunds(&server.state, "T-2"), 1);
    assert!(server.state.tasks_created().is_empty());

    // A tool that requires a task: -32021 naming the extension.
    let (code, data) = mcp_code(plain.call_tool_once(call("archive_orders", json!({"before": "2026-01-01"}))).await.unwrap_err());
    assert_eq!(code, ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY.0);
    assert!(data.unwrap()["requiredCapabilities"]["extensions"].get("io.modelcontextprotocol/tasks").is_some());
    // tasks/* likewise (rmcp's own gate).
    let (code, _) = mcp_code(get(&plain, "anything").await.unwrap_err());
    assert_eq!(code, ErrorCode::MISSING_REQUIRED_CLIENT_CAPABILITY.0);
    assert!(server.state.ledger.lock().unwrap().archives.is_empty());

    // With the extension, archive_orders is a task that archives once.
    let client = over_http(&server.url, Client::with_tasks()).await;
    let task = start_task(&client, "archive_orders", json!({"before": "2026-01-01"})).await;
    let (_, done) = poll_until(&client, &task.task_id, terminal).await;
    assert_eq!(completed_result(&done).structured_content.unwrap()["archived_before"], "2026-01-01");
    let archives = server.state.ledger.lock().unwrap().archives.clone();
    assert_eq!(archives.len(), 1, "{archives:?}");
    plain.cancel().await.unwrap();
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_cancelled_task_is_recorded_and_refunds_nothing() {
    let server = server(FaultScript::default(), Timings { task_work_ms: 5_000, ..fast() }).await;
    let client = over_http(&server.url, Client::with_tasks()).await;
    let task = start_task(&client, "issue_refund", json!({"order_id": "T-3", "amount_paise": 1000})).await;
    client.peer().cancel_task(CancelTaskParams::new(task.task_id.clone())).await.unwrap();
    let (_, done) = poll_until(&client, &task.task_id, terminal).await;
    assert_eq!(done.status(), TaskStatus::Cancelled);
    let cancels = server.state.task_requests("tasks/cancel", &task.task_id);
    assert_eq!(cancels.len(), 1, "the cancel was seen: {cancels:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(refunds(&server.state, "T-3"), 0, "a cancelled task applies nothing");
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_task_past_its_ttl_is_failed_its_work_stopped_then_forgotten() {
    let server = server(FaultScript::default(), Timings { task_work_ms: 1_500, task_ttl_ms: 300, ..fast() }).await;
    let client = over_http(&server.url, Client::with_tasks()).await;
    let started = tokio::time::Instant::now();
    let task = start_task(&client, "issue_refund", json!({"order_id": "T-4", "amount_paise": 1000})).await;
    assert_eq!(task.ttl_ms, Some(300));

    // Polled after its TTL: rmcp has failed it.
    tokio::time::sleep_until(started + Duration::from_millis(450)).await;
    let expired = get(&client, &task.task_id).await.unwrap();
    match &expired.payload {
        TaskPayload::Failed { error } => assert!(error["message"].as_str().unwrap().contains("TTL"), "{error:?}"),
        other => panic!("not failed at its TTL: {other:?}"),
    }

    // A task nobody asks about: its work stops at the TTL all the same (the
    // server calls rmcp's sweep then), so past its work time nothing was refunded.
    let started = tokio::time::Instant::now();
    let unasked = start_task(&client, "issue_refund", json!({"order_id": "T-4b", "amount_paise": 1000})).await;
    tokio::time::sleep_until(started + Duration::from_millis(1_700)).await;
    assert_eq!((refunds(&server.state, "T-4"), refunds(&server.state, "T-4b")), (0, 0));
    // Kept one more TTL after it failed, then unknown (-32602).
    for task_id in [&task.task_id, &unasked.task_id] {
        let (code, _) = mcp_code(get(&client, task_id).await.unwrap_err());
        assert_eq!(code, ErrorCode::INVALID_PARAMS.0);
    }
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_task_that_needs_a_person_completes_through_tasks_update() {
    let server = server(FaultScript::default(), fast()).await;
    let client = over_http(&server.url, Client::with_tasks()).await;
    for (order, answer, refunded) in [("T-5", json!({"action": "accept", "content": {"approve": true}}), 1), ("T-6", json!({"action": "decline"}), 0)] {
        let task = start_task(&client, "issue_refund", json!({"order_id": order, "amount_paise": 600_000})).await;
        let (_, asking) = poll_until(&client, &task.task_id, |t| t.status() != TaskStatus::Working).await;
        let TaskPayload::InputRequired { input_requests } = &asking.payload else { panic!("not input_required: {asking:?}") };
        let asked = serde_json::to_value(input_requests).unwrap();
        assert_eq!(asked[APPROVAL_KEY]["method"], "elicitation/create", "{asked}");
        assert!(asked[APPROVAL_KEY]["params"]["message"].as_str().unwrap().contains(&format!("6000.00 rupees on order {order}")), "{asked}");
        assert_eq!(refunds(&server.state, order), 0, "nothing before the answer");

        let responses = InputResponses::from([(APPROVAL_KEY.to_string(), answer)]);
        client.peer().update_task(UpdateTaskParams::new(task.task_id.clone(), responses)).await.unwrap();
        let (_, done) = poll_until(&client, &task.task_id, terminal).await;
        // A declined refund is a tool error: SEP-2663 calls that `completed`.
        let result = completed_result(&done);
        assert_eq!(result.is_error, Some(refunded == 0), "{order}: {result:?}");
        if refunded == 0 {
            assert_eq!(result.structured_content.unwrap()["error"]["status"], 403);
        }
        assert_eq!(refunds(&server.state, order), refunded, "{order}");
        assert_eq!(server.state.task_requests("tasks/update", &task.task_id).len(), 1);
    }
    let amounts: Vec<i64> = server.state.ledger.lock().unwrap().refunds.iter().map(|r| r.amount_paise).collect();
    assert_eq!(amounts, [600_000]);
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn a_continuation_confirms_the_order_once_on_the_round_with_the_answer() {
    let server = server(FaultScript::default(), fast()).await;
    let client = over_http(&server.url, Client::default()).await;
    let rounds = |order: &str| -> Vec<RoundOutcome> {
        server.state.ledger.lock().unwrap().confirmations.iter().filter(|r| r.order_id == order).map(|r| r.outcome).collect()
    };

    // By hand: input_required, then the same call with the answer and the state.
    let CallToolResponse::InputRequired(asked) = client.call_tool_once(call("confirm_order", json!({"order_id": "C-1"}))).await.unwrap() else {
        panic!("not input_required")
    };
    let requests = serde_json::to_value(asked.input_requests.as_ref().unwrap()).unwrap();
    assert_eq!(requests[CONFIRM_KEY]["params"]["message"], "Confirm order C-1?");
    let state = asked.request_state.clone().expect("a requestState");
    assert_eq!((rounds("C-1"), server.state.ledger.lock().unwrap().confirmed("C-1")), (vec![RoundOutcome::Asked], 0));

    // A state for another order is refused, and confirms nothing.
    let wrong = call("confirm_order", json!({"order_id": "C-9"}))
        .with_input_responses(InputResponses::from([(CONFIRM_KEY.to_string(), json!({"action": "accept"}))]))
        .with_request_state(state.clone());
    assert_eq!(mcp_code(client.call_tool_once(wrong).await.unwrap_err()).0, ErrorCode::INVALID_PARAMS.0);

    let answered = call("confirm_order", json!({"order_id": "C-1"}))
        .with_input_responses(InputResponses::from([(CONFIRM_KEY.to_string(), json!({"action": "accept", "content": {"confirm": true}}))]))
        .with_request_state(state);
    let CallToolResponse::Complete(result) = client.call_tool_once(answered).await.unwrap() else { panic!("not complete") };
    assert_eq!(text(&result), "order C-1 confirmed");
    assert_eq!(rounds("C-1"), [RoundOutcome::Asked, RoundOutcome::Confirmed]);
    assert_eq!(server.state.ledger.lock().unwrap().confirmed("C-1"), 1);

    // rmcp's call_tool drives the rounds itself, through the client's elicitation handler.
    let result = client.call_tool(call("confirm_order", json!({"order_id": "C-2"}))).await.unwrap();
    assert_eq!(text(&result), "order C-2 confirmed");
    assert_eq!(rounds("C-2"), [RoundOutcome::Asked, RoundOutcome::Confirmed]);
    assert_eq!(server.state.calls_to("confirm_order").len(), 5, "two rounds each, and the refused one");
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn progress_reaches_a_client_that_sent_a_token() {
    let server = server(FaultScript::default(), fast()).await;
    let seen = Client::default();
    let client = over_http(&server.url, seen.clone()).await;
    let result = client.call_tool(call("export_report", json!({"seconds": 0.3}))).await.unwrap();
    assert_eq!(text(&result), "report ready");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let progress = seen.progress.lock().unwrap().clone();
    let steps: Vec<f64> = progress.iter().map(|p| p.progress).collect();
    assert_eq!(steps, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "300 ms at one every 50 ms");
    assert!(progress.iter().all(|p| p.total == Some(6.0) && p.progress_token == progress[0].progress_token));

    let reports = server.state.ledger.lock().unwrap().reports.clone();
    assert_eq!(reports.len(), 1, "run once: {reports:?}");
    assert_eq!((reports[0].notifications, reports[0].finished), (6, true));
    assert_eq!(reports[0].progress_token, Some(serde_json::to_value(&progress[0].progress_token).unwrap()));
    client.cancel().await.unwrap();
    server.stop().await;
}

/// A client of the 2025-06-18 handshake writing JSON-RPC lines itself: rmcp's
/// client always sends a progress token, this one sends none.
struct RawSession {
    writer: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    lines: tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
}

impl RawSession {
    async fn start(state: Arc<DemoState>) -> RawSession {
        let (server_end, client_end) = tokio::io::duplex(1 << 16);
        tokio::spawn(async move {
            if let Ok(service) = DemoServer::new(state).serve(server_end).await {
                let _ = service.waiting().await;
            }
        });
        let (reader, writer) = tokio::io::split(client_end);
        let mut session = RawSession { writer, lines: BufReader::new(reader).lines() };
        let init = json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}});
        session.request(1, "initialize", init).await;
        session.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await;
        session
    }

    async fn send(&mut self, message: Value) {
        self.writer.write_all(format!("{message}\n").as_bytes()).await.unwrap();
    }

    /// Sends a request; every line read until its answer, the answer last.
    async fn request(&mut self, id: u64, method: &str, params: Value) -> Vec<Value> {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
        let mut seen = Vec::new();
        while let Some(line) = tokio::time::timeout(Duration::from_secs(10), self.lines.next_line()).await.unwrap().unwrap() {
            let message: Value = serde_json::from_str(&line).unwrap();
            let answered = message["id"] == id;
            seen.push(message);
            if answered {
                return seen;
            }
        }
        panic!("the stream ended before the answer to {method}");
    }
}

#[tokio::test]
async fn without_a_progress_token_the_export_sends_no_progress() {
    let state = state(FaultScript::default(), fast());
    let mut session = RawSession::start(Arc::clone(&state)).await;
    let seen = session.request(2, "tools/call", json!({"name": "export_report", "arguments": {"seconds": 0.2}})).await;
    assert_eq!(seen.len(), 1, "nothing before the answer: {seen:?}");
    assert_eq!(seen[0]["result"]["content"][0]["text"], "report ready", "{seen:?}");
    let reports = state.ledger.lock().unwrap().reports.clone();
    assert_eq!((reports.len(), reports[0].notifications, reports[0].finished, reports[0].progress_token.clone()), (1, 0, true, None));
}

#[tokio::test]
async fn the_listing_drops_task_support() {
    // tool_list() carries SEP-2663's marker; rmcp's `Tool` has no field for it.
    let listed = tool_list();
    let archive = listed.as_array().unwrap().iter().find(|t| t["name"] == "archive_orders").unwrap();
    assert_eq!(archive["execution"]["taskSupport"], "required");
    let mut session = RawSession::start(state(FaultScript::default(), fast())).await;
    let seen = session.request(2, "tools/list", json!({})).await;
    let tools = seen.last().unwrap()["result"]["tools"].as_array().unwrap().clone();
    let archive = tools.iter().find(|t| t["name"] == "archive_orders").expect("archive_orders listed");
    assert!(archive.get("execution").is_none(), "rmcp now carries execution: update the comment in tool_list(): {archive}");
    assert_eq!(tools.len(), listed.as_array().unwrap().len());
}

/// Polls through a fresh connection after every failure, as a host that
/// reconnects would; the answers seen (Ok status or the error) and the task.
async fn poll_reconnecting(url: &str, task_id: &str) -> (Vec<Result<TaskStatus, String>>, DetailedTask) {
    let mut client = over_http(url, Client::with_tasks()).await;
    let mut seen = Vec::new();
    for _ in 0..500 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        match get(&client, task_id).await {
            Ok(task) => {
                seen.push(Ok(task.status()));
                if terminal(&task) {
                    let _ = client.cancel().await;
                    return (seen, task);
                }
            }
            Err(e) => {
                seen.push(Err(e.to_string()));
                let _ = client.cancel().await;
                client = over_http(url, Client::with_tasks()).await;
            }
        }
    }
    panic!("task {task_id} never ended");
}

#[tokio::test]
async fn a_connection_cut_while_polling_still_leaves_one_refund() {
    let faults = FaultScript::new(vec![
        rule("tasks/get", Some(2), Fault::Drop),
        rule("tasks/get", Some(3), Fault::Http { status: 503, headers: vec![("retry-after".into(), "0".into())], body: "busy".into() }),
        rule("tasks/get", Some(4), Fault::JsonRpcError { code: -32000, message: "scripted".into(), data: None }),
    ]);
    let server = server(faults, Timings { task_work_ms: 400, ..fast() }).await;
    let client = over_http(&server.url, Client::with_tasks()).await;
    let task = start_task(&client, "issue_refund", json!({"order_id": "T-7", "amount_paise": 1000, "idempotency_key": "k-7"})).await;
    let (answers, done) = poll_reconnecting(&server.url, &task.task_id).await;
    assert!(answers[0].is_ok() && answers[1..4].iter().all(Result::is_err) && answers[4].is_ok(), "{answers:?}");
    assert_eq!(done.status(), TaskStatus::Completed);

    let polls = server.state.task_requests("tasks/get", &task.task_id);
    assert_eq!(polls.len(), answers.len(), "every poll recorded, the faulted ones too");
    let faults: Vec<Option<&str>> = polls.iter().map(|e| e.fault.as_deref()).collect();
    assert_eq!(faults[..5], [None, Some("drop"), Some("http-503"), Some("json-rpc--32000"), None]);
    assert_eq!((polls[1].answer.clone(), polls[2].answer.clone()), (None, None), "the fault layer answered them");
    assert_eq!(polls[3].answer.as_deref(), Some("error -32000"), "the handler answered the JSON-RPC error");
    assert_eq!(refunds(&server.state, "T-7"), 1, "one refund");
    assert_eq!(server.state.calls_to("issue_refund").len(), 1);
    client.cancel().await.unwrap();
    server.stop().await;
}

#[tokio::test]
async fn over_stdio_tasks_continuations_progress_and_poll_faults_work() {
    let faults = FaultScript::new(vec![rule("tasks/get", Some(1), Fault::Http { status: 503, headers: vec![], body: "busy".into() })]);
    let state = state(faults, fast());
    let seen = Client::with_tasks();
    let client = over_stream(Arc::clone(&state), seen.clone()).await;

    let task = start_task(&client, "issue_refund", json!({"order_id": "S-1", "amount_paise": 1000})).await;
    // The first poll meets the scripted 503, as a JSON-RPC error (stdio has no HTTP).
    let (code, data) = mcp_code(get(&client, &task.task_id).await.unwrap_err());
    assert_eq!((code, data.unwrap()["status"].clone()), (ErrorCode::INTERNAL_ERROR.0, json!(503)));
    let (_, done) = poll_until(&client, &task.task_id, terminal).await;
    assert_eq!(done.status(), TaskStatus::Completed);
    assert_eq!(refunds(&state, "S-1"), 1);
    assert_eq!(state.task_requests("tasks/get", &task.task_id)[0].fault.as_deref(), Some("http-503"));

    let result = client.call_tool(call("confirm_order", json!({"order_id": "S-2"}))).await.unwrap();
    assert_eq!(text(&result), "order S-2 confirmed");
    assert_eq!(state.ledger.lock().unwrap().confirmed("S-2"), 1);

    let result = client.call_tool(call("export_report", json!({"seconds": 0.1}))).await.unwrap();
    assert_eq!(text(&result), "report ready");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(seen.progress.lock().unwrap().len(), 2, "100 ms at one every 50 ms");
    client.cancel().await.unwrap();
}
