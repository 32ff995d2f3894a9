//! What real transports do, through the shared fault proxy
//! (tests/fault-proxy/README.md, scenarios T1–T12): lost sessions, servers
//! killed mid-call, cut answer streams, faults outside the wrapped call, a
//! transport that does not capture (T8, in `logs/capture_missing.rs`: it needs the
//! process's tracing to itself), deadlines and cancellation. Against the
//! demo server (its ledger file shows every effect) and
//! `@modelcontextprotocol/server-everything` (installed by
//! `make fault-proxy-setup`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_retry_demo_server::faults::{Fault, rule_first};
use agent_retry_demo_server::{DemoState, FaultScript, serve_http};
use agent_retry_host::component::types::EffectStatus;
use agent_retry_host::mcp::{CallError, ListedCheck, McpConnection, Metrics, RetryingToolCaller, RetryingToolCallerOptions, StopCause, ToolAnswer};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;

/// Short waits so the scenarios are quick; the attempt timeout is long, so a
/// call that ends early did not wait for it.
const CONFIG: &str = r#"{"base-delay-ms": 50, "max-delay-ms": 200}"#;
const ATTEMPT_TIMEOUT_MS: u64 = 10_000;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn demo_serve() -> String {
    env!("CARGO_BIN_EXE_demo-serve").to_string()
}

fn everything() -> String {
    let path = root().join("tests/fault-proxy/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(path.exists(), "{} is missing: run `make fault-proxy-setup`", path.display());
    path.display().to_string()
}

fn args(value: Value) -> Map<String, Value> {
    value.as_object().cloned().unwrap()
}

fn options() -> RetryingToolCallerOptions {
    RetryingToolCallerOptions { attempt_timeout_ms: Some(ATTEMPT_TIMEOUT_MS), ..Default::default() }
}

fn instance() -> agent_retry_host::PolicyInstance {
    let component = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(10))).unwrap()
}

async fn connected(connection: McpConnection, options: RetryingToolCallerOptions) -> RetryingToolCaller {
    RetryingToolCaller::connect(connection, instance(), CONFIG, "run-faults", options, Arc::new(Metrics::new())).await.unwrap()
}

/// A scratch directory of the test's own.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("agent-retry-faults-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn ledger_of(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap_or_else(|_| "{}".into())).unwrap()
}

/// `proxy.mjs` in front of a server command. Dropping it closes the proxy's
/// stdin, and the proxy then stops the server and exits (a killed proxy would
/// leave its server running).
struct Proxy {
    _child: tokio::process::Child,
    _stdin: tokio::process::ChildStdin,
    port: u16,
}

impl Proxy {
    async fn start(server: &[String]) -> Proxy {
        let mut child = tokio::process::Command::new("node")
            .arg(root().join("tests/fault-proxy/proxy.mjs"))
            .arg("--")
            .args(server)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("node is needed for the fault proxy");
        let stdin = child.stdin.take().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).await.unwrap();
        let started: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("proxy said {line:?}: {e}"));
        let url = started["url"].as_str().unwrap();
        let port = url.rsplit(':').next().unwrap().parse().unwrap();
        Proxy { _child: child, _stdin: stdin, port }
    }

    fn mcp(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// One control request, over a plain TCP connection.
    async fn control(&self, method: &str, path: &str, body: &str) -> Value {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.unwrap();
        let request = format!("{method} /__proxy/{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{answer}");
        serde_json::from_str(body).unwrap()
    }

    async fn faults(&self, faults: Value) {
        self.control("POST", "faults", &faults.to_string()).await;
    }

    async fn log(&self) -> Vec<Value> {
        self.control("GET", "log", "").await.as_array().unwrap().clone()
    }

    async fn count(&self, rpc: &str) -> usize {
        self.log().await.iter().filter(|e| e["rpc"] == rpc).count()
    }
}

/// The demo server over HTTP with sessions and a ledger file, behind the proxy.
async fn demo_behind_proxy(dir: &Path) -> (Proxy, PathBuf) {
    let ledger = dir.join("ledger.json");
    let command = vec![demo_serve(), "--http".into(), "127.0.0.1:{port}".into(), "--sessions".into(), "--ledger".into(), ledger.display().to_string()];
    (Proxy::start(&command).await, ledger)
}

