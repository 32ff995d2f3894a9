//! An HTTP client for rmcp's streamable-HTTP transport that keeps what the
//! policy needs to classify a failed call. rmcp's built-in reqwest client keeps
//! only the status and `Retry-After` of 429/5xx answers and drops 4xx details and
//! every other header (RateLimit, x-ratelimit-*, x-should-retry), so a failure
//! would reach the policy half-flattened; "Retry and Backoff for Agent-Driven MCP Calls": a failure flattened to
//! "error" cannot be classified.
//!
//! On a non-2xx answer this client returns `StreamableHttpError::Client(HttpFailure::Status
//! {status, headers, body})`; rmcp hands that to the one request that failed, as
//! `ServiceError::TransportSend`, and `observe` takes it back out by downcasting.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::ErrorData;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, ProtocolVersion, ServerJsonRpcMessage, ServerResult};
use rmcp::transport::streamable_http_client::{StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse};
use sse_stream::{Error as SseError, Sse, SseStream};

use crate::component::types::TransportError;

/// The most of an error body kept for the policy (it keeps less).
const MAX_ERROR_BODY_BYTES: usize = 16 * 1024;

/// Why an HTTP exchange failed.
#[derive(Debug, Clone)]
pub enum HttpFailure {
    /// The server answered with a non-2xx status.
    Status { status: u16, headers: Vec<(String, String)>, body: String },
    /// No usable answer was read.
    Transport { error: TransportError, detail: String },
    /// The server does not know the session the request carried: a 404 (the
    /// streamable-HTTP rule for a session it ended or never had), or a 400 whose
    /// body says the session id is not valid (what the TypeScript SDK's servers
    /// answer). The request was not run; the session must be set up again.
    SessionUnknown { status: u16, body: String },
}

impl fmt::Display for HttpFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpFailure::Status { status, body, .. } => write!(f, "HTTP {status}: {body}"),
            HttpFailure::Transport { error, detail } => write!(f, "{error:?}: {detail}"),
            HttpFailure::SessionUnknown { status, body } => write!(f, "session unknown to the server (HTTP {status}): {body}"),
        }
    }
}

impl std::error::Error for HttpFailure {}

impl HttpFailure {
    fn from_reqwest(e: &reqwest::Error) -> Self {
        // A certificate the client does not trust will not be trusted on a
        // second try: `other` is escalated, where `connection-refused` is retried.
        if let Some(tls) = tls_failure(e) {
            return HttpFailure::Transport { error: TransportError::Other, detail: format!("TLS: {tls} ({e})") };
        }
        let error = if e.is_timeout() {
            TransportError::Timeout
        } else if e.is_connect() {
            TransportError::ConnectionRefused
        } else if e.is_body() || e.is_decode() || e.is_request() {
            TransportError::ConnectionReset
        } else {
            TransportError::Other
        };
        HttpFailure::Transport { error, detail: e.to_string() }
    }
}

/// The rustls error somewhere in `e`'s sources, if the failure was TLS's.
#[cfg(feature = "tls")]
fn tls_failure(e: &reqwest::Error) -> Option<String> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = next {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        // An io::Error's `source()` skips the error it wraps (hyper wraps
        // rustls's in two): step into it instead.
        next = match error.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => error.source(),
        };
    }
    None
}

#[cfg(not(feature = "tls"))]
fn tls_failure(_: &reqwest::Error) -> Option<String> {
    None
}

/// reqwest, recording failures in full.
#[derive(Clone, Default)]
pub struct RecordingHttpClient {
    inner: reqwest::Client,
}

impl RecordingHttpClient {
    pub fn new() -> Self {
        Self::default()
    }

    /// Over a reqwest client built by the caller (proxies, timeouts, roots).
    pub fn with_client(inner: reqwest::Client) -> Self {
        RecordingHttpClient { inner }
    }
}

fn client_error(e: reqwest::Error) -> StreamableHttpError<HttpFailure> {
    StreamableHttpError::Client(HttpFailure::from_reqwest(&e))
}

/// A body that broke off after the status line: the answer stream was cut
/// before the JSON-RPC response came (`stream-closed`).
fn cut_body(e: reqwest::Error) -> StreamableHttpError<HttpFailure> {
    StreamableHttpError::Client(HttpFailure::Transport { error: TransportError::StreamClosed, detail: format!("the answer was cut: {e}") })
}

