//! The run-time guard (issue 24): the few invariants no policy may break,
//! enforced by the wrapper from what it already knows. The component decides;
//! this only refuses a verdict that breaks one of them, so a policy that passed
//! the update gate and then lies cannot repeat a 403, resend an unkeyed write
//! of unknown outcome, change a key, wait past the caps or spend past the
//! budgets. Pure and I/O-free; its specification is `tests/vectors/guard/`.
//!
//! The caps come from the configuration text the host holds, read by the
//! host's own JSON parser: never from the component's `effective-config`.

use std::fmt;

use serde_json::{Map, Value};

use crate::component::Outcome;
use crate::component::types::{Action, ActionKind, Decision, Delivery, Effect, FailureKind, StatusCheckResult, TaskStatus, ToolHints, TransportError, Verdict};
use crate::config_defaults as defaults;
use crate::labels;

/// What no policy may do, whatever it answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invariant {
    ClientErrorRepeated,
    UnknownWriteResent,
    KeyChanged,
    DelayOverCap,
    AttemptsOverBudget,
    VerdictDisagrees,
    TaskResent,
}

impl Invariant {
    /// The kebab-case name of the vectors and the logs.
    pub fn name(self) -> &'static str {
        match self {
            Invariant::ClientErrorRepeated => "client-error-repeated",
            Invariant::UnknownWriteResent => "unknown-write-resent",
            Invariant::KeyChanged => "key-changed",
            Invariant::DelayOverCap => "delay-over-cap",
            Invariant::AttemptsOverBudget => "attempts-over-budget",
            Invariant::VerdictDisagrees => "verdict-disagrees",
            Invariant::TaskResent => "task-resent",
        }
    }
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A broken invariant, with one short sentence carrying the numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub invariant: Invariant,
    pub detail: String,
}

impl fmt::Display for Violation {
    /// The policy-failure cause: `invariant <name>: <detail>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invariant {}: {}", self.invariant, self.detail)
    }
}

fn violation(invariant: Invariant, detail: String) -> Result<(), Violation> {
    Err(Violation { invariant, detail })
}

/// A call of the run: the index of its `begin`, from 0.
pub type CallIndex = usize;

/// What the guard reads of a verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asked {
    pub action: ActionKind,
    pub delay_ms: u64,
    pub hint_ms: Option<u64>,
    pub reconnect: bool,
    /// The wrapper cancels the call's task before it acts.
    pub cancel_task: bool,
}

impl From<&Verdict> for Asked {
    fn from(verdict: &Verdict) -> Self {
        Asked { action: verdict.action, delay_ms: verdict.delay_ms, hint_ms: verdict.hint_ms, reconnect: verdict.reconnect, cancel_task: verdict.cancel_task }
    }
}

/// What the guard reads of `last-decision`'s words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Said {
    pub action: ActionKind,
    pub delay_ms: u64,
    pub reconnect: bool,
    pub idempotency_key: Option<String>,
}

impl From<&Decision> for Said {
    fn from(decision: &Decision) -> Self {
        let (action, delay_ms, reconnect, idempotency_key) = match &decision.action {
            Action::Retry(plan) => (ActionKind::Retry, plan.delay_ms, plan.reconnect, plan.idempotency_key.clone()),
            Action::Poll(plan) => (ActionKind::Poll, plan.delay_ms, plan.reconnect, None),
            Action::Replan(_) => (ActionKind::Replan, 0, false, None),
            Action::CheckStatus => (ActionKind::CheckStatus, 0, false, None),
            Action::Succeed(_) => (ActionKind::Succeed, 0, false, None),
            Action::Escalate(_) => (ActionKind::Escalate, 0, false, None),
        };
        Said { action, delay_ms, reconnect, idempotency_key }
    }
}

