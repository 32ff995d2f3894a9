//! Runs one case's steps against a subject and checks them.

use serde_json::Value;

use agent_retry_host::steps::{StepState, run_step};
pub use agent_retry_host::steps::{Subject, result_json};

use crate::matcher::matches;
use crate::vector::Case;

/// What a case did: each step's output, and the first failure if any.
#[derive(Debug)]
pub struct CaseResult {
    pub outputs: Vec<Value>,
    pub failure: Option<String>,
}

/// Runs `case` against `subject`: loads the case's configuration, then each step.
pub fn run_case(case: &Case, subject: &mut dyn Subject) -> CaseResult {
    let mut outputs = Vec::new();
    let mut state = StepState::default();
    match subject.load_policy(&case.config.to_string()) {
        Ok(loaded) if loaded.get("ok").is_some() => {}
        Ok(loaded) => return CaseResult { outputs, failure: Some(format!("the case's config was rejected: {loaded}")) },
        Err(e) => return CaseResult { outputs, failure: Some(format!("loading the case's config: {e}")) },
    }
    for (i, step) in case.steps.iter().enumerate() {
        let output = match run_step(subject, step, &mut state) {
            Ok(output) => output,
            Err(e) => return CaseResult { outputs, failure: Some(format!("step {}: {e}", i + 1)) },
        };
        if let Some(expected) = step.get("expect")
            && let Err(mismatch) = matches(expected, &output)
        {
            let failure = format!("step {} ({}): {mismatch}", i + 1, step["op"]);
            outputs.push(output);
            return CaseResult { outputs, failure: Some(failure) };
        }
        outputs.push(output);
    }
    CaseResult { outputs, failure: None }
}
