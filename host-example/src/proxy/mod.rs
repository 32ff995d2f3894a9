//! `agent-retry proxy`: the policy between any MCP client and any MCP server,
//! for agent hosts that cannot load a component (docs/proxy.md).
//!
//! - `policy`: which policy decides (fixed, or live from files or a fleet);
//! - `settings`: the proxy's own settings file; `servers`: several upstreams;
//! - `service`: the MCP server the client sees (tool calls under the policy,
//!   the rest passed through);
//! - `relay`: what the upstream server asks or says, relayed to the client;
//! - `framing`, `http`: the stdio and HTTP forms, each refusing oversized and
//!   malformed messages with a JSON-RPC error;
//! - `webhook`: an escalation announced to a person.

mod framing;
mod http;
mod policy;
mod relay;
mod servers;
mod service;
mod settings;
mod webhook;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rmcp::ServiceExt;

use agent_retry_host::mcp::{McpConnection, SharedConnection};
use agent_retry_host::shared_state::{EmbeddedSharedState, FallbackSharedState, SharedStateBackend};
use agent_retry_host::{
    AccountBudgetBackend, EmbeddedAccounts, EntropySource, FleetSource, HostServices, LivePolicy, PolicyComponent, PolicySource, RedisAccounts, SharedAccounts,
};

pub use settings::Settings;

use policy::ProxyPolicy;
use relay::{Downstream, Relay};
use servers::{Server, Upstream};
use service::{Common, Proxy, ProxyService};

/// `agent-retry proxy`'s command line (its help is these comments).
#[derive(clap::Args)]
pub struct ProxyOptions {
    /// The upstream server's streamable-HTTP URL (instead of a command after --).
    #[arg(long, conflicts_with = "command")]
    pub upstream: Option<String>,
    /// Several upstream servers, each under its name at http://ADDR/NAME/mcp,
    /// with settings of their own (a JSON file; needs --listen; docs/proxy.md).
    #[arg(long, conflicts_with_all = ["upstream", "command"], requires = "listen")]
    pub servers: Option<PathBuf>,
    /// Serve streamable HTTP at http://ADDR/mcp (and /metrics) instead of stdio.
    #[arg(long)]
    pub listen: Option<String>,
    /// Also accept this Host header over HTTP (loopback names are always
    /// accepted; repeat for several): the proxy's name behind a load balancer.
    #[arg(long = "allow-host", requires = "listen")]
    pub allowed_hosts: Vec<String>,
    /// The policy's configuration (JSON), updated live with --wasm when either changes.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Take the policy a fleet publishes in this Redis instead (redis://host:port/).
    #[arg(long, conflicts_with = "config")]
    pub fleet: Option<String>,
    /// The fleet's key prefix.
    #[arg(long, default_value = agent_retry_host::fleet::DEFAULT_PREFIX)]
    pub prefix: String,
    /// Accept only policies whose signed manifest verifies under this Ed25519 key (64 hex digits).
    #[arg(long)]
    pub public_key: Option<String>,
    /// How often to look for a policy update (0: never).
    #[arg(long, default_value_t = 1000)]
    pub watch_ms: u64,
    /// The proxy's settings (JSON): key argument, status checks, timeouts,
    /// escalation webhook, message limit (docs/proxy.md).
    #[arg(long)]
    pub settings: Option<PathBuf>,
    /// Share account budgets, circuit breakers and retry ratios with every
    /// proxy and worker of the account on this Redis (redis://host:port/).
    #[arg(long)]
    pub redis: Option<String>,
    /// How many proxies share the account: while Redis is down each takes this share.
    #[arg(long, default_value_t = 1, requires = "redis")]
    pub workers: u32,
    /// Serve the counters (Prometheus text) at http://ADDR/metrics.
    #[arg(long)]
    pub metrics: Option<String>,
    /// Also trust the CA certificates in this PEM file (an https upstream with a private CA).
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// Export a span for every call and attempt (docs/events.md, "Traces")
    /// as OTLP/HTTP JSON to this URL, e.g. http://127.0.0.1:4318/v1/traces.
    #[arg(long)]
    pub otlp_endpoint: Option<String>,
    /// The upstream server's command and arguments (stdio).
    #[arg(last = true)]
    pub command: Vec<String>,
}

