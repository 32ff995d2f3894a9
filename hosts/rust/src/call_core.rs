//! One call's bookkeeping under the policy, the same for an MCP tool call
//! ([`crate::mcp::RetryingToolCaller`]) and any async call
//! ([`crate::PolicyRun`]): asking `begin-call`, the run-time guard's checks,
//! reporting each outcome and reading its verdict, the events (attempt lines,
//! waits, status checks, task polls, replans, escalations, stops) and the
//! escalations no decision answered. The wrappers do the I/O (send, poll,
//! check, reconnect) and act on the decisions. The Python `_call_core.py`,
//! the Node `call-core.ts`.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::component::types::{
    AbandonReason, Action, CallStart, Decision, Effect, EffectStatus, Escalation, EscalationReason, ResumeAnswer, ResumedCall, RunError, RunReport,
    SnapshotError, StatusCheckResult, ToolHints, Verdict,
};
use crate::component::{Admission, Outcome, PolicyHandle, PolicyInstance, RunHandle};
use crate::events::{
    AttemptEvent, BreakerEvent, EscalationEvent, Event, EventContext, ReplanEvent, ResumeEvent, StatusCheckEvent, TaskPollEvent, Telemetry, WaitEvent,
    WaitReason, outcome_words,
};
use crate::fault::PolicyFault;
use crate::guard::{CallIndex, Polled, RunGuard, Seen};
use crate::labels;
use crate::limit::Limit;
use crate::mcp::answer::{StopCause, Stopped};
use crate::time_source::TimeSource;
use crate::verdicts::{Refusal, Report, read_verdict};

/// Called with every verdict the wrapper acts on, before it acts: the tool (or
/// the pseudo-tool `initialize` / `tools/list`), the attempt the report named,
/// and the verdict (its rule is `PolicyInstance::rule_name`). The Python
/// wrapper's `on_verdict(tool, attempt, verdict)`, the Node one's `onVerdict`.
pub type OnVerdict = Arc<dyn Fn(&str, u32, &Verdict) + Send + Sync>;

/// How a call ends when no verdict answered it with a value or a message.
#[derive(Debug)]
pub(crate) enum CallEnd {
    /// The policy escalated, or the wrapper escalated for it (the policy
    /// failed, the guard refused its answer, the run was stopped by the guard).
    Escalated(Escalation),
    /// A deadline would pass, or the caller cancelled the call.
    Stopped(Stopped),
    /// The run was used wrongly (a bug in the host).
    Run(RunError),
    /// A circuit breaker of the server is open: the call is over before it
    /// was sent, as a replan with this message for the model.
    Replanned(String),
}

/// What a reported outcome was: an attempt's (a send: what the run's steps and
/// attempts count), a task poll's, or a status check's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reported {
    Sent,
    Polled,
    Checked,
}

/// What of a call was out when it stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Out {
    /// An attempt's request.
    Request,
    /// No request; `task_alive`: the call's task lives on the server.
    Idle { task_alive: bool },
    /// A new session was being set up for the call (its `initialize`).
    Connecting { task_alive: bool },
}

/// One call in progress.
pub(crate) struct CallState {
    /// The run's step (`None` for a pseudo-call: connecting, listing tools).
    pub step: Option<u32>,
    pub tool: String,
    pub call_id: u32,
    guarded: CallIndex,
    pub key: Option<String>,
    effect: Effect,
    /// The attempt the next outcome reports: 1, then each retry plan's.
    pub attempt: u32,
    /// The last attempt whose own outcome was reported (0: none yet).
    reported: u32,
    /// Attempts sent so far.
    pub sent: u32,
}

/// How a stopped call's reason reads: where it was when it stopped, and what
/// is known of its effect (docs/events.md, "Stop reasons").
pub(crate) struct StopFacts<'a> {
    pub cause: StopCause,
    /// The call's or the run's limit, in ms (timeouts only).
    pub limit_ms: Option<u64>,
    pub place: StopPlace<'a>,
    pub attempts_sent: u32,
    pub applied: StopEffect,
}

/// Where a call was when it stopped.
pub(crate) enum StopPlace<'a> {
    /// This attempt's request was out.
    InFlight(u32),
    BetweenAttempts,
    /// Before its first attempt was sent; `during` names the pseudo-call
    /// that ran for it (`initialize`, `tools/list`).
    BeforeSend(Option<&'a str>),
}

/// What is known of a stopped call's effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StopEffect {
    /// The call was never begun (it stopped while the tools were listed again).
    NothingSent,
    NotAWrite,
    MayHaveApplied,
    NotApplied,
}

