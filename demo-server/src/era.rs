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
}

/// The one revision a modern-only server speaks.
pub const MODERN_VERSION: &str = "2026-07-28";

impl Era {
    /// `dual` or `modern`, as the command line spells it.
    pub fn parse(text: &str) -> Result<Era, String> {
        match text {
            "dual" => Ok(Era::Dual),
            "modern" => Ok(Era::Modern),
            other => Err(format!("unknown era '{other}': expected 'dual' or 'modern'")),
        }
    }

    /// The JSON-RPC error body to answer instead of running the request, if
    /// this era refuses it. `method` and `id` are the request's; `header_version`
    /// is its `MCP-Protocol-Version` header.
    pub fn refusal(self, method: &str, id: &Value, header_version: Option<&str>) -> Option<String> {
        if self == Era::Dual {
            return None;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_modern_server_refuses_initialize_and_older_headers_only() {
        let id = json!(1);
        assert!(Era::Dual.refusal("initialize", &id, None).is_none());
        let refused = Era::Modern.refusal("initialize", &id, None).expect("initialize is refused");
        let body: Value = serde_json::from_str(&refused).unwrap();
        assert_eq!(body["error"]["code"], -32022);
        assert_eq!(body["error"]["data"]["supported"], json!(["2026-07-28"]));
        assert!(Era::Modern.refusal("tools/call", &id, Some("2025-11-25")).is_some());
        assert!(Era::Modern.refusal("tools/call", &id, Some("2026-07-28")).is_none());
        assert!(Era::Modern.refusal("server/discover", &id, None).is_none());
        assert!(Era::parse("legacy").is_err());
    }
}
