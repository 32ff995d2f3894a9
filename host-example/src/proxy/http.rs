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
use super::service::{Common, Proxy, ProxyService};

/// How long a request's body may take to arrive.
const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves each proxy on `listen` until the proxy stops; says where on stderr.
/// One unnamed upstream is at `/mcp`; named ones at `/NAME/mcp`.
pub async fn serve(common: &Arc<Common>, proxies: &[(String, Arc<Proxy>)], listen: SocketAddr, allowed_hosts: Vec<String>) -> anyhow::Result<()> {
    let mut router = axum::Router::new();
    let mut paths = Vec::new();
    for (name, proxy) in proxies {
        let mut config = StreamableHttpServerConfig::default()
            .with_sse_keep_alive(None)
            .with_legacy_session_mode(false)
            .with_json_response(true)
            .with_cancellation_token(common.shutdown.child_token());
        if !allowed_hosts.is_empty() {
            let mut hosts = config.allowed_hosts.clone();
            hosts.extend(allowed_hosts.iter().cloned());
            config = config.with_allowed_hosts(hosts);
        }
        let factory = Arc::clone(proxy);
        let service: StreamableHttpService<ProxyService, LocalSessionManager> =
            StreamableHttpService::new(move || Ok(ProxyService(Arc::clone(&factory))), Default::default(), config);
        let path = if name.is_empty() { "/mcp".to_string() } else { format!("/{name}/mcp") };
        let checked = axum::Router::new().nest_service(&path, service).layer(middleware::from_fn_with_state(proxy.settings.max_message_bytes, check_body));
        router = router.merge(checked);
        paths.push(path);
    }
    let metrics = Arc::clone(&common.metrics);
    let router = router.route("/metrics", axum::routing::get(move || async move { metrics.to_prometheus() }));
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| anyhow::anyhow!("cannot listen on {listen}: {e}"))?;
    let local = listener.local_addr()?;
    let urls: Vec<String> = paths.iter().map(|path| format!("http://{local}{path}")).collect();
    eprintln!("agent-retry proxy at {} (Ctrl-C stops it)", urls.join(" "));
    let stop = common.shutdown.clone();
    let serving = axum::serve(listener, router).with_graceful_shutdown(async move { stop.cancelled_owned().await });
    // A stop waits for open connections at most STOP_GRACE: one that sends
    // half a request and waits must not keep a stopped proxy alive.
    let stop = common.shutdown.clone();
    tokio::select! {
        served = serving => served?,
        () = async move {
            stop.cancelled().await;
            tokio::time::sleep(STOP_GRACE).await;
        } => {}
    }
    Ok(())
}

/// How long a stop waits for open HTTP connections.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

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