/// The facts of an attempt the guard keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub http_status: Option<u16>,
    pub json_rpc_code: Option<i32>,
    /// An HTTP status, a JSON-RPC error or a tool result came back.
    pub answered: bool,
    pub delivery: Delivery,
    pub transport: Option<TransportError>,
    pub session_id_sent: bool,
    /// The answer's headers carry the server's own word on retrying
    /// ([`speaks_of_retrying`]): a 4xx that is the component's to read.
    pub retry_signal: bool,
    /// The outcome is a task the server made of the call: whether it lives
    /// (any status but `cancelled`).
    pub task_live: Option<bool>,
}

/// Headers in which a server speaks about retrying its own 4xx (any value).
const RETRY_SPEAKING_HEADERS: [&str; 3] = ["x-envoy-overloaded", "grpc-status", "x-amzn-errortype"];

/// Whether headers (`name: value` lines) carry a server's own word on
/// retrying: `x-should-retry: true`, `x-envoy-overloaded`, `grpc-status` or
/// `x-amzn-errortype` (names and the `true` compared case-insensitively).
pub fn speaks_of_retrying(headers: &str) -> bool {
    headers.lines().any(|line| {
        let (name, value) = line.split_once(':').unwrap_or((line, ""));
        let name = name.trim().to_ascii_lowercase();
        RETRY_SPEAKING_HEADERS.contains(&name.as_str()) || (name == "x-should-retry" && value.trim().eq_ignore_ascii_case("true"))
    })
}

impl Seen {
    /// An answer with nothing the guard reads in it (a tool result).
    pub const ANSWERED: Seen = Seen {
        http_status: None,
        json_rpc_code: None,
        answered: true,
        delivery: Delivery::AnswerStarted,
        transport: None,
        session_id_sent: false,
        retry_signal: false,
        task_live: None,
    };

    /// The facts of an outcome as the host observed it.
    pub fn of(outcome: &Outcome) -> Seen {
        let answered = Seen::ANSWERED;
        match outcome {
            Outcome::Task(report) => Seen { task_live: Some(report.status != TaskStatus::Cancelled), ..answered },
            Outcome::Failure(o) | Outcome::PollFailure(o) => {
                let seen = Seen { delivery: o.delivery, session_id_sent: o.session_id_sent, retry_signal: speaks_of_retrying(&o.headers), ..answered };
                match o.kind {
                    FailureKind::HttpStatus(status) => Seen { http_status: Some(status), ..seen },
                    FailureKind::ProtocolError(code) => Seen { json_rpc_code: Some(code), ..seen },
                    FailureKind::Transport(error) => Seen { answered: false, transport: Some(error), ..seen },
                    FailureKind::ToolError(_) | FailureKind::InputRequired => seen,
                }
            }
            Outcome::Success | Outcome::EmptyResult(_) | Outcome::StatusCheck(_) => answered,
        }
    }

    /// The request may have run and nothing says whether it did.
    fn outcome_unknown(&self) -> bool {
        !self.answered && self.delivery != Delivery::NotSent && self.transport != Some(TransportError::ConnectionRefused)
    }
}

/// What a poll of the call's task showed: a status (the task lives unless
/// `cancelled`), the task's end with its result or its error (the call's
/// last facts), or a poll that itself failed (the task still lives).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Polled {
    Task { live: bool },
    Ended(Seen),
    PollFailed,
}

impl Polled {
    /// What the outcome of a poll (`tasks/get`) says of the task.
    pub fn of(outcome: &Outcome) -> Polled {
        match outcome {
            Outcome::Task(report) => Polled::Task { live: report.status != TaskStatus::Cancelled },
            Outcome::PollFailure(_) | Outcome::StatusCheck(_) => Polled::PollFailed,
            Outcome::Success | Outcome::EmptyResult(_) | Outcome::Failure(_) => Polled::Ended(Seen::of(outcome)),
        }
    }
}

/// The client errors after which a new session (`reconnect`) is a different
/// request: the statuses that refuse a session or a protocol revision.
const RECONNECT_STATUSES: [u16; 2] = [400, 404];
/// Client errors a policy may not repeat as they were.
const CLIENT_ERROR_STATUSES: [u16; 6] = [400, 401, 403, 404, 409, 422];
const CLIENT_ERROR_CODES: [i32; 3] = [-32600, -32601, -32602];

