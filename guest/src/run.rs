//! One agent run: its calls, its budgets and the effects it made.
//!
//! The host drives it: `begin_call` before a call's first attempt, `record_outcome`
//! after every attempt and after every status check. Each answer says what to do
//! next. Budgets, checked in this order when a retry is due
//! (narrowest first, so the reason names the most specific limit):
//! - `max-attempts-per-call`: attempts of one call, the first included;
//! - `max-retries-per-run`: retries of all calls in the run;
//! - `max-steps-per-run` (the step budget): attempts plus status checks;
//! - `max-replans-per-run`: errors shown to the model.
//!
//! Any escalation ends the run: later calls get `RunError::RunEnded`.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::account::AccountBudget;
use crate::backoff::next_delay_ms;
use crate::budget::{self, Spend};
use crate::classify::{classify, failure_label, is_ambiguous};
use crate::config::{Config, ToolPolicy};
use crate::escalation::{self, StopPoint};
use crate::text::excerpt;

/// The most effects `Run::effects_page` returns in one call.
pub const MAX_EFFECTS_PAGE: usize = 1000;
use crate::types::{
    Action, Admission, AttemptMismatch, CallRequest, CallTicket, Decision, Effect, EffectRecord, EffectStatus, Escalation, EscalationReason, Failure,
    FailureKind, Outcome, OutcomeClass, RetryPlan, RunError, RunReport, SizeLimit, StatusCheckResult, StatusCount,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// An attempt is out; its outcome is due.
    Sending,
    /// A status check is due; it remembers the failure that asked for it.
    CheckingStatus { class: OutcomeClass, hint_ms: Option<u64> },
    /// Succeeded, replanned or escalated.
    Finished,
}

#[derive(Clone, Debug)]
struct Call {
    tool: String,
    key: Option<String>,
    policy: ToolPolicy,
    /// The attempt now out (or last out), 1-based.
    attempt: u32,
    phase: Phase,
    last_error: Option<String>,
    /// Retry-quota tokens the call's last retry took (refunded if it then succeeds).
    quota_taken: u32,
    /// The call's place in `Run::effects`, if it has an effect there: finding it
    /// is O(1), so a run's cost grows linearly with its effects.
    effect_index: Option<u32>,
}

impl Call {
    /// Whether a failed attempt may be repeated without first reading state.
    fn safe_to_repeat(&self) -> bool {
        self.policy.effect != Effect::Write || self.policy.idempotent || self.key.is_some()
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    attempts: u32,
    retries: u32,
    status_checks: u32,
    replans: u32,
    succeeded_calls: u32,
    waits: u32,
    waited_ms: u64,
}

/// One agent run.
#[derive(Clone, Debug)]
pub struct Run {
    config: Arc<Config>,
    run_id: String,
    calls: Vec<Call>,
    counters: Counters,
    /// Attempts per HTTP status, ascending by status.
    statuses: Vec<StatusCount>,
    effects: Vec<EffectRecord>,
    escalation: Option<EscalationReason>,
}

/// What a retry is for, to word the decision's reason.
struct Failed {
    class: OutcomeClass,
    hint_ms: Option<u64>,
    rule: String,
    reason: String,
}

impl Run {
    /// A run, or `too-large` for a run id longer than [`crate::types::MAX_ID_BYTES`].
    pub fn start(config: Arc<Config>, run_id: &str) -> Result<Run, RunError> {
        SizeLimit::check("run-id", run_id)?;
        Ok(Run::new(config, run_id))
    }

    pub fn new(config: Arc<Config>, run_id: &str) -> Run {
        Run {
            config,
            run_id: run_id.to_string(),
            calls: Vec::new(),
            counters: Counters::default(),
            statuses: Vec::new(),
            effects: Vec::new(),
            escalation: None,
        }
    }

    fn effects_total(&self) -> u32 {
        u32::try_from(self.effects.len()).unwrap_or(u32::MAX)
    }

    /// The effects from the `start`-th, at most `max_count` (and [`MAX_EFFECTS_PAGE`]).
    pub fn effects_page(&self, start: u32, max_count: u32) -> Vec<EffectRecord> {
        let start = (start as usize).min(self.effects.len());
        let count = (max_count as usize).min(MAX_EFFECTS_PAGE);
        self.effects[start..].iter().take(count).cloned().collect()
    }

