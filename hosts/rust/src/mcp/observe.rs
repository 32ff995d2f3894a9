//! What happened to one attempt, as the contract's reports: a success, an
//! empty result, or a failure as an `observation` of raw facts (the status,
//! the headers and body as received, the JSON-RPC code and message, the
//! transport's error, whether an `Mcp-Session-Id` was sent, how far the
//! request got). What a failure means (a lost session, a refused revision, a
//! transient fault) is the policy's to decide, never this module's.

use rmcp::ServiceError;
use rmcp::model::CallToolResult;
use rmcp::transport::streamable_http_client::StreamableHttpError;
use serde_json::Value;

use super::http_client::HttpFailure;
use crate::component::Outcome;
use crate::component::types::{Delivery, FailureKind, Observation, TransportError};
use crate::limits::header_lines;

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

fn failure(kind: FailureKind, headers: String, body: String, session_id_sent: bool, delivery: Delivery) -> Outcome {
    Outcome::Failure(Observation { kind, headers, body, structured_content: None, session_id_sent, delivery })
}

/// A transport failure: no answer was read.
pub fn transport_failure(error: TransportError, delivery: Delivery, detail: String, session_id_sent: bool) -> Outcome {
    failure(FailureKind::Transport(error), String::new(), detail, session_id_sent, delivery)
}

/// The outcome of a call that returned (`session_id_sent`: whether its request
/// carried `Mcp-Session-Id`).
pub fn from_result(result: &CallToolResult, session_id_sent: bool) -> Outcome {
    if result.is_error == Some(true) {
        // The policy reads the text and the structured content for the upstream
        // failure (a status, a provider's error type, a wait); the wrapper adds nothing.
        let (body, structured_content) = (result_text(result), structured_text(result));
        return Outcome::Failure(Observation {
            kind: FailureKind::ToolError(None),
            headers: String::new(),
            body,
            structured_content,
            session_id_sent,
            delivery: Delivery::AnswerStarted,
        });
    }
    if is_empty(result) {
        return Outcome::EmptyResult("the tool returned no content".to_string());
    }
    Outcome::Success
}

/// The outcome of a call that failed in rmcp. `session_id_sent` is whether the
/// request carried `Mcp-Session-Id`, for the failures that do not say it
/// themselves (a JSON-RPC error; an HTTP failure of the capturing client does).
pub fn from_error(error: &ServiceError, session_id_sent: bool) -> Outcome {
    match error {
        ServiceError::McpError(e) => from_error_data(e, session_id_sent),
        ServiceError::TransportSend(e) => from_transport_error(e.error.as_ref(), session_id_sent),
        // The session's transport (a stdio pipe, rmcp's worker) is gone: whether
        // the request was written before it went is not known.
        ServiceError::TransportClosed => {
            transport_failure(TransportError::StreamClosed, Delivery::Unknown, "the session's transport closed".into(), session_id_sent)
        }
        ServiceError::Timeout { .. } => transport_failure(TransportError::Timeout, Delivery::Sent, String::new(), session_id_sent),
        other => transport_failure(TransportError::Other, Delivery::Unknown, other.to_string(), session_id_sent),
    }
}

/// Whether the failure says the session's transport itself is dead (the stdio
/// pipe, the server process): the next attempt needs a new one whatever the
/// policy decides. An I/O fact, not a reading of the server's answer.
pub fn transport_is_gone(error: &ServiceError) -> bool {
    match error {
        ServiceError::TransportClosed => true,
        ServiceError::TransportSend(e) => e.error.downcast_ref::<std::io::Error>().is_some(),
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

/// A JSON-RPC error object, as the contract's `protocol-error`: its message
/// as the body, its `data` as the structured content.
pub fn from_error_data(e: &rmcp::model::ErrorData, session_id_sent: bool) -> Outcome {
    let data = e.data.as_ref().filter(|v| !v.is_null()).map(Value::to_string);
    Outcome::Failure(Observation {
        kind: FailureKind::ProtocolError(e.code.0),
        headers: String::new(),
        body: e.message.to_string(),
        structured_content: data,
        session_id_sent,
        delivery: Delivery::AnswerStarted,
    })
}

/// A failure of the transport (rmcp's boxed error), as observed.
pub fn from_transport_error(error: &(dyn std::error::Error + Send + Sync + 'static), session_id_sent: bool) -> Outcome {
    if let Some(http) = error.downcast_ref::<StreamableHttpError<HttpFailure>>() {
        return from_http_error(http, session_id_sent);
    }
    if let Some(io) = error.downcast_ref::<std::io::Error>() {
        // A stdio pipe that broke while the request was written or awaited.
        return transport_failure(TransportError::StreamClosed, Delivery::Unknown, io.to_string(), session_id_sent);
    }
    transport_failure(TransportError::Other, Delivery::Unknown, error.to_string(), session_id_sent)
}

fn from_http_error(error: &StreamableHttpError<HttpFailure>, session_id_sent: bool) -> Outcome {
    match error {
        StreamableHttpError::Client(HttpFailure::Status { status, headers, body, session_id_sent }) => {
            failure(FailureKind::HttpStatus(*status), header_lines(headers), body.clone(), *session_id_sent, Delivery::AnswerStarted)
        }
        StreamableHttpError::Client(HttpFailure::Transport { error, delivery, detail, session_id_sent }) => {
            transport_failure(*error, *delivery, detail.clone(), *session_id_sent)
        }
        // rmcp's own client's reading of a 404 to a request that carried a
        // session: reported as the answer it was.
        StreamableHttpError::SessionExpired => failure(FailureKind::HttpStatus(404), String::new(), String::new(), true, Delivery::AnswerStarted),
        StreamableHttpError::HttpStatus(status) => {
            let headers: Vec<(String, String)> = status.retry_after.iter().map(|v| ("retry-after".to_string(), v.clone())).collect();
            failure(FailureKind::HttpStatus(status.status), header_lines(&headers), String::new(), session_id_sent, Delivery::AnswerStarted)
        }
        StreamableHttpError::Io(e) => transport_failure(TransportError::ConnectionReset, Delivery::Unknown, e.to_string(), session_id_sent),
        StreamableHttpError::Sse(e) => transport_failure(TransportError::StreamClosed, Delivery::AnswerStarted, e.to_string(), session_id_sent),
        StreamableHttpError::UnexpectedEndOfStream => {
            transport_failure(TransportError::StreamClosed, Delivery::AnswerStarted, error.to_string(), session_id_sent)
        }
        StreamableHttpError::TransportChannelClosed => transport_failure(TransportError::StreamClosed, Delivery::Unknown, error.to_string(), session_id_sent),
        other => transport_failure(TransportError::Other, Delivery::Unknown, other.to_string(), session_id_sent),
    }
}

/// A timed-out attempt: the request was written, no answer came.
pub fn timeout(session_id_sent: bool) -> Outcome {
    transport_failure(TransportError::Timeout, Delivery::Sent, String::new(), session_id_sent)
}
