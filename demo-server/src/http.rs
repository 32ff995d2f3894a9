//! The demo server over streamable HTTP on loopback, behind a layer that acts
//! out HTTP-level faults (statuses with headers, a dropped connection, a
//! response held back after the write was applied) and the account allowance.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use crate::era::Era;
use crate::faults::Fault;
use crate::tls::{TestAuthority, TlsListener};
use crate::tools::{AssignedFault, DemoServer, DemoState, lock};

/// A running server: its URL, its state, and a handle to stop it.
pub struct HttpServer {
    pub url: String,
    pub state: Arc<DemoState>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl HttpServer {
    pub async fn stop(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
}

/// Serves `state` on `addr` (port 0: a free port) at `/mcp`, statelessly.
pub async fn serve_http(addr: SocketAddr, state: Arc<DemoState>) -> anyhow::Result<HttpServer> {
    serve_http_with(addr, state, false).await
}

/// As [`serve_http`]; with `sessions`, clients that negotiate a protocol
/// version before 2026-07-28 get an `Mcp-Session-Id` (streamable HTTP's
/// sessions), kept in this process only: a restarted server answers a request
/// carrying an old one with 404, as the transport's rules say.
pub async fn serve_http_with(addr: SocketAddr, state: Arc<DemoState>, sessions: bool) -> anyhow::Result<HttpServer> {
    serve_http_options(addr, state, HttpOptions { sessions, ..HttpOptions::default() }).await
}

/// How the demo server is served over HTTP.
#[derive(Default)]
pub struct HttpOptions {
    /// Sessions for clients of revisions before 2026-07-28 (see [`serve_http_with`]).
    pub sessions: bool,
    /// The revisions it speaks.
    pub era: Era,
    /// Serve https with this identity (the URL says `https://`).
    pub tls: Option<TestAuthority>,
}

/// Serves `state` on `addr` at `/mcp` as `options` say.
pub async fn serve_http_options(addr: SocketAddr, state: Arc<DemoState>, options: HttpOptions) -> anyhow::Result<HttpServer> {
    let cancel = CancellationToken::new();
    let config = StreamableHttpServerConfig::default()
        .with_sse_keep_alive(None)
        .with_legacy_session_mode(options.sessions || options.era == Era::Handshake)
        .with_json_response(true)
        .with_cancellation_token(cancel.child_token());
    let handler_state = Arc::clone(&state);
    let service: StreamableHttpService<DemoServer, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(DemoServer::new(Arc::clone(&handler_state))), Default::default(), config);
    let router = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(middleware::from_fn_with_state(Arc::clone(&state), fault_layer))
        .layer(middleware::from_fn_with_state(options.era, era_gate));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let stop = cancel.clone();
    let shutdown = async move { stop.cancelled_owned().await };
    let (url, task) = match &options.tls {
        None => (
            format!("http://{local}/mcp"),
            tokio::spawn(async move {
                let _ = axum::serve(listener, router).with_graceful_shutdown(shutdown).await;
            }),
        ),
        Some(authority) => {
            let listener = TlsListener::new(listener, authority);
            (
                format!("https://{local}/mcp"),
                tokio::spawn(async move {
                    let _ = axum::serve(listener, router).with_graceful_shutdown(shutdown).await;
                }),
            )
        }
    };
    Ok(HttpServer { url, state, cancel, task })
}

/// Answers what the served era refuses before the MCP service sees it.
async fn era_gate(State(era): State<Era>, request: Request, next: Next) -> Response {
    if era == Era::Dual {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 4 << 20).await else {
        return respond(413, &[], "request body too large".into());
    };
    let message: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let method = message.get("method").and_then(Value::as_str).unwrap_or("");
    let header_version = parts.headers.get("mcp-protocol-version").and_then(|v| v.to_str().ok());
    let has_session = parts.headers.contains_key("mcp-session-id");
    if let Some(body) = era.refusal(method, message.get("id").unwrap_or(&Value::Null), header_version, has_session) {
        let status = if era == Era::Handshake && method == "server/discover" { 200 } else { 400 };
        return respond(status, &[("content-type".into(), "application/json".into())], body);
    }
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

/// The tool name and arguments of a `tools/call` request body, if it is one.
fn tools_call(body: &[u8]) -> Option<(String, Map<String, Value>)> {
    let message: Value = serde_json::from_slice(body).ok()?;
    if message.get("method")?.as_str()? != "tools/call" {
        return None;
    }
    let params = message.get("params")?;
    let name = params.get("name")?.as_str()?.to_string();
    let arguments = params.get("arguments").and_then(Value::as_object).cloned().unwrap_or_default();
    Some((name, arguments))
}

/// The method and task id of a `tasks/*` request body, if it is one.
fn tasks_request(body: &[u8]) -> Option<(String, String)> {
    let message: Value = serde_json::from_slice(body).ok()?;
    let method = message.get("method")?.as_str()?;
    if !method.starts_with("tasks/") {
        return None;
    }
    let task_id = message.pointer("/params/taskId").and_then(Value::as_str).unwrap_or_default();
    Some((method.to_string(), task_id.to_string()))
}

/// Acts out the fault scripted for a `tasks/*` request: an HTTP status or a
/// cut connection here (recorded here, as the handler never sees it); the
/// others are the handler's, and a held answer is held here.
async fn task_fault(state: &DemoState, mut parts: Parts, bytes: Bytes, method: &str, task_id: &str, next: Next) -> Response {
    let fault = lock(&state.faults).next_for_task_request(method);
    match fault {
        Some(Fault::Http { status, headers, body }) => {
            state.record_task_event(method, task_id, None, Some(format!("http-{status}")));
            respond(status, &headers, body)
        }
        Some(Fault::Drop) => {
            state.record_task_event(method, task_id, None, Some("drop".into()));
            dropped_connection()
        }
        fault => {
            let held = match fault {
                Some(Fault::TimeoutAfterApply { delay_ms }) => delay_ms,
                _ => 0,
            };
            parts.extensions.insert(AssignedFault(fault));
            let response = next.run(Request::from_parts(parts, Body::from(bytes))).await;
            tokio::time::sleep(Duration::from_millis(held)).await;
            response
        }
    }
}

/// The JSON-RPC method of a request body, if it is one.
fn method_of(body: &[u8]) -> Option<String> {
    let message: Value = serde_json::from_slice(body).ok()?;
    Some(message.get("method")?.as_str()?.to_string())
}

fn respond(status: u16, headers: &[(String, String)], body: String) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (axum::http::HeaderName::try_from(name.as_str()), HeaderValue::from_str(value)) {
            response.headers_mut().append(name, value);
        }
    }
    response
}

