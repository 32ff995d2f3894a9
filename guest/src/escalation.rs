//! The hand-off note: why the run stopped, the last error, when room returns,
//! and every effect already made, so that a person can act without re-reading
//! the trace ("Agent Retry Policies: When to Retry a Tool, Replan the Task or
//! Give Up": escalating without context is a failure mode).

use alloc::string::String;

use crate::cat::{cat, cat_to};
use crate::time::format_rfc3339;
use crate::types::{EffectRecord, EffectStatus, EscalationReason};

/// A sentence for each reason.
pub fn reason_text(reason: EscalationReason) -> &'static str {
    match reason {
        EscalationReason::PermissionDenied => "permission denied; a person must grant access or approve the action",
        EscalationReason::ReplansSpent => "the model could not fix the request within the replan limit (max-replans-per-run)",
        EscalationReason::CallAttemptsSpent => "the call failed on every attempt allowed (max-attempts-per-call)",
        EscalationReason::RunRetriesSpent => "the run's retry budget is spent (max-retries-per-run)",
        EscalationReason::RunStepsSpent => "the run's step budget is spent (max-steps-per-run)",
        EscalationReason::ServerWaitTooLong => "the server asks for a longer wait than the policy allows (max-hint-ms)",
        EscalationReason::RetryForbidden => "the server forbids a retry, and the model cannot fix the request",
        EscalationReason::AccountBudgetExhausted => "account budget exhausted: the shared account has no room within max-wait-ms",
        EscalationReason::RetryQuotaExhausted => "the account's retry quota is spent (too many retries across its workers lately)",
        EscalationReason::UnclassifiedFailure => "a failure the policy cannot classify (probable bug in the server, client or policy)",
        EscalationReason::StatusUnknown => "a status check could not tell whether a write was applied",
        EscalationReason::ConnectionMisconfigured => {
            "the connection cannot be made as configured (TLS or name resolution); a person must fix the URL, the certificate or the name"
        }
        EscalationReason::DeadlineTooNear => "the call's or the run's deadline is too near for the wait a retry needs",
        EscalationReason::ProtocolVersionUnsupported => "the server refused the client's MCP revision twice: they share no revision",
        EscalationReason::InputRequired => "the server asks for input that no handler answered; a person must answer it",
        EscalationReason::TaskExpired => "the call's task expired or the server no longer knows it: its result is lost",
        EscalationReason::TaskPollsSpent => "the call's task is not done within the poll budget (max-polls-per-task, max-task-wait-ms)",
        EscalationReason::TaskCancelled => "the server cancelled the call's task",
        EscalationReason::CircuitOpen => "the server failed lately and its circuit breaker is open: nothing is sent to it until a probe answers",
        EscalationReason::RetryBudgetExhausted => "the account's retries are past their share of its calls (account-budget.retry-ratio): this one fails fast",
        EscalationReason::Aborted => "a person aborted the run",
    }
}

/// The note, a report and an escalation name this many effects from each end of
/// a long list, and count the rest: they stay short however long the run
/// (`run.effects` pages through every one).
pub const NOTE_EFFECTS_EACH_END: usize = 10;

/// A run's effects as a report or an escalation lists them: all of them up to
/// twice [`NOTE_EFFECTS_EACH_END`], else the first and the last that many (the
/// host pages through the rest with `run.effects`), so that what crosses the
/// boundary stays bounded however long the run.
pub fn bounded<T: Clone>(effects: &[T]) -> alloc::vec::Vec<T> {
    let each_end = NOTE_EFFECTS_EACH_END;
    if effects.len() <= 2 * each_end {
        return effects.to_vec();
    }
    effects[..each_end].iter().chain(&effects[effects.len() - each_end..]).cloned().collect()
}

/// Where the run stopped.
pub struct StopPoint<'a> {
    pub run_id: &'a str,
    /// `(tool, call id, attempt)` of the call that stopped the run, if any.
    pub call: Option<(&'a str, u32, u32)>,
}

