//! What an MCP transport's answer means for the session and the revision: a
//! lost session, a refused MCP revision, a JSON-RPC error carried in an HTTP
//! body, and the answer to a negotiating client's `server/discover` probe.
//! These used to be three hosts' own rules, and they disagreed (issue 23); the
//! host now reports what it observed and this module decides, once.

use alloc::string::String;

use crate::json::{self, Json};
use crate::relayed;
use crate::types::ProbeAnswer;

/// JSON-RPC "unsupported protocol version" (MCP 2026-07-28, SEP-2575): the
/// server does not speak the revision the request carried.
pub const UNSUPPORTED_VERSION: i32 = -32022;
/// JSON-RPC "method not found" (JSON-RPC 2.0 §5.1).
pub const METHOD_NOT_FOUND: i32 = -32601;

/// The `error` object of a JSON-RPC response in an HTTP body, if the body is
/// one: its code and message. A transport's refusal is a small envelope, so
/// only a body within [`relayed::MAX_TEXT_BYTES`] is parsed: a large JSON page
/// costs nothing here. Spacing does not
/// matter (`{"code" : -32601}` is the same code).
pub fn json_rpc_error(body: &str) -> Option<(i32, String)> {
    let body = body.trim();
    if body.len() > relayed::MAX_TEXT_BYTES || !body.starts_with('{') {
        return None;
    }
    let Json::Object(members) = json::parse(body).ok()? else { return None };
    let (_, Json::Object(error)) = members.into_iter().find(|(k, _)| k == "error")? else { return None };
    let mut code = None;
    let mut message = String::new();
    for (key, value) in error {
        match (key.as_str(), value) {
            ("code", Json::Number(n)) => code = n.parse::<i32>().ok(),
            ("message", Json::String(m)) => message = m,
            _ => {}
        }
    }
    Some((code?, message))
}

/// The phrases that say an MCP session is not (or no longer) known, as the
/// SDKs' servers and clients word them: the TypeScript and Python servers'
/// "Bad Request: No valid session ID provided" and "Session not found", the
/// Go server's "session not found", rmcp's and the Python client's "Session
/// expired" and "Session terminated". `*` stands for the word "session".
const LOST_PHRASES: &[&str] = &[
    "no valid *",
    "no * found",
    "* not found",
    "* id not found",
    "* expired",
    "* has expired",
    "* id expired",
    "* terminated",
    "* has been terminated",
    "* was terminated",
    "* does not exist",
    "* id does not exist",
    "* is no longer valid",
    "* timed out",
    "* id is invalid",
    "* id is not valid",
    "* id is unknown",
    "invalid * id",
    "unknown * id",
];
/// Phrases that name a session only when nothing else follows them ("Invalid
/// session", but not "Invalid session name").
const LOST_AT_END: &[&str] = &["invalid *", "unknown *"];
/// Words that may come before a phrase about the MCP session. Any other word
/// says it is some other session: a tool's "upstream session", "training
/// session", "parameter session-id".
const MAY_PRECEDE: &str = "the this your mcp a requested given request bad";

/// Whether a text says the MCP session is not (or no longer) known (see
/// [`LOST_PHRASES`]). "session" must be a word of its own, so a tool's
/// `session_summary` or `session_count` never counts. Reads at most
/// [`relayed::MAX_TEXT_BYTES`]; words are compared without allocating.
pub fn says_session_lost(text: &str) -> bool {
    let words: alloc::vec::Vec<&str> =
        relayed::bounded(text, relayed::MAX_TEXT_BYTES).split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| !w.is_empty()).collect();
    let is = |i: usize, word: &str| words.get(i).is_some_and(|w| w.eq_ignore_ascii_case(if word == "*" { "session" } else { word }));
    // The phrase's length in words if it starts at `start`.
    let at = |start: usize, phrase: &str| phrase.split(' ').enumerate().all(|(k, word)| is(start + k, word)).then(|| phrase.split(' ').count());
    let preceded_well = |start: usize| start == 0 || MAY_PRECEDE.split(' ').any(|w| is(start - 1, w));
    (0..words.len()).any(|start| {
        let whole = LOST_PHRASES.iter().any(|p| at(start, p).is_some());
        let at_end = LOST_AT_END.iter().any(|p| at(start, p).is_some_and(|n| start + n == words.len()));
        (whole || at_end) && preceded_well(start)
    })
}

