//! The demo MCP server over stdio, for the stdio tests: `demo-stdio [FAULTS.json]`.

use agent_retry_demo_server::{DemoServer, DemoState, FaultScript};
use rmcp::ServiceExt;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let faults = match std::env::args().nth(1) {
        Some(path) => FaultScript::from_json(&std::fs::read_to_string(path)?).map_err(anyhow::Error::msg)?,
        None => FaultScript::default(),
    };
    let service = DemoServer::new(DemoState::new(faults, None)).serve(rmcp::transport::stdio()).await?;
    service.waiting().await?;
    Ok(())
}