/// The whole note, in prose. `effects` are the run's effects as [`bounded`]
/// lists them, of `total`.
#[allow(clippy::too_many_arguments)] // each is a part of the note; a struct would only rename them
pub fn note(
    stop: &StopPoint<'_>,
    reason: EscalationReason,
    detail: Option<&str>,
    last_error: Option<&str>,
    resets_in_ms: Option<u64>,
    now_ms: u64,
    effects: &[EffectRecord],
    total: usize,
) -> String {
    let mut note = cat!("Run ", stop.run_id, " stopped: ", reason_text(reason), ".");
    if let Some(detail) = detail {
        cat_to!(note; " ", detail, ".");
    }
    if let Some((tool, call_id, attempt)) = stop.call {
        cat_to!(note; " Call ", call_id, " (", tool, "), attempt ", attempt, ".");
    }
    if let Some(error) = last_error {
        cat_to!(note; " Last error: ", error, ".");
    }
    if let Some(wait) = resets_in_ms {
        let at = now_ms.saturating_add(wait);
        cat_to!(note; " Room returns in ", wait.div_ceil(1000), " s, at ", format_rfc3339(at), ".");
    }
    if effects.is_empty() {
        note.push_str(" No effects were made in this run.");
    } else {
        note.push_str(" Effects already made in this run:");
        let skipped = total.saturating_sub(effects.len());
        for (i, effect) in effects.iter().enumerate() {
            if skipped > 0 && i == NOTE_EFFECTS_EACH_END {
                cat_to!(note; " ... ", skipped, " more (the run's effects call lists every one) ...");
            }
            // The place in the run: past the skipped middle, the last ones.
            let place = if skipped > 0 && i >= NOTE_EFFECTS_EACH_END { i + skipped } else { i };
            let key = effect.idempotency_key.as_deref().unwrap_or("no key");
            let status = match effect.status {
                EffectStatus::Applied => "applied",
                EffectStatus::Unknown => "may have been applied; check before redoing it",
            };
            cat_to!(note; " ", place + 1, ". ", effect.tool, " (call ", effect.call_id, ", key ", key, "): ", status, ".");
        }
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    #[test]
    fn lists_effects_and_reset_time() {
        let effects = [
            EffectRecord { call_id: 3, tool: "issue_refund".to_string(), idempotency_key: Some("ar1-ab".to_string()), status: EffectStatus::Applied },
            EffectRecord { call_id: 5, tool: "upload_asset".to_string(), idempotency_key: None, status: EffectStatus::Unknown },
        ];
        let stop = StopPoint { run_id: "r1", call: Some(("issue_refund", 6, 1)) };
        let text = note(&stop, EscalationReason::ServerWaitTooLong, None, Some("HTTP 429: spend cap"), Some(3_600_000), 0, &effects, effects.len());
        assert!(text.contains("Run r1 stopped"), "{text}");
        assert!(text.contains("Room returns in 3600 s, at 1970-01-01T01:00:00Z"), "{text}");
        assert!(text.contains("1. issue_refund (call 3, key ar1-ab): applied."), "{text}");
        assert!(text.contains("2. upload_asset (call 5, key no key): may have been applied"), "{text}");
        let many: alloc::vec::Vec<EffectRecord> =
            (1..=1000).map(|i| EffectRecord { call_id: i, tool: "issue_refund".to_string(), idempotency_key: None, status: EffectStatus::Applied }).collect();
        let long = note(&stop, EscalationReason::PermissionDenied, None, None, None, 0, &bounded(&many), many.len());
        assert!(long.contains(" 10. issue_refund (call 10,") && long.contains("... 980 more") && long.contains(" 1000. issue_refund (call 1000,"), "{long}");
        assert!(!long.contains("(call 11,") && long.len() < 2000, "{}", long.len());
        let none = note(&StopPoint { run_id: "r", call: None }, EscalationReason::RunStepsSpent, None, None, None, 0, &[], 0);
        assert!(none.ends_with("No effects were made in this run."), "{none}");
    }
}
