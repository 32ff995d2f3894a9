//! Which MCP revisions the demo server speaks over HTTP. rmcp's server speaks
//! both eras (2026-07-28 without a handshake, and 2025-11-25 and older with
//! `initialize`); `Modern` refuses the older one as a server that implements
//! only 2026-07-28 does: HTTP 400 with JSON-RPC −32022 (unsupported protocol
//! version) and the versions it supports in `data.supported`
//! (https://modelcontextprotocol.io/specification/2026-07-28/basic/lifecycle).

use serde_json::{Value, json};

/// The revisions served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Era {
    /// 2026-07-28 and the revisions with a handshake (rmcp's own negotiation).
    #[default]
    Dual,
    /// 2026-07-28 only: `initialize`, and any request naming an older revision
    /// in `MCP-Protocol-Version`, is refused.
    Modern,
    /// 2025-11-25 with its handshake, answering `server/discover` with a result
    /// that lists 2025-11-25 alone, as go-sdk's stateful servers do: a client
    /// must fall back to `initialize`, not speak 2025-11-25 without it.
    Handshake,
}

/// The one revision a modern-only server speaks.
pub const MODERN_VERSION: &str = "2026-07-28";

impl Era {
    /// `dual` or `modern`, as the command line spells it.
    pub fn parse(text: &str) -> Result<Era, String> {
        match text {
            "dual" => Ok(Era::Dual),
            "modern" => Ok(Era::Modern),
            "handshake" => Ok(Era::Handshake),
            other => Err(format!("unknown era '{other}': expected 'dual', 'modern' or 'handshake'")),
        }
    }

    /// The JSON-RPC body to answer instead of running the request, if this era
    /// answers it itself (a modern server's refusal, a handshake server's discovery). `method` and `id` are the request's; `header_version`
    /// is its `MCP-Protocol-Version` header.
    /// `has_session`: the request carried `Mcp-Session-Id`.
    pub fn refusal(self, method: &str, id: &Value, header_version: Option<&str>, has_session: bool) -> Option<String> {
        match self {
            Era::Dual => return None,
            Era::Handshake if method == "server/discover" => return Some(handshake_discovery(id)),
            // Its revision has no requests before `initialize`: refused as
            // server-everything refuses them.
            Era::Handshake if !has_session && method != "initialize" && !method.starts_with("notifications/") => {
                return Some(json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32000, "message": "Bad Request: Server not initialized"}}).to_string());
            }
            Era::Handshake => return None,
            Era::Modern => {}
        }
        let requested = match (method, header_version) {
            ("initialize", _) => "(initialize handshake)".to_string(),
            (_, Some(version)) if version != MODERN_VERSION => version.to_string(),
            _ => return None,
        };
        let body = json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {
                "code": -32022,
                "message": "Unsupported protocol version",
                "data": { "supported": [MODERN_VERSION], "requested": requested },
            },
        });
        Some(body.to_string())
    }
}

/// A discovery that lists only the handshake's revision (see [`Era::Handshake`]).
fn handshake_discovery(id: &Value) -> String {
    let result = json!({
        "resultType": "complete",
        "supportedVersions": ["2025-11-25"],
        // As rmcp's own answers (initialize, server/discover) say.
        "capabilities": { "tools": {}, "extensions": { "io.modelcontextprotocol/tasks": {} } },
        "serverInfo": { "name": "agent-retry-demo", "version": "handshake-era" },
        "ttlMs": 0,
        "cacheScope": "private",
    });
    json!({ "jsonrpc": "2.0", "id": id, "result": result }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_modern_server_refuses_initialize_and_older_headers_only() {
        let id = json!(1);
        assert!(Era::Dual.refusal("initialize", &id, None, false).is_none());
        let refused = Era::Modern.refusal("initialize", &id, None, false).expect("initialize is refused");
        let body: Value = serde_json::from_str(&refused).unwrap();
        assert_eq!(body["error"]["code"], -32022);
        assert_eq!(body["error"]["data"]["supported"], json!(["2026-07-28"]));
        assert!(Era::Modern.refusal("tools/call", &id, Some("2025-11-25"), false).is_some());
        assert!(Era::Modern.refusal("tools/call", &id, Some("2026-07-28"), false).is_none());
        assert!(Era::Modern.refusal("server/discover", &id, None, false).is_none());
        assert!(Era::parse("legacy").is_err());
        let listed: Value = serde_json::from_str(&Era::Handshake.refusal("server/discover", &id, None, false).unwrap()).unwrap();
        assert_eq!(listed["result"]["supportedVersions"], json!(["2025-11-25"]));
        assert!(Era::Handshake.refusal("initialize", &id, None, false).is_none());
        assert!(Era::Handshake.refusal("tools/list", &id, None, false).is_some(), "no request before the handshake");
        assert!(Era::Handshake.refusal("tools/list", &id, None, true).is_none());
    }
}
