//! The wrapper around an MCP client: every tool call goes through the policy.
//!
//! For each call it derives the idempotency key once, asks `begin-call`, makes
//! the call, reports what happened (`record-success`, `record-empty-result`,
//! `record-failure` of the raw observation, `record-status-check`), and does
//! what the verdict says: sleep and retry with the same key (on a new session
//! first when it says `reconnect`), run the status check, hand the model a
//! short message, or stop with the escalation note. The wrapper never decides
//! what a failure means. The model sees only the final answer. Every attempt
//! is one JSON log line.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crate::fault::PolicyFault;
use futures::future::BoxFuture;
use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, CallToolResult, Tool};
use rmcp::service::{Peer, ServiceError};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::answer::{CallError, StopCause, Stopped, ToolAnswer};
use super::clock::Clock;
use super::connect::McpConnection;
use super::limit::Limit;
use super::metrics::Metrics;
use super::observe;
use crate::component::types::{
    Action, ActionKind, CallStart, Decision, Delivery, Effect, EffectStatus, Escalation, EscalationReason, FailureKind, PollPlan, RetryPlan, RunError, RunReport,
    StatusCheckResult, ToolHints, TransportError, Verdict,
};
use crate::component::{Admission, Outcome, PolicyHandle, PolicyInstance, RunHandle};
use crate::labels;

/// Reads state to learn whether an ambiguous write was applied: given the
/// client and the call's arguments, answers found / absent / unknown.
pub type StatusCheck = Box<dyn Fn(Peer<RoleClient>, Map<String, Value>) -> BoxFuture<'static, StatusCheckResult> + Send + Sync>;

/// Called with every verdict the wrapper acts on, before it acts: the tool (or
/// the pseudo-tool `initialize` / `tools/list`), the attempt the report named,
/// and the verdict (its rule is `PolicyInstance::rule_name`). The Python
/// wrapper's `on_verdict(tool, attempt, verdict)`, the Node one's `onVerdict`.
pub type OnVerdict = Arc<dyn Fn(&str, u32, &Verdict) + Send + Sync>;

/// How the wrapper behaves: the same options and defaults as the Python
/// (`attempt_timeout_s`, `key_argument`) and Node (`attemptTimeoutMs`,
/// `keyArgument`) wrappers.
#[derive(Clone)]
pub struct RetryingToolCallerOptions {
    /// Give up waiting for one attempt after this long (policy time, ms; default 30,000).
    pub attempt_timeout_ms: u64,
    /// The argument an idempotency key goes in, for tools whose input schema has it.
    pub key_argument: String,
    pub clock: Clock,
    /// Which policy decides, for the `policy` field of every log line: by
    /// default the component's identity; a host on a [`crate::LivePolicy`]
    /// passes the serving policy's (`loaded.identity.to_string()`).
    pub policy_identity: Option<String>,
    /// A call stops after this long, its retries and waits included (policy
    /// time, ms; default none): [`CallError::TimedOut`].
    pub call_timeout_ms: Option<u64>,
    /// The run's deadline: every call stops once the caller is this old
    /// (policy time, ms; default none). With it (or `call_timeout_ms`), every
    /// report passes the policy `time-left-ms`, the time to the nearer
    /// deadline, so that it never plans a wait past it.
    pub run_timeout_ms: Option<u64>,
    /// Told every verdict the wrapper acts on (for tests and metrics; default
    /// none): see [`OnVerdict`] and [`RetryingToolCallerOptions::on_verdict`].
    /// It runs inside the call and must not panic.
    pub on_verdict: Option<OnVerdict>,
}

impl RetryingToolCallerOptions {
    /// These options with `hook` told every verdict the wrapper acts on.
    pub fn on_verdict(mut self, hook: impl Fn(&str, u32, &Verdict) + Send + Sync + 'static) -> Self {
        self.on_verdict = Some(Arc::new(hook));
        self
    }
}

impl fmt::Debug for RetryingToolCallerOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryingToolCallerOptions")
            .field("attempt_timeout_ms", &self.attempt_timeout_ms)
            .field("key_argument", &self.key_argument)
            .field("clock", &self.clock)
            .field("policy_identity", &self.policy_identity)
            .field("call_timeout_ms", &self.call_timeout_ms)
            .field("run_timeout_ms", &self.run_timeout_ms)
            .field("on_verdict", &self.on_verdict.as_ref().map(|_| "Fn(tool, attempt, verdict)"))
            .finish()
    }
}

impl Default for RetryingToolCallerOptions {
    fn default() -> Self {
        RetryingToolCallerOptions {
            attempt_timeout_ms: 30_000,
            key_argument: "idempotency_key".into(),
            clock: Clock::real(),
            policy_identity: None,
            call_timeout_ms: None,
            run_timeout_ms: None,
            on_verdict: None,
        }
    }
}

