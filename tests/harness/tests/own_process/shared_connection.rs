//! Runs share one connection (issue 25, "Rust ergonomics"): two concurrent
//! runs, each with its own caller and report, over one stdio demo server
//! process; a run whose request failed on an old session leaves the new one
//! (which the other runs use) alone; a closed connection stays closed. The
//! test binary is its own stdio server: started with `--serve-demo
//! COUNT_FILE`, it notes its start in the file and serves the demo over stdio.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use agent_retry_demo_server::http::serve_http;
use agent_retry_demo_server::{DemoServer, DemoState, FaultScript};
use agent_retry_host::mcp::{CallError, McpConnection, Metrics, RetryingToolCaller, RetryingToolCallerOptions, SharedConnection, ToolAnswer};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};
use rmcp::ServiceExt;
use serde_json::json;

pub const SERVE: &str = "--serve-demo";

/// The demo server over stdio, its start noted in `count`.
pub async fn serve_demo(count: &Path) {
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(count).unwrap();
    writeln!(file, "started {}", std::process::id()).unwrap();
    let service = DemoServer::new(DemoState::new(FaultScript::default(), None)).serve(rmcp::transport::stdio()).await.unwrap();
    let _ = service.waiting().await;
}

pub async fn two_concurrent_runs_share_one_stdio_server_process() {
    let dir = std::env::temp_dir().join(format!("agent-retry-shared-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let count = dir.join("starts.txt");
    let _ = std::fs::remove_file(&count);
    let me = std::env::current_exe().unwrap().display().to_string();
    let shared = SharedConnection::new(McpConnection::stdio(&me, &[SERVE.into(), count.display().to_string()])).unwrap();

    let component = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    let run = |run_id: &'static str, calls: usize| {
        let shared = Arc::clone(&shared);
        let instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(1))).unwrap();
        async move {
            let metrics = Arc::new(Metrics::new());
            let mut caller =
                shared.caller_for_run(instance, "{}", run_id, RetryingToolCallerOptions::default(), Arc::clone(&metrics)).await.expect("the run starts");
            for n in 0..calls {
                let order = json!({"order_id": format!("ORD-{n}")}).as_object().cloned().unwrap();
                let answer = caller.call("lookup_order", order).await.expect("the call succeeds");
                assert!(matches!(answer, ToolAnswer::Done { .. }), "{answer:?}");
            }
            (caller.finish().await.expect("the run's report"), metrics.snapshot().attempts)
        }
    };
    let ((report_a, sent_a), (report_b, sent_b)) = tokio::join!(run("run-a", 2), run("run-b", 1));
    shared.close().await;

    // Each run has its own report and counts, with its own tool calls.
    assert_eq!((report_a.run_id.as_str(), sent_a), ("run-a", 2), "{report_a:?}");
    assert_eq!((report_b.run_id.as_str(), sent_b), ("run-b", 1), "{report_b:?}");
    assert!(report_a.succeeded_calls >= 3 && report_b.succeeded_calls >= 2, "each run lists the tools and makes its calls: {report_a:?} {report_b:?}");
    // One server process served both.
    let starts = std::fs::read_to_string(&count).unwrap_or_default();
    assert_eq!(starts.lines().count(), 1, "one stdio server process for both runs: {starts:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A caller for `run_id` over `shared`, with short backoffs and at most
/// `reconnects` new sessions of its own; its metrics.
async fn caller(shared: &Arc<SharedConnection>, run_id: &str, reconnects: u32) -> anyhow::Result<(RetryingToolCaller, Arc<Metrics>)> {
    let component = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    let instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(1))).unwrap();
    let config = r#"{"base-delay-ms": 1, "max-delay-ms": 5}"#;
    let options = RetryingToolCallerOptions { attempt_timeout_ms: Some(20_000), max_reconnects_per_run: reconnects, ..Default::default() };
    let metrics = Arc::new(Metrics::new());
    let caller = shared.caller_for_run(instance, config, run_id, options, Arc::clone(&metrics)).await?;
    Ok((caller, metrics))
}

fn order(id: &str) -> serde_json::Map<String, serde_json::Value> {
    json!({"order_id": id}).as_object().cloned().unwrap()
}

