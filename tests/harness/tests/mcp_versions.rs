//! Which servers the Rust wrapper reaches (issue 22's urgent half): it
//! negotiates its MCP revision (2026-07-28 through `server/discover`, else the
//! 2025-11-25 handshake), reaches https:// servers through rustls, and refuses
//! a URL it cannot serve as a configuration error. Against the demo server in
//! each era (modern-only refuses `initialize` with HTTP 400 and −32022), over
//! https with a CA made by the test, and against the legacy
//! `@modelcontextprotocol/server-everything` (installed by `make fault-proxy-setup`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_retry_demo_server::{DemoState, Era, FaultScript, HttpOptions, TestAuthority, serve_http_options};
use agent_retry_host::mcp::{CallError, ConnectionConfigError, McpConnection, Metrics, RetryingToolCaller, RetryingToolCallerOptions, ToolAnswer};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};
use serde_json::{Map, Value, json};

mod common;
use common::Captured;

const CONFIG: &str = r#"{"base-delay-ms": 20, "max-delay-ms": 50}"#;

fn instance() -> agent_retry_host::PolicyInstance {
    let component = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(22))).unwrap()
}

fn options() -> RetryingToolCallerOptions {
    RetryingToolCallerOptions { attempt_timeout_ms: 10_000, ..Default::default() }
}

async fn connect(connection: McpConnection) -> anyhow::Result<RetryingToolCaller> {
    RetryingToolCaller::connect(connection, instance(), CONFIG, "run-versions", options(), Arc::new(Metrics::new())).await
}

fn order(id: &str) -> Map<String, Value> {
    json!({"order_id": id}).as_object().cloned().unwrap()
}

async fn demo(era: Era, sessions: bool, tls: Option<TestAuthority>) -> agent_retry_demo_server::HttpServer {
    let state = DemoState::new(FaultScript::default(), None);
    serve_http_options("127.0.0.1:0".parse().unwrap(), state, HttpOptions { sessions, era, tls }).await.unwrap()
}