/// The caps and effects the guard reads from the configuration text.
#[derive(Clone, Debug)]
struct Caps {
    max_delay_ms: u64,
    max_hint_ms: u64,
    /// `hint-cap-over-backoff-ms`: with it a hinted wait is at most `max_delay_ms` plus it (0: none).
    hint_cap_ms: u64,
    max_attempts_per_call: u64,
    max_retries_per_run: u64,
    max_steps_per_run: u64,
    task_poll_max_delay_ms: u64,
    max_polls_per_task: u64,
    /// `account-budget.max-wait-ms`; 0 without an account budget.
    account_wait_ms: u64,
    default_effect: Effect,
    tools: Map<String, Value>,
    /// Statuses `status-overrides` makes `transient` or `throttled`.
    retryable_statuses: Vec<u16>,
}

fn number(config: &Value, name: &str, default: u64) -> u64 {
    config.get(name).and_then(Value::as_u64).unwrap_or(default)
}

/// A top-level field the configuration gives, else its preset's (the guest's
/// `Preset::fields`, mirrored), else the default.
fn field(config: &Value, name: &str, default: u64) -> u64 {
    let preset = match (config.get("preset").and_then(Value::as_str), name) {
        (Some("aws-2026"), "max-delay-ms") => Some(defaults::AWS_2026_MAX_DELAY_MS),
        (Some("aws-2026"), "max-attempts-per-call") => Some(defaults::AWS_2026_MAX_ATTEMPTS_PER_CALL),
        (Some("aws-2026"), "hint-cap-over-backoff-ms") => Some(defaults::AWS_2026_HINT_CAP_OVER_BACKOFF_MS),
        _ => None,
    };
    number(config, name, preset.unwrap_or(default))
}

fn effect(value: Option<&Value>) -> Option<Effect> {
    match value.and_then(Value::as_str) {
        Some("read") => Some(Effect::Read),
        Some("write") => Some(Effect::Write),
        Some("delete") => Some(Effect::Delete),
        _ => None,
    }
}

impl Caps {
    fn of(config: &Value) -> Caps {
        let account_wait_ms = match config.get("account-budget") {
            None | Some(Value::Null) => 0,
            Some(account) => number(account, "max-wait-ms", defaults::MAX_WAIT_MS),
        };
        let retryable_statuses = config
            .get("status-overrides")
            .and_then(Value::as_object)
            .map(|o| o.iter().filter(|(_, class)| matches!(class.as_str(), Some("transient" | "throttled"))).filter_map(|(s, _)| s.parse().ok()).collect())
            .unwrap_or_default();
        let default_effect = effect(Some(&Value::from(defaults::DEFAULT_EFFECT))).unwrap_or(Effect::Write);
        Caps {
            max_delay_ms: field(config, "max-delay-ms", defaults::MAX_DELAY_MS),
            max_hint_ms: number(config, "max-hint-ms", defaults::MAX_HINT_MS),
            hint_cap_ms: field(config, "hint-cap-over-backoff-ms", defaults::HINT_CAP_OVER_BACKOFF_MS),
            max_attempts_per_call: field(config, "max-attempts-per-call", defaults::MAX_ATTEMPTS_PER_CALL),
            max_retries_per_run: number(config, "max-retries-per-run", defaults::MAX_RETRIES_PER_RUN),
            max_steps_per_run: number(config, "max-steps-per-run", defaults::MAX_STEPS_PER_RUN),
            task_poll_max_delay_ms: number(config, "task-poll-max-delay-ms", defaults::TASK_POLL_MAX_DELAY_MS),
            max_polls_per_task: number(config, "max-polls-per-task", defaults::MAX_POLLS_PER_TASK),
            account_wait_ms,
            default_effect: effect(config.get("default-effect")).unwrap_or(default_effect),
            tools: config.get("tools").and_then(Value::as_object).cloned().unwrap_or_default(),
            retryable_statuses,
        }
    }