/// Appended to the logged reason of a decision on a failure whose HTTP status
/// and headers were not captured (the same text in every host).
const CAPTURE_MISSING: &str = " [no HTTP status or headers: the transport is not the wrapper's capturing one]";

/// The pseudo-tools connecting goes through, as calls of the policy.
const INITIALIZE: &str = "initialize";
const TOOLS_LIST: &str = "tools/list";

/// Where the session comes from: a connection the wrapper owns (and can set
/// up again), or a bare peer the caller built (which it cannot).
enum Session {
    Owned(Box<McpConnection>),
    Bare(Peer<RoleClient>),
}

/// What one attempt came to.
struct Attempted {
    outcome: Outcome,
    result: Option<CallToolResult>,
    /// The failure came from an HTTP transport that is not the capturing one.
    uncaptured: bool,
}

/// One log line: event, run, policy, step, call, tool, attempt, key, outcome,
/// class, rule, action, delay_ms, hint_ms, escalation, reason (hosts/README.md).
struct AttemptLine<'a> {
    step: Option<u32>,
    call: Option<u32>,
    tool: &'a str,
    attempt: u32,
    key: Option<&'a str>,
    outcome: &'a str,
    class: Option<&'a str>,
    rule: Option<&'a str>,
    action: &'a str,
    delay_ms: Option<u64>,
    hint_ms: Option<u64>,
    escalation: Option<&'a str>,
    reason: &'a str,
}

/// What the wrapper knows of a tool from `tools/list`.
#[derive(Clone, Debug, Default)]
struct ToolInfo {
    hints: Option<ToolHints>,
    takes_key: bool,
}

fn tool_info(tool: &Tool, key_argument: &str) -> ToolInfo {
    let hints = tool.annotations.as_ref().map(|a| ToolHints { read_only: a.read_only_hint, destructive: a.destructive_hint, idempotent: a.idempotent_hint });
    let takes_key = tool.input_schema.get("properties").and_then(Value::as_object).is_some_and(|p| p.contains_key(key_argument));
    ToolInfo { hints, takes_key }
}

/// One agent run's tool calls, through the policy.
pub struct RetryingToolCaller {
    session: Session,
    instance: PolicyInstance,
    policy: PolicyHandle,
    run: RunHandle,
    run_id: String,
    tools: HashMap<String, ToolInfo>,
    status_checks: HashMap<String, StatusCheck>,
    options: RetryingToolCallerOptions,
    metrics: Arc<Metrics>,
    steps: u32,
    previous_call: Option<(String, Map<String, Value>)>,
    /// Policy time the caller was built: `run_timeout_ms` counts from here.
    started_ms: u64,
    capture_warned: bool,
}

fn policy_error(e: PolicyFault) -> CallError {
    CallError::Policy(e)
}

/// A short label of an outcome for the log: `503`, `timeout`, `json-rpc -32602`, `ok`.
fn outcome_label(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Success => "ok".into(),
        Outcome::EmptyResult(_) => "empty".into(),
        Outcome::StatusCheck(r) => format!("status-check {}", labels::status_check(*r)),
        Outcome::Failure(f) => match f.kind {
            FailureKind::HttpStatus(s) => s.to_string(),
            FailureKind::Transport(e) => labels::transport(e).to_string(),
            FailureKind::ProtocolError(c) => format!("json-rpc {c}"),
            FailureKind::ToolError(Some(s)) => format!("is-error {s}"),
            FailureKind::ToolError(None) => "is-error".into(),
            FailureKind::InputRequired => "input-required".into(),
        },
        Outcome::Task(task) => format!("task {}", task.task_id),
        Outcome::PollFailure(_) => "poll-failed".into(),
    }
}

fn action_label(action: &Action) -> &'static str {
    match action {
        Action::Retry(_) => "retry",
        Action::Replan(_) => "replan",
        Action::CheckStatus => "check-status",
        Action::Succeed(_) => "succeed",
        Action::Escalate(_) => "escalate",
        Action::Poll(_) => "poll",
    }
}

impl RetryingToolCaller {
    /// Starts a run on a bare peer the caller connected: loads the configuration
    /// into a fresh policy and lists the server's tools (through the policy, as
    /// the `tools/list` call). A lost session cannot be set up again on a bare
    /// peer ([`CallError::SessionLost`]); [`RetryingToolCaller::connect`] can.
    pub async fn start(
        peer: Peer<RoleClient>,
        instance: PolicyInstance,
        config_json: &str,
        run_id: &str,
        options: RetryingToolCallerOptions,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        Self::begin(Session::Bare(peer), instance, config_json, run_id, options, metrics).await
    }

