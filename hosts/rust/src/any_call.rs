//! Any async call under the policy: [`PolicyRun::with_policy`] runs a closure
//! (an HTTP request, a model API call, anything) as the MCP wrapper runs a
//! tool call: it derives the idempotency key once, asks `begin-call`, runs an
//! attempt, reports what happened (the closure's value is a success; its
//! error is translated by [`ToObservation`] into the contract's
//! observation), and does what the verdict says: sleep and run again with
//! the same key, run the status check, hand back the model's message, or
//! stop with the escalation. The wrapper never decides what a failure means,
//! and the run-time guard enforces the invariants no policy may break.
//!
//! The Python `call_with_policy`, the Node `withPolicy`.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use crate::component::types::{
    AbandonReason, Action, Decision, Delivery, Escalation, FailureKind, Observation, RunError, RunReport, StatusCheckResult, ToolHints, TransportError,
};
use crate::component::{Admission, Outcome, PolicyHandle, PolicyInstance, RunHandle};
use crate::events::{AttemptEvent, EscalationEvent, Event, EventContext, ReplanEvent, RetryHooks, StatusCheckEvent, Telemetry, WaitEvent, WaitReason};
use crate::fault::PolicyFault;
use crate::guard::{CallIndex, RunGuard, Seen};
use crate::labels;
use crate::limits;
use crate::mcp::answer::{StopCause, Stopped};
use crate::mcp::caller::{DEFAULT_RUN_TIMEOUT_MS, policy_failure};
use crate::mcp::metrics::Metrics;
use crate::time_source::TimeSource;
use crate::verdicts::{Refusal, Report, read_verdict};

/// What one run of the closure is told: which attempt it is (1, then each
/// retry's) and the call's idempotency key (the same in every attempt).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    pub number: u32,
    pub idempotency_key: Option<String>,
}

/// How an error of the closure reads as the contract's observation: status,
/// headers as received, body text, or the transport's failure kind and
/// delivery. It only translates; the policy decides what it means. `None`:
/// an error the mapping does not know (a bug in the caller's code): the call
/// is abandoned and the error handed back unchanged
/// ([`AnyCallError::Unobserved`]).
pub trait ToObservation {
    fn to_observation(&self) -> Option<Observation>;
}

/// An error carrying the observation itself, for a caller that knows what it
/// observed (and what [`observe_response`] and `From<reqwest::Error>` give).
#[derive(Clone, Debug)]
pub struct Observed(pub Observation);

impl fmt::Display for Observed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", crate::events::outcome_words(&Outcome::Failure(self.0.clone())), limits::cut(&self.0.body, 200))
    }
}

impl std::error::Error for Observed {}

impl ToObservation for Observed {
    fn to_observation(&self) -> Option<Observation> {
        Some(self.0.clone())
    }
}

impl ToObservation for reqwest::Error {
    fn to_observation(&self) -> Option<Observation> {
        Some(reqwest_observation(self))
    }
}

impl From<reqwest::Error> for Observed {
    fn from(error: reqwest::Error) -> Self {
        Observed(reqwest_observation(&error))
    }
}

/// A reqwest error as the transport failure it is: a connect timeout was not
/// sent, another timeout was; a refused or failed connection was not sent; a
/// body cut short was being answered. A status error (`error_for_status`)
/// carries the status only: use [`observe_response`] to keep the headers and body.
fn reqwest_observation(error: &reqwest::Error) -> Observation {
    let detail = limits::cut(&error_chain(error), limits::MAX_BODY_BYTES).to_string();
    if let Some(status) = error.status() {
        return Observation::new(FailureKind::HttpStatus(status.as_u16()), &[], detail).delivered(Delivery::AnswerStarted);
    }
    let (kind, delivery) = if error.is_timeout() {
        (TransportError::Timeout, if error.is_connect() { Delivery::NotSent } else { Delivery::Sent })
    } else if error.is_connect() {
        (if refused(error) { TransportError::ConnectionRefused } else { TransportError::Other }, Delivery::NotSent)
    } else if error.is_body() || error.is_decode() {
        (TransportError::StreamClosed, Delivery::AnswerStarted)
    } else {
        (TransportError::Other, Delivery::Unknown)
    };
    Observation::new(FailureKind::Transport(kind), &[], detail).delivered(delivery)
}

