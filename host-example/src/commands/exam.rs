//! `agent-retry exam` and `agent-retry judge`: the host-conformance harness.
//!
//! `judge` serves the exam's faults (tests/judge/exam.json) on a free loopback
//! port, runs a host's exam client against it, and checks from the server's side
//! what a correct host must have done. `exam` is the Rust host's exam client: it
//! makes the exam's runs through the wrapper. A `--no-policy` client retries
//! everything at once with a new key each time, to show what the judge catches.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agent_retry_demo_server::judge::judge as check;
use agent_retry_demo_server::{DemoState, FaultRule, FaultScript, serve_http};
use rmcp::model::CallToolRequestParams;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use agent_retry_host::mcp::{CallError, Clock, ListedCheck, McpConnection, Metrics, RetryingToolCaller, RetryingToolCallerOptions, ToolAnswer, connect_http};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent};

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Exam {
    config: Value,
    attempt_timeout_ms: u64,
    key_argument: String,
    status_checks: std::collections::BTreeMap<String, ListedCheck>,
    faults: Vec<FaultRule>,
    runs: Vec<ExamRun>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct ExamRun {
    run_id: String,
    calls: Vec<ExamCall>,
}

#[derive(Deserialize)]
struct ExamCall {
    tool: String,
    arguments: Map<String, Value>,
}

fn read_exam(path: &Path) -> anyhow::Result<Exam> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read the exam {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// The Rust host's exam client.
pub async fn exam(wasm: &Path, url: &str, exam_path: &Path, no_policy: bool) -> anyhow::Result<()> {
    let exam = read_exam(exam_path)?;
    if no_policy {
        let client = connect_http(url).await?;
        for run in &exam.runs {
            naive_run(&client, run).await;
        }
        let _ = client.cancel().await;
        return Ok(());
    }
    let component = PolicyComponent::from_file(wasm)?;
    let config = exam.config.to_string();
    for run in &exam.runs {
        let instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::Os))?;
        let options = RetryingToolCallerOptions {
            attempt_timeout_ms: Some(exam.attempt_timeout_ms),
            key_argument: exam.key_argument.clone(),
            clock: Clock::real(),
            ..Default::default()
        };
        // The wrapper's own connection, as a user's: it negotiates the revision
        // and declares the tasks extension (the exam's J-9 is a task).
        let connection = McpConnection::http(url);
        let mut caller = RetryingToolCaller::connect(connection, instance, &config, &run.run_id, options, Arc::new(Metrics::new())).await?;
        for (tool, spec) in &exam.status_checks {
            caller = caller.with_status_check(tool, spec.clone().into_check());
        }
        for call in &run.calls {
            let outcome = match caller.call(&call.tool, call.arguments.clone()).await {
                Ok(ToolAnswer::Done { note, .. }) => json!({"run": run.run_id, "tool": call.tool, "outcome": "done", "note": note}),
                Ok(ToolAnswer::Replan(message)) => json!({"run": run.run_id, "tool": call.tool, "outcome": "replan", "message": message}),
                Err(CallError::Escalated(e)) => {
                    println!("{}", json!({"run": run.run_id, "tool": call.tool, "outcome": "escalated", "reason": agent_retry_host::labels::reason(e.reason)}));
                    break;
                }
                Err(other) => return Err(other.into()),
            };
            println!("{outcome}");
        }
    }
    Ok(())
}

