//! Runs one case's steps against a subject and checks them.

use serde_json::{Value, json};

use crate::matcher::matches;
use crate::vector::{Case, DEFAULT_ENTROPY, DEFAULT_START_MS, parse_u64};

/// Something that answers the operations of the contract. Outputs are the
/// canonical JSON of the WIT result (`{"ok": ..}` / `{"err": ..}` for results).
/// `Err(String)` is a harness failure (bad vector input, a trap), not an answer.
pub trait Subject {
    /// `policy.from-json`: `{"ok": <effective-config as JSON>}` or `{"err": config-error}`.
    /// On success the policy becomes the current one.
    fn load_policy(&mut self, config_text: &str) -> Result<Value, String>;
    fn classify(&mut self, failure: &Value, now_ms: u64) -> Result<Value, String>;
    fn next_delay(&mut self, retry: u32, hint_ms: Option<u64>, entropy: u64) -> Result<Value, String>;
    fn derive_idempotency_key(&mut self, run_id: &str, action_id: &str) -> Result<Value, String>;
    /// `policy.start-run`: the started run becomes the current run.
    fn start_run(&mut self, run_id: &str) -> Result<(), String>;
    fn begin_call(&mut self, call: &Value, now_ms: u64) -> Result<Value, String>;
    fn record_outcome(&mut self, call_id: u32, outcome: &Value, now_ms: u64, entropy: u64) -> Result<Value, String>;
    fn report(&mut self) -> Result<Value, String>;
}

/// What a case did: each step's output, and the first failure if any.
#[derive(Debug)]
pub struct CaseResult {
    pub outputs: Vec<Value>,
    pub failure: Option<String>,
}

fn field<'a>(step: &'a Value, name: &str) -> Result<&'a Value, String> {
    step.get(name).ok_or_else(|| format!("the step has no \"{name}\""))
}

fn text<'a>(step: &'a Value, name: &str) -> Result<&'a str, String> {
    field(step, name)?.as_str().ok_or_else(|| format!("\"{name}\" must be a string"))
}

fn optional_u64(step: &Value, name: &str) -> Result<Option<u64>, String> {
    match step.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => parse_u64(v).map(Some).map_err(|e| format!("\"{name}\": {e}")),
    }
}

const STEP_KEYS: &[&str] = &[
    "op", "expect", "now-ms", "entropy", "config", "config-text", "failure", "retry", "hint-ms", "run-id",
    "action-id", "call", "call-id", "outcome", "comment",
];

fn run_step(subject: &mut dyn Subject, step: &Value, now_ms: &mut u64, started: &mut bool) -> Result<Value, String> {
    let keys = step.as_object().ok_or("a step must be an object")?;
    if let Some(unknown) = keys.keys().find(|k| !STEP_KEYS.contains(&k.as_str())) {
        return Err(format!("unknown step field \"{unknown}\""));
    }
    if let Some(now) = optional_u64(step, "now-ms")? {
        *now_ms = now;
    }
    let entropy = optional_u64(step, "entropy")?.unwrap_or(DEFAULT_ENTROPY);
    let op = text(step, "op")?;
    let needs_run = matches!(op, "begin-call" | "record-outcome" | "report");
    if needs_run && !*started {
        subject.start_run("run-1")?;
        *started = true;
    }
    match op {
        "load-policy" => {
            let config_text = match (step.get("config"), step.get("config-text")) {
                (Some(config), None) => config.to_string(),
                (None, Some(Value::String(text))) => text.clone(),
                _ => return Err("load-policy takes \"config\" (JSON) or \"config-text\" (a string)".into()),
            };
            subject.load_policy(&config_text)
        }
        "classify" => subject.classify(field(step, "failure")?, *now_ms),
        "next-delay" => {
            let retry = field(step, "retry")?.as_u64().and_then(|r| u32::try_from(r).ok()).ok_or("\"retry\" must be a u32")?;
            subject.next_delay(retry, optional_u64(step, "hint-ms")?, entropy)
        }
        "derive-idempotency-key" => subject.derive_idempotency_key(text(step, "run-id")?, text(step, "action-id")?),
        "start-run" => {
            subject.start_run(text(step, "run-id")?)?;
            *started = true;
            Ok(Value::Null)
        }
        "begin-call" => subject.begin_call(field(step, "call")?, *now_ms),
        "record-outcome" => {
            let call_id = field(step, "call-id")?.as_u64().and_then(|r| u32::try_from(r).ok()).ok_or("\"call-id\" must be a u32")?;
            subject.record_outcome(call_id, field(step, "outcome")?, *now_ms, entropy)
        }
        "report" => subject.report(),
        other => Err(format!("unknown op \"{other}\"")),
    }
}

/// Runs `case` against `subject`: loads the case's configuration, then each step.
pub fn run_case(case: &Case, subject: &mut dyn Subject) -> CaseResult {
    let mut outputs = Vec::new();
    let mut now_ms = DEFAULT_START_MS;
    let mut started = false;
    match subject.load_policy(&case.config.to_string()) {
        Ok(loaded) if loaded.get("ok").is_some() => {}
        Ok(loaded) => return CaseResult { outputs, failure: Some(format!("the case's config was rejected: {loaded}")) },
        Err(e) => return CaseResult { outputs, failure: Some(format!("loading the case's config: {e}")) },
    }
    for (i, step) in case.steps.iter().enumerate() {
        let output = match run_step(subject, step, &mut now_ms, &mut started) {
            Ok(output) => output,
            Err(e) => return CaseResult { outputs, failure: Some(format!("step {}: {e}", i + 1)) },
        };
        if let Some(expected) = step.get("expect") {
            if let Err(mismatch) = matches(expected, &output) {
                let failure = format!("step {} ({}): {mismatch}", i + 1, step["op"]);
                outputs.push(output);
                return CaseResult { outputs, failure: Some(failure) };
            }
        }
        outputs.push(output);
    }
    CaseResult { outputs, failure: None }
}

/// `{"ok": v}` or `{"err": e}`.
pub fn result_json(result: Result<Value, Value>) -> Value {
    match result {
        Ok(v) => json!({ "ok": v }),
        Err(e) => json!({ "err": e }),
    }
}