/// Whether the OS refused the connection (the error's source chain says so).
fn refused(error: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return true;
        }
        source = e.source();
    }
    false
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// A response with a success status, or its failure as observed: the
/// status, the headers as received, the body (at most the contract's body
/// limit, read no further). A body that cannot be read is reported as read so far.
pub async fn observe_response(response: reqwest::Response) -> Result<reqwest::Response, Observed> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let headers: Vec<(String, String)> =
        response.headers().iter().map(|(name, value)| (name.as_str().to_string(), String::from_utf8_lossy(value.as_bytes()).into_owned())).collect();
    let mut body = Vec::new();
    let mut response = response;
    while body.len() < limits::MAX_BODY_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk[..chunk.len().min(limits::MAX_BODY_BYTES - body.len())]),
            Ok(None) | Err(_) => break,
        }
    }
    let body = String::from_utf8_lossy(&body);
    let body = limits::cut(&body, limits::MAX_BODY_BYTES).to_string();
    Err(Observed(Observation::new(FailureKind::HttpStatus(status.as_u16()), &headers, body).delivered(Delivery::AnswerStarted)))
}

/// Reads state to learn whether an ambiguous write was applied.
pub type AnyStatusCheck = Box<dyn Fn() -> BoxFuture<'static, StatusCheckResult> + Send + Sync>;

/// How [`PolicyRun`] behaves: the MCP wrapper's options that apply to any call.
#[derive(Clone)]
pub struct WithPolicyOptions {
    /// The clock the policy reads and the waits sleep on (real by default).
    pub clock: Arc<dyn TimeSource>,
    /// Which policy decides, for the `policy` field of every event (default: the component's identity).
    pub policy_identity: Option<String>,
    /// Told the events as they happen (default none).
    pub hooks: Option<Arc<dyn RetryHooks>>,
    /// The instruments the events are counted in (default none).
    pub metrics: Option<Arc<Metrics>>,
    /// A call stops after this long, its waits included (policy ms; default none).
    pub call_timeout_ms: Option<u64>,
    /// Every call stops once the run is this old (policy ms; default 30 minutes).
    pub run_timeout_ms: Option<u64>,
    /// Makes a span per call and per attempt (default none: no spans).
    #[cfg(feature = "otel")]
    pub tracer: Option<crate::otel::OtelTracer>,
}

impl Default for WithPolicyOptions {
    fn default() -> Self {
        WithPolicyOptions {
            clock: Arc::new(crate::mcp::Clock::real()),
            policy_identity: None,
            hooks: None,
            metrics: None,
            call_timeout_ms: None,
            run_timeout_ms: Some(DEFAULT_RUN_TIMEOUT_MS),
            #[cfg(feature = "otel")]
            tracer: None,
        }
    }
}

impl fmt::Debug for WithPolicyOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WithPolicyOptions")
            .field("policy_identity", &self.policy_identity)
            .field("hooks", &self.hooks.is_some())
            .field("metrics", &self.metrics.is_some())
            .field("call_timeout_ms", &self.call_timeout_ms)
            .field("run_timeout_ms", &self.run_timeout_ms)
            .finish()
    }
}

/// What one call tells the policy beyond its tool's name.
#[derive(Clone, Debug, Default)]
pub struct CallOptions {
    /// The tool's hints, as MCP annotations give them (default none: the configuration decides).
    pub hints: Option<ToolHints>,
    /// Whether the call takes an idempotency key. By default it does when
    /// the hints or the configuration's entry for the tool say `idempotent`.
    pub keyed: Option<bool>,
    /// What the key is derived from with the run id (default `step-N`).
    pub action_id: Option<String>,
}

