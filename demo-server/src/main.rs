//! `demo-mcp-server`: the demo MCP server, over streamable HTTP or stdio.

use std::path::PathBuf;
use std::time::Duration;

use agent_retry_demo_server::{Allowance, DemoServer, DemoState, FaultScript, serve_http};
use rmcp::ServiceExt;

const USAGE: &str = "usage: demo-mcp-server (--http ADDR | --stdio) [--faults FILE.json] [--allowance CALLS --window-ms MS]

  --http ADDR     serve streamable HTTP at http://ADDR/mcp (e.g. 127.0.0.1:8080; port 0 picks one)
  --stdio         serve MCP over stdin/stdout
  --faults FILE   a fault script (see demo-server/src/faults.rs)
  --allowance N   at most N tool calls per window, shared by all clients (429 past it)
  --window-ms MS  the allowance window (default 60000)";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    if args.iter().any(|a| a == "--help" || a == "-h") || args.is_empty() {
        println!("{USAGE}");
        return Ok(());
    }
    let faults = match value("--faults") {
        Some(path) => FaultScript::from_json(&std::fs::read_to_string(PathBuf::from(&path))?).map_err(anyhow::Error::msg)?,
        None => FaultScript::default(),
    };
    let allowance = match value("--allowance") {
        Some(n) => {
            let window_ms: u64 = value("--window-ms").map(|w| w.parse()).transpose()?.unwrap_or(60_000);
            Some(Allowance::new(n.parse()?, Duration::from_millis(window_ms)))
        }
        None => None,
    };
    let state = DemoState::new(faults, allowance);
    if args.iter().any(|a| a == "--stdio") {
        let service = DemoServer::new(state).serve(rmcp::transport::stdio()).await?;
        service.waiting().await?;
        return Ok(());
    }
    let addr = value("--http").ok_or_else(|| anyhow::anyhow!("{USAGE}"))?;
    let server = serve_http(addr.parse()?, state).await?;
    eprintln!("demo MCP server at {}", server.url);
    tokio::signal::ctrl_c().await?;
    server.stop().await;
    Ok(())
}
