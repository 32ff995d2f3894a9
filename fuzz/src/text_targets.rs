//! The targets whose input is text: `headers`, `tool_error`, `config`, `json`.

use std::sync::Arc;

use agent_retry_policy::account::NoAccountBudget;
use agent_retry_policy::classify::classify;
use agent_retry_policy::config::{Config, ONE_DAY_MS, ONE_YEAR_MS};
use agent_retry_policy::hints;
use agent_retry_policy::json::{self, Json};
use agent_retry_policy::readable;
use agent_retry_policy::relayed::MAX_TEXT_BYTES;
use agent_retry_policy::run::{At, Run};
use agent_retry_policy::types::{Action, Admission, CallRequest, Classification, EscalationReason, Failure, FailureKind, Outcome, OutcomeClass};

use crate::oracle::{self, check_classification};
use crate::{DEFAULT_NOW_MS, invariant, known_bug};

/// Directive lines (`@name value`) at the start of a text input, and the rest.
fn directives(data: &[u8]) -> (Vec<(String, String)>, String) {
    let text = String::from_utf8_lossy(data).into_owned();
    let mut rest = text.as_str();
    let mut found = Vec::new();
    while let Some(line_rest) = rest.strip_prefix('@') {
        let (line, after) = line_rest.split_once('\n').unwrap_or((line_rest, ""));
        let (name, value) = line.split_once(' ').unwrap_or((line, ""));
        found.push((name.to_string(), value.trim().to_string()));
        rest = after;
    }
    (found, rest.to_string())
}

/// A `headers` input: a failure with arbitrary headers.
#[derive(Clone, Debug)]
pub struct HeadersCase {
    pub failure: Failure,
    pub now_ms: u64,
}

impl HeadersCase {
    /// `@status N` (default 429) and `@now MS`, then `Name: value` lines.
    pub fn parse(data: &[u8]) -> HeadersCase {
        let (found, rest) = directives(data);
        let mut status = 429u16;
        let mut now_ms = DEFAULT_NOW_MS;
        for (name, value) in found {
            match name.as_str() {
                "status" => status = value.parse().unwrap_or(status),
                "now" => now_ms = value.parse().unwrap_or(now_ms),
                _ => {}
            }
        }
        let headers = rest
            .split('\n')
            .filter(|line| !line.is_empty())
            .map(|line| match line.split_once(':') {
                Some((name, value)) => (name.to_string(), value.strip_prefix(' ').unwrap_or(value).to_string()),
                None => (line.to_string(), String::new()),
            })
            .collect();
        HeadersCase {
            failure: Failure {
                kind: FailureKind::HttpStatus(status),
                headers,
                body: String::new(),
                structured_content: None,
                session_id_sent: false,
                delivery: Default::default(),
            },
            now_ms,
        }
    }
}

/// A `tool_error` input: an `isError` text (and structured content) or a
/// JSON-RPC error message that may relay an upstream failure.
#[derive(Clone, Debug)]
pub struct ToolErrorCase {
    pub failure: Failure,
    pub now_ms: u64,
    pub tool: Option<String>,
}

impl ToolErrorCase {
    /// `@host N` (the host saw upstream status N), `@rpc CODE` (a JSON-RPC
    /// error), `@tool NAME`, `@now MS`; then the body; a NUL starts the structured content.
    pub fn parse(data: &[u8]) -> ToolErrorCase {
        let (found, rest) = directives(data);
        let mut kind = FailureKind::ToolError(None);
        let mut now_ms = DEFAULT_NOW_MS;
        let mut tool = None;
        for (name, value) in found {
            match name.as_str() {
                "host" => kind = FailureKind::ToolError(value.parse().ok()),
                "rpc" => kind = FailureKind::ProtocolError(value.parse().unwrap_or(-32603)),
                "tool" => tool = Some(value),
                "now" => now_ms = value.parse().unwrap_or(now_ms),
                _ => {}
            }
        }
        let (body, structured) = match rest.split_once('\0') {
            Some((body, structured)) => (body.to_string(), Some(structured.to_string())),
            None => (rest, None),
        };
        ToolErrorCase {
            failure: Failure { kind, headers: Vec::new(), body, structured_content: structured, session_id_sent: false, delivery: Default::default() },
            now_ms,
            tool,
        }
    }
}

