//! The core's mirror of `wit/types.wit`. The terms (call, attempt, retry, replan,
//! run, step, escalate) are defined there, once.
//!
//! The serde form of each type is the vectors' canonical JSON (see
//! `tests/vectors/README.md`): kebab-case names, a variant case without payload as
//! `"case"`, a case with payload as `{"case": payload}`, options as `null` or the value.

use alloc::string::String;
use alloc::vec::Vec;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TransportError {
    Timeout,
    ConnectionReset,
    ConnectionRefused,
    StreamClosed,
    Tls,
    NameResolution,
    Other,
}

/// How far a failed request got (`delivery` in the WIT).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Delivery {
    #[default]
    Unknown,
    NotSent,
    Sent,
    AnswerStarted,
}

/// What a negotiating client makes of a non-discovery answer to `server/discover`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProbeAnswer {
    OlderServer,
    Failure,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureKind {
    HttpStatus(u16),
    Transport(TransportError),
    ProtocolError(i32),
    ToolError(Option<u16>),
    InputRequired,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Failure {
    pub kind: FailureKind,
    #[serde(default)]
    pub headers: Vec<(String, String)>,
    #[serde(default)]
    pub body: String,
    #[serde(default)]
    pub structured_content: Option<String>,
    #[serde(default)]
    pub session_id_sent: bool,
    #[serde(default)]
    pub delivery: Delivery,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Success,
    EmptyResult(String),
    Failure(Failure),
    StatusCheck(StatusCheckResult),
    /// What the server said of the call's task (`record-task-status`).
    Task(TaskReport),
    /// A failed poll of the call's task (`record-poll-failure`).
    PollFailure(Failure),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskStatus {
    Working,
    InputAnswered,
    InputRequired,
    Cancelled,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct TaskReport {
    pub task_id: String,
    pub status: TaskStatus,
    #[serde(default)]
    pub poll_interval_ms: Option<u64>,
    #[serde(default)]
    pub ttl_ms: Option<u64>,
    #[serde(default)]
    pub age_ms: Option<u64>,
    #[serde(default)]
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct PollPlan {
    pub delay_ms: u64,
    pub task_id: String,
    pub reconnect: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OutcomeClass {
    Success,
    Transient,
    Throttled,
    Deterministic,
    Permission,
    Semantic,
    Misconfigured,
    NeedsInput,
    Unclassified,
}

impl OutcomeClass {
    pub const fn name(self) -> &'static str {
        match self {
            OutcomeClass::Success => "success",
            OutcomeClass::Transient => "transient",
            OutcomeClass::Throttled => "throttled",
            OutcomeClass::Deterministic => "deterministic",
            OutcomeClass::Permission => "permission",
            OutcomeClass::Semantic => "semantic",
            OutcomeClass::Misconfigured => "misconfigured",
            OutcomeClass::NeedsInput => "needs-input",
            OutcomeClass::Unclassified => "unclassified",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct HeaderProblem {
    pub name: String,
    pub value: String,
    pub problem: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Classification {
    pub class: OutcomeClass,
    pub hint_ms: Option<u64>,
    pub hint_source: Option<String>,
    pub server_says_retry: Option<bool>,
    pub rule: String,
    pub reason: String,
    pub header_problems: Vec<HeaderProblem>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Effect {
    Read,
    Write,
    Delete,
}

impl Effect {
    pub const fn name(self) -> &'static str {
        match self {
            Effect::Read => "read",
            Effect::Write => "write",
            Effect::Delete => "delete",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct ToolHints {
    #[serde(default)]
    pub read_only: Option<bool>,
    #[serde(default)]
    pub destructive: Option<bool>,
    #[serde(default)]
    pub idempotent: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct CallRequest {
    /// The server, for its circuit breakers; none, no breaker applies.
    #[serde(default)]
    pub server: Option<String>,
    pub tool: String,
    #[serde(default)]
    pub idempotency_key: Option<String>,
    #[serde(default)]
    pub hints: Option<ToolHints>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct CallTicket {
    pub call_id: u32,
    pub delay_ms: u64,
    pub effect: Effect,
    pub safe_to_repeat: bool,
    pub idle_timeout_ms: u64,
    pub attempt_timeout_ms: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EscalationReason {
    PermissionDenied,
    ReplansSpent,
    CallAttemptsSpent,
    RunRetriesSpent,
    RunStepsSpent,
    ServerWaitTooLong,
    RetryForbidden,
    AccountBudgetExhausted,
    RetryQuotaExhausted,
    UnclassifiedFailure,
    StatusUnknown,
    ConnectionMisconfigured,
    DeadlineTooNear,
    ProtocolVersionUnsupported,
    InputRequired,
    TaskExpired,
    TaskPollsSpent,
    TaskCancelled,
    CircuitOpen,
    RetryBudgetExhausted,
    Aborted,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EffectStatus {
    Applied,
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct EffectRecord {
    pub call_id: u32,
    pub tool: String,
    pub idempotency_key: Option<String>,
    pub status: EffectStatus,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Escalation {
    pub reason: EscalationReason,
    pub last_error: Option<String>,
    pub resets_in_ms: Option<u64>,
    pub effects: Vec<EffectRecord>,
    pub effects_total: u32,
    pub note: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct RetryPlan {
    pub delay_ms: u64,
    pub attempt: u32,
    pub idempotency_key: Option<String>,
    pub reconnect: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    Retry(RetryPlan),
    Replan(String),
    CheckStatus,
    Succeed(Option<String>),
    Escalate(Escalation),
    Poll(PollPlan),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Decision {
    pub action: Action,
    pub class: OutcomeClass,
    pub attempt: u32,
    pub hint_ms: Option<u64>,
    pub rule: String,
    pub reason: String,
    pub cancel_task: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Admission {
    Send(CallTicket),
    Escalate(Escalation),
    /// Not sent: a breaker is open, and the model is told (the decision's message).
    Replan(Decision),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StatusCheckResult {
    Found,
    Absent,
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct StatusCount {
    pub status: u16,
    pub count: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct RunReport {
    pub run_id: String,
    pub calls: u32,
    pub attempts: u32,
    pub retries: u32,
    pub status_checks: u32,
    pub replans: u32,
    pub tasks: u32,
    pub polls: u32,
    pub succeeded_calls: u32,
    pub abandoned_calls: u32,
    pub waits: u32,
    pub waited_ms: u64,
    pub escalation: Option<EscalationReason>,
    pub statuses: Vec<StatusCount>,
    pub effects: Vec<EffectRecord>,
    pub effects_total: u32,
}

/// Why the host stopped a call before a verdict ended it (`abandon-call`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AbandonReason {
    Cancelled,
    Deadline,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunError {
    UnknownCall(u32),
    CallFinished(u32),
    StatusCheckPending(u32),
    NoStatusCheckPending(u32),
    RunEnded(EscalationReason),
    NoTask(u32),
    AttemptMismatch(AttemptMismatch),
    TooLarge(SizeLimit),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct AttemptMismatch {
    pub call_id: u32,
    pub expected: u32,
    pub reported: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct SizeLimit {
    pub input: String,
    pub size_bytes: u32,
    pub limit_bytes: u32,
}

/// The longest run id, tool name or idempotency key, in bytes.
pub const MAX_ID_BYTES: usize = 256;

/// The longest server a call may name, in bytes (a URL or a command line; the
/// breakers keep a normalised name of at most 256 bytes).
pub const MAX_SERVER_BYTES: usize = 4096;

impl SizeLimit {
    /// `Err(too-large)` if `value` is longer than [`MAX_ID_BYTES`].
    pub fn check(input: &str, value: &str) -> Result<(), RunError> {
        Self::check_within(input, value, MAX_ID_BYTES)
    }

    /// `Err(too-large)` if `value` is longer than `limit_bytes`.
    pub fn check_within(input: &str, value: &str, limit_bytes: usize) -> Result<(), RunError> {
        if value.len() <= limit_bytes {
            return Ok(());
        }
        let size_bytes = u32::try_from(value.len()).unwrap_or(u32::MAX);
        Err(RunError::TooLarge(SizeLimit { input: String::from(input), size_bytes, limit_bytes: limit_bytes as u32 }))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConfigErrorKind {
    Syntax,
    UnknownField,
    WrongType,
    OutOfRange,
    TooLarge,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ConfigError {
    pub kind: ConfigErrorKind,
    pub field: String,
    pub message: String,
}

impl core::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        if self.field.is_empty() { write!(f, "{}", self.message) } else { write!(f, "{}: {}", self.field, self.message) }
    }
}

/// A person's answer to an escalation (`resume-answer` in the WIT).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResumeAnswer {
    Retry,
    Done(Option<String>),
    Skip,
    Abort,
}

/// What the host does with a resumed run's call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResumedAction {
    Send,
    Succeed,
    Replan,
    Escalate,
}

/// The call that stopped a run, after a resume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct ResumedCall {
    pub call_id: u32,
    pub tool: String,
    pub server: Option<String>,
    pub idempotency_key: Option<String>,
    pub arguments_json: Option<String>,
    pub action: ResumedAction,
    pub ticket: Option<CallTicket>,
    pub attempt: u32,
    pub result_text: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SnapshotErrorKind {
    Malformed,
    Tampered,
    OtherContract,
    TooLarge,
    NotEscalated,
    CallsOpen,
}

/// A snapshot not taken, or not resumed, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct SnapshotError {
    pub kind: SnapshotErrorKind,
    pub message: String,
}

impl SnapshotError {
    pub fn new(kind: SnapshotErrorKind, message: impl Into<String>) -> SnapshotError {
        SnapshotError { kind, message: message.into() }
    }
}
