//! Against a probe MCP server over stdio: the warning about tools without
//! hints is given once per connection (issue 25, "Docs for users"), and a
//! traced call's `tools/call` carries its attempt span's W3C `traceparent` in
//! `params._meta` (docs/events.md, "Traces"). The test binary is its own
//! server (`--serve-probe`).

use crate::lines::Lines;

use std::sync::Arc;

use agent_retry_host::mcp::{McpConnection, Metrics, RetryingToolCaller, RetryingToolCallerOptions, SharedConnection, ToolAnswer};
use agent_retry_host::otel::OtelTracer;
use agent_retry_host::otel::opentelemetry::trace::{SpanKind, Status};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, PolicyInstance, default_wasm_path};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData, ListToolsResult, PaginatedRequestParams, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{RoleServer, ServerHandler, ServiceExt};
use serde_json::{Map, json};

pub const SERVE: &str = "--serve-probe";

/// Serves the probe over stdio (the binary started with `--serve-probe`).
pub async fn serve_probe() {
    let service = ProbeServer.serve(rmcp::transport::stdio()).await.unwrap();
    let _ = service.waiting().await;
}

/// Two tools without annotations and one read; every call answers with the
/// `traceparent` its request's `_meta` carried.
struct ProbeServer;

impl ServerHandler for ProbeServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(&self, _request: Option<PaginatedRequestParams>, _context: RequestContext<RoleServer>) -> Result<ListToolsResult, ErrorData> {
        let schema = json!({"type": "object", "properties": {}});
        let tools = json!([
            {"name": "plain_a", "inputSchema": schema},
            {"name": "plain_b", "inputSchema": schema},
            {"name": "lookup", "inputSchema": schema, "annotations": {"readOnlyHint": true}},
        ]);
        let tools: Vec<Tool> = serde_json::from_value(tools).map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(&self, _request: CallToolRequestParams, context: RequestContext<RoleServer>) -> Result<CallToolResponse, ErrorData> {
        let traceparent = context.meta.get_traceparent().unwrap_or("none").to_string();
        Ok(CallToolResult::success(vec![ContentBlock::text(format!("traceparent={traceparent}"))]).into())
    }
}

fn probe() -> McpConnection {
    McpConnection::stdio(&std::env::current_exe().unwrap().display().to_string(), &[SERVE.into()])
}

fn instance() -> PolicyInstance {
    let component = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(1))).unwrap()
}

pub async fn tools_without_hints_are_warned_about_once_per_connection() {
    let lines = Lines::default();
    let _guard = tracing::subscriber::set_default(lines.clone());
    let warnings = || lines.0.lock().unwrap().iter().filter(|l| l.get("event") == Some(&json!("agent_retry.tools_without_hints"))).cloned().collect::<Vec<_>>();

    // Two runs over one connection: each lists the tools, one warning.
    let shared = SharedConnection::new(probe()).unwrap();
    for run_id in ["W-1", "W-2"] {
        let caller = shared.caller_for_run(instance(), "{}", run_id, RetryingToolCallerOptions::default(), Arc::new(Metrics::new())).await.unwrap();
        caller.finish().await.unwrap();
    }
    shared.close().await;
    let once = warnings();
    assert_eq!(once.len(), 1, "once per connection: {once:?}");
    assert_eq!(once[0]["count"], json!(2), "{once:?}");
    assert_eq!(once[0]["tools"], json!("plain_a, plain_b"), "the read tool is described: {once:?}");
    assert_eq!(once[0]["run"], json!("W-1"));

    // Another connection warns again.
    let caller = RetryingToolCaller::connect(probe(), instance(), "{}", "W-3", RetryingToolCallerOptions::default(), Arc::new(Metrics::new())).await.unwrap();
    caller.finish().await.unwrap();
    assert_eq!(warnings().len(), 2, "{:?}", warnings());
}

/// The text the probe answered `lookup` with.
async fn call_lookup(caller: &mut RetryingToolCaller) -> String {
    let answer = caller.call("lookup", Map::new()).await.unwrap();
    let ToolAnswer::Done { result: Some(result), .. } = answer else { panic!("{answer:?}") };
    serde_json::to_value(&result).unwrap()["content"][0]["text"].as_str().unwrap().to_string()
}

pub async fn a_traced_call_sends_its_attempt_spans_traceparent() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
    let options = RetryingToolCallerOptions { tracer: Some(OtelTracer::from_provider(&provider)), ..Default::default() };
    let mut caller = RetryingToolCaller::connect(probe(), instance(), "{}", "T-1", options, Arc::new(Metrics::new())).await.unwrap();
    let text = call_lookup(&mut caller).await;
    caller.finish().await.unwrap();

    let spans = exporter.get_finished_spans().unwrap();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
    assert_eq!(names, ["tools/call lookup", "execute_tool lookup"], "the connect and tools/list make no call span");
    let (attempt, call) = (&spans[0], &spans[1]);
    assert_eq!(attempt.span_kind, SpanKind::Client);
    assert_eq!(attempt.parent_span_id, call.span_context.span_id());
    assert_eq!(attempt.status, Status::Unset);
    let attribute = |name: &str| attempt.attributes.iter().find(|kv| kv.key.as_str() == name).map(|kv| kv.value.to_string());
    assert_eq!(attribute("mcp.method.name").as_deref(), Some("tools/call"));
    assert_eq!(attribute("gen_ai.tool.name").as_deref(), Some("lookup"));
    assert_eq!(attribute("agent_retry.action").as_deref(), Some("succeed"));
    assert_eq!(attribute("http.request.resend_count"), None, "a first attempt");
    let context = attempt.span_context.clone();
    let sent = format!("traceparent=00-{}-{}-{:02x}", context.trace_id(), context.span_id(), context.trace_flags().to_u8());
    assert_eq!(text, sent, "the server saw the attempt span's context");

    // Without a tracer nothing is traced, and nothing is sent.
    let mut untraced =
        RetryingToolCaller::connect(probe(), instance(), "{}", "T-2", RetryingToolCallerOptions::default(), Arc::new(Metrics::new())).await.unwrap();
    assert_eq!(call_lookup(&mut untraced).await, "traceparent=none");
    untraced.finish().await.unwrap();
}