/// The configurations the text targets classify with: the defaults, one whose
/// limits are small (so that hints hit them), and one with rules and overrides.
pub fn text_configs() -> Vec<(&'static str, Arc<Config>)> {
    TEXT_CONFIGS.iter().map(|(name, text)| (*name, Arc::new(Config::from_json(text).expect("the targets' configurations load")))).collect()
}

/// The texts of [`text_configs`].
pub const TEXT_CONFIGS: &[(&str, &str)] = &[
    ("defaults", "{}"),
    ("small-limits", r#"{"max-hint-ms": 1000, "max-plausible-hint-ms": 1000, "max-delay-ms": 1000, "base-delay-ms": 1000, "max-message-chars": 16}"#),
    (
        "rules",
        r#"{"tools": {"search": {"effect": "read", "tool-error-rules": [{"contains": "E_BUSY", "class": "transient"}, {"contains": "://", "class": "permission"}]},
            "issue_refund": {"effect": "write"}, "delete_asset": {"destructiveHint": true}},
           "status-overrides": {"409": "transient", "503": "deterministic", "429": "unclassified"},
           "tool-error-rules": [{"contains": "quota_low", "class": "throttled"}, {"contains": "try again", "class": "deterministic"}],
           "max-hint-ms": 86400000}"#,
    ),
];

/// A whole failure through a run: begin-call, then record-outcome; the
/// decision must agree with the classification and the backoff promise.
fn through_a_run(config: &Arc<Config>, tool: &str, failure: &Failure, classification: &Classification, now_ms: u64, entropy: u64, context: &str) {
    let mut run = Run::new(Arc::clone(config), "fuzz");
    let request = CallRequest { server: None, tool: tool.to_string(), idempotency_key: Some("k".to_string()), hints: None };
    let Ok(Admission::Send(ticket)) = readable::begin_call(&mut run, &request, now_ms, &mut NoAccountBudget) else {
        panic!("broken invariant: the first call of a fresh run was not admitted ({context})");
    };
    let decision = readable::record_outcome(
        &mut run,
        ticket.call_id,
        1,
        &Outcome::Failure(failure.clone()),
        At { now_ms, time_left_ms: None, entropy },
        &mut NoAccountBudget,
    )
    .unwrap_or_else(|e| panic!("broken invariant: record-outcome refused a first outcome: {e:?} ({context})"));
    invariant!(
        decision.class == classification.class && decision.rule == classification.rule,
        "decision {:?}/{} vs classification {:?}/{} ({context})",
        decision.class,
        decision.rule,
        classification.class,
        classification.rule
    );
    invariant!(decision.hint_ms == classification.hint_ms, "decision hint {:?} vs classification {:?} ({context})", decision.hint_ms, classification.hint_ms);
    let limit = classification.reason.len() + 512 + oracle::problems_bytes(classification);
    invariant!(decision.reason.len() <= limit, "decision reason of {} bytes (limit {limit}) ({context})", decision.reason.len());
    let transient = matches!(decision.class, OutcomeClass::Transient | OutcomeClass::Throttled);
    match &decision.action {
        Action::Retry(plan) => {
            invariant!(transient, "a retry of a {:?} failure ({context})", decision.class);
            let hint = decision.hint_ms.unwrap_or(0);
            invariant!(hint <= config.max_hint_ms, "a retry honours a hint of {hint} ms above max-hint-ms {} ({context})", config.max_hint_ms);
            let expected = oracle::delay_ms(config.base_delay_ms, config.max_delay_ms, 1, decision.hint_ms, entropy);
            invariant!(plan.delay_ms == expected, "first retry delay {} ms, the full-jitter formula gives {expected} ({context})", plan.delay_ms);
            invariant!(
                plan.delay_ms <= config.max_delay_ms || plan.delay_ms == hint,
                "delay {} above max-delay-ms {} without a hint ({context})",
                plan.delay_ms,
                config.max_delay_ms
            );
            invariant!(plan.attempt == 2 && plan.idempotency_key.as_deref() == Some("k"), "retry plan {plan:?} ({context})");
        }
        Action::Escalate(e) => {
            if e.reason == EscalationReason::ServerWaitTooLong {
                let hint = decision.hint_ms.unwrap_or(0);
                invariant!(hint > config.max_hint_ms && e.resets_in_ms == decision.hint_ms, "server-wait-too-long with hint {hint} ({context})");
            }
            if transient && decision.hint_ms.is_some_and(|h| h > config.max_hint_ms) {
                invariant!(e.reason == EscalationReason::ServerWaitTooLong, "a hint over max-hint-ms escalated as {:?} ({context})", e.reason);
            }
        }
        _ => {
            invariant!(
                !transient || ticket.effect == agent_retry_policy::types::Effect::Delete,
                "a {:?} failure neither retried nor escalated ({context})",
                decision.class
            );
        }
    }
}