/// The demo server over stdio with a ledger file: its command and the file.
fn demo_over_stdio(dir: &Path) -> (Vec<String>, PathBuf) {
    let ledger = dir.join("ledger.json");
    (vec![demo_serve(), "--stdio".into(), "--ledger".into(), ledger.display().to_string()], ledger)
}

/// Checks a note the way an operator would: list the order's notes.
fn note_check() -> agent_retry_host::mcp::StatusCheck {
    ListedCheck::new("list_notes", &["order_id"], "notes", &["order_id", "text"]).into_check()
}

/// The stdio shim in front of a server command, as the command the wrapper starts.
fn shim(dir: &Path, faults: Value, server: &[String]) -> (McpConnection, PathBuf) {
    let script = dir.join("faults.json");
    let log = dir.join("shim.jsonl");
    std::fs::write(&script, faults.to_string()).unwrap();
    let mut args = vec![root().join("tests/fault-proxy/stdio.mjs").display().to_string(), "--script".into(), script.display().to_string()];
    args.extend(["--log".into(), log.display().to_string(), "--".into()]);
    args.extend(server.iter().cloned());
    (McpConnection::stdio("node", &args), log)
}

fn shim_log(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn shim_pids(path: &Path) -> std::collections::BTreeSet<u64> {
    shim_log(path).iter().filter(|e| e["rpc"].is_string()).map(|e| e["pid"].as_u64().unwrap()).collect()
}

fn refunds(ledger_path: &Path) -> Vec<Value> {
    ledger_of(ledger_path)["refunds"].as_array().cloned().unwrap_or_default()
}

fn done(answer: &ToolAnswer) -> bool {
    matches!(answer, ToolAnswer::Done { .. })
}

/// The wrapper negotiates 2026-07-28, which has no sessions; a client that
/// does the 2025-11-25 handshake gets one (as older clients do).
fn with_sessions(connection: McpConnection) -> McpConnection {
    let mut config = rmcp::model::ClientConfig::default();
    config.protocol_version = rmcp::model::ProtocolVersion::V_2025_11_25;
    connection.with_client_config(config).with_lifecycle(rmcp::ClientLifecycleMode::Initialize)
}

#[tokio::test]
async fn t1_a_restarted_server_loses_the_session_and_the_wrapper_sets_it_up_again() {
    let dir = scratch("t1");
    let (proxy, ledger) = demo_behind_proxy(&dir).await;
    let mut caller = connected(with_sessions(McpConnection::http(&proxy.mcp("/mcp"))), options()).await;
    let order = caller.call("lookup_order", args(json!({"order_id": "T1"}))).await.unwrap();
    assert!(done(&order), "{order:?}");
    proxy.control("POST", "restart", "").await;
    let refund = caller.call("issue_refund", args(json!({"order_id": "T1", "amount_paise": 100}))).await.unwrap();
    assert!(done(&refund), "the lost session is not the model's error: {refund:?}");
    let log = proxy.log().await;
    assert_eq!(log.iter().filter(|e| e["rpc"] == "initialize").count(), 2, "re-initialised once: {log:?}");
    assert!(log.iter().any(|e| e["rpc"] == "tools/call" && e["session"] == true && e["status"] == 404), "the old session was refused: {log:?}");
    assert_eq!(refunds(&ledger).len(), 1, "{:?}", ledger);
    let report = caller.finish().await.unwrap();
    assert_eq!(report.replans, 0);
}

#[tokio::test]
async fn t2_an_answer_cut_mid_stream_is_seen_at_once_and_the_keyed_write_resent() {
    let dir = scratch("t2");
    let (proxy, ledger) = demo_behind_proxy(&dir).await;
    let mut caller = connected(McpConnection::http(&proxy.mcp("/mcp")), options()).await;
    proxy.faults(json!([{"on": "tools/call", "tool": "issue_refund", "fault": "cut-during"}])).await;
    let started = Instant::now();
    let refund = caller.call("issue_refund", args(json!({"order_id": "T2", "amount_paise": 100}))).await.unwrap();
    assert!(done(&refund), "{refund:?}");
    assert!(started.elapsed() < Duration::from_millis(ATTEMPT_TIMEOUT_MS / 2), "waited {:?}: the cut was not seen at once", started.elapsed());
    assert_eq!(proxy.log().await.iter().filter(|e| e["tool"] == "issue_refund").count(), 2);
    let refunds = refunds(&ledger);
    assert_eq!(refunds.len(), 1, "applied once, though sent twice: {refunds:?}");
    assert!(refunds[0]["idempotency_key"].is_string());
}

#[tokio::test]
async fn t3_an_unkeyed_write_cut_mid_answer_is_status_checked_not_resent() {
    let dir = scratch("t3");
    let (proxy, ledger) = demo_behind_proxy(&dir).await;
    let mut caller = connected(McpConnection::http(&proxy.mcp("/mcp")), options()).await.with_status_check("record_note", note_check());
    proxy.faults(json!([{"on": "tools/call", "tool": "record_note", "fault": "cut-during"}])).await;
    let note = caller.call("record_note", args(json!({"order_id": "T3", "text": "called the customer"}))).await.unwrap();
    assert!(matches!(&note, ToolAnswer::Done { result: None, note: Some(_) }), "the status check found it: {note:?}");
    assert_eq!(proxy.log().await.iter().filter(|e| e["tool"] == "record_note").count(), 1, "not resent");
    assert_eq!(ledger_of(&ledger)["notes"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn t4_cut_answers_to_initialize_tools_list_and_the_get_stream_do_not_kill_the_session() {
    let dir = scratch("t4");
    let (proxy, _ledger) = demo_behind_proxy(&dir).await;
    proxy
        .faults(json!([
            {"on": "initialize", "fault": "cut-before"},
            {"on": "tools/list", "fault": "cut-during"},
            {"on": "GET", "fault": "cut-before"},
        ]))
        .await;
    // The handshake and the GET stream belong to 2025-11-25: a client of it.
    let mut caller = connected(with_sessions(McpConnection::http(&proxy.mcp("/mcp"))), options()).await;
    let order = caller.call("lookup_order", args(json!({"order_id": "T4"}))).await.unwrap();
    assert!(done(&order), "{order:?}");
    let log = proxy.log().await;
    assert!(log.iter().filter(|e| e["rpc"] == "initialize").count() >= 2, "{log:?}");
    assert!(log.iter().filter(|e| e["rpc"] == "tools/list").count() >= 2, "{log:?}");
    // The wrapper knew the tool from the retried tools/list: lookup_order is a read.
    let report = caller.finish().await.unwrap();
    assert!(report.replans == 0 && report.escalation.is_none(), "{report:?}");
}

#[tokio::test]
async fn t4_a_cut_server_discover_probe_is_a_failed_connect_retried_not_a_legacy_server() {
    // A probe that got no answer says nothing of the server's revision: the
    // connect is retried as the policy says, and the retry negotiates 2026-07-28.
    let dir = scratch("t4-discover");
    let (proxy, _ledger) = demo_behind_proxy(&dir).await;
    proxy.faults(json!([{"on": "server/discover", "fault": "cut-before"}])).await;
    let mut caller = connected(McpConnection::http(&proxy.mcp("/mcp")), options()).await;
    let order = caller.call("lookup_order", args(json!({"order_id": "T4D"}))).await.unwrap();
    assert!(done(&order), "{order:?}");
    let log = proxy.log().await;
    assert_eq!(log.iter().filter(|e| e["rpc"] == "server/discover").count(), 2, "{log:?}");
    assert_eq!(log.iter().filter(|e| e["rpc"] == "initialize").count(), 0, "no fall-back to the handshake: {log:?}");
    caller.finish().await.unwrap();
}

#[tokio::test]
async fn t5_a_stdio_server_killed_after_applying_a_keyed_write_is_respawned_and_the_write_resent_once() {
    let dir = scratch("t5");
    let (server, ledger) = demo_over_stdio(&dir);
    let (connection, log) = shim(&dir, json!([{"on": "tools/call", "tool": "issue_refund", "fault": "kill-after"}]), &server);
    let mut caller = connected(connection, options()).await;
    let refund = caller.call("issue_refund", args(json!({"order_id": "T5", "amount_paise": 100}))).await.unwrap();
    assert!(done(&refund), "{refund:?}");
    assert_eq!(refunds(&ledger).len(), 1, "{:?}", ledger_of(&ledger));
    assert_eq!(shim_pids(&log).len(), 2, "one respawn: {:?}", shim_log(&log));
    caller.finish().await.unwrap();
}

#[tokio::test]
async fn t6_an_unkeyed_write_whose_stdio_server_died_is_status_checked_after_the_respawn() {
    let dir = scratch("t6");
    let (server, ledger) = demo_over_stdio(&dir);
    let (connection, log) = shim(&dir, json!([{"on": "tools/call", "tool": "record_note", "fault": "kill-after"}]), &server);
    let mut caller = connected(connection, options()).await.with_status_check("record_note", note_check());
    let note = caller.call("record_note", args(json!({"order_id": "T6", "text": "refund approved"}))).await.unwrap();
    assert!(matches!(&note, ToolAnswer::Done { result: None, note: Some(_) }), "{note:?}");
    assert_eq!(ledger_of(&ledger)["notes"].as_array().unwrap().len(), 1);
    let sent: Vec<_> = shim_log(&log).into_iter().filter(|e| e["tool"] == "record_note").collect();
    assert_eq!(sent.len(), 1, "not resent: {sent:?}");
    caller.finish().await.unwrap();
}

#[tokio::test]
async fn t7_a_stdio_server_that_cannot_start_again_ends_in_an_escalation_saying_so() {
    let dir = scratch("t7");
    let server = [demo_serve(), "--stdio".into()];
    let faults = json!([{"on": "tools/call", "tool": "lookup_order", "fault": "kill-before"}, {"fault": "exit-at-start", "count": 1000}]);
    let (connection, log) = shim(&dir, faults.clone(), &server);
    // The first start is the shim's own: the exit-at-start fault would refuse
    // it too, so the fault file is written after the caller has connected.
    std::fs::write(dir.join("faults.json"), "[]").unwrap();
    let mut caller = connected(connection, options()).await;
    std::fs::write(dir.join("faults.json"), faults.to_string()).unwrap();
    let error = caller.call("lookup_order", args(json!({"order_id": "T7"}))).await.unwrap_err();
    let CallError::Escalated(escalation) = &error else { panic!("{error:?}") };
    assert!(escalation.note.contains("initialize"), "the note names the reconnection: {}", escalation.note);
    assert!(escalation.note.contains("could not reach the MCP server again"), "{}", escalation.note);
    let starts = shim_log(&log).iter().filter(|e| e["fault"] == "exit-at-start").count();
    assert!((1..=10).contains(&starts), "bounded restarts: {starts}");
}

#[tokio::test]
async fn t9_a_call_timeout_stops_a_write_in_flight_and_a_cancelled_backoff_stops_at_once() {
    let dir = scratch("t9");
    let (proxy, _ledger) = demo_behind_proxy(&dir).await;
    let limited = RetryingToolCallerOptions { call_timeout_ms: Some(300), ..options() };
    let mut caller = connected(McpConnection::http(&proxy.mcp("/mcp")), limited).await;
    proxy.faults(json!([{"on": "tools/call", "tool": "issue_refund", "fault": "delay", "delay_ms": 5000}])).await;
    let started = Instant::now();
    let error = caller.call("issue_refund", args(json!({"order_id": "T9", "amount_paise": 100}))).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(2000), "stopped at the limit, not the answer: {:?}", started.elapsed());
    let CallError::TimedOut(stopped) = &error else { panic!("{error:?}") };
    assert_eq!((stopped.cause, stopped.attempts_sent, stopped.may_have_applied), (StopCause::CallTimeout, 1, true), "{stopped:?}");
    // The run was told (contract 0.7.0's abandon-call): the call is closed, its write possibly applied.
    let report = caller.report().unwrap();
    assert_eq!(report.abandoned_calls, 1);
    assert_eq!(report.effects.iter().map(|e| (Some(e.call_id), e.status)).collect::<Vec<_>>(), vec![(stopped.call_id, EffectStatus::Unknown)]);

    // A 503 asking for 2 s: the wrapper waits, and is cancelled while it does.
    let fault = Fault::Http { status: 503, headers: vec![("Retry-After".into(), "2".into())], body: "busy".into() };
    let server = serve_http("127.0.0.1:0".parse().unwrap(), DemoState::new(FaultScript::new(vec![rule_first("lookup_order", 1, fault)]), None)).await.unwrap();
    let mut caller = connected(McpConnection::http(&server.url), options()).await;
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        trigger.cancel();
    });
    let started = Instant::now();
    let error = caller.call_until("lookup_order", args(json!({"order_id": "T9"})), &cancel).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(1200), "{:?}", started.elapsed());
    let CallError::Cancelled(stopped) = &error else { panic!("{error:?}") };
    assert_eq!((stopped.cause, stopped.attempts_sent, stopped.may_have_applied), (StopCause::Cancelled, 1, false), "{stopped:?}");
    // Abandoned during the wait before attempt 2: closed, and nothing on the wire.
    let report = caller.report().unwrap();
    assert_eq!((report.abandoned_calls, report.effects.len()), (1, 0));
    assert_eq!(server.state.calls_to("lookup_order").len(), 1, "not resent after the cancellation");
    server.stop().await;
}