/// Why a call through [`PolicyRun::with_policy`] gave no value.
#[derive(Debug)]
pub enum AnyCallError<E> {
    /// The caller (or the model) can fix the call: the policy's message, and its rule.
    Replan { message: String, rule: String },
    /// The policy escalated: hand `note` to a person.
    Escalated(Escalation),
    /// The call or run time limit would pass before the next attempt.
    TimedOut(Stopped),
    /// The closure failed with an error its mapping does not know: handed
    /// back unchanged (the call is abandoned in the run, as cancelled).
    Unobserved(E),
    /// A status check showed the call applied, so it is not sent again; its
    /// value was never received (the policy's note says so).
    Applied { note: Option<String> },
    /// The policy component failed; nothing is retried.
    Policy(PolicyFault),
    /// The run was used wrongly (a bug in the host).
    Run(RunError),
}

impl<E: fmt::Display> fmt::Display for AnyCallError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnyCallError::Replan { message, rule } => write!(f, "replan ({rule}): {message}"),
            AnyCallError::Escalated(e) => write!(f, "escalated: {}", e.note),
            AnyCallError::TimedOut(s) => write!(f, "{} stopped by {} after {} attempt(s)", s.tool, s.cause.label(), s.attempts_sent),
            AnyCallError::Unobserved(e) => write!(f, "{e}"),
            AnyCallError::Applied { note } => write!(f, "applied, its value not received{}", note.as_deref().map(|n| format!(": {n}")).unwrap_or_default()),
            AnyCallError::Policy(e) => write!(f, "the policy component failed: {e}"),
            AnyCallError::Run(e) => write!(f, "run error: {e:?}"),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for AnyCallError<E> {}

/// One run of calls under the policy (one agent run): its policy instance,
/// its run in the component, its guard and its steps.
pub struct PolicyRun {
    instance: PolicyInstance,
    policy: PolicyHandle,
    run: RunHandle,
    run_id: String,
    config: Value,
    guard: RunGuard,
    options: WithPolicyOptions,
    telemetry: Telemetry,
    status_checks: HashMap<String, AnyStatusCheck>,
    steps: u32,
    started_ms: u64,
    /// After the guard refused a verdict, every later call ends with this escalation.
    stopped_by_guard: Option<Escalation>,
}

/// Where a call is: the policy's id for it and the guard's.
struct CallState<'a> {
    step: u32,
    tool: &'a str,
    call_id: u32,
    guarded: CallIndex,
    key: Option<String>,
    deadline: Option<(u64, StopCause)>,
    sent: u32,
}

impl PolicyRun {
    /// Loads the configuration into `instance` and starts the run.
    pub fn start(mut instance: PolicyInstance, config_json: &str, run_id: &str, options: WithPolicyOptions) -> anyhow::Result<Self> {
        let policy = instance.load_policy(config_json)?.map_err(|e| anyhow::anyhow!("policy configuration: {}: {}", e.field, e.message))?;
        let run = instance.start_run(&policy, run_id)?.map_err(|e| anyhow::anyhow!("run id: {e:?}"))?;
        let telemetry = telemetry_of(&options);
        Ok(PolicyRun {
            policy,
            run,
            run_id: run_id.to_string(),
            config: serde_json::from_str(config_json).unwrap_or(Value::Null),
            guard: RunGuard::from_config_text(config_json),
            started_ms: options.clock.now_ms(),
            telemetry,
            options,
            instance,
            status_checks: HashMap::new(),
            steps: 0,
            stopped_by_guard: None,
        })
    }