/// The first field named `name` (any case), trimmed as the policy trims: of
/// ASCII whitespace only (HTTP's optional whitespace is spaces and tabs).
fn first_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n.trim_ascii().eq_ignore_ascii_case(name)).map(|(_, v)| v.trim_ascii())
}

/// Whole ms or s written as plain digits, as every wait header accepts them.
fn plain_number(value: &str) -> Option<u64> {
    (!value.is_empty() && value.len() <= 15 && value.bytes().all(|b| b.is_ascii_digit())).then(|| value.parse().ok()).flatten()
}

/// `headers`: every header parser, through `hints::read` and through
/// classification of a failure with those headers, and a run's decision.
pub fn headers(data: &[u8]) {
    let case = HeadersCase::parse(data);
    let headers = &case.failure.headers;
    // As the policy reads them: borrowed, within its limits, trimmed.
    let pairs: Vec<hints::Pair<'_>> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let (limited, _) = hints::within_limits(&pairs);
    let context = "headers";
    for plausible in [ONE_YEAR_MS, 1000, 10 * ONE_YEAR_MS] {
        let read = hints::read(&limited, case.now_ms, plausible);
        invariant!(read == hints::read(&limited, case.now_ms, plausible), "hints::read is not deterministic");
        if let Some(wait) = &read.wait {
            invariant!(wait.wait_ms <= plausible, "hint {} ms above max-plausible {plausible} from {}", wait.wait_ms, wait.source);
            invariant!(oracle::HINT_SOURCES.contains(&wait.source), "unknown hint source {}", wait.source);
        }
        // Precedence: a valid retry-after-ms wins over everything (RFC-less, the
        // Stainless SDKs'); Retry-After in plain seconds wins when no ms header is there.
        if headers.len() <= 64 && headers.iter().all(|(_, v)| v.len() <= 1024) {
            if let Some(ms) = first_header(headers, "retry-after-ms").and_then(plain_number).filter(|ms| *ms <= plausible) {
                let got = read.wait.as_ref().map(|w| (w.wait_ms, w.source));
                invariant!(got == Some((ms, "retry-after-ms")), "retry-after-ms: {ms} read as {got:?}");
            } else if first_header(headers, "retry-after-ms").is_none()
                && first_header(headers, "x-amz-retry-after").is_none()
                && let Some(s) = first_header(headers, "retry-after").and_then(plain_number).filter(|s| s * 1000 <= plausible)
            {
                let got = read.wait.as_ref().map(|w| (w.wait_ms, w.source));
                invariant!(got == Some((s * 1000, "retry-after")), "retry-after: {s} read as {got:?}");
            }
        }
    }
    let entropy = data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3));
    for (name, config) in text_configs() {
        let context = format!("{context}, config {name}");
        let c = classify(&case.failure, &config, None, case.now_ms);
        check_classification(&c, config.max_plausible_hint_ms, headers.len(), &context);
        let read = hints::read(&limited, case.now_ms, config.max_plausible_hint_ms);
        invariant!(c.hint_ms == read.wait.as_ref().map(|w| w.wait_ms), "classification hint {:?} is not the headers' {:?} ({context})", c.hint_ms, read.wait);
        invariant!(c == classify(&case.failure, &config, None, case.now_ms), "classify is not deterministic ({context})");
        // Header names are compared in any case; a header the policy does not read changes nothing.
        let mut upper = case.failure.clone();
        upper.headers.iter_mut().for_each(|(n, _)| n.make_ascii_uppercase());
        invariant!(c == classify(&upper, &config, None, case.now_ms), "upper-casing header names changed the classification ({context})");
        if headers.len() < hints::MAX_HEADERS {
            let mut more = case.failure.clone();
            more.headers.push(("x-fuzz-unrelated".to_string(), "1".to_string()));
            invariant!(c == classify(&more, &config, None, case.now_ms), "an unrelated header changed the classification ({context})");
        }
        through_a_run(&config, "lookup_order", &case.failure, &c, case.now_ms, entropy, &context);
    }
}

