//! Failure classification: one failure in, one class and the server's hint out.
//!
//! The classes follow the status codes' meaning by specification (RFC 9110, RFC
//! 6585) and the MCP spec's two error channels. Anything not listed is
//! `unclassified`: terminal, never retried, flagged as a probable bug, because
//! retrying an unknown error is how a bad request is repeated forty times against
//! a shared allowance ("Retry and Backoff for Agent-Driven MCP Calls", step 1).

use alloc::boxed::Box;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::cat::cat;
use crate::config::Config;
use crate::hints::{self, Headers, Name, Pair};
use crate::relayed;
use crate::rules::Rule;
use crate::session::{self, Meaning};
use crate::types::{Classification, Delivery, Failure, FailureKind, HeaderProblem, OutcomeClass, TransportError};

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
        TransportError::Timeout | TransportError::ConnectionReset | TransportError::ConnectionRefused | TransportError::StreamClosed => OutcomeClass::Transient,
        // A certificate or a name is not fixed by waiting, nor by the model.
        TransportError::Tls | TransportError::NameResolution => OutcomeClass::Misconfigured,
        TransportError::Other => OutcomeClass::Unclassified,
    }
}

fn transport_name(error: TransportError) -> &'static str {
    match error {
        TransportError::Timeout => "timeout",
        TransportError::ConnectionReset => "connection reset",
        TransportError::ConnectionRefused => "connection refused",
        TransportError::StreamClosed => "stream closed",
        TransportError::Tls => "TLS failure",
        TransportError::NameResolution => "name not resolved",
        TransportError::Other => "transport error",
    }
}

/// A short label of what failed, e.g. `HTTP 503`, `JSON-RPC -32602`, `timeout`.
pub fn failure_label(kind: &FailureKind) -> String {
    match kind {
        FailureKind::HttpStatus(status) => cat!("HTTP ", status),
        FailureKind::Transport(error) => transport_name(*error).to_string(),
        FailureKind::ProtocolError(code) => cat!("JSON-RPC error ", code),
        FailureKind::ToolError(Some(status)) => cat!("tool error (upstream HTTP ", status, ")"),
        FailureKind::ToolError(None) => "tool error".to_string(),
        FailureKind::InputRequired => "input required".to_string(),
    }
}

/// Whether the request may have run on the server. A request that never left
/// the host (or a refused connection) never reached it; a throttled request, a
/// lost session and a refused revision were turned away before it ran; anything
/// else that failed without a clear answer may have been applied.
pub fn is_ambiguous(classified: &Classified) -> bool {
    let not_run = matches!(classified.kind, FailureKind::Transport(TransportError::ConnectionRefused))
        || (matches!(classified.kind, FailureKind::Transport(_)) && classified.delivery == Delivery::NotSent)
        || matches!(classified.rule, Rule::LostSession | Rule::VersionMismatch);
    classified.class == OutcomeClass::Transient && !not_run
}

/// The class of a gRPC status code (`grpc-status`; "gRPC status codes", grpc.io).
pub fn grpc_class(code: u32) -> Option<OutcomeClass> {
    use OutcomeClass::*;
    Some(match code {
        // CANCELLED, DEADLINE_EXCEEDED, ABORTED, INTERNAL, UNAVAILABLE
        1 | 4 | 10 | 13 | 14 => Transient,
        8 => Throttled,       // RESOURCE_EXHAUSTED
        7 | 16 => Permission, // PERMISSION_DENIED, UNAUTHENTICATED
        3 | 5 | 6 | 9 | 11 => Deterministic,
        2 | 12 | 15 => Unclassified, // UNKNOWN, UNIMPLEMENTED, DATA_LOSS
        _ => return None,
    })
}

/// An AWS error code as botocore reads it: the `x-amzn-ErrorType` header, or
/// `__type` / `code` / `Code` in a JSON body. Only the throttling and transient
/// codes change a class (botocore's standard retry mode does the same).
fn aws_error_code(headers: &Headers<'_>, body: &str) -> Option<(OutcomeClass, String)> {
    let from_body = || {
        // Most bodies start with a letter: tell that from the first byte,
        // without decoding characters (an ASCII byte that is not whitespace is
        // where `trim` would start too).
        if body.as_bytes().first().is_some_and(|b| b.is_ascii() && !char::from(*b).is_whitespace() && *b != b'{') {
            return None;
        }
        let body = relayed::bounded(body, relayed::MAX_STRUCTURED_BYTES).trim();
        // Only an object can carry a code: do not pay for a parse error's words.
        if !body.starts_with('{') {
            return None;
        }
        let json = crate::json::parse(body).ok()?;
        let crate::json::Json::Object(members) = json else { return None };
        members.into_iter().find_map(|(k, v)| match v {
            crate::json::Json::String(code) if matches!(k.as_str(), "__type" | "code" | "Code") => Some(code),
            _ => None,
        })
    };
    let code = headers.get(Name::XAmznErrorType).map(String::from).or_else(from_body)?;
    let class = relayed::identifier_class(&code)?;
    matches!(class, OutcomeClass::Throttled | OutcomeClass::Transient).then_some((class, crate::text::excerpt(&code, 60)))
}

