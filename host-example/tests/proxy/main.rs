//! `agent-retry proxy` driven as an agent host drives it: rmcp's client starts
//! it as a stdio child, or connects to its HTTP URL, and calls tools. The
//! demo server runs in this process, so that what it received is read directly.

// The config snippets of docs/proxy.md, in this binary: each test binary
// compiles rmcp's client again (about 50 s of a CI core).
mod docs;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agent_retry_demo_server::{DemoState, Era, FaultScript, HttpOptions, HttpServer, serve_http, serve_http_options};
use agent_retry_harness::RedisServer;
use agent_retry_host::mcp::connect::McpClient;
use agent_retry_host::mcp::connect_http;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult, ClientConfig};
use rmcp::transport::TokioChildProcess;
use serde_json::{Map, Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_agent-retry");

/// What each client sees, and what the server does, for the four kinds of failure.
const FAULTS: &str = r#"[
  {"tool": "lookup_order", "when": {"order_id": "P-503"}, "call": 1, "fault": {"kind": "http", "status": 503}},
  {"tool": "lookup_order", "when": {"order_id": "P-400"}, "fault": {"kind": "http", "status": 400, "body": "invalid argument order_id"}},
  {"tool": "issue_refund", "when": {"order_id": "P-403"}, "fault": {"kind": "http", "status": 403, "body": "forbidden: needs approval"}},
  {"tool": "issue_refund", "when": {"order_id": "P-TIMEOUT"}, "call": 1, "fault": {"kind": "timeout-after-apply", "delay-ms": 1500}}
]"#;

/// Short waits, so that the tests do not sleep through real backoff.
const POLICY: &str = r#"{"base-delay-ms": 20, "max-delay-ms": 100}"#;

struct Files {
    dir: PathBuf,
}

