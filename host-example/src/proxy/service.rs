//! The proxy as an MCP server: every `tools/call` is one run of the policy
//! against the upstream server; everything else goes through untouched.
//!
//! A proxy cannot see where an agent's run begins or ends, so each tool call is
//! a run of its own (its key derived from a run id unique to the call, or the
//! key the client sent). What spans calls is shared: the account budget, the
//! circuit breakers and the retry ratio (in this process, or on Redis for
//! every proxy of an account).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelledNotificationParam, ClientNotification, ClientRequest, CompleteRequestParams,
    CompleteResult, ContentBlock, CustomNotification, CustomRequest, CustomResult, DiscoverResult, GetMeta, GetPromptRequestParams, GetPromptResponse,
    InitializeRequestParams, InitializeResult, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities, ServerConfig, ServerResult, SubscribeRequestParams,
    TASKS_EXTENSION_ID, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RequestContext, ServiceError};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use agent_retry_host::mcp::{CallError, Clock, Metrics, RetryingToolCaller, RetryingToolCallerOptions, SharedConnection, ToolAnswer};
use agent_retry_host::shared_state::SharedStateBackend;
use agent_retry_host::{AccountBudgetBackend, EntropySource, HostServices, Outcome};

use super::policy::ProxyPolicy;
use super::relay::Downstream;
use super::settings::Settings;
use super::webhook::Webhook;

/// What every upstream of one proxy process shares: the policy, the account
/// budget, the breakers' state, the counters, and the stop.
pub struct Common {
    pub policy: ProxyPolicy,
    pub accounts: Arc<dyn AccountBudgetBackend>,
    pub shared_state: Arc<dyn SharedStateBackend>,
    pub metrics: Arc<Metrics>,
    /// Cancelled when the proxy stops: calls in flight are cancelled upstream.
    pub shutdown: CancellationToken,
    /// Spans of every call and attempt, when an OTLP endpoint is given.
    pub tracer: Option<agent_retry_host::otel::OtelTracer>,
    /// Makes run ids unique to this proxy process, across restarts.
    instance: String,
    calls: AtomicU64,
}

impl Common {
    pub fn new(
        policy: ProxyPolicy,
        accounts: Arc<dyn AccountBudgetBackend>,
        shared_state: Arc<dyn SharedStateBackend>,
        tracer: Option<agent_retry_host::otel::OtelTracer>,
    ) -> Arc<Self> {
        let mut entropy = [0u8; 6];
        let _ = getrandom::fill(&mut entropy);
        let instance = format!("proxy-{}", entropy.iter().map(|b| format!("{b:02x}")).collect::<String>());
        Arc::new(Common {
            policy,
            accounts,
            shared_state,
            metrics: Arc::new(Metrics::new()),
            shutdown: CancellationToken::new(),
            tracer,
            instance,
            calls: AtomicU64::new(0),
        })
    }
}

/// One upstream server behind the proxy, and what its clients share.
pub struct Proxy {
    pub common: Arc<Common>,
    pub settings: Settings,
    pub upstream: Arc<SharedConnection>,
    /// The upstream server's name for the breakers and the logs.
    pub server_name: String,
    pub downstream: Arc<Downstream>,
    /// Whether the server's requests can be relayed to one client (stdio).
    pub relays_requests: bool,
    pub webhook: Option<Webhook>,
    /// What the proxy says of itself ([`Proxy::info`]).
    info: std::sync::Mutex<Option<ServerConfig>>,
    /// Tool calls in flight, so that stopping lets them cancel upstream first.
    in_flight: tokio::sync::watch::Sender<usize>,
}

impl Proxy {
    pub fn new(
        common: &Arc<Common>,
        settings: Settings,
        upstream: Arc<SharedConnection>,
        server_name: String,
        downstream: Arc<Downstream>,
        relays_requests: bool,
    ) -> Self {
        let webhook = settings.escalation_webhook.clone().map(Webhook::new);
        Proxy {
            common: Arc::clone(common),
            settings,
            upstream,
            server_name,
            downstream,
            relays_requests,
            webhook,
            info: std::sync::Mutex::new(None),
            in_flight: tokio::sync::watch::channel(0).0,
        }
    }