/// Whether an answer to a request that carried `Mcp-Session-Id` means the
/// server does not know the session: a 404 (streamable HTTP's rule), unless its
/// body is a JSON-RPC "method not found" (rmcp answers -32601 with 404: the
/// server ran the request), or a 400 whose body says the session id is not
/// valid. The same rule as the Python and Node wrappers'.
fn is_unknown_session(status: u16, body: &str) -> bool {
    let method_not_found = body.contains("\"code\":-32601") || body.contains("\"code\": -32601");
    (status == 404 && !method_not_found) || (status == 400 && says_session_invalid(body))
}

/// Whether a 400 body is a server's "no valid session id" (the TypeScript SDK's
/// `Bad Request: No valid session ID provided`, other servers' wordings).
fn says_session_invalid(body: &str) -> bool {
    let lower = body.to_ascii_lowercase();
    lower.contains("session") && (lower.contains("invalid") || lower.contains("no valid") || lower.contains("not found") || lower.contains("unknown"))
}

/// A server of a revision before 2026-07-28 refuses the negotiating client's
/// `server/discover` probe at the HTTP level (a 400 or 404, often with no
/// JSON-RPC id it could echo). rmcp's lifecycle falls back to `initialize` only
/// on a JSON-RPC error that answers the probe, so the refusal is handed back
/// as one, with the probe's id; as rmcp's own HTTP client does
/// (`legacy_discover_response`, rmcp 3.11).
fn legacy_discover_answer(message: &ClientJsonRpcMessage, session_attached: bool, status: u16, body: &str) -> Option<StreamableHttpPostResponse> {
    // 401 and 403 keep their status (rmcp's rule); 408 and 429 too: a server
    // that asks to wait or is throttled said nothing of its revision, and the
    // policy must see its hint (the same rule in the Python and Node wrappers).
    if session_attached || !(400..500).contains(&status) || matches!(status, 401 | 403 | 408 | 429) {
        return None;
    }
    let ClientJsonRpcMessage::Request(request) = message else {
        return None;
    };
    if !matches!(request.request, ClientRequest::DiscoverRequest(_)) {
        return None;
    }
    let error = match serde_json::from_str::<ServerJsonRpcMessage>(body) {
        Ok(ServerJsonRpcMessage::Error(error)) => error.error,
        _ => ErrorData::invalid_request(format!("server/discover refused with HTTP {status}: {body}"), None),
    };
    Some(StreamableHttpPostResponse::Json(ServerJsonRpcMessage::error(error, Some(request.id.clone())), None))
}

/// A `server/discover` that lists no revision without the handshake (a
/// server of 2025-11-25 that answers the probe, as go-sdk's stateful servers
/// do) is handed back to rmcp as a refusal, so that it falls back to
/// `initialize`: the wrapper asks discover for 2026-07-28 alone, because a
/// handshake-era revision spoken without its handshake is spoken wrongly. As
/// the Python and TypeScript SDKs do.
fn handshake_era_discovery(sent: &ClientJsonRpcMessage, answer: ServerJsonRpcMessage) -> ServerJsonRpcMessage {
    let ClientJsonRpcMessage::Request(request) = sent else {
        return answer;
    };
    if !matches!(request.request, ClientRequest::DiscoverRequest(_)) {
        return answer;
    }
    let ServerJsonRpcMessage::Response(response) = &answer else {
        return answer;
    };
    let ServerResult::DiscoverResult(result) = &response.result else {
        return answer;
    };
    if result.supported_versions.contains(&ProtocolVersion::V_2026_07_28) {
        return answer;
    }
    let listed: Vec<&str> = result.supported_versions.iter().map(ProtocolVersion::as_str).collect();
    let refusal = ErrorData::invalid_request(format!("server/discover lists {listed:?}: no revision without the handshake"), None);
    ServerJsonRpcMessage::error(refusal, Some(request.id.clone()))
}

fn headers_of(response: &reqwest::Response) -> Vec<(String, String)> {
    response.headers().iter().map(|(name, value)| (name.as_str().to_string(), String::from_utf8_lossy(value.as_bytes()).into_owned())).collect()
}

/// Reads at most `limit` bytes of a body.
async fn read_limited(response: reqwest::Response, limit: usize) -> Result<Vec<u8>, reqwest::Error> {
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        let room = limit.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= limit {
            break;
        }
    }
    Ok(body)
}

