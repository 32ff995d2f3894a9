//! The genuine policy never trips the run-time guard: every case of
//! `tests/vectors/runs-*.json` replayed through the conformance runner on the
//! component, with a guard observing what a wrapper would tell it (each
//! admitted call, each attempt or status check, each decision as the verdict
//! and as its words). Zero violations.

use std::collections::HashMap;
use std::path::Path;

use agent_retry_host::dynamic::DynamicPolicy;
use agent_retry_host::guard::{Asked, CallIndex, RunGuard, Said};
use agent_retry_host::steps::{StepState, Subject, run_step};
use agent_retry_host::vectors::guard::{asked, polled, said, seen, status_check};
use agent_retry_host::vectors::{Case, load_dir};
use agent_retry_host::{PolicyComponent, default_wasm_path};
use serde_json::{Value, json};

/// A call the guard follows: its index, and whether the next report is a poll's.
struct Followed {
    index: CallIndex,
    polling: bool,
}

/// A decision (canonical JSON) as the verdict and the words the guard reads.
fn verdict_and_words(decision: &Value) -> Result<(Asked, Said), String> {
    let (name, payload) = match &decision["action"] {
        Value::String(name) => (name.clone(), Value::Null),
        Value::Object(case) => case.iter().next().map(|(n, p)| (n.clone(), p.clone())).ok_or("an empty action")?,
        other => return Err(format!("an action of an unknown shape: {other}")),
    };
    let verdict = json!({
        "action": name, "delay-ms": payload["delay-ms"], "hint-ms": decision["hint-ms"], "reconnect": payload["reconnect"],
        "cancel-task": decision["cancel-task"],
    });
    let words = json!({"action": name, "delay-ms": payload["delay-ms"], "reconnect": payload["reconnect"], "idempotency-key": payload["idempotency-key"]});
    Ok((asked(&verdict)?, said(&words)?))
}

/// The violations the guard found in one case (`step i: violation`), and
/// how many verdicts it checked.
fn observe(component: &PolicyComponent, case: &Case) -> Result<(Vec<String>, usize), String> {
    let mut subject = DynamicPolicy::new(component)?;
    let mut config = case.config.clone().unwrap_or_else(|| json!({}));
    if subject.load_policy(&config.to_string())?.get("ok").is_none() {
        return Err("the case's configuration is refused".into());
    }
    let mut guard = RunGuard::from_config(&config);
    let mut calls: HashMap<u64, Followed> = HashMap::new();
    let mut state = StepState::default();
    let (mut found, mut verdicts) = (Vec::new(), 0);
    for (i, step) in case.steps.iter().enumerate() {
        let output = run_step(&mut subject, step, &mut state)?;
        let Some(ok) = output.get("ok") else { continue };
        let checked = match step["op"].as_str() {
            Some("load-policy") => {
                config = step.get("config").cloned().or_else(|| step["config-text"].as_str().and_then(|t| serde_json::from_str(t).ok())).unwrap_or(Value::Null);
                Ok(())
            }
            // A new run: a new guard, under the policy now loaded.
            Some("start-run") => {
                guard = RunGuard::from_config(&config);
                calls.clear();
                Ok(())
            }
            Some("begin-call") => match ok.get("send") {
                Some(ticket) => {
                    let call = &step["call"];
                    let hints = &call["hints"];
                    let hints = (!hints.is_null()).then(|| agent_retry_host::component::types::ToolHints {
                        read_only: hints["read-only"].as_bool(),
                        destructive: hints["destructive"].as_bool(),
                        idempotent: hints["idempotent"].as_bool(),
                    });
                    let tool = call["tool"].as_str().unwrap_or_default();
                    let begun = guard.begin(tool, call["idempotency-key"].as_str(), hints.as_ref(), ticket["delay-ms"].as_u64().unwrap_or(0));
                    begun.map(|index| {
                        calls.insert(ticket["call-id"].as_u64().unwrap_or(0), Followed { index, polling: false });
                    })
                }
                None => Ok(()),
            },
            Some("record-outcome") => {
                let Some(call) = step["call-id"].as_u64().and_then(|id| calls.get_mut(&id)) else { continue };
                let outcome = &step["outcome"];
                if let Some(result) = outcome.get("status-check") {
                    guard.status_checked(call.index, status_check(result)?);
                } else if call.polling || outcome.get("poll-failure").is_some() {
                    // A poll's answer (or a poll that failed): a task status,
                    // the task's end, or the poll's failure; not an attempt.
                    guard.polled(call.index, polled(outcome)?);
                } else {
                    guard.attempted(call.index, seen(outcome)?);
                }
                let (verdict, words) = verdict_and_words(ok)?;
                verdicts += 1;
                call.polling = words.action == agent_retry_host::component::types::ActionKind::Poll;
                guard.verdict(call.index, &verdict).and_then(|()| guard.decision(call.index, &words))
            }
            _ => Ok(()),
        };
        if let Err(violation) = checked {
            found.push(format!("step {}: {violation}", i + 1));
        }
    }
    Ok((found, verdicts))
}

#[test]
fn the_genuine_policy_never_trips_the_guard_on_any_run_vector() {
    let component = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors");
    let files: Vec<_> = load_dir(&dir).unwrap().into_iter().filter(|f| f.path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("runs-"))).collect();
    assert!(files.len() >= 12, "every runs-*.json: {}", files.len());
    let (mut cases, mut verdicts, mut problems) = (0, 0, Vec::new());
    for file in &files {
        for case in &file.cases {
            cases += 1;
            match observe(&component, case) {
                Ok((found, checked)) if found.is_empty() => verdicts += checked,
                Ok((found, _)) => problems.push(format!("{} / {}: {}", file.path.display(), case.description, found.join("; "))),
                Err(e) => problems.push(format!("{} / {}: runner: {e}", file.path.display(), case.description)),
            }
        }
    }
    println!("{cases} run cases, {verdicts} verdicts observed by the guard");
    assert!(verdicts > cases, "the guard saw the verdicts: {verdicts}");
    assert!(problems.is_empty(), "{} of {cases} cases:\n{}", problems.len(), problems.join("\n"));
}
