//! A refund-desk agent's three tool calls through agent-retry-host (the packaged crate).
//!   agent-retry-fresh-example http://127.0.0.1:PORT/mcp
//! The demo server fails the first lookup and the first refund with a 503: both are
//! retried (the refund with the same idempotency key); a refund above the approval
//! limit is a task that asks a person: with no handler, it escalates input-required. Prints one JSON line.
use std::sync::Arc;

use agent_retry_host::mcp::{CallError, McpConnection, Metrics, RetryingToolCaller, RetryingToolCallerOptions, ToolAnswer};
use agent_retry_host::{BUNDLED_WASM, EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, labels};
use serde_json::{Map, Value, json};

fn args(value: Value) -> Map<String, Value> {
    value.as_object().cloned().unwrap_or_default()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = std::env::args().nth(1).expect("usage: agent-retry-fresh-example URL");
    assert!(BUNDLED_WASM.is_some(), "the packaged crate embeds the component");
    let instance = PolicyComponent::load(None)?.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::Os))?;
    // The wrapper's connection: statuses and headers captured, a lost session set up again.
    let connection = McpConnection::http(&url);
    let mut caller = RetryingToolCaller::connect(connection, instance, "{}", "CASE-7001", RetryingToolCallerOptions::default(), Arc::new(Metrics::new())).await?;
    let order = match caller.call("lookup_order", args(json!({"order_id": "ORD-1"}))).await? {
        ToolAnswer::Done { result, .. } => result.and_then(|r| r.structured_content).map(|s| s["status"].clone()).unwrap_or(Value::Null),
        ToolAnswer::Replan(message) => anyhow::bail!("lookup replanned: {message}"),
    };
    let refunded = matches!(caller.call("issue_refund", args(json!({"order_id": "ORD-1", "amount_paise": 50_000}))).await?, ToolAnswer::Done { .. });
    let escalated = match caller.call("issue_refund", args(json!({"order_id": "ORD-2", "amount_paise": 900_000}))).await {
        Err(CallError::Escalated(e)) => Some(labels::reason(e.reason)),
        _ => None,
    };
    let report = caller.finish().await?;
    println!("{}", json!({"host": "rust", "order": order, "refunded": refunded, "escalated": escalated,
                         "retries": report.retries, "attempts": report.attempts}));
    Ok(())
}
