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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use futures::StreamExt;
use futures::stream::BoxStream;
use http::{HeaderName, HeaderValue};
use rmcp::ErrorData;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, ProtocolVersion, ServerJsonRpcMessage, ServerResult};
use rmcp::transport::streamable_http_client::{StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse};
use sse_stream::{Error as SseError, Sse, SseStream};

use crate::component::types::{Delivery, ProbeAnswer, TransportError};
use crate::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, PolicyInstance};

/// The most of an error body kept for the policy (it keeps less).
const MAX_ERROR_BODY_BYTES: usize = 16 * 1024;

/// Why an HTTP exchange failed, as observed: nothing here says what it means.
#[derive(Debug, Clone)]
pub enum HttpFailure {
    /// The server answered with a non-2xx status: its headers and body as received.
    Status { status: u16, headers: Vec<(String, String)>, body: String, session_id_sent: bool },
    /// No usable answer was read.
    Transport { error: TransportError, delivery: Delivery, detail: String, session_id_sent: bool },
}

impl fmt::Display for HttpFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpFailure::Status { status, body, .. } => write!(f, "HTTP {status}: {body}"),
            HttpFailure::Transport { error, detail, .. } => write!(f, "{}: {detail}", crate::labels::transport(*error)),
        }
    }
}

impl std::error::Error for HttpFailure {}

impl HttpFailure {
    fn from_reqwest(e: &reqwest::Error, session_id_sent: bool) -> Self {
        let transport = |error, delivery, detail| HttpFailure::Transport { error, delivery, detail, session_id_sent };
        // Neither a TLS handshake that failed nor a name that does not resolve
        // is fixed by waiting; nothing of the request left the host.
        if let Some(tls) = tls_failure(e) {
            if e.is_connect() {
                return transport(TransportError::Tls, Delivery::NotSent, format!("TLS: {tls} ({})", detail(e)));
            }
            // A TLS error on a connection already set up (a bad record, an
            // alert after the request was written): the connection broke, as
            // a reset does, and the request went out.
            let delivery = if e.is_body() || e.is_decode() { Delivery::AnswerStarted } else { Delivery::Sent };
            return transport(TransportError::ConnectionReset, delivery, format!("TLS: {tls} ({})", detail(e)));
        }
        if name_not_resolved(e) {
            return transport(TransportError::NameResolution, Delivery::NotSent, detail(e));
        }
        let (error, delivery) = if e.is_connect() {
            // No connection: the request never left (a connect that timed out too).
            (if e.is_timeout() { TransportError::Timeout } else { TransportError::ConnectionRefused }, Delivery::NotSent)
        } else if e.is_timeout() {
            (TransportError::Timeout, Delivery::Sent)
        } else if e.is_body() || e.is_decode() {
            // The status line came; the body broke off.
            (TransportError::ConnectionReset, Delivery::AnswerStarted)
        } else if e.is_request() {
            // The connection broke around the request: whether it was written is not known.
            (TransportError::ConnectionReset, Delivery::Unknown)
        } else {
            (TransportError::Other, Delivery::Unknown)
        };
        transport(error, delivery, detail(e))
    }
}

/// `e` in words, its URL cut to the scheme, host and port: a query or a path
/// may carry a credential, and the text goes into logs, notes and the model's
/// messages.
fn detail(e: &reqwest::Error) -> String {
    let text = e.to_string();
    match e.url() {
        Some(url) => text.replace(url.as_str(), &shown_url(url)),
        None => text,
    }
}

/// `url` as logs and messages show it: its scheme, host and port (a query,
/// a path or user information may hold a credential).
pub fn shown_url(url: &reqwest::Url) -> String {
    format!("{}://{}{}", url.scheme(), url.host_str().unwrap_or(""), url.port().map(|p| format!(":{p}")).unwrap_or_default())
}