#[tokio::test]
async fn t9_the_run_timeout_counts_from_the_callers_start_and_stops_a_read_in_flight() {
    let dir = scratch("t9-run");
    let (proxy, _ledger) = demo_behind_proxy(&dir).await;
    let limited = RetryingToolCallerOptions { run_timeout_ms: Some(1_000), ..options() };
    let mut caller = connected(McpConnection::http(&proxy.mcp("/mcp")), limited).await;
    let first = caller.call("lookup_order", args(json!({"order_id": "T9"}))).await.unwrap();
    assert!(done(&first), "{first:?}");
    proxy.faults(json!([{"on": "tools/call", "tool": "lookup_order", "fault": "delay", "delay_ms": 5000}])).await;
    let started = Instant::now();
    let error = caller.call("lookup_order", args(json!({"order_id": "T9"}))).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(1_500), "{:?}", started.elapsed());
    let CallError::TimedOut(stopped) = &error else { panic!("{error:?}") };
    assert_eq!((stopped.cause, stopped.may_have_applied), (StopCause::RunTimeout, false), "a read: {stopped:?}");
}

#[tokio::test]
async fn t10_server_everything_restarted_over_http_is_re_initialised() {
    let proxy = Proxy::start(&["node".into(), everything(), "streamableHttp".into()]).await;
    let mut caller = connected(McpConnection::http(&proxy.mcp("/mcp")), options()).await;
    let first = caller.call("echo", args(json!({"message": "one"}))).await.unwrap();
    assert!(done(&first), "{first:?}");
    proxy.control("POST", "restart", "").await;
    let second = caller.call("echo", args(json!({"message": "two"}))).await.unwrap();
    assert!(done(&second), "the 400 'No valid session ID' is not the model's error: {second:?}");
    assert_eq!(proxy.count("initialize").await, 2);
}