    /// Steps taken: attempts sent plus status checks asked for.
    fn steps(&self) -> u32 {
        self.counters.attempts.saturating_add(self.counters.status_checks)
    }

    fn ensure_open(&self) -> Result<(), RunError> {
        match self.escalation {
            Some(reason) => Err(RunError::RunEnded(reason)),
            None => Ok(()),
        }
    }

    fn call_index(&self, call_id: u32) -> Result<usize, RunError> {
        let index = (call_id as usize).wrapping_sub(1);
        match self.calls.get(index) {
            None => Err(RunError::UnknownCall(call_id)),
            Some(call) if call.phase == Phase::Finished => Err(RunError::CallFinished(call_id)),
            Some(_) => Ok(index),
        }
    }

    fn note_wait(&mut self, delay_ms: u64) {
        if delay_ms > 0 {
            self.counters.waits = self.counters.waits.saturating_add(1);
            self.counters.waited_ms = self.counters.waited_ms.saturating_add(delay_ms);
        }
    }

    fn set_effect(&mut self, index: usize, status: Option<EffectStatus>) {
        let call_id = index as u32 + 1;
        let position = self.calls[index].effect_index.map(|i| i as usize);
        match (position, status) {
            (Some(i), Some(status)) => self.effects[i].status = status,
            (Some(i), None) => {
                // Withdrawn (a status check found the write absent): rare, so
                // shifting the later effects' places by one is fine.
                self.effects.remove(i);
                self.calls[index].effect_index = None;
                for call in &mut self.calls {
                    if let Some(j) = call.effect_index.filter(|j| *j as usize > i) {
                        call.effect_index = Some(j - 1);
                    }
                }
            }
            (None, Some(status)) => {
                let call = &mut self.calls[index];
                call.effect_index = Some(self.effects.len() as u32);
                self.effects.push(EffectRecord { call_id, tool: call.tool.clone(), idempotency_key: call.key.clone(), status });
            }
            (None, None) => {}
        }
    }

    /// Ends the run with an escalation. `index` is the call that stopped it, if any.
    fn escalate(&mut self, index: Option<usize>, reason: EscalationReason, resets_in_ms: Option<u64>, now_ms: u64) -> Escalation {
        self.escalation = Some(reason);
        let (stop_call, last_error) = match index {
            Some(i) => {
                let call = &mut self.calls[i];
                call.phase = Phase::Finished;
                (Some((call.tool.as_str(), i as u32 + 1, call.attempt)), call.last_error.clone())
            }
            None => (None, None),
        };
        let stop = StopPoint { run_id: &self.run_id, call: stop_call };
        let note = escalation::note(&stop, reason, last_error.as_deref(), resets_in_ms, now_ms, &self.effects);
        Escalation { reason, last_error, resets_in_ms, effects: escalation::bounded(&self.effects), effects_total: self.effects_total(), note }
    }

    fn decision(&self, index: usize, action: Action, failed: &Failed, reason: String) -> Decision {
        let rule = failed.rule.clone();
        Decision { action, class: failed.class, attempt: self.calls[index].attempt, hint_ms: failed.hint_ms, rule, reason }
    }

    fn escalate_call(&mut self, index: usize, failed: Failed, reason: EscalationReason, resets_in_ms: Option<u64>, now_ms: u64) -> Decision {
        let escalation = self.escalate(Some(index), reason, resets_in_ms, now_ms);
        let text = format!("{}; escalate: {}", failed.reason, escalation::reason_text(reason));
        self.decision(index, Action::Escalate(escalation), &failed, text)
    }

