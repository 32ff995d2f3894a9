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
//!
//! An attempt waits `idle-timeout-ms` for an answer (each progress
//! notification starts that wait again) and `attempt-timeout-ms` in all, as
//! `begin-call` says for the tool. A continuation (`input_required`) is
//! answered by the application's client handler within the same attempt, or
//! reported as `input-required`. A tool call answered by a task is polled
//! (`tasks/get`) as the verdicts say; the tool is not called again while the
//! task lives, and a verdict's `cancel-task` is sent as `tasks/cancel`.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::future::BoxFuture;
use rmcp::RoleClient;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelTaskParams, CancelledNotificationParam, ClientRequest, ContentBlock, GetTaskParams,
    GetTaskRequest, MetaObject, RequestMetaObject, ServerResult, TaskPayload, Tool, UpdateTaskParams,
};
use rmcp::service::{Peer, PeerRequestOptions, ServiceError};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;
use tracing::instrument::WithSubscriber;

use super::answer::{CallError, StopCause, ToolAnswer};
use super::clock::Clock;
use super::connect::{McpConnection, SharedConnection};
use super::continuation;
use super::metrics::Metrics;
use super::observe;
use super::session_client::ClientHandlerRef;
use super::task;
use crate::call_core::{CallEnd, CallState, CoreOptions, Out, Reported, ResumeRefused, RunCore};
use crate::component::types::{
    AbandonReason, Action, CallStart, Delivery, FailureKind, Observation, ResumeAnswer, ResumedAction, ResumedCall, RunReport, SnapshotError,
    SnapshotErrorKind, StatusCheckResult, TaskStatus, ToolHints, TransportError, Verdict,
};
use crate::component::{Outcome, PolicyInstance};
use crate::events::{RetryHooks, Telemetry, WaitReason, outcome_words};
use crate::fault::PolicyFault;
use crate::labels;
use crate::limit::Limit;

/// Reads state to learn whether an ambiguous write was applied: given the
/// client and the call's arguments, answers found / absent / unknown.
pub type StatusCheck = Box<dyn Fn(Peer<RoleClient>, Map<String, Value>) -> BoxFuture<'static, StatusCheckResult> + Send + Sync>;

pub use crate::call_core::OnVerdict;

/// Called with every progress notification of a tool call the wrapper makes:
/// the tool, the progress, the total (if the server knows it) and the
/// server's message. The Python wrapper's `on_progress(tool, progress, total,
/// message)`, the Node one's `onProgress(event)`. Only the sessions of an
/// [`super::McpConnection`] route progress to it (a bare peer's handler sees
/// its own); either way, progress restarts the attempt's idle timeout.
pub type OnProgress = Arc<dyn Fn(&str, f64, Option<f64>, Option<&str>) + Send + Sync>;

/// How the wrapper behaves: the same options and defaults as the Python
/// (`attempt_timeout_s`, `key_argument`) and Node (`attemptTimeoutMs`,
/// `keyArgument`) wrappers.
#[derive(Clone)]
pub struct RetryingToolCallerOptions {
    /// Caps how long an attempt may wait without an answer or a progress
    /// notification (policy time, ms). By default (`None`) the policy's
    /// `idle-timeout-ms` for the tool decides, as its `attempt-timeout-ms`
    /// always does for the attempt in all.
    pub attempt_timeout_ms: Option<u64>,
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
    /// (policy time, ms; default [`DEFAULT_RUN_TIMEOUT_MS`], `None` for
    /// none). With it (or `call_timeout_ms`), every report passes the policy
    /// `time-left-ms`, the time to the nearer deadline, so that it never
    /// plans a wait past it.
    pub run_timeout_ms: Option<u64>,
    /// Told every verdict the wrapper acts on (for tests and metrics; default
    /// none): see [`OnVerdict`] and [`RetryingToolCallerOptions::on_verdict`].
    /// It runs inside the call and must not panic.
    pub on_verdict: Option<OnVerdict>,
    /// Told every progress notification of a tool call (default none): see
    /// [`OnProgress`] and [`RetryingToolCallerOptions::on_progress`]. It runs
    /// inside the call and must not panic.
    pub on_progress: Option<OnProgress>,
    /// The most new sessions the run may set up after its first, whatever sets
    /// them up: a verdict's `reconnect`, a session suspect after a cut stream
    /// or a refused connection over HTTP, a stdio server started again
    /// (default [`DEFAULT_MAX_RECONNECTS_PER_RUN`]). Once spent, an attempt
    /// that needs a new session is not sent: it is reported as
    /// `transport(other)`, `not-sent`, "reconnections spent: ...", which the
    /// policy escalates. The Python wrapper's `max_reconnects_per_run`, the
    /// Node one's `maxReconnectsPerRun`.
    pub max_reconnects_per_run: u32,
    /// The server's name for the policy's circuit breakers (default: the
    /// connection's, [`McpConnection::server_name`]; with a bare client, none:
    /// no breaker applies). Workers that share breakers must name a server alike.
    pub server_name: Option<String>,
    /// Told the events of docs/events.md as they happen (default none): see
    /// [`RetryHooks`]. A hook that panics is caught and logged once.
    pub hooks: Option<Arc<dyn RetryHooks>>,
    /// Makes a span per call and per attempt, and puts the attempt's trace
    /// context in the request's `params._meta` (default none: no spans).
    #[cfg(feature = "otel")]
    pub tracer: Option<crate::otel::OtelTracer>,
    /// Records the instruments of docs/events.md through OpenTelemetry (default none).
    #[cfg(feature = "otel")]
    pub meter: Option<crate::otel::OtelMeter>,
}

impl RetryingToolCallerOptions {
    /// These options with `hooks` told the wrapper's events.
    pub fn hooks(mut self, hooks: impl RetryHooks + 'static) -> Self {
        self.hooks = Some(Arc::new(hooks));
        self
    }

    /// These options with `hook` told every verdict the wrapper acts on.
    pub fn on_verdict(mut self, hook: impl Fn(&str, u32, &Verdict) + Send + Sync + 'static) -> Self {
        self.on_verdict = Some(Arc::new(hook));
        self
    }

    /// These options with `hook` told every progress notification of a tool
    /// call: `hook(tool, progress, total, message)`.
    pub fn on_progress(mut self, hook: impl Fn(&str, f64, Option<f64>, Option<&str>) + Send + Sync + 'static) -> Self {
        self.on_progress = Some(Arc::new(hook));
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
            .field("on_progress", &self.on_progress.as_ref().map(|_| "Fn(tool, progress, total, message)"))
            .field("max_reconnects_per_run", &self.max_reconnects_per_run)
            .field("hooks", &self.hooks.as_ref().map(|_| "dyn RetryHooks"))
            .finish()
    }
}

impl Default for RetryingToolCallerOptions {
    fn default() -> Self {
        RetryingToolCallerOptions {
            attempt_timeout_ms: None,
            key_argument: "idempotency_key".into(),
            clock: Clock::real(),
            policy_identity: None,
            call_timeout_ms: None,
            run_timeout_ms: Some(DEFAULT_RUN_TIMEOUT_MS),
            on_verdict: None,
            on_progress: None,
            max_reconnects_per_run: DEFAULT_MAX_RECONNECTS_PER_RUN,
            server_name: None,
            hooks: None,
            #[cfg(feature = "otel")]
            tracer: None,
            #[cfg(feature = "otel")]
            meter: None,
        }
    }
}

