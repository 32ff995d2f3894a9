//! The event model of docs/events.md: every wrapper (the MCP
//! [`crate::mcp::RetryingToolCaller`] and the any-call helper
//! [`crate::any_call::PolicyRun::with_policy`]) reports what it does as these
//! events, and one fan-out ([`Telemetry`]) makes the `tracing` line, the hooks'
//! calls and the metrics from each, so that they cannot disagree.

use std::collections::HashSet;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};

use crate::component::Outcome;
use crate::component::types::{Decision, Escalation, EscalationReason, FailureKind, StatusCheckResult};
use crate::labels;
use crate::mcp::metrics::Metrics;

/// What every event of a call carries (`run`, `policy`, `step`, `call`,
/// `tool`): `step` is `None` for the pseudo-tools `initialize` and
/// `tools/list`, `call` before the policy gave the call an id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventContext {
    pub run: String,
    /// Which policy decided (the component's identity, or the serving `LivePolicy`'s).
    pub policy: String,
    pub step: Option<u32>,
    pub call: Option<u32>,
    /// The tool, the pseudo-tool `initialize` / `tools/list`, or the name given to the any-call helper.
    pub tool: String,
}

/// `agent_retry.attempt`: a report's verdict was read (one per attempt, one
/// per status check's verdict, one for a call refused before it was sent,
/// attempt 0), or a call stopped waiting (action `stop`).
#[derive(Clone, Debug)]
pub struct AttemptEvent {
    pub context: EventContext,
    pub attempt: u32,
    pub key: Option<String>,
    /// What was observed, in words that do not change (`success`, `http 503`, `not sent`, ...).
    pub outcome: String,
    pub class: Option<String>,
    pub rule: Option<String>,
    /// `retry`, `replan`, `check-status`, `succeed`, `escalate`, `poll`, or `stop`.
    pub action: String,
    pub delay_ms: Option<u64>,
    pub hint_ms: Option<u64>,
    /// The escalation reason's contract name, when the action is `escalate`.
    pub escalation: Option<String>,
    pub reason: String,
    /// The invariant the policy broke, when the run-time guard stopped it.
    pub invariant: Option<String>,
    /// The policy's words for the verdict, where there is one.
    pub decision: Option<Decision>,
    /// Whether this line counts as an attempt, as the run report counts
    /// them: a verdict on an attempt that was sent, or the first send of an
    /// admitted call the run guard refused (not a status check, a task poll,
    /// or a call refused before admission). What the attempts counter counts.
    pub sent: bool,
}

impl AttemptEvent {
    /// A line no verdict answered (a stop, an escalation the wrapper made for
    /// the policy): no class, rule, delays or decision. `counted`: the run
    /// report counts the attempt it names.
    pub(crate) fn unanswered(context: EventContext, attempt: u32, key: Option<String>, outcome: &str, action: &str, reason: String, counted: bool) -> Self {
        AttemptEvent {
            context,
            attempt,
            key,
            outcome: outcome.to_string(),
            class: None,
            rule: None,
            action: action.to_string(),
            delay_ms: None,
            hint_ms: None,
            escalation: None,
            reason,
            invariant: None,
            decision: None,
            sent: counted,
        }
    }
}

/// Why the wrapper waits (`agent_retry.wait`'s `why`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WaitReason {
    /// A retry's backoff.
    Retry,
    /// Before the next poll of a task.
    Poll,
    /// The account budget's wait before the first attempt.
    Admission,
}

impl WaitReason {
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::Retry => "retry",
            WaitReason::Poll => "poll",
            WaitReason::Admission => "admission",
        }
    }
}

impl fmt::Display for WaitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `agent_retry.wait`: before the wrapper sleeps.
#[derive(Clone, Debug)]
pub struct WaitEvent {
    pub context: EventContext,
    /// The attempt the wait comes before (1 for the admission wait).
    pub attempt: u32,
    pub why: WaitReason,
    pub wait_ms: u64,
    pub hint_ms: Option<u64>,
}

/// `agent_retry.replan`: a call ends with a message for the model.
#[derive(Clone, Debug)]
pub struct ReplanEvent {
    pub context: EventContext,
    pub attempt: u32,
    pub rule: Option<String>,
    pub message: String,
    pub decision: Option<Decision>,
}