    /// Asks to begin a call.
    pub fn begin_call(&mut self, request: &CallRequest, now_ms: u64, budget: &mut dyn AccountBudget) -> Result<Admission, RunError> {
        self.ensure_open()?;
        SizeLimit::check("tool", &request.tool)?;
        if let Some(key) = &request.idempotency_key {
            SizeLimit::check("idempotency-key", key)?;
        }
        if self.steps() >= self.config.max_steps_per_run {
            return Ok(Admission::Escalate(self.escalate(None, EscalationReason::RunStepsSpent, None, now_ms)));
        }
        let delay_ms = match budget::withdraw(&self.config, Spend::FirstAttempt, now_ms, budget) {
            Ok(taken) => taken.wait_ms,
            Err(refused) => return Ok(Admission::Escalate(self.escalate(None, refused.reason, Some(refused.resets_in_ms), now_ms))),
        };
        let policy = self.config.tool_policy(&request.tool, request.hints.as_ref());
        let call = Call {
            tool: request.tool.clone(),
            key: request.idempotency_key.clone(),
            policy,
            attempt: 1,
            phase: Phase::Sending,
            last_error: None,
            quota_taken: 0,
            effect_index: None,
        };
        let safe_to_repeat = call.safe_to_repeat();
        // The first call gets room for one, not the four a Vec reserves by
        // default: most runs in flight have one call out, and 100,000 runs must
        // fit in one instance's 64 MiB.
        self.calls.reserve_exact(usize::from(self.calls.is_empty()));
        self.calls.push(call);
        self.counters.attempts += 1;
        self.note_wait(delay_ms);
        let call_id = self.calls.len() as u32; // fewer than max-steps-per-run (≤ 10^6)
        Ok(Admission::Send(CallTicket { call_id, delay_ms, effect: policy.effect, safe_to_repeat }))
    }

    /// Records what attempt `attempt` returned and decides what happens next. A
    /// report of another attempt than the call's current one (a second report of
    /// one attempt) is refused and changes nothing.
    pub fn record_outcome(
        &mut self,
        call_id: u32,
        attempt: u32,
        outcome: &Outcome,
        now_ms: u64,
        entropy: u64,
        budget: &mut dyn AccountBudget,
    ) -> Result<Decision, RunError> {
        self.ensure_open()?;
        let index = self.call_index(call_id)?;
        let expected = self.calls[index].attempt;
        if attempt != expected {
            return Err(RunError::AttemptMismatch(AttemptMismatch { call_id, expected, reported: attempt }));
        }
        let pending = match self.calls[index].phase {
            Phase::CheckingStatus { class, hint_ms } => Some(Failed { class, hint_ms, rule: String::from("status-check"), reason: String::new() }),
            _ => None,
        };
        match (outcome, pending) {
            (Outcome::StatusCheck(result), Some(failed)) => Ok(self.on_status_check(index, *result, failed, now_ms, entropy, budget)),
            (Outcome::StatusCheck(_), None) => Err(RunError::NoStatusCheckPending(call_id)),
            (_, Some(_)) => Err(RunError::StatusCheckPending(call_id)),
            (Outcome::Success, None) => {
                let call = &self.calls[index];
                budget::deposit(&self.config, call.attempt > 1, call.quota_taken, now_ms, budget);
                let effect = self.calls[index].policy.effect;
                let status = if effect == Effect::Read { None } else { Some(EffectStatus::Applied) };
                let done = Failed { class: OutcomeClass::Success, hint_ms: None, rule: String::from("success"), reason: String::new() };
                Ok(self.succeed(index, status, None, &done, "the call succeeded".to_string()))
            }
            (Outcome::EmptyResult(detail), None) => {
                let limit = self.config.max_message_chars as usize;
                let message = excerpt(&format!("{} returned an empty or unusable result: {detail}", self.calls[index].tool), limit);
                self.calls[index].last_error = Some(message.clone());
                // The server answered 2xx: a write it answered has been applied.
                if self.calls[index].policy.effect != Effect::Read {
                    self.set_effect(index, Some(EffectStatus::Applied));
                }
                let failed = Failed {
                    class: OutcomeClass::Semantic,
                    hint_ms: None,
                    rule: String::from("empty-result"),
                    reason: "empty or unusable result is semantic".to_string(),
                };
                Ok(self.replan_or_escalate(index, failed, message, now_ms))
            }
            (Outcome::Failure(failure), None) => Ok(self.on_failure(index, failure, now_ms, entropy, budget)),
        }
    }

    fn succeed(&mut self, index: usize, effect: Option<EffectStatus>, note: Option<String>, outcome: &Failed, reason: String) -> Decision {
        self.calls[index].phase = Phase::Finished;
        self.counters.succeeded_calls += 1;
        if effect.is_some() {
            self.set_effect(index, effect);
        }
        self.decision(index, Action::Succeed(note), outcome, reason)
    }

