//! `agent-retry explain`: a scripted sequence of tool-call failures through the
//! policy, every decision printed (simulated clock, seeded jitter: reproducible).

use std::sync::Arc;

use agent_retry_host::component::types::{Action, Delivery, FailureKind, Observation, StatusCheckResult, TransportError};
use agent_retry_host::{Admission, EmbeddedAccounts, EntropySource, HostServices, Outcome, PolicyComponent};

/// One scripted step: a call and the outcomes its attempts get.
struct Scripted {
    tool: &'static str,
    keyed: bool,
    outcomes: Vec<Outcome>,
}

fn http(status: u16, headers: &[(&str, &str)], body: &str) -> Outcome {
    let headers: Vec<(String, String)> = headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect();
    Outcome::Failure(Observation::new(FailureKind::HttpStatus(status), &headers, body).delivered(Delivery::AnswerStarted))
}

fn timeout() -> Outcome {
    Outcome::Failure(Observation::new(FailureKind::Transport(TransportError::Timeout), &[], "").delivered(Delivery::Sent))
}

/// Runs the scripted walkthrough and prints every decision.
pub fn explain(wasm: &std::path::Path, seed: u64) -> anyhow::Result<()> {
    let component = PolicyComponent::from_file(wasm)?;
    let services = HostServices::new(Arc::new(EmbeddedAccounts::on_host_clock()), EntropySource::seeded(seed));
    let mut instance = component.instantiate(services)?;
    let config = r#"{"tools": {"lookup_order": {"effect": "read"}, "check_refund_policy": {"readOnlyHint": true},
        "issue_refund": {"effect": "write"}, "list_refunds": {"effect": "read"}, "delete_asset": {"effect": "delete"}}}"#;
    let policy = instance.load_policy(config)?.map_err(|e| anyhow::anyhow!("{}: {}", e.field, e.message))?;
    let run_id = "CASE-5016";
    let run = instance.start_run(&policy, run_id)?.map_err(|e| anyhow::anyhow!("run id: {e:?}"))?;
    let script = [
        Scripted { tool: "lookup_order", keyed: false, outcomes: vec![http(503, &[], "upstream unavailable"), Outcome::Success] },
        Scripted { tool: "check_refund_policy", keyed: false, outcomes: vec![http(429, &[("Retry-After", "2")], "slow down"), Outcome::Success] },
        Scripted { tool: "issue_refund", keyed: true, outcomes: vec![timeout(), Outcome::Success] },
        Scripted { tool: "issue_refund", keyed: false, outcomes: vec![timeout(), Outcome::StatusCheck(StatusCheckResult::Found)] },
        Scripted { tool: "issue_refund", keyed: true, outcomes: vec![http(400, &[], "amount must be an integer number of paise")] },
        Scripted { tool: "delete_asset", keyed: false, outcomes: vec![http(404, &[], "no such asset")] },
        Scripted { tool: "issue_refund", keyed: true, outcomes: vec![http(403, &[], "refunds above 5000 rupees need a person")] },
    ];
    let mut now_ms: u64 = 1_764_460_800_000;
    println!("run {run_id}: scripted failures through the policy (simulated clock, seed {seed})\n");
    println!("{:<4} {:<20} {:>3}  {:<44} {:<14} decision", "call", "tool", "try", "outcome", "class");
    for (step, scripted) in script.iter().enumerate() {
        let key = if scripted.keyed { Some(instance.derive_idempotency_key(run_id, &format!("step-{step}"))?) } else { None };
        let ticket = match instance.begin(&run, None, scripted.tool, key.as_deref(), None, now_ms)? {
            Ok(Admission::Send(ticket)) => ticket,
            Ok(Admission::Escalate(e)) => {
                println!("escalated before the call: {}", e.note);
                break;
            }
            Ok(Admission::Replan(_, decision)) => {
                println!("replanned before the call: {}", decision.reason);
                continue;
            }
            Err(e) => anyhow::bail!("run error: {e:?}"),
        };
        let mut stop = false;
        let mut attempt = 1;
        for outcome in &scripted.outcomes {
            let decision = match instance.decide(&run, ticket.call_id, attempt, outcome, None, now_ms, None)? {
                Ok(decision) => decision,
                Err(e) => anyhow::bail!("run error: {e:?}"),
            };
            let what = match &decision.action {
                Action::Retry(plan) => {
                    attempt = plan.attempt;
                    now_ms += plan.delay_ms;
                    let key = if plan.idempotency_key.is_some() { "same key" } else { "no key needed" };
                    format!("retry after {} ms, {key}", plan.delay_ms)
                }
                Action::Replan(message) => format!("replan: show the model \"{message}\""),
                Action::CheckStatus => "check status before resending".to_string(),
                Action::Succeed(None) => "succeed".to_string(),
                Action::Succeed(Some(note)) => format!("succeed ({note})"),
                Action::Escalate(e) => {
                    stop = true;
                    format!("ESCALATE\n\n{}", e.note)
                }
                Action::Poll(plan) => {
                    now_ms += plan.delay_ms;
                    format!("poll task {} after {} ms", plan.task_id, plan.delay_ms)
                }
            };
            println!(
                "{:<4} {:<20} {:>3}  {:<44} {:<14} {what}",
                ticket.call_id,
                scripted.tool,
                decision.attempt,
                describe(outcome),
                agent_retry_host::labels::class(decision.class)
            );
            now_ms += 50;
        }
        if stop {
            break;
        }
    }
    let report = instance.report(&run)?;
    println!(
        "\nreport: {} calls, {} attempts, {} retries, {} status checks, {} replans, {} succeeded, waited {} ms in {} waits, escalation: {}",
        report.calls,
        report.attempts,
        report.retries,
        report.status_checks,
        report.replans,
        report.succeeded_calls,
        report.waited_ms,
        report.waits,
        report.escalation.map_or("none", agent_retry_host::labels::reason)
    );
    instance.drop_run(run)?;
    instance.drop_policy(policy)?;
    Ok(())
}

fn describe(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Success => "success".to_string(),
        Outcome::EmptyResult(detail) => format!("empty result: {detail}"),
        Outcome::StatusCheck(result) => format!("status check: {}", agent_retry_host::labels::status_check(*result)),
        Outcome::Task(task) => format!("task {}", task.task_id),
        Outcome::Failure(f) | Outcome::PollFailure(f) => {
            let kind = match &f.kind {
                FailureKind::HttpStatus(s) => format!("HTTP {s}"),
                FailureKind::Transport(e) => agent_retry_host::labels::transport(*e).to_string(),
                FailureKind::ProtocolError(c) => format!("JSON-RPC {c}"),
                FailureKind::ToolError(s) => format!("isError {s:?}"),
                FailureKind::InputRequired => "input required".to_string(),
            };
            if f.headers.is_empty() { kind } else { format!("{kind} ({})", f.headers.replace('\n', ", ")) }
        }
    }
}