/// The run deadline a caller has unless it says otherwise: 30 minutes, so
/// that no policy's wait can hold a run for ever (the same in every host).
pub const DEFAULT_RUN_TIMEOUT_MS: u64 = 1_800_000;

/// The new sessions a run may set up after its first (a verdict's `reconnect`,
/// a session suspect after a cut stream or a refused connection, a stdio
/// server started again), unless `max_reconnects_per_run` says otherwise: the
/// same in every host.
pub const DEFAULT_MAX_RECONNECTS_PER_RUN: u32 = 3;

/// Whether an HTTP session is suspect after this failure: the next request goes
/// on a new one (transport state, as a pool drops a broken connection; the
/// policy still decides whether there is a next request).
fn leaves_session_suspect(outcome: &Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Failure(Observation {
            kind: FailureKind::Transport(TransportError::ConnectionReset | TransportError::ConnectionRefused | TransportError::StreamClosed),
            ..
        })
    )
}

/// Appended to the logged reason of a decision on a failure whose HTTP status
/// and headers were not captured (the same text in every host).
const CAPTURE_MISSING: &str = " [no HTTP status or headers: the transport is not the wrapper's capturing one]";

/// The most a `tasks/cancel` is given (policy ms; the same bound in every
/// host), and never past the call's deadline.
const CANCEL_TIMEOUT_MS: u64 = 5_000;

/// The most tool names the `tools_without_hints` warning lists.
const HINTLESS_NAMES_SHOWN: usize = 20;

/// The pseudo-tools connecting goes through, as calls of the policy.
const INITIALIZE: &str = "initialize";
const TOOLS_LIST: &str = "tools/list";

/// Where the session comes from: a connection the wrapper owns (and can set
/// up again), one it shares with other runs (set up again for all), or a bare
/// peer the caller built (which it cannot).
enum Session {
    Owned(Box<McpConnection>),
    Shared(Arc<SharedConnection>),
    Bare(Peer<RoleClient>),
}

impl Session {
    /// Reads or changes the connection, if there is one (not a bare peer).
    fn connection<R>(&mut self, f: impl FnOnce(&mut McpConnection) -> R) -> Option<R> {
        match self {
            Session::Owned(connection) => Some(f(connection)),
            Session::Shared(shared) => Some(shared.with(f)),
            Session::Bare(_) => None,
        }
    }

    /// Reads the connection, if there is one.
    fn read<R>(&self, f: impl FnOnce(&McpConnection) -> R) -> Option<R> {
        match self {
            Session::Owned(connection) => Some(f(connection)),
            Session::Shared(shared) => Some(shared.with(|c| f(c))),
            Session::Bare(_) => None,
        }
    }

    /// Sets a session up (a shared connection: unless another run just did):
    /// whether this call set one up.
    async fn connect(&mut self) -> Result<bool, Outcome> {
        match self {
            Session::Owned(connection) => connection.connect().await.map(|()| true),
            Session::Shared(shared) => shared.connect().await,
            Session::Bare(_) => Ok(false),
        }
    }

    /// Sessions set up so far (0 for a bare peer).
    fn number(&self) -> u32 {
        self.read(McpConnection::sessions).unwrap_or(0)
    }
}

/// What one attempt (or a poll of its task, or a status check) came to.
struct Attempted {
    outcome: Outcome,
    result: Option<CallToolResult>,
    /// The failure came from an HTTP transport that is not the capturing one.
    uncaptured: bool,
}

impl Attempted {
    fn of(outcome: Outcome) -> Self {
        Attempted { outcome, result: None, uncaptured: false }
    }
}

/// How long one attempt may wait, in policy ms: `idle` without an answer or a
/// progress notification, `total` in all (`call-start`'s, `idle` capped by
/// the host's `attempt_timeout_ms` when it is set).
#[derive(Clone, Copy, Debug)]
struct Timeouts {
    idle_ms: u64,
    total_ms: u64,
}

impl Timeouts {
    fn of(ticket: &CallStart, cap_ms: Option<u64>) -> Self {
        Timeouts { idle_ms: ticket.idle_timeout_ms.min(cap_ms.unwrap_or(u64::MAX)), total_ms: ticket.attempt_timeout_ms }
    }
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
    /// The run in the component, its guard and events: the bookkeeping the
    /// any-call helper shares ([`crate::call_core`]).
    core: RunCore,
    tools: HashMap<String, ToolInfo>,
    status_checks: HashMap<String, StatusCheck>,
    options: RetryingToolCallerOptions,
    metrics: Arc<Metrics>,
    /// The `tools_without_hints` warning was given (once per connection).
    hints_warned: bool,
    previous_call: Option<(String, Map<String, Value>)>,
    /// The last call's arguments as sent (its key included): a snapshot keeps them.
    last_sent: Option<Map<String, Value>>,
    capture_warned: bool,
    /// New sessions set up after the first (`max_reconnects_per_run` bounds them).
    reconnects: u32,
    /// The session the tools were listed on: after a new one (set up by any
    /// run of a shared connection) the next call lists them again.
    tools_session: u32,
    /// The session the last request went on: a failure marks that one lost,
    /// never a newer one other runs may be using.
    session_used: u32,
    /// The last `initialize` of this run set a session up (not another run of a shared connection).
    set_up_session: bool,
}

/// The fan-out of a caller's events: its hooks, its metrics, its tracer and meter.
#[cfg(feature = "otel")]
fn telemetry_of(options: &RetryingToolCallerOptions, metrics: &Arc<Metrics>) -> Telemetry {
    Telemetry::new(options.hooks.clone(), Some(Arc::clone(metrics))).with_tracer(options.tracer.clone()).with_meter(options.meter.clone())
}

/// The fan-out of a caller's events: its hooks, its metrics.
#[cfg(not(feature = "otel"))]
fn telemetry_of(options: &RetryingToolCallerOptions, metrics: &Arc<Metrics>) -> Telemetry {
    Telemetry::new(options.hooks.clone(), Some(Arc::clone(metrics)))
}

fn policy_error(e: PolicyFault) -> CallError {
    CallError::Policy(e)
}