    fn replan_or_escalate(&mut self, index: usize, failed: Failed, message: String, now_ms: u64) -> Decision {
        if self.counters.replans >= self.config.max_replans_per_run {
            return self.escalate_call(index, failed, EscalationReason::ReplansSpent, None, now_ms);
        }
        self.counters.replans += 1;
        self.calls[index].phase = Phase::Finished;
        let reason = format!("{}; replan {} of {}", failed.reason, self.counters.replans, self.config.max_replans_per_run);
        self.decision(index, Action::Replan(message), &failed, reason)
    }

    fn on_failure(&mut self, index: usize, failure: &Failure, now_ms: u64, entropy: u64, budget: &mut dyn AccountBudget) -> Decision {
        if let FailureKind::HttpStatus(status) = failure.kind {
            match self.statuses.binary_search_by_key(&status, |s| s.status) {
                Ok(i) => self.statuses[i].count = self.statuses[i].count.saturating_add(1),
                Err(i) => self.statuses.insert(i, StatusCount { status, count: 1 }),
            }
        }
        let classification = classify(failure, &self.config, Some(&self.calls[index].tool), now_ms);
        let label = failure_label(&failure.kind);
        let body = excerpt(&failure.body, self.config.max_message_chars as usize);
        let error_text = if body.is_empty() { label.clone() } else { format!("{label}: {body}") };
        self.calls[index].last_error = Some(error_text.clone());
        let mut reason = classification.reason.clone();
        for problem in &classification.header_problems {
            reason.push_str(&format!("; ignored {} ({})", problem.name, problem.problem));
        }
        let class = classification.class;
        let hint_ms = classification.hint_ms;
        if let (Some(hint), Some(source)) = (hint_ms, &classification.hint_source) {
            reason.push_str(&format!("; {source} hints {hint} ms"));
        }
        let failed = Failed { class, hint_ms, rule: classification.rule, reason };
        let gone = matches!(classification.status, Some(404 | 410));
        if self.calls[index].policy.effect == Effect::Delete && gone {
            // Deleting what is already gone is the delete's goal reached, whatever
            // `x-should-retry` says. If an earlier attempt of this call failed
            // ambiguously, that attempt did it.
            let earlier = self.calls[index].effect_index.is_some();
            let effect = earlier.then_some(EffectStatus::Applied);
            let note = Some(format!("already deleted ({label})"));
            let reason = format!("{}; a delete whose target is gone succeeded", failed.reason);
            return self.succeed(index, effect, note, &failed, reason);
        }
        match class {
            OutcomeClass::Permission => self.escalate_call(index, failed, EscalationReason::PermissionDenied, None, now_ms),
            OutcomeClass::Deterministic => {
                let call = &self.calls[index];
                let message = format!("{} failed: {error_text}", call.tool);
                self.replan_or_escalate(index, failed, message, now_ms)
            }
            OutcomeClass::Transient | OutcomeClass::Throttled => {
                let call = &self.calls[index];
                let ambiguous = is_ambiguous(&failure.kind, class);
                if ambiguous && call.policy.effect != Effect::Read {
                    self.set_effect(index, Some(EffectStatus::Unknown));
                }
                if let Some(hint) = hint_ms.filter(|h| *h > self.config.max_hint_ms) {
                    return self.escalate_call(index, failed, EscalationReason::ServerWaitTooLong, Some(hint), now_ms);
                }
                // The model cannot fix it, and the server says a retry will not either.
                if classification.server_says_retry == Some(false) {
                    return self.escalate_call(index, failed, EscalationReason::RetryForbidden, hint_ms, now_ms);
                }
                if ambiguous && !self.calls[index].safe_to_repeat() {
                    if self.steps() >= self.config.max_steps_per_run {
                        return self.escalate_call(index, failed, EscalationReason::RunStepsSpent, None, now_ms);
                    }
                    self.counters.status_checks += 1;
                    self.calls[index].phase = Phase::CheckingStatus { class, hint_ms };
                    let reason = format!("{}; a write without a key may have applied: check status before resending", failed.reason);
                    return self.decision(index, Action::CheckStatus, &failed, reason);
                }
                self.retry_or_escalate(index, failed, now_ms, entropy, budget)
            }
            // Unclassified, and the classes classify never gives a failure.
            OutcomeClass::Unclassified | OutcomeClass::Success | OutcomeClass::Semantic => {
                self.escalate_call(index, failed, EscalationReason::UnclassifiedFailure, None, now_ms)
            }
        }
    }

