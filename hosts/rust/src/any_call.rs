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
use tokio_util::sync::CancellationToken;

use crate::call_core::{CallEnd, CallState, CoreOptions, Out, Reported, RunCore};
use crate::component::types::{
    AbandonReason, Action, Delivery, Escalation, FailureKind, Observation, RunError, RunReport, StatusCheckResult, ToolHints, TransportError,
};
use crate::component::{Outcome, PolicyInstance};
use crate::events::{RetryHooks, Telemetry, WaitReason};
use crate::fault::PolicyFault;
use crate::labels;
use crate::limits;
use crate::mcp::answer::Stopped;
use crate::mcp::caller::DEFAULT_RUN_TIMEOUT_MS;
use crate::mcp::metrics::Metrics;
use crate::time_source::TimeSource;

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
    /// The server (or service) the calls go to, for the policy's circuit
    /// breakers (default none: no breaker applies).
    pub server: Option<String>,
    /// Makes a span per call and per attempt (default none: no spans).
    #[cfg(feature = "otel")]
    pub tracer: Option<crate::otel::OtelTracer>,
    /// Records the instruments of docs/events.md through OpenTelemetry (default none).
    #[cfg(feature = "otel")]
    pub meter: Option<crate::otel::OtelMeter>,
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
            server: None,
            #[cfg(feature = "otel")]
            tracer: None,
            #[cfg(feature = "otel")]
            meter: None,
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
    /// The call or run time limit passed (an attempt or a status check in
    /// flight is cut), or would pass before the next attempt.
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
            AnyCallError::TimedOut(s) => write!(f, "{}: {}", s.tool, s.reason),
            AnyCallError::Unobserved(e) => write!(f, "{e}"),
            AnyCallError::Applied { note } => write!(f, "applied, its value not received{}", note.as_deref().map(|n| format!(": {n}")).unwrap_or_default()),
            AnyCallError::Policy(e) => write!(f, "the policy component failed: {e}"),
            AnyCallError::Run(e) => write!(f, "run error: {e:?}"),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for AnyCallError<E> {}

/// One run of calls under the policy (one agent run): its run in the
/// component, with its guard and events ([`crate::call_core`]), and the
/// status checks of its writes.
pub struct PolicyRun {
    core: RunCore,
    config: Value,
    status_checks: HashMap<String, AnyStatusCheck>,
}

impl<E> From<CallEnd> for AnyCallError<E> {
    fn from(end: CallEnd) -> Self {
        match end {
            CallEnd::Escalated(escalation) => AnyCallError::Escalated(escalation),
            CallEnd::Stopped(stopped) => AnyCallError::TimedOut(stopped),
            CallEnd::Run(error) => AnyCallError::Run(error),
            CallEnd::Replanned(message) => AnyCallError::Replan { message, rule: "circuit-open".into() },
        }
    }
}

impl PolicyRun {
    /// Loads the configuration into `instance` and starts the run.
    pub fn start(instance: PolicyInstance, config_json: &str, run_id: &str, options: WithPolicyOptions) -> anyhow::Result<Self> {
        let telemetry = telemetry_of(&options);
        let core_options = CoreOptions {
            clock: Arc::clone(&options.clock),
            policy_identity: options.policy_identity.clone(),
            call_timeout_ms: options.call_timeout_ms,
            run_timeout_ms: options.run_timeout_ms,
            on_verdict: None,
            words_always: true,
            server: options.server.clone(),
        };
        let core = RunCore::start(instance, config_json, run_id, telemetry, core_options)?;
        Ok(PolicyRun { core, config: serde_json::from_str(config_json).unwrap_or(Value::Null), status_checks: HashMap::new() })
    }

    /// Registers how to check whether a write to `tool` was applied.
    pub fn with_status_check(mut self, tool: &str, check: AnyStatusCheck) -> Self {
        self.status_checks.insert(tool.to_string(), check);
        self
    }

    pub fn run_id(&self) -> &str {
        &self.core.run_id
    }

    /// What happened in the run so far.
    pub fn report(&mut self) -> Result<RunReport, PolicyFault> {
        self.core.report()
    }