/// The `reason` of a stop's attempt event, the same words in every host
/// (tests/events/stop_reasons.json).
pub(crate) fn stop_reason(facts: &StopFacts<'_>) -> String {
    let stopped_by = match (facts.cause, facts.limit_ms) {
        (StopCause::Cancelled, _) => "the call was cancelled".to_string(),
        (StopCause::CallTimeout, limit) => format!("the call's limit of {} ms passed", limit.unwrap_or(0)),
        (StopCause::RunTimeout, limit) => format!("the run's limit of {} ms passed", limit.unwrap_or(0)),
    };
    let place = match facts.place {
        StopPlace::InFlight(attempt) => format!("while attempt {attempt} was in flight"),
        StopPlace::BetweenAttempts => "between attempts".to_string(),
        StopPlace::BeforeSend(None) => "before the call was sent".to_string(),
        StopPlace::BeforeSend(Some(during)) => format!("while its {during} ran, before the call was sent"),
    };
    let applied = match facts.applied {
        StopEffect::NothingSent => "nothing of it was sent",
        StopEffect::NotAWrite => "it is not a write",
        StopEffect::MayHaveApplied => "the write may have been applied: check before sending it again",
        StopEffect::NotApplied => "the write was not applied",
    };
    format!("{stopped_by} {place} ({} sent); {applied}", facts.attempts_sent)
}

/// How a run's core is set up: what both wrappers' options share.
pub(crate) struct CoreOptions {
    pub clock: Arc<dyn TimeSource>,
    pub policy_identity: Option<String>,
    pub call_timeout_ms: Option<u64>,
    pub run_timeout_ms: Option<u64>,
    pub on_verdict: Option<OnVerdict>,
    /// Read the decision's words for every verdict (the any-call helper's
    /// events always carry them), not only when a log line will be written.
    pub words_always: bool,
    /// The server the run's calls go to, for the policy's circuit breakers (none: no breaker applies).
    pub server: Option<String>,
}

/// One run under the policy: its instance, run, guard and events.
pub(crate) struct RunCore {
    pub instance: PolicyInstance,
    policy: PolicyHandle,
    pub run: RunHandle,
    pub run_id: String,
    pub guard: RunGuard,
    pub telemetry: Telemetry,
    pub clock: Arc<dyn TimeSource>,
    policy_identity: Option<String>,
    /// Policy time the run started: `run_timeout_ms` counts from here.
    started_ms: u64,
    call_timeout_ms: Option<u64>,
    run_timeout_ms: Option<u64>,
    on_verdict: Option<OnVerdict>,
    words_always: bool,
    /// After the guard refused a verdict, every later call ends with this escalation.
    stopped_by_guard: Option<Escalation>,
    /// The run's steps so far (tool calls, not pseudo-calls).
    pub steps: u32,
    /// The server the calls go to, for the breakers.
    pub server: Option<String>,
    /// The configuration, for the guard of a resumed run.
    config_json: String,
}

/// How a resume ended before anything was sent: the snapshot was refused, or
/// the policy failed.
#[derive(Debug)]
pub(crate) enum ResumeRefused {
    Snapshot(SnapshotError),
    Policy(PolicyFault),
}

impl RunCore {
    /// Loads the configuration into `instance` and starts the run.
    pub fn start(mut instance: PolicyInstance, config_json: &str, run_id: &str, telemetry: Telemetry, options: CoreOptions) -> anyhow::Result<Self> {
        let policy = instance.load_policy(config_json)?.map_err(|e| anyhow::anyhow!("policy configuration: {}: {}", e.field, e.message))?;
        let run = instance.start_run(&policy, run_id)?.map_err(|e| anyhow::anyhow!("run id: {e:?}"))?;
        Ok(RunCore {
            instance,
            policy,
            run,
            run_id: run_id.to_string(),
            guard: RunGuard::from_config_text(config_json),
            telemetry,
            started_ms: options.clock.now_ms(),
            clock: options.clock,
            policy_identity: options.policy_identity,
            call_timeout_ms: options.call_timeout_ms,
            run_timeout_ms: options.run_timeout_ms,
            on_verdict: options.on_verdict,
            words_always: options.words_always,
            stopped_by_guard: None,
            steps: 0,
            server: options.server,
            config_json: config_json.to_string(),
        })
    }