/// `tool_error`: tool-error text and structured content through classification
/// (and a run): a rule is always named, the cost is bounded by the read limits.
pub fn tool_error(data: &[u8]) {
    let case = ToolErrorCase::parse(data);
    let entropy = data.iter().fold(7u64, |h, b| h.rotate_left(5) ^ u64::from(*b));
    for (name, config) in text_configs() {
        let context = format!("tool_error, config {name}");
        let tool = case.tool.as_deref();
        let c = classify(&case.failure, &config, tool, case.now_ms);
        check_classification(&c, config.max_plausible_hint_ms, 0, &context);
        invariant!(c == classify(&case.failure, &config, tool, case.now_ms), "classify is not deterministic ({context})");
        // Only the first MAX_TEXT_BYTES of the text are read: what follows changes nothing.
        if matches!(case.failure.kind, FailureKind::ToolError(_)) && case.failure.body.len() >= MAX_TEXT_BYTES {
            let mut longer = case.failure.clone();
            longer.body.push_str(" HTTP 503 rate limit ThrottlingException try again in 5s permission denied");
            invariant!(
                c == classify(&longer, &config, tool, case.now_ms),
                "text after the first {MAX_TEXT_BYTES} bytes changed the classification ({context})"
            );
        }
        let run_tool = tool.filter(|t| t.len() <= 256).unwrap_or("search");
        let in_run = classify(&case.failure, &config, Some(run_tool), case.now_ms);
        through_a_run(&config, run_tool, &case.failure, &in_run, case.now_ms, entropy, &context);
    }
}

/// Bytes an error of the configuration may take (field path and message).
pub const MAX_CONFIG_ERROR_BYTES: usize = 1024;

/// `config`: configuration text → a policy or a typed error; the effective
/// configuration of a loaded policy loads again to the same configuration.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match Config::from_json(&text) {
        Ok(config) => {
            invariant!(config.base_delay_ms >= 1 && config.base_delay_ms <= ONE_DAY_MS, "base-delay-ms {}", config.base_delay_ms);
            invariant!(config.max_delay_ms >= config.base_delay_ms && config.max_delay_ms <= ONE_DAY_MS, "max-delay-ms {}", config.max_delay_ms);
            invariant!((1..=100).contains(&config.max_attempts_per_call), "max-attempts-per-call {}", config.max_attempts_per_call);
            invariant!((1..=1_000_000).contains(&config.max_steps_per_run), "max-steps-per-run {}", config.max_steps_per_run);
            invariant!(config.max_plausible_hint_ms >= config.max_hint_ms, "max-plausible-hint-ms below max-hint-ms");
            invariant!((16..=10_000).contains(&config.max_message_chars), "max-message-chars {}", config.max_message_chars);
            for (i, tool) in config.tools.iter().enumerate() {
                invariant!(!tool.name.is_empty() && tool.name.len() <= 256, "tool name of {} bytes", tool.name.len());
                let found = config.tool_entry(&tool.name).map(|e| e.name.as_str());
                invariant!(found == Some(tool.name.as_str()), "tool {i} ({:?}) not found by name: {found:?}", tool.name);
            }
            if let Some(account) = &config.account_budget {
                invariant!(account.attempt_cost <= account.capacity && account.retry_cost <= account.capacity, "costs above capacity: {account:?}");
                invariant!(!account.account_id.is_empty() && account.account_id.len() <= 256, "account id of {} bytes", account.account_id.len());
            }
            let effective = config.to_json();
            invariant!(json::parse(&effective).is_ok(), "effective-config is not JSON: {effective}");
            invariant!(serde_json::from_str::<serde_json::Value>(&effective).is_ok(), "effective-config is not JSON for serde_json: {effective}");
            let again = Config::from_json(&effective).unwrap_or_else(|e| panic!("broken invariant: effective-config does not load again: {e:?}\n{effective}"));
            invariant!(again == config, "effective-config loads to another configuration:\n{effective}");
            invariant!(again.to_json() == effective, "effective-config of the effective-config differs:\n{effective}\n{}", again.to_json());
        }
        Err(e) => {
            let syntax = json::parse(&text).is_err();
            invariant!(
                (e.kind == agent_retry_policy::types::ConfigErrorKind::Syntax) == syntax || e.kind == agent_retry_policy::types::ConfigErrorKind::TooLarge,
                "error kind {:?} but the JSON reader says syntax error: {syntax}",
                e.kind
            );
            invariant!(!e.message.is_empty(), "a configuration error without a message: {e:?}");
            let size = e.field.len() + e.message.len();
            known_bug!(
                "F1",
                size <= MAX_CONFIG_ERROR_BYTES,
                "configuration error of {size} bytes (limit {MAX_CONFIG_ERROR_BYTES}): field {}…",
                e.field.chars().take(80).collect::<String>()
            );
            invariant!(!e.message.contains('\n'), "a configuration error's message spans lines: {e:?}");
            known_bug!("F1", !e.field.contains(['\n', '\r']), "a configuration error's field spans lines: {:?}", e.field);
        }
    }
}

