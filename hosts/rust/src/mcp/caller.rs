//! The wrapper around an MCP client: every tool call goes through the policy.
//!
//! For each call it derives the idempotency key once, asks `begin-call`, makes
//! the call, turns what happened into an `outcome`, asks `record-outcome`, and
//! does what the decision says: sleep and retry with the same key, run the
//! status check, hand the model a short message, or stop with the escalation
//! note. The model sees only the final answer. Every attempt is one JSON log line.

use std::collections::HashMap;
use std::sync::Arc;

use crate::fault::PolicyFault;
use futures::future::BoxFuture;
use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, CallToolResult, Tool};
use rmcp::service::Peer;
use serde_json::{Map, Value};

use super::clock::Clock;
use super::metrics::Metrics;
use super::observe;
use crate::component::types::{
    Action, Admission, CallRequest, Decision, Escalation, EscalationReason, FailureKind, Outcome, RunError, RunReport, StatusCheckResult, ToolHints,
};
use crate::component::{PolicyHandle, PolicyInstance, RunHandle};
use crate::labels;

/// Reads state to learn whether an ambiguous write was applied: given the
/// client and the call's arguments, answers found / absent / unknown.
pub type StatusCheck = Box<dyn Fn(Peer<RoleClient>, Map<String, Value>) -> BoxFuture<'static, StatusCheckResult> + Send + Sync>;

/// What the model gets back from a call.
#[derive(Debug)]
pub enum ToolAnswer {
    /// The call succeeded. `result` is `None` when a status check, not the call,
    /// showed it done; `note` says so ("already applied", "already deleted").
    Done { result: Option<CallToolResult>, note: Option<String> },
    /// The model can fix the call: show it this message as the tool's error.
    Replan(String),
}

/// Why a call did not give the model an answer: the run stops.
#[derive(Debug)]
pub enum CallError {
    /// The policy escalated: hand `note` to a person.
    Escalated(Escalation),
    /// The policy component failed (a trap, fuel or memory, a broken contract);
    /// nothing is retried and the run is escalated.
    Policy(PolicyFault),
    /// The host used the run wrongly (a bug in the host).
    Run(RunError),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Escalated(e) => write!(f, "escalated: {}", e.note),
            CallError::Policy(e) => write!(f, "the policy component failed: {e}"),
            CallError::Run(e) => write!(f, "run error: {e:?}"),
        }
    }
}

impl std::error::Error for CallError {}

/// How the wrapper behaves: the same options and defaults as the Python
/// (`attempt_timeout_s`, `key_argument`) and Node (`attemptTimeoutMs`,
/// `keyArgument`) wrappers.
#[derive(Clone, Debug)]
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
}

impl Default for RetryingToolCallerOptions {
    fn default() -> Self {
        RetryingToolCallerOptions { attempt_timeout_ms: 30_000, key_argument: "idempotency_key".into(), clock: Clock::real(), policy_identity: None }
    }
}

/// One log line: event, run, policy, step, call, tool, attempt, key, outcome,
/// class, rule, action, delay_ms, hint_ms, escalation, reason (hosts/README.md).
struct AttemptLine<'a> {
    step: u32,
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
    peer: Peer<RoleClient>,
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
        Outcome::Failure(f) => match &f.kind {
            FailureKind::HttpStatus(s) => s.to_string(),
            FailureKind::Transport(e) => labels::transport(*e).to_string(),
            FailureKind::ProtocolError(c) => format!("json-rpc {c}"),
            FailureKind::ToolError(Some(s)) => format!("is-error {s}"),
            FailureKind::ToolError(None) => "is-error".into(),
        },
    }
}

fn action_label(action: &Action) -> &'static str {
    match action {
        Action::Retry(_) => "retry",
        Action::Replan(_) => "replan",
        Action::CheckStatus => "check-status",
        Action::Succeed(_) => "succeed",
        Action::Escalate(_) => "escalate",
    }
}

