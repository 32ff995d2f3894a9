//! The guard vectors (`tests/vectors/guard/guard.json`, format in its
//! README): readable events applied in order to a fresh [`RunGuard`], and the
//! readable forms of what the guard reads (an outcome, a verdict, words), for
//! any runner that drives a guard from the vectors.

use serde::Deserialize;
use serde_json::Value;

use crate::component::types::{ActionKind, Delivery, StatusCheckResult, ToolHints, TransportError};
use crate::guard::{Asked, CallIndex, Polled, RunGuard, Said, Seen, Violation, speaks_of_retrying};
use crate::labels;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardFile {
    pub description: String,
    pub cases: Vec<GuardCase>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuardCase {
    pub description: String,
    #[serde(default)]
    pub comment: Option<String>,
    pub config: Value,
    pub events: Vec<Value>,
    /// `{"violation": name, "event": index}` or `{"violation": null}`.
    pub expect: Value,
}

/// The first violation of a replay, and the index of the event it refused.
pub type FirstViolation = Option<(usize, Violation)>;

/// Applies `case`'s events to a fresh guard until the first violation.
pub fn replay(case: &GuardCase) -> Result<FirstViolation, String> {
    let mut guard = RunGuard::from_config(&case.config);
    let mut calls: Vec<CallIndex> = Vec::new();
    for (i, event) in case.events.iter().enumerate() {
        let named =
            event.get("call").map(|c| c.as_u64().and_then(|c| usize::try_from(c).ok()).ok_or_else(|| format!("event {i}: bad call {c}"))).transpose()?;
        let call = match named {
            Some(n) => *calls.get(n).ok_or_else(|| format!("event {i}: call {n} was never begun"))?,
            None => calls.last().copied().unwrap_or(0),
        };
        let checked = if let Some(begin) = event.get("begin") {
            let hints = tool_hints(&begin["hints"])?;
            let delay = begin["delay-ms"].as_u64().ok_or_else(|| format!("event {i}: begin needs delay-ms"))?;
            let tool = begin["tool"].as_str().ok_or_else(|| format!("event {i}: begin needs a tool"))?;
            guard.begin(tool, begin["idempotency-key"].as_str(), hints.as_ref(), delay).map(|index| calls.push(index))
        } else if let Some(outcome) = event.get("attempted") {
            guard.attempted(call, seen(outcome)?);
            Ok(())
        } else if let Some(outcome) = event.get("polled") {
            guard.polled(call, polled(outcome)?);
            Ok(())
        } else if let Some(verdict) = event.get("verdict") {
            guard.verdict(call, &asked(verdict)?)
        } else if let Some(result) = event.get("status-check") {
            guard.status_checked(call, status_check(result)?);
            Ok(())
        } else if let Some(decision) = event.get("decision") {
            guard.decision(call, &said(decision)?)
        } else {
            return Err(format!("event {i}: unknown event {event}"));
        };
        if let Err(violation) = checked {
            return Ok(Some((i, violation)));
        }
    }
    Ok(None)
}

fn tool_hints(hints: &Value) -> Result<Option<ToolHints>, String> {
    if hints.is_null() {
        return Ok(None);
    }
    let flag = |name: &str| hints.get(name).and_then(Value::as_bool);
    Ok(Some(ToolHints { read_only: flag("read-only"), destructive: flag("destructive"), idempotent: flag("idempotent") }))
}

fn by_label<T: Copy>(all: &[T], label: fn(T) -> &'static str, value: &Value, what: &str) -> Result<T, String> {
    all.iter().copied().find(|v| Some(label(*v)) == value.as_str()).ok_or_else(|| format!("unknown {what} {value}"))
}

const TRANSPORT_ERRORS: [TransportError; 7] = [
    TransportError::Timeout,
    TransportError::ConnectionReset,
    TransportError::ConnectionRefused,
    TransportError::StreamClosed,
    TransportError::Tls,
    TransportError::NameResolution,
    TransportError::Other,
];
const DELIVERIES: [Delivery; 4] = [Delivery::Unknown, Delivery::NotSent, Delivery::Sent, Delivery::AnswerStarted];
const ACTIONS: [ActionKind; 6] = [ActionKind::Retry, ActionKind::Replan, ActionKind::CheckStatus, ActionKind::Succeed, ActionKind::Escalate, ActionKind::Poll];
const STATUS_CHECKS: [StatusCheckResult; 3] = [StatusCheckResult::Found, StatusCheckResult::Absent, StatusCheckResult::Unknown];

/// `found` / `absent` / `unknown`.
pub fn status_check(result: &Value) -> Result<StatusCheckResult, String> {
    by_label(&STATUS_CHECKS, labels::status_check, result, "status check")
}

/// The facts of a readable outcome (`../README.md`): `"success"`,
/// `{"empty-result"}`, `{"failure"}`, `{"task"}`, `{"poll-failure"}` or `{"status-check"}`.
pub fn seen(outcome: &Value) -> Result<Seen, String> {
    let answered = Seen::ANSWERED;
    let Some(failure) = outcome.get("failure").or_else(|| outcome.get("poll-failure")) else {
        return match outcome {
            Value::String(s) if s == "success" => Ok(answered),
            Value::Object(o) if o.contains_key("task") => Ok(Seen { task_live: Some(task_live(&o["task"])?), ..answered }),
            Value::Object(o) if o.contains_key("empty-result") || o.contains_key("status-check") => Ok(answered),
            _ => Err(format!("an outcome of an unknown shape: {outcome}")),
        };
    };
    let delivery = match failure.get("delivery") {
        None | Some(Value::Null) => Delivery::Unknown,
        Some(d) => by_label(&DELIVERIES, labels::delivery, d, "delivery")?,
    };
    let session_id_sent = failure.get("session-id-sent").and_then(Value::as_bool).unwrap_or(false);
    let headers = crate::steps::header_lines_json(failure.get("headers"))?;
    let seen = Seen { delivery, session_id_sent, retry_signal: speaks_of_retrying(&headers), ..answered };
    let kind = &failure["kind"];
    Ok(if let Some(status) = kind.get("http-status") {
        Seen { http_status: Some(status.as_u64().and_then(|s| u16::try_from(s).ok()).ok_or("bad http-status")?), ..seen }
    } else if let Some(code) = kind.get("protocol-error") {
        Seen { json_rpc_code: Some(code.as_i64().and_then(|c| i32::try_from(c).ok()).ok_or("bad protocol-error")?), ..seen }
    } else if let Some(error) = kind.get("transport") {
        Seen { answered: false, transport: Some(by_label(&TRANSPORT_ERRORS, labels::transport, error, "transport error")?), ..seen }
    } else if kind.get("tool-error").is_some() || kind == "input-required" {
        seen
    } else {
        return Err(format!("a failure kind of an unknown shape: {kind}"));
    })
}

/// Whether a readable task report (`{task-id, status, ...}`) says the task lives.
fn task_live(task: &Value) -> Result<bool, String> {
    match task["status"].as_str() {
        Some("cancelled") => Ok(false),
        Some("working" | "input-answered" | "input-required") => Ok(true),
        _ => Err(format!("a task of an unknown status: {task}")),
    }
}

/// A readable poll outcome: a `{"task"}` status, the task's end (`"success"`,
/// `{"empty-result"}`, `{"failure"}`) or `{"poll-failure"}`.
pub fn polled(outcome: &Value) -> Result<Polled, String> {
    if let Some(task) = outcome.get("task") {
        return Ok(Polled::Task { live: task_live(task)? });
    }
    if outcome.get("poll-failure").is_some() || outcome.get("status-check").is_some() {
        return Ok(Polled::PollFailed);
    }
    Ok(Polled::Ended(seen(outcome)?))
}

/// A readable verdict: `{action, delay-ms, hint-ms, reconnect, cancel-task}`.
pub fn asked(verdict: &Value) -> Result<Asked, String> {
    Ok(Asked {
        action: by_label(&ACTIONS, labels::action, &verdict["action"], "action")?,
        delay_ms: verdict["delay-ms"].as_u64().unwrap_or(0),
        hint_ms: verdict["hint-ms"].as_u64(),
        reconnect: verdict["reconnect"].as_bool().unwrap_or(false),
        cancel_task: verdict["cancel-task"].as_bool().unwrap_or(false),
    })
}

/// Readable words: `{action, delay-ms, reconnect, idempotency-key}`.
pub fn said(decision: &Value) -> Result<Said, String> {
    Ok(Said {
        action: by_label(&ACTIONS, labels::action, &decision["action"], "action")?,
        delay_ms: decision["delay-ms"].as_u64().unwrap_or(0),
        reconnect: decision["reconnect"].as_bool().unwrap_or(false),
        idempotency_key: decision["idempotency-key"].as_str().map(String::from),
    })
}