pub async fn proxy(wasm: PathBuf, options: ProxyOptions) -> anyhow::Result<()> {
    // stdout is the stdio client's: the log goes to stderr, one JSON line each.
    crate::commands::init_json_log(std::io::stderr);
    let settings = match &options.settings {
        Some(path) => Settings::read(path)?,
        None => Settings::default(),
    };
    let servers = match (&options.servers, &options.upstream, options.command.is_empty()) {
        (Some(path), None, true) => {
            if options.listen.is_none() {
                anyhow::bail!("--servers needs --listen: several servers are served over HTTP, each at /NAME/mcp");
            }
            servers::read(path, &settings)?
        }
        (None, Some(url), true) => vec![Server { name: String::new(), upstream: Upstream::Url(url.clone()), settings }],
        (None, None, false) => vec![Server { name: String::new(), upstream: Upstream::Command(options.command.clone()), settings }],
        _ => anyhow::bail!("give the upstream server: --upstream URL, its command after --, or --servers FILE"),
    };
    let policy = open_policy(&wasm, &options)?;
    if options.watch_ms > 0 {
        let _watcher = policy.watch(Duration::from_millis(options.watch_ms));
    }
    let (accounts, shared_state): (Arc<dyn AccountBudgetBackend>, Arc<dyn SharedStateBackend>) = match &options.redis {
        Some(url) => (Arc::new(SharedAccounts::new(RedisAccounts::connect(url)?, options.workers.max(1))), Arc::new(FallbackSharedState::open(url)?)),
        None => (Arc::new(EmbeddedAccounts::new()), Arc::new(EmbeddedSharedState::new())),
    };
    let traces = options.otlp_endpoint.as_deref().map(tracer_provider).transpose()?;
    let tracer = traces.as_ref().map(agent_retry_host::otel::OtelTracer::from_provider);
    let common = Common::new(policy, accounts, shared_state, tracer);
    let stdio = options.listen.is_none();
    let ca = options.ca_file.as_deref().map(std::fs::read).transpose()?;
    let mut proxies = Vec::new();
    for server in servers {
        let proxy = open_upstream(&common, server.upstream, server.settings, ca.as_deref(), stdio)?;
        proxies.push((server.name, Arc::new(proxy)));
    }
    stop_on_signals(common.shutdown.clone())?;
    if let Some(addr) = &options.metrics {
        let metrics = Arc::clone(&common.metrics);
        let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("cannot listen on {addr} for --metrics: {e}"))?;
        let router = axum::Router::new().route("/metrics", axum::routing::get(move || async move { metrics.to_prometheus() }));
        tokio::spawn(async move { axum::serve(listener, router).await });
    }
    let served = match &options.listen {
        Some(listen) => {
            let addr: SocketAddr = listen.parse().map_err(|e| anyhow::anyhow!("--listen {listen}: not an address such as 127.0.0.1:8080 ({e})"))?;
            // Stateless: every request needs the upstream's information at once.
            futures::future::join_all(proxies.iter().map(|(_, proxy)| proxy.refresh_info())).await;
            http::serve(&common, &proxies, addr, options.allowed_hosts.clone()).await
        }
        None => serve_stdio(Arc::clone(&proxies[0].1)).await,
    };
    // Calls in flight are cancelled upstream before the upstream sessions close.
    common.shutdown.cancel();
    let mut busy = false;
    for (_, proxy) in &proxies {
        busy |= proxy.drain(Duration::from_secs(3)).await;
    }
    if busy {
        // A cancelled request's `notifications/cancelled` is sent from a task
        // of its own as the request is dropped: it goes before the session closes.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (_, proxy) in &proxies {
        proxy.upstream.close().await;
    }
    if let Some(traces) = traces {
        // The spans still in the batch are sent before the proxy exits.
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
    served
}

/// The traces URL of `endpoint`: a collector's base URL (`http://host:4318`,
/// as OpenTelemetry's own variables give it) gets `/v1/traces`.
fn traces_url(endpoint: &str) -> String {
    match reqwest::Url::parse(endpoint) {
        Ok(url) if url.path() == "/" || url.path().is_empty() => format!("{}/v1/traces", endpoint.trim_end_matches('/')),
        _ => endpoint.to_string(),
    }
}

