//! Wrapping real MCP tool calls with the policy: the retry lives in the code
//! that makes the call ("Retry and Backoff for Agent-Driven MCP Calls"), and the model sees only the final outcome.

pub mod answer;
pub mod caller;
pub mod clock;
pub mod connect;
mod continuation;
pub mod http_client;
pub mod metrics;
pub mod observe;
mod session_client;
pub mod status_check;
mod task;

pub use answer::{CallError, StopCause, Stopped, ToolAnswer};
pub use caller::{DEFAULT_MAX_RECONNECTS_PER_RUN, OnProgress, OnVerdict, RetryingToolCaller, RetryingToolCallerOptions, StatusCheck};
pub use clock::Clock;
pub use connect::{
    ConnectionConfigError, HANDSHAKE_VERSION, McpConnection, PREFERRED_VERSIONS, SharedConnection, connect_http, connect_stdio, negotiating_lifecycle,
};
pub use metrics::Metrics;
pub use session_client::ClientHandlerRef;
pub use status_check::ListedCheck;