/// The errors in `e`'s chain, stepping into the error an `io::Error` wraps
/// (its `source()` skips it; hyper wraps rustls's in two).
fn chain(e: &reqwest::Error) -> impl Iterator<Item = &(dyn std::error::Error + 'static)> {
    std::iter::successors(Some(e as &(dyn std::error::Error + 'static)), |error| match error.downcast_ref::<std::io::Error>() {
        Some(io) => io.get_ref().map(|inner| inner as &(dyn std::error::Error + 'static)),
        None => error.source(),
    })
}

/// Whether the server's name did not resolve (hyper-util's resolver fails
/// with "dns error", wrapping getaddrinfo's "failed to lookup address").
fn name_not_resolved(e: &reqwest::Error) -> bool {
    e.is_connect()
        && chain(e).any(|error| {
            let text = error.to_string();
            text.contains("dns error") || text.contains("failed to lookup address")
        })
}

/// The rustls error somewhere in `e`'s sources, if the failure was TLS's.
#[cfg(feature = "tls")]
fn tls_failure(e: &reqwest::Error) -> Option<String> {
    chain(e).find_map(|error| error.downcast_ref::<rustls::Error>().map(ToString::to_string))
}

#[cfg(not(feature = "tls"))]
fn tls_failure(_: &reqwest::Error) -> Option<String> {
    None
}

/// Asks the policy what an answer to the `server/discover` probe that is not
/// a discovery result means (`read-probe-answer`): the answer's HTTP status
/// and the JSON-RPC error code it carried, if any.
pub type ProbeReader = Arc<dyn Fn(Option<u16>, Option<i32>) -> ProbeAnswer + Send + Sync>;

/// A [`ProbeReader`] on its own instance of `instance`'s component (the run's
/// instance stays the run's; this one is made at the first question).
pub fn probe_reader_of(instance: &PolicyInstance) -> ProbeReader {
    let sibling: Arc<Mutex<Option<PolicyInstance>>> = Arc::new(Mutex::new(None));
    let spawn = instance.sibling_factory();
    Arc::new(move |status, code| {
        let mut slot = sibling.lock().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_none_or(PolicyInstance::is_broken) {
            *slot = spawn().ok();
        }
        ask(slot.as_mut(), status, code)
    })
}

/// The default [`ProbeReader`] of a connection no policy was given to (a bare
/// peer's, [`super::connect_http`]): the default component
/// ([`PolicyComponent::load`]`(None)`), loaded at the first question.
fn default_probe_reader() -> ProbeReader {
    static DEFAULT: OnceLock<Option<Mutex<PolicyInstance>>> = OnceLock::new();
    Arc::new(|status, code| {
        let instance = DEFAULT.get_or_init(|| {
            let component =
                PolicyComponent::load(None).map_err(|e| tracing::warn!(target: "agent_retry", reason = %e, "no policy to read a probe's answer")).ok()?;
            let services = HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::Os);
            component.instantiate(services).ok().map(Mutex::new)
        });
        match instance {
            Some(instance) => ask(Some(&mut instance.lock().unwrap_or_else(|p| p.into_inner())), status, code),
            None => ask(None, status, code),
        }
    })
}

/// The policy's answer; without a policy that answers (none loaded, or it
/// failed), the answer is the connect attempt's `failure`, so that the
/// refusal reaches the caller as it came instead of a guessed fallback.
fn ask(instance: Option<&mut PolicyInstance>, status: Option<u16>, code: Option<i32>) -> ProbeAnswer {
    match instance.map(|instance| instance.read_probe_answer(status, code)) {
        Some(Ok(answer)) => answer,
        Some(Err(fault)) => {
            tracing::warn!(target: "agent_retry", reason = %fault, "the policy failed to read a probe's answer");
            ProbeAnswer::Failure
        }
        None => ProbeAnswer::Failure,
    }
}

/// reqwest, recording failures in full.
#[derive(Clone, Default)]
pub struct RecordingHttpClient {
    inner: reqwest::Client,
    /// Whether the last request carried `Mcp-Session-Id` (shared by the clones).
    session_id_sent: Arc<AtomicBool>,
    /// Who reads a refused probe's answer (shared by the clones); none: the default.
    probe: Arc<Mutex<Option<ProbeReader>>>,
}

impl RecordingHttpClient {
    pub fn new() -> Self {
        Self::default()
    }

    /// Over a reqwest client built by the caller (proxies, timeouts, roots).
    pub fn with_client(inner: reqwest::Client) -> Self {
        RecordingHttpClient { inner, ..Self::default() }
    }

    /// Whether the last request this client (or a clone) posted carried `Mcp-Session-Id`.
    pub fn session_id_sent(&self) -> bool {
        self.session_id_sent.load(Ordering::Relaxed)
    }

    /// Reads a refused probe's answer with `reader` (the policy's rule).
    pub fn set_probe_reader(&self, reader: ProbeReader) {
        *self.probe.lock().unwrap_or_else(|p| p.into_inner()) = Some(reader);
    }

    fn probe_reader(&self) -> ProbeReader {
        self.probe.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_else(default_probe_reader)
    }
}

fn client_error(e: reqwest::Error, session_id_sent: bool) -> StreamableHttpError<HttpFailure> {
    StreamableHttpError::Client(HttpFailure::from_reqwest(&e, session_id_sent))
}

/// A body that broke off after the status line: the answer stream was cut
/// before the JSON-RPC response came (`stream-closed`).
fn cut_body(e: reqwest::Error, session_id_sent: bool) -> StreamableHttpError<HttpFailure> {
    StreamableHttpError::Client(HttpFailure::Transport {
        error: TransportError::StreamClosed,
        delivery: Delivery::AnswerStarted,
        detail: format!("the answer was cut: {}", detail(&e)),
        session_id_sent,
    })
}

/// The answer to a `server/discover` probe that is not a discovery result,
/// when the policy reads it as an older server's refusal: handed back to rmcp
/// as a JSON-RPC error that answers the probe (with its id), so that rmcp's
/// lifecycle falls back to `initialize`, as rmcp's own HTTP client does
/// (`legacy_discover_response`, rmcp 3.11). Otherwise `None`: the answer is
/// the connect attempt's failure, with its headers. The policy decides which
/// (`read-probe-answer`), not the host.
fn legacy_discover_answer(
    message: &ClientJsonRpcMessage,
    session_attached: bool,
    status: u16,
    body: &str,
    reader: impl FnOnce() -> ProbeReader,
) -> Option<StreamableHttpPostResponse> {
    let ClientJsonRpcMessage::Request(request) = message else {
        return None;
    };
    if session_attached || !matches!(request.request, ClientRequest::DiscoverRequest(_)) {
        return None;
    }
    let rpc_error = match serde_json::from_str::<ServerJsonRpcMessage>(body) {
        Ok(ServerJsonRpcMessage::Error(error)) => Some(error.error),
        _ => None,
    };
    if reader()(Some(status), rpc_error.as_ref().map(|e| e.code.0)) != ProbeAnswer::OlderServer {
        return None;
    }
    let error = rpc_error.unwrap_or_else(|| ErrorData::invalid_request(format!("server/discover refused with HTTP {status}: {body}"), None));
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
        self.session_id_sent.store(session_attached, Ordering::Relaxed);
        if let Some(session_id) = session_id {
            request = request.header("mcp-session-id", session_id.as_ref());
        }
        let body = serde_json::to_vec(&message)?;
        let response = request.body(body).send().await.map_err(|e| client_error(e, session_attached))?;
        let status = response.status();
        if status == reqwest::StatusCode::ACCEPTED || status == reqwest::StatusCode::NO_CONTENT {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if !status.is_success() {
            let headers = headers_of(&response);
            let body = read_limited(response, MAX_ERROR_BODY_BYTES).await.map_err(|e| cut_body(e, session_attached))?;
            let body = String::from_utf8_lossy(&body).into_owned();
            if let Some(answer) = legacy_discover_answer(&message, session_attached, status.as_u16(), &body, || self.probe_reader()) {
                return Ok(answer);
            }
            // As received: whether it means a lost session is the policy's to say.
            return Err(StreamableHttpError::Client(HttpFailure::Status { status: status.as_u16(), headers, body, session_id_sent: session_attached }));
        }
        let session_id = response.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_string);
        let content_type = response.headers().get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        if content_type.starts_with("text/event-stream") {
            let stream: BoxStream<'static, Result<Sse, SseError>> = SseStream::from_bytes_stream(response.bytes_stream()).boxed();
            return Ok(StreamableHttpPostResponse::Sse(stream, session_id));
        }
        if content_type.starts_with("application/json") {
            let bytes = response.bytes().await.map_err(|e| cut_body(e, session_attached))?;
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
        let response = request.send().await.map_err(|e| client_error(e, true))?;
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
        let session_attached = session_id.is_some();
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
        let response = request.send().await.map_err(|e| client_error(e, session_attached))?;
        if response.status() == reqwest::StatusCode::METHOD_NOT_ALLOWED || !response.status().is_success() {
            return Err(StreamableHttpError::ServerDoesNotSupportSse);
        }
        Ok(SseStream::from_bytes_stream(response.bytes_stream()).boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{ClientRequest, DiscoverRequest, DiscoverRequestParams, NumberOrString};

    fn probe() -> ClientJsonRpcMessage {
        ClientJsonRpcMessage::request(ClientRequest::DiscoverRequest(DiscoverRequest::new(DiscoverRequestParams {})), NumberOrString::Number(7))
    }

    #[test]
    fn a_refused_probe_is_read_by_the_policy_not_by_the_host() {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let reader = |answer: ProbeAnswer| {
            let asked = Arc::clone(&asked);
            move || -> ProbeReader {
                Arc::new(move |status, code| {
                    asked.lock().unwrap().push((status, code));
                    answer
                })
            }
        };
        let rpc = r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"Method not found"}}"#;
        assert!(legacy_discover_answer(&probe(), false, 404, rpc, reader(ProbeAnswer::OlderServer)).is_some());
        // The same answer read as a failure goes up as the connect attempt's failure.
        assert!(legacy_discover_answer(&probe(), false, 404, rpc, reader(ProbeAnswer::Failure)).is_none());
        assert!(legacy_discover_answer(&probe(), false, 503, "busy", reader(ProbeAnswer::Failure)).is_none());
        assert_eq!(*asked.lock().unwrap(), vec![(Some(404), Some(-32601)), (Some(404), Some(-32601)), (Some(503), None)]);
        // A request inside a session: nobody is asked.
        assert!(legacy_discover_answer(&probe(), true, 404, rpc, reader(ProbeAnswer::OlderServer)).is_none());
        assert_eq!(asked.lock().unwrap().len(), 3);
    }
}
