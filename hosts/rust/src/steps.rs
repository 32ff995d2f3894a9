//! Steps: one operation of the contract, as canonical JSON in and out. The
//! conformance vectors are sequences of steps, and `agent-retry decide` reads
//! them as JSON lines, so both drive the component the same way. The readable
//! steps (`begin-call` of a `call`, `record-outcome` of an `outcome`,
//! `classify` of a `failure`) are translated onto the contract's single path
//! here, and only here.

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

/// Something that answers the operations of the contract 0.9.0, each value
/// in canonical JSON (`{"ok": ..}` / `{"err": ..}` for results). `Err(String)`
/// is a harness failure (bad vector input, a trap), not an answer. The
/// readable steps of the vectors are translated onto these functions in one
/// place, [`run_step`].
pub trait Subject {
    /// `policy.from-json`: `{"ok": <effective-config as JSON>}` or `{"err": config-error}`.
    /// On success the policy becomes the current one.
    fn load_policy(&mut self, config_text: &str) -> Result<Value, String>;
    /// `policy.classify` of an `observation`.
    fn classify(&mut self, observation: &Value, now_ms: u64) -> Result<Value, String>;
    fn next_delay(&mut self, retry: u32, hint_ms: Option<u64>, entropy: u64) -> Result<Value, String>;
    fn derive_idempotency_key(&mut self, run_id: &str, action_id: &str) -> Result<Value, String>;
    /// `rule-names()`: a list of strings.
    fn rule_names(&mut self) -> Result<Value, String>;
    /// `read-probe-answer(http-status, json-rpc-code)`: the enum's case.
    fn read_probe_answer(&mut self, http_status: Option<u16>, json_rpc_code: Option<i32>) -> Result<Value, String>;
    /// `policy.start-run`: `{"ok": null}` (the started run becomes the current
    /// run) or `{"err": run-error}`.
    fn start_run(&mut self, run_id: &str) -> Result<Value, String>;
    /// `run.begin-call`: `result<call-start, run-error>`.
    fn begin_call(&mut self, server: &Value, tool: &Value, idempotency_key: &Value, hints: &Value, now_ms: u64) -> Result<Value, String>;
    /// `run.take-breaker-changes()`: a list of `breaker-change`.
    fn take_breaker_changes(&mut self) -> Result<Value, String>;
    /// Puts `value` under `key` in the shared state the component imports
    /// (a store's write, as another worker's: not a call of the component).
    fn put_shared_state(&mut self, key: &str, value: &str) -> Result<(), String>;
    /// The text under `key` in the shared state, or null.
    fn shared_state(&mut self, key: &str) -> Result<Value, String>;
    /// `run.record-success`: `result<verdict, run-error>`.
    fn record_success(&mut self, call_id: u32, attempt: u32, now_ms: u64) -> Result<Value, String>;
    /// `run.record-empty-result`: `result<verdict, run-error>`.
    fn record_empty_result(&mut self, call_id: u32, attempt: u32, detail: &str, now_ms: u64) -> Result<Value, String>;
    /// `run.record-failure` of an `observation`: `result<verdict, run-error>`.
    fn record_failure(
        &mut self,
        call_id: u32,
        attempt: u32,
        observation: &Value,
        time_left_ms: Option<u64>,
        now_ms: u64,
        entropy: u64,
    ) -> Result<Value, String>;
    /// `run.record-status-check` (`found` / `absent` / `unknown`): `result<verdict, run-error>`.
    fn record_status_check(
        &mut self,
        call_id: u32,
        attempt: u32,
        result: &Value,
        time_left_ms: Option<u64>,
        now_ms: u64,
        entropy: u64,
    ) -> Result<Value, String>;
    /// `run.record-task-status` of a `task-report`: `result<verdict, run-error>`.
    fn record_task_status(&mut self, call_id: u32, attempt: u32, task: &Value, time_left_ms: Option<u64>, now_ms: u64, entropy: u64) -> Result<Value, String>;
    /// `run.record-poll-failure` of an `observation`: `result<verdict, run-error>`.
    fn record_poll_failure(
        &mut self,
        call_id: u32,
        attempt: u32,
        observation: &Value,
        time_left_ms: Option<u64>,
        now_ms: u64,
        entropy: u64,
    ) -> Result<Value, String>;
    /// `run.abandon-call(call-id, attempt, sent, why)`: `{"ok": null}` or `{"err": run-error}`.
    fn abandon_call(&mut self, call_id: u32, attempt: u32, sent: bool, why: &str) -> Result<Value, String>;
    /// `run.last-decision(call-id)`: a decision or null.
    fn last_decision(&mut self, call_id: u32) -> Result<Value, String>;
    /// `run.escalation()`: an escalation or null.
    fn escalation(&mut self) -> Result<Value, String>;
    fn report(&mut self) -> Result<Value, String>;
    fn effects(&mut self, start: u32, max_count: u32) -> Result<Value, String>;
    /// `run.snapshot(arguments-json, now-ms)`: `{"ok": text}` or `{"err": snapshot-error}`.
    fn snapshot(&mut self, arguments_json: Option<&str>, now_ms: u64) -> Result<Value, String>;
    /// `policy.resume-run(snapshot, answer, now-ms)`, then `run.resumed-call()`:
    /// `{"ok": resumed-call}` (the resumed run becomes the current one) or
    /// `{"err": snapshot-error}`. `answer` is canonical JSON: `"retry"`,
    /// `{"done": text-or-null}`, `"skip"`, `"abort"`.
    fn resume_run(&mut self, snapshot: &str, answer: &Value, now_ms: u64) -> Result<Value, String>;
}

