//! Connecting an rmcp client, over streamable HTTP or a child process's stdio,
//! and connecting again when the session is lost.

use rmcp::model::ClientConfig;
use rmcp::service::{ClientInitializeError, Peer, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};

use super::http_client::RecordingHttpClient;
use super::observe;
use crate::component::types::{Outcome, TransportError};

/// A connected MCP client.
pub type McpClient = RunningService<RoleClient, ClientConfig>;

/// Connects to a streamable-HTTP MCP server at `url`, with the capturing client.
pub async fn connect_http(url: &str) -> anyhow::Result<McpClient> {
    Ok(ClientConfig::default().serve(http_transport(url)).await?)
}

/// Starts `program args...` and speaks MCP over its stdin/stdout.
pub async fn connect_stdio(program: &str, args: &[String]) -> anyhow::Result<McpClient> {
    let mut command = tokio::process::Command::new(program);
    command.args(args);
    let transport = TokioChildProcess::new(command)?;
    Ok(ClientConfig::default().serve(transport).await?)
}

/// rmcp's streamable-HTTP transport over the capturing client. rmcp's own
/// re-initialisation after a 404 is off: it would resend the request outside
/// the policy; the wrapper sets the session up again as a call of the policy.
fn http_transport(url: &str) -> StreamableHttpClientTransport<RecordingHttpClient> {
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_string());
    config.reinit_on_expired_session = false;
    StreamableHttpClientTransport::with_client(RecordingHttpClient::new(), config)
}

#[derive(Clone, Debug)]
enum Endpoint {
    Http { url: String },
    Stdio { program: String, args: Vec<String> },
}

/// A connection the wrapper owns: it knows how to connect, over HTTP with the
/// status- and header-capturing client or over stdio by starting the server,
/// and how to connect again after the session is lost (a new `initialize`
/// over HTTP; a new process over stdio).
pub struct McpConnection {
    endpoint: Endpoint,
    config: ClientConfig,
    client: Option<McpClient>,
    lost: bool,
    /// Sessions set up so far: after the first, a connect is a reconnection.
    sessions: u32,
}

impl McpConnection {
    /// A streamable-HTTP server at `url` (e.g. `http://127.0.0.1:8080/mcp`).
    pub fn http(url: &str) -> Self {
        McpConnection { endpoint: Endpoint::Http { url: url.to_string() }, config: ClientConfig::default(), client: None, lost: false, sessions: 0 }
    }

    /// A server the wrapper starts as `program args...` and speaks to on stdio;
    /// started again when it exits.
    pub fn stdio(program: &str, args: &[String]) -> Self {
        McpConnection {
            endpoint: Endpoint::Stdio { program: program.to_string(), args: args.to_vec() },
            config: ClientConfig::default(),
            client: None,
            lost: false,
            sessions: 0,
        }
    }

    /// What the client says of itself in `initialize` (its name and version,
    /// capabilities, the protocol version it asks for; rmcp's defaults if not set).
    pub fn with_client_config(mut self, config: ClientConfig) -> Self {
        self.config = config;
        self
    }

    /// The session's peer, if it is connected and not known lost.
    pub fn peer(&self) -> Option<Peer<RoleClient>> {
        self.client.as_ref().filter(|_| !self.lost).map(|c| c.peer().clone())
    }

    /// Whether the next request needs a new session first.
    pub fn needs_connect(&self) -> bool {
        self.lost || self.client.as_ref().is_none_or(|c| c.peer().is_transport_closed())
    }

    /// Marks the session lost: the next [`McpConnection::connect`] replaces it.
    pub fn mark_lost(&mut self) {
        self.lost = true;
    }

    /// Connects (again): closes what is left of the old session (and its
    /// process), then starts a new one. A failure is observed as the contract's
    /// outcome, for the policy to decide on.
    pub async fn connect(&mut self) -> Result<(), Outcome> {
        if let Some(old) = self.client.take() {
            // Closing a dead session can hang on its transport; it gets a second.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), old.cancel()).await;
        }
        let client = match &self.endpoint {
            Endpoint::Http { url } => self.config.clone().serve(http_transport(url)).await.map_err(|e| from_initialize_error(&e))?,
            Endpoint::Stdio { program, args } => {
                let mut command = tokio::process::Command::new(program);
                command.args(args);
                // A server that cannot be started never saw a request.
                let transport =
                    TokioChildProcess::new(command).map_err(|e| observe::transport_failure(TransportError::ConnectionRefused, format!("{program}: {e}")))?;
                self.config.clone().serve(transport).await.map_err(|e| from_initialize_error(&e))?
            }
        };
        self.client = Some(client);
        self.lost = false;
        self.sessions += 1;
        Ok(())
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

/// What an `initialize` that failed looked like, as an outcome.
fn from_initialize_error(error: &ClientInitializeError) -> Outcome {
    match error {
        ClientInitializeError::TransportError { error, .. } => observe::from_transport_error(error.error.as_ref()),
        ClientInitializeError::JsonRpcError(e) => observe::from_error_data(e),
        ClientInitializeError::ConnectionClosed(detail) => observe::transport_failure(TransportError::StreamClosed, detail.clone()),
        other => observe::transport_failure(TransportError::Other, other.to_string()),
    }
}