    /// A snapshot of the escalated run, with the stopped call's arguments (JSON).
    pub fn snapshot(&mut self, arguments_json: Option<&str>) -> Result<String, ResumeRefused> {
        let now = self.clock.now_ms();
        match self.instance.snapshot(&self.run, arguments_json, now) {
            Ok(Ok(text)) => Ok(text),
            Ok(Err(refused)) => Err(ResumeRefused::Snapshot(refused)),
            Err(fault) => Err(ResumeRefused::Policy(fault)),
        }
    }

    /// Makes the run resumed from `snapshot` with `answer` this core's run (the
    /// old one is freed; the guard starts again with it), emits
    /// `agent_retry.resume` and answers the resumed call. Nothing is sent.
    pub fn resume(&mut self, snapshot: &str, answer: &ResumeAnswer) -> Result<ResumedCall, ResumeRefused> {
        let now = self.clock.now_ms();
        let run = match self.instance.resume_run(&self.policy, snapshot, answer, now) {
            Ok(Ok(run)) => run,
            Ok(Err(refused)) => return Err(ResumeRefused::Snapshot(refused)),
            Err(fault) => return Err(ResumeRefused::Policy(fault)),
        };
        let old = std::mem::replace(&mut self.run, run);
        // The old run is over; a fault freeing it does not stop the resumed one.
        let _ = self.instance.drop_run(old);
        self.guard = RunGuard::from_config_text(&self.config_json);
        self.stopped_by_guard = None;
        let call = self.instance.resumed_call(&self.run).map_err(ResumeRefused::Policy)?;
        let Some(call) = call else {
            let message = "the component resumed the run but names no call".to_string();
            return Err(ResumeRefused::Policy(PolicyFault::BoundaryViolation { cause: message }));
        };
        // The resumed run's id, and its calls: the next call's key is derived
        // from step calls + 1, as in every host, never from a step it used.
        let report = self.instance.report(&self.run).map_err(ResumeRefused::Policy)?;
        (self.run_id, self.steps) = (report.run_id, self.steps.max(report.calls));
        self.telemetry.emit(Event::Resume(ResumeEvent {
            context: self.context(None, Some(call.call_id), &call.tool),
            attempt: call.attempt,
            answer: labels::resume_answer(answer),
            action: labels::resumed_action(call.action),
        }));
        Ok(call)
    }

    /// A resumed call that ends without a send, in the events a call ends with:
    /// the model's replan line, or the escalation line (as in every host).
    pub fn resumed_end(&self, call: &ResumedCall, replan: Option<(&str, &Decision)>, escalation: Option<&Escalation>) {
        let context = self.context(Some(call.call_id), Some(call.call_id), &call.tool);
        if let Some((message, decision)) = replan {
            let (rule, decision) = (Some(decision.rule.clone()), Some(decision.clone()));
            self.telemetry.emit(Event::Replan(ReplanEvent { context: context.clone(), attempt: call.attempt, rule, message: message.to_string(), decision }));
        }
        if let Some(escalation) = escalation {
            self.telemetry.emit(Event::Escalation(EscalationEvent {
                context,
                attempt: call.attempt,
                rule: None,
                escalation: escalation.clone(),
                decision: None,
            }));
        }
    }

    /// The state of a resumed call whose next attempt is to be sent: the
    /// guard registers it as a new call (with the same key).
    pub fn resumed_state(&mut self, step: Option<u32>, call: &ResumedCall, ticket: &CallStart) -> Result<CallState, CallEnd> {
        let guarded = match self.guard.begin(&call.tool, call.idempotency_key.as_deref(), None, ticket.delay_ms) {
            Ok(guarded) => guarded,
            Err(violation) => {
                let fault = PolicyFault::BoundaryViolation { cause: violation.to_string() };
                let escalation = policy_failure(&call.tool, "not sent", &fault);
                self.stopped_by_guard = Some(escalation.clone());
                let invariant = Some(violation.invariant.name().to_string());
                return Err(self.escalate_line(
                    step,
                    Some((call.call_id, 0)),
                    &call.tool,
                    call.idempotency_key.as_deref(),
                    "not sent",
                    escalation,
                    invariant,
                    true,
                ));
            }
        };
        Ok(CallState {
            step,
            tool: call.tool.clone(),
            call_id: call.call_id,
            guarded,
            key: call.idempotency_key.clone(),
            effect: ticket.effect,
            attempt: call.attempt,
            reported: call.attempt.saturating_sub(1),
            sent: 0,
        })
    }

    /// What happened in the run so far.
    pub fn report(&mut self) -> Result<RunReport, PolicyFault> {
        self.instance.report(&self.run)
    }

