//! The HTTP form: streamable HTTP at `http://ADDR/mcp`, stateless (no
//! `Mcp-Session-Id`: any instance behind a load balancer can answer any
//! request), and the counters at `/metrics` (Prometheus text).
//!
//! Each POST body is checked before rmcp reads it: over `max-message-bytes`
//! is HTTP 413, and not JSON or not a message of MCP is HTTP 400, each with a
//! JSON-RPC error body (`framing::refusal`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use super::framing::Refused;
use super::service::{Proxy, ProxyService};

/// How long a request's body may take to arrive.
const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves `proxy` on `listen` until it is shut down; says where on stderr.
pub async fn serve(proxy: Arc<Proxy>, listen: SocketAddr, allowed_hosts: Vec<String>) -> anyhow::Result<()> {
    let max = proxy.settings.max_message_bytes;
    let mut config = StreamableHttpServerConfig::default()
        .with_sse_keep_alive(None)
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_cancellation_token(proxy.shutdown.child_token());
    if !allowed_hosts.is_empty() {
        let mut hosts = config.allowed_hosts.clone();
        hosts.extend(allowed_hosts);
        config = config.with_allowed_hosts(hosts);
    }
    let factory = Arc::clone(&proxy);
    let service: StreamableHttpService<ProxyService, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(ProxyService(Arc::clone(&factory))), Default::default(), config);
    let metrics = Arc::clone(&proxy.metrics);
    let router = axum::Router::new()
        .nest_service("/mcp", service)
        .layer(middleware::from_fn_with_state(max, check_body))
        .route("/metrics", axum::routing::get(move || async move { metrics.to_prometheus() }));
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
    eprintln!("agent-retry proxy at http://{}/mcp (Ctrl-C stops it)", listener.local_addr()?);
    let stop = proxy.shutdown.clone();
    axum::serve(listener, router).with_graceful_shutdown(async move { stop.cancelled_owned().await }).await?;
    Ok(())
}

/// Refuses a POST body over `max` bytes (413) or not JSON (400), with a
/// JSON-RPC error; passes the rest on unchanged.
async fn check_body(State(max): State<usize>, request: Request, next: Next) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    // A body that trickles in (a slow client, or one holding connections
    // open on purpose) is given up after BODY_TIMEOUT.
    let Ok(read) = tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, max)).await else {
        let message = format!("agent-retry proxy: the message did not arrive within {} s", BODY_TIMEOUT.as_secs());
        return error(StatusCode::REQUEST_TIMEOUT, "null", -32600, &message);
    };
    let bytes = match read {
        Ok(bytes) => bytes,
        Err(_) => {
            let message = format!("agent-retry proxy: the message could not be read within the limit of {max} bytes (max-message-bytes)");
            return error(StatusCode::PAYLOAD_TOO_LARGE, "null", -32600, &message);
        }
    };
    match super::framing::refusal(&bytes) {
        Some(Refused::Request { id, code, message }) => return error(StatusCode::BAD_REQUEST, &id, code, &message),
        // No request of the server's waits over stateless HTTP.
        Some(Refused::Answer { id, message }) => return error(StatusCode::BAD_REQUEST, &id, -32600, &message),
        None => {}
    }
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

/// `id`: the request's, as JSON text (or `null`).
fn error(status: StatusCode, id: &str, code: i32, message: &str) -> Response {
    let body = format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"error\":{{\"code\":{code},\"message\":{}}}}}", serde_json::Value::from(message));
    Response::builder().status(status).header("content-type", "application/json").body(Body::from(body)).unwrap_or_default()
}
