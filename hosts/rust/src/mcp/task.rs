//! A task (MCP 2026-07-28 Tasks extension, `io.modelcontextprotocol/tasks`)
//! as the server gave it, put as the contract's reports: a live task is a
//! `task-report`, a completed one the outcome of its result, a failed one a
//! `protocol-error` failure, exactly as an attempt's outcome would be.

use rmcp::model::{CallToolResult, JsonObject, Task, TaskStatus as WireStatus};
use serde_json::Value;

use super::observe;
use crate::component::Outcome;
use crate::component::types::{Delivery, FailureKind, Observation, TaskReport, TaskStatus};

/// The report of a live task: `status` as the host saw it, `message` its
/// status message (or, given, the questions it asks). `now_ms` is the host's
/// clock (ms since the epoch), against which `createdAt` is read.
pub fn report(task: &Task, status: TaskStatus, message: Option<String>, now_ms: u64) -> TaskReport {
    TaskReport {
        task_id: task.task_id.clone(),
        status,
        poll_interval_ms: task.poll_interval_ms,
        ttl_ms: task.ttl_ms,
        age_ms: epoch_ms(&task.created_at).map(|created| now_ms.saturating_sub(created)),
        message: message.or_else(|| task.status_message.clone()).unwrap_or_default(),
    }
}

/// What a task's status says, when it is alive or cancelled: the tool call's
/// answer (`CreateTaskResult`) carries no result, no error and no questions,
/// so a task that is already further along than `working` there is reported
/// `working`, and the first poll tells the rest.
pub fn live_status(status: WireStatus) -> TaskStatus {
    match status {
        WireStatus::Cancelled => TaskStatus::Cancelled,
        _ => TaskStatus::Working,
    }
}

/// A completed task's result, observed as an attempt's result is.
pub fn completed(result: JsonObject, session_id_sent: bool) -> (Outcome, Option<CallToolResult>) {
    match serde_json::from_value::<CallToolResult>(Value::Object(result)) {
        Ok(result) => (observe::from_result(&result, session_id_sent), Some(result)),
        Err(e) => (
            observe::transport_failure(
                crate::component::types::TransportError::Other,
                Delivery::AnswerStarted,
                format!("the completed task's result is not a tool result: {e}"),
                session_id_sent,
            ),
            None,
        ),
    }
}

/// A failed task's JSON-RPC error, as the `protocol-error` it is.
pub fn failed(error: &JsonObject, session_id_sent: bool) -> Outcome {
    let code = error.get("code").and_then(Value::as_i64).and_then(|c| i32::try_from(c).ok()).unwrap_or(-32603);
    let body = error.get("message").and_then(Value::as_str).unwrap_or_default().to_string();
    let structured_content = error.get("data").filter(|d| !d.is_null()).map(Value::to_string);
    Outcome::Failure(Observation {
        kind: FailureKind::ProtocolError(code),
        headers: String::new(),
        body,
        structured_content,
        session_id_sent,
        delivery: Delivery::AnswerStarted,
    })
}

/// An RFC 3339 time (`2026-12-02T07:00:00.123+00:00`, or `...Z`) as ms since
/// the epoch; `None` if it is not one.
pub fn epoch_ms(text: &str) -> Option<u64> {
    let (date, rest) = text.split_once(['T', 't', ' '])?;
    let mut ymd = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (year, month, day) = (ymd.next()??, ymd.next()??, ymd.next()??);
    let zone_at = rest.find(['Z', 'z', '+', '-'])?;
    let (clock, zone) = rest.split_at(zone_at);
    let mut hms = clock.splitn(3, ':');
    let (hour, minute) = (hms.next()?.parse::<i64>().ok()?, hms.next()?.parse::<i64>().ok()?);
    let seconds: f64 = hms.next()?.parse().ok()?;
    let offset_minutes = match zone {
        "Z" | "z" => 0,
        _ => {
            let sign = if zone.starts_with('-') { -1 } else { 1 };
            let (h, m) = zone[1..].split_once(':')?;
            sign * (h.parse::<i64>().ok()? * 60 + m.parse::<i64>().ok()?)
        }
    };
    let days = days_from_civil(year, month, day);
    let ms = ((days * 86_400 + hour * 3_600 + (minute - offset_minutes) * 60) * 1000) as f64 + seconds * 1000.0;
    (ms >= 0.0).then_some(ms as u64)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::epoch_ms;

    #[test]
    fn rfc3339_times_are_read_as_epoch_ms() {
        assert_eq!(epoch_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(epoch_ms("2026-12-02T07:00:00.250+00:00"), Some(1_796_194_800_250));
        assert_eq!(epoch_ms("2026-12-02T08:30:00+01:30"), Some(1_796_194_800_000));
        assert_eq!(epoch_ms("not a time"), None);
    }
}
