//! `agent-retry call`: one tool call through the wrapper, against any MCP server.

use std::sync::Arc;

use serde_json::{Map, Value};

use agent_retry_host::mcp::{CallError, McpConnection, Metrics, RetryingToolCaller, RetryingToolCallerOptions, ToolAnswer};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent};

pub struct CallOptions<'a> {
    pub wasm: &'a std::path::Path,
    pub url: Option<&'a str>,
    pub stdio: Option<&'a str>,
    pub tool: &'a str,
    pub arguments: &'a str,
    pub config: &'a str,
    pub seed: Option<u64>,
    /// PEM CA certificates to trust beside the platform's (an https server with a private CA).
    pub ca_file: Option<&'a std::path::Path>,
}

pub async fn call(options: CallOptions<'_>) -> anyhow::Result<()> {
    super::init_json_log(std::io::stderr);
    let arguments: Map<String, Value> = serde_json::from_str(options.arguments).map_err(|e| anyhow::anyhow!("arguments must be a JSON object: {e}"))?;
    // The wrapper's own connection: it captures HTTP statuses and headers, and
    // sets a lost session up again (re-initialises; restarts a stdio server).
    let connection = match (options.url, options.stdio) {
        (Some(url), None) => match options.ca_file {
            Some(path) => McpConnection::try_http(url)?.with_root_certificates_pem(&std::fs::read(path)?)?,
            None => McpConnection::try_http(url)?,
        },
        (None, Some(command)) => {
            let words: Vec<String> = command.split_whitespace().map(str::to_string).collect();
            let (program, args) = words.split_first().ok_or_else(|| anyhow::anyhow!("--stdio needs a command"))?;
            McpConnection::stdio(program, args)
        }
        _ => anyhow::bail!("give exactly one of --url and --stdio"),
    };
    let entropy = options.seed.map_or(EntropySource::Os, EntropySource::seeded);
    let instance = PolicyComponent::from_file(options.wasm)?.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), entropy))?;
    let metrics = Arc::new(Metrics::new());
    let mut caller = RetryingToolCaller::connect(connection, instance, options.config, "cli", RetryingToolCallerOptions::default(), metrics).await?;
    let answer = caller.call(options.tool, arguments).await;
    let report = caller.finish().await?;
    match answer {
        Ok(ToolAnswer::Done { result, note }) => {
            let result = result.map(|r| serde_json::to_value(r).unwrap_or(Value::Null));
            println!("{}", serde_json::json!({ "outcome": "done", "note": note, "result": result }));
        }
        Ok(ToolAnswer::Replan(message)) => println!("{}", serde_json::json!({ "outcome": "replan", "message": message })),
        Err(CallError::Escalated(e)) => {
            println!("{}", serde_json::json!({ "outcome": "escalated", "reason": agent_retry_host::labels::reason(e.reason), "note": e.note }))
        }
        Err(other) => return Err(other.into()),
    }
    eprintln!("attempts {}, retries {}, waited {} ms", report.attempts, report.retries, report.waited_ms);
    Ok(())
}