/// Looks an order up through the wrapper and says it came back done.
async fn looks_up(connection: McpConnection) {
    let mut caller = connect(connection).await.expect("connected");
    let answer = caller.call("lookup_order", order("A1")).await.expect("a lookup through the wrapper");
    let ToolAnswer::Done { result: Some(result), .. } = answer else { panic!("the lookup did not come back done: {answer:?}") };
    assert_ne!(result.is_error, Some(true), "{result:?}");
    caller.finish().await.unwrap();
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[tokio::test]
async fn a_modern_only_server_is_reached_without_a_handshake() {
    let server = demo(Era::Modern, false, None).await;
    looks_up(McpConnection::http(&server.url)).await;
    assert_eq!(server.state.calls_to("lookup_order").len(), 1, "the server ran the lookup once");
    server.stop().await;
}

#[tokio::test]
async fn the_handshake_alone_cannot_reach_a_modern_only_server() {
    // The gate the test above passes is real: a client that only does the
    // 2025-11-25 handshake is refused (HTTP 400, −32022), and the run stops.
    let server = demo(Era::Modern, false, None).await;
    let refused = connect(McpConnection::http(&server.url).with_lifecycle(rmcp::ClientLifecycleMode::Initialize)).await;
    let error = refused.err().expect("the handshake is refused");
    // As in the Python and Node wrappers: the host reports HTTP 400 and its
    // body, the policy replans the `initialize` pseudo-call, and the run stops.
    let Some(CallError::SessionLost(text)) = error.downcast_ref::<CallError>() else { panic!("not SessionLost: {error:#}") };
    assert!(text.contains("-32022") && text.contains(r#""supported":["2026-07-28"]"#), "the refusal names the server's answer: {text}");
    server.stop().await;
}

#[tokio::test]
async fn a_dual_era_server_is_reached_stateless_and_with_sessions() {
    for sessions in [false, true] {
        let server = demo(Era::Dual, sessions, None).await;
        looks_up(McpConnection::http(&server.url)).await;
        server.stop().await;
    }
}

#[tokio::test]
async fn a_legacy_server_over_stdio_is_reached_through_the_handshake() {
    let everything = root().join("tests/fault-proxy/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(everything.exists(), "{} is missing: run `make fault-proxy-setup`", everything.display());
    let connection = McpConnection::stdio("node", &[everything.display().to_string(), "stdio".into()]);
    let mut caller = connect(connection).await.expect("connected to server-everything");
    let answer = caller.call("echo", json!({"message": "hi"}).as_object().cloned().unwrap()).await.unwrap();
    let ToolAnswer::Done { result: Some(result), .. } = answer else { panic!("echo did not come back done: {answer:?}") };
    assert!(format!("{:?}", result.content).contains("hi"), "{result:?}");
    caller.finish().await.unwrap();
}

#[tokio::test]
async fn an_https_server_with_a_private_ca_is_reached_when_its_ca_is_trusted() {
    let authority = TestAuthority::generate().unwrap();
    let ca_pem = authority.ca_pem.clone();
    let server = demo(Era::Modern, false, Some(authority)).await;
    assert!(server.url.starts_with("https://"), "{}", server.url);
    looks_up(McpConnection::try_http(&server.url).unwrap().with_root_certificates_pem(ca_pem.as_bytes()).unwrap()).await;
    server.stop().await;
}

#[tokio::test]
async fn an_untrusted_certificate_escalates_at_once_and_is_not_retried() {
    let captured = Captured::default();
    let _guard = tracing::subscriber::set_default(captured.subscriber());
    let server = demo(Era::Modern, false, Some(TestAuthority::generate().unwrap())).await;
    let refused = connect(McpConnection::http(&server.url)).await.err().expect("an untrusted certificate does not connect");
    let Some(CallError::Escalated(escalation)) = refused.downcast_ref::<CallError>() else { panic!("not an escalation: {refused:#}") };
    assert!(escalation.note.contains("TLS"), "the note says it was TLS: {}", escalation.note);
    assert!(escalation.note.to_lowercase().contains("certificate"), "and what about it: {}", escalation.note);
    let attempts: Vec<(Value, Value, Value)> = captured.attempts().iter().map(|a| (a["tool"].clone(), a["outcome"].clone(), a["action"].clone())).collect();
    assert_eq!(attempts, vec![(json!("initialize"), json!("other"), json!("escalate"))], "one attempt, not retried");
    server.stop().await;
}

#[tokio::test]
async fn a_url_the_wrapper_cannot_serve_is_a_configuration_error_before_anything_is_sent() {
    for url in ["ftp://127.0.0.1:21/mcp", "ws://127.0.0.1:1/mcp", "127.0.0.1:8080/mcp", "not a url"] {
        let error = McpConnection::try_http(url).err().unwrap_or_else(|| panic!("{url} was accepted"));
        assert_eq!((error.option, error.url.as_str()), ("url", url));
        // Through the caller too: a ConnectionConfigError, not an escalation.
        let through_caller = connect(McpConnection::http(url)).await.err().expect("refused");
        let config_error = through_caller.downcast_ref::<ConnectionConfigError>().unwrap_or_else(|| panic!("{url}: {through_caller:#}"));
        assert_eq!(config_error, &error);
    }
    let ftp = McpConnection::try_http("ftp://127.0.0.1:21/mcp").err().unwrap();
    assert!(ftp.reason.contains("'ftp'"), "the reason names the scheme: {ftp}");
    let pem = McpConnection::http("https://127.0.0.1:1/mcp").with_root_certificates_pem(b"not pem").err().expect("bad PEM is refused");
    assert_eq!(pem.option, "root_certificates_pem");
    assert!(pem.reason.contains("no certificate") || pem.reason.contains("PEM"), "{pem}");
}

#[tokio::test]
async fn a_discovery_that_lists_only_the_handshakes_revision_gets_the_handshake() {
    // A 2025-11-25 server that answers the probe (go-sdk's stateful servers):
    // the wrapper must not speak 2025-11-25 without `initialize`.
    let server = demo(Era::Handshake, true, None).await;
    looks_up(McpConnection::http(&server.url)).await;
    server.stop().await;
}

async fn demo_with_faults(rules: Value) -> agent_retry_demo_server::HttpServer {
    let faults = FaultScript::from_json(&rules.to_string()).unwrap();
    let state = DemoState::new(faults, None);
    serve_http_options("127.0.0.1:0".parse().unwrap(), state, HttpOptions { sessions: true, era: Era::Dual, tls: None }).await.unwrap()
}

#[tokio::test]
async fn a_probe_answered_429_is_the_connects_failure_with_its_hint_not_a_legacy_server() {
    let captured = Captured::default();
    let _guard = tracing::subscriber::set_default(captured.subscriber());
    let server = demo_with_faults(json!([{"tool": "server/discover", "call": 1,
        "fault": {"kind": "http", "status": 429, "headers": [["retry-after", "1"]], "body": "slow down"}}]))
    .await;
    let started = std::time::Instant::now();
    looks_up(McpConnection::http(&server.url)).await;
    let first = &captured.attempts()[0];
    assert_eq!((first["tool"].as_str(), first["outcome"].as_str(), first["action"].as_str()), (Some("initialize"), Some("429"), Some("retry")), "{first:?}");
    assert!(started.elapsed() >= std::time::Duration::from_millis(1000), "the server's hint was waited");
    server.stop().await;
}

#[tokio::test]
async fn a_probe_answered_403_escalates_and_one_answered_404_is_a_legacy_server() {
    let server = demo_with_faults(json!([{"tool": "server/discover", "fault": {"kind": "http", "status": 403, "body": "no"}}])).await;
    let refused = connect(McpConnection::http(&server.url)).await.err().expect("a 403 to the probe stops the run");
    let Some(CallError::Escalated(escalation)) = refused.downcast_ref::<CallError>() else { panic!("not an escalation: {refused:#}") };
    assert_eq!(agent_retry_host::labels::reason(escalation.reason), "permission-denied");
    server.stop().await;
    // A 404 says the server does not know the method: the handshake follows.
    let server = demo_with_faults(json!([{"tool": "server/discover", "fault": {"kind": "http", "status": 404, "body": "not found"}}])).await;
    looks_up(McpConnection::http(&server.url)).await;
    server.stop().await;
}