    /// The upstream server as logs and webhooks show it: an HTTP URL by its
    /// scheme, host and port, a command by its program (a query, a path or an
    /// argument may hold a credential). The breakers get the full name.
    pub fn shown_server(&self) -> String {
        shown(&self.server_name)
    }

    /// What the proxy says of itself: the upstream server's capabilities and
    /// identity, without the tasks extension (the proxy drives a task to its
    /// end, so its client gets a plain result). Until the upstream server
    /// answers, tools only: a call then fails under the policy, and the proxy
    /// stays up.
    pub fn info(&self) -> ServerConfig {
        self.info.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_else(|| ServerConfig::new(ServerCapabilities::builder().enable_tools().build()))
    }

    /// Reads the upstream server's information again (connecting if no
    /// session is up), for at most [`SESSION_SET_UP`], or until the proxy stops.
    pub async fn refresh_info(&self) {
        let connecting = tokio::time::timeout(SESSION_SET_UP, self.upstream.session_peer());
        let peer = match tokio::select! { connected = connecting => connected, () = self.common.shutdown.cancelled() => return } {
            Ok(Ok(peer)) => peer,
            Ok(Err(outcome)) => {
                tracing::warn!(target: "agent_retry", event = "agent_retry.proxy_upstream_unreachable", server = %self.shown_server(), "{}", describe(&outcome));
                return;
            }
            Err(_) => {
                let detail = format!("no answer in {} s", SESSION_SET_UP.as_secs());
                tracing::warn!(target: "agent_retry", event = "agent_retry.proxy_upstream_unreachable", server = %self.shown_server(), "{detail}");
                return;
            }
        };
        let Some(upstream) = peer.peer_info() else { return };
        let mut info = ServerConfig::new(upstream.capabilities.clone());
        if let Some(extensions) = info.capabilities.extensions.as_mut() {
            extensions.remove(TASKS_EXTENSION_ID);
        }
        if let Some(server) = &upstream.server_info {
            info.server_info = server.clone();
        }
        info.instructions = upstream.instructions.clone();
        *self.info.lock().unwrap_or_else(|p| p.into_inner()) = Some(info);
    }

    /// Waits (at most `max`) for the calls in flight to end: after
    /// [`Common::shutdown`] each cancels its request upstream and ends.
    /// Whether any call was in flight.
    pub async fn drain(&self, max: std::time::Duration) -> bool {
        let mut calls = self.in_flight.subscribe();
        let busy = *calls.borrow() > 0;
        let _ = tokio::time::timeout(max, calls.wait_for(|n| *n == 0)).await;
        busy
    }

    /// One tool call, as one run of the policy.
    async fn call_tool(&self, params: CallToolRequestParams, context: RequestContext<RoleServer>) -> Result<CallToolResult, ErrorData> {
        self.in_flight.send_modify(|n| *n += 1);
        let _counted = InFlight(&self.in_flight);
        self.run_call(params, context).await
    }

