//! The proxy's own settings (`--settings FILE`, JSON): what the policy's
//! configuration does not say, because it is about the MCP side of the calls.
//! An unknown member, or a value of the wrong type, is refused at start with
//! the member named: a typo never silently turns a status check off.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use agent_retry_host::mcp::ListedCheck;

/// The most bytes of one JSON-RPC message a client may send by default (4 MiB):
/// larger ones are refused with a JSON-RPC error before they are parsed.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 << 20;

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Settings {
    /// The argument an idempotency key goes in, for tools whose input schema
    /// has it (the wrappers' `key_argument`). A key the client already put
    /// there is sent unchanged.
    #[serde(default = "default_key_argument")]
    pub key_argument: String,
    /// Caps how long an attempt waits without an answer or progress (ms);
    /// by default the policy's `idle-timeout-ms` for the tool decides.
    #[serde(default)]
    pub attempt_timeout_ms: Option<u64>,
    /// A call stops after this long, its retries and waits included (ms).
    #[serde(default)]
    pub call_timeout_ms: Option<u64>,
    /// How to learn whether an ambiguous write was applied: the write tool's
    /// name, then the read tool that lists what was applied (docs/proxy.md).
    #[serde(default)]
    pub status_checks: BTreeMap<String, ListedCheck>,
    /// An escalation is also POSTed here as JSON, so that a person hears of it.
    #[serde(default)]
    pub escalation_webhook: Option<String>,
    /// The largest JSON-RPC message a client may send, in bytes.
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
}

fn default_key_argument() -> String {
    "idempotency_key".into()
}

fn default_max_message_bytes() -> usize {
    DEFAULT_MAX_MESSAGE_BYTES
}

impl Default for Settings {
    fn default() -> Self {
        serde_json::from_str("{}").expect("the defaults parse")
    }
}

impl Settings {
    /// Reads `path`; a bad file is an error naming the file and what is wrong in it.
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read the proxy settings {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("the proxy settings {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let settings: Settings = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if settings.key_argument.is_empty() {
            return Err("key-argument must not be empty".into());
        }
        if settings.max_message_bytes < 1024 {
            return Err(format!("max-message-bytes is {}: at least 1024 bytes, so that an initialize fits", settings.max_message_bytes));
        }
        if let Some(url) = &settings.escalation_webhook
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(format!("escalation-webhook must be an http:// or https:// URL, not '{url}'"));
        }
        Ok(settings)
    }
}