fn refused(refusal: ResumeRefused) -> CallError {
    match refusal {
        ResumeRefused::Snapshot(e) => CallError::Snapshot(e),
        ResumeRefused::Policy(e) => CallError::Policy(e),
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

    /// Starts a run on a connection shared with other runs: connects if no
    /// session is up, and lists the tools for this run. The run has its own
    /// report, budgets and reconnection allowance; the session (and its server
    /// process), its reconnections and the HTTP capture are shared. Finishing
    /// the run leaves the connection open ([`SharedConnection::close`] ends it).
    pub async fn for_run(
        shared: &Arc<SharedConnection>,
        instance: PolicyInstance,
        config_json: &str,
        run_id: &str,
        options: RetryingToolCallerOptions,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        Self::begin(Session::Shared(Arc::clone(shared)), instance, config_json, run_id, options, metrics).await
    }

    async fn begin(
        session: Session,
        instance: PolicyInstance,
        config_json: &str,
        run_id: &str,
        options: RetryingToolCallerOptions,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let core_options = CoreOptions {
            clock: Arc::new(options.clock),
            policy_identity: options.policy_identity.clone(),
            call_timeout_ms: options.call_timeout_ms,
            run_timeout_ms: options.run_timeout_ms,
            on_verdict: options.on_verdict.clone(),
            words_always: false,
            server: options.server_name.clone().or_else(|| session.read(McpConnection::server_name)),
        };
        let core = RunCore::start(instance, config_json, run_id, telemetry_of(&options, &metrics), core_options)?;
        // A refused `server/discover` probe is read by this policy's rule.
        session.read(|connection| connection.set_probe_reader(super::http_client::probe_reader_of(&core.instance)));
        let mut caller = RetryingToolCaller {
            session,
            core,
            tools: HashMap::new(),
            status_checks: HashMap::new(),
            hints_warned: false,
            options,
            metrics,
            previous_call: None,
            last_sent: None,
            capture_warned: false,
            reconnects: 0,
            tools_session: 0,
            session_used: 0,
            set_up_session: false,
        };
        let cancel = CancellationToken::new();
        let limit = caller.limit(None, &cancel);
        caller.ensure_session(&limit).await?;
        if !caller.take_listed_tools() {
            caller.list_tools(&limit).await?;
        }
        Ok(caller)
    }

    /// Registers how to check whether a write to `tool` was applied.
    pub fn with_status_check(mut self, tool: &str, check: StatusCheck) -> Self {
        self.status_checks.insert(tool.to_string(), check);
        self
    }

    pub fn run_id(&self) -> &str {
        &self.core.run_id
    }

    /// What happened in the run so far.
    pub fn report(&mut self) -> Result<RunReport, CallError> {
        self.core.report().map_err(policy_error)
    }

    /// Ends the run and frees it in the component (and closes a connection
    /// the wrapper owns, stopping a server process it started).
    pub async fn finish(self) -> Result<RunReport, CallError> {
        let report = self.core.finish().map_err(policy_error)?;
        if let Session::Owned(connection) = self.session {
            connection.close().await;
        }
        Ok(report)
    }

    /// The nearer of the run's limit and (from `call_started_ms`) the call's.
    fn limit<'a>(&self, call_started_ms: Option<u64>, cancel: &'a CancellationToken) -> Limit<'a> {
        self.core.limit(call_started_ms, cancel)
    }

    /// Whether the last request carried `Mcp-Session-Id` (not known for a bare
    /// peer: false).
    fn session_id_sent(&self) -> bool {
        self.session.read(McpConnection::session_id_sent).unwrap_or(false)
    }

    /// Does what a retry's `reconnect` says: the next attempt goes on a new
    /// session. A bare peer cannot be connected again.
    fn reconnect_before_retry(&mut self, what: &str) -> Result<(), CallError> {
        let used = self.session_used;
        match self.session.connection(|connection| connection.mark_lost_if(used)) {
            Some(()) => Ok(()),
            None => Err(CallError::SessionLost(format!(
                "the policy asks for a new session before retrying {what}, and a bare peer cannot be connected again (use McpConnection)"
            ))),
        }
    }

    /// The session's peer: `None` when an owned connection has none (or lost it).
    fn peer(&self) -> Option<Peer<RoleClient>> {
        match &self.session {
            Session::Bare(peer) => Some(peer.clone()),
            connected => connected.read(McpConnection::peer).flatten(),
        }
    }

    /// Sets the session up (again) when it is lost, as the policy's
    /// `initialize` call. A bare peer's lost session is [`CallError::SessionLost`].
    fn ensure_session<'a>(&'a mut self, limit: &'a Limit<'a>) -> BoxFuture<'a, Result<(), CallError>> {
        Box::pin(async move {
            if let Session::Bare(peer) = &self.session {
                if peer.is_transport_closed() {
                    return Err(CallError::SessionLost("the session's transport closed, and a bare peer cannot be connected again (use McpConnection)".into()));
                }
                return Ok(());
            }
            // Not connected again: the attempt that needs it is reported as the budget's end.
            if self.reconnects_spent() {
                return Ok(());
            }
            let (needed, again) = self.session.read(|c| (c.needs_connect(), c.was_connected())).unwrap_or_default();
            if needed {
                self.pseudo_call(INITIALIZE, limit).await?;
                // Counted against this run only when it set the session up itself.
                if std::mem::take(&mut self.set_up_session) && again {
                    self.reconnects += 1;
                }
            }
            Ok(())
        })
    }

    /// Takes the tools another run of a shared connection listed on the
    /// current session, when the connection reuses listings: whether it did.
    fn take_listed_tools(&mut self) -> bool {
        let Session::Shared(shared) = &self.session else { return false };
        let Some((session, tools)) = shared.with(|c| c.listed_tools_now()) else { return false };
        self.tools = tools.iter().map(|tool| (tool.name.to_string(), tool_info(tool, &self.options.key_argument))).collect();
        self.tools_session = session;
        true
    }

    /// Lists the server's tools (their annotations and whether they take a
    /// key), as the policy's `tools/list` call.
    async fn list_tools(&mut self, limit: &Limit<'_>) -> Result<(), CallError> {
        self.pseudo_call(TOOLS_LIST, limit).await?;
        // The session the listing went on (set up again in it, if it was lost).
        self.tools_session = self.session_used;
        Ok(())
    }

    /// Once per connection: the tools that carry no annotations are treated as
    /// unkeyed writes by the policy (unless the configuration names them), so
    /// that the first ambiguous failure escalates `status-unknown`. Names
    /// listed up to [`HINTLESS_NAMES_SHOWN`].
    fn warn_tools_without_hints(&mut self, tools: &[Tool]) {
        let hintless: Vec<&str> = tools.iter().filter(|tool| tool.annotations.is_none()).map(|tool| tool.name.as_ref()).collect();
        if hintless.is_empty() {
            return;
        }
        let first = self.session.connection(McpConnection::first_hints_warning).unwrap_or_else(|| !std::mem::replace(&mut self.hints_warned, true));
        if !first {
            return;
        }
        let mut names = hintless.iter().take(HINTLESS_NAMES_SHOWN).map(|name| crate::limits::cut(name, 128)).collect::<Vec<_>>().join(", ");
        if hintless.len() > HINTLESS_NAMES_SHOWN {
            names.push_str(&format!(" and {} more", hintless.len() - HINTLESS_NAMES_SHOWN));
        }
        tracing::warn!(
            target: "agent_retry",
            event = "agent_retry.tools_without_hints",
            ts = crate::events::unix_seconds(),
            run = %self.core.run_id,
            count = hintless.len(),
            tools = %names,
            "tools without annotations count as unkeyed writes unless the configuration says otherwise: see docs/users.md#a-tool-without-annotations-is-an-unkeyed-write"
        );
    }

    /// Whether the next request needs a new session after the first, and none
    /// is left in `max_reconnects_per_run`.
    fn reconnects_spent(&self) -> bool {
        self.session.read(|c| c.needs_connect() && c.was_connected()).unwrap_or(false) && self.reconnects >= self.options.max_reconnects_per_run
    }

    /// An attempt not sent because the reconnections are spent: `other`, which the policy escalates.
    fn reconnects_spent_outcome(&self) -> Outcome {
        let detail =
            format!("reconnections spent: {} new sessions in this run (max_reconnects_per_run {})", self.reconnects, self.options.max_reconnects_per_run);
        observe::transport_failure(TransportError::Other, Delivery::NotSent, detail, false)
    }

    /// One attempt of a pseudo-call: connecting, or listing the tools (no
    /// progress comes for either: the idle timeout is the whole wait).
    async fn pseudo_attempt(&mut self, what: &str, timeouts: Timeouts, limit: &Limit<'_>) -> Result<Attempted, StopCause> {
        let timeout = self.options.clock.real_duration(timeouts.idle_ms.min(timeouts.total_ms));
        if what == INITIALIZE {
            let Some(was_connected) = self.session.read(McpConnection::was_connected) else {
                return Ok(Attempted { outcome: Outcome::Success, result: None, uncaptured: false });
            };
            // The note of an escalation quotes the last failure: say what it was for.
            let what_failed =
                if was_connected { "could not reach the MCP server again after the session was lost" } else { "could not connect to the MCP server" };
            let connecting = tokio::time::timeout(timeout, self.session.connect());
            let outcome = match limit.within(connecting).await? {
                Err(_elapsed) => with_context(observe::timeout(false), what_failed),
                Ok(Ok(set_up)) => {
                    self.set_up_session = set_up;
                    Outcome::Success
                }
                Ok(Err(outcome)) => with_context(outcome, what_failed),
            };
            return Ok(Attempted { outcome, result: None, uncaptured: false });
        }
        if self.reconnects_spent() {
            return Ok(Attempted::of(self.reconnects_spent_outcome()));
        }
        let peer = match self.peer_to_send() {
            Ok(peer) => peer,
            Err(outcome) => return Ok(Attempted::of(outcome)),
        };
        let listed = limit.within(tokio::time::timeout(timeout, peer.list_all_tools())).await?;
        let key_argument = self.options.key_argument.clone();
        let (outcome, uncaptured) = match listed {
            Err(_elapsed) => (observe::timeout(self.session_id_sent()), false),
            Ok(Ok(tools)) => {
                self.tools = tools.iter().map(|tool| (tool.name.to_string(), tool_info(tool, &key_argument))).collect();
                let session = self.session_used;
                self.session.connection(|c| c.remember_tools(session, &tools));
                self.warn_tools_without_hints(&tools);
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
        let (mut state, ticket) = self.core.begin(None, what, None, Some(hints))?;
        self.core.pause(&state, WaitReason::Admission, ticket.delay_ms, None, false, limit).await?;
        let timeouts = Timeouts::of(&ticket, self.options.attempt_timeout_ms);
        loop {
            if what == TOOLS_LIST {
                // A stop while it connects stops this call too: it is the one abandoned in the run.
                match self.ensure_session(limit).await {
                    Ok(()) => {}
                    Err(CallError::TimedOut(stop) | CallError::Cancelled(stop)) => {
                        return Err(self.core.stop(&state, stop.cause, Out::Connecting { task_alive: false }).into());
                    }
                    Err(other) => return Err(other),
                }
            }
            state.sent += 1;
            let attempted = match self.pseudo_attempt(what, timeouts, limit).await {
                Ok(attempted) => attempted,
                Err(cause) => return Err(self.core.stop(&state, cause, Out::Request).into()),
            };
            let note = self.capture_note(attempted.uncaptured);
            let decision = self.core.decide(&mut state, &attempted.outcome, Reported::Sent, note, limit)?;
            match decision.action {
                Action::Succeed(_) => return Ok(()),
                Action::Retry(plan) => {
                    // Connecting again is what an `initialize` retry does anyway.
                    if plan.reconnect && what == TOOLS_LIST {
                        self.reconnect_before_retry(what)?;
                    }
                    self.core.pause(&state, WaitReason::Retry, plan.delay_ms, decision.hint_ms, false, limit).await?;
                }
                Action::Escalate(escalation) => return Err(CallError::Escalated(escalation)),
                Action::Replan(message) => return Err(CallError::SessionLost(format!("{what}: {message}"))),
                // A read is not status-checked; were it asked, nothing is known.
                Action::CheckStatus => {
                    let outcome = Outcome::StatusCheck(StatusCheckResult::Unknown);
                    self.core.status_checked(&state, None, StatusCheckResult::Unknown);
                    let decision = self.core.decide(&mut state, &outcome, Reported::Checked, "", limit)?;
                    if let Action::Escalate(escalation) = decision.action {
                        return Err(CallError::Escalated(escalation));
                    }
                    return Err(CallError::SessionLost(format!("{what}: {}", decision.reason)));
                }
                // Only a task's report is answered with a poll, and a pseudo-call has none.
                Action::Poll(_) => {
                    let fault = PolicyFault::BoundaryViolation { cause: format!("a poll answered {what}, which has no task") };
                    let answered = Some((state.call_id, state.attempt));
                    return Err(self.core.policy_failed(None, answered, what, None, &outcome_words(&attempted.outcome), fault).into());
                }
            }
        }
    }

    /// Once per run: a failure came from an HTTP transport that is not the
    /// capturing one (statuses and headers unseen). The words appended to the
    /// decision's logged reason (the same text in every host), or none.
    fn capture_note(&mut self, uncaptured: bool) -> &'static str {
        if !uncaptured {
            return "";
        }
        if !std::mem::replace(&mut self.capture_warned, true) {
            tracing::warn!(
                target: "agent_retry",
                event = "agent_retry.capture_missing",
                ts = crate::events::unix_seconds(),
                run = %self.core.run_id,
                "a failure came from an HTTP transport that is not the wrapper's capturing one: statuses and headers (Retry-After) are not seen; connect with McpConnection::http"
            );
        }
        CAPTURE_MISSING
    }

    /// Observes a failed request as it came. When the session's transport
    /// itself is gone (a dead pipe), an owned connection needs a new one before
    /// the next request whatever the policy decides: that is I/O, not a reading
    /// of the failure.
    fn observe_failure(&mut self, error: &ServiceError) -> Outcome {
        let session_id_sent = self.session_id_sent();
        let outcome = observe::from_error(error, session_id_sent);
        let gone = observe::transport_is_gone(error);
        let used = self.session_used;
        self.session.connection(|connection| {
            if gone || (connection.is_http() && leaves_session_suspect(&outcome)) {
                connection.mark_lost_if(used);
            }
        });
        outcome
    }

    /// The application's client handler, if its connection has one.
    fn handler(&self) -> Option<ClientHandlerRef> {
        self.session.read(|connection| connection.handler().cloned()).flatten()
    }

    /// The peer for the next request, or why none can be sent: an owned
    /// connection without a session, or a transport already closed (nothing
    /// can be written to a closed pipe: the request never left). The caller
    /// remembers the session the request goes on: a failure marks only that
    /// one lost ([`RetryingToolCaller::observe_failure`]).
    fn peer_to_send(&mut self) -> Result<Peer<RoleClient>, Outcome> {
        let current = match &self.session {
            Session::Bare(peer) => Some((peer.clone(), 0)),
            connected => connected.read(McpConnection::current_session).flatten(),
        };
        let Some((peer, session)) = current else {
            return Err(lost_before_send());
        };
        self.session_used = session;
        if peer.is_transport_closed() {
            self.session.connection(|connection| connection.mark_lost_if(session));
            return Err(lost_before_send());
        }
        Ok(peer)
    }

    /// One attempt of a tool call, within the limit: its continuation rounds
    /// (answered by the application's handler: the same attempt) included.
    async fn attempt(&mut self, tool: &str, arguments: &Map<String, Value>, timeouts: Timeouts, limit: &Limit<'_>) -> Result<Attempted, StopCause> {
        if self.reconnects_spent() {
            return Ok(Attempted::of(self.reconnects_spent_outcome()));
        }
        let peer = match self.peer_to_send() {
            Ok(peer) => peer,
            Err(outcome) => return Ok(Attempted::of(outcome)),
        };
        let total = self.options.clock.real_duration(timeouts.total_ms);
        let idle = self.options.clock.real_duration(timeouts.idle_ms);
        let mut params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments.clone());
        // The attempt span's W3C trace context, for a traced server (MCP SEP-414).
        if let Some((traceparent, tracestate)) = self.core.telemetry.trace_meta() {
            let mut meta = MetaObject::new();
            meta.set_traceparent(traceparent);
            if let Some(tracestate) = tracestate {
                meta.set_tracestate(tracestate);
            }
            params.meta = Some(RequestMetaObject(meta));
        }
        // Time spent waiting for the server; a person answering a handler does not count.
        let mut waited = Duration::ZERO;
        let mut questions = String::new();
        for _round in 0..=continuation::MAX_ROUNDS {
            let sent_at = Instant::now();
            let answered = limit.within(self.send_call(&peer, tool, params.clone(), idle, total.saturating_sub(waited))).await?;
            waited += sent_at.elapsed();
            let session_id_sent = self.session_id_sent();
            let asked = match answered {
                Ok(ServerResult::CallToolResult(result)) => {
                    return Ok(Attempted { outcome: observe::from_result(&result, session_id_sent), result: Some(result), uncaptured: false });
                }
                // A bare acknowledgement: a result with no content.
                Ok(ServerResult::EmptyResult(_)) => {
                    let result = CallToolResult::default();
                    return Ok(Attempted { outcome: observe::from_result(&result, session_id_sent), result: Some(result), uncaptured: false });
                }
                Ok(ServerResult::CreateTaskResult(created)) => {
                    let report = task::report(&created.task, task::live_status(created.task.status), None, self.options.clock.now_ms());
                    return Ok(Attempted::of(Outcome::Task(report)));
                }
                Ok(ServerResult::InputRequiredResult(asked)) => asked,
                Ok(_) => return Ok(Attempted::of(observe::from_error(&ServiceError::UnexpectedResponse, session_id_sent))),
                Err(error) => {
                    let uncaptured = observe::is_uncaptured(&error) && matches!(self.session, Session::Bare(_));
                    return Ok(Attempted { outcome: self.observe_failure(&error), result: None, uncaptured });
                }
            };
            let requests = asked.input_requests.unwrap_or_default();
            // A round that carries only `requestState` needs no answer: it is sent back as it came.
            let responses = if requests.is_empty() {
                None
            } else {
                questions = continuation::questions(&requests);
                let Some(handler) = self.handler() else {
                    return Ok(Attempted::of(input_required(questions, session_id_sent)));
                };
                match limit.within(continuation::answer(&handler, &peer, requests)).await? {
                    Ok(responses) => Some(responses),
                    Err(why) => {
                        return Ok(Attempted::of(input_required(format!("{questions}\n(the client's handler did not answer: {why})"), session_id_sent)));
                    }
                }
            };
            params.input_responses = responses;
            params.request_state = asked.request_state;
        }
        let spent = format!("{questions}\n(the server still asked for input after {} answered rounds)", continuation::MAX_ROUNDS);
        Ok(Attempted::of(input_required(spent, self.session_id_sent())))
    }

    /// Sends one `tools/call` and waits for its answer: at most `idle` without
    /// an answer or a progress notification (rmcp restarts the wait at each),
    /// `total` in all. Each progress notification is told to `on_progress`.
    /// Dropped unanswered (the call's deadline, its cancellation), it sends
    /// `notifications/cancelled` for the request.
    async fn send_call(
        &self,
        peer: &Peer<RoleClient>,
        tool: &str,
        params: CallToolRequestParams,
        idle: Duration,
        total: Duration,
    ) -> Result<ServerResult, ServiceError> {
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let options = PeerRequestOptions::with_timeout(idle.min(total)).reset_timeout_on_progress().with_max_total_timeout(total);
        let handle = peer.send_request_with_option(request, options).await?;
        let mut progress = match self.session.read(|connection| connection.progress().clone()) {
            Some(dispatcher) => Some(dispatcher.subscribe(handle.progress_token.clone()).await),
            None => None,
        };
        let mut unanswered = CancelOnDrop { peer: Some(peer.clone()), request_id: handle.id.clone() };
        let response = handle.await_response();
        tokio::pin!(response);
        let answered = loop {
            tokio::select! {
                answered = &mut response => break answered,
                Some(note) = async {
                    match progress.as_mut() {
                        Some(stream) => stream.next().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if let Some(hook) = &self.options.on_progress {
                        hook(tool, note.progress, note.total, note.message.as_deref());
                    }
                }
            }
        };
        // Answered, or timed out (rmcp then sent the cancellation itself).
        unanswered.peer = None;
        // rmcp hands each notification to a task of its own, so the last
        // progress can trail the answer by a moment: what has arrived by now is
        // still told.
        tokio::task::yield_now().await;
        if let (Some(stream), Some(hook)) = (progress.as_mut(), &self.options.on_progress) {
            while let Some(Some(note)) = futures::FutureExt::now_or_never(stream.next()) {
                hook(tool, note.progress, note.total, note.message.as_deref());
            }
        }
        answered
    }

    /// Polls the call's task (`tasks/get`) and reports what it says: a live
    /// task's status (input it asks for answered through `tasks/update` by
    /// the application's handler, if there is one), a completed task's result,
    /// a failed task's error, or the poll's own failure.
    async fn poll(&mut self, task_id: &str, timeouts: Timeouts, limit: &Limit<'_>) -> Result<Attempted, StopCause> {
        if self.reconnects_spent() {
            return Ok(Attempted::of(as_poll_failure(self.reconnects_spent_outcome())));
        }
        let peer = match self.peer_to_send() {
            Ok(peer) => peer,
            Err(outcome) => return Ok(Attempted::of(as_poll_failure(outcome))),
        };
        let wait = self.options.clock.real_duration(timeouts.idle_ms.min(timeouts.total_ms));
        let got = limit.within(tokio::time::timeout(wait, get_task(&peer, task_id))).await?;
        let session_id_sent = self.session_id_sent();
        let detailed = match got {
            Err(_elapsed) => return Ok(Attempted::of(as_poll_failure(observe::timeout(session_id_sent)))),
            Ok(Err(error)) => {
                let uncaptured = observe::is_uncaptured(&error) && matches!(self.session, Session::Bare(_));
                return Ok(Attempted { outcome: as_poll_failure(self.observe_failure(&error)), result: None, uncaptured });
            }
            Ok(Ok(ServerResult::GetTaskResult(got))) => got.task,
            // An answer that is not a task (rmcp could not read one in it).
            Ok(Ok(other)) => return Ok(Attempted::of(unusable_answer(&other, session_id_sent))),
        };
        let now = self.options.clock.now_ms();
        let live = |status: TaskStatus, message: Option<String>| Attempted::of(Outcome::Task(task::report(&detailed.task, status, message, now)));
        Ok(match detailed.payload.clone() {
            TaskPayload::Working => live(TaskStatus::Working, None),
            TaskPayload::Cancelled => live(TaskStatus::Cancelled, None),
            TaskPayload::Completed { result } => {
                let (outcome, result) = task::completed(result, session_id_sent);
                Attempted { outcome, result, uncaptured: false }
            }
            TaskPayload::Failed { error } => Attempted::of(task::failed(&error, session_id_sent)),
            TaskPayload::InputRequired { input_requests } => {
                let questions = continuation::questions(&input_requests);
                let Some(handler) = self.handler() else {
                    return Ok(live(TaskStatus::InputRequired, Some(questions)));
                };
                let responses = match limit.within(continuation::answer(&handler, &peer, input_requests)).await? {
                    Ok(responses) => responses,
                    Err(why) => return Ok(live(TaskStatus::InputRequired, Some(format!("{questions}\n(the client's handler did not answer: {why})")))),
                };
                let update = peer.update_task(UpdateTaskParams::new(task_id, responses));
                match limit.within(tokio::time::timeout(wait, update)).await? {
                    Ok(Ok(())) => live(TaskStatus::InputAnswered, Some(questions)),
                    Ok(Err(error)) => Attempted::of(as_poll_failure(self.observe_failure(&error))),
                    Err(_elapsed) => Attempted::of(as_poll_failure(observe::timeout(self.session_id_sent()))),
                }
            }
            // A status this client does not know.
            _ => Attempted::of(unusable_answer(&detailed, session_id_sent)),
        })
    }

    /// Sends `tasks/cancel` for a task the call stops waiting for (as a
    /// verdict's `cancel-task` says, or when the call stops at a deadline or is
    /// cancelled). Best effort: the policy's decision stands whatever the
    /// server answers. The request goes on a task of its own, given at most
    /// [`CANCEL_TIMEOUT_MS`]; the call waits for its answer only on a verdict
    /// (`stopped` false), and then never past its deadline nor its
    /// cancellation. A stopped call returns at once, the cancel still on its way.
    async fn cancel_task(&mut self, tool: &str, task_id: &str, limit: &Limit<'_>, stopped: bool) {
        // Best effort, on whatever session is up: its failure marks nothing lost.
        let peer = match self.peer().filter(|peer| !peer.is_transport_closed()) {
            Some(peer) => peer,
            None => {
                tracing::info!(target: "agent_retry", event = "agent_retry.cancel_task", ts = crate::events::unix_seconds(), run = %self.core.run_id, tool, task = task_id, answer = "not sent: no session", "tasks/cancel");
                return;
            }
        };
        let bound = self.options.clock.real_duration(CANCEL_TIMEOUT_MS);
        let (run, tool, task_id) = (self.core.run_id.clone(), tool.to_string(), task_id.to_string());
        let sending = tokio::spawn(
            async move {
                let answer = match tokio::time::timeout(bound, peer.cancel_task(CancelTaskParams::new(task_id.clone()))).await {
                    Ok(Ok(())) => "acknowledged".to_string(),
                    Ok(Err(error)) => format!("failed: {error}"),
                    Err(_elapsed) => "no answer".to_string(),
                };
                tracing::info!(target: "agent_retry", event = "agent_retry.cancel_task", ts = crate::events::unix_seconds(), run = %run, tool, task = task_id, answer, "tasks/cancel");
            }
            .with_current_subscriber(),
        );
        if !stopped {
            // The limit ends the wait at the deadline; the task bounds itself.
            let _ = limit.within(sending).await;
        }
    }

    /// Makes one tool call the model asked for, through the policy.
    pub async fn call(&mut self, tool: &str, arguments: Map<String, Value>) -> Result<ToolAnswer, CallError> {
        self.call_until(tool, arguments, &CancellationToken::new()).await
    }

    /// [`RetryingToolCaller::call`], stopped at once when `cancel` fires
    /// ([`CallError::Cancelled`], saying whether an attempt may have been
    /// applied). Dropping the future also stops it, without that report.
    pub async fn call_until(&mut self, tool: &str, arguments: Map<String, Value>, cancel: &CancellationToken) -> Result<ToolAnswer, CallError> {
        self.core.telemetry.begin_call(&self.core.context(Some(self.core.steps + 1), None, tool));
        let _dropped = self.core.telemetry.ending_on_drop();
        let result = self.call_under_policy(tool, arguments, cancel).await;
        let (action, error_type) = match &result {
            Ok(ToolAnswer::Done { .. }) => ("succeed", None),
            Ok(ToolAnswer::Replan(_)) => ("replan", None),
            Err(CallError::Escalated(e)) => ("escalate", Some(labels::reason(e.reason))),
            Err(CallError::TimedOut(stopped) | CallError::Cancelled(stopped)) => ("stop", Some(stopped.cause.label())),
            Err(CallError::SessionLost(_)) => ("stop", Some("session-lost")),
            Err(CallError::Policy(_)) => ("stop", Some("policy-fault")),
            Err(CallError::Run(_)) => ("stop", Some("run-error")),
            Err(CallError::Snapshot(_)) => ("stop", Some("snapshot-refused")),
        };
        self.core.telemetry.end_call(action, error_type);
        result
    }

    /// A snapshot of the run after it escalated, with its last call's
    /// arguments as sent: a versioned document (JSON) a person answers and any
    /// host resumes ([`RetryingToolCaller::resume`]). Refused
    /// ([`CallError::Snapshot`]) before the run escalated.
    pub fn snapshot(&mut self) -> Result<String, CallError> {
        let arguments = self.last_sent.as_ref().map(|a| Value::Object(a.clone()).to_string());
        self.core.snapshot(arguments.as_deref()).map_err(refused)
    }

    /// Resumes the escalated run of `snapshot` (taken by any host) with a
    /// person's answer: this caller's run becomes the resumed one. `Retry`
    /// sends the stopped call again with its arguments and its key, and goes
    /// on as any call does; `Done` answers the person's result, `Skip` the
    /// replan the model is told, `Abort` escalates
    /// ([`CallError::Escalated`]). A snapshot that is changed, of another
    /// contract major or not a snapshot is refused ([`CallError::Snapshot`]),
    /// nothing sent.
    pub async fn resume(&mut self, snapshot: &str, answer: ResumeAnswer) -> Result<ToolAnswer, CallError> {
        let call = self.core.resume(snapshot, &answer).map_err(refused)?;
        // A later snapshot of this run keeps the resumed call's arguments, whatever the answer.
        self.last_sent = call.arguments_json.as_deref().and_then(|a| serde_json::from_str::<Value>(a).ok()).and_then(|v| v.as_object().cloned());
        match call.action {
            ResumedAction::Succeed => {
                let text = call.result_text.clone().unwrap_or_default();
                Ok(ToolAnswer::Done { result: Some(CallToolResult::success(vec![ContentBlock::text(text)])), note: Some("a person marked it done".into()) })
            }
            ResumedAction::Replan => {
                let decision = self.core.instance.last_decision(&self.core.run, call.call_id).map_err(policy_error)?;
                let Some((Action::Replan(message), decision)) = decision.map(|d| (d.action.clone(), d)) else {
                    return Err(CallError::Policy(PolicyFault::BoundaryViolation { cause: "a resumed call to replan has no replan decision".into() }));
                };
                self.core.resumed_end(&call, Some((&message, &decision)), None);
                Ok(ToolAnswer::Replan(message))
            }
            ResumedAction::Escalate => match self.core.instance.escalation(&self.core.run).map_err(policy_error)? {
                Some(escalation) => {
                    self.core.resumed_end(&call, None, Some(&escalation));
                    Err(CallError::Escalated(escalation))
                }
                None => Err(CallError::Policy(PolicyFault::BoundaryViolation { cause: "a resumed run to escalate has no escalation".into() })),
            },
            ResumedAction::Send => {
                self.core.telemetry.begin_call(&self.core.context(Some(call.call_id), Some(call.call_id), &call.tool));
                let _dropped = self.core.telemetry.ending_on_drop();
                let result = self.send_resumed(&call).await;
                let (action, error_type) = match &result {
                    Ok(ToolAnswer::Done { .. }) => ("succeed", None),
                    Ok(ToolAnswer::Replan(_)) => ("replan", None),
                    Err(CallError::Escalated(e)) => ("escalate", Some(labels::reason(e.reason))),
                    Err(_) => ("stop", Some("resume")),
                };
                self.core.telemetry.end_call(action, error_type);
                result
            }
        }
    }

    /// Sends a resumed call's next attempt, with its arguments and its key.
    async fn send_resumed(&mut self, call: &ResumedCall) -> Result<ToolAnswer, CallError> {
        let Some(ticket) = call.ticket else {
            return Err(CallError::Policy(PolicyFault::BoundaryViolation { cause: "a resumed call to send has no ticket".into() }));
        };
        // The session's own calls are made again as the wrapper makes them, not as a tool call:
        // the call is closed unsent, and the model calls its tool again.
        let pseudo = [INITIALIZE, TOOLS_LIST].contains(&call.tool.as_str());
        let arguments = match call.arguments_json.as_deref().map(serde_json::from_str::<Value>) {
            Some(Ok(Value::Object(arguments))) => Some(arguments),
            _ => None,
        };
        let (Some(mut arguments), false) = (arguments, pseudo) else {
            let _ = self.core.instance.abandon_call(&self.core.run, call.call_id, call.attempt, false, AbandonReason::Cancelled);
            if pseudo {
                return Ok(ToolAnswer::Replan(format!("A person allowed {} again: call the tool again.", call.tool)));
            }
            // Never a write with no arguments: the person's retry cannot be made from this snapshot.
            let message = format!("the snapshot keeps no arguments for call {} ({}): it cannot be sent again; nothing was sent", call.call_id, call.tool);
            return Err(CallError::Snapshot(SnapshotError { kind: SnapshotErrorKind::Malformed, message }));
        };
        // The key goes as the call first sent it, whichever host took the snapshot.
        if let Some(key) = &call.idempotency_key
            && self.tools.get(&call.tool).is_some_and(|info| info.takes_key)
        {
            arguments.insert(self.options.key_argument.clone(), Value::String(key.clone()));
        }
        let cancel = CancellationToken::new();
        let limit = self.limit(Some(self.core.clock.now_ms()), &cancel);
        // The call keeps its place in the run: its step is its id.
        let step = Some(call.call_id);
        let state = self.core.resumed_state(step, call, &ticket)?;
        self.last_sent = Some(arguments.clone());
        self.core.pause(&state, WaitReason::Admission, ticket.delay_ms, None, false, &limit).await?;
        self.drive(&call.tool, &arguments, state, &ticket, step, &limit).await
    }
    /// [`RetryingToolCaller::call_until`] inside the call's span.
    async fn call_under_policy(&mut self, tool: &str, mut arguments: Map<String, Value>, cancel: &CancellationToken) -> Result<ToolAnswer, CallError> {
        let call_started = self.core.clock.now_ms();
        let limit = self.limit(Some(call_started), cancel);
        self.core.steps += 1;
        let step = Some(self.core.steps);
        self.core.refuse_if_stopped(step, tool)?;
        if self.previous_call.as_ref().is_some_and(|(t, a)| t == tool && *a == arguments) {
            self.metrics.update(|c| c.identical_consecutive_calls += 1);
        }
        self.previous_call = Some((tool.to_string(), arguments.clone()));
        // After a new session the tools are listed again: a restarted server's annotations rule.
        if self.tools_session != self.session.number() && !self.take_listed_tools() {
            // A stop while they are listed stops this call too, before it was begun.
            match self.list_tools(&limit).await {
                Ok(()) => {}
                Err(CallError::TimedOut(stop) | CallError::Cancelled(stop)) => {
                    return Err(self.core.stop_before_begin(step, tool, stop.cause, TOOLS_LIST).into());
                }
                Err(other) => return Err(other),
            }
        }
        let info = self.tools.get(tool).cloned().unwrap_or_default();
        // The key identifies the intended effect: derived once per call, from the
        // run and the step, and sent unchanged with every attempt.
        let key = if info.takes_key {
            match arguments.get(&self.options.key_argument).filter(|given| !given.is_null()) {
                // A key the application (or a proxy's client) already put in the
                // arguments (null is none) names the effect it means: sent unchanged, never
                // replaced. One the policy cannot be told (not a string, empty,
                // too long) still goes as it is, and the call counts as an unkeyed
                // write: an ambiguous failure is checked, never resent blind.
                Some(given) => given.as_str().filter(|key| given_key_fits(key)).map(str::to_string),
                None => {
                    let key = self.core.derive_key(step, tool, &format!("step-{}", self.core.steps))?;
                    arguments.insert(self.options.key_argument.clone(), Value::String(key.clone()));
                    Some(key)
                }
            }
        } else {
            None
        };
        self.last_sent = Some(arguments.clone());
        let (state, ticket) = match self.core.begin(step, tool, key, info.hints) {
            Ok(begun) => begun,
            Err(CallEnd::Replanned(message)) => return Ok(ToolAnswer::Replan(message)),
            Err(end) => return Err(end.into()),
        };
        self.core.pause(&state, WaitReason::Admission, ticket.delay_ms, None, false, &limit).await?;
        self.drive(tool, &arguments, state, &ticket, step, &limit).await
    }

    /// Sends the call's attempts, polls its task, checks its status, as the
    /// verdicts say, from the attempt `state` is at, until one ends it.
    async fn drive(
        &mut self,
        tool: &str,
        arguments: &Map<String, Value>,
        mut state: CallState,
        ticket: &CallStart,
        step: Option<u32>,
        limit: &Limit<'_>,
    ) -> Result<ToolAnswer, CallError> {
        let timeouts = Timeouts::of(ticket, self.options.attempt_timeout_ms);
        let mut next = Next::Send;
        // The task that answered the attempt, while it lives.
        let mut task: Option<String> = None;
        loop {
            // A lost session is set up again (the policy's `initialize` call)
            // before the next attempt, poll or status check. A stop while it
            // connects stops this call too: it is the one abandoned in the run.
            match self.ensure_session(limit).await {
                Ok(()) => {}
                Err(CallError::TimedOut(stop) | CallError::Cancelled(stop)) => {
                    // A task waiting for its next poll lives on: it is cancelled.
                    let task_alive = matches!(next, Next::Poll);
                    if let (true, Some(task_id)) = (task_alive, task.clone()) {
                        self.cancel_task(tool, &task_id, limit, true).await;
                    }
                    return Err(self.core.stop(&state, stop.cause, Out::Connecting { task_alive }).into());
                }
                Err(other) => return Err(other),
            }
            let (attempted, reported) = match next {
                Next::Send => {
                    state.sent += 1;
                    self.core.telemetry.begin_attempt(true);
                    let telemetry = self.core.telemetry.clone();
                    match telemetry.in_attempt(self.attempt(tool, arguments, timeouts, limit)).await {
                        Ok(attempted) => (attempted, Reported::Sent),
                        Err(cause) => return Err(self.core.stop(&state, cause, Out::Request).into()),
                    }
                }
                Next::Poll => {
                    let task_id = task.clone().unwrap_or_default();
                    match self.poll(&task_id, timeouts, limit).await {
                        Ok(attempted) => (attempted, Reported::Polled),
                        Err(cause) => {
                            self.cancel_task(tool, &task_id, limit, true).await;
                            return Err(self.core.stop(&state, cause, Out::Idle { task_alive: true }).into());
                        }
                    }
                }
                Next::CheckStatus => {
                    let found = match (self.status_checks.get(tool), self.peer()) {
                        (Some(check), Some(peer)) => match limit.within(check(peer, arguments.clone())).await {
                            Ok(found) => found,
                            Err(cause) => return Err(self.core.stop(&state, cause, Out::Idle { task_alive: false }).into()),
                        },
                        _ => StatusCheckResult::Unknown,
                    };
                    self.core.status_checked(&state, None, found);
                    (Attempted::of(Outcome::StatusCheck(found)), Reported::Checked)
                }
            };
            if let Outcome::Task(report) = &attempted.outcome {
                task = Some(report.task_id.clone());
            }
            if reported == Reported::Polled || matches!(attempted.outcome, Outcome::Task(_)) {
                self.core.task_polled(&state, task.as_deref(), &attempted.outcome);
            }
            let note = self.capture_note(attempted.uncaptured);
            let decision = self.core.decide(&mut state, &attempted.outcome, reported, note, limit)?;
            // The policy stops waiting for a task that still lives: cancel it first.
            if decision.cancel_task
                && let Some(task_id) = task.take()
            {
                self.cancel_task(tool, &task_id, limit, false).await;
            }
            match decision.action {
                Action::Retry(plan) => {
                    next = Next::Send;
                    // A new attempt is a new tool call: the old task is not polled again.
                    task = None;
                    // The server lost the session (or refused the revision):
                    // the retry goes on a new one, set up before it is sent.
                    if plan.reconnect {
                        self.reconnect_before_retry(tool)?;
                    }
                    self.core.pause(&state, WaitReason::Retry, plan.delay_ms, decision.hint_ms, false, limit).await?;
                }
                Action::Poll(plan) => {
                    let Some(task_id) = task.clone() else {
                        let fault = PolicyFault::BoundaryViolation { cause: format!("a poll answered {tool}, which has no task") };
                        let answered = Some((state.call_id, state.attempt));
                        let words = outcome_words(&attempted.outcome);
                        return Err(self.core.policy_failed(step, answered, tool, state.key.as_deref(), &words, fault).into());
                    };
                    next = Next::Poll;
                    if plan.reconnect {
                        self.reconnect_before_retry(tool)?;
                    }
                    // A stop during the wait leaves the task alive on the server: it is cancelled.
                    if let Err(end) = self.core.pause(&state, WaitReason::Poll, plan.delay_ms, decision.hint_ms, true, limit).await {
                        self.cancel_task(tool, &task_id, limit, true).await;
                        return Err(end.into());
                    }
                }
                Action::CheckStatus => next = Next::CheckStatus,
                Action::Replan(message) => return Ok(ToolAnswer::Replan(message)),
                Action::Succeed(note) => return Ok(ToolAnswer::Done { result: attempted.result, note }),
                Action::Escalate(escalation) => return Err(CallError::Escalated(escalation)),
            }
        }
    }
}