/// What an HTTP answer to a request means for the session and the revision,
/// if anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Meaning {
    /// The server does not know the session the request carried: it did not
    /// run the request. Connect again and resend.
    LostSession,
    /// The server refused the request's MCP revision (-32022): it did not run
    /// it. Connect again (negotiating) and resend, once.
    VersionRefused,
    /// A JSON-RPC error with this code answered the request (the server read it).
    JsonRpc(i32),
}

/// What an HTTP status and body mean: a 404 to a request that carried a
/// session id is a lost session (streamable HTTP, MCP 2025-11-25 "Session
/// Management"), unless its body is a JSON-RPC error, which the server
/// answered having read the request (rmcp answers "method not found" with
/// 404); a 400 or 404 is a lost session when its text says so. A 400 carrying
/// -32022 is a refused revision (a 2026-07-28 server's answer to a client it
/// does not speak with); no other status is overridden by its body.
pub fn http_meaning(status: u16, body: &str, session_id_sent: bool) -> Option<Meaning> {
    if !matches!(status, 400 | 404) {
        return None;
    }
    let error = json_rpc_error(body);
    if status == 400 && matches!(error, Some((UNSUPPORTED_VERSION, _))) {
        return Some(Meaning::VersionRefused);
    }
    // An invalid-params or method-not-found error is the tool's or the
    // method's: the server read the request.
    let read_by_server = matches!(error, Some((-32602 | METHOD_NOT_FOUND, _)));
    let text = error.as_ref().map_or(body, |(_, message)| message.as_str());
    match &error {
        _ if session_id_sent && !read_by_server && says_session_lost(text) => Some(Meaning::LostSession),
        None if status == 404 && session_id_sent => Some(Meaning::LostSession),
        Some((code, _)) => Some(Meaning::JsonRpc(*code)),
        None => None,
    }
}

/// What a JSON-RPC error means for the session and the revision: -32022 is a
/// refused revision; an SDK's invalid-request or connection-closed error that
/// says the session is gone, to a request that carried one, is a lost session
/// (the Python SDK's "Session terminated").
pub fn protocol_meaning(code: i32, message: &str, session_id_sent: bool) -> Option<Meaning> {
    match code {
        UNSUPPORTED_VERSION => Some(Meaning::VersionRefused),
        -32600 | -32000 | -32001 if session_id_sent && says_session_lost(message) => Some(Meaning::LostSession),
        _ => None,
    }
}