    /// Whether a call of `tool` is an unkeyed write, from the configuration
    /// and the tool's MCP hints (the guest's `tool_policy`).
    fn unkeyed_write(&self, tool: &str, key: Option<&str>, hints: Option<&ToolHints>) -> bool {
        let flag = |entry: &Value, name: &str| entry.get(name).and_then(Value::as_bool);
        let (effect_of, idempotent) = match self.tools.get(tool) {
            Some(entry) if entry.get("effect").is_some() => {
                (effect(entry.get("effect")).unwrap_or(self.default_effect), flag(entry, "idempotent") == Some(true))
            }
            Some(entry) if ["readOnlyHint", "destructiveHint", "idempotentHint"].iter().any(|h| entry.get(h).is_some()) => {
                if flag(entry, "readOnlyHint") == Some(true) { (Effect::Read, true) } else { (Effect::Write, flag(entry, "idempotentHint") == Some(true)) }
            }
            _ => match hints {
                Some(hints) if hints.read_only == Some(true) => (Effect::Read, true),
                Some(hints) => (if self.default_effect == Effect::Read { Effect::Write } else { self.default_effect }, hints.idempotent == Some(true)),
                None => (self.default_effect, false),
            },
        };
        effect_of == Effect::Write && !idempotent && key.is_none()
    }

    fn client_error(&self, seen: &Seen) -> Option<String> {
        if let Some(status) = seen.http_status {
            // The server's own word on retrying its 4xx is the component's to read.
            return (CLIENT_ERROR_STATUSES.contains(&status) && !self.retryable_statuses.contains(&status) && !seen.retry_signal)
                .then(|| format!("a {status} answer"));
        }
        seen.json_rpc_code.filter(|c| CLIENT_ERROR_CODES.contains(c)).map(|code| format!("a JSON-RPC {code} error"))
    }
}

/// One call's facts, as the guard saw them.
#[derive(Clone, Debug)]
pub struct CallGuard {
    tool: String,
    key: Option<String>,
    unkeyed_write: bool,
    /// Attempts sent, counted here (never taken from a verdict).
    attempts: u64,
    last: Option<Seen>,
    /// An unkeyed write whose outcome is unknown, and no status check said `absent`.
    maybe_applied: bool,
    /// An unkeyed write the server made a task of: unknown until the task
    /// ends with its result or error (a cancelled task leaves it unknown), or
    /// a status check says `absent`.
    task_maybe_applied: bool,
    /// A status check found the write applied.
    found: bool,
    /// The call's task lives: a status other than `cancelled` was seen, and
    /// since then no end, no `cancelled` status, no verdict that cancels it.
    task_lives: bool,
    /// Polls of the call's current task the verdicts planned.
    polls: u64,
    /// Retries on a new connection after a client error sent without a session id.
    blind_reconnects: u32,
    verdict: Option<Asked>,
}

/// One run's guard: the caps, the run's counts, and each call's facts. The
/// first violation stays: the wrapper sends nothing more in the run.
#[derive(Clone, Debug)]
pub struct RunGuard {
    caps: Caps,
    steps: u64,
    retries: u64,
    calls: Vec<CallGuard>,
    tripped: Option<Violation>,
}

impl RunGuard {
    /// A guard for a run under this configuration text; a text that is not
    /// JSON (which the policy refuses anyway) takes every default.
    pub fn from_config_text(config_json: &str) -> RunGuard {
        RunGuard::from_config(&serde_json::from_str(config_json).unwrap_or(Value::Null))
    }

    /// A guard for a run under this configuration.
    pub fn from_config(config: &Value) -> RunGuard {
        RunGuard { caps: Caps::of(config), steps: 0, retries: 0, calls: Vec::new(), tripped: None }
    }

