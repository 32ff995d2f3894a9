//! The config snippets of docs/proxy.md, run as the agent hosts run them:
//! a `command` and `args` started as a stdio child, a `url` connected to over
//! streamable HTTP (the proxy started by the page's own `http-proxy` command).
//! `agent-retry` in a snippet is this build's binary.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agent_retry_demo_server::{DemoState, FaultScript, serve_http};
use agent_retry_host::mcp::connect::McpClient;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, ClientConfig};
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_agent-retry");

/// Every `<!-- snippet: NAME -->` of the page, with the fenced block after it.
fn snippets() -> Vec<(String, String)> {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/proxy.md")).unwrap();
    let mut found = Vec::new();
    let mut lines = page.lines();
    while let Some(line) = lines.next() {
        let Some(name) = line.strip_prefix("<!-- snippet: ").and_then(|rest| rest.strip_suffix(" -->")) else { continue };
        let fence = lines.next().unwrap_or_default();
        assert!(fence.starts_with("```"), "snippet {name}: a fenced block follows its marker");
        let body: Vec<&str> = lines.by_ref().take_while(|l| !l.starts_with("```")).collect();
        found.push((name.to_string(), body.join("\n")));
    }
    found
}

/// A command line of the page, `agent-retry` replaced by this build.
fn words(line: &str) -> Vec<String> {
    line.split_whitespace().map(|w| if w == "agent-retry" { BIN.to_string() } else { w.to_string() }).collect()
}

async fn stdio_client(command: &[String]) -> McpClient {
    let mut child = tokio::process::Command::new(&command[0]);
    child.args(&command[1..]);
    let (transport, _) = TokioChildProcess::builder(child).stderr(Stdio::null()).spawn().unwrap();
    ClientConfig::default().serve(transport).await.unwrap()
}

/// The demo server's tools answer through the proxy.
async fn works(client: &McpClient, name: &str) {
    let tools = client.peer().list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "lookup_order"), "{name}: the server's tools are listed through the proxy");
    let Value::Object(arguments) = json!({"order_id": "A-1"}) else { unreachable!() };
    let request = CallToolRequestParams::new("lookup_order").with_arguments(arguments);
    let result = tokio::time::timeout(Duration::from_secs(20), client.peer().call_tool(request)).await.unwrap().unwrap();
    assert_ne!(result.is_error, Some(true), "{name}: {result:?}");
}

struct Stop(Child);

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_config_snippet_of_the_proxy_page_works_as_its_host_runs_it() {
    let snippets = snippets();
    let names: Vec<&str> = snippets.iter().map(|(n, _)| n.as_str()).collect();
    for host in ["claude-code", "claude-desktop", "cursor", "vscode"] {
        assert!(names.iter().any(|n| n.starts_with(host)), "docs/proxy.md has a snippet for {host}: {names:?}");
    }
    // The page's HTTP proxy, for the `url` snippets.
    let http_line = &snippets.iter().find(|(n, _)| n == "http-proxy").expect("an http-proxy snippet").1;
    let mut proxy = Command::new(BIN).args(&words(http_line)[1..]).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stderr = BufReader::new(proxy.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("agent-retry proxy at") {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "the page's HTTP proxy did not start");
    }
    std::thread::spawn(move || for _ in stderr.lines() {});
    let _proxy = Stop(proxy);
    // The demo server the `--upstream` snippet names.
    let upstream = serve_http("127.0.0.1:8932".parse().unwrap(), DemoState::new(FaultScript::default(), None)).await.unwrap();

    let mut ran = 0;
    for (name, body) in &snippets {
        let client = if name == "claude-code-cli" {
            let command = words(body.trim());
            let after = command.iter().position(|w| w == "--").expect("claude mcp add NAME -- COMMAND");
            assert_eq!(&command[..3], ["claude", "mcp", "add"], "{name}");
            stdio_client(&command[after + 1..]).await
        } else if name == "http-proxy" {
            continue;
        } else {
            let config: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{name}: not JSON: {e}"));
            let servers = config.get("mcpServers").or_else(|| config.get("servers")).and_then(Value::as_object).expect("a servers object");
            let (_, server) = servers.iter().next().expect("one server");
            if let Some(url) = server.get("url").and_then(Value::as_str) {
                agent_retry_host::mcp::connect_http(url).await.unwrap()
            } else {
                let program = server["command"].as_str().unwrap();
                let args: Vec<String> = server["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect();
                let command: Vec<String> = std::iter::once(program.to_string()).chain(args).map(|w| words(&w).remove(0)).collect();
                stdio_client(&command).await
            }
        };
        works(&client, name).await;
        let _ = client.cancel().await;
        ran += 1;
    }
    assert_eq!(ran, snippets.len() - 1, "every snippet but the proxy's own command ran");
    upstream.stop().await;
}
