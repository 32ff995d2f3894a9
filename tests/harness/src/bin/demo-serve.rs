//! The demo MCP server for the fault-proxy tests (tests/fault-proxy/README.md):
//! `demo-serve (--http ADDR [--sessions] | --stdio) [--faults FILE] [--ledger PATH]`,
//! the same server as `agent-retry serve`, without building the CLI.

use agent_retry_demo_server::{DemoServer, DemoState, FaultScript, serve_http_with};
use rmcp::ServiceExt;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let faults = match value("--faults") {
        Some(path) => FaultScript::from_json(&std::fs::read_to_string(path)?).map_err(anyhow::Error::msg)?,
        None => FaultScript::default(),
    };
    let state = match value("--ledger") {
        Some(path) => DemoState::with_ledger_file(faults, None, path.into())?,
        None => DemoState::new(faults, None),
    };
    match value("--http") {
        Some(addr) => {
            let _server = serve_http_with(addr.parse()?, state, args.iter().any(|a| a == "--sessions")).await?;
            std::future::pending::<()>().await;
        }
        None => {
            let service = DemoServer::new(state).serve(rmcp::transport::stdio()).await?;
            service.waiting().await?;
        }
    }
    Ok(())
}
