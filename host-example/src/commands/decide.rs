//! `agent-retry decide`: steps as JSON lines on stdin, the component's answers as
//! JSON lines on stdout. A step is what the conformance vectors use
//! (`tests/vectors/README.md`), e.g. `{"op": "record-outcome", "call-id": 1,
//! "outcome": {"failure": {"kind": {"http-status": 503}}}}`. The policy starts
//! with the defaults; a `load-policy` step replaces it.

use std::io::{BufRead, Write};

use serde_json::{Value, json};

use agent_retry_host::PolicyComponent;
use agent_retry_host::dynamic::DynamicPolicy;
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
        let answer = match serde_json::from_str::<Value>(&line) {
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
            Err(e) => json!({ "error": format!("not JSON: {e}") }),
        };
        writeln!(out, "{answer}")?;
    }
    Ok(())
}