    /// Ends the run and frees it (and its policy) in the component.
    pub fn finish(mut self) -> Result<RunReport, PolicyFault> {
        let report = self.report()?;
        self.instance.drop_run(self.run)?;
        self.instance.drop_policy(self.policy)?;
        Ok(report)
    }

    /// The nearer of the run's limit and (from `call_started_ms`) the call's.
    pub fn limit<'a>(&self, call_started_ms: Option<u64>, cancel: &'a CancellationToken) -> Limit<'a> {
        let run = self.run_timeout_ms.map(|t| (self.started_ms.saturating_add(t), StopCause::RunTimeout));
        let call = call_started_ms.zip(self.call_timeout_ms).map(|(start, t)| (start.saturating_add(t), StopCause::CallTimeout));
        let deadline_ms = match (run, call) {
            (Some(r), Some(c)) => Some(if c.0 <= r.0 { c } else { r }),
            (r, c) => r.or(c),
        };
        Limit { deadline_ms, cancel, clock: Arc::clone(&self.clock) }
    }

    /// The events' common fields.
    pub fn context(&self, step: Option<u32>, call: Option<u32>, tool: &str) -> EventContext {
        let policy = self.policy_identity.clone().unwrap_or_else(|| self.instance.policy_identity().to_string());
        EventContext { run: self.run_id.clone(), policy, step, call, tool: tool.to_string() }
    }

    fn call_context(&self, state: &CallState) -> EventContext {
        self.context(state.step, Some(state.call_id), &state.tool)
    }

    /// After the guard refused a verdict, every later call of the run ends
    /// at once with the same escalation, nothing sent.
    pub fn refuse_if_stopped(&self, step: Option<u32>, tool: &str) -> Result<(), CallEnd> {
        let Some(escalation) = self.stopped_by_guard.clone() else {
            return Ok(());
        };
        let invariant = self.guard.tripped().map(|v| v.invariant.name().to_string());
        Err(self.escalate_line(step, None, tool, None, "not sent", escalation, invariant, false))
    }

    /// Derives the call's idempotency key from the run and `action_id` (a policy failure ends the call).
    pub fn derive_key(&mut self, step: Option<u32>, tool: &str, action_id: &str) -> Result<String, CallEnd> {
        let derived = self.instance.derive_idempotency_key(&self.run_id, action_id);
        derived.map_err(|fault| self.policy_failed(step, None, tool, None, "not sent", fault))
    }

    /// Asks `begin-call` and the guard to begin a call: the call's state and
    /// its ticket (the admission wait, the attempt timeouts), or how it ended
    /// before a send (not admitted, the policy failing, the guard refusing).
    pub fn begin(&mut self, step: Option<u32>, tool: &str, key: Option<String>, hints: Option<ToolHints>) -> Result<(CallState, CallStart), CallEnd> {
        self.refuse_if_stopped(step, tool)?;
        let now = self.clock.now_ms();
        let begun = match self.instance.begin(&self.run, self.server.as_deref(), tool, key.as_deref(), hints, now) {
            Ok(Ok(begun)) => begun,
            Ok(Err(error)) => return Err(CallEnd::Run(error)),
            Err(fault) => return Err(self.policy_failed(step, None, tool, key.as_deref(), "not sent", fault)),
        };
        let ticket = match begun {
            Admission::Send(ticket) => ticket,
            Admission::Escalate(escalation) => return Err(self.escalate_line(step, None, tool, key.as_deref(), "not sent", escalation, None, false)),
            Admission::Replan(start, decision) => {
                self.breaker_changes(step, Some(start.call_id), tool, start.breaker_changed);
                return Err(self.refused_by_breaker(step, start.call_id, tool, key, decision));
            }
        };
        self.breaker_changes(step, Some(ticket.call_id), tool, ticket.breaker_changed);
        let guarded = match self.guard.begin(tool, key.as_deref(), hints.as_ref(), ticket.delay_ms) {
            Ok(guarded) => guarded,
            Err(violation) => {
                // The run counted the admitted call's first attempt: so does its line (attempt 0, never sent),
                // as in Python and Node, so that the attempts counter equals the report.
                let fault = PolicyFault::BoundaryViolation { cause: violation.to_string() };
                let escalation = policy_failure(tool, "not sent", &fault);
                self.stopped_by_guard = Some(escalation.clone());
                let invariant = Some(violation.invariant.name().to_string());
                return Err(self.escalate_line(step, Some((ticket.call_id, 0)), tool, key.as_deref(), "not sent", escalation, invariant, true));
            }
        };
        let state = CallState { step, tool: tool.to_string(), call_id: ticket.call_id, guarded, key, effect: ticket.effect, attempt: 1, reported: 0, sent: 0 };
        Ok((state, ticket))
    }

    /// A call an open breaker stopped before it was sent: its attempt line
    /// (attempt 0, not sent) and its replan line.
    fn refused_by_breaker(&self, step: Option<u32>, call_id: u32, tool: &str, key: Option<String>, decision: Decision) -> CallEnd {
        let context = self.context(step, Some(call_id), tool);
        let Action::Replan(message) = decision.action.clone() else {
            return CallEnd::Run(RunError::CallFinished(call_id));
        };
        self.telemetry.emit(Event::Attempt(AttemptEvent {
            context: context.clone(),
            attempt: 0,
            key,
            outcome: "not sent".into(),
            class: None,
            rule: Some(decision.rule.clone()),
            action: "replan".into(),
            delay_ms: None,
            hint_ms: decision.hint_ms,
            escalation: None,
            reason: crate::limits::cut_lifted_text(decision.reason.clone()),
            invariant: None,
            decision: Some(decision.clone()),
            sent: false,
        }));
        self.telemetry.emit(Event::Replan(ReplanEvent {
            context,
            attempt: 0,
            rule: Some(decision.rule.clone()),
            message: message.clone(),
            decision: Some(decision),
        }));
        CallEnd::Replanned(message)
    }

    /// Emits the breakers' changes the last begin or report made, if `changed` says there are some.
    fn breaker_changes(&mut self, step: Option<u32>, call: Option<u32>, tool: &str, changed: bool) {
        if !changed {
            return;
        }
        let changes = match self.instance.take_breaker_changes(&self.run) {
            Ok(changes) => changes,
            // Only the log loses them: the policy keeps deciding.
            Err(fault) => {
                tracing::warn!(target: "agent_retry", %fault, "the circuit breakers' changes could not be read");
                return;
            }
        };
        for change in changes {
            self.telemetry.emit(Event::Breaker(BreakerEvent {
                context: self.context(step, call, tool),
                server: change.server,
                scope: if change.tool.is_some() { "tool" } else { "server" },
                from: labels::breaker_state(change.old_state),
                to: labels::breaker_state(change.new_state),
                until_ms: change.until_ms,
                why: change.why,
            }));
        }
    }

    /// Sleeps a wait of the call, its event first, unless it would end past
    /// the limit (then it is not slept, and the call stops) or the call is
    /// cancelled while it sleeps. `task_alive`: the call's task lives on the
    /// server through the wait (a stop abandons it as in flight).
    pub async fn pause(
        &mut self,
        state: &CallState,
        why: WaitReason,
        wait_ms: u64,
        hint_ms: Option<u64>,
        task_alive: bool,
        limit: &Limit<'_>,
    ) -> Result<(), CallEnd> {
        if wait_ms > 0 {
            self.telemetry.emit(Event::Wait(WaitEvent { context: self.call_context(state), attempt: state.attempt, why, wait_ms, hint_ms }));
        }
        if let Some((deadline, cause)) = limit.deadline_ms
            && self.clock.now_ms().saturating_add(wait_ms) > deadline
        {
            return Err(self.stop(state, cause, Out::Idle { task_alive }));
        }
        if wait_ms == 0 {
            return Ok(());
        }
        match limit.within(self.clock.sleep(wait_ms)).await {
            Ok(()) => Ok(()),
            Err(cause) => Err(self.stop(state, cause, Out::Idle { task_alive })),
        }
    }

    /// Reports an outcome (an attempt's, a poll's or a status check's) with
    /// the time left to the nearer deadline, passes the verdict through the
    /// guard and emits its events: the attempt line (its reason followed by
    /// `reason_suffix`), and the replan or escalation that ends the call. A
    /// retry moves the call to its next attempt.
    pub fn decide(
        &mut self,
        state: &mut CallState,
        outcome: &Outcome,
        reported: Reported,
        reason_suffix: &str,
        limit: &Limit<'_>,
    ) -> Result<Decision, CallEnd> {
        match (reported, outcome) {
            (Reported::Sent, _) => self.guard.attempted(state.guarded, Seen::of(outcome)),
            (Reported::Polled, _) => self.guard.polled(state.guarded, Polled::of(outcome)),
            (Reported::Checked, Outcome::StatusCheck(found)) => self.guard.status_checked(state.guarded, *found),
            (Reported::Checked, _) => {}
        }
        let now = self.clock.now_ms();
        let time_left_ms = limit.deadline_ms.map(|(deadline, _)| deadline.saturating_sub(now));
        let report = Report {
            call: (state.call_id, state.guarded),
            attempt: state.attempt,
            key: state.key.as_deref(),
            outcome,
            time_left_ms,
            now_ms: now,
            entropy: None,
        };
        let words_wanted = self.words_always || tracing::enabled!(target: "agent_retry", tracing::Level::INFO);
        let (on_verdict, tool, attempt) = (self.on_verdict.clone(), state.tool.clone(), state.attempt);
        let words = outcome_words(outcome);
        let mut breaker_changed = false;
        let read = read_verdict(&mut self.instance, &self.run, &mut self.guard, report, words_wanted, |verdict| {
            breaker_changed = verdict.breaker_changed;
            if let Some(hook) = &on_verdict {
                hook(&tool, attempt, verdict);
            }
        });
        self.breaker_changes(state.step, Some(state.call_id), &state.tool.clone(), breaker_changed);
        let decision = match read {
            Ok(Ok(decision)) => decision,
            Ok(Err(error)) => return Err(CallEnd::Run(error)),
            Err(refusal) => return Err(self.refused(state, &words, refusal)),
        };
        if reported == Reported::Sent {
            state.reported = state.attempt;
        }
        let context = self.call_context(state);
        let (delay_ms, escalation) = match &decision.action {
            Action::Retry(plan) => (Some(plan.delay_ms), None),
            Action::Poll(plan) => (Some(plan.delay_ms), None),
            Action::Escalate(e) => (None, Some(labels::reason(e.reason).to_string())),
            _ => (None, None),
        };
        self.telemetry.emit(Event::Attempt(AttemptEvent {
            context: context.clone(),
            attempt: decision.attempt,
            key: state.key.clone(),
            outcome: words,
            class: Some(labels::class(decision.class).to_string()),
            rule: Some(decision.rule.clone()),
            action: labels::verdict_action(&decision.action).to_string(),
            delay_ms,
            hint_ms: decision.hint_ms,
            escalation,
            reason: crate::limits::cut_lifted_text(decision.reason.clone()) + reason_suffix,
            invariant: None,
            decision: Some(decision.clone()),
            sent: reported == Reported::Sent,
        }));
        match &decision.action {
            Action::Replan(message) => self.telemetry.emit(Event::Replan(ReplanEvent {
                context,
                attempt: decision.attempt,
                rule: Some(decision.rule.clone()),
                message: message.clone(),
                decision: Some(decision.clone()),
            })),
            Action::Escalate(escalation) => self.telemetry.emit(Event::Escalation(EscalationEvent {
                context,
                attempt: decision.attempt,
                rule: Some(decision.rule.clone()),
                escalation: escalation.clone(),
                decision: Some(decision.clone()),
            })),
            Action::Retry(plan) => state.attempt = plan.attempt,
            _ => {}
        }
        Ok(decision)
    }

    /// Emits the status check's event.
    pub fn status_checked(&self, state: &CallState, check_tool: Option<String>, result: StatusCheckResult) {
        let context = self.call_context(state);
        self.telemetry.emit(Event::StatusCheck(StatusCheckEvent { context, attempt: state.attempt, check_tool, result }));
    }

    /// Emits a task poll event when the outcome says what the task's status is.
    pub fn task_polled(&self, state: &CallState, task_id: Option<&str>, outcome: &Outcome) {
        let status = match outcome {
            Outcome::Task(report) => labels::task_status(report.status),
            Outcome::Success | Outcome::EmptyResult(_) => "completed",
            Outcome::Failure(_) => "failed",
            _ => return,
        };
        let task_id = match outcome {
            Outcome::Task(report) => report.task_id.clone(),
            _ => task_id.unwrap_or_default().to_string(),
        };
        let context = self.call_context(state);
        self.telemetry.emit(Event::TaskPoll(TaskPollEvent { context, attempt: state.attempt, task_id, status: status.to_string() }));
    }

    /// A verdict that cannot be acted on: the policy-failure escalation (a
    /// broken invariant also ends every later call of the run).
    fn refused(&mut self, state: &CallState, last_outcome: &str, refusal: Refusal) -> CallEnd {
        let answered = Some((state.call_id, state.attempt));
        // An attempt whose verdict was refused is one the run report counted.
        let counted = state.reported < state.attempt;
        let (escalation, invariant) = match refusal {
            Refusal::Fault(fault) => (policy_failure(&state.tool, last_outcome, &fault), None),
            Refusal::Broken(violation) => {
                let fault = PolicyFault::BoundaryViolation { cause: violation.to_string() };
                let escalation = policy_failure(&state.tool, last_outcome, &fault);
                self.stopped_by_guard = Some(escalation.clone());
                (escalation, Some(violation.invariant.name().to_string()))
            }
        };
        self.escalate_line(state.step, answered, &state.tool, state.key.as_deref(), last_outcome, escalation, invariant, counted)
    }

    /// The safe fallback when the policy itself fails (a trap, out of fuel or
    /// memory, a broken contract, an unusable instance): nothing is retried;
    /// one `escalate` line and an escalation whose note says the policy
    /// failed, with what the last attempt saw. The instance is broken: serve
    /// the next run from a fresh one.
    pub fn policy_failed(
        &self,
        step: Option<u32>,
        answered: Option<(u32, u32)>,
        tool: &str,
        key: Option<&str>,
        last_outcome: &str,
        fault: PolicyFault,
    ) -> CallEnd {
        let escalation = policy_failure(tool, last_outcome, &fault);
        self.escalate_line(step, answered, tool, key, last_outcome, escalation, None, false)
    }

    /// The `escalate` attempt event (attempt 0 before a send; `counted` when
    /// the run report counts it as an attempt) and the escalation event of an
    /// escalation no decision answered. `answered`: the call id and the
    /// attempt the refused verdict answered, when the call was begun.
    #[allow(clippy::too_many_arguments)]
    fn escalate_line(
        &self,
        step: Option<u32>,
        answered: Option<(u32, u32)>,
        tool: &str,
        key: Option<&str>,
        outcome: &str,
        escalation: Escalation,
        invariant: Option<String>,
        counted: bool,
    ) -> CallEnd {
        let context = self.context(step, answered.map(|(call_id, _)| call_id), tool);
        let attempt = answered.map_or(0, |(_, attempt)| attempt);
        let line = AttemptEvent::unanswered(context.clone(), attempt, key.map(String::from), outcome, "escalate", escalation.note.clone(), counted);
        let escalated = Some(labels::reason(escalation.reason).to_string());
        self.telemetry.emit(Event::Attempt(AttemptEvent { escalation: escalated, invariant, ..line }));
        self.telemetry.emit(Event::Escalation(EscalationEvent { context, attempt, rule: None, escalation: escalation.clone(), decision: None }));
        CallEnd::Escalated(escalation)
    }

    /// A call that stops waiting: the run is told first (`abandon-call`, so
    /// that the call no longer counts as open and a write on the wire is
    /// listed as possibly applied), then one `stop` line whose reason says
    /// where the call was and what is known of its effect.
    pub fn stop(&mut self, state: &CallState, cause: StopCause, out: Out) -> CallEnd {
        let why = if cause == StopCause::Cancelled { AbandonReason::Cancelled } else { AbandonReason::Deadline };
        let (request_out, task_alive, during) = match out {
            Out::Request => (true, false, None),
            Out::Idle { task_alive } => (false, task_alive, None),
            Out::Connecting { task_alive } => (false, task_alive, Some("initialize")),
        };
        let in_flight = request_out || task_alive;
        // A call a verdict already ended, or a failed policy: the stop goes on all the same.
        let _ = self.instance.abandon_call(&self.run, state.call_id, state.attempt, in_flight, why);
        let writes = matches!(state.effect, Effect::Write | Effect::Delete);
        let may_have_applied = writes && (in_flight || self.listed_unknown(state.call_id));
        let applied = match (writes, may_have_applied) {
            (false, _) => StopEffect::NotAWrite,
            (true, true) => StopEffect::MayHaveApplied,
            (true, false) => StopEffect::NotApplied,
        };
        let place = match (request_out, state.sent) {
            (true, _) => StopPlace::InFlight(state.attempt),
            (false, 0) => StopPlace::BeforeSend(during),
            (false, _) => StopPlace::BetweenAttempts,
        };
        let reason = stop_reason(&StopFacts { cause, limit_ms: self.limit_ms(cause), place, attempts_sent: state.sent, applied });
        // The attempt planned and never answered is one the run report counted.
        self.stop_line(state, cause.label(), reason.clone(), state.reported < state.attempt);
        CallEnd::Stopped(Stopped { cause, tool: state.tool.clone(), call_id: Some(state.call_id), attempts_sent: state.sent, may_have_applied, reason })
    }

    /// A tool call that stops before it was begun, while `during` (a
    /// pseudo-call: listing the tools again) ran for it: its own `stop`
    /// line (no call id: the policy named no effect of it, nothing was sent).
    pub fn stop_before_begin(&self, step: Option<u32>, tool: &str, cause: StopCause, during: &str) -> CallEnd {
        let place = StopPlace::BeforeSend(Some(during));
        let reason = stop_reason(&StopFacts { cause, limit_ms: self.limit_ms(cause), place, attempts_sent: 0, applied: StopEffect::NothingSent });
        let line = AttemptEvent::unanswered(self.context(step, None, tool), 0, None, cause.label(), "stop", reason.clone(), false);
        self.telemetry.emit(Event::Attempt(line));
        CallEnd::Stopped(Stopped { cause, tool: tool.to_string(), call_id: None, attempts_sent: 0, may_have_applied: false, reason })
    }

    /// The limit a stop names, in ms (none for a cancellation).
    fn limit_ms(&self, cause: StopCause) -> Option<u64> {
        match cause {
            StopCause::CallTimeout => self.call_timeout_ms,
            StopCause::RunTimeout => self.run_timeout_ms,
            StopCause::Cancelled => None,
        }
    }

    /// Whether the run lists an effect of `call_id` as `unknown` (a policy
    /// that cannot say is read as the worst case).
    pub fn listed_unknown(&mut self, call_id: u32) -> bool {
        self.instance.all_effects(&self.run).map_or(true, |effects| effects.iter().any(|e| e.call_id == call_id && e.status == EffectStatus::Unknown))
    }

    /// The `stop` attempt event of a call that ends without a verdict;
    /// `counted`: the run report counts the attempt it names.
    pub fn stop_line(&self, state: &CallState, outcome: &str, reason: String, counted: bool) {
        let line = AttemptEvent::unanswered(self.call_context(state), state.attempt, state.key.clone(), outcome, "stop", reason, counted);
        self.telemetry.emit(Event::Attempt(line));
    }
}