/// The exam as an agent host behind the proxy takes it: the exam's policy
/// configuration and the proxy's settings (timeout, key argument, status
/// checks) in files, the proxy started as the client's stdio server, and each
/// call made once, plainly. The judge checks the proxy's behaviour.
pub async fn exam_through_proxy(wasm: &Path, url: &str, exam_path: &Path) -> anyhow::Result<()> {
    let exam = read_exam(exam_path)?;
    let dir = std::env::temp_dir().join(format!("agent-retry-exam-proxy-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("policy.json");
    std::fs::write(&config, exam.config.to_string())?;
    let checks: serde_json::Map<String, Value> =
        exam.status_checks.iter().map(|(tool, check)| (tool.clone(), serde_json::to_value(check).unwrap_or_default())).collect();
    let settings = dir.join("settings.json");
    std::fs::write(&settings, json!({"attempt-timeout-ms": exam.attempt_timeout_ms, "key-argument": exam.key_argument, "status-checks": checks}).to_string())?;
    let program = std::env::current_exe()?.to_string_lossy().into_owned();
    let args: Vec<String> = vec![
        "--wasm".into(),
        wasm.to_string_lossy().into_owned(),
        "proxy".into(),
        "--config".into(),
        config.to_string_lossy().into_owned(),
        "--settings".into(),
        settings.to_string_lossy().into_owned(),
        "--watch-ms".into(),
        "0".into(),
        "--upstream".into(),
        url.to_string(),
    ];
    let client = agent_retry_host::mcp::connect_stdio(&program, &args).await?;
    for run in &exam.runs {
        for call in &run.calls {
            let request = CallToolRequestParams::new(call.tool.clone()).with_arguments(call.arguments.clone());
            let result = client.peer().call_tool(request).await?;
            let outcome = if result.is_error == Some(true) { "error" } else { "done" };
            println!("{}", json!({"run": run.run_id, "tool": call.tool, "outcome": outcome}));
        }
    }
    let _ = client.cancel().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// What the seed warns against: retry everything at once, a new key each time.
async fn naive_run(client: &agent_retry_host::mcp::connect::McpClient, run: &ExamRun) {
    for call in &run.calls {
        for attempt in 0..3 {
            let mut arguments = call.arguments.clone();
            if call.tool == "issue_refund" {
                arguments.insert("idempotency_key".into(), Value::from(format!("{}-{attempt}", run.run_id)));
            }
            let request = CallToolRequestParams::new(call.tool.clone()).with_arguments(arguments);
            match tokio::time::timeout(Duration::from_secs(1), client.peer().call_tool(request)).await {
                Ok(Ok(result)) if result.is_error != Some(true) => break,
                _ => continue,
            }
        }
    }
}

/// Serves the exam, runs the client, prints the verdicts. Fails if any rule failed.
pub async fn judge(exam_path: &Path, client: &[String]) -> anyhow::Result<()> {
    let exam = read_exam(exam_path)?;
    let (program, args) = client.split_first().ok_or_else(|| anyhow::anyhow!("give the exam client's command after --"))?;
    let state = DemoState::new(FaultScript::new(exam.faults), None);
    let server = serve_http("127.0.0.1:0".parse()?, Arc::clone(&state)).await?;
    let child = tokio::process::Command::new(program)
        .args(args)
        .arg("--url")
        .arg(&server.url)
        .arg("--exam")
        .arg(exam_path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start the exam client {program}: {e}"))?;
    // The client's own log is shown only if it fails.
    let output = match tokio::time::timeout(Duration::from_secs(180), child.wait_with_output()).await {
        Ok(output) => output?,
        Err(_) => anyhow::bail!("the exam client did not finish in 180 s"),
    };
    let status = output.status;
    if !status.success() {
        eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    }
    let max_attempts = exam.config.get("max-attempts-per-call").and_then(Value::as_u64).unwrap_or(4) as usize;
    let verdicts = check(&state, max_attempts);
    server.stop().await;
    println!("judge: exam client `{}` exited with {status}", client.join(" "));
    for v in &verdicts {
        println!("{} {}: {}", if v.passed { "PASS" } else { "FAIL" }, v.rule, v.detail);
    }
    let passed = verdicts.iter().filter(|v| v.passed).count();
    let failed = verdicts.len() - passed;
    println!("{passed} passed, {failed} failed");
    if failed > 0 || !status.success() {
        anyhow::bail!("the host failed the exam");
    }
    Ok(())
}