impl RetryingToolCaller {
    /// Starts a run: loads the configuration into a fresh policy and lists the
    /// server's tools (their annotations and whether they take a key).
    pub async fn start(
        peer: Peer<RoleClient>,
        mut instance: PolicyInstance,
        config_json: &str,
        run_id: &str,
        options: RetryingToolCallerOptions,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let policy = instance.load_policy(config_json)?.map_err(|e| anyhow::anyhow!("policy configuration: {}: {}", e.field, e.message))?;
        let run = instance.start_run(&policy, run_id)?.map_err(|e| anyhow::anyhow!("run id: {e:?}"))?;
        let tools = peer.list_all_tools().await?.iter().map(|tool| (tool.name.to_string(), tool_info(tool, &options.key_argument))).collect();
        Ok(RetryingToolCaller {
            peer,
            instance,
            policy,
            run,
            run_id: run_id.to_string(),
            tools,
            status_checks: HashMap::new(),
            options,
            metrics,
            steps: 0,
            previous_call: None,
        })
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

    /// Ends the run and frees it in the component.
    pub fn finish(mut self) -> Result<RunReport, CallError> {
        let report = self.report()?;
        self.instance.drop_run(self.run).map_err(policy_error)?;
        self.instance.drop_policy(self.policy).map_err(policy_error)?;
        Ok(report)
    }

    async fn attempt(&self, tool: &str, arguments: &Map<String, Value>) -> (Outcome, Option<CallToolResult>) {
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments.clone());
        let timeout = self.options.clock.real_duration(self.options.attempt_timeout_ms);
        match tokio::time::timeout(timeout, self.peer.call_tool(params)).await {
            Err(_elapsed) => (observe::timeout(), None),
            Ok(Ok(result)) => (observe::from_result(&result), Some(result)),
            Ok(Err(error)) => (observe::from_error(&error), None),
        }
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

    /// The attempt line of a decision (see [`AttemptLine`]).
    fn log(&self, step: u32, call_id: u32, tool: &str, key: Option<&str>, outcome: &Outcome, decision: &Decision) {
        let delay_ms = match &decision.action {
            Action::Retry(plan) => Some(plan.delay_ms),
            _ => None,
        };
        let escalation = match &decision.action {
            Action::Escalate(e) => Some(labels::reason(e.reason)),
            _ => None,
        };
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
            reason: &decision.reason,
        });
        let status = outcome_label(outcome);
        let attempted = !matches!(outcome, Outcome::StatusCheck(_));
        self.metrics.update(|c| {
            if attempted {
                c.attempts += 1;
                *c.by_status.entry(status).or_default() += 1;
            }
            *c.by_action.entry(action_label(&decision.action).to_string()).or_default() += 1;
            if let Some(delay) = delay_ms {
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
    fn escalated_before_send(&self, step: u32, tool: &str, key: Option<&str>, escalation: Escalation) -> CallError {
        self.log_line(AttemptLine {
            step,
            call: None,
            tool,
            attempt: 0,
            key,
            outcome: "not sent",
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

    /// Makes one tool call the model asked for, through the policy.
    pub async fn call(&mut self, tool: &str, mut arguments: Map<String, Value>) -> Result<ToolAnswer, CallError> {
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
            let key = self.instance.derive_idempotency_key(&self.run_id, &format!("step-{step}")).map_err(policy_error)?;
            arguments.insert(self.options.key_argument.clone(), Value::String(key.clone()));
            Some(key)
        } else {
            None
        };
        let request = CallRequest { tool: tool.to_string(), idempotency_key: key.clone(), hints: info.hints };
        let now = self.options.clock.now_ms();
        let ticket = match self.instance.begin_call(&self.run, &request, now).map_err(policy_error)?.map_err(CallError::Run)? {
            Admission::Send(ticket) => ticket,
            Admission::Escalate(escalation) => return Err(self.escalated_before_send(step, tool, key.as_deref(), escalation)),
        };
        self.options.clock.sleep(ticket.delay_ms).await;
        let (mut outcome, mut result) = self.attempt(tool, &arguments).await;
        // The attempt each outcome reports: 1, then each retry plan's.
        let mut attempt = 1;
        loop {
            let now = self.options.clock.now_ms();
            let decision =
                self.instance.record_outcome(&self.run, ticket.call_id, attempt, &outcome, now, None).map_err(policy_error)?.map_err(CallError::Run)?;
            self.log(step, ticket.call_id, tool, key.as_deref(), &outcome, &decision);
            match decision.action {
                Action::Retry(plan) => {
                    attempt = plan.attempt;
                    self.options.clock.sleep(plan.delay_ms).await;
                    (outcome, result) = self.attempt(tool, &arguments).await;
                }
                Action::CheckStatus => {
                    let found = match self.status_checks.get(tool) {
                        Some(check) => check(self.peer.clone(), arguments.clone()).await,
                        None => StatusCheckResult::Unknown,
                    };
                    outcome = Outcome::StatusCheck(found);
                    result = None;
                }
                Action::Replan(message) => return Ok(ToolAnswer::Replan(message)),
                Action::Succeed(note) => return Ok(ToolAnswer::Done { result, note }),
                Action::Escalate(escalation) => return Err(CallError::Escalated(escalation)),
            }
        }
    }
}
