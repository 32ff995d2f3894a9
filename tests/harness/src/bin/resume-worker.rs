//! The Rust worker of the cross-host resume test
//! (hosts/python/tests/test_resume_across_hosts.py; its twins are
//! resume_worker.py and resume-worker.ts): loads the policy from CONFIG_PATH,
//! connects to the MCP server at URL, resumes the snapshot in SNAPSHOT_PATH
//! (taken by any host) with ANSWER through the wrapper, and prints one JSON
//! line: {"host", "action", "text", "call_id", "attempt", "key"}.
//!
//!     resume-worker URL CONFIG_PATH SNAPSHOT_PATH retry|skip|abort|done:TEXT

use std::sync::Arc;

use agent_retry_host::component::types::ResumeAnswer;
use agent_retry_host::mcp::{CallError, McpConnection, Metrics, RetryingToolCaller, RetryingToolCallerOptions, ToolAnswer};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent};
use serde_json::{Value, json};

fn answer(text: &str) -> anyhow::Result<ResumeAnswer> {
    Ok(match text {
        "retry" => ResumeAnswer::Retry,
        "skip" => ResumeAnswer::Skip,
        "abort" => ResumeAnswer::Abort,
        done if done.starts_with("done:") => ResumeAnswer::Done(Some(done["done:".len()..].to_string())),
        other => anyhow::bail!("unknown answer {other:?}: retry, skip, abort or done:TEXT"),
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, config_path, snapshot_path, answer_text] = args.as_slice() else {
        anyhow::bail!("usage: resume-worker URL CONFIG_PATH SNAPSHOT_PATH retry|skip|abort|done:TEXT");
    };
    let config = std::fs::read_to_string(config_path)?;
    let snapshot = std::fs::read_to_string(snapshot_path)?;
    let component = PolicyComponent::from_file(&agent_retry_host::default_wasm_path())?;
    let instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::Os))?;
    let options = RetryingToolCallerOptions { key_argument: "idempotency_key".into(), ..Default::default() };
    let mut caller = RetryingToolCaller::connect(McpConnection::http(url), instance, &config, "resume-worker", options, Arc::new(Metrics::new())).await?;
    let resumed = caller.resume(&snapshot, answer(answer_text)?).await;
    // The stopped call and its key, as the resumed run reports them.
    let document: Value = serde_json::from_str(&snapshot)?;
    let call_id = document["stopped-call"].as_u64().unwrap_or(0);
    let report = caller.report()?;
    let key = report.effects.iter().find(|e| u64::from(e.call_id) == call_id).and_then(|e| e.idempotency_key.clone());
    // The resumed call's attempt: the snapshot's last one, plus one when it was sent again.
    let stopped = document["calls"].as_array().and_then(|calls| calls.iter().find(|c| c["id"].as_u64() == Some(call_id)).cloned());
    let last = stopped.as_ref().and_then(|c| c["attempt"].as_u64()).unwrap_or(0);
    let attempt = if answer_text == "retry" { last + 1 } else { last };
    let (action, text) = match resumed {
        Ok(ToolAnswer::Done { result, note }) => {
            let text = result
                .and_then(|r| serde_json::to_value(&r).ok())
                .and_then(|v| v["content"][0]["text"].as_str().map(String::from))
                .or(note)
                .unwrap_or_default();
            ("succeed", text)
        }
        Ok(ToolAnswer::Replan(message)) => ("replan", message),
        Err(CallError::Escalated(e)) => ("escalate", e.note),
        Err(other) => anyhow::bail!("resume failed: {other}"),
    };
    let action = if answer_text == "retry" && action == "succeed" { "send" } else { action };
    println!("{}", json!({"host": "rust", "action": action, "text": text, "call_id": call_id, "attempt": attempt, "key": key}));
    Ok(())
}