/// The clock and run state a sequence of steps carries from one to the next.
pub struct StepState {
    pub now_ms: u64,
    pub run_started: bool,
    /// Per call id, the attempt the host sent last: 1 after `begin-call`, then
    /// each retry plan's `attempt` (what a `record-outcome` reports by default).
    pub attempts: std::collections::HashMap<u32, u32>,
    /// The last snapshot a `snapshot` step took, for the next `resume`.
    pub snapshot: Option<String>,
}

impl Default for StepState {
    fn default() -> Self {
        StepState { now_ms: DEFAULT_START_MS, run_started: false, attempts: std::collections::HashMap::new(), snapshot: None }
    }
}

/// A readable failure's `headers` (`[[name, value], ...]`) as an
/// observation's `name: value` lines.
pub fn header_lines_json(headers: Option<&Value>) -> Result<String, String> {
    let Some(headers) = headers.filter(|h| !h.is_null()) else { return Ok(String::new()) };
    let pairs: Vec<(String, String)> = serde_json::from_value(headers.clone()).map_err(|e| format!("bad headers {headers}: {e}"))?;
    Ok(crate::limits::header_lines(&pairs))
}

/// A readable failure (`{kind, headers: [[name, value], ...], body,
/// structured-content, session-id-sent?, delivery?}`) as the `observation`
/// the contract takes: headers joined as lines, `session-id-sent` false and
/// `delivery` `unknown` unless given.
pub fn observation_json(failure: &Value) -> Result<Value, String> {
    let object = failure.as_object().ok_or_else(|| format!("a failure must be an object: {failure}"))?;
    const KEYS: &[&str] = &["kind", "headers", "body", "structured-content", "session-id-sent", "delivery"];
    if let Some(unknown) = object.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(format!("unknown failure field \"{unknown}\""));
    }
    let field = |name: &str, default: Value| object.get(name).filter(|v| !v.is_null()).cloned().unwrap_or(default);
    Ok(json!({
        "kind": field("kind", Value::Null),
        "headers": header_lines_json(object.get("headers"))?,
        "body": field("body", Value::from("")),
        "structured-content": field("structured-content", Value::Null),
        "session-id-sent": field("session-id-sent", Value::Bool(false)),
        "delivery": field("delivery", Value::from("unknown")),
    }))
}

/// A readable task report (`{task-id, status, poll-interval-ms?, ttl-ms?,
/// age-ms?, message?}`) as the `task-report` the contract takes.
pub fn task_report_json(task: &Value) -> Result<Value, String> {
    let object = task.as_object().ok_or_else(|| format!("a task report must be an object: {task}"))?;
    const KEYS: &[&str] = &["task-id", "status", "poll-interval-ms", "ttl-ms", "age-ms", "message"];
    if let Some(unknown) = object.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(format!("unknown task report field \"{unknown}\""));
    }
    let field = |name: &str, default: Value| object.get(name).filter(|v| !v.is_null()).cloned().unwrap_or(default);
    Ok(json!({
        "task-id": field("task-id", Value::Null),
        "status": field("status", Value::Null),
        "poll-interval-ms": field("poll-interval-ms", Value::Null),
        "ttl-ms": field("ttl-ms", Value::Null),
        "age-ms": field("age-ms", Value::Null),
        "message": field("message", Value::from("")),
    }))
}

