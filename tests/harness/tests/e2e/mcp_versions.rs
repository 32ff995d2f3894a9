//! Which servers the Rust wrapper reaches (issue 22's urgent half): it
//! negotiates its MCP revision (2026-07-28 through `server/discover`, else the
//! 2025-11-25 handshake), reaches https:// servers through rustls, and refuses
//! a URL it cannot serve as a configuration error. Against the demo server in
//! each era (modern-only refuses `initialize` with HTTP 400 and −32022), over
//! https with a CA made by the test, and against the legacy
//! `@modelcontextprotocol/server-everything` (installed by `make fault-proxy-setup`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use agent_retry_host::labels;

use agent_retry_demo_server::{DemoState, Era, FaultScript, HttpOptions, TestAuthority, serve_http_options};
use agent_retry_host::mcp::{CallError, ConnectionConfigError, McpConnection, Metrics, RetryingToolCaller, RetryingToolCallerOptions, ToolAnswer};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};
use serde_json::{Map, Value, json};

const CONFIG: &str = r#"{"base-delay-ms": 20, "max-delay-ms": 50}"#;

fn instance() -> agent_retry_host::PolicyInstance {
    let component = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(22))).unwrap()
}

fn options() -> RetryingToolCallerOptions {
    RetryingToolCallerOptions { attempt_timeout_ms: Some(10_000), ..Default::default() }
}

async fn connect(connection: McpConnection) -> anyhow::Result<RetryingToolCaller> {
    RetryingToolCaller::connect(connection, instance(), CONFIG, "run-versions", options(), Arc::new(Metrics::new())).await
}

/// Every verdict the wrapper acted on: (tool, attempt, action, rule, reconnect).
type Seen = Vec<(String, u32, String, String, bool)>;