/// `agent_retry.escalation`: a call ends with an escalation.
#[derive(Clone, Debug)]
pub struct EscalationEvent {
    pub context: EventContext,
    pub attempt: u32,
    pub rule: Option<String>,
    pub escalation: Escalation,
    pub decision: Option<Decision>,
}

impl EscalationEvent {
    pub fn reason(&self) -> EscalationReason {
        self.escalation.reason
    }

    pub fn note(&self) -> &str {
        &self.escalation.note
    }
}

/// `agent_retry.status_check`: a status check answered.
#[derive(Clone, Debug)]
pub struct StatusCheckEvent {
    pub context: EventContext,
    pub attempt: u32,
    /// The tool the check read, when the host knows it.
    pub check_tool: Option<String>,
    pub result: StatusCheckResult,
}

/// `agent_retry.task_poll`: a task's status was read.
#[derive(Clone, Debug)]
pub struct TaskPollEvent {
    pub context: EventContext,
    pub attempt: u32,
    pub task_id: String,
    pub status: String,
}

/// `agent_retry.breaker`: a circuit breaker of the call's server changed state.
#[derive(Clone, Debug)]
pub struct BreakerEvent {
    pub context: EventContext,
    /// The server the breaker guards.
    pub server: String,
    /// `server` for the server's breaker, `tool` for the tool's on it.
    pub scope: &'static str,
    /// The states before and after: `closed`, `open`, `half-open`.
    pub from: &'static str,
    pub to: &'static str,
    /// Until when (the store's clock, ms since the epoch) an open breaker sends
    /// nothing or a half-open one waits for its probe.
    pub until_ms: Option<u64>,
    pub why: String,
}

/// `agent_retry.resume`: a person answered an escalation and the run resumed
/// from its snapshot (contract 0.9.0).
#[derive(Clone, Debug)]
pub struct ResumeEvent {
    pub context: EventContext,
    /// The resumed call's attempt: the one sent for `send`, else its last.
    pub attempt: u32,
    /// The person's answer: `retry`, `done`, `skip`, `abort`.
    pub answer: &'static str,
    /// What the host does now: `send`, `succeed`, `replan`, `escalate`.
    pub action: &'static str,
}

/// What happened to a live update (`agent_retry_policy_updates_total`'s `outcome`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PolicyUpdateOutcome {
    Accepted,
    Refused,
    RolledBack,
}

impl PolicyUpdateOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyUpdateOutcome::Accepted => "accepted",
            PolicyUpdateOutcome::Refused => "refused",
            PolicyUpdateOutcome::RolledBack => "rolled-back",
        }
    }
}

impl fmt::Display for PolicyUpdateOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `agent_retry.policy_update`: a live update was accepted, refused or
/// rolled back (the 0.7 line's fields: `message, identity` or `serving, kind, reason`).
#[derive(Clone, Debug)]
pub struct PolicyUpdateEvent {
    pub outcome: PolicyUpdateOutcome,
    pub message: String,
    /// The policy that serves now (accepted, rolled back).
    pub identity: Option<String>,
    /// The policy that keeps serving (refused).
    pub serving: Option<String>,
    /// Which check refused it (`read`, `integrity`, `load`, `config`, `self-test`, `fleet`, `older`, ...).
    pub kind: Option<String>,
    pub reason: Option<String>,
}

/// One event of docs/events.md.
#[derive(Clone, Debug)]
pub enum Event {
    Attempt(AttemptEvent),
    Wait(WaitEvent),
    Replan(ReplanEvent),
    Escalation(EscalationEvent),
    StatusCheck(StatusCheckEvent),
    TaskPoll(TaskPollEvent),
    Breaker(BreakerEvent),
    Resume(ResumeEvent),
    PolicyUpdate(PolicyUpdateEvent),
}

