//! `agent-retry demo`: the refund desk end to end. Starts the demo MCP server on
//! a free loopback port with faults scripted across runs and an account
//! allowance, runs scripted agent runs against it through the wrapper (several
//! workers at once), and prints what happened, checked against the server's ledger.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_retry_demo_server::faults::{Fault, rule_when};
use agent_retry_demo_server::tools::lock;
use agent_retry_demo_server::{Allowance, DemoState, FaultRule, FaultScript, serve_http};
use serde_json::{Map, Value, json};

use agent_retry_host::mcp::{CallError, Clock, ListedCheck, Metrics, RetryingToolCaller, RetryingToolCallerOptions, ToolAnswer, connect_http};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent};

pub struct DemoOptions {
    pub wasm: PathBuf,
    pub runs: u32,
    pub workers: u32,
    pub seed: Option<u64>,
    pub log: PathBuf,
    pub prometheus: bool,
}

/// The policy configuration the demo's workers load.
pub const DEMO_CONFIG: &str = r#"{"base-delay-ms": 200, "max-delay-ms": 2000, "max-hint-ms": 5000, "max-replans-per-run": 2,
    "tools": {"delete_asset": {"effect": "delete"}}}"#;

fn http(status: u16, headers: &[(&str, &str)], body: &str) -> Fault {
    Fault::Http { status, headers: headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(), body: body.to_string() }
}

fn order(n: u32) -> String {
    format!("ORD-{}", 5000 + n)
}

/// Faults across runs, one story per order.
fn fault_script() -> Vec<FaultRule> {
    let when = |n: u32| json!({ "order_id": order(n) });
    vec![
        rule_when("lookup_order", when(2), Some(1), http(503, &[], "upstream unavailable")),
        rule_when("check_refund_policy", when(3), Some(1), http(429, &[("Retry-After", "1")], "slow down")),
        rule_when("issue_refund", when(4), Some(1), Fault::TimeoutAfterApply { delay_ms: 1500 }),
        rule_when("lookup_order", when(7), Some(1), Fault::Empty),
        rule_when("issue_refund", when(8), Some(1), Fault::Drop),
        rule_when("lookup_order", when(9), None, http(503, &[], "orders database is down")),
        rule_when("issue_refund", when(10), Some(1), http(529, &[("retry-after-ms", "300")], "overloaded")),
        rule_when("check_refund_policy", when(11), Some(1), http(500, &[("x-should-retry", "false")], "policy engine rejected the request")),
    ]
}

#[derive(Debug)]
enum RunEnd {
    Completed,
    GaveUp(String),
    Escalated(String),
}

struct RunResult {
    case: String,
    end: RunEnd,
    replans: u32,
}

fn args(value: Value) -> Map<String, Value> {
    value.as_object().cloned().unwrap_or_default()
}

/// A tool call the scripted agent makes; on a replan it tries `fix` once.
async fn step(
    caller: &mut RetryingToolCaller,
    tool: &str,
    arguments: Value,
    fix: impl Fn(&str) -> Option<Value>,
    replans: &mut u32,
) -> Result<bool, CallError> {
    match caller.call(tool, args(arguments)).await? {
        ToolAnswer::Done { .. } => Ok(true),
        ToolAnswer::Replan(message) => {
            *replans += 1;
            // The "model" reads the message and changes its arguments, or repeats the call.
            let Some(fixed) = fix(&message) else { return Ok(false) };
            match caller.call(tool, args(fixed)).await? {
                ToolAnswer::Done { .. } => Ok(true),
                ToolAnswer::Replan(_) => {
                    *replans += 1;
                    Ok(false)
                }
            }
        }
    }
}

/// One agent run of the refund desk: look up, check the policy, refund.
async fn agent_run(caller: &mut RetryingToolCaller, n: u32) -> Result<RunEnd, CallError> {
    let order_id = order(n);
    let amount: Value = match n {
        6 => json!(900_000),   // above 5,000 rupees: needs a person
        5 => json!("2450.00"), // sent as text: the server rejects it, the model fixes it
        _ => json!(245_000),
    };
    let mut replans = 0;
    let same = |a: Value| move |_: &str| Some(a.clone());
    if !step(caller, "lookup_order", json!({"order_id": order_id}), same(json!({"order_id": order_id})), &mut replans).await? {
        return Ok(RunEnd::GaveUp("lookup_order kept failing".into()));
    }
    let check = json!({"order_id": order_id, "amount_paise": 245_000});
    if !step(caller, "check_refund_policy", check.clone(), same(check.clone()), &mut replans).await? {
        return Ok(RunEnd::GaveUp("check_refund_policy kept failing".into()));
    }
    // The server says the amount had the wrong type; the model sends it as an integer of paise.
    let fix_amount = |message: &str| message.contains("expected i64").then(|| json!({"order_id": order_id, "amount_paise": 245_000}));
    if !step(caller, "issue_refund", json!({"order_id": order_id, "amount_paise": amount}), fix_amount, &mut replans).await? {
        return Ok(RunEnd::GaveUp("issue_refund was rejected".into()));
    }
    Ok(RunEnd::Completed)
}