    async fn run_call(&self, params: CallToolRequestParams, context: RequestContext<RoleServer>) -> Result<CallToolResult, ErrorData> {
        let serving = self.common.policy.serving();
        let services = HostServices::new(Arc::clone(&self.common.accounts), EntropySource::Os).with_shared_state(Arc::clone(&self.common.shared_state));
        let instance =
            serving.component.instantiate(services).map_err(|e| ErrorData::internal_error(format!("agent-retry proxy: the policy cannot start: {e}"), None))?;
        let run_id = format!("{}-{}", self.common.instance, self.common.calls.fetch_add(1, Ordering::Relaxed) + 1);
        let mut options = RetryingToolCallerOptions {
            attempt_timeout_ms: self.settings.attempt_timeout_ms,
            key_argument: self.settings.key_argument.clone(),
            clock: Clock::real(),
            policy_identity: serving.identity,
            call_timeout_ms: self.settings.call_timeout_ms,
            server_name: Some(self.server_name.clone()),
            tracer: self.common.tracer.clone(),
            ..Default::default()
        };
        // Progress goes on to the client under the token it gave, in order, and
        // all of it before the answer (one task sends it; the answer waits for it).
        let mut progress_sent = None;
        if let Some(token) = context.meta.get_progress_token() {
            let (progress, mut to_send) = tokio::sync::mpsc::unbounded_channel::<ProgressNotificationParam>();
            let peer = context.peer.clone();
            progress_sent = Some(tokio::spawn(async move {
                while let Some(param) = to_send.recv().await {
                    let _ = peer.notify_progress(param).await;
                }
            }));
            options.on_progress = Some(Arc::new(move |_tool: &str, done: f64, total: Option<f64>, message: Option<&str>| {
                let mut param = ProgressNotificationParam::new(token.clone(), done);
                param.total = total;
                param.message = message.map(str::to_string);
                let _ = progress.send(param);
            }));
        }
        let cancel = self.cancel_with(&context.ct);
        // However the call ends, its watcher of the client and the stop ends too.
        let _watching = cancel.clone().drop_guard();
        let tool = params.name.to_string();
        let arguments: Map<String, Value> = params.arguments.unwrap_or_default();
        let started = RetryingToolCaller::for_run(&self.upstream, instance, &serving.config_json, &run_id, options, Arc::clone(&self.common.metrics));
        let mut caller = match tokio::select! { started = started => started, () = cancel.cancelled() => return Err(cancelled()) } {
            Ok(caller) => caller,
            Err(error) => {
                return match error.downcast::<CallError>() {
                    Ok(error) => self.answer(&run_id, &tool, Err(error)),
                    Err(other) => Err(ErrorData::internal_error(format!("agent-retry proxy: {other:#}"), None)),
                };
            }
        };
        for (write, check) in &self.settings.status_checks {
            caller = caller.with_status_check(write, check.clone().into_check());
        }
        let answer = caller.call_until(&tool, arguments, &cancel).await;
        cancel.cancel();
        // Finishing drops the caller and its progress hook: the sending task ends once it sent all.
        let _ = caller.finish().await;
        if let Some(sent) = progress_sent {
            let _ = sent.await;
        }
        self.answer(&run_id, &tool, answer)
    }

