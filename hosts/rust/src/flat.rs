//! Contract 0.4.0's flat hot path as steps: a `begin-call` or `record-outcome`
//! step made through `begin-call-flat`, `record-success` / `record-failure` and
//! `last-decision` / `escalation`, and answered in the rich form, so that the
//! vectors check that the flat path decides exactly what the rich one does.
//! Each flat answer is also checked against the words it stands for.

use serde_json::{Value, json};

use crate::steps::Subject;

/// A failure's `headers` (canonical JSON `[[name, value], ...]`) as the flat
/// path's `name: value` lines.
pub fn header_lines_json(headers: Option<&Value>) -> Result<String, String> {
    let Some(headers) = headers.filter(|h| !h.is_null()) else { return Ok(String::new()) };
    let pairs: Vec<(String, String)> = serde_json::from_value(headers.clone()).map_err(|e| format!("bad headers {headers}: {e}"))?;
    Ok(crate::limits::header_lines(&pairs))
}

/// `begin-call` through `begin-call-flat`, answered as `begin-call` answers.
pub fn begin_call(subject: &mut dyn Subject, call: &Value, now_ms: u64) -> Result<Value, String> {
    let answer = subject.begin_call_flat(call, now_ms)?;
    let Some(start) = answer.get("ok") else { return Ok(answer) };
    if start["admitted"] == json!(true) {
        let ticket = json!({
            "call-id": start["call-id"], "delay-ms": start["delay-ms"], "effect": start["effect"], "safe-to-repeat": start["safe-to-repeat"],
        });
        return Ok(json!({ "ok": { "send": ticket } }));
    }
    match subject.escalation()? {
        Value::Null => Err(format!("begin-call-flat did not admit the call, and the run has no escalation: {start}")),
        escalation => Ok(json!({ "ok": { "escalate": escalation } })),
    }
}

/// `record-outcome` of a success or a failure through `record-success` /
/// `record-failure` and `last-decision`; any other outcome as it is.
pub fn record_outcome(subject: &mut dyn Subject, call_id: u32, attempt: u32, outcome: &Value, now_ms: u64, entropy: u64) -> Result<Value, String> {
    let answer = if outcome == "success" {
        subject.record_success(call_id, attempt, now_ms)?
    } else if let Some(failure) = outcome.get("failure") {
        subject.record_failure(call_id, attempt, failure, now_ms, entropy)?
    } else {
        return subject.record_outcome(call_id, attempt, outcome, now_ms, entropy);
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
/// hint, rule and whether it carries text.
fn check_verdict(verdict: &Value, decision: &Value, rule_names: &Value) -> Result<(), String> {
    let action = &decision["action"];
    let (kind, delay, has_note) = match action {
        Value::String(case) => (case.as_str(), json!(0), false),
        Value::Object(case) => {
            let (name, payload) = case.iter().next().ok_or("an empty action")?;
            let delay = if name == "retry" { payload["delay-ms"].clone() } else { json!(0) };
            (name.as_str(), delay, name != "retry" && !payload.is_null())
        }
        other => return Err(format!("an action of an unknown shape: {other}")),
    };
    let rule = rule_names.get(verdict["rule-index"].as_u64().unwrap_or(u64::MAX) as usize).cloned().unwrap_or(Value::Null);
    let expected = json!({
        "action": kind, "class": decision["class"], "attempt": decision["attempt"], "delay-ms": delay,
        "hint-ms": decision["hint-ms"], "rule": decision["rule"], "has-note": has_note,
    });
    let actual = json!({
        "action": verdict["action"], "class": verdict["class"], "attempt": verdict["attempt"], "delay-ms": verdict["delay-ms"],
        "hint-ms": verdict["hint-ms"], "rule": rule, "has-note": verdict["has-note"],
    });
    if expected != actual {
        return Err(format!("the flat verdict {actual} does not say what its decision says: {expected}"));
    }
    Ok(())
}
