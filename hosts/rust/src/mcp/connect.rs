//! Connecting an rmcp client, over streamable HTTP or a child process's stdio,
//! and connecting again when the session is lost. Every connection negotiates
//! its MCP revision (rmcp's `ClientLifecycleMode::Auto`): `server/discover`
//! first (2026-07-28, no handshake), `initialize` with 2025-11-25 when the
//! server answers as an older one.

use std::fmt;
use std::sync::Arc;

use rmcp::model::{ClientConfig, ProtocolVersion, Tool};
use rmcp::service::{ClientInitializeError, Peer, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient};

use rmcp::handler::client::progress::ProgressDispatcher;

use super::http_client::{ProbeReader, RecordingHttpClient};
use super::observe;
use super::session_client::{ClientHandlerRef, SessionClient};
use crate::component::Outcome;
use crate::component::types::{Delivery, TransportError};

/// A connected MCP client.
pub type McpClient = RunningService<RoleClient, ClientConfig>;

/// A session of an [`McpConnection`].
type OwnedClient = RunningService<RoleClient, SessionClient>;

/// What the wrapper asks for in `server/discover`: the revisions without the
/// handshake (a server that lists only older ones gets `initialize`, see
/// `http_client::handshake_era_discovery`).
pub const PREFERRED_VERSIONS: [ProtocolVersion; 1] = [ProtocolVersion::V_2026_07_28];

/// The revision the wrapper asks for in `initialize`, with a server of the handshake.
pub const HANDSHAKE_VERSION: ProtocolVersion = ProtocolVersion::V_2025_11_25;

/// How every connection of the wrapper starts: negotiated (see the module's doc).
pub fn negotiating_lifecycle() -> ClientLifecycleMode {
    ClientLifecycleMode::Auto { preferred_versions: PREFERRED_VERSIONS.to_vec(), legacy_version: Some(HANDSHAKE_VERSION) }
}

/// A connection that cannot work as configured: no retry would help, so it is
/// never shown to the policy as a failed attempt. Returned by
/// [`McpConnection::try_http`] and, inside the `anyhow::Error`, by
/// `RetryingToolCaller::connect`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionConfigError {
    /// The setting at fault: `url` or `root_certificates_pem` (the Python and
    /// Node hosts' `option`, spelled as there).
    pub option: &'static str,
    /// The URL as given.
    pub url: String,
    /// What is wrong, in words.
    pub reason: String,
}

impl fmt::Display for ConnectionConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot connect to {:?}: {}: {}", self.url, self.option, self.reason)
    }
}

impl std::error::Error for ConnectionConfigError {}

/// Whether this build can serve `url`: http://, and https:// with the `tls` feature.
fn check_url(url: &str) -> Result<(), ConnectionConfigError> {
    let refuse = |reason: String| Err(ConnectionConfigError { option: "url", url: url.to_string(), reason });
    let parsed = match reqwest::Url::parse(url) {
        Ok(parsed) => parsed,
        Err(e) => return refuse(format!("not a URL ({e})")),
    };
    match parsed.scheme() {
        "http" => Ok(()),
        "https" if cfg!(feature = "tls") => Ok(()),
        "https" => refuse("https:// needs agent-retry-host's `tls` feature (on by default), which this build leaves out".into()),
        other => refuse(format!("the scheme '{other}' is not served: the wrapper speaks streamable HTTP, at http:// or https:// URLs")),
    }
}

/// Connects to a streamable-HTTP MCP server at `url`, with the capturing client
/// (a refused `server/discover` probe is read by the default component:
/// [`crate::PolicyComponent::load`]`(None)`).
pub async fn connect_http(url: &str) -> anyhow::Result<McpClient> {
    check_url(url)?;
    Ok(ClientConfig::default().serve_with_lifecycle(http_transport(url, RecordingHttpClient::new()), negotiating_lifecycle()).await?)
}

/// Starts `program args...` and speaks MCP over its stdin/stdout.
pub async fn connect_stdio(program: &str, args: &[String]) -> anyhow::Result<McpClient> {
    let mut command = tokio::process::Command::new(program);
    command.args(args);
    let transport = TokioChildProcess::new(command)?;
    Ok(ClientConfig::default().serve_with_lifecycle(transport, negotiating_lifecycle()).await?)
}