/// `begin-call` of a readable `call` (`{server, tool, idempotency-key,
/// hints}`), answered readably: `{"ok": {"send": ticket}}`, `{"ok":
/// {"replan": last-decision}}` when a breaker refused it, `{"ok":
/// {"escalate": escalation()}}` when not admitted, or `{"err": run-error}`.
fn begin_call(subject: &mut dyn Subject, call: &Value, now_ms: u64) -> Result<Value, String> {
    let field = |name: &str| call.get(name).cloned().unwrap_or(Value::Null);
    let answer = subject.begin_call(&field("server"), &field("tool"), &field("idempotency-key"), &field("hints"), now_ms)?;
    let Some(start) = answer.get("ok") else { return Ok(answer) };
    if start["admitted"] == json!(true) {
        let ticket = json!({
            "call-id": start["call-id"], "delay-ms": start["delay-ms"], "effect": start["effect"], "safe-to-repeat": start["safe-to-repeat"],
            "idle-timeout-ms": start["idle-timeout-ms"], "attempt-timeout-ms": start["attempt-timeout-ms"],
        });
        return Ok(json!({ "ok": { "send": ticket } }));
    }
    if start["replan"] == json!(true) {
        let call_id = start["call-id"].as_u64().and_then(|id| u32::try_from(id).ok()).ok_or("a replan's call-start has no call id")?;
        return match subject.last_decision(call_id)? {
            Value::Null => Err(format!("begin-call answered a replan, and call {call_id} has no decision")),
            decision => Ok(json!({ "ok": { "replan": decision } })),
        };
    }
    match subject.escalation()? {
        Value::Null => Err(format!("begin-call did not admit the call, and the run has no escalation: {start}")),
        escalation => Ok(json!({ "ok": { "escalate": escalation } })),
    }
}

/// `record-outcome` of a readable outcome through the report it stands for,
/// answered with `last-decision` (checked against the verdict).
fn record_outcome(
    subject: &mut dyn Subject,
    call_id: u32,
    attempt: u32,
    outcome: &Value,
    time_left_ms: Option<u64>,
    now_ms: u64,
    entropy: u64,
) -> Result<Value, String> {
    let answer = if outcome == "success" {
        subject.record_success(call_id, attempt, now_ms)?
    } else if let Some(detail) = outcome.get("empty-result") {
        let detail = detail.as_str().ok_or_else(|| format!("empty-result takes a string: {detail}"))?;
        subject.record_empty_result(call_id, attempt, detail, now_ms)?
    } else if let Some(failure) = outcome.get("failure") {
        subject.record_failure(call_id, attempt, &observation_json(failure)?, time_left_ms, now_ms, entropy)?
    } else if let Some(result) = outcome.get("status-check") {
        subject.record_status_check(call_id, attempt, result, time_left_ms, now_ms, entropy)?
    } else if let Some(task) = outcome.get("task") {
        subject.record_task_status(call_id, attempt, &task_report_json(task)?, time_left_ms, now_ms, entropy)?
    } else if let Some(failure) = outcome.get("poll-failure") {
        subject.record_poll_failure(call_id, attempt, &observation_json(failure)?, time_left_ms, now_ms, entropy)?
    } else {
        return Err(format!("an outcome of an unknown shape: {outcome}"));
    };
    let Some(verdict) = answer.get("ok") else { return Ok(answer) };
    let decision = subject.last_decision(call_id)?;
    if decision.is_null() {
        return Err(format!("last-decision({call_id}) is none right after a verdict {verdict}"));
    }
    let rule_names = subject.rule_names()?;
    check_verdict(verdict, &decision, &rule_names)?;
    Ok(json!({ "ok": decision }))
}

