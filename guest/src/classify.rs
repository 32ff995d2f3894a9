//! Failure classification: one failure in, one class and the server's hint out.
//!
//! The classes follow the status codes' meaning by specification (RFC 9110, RFC
//! 6585) and the MCP spec's two error channels. Anything not listed is
//! `unclassified`: terminal, never retried, flagged as a probable bug, because
//! retrying an unknown error is how a bad request is repeated forty times against
//! a shared allowance (seed 000, step 1).

use alloc::format;
use alloc::string::{String, ToString};

use crate::hints;
use crate::types::{Classification, Failure, FailureKind, OutcomeClass, TransportError};

/// The class of an HTTP status, before overrides and `x-should-retry`.
pub fn status_class(status: u16) -> OutcomeClass {
    match status {
        401 | 403 => OutcomeClass::Permission,
        429 | 529 => OutcomeClass::Throttled,
        408 | 500 | 502 | 503 | 504 => OutcomeClass::Transient,
        400..=499 => OutcomeClass::Deterministic,
        // 1xx-3xx are not failures, 501 and 505+ will not change by waiting, and
        // anything outside 100-599 is not an HTTP status.
        _ => OutcomeClass::Unclassified,
    }
}

/// The class of a JSON-RPC error code (MCP's protocol-error channel).
pub fn protocol_error_class(code: i32) -> OutcomeClass {
    match code {
        // Invalid params (bad arguments, unknown tool) and method not found: the
        // model can change the call. -32002 was "resource not found" until 2026-07-28.
        -32602 | -32601 | -32002 => OutcomeClass::Deterministic,
        // Internal error, and the TS SDK's local ConnectionClosed / RequestTimeout:
        // the server or the link failed; the same call may work.
        -32603 | -32000 | -32001 => OutcomeClass::Transient,
        // URL elicitation required: a person must act.
        -32042 => OutcomeClass::Permission,
        // Parse error, invalid request, version and capability mismatches: the
        // client is broken, which no retry or replan fixes.
        _ => OutcomeClass::Unclassified,
    }
}

fn transport_class(error: TransportError) -> OutcomeClass {
    match error {
        TransportError::Timeout
        | TransportError::ConnectionReset
        | TransportError::ConnectionRefused
        | TransportError::StreamClosed => OutcomeClass::Transient,
        TransportError::Other => OutcomeClass::Unclassified,
    }
}

fn transport_name(error: TransportError) -> &'static str {
    match error {
        TransportError::Timeout => "timeout",
        TransportError::ConnectionReset => "connection reset",
        TransportError::ConnectionRefused => "connection refused",
        TransportError::StreamClosed => "stream closed",
        TransportError::Other => "transport error",
    }
}

/// A short label of what failed, e.g. `HTTP 503`, `JSON-RPC -32602`, `timeout`.
pub fn failure_label(kind: &FailureKind) -> String {
    match kind {
        FailureKind::HttpStatus(status) => format!("HTTP {status}"),
        FailureKind::Transport(error) => transport_name(*error).to_string(),
        FailureKind::ProtocolError(code) => format!("JSON-RPC error {code}"),
        FailureKind::ToolError(Some(status)) => format!("tool error (upstream HTTP {status})"),
        FailureKind::ToolError(None) => "tool error".to_string(),
    }
}

/// Whether the request may have run on the server. A refused connection never
/// reached it, and a throttled request was turned away before it ran; anything
/// else that failed without a clear answer may have been applied.
pub fn is_ambiguous(kind: &FailureKind, class: OutcomeClass) -> bool {
    class == OutcomeClass::Transient && !matches!(kind, FailureKind::Transport(TransportError::ConnectionRefused))
}