/// rmcp's streamable-HTTP transport over the capturing client. rmcp's own
/// re-initialisation after a 404 is off: it would resend the request outside
/// the policy; the wrapper sets the session up again as a call of the policy.
fn http_transport(url: &str, client: RecordingHttpClient) -> StreamableHttpClientTransport<RecordingHttpClient> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_string());
    config.reinit_on_expired_session = false;
    StreamableHttpClientTransport::with_client(client, config)
}

#[derive(Clone)]
enum Endpoint {
    /// `client` is built once, so a reconnection keeps its roots and pool;
    /// `refused` is why the URL cannot be served, found when it was given.
    Http {
        url: String,
        client: RecordingHttpClient,
        refused: Option<ConnectionConfigError>,
    },
    Stdio {
        program: String,
        args: Vec<String>,
    },
}

/// A connection the wrapper owns: it knows how to connect, over HTTP with the
/// status- and header-capturing client or over stdio by starting the server,
/// and how to connect again after the session is lost (a new `initialize`
/// over HTTP; a new process over stdio). Every session declares the tasks
/// extension and routes progress notifications to the wrapper.
pub struct McpConnection {
    endpoint: Endpoint,
    config: ClientConfig,
    handler: Option<ClientHandlerRef>,
    progress: ProgressDispatcher,
    lifecycle: ClientLifecycleMode,
    client: Option<OwnedClient>,
    lost: bool,
    /// Sessions set up so far: after the first, a connect is a reconnection.
    sessions: u32,
    /// The warning about tools without hints was given (once per connection).
    hints_warned: bool,
    /// Runs of a shared connection take the tools another run listed on the
    /// same session ([`McpConnection::reusing_tool_lists`]).
    reuse_tool_lists: bool,
    /// The last listing and the session it was made on.
    listed_tools: Option<(u32, Arc<Vec<Tool>>)>,
}

impl McpConnection {
    /// The server as the policy's circuit breakers are told it, the same in
    /// every host: the HTTP URL as given (the policy keeps it without its
    /// query, user information or default port), or `stdio:` and the command
    /// line, its parts joined by single spaces.
    pub fn server_name(&self) -> String {
        match &self.endpoint {
            Endpoint::Http { url, .. } => url.clone(),
            Endpoint::Stdio { program, args } => {
                std::iter::once(program.as_str()).chain(args.iter().map(String::as_str)).fold(String::from("stdio:"), |mut name, part| {
                    if name.len() > "stdio:".len() {
                        name.push(' ');
                    }
                    name.push_str(part);
                    name
                })
            }
        }
    }

    /// A streamable-HTTP server at `url` (e.g. `http://127.0.0.1:8080/mcp`, or
    /// `https://`, trusted through the platform's roots). A URL this build
    /// cannot serve is kept as a [`ConnectionConfigError`]: `RetryingToolCaller::connect`
    /// returns it before anything is sent ([`McpConnection::try_http`] returns it at once).
    pub fn http(url: &str) -> Self {
        let refused = check_url(url).err();
        Self::with_endpoint(Endpoint::Http { url: url.to_string(), client: RecordingHttpClient::new(), refused })
    }

    /// As [`McpConnection::http`], refusing a URL this build cannot serve.
    pub fn try_http(url: &str) -> Result<Self, ConnectionConfigError> {
        check_url(url)?;
        Ok(Self::http(url))
    }

    /// A server the wrapper starts as `program args...` and speaks to on stdio;
    /// started again when it exits.
    pub fn stdio(program: &str, args: &[String]) -> Self {
        Self::with_endpoint(Endpoint::Stdio { program: program.to_string(), args: args.to_vec() })
    }

    fn with_endpoint(endpoint: Endpoint) -> Self {
        McpConnection {
            endpoint,
            config: ClientConfig::default(),
            handler: None,
            progress: ProgressDispatcher::new(),
            lifecycle: negotiating_lifecycle(),
            client: None,
            lost: false,
            sessions: 0,
            hints_warned: false,
            reuse_tool_lists: false,
            listed_tools: None,
        }
    }

