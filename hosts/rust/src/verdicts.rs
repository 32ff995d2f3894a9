//! Reading a verdict the way every wrapper must: report the outcome, pass the
//! verdict (and its words, when they are read) through the run-time guard,
//! and build the decision the wrapper acts on. Shared by the MCP wrapper and
//! the any-call helper, so that both enforce the same invariants.

use crate::component::types::{Action, ActionKind, Decision, PollPlan, RetryPlan, RunError, Verdict};
use crate::component::{Outcome, PolicyInstance, RunHandle};
use crate::fault::PolicyFault;
use crate::guard::{Asked, CallIndex, RunGuard, Said, Violation};

/// Why the wrapper cannot act on what the policy answered.
pub(crate) enum Refusal {
    /// The call into the policy failed.
    Fault(PolicyFault),
    /// The answer broke an invariant (the run-time guard).
    Broken(Violation),
}

impl From<PolicyFault> for Refusal {
    fn from(fault: PolicyFault) -> Self {
        Refusal::Fault(fault)
    }
}

/// One report to the policy, as [`read_verdict`] takes it.
pub(crate) struct Report<'a> {
    /// The policy's call id and the guard's index of the call.
    pub call: (u32, CallIndex),
    pub attempt: u32,
    pub key: Option<&'a str>,
    pub outcome: &'a Outcome,
    pub time_left_ms: Option<u64>,
    pub now_ms: u64,
    /// The entropy the report passes (`None`: the host's import supplies it).
    pub entropy: Option<u64>,
}

/// Reports an attempt's outcome (or a status check's) and passes the verdict
/// through the guard. The wrapper acts on the verdict alone: the decision's
/// words (its reason, a message, a note) cross the boundary only when they
/// are needed (the action carries text, or `words_wanted`: a line will be
/// written), give only text, and must agree with the verdict. `on_verdict`
/// is told the verdict before the guard reads it.
pub(crate) fn read_verdict(
    instance: &mut PolicyInstance,
    run: &RunHandle,
    guard: &mut RunGuard,
    report: Report<'_>,
    words_wanted: bool,
    on_verdict: impl FnOnce(&Verdict),
) -> Result<Result<Decision, RunError>, Refusal> {
    let (call_id, guarded) = report.call;
    let verdict = match instance.record(run, call_id, report.attempt, report.outcome, report.time_left_ms, report.now_ms, report.entropy)? {
        Ok(verdict) => verdict,
        Err(error) => return Ok(Err(error)),
    };
    on_verdict(&verdict);
    guard.verdict(guarded, &Asked::from(&verdict)).map_err(Refusal::Broken)?;
    // A replan or an escalation always carries text: its words are read
    // whatever `has-note` says, so a component that says otherwise cannot
    // leave the wrapper without them.
    let carries_text = verdict.has_note || matches!(verdict.action, ActionKind::Replan | ActionKind::Escalate);
    let words = if carries_text || words_wanted {
        let Some(words) = instance.last_decision(run, call_id)? else {
            let cause = format!("last-decision has no decision for call {call_id} right after its verdict");
            return Err(Refusal::Fault(PolicyFault::BoundaryViolation { cause }));
        };
        guard.decision(guarded, &Said::from(&words)).map_err(Refusal::Broken)?;
        Some(words)
    } else {
        None
    };
    let (rule, reason, text) = match words {
        Some(words) => (words.rule, words.reason, Some(words.action)),
        None => (instance.rule_name(&verdict)?, String::new(), None),
    };
    let action = match (verdict.action, text) {
        (ActionKind::Retry, _) => Action::Retry(RetryPlan {
            delay_ms: verdict.delay_ms,
            attempt: verdict.attempt.saturating_add(1),
            idempotency_key: report.key.map(String::from),
            reconnect: verdict.reconnect,
        }),
        // The caller keeps the task's id.
        (ActionKind::Poll, _) => Action::Poll(PollPlan { delay_ms: verdict.delay_ms, task_id: String::new(), reconnect: verdict.reconnect }),
        (ActionKind::CheckStatus, _) => Action::CheckStatus,
        (ActionKind::Succeed, Some(Action::Succeed(note))) => Action::Succeed(note),
        (ActionKind::Succeed, _) => Action::Succeed(None),
        (ActionKind::Replan, Some(Action::Replan(message))) => Action::Replan(message),
        (ActionKind::Escalate, Some(Action::Escalate(escalation))) => Action::Escalate(escalation),
        // The guard compared the cases: only a missing text is left.
        (ActionKind::Replan | ActionKind::Escalate, _) => {
            return Err(Refusal::Fault(PolicyFault::BoundaryViolation { cause: "an action with text had no words".into() }));
        }
    };
    let (class, attempt, hint_ms, cancel_task) = (verdict.class, verdict.attempt, verdict.hint_ms, verdict.cancel_task);
    Ok(Ok(Decision { action, class, attempt, hint_ms, rule, reason, cancel_task }))
}
