//! Runs one case's steps against a subject and checks them.

use serde_json::Value;

use crate::steps::{StepState, run_step};
pub use crate::steps::{Subject, result_json};

use super::format::Case;
use super::matcher::matches;

/// What a case did: each step's output, and the first failure if any.
#[derive(Debug)]
pub struct CaseResult {
    pub outputs: Vec<Value>,
    pub failure: Option<String>,
}

/// Runs `case` against `subject`: loads the case's configuration (`{}` if it
/// has none), then each step.
pub fn run_case(case: &Case, subject: &mut dyn Subject) -> CaseResult {
    run_case_in(case, "{}", subject)
}

/// [`run_case`] through the flat hot path ([`crate::flat`]): its outputs must
/// be the rich path's.
pub fn run_case_flat(case: &Case, subject: &mut dyn Subject) -> CaseResult {
    run_case_with(case, "{}", subject, true)
}

/// [`run_case`], with `default_config` for a case that names no configuration.
pub fn run_case_in(case: &Case, default_config: &str, subject: &mut dyn Subject) -> CaseResult {
    run_case_with(case, default_config, subject, false)
}

fn run_case_with(case: &Case, default_config: &str, subject: &mut dyn Subject, flat: bool) -> CaseResult {
    let mut outputs = Vec::new();
    let mut state = StepState { flat, ..StepState::default() };
    let config = case.config.as_ref().map_or_else(|| default_config.to_string(), Value::to_string);
    match subject.load_policy(&config) {
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