    /// Also trusts the CA certificates in `pem` (one or more PEM blocks), beside
    /// the platform's roots: for a server whose certificate a private CA signed.
    /// Bad PEM is a [`ConnectionConfigError`].
    #[cfg(feature = "tls")]
    pub fn with_root_certificates_pem(mut self, pem: &[u8]) -> Result<Self, ConnectionConfigError> {
        let Endpoint::Http { url, client, .. } = &mut self.endpoint else {
            return Ok(self);
        };
        let refuse = |reason: String| ConnectionConfigError { option: "root_certificates_pem", url: url.clone(), reason };
        let certificates = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| refuse(format!("the root certificates are not PEM: {e}")))?;
        if certificates.is_empty() {
            return Err(refuse("the root certificates' PEM holds no certificate".into()));
        }
        let built = reqwest::Client::builder()
            .tls_certs_merge(certificates)
            .build()
            .map_err(|e| refuse(format!("the HTTP client cannot be built with those roots: {e}")))?;
        *client = RecordingHttpClient::with_client(built);
        Ok(self)
    }

    /// How it starts a connection: [`negotiating_lifecycle`] unless set here
    /// (e.g. `ClientLifecycleMode::Initialize` for the handshake alone).
    pub fn with_lifecycle(mut self, lifecycle: ClientLifecycleMode) -> Self {
        self.lifecycle = lifecycle;
        self
    }

    /// Why this connection cannot work as configured, if it cannot.
    pub fn configuration_error(&self) -> Option<&ConnectionConfigError> {
        match &self.endpoint {
            Endpoint::Http { refused, .. } => refused.as_ref(),
            Endpoint::Stdio { .. } => None,
        }
    }

    /// What the client says of itself (its name and version, capabilities; in
    /// `initialize` also the revision it asks for; rmcp's defaults if not set).
    pub fn with_client_config(mut self, config: ClientConfig) -> Self {
        self.config = config;
        self
    }

    /// Answers what the server asks with `handler` (any `rmcp::ClientHandler`,
    /// e.g. `Arc::new(my_handler.into_dyn())`): its elicitation, sampling and
    /// roots answer the input a continuation (`input_required`) or a task asks
    /// for, and what it says of itself replaces the client configuration.
    /// Without one, such input is reported to the policy as nobody's
    /// (`input-required`).
    pub fn with_handler(mut self, handler: ClientHandlerRef) -> Self {
        self.handler = Some(handler);
        self
    }

    /// The application's handler, if it gave one.
    pub fn handler(&self) -> Option<&ClientHandlerRef> {
        self.handler.as_ref()
    }

    /// Where the sessions' progress notifications go, by progress token.
    pub(crate) fn progress(&self) -> &ProgressDispatcher {
        &self.progress
    }

    /// The session's peer, if it is connected and not known lost.
    pub fn peer(&self) -> Option<Peer<RoleClient>> {
        self.client.as_ref().filter(|_| !self.lost).map(|c| c.peer().clone())
    }

    /// Runs that share this connection ([`SharedConnection`]) take the tools
    /// another run listed on the same session instead of listing them again: a
    /// proxy's one run per tool call then costs no `tools/list`. A new session,
    /// or [`SharedConnection::forget_listed_tools`] (the server said its list
    /// changed), has them listed again.
    pub fn reusing_tool_lists(mut self) -> Self {
        self.reuse_tool_lists = true;
        self
    }

    /// The tools listed on the current session, when they are reused.
    pub(crate) fn listed_tools_now(&self) -> Option<(u32, Arc<Vec<Tool>>)> {
        let (session, tools) = self.listed_tools.as_ref().filter(|_| self.reuse_tool_lists && !self.needs_connect())?;
        (*session == self.sessions).then(|| (*session, Arc::clone(tools)))
    }

    /// Keeps a listing made on session number `session`, when they are reused.
    pub(crate) fn remember_tools(&mut self, session: u32, tools: &[Tool]) {
        if self.reuse_tool_lists && session == self.sessions {
            self.listed_tools = Some((session, Arc::new(tools.to_vec())));
        }
    }

    /// Whether the next request needs a new session first.
    pub fn needs_connect(&self) -> bool {
        self.lost || self.client.as_ref().is_none_or(|c| c.peer().is_transport_closed())
    }

    /// Reads a refused `server/discover` probe's answer with `reader` (the
    /// policy's `read-probe-answer`); the wrapper gives it one on its policy.
    pub fn set_probe_reader(&self, reader: ProbeReader) {
        if let Endpoint::Http { client, .. } = &self.endpoint {
            client.set_probe_reader(reader);
        }
    }

    /// Whether the last request carried `Mcp-Session-Id` (a session of the
    /// 2025-11-25 handshake); false over stdio.
    pub fn session_id_sent(&self) -> bool {
        match &self.endpoint {
            Endpoint::Http { client, .. } => client.session_id_sent(),
            Endpoint::Stdio { .. } => false,
        }
    }

    /// Marks the session lost: the next [`McpConnection::connect`] replaces it.
    pub fn mark_lost(&mut self) {
        self.lost = true;
    }

    /// The session's peer and its number ([`McpConnection::sessions`] when
    /// it was set up), if it is connected and not known lost: a request
    /// remembers which session it went on.
    pub(crate) fn current_session(&self) -> Option<(Peer<RoleClient>, u32)> {
        self.peer().map(|peer| (peer, self.sessions))
    }

    /// Marks session number `session` lost, unless a newer one replaced it: a
    /// request that failed on an old session says nothing of the new one
    /// (which other runs of a shared connection may be using).
    pub(crate) fn mark_lost_if(&mut self, session: u32) {
        if session == self.sessions {
            self.lost = true;
        }
    }

    /// Sessions set up so far: 1 after the first connect, one more for each
    /// reconnection (a new `initialize` over HTTP, a new process over stdio).
    pub fn sessions(&self) -> u32 {
        self.sessions
    }

    /// Connects (again): closes what is left of the old session (and its
    /// process), then starts a new one. A failure is observed as the contract's
    /// outcome, for the policy to decide on.
    pub async fn connect(&mut self) -> Result<(), Outcome> {
        close_session(self.client.take()).await;
        let client = self.session_start().start().await?;
        self.install(client);
        Ok(())
    }

    /// What a new session starts from, apart from the connection (so that a
    /// shared connection is not held while a session starts).
    fn session_start(&self) -> SessionStart {
        SessionStart {
            endpoint: self.endpoint.clone(),
            service: SessionClient::new(self.config.clone(), self.handler.clone(), self.progress.clone()),
            lifecycle: self.lifecycle.clone(),
        }
    }

    fn install(&mut self, client: OwnedClient) {
        self.client = Some(client);
        self.lost = false;
        self.sessions += 1;
    }

    /// Whether the warning about tools without hints is still to be given on
    /// this connection: true the first time only.
    pub(crate) fn first_hints_warning(&mut self) -> bool {
        !std::mem::replace(&mut self.hints_warned, true)
    }

    /// Whether it speaks streamable HTTP (a session there can be suspect after a
    /// cut stream or a refused connection; a stdio session ends with its process).
    pub fn is_http(&self) -> bool {
        matches!(self.endpoint, Endpoint::Http { .. })
    }

    /// Whether a session was set up before (so the next connect is a reconnection).
    pub fn was_connected(&self) -> bool {
        self.sessions > 0
    }

    /// Ends the session (and stops the server process the wrapper started).
    pub async fn close(mut self) {
        if let Some(client) = self.client.take() {
            let _ = client.cancel().await;
        }
    }
}