/// Classifies `failure`. `overrides` maps HTTP statuses (also an upstream status in
/// a tool error) to classes.
pub fn classify(failure: &Failure, overrides: &[(u16, OutcomeClass)], now_ms: u64) -> Classification {
    let status_with_override = |status: u16| match overrides.iter().find(|(s, _)| *s == status) {
        Some((_, class)) => (*class, " (status-overrides)"),
        None => (status_class(status), ""),
    };
    let (mut class, note) = match &failure.kind {
        FailureKind::HttpStatus(status) => status_with_override(*status),
        FailureKind::Transport(error) => (transport_class(*error), ""),
        FailureKind::ProtocolError(code) => (protocol_error_class(*code), ""),
        FailureKind::ToolError(Some(status)) if (400..=599).contains(status) => status_with_override(*status),
        // An isError result is the tool's own verdict on the request (MCP "tool
        // execution errors"): actionable feedback for the model.
        FailureKind::ToolError(_) => (OutcomeClass::Deterministic, ""),
    };
    let server = hints::read(&failure.headers, now_ms);
    let mut verdict = "";
    match server.should_retry {
        Some(true) if matches!(class, OutcomeClass::Deterministic | OutcomeClass::Unclassified) => {
            class = OutcomeClass::Transient;
            verdict = ", x-should-retry: true";
        }
        Some(false) if matches!(class, OutcomeClass::Transient | OutcomeClass::Throttled) => {
            class = OutcomeClass::Deterministic;
            verdict = ", x-should-retry: false";
        }
        _ => {}
    }
    let label = failure_label(&failure.kind);
    let reason = match class {
        OutcomeClass::Unclassified => format!("{label} is not a failure the policy knows: {}{note}{verdict} (probable bug)", class.name()),
        _ => format!("{label} is {}{note}{verdict}", class.name()),
    };
    Classification {
        class,
        hint_ms: server.wait.as_ref().map(|h| h.wait_ms),
        hint_source: server.wait.map(|h| h.source.to_string()),
        reason,
        header_problems: server.problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use alloc::vec::Vec;

    fn class_of(kind: FailureKind) -> OutcomeClass {
        classify(&Failure { kind, headers: Vec::new(), body: String::new() }, &[], 0).class
    }

    #[test]
    fn status_table() {
        for s in [408, 500, 502, 503, 504] {
            assert_eq!(status_class(s), OutcomeClass::Transient, "{s}");
        }
        for s in [429, 529] {
            assert_eq!(status_class(s), OutcomeClass::Throttled, "{s}");
        }
        for s in [400, 404, 409, 410, 422, 418, 499] {
            assert_eq!(status_class(s), OutcomeClass::Deterministic, "{s}");
        }
        for s in [401, 403] {
            assert_eq!(status_class(s), OutcomeClass::Permission, "{s}");
        }
        for s in [0, 99, 100, 200, 204, 302, 501, 505, 599, 600, u16::MAX] {
            assert_eq!(status_class(s), OutcomeClass::Unclassified, "{s}");
        }
    }

    #[test]
    fn channels() {
        assert_eq!(class_of(FailureKind::Transport(TransportError::Timeout)), OutcomeClass::Transient);
        assert_eq!(class_of(FailureKind::Transport(TransportError::Other)), OutcomeClass::Unclassified);
        assert_eq!(class_of(FailureKind::ProtocolError(-32602)), OutcomeClass::Deterministic);
        assert_eq!(class_of(FailureKind::ProtocolError(-32700)), OutcomeClass::Unclassified);
        assert_eq!(class_of(FailureKind::ProtocolError(i32::MIN)), OutcomeClass::Unclassified);
        assert_eq!(class_of(FailureKind::ToolError(None)), OutcomeClass::Deterministic);
        assert_eq!(class_of(FailureKind::ToolError(Some(503))), OutcomeClass::Transient);
        assert_eq!(class_of(FailureKind::ToolError(Some(200))), OutcomeClass::Deterministic);
    }

    #[test]
    fn overrides_and_server_verdict() {
        let overrides = [(409, OutcomeClass::Transient)];
        let failure = |status, headers: Vec<(String, String)>| Failure { kind: FailureKind::HttpStatus(status), headers, body: String::new() };
        assert_eq!(classify(&failure(409, vec![]), &overrides, 0).class, OutcomeClass::Transient);
        let no = vec![("x-should-retry".to_string(), "false".to_string())];
        assert_eq!(classify(&failure(503, no), &[], 0).class, OutcomeClass::Deterministic);
        let yes = vec![("X-Should-Retry".to_string(), "true".to_string())];
        assert_eq!(classify(&failure(400, yes.clone()), &[], 0).class, OutcomeClass::Transient);
        // The server cannot talk the policy into retrying a permission error.
        assert_eq!(classify(&failure(403, yes), &[], 0).class, OutcomeClass::Permission);
    }

    #[test]
    fn ambiguity() {
        assert!(is_ambiguous(&FailureKind::Transport(TransportError::Timeout), OutcomeClass::Transient));
        assert!(!is_ambiguous(&FailureKind::Transport(TransportError::ConnectionRefused), OutcomeClass::Transient));
        assert!(!is_ambiguous(&FailureKind::HttpStatus(429), OutcomeClass::Throttled));
        assert!(is_ambiguous(&FailureKind::HttpStatus(503), OutcomeClass::Transient));
    }
}