/// What an answer to `server/discover` that is not a discovery result means.
/// A server that asks to wait (408, 429), refuses the credentials (401, 403)
/// or fails (5xx) said nothing of its revision: that is the connect attempt's
/// failure. Any other 4xx, or a JSON-RPC error, is an older server refusing a
/// method it does not know: fall back to the `initialize` handshake.
pub fn read_probe_answer(http_status: Option<u16>, json_rpc_code: Option<i32>) -> ProbeAnswer {
    match http_status {
        Some(401 | 403 | 408 | 429 | 500..=599) => ProbeAnswer::Failure,
        Some(400..=499) => ProbeAnswer::OlderServer,
        _ if json_rpc_code.is_some() => ProbeAnswer::OlderServer,
        _ => ProbeAnswer::Failure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seven rows of issue 23, where three hosts gave three answers.
    #[test]
    fn the_seven_rows_get_one_answer() {
        let lost = |status, body| http_meaning(status, body, true);
        assert_eq!(lost(400, "Session expired"), Some(Meaning::LostSession));
        assert_eq!(lost(400, "Session terminated"), Some(Meaning::LostSession));
        assert_eq!(lost(400, "Bad Request: No valid session ID provided"), Some(Meaning::LostSession));
        assert_eq!(lost(400, "Tool not found: session_summary"), None);
        assert_eq!(lost(400, "invalid argument 'session_count'"), None);
        assert_eq!(lost(404, r#"{"error":{"code" : -32601}}"#), Some(Meaning::JsonRpc(-32601)));
        assert_eq!(lost(404, r#"{"error":{"code":-32601}}"#), Some(Meaning::JsonRpc(-32601)));
    }

    #[test]
    fn without_a_session_id_nothing_is_a_lost_session() {
        assert_eq!(http_meaning(404, "", false), None);
        assert_eq!(http_meaning(400, "Session expired", false), None);
        assert_eq!(http_meaning(404, "", true), Some(Meaning::LostSession));
    }

    #[test]
    fn a_refused_revision_is_read_from_a_body_or_a_code() {
        let body = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32022,"message":"Unsupported protocol version","data":{"supported":["2026-07-28"]}}}"#;
        assert_eq!(http_meaning(400, body, false), Some(Meaning::VersionRefused));
        assert_eq!(protocol_meaning(-32022, "", false), Some(Meaning::VersionRefused));
        assert_eq!(protocol_meaning(-32600, "Session terminated", true), Some(Meaning::LostSession));
        assert_eq!(protocol_meaning(-32600, "Session terminated", false), None);
    }

    #[test]
    fn session_wording() {
        for yes in [
            "Session not found",
            "Bad Request: No valid session ID provided",
            "Unknown session id 'abc'",
            "Session ID is not valid",
            "session has expired",
            "Session does not exist",
            "No session found",
            "Session is no longer valid",
            "Session timed out",
            "Invalid session",
            "MCP session terminated",
        ] {
            assert!(says_session_lost(yes), "{yes}");
        }
        for no in [
            "session",
            "session_count must be positive; invalid",
            "sessions are fine",
            "the session was created",
            "invalid 'session' argument",
            "missing session parameter",
            "Unknown session type 'foo'",
            "parameter session-id is invalid: expected uuid",
            "Cannot book: the training session is closed",
            "Invalid session name: must be alphanumeric",
            "Upstream session expired, log in again",
        ] {
            assert!(!says_session_lost(no), "{no}");
        }
    }

    #[test]
    fn a_body_overrides_only_a_400_or_404() {
        let refused = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32022,"message":"Unsupported protocol version"}}"#;
        for status in [401, 403, 429, 500, 503] {
            assert_eq!(http_meaning(status, refused, true), None, "{status}");
        }
        // A tool's invalid params about a "session" is the tool's.
        assert_eq!(http_meaning(400, r#"{"error":{"code":-32602,"message":"Unknown session"}}"#, true), Some(Meaning::JsonRpc(-32602)));
        // A large JSON page is not parsed.
        let page = alloc::format!("{{\"error\":{{\"code\":-32022}},\"pad\":\"{}\"}}", "x".repeat(5000));
        assert_eq!(http_meaning(400, &page, false), None);
    }

    #[test]
    fn the_probe_rule() {
        for status in [401, 403, 408, 429, 500, 503] {
            assert_eq!(read_probe_answer(Some(status), None), ProbeAnswer::Failure, "{status}");
        }
        for status in [400, 404, 405, 406, 415] {
            assert_eq!(read_probe_answer(Some(status), None), ProbeAnswer::OlderServer, "{status}");
        }
        assert_eq!(read_probe_answer(None, Some(-32601)), ProbeAnswer::OlderServer);
        assert_eq!(read_probe_answer(None, None), ProbeAnswer::Failure);
    }
}