/// [`connect`], with every verdict the wrapper acted on (its `on_verdict` hook).
async fn connect_seeing(connection: McpConnection) -> (anyhow::Result<RetryingToolCaller>, Seen) {
    let mut policy = instance();
    let rules = policy.rule_names().unwrap();
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let hook = Arc::clone(&seen);
    let options = options().on_verdict(move |tool, attempt, verdict| {
        let action = labels::action(verdict.action);
        let rule = rules[usize::from(verdict.rule_index)].clone();
        hook.lock().unwrap().push((tool.to_string(), attempt, action.to_string(), rule, verdict.reconnect));
    });
    let connected = RetryingToolCaller::connect(connection, policy, CONFIG, "run-versions", options, Arc::new(Metrics::new())).await;
    let seen = seen.lock().unwrap().clone();
    (connected, seen)
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
    let (refused, seen) = connect_seeing(McpConnection::http(&server.url).with_lifecycle(rmcp::ClientLifecycleMode::Initialize)).await;
    let error = refused.err().expect("the handshake is refused");
    // As in the Python and Node wrappers: the host reports the HTTP 400 as it
    // came; the policy reads the −32022 in it (rule version-mismatch): a new
    // session, negotiating again, then, refused again, an escalation (the two
    // share no revision) whose note carries the server's answer.
    let Some(CallError::Escalated(escalation)) = error.downcast_ref::<CallError>() else { panic!("not an escalation: {error:#}") };
    assert_eq!(agent_retry_host::labels::reason(escalation.reason), "protocol-version-unsupported", "{}", escalation.note);
    let note = &escalation.note;
    assert!(note.contains("-32022") && note.contains(r#""supported":["2026-07-28"]"#), "the note carries the server's answer: {note}");
    let expected = [("initialize", 1, "retry", "version-mismatch", true), ("initialize", 2, "escalate", "version-mismatch", false)];
    assert_eq!(seen, expected.map(|(t, a, act, rule, r)| (t.to_string(), a, act.to_string(), rule.to_string(), r)).to_vec());
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
    // Seen through the wrapper's `on_verdict` hook, not its log lines: tests of
    // one binary that capture logs on their own threads lose lines to each
    // other (tracing caches a callsite's interest process-wide).
    let server = demo(Era::Modern, false, Some(TestAuthority::generate().unwrap())).await;
    let (connected, seen) = connect_seeing(McpConnection::http(&server.url)).await;
    let refused = connected.err().expect("an untrusted certificate does not connect");
    let Some(CallError::Escalated(escalation)) = refused.downcast_ref::<CallError>() else { panic!("not an escalation: {refused:#}") };
    assert_eq!(agent_retry_host::labels::reason(escalation.reason), "connection-misconfigured");
    assert!(escalation.note.contains("TLS"), "the note says it was TLS: {}", escalation.note);
    assert!(escalation.note.to_lowercase().contains("certificate"), "and what about it: {}", escalation.note);
    let one = ("initialize".to_string(), 1, "escalate".to_string(), "transport".to_string(), false);
    assert_eq!(seen, vec![one], "one attempt, not retried");
    server.stop().await;
}

/// A server that completes the TLS handshake, reads the request, then writes
/// a record the client cannot decrypt (python3's ssl; a certificate made by
/// the demo server's test CA): a TLS error after the request was written.
const TLS_GARBAGE_SERVER: &str = r#"
import os, socket, ssl, sys, time
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain(sys.argv[1], sys.argv[2])
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(8)
print(srv.getsockname()[1], flush=True)
while True:
    c, _ = srv.accept()
    try:
        s = ctx.wrap_socket(c, server_side=True)
        data = b""
        while b"\r\n\r\n" not in data:
            data += s.recv(65536)
        os.write(s.fileno(), b"\x17\x03\x03\x00\x20" + b"\x00" * 32)
        time.sleep(0.2); c.close()
    except Exception:
        c.close()
"#;

/// Finding M4: a TLS error on a connection already set up, once the request
/// was written, is the connection breaking (`connection-reset`, retried as
/// transient), not a TLS failure (`tls`, "not sent", escalated at once as
/// misconfigured): only a failure while connecting is that.
#[tokio::test]
async fn a_tls_error_after_the_request_was_written_is_a_reset_not_a_tls_failure() {
    use std::io::BufRead;
    let dir = std::env::temp_dir().join(format!("agent-retry-tls-garbage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    // The demo server's test CA (rcgen): no `openssl` on the machine needed.
    let authority = TestAuthority::generate().unwrap();
    std::fs::write(&cert, &authority.server_cert_pem).unwrap();
    std::fs::write(&key, &authority.server_key_pem).unwrap();
    let mut server = std::process::Command::new("python3")
        .arg("-c")
        .arg(TLS_GARBAGE_SERVER)
        .arg(&cert)
        .arg(&key)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 is needed");
    let mut port = String::new();
    std::io::BufReader::new(server.stdout.take().unwrap()).read_line(&mut port).unwrap();
    let url = format!("https://127.0.0.1:{}/mcp", port.trim());
    let connection = McpConnection::try_http(&url).unwrap().with_root_certificates_pem(authority.ca_pem.as_bytes()).unwrap();
    let (refused, seen) = connect_seeing(connection).await;
    server.kill().unwrap();
    let _ = server.wait();
    let refused = refused.err().expect("no MCP answer ever comes");
    // A `tls` observation is misconfigured and escalated at once; a reset is
    // transient and retried.
    assert_eq!(seen[0], ("initialize".to_string(), 1, "retry".to_string(), "transport".to_string(), false), "{seen:?}");
    assert!(seen.len() > 1, "retried: {seen:?}");
    let Some(CallError::Escalated(escalation)) = refused.downcast_ref::<CallError>() else { panic!("not an escalation: {refused:#}") };
    assert_ne!(agent_retry_host::labels::reason(escalation.reason), "connection-misconfigured", "{}", escalation.note);
}

/// A name that does not resolve is observed as `name-resolution` (not
/// `connection-refused`, which is retried): escalated at once as misconfigured.
#[tokio::test]
async fn a_name_that_does_not_resolve_escalates_at_once_and_is_not_retried() {
    let (refused, seen) = connect_seeing(McpConnection::http("http://agent-retry-no-such-host.invalid:8080/mcp")).await;
    let refused = refused.err().expect("no such name");
    let Some(CallError::Escalated(escalation)) = refused.downcast_ref::<CallError>() else { panic!("not an escalation: {refused:#}") };
    assert_eq!(agent_retry_host::labels::reason(escalation.reason), "connection-misconfigured", "{}", escalation.note);
    let acted: Vec<(&str, u32, &str)> = seen.iter().map(|(tool, attempt, action, ..)| (tool.as_str(), *attempt, action.as_str())).collect();
    assert_eq!(acted, vec![("initialize", 1, "escalate")], "one attempt, not retried");
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
    let server = demo_with_faults(json!([{"tool": "server/discover", "call": 1,
        "fault": {"kind": "http", "status": 429, "headers": [["retry-after", "1"]], "body": "slow down"}}]))
    .await;
    let started = std::time::Instant::now();
    let (connected, seen) = connect_seeing(McpConnection::http(&server.url)).await;
    let mut caller = connected.expect("connected after the wait");
    assert_eq!(seen[0], ("initialize".to_string(), 1, "retry".to_string(), "http-status".to_string(), false), "{seen:?}");
    assert!(started.elapsed() >= std::time::Duration::from_millis(1000), "the server's hint was waited");
    let answer = caller.call("lookup_order", order("A1")).await.expect("a lookup through the wrapper");
    assert!(matches!(answer, ToolAnswer::Done { .. }), "{answer:?}");
    caller.finish().await.unwrap();
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