impl From<CallEnd> for CallError {
    fn from(end: CallEnd) -> Self {
        match end {
            CallEnd::Escalated(escalation) => CallError::Escalated(escalation),
            CallEnd::Stopped(stopped) if stopped.cause == StopCause::Cancelled => CallError::Cancelled(stopped),
            CallEnd::Stopped(stopped) => CallError::TimedOut(stopped),
            CallEnd::Run(error) => CallError::Run(error),
            // A pseudo-call's replan: the session cannot be set up now (a tool call's is its answer).
            CallEnd::Replanned(message) => CallError::SessionLost(message),
        }
    }
}

impl SharedConnection {
    /// A caller for one run over this connection: [`RetryingToolCaller::for_run`].
    pub async fn caller_for_run(
        self: &Arc<Self>,
        instance: PolicyInstance,
        config_json: &str,
        run_id: &str,
        options: RetryingToolCallerOptions,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<RetryingToolCaller> {
        RetryingToolCaller::for_run(self, instance, config_json, run_id, options, metrics).await
    }
}

/// Whether a key found in a call's arguments can be told to the policy as the
/// call's key: a non-empty string within the contract's limit on ids.
fn given_key_fits(key: &str) -> bool {
    !key.is_empty() && key.len() <= crate::limits::MAX_ID_BYTES
}

/// What the wrapper does next in a call.
#[derive(Clone, Copy)]
enum Next {
    Send,
    /// Poll the call's task (`tasks/get`).
    Poll,
    CheckStatus,
}

/// A continuation nobody answered, as the failure the policy reads: the
/// server's questions as the body.
fn input_required(questions: String, session_id_sent: bool) -> Outcome {
    Outcome::Failure(Observation {
        kind: FailureKind::InputRequired,
        headers: String::new(),
        body: questions,
        structured_content: None,
        session_id_sent,
        delivery: Delivery::AnswerStarted,
    })
}

/// A failed `tasks/*` request, reported as the poll's failure (never as the
/// attempt's: the tool was not called again).
fn as_poll_failure(outcome: Outcome) -> Outcome {
    match outcome {
        Outcome::Failure(observation) => Outcome::PollFailure(observation),
        other => other,
    }
}

/// A `tasks/get` answer the wrapper cannot use (not a task, or a status it
/// does not know), reported once as the poll's failure: `protocol-error
/// (-32603)` with the answer as its body, as every host reports it. The body
/// is the answer as rmcp read it (the component cuts it to the body limit).
fn unusable_answer(answer: &impl serde::Serialize, session_id_sent: bool) -> Outcome {
    Outcome::PollFailure(Observation {
        kind: FailureKind::ProtocolError(-32603),
        headers: String::new(),
        body: serde_json::to_string(answer).unwrap_or_default(),
        structured_content: None,
        session_id_sent,
        delivery: Delivery::AnswerStarted,
    })
}

/// Sends `tasks/get` and hands back the answer whatever rmcp read it as
/// (its `get_task` turns an answer that is not a task into a bare
/// `UnexpectedResponse`, losing it). Dropped unanswered, it sends
/// `notifications/cancelled` for the request.
async fn get_task(peer: &Peer<RoleClient>, task_id: &str) -> Result<ServerResult, ServiceError> {
    let request = ClientRequest::GetTaskRequest(GetTaskRequest::new(GetTaskParams::new(task_id)));
    let handle = peer.send_request_with_option(request, PeerRequestOptions::no_options()).await?;
    let mut unanswered = CancelOnDrop { peer: Some(peer.clone()), request_id: handle.id.clone() };
    let answered = handle.await_response().await;
    unanswered.peer = None;
    answered
}

/// Sends `notifications/cancelled` for a request dropped before its answer
/// (rmcp's `call_tool` does the same), unless `peer` was taken.
struct CancelOnDrop {
    peer: Option<Peer<RoleClient>>,
    request_id: rmcp::model::RequestId,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(peer) = self.peer.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let params = CancelledNotificationParam::new(Some(self.request_id.clone()), Some("the caller stopped waiting".into()));
            runtime.spawn(async move {
                let _ = peer.notify_cancelled(params).await;
            });
        }
    }
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
