//! Steps: one operation of the contract, as canonical JSON in and out. The
//! conformance vectors are sequences of steps, and `agent-retry decide` reads
//! them as JSON lines, so both drive the component the same way.

use serde_json::{Value, json};

/// The clock at the start of every case unless a step says otherwise:
/// 2025-11-30T00:00:00Z.
pub const DEFAULT_START_MS: u64 = 1_764_460_800_000;

/// The entropy a step uses when it gives none: the middle of the range.
pub const DEFAULT_ENTROPY: u64 = 0x8000_0000_0000_0000;

/// A u64 written as a JSON number or a `0x` hex string (JSON numbers lose
/// precision above 2^53 in JavaScript).
pub fn parse_u64(value: &Value) -> Result<u64, String> {
    match value {
        Value::Number(n) => n.as_u64().ok_or_else(|| format!("{n} is not a u64")),
        Value::String(s) => {
            let hex = s.strip_prefix("0x").ok_or_else(|| format!("\"{s}\" is not a 0x hex u64"))?;
            u64::from_str_radix(hex, 16).map_err(|e| format!("\"{s}\": {e}"))
        }
        other => Err(format!("{other} is not a u64")),
    }
}

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
    /// `policy.start-run`: `{"ok": null}` (the started run becomes the current
    /// run) or `{"err": run-error}`.
    fn start_run(&mut self, run_id: &str) -> Result<Value, String>;
    fn begin_call(&mut self, call: &Value, now_ms: u64) -> Result<Value, String>;
    fn record_outcome(&mut self, call_id: u32, attempt: u32, outcome: &Value, now_ms: u64, entropy: u64) -> Result<Value, String>;
    fn report(&mut self) -> Result<Value, String>;
    fn effects(&mut self, start: u32, max_count: u32) -> Result<Value, String>;

    // The flat hot path (contract 0.4.0), for [`crate::flat`].
    /// `rule-names()`: a list of strings.
    fn rule_names(&mut self) -> Result<Value, String>;
    /// `run.begin-call-flat` of a `call-request`: `result<call-start, run-error>`.
    fn begin_call_flat(&mut self, call: &Value, now_ms: u64) -> Result<Value, String>;
    /// `run.record-success`: `result<verdict, run-error>`.
    fn record_success(&mut self, call_id: u32, attempt: u32, now_ms: u64) -> Result<Value, String>;
    /// `run.record-failure` of a `failure` (its headers passed as lines): `result<verdict, run-error>`.
    fn record_failure(&mut self, call_id: u32, attempt: u32, failure: &Value, now_ms: u64, entropy: u64) -> Result<Value, String>;
    /// `run.last-decision(call-id)`: a decision or null.
    fn last_decision(&mut self, call_id: u32) -> Result<Value, String>;
    /// `run.escalation()`: an escalation or null.
    fn escalation(&mut self) -> Result<Value, String>;
}

/// The clock and run state a sequence of steps carries from one to the next.
pub struct StepState {
    pub now_ms: u64,
    pub run_started: bool,
    /// Per call id, the attempt the host sent last: 1 after `begin-call`, then
    /// each retry plan's `attempt` (what a `record-outcome` reports by default).
    pub attempts: std::collections::HashMap<u32, u32>,
    /// Whether `begin-call` and `record-outcome` go through the flat hot path
    /// ([`crate::flat`]); their answers are in the rich form either way.
    pub flat: bool,
}

impl Default for StepState {
    fn default() -> Self {
        StepState { now_ms: DEFAULT_START_MS, run_started: false, attempts: std::collections::HashMap::new(), flat: false }
    }
}

fn u32_field(step: &Value, name: &str) -> Result<u32, String> {
    field(step, name)?.as_u64().and_then(|r| u32::try_from(r).ok()).ok_or_else(|| format!("\"{name}\" must be a u32"))
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
    "op",
    "expect",
    "now-ms",
    "entropy",
    "config",
    "config-text",
    "failure",
    "retry",
    "hint-ms",
    "run-id",
    "action-id",
    "call",
    "call-id",
    "attempt",
    "outcome",
    "start",
    "max-count",
    "comment",
];

/// Runs one step; `Err` is a harness failure (bad step, trap), not an answer.
pub fn run_step(subject: &mut dyn Subject, step: &Value, state: &mut StepState) -> Result<Value, String> {
    let now_ms = &mut state.now_ms;
    let started = &mut state.run_started;
    let keys = step.as_object().ok_or("a step must be an object")?;
    if let Some(unknown) = keys.keys().find(|k| !STEP_KEYS.contains(&k.as_str())) {
        return Err(format!("unknown step field \"{unknown}\""));
    }
    if let Some(now) = optional_u64(step, "now-ms")? {
        *now_ms = now;
    }
    let entropy = optional_u64(step, "entropy")?.unwrap_or(DEFAULT_ENTROPY);
    let op = text(step, "op")?;
    let needs_run = matches!(op, "begin-call" | "record-outcome" | "report" | "effects");
    if needs_run && !*started {
        subject.start_run("run-1")?;
        *started = true;
    }
    let flat = state.flat;
    let attempts = &mut state.attempts;
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
            let answer = subject.start_run(text(step, "run-id")?)?;
            if answer.get("ok").is_some() {
                *started = true;
                attempts.clear();
            }
            Ok(answer)
        }
        "begin-call" => {
            let call = field(step, "call")?;
            let answer = if flat { crate::flat::begin_call(subject, call, *now_ms)? } else { subject.begin_call(call, *now_ms)? };
            if let Some(call_id) = answer["ok"]["send"]["call-id"].as_u64().and_then(|id| u32::try_from(id).ok()) {
                attempts.insert(call_id, 1);
            }
            Ok(answer)
        }
        "record-outcome" => {
            let call_id = u32_field(step, "call-id")?;
            let attempt = match step.get("attempt") {
                Some(_) => u32_field(step, "attempt")?,
                None => attempts.get(&call_id).copied().unwrap_or(1),
            };
            let outcome = field(step, "outcome")?;
            let answer = if flat {
                crate::flat::record_outcome(subject, call_id, attempt, outcome, *now_ms, entropy)?
            } else {
                subject.record_outcome(call_id, attempt, outcome, *now_ms, entropy)?
            };
            if let Some(next) = answer["ok"]["action"]["retry"]["attempt"].as_u64().and_then(|a| u32::try_from(a).ok()) {
                attempts.insert(call_id, next);
            }
            Ok(answer)
        }
        "report" => subject.report(),
        "effects" => subject.effects(u32_field(step, "start")?, u32_field(step, "max-count")?),
        other => Err(format!("unknown op \"{other}\"")),
    }
}

/// `{"ok": v}` or `{"err": e}`.
pub fn result_json(result: Result<Value, Value>) -> Value {
    match result {
        Ok(v) => json!({ "ok": v }),
        Err(e) => json!({ "err": e }),
    }
}