#[tokio::test]
async fn t11_server_everything_killed_over_stdio_is_respawned() {
    let dir = scratch("t11");
    let (connection, log) = shim(&dir, json!([{"on": "tools/call", "tool": "echo", "fault": "kill-after"}]), &[everything(), "stdio".into()]);
    let mut caller = connected(connection, options()).await;
    let echo = caller.call("echo", args(json!({"message": "still here"}))).await.unwrap();
    assert!(done(&echo), "{echo:?}");
    assert_eq!(shim_pids(&log).len(), 2, "{:?}", shim_log(&log));
    caller.finish().await.unwrap();
}

#[tokio::test]
async fn t12_server_everything_answer_cut_mid_stream_is_seen_at_once() {
    let proxy = Proxy::start(&["node".into(), everything(), "streamableHttp".into()]).await;
    let mut caller = connected(McpConnection::http(&proxy.mcp("/mcp")), options()).await;
    proxy.faults(json!([{"on": "tools/call", "tool": "echo", "fault": "cut-during"}])).await;
    let started = Instant::now();
    let echo = caller.call("echo", args(json!({"message": "cut"}))).await.unwrap();
    assert!(done(&echo), "{echo:?}");
    assert!(started.elapsed() < Duration::from_millis(ATTEMPT_TIMEOUT_MS / 2), "{:?}", started.elapsed());
}