    /// Starts a run on a connection the wrapper owns: connects (the
    /// `initialize` call of the policy) and lists the tools (`tools/list`), each
    /// retried under the policy's rules; later, a lost session is set up again
    /// the same way. A failure is a [`CallError`] inside the `anyhow::Error`,
    /// or a [`super::ConnectionConfigError`] (a URL this build cannot serve), found
    /// before the policy or the server is asked anything.
    pub async fn connect(
        connection: McpConnection,
        instance: PolicyInstance,
        config_json: &str,
        run_id: &str,
        options: RetryingToolCallerOptions,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        if let Some(refused) = connection.configuration_error() {
            return Err(refused.clone().into());
        }
        Self::begin(Session::Owned(Box::new(connection)), instance, config_json, run_id, options, metrics).await
    }

    async fn begin(
        session: Session,
        mut instance: PolicyInstance,
        config_json: &str,
        run_id: &str,
        options: RetryingToolCallerOptions,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let policy = instance.load_policy(config_json)?.map_err(|e| anyhow::anyhow!("policy configuration: {}: {}", e.field, e.message))?;
        let run = instance.start_run(&policy, run_id)?.map_err(|e| anyhow::anyhow!("run id: {e:?}"))?;
        let started_ms = options.clock.now_ms();
        // A refused `server/discover` probe is read by this policy's rule.
        if let Session::Owned(connection) = &session {
            connection.set_probe_reader(super::http_client::probe_reader_of(&instance));
        }
        let mut caller = RetryingToolCaller {
            session,
            instance,
            policy,
            run,
            run_id: run_id.to_string(),
            tools: HashMap::new(),
            status_checks: HashMap::new(),
            options,
            metrics,
            steps: 0,
            previous_call: None,
            started_ms,
            capture_warned: false,
        };
        let cancel = CancellationToken::new();
        let limit = caller.limit(None, &cancel);
        caller.ensure_session(&limit).await?;
        caller.list_tools(&limit).await?;
        Ok(caller)
    }