    fn retry_or_escalate(&mut self, index: usize, failed: Failed, now_ms: u64, entropy: u64, budget: &mut dyn AccountBudget) -> Decision {
        let config = Arc::clone(&self.config);
        let attempt = self.calls[index].attempt;
        let spent = if attempt >= config.max_attempts_per_call {
            Some(EscalationReason::CallAttemptsSpent)
        } else if self.counters.retries >= config.max_retries_per_run {
            Some(EscalationReason::RunRetriesSpent)
        } else if self.steps() >= config.max_steps_per_run {
            Some(EscalationReason::RunStepsSpent)
        } else {
            None
        };
        if let Some(reason) = spent {
            return self.escalate_call(index, failed, reason, None, now_ms);
        }
        // Attempt n failed: this is retry number n.
        let mut delay_ms = next_delay_ms(config.base_delay_ms, config.max_delay_ms, attempt, failed.hint_ms, entropy);
        let spend = Spend::Retry { throttled: failed.class == OutcomeClass::Throttled };
        let taken = match budget::withdraw(&config, spend, now_ms, budget) {
            Ok(taken) => taken,
            Err(refused) => return self.escalate_call(index, failed, refused.reason, Some(refused.resets_in_ms), now_ms),
        };
        let mut account_note = String::new();
        if taken.wait_ms > delay_ms {
            account_note = format!("; the account budget has room in {} ms", taken.wait_ms);
            delay_ms = taken.wait_ms;
        }
        self.counters.retries += 1;
        self.counters.attempts += 1;
        self.note_wait(delay_ms);
        let call = &mut self.calls[index];
        call.attempt += 1;
        call.phase = Phase::Sending;
        call.quota_taken = taken.quota_taken;
        let plan = RetryPlan { delay_ms, attempt: call.attempt, idempotency_key: call.key.clone() };
        let reason = format!("{}; retry {} of {} after {delay_ms} ms{account_note}", failed.reason, attempt, config.max_attempts_per_call - 1);
        Decision { action: Action::Retry(plan), class: failed.class, attempt, hint_ms: failed.hint_ms, rule: failed.rule, reason }
    }

    /// What the status check found.
    /// What the status check found. `failed` is the failure that asked for it.
    fn on_status_check(
        &mut self,
        index: usize,
        result: StatusCheckResult,
        mut failed: Failed,
        now_ms: u64,
        entropy: u64,
        budget: &mut dyn AccountBudget,
    ) -> Decision {
        match result {
            StatusCheckResult::Found => {
                let note = Some("already applied: a status check found it".to_string());
                let reason = "status check found the write applied".to_string();
                self.succeed(index, Some(EffectStatus::Applied), note, &failed, reason)
            }
            StatusCheckResult::Absent => {
                self.set_effect(index, None);
                self.calls[index].phase = Phase::Sending;
                failed.reason = "status check found the write absent".to_string();
                self.retry_or_escalate(index, failed, now_ms, entropy, budget)
            }
            StatusCheckResult::Unknown => {
                failed.reason = "status check could not tell".to_string();
                self.escalate_call(index, failed, EscalationReason::StatusUnknown, None, now_ms)
            }
        }
    }

    /// What happened in the run so far.
    pub fn report(&self) -> RunReport {
        let c = &self.counters;
        RunReport {
            run_id: self.run_id.clone(),
            calls: self.calls.len() as u32,
            attempts: c.attempts,
            retries: c.retries,
            status_checks: c.status_checks,
            replans: c.replans,
            succeeded_calls: c.succeeded_calls,
            waits: c.waits,
            waited_ms: c.waited_ms,
            escalation: self.escalation,
            statuses: self.statuses.clone(),
            effects: escalation::bounded(&self.effects),
            effects_total: self.effects_total(),
        }
    }
}
