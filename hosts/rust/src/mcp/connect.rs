//! Connecting an rmcp client, over streamable HTTP or a child process's stdio.

use rmcp::model::ClientConfig;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};

use super::http_client::RecordingHttpClient;

/// A connected MCP client.
pub type McpClient = RunningService<RoleClient, ClientConfig>;

/// Connects to a streamable-HTTP MCP server at `url`.
pub async fn connect_http(url: &str) -> anyhow::Result<McpClient> {
    let config = StreamableHttpClientTransportConfig::with_uri(url.to_string());
    let transport = StreamableHttpClientTransport::with_client(RecordingHttpClient::new(), config);
    Ok(ClientConfig::default().serve(transport).await?)
}

/// Starts `program args...` and speaks MCP over its stdin/stdout.
pub async fn connect_stdio(program: &str, args: &[String]) -> anyhow::Result<McpClient> {
    let mut command = tokio::process::Command::new(program);
    command.args(args);
    let transport = TokioChildProcess::new(command)?;
    Ok(ClientConfig::default().serve(transport).await?)
}
