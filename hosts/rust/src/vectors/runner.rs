//! Runs one case's steps against a subject and checks them.

use serde_json::Value;

use crate::guard::RunGuard;
use crate::steps::{StepState, run_step};
pub use crate::steps::{Subject, result_json};

use super::format::{Case, ObservationCase};
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

/// [`run_case`], with `default_config` for a case that names no configuration.
pub fn run_case_in(case: &Case, default_config: &str, subject: &mut dyn Subject) -> CaseResult {
    let mut outputs = Vec::new();
    let mut state = StepState::default();
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
        let expected = match step.get("expect").map(|expected| with_config_values(expected, &config)).transpose() {
            Ok(expected) => expected,
            Err(e) => return CaseResult { outputs, failure: Some(format!("step {} ({}): {e}", i + 1, step["op"])) },
        };
        if let Some(expected) = expected
            && let Err(mismatch) = matches(&expected, &output)
        {
            let failure = format!("step {} ({}): {mismatch}", i + 1, step["op"]);
            outputs.push(output);
            return CaseResult { outputs, failure: Some(failure) };
        }
        outputs.push(output);
    }
    CaseResult { outputs, failure: None }
}

/// `expected` with each `{"$config": field}` replaced by that field of the
/// configuration the case runs under (`config_text`), read by the host (its
/// run-time guard's reading, with the guest's defaults), never by the
/// component under test. A field the guard does not read is an error naming it.
pub fn with_config_values(expected: &Value, config_text: &str) -> Result<Value, String> {
    Ok(match expected {
        Value::Object(object) if object.len() == 1 && object.get("$config").is_some_and(Value::is_string) => {
            let field = object["$config"].as_str().unwrap_or_default();
            let cap = RunGuard::from_config_text(config_text).cap(field);
            Value::from(cap.ok_or_else(|| format!("$config names {field:?}; the host reads {}", RunGuard::CAP_FIELDS.join(", ")))?)
        }
        Value::Object(object) => {
            Value::Object(object.iter().map(|(k, v)| Ok((k.clone(), with_config_values(v, config_text)?))).collect::<Result<_, String>>()?)
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| with_config_values(v, config_text)).collect::<Result<_, _>>()?),
        other => other.clone(),
    })
}

/// The tool every case of `observations.json` calls.
pub const OBSERVED_TOOL: &str = "lookup_order";

/// A verdict as `observations.json`'s `expect` names it: the action, the
/// class, the rule's name and whether a retry reconnects.
pub fn verdict_summary(verdict: &Value, rule_names: &Value) -> Value {
    let rule = rule_names.get(verdict["rule-index"].as_u64().unwrap_or(u64::MAX) as usize).cloned().unwrap_or(Value::Null);
    serde_json::json!({ "action": verdict["action"], "class": verdict["class"], "rule": rule, "reconnect": verdict["reconnect"] })
}

/// One case of `observations.json` in its pure form: a run under the file's
/// `config`, `begin-call` of `lookup_order`, `record-failure` of the case's
/// observation as attempt 1; the verdict must match the case's `expect`.
/// `Ok` is the verdict's summary ([`verdict_summary`]).
pub fn run_observation_case(config: &Value, case: &ObservationCase, subject: &mut dyn Subject) -> Result<Value, String> {
    let loaded = subject.load_policy(&config.to_string())?;
    if loaded.get("ok").is_none() {
        return Err(format!("the file's config was rejected: {loaded}"));
    }
    let started = subject.start_run("run-1")?;
    if started.get("ok").is_none() {
        return Err(format!("start-run: {started}"));
    }
    let now_ms = crate::steps::DEFAULT_START_MS;
    let start = subject.begin_call(&Value::Null, &Value::from(OBSERVED_TOOL), &Value::Null, &Value::Null, now_ms)?;
    let call_id = match start.get("ok") {
        Some(start) if start["admitted"] == Value::Bool(true) => start["call-id"].as_u64().and_then(|id| u32::try_from(id).ok()).ok_or("no call-id")?,
        _ => return Err(format!("begin-call did not admit {OBSERVED_TOOL}: {start}")),
    };
    let observation = crate::steps::observation_json(&case.observation)?;
    let answer = subject.record_failure(call_id, 1, &observation, None, now_ms, crate::steps::DEFAULT_ENTROPY)?;
    let verdict = answer.get("ok").ok_or_else(|| format!("record-failure: {answer}"))?;
    let summary = verdict_summary(verdict, &subject.rule_names()?);
    matches(&case.expect, &summary).map_err(|mismatch| format!("verdict {summary}: {mismatch}"))?;
    Ok(summary)
}
