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

pub fn decide(wasm: &std::path::Path) -> anyhow::Result<()> {
    let component = PolicyComponent::from_file(wasm)?;
    let mut policy = DynamicPolicy::new(&component).map_err(anyhow::Error::msg)?;
    policy.load_policy("{}").map_err(anyhow::Error::msg)?;
    let mut state = StepState::default();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let answer = match serde_json::from_str::<Value>(&line) {
            Ok(step) => run_step(&mut policy, &step, &mut state).unwrap_or_else(|e| json!({ "error": e })),
            Err(e) => json!({ "error": format!("not JSON: {e}") }),
        };
        writeln!(out, "{answer}")?;
    }
    Ok(())
}