    /// A token cancelled when the client cancels the request or the proxy stops.
    fn cancel_with(&self, request: &CancellationToken) -> CancellationToken {
        let cancel = CancellationToken::new();
        let (request, shutdown, done) = (request.clone(), self.common.shutdown.clone(), cancel.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = request.cancelled() => done.cancel(),
                () = shutdown.cancelled() => done.cancel(),
                () = done.cancelled() => {}
            }
        });
        cancel
    }

    /// What the client sees of the call's end: the result, or an `isError`
    /// result with the policy's message (a replan) or note (an escalation).
    fn answer(&self, run_id: &str, tool: &str, answer: Result<ToolAnswer, CallError>) -> Result<CallToolResult, ErrorData> {
        match answer {
            Ok(ToolAnswer::Done { result: Some(result), .. }) => Ok(result),
            // A status check found the write applied: nothing new to show but that.
            Ok(ToolAnswer::Done { result: None, note }) => {
                Ok(CallToolResult::success(vec![ContentBlock::text(note.unwrap_or_else(|| format!("{tool}: done")))]))
            }
            Ok(ToolAnswer::Replan(message)) => Ok(CallToolResult::error(vec![ContentBlock::text(message)])),
            Err(CallError::Escalated(escalation)) => {
                let reason = agent_retry_host::labels::reason(escalation.reason);
                tracing::warn!(
                    target: "agent_retry",
                    event = "agent_retry.proxy_escalation",
                    ts = agent_retry_host::events::unix_seconds(),
                    run = run_id,
                    tool,
                    server = %self.shown_server(),
                    reason,
                    "{}",
                    escalation.note
                );
                if let Some(webhook) = &self.webhook {
                    webhook.announce(run_id, tool, &self.shown_server(), reason, &escalation.note);
                }
                Ok(CallToolResult::error(vec![ContentBlock::text(escalation.note)]))
            }
            Err(CallError::Cancelled(_)) => Err(cancelled()),
            // The session could not be set up, or a breaker refused it: the policy's words, for the model.
            Err(CallError::SessionLost(message)) => Ok(CallToolResult::error(vec![ContentBlock::text(message)])),
            Err(CallError::TimedOut(stopped)) => Ok(CallToolResult::error(vec![ContentBlock::text(format!("agent-retry: {}", CallError::TimedOut(stopped)))])),
            Err(other) => Err(ErrorData::internal_error(format!("agent-retry proxy: {other}"), None)),
        }
    }

    /// Sends `request` upstream as the client sent it (less the protocol
    /// metadata, which the upstream session sets for its own revision).
    async fn forward(&self, mut request: ClientRequest, context: RequestContext<RoleServer>) -> Result<ServerResult, ErrorData> {
        let meta = request.get_meta_mut();
        for key in ["io.modelcontextprotocol/protocolVersion", "io.modelcontextprotocol/clientInfo", "io.modelcontextprotocol/clientCapabilities"] {
            meta.0.remove(key);
        }
        let no_answer = || ErrorData::internal_error(format!("agent-retry proxy: the upstream server did not answer in {} s", UPSTREAM_ANSWER.as_secs()), None);
        let peer = match tokio::time::timeout(UPSTREAM_ANSWER, self.upstream.session_peer()).await {
            Ok(connected) => connected.map_err(unreachable)?,
            Err(_) => return Err(no_answer()),
        };
        let handle = peer.send_request_with_option(request, PeerRequestOptions::no_options()).await.map_err(upstream_error)?;
        let id = handle.id.clone();
        let gave_up = |reason: &str| CancelledNotificationParam::new(Some(id.clone()), Some(reason.to_string()));
        tokio::select! {
            answered = handle.await_response() => answered.map_err(upstream_error),
            () = context.ct.cancelled() => {
                let _ = peer.notify_cancelled(gave_up("the client cancelled")).await;
                Err(cancelled())
            }
            () = tokio::time::sleep(UPSTREAM_ANSWER) => {
                let _ = peer.notify_cancelled(gave_up("no answer in time")).await;
                Err(no_answer())
            }
        }
    }
}

/// How long the proxy waits for the upstream server where no policy bounds
/// the wait: a request passed through (the TypeScript SDK's default).
const UPSTREAM_ANSWER: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a client's `initialize` (or the HTTP form's start) waits for the
/// upstream's session; then the proxy answers with tools only, and a call
/// fails under the policy.
const SESSION_SET_UP: std::time::Duration = std::time::Duration::from_secs(10);

/// `server` (a URL, or `stdio:` and a command line) without what may hold a credential.
fn shown(server: &str) -> String {
    if let Some(command) = server.strip_prefix("stdio:") {
        return format!("stdio:{}", command.split(' ').next().unwrap_or_default());
    }
    match reqwest::Url::parse(server) {
        Ok(url) => agent_retry_host::mcp::http_client::shown_url(&url),
        Err(_) => "(upstream)".into(),
    }
}

/// One call in flight, counted down however it ends (a client's
/// disconnection drops its future).
struct InFlight<'a>(&'a tokio::sync::watch::Sender<usize>);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// The upstream server could not be reached for a request outside the policy.
fn unreachable(outcome: Outcome) -> ErrorData {
    ErrorData::internal_error(format!("agent-retry proxy: the upstream server cannot be reached: {}", describe(&outcome)), None)
}

fn describe(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Failure(observation) => observation.body.clone(),
        _ => "no session".into(),
    }
}

/// The upstream's failure, as the client is told it: a JSON-RPC error the
/// server answered is relayed as it is (over streamable HTTP it may come with
/// an HTTP error status, as a body the transport hands back); anything else is
/// the proxy's `-32603`.
fn upstream_error(error: ServiceError) -> ErrorData {
    if let ServiceError::McpError(error) = error {
        return error;
    }
    if let Outcome::Failure(observation) = agent_retry_host::mcp::observe::from_error(&error, false)
        && let Some(relayed) = json_rpc_error_in(&observation.body)
    {
        return relayed;
    }
    ErrorData::internal_error(format!("agent-retry proxy: the upstream server did not answer: {}", describe_error(&error)), None)
}