    /// Registers how to check whether a write to `tool` was applied.
    pub fn with_status_check(mut self, tool: &str, check: StatusCheck) -> Self {
        self.status_checks.insert(tool.to_string(), check);
        self
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// What happened in the run so far.
    pub fn report(&mut self) -> Result<RunReport, CallError> {
        self.instance.report(&self.run).map_err(policy_error)
    }

    /// Ends the run and frees it in the component (and closes a connection
    /// the wrapper owns, stopping a server process it started).
    pub async fn finish(mut self) -> Result<RunReport, CallError> {
        let report = self.report()?;
        self.instance.drop_run(self.run).map_err(policy_error)?;
        self.instance.drop_policy(self.policy).map_err(policy_error)?;
        if let Session::Owned(connection) = self.session {
            connection.close().await;
        }
        Ok(report)
    }

    /// The nearer of the run's limit and (from `call_started_ms`) the call's.
    fn limit<'a>(&self, call_started_ms: Option<u64>, cancel: &'a CancellationToken) -> Limit<'a> {
        let run = self.options.run_timeout_ms.map(|t| (self.started_ms.saturating_add(t), StopCause::RunTimeout));
        let call = call_started_ms.zip(self.options.call_timeout_ms).map(|(start, t)| (start.saturating_add(t), StopCause::CallTimeout));
        let deadline_ms = match (run, call) {
            (Some(r), Some(c)) => Some(if c.0 <= r.0 { c } else { r }),
            (r, c) => r.or(c),
        };
        Limit { deadline_ms, cancel, clock: self.options.clock }
    }

    /// Whether the last request carried `Mcp-Session-Id` (not known for a bare
    /// peer: false).
    fn session_id_sent(&self) -> bool {
        match &self.session {
            Session::Owned(connection) => connection.session_id_sent(),
            Session::Bare(_) => false,
        }
    }

    /// Does what a retry's `reconnect` says: the next attempt goes on a new
    /// session. A bare peer cannot be connected again.
    fn reconnect_before_retry(&mut self, what: &str) -> Result<(), CallError> {
        match &mut self.session {
            Session::Owned(connection) => {
                connection.mark_lost();
                Ok(())
            }
            Session::Bare(_) => Err(CallError::SessionLost(format!(
                "the policy asks for a new session before retrying {what}, and a bare peer cannot be connected again (use McpConnection)"
            ))),
        }
    }

    /// The session's peer: `None` when an owned connection has none (or lost it).
    fn peer(&self) -> Option<Peer<RoleClient>> {
        match &self.session {
            Session::Owned(connection) => connection.peer(),
            Session::Bare(peer) => Some(peer.clone()),
        }
    }

    /// Sets the session up (again) when it is lost, as the policy's
    /// `initialize` call. A bare peer's lost session is [`CallError::SessionLost`].
    fn ensure_session<'a>(&'a mut self, limit: &'a Limit<'a>) -> BoxFuture<'a, Result<(), CallError>> {
        Box::pin(async move {
            match &self.session {
                Session::Owned(connection) if connection.needs_connect() => self.pseudo_call(INITIALIZE, limit).await,
                Session::Owned(_) => Ok(()),
                Session::Bare(peer) if peer.is_transport_closed() => {
                    Err(CallError::SessionLost("the session's transport closed, and a bare peer cannot be connected again (use McpConnection)".into()))
                }
                Session::Bare(_) => Ok(()),
            }
        })
    }

    /// Lists the server's tools (their annotations and whether they take a
    /// key), as the policy's `tools/list` call.
    async fn list_tools(&mut self, limit: &Limit<'_>) -> Result<(), CallError> {
        self.pseudo_call(TOOLS_LIST, limit).await
    }

    /// One attempt of a pseudo-call: connecting, or listing the tools.
    async fn pseudo_attempt(&mut self, what: &str, limit: &Limit<'_>) -> Result<Attempted, StopCause> {
        let timeout = self.options.clock.real_duration(self.options.attempt_timeout_ms);
        if what == INITIALIZE {
            let Session::Owned(connection) = &mut self.session else {
                return Ok(Attempted { outcome: Outcome::Success, result: None, uncaptured: false });
            };
            // The note of an escalation quotes the last failure: say what it was for.
            let what_failed = if connection.was_connected() {
                "could not reach the MCP server again after the session was lost"
            } else {
                "could not connect to the MCP server"
            };
            let connecting = tokio::time::timeout(timeout, connection.connect());
            let outcome = match limit.within(connecting).await? {
                Err(_elapsed) => with_context(observe::timeout(false), what_failed),
                Ok(Ok(())) => Outcome::Success,
                Ok(Err(outcome)) => with_context(outcome, what_failed),
            };
            return Ok(Attempted { outcome, result: None, uncaptured: false });
        }
        let Some(peer) = self.peer() else {
            return Ok(Attempted { outcome: lost_before_send(), result: None, uncaptured: false });
        };
        let listed = limit.within(tokio::time::timeout(timeout, peer.list_all_tools())).await?;
        let key_argument = self.options.key_argument.clone();
        let (outcome, uncaptured) = match listed {
            Err(_elapsed) => (observe::timeout(self.session_id_sent()), false),
            Ok(Ok(tools)) => {
                self.tools = tools.iter().map(|tool| (tool.name.to_string(), tool_info(tool, &key_argument))).collect();
                (Outcome::Success, false)
            }
            Ok(Err(error)) => (self.observe_failure(&error), observe::is_uncaptured(&error) && matches!(self.session, Session::Bare(_))),
        };
        Ok(Attempted { outcome, result: None, uncaptured })
    }

    /// Connecting or listing the tools as a call of the policy: the pseudo-tool
    /// `initialize` or `tools/list` (read-only, idempotent, no key), its
    /// failures retried as the policy decides; each is a step of the run.
    async fn pseudo_call(&mut self, what: &str, limit: &Limit<'_>) -> Result<(), CallError> {
        let hints = ToolHints { read_only: Some(true), destructive: Some(false), idempotent: Some(true) };
        let now = self.options.clock.now_ms();
        let begun = self.begin_call(what, None, Some(hints), now).map_err(|fault| self.policy_failed(None, what, None, "not sent", fault))?;
        let ticket = match begun.map_err(CallError::Run)? {
            Admission::Send(ticket) => ticket,
            Admission::Escalate(escalation) => return Err(self.escalated_before_send(None, what, None, escalation)),
        };
        let mut sent = 0;
        let stopped = |caller: &mut Self, cause, sent, in_flight| Err(caller.stopped(cause, what, Some(&ticket), sent, in_flight, None));
        if let Err(cause) = limit.pause(ticket.delay_ms).await {
            return stopped(self, cause, sent, false);
        }
        let mut attempt = 1;
        loop {
            if what == TOOLS_LIST {
                self.ensure_session(limit).await?;
            }
            sent += 1;
            let attempted = match self.pseudo_attempt(what, limit).await {
                Ok(attempted) => attempted,
                Err(cause) => return stopped(self, cause, sent, true),
            };
            let decision = self
                .record(what, ticket.call_id, attempt, None, &attempted.outcome, limit)
                .map_err(|fault| self.policy_failed(None, what, None, &outcome_label(&attempted.outcome), fault))?
                .map_err(CallError::Run)?;
            self.log(None, ticket.call_id, what, None, &attempted.outcome, &decision, attempted.uncaptured);
            match decision.action {
                Action::Succeed(_) => return Ok(()),
                Action::Retry(plan) => {
                    attempt = plan.attempt;
                    // Connecting again is what an `initialize` retry does anyway.
                    if plan.reconnect && what == TOOLS_LIST {
                        self.reconnect_before_retry(what)?;
                    }
                    if let Err(cause) = limit.pause(plan.delay_ms).await {
                        return stopped(self, cause, sent, false);
                    }
                }
                Action::Escalate(escalation) => return Err(CallError::Escalated(escalation)),
                Action::Replan(message) => return Err(CallError::SessionLost(format!("{what}: {message}"))),
                // A read is not status-checked; were it asked, nothing is known.
                Action::CheckStatus => {
                    let outcome = Outcome::StatusCheck(StatusCheckResult::Unknown);
                    let decision = self
                        .record(what, ticket.call_id, attempt, None, &outcome, limit)
                        .map_err(|fault| self.policy_failed(None, what, None, &outcome_label(&outcome), fault))?
                        .map_err(CallError::Run)?;
                    self.log(None, ticket.call_id, what, None, &outcome, &decision, false);
                    if let Action::Escalate(escalation) = decision.action {
                        return Err(CallError::Escalated(escalation));
                    }
                    return Err(CallError::SessionLost(format!("{what}: {}", decision.reason)));
                }
                // Only a task's report is answered with a poll, and a pseudo-call has none.
                Action::Poll(_) => {
                    let fault = PolicyFault::BoundaryViolation { cause: format!("a poll answered {what}, which has no task") };
                    return Err(self.policy_failed(None, what, None, &outcome_label(&attempted.outcome), fault));
                }
            }
        }
    }

    /// Observes a failed request as it came. When the session's transport
    /// itself is gone (a dead pipe), an owned connection needs a new one before
    /// the next request whatever the policy decides: that is I/O, not a reading
    /// of the failure.
    fn observe_failure(&mut self, error: &ServiceError) -> Outcome {
        let session_id_sent = self.session_id_sent();
        if observe::transport_is_gone(error)
            && let Session::Owned(connection) = &mut self.session
        {
            connection.mark_lost();
        }
        observe::from_error(error, session_id_sent)
    }

    /// One attempt of a tool call, within the limit.
    async fn attempt(&mut self, tool: &str, arguments: &Map<String, Value>, limit: &Limit<'_>) -> Result<Attempted, StopCause> {
        let Some(peer) = self.peer() else {
            return Ok(Attempted { outcome: lost_before_send(), result: None, uncaptured: false });
        };
        if peer.is_transport_closed() {
            // Nothing can be written to a closed pipe: the request never left.
            if let Session::Owned(connection) = &mut self.session {
                connection.mark_lost();
            }
            return Ok(Attempted { outcome: lost_before_send(), result: None, uncaptured: false });
        }
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments.clone());
        let timeout = self.options.clock.real_duration(self.options.attempt_timeout_ms);
        let answered = limit.within(tokio::time::timeout(timeout, peer.call_tool(params))).await?;
        let session_id_sent = self.session_id_sent();
        Ok(match answered {
            Err(_elapsed) => Attempted { outcome: observe::timeout(session_id_sent), result: None, uncaptured: false },
            Ok(Ok(result)) => Attempted { outcome: observe::from_result(&result, session_id_sent), result: Some(result), uncaptured: false },
            Ok(Err(error)) => {
                let uncaptured = observe::is_uncaptured(&error) && matches!(self.session, Session::Bare(_));
                Attempted { outcome: self.observe_failure(&error), result: None, uncaptured }
            }
        })
    }

    /// Writes one attempt line, with the fields (and order) of the Python and
    /// Node wrappers' lines; a value that does not apply is left out.
    fn log_line(&self, line: AttemptLine) {
        let policy = self.options.policy_identity.as_deref().unwrap_or(self.instance.policy_identity());
        tracing::info!(
            target: "agent_retry",
            event = "agent_retry.attempt",
            run = %self.run_id,
            policy,
            step = line.step,
            call = line.call,
            tool = line.tool,
            attempt = line.attempt,
            key = line.key,
            outcome = line.outcome,
            class = line.class,
            rule = line.rule,
            action = line.action,
            delay_ms = line.delay_ms,
            hint_ms = line.hint_ms,
            escalation = line.escalation,
            reason = line.reason,
            "attempt"
        );
    }

    /// The attempt line of a decision (see [`AttemptLine`]); `step` is `None`
    /// for the pseudo-calls `initialize` and `tools/list`.
    #[allow(clippy::too_many_arguments)]
    fn log(&mut self, step: Option<u32>, call_id: u32, tool: &str, key: Option<&str>, outcome: &Outcome, decision: &Decision, uncaptured: bool) {
        let delay_ms = match &decision.action {
            Action::Retry(plan) => Some(plan.delay_ms),
            _ => None,
        };
        let escalation = match &decision.action {
            Action::Escalate(e) => Some(labels::reason(e.reason)),
            _ => None,
        };
        if uncaptured && !self.capture_warned {
            self.capture_warned = true;
            tracing::warn!(
                target: "agent_retry",
                event = "agent_retry.capture_missing",
                run = %self.run_id,
                "a failure came from an HTTP transport that is not the wrapper's capturing one: statuses and headers (Retry-After) are not seen; connect with McpConnection::http"
            );
        }
        let reason = if uncaptured { format!("{}{CAPTURE_MISSING}", decision.reason) } else { decision.reason.clone() };
        self.log_line(AttemptLine {
            step,
            call: Some(call_id),
            tool,
            attempt: decision.attempt,
            key,
            outcome: &outcome_label(outcome),
            class: Some(labels::class(decision.class)),
            rule: Some(&decision.rule),
            action: action_label(&decision.action),
            delay_ms,
            hint_ms: decision.hint_ms,
            escalation,
            reason: &reason,
        });
        let status = outcome_label(outcome);
        // The metrics count tool calls: connecting and listing count only when they escalate.
        let attempted = step.is_some() && !matches!(outcome, Outcome::StatusCheck(_));
        let tool_call = step.is_some();
        self.metrics.update(|c| {
            if attempted {
                c.attempts += 1;
                *c.by_status.entry(status).or_default() += 1;
            }
            if tool_call {
                *c.by_action.entry(action_label(&decision.action).to_string()).or_default() += 1;
            }
            if let Some(delay) = delay_ms.filter(|_| tool_call) {
                c.retries += 1;
                c.waited_ms += delay;
            }
            if let Action::Escalate(e) = &decision.action {
                *c.escalations_by_reason.entry(labels::reason(e.reason).to_string()).or_default() += 1;
                if e.reason == EscalationReason::RunStepsSpent {
                    c.runs_ended_by_step_budget += 1;
                }
            }
        });
    }

    /// The line of a call the policy escalated before it was sent: attempt 0,
    /// outcome "not sent" (as the Python and Node wrappers log it).
    fn escalated_before_send(&self, step: Option<u32>, tool: &str, key: Option<&str>, escalation: Escalation) -> CallError {
        self.escalated_without_decision(step, tool, key, "not sent", escalation)
    }

    /// The `escalate` line (attempt 0) and the count of an escalation no
    /// decision answered: a call not admitted, or the policy failing.
    fn escalated_without_decision(&self, step: Option<u32>, tool: &str, key: Option<&str>, outcome: &str, escalation: Escalation) -> CallError {
        self.log_line(AttemptLine {
            step,
            call: None,
            tool,
            attempt: 0,
            key,
            outcome,
            class: None,
            rule: None,
            action: "escalate",
            delay_ms: None,
            hint_ms: None,
            escalation: Some(labels::reason(escalation.reason)),
            reason: &escalation.note,
        });
        self.metrics.update(|c| {
            *c.escalations_by_reason.entry(labels::reason(escalation.reason).to_string()).or_default() += 1;
            if escalation.reason == EscalationReason::RunStepsSpent {
                c.runs_ended_by_step_budget += 1;
            }
        });
        CallError::Escalated(escalation)
    }

    /// Asks to begin a call; the hand-off of a call that is not admitted is
    /// read from the run.
    fn begin_call(&mut self, tool: &str, key: Option<&str>, hints: Option<ToolHints>, now: u64) -> Result<Result<Admission, RunError>, PolicyFault> {
        self.instance.begin(&self.run, tool, key, hints, now)
    }

    /// Reports an attempt's outcome (or a status check's) with the time left
    /// to the nearer deadline, if there is one. The decision's words (its
    /// reason, a message, a note) cross the boundary only when they are
    /// needed: when the action carries text, or when the attempt line will be
    /// written.
    fn record(
        &mut self,
        tool: &str,
        call_id: u32,
        attempt: u32,
        key: Option<&str>,
        outcome: &Outcome,
        limit: &Limit<'_>,
    ) -> Result<Result<Decision, RunError>, PolicyFault> {
        let now = self.options.clock.now_ms();
        let time_left_ms = limit.deadline_ms.map(|(deadline, _)| deadline.saturating_sub(now));
        let verdict = match self.instance.record(&self.run, call_id, attempt, outcome, time_left_ms, now, None)? {
            Ok(verdict) => verdict,
            Err(error) => return Ok(Err(error)),
        };
        if let Some(hook) = &self.options.on_verdict {
            hook(tool, attempt, &verdict);
        }
        // A replan or an escalation always carries text: its words are read
        // whatever `has-note` says, so a component that says otherwise cannot
        // leave the wrapper without them.
        let carries_text = verdict.has_note || matches!(verdict.action, ActionKind::Replan | ActionKind::Escalate);
        if carries_text || tracing::enabled!(target: "agent_retry", tracing::Level::INFO) {
            return match self.instance.last_decision(&self.run, call_id)? {
                Some(decision) => Ok(Ok(decision)),
                None => Err(PolicyFault::BoundaryViolation { cause: format!("last-decision has no decision for call {call_id} right after its verdict") }),
            };
        }
        let action = match verdict.action {
            ActionKind::Retry => Action::Retry(RetryPlan {
                delay_ms: verdict.delay_ms,
                attempt: verdict.attempt + 1,
                idempotency_key: key.map(String::from),
                reconnect: verdict.reconnect,
            }),
            ActionKind::CheckStatus => Action::CheckStatus,
            ActionKind::Succeed => Action::Succeed(None),
            // The caller keeps the task's id.
            ActionKind::Poll => Action::Poll(PollPlan { delay_ms: verdict.delay_ms, task_id: String::new(), reconnect: verdict.reconnect }),
            // Answered above, with their words.
            ActionKind::Replan | ActionKind::Escalate => return Err(PolicyFault::BoundaryViolation { cause: "an action with text had no words".into() }),
        };
        let rule = self.instance.rule_name(&verdict)?;
        let (class, attempt, hint_ms, cancel_task) = (verdict.class, verdict.attempt, verdict.hint_ms, verdict.cancel_task);
        Ok(Ok(Decision { action, class, attempt, hint_ms, rule, reason: String::new(), cancel_task }))
    }

    /// The safe fallback when the policy itself fails (a trap, out of fuel or
    /// memory, a broken contract, an unusable instance): nothing is retried; one
    /// `escalate` line and an escalation whose note says the policy failed, with
    /// what the last attempt saw (the same note as the Python and Node wrappers').
    /// The instance is broken: serve the next run from a fresh one.
    fn policy_failed(&self, step: Option<u32>, tool: &str, key: Option<&str>, last_outcome: &str, fault: PolicyFault) -> CallError {
        let note = format!(
            "the retry policy failed ({}: {fault}); not retried. Last outcome of {tool}: {last_outcome}. \
             Effects of this run are not known to the host: check before sending again.",
            fault.kind()
        );
        let escalation = Escalation {
            reason: EscalationReason::UnclassifiedFailure,
            last_error: Some(last_outcome.to_string()),
            resets_in_ms: None,
            effects: vec![],
            effects_total: 0,
            note,
        };
        self.escalated_without_decision(step, tool, key, last_outcome, escalation)
    }

    /// A call that stopped waiting: one line (outcome the cause, action `stop`),
    /// and the error saying whether it may have been applied.
    fn stopped(&mut self, cause: StopCause, tool: &str, ticket: Option<&CallStart>, attempts_sent: u32, in_flight: bool, key: Option<&str>) -> CallError {
        let may_have_applied = ticket.is_some_and(|ticket| {
            ticket.effect != Effect::Read
                && (in_flight
                    || self
                        .instance
                        .all_effects(&self.run)
                        .is_ok_and(|effects| effects.iter().any(|e| e.call_id == ticket.call_id && e.status == EffectStatus::Unknown)))
        });
        let reason = format!(
            "{} after {attempts_sent} attempt(s){}; {}",
            cause.label(),
            if in_flight { ", one in flight" } else { "" },
            if may_have_applied { "it may have been applied" } else { "it was not applied" }
        );
        let step = if tool == INITIALIZE || tool == TOOLS_LIST { None } else { Some(self.steps) };
        self.log_line(AttemptLine {
            step,
            call: ticket.map(|t| t.call_id),
            tool,
            attempt: attempts_sent,
            key,
            outcome: cause.label(),
            class: None,
            rule: None,
            action: "stop",
            delay_ms: None,
            hint_ms: None,
            escalation: None,
            reason: &reason,
        });
        let stopped = Stopped { cause, tool: tool.to_string(), call_id: ticket.map(|t| t.call_id), attempts_sent, may_have_applied };
        match cause {
            StopCause::Cancelled => CallError::Cancelled(stopped),
            StopCause::CallTimeout | StopCause::RunTimeout => CallError::TimedOut(stopped),
        }
    }

    /// Makes one tool call the model asked for, through the policy.
    pub async fn call(&mut self, tool: &str, arguments: Map<String, Value>) -> Result<ToolAnswer, CallError> {
        self.call_until(tool, arguments, &CancellationToken::new()).await
    }

    /// [`RetryingToolCaller::call`], stopped at once when `cancel` fires
    /// ([`CallError::Cancelled`], saying whether an attempt may have been
    /// applied). Dropping the future also stops it, without that report.
    pub async fn call_until(&mut self, tool: &str, mut arguments: Map<String, Value>, cancel: &CancellationToken) -> Result<ToolAnswer, CallError> {
        let call_started = self.options.clock.now_ms();
        let limit = self.limit(Some(call_started), cancel);
        self.steps += 1;
        let step = self.steps;
        if self.previous_call.as_ref().is_some_and(|(t, a)| t == tool && *a == arguments) {
            self.metrics.update(|c| c.identical_consecutive_calls += 1);
        }
        self.previous_call = Some((tool.to_string(), arguments.clone()));
        let info = self.tools.get(tool).cloned().unwrap_or_default();
        // The key identifies the intended effect: derived once per call, from the
        // run and the step, and sent unchanged with every attempt.
        let key = if info.takes_key {
            let key = self
                .instance
                .derive_idempotency_key(&self.run_id, &format!("step-{step}"))
                .map_err(|fault| self.policy_failed(Some(step), tool, None, "not sent", fault))?;
            arguments.insert(self.options.key_argument.clone(), Value::String(key.clone()));
            Some(key)
        } else {
            None
        };
        let now = self.options.clock.now_ms();
        let begun =
            self.begin_call(tool, key.as_deref(), info.hints, now).map_err(|fault| self.policy_failed(Some(step), tool, key.as_deref(), "not sent", fault))?;
        let ticket = match begun.map_err(CallError::Run)? {
            Admission::Send(ticket) => ticket,
            Admission::Escalate(escalation) => return Err(self.escalated_before_send(Some(step), tool, key.as_deref(), escalation)),
        };
        let mut sent = 0;
        if let Err(cause) = limit.pause(ticket.delay_ms).await {
            return Err(self.stopped(cause, tool, Some(&ticket), sent, false, key.as_deref()));
        }
        // The attempt each outcome reports: 1, then each retry plan's.
        let mut attempt = 1;
        let mut next = Next::Send;
        loop {
            // A lost session is set up again (the policy's `initialize` call)
            // before the next attempt or status check.
            self.ensure_session(&limit).await?;
            let attempted = match next {
                Next::Send => {
                    sent += 1;
                    match self.attempt(tool, &arguments, &limit).await {
                        Ok(attempted) => attempted,
                        Err(cause) => return Err(self.stopped(cause, tool, Some(&ticket), sent, true, key.as_deref())),
                    }
                }
                Next::CheckStatus => {
                    let found = match (self.status_checks.get(tool), self.peer()) {
                        (Some(check), Some(peer)) => match limit.within(check(peer, arguments.clone())).await {
                            Ok(found) => found,
                            Err(cause) => return Err(self.stopped(cause, tool, Some(&ticket), sent, false, key.as_deref())),
                        },
                        _ => StatusCheckResult::Unknown,
                    };
                    Attempted { outcome: Outcome::StatusCheck(found), result: None, uncaptured: false }
                }
            };
            let decision = self
                .record(tool, ticket.call_id, attempt, key.as_deref(), &attempted.outcome, &limit)
                .map_err(|fault| self.policy_failed(Some(step), tool, key.as_deref(), &outcome_label(&attempted.outcome), fault))?
                .map_err(CallError::Run)?;
            self.log(Some(step), ticket.call_id, tool, key.as_deref(), &attempted.outcome, &decision, attempted.uncaptured);
            match decision.action {
                Action::Retry(plan) => {
                    attempt = plan.attempt;
                    next = Next::Send;
                    // The server lost the session (or refused the revision):
                    // the retry goes on a new one, set up before it is sent.
                    if plan.reconnect {
                        self.reconnect_before_retry(tool)?;
                    }
                    if let Err(cause) = limit.pause(plan.delay_ms).await {
                        return Err(self.stopped(cause, tool, Some(&ticket), sent, false, key.as_deref()));
                    }
                }
                Action::CheckStatus => next = Next::CheckStatus,
                Action::Replan(message) => return Ok(ToolAnswer::Replan(message)),
                Action::Succeed(note) => return Ok(ToolAnswer::Done { result: attempted.result, note }),
                Action::Escalate(escalation) => return Err(CallError::Escalated(escalation)),
                Action::Poll(_) => {
                    let fault = PolicyFault::BoundaryViolation { cause: format!("a poll answered {tool}, which has no task") };
                    return Err(self.policy_failed(Some(step), tool, key.as_deref(), &outcome_label(&attempted.outcome), fault));
                }
            }
        }
    }
}

/// What the wrapper does next in a call.
#[derive(Clone, Copy)]
enum Next {
    Send,
    CheckStatus,
}

/// A transport failure's body (the host's own words: nothing was answered)
/// prefixed with what the wrapper was doing, as the Python wrapper does. An
/// answer's body (an HTTP status, a JSON-RPC error) is reported as received:
/// the policy reads it (a -32022, a -32601, a provider's JSON error code).
fn with_context(outcome: Outcome, context: &str) -> Outcome {
    match outcome {
        Outcome::Failure(mut failure) if matches!(failure.kind, FailureKind::Transport(_)) => {
            failure.body = if failure.body.is_empty() { context.to_string() } else { format!("{context}: {}", failure.body) };
            Outcome::Failure(failure)
        }
        other => other,
    }
}

/// A request that could not be sent: the session's transport was already
/// closed, and nothing left the host.
fn lost_before_send() -> Outcome {
    observe::transport_failure(TransportError::StreamClosed, Delivery::NotSent, "not sent: the session's transport is closed".into(), false)
}
