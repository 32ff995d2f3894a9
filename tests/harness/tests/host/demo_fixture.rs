//! The demo server's fault script as a test fixture (issue 25: "usable as a
//! fixture from pytest, node:test and cargo tests"): `testing::DemoServer`
//! starts `agent-retry serve` with a script, and the wrapper gets through it.

use std::path::PathBuf;
use std::sync::Arc;

use agent_retry_host::mcp::{McpConnection, Metrics, RetryingToolCaller, RetryingToolCallerOptions, ToolAnswer};
use agent_retry_host::testing::DemoServer;
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};
use serde_json::json;

/// The workspace's `agent-retry` (built by `cargo test --workspace` beside this test).
fn binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().and_then(|deps| deps.parent()).unwrap().join("agent-retry");
    assert!(bin.exists(), "{} is missing: cargo build --release -p agent-retry-cli", bin.display());
    bin
}

#[tokio::test]
async fn a_scripted_503_is_retried_through_the_fixture() {
    let faults = r#"[{"tool": "lookup_order", "call": 1, "fault": {"kind": "http", "status": 503}}]"#;
    let server = DemoServer::start_with(&binary(), faults, &[]).unwrap();
    assert!(server.url().starts_with("http://127.0.0.1:") && server.url().ends_with("/mcp"), "{}", server.url());
    let component = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    let instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(1))).unwrap();
    let options = RetryingToolCallerOptions { attempt_timeout_ms: Some(4000), ..Default::default() };
    let mut caller = RetryingToolCaller::connect(
        McpConnection::http(server.url()),
        instance,
        r#"{"base-delay-ms": 1, "max-delay-ms": 5}"#,
        "run-fixture",
        options,
        Arc::new(Metrics::new()),
    )
    .await
    .unwrap();
    let args = json!({"order_id": "ORD-1"}).as_object().cloned().unwrap();
    let answer = caller.call("lookup_order", args).await.unwrap();
    assert!(matches!(answer, ToolAnswer::Done { .. }), "{answer:?}");
    let report = caller.finish().await.unwrap();
    assert_eq!(report.retries, 1, "the scripted 503 was retried once: {report:?}");
}

#[test]
fn a_bad_script_or_binary_is_a_clear_error() {
    let refused = DemoServer::start_with(&binary(), "{not json", &[]).unwrap_err();
    assert!(refused.to_string().contains("exited before serving"), "{refused}");
    let missing = DemoServer::start_with(std::path::Path::new("/nonexistent/agent-retry"), "", &[]).unwrap_err();
    assert_eq!(missing.kind(), std::io::ErrorKind::NotFound, "{missing}");
}