    /// Ends the run and frees it in the component.
    pub fn finish(self) -> Result<RunReport, PolicyFault> {
        self.core.finish()
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
        self.core.telemetry.begin_call(&self.core.context(Some(self.core.steps + 1), None, tool));
        let _dropped = self.core.telemetry.ending_on_drop();
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
        self.core.telemetry.end_call(action, error_type);
        result
    }

    /// [`PolicyRun::with_policy_using`] inside the call's span.
    async fn call_under_policy<T, E, F, Fut>(&mut self, tool: &str, call: CallOptions, mut attempt_fn: F) -> Result<T, AnyCallError<E>>
    where
        E: ToObservation,
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let call_started = self.core.clock.now_ms();
        self.core.steps += 1;
        let step = Some(self.core.steps);
        self.core.refuse_if_stopped(step, tool)?;
        // The key identifies the intended effect: derived once, sent unchanged with every attempt.
        let key = if self.keyed(tool, &call) {
            let action_id = call.action_id.clone().unwrap_or_else(|| format!("step-{}", self.core.steps));
            Some(self.core.derive_key(step, tool, &action_id)?)
        } else {
            None
        };
        let (mut state, ticket) = self.core.begin(step, tool, key, call.hints)?;
        // No cancellation token: dropping the future is how this call is cancelled.
        let never = CancellationToken::new();
        let limit = self.core.limit(Some(call_started), &never);
        self.core.pause(&state, WaitReason::Admission, ticket.delay_ms, None, false, &limit).await?;
        let mut check_next = false;
        loop {
            let (outcome, value, reported) = if check_next {
                let found = match self.status_checks.get(tool) {
                    Some(check) => match limit.within(check()).await {
                        Ok(found) => found,
                        Err(cause) => return Err(self.core.stop(&state, cause, Out::Idle { task_alive: false }).into()),
                    },
                    None => StatusCheckResult::Unknown,
                };
                self.core.status_checked(&state, None, found);
                (Outcome::StatusCheck(found), None, Reported::Checked)
            } else {
                state.sent += 1;
                self.core.telemetry.begin_attempt(false);
                let attempt = Attempt { number: state.attempt, idempotency_key: state.key.clone() };
                // The attempt is cut when a deadline passes (as the MCP wrapper cuts its request).
                let answered = match limit.within(self.core.telemetry.in_attempt(attempt_fn(attempt))).await {
                    Ok(answered) => answered,
                    Err(cause) => return Err(self.core.stop(&state, cause, Out::Request).into()),
                };
                match answered {
                    Ok(value) => (Outcome::Success, Some(value), Reported::Sent),
                    Err(error) => match error.to_observation() {
                        Some(observation) => (Outcome::Failure(limits::bounded_observation(&observation).into_owned()), None, Reported::Sent),
                        None => return Err(self.unobserved(&state, error)),
                    },
                }
            };
            let decision = self.core.decide(&mut state, &outcome, reported, "", &limit)?;
            match decision.action {
                Action::Retry(plan) => {
                    check_next = false;
                    self.core.pause(&state, WaitReason::Retry, plan.delay_ms, decision.hint_ms, false, &limit).await?;
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
                    return Err(self.core.policy_failed(step, Some((state.call_id, state.attempt)), tool, state.key.as_deref(), &words, fault).into());
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

    /// The closure's error has no observation: a bug in the caller's code.
    /// The call is abandoned (in flight, as cancelled) and the error handed back.
    fn unobserved<E>(&mut self, state: &CallState, error: E) -> AnyCallError<E> {
        let _ = self.core.instance.abandon_call(&self.core.run, state.call_id, state.attempt, true, AbandonReason::Cancelled);
        let reason = "the attempt failed with an error its mapping does not know: handed back unchanged".to_string();
        self.core.stop_line(state, "unmapped error", reason, true);
        AnyCallError::Unobserved(error)
    }
}

/// The fan-out of a run's events: its hooks, its metrics, its tracer and meter.
#[cfg(feature = "otel")]
fn telemetry_of(options: &WithPolicyOptions) -> Telemetry {
    Telemetry::new(options.hooks.clone(), options.metrics.clone()).with_tracer(options.tracer.clone()).with_meter(options.meter.clone())
}

/// The fan-out of a run's events: its hooks, its metrics.
#[cfg(not(feature = "otel"))]
fn telemetry_of(options: &WithPolicyOptions) -> Telemetry {
    Telemetry::new(options.hooks.clone(), options.metrics.clone())
}