    /// A cap by its configuration name, as this guard read it (the vectors'
    /// `{"$config": field}` matcher); `retry-wait-cap-ms` is the longest wait
    /// of a retry without a hint: `max-delay-ms` or the account's
    /// `max-wait-ms`. None for a name it does not read.
    pub fn cap(&self, field: &str) -> Option<u64> {
        let caps = &self.caps;
        Some(match field {
            "max-delay-ms" => caps.max_delay_ms,
            "max-hint-ms" => caps.max_hint_ms,
            "max-attempts-per-call" => caps.max_attempts_per_call,
            "max-retries-per-run" => caps.max_retries_per_run,
            "max-steps-per-run" => caps.max_steps_per_run,
            "task-poll-max-delay-ms" => caps.task_poll_max_delay_ms,
            "max-polls-per-task" => caps.max_polls_per_task,
            "retry-wait-cap-ms" => caps.max_delay_ms.max(caps.account_wait_ms),
            _ => return None,
        })
    }

    /// The fields [`RunGuard::cap`] reads.
    pub const CAP_FIELDS: [&'static str; 8] = [
        "max-delay-ms",
        "max-hint-ms",
        "max-attempts-per-call",
        "max-retries-per-run",
        "max-steps-per-run",
        "task-poll-max-delay-ms",
        "max-polls-per-task",
        "retry-wait-cap-ms",
    ];

    /// The first violation of the run, if there was one.
    pub fn tripped(&self) -> Option<&Violation> {
        self.tripped.as_ref()
    }

    fn keep(&mut self, checked: Result<(), Violation>) -> Result<(), Violation> {
        if let Err(violation) = &checked
            && self.tripped.is_none()
        {
            self.tripped = Some(violation.clone());
        }
        checked
    }

    /// The policy admitted a call whose first send waits `start_delay_ms`.
    pub fn begin(&mut self, tool: &str, key: Option<&str>, hints: Option<&ToolHints>, start_delay_ms: u64) -> Result<CallIndex, Violation> {
        let unkeyed_write = self.caps.unkeyed_write(tool, key, hints);
        self.calls.push(CallGuard {
            tool: tool.to_string(),
            key: key.map(String::from),
            unkeyed_write,
            attempts: 0,
            last: None,
            maybe_applied: false,
            task_maybe_applied: false,
            found: false,
            task_lives: false,
            polls: 0,
            blind_reconnects: 0,
            verdict: None,
        });
        let index = self.calls.len() - 1;
        let cap = self.caps.account_wait_ms;
        let checked = if start_delay_ms > cap {
            violation(Invariant::DelayOverCap, format!("a first send after {start_delay_ms} ms; the account's wait cap is {cap} ms"))
        } else if self.steps >= self.caps.max_steps_per_run {
            let max = self.caps.max_steps_per_run;
            violation(Invariant::AttemptsOverBudget, format!("a call of {tool} admitted after the run's {} steps; max-steps-per-run is {max}", self.steps))
        } else {
            Ok(())
        };
        self.keep(checked).map(|()| index)
    }

    /// An attempt of `call` was sent and `seen` observed: one step.
    pub fn attempted(&mut self, call: CallIndex, seen: Seen) {
        self.steps += 1;
        let Some(guarded) = self.calls.get_mut(call) else { return };
        guarded.attempts += 1;
        if guarded.unkeyed_write && seen.outcome_unknown() {
            guarded.maybe_applied = true;
        }
        if let Some(live) = seen.task_live {
            // A new task of the call: its own polls; for an unkeyed write,
            // applied or not once it ends.
            guarded.polls = 0;
            guarded.task_lives = live;
            guarded.task_maybe_applied |= guarded.unkeyed_write;
        }
        guarded.last = Some(seen);
    }

    /// A poll of `call`'s task answered (or failed): not a step, not an attempt.
    pub fn polled(&mut self, call: CallIndex, polled: Polled) {
        let Some(guarded) = self.calls.get_mut(call) else { return };
        match polled {
            // A cancelled task leaves an unkeyed write unknown; a live one keeps it so.
            Polled::Task { live } => {
                guarded.task_lives = live;
                guarded.task_maybe_applied |= guarded.unkeyed_write;
            }
            // The poll failed, not the task: it still lives.
            Polled::PollFailed => {}
            // The task ended with its result or its error: the call's last
            // facts; what the task left unknown is known (not what an
            // earlier attempt left unknown).
            Polled::Ended(seen) => {
                guarded.task_lives = false;
                guarded.task_maybe_applied = false;
                guarded.last = Some(seen);
            }
        }
    }