/// Bytes an error of the JSON reader may take.
pub const MAX_JSON_ERROR_BYTES: usize = 200;

/// Whether our value is serde_json's (numbers compared as f64: ours keep their text).
fn same(ours: &Json, theirs: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (ours, theirs) {
        (Json::Null, Value::Null) => true,
        (Json::Bool(a), Value::Bool(b)) => a == b,
        (Json::String(a), Value::String(b)) => a == b,
        (Json::Number(text), Value::Number(n)) => {
            let exact = match (ours.as_u64(), n.as_u64()) {
                (Some(a), Some(b)) => a == b,
                (Some(_), None) => false,
                _ => true,
            };
            // serde_json rounds long mantissas approximately (no `float_roundtrip`).
            let close = match (text.parse::<f64>().ok(), n.as_f64()) {
                (Some(a), Some(b)) => a == b || (a - b).abs() <= b.abs() * 1e-14,
                (a, b) => a == b,
            };
            exact && close
        }
        (Json::Array(a), Value::Array(b)) => a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y)),
        (Json::Object(a), Value::Object(b)) => a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| same(v, w))),
        _ => false,
    }
}

/// `json`: the JSON reader against serde_json (the same documents accepted, the
/// same values), bounded errors, and strings written by `write_string` read back.
pub fn json(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let ours = json::parse(&text);
    let theirs = serde_json::from_str::<serde_json::Value>(&text);
    match (&ours, &theirs) {
        (Ok(v), Ok(w)) => invariant!(same(v, w), "the reader and serde_json read different values from {:?}", text.chars().take(200).collect::<String>()),
        (Ok(_), Err(e)) if text.contains("\\u") && e.to_string().contains("escape") => {
            known_bug!("F2", false, "the reader accepts a \\u escape serde_json refuses ({e}): {:?}", text.chars().take(200).collect::<String>())
        }
        (Ok(_), Err(e)) => invariant!(
            e.to_string().contains("number out of range"),
            "the reader accepts what serde_json refuses ({e}): {:?}",
            text.chars().take(200).collect::<String>()
        ),
        (Err(m), Ok(_)) => invariant!(
            m.contains("nesting deeper") || m.contains("appears twice"),
            "the reader refuses valid JSON ({m}): {:?}",
            text.chars().take(200).collect::<String>()
        ),
        (Err(_), Err(_)) => {}
    }
    if let Err(m) = &ours {
        invariant!(m.len() <= MAX_JSON_ERROR_BYTES, "JSON error of {} bytes", m.len());
    }
    let mut written = String::new();
    json::write_string(&mut written, &text);
    invariant!(json::parse(&written) == Ok(Json::String(text.to_string())), "write_string does not read back: {written:?}");
    invariant!(serde_json::from_str::<String>(&written).ok().as_deref() == Some(&*text), "write_string is not JSON for serde_json: {written:?}");
}
