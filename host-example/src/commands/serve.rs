//! `agent-retry serve`: the demo MCP server, over streamable HTTP or stdio.

use std::path::Path;
use std::time::Duration;

use agent_retry_demo_server::{Allowance, DemoServer, DemoState, Era, FaultScript, HttpOptions, TestAuthority, Timings, serve_http_options};
use rmcp::ServiceExt;

pub struct ServeOptions<'a> {
    pub http: Option<&'a str>,
    pub faults: Option<&'a Path>,
    pub allowance: Option<u32>,
    pub window_ms: u64,
    pub ledger: Option<std::path::PathBuf>,
    /// Streamable HTTP's sessions, for clients of protocol versions before 2026-07-28.
    pub sessions: bool,
    /// The revisions served over HTTP.
    pub era: Era,
    /// Serve https; the test CA's certificate goes to this file.
    pub tls_ca_out: Option<std::path::PathBuf>,
    /// Tasks' work, poll interval and TTL; the progress interval.
    pub timings: Timings,
}

pub async fn serve(options: ServeOptions<'_>) -> anyhow::Result<()> {
    let faults = match options.faults {
        Some(path) => FaultScript::from_json(&std::fs::read_to_string(path)?).map_err(anyhow::Error::msg)?,
        None => FaultScript::default(),
    };
    let allowance = options.allowance.map(|n| Allowance::new(n, Duration::from_millis(options.window_ms)));
    let state = match options.ledger {
        Some(path) => DemoState::with_ledger_file(faults, allowance, path)?,
        None => DemoState::new(faults, allowance),
    };
    state.set_timings(options.timings);
    match options.http {
        Some(addr) => {
            let tls = match &options.tls_ca_out {
                Some(path) => {
                    let authority = TestAuthority::generate()?;
                    std::fs::write(path, &authority.ca_pem)?;
                    Some(authority)
                }
                None => None,
            };
            let http = HttpOptions { sessions: options.sessions, era: options.era, tls };
            let server = serve_http_options(addr.parse()?, state, http).await?;
            eprintln!("demo MCP server at {} (Ctrl-C stops it)", server.url);
            tokio::signal::ctrl_c().await?;
            server.stop().await;
        }
        None => {
            let service = DemoServer::new(state).serve(rmcp::transport::stdio()).await?;
            service.waiting().await?;
        }
    }
    Ok(())
}
