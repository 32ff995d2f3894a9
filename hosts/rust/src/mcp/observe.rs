//! What happened to one attempt, as the contract's `outcome`.

use rmcp::ServiceError;
use rmcp::model::CallToolResult;
use rmcp::transport::streamable_http_client::StreamableHttpError;
use serde_json::Value;

use super::http_client::HttpFailure;
use crate::component::types::{Failure, FailureKind, Outcome, TransportError};

/// The text of a result's content blocks.
pub fn result_text(result: &CallToolResult) -> String {
    result.content.iter().filter_map(|block| block.as_text().map(|t| t.text.clone())).collect::<Vec<_>>().join("\n")
}

/// A result's `structuredContent` as JSON text, if it has any.
fn structured_text(result: &CallToolResult) -> Option<String> {
    result.structured_content.as_ref().filter(|v| !v.is_null()).map(Value::to_string)
}

/// A result with no content at all: a 200 that carries nothing usable.
pub fn is_empty(result: &CallToolResult) -> bool {
    let no_structure = matches!(result.structured_content, None | Some(Value::Null));
    let no_text = result.content.iter().all(|b| b.as_text().is_some_and(|t| t.text.trim().is_empty()));
    no_structure && no_text
}

fn failure(kind: FailureKind, headers: Vec<(String, String)>, body: String) -> Outcome {
    Outcome::Failure(Failure { kind, headers, body, structured_content: None })
}

/// The outcome of a call that returned.
pub fn from_result(result: &CallToolResult) -> Outcome {
    if result.is_error == Some(true) {
        // The policy reads the text and the structured content for the upstream
        // failure (a status, a provider's error type, a wait); the wrapper adds nothing.
        let (body, structured_content) = (result_text(result), structured_text(result));
        return Outcome::Failure(Failure { kind: FailureKind::ToolError(None), headers: Vec::new(), body, structured_content });
    }
    if is_empty(result) {
        return Outcome::EmptyResult("the tool returned no content".to_string());
    }
    Outcome::Success
}

/// The outcome of a call that failed in rmcp.
pub fn from_error(error: &ServiceError) -> Outcome {
    match error {
        ServiceError::McpError(e) => from_error_data(e),
        ServiceError::TransportSend(e) => from_transport_error(e.error.as_ref()),
        ServiceError::TransportClosed => failure(FailureKind::Transport(TransportError::StreamClosed), Vec::new(), "the session's transport closed".into()),
        ServiceError::Timeout { .. } => failure(FailureKind::Transport(TransportError::Timeout), Vec::new(), String::new()),
        other => failure(FailureKind::Transport(TransportError::Other), Vec::new(), other.to_string()),
    }
}

/// Whether a failed call lost the session: the server no longer knows it, or
/// the transport (the stdio pipe, the server process) is gone.
pub fn loses_session(error: &ServiceError) -> bool {
    match error {
        ServiceError::TransportClosed => true,
        ServiceError::TransportSend(e) => matches!(
            e.error.downcast_ref::<StreamableHttpError<HttpFailure>>(),
            Some(StreamableHttpError::Client(HttpFailure::SessionUnknown { .. }) | StreamableHttpError::SessionExpired)
        ),
        _ => false,
    }
}

/// Whether a failure came from a transport that is not the wrapper's capturing
/// client or a stdio pipe (a bare peer's HTTP client): its status and headers
/// were not kept.
pub fn is_uncaptured(error: &ServiceError) -> bool {
    match error {
        ServiceError::TransportSend(e) => {
            e.error.downcast_ref::<StreamableHttpError<HttpFailure>>().is_none() && e.error.downcast_ref::<std::io::Error>().is_none()
        }
        _ => false,
    }
}

/// A JSON-RPC error object, as the contract's `protocol-error`.
pub fn from_error_data(e: &rmcp::model::ErrorData) -> Outcome {
    let data = e.data.as_ref().filter(|v| !v.is_null()).map(Value::to_string);
    Outcome::Failure(Failure { kind: FailureKind::ProtocolError(e.code.0), headers: Vec::new(), body: e.message.to_string(), structured_content: data })
}

/// A failure of the transport (rmcp's boxed error), as the contract's outcome.
pub fn from_transport_error(error: &(dyn std::error::Error + Send + Sync + 'static)) -> Outcome {
    if let Some(http) = error.downcast_ref::<StreamableHttpError<HttpFailure>>() {
        return from_http_error(http);
    }
    if let Some(io) = error.downcast_ref::<std::io::Error>() {
        // A stdio pipe that broke while the request was written or awaited.
        return failure(FailureKind::Transport(TransportError::StreamClosed), Vec::new(), io.to_string());
    }
    failure(FailureKind::Transport(TransportError::Other), Vec::new(), error.to_string())
}

/// A transport failure with a detail for the log and the note.
pub fn transport_failure(error: TransportError, detail: String) -> Outcome {
    failure(FailureKind::Transport(error), Vec::new(), detail)
}

fn from_http_error(error: &StreamableHttpError<HttpFailure>) -> Outcome {
    match error {
        StreamableHttpError::Client(HttpFailure::Status { status, headers, body }) => failure(FailureKind::HttpStatus(*status), headers.clone(), body.clone()),
        StreamableHttpError::Client(HttpFailure::Transport { error, detail }) => failure(FailureKind::Transport(*error), Vec::new(), detail.clone()),
        // The server did not run the request: it no longer knows the session.
        StreamableHttpError::Client(HttpFailure::SessionUnknown { status, body }) => {
            failure(FailureKind::Transport(TransportError::ConnectionRefused), Vec::new(), format!("session lost: HTTP {status}: {body}"))
        }
        StreamableHttpError::SessionExpired => failure(FailureKind::Transport(TransportError::ConnectionRefused), Vec::new(), "session lost: HTTP 404".into()),
        StreamableHttpError::HttpStatus(status) => {
            let headers = status.retry_after.iter().map(|v| ("retry-after".to_string(), v.clone())).collect();
            failure(FailureKind::HttpStatus(status.status), headers, String::new())
        }
        StreamableHttpError::Io(e) => failure(FailureKind::Transport(TransportError::ConnectionReset), Vec::new(), e.to_string()),
        StreamableHttpError::Sse(e) => failure(FailureKind::Transport(TransportError::StreamClosed), Vec::new(), e.to_string()),
        StreamableHttpError::UnexpectedEndOfStream | StreamableHttpError::TransportChannelClosed => {
            failure(FailureKind::Transport(TransportError::StreamClosed), Vec::new(), error.to_string())
        }
        other => failure(FailureKind::Transport(TransportError::Other), Vec::new(), other.to_string()),
    }
}

/// A timed-out attempt.
pub fn timeout() -> Outcome {
    failure(FailureKind::Transport(TransportError::Timeout), Vec::new(), String::new())
}