    /// Registers how to check whether a write to `tool` was applied.
    pub fn with_status_check(mut self, tool: &str, check: AnyStatusCheck) -> Self {
        self.status_checks.insert(tool.to_string(), check);
        self
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// What happened in the run so far.
    pub fn report(&mut self) -> Result<RunReport, PolicyFault> {
        self.instance.report(&self.run)
    }

    /// Ends the run and frees it in the component.
    pub fn finish(mut self) -> Result<RunReport, PolicyFault> {
        let report = self.report()?;
        self.instance.drop_run(self.run)?;
        self.instance.drop_policy(self.policy)?;
        Ok(report)
    }

    /// Runs `attempt` under the policy as the call `tool`, with the default [`CallOptions`].
    pub async fn with_policy<T, E, F, Fut>(&mut self, tool: &str, attempt: F) -> Result<T, AnyCallError<E>>
    where
        E: ToObservation,
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.with_policy_using(tool, CallOptions::default(), attempt).await
    }

    /// Runs `attempt` under the policy as the call `tool`: once, and again
    /// as the verdicts say (with the same key), until it succeeds, the policy
    /// asks for a replan or escalates, or a deadline would pass.
    pub async fn with_policy_using<T, E, F, Fut>(&mut self, tool: &str, call: CallOptions, attempt_fn: F) -> Result<T, AnyCallError<E>>
    where
        E: ToObservation,
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.telemetry.begin_call(&self.context(self.steps + 1, None, tool));
        let result = self.call_under_policy(tool, call, attempt_fn).await;
        let (action, error_type) = match &result {
            Ok(_) | Err(AnyCallError::Applied { .. }) => ("succeed", None),
            Err(AnyCallError::Replan { .. }) => ("replan", None),
            Err(AnyCallError::Escalated(e)) => ("escalate", Some(labels::reason(e.reason))),
            Err(AnyCallError::TimedOut(stopped)) => ("stop", Some(stopped.cause.label())),
            Err(AnyCallError::Unobserved(_)) => ("stop", Some(std::any::type_name::<E>().rsplit("::").next().unwrap_or("unobserved"))),
            Err(AnyCallError::Policy(_)) => ("stop", Some("policy-fault")),
            Err(AnyCallError::Run(_)) => ("stop", Some("run-error")),
        };
        self.telemetry.end_call(action, error_type);
        result
    }

    /// [`PolicyRun::with_policy_using`] inside the call's span.
    async fn call_under_policy<T, E, F, Fut>(&mut self, tool: &str, call: CallOptions, mut attempt_fn: F) -> Result<T, AnyCallError<E>>
    where
        E: ToObservation,
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let call_started = self.options.clock.now_ms();
        self.steps += 1;
        let step = self.steps;
        if let Some(escalation) = self.stopped_by_guard.clone() {
            let invariant = self.guard.tripped().map(|v| v.invariant.name().to_string());
            return Err(self.escalate_line(step, None, tool, None, "not sent", escalation, invariant, false));
        }
        // The key identifies the intended effect: derived once, sent unchanged with every attempt.
        let key = if self.keyed(tool, &call) {
            let action_id = call.action_id.clone().unwrap_or_else(|| format!("step-{step}"));
            match self.instance.derive_idempotency_key(&self.run_id, &action_id) {
                Ok(key) => Some(key),
                Err(fault) => return Err(self.policy_failed(step, None, tool, None, "not sent", fault)),
            }
        } else {
            None
        };
        let begun = match self.instance.begin(&self.run, tool, key.as_deref(), call.hints, call_started) {
            Ok(Ok(begun)) => begun,
            Ok(Err(error)) => return Err(AnyCallError::Run(error)),
            Err(fault) => return Err(self.policy_failed(step, None, tool, key.as_deref(), "not sent", fault)),
        };
        let ticket = match begun {
            Admission::Send(ticket) => ticket,
            Admission::Escalate(escalation) => return Err(self.escalate_line(step, None, tool, key.as_deref(), "not sent", escalation, None, false)),
        };
        let guarded = match self.guard.begin(tool, key.as_deref(), call.hints.as_ref(), ticket.delay_ms) {
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
        let mut state = CallState { step, tool, call_id: ticket.call_id, guarded, key, deadline: self.deadline(call_started), sent: 0 };
        self.pause(&mut state, 1, WaitReason::Admission, ticket.delay_ms, None).await?;
        let mut attempt = 1;
        let mut check_next = false;
        loop {
            let (outcome, value) = if check_next {
                let found = match self.status_checks.get(tool) {
                    Some(check) => check().await,
                    None => StatusCheckResult::Unknown,
                };
                self.guard.status_checked(state.guarded, found);
                let context = self.context(step, Some(state.call_id), tool);
                self.telemetry.emit(Event::StatusCheck(StatusCheckEvent { context, attempt, check_tool: None, result: found }));
                (Outcome::StatusCheck(found), None)
            } else {
                state.sent += 1;
                self.telemetry.begin_attempt(false);
                let answered = self.telemetry.in_attempt(attempt_fn(Attempt { number: attempt, idempotency_key: state.key.clone() })).await;
                match answered {
                    Ok(value) => {
                        self.guard.attempted(state.guarded, Seen::of(&Outcome::Success));
                        (Outcome::Success, Some(value))
                    }
                    Err(error) => match error.to_observation() {
                        Some(observation) => {
                            let outcome = Outcome::Failure(limits::bounded_observation(&observation).into_owned());
                            self.guard.attempted(state.guarded, Seen::of(&outcome));
                            (outcome, None)
                        }
                        None => return Err(self.unobserved(&state, attempt, error)),
                    },
                }
            };
            let decision = self.decide(&state, attempt, &outcome, !check_next)?;
            match decision.action {
                Action::Retry(plan) => {
                    attempt = plan.attempt;
                    check_next = false;
                    self.pause(&mut state, attempt, WaitReason::Retry, plan.delay_ms, decision.hint_ms).await?;
                }
                Action::CheckStatus => check_next = true,
                Action::Succeed(note) => match value {
                    Some(value) => return Ok(value),
                    // A status check showed the write applied: there is no value to give.
                    None => return Err(AnyCallError::Applied { note }),
                },
                Action::Replan(message) => return Err(AnyCallError::Replan { message, rule: decision.rule }),
                Action::Escalate(escalation) => return Err(AnyCallError::Escalated(escalation)),
                // Only a task's report is answered with a poll, and a closure reports none.
                Action::Poll(_) => {
                    let fault = PolicyFault::BoundaryViolation { cause: format!("a poll answered {tool}, which has no task") };
                    let words = crate::events::outcome_words(&outcome);
                    return Err(self.policy_failed(step, Some((state.call_id, attempt)), tool, state.key.as_deref(), &words, fault));
                }
            }
        }
    }

    /// Whether a call takes a key: as told, else when its hints or the
    /// configuration's entry for the tool say `idempotent` (what the user
    /// declared, read as given).
    fn keyed(&self, tool: &str, call: &CallOptions) -> bool {
        call.keyed.unwrap_or_else(|| {
            call.hints.is_some_and(|h| h.idempotent == Some(true))
                || self.config.pointer(&format!("/tools/{}/idempotent", tool.replace('~', "~0").replace('/', "~1"))) == Some(&Value::Bool(true))
        })
    }

    /// The nearer of the run's deadline and (from `call_started_ms`) the call's.
    fn deadline(&self, call_started_ms: u64) -> Option<(u64, StopCause)> {
        let run = self.options.run_timeout_ms.map(|t| (self.started_ms.saturating_add(t), StopCause::RunTimeout));
        let call = self.options.call_timeout_ms.map(|t| (call_started_ms.saturating_add(t), StopCause::CallTimeout));
        match (run, call) {
            (Some(r), Some(c)) => Some(if c.0 <= r.0 { c } else { r }),
            (r, c) => r.or(c),
        }
    }

    fn context(&self, step: u32, call: Option<u32>, tool: &str) -> EventContext {
        let policy = self.options.policy_identity.clone().unwrap_or_else(|| self.instance.policy_identity().to_string());
        EventContext { run: self.run_id.clone(), policy, step: Some(step), call, tool: tool.to_string() }
    }

    /// Sleeps a wait (its event first), unless it would end past the deadline: then the call stops.
    async fn pause<E>(&mut self, state: &mut CallState<'_>, attempt: u32, why: WaitReason, wait_ms: u64, hint_ms: Option<u64>) -> Result<(), AnyCallError<E>> {
        if let Some((deadline, cause)) = state.deadline
            && self.options.clock.now_ms().saturating_add(wait_ms) > deadline
        {
            return Err(self.stopped(state, attempt, cause));
        }
        if wait_ms > 0 {
            let context = self.context(state.step, Some(state.call_id), state.tool);
            self.telemetry.emit(Event::Wait(WaitEvent { context, attempt, why, wait_ms, hint_ms }));
            self.options.clock.sleep(wait_ms).await;
        }
        Ok(())
    }

    /// Reports the outcome and reads the verdict through the guard; emits the
    /// attempt event (and the replan or escalation that ends the call).
    fn decide<E>(&mut self, state: &CallState<'_>, attempt: u32, outcome: &Outcome, sent: bool) -> Result<Decision, AnyCallError<E>> {
        let now = self.options.clock.now_ms();
        let time_left_ms = state.deadline.map(|(deadline, _)| deadline.saturating_sub(now));
        let report = Report { call: (state.call_id, state.guarded), attempt, key: state.key.as_deref(), outcome, time_left_ms, now_ms: now, entropy: None };
        let words = crate::events::outcome_words(outcome);
        let decision = match read_verdict(&mut self.instance, &self.run, &mut self.guard, report, true, |_| {}) {
            Ok(Ok(decision)) => decision,
            Ok(Err(error)) => return Err(AnyCallError::Run(error)),
            Err(refusal) => return Err(self.refused(state.step, (state.call_id, attempt), state.tool, state.key.as_deref(), &words, refusal)),
        };
        let context = self.context(state.step, Some(state.call_id), state.tool);
        let (delay_ms, escalation) = match &decision.action {
            Action::Retry(plan) => (Some(plan.delay_ms), None),
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
            reason: limits::cut_lifted_text(decision.reason.clone()),
            invariant: None,
            decision: Some(decision.clone()),
            sent,
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
            _ => {}
        }
        Ok(decision)
    }

    /// A verdict that cannot be acted on: the policy-failure escalation (a
    /// broken invariant also ends every later call of the run).
    fn refused<E>(&mut self, step: u32, answered: (u32, u32), tool: &str, key: Option<&str>, last_outcome: &str, refusal: Refusal) -> AnyCallError<E> {
        match refusal {
            Refusal::Fault(fault) => self.policy_failed(step, Some(answered), tool, key, last_outcome, fault),
            Refusal::Broken(violation) => {
                let fault = PolicyFault::BoundaryViolation { cause: violation.to_string() };
                let escalation = policy_failure(tool, last_outcome, &fault);
                self.stopped_by_guard = Some(escalation.clone());
                self.escalate_line(step, Some(answered), tool, key, last_outcome, escalation, Some(violation.invariant.name().to_string()), false)
            }
        }
    }

    /// The safe fallback when the policy itself fails: nothing is retried.
    fn policy_failed<E>(
        &mut self,
        step: u32,
        answered: Option<(u32, u32)>,
        tool: &str,
        key: Option<&str>,
        last_outcome: &str,
        fault: PolicyFault,
    ) -> AnyCallError<E> {
        let escalation = policy_failure(tool, last_outcome, &fault);
        self.escalate_line(step, answered, tool, key, last_outcome, escalation, None, false)
    }

    /// The `escalate` attempt event (attempt 0 before a send; `counted` when
    /// the run report counts it as an attempt) and the escalation event of an
    /// escalation no decision answered.
    #[allow(clippy::too_many_arguments)]
    fn escalate_line<E>(
        &mut self,
        step: u32,
        answered: Option<(u32, u32)>,
        tool: &str,
        key: Option<&str>,
        outcome: &str,
        escalation: Escalation,
        invariant: Option<String>,
        counted: bool,
    ) -> AnyCallError<E> {
        let context = self.context(step, answered.map(|(call_id, _)| call_id), tool);
        let attempt = answered.map_or(0, |(_, attempt)| attempt);
        self.telemetry.emit(Event::Attempt(AttemptEvent {
            context: context.clone(),
            attempt,
            key: key.map(String::from),
            outcome: outcome.to_string(),
            class: None,
            rule: None,
            action: "escalate".into(),
            delay_ms: None,
            hint_ms: None,
            escalation: Some(labels::reason(escalation.reason).to_string()),
            reason: escalation.note.clone(),
            invariant,
            decision: None,
            sent: counted,
        }));
        self.telemetry.emit(Event::Escalation(EscalationEvent { context, attempt, rule: None, escalation: escalation.clone(), decision: None }));
        AnyCallError::Escalated(escalation)
    }

    /// A call that stops before its next attempt because a deadline would pass.
    fn stopped<E>(&mut self, state: &CallState<'_>, attempt: u32, cause: StopCause) -> AnyCallError<E> {
        let _ = self.instance.abandon_call(&self.run, state.call_id, attempt, false, AbandonReason::Deadline);
        let may_have_applied = self.may_have_applied(state.call_id);
        self.stop_line(state, attempt, cause.label(), format!("{} after {} attempt(s)", cause.label(), state.sent));
        AnyCallError::TimedOut(Stopped { cause, tool: state.tool.to_string(), call_id: Some(state.call_id), attempts_sent: state.sent, may_have_applied })
    }

    /// The closure's error has no observation: a bug in the caller's code.
    /// The call is abandoned (in flight, as cancelled) and the error handed back.
    fn unobserved<E>(&mut self, state: &CallState<'_>, attempt: u32, error: E) -> AnyCallError<E> {
        let _ = self.instance.abandon_call(&self.run, state.call_id, attempt, true, AbandonReason::Cancelled);
        self.stop_line(state, attempt, "unmapped error", "the attempt failed with an error its mapping does not know: handed back unchanged".into());
        AnyCallError::Unobserved(error)
    }

    fn may_have_applied(&mut self, call_id: u32) -> bool {
        self.instance
            .all_effects(&self.run)
            .is_ok_and(|effects| effects.iter().any(|e| e.call_id == call_id && e.status == crate::component::types::EffectStatus::Unknown))
    }

    /// The line of a call that stops with an attempt the policy admitted (or
    /// decided) and never answered: the run report counts that attempt, so
    /// the line counts as one (`sent`).
    fn stop_line(&self, state: &CallState<'_>, attempt: u32, outcome: &str, reason: String) {
        self.telemetry.emit(Event::Attempt(AttemptEvent {
            context: self.context(state.step, Some(state.call_id), state.tool),
            attempt,
            key: state.key.clone(),
            outcome: outcome.to_string(),
            class: None,
            rule: None,
            action: "stop".into(),
            delay_ms: None,
            hint_ms: None,
            escalation: None,
            reason,
            invariant: None,
            decision: None,
            sent: true,
        }));
    }
}

/// The fan-out of a run's events: its hooks, its metrics, its tracer.
#[cfg(feature = "otel")]
fn telemetry_of(options: &WithPolicyOptions) -> Telemetry {
    Telemetry::new(options.hooks.clone(), options.metrics.clone()).with_tracer(options.tracer.clone())
}

/// The fan-out of a run's events: its hooks, its metrics.
#[cfg(not(feature = "otel"))]
fn telemetry_of(options: &WithPolicyOptions) -> Telemetry {
    Telemetry::new(options.hooks.clone(), options.metrics.clone())
}
