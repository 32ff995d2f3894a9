//! Runs share one connection (issue 25, "Rust ergonomics"): two concurrent
//! runs, each with its own caller and report, over one stdio demo server
//! process. The test binary is its own server: started with `--serve-demo
//! COUNT_FILE`, it notes its start in the file and serves the demo over stdio
//! (so the test has no harness: libtest would write to the server's stdout).

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use agent_retry_demo_server::{DemoServer, DemoState, FaultScript};
use agent_retry_host::mcp::{McpConnection, Metrics, RetryingToolCallerOptions, SharedConnection, ToolAnswer};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};
use rmcp::ServiceExt;
use serde_json::json;

const SERVE: &str = "--serve-demo";

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == SERVE) {
        Some(i) => serve_demo(Path::new(&args[i + 1])).await,
        None => {
            two_concurrent_runs_share_one_stdio_server_process().await;
            println!("test two_concurrent_runs_share_one_stdio_server_process ... ok");
        }
    }
}

/// The demo server over stdio, its start noted in `count`.
async fn serve_demo(count: &Path) {
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(count).unwrap();
    writeln!(file, "started {}", std::process::id()).unwrap();
    let service = DemoServer::new(DemoState::new(FaultScript::default(), None)).serve(rmcp::transport::stdio()).await.unwrap();
    let _ = service.waiting().await;
}

async fn two_concurrent_runs_share_one_stdio_server_process() {
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