/// The verdict says what the decision says: the action, class, attempt, delay,
/// hint, rule, whether it carries text, whether a retry or a poll reconnects,
/// and whether the task is cancelled.
pub fn check_verdict(verdict: &Value, decision: &Value, rule_names: &Value) -> Result<(), String> {
    let action = &decision["action"];
    let (kind, delay, has_note, reconnect) = match action {
        Value::String(case) => (case.as_str(), json!(0), false, false),
        Value::Object(case) => {
            let (name, payload) = case.iter().next().ok_or("an empty action")?;
            if name == "retry" || name == "poll" {
                (name.as_str(), payload["delay-ms"].clone(), false, payload["reconnect"] == json!(true))
            } else {
                (name.as_str(), json!(0), !payload.is_null(), false)
            }
        }
        other => return Err(format!("an action of an unknown shape: {other}")),
    };
    let rule = rule_names.get(verdict["rule-index"].as_u64().unwrap_or(u64::MAX) as usize).cloned().unwrap_or(Value::Null);
    let expected = json!({
        "action": kind, "class": decision["class"], "attempt": decision["attempt"], "delay-ms": delay,
        "hint-ms": decision["hint-ms"], "rule": decision["rule"], "has-note": has_note, "reconnect": reconnect,
        "cancel-task": decision["cancel-task"],
    });
    let actual = json!({
        "action": verdict["action"], "class": verdict["class"], "attempt": verdict["attempt"], "delay-ms": verdict["delay-ms"],
        "hint-ms": verdict["hint-ms"], "rule": rule, "has-note": verdict["has-note"], "reconnect": verdict["reconnect"],
        "cancel-task": verdict["cancel-task"],
    });
    if expected != actual {
        return Err(format!("the verdict {actual} does not say what its last-decision says: {expected}"));
    }
    Ok(())
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
    "sent",
    "why",
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
    "time-left-ms",
    "http-status",
    "json-rpc-code",
    "comment",
    "key",
    "value",
    "arguments-json",
    "answer",
    "edit",
    "snapshot-text",
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
    let needs_run = matches!(op, "begin-call" | "record-outcome" | "report" | "effects" | "breaker-changes" | "last-decision" | "escalation" | "snapshot");
    let time_left_ms = optional_u64(step, "time-left-ms")?;
    if needs_run && !*started {
        subject.start_run("run-1")?;
        *started = true;
    }
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
        "classify" => subject.classify(&observation_json(field(step, "failure")?)?, *now_ms),
        "read-probe-answer" => {
            let status = match step.get("http-status") {
                None | Some(Value::Null) => None,
                Some(v) => Some(v.as_u64().and_then(|s| u16::try_from(s).ok()).ok_or("\"http-status\" must be a u16 or null")?),
            };
            let code = match step.get("json-rpc-code") {
                None | Some(Value::Null) => None,
                Some(v) => Some(v.as_i64().and_then(|c| i32::try_from(c).ok()).ok_or("\"json-rpc-code\" must be an s32 or null")?),
            };
            subject.read_probe_answer(status, code)
        }
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
            let answer = begin_call(subject, call, *now_ms)?;
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
            let answer = record_outcome(subject, call_id, attempt, outcome, time_left_ms, *now_ms, entropy)?;
            if let Some(next) = answer["ok"]["action"]["retry"]["attempt"].as_u64().and_then(|a| u32::try_from(a).ok()) {
                attempts.insert(call_id, next);
            }
            Ok(answer)
        }
        "abandon-call" => {
            let call_id = u32_field(step, "call-id")?;
            let attempt = match step.get("attempt") {
                Some(_) => u32_field(step, "attempt")?,
                None => attempts.get(&call_id).copied().unwrap_or(1),
            };
            let sent = step.get("sent").map_or(Ok(true), |v| v.as_bool().ok_or("sent is not a boolean"))?;
            let why = step.get("why").and_then(Value::as_str).ok_or("abandon-call needs why: cancelled or deadline")?;
            subject.abandon_call(call_id, attempt, sent, why)
        }
        "report" => subject.report(),
        "effects" => subject.effects(u32_field(step, "start")?, u32_field(step, "max-count")?),
        "breaker-changes" => subject.take_breaker_changes(),
        "last-decision" => subject.last_decision(u32_field(step, "call-id")?),
        "escalation" => subject.escalation(),
        "put-shared-state" => {
            subject.put_shared_state(text(step, "key")?, text(step, "value")?)?;
            Ok(Value::Null)
        }
        "shared-state" => subject.shared_state(text(step, "key")?),
        "snapshot" => {
            let arguments = step.get("arguments-json").and_then(Value::as_str);
            let answer = subject.snapshot(arguments, *now_ms)?;
            state.snapshot = answer["ok"].as_str().map(String::from);
            Ok(answer)
        }
        "resume" => {
            // The last snapshot, or a text given; `edit` replaces one piece of it
            // (`[from, to]`, which must occur), as a person or a store might.
            let mut text = match step.get("snapshot-text") {
                Some(Value::String(given)) => given.clone(),
                Some(_) => return Err("snapshot-text must be a string".into()),
                None => state.snapshot.clone().ok_or("resume needs a snapshot step first, or snapshot-text")?,
            };
            if let Some(edit) = step.get("edit") {
                let [from, to] = edit.as_array().map(Vec::as_slice).unwrap_or_default() else { return Err("edit must be [from, to]".into()) };
                let (Some(from), Some(to)) = (from.as_str(), to.as_str()) else { return Err("edit must be two strings".into()) };
                if !text.contains(from) {
                    return Err(format!("edit: {from:?} is not in the snapshot"));
                }
                text = text.replacen(from, to, 1);
            }
            let answer = subject.resume_run(&text, field(step, "answer")?, *now_ms)?;
            if let Some(call) = answer.get("ok") {
                *started = true;
                if let (Some(id), Some(attempt)) = (call["call-id"].as_u64(), call["attempt"].as_u64()) {
                    attempts.insert(id as u32, attempt as u32);
                }
            }
            Ok(answer)
        }
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
