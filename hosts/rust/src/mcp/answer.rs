//! What a call through the wrapper ends in: the model's answer, or why the run stops.

use rmcp::model::CallToolResult;

use crate::component::types::{Escalation, RunError, SnapshotError};
use crate::fault::PolicyFault;

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
    /// The call or run time limit passed first (`call_timeout_ms`, `run_timeout_ms`).
    TimedOut(Stopped),
    /// The caller cancelled the call ([`super::RetryingToolCaller::call_until`]).
    Cancelled(Stopped),
    /// The session could not be set up again and the policy did not escalate
    /// (it answered a replan: the server refused the `initialize` itself), or the
    /// caller was built on a bare peer, which cannot be connected again.
    SessionLost(String),
    /// A snapshot not taken, or not resumed ([`crate::mcp::RetryingToolCaller::resume`]): tampered,
    /// of another contract major, malformed, too large, or the run has not escalated.
    Snapshot(SnapshotError),
}

/// Why a call stopped before the policy's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopCause {
    /// `call_timeout_ms` passed.
    CallTimeout,
    /// `run_timeout_ms` passed.
    RunTimeout,
    /// The caller's cancellation token fired.
    Cancelled,
}

impl StopCause {
    /// `call-timeout`, `run-timeout`, `cancelled`: the log's outcome.
    pub fn label(self) -> &'static str {
        match self {
            StopCause::CallTimeout => "call-timeout",
            StopCause::RunTimeout => "run-timeout",
            StopCause::Cancelled => "cancelled",
        }
    }
}

/// A call that stopped waiting: what is known of its effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stopped {
    pub cause: StopCause,
    pub tool: String,
    /// The policy's call id; `None` if the policy had not admitted the call.
    pub call_id: Option<u32>,
    /// Attempts sent to the server before it stopped.
    pub attempts_sent: u32,
    /// The call is a write or delete, and an attempt was in flight when it
    /// stopped or the run's effects list it as `unknown`.
    pub may_have_applied: bool,
    /// Where the call was when it stopped and what is known of its effect, in
    /// the words of every host (docs/events.md, "Stop reasons").
    pub reason: String,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Escalated(e) => write!(f, "escalated: {}", e.note),
            CallError::Policy(e) => write!(f, "the policy component failed: {e}"),
            CallError::Run(e) => write!(f, "run error: {e:?}"),
            CallError::TimedOut(s) | CallError::Cancelled(s) => write!(f, "{}: {}", s.tool, s.reason),
            CallError::SessionLost(note) => write!(f, "the MCP session was lost: {note}"),
            CallError::Snapshot(e) => write!(f, "snapshot refused ({:?}): {}", e.kind, e.message),
        }
    }
}

impl std::error::Error for CallError {}