/// The JSON-RPC error object of an answer `body`, if it is one.
fn json_rpc_error_in(body: &str) -> Option<ErrorData> {
    let answer: Value = serde_json::from_str(body.get(body.find('{')?..)?).ok()?;
    serde_json::from_value(answer.get("error")?.clone()).ok()
}

/// A transport failure in a sentence (not rmcp's type names).
fn describe_error(error: &ServiceError) -> String {
    match agent_retry_host::mcp::observe::from_error(error, false) {
        Outcome::Failure(observation) if !observation.body.is_empty() => observation.body,
        _ => "the session ended".into(),
    }
}

fn cancelled() -> ErrorData {
    ErrorData::internal_error("agent-retry proxy: the request was cancelled", None)
}

/// One client's view of the proxy (over HTTP, one per request).
#[derive(Clone)]
pub struct ProxyService(pub Arc<Proxy>);

impl ProxyService {
    /// Over stdio, the one client the upstream server's requests are relayed to.
    fn note_client(&self, context: &RequestContext<RoleServer>) {
        if self.0.relays_requests && !context.peer.is_transport_closed() {
            self.0.downstream.set_peer(context.peer.clone());
        }
    }

    /// `method` with `params` sent upstream, its answer read as `R`.
    async fn pass<P: serde::Serialize, R: serde::de::DeserializeOwned>(
        &self,
        method: &str,
        params: Option<P>,
        context: RequestContext<RoleServer>,
    ) -> Result<R, ErrorData> {
        let answer = self.pass_raw(method, params, context).await?;
        let value = serde_json::to_value(answer).map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        serde_json::from_value(value)
            .map_err(|e| ErrorData::internal_error(format!("agent-retry proxy: the upstream answer to {method} is not one: {e}"), None))
    }

    async fn pass_raw<P: serde::Serialize>(&self, method: &str, params: Option<P>, context: RequestContext<RoleServer>) -> Result<ServerResult, ErrorData> {
        self.note_client(&context);
        let mut message = serde_json::json!({ "method": method });
        if let Some(params) = params {
            message["params"] = serde_json::to_value(params).map_err(|e| ErrorData::invalid_params(e.to_string(), None))?;
        }
        let request: ClientRequest = serde_json::from_value(message).map_err(|e| ErrorData::invalid_params(e.to_string(), None))?;
        self.0.forward(request, context).await
    }

    /// An answer that may ask for input first (2026-07-28): passed back as it is.
    async fn pass_or_input<P: serde::Serialize, R: serde::de::DeserializeOwned, T>(
        &self,
        method: &str,
        params: P,
        context: RequestContext<RoleServer>,
        complete: impl FnOnce(R) -> T,
        input: impl FnOnce(rmcp::model::InputRequiredResult) -> T,
    ) -> Result<T, ErrorData> {
        match self.pass_raw(method, Some(params), context).await? {
            ServerResult::InputRequiredResult(asked) => Ok(input(asked)),
            other => {
                let value = serde_json::to_value(other).map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
                serde_json::from_value(value)
                    .map(complete)
                    .map_err(|e| ErrorData::internal_error(format!("agent-retry proxy: the upstream answer to {method} is not one: {e}"), None))
            }
        }
    }

    async fn notify_upstream(&self, notification: ClientNotification) {
        if let Ok(peer) = self.0.upstream.session_peer().await {
            let _ = peer.send_notification(notification).await;
        }
    }
}

impl ServerHandler for ProxyService {
    fn get_info(&self) -> ServerConfig {
        self.0.info()
    }