pub async fn demo(options: DemoOptions) -> anyhow::Result<()> {
    let log = std::fs::File::create(&options.log)?;
    super::init_json_log(Mutex::new(log));
    let component = Arc::new(PolicyComponent::from_file(&options.wasm)?);
    let state = DemoState::new(FaultScript::new(fault_script()), Some(Allowance::new(40, Duration::from_secs(1))));
    let server = serve_http("127.0.0.1:0".parse()?, Arc::clone(&state)).await?;
    let accounts = Arc::new(EmbeddedAccounts::new());
    let metrics = Arc::new(Metrics::new());
    let progress = indicatif::ProgressBar::new(u64::from(options.runs));
    progress.set_style(indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} runs {msg}").unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()));
    let next_run = Arc::new(Mutex::new(1u32));
    let results = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let mut workers = Vec::new();
    for worker in 0..options.workers.max(1) {
        let (component, accounts, metrics, progress, next_run, results, url) = (
            Arc::clone(&component),
            Arc::clone(&accounts),
            Arc::clone(&metrics),
            progress.clone(),
            Arc::clone(&next_run),
            Arc::clone(&results),
            server.url.clone(),
        );
        let entropy_seed = options.seed.map(|s| s ^ u64::from(worker));
        let runs = options.runs;
        workers.push(tokio::spawn(async move {
            let client = connect_http(&url).await?;
            loop {
                let n = {
                    let mut next = next_run.lock().unwrap_or_else(|p| p.into_inner());
                    if *next > runs {
                        break;
                    }
                    *next += 1;
                    *next - 1
                };
                let entropy = entropy_seed.map_or(EntropySource::Os, EntropySource::seeded);
                let instance = component.instantiate(HostServices::new(accounts.clone(), entropy))?;
                let case = format!("CASE-{}", 5000 + n);
                let options = RetryingToolCallerOptions { attempt_timeout_ms: Some(1000), key_argument: "idempotency_key".into(), clock: Clock::real(), ..Default::default() };
                let mut caller = RetryingToolCaller::start(client.peer().clone(), instance, DEMO_CONFIG, &case, options, Arc::clone(&metrics))
                    .await?
                    .with_status_check("issue_refund", ListedCheck::new("list_refunds", &["order_id"], "refunds", &["order_id", "amount_paise"]).into_check());
                let end = match agent_run(&mut caller, n).await {
                    Ok(end) => end,
                    Err(CallError::Escalated(e)) => RunEnd::Escalated(e.note),
                    Err(other) => RunEnd::Escalated(other.to_string()),
                };
                let report = caller.finish().await?;
                tracing::info!(target: "agent_retry", run = %case, calls = report.calls, attempts = report.attempts, retries = report.retries, replans = report.replans,
                               waited_ms = report.waited_ms, escalation = ?report.escalation, "run summary");
                results.lock().unwrap_or_else(|p| p.into_inner()).push(RunResult { case, end, replans: report.replans });
                progress.inc(1);
            }
            let _ = client.cancel().await;
            anyhow::Ok(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    progress.finish_and_clear();
    let elapsed = started.elapsed();
    let mut results = std::mem::take(&mut *results.lock().unwrap_or_else(|p| p.into_inner()));
    results.sort_by(|a, b| a.case.cmp(&b.case));
    let counts = metrics.snapshot();
    let (duplicates, refunds) = {
        let ledger = lock(&state.ledger);
        (ledger.duplicate_refunds(), ledger.refunds.len())
    };
    let server_calls = lock(&state.calls).len();
    let refused = lock(&state.allowance).as_ref().map_or(0, |a| a.refused);
    let completed = results.iter().filter(|r| matches!(r.end, RunEnd::Completed)).count();
    let escalated = results.iter().filter(|r| matches!(r.end, RunEnd::Escalated(_))).count();
    let replanned = results.iter().filter(|r| r.replans > 0).count();
    println!(
        "agent-retry demo: {} runs of the refund desk on {} workers against {} ({:.1} s)\n",
        results.len(),
        options.workers,
        server.url,
        elapsed.as_secs_f64()
    );
    println!("{:<10} {:<10} end", "run", "replans");
    for r in &results {
        let end = match &r.end {
            RunEnd::Completed => "completed".to_string(),
            RunEnd::GaveUp(why) => format!("gave up: {why}"),
            RunEnd::Escalated(_) => "ESCALATED (note below)".to_string(),
        };
        println!("{:<10} {:<10} {end}", r.case, r.replans);
    }
    println!();
    println!("runs completed                 {completed} of {}", results.len());
    println!("runs with a replan             {replanned}");
    println!("runs escalated                 {escalated}");
    println!("retries                        {}", counts.retries);
    println!("tool-call attempts (host)      {}", counts.attempts);
    println!("tool calls received (server)   {server_calls} ({refused} refused by the allowance with 429)");
    println!("refunds in the server's ledger {refunds}");
    println!("duplicate effects in ledger    {duplicates}");
    println!("time waited before retries     {} ms", counts.waited_ms);
    println!("identical consecutive calls    {}", counts.identical_consecutive_calls);
    println!("attempts by status             {:?}", counts.by_status);
    println!("decisions by action            {:?}", counts.by_action);
    println!("escalations by reason          {:?}", counts.escalations_by_reason);
    println!("runs ended by the step budget  {}", counts.runs_ended_by_step_budget);
    for r in &results {
        if let RunEnd::Escalated(note) = &r.end {
            println!("\n{}: {note}", r.case);
        }
    }
    println!("\none JSON line per attempt: {}", options.log.display());
    if options.prometheus {
        println!("\n{}", metrics.to_prometheus());
    }
    server.stop().await;
    if duplicates > 0 {
        anyhow::bail!("{duplicates} duplicate effects in the server's ledger");
    }
    Ok(())
}