impl Event {
    /// The `event` field: `agent_retry.attempt`, `agent_retry.wait`, ...
    pub fn name(&self) -> &'static str {
        match self {
            Event::Attempt(_) => "agent_retry.attempt",
            Event::Wait(_) => "agent_retry.wait",
            Event::Replan(_) => "agent_retry.replan",
            Event::Escalation(_) => "agent_retry.escalation",
            Event::StatusCheck(_) => "agent_retry.status_check",
            Event::TaskPoll(_) => "agent_retry.task_poll",
            Event::Breaker(_) => "agent_retry.breaker",
            Event::Resume(_) => "agent_retry.resume",
            Event::PolicyUpdate(_) => "agent_retry.policy_update",
        }
    }

    /// The log line's fields as JSON, without `ts` (a field that does not apply is `null`).
    pub fn to_log(&self) -> Value {
        let mut line = Map::new();
        line.insert("event".into(), json!(self.name()));
        let context = |line: &mut Map<String, Value>, c: &EventContext| {
            line.insert("run".into(), json!(c.run));
            line.insert("policy".into(), json!(c.policy));
            line.insert("step".into(), json!(c.step));
            line.insert("call".into(), json!(c.call));
            line.insert("tool".into(), json!(c.tool));
        };
        let fields: Vec<(&str, Value)> = match self {
            Event::Attempt(e) => {
                context(&mut line, &e.context);
                let mut fields = vec![
                    ("attempt", json!(e.attempt)),
                    ("key", json!(e.key)),
                    ("outcome", json!(e.outcome)),
                    ("class", json!(e.class)),
                    ("rule", json!(e.rule)),
                    ("action", json!(e.action)),
                    ("delay_ms", json!(e.delay_ms)),
                    ("hint_ms", json!(e.hint_ms)),
                    ("escalation", json!(e.escalation)),
                    ("reason", json!(e.reason)),
                ];
                if let Some(invariant) = &e.invariant {
                    fields.push(("invariant", json!(invariant)));
                }
                fields
            }
            Event::Wait(e) => {
                context(&mut line, &e.context);
                vec![("attempt", json!(e.attempt)), ("why", json!(e.why.as_str())), ("wait_ms", json!(e.wait_ms)), ("hint_ms", json!(e.hint_ms))]
            }
            Event::Replan(e) => {
                context(&mut line, &e.context);
                vec![("attempt", json!(e.attempt)), ("rule", json!(e.rule)), ("message", json!(e.message))]
            }
            Event::Escalation(e) => {
                context(&mut line, &e.context);
                vec![
                    ("attempt", json!(e.attempt)),
                    ("rule", json!(e.rule)),
                    ("reason", json!(labels::reason(e.escalation.reason))),
                    ("note", json!(e.escalation.note)),
                ]
            }
            Event::StatusCheck(e) => {
                context(&mut line, &e.context);
                vec![("attempt", json!(e.attempt)), ("check_tool", json!(e.check_tool)), ("result", json!(labels::status_check(e.result)))]
            }
            Event::TaskPoll(e) => {
                context(&mut line, &e.context);
                vec![("attempt", json!(e.attempt)), ("task_id", json!(e.task_id)), ("status", json!(e.status))]
            }
            Event::Breaker(e) => {
                context(&mut line, &e.context);
                vec![
                    ("server", json!(e.server)),
                    ("scope", json!(e.scope)),
                    ("from", json!(e.from)),
                    ("to", json!(e.to)),
                    ("until_ms", json!(e.until_ms)),
                    ("why", json!(e.why)),
                ]
            }
            Event::Resume(e) => {
                context(&mut line, &e.context);
                vec![("attempt", json!(e.attempt)), ("answer", json!(e.answer)), ("action", json!(e.action))]
            }
            Event::PolicyUpdate(e) => {
                let mut fields = vec![("message", json!(e.message))];
                match e.outcome {
                    PolicyUpdateOutcome::Refused => {
                        fields.extend([("serving", json!(e.serving)), ("kind", json!(e.kind)), ("reason", json!(e.reason))]);
                    }
                    _ => fields.push(("identity", json!(e.identity))),
                }
                fields
            }
        };
        for (name, value) in fields {
            line.insert(name.into(), value);
        }
        Value::Object(line)
    }
}

/// Observers of what a wrapper does: each method is told one event before
/// the wrapper acts on it, cannot change the decision, and runs on the
/// caller's task (keep it short). A method that panics is caught and logged
/// once per hook as `agent_retry.hook_failed`; the call goes on as if it were
/// absent. The Python `Hooks(...)`, the Node `hooks: {...}`.
pub trait RetryHooks: Send + Sync {
    /// Before the wrapper sleeps (a retry's backoff, a poll's interval, the account budget's wait).
    fn on_wait(&self, _event: &WaitEvent) {}
    /// An attempt whose verdict is `retry`.
    fn on_retry(&self, _event: &AttemptEvent) {}
    /// A call ends with a message for the model.
    fn on_replan(&self, _event: &ReplanEvent) {}
    /// A call ends with an escalation (its note in `event.escalation.note`).
    fn on_escalate(&self, _event: &EscalationEvent) {}
    /// A status check answered.
    fn on_status_check(&self, _event: &StatusCheckEvent) {}
    /// A live update was accepted, refused or rolled back.
    fn on_policy_update(&self, _event: &PolicyUpdateEvent) {}
    /// Every event, after the typed method above (for a log of one's own, an
    /// exporter, a test's record).
    fn on_event(&self, _event: &Event) {}
}

