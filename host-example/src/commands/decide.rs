//! `agent-retry decide`: steps as JSON lines on stdin, the component's answers as
//! JSON lines on stdout. A step is what the conformance vectors use
//! (`tests/vectors/README.md`), e.g. `{"op": "record-outcome", "call-id": 1,
//! "outcome": {"failure": {"kind": {"http-status": 503}}}}`. The policy starts
//! with the defaults; a `load-policy` step replaces it.

use std::io::{BufRead, Write};

use serde_json::{Value, json};

use agent_retry_host::PolicyComponent;
use agent_retry_host::dynamic::DynamicPolicy;
use agent_retry_host::limits::{MAX_BODY_BYTES, MAX_CONFIG_BYTES, MAX_HEADER_VALUE_BYTES, MAX_HEADERS, MAX_ID_BYTES, MAX_STRUCTURED_BYTES, cut};
use agent_retry_host::steps::{StepState, Subject, run_step};

pub fn decide(wasm: &std::path::Path, fuel_per_call: u64, fuel_per_config_byte: u64) -> anyhow::Result<()> {
    let component = PolicyComponent::from_file(wasm)?.with_fuel_per_call(fuel_per_call).with_fuel_per_config_byte(fuel_per_config_byte);
    let fresh = |config: &str| -> anyhow::Result<DynamicPolicy> {
        let mut policy = DynamicPolicy::new(&component).map_err(anyhow::Error::msg)?;
        policy.load_policy(config).map_err(anyhow::Error::msg)?;
        Ok(policy)
    };
    // The configuration in force, to load again in a fresh instance after a trap.
    let mut config = String::from("{}");
    let mut policy = fresh(&config)?;
    let mut state = StepState::default();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let answer = match serde_json::from_str::<Value>(&line).map_err(|e| format!("not JSON: {e}")).and_then(bounded_step) {
            Ok(step) => match run_step(&mut policy, &step, &mut state) {
                Ok(answer) => {
                    if step["op"] == "load-policy" && answer.get("ok").is_some() {
                        config = step.get("config").map(Value::to_string).or_else(|| step["config-text"].as_str().map(String::from)).unwrap_or(config);
                    }
                    answer
                }
                // A trapped instance cannot be entered again: the next steps get a
                // fresh one with the configuration in force. Its runs are gone.
                Err(error) if policy.is_broken() => {
                    policy = fresh(&config)?;
                    state = StepState::default();
                    json!({ "error": error, "recovered": "a fresh instance serves the next steps, with the configuration in force; runs started before the trap are gone" })
                }
                Err(error) => json!({ "error": error }),
            },
            Err(e) => json!({ "error": e }),
        };
        writeln!(out, "{answer}")?;
    }
    Ok(())
}

/// A step with the input limits every wrapper applies before a value crosses
/// the boundary (`agent_retry_host::limits`): a failure's body and an empty
/// result's detail cut to 64 KiB, at most 128 headers of 4 KiB, structured
/// content over 64 KiB dropped; an id over 256 bytes or a configuration over
/// 1 MiB refused, naming it. (A 33 MB tool error once trapped the instance here.)
fn bounded_step(mut step: Value) -> Result<Value, String> {
    // Read with `get`, never indexed mutably: that would add the fields it names.
    for id in ["run-id", "action-id"] {
        refuse_long(step.get(id), id, MAX_ID_BYTES)?;
    }
    for id in ["tool", "idempotency-key"] {
        refuse_long(step.get("call").and_then(|call| call.get(id)), id, MAX_ID_BYTES)?;
    }
    refuse_long(step.get("config-text"), "config-text", MAX_CONFIG_BYTES)?;
    if let Some(config) = step.get("config").filter(|c| c.is_object()) {
        refuse_long(Some(&Value::from(config.to_string())), "config", MAX_CONFIG_BYTES)?;
    }
    if let Some(failure) = step.get_mut("failure") {
        bound_failure(failure);
    }
    if let Some(outcome) = step.get_mut("outcome").and_then(Value::as_object_mut) {
        for (name, value) in outcome.iter_mut() {
            match name.as_str() {
                "failure" | "poll-failure" => bound_failure(value),
                "empty-result" => cut_in_place(value, MAX_BODY_BYTES),
                "task" => {
                    if let Some(message) = value.get_mut("message") {
                        cut_in_place(message, MAX_BODY_BYTES);
                    }
                }
                _ => {}
            }
        }
    }
    Ok(step)
}

fn refuse_long(value: Option<&Value>, name: &str, max: usize) -> Result<(), String> {
    match value.and_then(Value::as_str) {
        Some(text) if text.len() > max => Err(format!("{name} is {} bytes, more than the {max}-byte limit", text.len())),
        _ => Ok(()),
    }
}

fn cut_in_place(value: &mut Value, max: usize) {
    if let Some(text) = value.as_str().filter(|t| t.len() > max) {
        *value = Value::from(cut(text, max));
    }
}

/// A readable failure (`{kind, headers, body, structured-content, ...}`), bounded.
fn bound_failure(failure: &mut Value) {
    let Some(fields) = failure.as_object_mut() else { return };
    if let Some(body) = fields.get_mut("body") {
        cut_in_place(body, MAX_BODY_BYTES);
    }
    if let Some(Value::Array(headers)) = fields.get_mut("headers") {
        headers.truncate(MAX_HEADERS);
        for pair in headers.iter_mut().filter_map(Value::as_array_mut) {
            pair.iter_mut().for_each(|part| cut_in_place(part, MAX_HEADER_VALUE_BYTES));
        }
    }
    if fields.get("structured-content").and_then(Value::as_str).is_some_and(|text| text.len() > MAX_STRUCTURED_BYTES) {
        fields.insert("structured-content".into(), Value::Null);
    }
}