    /// A status check of `call` read the target's state: one step.
    pub fn status_checked(&mut self, call: CallIndex, result: StatusCheckResult) {
        self.steps += 1;
        let Some(guarded) = self.calls.get_mut(call) else { return };
        match result {
            StatusCheckResult::Absent => {
                guarded.maybe_applied = false;
                guarded.task_maybe_applied = false;
            }
            StatusCheckResult::Found => guarded.found = true,
            StatusCheckResult::Unknown => {}
        }
    }

    /// A verdict on `call`, before the wrapper acts on it.
    pub fn verdict(&mut self, call: CallIndex, asked: &Asked) -> Result<(), Violation> {
        if let Some(guarded) = self.calls.get_mut(call)
            && asked.cancel_task
        {
            // The wrapper cancels the task before it acts: it no longer lives.
            guarded.task_lives = false;
        }
        let checked = self.check_verdict(call, asked);
        if let Some(guarded) = self.calls.get_mut(call) {
            guarded.verdict = Some(*asked);
        }
        if checked.is_ok() && asked.action == ActionKind::Retry {
            self.retries += 1;
        }
        self.keep(checked)
    }

    fn check_verdict(&mut self, call: CallIndex, asked: &Asked) -> Result<(), Violation> {
        let caps = &self.caps;
        let (steps, retries) = (self.steps, self.retries);
        let Some(guarded) = self.calls.get_mut(call) else {
            return violation(Invariant::VerdictDisagrees, format!("a verdict on call {call}, which was never begun"));
        };
        let tool = &guarded.tool;
        match asked.action {
            ActionKind::Retry => {
                if guarded.task_lives {
                    let detail = format!("the policy asked to call {tool} again (attempt {}) while its task lives", guarded.attempts + 1);
                    return violation(Invariant::TaskResent, detail);
                }
                if let Some(what) = guarded.last.as_ref().and_then(|seen| caps.client_error(seen)) {
                    let with_session = guarded.last.is_some_and(|seen| seen.session_id_sent);
                    if !asked.reconnect {
                        return violation(Invariant::ClientErrorRepeated, format!("the policy asked to retry {what} of {tool} as it was"));
                    }
                    if !guarded.last.and_then(|seen| seen.http_status).is_some_and(|s| RECONNECT_STATUSES.contains(&s)) {
                        let detail = format!("the policy asked to retry {what} of {tool} on a new session, which a session does not cause");
                        return violation(Invariant::ClientErrorRepeated, detail);
                    }
                    if !with_session {
                        if guarded.blind_reconnects > 0 {
                            let detail = format!("the policy asked to retry {what} of {tool} on a new connection again, and the request carried no session id");
                            return violation(Invariant::ClientErrorRepeated, detail);
                        }
                        guarded.blind_reconnects += 1;
                    }
                }
                if guarded.found {
                    return violation(Invariant::UnknownWriteResent, format!("the policy asked to resend {tool}, which a status check found applied"));
                }
                if guarded.maybe_applied {
                    let detail = format!("the policy asked to resend {tool}, an unkeyed write whose outcome is unknown, without a status check saying absent");
                    return violation(Invariant::UnknownWriteResent, detail);
                }
                if guarded.task_maybe_applied {
                    let detail = format!(
                        "the policy asked to resend {tool}, an unkeyed write whose task did not end with a result or an error, without a status check saying absent"
                    );
                    return violation(Invariant::UnknownWriteResent, detail);
                }
                if guarded.attempts + 1 > caps.max_attempts_per_call {
                    let detail = format!("attempt {} of {tool}; max-attempts-per-call is {}", guarded.attempts + 1, caps.max_attempts_per_call);
                    return violation(Invariant::AttemptsOverBudget, detail);
                }
                if steps + 1 > caps.max_steps_per_run {
                    return violation(Invariant::AttemptsOverBudget, format!("step {} of the run; max-steps-per-run is {}", steps + 1, caps.max_steps_per_run));
                }
                if retries + 1 > caps.max_retries_per_run {
                    let detail = format!("retry {} of the run; max-retries-per-run is {}", retries + 1, caps.max_retries_per_run);
                    return violation(Invariant::AttemptsOverBudget, detail);
                }
                // A hint is waited up to max-hint-ms, or with a hint cap up to the backoff's cap plus it.
                let hinted = match caps.hint_cap_ms {
                    0 => caps.max_hint_ms,
                    cap => caps.max_delay_ms.saturating_add(cap),
                };
                let cap = caps.max_delay_ms.max(asked.hint_ms.map_or(0, |_| hinted)).max(caps.account_wait_ms);
                if asked.delay_ms > cap {
                    return violation(Invariant::DelayOverCap, format!("a retry of {tool} after {} ms; the cap is {cap} ms", asked.delay_ms));
                }
            }
            ActionKind::Poll => {
                guarded.polls += 1;
                if guarded.polls > caps.max_polls_per_task {
                    let detail = format!("poll {} of {tool}'s task; max-polls-per-task is {}", guarded.polls, caps.max_polls_per_task);
                    return violation(Invariant::AttemptsOverBudget, detail);
                }
                let cap = caps.task_poll_max_delay_ms.max(caps.max_hint_ms);
                if asked.delay_ms > cap {
                    return violation(Invariant::DelayOverCap, format!("a poll of {tool}'s task after {} ms; the cap is {cap} ms", asked.delay_ms));
                }
            }
            ActionKind::CheckStatus if steps + 1 > caps.max_steps_per_run => {
                return violation(
                    Invariant::AttemptsOverBudget,
                    format!("a status check at step {} of the run; max-steps-per-run is {}", steps + 1, caps.max_steps_per_run),
                );
            }
            ActionKind::CheckStatus | ActionKind::Succeed | ActionKind::Replan | ActionKind::Escalate => {}
        }
        Ok(())
    }

