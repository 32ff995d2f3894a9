//! Sessions after a cut stream or a refused connection (issue 24 row 10), in
//! the Rust wrapper, against the `mcp` 2.x Python SDK's own streamable-HTTP
//! server (tests/mcp-sdk-server/server.py, run with the repository's .venv):
//! the server SIGKILLed mid-read and listening again 1.5 s later is reached on
//! a new session; a server that cuts every stream gets exactly
//! `max_reconnects_per_run` new sessions, then the escalation saying so; the
//! tool list is read again after a reconnection.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_retry_host::mcp::{CallError, DEFAULT_MAX_RECONNECTS_PER_RUN, McpConnection, Metrics, RetryingToolCaller, RetryingToolCallerOptions, ToolAnswer};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long nothing listens between the kill and the restarted server.
const DOWN: Duration = Duration::from_millis(1500);
/// The SDK server takes about 2 s to import: its replacement starts this long before it listens.
const IMPORT: Duration = Duration::from_secs(4);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn args(value: Value) -> Map<String, Value> {
    value.as_object().cloned().unwrap()
}

fn instance() -> agent_retry_host::PolicyInstance {
    let component = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(10))).unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn epoch_s(at: SystemTime) -> f64 {
    at.duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

/// The SDK server on a fixed port, killed and started again by the test; its request log.
struct SdkServer {
    port: u16,
    log: PathBuf,
    children: Vec<Child>,
}

impl SdkServer {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("agent-retry-row10-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        SdkServer { port: free_port(), log: dir.join("requests.log"), children: Vec::new() }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    fn spawn(&mut self, flags: &[&str], listen_at: f64) -> usize {
        let python = root().join(".venv/bin/python");
        assert!(python.exists(), "{} is missing: the repository's Python environment (make test-python sets it up)", python.display());
        let child = Command::new(python)
            .arg(root().join("tests/mcp-sdk-server/server.py"))
            .args(["--port", &self.port.to_string(), "--log", &self.log.display().to_string(), "--listen-at", &listen_at.to_string()])
            .args(flags)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        self.children.push(child);
        self.children.len() - 1
    }

    async fn listening(&mut self, index: usize) {
        let stdout = self.children[index].stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).await.unwrap();
        assert!(line.starts_with("listening"), "the SDK server did not start: {line:?}");
    }

    async fn start(&mut self, flags: &[&str]) {
        let index = self.spawn(flags, 0.0);
        self.listening(index).await;
    }

    /// SIGKILLs the running server; its replacement listens DOWN later on the same port.
    async fn kill_and_restart(&mut self, flags: &[&str]) {
        let kill_at = SystemTime::now() + IMPORT;
        let old = self.children.len() - 1;
        let replacement = self.spawn(flags, epoch_s(kill_at + DOWN));
        tokio::time::sleep(kill_at.duration_since(SystemTime::now()).unwrap_or_default()).await;
        self.children[old].kill().await.unwrap();
        self.listening(replacement).await;
    }

    fn requests(&self) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().filter_map(|l| l.split(' ').next()).map(str::to_string).collect()
    }

    fn connects(&self) -> usize {
        self.requests().iter().filter(|m| *m == "initialize" || *m == "server/discover").count()
    }
}

async fn connected(server: &SdkServer, config: &str, options: RetryingToolCallerOptions) -> RetryingToolCaller {
    // The row's sessions: the 2025-11-25 handshake.
    let mut client = rmcp::model::ClientConfig::default();
    client.protocol_version = rmcp::model::ProtocolVersion::V_2025_11_25;
    let connection = McpConnection::http(&server.url()).with_client_config(client).with_lifecycle(rmcp::ClientLifecycleMode::Initialize);
    RetryingToolCaller::connect(connection, instance(), config, "row10", options, Arc::new(Metrics::new())).await.unwrap()
}

fn text(answer: &ToolAnswer) -> String {
    match answer {
        ToolAnswer::Done { result: Some(result), .. } => agent_retry_host::mcp::observe::result_text(result),
        other => panic!("not done: {other:?}"),
    }
}

#[tokio::test]
async fn a_server_killed_mid_read_and_listening_again_is_reached_on_a_new_session() {
    let mut server = SdkServer::new("kill");
    server.start(&["--slow-s", "30"]).await;
    let mut caller = connected(&server, "{}", RetryingToolCallerOptions::default()).await;
    let call = caller.call("lookup_order", args(json!({"order_id": "K1"})));
    let restart = async {
        while !server.requests().iter().any(|m| m == "slow") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        server.kill_and_restart(&["--generation", "2"]).await;
    };
    let (answer, ()) = tokio::join!(call, restart);
    assert!(text(&answer.unwrap()).contains("generation 2"));
    let requests = server.requests();
    let restarted = &requests[requests.iter().position(|m| m == "slow").unwrap() + 1..];
    assert_eq!(restarted.first().map(String::as_str), Some("initialize"), "{requests:?}");
}

#[tokio::test]
async fn a_server_that_cuts_every_stream_gets_max_reconnects_per_run_new_sessions_then_an_escalation() {
    assert_eq!(DEFAULT_MAX_RECONNECTS_PER_RUN, 3);
    let mut server = SdkServer::new("budget");
    server.start(&["--cut-calls"]).await;
    // Enough attempts for the budget to end the call, not the per-call limit.
    let config = r#"{"base-delay-ms": 10, "max-delay-ms": 20, "max-attempts-per-call": 8}"#;
    let options = RetryingToolCallerOptions { max_reconnects_per_run: 2, ..Default::default() };
    let mut caller = connected(&server, config, options).await;
    let answer = caller.call("lookup_order", args(json!({"order_id": "B1"}))).await;
    let Err(CallError::Escalated(escalation)) = answer else { panic!("not escalated: {answer:?}") };
    // The first session and exactly two more; three cut attempts, then none sent.
    assert_eq!(server.connects(), 3, "{:?}", server.requests());
    assert_eq!(server.requests().iter().filter(|m| *m == "tools/call").count(), 3, "{:?}", server.requests());
    assert!(escalation.note.contains("reconnections spent: 2 new sessions in this run (max_reconnects_per_run 2)"), "{}", escalation.note);
}

#[tokio::test]
async fn the_tool_list_is_read_again_after_a_reconnection() {
    let mut server = SdkServer::new("relist");
    server.start(&[]).await;
    let mut caller = connected(&server, "{}", RetryingToolCallerOptions::default()).await;
    assert!(text(&caller.call("lookup_order", args(json!({"order_id": "L1"}))).await.unwrap()).contains("generation 1"));
    let lists_before = server.requests().iter().filter(|m| *m == "tools/list").count();
    server.kill_and_restart(&["--generation", "2"]).await;
    // The old session is unknown to the new server (404): the policy's reconnect, a new session.
    assert!(text(&caller.call("lookup_order", args(json!({"order_id": "L2"}))).await.unwrap()).contains("generation 2"));
    assert!(text(&caller.call("lookup_order", args(json!({"order_id": "L3"}))).await.unwrap()).contains("generation 2"));
    let requests = server.requests();
    let reconnected = requests.iter().rposition(|m| m == "initialize").unwrap();
    assert_eq!(lists_before, 1, "{requests:?}");
    assert!(requests[reconnected..].iter().any(|m| m == "tools/list"), "listed again on the new session: {requests:?}");
}