/// Run A's call is in flight on session 1 when run B's call is cut and B
/// sets session 2 up, which ends session 1 and A's request with it. A's
/// request is sent again on session 2, which stays up for B; A's one
/// allowed reconnection is still there for its own cut call later. (That a
/// failure marks only its own session lost is checked on `McpConnection`
/// itself, connect.rs: here A's failure arrives before session 2 is up.)
pub async fn a_failure_on_an_old_session_leaves_the_new_one_alone() {
    let faults = FaultScript::from_json(
        r#"[{"tool": "lookup_order", "when": {"order_id": "ORD-SLOW"}, "call": 1, "fault": {"kind": "timeout-after-apply", "delay-ms": 4000}},
            {"tool": "lookup_order", "when": {"order_id": "ORD-CUT"}, "call": 1, "fault": {"kind": "drop"}},
            {"tool": "lookup_order", "when": {"order_id": "ORD-CUT-A"}, "call": 1, "fault": {"kind": "drop"}}]"#,
    )
    .unwrap();
    let server = serve_http("127.0.0.1:0".parse().unwrap(), DemoState::new(faults, None)).await.unwrap();
    let shared = SharedConnection::new(McpConnection::http(&server.url)).unwrap();
    let (mut a, metrics_a) = caller(&shared, "run-a", 1).await.expect("run A starts");
    let (mut b, _) = caller(&shared, "run-b", 3).await.expect("run B starts");
    assert_eq!(shared.sessions(), 1, "both runs start on one session");
    let slow = async { a.call("lookup_order", order("ORD-SLOW")).await };
    let cut = async {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        b.call("lookup_order", order("ORD-CUT")).await
    };
    let (slow, cut) = tokio::join!(slow, cut);
    assert!(matches!(cut, Ok(ToolAnswer::Done { .. })), "B's cut call is retried on a new session: {cut:?}");
    assert!(matches!(slow, Ok(ToolAnswer::Done { .. })), "A's call gets its answer: {slow:?}");
    assert_eq!(metrics_a.snapshot().attempts, 2, "A's request died with session 1 and was sent again");
    assert_eq!(shared.sessions(), 2, "one new session, set up by B; A's failure on the old one set up none");
    // B's next call goes on the session B set up: nobody marked it lost.
    let again = b.call("lookup_order", order("ORD-1")).await;
    assert!(matches!(again, Ok(ToolAnswer::Done { .. })), "{again:?}");
    assert_eq!(shared.sessions(), 2);
    // A's own cut call takes A's one reconnection: B's was not charged to A.
    let own = a.call("lookup_order", order("ORD-CUT-A")).await;
    assert!(matches!(own, Ok(ToolAnswer::Done { .. })), "A still has its reconnection: {own:?}");
    assert_eq!(shared.sessions(), 3);
    let (report_a, report_b) = (a.finish().await.unwrap(), b.finish().await.unwrap());
    assert_eq!((report_a.escalation, report_b.escalation), (None, None), "{report_a:?} {report_b:?}");
    shared.close().await;
    server.stop().await;
}

/// After `close`, a run that needs a session gets none: its connect is not
/// sent, which the policy escalates (it used to start a new session).
pub async fn a_closed_connection_stays_closed() {
    let server = serve_http("127.0.0.1:0".parse().unwrap(), DemoState::new(FaultScript::default(), None)).await.unwrap();
    let shared = SharedConnection::new(McpConnection::http(&server.url)).unwrap();
    let (mut a, _) = caller(&shared, "run-a", 3).await.expect("run A starts");
    shared.close().await;
    let after = a.call("lookup_order", order("ORD-1")).await;
    assert!(matches!(after, Err(CallError::Escalated(_))), "a call after close is not sent: {after:?}");
    let late = caller(&shared, "run-late", 3).await;
    let refused = late.err().and_then(|e| e.downcast::<CallError>().ok());
    assert!(matches!(refused, Some(CallError::Escalated(ref e)) if e.note.contains("closed")), "a run started after close gets no session: {refused:?}");
    assert_eq!(shared.sessions(), 1, "no session was set up after close");
    server.stop().await;
}

/// The pid of the newest stdio server started (its line in `count`).
fn newest_server(count: &Path) -> i32 {
    let starts = std::fs::read_to_string(count).unwrap();
    starts.lines().last().and_then(|l| l.strip_prefix("started ")).and_then(|pid| pid.parse().ok()).expect("a started server")
}

/// Kills the newest stdio server and waits until it is gone.
async fn kill_server(count: &Path) {
    let pid = newest_server(count);
    std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    while std::path::Path::new(&format!("/proc/{pid}")).exists() && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ") {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Two runs, each allowed one reconnection of its own, over one stdio server
/// that dies twice. The first time both runs find the session lost at once:
/// one sets the next up, the other waits for it and is not charged. The
/// second time one of them still has its reconnection, so at most one run
/// escalates. (A run used to be charged for the session another run set
/// up: both had spent theirs after the first death, and both escalated.)
pub async fn a_run_is_charged_only_for_the_sessions_it_set_up() {
    let dir = std::env::temp_dir().join(format!("agent-retry-charged-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let count = dir.join("starts.txt");
    let _ = std::fs::remove_file(&count);
    let me = std::env::current_exe().unwrap().display().to_string();
    let shared = SharedConnection::new(McpConnection::stdio(&me, &[SERVE.into(), count.display().to_string()])).unwrap();
    let (mut a, _) = caller(&shared, "run-a", 1).await.expect("run A starts");
    let (mut b, _) = caller(&shared, "run-b", 1).await.expect("run B starts");

    kill_server(&count).await;
    let (first_a, first_b) = tokio::join!(a.call("lookup_order", order("ORD-1")), b.call("lookup_order", order("ORD-2")));
    assert!(matches!(first_a, Ok(ToolAnswer::Done { .. })) && matches!(first_b, Ok(ToolAnswer::Done { .. })), "{first_a:?} {first_b:?}");
    assert_eq!(shared.sessions(), 2, "one new session for both runs");

    kill_server(&count).await;
    let second_a = a.call("lookup_order", order("ORD-3")).await;
    let second_b = b.call("lookup_order", order("ORD-4")).await;
    let escalated = [&second_a, &second_b].iter().filter(|r| matches!(r, Err(CallError::Escalated(_)))).count();
    assert!(escalated <= 1, "the run that did not set session 2 up still has its reconnection: {second_a:?} {second_b:?}");
    assert_eq!(shared.sessions(), 3, "{second_a:?} {second_b:?}");
    shared.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}