/// Headers promise a JSON body; the body then fails, so the connection is cut.
fn dropped_connection() -> Response {
    let failing = futures::stream::once(async { Err::<Bytes, std::io::Error>(std::io::Error::other("connection dropped by the fault script")) });
    let mut response = Response::new(Body::from_stream(failing));
    response.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
    response.headers_mut().insert("content-length", HeaderValue::from_static("64"));
    response
}

async fn fault_layer(State(state): State<Arc<DemoState>>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 4 << 20).await else {
        return respond(413, &[], "request body too large".into());
    };
    if let Some((method, task_id)) = tasks_request(&bytes) {
        return task_fault(&state, parts, bytes, &method, &task_id, next).await;
    }
    let Some((tool, arguments)) = tools_call(&bytes) else {
        // A rule may name another method (`server/discover`, `initialize`,
        // `tools/list`): its HTTP-level faults apply to that request.
        let fault = method_of(&bytes).and_then(|method| lock(&state.faults).next_for_method(&method));
        return match fault {
            Some(Fault::Http { status, headers, body }) => respond(status, &headers, body),
            Some(Fault::Drop) => dropped_connection(),
            _ => next.run(Request::from_parts(parts, Body::from(bytes))).await,
        };
    };
    if let Err(wait) = state.admit() {
        state.record(&tool, &arguments, Some("http-429".into()));
        let seconds = wait.as_millis().div_ceil(1000).max(1);
        let headers = [("retry-after".to_string(), seconds.to_string()), ("ratelimit".to_string(), format!("\"demo\";r=0;t={seconds}"))];
        return respond(429, &headers, "account allowance exhausted".into());
    }
    let fault = lock(&state.faults).next(&tool, &arguments);
    state.record(&tool, &arguments, fault.as_ref().map(Fault::name));
    match fault {
        Some(Fault::Http { status, headers, body }) => respond(status, &headers, body),
        Some(Fault::Drop) => dropped_connection(),
        Some(Fault::TimeoutAfterApply { delay_ms }) => {
            parts.extensions.insert(AssignedFault(None));
            let response = next.run(Request::from_parts(parts, Body::from(bytes))).await;
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
            response
        }
        tool_level => {
            parts.extensions.insert(AssignedFault(tool_level));
            next.run(Request::from_parts(parts, Body::from(bytes))).await
        }
    }
}