/// A classification without its prose: what the run needs to decide, kept
/// small so that a decision costs no `format!`. [`Classified::reason`] words it
/// when a host asks (`classify`, `last-decision`, the logs).
#[derive(Clone, Debug)]
pub struct Classified {
    pub kind: FailureKind,
    pub delivery: Delivery,
    pub class: OutcomeClass,
    pub hint_ms: Option<u64>,
    /// Where the hint came from: a header's name, `text` or `structured-content`.
    pub hint_source: Option<&'static str>,
    pub server_says_retry: Option<bool>,
    pub rule: Rule,
    /// The HTTP status the failure carried or relayed (a delete's "already gone").
    pub status: Option<u16>,
    /// `x-should-retry: true` turned the class, or the server forbids a retry.
    pub verdict: ServerVerdict,
    /// What a rule read and what the headers got wrong, if anything: boxed,
    /// since most failures have neither, and a decision that keeps `None`
    /// moves and drops a pointer, not two buffers.
    pub findings: Option<Box<Findings>>,
}

/// The rarer parts of a classification (see [`Classified::findings`]).
#[derive(Clone, Debug, Default)]
pub struct Findings {
    /// What a rule read (a provider's code, a phrase), for the reason.
    pub evidence: String,
    pub header_problems: Vec<HeaderProblem>,
}

/// What the server's own verdict on retrying did to a classification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerVerdict {
    None,
    Allowed,
    Forbidden,
}

impl Classified {
    /// What a rule read, or nothing.
    pub fn evidence(&self) -> &str {
        self.findings.as_ref().map_or("", |f| f.evidence.as_str())
    }

    /// The headers that were ignored, and why.
    pub fn header_problems(&self) -> &[HeaderProblem] {
        self.findings.as_ref().map_or(&[], |f| f.header_problems.as_slice())
    }

    /// One line a person can read: which rule applied and what it read.
    pub fn reason(&self) -> String {
        let label = failure_label(&self.kind);
        let evidence = self.evidence();
        let read = if evidence.is_empty() { "" } else { ": " };
        let verdict = match self.verdict {
            ServerVerdict::None => "",
            ServerVerdict::Allowed => ", x-should-retry: true",
            ServerVerdict::Forbidden => ", but the server forbids a retry",
        };
        let (class, rule) = (self.class.name(), self.rule.name());
        match self.class {
            OutcomeClass::Unclassified => {
                cat!(label, " is not a failure the policy knows: ", class, " (", rule, read, evidence, ")", verdict, " (probable bug)")
            }
            _ => cat!(label, " is ", class, " (", rule, read, evidence, ")", verdict),
        }
    }

    /// The contract's `classification`, prose included.
    pub fn into_classification(self) -> Classification {
        let reason = self.reason();
        Classification {
            class: self.class,
            hint_ms: self.hint_ms,
            hint_source: self.hint_source.map(String::from),
            server_says_retry: self.server_says_retry,
            rule: String::from(self.rule.name()),
            reason,
            header_problems: self.findings.map(|f| f.header_problems).unwrap_or_default(),
        }
    }
}

/// Classifies `failure`, for `tool` when the run knows it (its `tool-error-rules`).
pub fn classify(failure: &Failure, config: &Config, tool: Option<&str>, now_ms: u64) -> Classification {
    let pairs = failure.header_pairs();
    classify_view(&failure.view(&pairs), config, tool, now_ms).into_classification()
}

impl Failure {
    /// The headers as the policy reads them: borrowed `(name, value)` pairs.
    pub fn header_pairs(&self) -> Vec<Pair<'_>> {
        self.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect()
    }

    /// The failure as the policy reads it; `pairs` are its [`Failure::header_pairs`].
    pub fn view<'a>(&'a self, pairs: &'a [Pair<'a>]) -> FailureView<'a> {
        FailureView {
            kind: &self.kind,
            headers: pairs,
            body: &self.body,
            structured_content: self.structured_content.as_deref(),
            session_id_sent: self.session_id_sent,
            delivery: self.delivery,
        }
    }
}

/// A failure as the policy reads it, borrowed from the host's `failure` or from
/// the flat arguments of `record-failure`.
pub struct FailureView<'a> {
    pub kind: &'a FailureKind,
    pub headers: &'a [Pair<'a>],
    pub body: &'a str,
    pub structured_content: Option<&'a str>,
    pub session_id_sent: bool,
    pub delivery: Delivery,
}

