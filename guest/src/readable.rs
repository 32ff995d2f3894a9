//! The vectors' readable steps on the contract's one run path: a `call-request`
//! begun into an `admission`, an `outcome` recorded into a worded `decision`.
//! The native conformance subject, the property tests and the fuzzers speak
//! this form; the component does not export it (contract 0.5.0 has one path).

use crate::account::AccountBudget;
use crate::run::{At, Run, Start};
use crate::types::{Admission, CallRequest, Decision, Outcome, RunError};

/// `begin-call`, answered as an `admission`.
pub fn begin_call(run: &mut Run, request: &CallRequest, now_ms: u64, budget: &mut dyn AccountBudget) -> Result<Admission, RunError> {
    let start = run.begin(request.server.clone(), request.tool.clone(), request.idempotency_key.clone(), request.hints.as_ref(), now_ms, budget)?;
    Ok(match start {
        Start::Send(ticket) => Admission::Send(ticket),
        Start::Escalated => Admission::Escalate(run.escalation().expect("an escalated run keeps its hand-off")),
        Start::Replan(call_id) => Admission::Replan(run.last_decision(call_id).expect("a replan was just decided")),
    })
}

/// The report an outcome stands for, answered with the run's last decision.
pub fn record_outcome(run: &mut Run, call_id: u32, attempt: u32, outcome: &Outcome, at: At, budget: &mut dyn AccountBudget) -> Result<Decision, RunError> {
    let now_ms = at.now_ms;
    match outcome {
        Outcome::Success => run.record_success(call_id, attempt, now_ms, budget)?,
        Outcome::EmptyResult(detail) => run.record_empty_result(call_id, attempt, detail, now_ms, budget)?,
        Outcome::StatusCheck(result) => run.record_status_check(call_id, attempt, *result, at, budget)?,
        Outcome::Failure(failure) => {
            let pairs = failure.header_pairs();
            run.record_failure(call_id, attempt, &failure.view(&pairs), at, budget)?
        }
        Outcome::Task(task) => run.record_task_status(call_id, attempt, task, at, budget)?,
        Outcome::PollFailure(failure) => {
            let pairs = failure.header_pairs();
            run.record_poll_failure(call_id, attempt, &failure.view(&pairs), at, budget)?
        }
    };
    Ok(run.last_decision(call_id).expect("a decision was just made"))
}