/// Closes what is left of an old session (and its process).
async fn close_session(old: Option<OwnedClient>) {
    if let Some(old) = old {
        // Closing a dead session can hang on its transport; it gets a second.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), old.cancel()).await;
    }
}

/// A session about to start: where, with which client handler, how.
struct SessionStart {
    endpoint: Endpoint,
    service: SessionClient,
    lifecycle: ClientLifecycleMode,
}

impl SessionStart {
    async fn start(self) -> Result<OwnedClient, Outcome> {
        let SessionStart { endpoint, service, lifecycle } = self;
        match &endpoint {
            // `RetryingToolCaller::connect` refuses it first; a direct call gets
            // `other`, which the policy escalates and never retries.
            Endpoint::Http { refused: Some(refused), .. } => {
                Err(observe::transport_failure(TransportError::Other, Delivery::NotSent, refused.to_string(), false))
            }
            Endpoint::Http { url, client, refused: None } => {
                let transport = http_transport(url, client.clone());
                service.serve_with_lifecycle(transport, lifecycle).await.map_err(|e| from_initialize_error(&e))
            }
            Endpoint::Stdio { program, args } => {
                let mut command = tokio::process::Command::new(program);
                command.args(args);
                // A server that cannot be started never saw a request.
                let transport = TokioChildProcess::new(command)
                    .map_err(|e| observe::transport_failure(TransportError::ConnectionRefused, Delivery::NotSent, format!("{program}: {e}"), false))?;
                service.serve_with_lifecycle(transport, lifecycle).await.map_err(|e| from_initialize_error(&e))
            }
        }
    }
}

/// A connection several runs share: each run has a caller of its own
/// ([`SharedConnection::caller_for_run`]: its policy run, report, budgets and
/// reconnection allowance), and all use one session (one server process over
/// stdio), set up again once for all when it is lost.
pub struct SharedConnection {
    connection: std::sync::Mutex<McpConnection>,
    /// One session set-up at a time: a run that waited for it finds it done.
    connecting: tokio::sync::Mutex<()>,
    /// Closed for good ([`SharedConnection::close`]): no run connects again.
    closed: std::sync::atomic::AtomicBool,
}

