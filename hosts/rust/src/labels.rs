//! WIT names (kebab-case) of the contract's enums, for logs and tables.

use crate::component::types::{Action, ActionKind, BreakerState, Delivery, EscalationReason, OutcomeClass, StatusCheckResult, TaskStatus, TransportError};

pub fn class(class: OutcomeClass) -> &'static str {
    match class {
        OutcomeClass::Success => "success",
        OutcomeClass::Transient => "transient",
        OutcomeClass::Throttled => "throttled",
        OutcomeClass::Deterministic => "deterministic",
        OutcomeClass::Permission => "permission",
        OutcomeClass::Semantic => "semantic",
        OutcomeClass::Misconfigured => "misconfigured",
        OutcomeClass::NeedsInput => "needs-input",
        OutcomeClass::Unclassified => "unclassified",
    }
}

pub fn transport(error: TransportError) -> &'static str {
    match error {
        TransportError::Timeout => "timeout",
        TransportError::ConnectionReset => "connection-reset",
        TransportError::ConnectionRefused => "connection-refused",
        TransportError::StreamClosed => "stream-closed",
        TransportError::Tls => "tls",
        TransportError::NameResolution => "name-resolution",
        TransportError::Other => "other",
    }
}

pub fn reason(reason: EscalationReason) -> &'static str {
    match reason {
        EscalationReason::PermissionDenied => "permission-denied",
        EscalationReason::ReplansSpent => "replans-spent",
        EscalationReason::CallAttemptsSpent => "call-attempts-spent",
        EscalationReason::RunRetriesSpent => "run-retries-spent",
        EscalationReason::RunStepsSpent => "run-steps-spent",
        EscalationReason::ServerWaitTooLong => "server-wait-too-long",
        EscalationReason::RetryForbidden => "retry-forbidden",
        EscalationReason::AccountBudgetExhausted => "account-budget-exhausted",
        EscalationReason::RetryQuotaExhausted => "retry-quota-exhausted",
        EscalationReason::UnclassifiedFailure => "unclassified-failure",
        EscalationReason::StatusUnknown => "status-unknown",
        EscalationReason::ConnectionMisconfigured => "connection-misconfigured",
        EscalationReason::DeadlineTooNear => "deadline-too-near",
        EscalationReason::ProtocolVersionUnsupported => "protocol-version-unsupported",
        EscalationReason::InputRequired => "input-required",
        EscalationReason::TaskExpired => "task-expired",
        EscalationReason::TaskPollsSpent => "task-polls-spent",
        EscalationReason::TaskCancelled => "task-cancelled",
        EscalationReason::CircuitOpen => "circuit-open",
        EscalationReason::RetryBudgetExhausted => "retry-budget-exhausted",
        EscalationReason::Aborted => "aborted",
    }
}

/// A circuit breaker's state, as the `agent_retry.breaker` event says it.
pub fn breaker_state(state: BreakerState) -> &'static str {
    match state {
        BreakerState::Closed => "closed",
        BreakerState::Open => "open",
        BreakerState::HalfOpen => "half-open",
    }
}

pub fn status_check(result: StatusCheckResult) -> &'static str {
    match result {
        StatusCheckResult::Found => "found",
        StatusCheckResult::Absent => "absent",
        StatusCheckResult::Unknown => "unknown",
    }
}

pub fn delivery(delivery: Delivery) -> &'static str {
    match delivery {
        Delivery::Unknown => "unknown",
        Delivery::NotSent => "not-sent",
        Delivery::Sent => "sent",
        Delivery::AnswerStarted => "answer-started",
    }
}

pub fn action(action: ActionKind) -> &'static str {
    match action {
        ActionKind::Retry => "retry",
        ActionKind::Replan => "replan",
        ActionKind::CheckStatus => "check-status",
        ActionKind::Succeed => "succeed",
        ActionKind::Escalate => "escalate",
        ActionKind::Poll => "poll",
    }
}

/// A verdict's action, as every attempt event names it (`retry`, `replan`, ...).
pub fn verdict_action(verdict: &Action) -> &'static str {
    match verdict {
        Action::Retry(_) => "retry",
        Action::Replan(_) => "replan",
        Action::CheckStatus => "check-status",
        Action::Succeed(_) => "succeed",
        Action::Escalate(_) => "escalate",
        Action::Poll(_) => "poll",
    }
}

pub fn task_status(status: TaskStatus) -> &'static str {
    match status {
        TaskStatus::Working => "working",
        TaskStatus::InputAnswered => "input-answered",
        TaskStatus::InputRequired => "input-required",
        TaskStatus::Cancelled => "cancelled",
    }
}

/// A person's answer, as the `agent_retry.resume` event says it.
pub fn resume_answer(answer: &crate::component::types::ResumeAnswer) -> &'static str {
    use crate::component::types::ResumeAnswer;
    match answer {
        ResumeAnswer::Retry => "retry",
        ResumeAnswer::Done(_) => "done",
        ResumeAnswer::Skip => "skip",
        ResumeAnswer::Abort => "abort",
    }
}

/// What a resumed call asks of the host, as the `agent_retry.resume` event says it.
pub fn resumed_action(action: crate::component::types::ResumedAction) -> &'static str {
    use crate::component::types::ResumedAction;
    match action {
        ResumedAction::Send => "send",
        ResumedAction::Succeed => "succeed",
        ResumedAction::Replan => "replan",
        ResumedAction::Escalate => "escalate",
    }
}