/// Spans exported as OTLP/HTTP (JSON) to `endpoint`, e.g.
/// `http://collector:4318/v1/traces`, in batches, as `agent-retry-proxy`.
fn tracer_provider(endpoint: &str) -> anyhow::Result<opentelemetry_sdk::trace::SdkTracerProvider> {
    use opentelemetry_otlp::{Protocol, WithExportConfig};
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpJson)
        .with_endpoint(traces_url(endpoint))
        .build()
        .map_err(|e| anyhow::anyhow!("--otlp-endpoint {endpoint}: {e}"))?;
    let resource = opentelemetry_sdk::Resource::builder().with_service_name("agent-retry-proxy").build();
    Ok(opentelemetry_sdk::trace::SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}

/// The connection to one upstream server, and the proxy in front of it.
fn open_upstream(common: &Arc<Common>, upstream: Upstream, settings: Settings, ca: Option<&[u8]>, stdio: bool) -> anyhow::Result<Proxy> {
    let downstream = Arc::new(Downstream::default());
    let handler = Arc::new(Relay { downstream: Arc::clone(&downstream) });
    let connection = match upstream {
        Upstream::Url(url) => {
            let connection = McpConnection::try_http(&url)?;
            match ca {
                Some(pem) => connection.with_root_certificates_pem(pem)?,
                None => connection,
            }
        }
        Upstream::Command(command) => {
            let (program, args) = command.split_first().ok_or_else(|| anyhow::anyhow!("an empty command"))?;
            McpConnection::stdio(program, args)
        }
    };
    let connection = connection.with_handler(handler).reusing_tool_lists();
    let server_name = connection.server_name();
    let connection = SharedConnection::new(connection)?;
    downstream.set_upstream(&connection);
    Ok(Proxy::new(common, settings, connection, server_name, downstream, stdio))
}

/// SIGINT (Ctrl-C) and SIGTERM (`docker stop`, Kubernetes) stop the proxy as
/// the client's leaving does: calls in flight are cancelled upstream first.
fn stop_on_signals(stop: tokio_util::sync::CancellationToken) -> anyhow::Result<()> {
    #[cfg(unix)]
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::spawn(async move {
        #[cfg(unix)]
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        stop.cancel();
    });
    Ok(())
}

/// The stdio form: until the client closes stdin (or a signal).
async fn serve_stdio(proxy: Arc<Proxy>) -> anyhow::Result<()> {
    let stop = proxy.common.shutdown.clone();
    let transport = framing::frame(tokio::io::stdin(), tokio::io::stdout(), proxy.settings.max_message_bytes, stop.clone());
    let running = ProxyService(Arc::clone(&proxy)).serve_with_ct(transport, stop.child_token()).await?;
    running.waiting().await?;
    Ok(())
}

fn open_policy(wasm: &std::path::Path, options: &ProxyOptions) -> anyhow::Result<ProxyPolicy> {
    let integrity = crate::commands::watch::integrity(None, options.public_key.as_deref())?;
    if let Some(url) = &options.fleet {
        let fleet = FleetSource::new(url.clone()).with_prefix(options.prefix.clone());
        return Ok(ProxyPolicy::Live(Arc::new(LivePolicy::open_fleet(fleet, integrity)?)));
    }
    if let Some(config) = &options.config {
        let source = PolicySource { wasm: wasm.to_path_buf(), config: config.clone(), integrity, vectors: None, gate_vectors: Vec::new() };
        return Ok(ProxyPolicy::Live(Arc::new(LivePolicy::open(source)?)));
    }
    // No configuration: the defaults, checked once before any client is served.
    let component = Arc::new(PolicyComponent::from_file(wasm)?);
    let mut instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::Os))?;
    if let Err(e) = instance.load_policy("{}")? {
        anyhow::bail!("the policy refuses its default configuration: {}", e.message);
    }
    Ok(ProxyPolicy::Fixed { component, config_json: "{}".into() })
}