impl Files {
    fn new(name: &str) -> Files {
        let dir = std::env::temp_dir().join(format!("agent-retry-proxy-test-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Files { dir }
    }

    fn write(&self, name: &str, text: &str) -> String {
        let path = self.dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().into_owned()
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn demo(faults: &str) -> HttpServer {
    let state = DemoState::new(FaultScript::from_json(faults).unwrap(), None);
    serve_http("127.0.0.1:0".parse().unwrap(), state).await.unwrap()
}

/// The proxy's arguments in front of `upstream`, with the test's policy and settings.
fn proxy_args(files: &Files, upstream: &str, settings: &str, extra: &[&str]) -> Vec<String> {
    let config = files.write("policy.json", POLICY);
    let settings = files.write("settings.json", settings);
    let mut args: Vec<String> = ["proxy", "--config", &config, "--settings", &settings, "--watch-ms", "0", "--upstream", upstream].map(String::from).to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// A proxy serving HTTP: the process and its URL (read from its stderr; with
/// `--servers`, `urls` has one per server).
struct HttpProxy {
    child: Child,
    url: String,
    urls: Vec<String>,
}

impl HttpProxy {
    fn start(args: &[String]) -> HttpProxy {
        // `--listen` before the arguments: a stdio upstream's command ends them.
        let mut child = Command::new(BIN)
            .arg(&args[0])
            .args(["--listen", "127.0.0.1:0"])
            .args(&args[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        let urls: Vec<String> = loop {
            line.clear();
            assert!(stderr.read_line(&mut line).unwrap() > 0, "the proxy ended before it listened");
            if let Some(rest) = line.split("agent-retry proxy at ").nth(1) {
                break rest.split_whitespace().filter(|w| w.starts_with("http")).map(String::from).collect();
            }
        };
        // Keeps reading, so that the log never fills the pipe.
        std::thread::spawn(move || for _ in stderr.lines() {});
        HttpProxy { child, url: urls[0].clone(), urls }
    }

    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for HttpProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The proxy as an agent host starts it: a stdio child (its log, on stderr, dropped).
async fn connect_stdio(program: &str, args: &[String]) -> anyhow::Result<McpClient> {
    let mut command = tokio::process::Command::new(program);
    command.args(args);
    let (transport, _) = TokioChildProcess::builder(command).stderr(Stdio::null()).spawn()?;
    Ok(ClientConfig::default().serve(transport).await?)
}

async fn call(client: &McpClient, tool: &str, arguments: Value) -> CallToolResult {
    let Value::Object(arguments) = arguments else { panic!("arguments are an object") };
    let request = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
    tokio::time::timeout(Duration::from_secs(30), client.peer().call_tool(request)).await.expect("the call ends").expect("the proxy answers")
}

fn text(result: &CallToolResult) -> String {
    result.content.iter().filter_map(|c| c.as_text().map(|t| t.text.clone())).collect::<Vec<_>>().join("\n")
}

fn sent(state: &DemoState, tool: &str, order: &str) -> Vec<Map<String, Value>> {
    state.calls_to(tool).into_iter().filter(|c| c.arguments["order_id"] == order).filter_map(|c| c.arguments.as_object().cloned()).collect()
}

/// The four outcomes the issue names, as one client sees them through the proxy.
async fn the_policy_not_the_failures(client: &McpClient, state: &DemoState, form: &str) {
    let blip = call(client, "lookup_order", json!({"order_id": "P-503"})).await;
    assert_ne!(blip.is_error, Some(true), "{form}: a 503 blip is retried inside the proxy: {blip:?}");
    assert_eq!(sent(state, "lookup_order", "P-503").len(), 2, "{form}: the server saw the blip and the retry");

    let bad = call(client, "lookup_order", json!({"order_id": "P-400"})).await;
    assert_eq!(bad.is_error, Some(true), "{form}: a replan is an error result");
    assert_eq!(text(&bad), "lookup_order failed: HTTP 400: invalid argument order_id", "{form}: the policy's message, not the raw body");
    assert_eq!(sent(state, "lookup_order", "P-400").len(), 1, "{form}: a 400 is never repeated");

    let forbidden = call(client, "issue_refund", json!({"order_id": "P-403", "amount_paise": 500})).await;
    assert_eq!(forbidden.is_error, Some(true), "{form}: an escalation is an error result");
    let note = text(&forbidden);
    assert!(note.contains("permission denied; a person must grant access"), "{form}: the note: {note}");
    assert!(note.contains("Last error: HTTP 403: forbidden: needs approval"), "{form}: the note: {note}");
    assert_eq!(sent(state, "issue_refund", "P-403").len(), 1, "{form}: a 403 is never repeated");

    let applied = call(client, "issue_refund", json!({"order_id": "P-TIMEOUT", "amount_paise": 700})).await;
    assert_ne!(applied.is_error, Some(true), "{form}: the keyed write's retry is answered: {applied:?}");
    let attempts = sent(state, "issue_refund", "P-TIMEOUT");
    assert!(attempts.len() >= 2, "{form}: the write timed out and was sent again: {attempts:?}");
    let keys: Vec<&Value> = attempts.iter().map(|a| &a["idempotency_key"]).collect();
    assert!(keys.iter().all(|k| *k == keys[0] && k.is_string()), "{form}: one key for every attempt: {keys:?}");
    let refunds = state.ledger.lock().unwrap().refunds.iter().filter(|r| r.order_id == "P-TIMEOUT").count();
    assert_eq!(refunds, 1, "{form}: one refund in the ledger");

    // A null key is none: the proxy derives one.
    let null_key = call(client, "issue_refund", json!({"order_id": "P-NULL", "amount_paise": 300, "idempotency_key": null})).await;
    assert_ne!(null_key.is_error, Some(true), "{null_key:?}");
    assert!(sent(state, "issue_refund", "P-NULL")[0]["idempotency_key"].as_str().is_some_and(|k| k.starts_with("ar1-")), "{form}: a null key is derived");
    // A key the client chose is the one the server sees, unchanged.
    let chosen = call(client, "issue_refund", json!({"order_id": "P-KEY", "amount_paise": 300, "idempotency_key": "client-key-1"})).await;
    assert_ne!(chosen.is_error, Some(true), "{chosen:?}");
    assert_eq!(sent(state, "issue_refund", "P-KEY")[0]["idempotency_key"], "client-key-1", "{form}: the client's key is kept");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stdio_client_sees_the_policy_not_the_failures() {
    let server = demo(FAULTS).await;
    let files = Files::new("stdio");
    let args = proxy_args(&files, &server.url, r#"{"attempt-timeout-ms": 500}"#, &[]);
    let client = connect_stdio(BIN, &args).await.unwrap();
    the_policy_not_the_failures(&client, &server.state, "stdio").await;
    // The rest passes through: the server's own tool list.
    let tools = client.peer().list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "issue_refund"), "{tools:?}");
    let _ = client.cancel().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http_client_sees_the_policy_not_the_failures() {
    let server = demo(FAULTS).await;
    let files = Files::new("http");
    let proxy = HttpProxy::start(&proxy_args(&files, &server.url, r#"{"attempt-timeout-ms": 500}"#, &[]));
    let client = connect_http(&proxy.url).await.unwrap();
    the_policy_not_the_failures(&client, &server.state, "http").await;
    let _ = client.cancel().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upstream_that_dies_is_an_error_result_and_the_proxy_stays_up() {
    let server = demo("[]").await;
    let files = Files::new("dies");
    let mut proxy = HttpProxy::start(&proxy_args(&files, &server.url, "{}", &[]));
    let client = connect_http(&proxy.url).await.unwrap();
    assert_ne!(call(&client, "lookup_order", json!({"order_id": "A-1"})).await.is_error, Some(true));
    server.stop().await;
    let lost = call(&client, "lookup_order", json!({"order_id": "A-1"})).await;
    assert_eq!(lost.is_error, Some(true), "a dead upstream is a failure the policy ends: {lost:?}");
    assert!(proxy.alive(), "the proxy stays up");
    // It still answers: a listing the upstream cannot give is a JSON-RPC error, not a hang.
    let listed = tokio::time::timeout(Duration::from_secs(20), client.peer().list_tools(None)).await.expect("answered");
    assert!(listed.is_err(), "no upstream, no list: {listed:?}");
    assert!(proxy.alive(), "the proxy stays up");
    let _ = client.cancel().await;
}

/// The export takes 2 s and reports progress; the client leaves after 0.5 s.
/// Over stdio to the upstream, the proxy's cancellation reaches the server.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_goes_away_mid_call_is_cancelled_upstream() {
    let files = Files::new("away");
    let ledger = files.dir.join("ledger.json").to_string_lossy().into_owned();
    let config = files.write("policy.json", POLICY);
    let args: Vec<String> = ["proxy", "--config", &config, "--watch-ms", "0", "--", BIN, "serve", "--stdio", "--ledger", &ledger].map(String::from).to_vec();
    let client = connect_stdio(BIN, &args).await.unwrap();
    let peer = client.peer().clone();
    let arguments = json!({"seconds": 2.0}).as_object().cloned().unwrap();
    let export = tokio::spawn(async move { peer.call_tool(CallToolRequestParams::new("export_report").with_arguments(arguments)).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = client.cancel().await;
    let _ = export.await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let ledger: Value = serde_json::from_str(&std::fs::read_to_string(&ledger).unwrap()).unwrap();
    let reports = ledger["reports"].as_array().cloned().unwrap_or_default();
    assert_eq!(reports.len(), 1, "{ledger}");
    assert_eq!(reports[0]["finished"], false, "the export was cancelled upstream when the client went away: {ledger}");
}

/// Over HTTP, a client that drops its request mid-call has it cancelled upstream too.
#[tokio::test(flavor = "multi_thread")]
async fn an_http_client_that_drops_its_request_has_it_cancelled_upstream() {
    let files = Files::new("away-http");
    let ledger = files.dir.join("ledger.json").to_string_lossy().into_owned();
    let config = files.write("policy.json", POLICY);
    let args: Vec<String> = ["proxy", "--config", &config, "--watch-ms", "0", "--", BIN, "serve", "--stdio", "--ledger", &ledger].map(String::from).to_vec();
    let proxy = HttpProxy::start(&args);
    let http = reqwest::Client::new();
    let post = |body: Value| {
        http.post(&proxy.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25")
            .body(body.to_string())
    };
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}});
    assert!(post(initialize).send().await.unwrap().status().is_success());
    let export = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "export_report", "arguments": {"seconds": 2.0}}});
    let dropped = tokio::time::timeout(Duration::from_millis(500), post(export).send()).await;
    assert!(dropped.is_err(), "the request was dropped before its answer");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let ledger: Value = serde_json::from_str(&std::fs::read_to_string(&ledger).unwrap()).unwrap();
    assert_eq!(ledger["reports"][0]["finished"], false, "the export was cancelled upstream: {ledger}");
}

/// The server's breaker state, on one Redis: a breaker one proxy opened
/// refuses the other proxy's calls, and the model is told so.
#[tokio::test(flavor = "multi_thread")]
async fn two_proxies_on_one_redis_share_a_breaker() {
    let redis = RedisServer::start();
    let server = demo(r#"[{"tool": "lookup_order", "when": {"order_id": "DOWN"}, "fault": {"kind": "http", "status": 503}}]"#).await;
    let files = Files::new("breaker");
    let policy = json!({"base-delay-ms": 10, "max-delay-ms": 20, "max-attempts-per-call": 2, "circuit-breaker": {"failures-to-open": 2, "cooldown-ms": 60000}});
    let (a, b) = two_proxies(&files, &server, &redis, &policy);
    let (client_a, client_b) = (connect_http(&a.url).await.unwrap(), connect_http(&b.url).await.unwrap());
    let down = call(&client_a, "lookup_order", json!({"order_id": "DOWN"})).await;
    assert_eq!(down.is_error, Some(true), "{down:?}");
    assert_eq!(sent(&server.state, "lookup_order", "DOWN").len(), 2, "A sent the call and its retry");
    let refused = call(&client_b, "check_refund_policy", json!({"order_id": "UP", "amount_paise": 100})).await;
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    assert!(text(&refused).contains("circuit breaker open"), "B is told why: {}", text(&refused));
    assert!(server.state.calls_to("check_refund_policy").is_empty(), "B sent nothing");
    let _ = (client_a.cancel().await, client_b.cancel().await);
    server.stop().await;
}

/// One account on one Redis: its tokens are counted once across both proxies.
#[tokio::test(flavor = "multi_thread")]
async fn two_proxies_on_one_redis_share_an_account_budget() {
    let redis = RedisServer::start();
    let server = demo("[]").await;
    let files = Files::new("account");
    let policy = json!({"account-budget": {"account-id": "acct-proxy-test", "capacity": 4, "refill-interval-ms": 600000, "max-wait-ms": 0}});
    let (a, b) = two_proxies(&files, &server, &redis, &policy);
    let (client_a, client_b) = (connect_http(&a.url).await.unwrap(), connect_http(&b.url).await.unwrap());
    let mut outcomes = Vec::new();
    for (i, client) in [&client_a, &client_b, &client_a, &client_b, &client_a, &client_b].into_iter().enumerate() {
        let result = call(client, "check_refund_policy", json!({"order_id": format!("B-{i}"), "amount_paise": 100})).await;
        outcomes.push((result.is_error == Some(true), text(&result)));
    }
    let sent = server.state.calls_to("check_refund_policy").len();
    let refused: Vec<&String> = outcomes.iter().filter(|(error, _)| *error).map(|(_, text)| text).collect();
    // Each proxy's first run lists the tools, a call of the account too.
    assert_eq!(sent + refused.len(), 6, "every call was sent or refused: {outcomes:?}");
    assert_eq!(sent, 2, "four tokens: two listings, two calls, whichever proxy made them: {outcomes:?}");
    assert!(refused.iter().all(|t| t.contains("account")), "refused by the account budget: {refused:?}");
    let _ = (client_a.cancel().await, client_b.cancel().await);
    server.stop().await;
}

fn two_proxies(files: &Files, server: &HttpServer, redis: &RedisServer, policy: &Value) -> (HttpProxy, HttpProxy) {
    let config = files.write("shared-policy.json", &policy.to_string());
    let args: Vec<String> =
        ["proxy", "--config", &config, "--watch-ms", "0", "--upstream", &server.url, "--redis", &redis.url(), "--workers", "2"].map(String::from).to_vec();
    (HttpProxy::start(&args), HttpProxy::start(&args))
}

/// Each side speaks 2026-07-28 and 2025-11-25: upstream servers of either
/// revision only, behind both forms, answer a client of either revision.
#[tokio::test(flavor = "multi_thread")]
async fn both_revisions_on_each_side() {
    let files = Files::new("revisions");
    for era in [Era::Modern, Era::Handshake] {
        let state = DemoState::new(FaultScript::default(), None);
        let options = HttpOptions { era, sessions: era == Era::Handshake, ..HttpOptions::default() };
        let server = serve_http_options("127.0.0.1:0".parse().unwrap(), state, options).await.unwrap();
        let args = proxy_args(&files, &server.url, "{}", &[]);
        let proxy = HttpProxy::start(&args);
        // A client of 2026-07-28 (rmcp's negotiation: server/discover first), over HTTP and stdio.
        let modern = connect_http(&proxy.url).await.unwrap();
        assert_eq!(modern.peer().peer_info().unwrap().protocol_version.as_str(), "2026-07-28", "{era:?}");
        assert_ne!(call(&modern, "lookup_order", json!({"order_id": "A-1"})).await.is_error, Some(true), "{era:?}: modern client over HTTP");
        let stdio = connect_stdio(BIN, &args).await.unwrap();
        assert_ne!(call(&stdio, "lookup_order", json!({"order_id": "A-1"})).await.is_error, Some(true), "{era:?}: over stdio");
        // A client of 2025-11-25, with the handshake.
        let legacy = rmcp::ClientServiceExt::serve_with_lifecycle(
            ClientConfig::default(),
            rmcp::transport::StreamableHttpClientTransport::from_uri(proxy.url.clone()),
            rmcp::ClientLifecycleMode::Initialize,
        )
        .await
        .unwrap();
        assert_eq!(legacy.peer().peer_info().unwrap().protocol_version.as_str(), "2025-11-25", "{era:?}");
        let answered = call(&legacy, "lookup_order", json!({"order_id": "A-1"})).await;
        assert_ne!(answered.is_error, Some(true), "{era:?}: 2025-11-25 client: {answered:?}");
        let _ = (modern.cancel().await, stdio.cancel().await, legacy.cancel().await);
        server.stop().await;
    }
}

#[test]
fn bad_settings_are_refused_at_start_naming_the_member() {
    let files = Files::new("settings");
    let settings = files.write("bad.json", r#"{"status-check": {}}"#);
    let output = Command::new(BIN).args(["proxy", "--settings", &settings, "--upstream", "http://127.0.0.1:9/mcp"]).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("status-check") && stderr.contains("bad.json"), "{stderr}");
}

/// An HTTP server of the test's own at `path` (a webhook, a collector): its
/// URL, and the bodies POSTed to it as they come.
async fn receiving_posts(path: &'static str) -> (String, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}{path}", listener.local_addr().unwrap());
    let (posted, received) = tokio::sync::mpsc::unbounded_channel::<String>();
    let app = axum::Router::new().route(
        path,
        axum::routing::post(move |body: String| {
            let posted = posted.clone();
            async move {
                let _ = posted.send(body);
                "{}"
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

fn everything() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fault-proxy/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(std::path::Path::new(path).exists(), "{path} is missing: install it with `make fault-proxy-setup`");
    path.to_string()
}

/// rmcp's client through the proxy to a third party's server (the registry's
/// server-everything, over its stdio), over both forms.
#[tokio::test(flavor = "multi_thread")]
async fn server_everything_through_both_forms() {
    let files = Files::new("everything");
    let config = files.write("policy.json", POLICY);
    let args: Vec<String> = ["proxy", "--config", &config, "--watch-ms", "0", "--", "node", &everything(), "stdio"].map(String::from).to_vec();
    let proxy = HttpProxy::start(&args);
    for (form, client) in [("stdio", connect_stdio(BIN, &args).await.unwrap()), ("http", connect_http(&proxy.url).await.unwrap())] {
        let tools = client.peer().list_all_tools().await.unwrap();
        assert!(tools.iter().any(|t| t.name == "echo"), "{form}: {tools:?}");
        let echoed = call(&client, "echo", json!({"message": "through the proxy"})).await;
        assert_eq!(text(&echoed), "Echo: through the proxy", "{form}");
        // Prompts and resources pass through as the server answers them.
        let prompts = client.peer().list_all_prompts().await.unwrap();
        assert!(!prompts.is_empty(), "{form}: prompts pass through");
        let resources = client.peer().list_resources(None).await.unwrap();
        assert!(!resources.resources.is_empty(), "{form}: resources pass through");
        let _ = client.cancel().await;
    }
}

/// An escalation is counted at /metrics and announced to the webhook, with the note.
#[tokio::test(flavor = "multi_thread")]
async fn an_escalation_is_counted_and_announced_to_the_webhook() {
    let server = demo(FAULTS).await;
    let files = Files::new("webhook");
    let (hook_url, mut received) = receiving_posts("/escalations").await;
    let settings = json!({"escalation-webhook": hook_url}).to_string();
    let proxy = HttpProxy::start(&proxy_args(&files, &server.url, &settings, &[]));
    let client = connect_http(&proxy.url).await.unwrap();
    let forbidden = call(&client, "issue_refund", json!({"order_id": "P-403", "amount_paise": 500})).await;
    assert_eq!(forbidden.is_error, Some(true));
    let announced = tokio::time::timeout(Duration::from_secs(10), received.recv()).await.expect("announced").unwrap();
    let announced: Value = serde_json::from_str(&announced).unwrap();
    assert_eq!(announced["event"], "agent_retry.escalation");
    assert_eq!(announced["tool"], "issue_refund");
    assert_eq!(announced["reason"], "permission-denied");
    assert_eq!(announced["note"].as_str(), Some(text(&forbidden).as_str()), "the note the client got");
    let metrics = reqwest::get(proxy.url.replace("/mcp", "/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("agent_retry_escalations_total{reason=\"permission-denied\"} 1"), "{metrics}");
    let _ = client.cancel().await;
    server.stop().await;
}

/// The policy's configuration is updated while the proxy serves: the next
/// call runs under the new one.
#[tokio::test(flavor = "multi_thread")]
async fn a_policy_update_takes_effect_while_the_proxy_serves() {
    let server = demo(r#"[{"tool": "lookup_order", "when": {"order_id": "DOWN"}, "fault": {"kind": "http", "status": 503}}]"#).await;
    let files = Files::new("live");
    let config = files.write("live-policy.json", r#"{"base-delay-ms": 5, "max-delay-ms": 10, "max-attempts-per-call": 2}"#);
    let args: Vec<String> = ["proxy", "--config", &config, "--watch-ms", "100", "--upstream", &server.url].map(String::from).to_vec();
    let client = connect_stdio(BIN, &args).await.unwrap();
    call(&client, "lookup_order", json!({"order_id": "DOWN"})).await;
    assert_eq!(sent(&server.state, "lookup_order", "DOWN").len(), 2, "two attempts under the first policy");
    // A new configuration, written as an operator writes it (newer, another size).
    std::thread::sleep(Duration::from_millis(1100));
    files.write("live-policy.json", r#"{"base-delay-ms": 5, "max-delay-ms": 10, "max-attempts-per-call": 3, "max-retries-per-run": 5}"#);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let before = sent(&server.state, "lookup_order", "DOWN").len();
        call(&client, "lookup_order", json!({"order_id": "DOWN"})).await;
        if sent(&server.state, "lookup_order", "DOWN").len() - before == 3 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the update was not taken");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = client.cancel().await;
    server.stop().await;
}

/// One proxy in front of several upstreams, each under its name and with
/// settings of its own.
#[tokio::test(flavor = "multi_thread")]
async fn one_proxy_serves_several_upstreams_each_under_its_name() {
    let (orders, archive) = (demo(FAULTS).await, demo("[]").await);
    let files = Files::new("servers");
    let servers = json!({
        "orders": {"upstream": orders.url, "settings": {"attempt-timeout-ms": 500}},
        "archive": {"upstream": archive.url},
        "local": {"command": [BIN, "serve", "--stdio"]}
    });
    let servers_file = files.write("servers.json", &servers.to_string());
    let config = files.write("policy.json", POLICY);
    let args: Vec<String> = ["proxy", "--config", &config, "--watch-ms", "0", "--servers", &servers_file].map(String::from).to_vec();
    let proxy = HttpProxy::start(&args);
    let urls = &proxy.urls;
    let url_of = |name: &str| urls.iter().find(|u| u.ends_with(&format!("/{name}/mcp"))).unwrap_or_else(|| panic!("no /{name}/mcp in {urls:?}")).to_string();

    // Each name reaches its own server, under its own settings: the orders'
    // attempt timeout makes its keyed write's timeout a retry.
    let to_orders = connect_http(&url_of("orders")).await.unwrap();
    let applied = call(&to_orders, "issue_refund", json!({"order_id": "P-TIMEOUT", "amount_paise": 700})).await;
    assert_ne!(applied.is_error, Some(true), "{applied:?}");
    assert!(sent(&orders.state, "issue_refund", "P-TIMEOUT").len() >= 2);
    let to_archive = connect_http(&url_of("archive")).await.unwrap();
    assert_ne!(call(&to_archive, "lookup_order", json!({"order_id": "X-1"})).await.is_error, Some(true));
    assert_eq!(sent(&archive.state, "lookup_order", "X-1").len(), 1);
    assert!(sent(&orders.state, "lookup_order", "X-1").is_empty(), "the archive's call went to the archive only");
    let to_local = connect_http(&url_of("local")).await.unwrap();
    assert_ne!(call(&to_local, "lookup_order", json!({"order_id": "A-1"})).await.is_error, Some(true));
    let _ = (to_orders.cancel().await, to_archive.cancel().await, to_local.cancel().await);
    drop(proxy);
    orders.stop().await;
    archive.stop().await;
}

#[test]
fn a_bad_servers_file_is_refused_naming_what_is_wrong() {
    let files = Files::new("bad-servers");
    for (text, expected) in [
        (r#"{"a b": {"upstream": "http://127.0.0.1:9/mcp"}}"#, "'a b' is not a server name"),
        (r#"{"x": {"upstream": "http://127.0.0.1:9/mcp", "command": ["srv"]}}"#, "x: give exactly one of"),
        (r#"{"x": {"upstream": "http://127.0.0.1:9/mcp", "setting": {}}}"#, "unknown field `setting`"),
        (r#"{"x": {"upstream": "http://127.0.0.1:9/mcp", "settings": {"key-argumnt": "k"}}}"#, "x.settings: unknown field `key-argumnt`"),
        (r#"{"x": {"upstream": "http://127.0.0.1:9/mcp"}, "x": {"upstream": "http://127.0.0.1:10/mcp"}}"#, "the server 'x' is named twice"),
    ] {
        let path = files.write("servers.json", text);
        let output = Command::new(BIN).args(["proxy", "--listen", "127.0.0.1:0", "--servers", &path]).output().unwrap();
        assert!(!output.status.success(), "{text}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected) && stderr.contains("servers.json"), "{text}: {stderr}");
    }
}

/// With `--otlp-endpoint`, every call and attempt is a span, sent as OTLP/HTTP
/// JSON (here to a collector of the test's own), flushed as the proxy stops.
#[tokio::test(flavor = "multi_thread")]
async fn spans_go_to_the_otlp_endpoint() {
    let server = demo(FAULTS).await;
    let files = Files::new("otlp");
    let (endpoint, mut received) = receiving_posts("/v1/traces").await;
    let args = proxy_args(&files, &server.url, "{}", &["--otlp-endpoint", &endpoint]);
    let client = connect_stdio(BIN, &args).await.unwrap();
    assert_ne!(call(&client, "lookup_order", json!({"order_id": "P-503"})).await.is_error, Some(true));
    // Stopping the proxy flushes the batch.
    let _ = client.cancel().await;
    let mut exported = String::new();
    while !exported.contains("execute_tool lookup_order") {
        let body = tokio::time::timeout(Duration::from_secs(15), received.recv()).await.expect("spans exported").unwrap();
        exported.push_str(&body);
    }
    assert!(exported.contains("agent-retry-proxy"), "the service's name: {exported}");
    assert_eq!(exported.matches("\"tools/call lookup_order\"").count(), 2, "a span for each attempt, the blip's and the retry's: {exported}");
    assert!(exported.contains("agent_retry.run"), "{exported}");
    server.stop().await;
}