impl StreamableHttpClient for RecordingHttpClient {
    type Error = HttpFailure;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<StreamableHttpPostResponse, StreamableHttpError<Self::Error>> {
        let mut request = self
            .inner
            .post(uri.as_ref())
            .header(http::header::ACCEPT, "text/event-stream, application/json")
            .header(http::header::CONTENT_TYPE, "application/json");
        if let Some(token) = auth_header {
            request = request.bearer_auth(token);
        }
        for (name, value) in custom_headers {
            request = request.header(name, value);
        }
        let session_attached = session_id.is_some();
        if let Some(session_id) = session_id {
            request = request.header("mcp-session-id", session_id.as_ref());
        }
        let body = serde_json::to_vec(&message)?;
        let response = request.body(body).send().await.map_err(client_error)?;
        let status = response.status();
        if status == reqwest::StatusCode::ACCEPTED || status == reqwest::StatusCode::NO_CONTENT {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if !status.is_success() {
            let headers = headers_of(&response);
            let body = read_limited(response, MAX_ERROR_BODY_BYTES).await.map_err(cut_body)?;
            let body = String::from_utf8_lossy(&body).into_owned();
            if let Some(answer) = legacy_discover_answer(&message, session_attached, status.as_u16(), &body) {
                return Ok(answer);
            }
            let session_lost = is_unknown_session(status.as_u16(), &body);
            if session_attached && session_lost {
                return Err(StreamableHttpError::Client(HttpFailure::SessionUnknown { status: status.as_u16(), body }));
            }
            return Err(StreamableHttpError::Client(HttpFailure::Status { status: status.as_u16(), headers, body }));
        }
        let session_id = response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_string);
        let content_type = response.headers().get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        if content_type.starts_with("text/event-stream") {
            let stream: BoxStream<'static, Result<Sse, SseError>> = SseStream::from_bytes_stream(response.bytes_stream()).boxed();
            return Ok(StreamableHttpPostResponse::Sse(stream, session_id));
        }
        if content_type.starts_with("application/json") {
            let bytes = response.bytes().await.map_err(cut_body)?;
            if bytes.is_empty() {
                return Ok(StreamableHttpPostResponse::Accepted);
            }
            let answer: ServerJsonRpcMessage = serde_json::from_slice(&bytes)?;
            return Ok(StreamableHttpPostResponse::Json(handshake_era_discovery(&message, answer), session_id));
        }
        if response.content_length() == Some(0) {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        Err(StreamableHttpError::UnexpectedContentType(Some(content_type)))
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<Self::Error>> {
        let mut request = self.inner.delete(uri.as_ref()).header("mcp-session-id", session_id.as_ref());
        if let Some(token) = auth_header {
            request = request.bearer_auth(token);
        }
        for (name, value) in custom_headers {
            request = request.header(name, value);
        }
        let response = request.send().await.map_err(client_error)?;
        if response.status() == reqwest::StatusCode::METHOD_NOT_ALLOWED {
            return Err(StreamableHttpError::ServerDoesNotSupportDeleteSession);
        }
        Ok(())
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxStream<'static, Result<Sse, SseError>>, StreamableHttpError<Self::Error>> {
        let mut request = self.inner.get(uri.as_ref()).header(http::header::ACCEPT, "text/event-stream");
        if let Some(session_id) = session_id {
            request = request.header("mcp-session-id", session_id.as_ref());
        }
        if let Some(last_event_id) = last_event_id {
            request = request.header("last-event-id", last_event_id);
        }
        if let Some(token) = auth_header {
            request = request.bearer_auth(token);
        }
        for (name, value) in custom_headers {
            request = request.header(name, value);
        }
        let response = request.send().await.map_err(client_error)?;
        if response.status() == reqwest::StatusCode::METHOD_NOT_ALLOWED || !response.status().is_success() {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        Ok(SseStream::from_bytes_stream(response.bytes_stream()).boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::is_unknown_session;

    #[test]
    fn an_unknown_session_is_a_404_or_a_400_that_says_so_but_not_a_method_not_found() {
        assert!(is_unknown_session(404, ""));
        assert!(is_unknown_session(400, r#"{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"}}"#));
        assert!(!is_unknown_session(404, r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"Method not found"}}"#));
        assert!(!is_unknown_session(400, "amount_paise must be an integer"));
        assert!(!is_unknown_session(403, "session invalid"));
    }
}