    async fn initialize(&self, request: InitializeRequestParams, context: RequestContext<RoleServer>) -> Result<InitializeResult, ErrorData> {
        self.note_client(&context);
        // Over stdio, the upstream session declares what its one client declared
        // (over HTTP, clients come and go: the proxy declares nothing of theirs).
        if self.0.relays_requests {
            self.0.downstream.set_client(request.clone());
        }
        self.0.refresh_info().await;
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn discover(&self, context: RequestContext<RoleServer>) -> Result<DiscoverResult, ErrorData> {
        self.note_client(&context);
        self.0.refresh_info().await;
        Ok(DiscoverResult::from_server_info(self.supported_protocol_versions().into_owned(), self.0.info()))
    }

    async fn call_tool(&self, request: CallToolRequestParams, context: RequestContext<RoleServer>) -> Result<CallToolResponse, ErrorData> {
        self.note_client(&context);
        self.0.call_tool(request, context).await.map(CallToolResponse::Complete)
    }

    async fn list_tools(&self, request: Option<PaginatedRequestParams>, context: RequestContext<RoleServer>) -> Result<ListToolsResult, ErrorData> {
        self.pass("tools/list", request, context).await
    }

    async fn list_prompts(&self, request: Option<PaginatedRequestParams>, context: RequestContext<RoleServer>) -> Result<ListPromptsResult, ErrorData> {
        self.pass("prompts/list", request, context).await
    }

    async fn get_prompt(&self, request: GetPromptRequestParams, context: RequestContext<RoleServer>) -> Result<GetPromptResponse, ErrorData> {
        self.pass_or_input("prompts/get", request, context, GetPromptResponse::Complete, GetPromptResponse::InputRequired).await
    }

    async fn list_resources(&self, request: Option<PaginatedRequestParams>, context: RequestContext<RoleServer>) -> Result<ListResourcesResult, ErrorData> {
        self.pass("resources/list", request, context).await
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        self.pass("resources/templates/list", request, context).await
    }

    async fn read_resource(&self, request: ReadResourceRequestParams, context: RequestContext<RoleServer>) -> Result<ReadResourceResponse, ErrorData> {
        self.pass_or_input("resources/read", request, context, ReadResourceResponse::Complete, ReadResourceResponse::InputRequired).await
    }

    async fn subscribe(&self, request: SubscribeRequestParams, context: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        self.pass_raw("resources/subscribe", Some(request), context).await.map(drop)
    }

    async fn unsubscribe(&self, request: UnsubscribeRequestParams, context: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        self.pass_raw("resources/unsubscribe", Some(request), context).await.map(drop)
    }

    async fn complete(&self, request: CompleteRequestParams, context: RequestContext<RoleServer>) -> Result<CompleteResult, ErrorData> {
        self.pass("completion/complete", Some(request), context).await
    }

    // Logging is deprecated in 2026-07-28 (SEP-2577); older clients still set it.
    #[allow(deprecated)]
    async fn set_level(&self, request: rmcp::model::SetLevelRequestParams, context: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        self.pass_raw("logging/setLevel", Some(request), context).await.map(drop)
    }

    async fn on_custom_request(&self, request: CustomRequest, context: RequestContext<RoleServer>) -> Result<CustomResult, ErrorData> {
        // A method of the protocol rmcp could not read (`tools/call` without
        // its params) is the client's mistake: never sent upstream, outside the policy.
        if request.method.starts_with("tools/") || request.method == "initialize" {
            return Err(ErrorData::invalid_params(format!("agent-retry proxy: {} needs its params", request.method), None));
        }
        self.note_client(&context);
        match self.0.forward(ClientRequest::CustomRequest(request), context).await? {
            ServerResult::CustomResult(result) => Ok(result),
            other => Ok(CustomResult(serde_json::to_value(other).unwrap_or_default())),
        }
    }

    async fn on_roots_list_changed(&self, _context: NotificationContext<RoleServer>) {
        self.notify_upstream(ClientNotification::RootsListChangedNotification(Default::default())).await;
    }

    async fn on_custom_notification(&self, notification: CustomNotification, _context: NotificationContext<RoleServer>) {
        self.notify_upstream(ClientNotification::CustomNotification(notification)).await;
    }
}