/// The policy-failure escalation (the same note as the Python and Node wrappers').
pub(crate) fn policy_failure(tool: &str, last_outcome: &str, fault: &PolicyFault) -> Escalation {
    let note = format!(
        "the retry policy failed ({}: {fault}); not retried. Last outcome of {tool}: {last_outcome}. \
         Effects of this run are not known to the host: check before sending again.",
        fault.kind()
    );
    Escalation {
        reason: EscalationReason::UnclassifiedFailure,
        last_error: Some(last_outcome.to_string()),
        resets_in_ms: None,
        effects: vec![],
        effects_total: 0,
        note,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every case of the shared stop-reason vectors gives the same words here.
    #[test]
    fn stop_reasons_match_the_shared_vectors() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/events/stop_reasons.json");
        let vectors: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).expect("stop_reasons.json")).expect("JSON");
        let cases = vectors["cases"].as_array().expect("cases");
        assert!(cases.len() >= 8, "too few cases: {}", cases.len());
        for case in cases {
            let inputs = &case["inputs"];
            let text = |field: &str| inputs[field].as_str().unwrap_or_default().to_string();
            let cause = match text("cause").as_str() {
                "call-timeout" => StopCause::CallTimeout,
                "run-timeout" => StopCause::RunTimeout,
                "cancelled" => StopCause::Cancelled,
                other => panic!("cause {other}"),
            };
            let during = inputs["during"].as_str();
            let place = match text("where").as_str() {
                "in-flight" => StopPlace::InFlight(inputs["attempt"].as_u64().expect("attempt") as u32),
                "between-attempts" => StopPlace::BetweenAttempts,
                "before-send" => StopPlace::BeforeSend(during),
                other => panic!("where {other}"),
            };
            let applied = match text("applied").as_str() {
                "nothing-sent" => StopEffect::NothingSent,
                "not-a-write" => StopEffect::NotAWrite,
                "may-have-applied" => StopEffect::MayHaveApplied,
                "not-applied" => StopEffect::NotApplied,
                other => panic!("applied {other}"),
            };
            let facts = StopFacts {
                cause,
                limit_ms: inputs["limit_ms"].as_u64(),
                place,
                attempts_sent: inputs["attempts_sent"].as_u64().expect("attempts_sent") as u32,
                applied,
            };
            assert_eq!(stop_reason(&facts), case["reason"].as_str().expect("reason"), "case {case}");
        }
    }
}