    /// `last-decision`'s words on `call`, when the wrapper reads them: they
    /// must say what the verdict said, with the call's own key.
    pub fn decision(&mut self, call: CallIndex, said: &Said) -> Result<(), Violation> {
        let checked = self.check_decision(call, said);
        self.keep(checked)
    }

    fn check_decision(&self, call: CallIndex, said: &Said) -> Result<(), Violation> {
        let Some(guarded) = self.calls.get(call) else {
            return violation(Invariant::VerdictDisagrees, format!("words on call {call}, which was never begun"));
        };
        let Some(asked) = guarded.verdict else {
            return violation(Invariant::VerdictDisagrees, format!("last-decision on {} before any verdict", guarded.tool));
        };
        if said.action != asked.action {
            let detail = format!("last-decision says {} where the verdict said {}", labels::action(said.action), labels::action(asked.action));
            return violation(Invariant::VerdictDisagrees, detail);
        }
        if matches!(asked.action, ActionKind::Retry | ActionKind::Poll) && (said.delay_ms != asked.delay_ms || said.reconnect != asked.reconnect) {
            let detail = format!(
                "last-decision says {} after {} ms (reconnect {}) where the verdict said {} ms (reconnect {})",
                labels::action(said.action),
                said.delay_ms,
                said.reconnect,
                asked.delay_ms,
                asked.reconnect
            );
            return violation(Invariant::VerdictDisagrees, detail);
        }
        if asked.action == ActionKind::Retry && said.idempotency_key != guarded.key {
            let detail = format!("the retry plan of {} names the key {:?}; the call's key is {:?}", guarded.tool, said.idempotency_key, guarded.key);
            return violation(Invariant::KeyChanged, detail);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