impl SharedConnection {
    /// Shares `connection`; a URL this build cannot serve is refused at once.
    pub fn new(connection: McpConnection) -> Result<Arc<Self>, ConnectionConfigError> {
        if let Some(refused) = connection.configuration_error() {
            return Err(refused.clone());
        }
        let connection = std::sync::Mutex::new(connection);
        Ok(Arc::new(SharedConnection { connection, connecting: tokio::sync::Mutex::new(()), closed: std::sync::atomic::AtomicBool::new(false) }))
    }

    /// Reads or changes the connection (never across an await).
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut McpConnection) -> R) -> R {
        f(&mut self.connection.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Sets a session up unless one is up (another run may have just done
    /// it): whether this call set one up. After [`SharedConnection::close`],
    /// nothing is set up: the attempt is `other`, not sent.
    pub(crate) async fn connect(&self) -> Result<bool, Outcome> {
        let _turn = self.connecting.lock().await;
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            let detail = "not sent: the shared connection was closed".to_string();
            return Err(observe::transport_failure(TransportError::Other, Delivery::NotSent, detail, false));
        }
        let (old, start) = self.with(|c| if c.needs_connect() { Some((c.client.take(), c.session_start())) } else { None }).unzip();
        let Some(start) = start else { return Ok(false) };
        close_session(old.flatten()).await;
        let client = start.start().await?;
        self.with(|c| c.install(client));
        Ok(true)
    }

    /// Sessions set up so far, by every run ([`McpConnection::sessions`]).
    pub fn sessions(&self) -> u32 {
        self.with(|c| c.sessions())
    }

    /// The current session's peer, set up first if none is up: for requests
    /// no run's policy judges (a proxy's pass-through of lists, resources and
    /// prompts). A session that cannot be set up is the outcome the policy
    /// would read.
    pub async fn session_peer(&self) -> Result<Peer<RoleClient>, Outcome> {
        if let Some(peer) = self.with(|c| c.peer()) {
            return Ok(peer);
        }
        self.connect().await?;
        let detail = "not sent: the session closed as it was set up".to_string();
        self.with(|c| c.peer()).ok_or_else(|| observe::transport_failure(TransportError::StreamClosed, Delivery::NotSent, detail, false))
    }

    /// Drops the kept tool listing ([`McpConnection::reusing_tool_lists`]):
    /// the next run lists the tools again.
    pub fn forget_listed_tools(&self) {
        self.with(|c| c.listed_tools = None);
    }

    /// Ends the session (and stops the server process), for every run, for
    /// good: a run that needs a session after it gets none.
    pub async fn close(&self) {
        let _turn = self.connecting.lock().await;
        self.closed.store(true, std::sync::atomic::Ordering::Release);
        let client = self.with(|c| c.client.take());
        if let Some(client) = client {
            let _ = client.cancel().await;
        }
    }
}

/// What an `initialize` that failed looked like, as an outcome.
fn from_initialize_error(error: &ClientInitializeError) -> Outcome {
    match error {
        // No session exists while connecting: no `Mcp-Session-Id` was sent.
        ClientInitializeError::TransportError { error, .. } => observe::from_transport_error(error.error.as_ref(), false),
        ClientInitializeError::JsonRpcError(e) => observe::from_error_data(e, false),
        ClientInitializeError::ConnectionClosed(detail) => observe::transport_failure(TransportError::StreamClosed, Delivery::Unknown, detail.clone(), false),
        // The server answered the probe as an older one, then refused the
        // handshake too: the handshake's failure is what the server said last.
        ClientInitializeError::LegacyFallbackFailed { fallback, .. } => from_initialize_error(fallback),
        // `other` is escalated, never retried; the text names both lists.
        other => observe::transport_failure(TransportError::Other, Delivery::Unknown, other.to_string(), false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failure on an old session says nothing of the new one; on the
    /// current one it marks it lost.
    #[test]
    fn only_the_session_a_request_went_on_is_marked_lost() {
        let mut connection = McpConnection::stdio("agent-retry-test-no-such-server", &[]);
        connection.sessions = 2;
        connection.mark_lost_if(1);
        assert!(!connection.lost, "session 1's failure leaves session 2 alone");
        connection.mark_lost_if(2);
        assert!(connection.lost, "session 2's failure marks it lost");
    }
}