/// The one fan-out every emitter uses: the `tracing` line, the spans (with
/// the `otel` feature and a tracer), the hooks, then the metrics, from the
/// same event.
#[derive(Clone, Default)]
pub struct Telemetry {
    hooks: Option<Arc<dyn RetryHooks>>,
    metrics: Option<Arc<Metrics>>,
    /// The hooks that panicked already (logged once each).
    failed: Arc<Mutex<HashSet<&'static str>>>,
    #[cfg(feature = "otel")]
    tracer: Option<crate::otel::OtelTracer>,
    #[cfg(feature = "otel")]
    meter: Option<crate::otel::OtelMeter>,
    /// The spans of the call in progress (a wrapper makes one call at a time).
    #[cfg(feature = "otel")]
    spans: Arc<Mutex<Option<crate::otel::CallSpans>>>,
}

impl fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Telemetry").field("hooks", &self.hooks.as_ref().map(|_| "dyn RetryHooks")).field("metrics", &self.metrics.is_some()).finish()
    }
}

impl Telemetry {
    pub fn new(hooks: Option<Arc<dyn RetryHooks>>, metrics: Option<Arc<Metrics>>) -> Self {
        Telemetry { hooks, metrics, ..Default::default() }
    }

    /// This fan-out with spans made by `tracer` (none: no spans).
    #[cfg(feature = "otel")]
    pub fn with_tracer(mut self, tracer: Option<crate::otel::OtelTracer>) -> Self {
        self.tracer = tracer;
        self
    }

    /// This fan-out with its instruments also recorded by `meter` (none: not).
    #[cfg(feature = "otel")]
    pub fn with_meter(mut self, meter: Option<crate::otel::OtelMeter>) -> Self {
        self.meter = meter;
        self
    }