/// Classifies a failure without wording it (see [`Classified::reason`]).
pub fn classify_view(failure: &FailureView<'_>, config: &Config, tool: Option<&str>, now_ms: u64) -> Classified {
    let overrides = &config.status_overrides;
    let status_with_override = |status: u16| match overrides.iter().find(|(s, _)| *s == status) {
        Some((_, class)) => (*class, Rule::ConfigStatusOverrides),
        None => (status_class(status), Rule::HttpStatus),
    };
    let (pairs, limit_problems) = hints::within_limits(failure.headers);
    let headers = Headers::new(&pairs);
    let mut server = hints::read_indexed(&headers, now_ms, config.max_plausible_hint_ms);
    if !limit_problems.is_empty() {
        server.problems.extend(limit_problems);
    }
    let mut hint: Option<(u64, &'static str)> = server.wait.as_ref().map(|h| (h.wait_ms, h.source));
    let mut evidence = String::new();
    let mut status = None;
    let relayed_text = |hint: &mut Option<(u64, &'static str)>| {
        let rules = config.text_rules_for(tool);
        let read = relayed::read(failure.body, failure.structured_content, &rules, overrides, now_ms);
        if hint.is_none() {
            *hint = read.hint_ms.filter(|ms| *ms <= config.max_plausible_hint_ms).map(|ms| (ms, "text"));
        }
        read
    };
    let (mut class, mut rule) = match failure.kind {
        FailureKind::HttpStatus(http) => {
            status = Some(*http);
            let status = http;
            let (mut class, mut rule) = status_with_override(*status);
            if let Some((code_class, code)) = aws_error_code(&headers, failure.body) {
                (class, rule, evidence) = (code_class, Rule::AwsErrorCode, code);
            }
            if let Some(grpc) = headers.get(Name::GrpcStatus).and_then(|v| v.parse::<u32>().ok()).and_then(grpc_class) {
                (class, rule) = (grpc, Rule::GrpcStatus);
            }
            if headers.get(Name::XEnvoyOverloaded).is_some_and(|v| v.eq_ignore_ascii_case("true")) {
                (class, rule) = (OutcomeClass::Throttled, Rule::EnvoyOverloaded);
            }
            // RFC 9110 §15.5.14: a 413 with Retry-After says the condition is temporary.
            if *status == 413 && server.wait.as_ref().is_some_and(|h| h.source == Name::RetryAfter.text()) {
                (class, rule) = (OutcomeClass::Throttled, Rule::PayloadTooLargeRetryAfter);
            }
            match session::http_meaning(*status, failure.body, failure.session_id_sent) {
                Some(meaning) if rule == Rule::HttpStatus => meaning_class(meaning),
                _ => (class, rule),
            }
        }
        FailureKind::Transport(error) => (transport_class(*error), Rule::Transport),
        FailureKind::ProtocolError(code) => {
            let class = protocol_error_class(*code);
            // An internal or implementation-defined server error often carries the
            // upstream failure a server threw (the TypeScript SDK's "MCP error
            // -32603: ..."): read it and its data, if they say anything.
            let server_error = *code == -32603 || (-32099..=-32000).contains(code);
            let read = if server_error { Some(relayed_text(&mut hint)) } else { None };
            match (
                session::protocol_meaning(*code, failure.body, failure.session_id_sent),
                read.filter(|r| !matches!(r.rule, Rule::ToolError | Rule::ToolErrorScanLimit)),
            ) {
                (Some(meaning), _) => meaning_class(meaning),
                (None, Some(r)) => {
                    evidence = r.evidence;
                    status = r.status;
                    (r.class, r.rule)
                }
                (None, None) => (class, Rule::JsonRpcCode),
            }
        }
        FailureKind::ToolError(Some(upstream)) if (400..=599).contains(upstream) => {
            relayed_text(&mut hint);
            status = Some(*upstream);
            let (class, rule) = status_with_override(*upstream);
            (class, if rule == Rule::HttpStatus { Rule::ToolErrorHostStatus } else { rule })
        }
        // An isError result is the tool's own verdict (MCP "tool execution
        // errors"): read what it relays; if nothing, it is for the model.
        FailureKind::ToolError(_) => {
            let read = relayed_text(&mut hint);
            evidence = read.evidence;
            status = read.status;
            (read.class, read.rule)
        }
        // The server asks a person (or the client) something nobody answered:
        // neither waiting nor the model can.
        FailureKind::InputRequired => (OutcomeClass::NeedsInput, Rule::InputRequired),
    };
    let mut verdict = ServerVerdict::None;
    if server.should_retry == Some(true) && matches!(class, OutcomeClass::Deterministic | OutcomeClass::Unclassified) {
        (class, rule) = (OutcomeClass::Transient, Rule::ShouldRetry);
        verdict = ServerVerdict::Allowed;
    }
    if server.should_retry == Some(false) && matches!(class, OutcomeClass::Transient | OutcomeClass::Throttled) {
        verdict = ServerVerdict::Forbidden;
    }
    Classified {
        kind: *failure.kind,
        delivery: failure.delivery,
        class,
        hint_ms: hint.map(|(ms, _)| ms),
        hint_source: hint.map(|(_, source)| source),
        server_says_retry: server.should_retry,
        rule,
        status,
        verdict,
        findings: (!evidence.is_empty() || !server.problems.is_empty()).then(|| Box::new(Findings { evidence, header_problems: server.problems })),
    }
}

/// The class and rule of an HTTP or JSON-RPC answer's meaning for the session.
fn meaning_class(meaning: Meaning) -> (OutcomeClass, Rule) {
    match meaning {
        Meaning::LostSession => (OutcomeClass::Transient, Rule::LostSession),
        Meaning::VersionRefused => (OutcomeClass::Transient, Rule::VersionMismatch),
        // A 400 or 404 is the request's fault whatever code its body carries
        // (an SDK's -32000 "Server not initialized" is not transient), unless
        // the code asks for a person.
        Meaning::JsonRpc(code) => match protocol_error_class(code) {
            OutcomeClass::Permission => (OutcomeClass::Permission, Rule::JsonRpcCode),
            _ => (OutcomeClass::Deterministic, Rule::JsonRpcCode),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    fn class_of(kind: FailureKind) -> OutcomeClass {
        classify(&Failure { kind, ..failure(FailureKind::Transport(TransportError::Other)) }, &Config::default(), None, 0).class
    }

    fn failure(kind: FailureKind) -> Failure {
        Failure { kind, headers: Vec::new(), body: String::new(), structured_content: None, session_id_sent: false, delivery: Delivery::Unknown }
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
        let overridden = Config { status_overrides: vec![(409, OutcomeClass::Transient)], ..Config::default() };
        let plain = Config::default();
        let failure = |status, headers: Vec<(String, String)>| Failure { headers, ..failure(FailureKind::HttpStatus(status)) };
        assert_eq!(classify(&failure(409, vec![]), &overridden, None, 0).class, OutcomeClass::Transient);
        let no = vec![("x-should-retry".to_string(), "false".to_string())];
        let forbidden = classify(&failure(503, no), &plain, None, 0);
        assert_eq!((forbidden.class, forbidden.server_says_retry), (OutcomeClass::Transient, Some(false)));
        let yes = vec![("X-Should-Retry".to_string(), "true".to_string())];
        assert_eq!(classify(&failure(400, yes.clone()), &plain, None, 0).class, OutcomeClass::Transient);
        // The server cannot talk the policy into retrying a permission error.
        assert_eq!(classify(&failure(403, yes), &plain, None, 0).class, OutcomeClass::Permission);
        let aws = vec![("x-amzn-ErrorType".to_string(), "ThrottlingException:http://internal.amazon.com/coral/".to_string())];
        assert_eq!(classify(&failure(400, aws), &plain, None, 0).class, OutcomeClass::Throttled);
    }

    #[test]
    fn ambiguity() {
        let ambiguous = |failure: Failure| is_ambiguous(&classify_failure(&failure));
        assert!(ambiguous(failure(FailureKind::Transport(TransportError::Timeout))));
        assert!(!ambiguous(failure(FailureKind::Transport(TransportError::ConnectionRefused))));
        assert!(!ambiguous(Failure { delivery: Delivery::NotSent, ..failure(FailureKind::Transport(TransportError::StreamClosed)) }));
        assert!(ambiguous(Failure { delivery: Delivery::Sent, ..failure(FailureKind::Transport(TransportError::StreamClosed)) }));
        assert!(!ambiguous(failure(FailureKind::HttpStatus(429))));
        assert!(ambiguous(failure(FailureKind::HttpStatus(503))));
        // A lost session was not run: the server did not know the session.
        assert!(!ambiguous(Failure { session_id_sent: true, ..failure(FailureKind::HttpStatus(404)) }));
        assert!(!ambiguous(failure(FailureKind::HttpStatus(404))), "a plain 404 is deterministic");
    }

    #[test]
    fn tls_and_names_are_misconfigured() {
        assert_eq!(class_of(FailureKind::Transport(TransportError::Tls)), OutcomeClass::Misconfigured);
        assert_eq!(class_of(FailureKind::Transport(TransportError::NameResolution)), OutcomeClass::Misconfigured);
    }

    fn classify_failure(failure: &Failure) -> Classified {
        let pairs = failure.header_pairs();
        classify_view(&failure.view(&pairs), &Config::default(), None, 0)
    }
}
