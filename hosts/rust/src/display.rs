//! `Display` for the crate's public enums: the contract's own names (WIT's
//! kebab-case, e.g. `EscalationReason::PermissionDenied` prints
//! `permission-denied`), so that a log line, a note or an error message
//! shows what every host shows.

use std::fmt;

use crate::accounts::Reservation;
use crate::component::types::{
    AbandonReason, Action, ActionKind, ConfigErrorKind, Delivery, Effect, EffectStatus, EscalationReason, FailureKind, OutcomeClass, ProbeAnswer,
    StatusCheckResult, TaskStatus, TransportError,
};
use crate::component::{Admission, Outcome};
use crate::entropy::EntropySource;
use crate::events::Event;
use crate::guard::Polled;
use crate::labels;
use crate::live::Integrity;
use crate::mcp::answer::{StopCause, ToolAnswer};

macro_rules! display_as {
    ($($ty:ty => $name:expr;)*) => {$(
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let name: &str = $name(*self);
                f.write_str(name)
            }
        }
    )*};
}

display_as! {
    EscalationReason => labels::reason;
    OutcomeClass => labels::class;
    TransportError => labels::transport;
    Delivery => labels::delivery;
    StatusCheckResult => labels::status_check;
    ActionKind => labels::action;
    TaskStatus => labels::task_status;
    StopCause => StopCause::label;
    Effect => |e| match e { Effect::Read => "read", Effect::Write => "write", Effect::Delete => "delete" };
    EffectStatus => |s| match s { EffectStatus::Applied => "applied", EffectStatus::Unknown => "unknown" };
    ProbeAnswer => |a| match a { ProbeAnswer::OlderServer => "older-server", ProbeAnswer::Failure => "failure" };
    AbandonReason => |r| match r { AbandonReason::Cancelled => "cancelled", AbandonReason::Deadline => "deadline" };
    ConfigErrorKind => |k| match k {
        ConfigErrorKind::Syntax => "syntax",
        ConfigErrorKind::UnknownField => "unknown-field",
        ConfigErrorKind::WrongType => "wrong-type",
        ConfigErrorKind::OutOfRange => "out-of-range",
        ConfigErrorKind::TooLarge => "too-large",
    };
}

/// `http-status 503`, `transport timeout`, `protocol-error -32602`, `tool-error`, `input-required`.
impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureKind::HttpStatus(status) => write!(f, "http-status {status}"),
            FailureKind::Transport(error) => write!(f, "transport {error}"),
            FailureKind::ProtocolError(code) => write!(f, "protocol-error {code}"),
            FailureKind::ToolError(Some(status)) => write!(f, "tool-error {status}"),
            FailureKind::ToolError(None) => f.write_str("tool-error"),
            FailureKind::InputRequired => f.write_str("input-required"),
        }
    }
}

/// The action's kind and its one figure or text: `retry in 1200 ms`, `escalate permission-denied`, `replan: ...`.
impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Retry(plan) => write!(f, "retry in {} ms", plan.delay_ms),
            Action::Poll(plan) => write!(f, "poll in {} ms", plan.delay_ms),
            Action::CheckStatus => f.write_str("check-status"),
            Action::Succeed(None) => f.write_str("succeed"),
            Action::Succeed(Some(note)) => write!(f, "succeed: {note}"),
            Action::Replan(message) => write!(f, "replan: {message}"),
            Action::Escalate(escalation) => write!(f, "escalate {}", escalation.reason),
        }
    }
}

/// The outcome in the words of docs/events.md (`success`, `http 503`, ...).
impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::events::outcome_words(self))
    }
}

impl fmt::Display for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Admission::Send(start) => write!(f, "send call {} after {} ms", start.call_id, start.delay_ms),
            Admission::Escalate(escalation) => write!(f, "escalate {}", escalation.reason),
            Admission::Replan(start, _) => write!(f, "replan call {}: a circuit breaker is open", start.call_id),
        }
    }
}

impl fmt::Display for EntropySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EntropySource::Os => "os",
            EntropySource::Seeded(_) => "seeded",
            EntropySource::Fixed(_) => "fixed",
        })
    }
}

impl fmt::Display for Polled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Polled::Task { live: true } => f.write_str("task live"),
            Polled::Task { live: false } => f.write_str("task ended"),
            Polled::Ended(_) => f.write_str("task result"),
            Polled::PollFailed => f.write_str("poll failed"),
        }
    }
}

impl fmt::Display for Integrity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Integrity::Unchecked => "unchecked",
            Integrity::PinnedSha256(_) => "pinned-sha256",
            Integrity::Ed25519(_) => "ed25519",
        })
    }
}

impl fmt::Display for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reservation::Granted(wait_ms) => write!(f, "granted after {wait_ms} ms"),
            Reservation::Refused(room_in_ms) => write!(f, "refused, room in {room_in_ms} ms"),
        }
    }
}

impl fmt::Display for ToolAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolAnswer::Done { note: Some(note), .. } => write!(f, "done: {note}"),
            ToolAnswer::Done { .. } => f.write_str("done"),
            ToolAnswer::Replan(message) => write!(f, "replan: {message}"),
        }
    }
}

/// The event's name (`agent_retry.attempt`, ...).
impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_print_the_contracts_names() {
        assert_eq!(EscalationReason::PermissionDenied.to_string(), "permission-denied");
        assert_eq!(EscalationReason::RunStepsSpent.to_string(), "run-steps-spent");
        assert_eq!(OutcomeClass::NeedsInput.to_string(), "needs-input");
        assert_eq!(TransportError::ConnectionRefused.to_string(), "connection-refused");
        assert_eq!(Delivery::AnswerStarted.to_string(), "answer-started");
        assert_eq!(ActionKind::CheckStatus.to_string(), "check-status");
        assert_eq!(TaskStatus::InputAnswered.to_string(), "input-answered");
        assert_eq!(ConfigErrorKind::UnknownField.to_string(), "unknown-field");
        assert_eq!(FailureKind::HttpStatus(503).to_string(), "http-status 503");
        assert_eq!(FailureKind::Transport(TransportError::Timeout).to_string(), "transport timeout");
        assert_eq!(StopCause::CallTimeout.to_string(), "call-timeout");
        assert_eq!(Outcome::Success.to_string(), "success");
        assert_eq!(format!("{}", Integrity::PinnedSha256("ab".into())), "pinned-sha256");
    }
}