    #[cfg(feature = "otel")]
    fn spans(&self) -> std::sync::MutexGuard<'_, Option<crate::otel::CallSpans>> {
        self.spans.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A call begins: its span starts (a call left open before it, dropped
    /// unfinished, ends as stopped).
    pub fn begin_call(&self, _context: &EventContext) {
        #[cfg(feature = "otel")]
        if let Some(tracer) = &self.tracer {
            let started = crate::otel::CallSpans::start(tracer, &_context.run, &_context.policy, _context.step, &_context.tool);
            if let Some(left) = self.spans().replace(started) {
                left.end("stop", Some("cancelled"));
            }
        }
    }

    /// The call's next attempt is sent: its span starts (`mcp`: a `tools/call` client span).
    pub fn begin_attempt(&self, _mcp: bool) {
        #[cfg(feature = "otel")]
        if let Some(spans) = self.spans().as_mut() {
            spans.attempt(_mcp);
        }
    }

    /// The open attempt span's W3C `traceparent` and `tracestate`, when one is recorded.
    pub fn trace_meta(&self) -> Option<(String, Option<String>)> {
        #[cfg(feature = "otel")]
        if let Some(spans) = self.spans().as_ref() {
            return spans.trace_meta();
        }
        None
    }

    /// `attempt` run with the open attempt span as the current span, so that
    /// what it traces nests under it.
    #[cfg(feature = "otel")]
    pub fn in_attempt<F: std::future::Future>(&self, attempt: F) -> impl std::future::Future<Output = F::Output> + use<F> {
        use opentelemetry::trace::FutureExt;
        let context = self.spans().as_ref().and_then(crate::otel::CallSpans::attempt_context).unwrap_or_else(opentelemetry::Context::current);
        attempt.with_context(context)
    }

    /// `attempt` as it is (no spans without the `otel` feature).
    #[cfg(not(feature = "otel"))]
    pub fn in_attempt<F: std::future::Future>(&self, attempt: F) -> impl std::future::Future<Output = F::Output> + use<F> {
        attempt
    }

    /// A guard that ends the call's span as stopped (`cancelled`) if the call
    /// is dropped before it ends (a no-op once it ended).
    pub fn ending_on_drop(&self) -> CallEndGuard {
        CallEndGuard(self.clone())
    }

    /// The call ends (no-op once its span ended): `action` is `succeed`,
    /// `replan`, `escalate` or `stop`; `error_type` the escalation reason or why it stopped.
    pub fn end_call(&self, _action: &str, _error_type: Option<&str>) {
        #[cfg(feature = "otel")]
        if let Some(spans) = self.spans().take() {
            spans.end(_action, _error_type);
        }
    }

    #[cfg(feature = "otel")]
    fn record_span(&self, event: &Event) {
        if let Some(spans) = self.spans().as_mut() {
            spans.record(event);
        }
        match event {
            Event::Replan(_) => self.end_call("replan", None),
            Event::Escalation(e) => self.end_call("escalate", Some(labels::reason(e.escalation.reason))),
            _ => {}
        }
    }

    pub fn metrics(&self) -> Option<&Arc<Metrics>> {
        self.metrics.as_ref()
    }

    /// Logs the event, records it in the call's spans, tells the hooks, counts it.
    pub fn emit(&self, event: Event) {
        trace_line(&event);
        #[cfg(feature = "otel")]
        self.record_span(&event);
        if let Some(hooks) = &self.hooks {
            let hooks = hooks.as_ref();
            match &event {
                Event::Attempt(e) if e.action == "retry" => self.guarded("on_retry", || hooks.on_retry(e)),
                Event::Wait(e) => self.guarded("on_wait", || hooks.on_wait(e)),
                Event::Replan(e) => self.guarded("on_replan", || hooks.on_replan(e)),
                Event::Escalation(e) => self.guarded("on_escalate", || hooks.on_escalate(e)),
                Event::StatusCheck(e) => self.guarded("on_status_check", || hooks.on_status_check(e)),
                Event::PolicyUpdate(e) => self.guarded("on_policy_update", || hooks.on_policy_update(e)),
                _ => {}
            }
            self.guarded("on_event", || hooks.on_event(&event));
        }
        if let Some(metrics) = &self.metrics {
            metrics.count(&event);
        }
        #[cfg(feature = "otel")]
        if let Some(meter) = &self.meter {
            meter.record(&event);
        }
    }

    /// Runs one hook; a panic is caught (the call goes on) and logged the first time.
    fn guarded(&self, hook: &'static str, call: impl FnOnce()) {
        let Err(panic) = catch_unwind(AssertUnwindSafe(call)) else { return };
        let first = self.failed.lock().unwrap_or_else(|p| p.into_inner()).insert(hook);
        if first {
            let error =
                panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_else(|| "a panic".into());
            let ts = unix_seconds();
            tracing::warn!(target: "agent_retry", event = "agent_retry.hook_failed", ts, hook, error = %error, "a hook panicked; the call goes on without it");
        }
    }
}

/// Ends its call's span as stopped (`cancelled`) when dropped: a call whose
/// future is dropped mid-way leaves no span open behind it.
pub struct CallEndGuard(Telemetry);

impl Drop for CallEndGuard {
    fn drop(&mut self) {
        self.0.end_call("stop", Some("cancelled"));
    }
}

/// The event's `tracing` line at INFO on the `agent_retry` target (quiet
/// unless a subscriber listens); fields that do not apply are left out. The
/// attempt line keeps the 0.7 fields and order.
fn trace_line(event: &Event) {
    if !tracing::enabled!(target: "agent_retry", tracing::Level::INFO) {
        return;
    }
    let ts = unix_seconds();
    match event {
        Event::Attempt(e) => {
            let c = &e.context;
            tracing::info!(
                target: "agent_retry",
                event = "agent_retry.attempt",
                ts,
                run = %c.run,
                policy = %c.policy,
                step = c.step,
                call = c.call,
                tool = %c.tool,
                attempt = e.attempt,
                key = e.key.as_deref(),
                outcome = %e.outcome,
                class = e.class.as_deref(),
                rule = e.rule.as_deref(),
                action = %e.action,
                delay_ms = e.delay_ms,
                hint_ms = e.hint_ms,
                escalation = e.escalation.as_deref(),
                reason = %e.reason,
                invariant = e.invariant.as_deref(),
                "attempt"
            );
        }
        Event::Wait(e) => {
            let c = &e.context;
            tracing::info!(target: "agent_retry", event = "agent_retry.wait", ts, run = %c.run, policy = %c.policy, step = c.step, call = c.call, tool = %c.tool,
                attempt = e.attempt, why = e.why.as_str(), wait_ms = e.wait_ms, hint_ms = e.hint_ms, "wait");
        }
        Event::Replan(e) => {
            let c = &e.context;
            tracing::info!(target: "agent_retry", event = "agent_retry.replan", ts, run = %c.run, policy = %c.policy, step = c.step, call = c.call, tool = %c.tool,
                attempt = e.attempt, rule = e.rule.as_deref(), message = %e.message, "replan");
        }
        Event::Escalation(e) => {
            let c = &e.context;
            tracing::info!(target: "agent_retry", event = "agent_retry.escalation", ts, run = %c.run, policy = %c.policy, step = c.step, call = c.call, tool = %c.tool,
                attempt = e.attempt, rule = e.rule.as_deref(), reason = labels::reason(e.escalation.reason), note = %e.escalation.note, "escalation");
        }
        Event::StatusCheck(e) => {
            let c = &e.context;
            tracing::info!(target: "agent_retry", event = "agent_retry.status_check", ts, run = %c.run, policy = %c.policy, step = c.step, call = c.call, tool = %c.tool,
                attempt = e.attempt, check_tool = e.check_tool.as_deref(), result = labels::status_check(e.result), "status check");
        }
        Event::TaskPoll(e) => {
            let c = &e.context;
            tracing::info!(target: "agent_retry", event = "agent_retry.task_poll", ts, run = %c.run, policy = %c.policy, step = c.step, call = c.call, tool = %c.tool,
                attempt = e.attempt, task_id = %e.task_id, status = %e.status, "task poll");
        }
        Event::Breaker(e) => {
            let c = &e.context;
            tracing::info!(target: "agent_retry", event = "agent_retry.breaker", ts, run = %c.run, policy = %c.policy, step = c.step, call = c.call, tool = %c.tool,
                server = %e.server, scope = e.scope, from = e.from, to = e.to, until_ms = e.until_ms, why = %e.why, "circuit breaker");
        }
        Event::Resume(e) => {
            let c = &e.context;
            tracing::info!(target: "agent_retry", event = "agent_retry.resume", ts, run = %c.run, policy = %c.policy, step = c.step, call = c.call, tool = %c.tool,
                attempt = e.attempt, answer = e.answer, action = e.action, "resume");
        }
        // The 0.7 lines, unchanged: an accepted update or a rollback at INFO, a refusal at WARN.
        Event::PolicyUpdate(e) => match e.outcome {
            PolicyUpdateOutcome::Refused => tracing::warn!(target: "agent_retry", event = "agent_retry.policy_update", ts, serving = e.serving.as_deref(),
                kind = e.kind.as_deref(), reason = e.reason.as_deref(), "{}", e.message),
            _ => tracing::info!(target: "agent_retry", event = "agent_retry.policy_update", ts, policy = e.identity.as_deref(), "{}", e.message),
        },
    }
}

/// The event's `ts` (docs/events.md): Unix seconds, 3 decimals, of the wall
/// clock (`tracing`'s own `timestamp` may stay beside it).
pub fn unix_seconds() -> f64 {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    ms as f64 / 1000.0
}

/// An outcome in the words of docs/events.md (`success`, `empty result`,
/// `http 503`, `transport timeout`, `json-rpc -32603`, `tool error`, `status
/// check found`, `task working`, `poll failed: http 503`, ...): what the
/// any-call helper logs.
pub fn outcome_words(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Success => "success".into(),
        Outcome::EmptyResult(_) => "empty result".into(),
        Outcome::Failure(observation) => failure_words(observation.kind),
        Outcome::StatusCheck(result) => format!("status check {}", labels::status_check(*result)),
        Outcome::Task(task) => format!("task {}", labels::task_status(task.status)),
        Outcome::PollFailure(observation) => format!("poll failed: {}", failure_words(observation.kind)),
    }
}

fn failure_words(kind: FailureKind) -> String {
    match kind {
        FailureKind::HttpStatus(status) => format!("http {status}"),
        FailureKind::Transport(error) => format!("transport {}", labels::transport(error)),
        FailureKind::ProtocolError(code) => format!("json-rpc {code}"),
        FailureKind::ToolError(_) => "tool error".into(),
        FailureKind::InputRequired => "input required".into(),
    }
}
