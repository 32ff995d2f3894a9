//! Failures a tool relays as text: most MCP servers report an upstream API's
//! failure as an `isError: true` result whose only trace of the upstream status is
//! its text or structured content (MCP specification, "Error Handling": tool
//! execution errors are reported in the result). This module reads them as a
//! person would, from data-driven tables, in this order (the first rule that
//! matches decides the class):
//!
//! 1. the configuration's own `tool-error-rules` (the tool's, then the global ones);
//! 2. phrases that look like one class but are another (`request too large` with a
//!    429 is a bad request; `insufficient_quota` is billing, not a throttle);
//! 3. a provider's error identifier in the structured content or JSON in the text
//!    (`error.type`, `error.code`, `error.status`, AWS `__type`), or written in the
//!    text as an identifier (`overloaded_error`, `ThrottlingException`,
//!    `code = Unavailable`);
//! 4. throttle wording (`rate limit`, `too many requests`, `quota exceeded`);
//! 5. an HTTP status: a number in a status field of the JSON, or in the text next
//!    to a word that makes it one (`HTTP 503`, `status code 429`, `503 Service
//!    Unavailable`); a bare number (`429 items`) is not a status;
//! 6. permission wording; 7. outage, timeout and connection wording.
//!
//! Text that matches nothing stays deterministic: the model sees it (replan).
//! A wait written in the text (`try again in 20s`, `Retry after 1m30s`,
//! `retryDelay: "53s"`) becomes the hint when no header gave one.
//!
//! Costs are linear: the text is read up to `MAX_TEXT_BYTES`, structured content
//! is parsed up to `MAX_STRUCTURED_BYTES`, and each table is a fixed list.

use alloc::string::String;
use alloc::vec::Vec;

use crate::classify::status_class;
use crate::json::{self, Json};
use crate::rules::Rule;
use crate::types::OutcomeClass;

/// How much of a tool's text the rules read.
pub const MAX_TEXT_BYTES: usize = 4096;
/// Structured content longer than this is not parsed (its text is still read).
pub const MAX_STRUCTURED_BYTES: usize = 65_536;
/// The most word comparisons one read makes. A relayed error of a kilobyte
/// needs about 1,500; a text built to make every phrase or rule compare with
/// every word stops here, so a read's cost has a bound whatever the input (the
/// rule then says `tool-error:scan-limit` and the text goes to the model).
pub const MAX_COMPARISONS: u32 = 20_000;

/// A class rule from the configuration: text containing `contains` (any case;
/// where a word starts, if `contains` starts with a letter, digit or `_`) has `class`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextRule {
    /// Lower-cased.
    pub contains: String,
    pub class: OutcomeClass,
}

/// What the text of a failure says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relayed {
    pub class: OutcomeClass,
    /// The rule that decided, e.g. `tool-error:vocabulary`.
    pub rule: Rule,
    /// What it read, for the decision's reason, e.g. `"rate limit"`.
    pub evidence: String,
    /// A wait written in the text or structured content, in ms.
    pub hint_ms: Option<u64>,
    /// The upstream HTTP status, when the `tool-error:status` rule decided.
    pub status: Option<u16>,
}

use OutcomeClass::{Deterministic as D, Permission as P, Throttled as T, Transient as R, Unclassified as U};

/// A server-minted handle (a page snapshot's ref, a sandbox, a cursor) that
/// is no longer valid: the same call fails the same way, so the model must get
/// a new handle first (MCP 2026-07-28 keeps state in such handles). Each phrase
/// is a real server's wording:
/// - microsoft/playwright-mcp: "Ref e3 not found in the current page snapshot.
///   Try capturing new snapshot." (what its tests expect of a stale ref);
/// - e2b-dev/E2B SDKs: "<message>: This error is likely due to sandbox timeout."
///   (`format_sandbox_timeout_exception`, python and js SDKs);
/// - Glean API: "The provided cursor has expired. Start a new search to get a
///   fresh cursor." (developers.glean.com/errors/invalid-cursor).
const EXPIRED_HANDLES: &[(&str, OutcomeClass)] =
    &[("not found in the current page snapshot", D), ("likely due to sandbox timeout", D), ("cursor has expired", D)];

/// Phrases that override what the rest of the text seems to say.
const VETOES: &[(&str, OutcomeClass)] = &[
    // OpenAI's 429 for a request larger than the whole limit: no wait helps.
    ("request too large", D),
    ("larger than max", D),
    ("maximum context length", D),
    ("context_length_exceeded", D),
    // Billing and keys: a person must act, whatever the status says.
    ("insufficient_quota", P),
    ("check your plan and billing", P),
    ("billing_error", P),
    ("api key not valid", P),
    ("api_key_invalid", P),
    // A certificate the client rejects will be rejected again: a configuration bug.
    ("failed to verify certificate", U),
    ("certificate verify failed", U),
];

/// Provider error identifiers, compared lower-cased with `_`, `-` and spaces
/// removed: Anthropic and OpenAI error types and codes, Google API / gRPC status
/// names, and botocore's throttling and transient AWS error codes.
const IDENTIFIERS: &[(&str, OutcomeClass)] = &[
    ("ratelimiterror", T),
    ("ratelimitexceeded", T),
    ("ratelimited", T),
    ("overloadederror", T),
    ("resourceexhausted", T),
    ("toomanyrequests", T),
    ("overquerylimit", T),
    ("throttling", T),
    ("throttlingexception", T),
    ("throttledexception", T),
    ("requestthrottled", T),
    ("requestthrottledexception", T),
    ("toomanyrequestsexception", T),
    ("provisionedthroughputexceededexception", T),
    ("transactioninprogressexception", T),
    ("requestlimitexceeded", T),
    ("bandwidthlimitexceeded", T),
    ("limitexceededexception", T),
    ("slowdown", T),
    ("ec2throttledexception", T),
    ("unavailable", R),
    ("deadlineexceeded", R),
    ("internal", R),
    ("aborted", R),
    ("apierror", R),
    ("servererror", R),
    ("timeouterror", R),
    ("requesttimeout", R),
    ("requesttimeoutexception", R),
    ("priorrequestnotcomplete", R),
    ("serviceunavailable", R),
    ("serviceunavailableexception", R),
    ("internalerror", R),
    ("internalfailure", R),
    ("internalservererror", R),
    ("internalserverexception", R),
    ("backenderror", R),
    ("permissiondenied", P),
    ("unauthenticated", P),
    ("authenticationerror", P),
    ("permissionerror", P),
    ("accessdenied", P),
    ("accessdeniedexception", P),
    ("unrecognizedclientexception", P),
    ("invalidsignatureexception", P),
    ("expiredtoken", P),
    ("expiredtokenexception", P),
    ("invalidapikey", P),
    ("requestdenied", P),
    ("invalidargument", D),
    ("notfound", D),
    ("alreadyexists", D),
    ("failedprecondition", D),
    ("outofrange", D),
    ("invalidrequesterror", D),
    ("notfounderror", D),
    ("validationexception", D),
    ("resourcenotfoundexception", D),
    ("unimplemented", U),
    ("dataloss", U),
];

/// Throttle wording (any case, whole words).
const THROTTLE_WORDS: &[(&str, OutcomeClass)] = &[
    ("rate limit", T),
    ("rate-limit", T),
    ("rate limited", T),
    ("rate limiting", T),
    ("too many requests", T),
    ("throttled", T),
    ("throttling", T),
    ("resource exhausted", T),
    ("resource has been exhausted", T),
    ("quota exceeded", T),
    ("exceeded your current quota", T),
    ("overloaded", T),
    ("high demand", T),
    ("reduce your request rate", T),
    ("slow down", T),
    ("too many clients", T),
];

/// Permission wording.
const PERMISSION_WORDS: &[(&str, OutcomeClass)] = &[
    ("permission denied", P),
    ("access denied", P),
    ("access is denied", P),
    ("forbidden", P),
    ("unauthorized", P),
    ("unauthorised", P),
    ("not authorized", P),
    ("authentication failed", P),
    ("invalid api key", P),
    ("invalid x-api-key", P),
    ("bad credentials", P),
    ("insufficient permissions", P),
    ("token has expired", P),
    ("unable to locate credentials", P),
];

/// Outage, timeout and connection wording, as Go, Node, Python and Java clients
/// and the MCP SDKs put it.
const TRANSIENT_WORDS: &[(&str, OutcomeClass)] = &[
    ("service unavailable", R),
    ("temporarily unavailable", R),
    ("currently unavailable", R),
    ("bad gateway", R),
    ("gateway timeout", R),
    ("internal server error", R),
    ("server error", R),
    ("try again later", R),
    ("timed out", R),
    ("timeout error", R),
    ("deadline exceeded", R),
    ("i/o timeout", R),
    ("etimedout", R),
    ("esockettimedout", R),
    ("und_err_connect_timeout", R),
    ("und_err_headers_timeout", R),
    ("und_err_body_timeout", R),
    ("read timeout", R),
    ("connect timeout", R),
    ("handshake timeout", R),
    ("request timeout", R),
    ("sockettimeoutexception", R),
    ("connection refused", R),
    ("econnrefused", R),
    ("connection reset", R),
    ("econnreset", R),
    ("econnaborted", R),
    ("socket hang up", R),
    ("broken pipe", R),
    ("connection aborted", R),
    ("connection closed", R),
    ("remote end closed connection", R),
    ("remotedisconnected", R),
    ("other side closed", R),
    ("und_err_socket", R),
    ("fetch failed", R),
    ("eai_again", R),
    ("connection error", R),
    ("could not connect", R),
    ("failed to establish a new connection", R),
    ("connection terminated unexpectedly", R),
    ("unexpected eof", R),
    ("no route to host", R),
];

/// Words that make the number after them an HTTP status (`HTTP 503`, `status code: 429`).
const STATUS_BEFORE: &[&str] =
    &["http", "http/1.0", "http/1.1", "http/2", "status", "status code", "statuscode", "error code", "code", "error", "returned", "responded with"];

/// Reason phrases that make the number before them an HTTP status (`503 Service Unavailable`).
const STATUS_AFTER: &[&str] = &[
    "too many requests",
    "service unavailable",
    "bad gateway",
    "gateway timeout",
    "internal server error",
    "forbidden",
    "unauthorized",
    "not found",
    "bad request",
    "request timeout",
    "conflict",
    "unprocessable",
    "payload too large",
    "content too large",
    "overloaded",
    "api rate limit",
    "error",
];

/// Words after which a duration is a wait hint (`try again in 20s`, `Retry after: 21 seconds`).
const HINT_BEFORE: &[&str] =
    &["try again in", "retry in", "retry after", "try again after", "retry-after", "rate reset in", "reset in", "resets in", "wait for"];

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Positions where `needle` occurs in `hay`. A plain scan: the needles are short,
/// and core's two-way searcher costs the component kilobytes.
#[inline(never)]
pub fn positions<'a>(hay: &'a [u8], needle: &'a [u8]) -> impl Iterator<Item = usize> + 'a {
    let last = hay.len().checked_sub(needle.len()).map_or(0, |n| n + 1);
    (0..last).filter(move |&i| hay[i] == needle[0] && hay[i..i + needle.len()] == *needle)
}

/// Lower-cased text with the positions where its words start, grouped by their
/// first byte: a phrase is compared only with the words that start like it, so
/// a scan costs about the words times the phrases sharing a first letter, and a
/// text cannot make every phrase compare everywhere.
struct Words {
    text: String,
    /// Word starts grouped by first byte (a counting sort), ascending in each group.
    starts: Vec<u32>,
    /// `starts[group[b]..group[b + 1]]` are the words starting with byte `b`.
    group: [u32; 257],
    /// Comparisons left (`MAX_COMPARISONS`).
    budget: core::cell::Cell<u32>,
}

impl Words {
    fn new(text: String) -> Words {
        let bytes = text.as_bytes();
        let is_start = |i: usize| is_word_byte(bytes[i]) && (i == 0 || !is_word_byte(bytes[i - 1]));
        let mut group = [0u32; 257];
        for i in (0..bytes.len()).filter(|&i| is_start(i)) {
            group[usize::from(bytes[i]) + 1] += 1;
        }
        for b in 1..257 {
            group[b] += group[b - 1];
        }
        let mut next = group;
        let mut starts = alloc::vec![0u32; group[256] as usize];
        for i in (0..bytes.len()).filter(|&i| is_start(i)) {
            let slot = &mut next[usize::from(bytes[i])];
            starts[*slot as usize] = i as u32;
            *slot += 1;
        }
        Words { text, starts, group, budget: core::cell::Cell::new(MAX_COMPARISONS) }
    }

    /// Calls `found` with each position where `needle` (which starts with a word
    /// byte) begins a word, and as a whole word if `whole`, until `found` says
    /// stop or the comparison budget is spent. Returns whether `found` stopped it.
    #[inline(never)]
    fn each(&self, needle: &[u8], whole: bool, found: &mut dyn FnMut(usize) -> bool) -> bool {
        let bytes = self.text.as_bytes();
        let Some(&first) = needle.first() else { return false };
        let group = &self.starts[self.group[usize::from(first)] as usize..self.group[usize::from(first) + 1] as usize];
        for &start in group {
            let left = self.budget.get();
            if left == 0 {
                return false;
            }
            self.budget.set(left - 1);
            let i = start as usize;
            // The second byte first: most words differ there.
            let second_matches = needle.len() < 2 || bytes.get(i + 1) == needle.get(1);
            if second_matches
                && bytes.get(i..i + needle.len()) == Some(needle)
                && (!whole || bytes.get(i + needle.len()).is_none_or(|b| !is_word_byte(*b)))
                && found(i)
            {
                return true;
            }
        }
        false
    }

    /// Whether `needle` occurs as whole words.
    fn has(&self, needle: &str) -> bool {
        self.each(needle.as_bytes(), true, &mut |_| true)
    }
}

/// The first phrase of `table` that `words` contains as whole words.
#[inline(never)]
fn first_phrase(words: &Words, table: &'static [(&'static str, OutcomeClass)]) -> Option<(OutcomeClass, &'static str)> {
    table.iter().find(|(phrase, _)| words.has(phrase)).map(|(phrase, class)| (*class, *phrase))
}

/// The class of a provider error identifier, if it is one the table knows: the
/// identifier is compared lower-cased, without `_`, `-` and spaces. AWS writes
/// `com.amazon.coral#ThrottlingException` or `ThrottlingException:http://...`.
#[inline(never)]
pub fn identifier_class(text: &str) -> Option<OutcomeClass> {
    let text = text.rsplit('#').next().unwrap_or(text);
    let text = text.split(':').next().unwrap_or(text).trim();
    if text.is_empty() || text.len() > 64 {
        return None;
    }
    let mut id = [0u8; 64];
    let mut len = 0;
    for b in text.bytes().filter(|b| !matches!(b, b'_' | b'-' | b' ')) {
        id[len] = b.to_ascii_lowercase();
        len += 1;
    }
    let id = &id[..len];
    IDENTIFIERS.iter().find(|(name, _)| name.as_bytes() == id).map(|(_, class)| *class)
}

/// The first `max` bytes of `text`, cut on a character boundary.
pub fn bounded(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or("")
}

#[inline(never)]
fn member<'a>(object: &'a Json, key: &str) -> Option<&'a Json> {
    match object {
        Json::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
        _ => None,
    }
}

/// The error object of a provider's JSON: `{"error": {...}}`, else the whole.
#[inline(never)]
fn error_object(root: &Json) -> &Json {
    match member(root, "error") {
        Some(inner @ Json::Object(_)) => inner,
        _ => root,
    }
}

/// String fields that carry an error identifier, most specific first.
const IDENTIFIER_FIELDS: &[&str] = &["type", "code", "status", "__type", "Code", "name", "error", "reason"];

/// Number fields that carry the upstream HTTP status.
const STATUS_FIELDS: &[&str] = &["status", "code", "statusCode", "status_code", "httpStatusCode"];

/// What a provider's JSON says: an identifier's class, and an HTTP status.
#[inline(never)]
fn read_json(root: &Json) -> (Option<(OutcomeClass, String)>, Option<u16>) {
    let error = error_object(root);
    let mut identified = None;
    'outer: for object in [error, root] {
        for field in IDENTIFIER_FIELDS {
            if let Some(Json::String(value)) = member(object, field) {
                // Anthropic's envelope says `"type": "error"`: not an identifier.
                if let Some(class) = identifier_class(value) {
                    identified = Some((class, crate::text::excerpt(value, 60)));
                    break 'outer;
                }
            }
        }
    }
    let metadata = member(root, "$metadata"); // AWS SDK for JavaScript v3
    let mut status = None;
    for object in [Some(error), Some(root), metadata].into_iter().flatten() {
        for field in STATUS_FIELDS {
            if let Some(code) = member(object, field).and_then(Json::as_u64).filter(|c| (400..=599).contains(c)) {
                status = Some(code as u16);
                break;
            }
        }
        if status.is_some() {
            break;
        }
    }
    (identified, status)
}

/// A wait written in JSON: Google's `RetryInfo.retryDelay` (`"53s"`), or
/// `retry_after` / `retryAfter` in seconds.
#[inline(never)]
fn json_hint_ms(root: &Json) -> Option<u64> {
    let error = error_object(root);
    if let Some(Json::Array(details)) = member(error, "details") {
        for detail in details {
            if let Some(Json::String(delay)) = member(detail, "retryDelay") {
                return crate::hints::go_duration_ms(delay.trim());
            }
        }
    }
    for object in [error, root] {
        for field in ["retry_after", "retryAfter"] {
            match member(object, field) {
                Some(Json::Number(n)) => return crate::hints::decimal_ms(n, 1000),
                Some(Json::String(s)) => return crate::hints::decimal_ms(s.trim(), 1000),
                _ => {}
            }
        }
    }
    None
}

/// A duration written in prose at the start of `text`: `20s`, `1m30s`, `644ms`,
/// `30 seconds`, `1.5 minutes`, `2 hours`; or a bare number of seconds.
#[inline(never)]
fn prose_duration_ms(text: &str) -> Option<u64> {
    let text = text.trim_start_matches([' ', ':', '=']);
    let number_len = text.bytes().take_while(|b| b.is_ascii_digit() || *b == b'.').count();
    if number_len == 0 {
        return None;
    }
    let compact_len = text.bytes().take_while(|b| b.is_ascii_alphanumeric() || *b == b'.').count();
    let compact = text.get(..compact_len)?.trim_end_matches('.');
    // A Go duration (`1m30s`, `9m38.016s`, `644ms`) written without spaces.
    if compact.len() > number_len
        && let Some(ms) = crate::hints::go_duration_ms(compact)
    {
        return Some(ms);
    }
    let number = text.get(..number_len)?.trim_end_matches('.');
    let unit_text = text.get(number_len..)?.trim_start();
    let unit_len = unit_text.bytes().take_while(u8::is_ascii_alphabetic).count();
    let unit_ms = match unit_text.get(..unit_len)? {
        "ms" | "millisecond" | "milliseconds" => 1,
        "" | "s" | "sec" | "secs" | "second" | "seconds" => 1000,
        "m" | "min" | "mins" | "minute" | "minutes" => 60_000,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600_000,
        _ => return None,
    };
    crate::hints::decimal_ms(number, unit_ms)
}

/// A wait written in the text, after one of `HINT_BEFORE`, or an RFC 3339 time
/// after `resets at`.
#[inline(never)]
fn prose_hint_ms(words: &Words, now_ms: u64) -> Option<u64> {
    let lower = words.text.as_str();
    let mut hint = None;
    for trigger in HINT_BEFORE {
        let after = |i: usize| lower.get(i + trigger.len()..).unwrap_or("");
        if words.each(trigger.as_bytes(), true, &mut |i| {
            hint = prose_duration_ms(after(i));
            hint.is_some()
        }) {
            return hint;
        }
    }
    for trigger in ["resets at", "reset at"] {
        let after = |i: usize| lower.get(i + trigger.len()..).unwrap_or("").trim_start_matches([' ', ':']);
        if words.each(trigger.as_bytes(), true, &mut |i| {
            let stamp = after(i).split([' ', ',', ';', '\n']).next().unwrap_or("").trim_end_matches('.').to_ascii_uppercase();
            hint = crate::time::parse_rfc3339(&stamp).map(|at| at.saturating_sub(now_ms));
            hint.is_some()
        }) {
            return hint;
        }
    }
    None
}

/// An HTTP status written in the text, with the words that make it one.
#[inline(never)]
fn prose_status(lower: &str) -> Option<u16> {
    let bytes = lower.as_bytes();
    let trim_end = |t: &[u8]| -> usize { t.len() - t.iter().rev().take_while(|b| b" :=([\'\"".contains(b)).count() };
    let trim_start = |t: &[u8]| -> usize { t.iter().take_while(|b| b" :-)]\'\"".contains(b)).count() };
    let mut i = 0;
    while i + 3 <= bytes.len() {
        let digits = &bytes[i..i + 3];
        let is_number = digits.iter().all(u8::is_ascii_digit) && (i == 0 || !is_word_byte(bytes[i - 1])) && bytes.get(i + 3).is_none_or(|b| !is_word_byte(*b));
        if is_number {
            let status = digits.iter().fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
            if (400..=599).contains(&status) {
                let before = &bytes[..trim_end(&bytes[..i])];
                let rest = &bytes[i + 3..];
                let after = &rest[trim_start(rest)..];
                let named_before = STATUS_BEFORE.iter().any(|w| {
                    let w = w.as_bytes();
                    before.ends_with(w) && before.len().checked_sub(w.len() + 1).is_none_or(|j| !is_word_byte(before[j]))
                });
                let named_after = STATUS_AFTER.iter().any(|w| after.starts_with(w.as_bytes()));
                if named_before || named_after {
                    return Some(status);
                }
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    None
}

/// Identifiers written in the text: `snake_case` or `CamelCase` tokens
/// (`overloaded_error`, `ThrottlingException`, `RESOURCE_EXHAUSTED`) and gRPC's
/// `code = Unavailable`. Plain words are left to the wording tables.
#[inline(never)]
fn prose_identifier(text: &str, budget: &core::cell::Cell<u32>) -> Option<(OutcomeClass, String)> {
    let grpc = positions(text.as_bytes(), b"code = ").filter_map(|i| text.get(i + 7..));
    let tokens = text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
    for (token, from_grpc) in grpc.map(|t| (t.split(|c: char| !c.is_ascii_alphanumeric()).next().unwrap_or(""), true)).chain(tokens.map(|t| (t, false))) {
        let bytes = token.as_bytes();
        let camel = bytes.windows(2).any(|w| w[0].is_ascii_lowercase() && w[1].is_ascii_uppercase());
        if !(from_grpc || token.contains('_') || camel) {
            continue;
        }
        let left = budget.get();
        if left == 0 {
            return None;
        }
        budget.set(left - 1);
        if let Some(class) = identifier_class(token) {
            return Some((class, String::from(token)));
        }
    }
    None
}

fn quoted(text: &str) -> String {
    let mut out = String::from("\"");
    out.push_str(text);
    out.push('"');
    out
}

/// Reads a tool's failure text and structured content. `rules` are the
/// configuration's (the tool's first); `overrides` are `status-overrides`.
pub fn read(text: &str, structured: Option<&str>, rules: &[&TextRule], overrides: &[(u16, OutcomeClass)], now_ms: u64) -> Relayed {
    let text = bounded(text, MAX_TEXT_BYTES);
    let mut lower = text.to_ascii_lowercase();
    let parsed = structured.filter(|s| s.len() <= MAX_STRUCTURED_BYTES).and_then(|s| json::parse(s).ok()).or_else(|| {
        // JSON in the text: the whole text, or after a prefix (`529 {"type": ...}`).
        let start = text.find('{')?;
        json::parse(text.get(start..)?.trim_end()).ok()
    });
    if let Some(s) = structured {
        lower.push('\n');
        lower.push_str(&bounded(s, MAX_TEXT_BYTES).to_ascii_lowercase());
    }
    let words = Words::new(lower);
    let lower = words.text.as_str();
    let hint_ms = parsed.as_ref().and_then(json_hint_ms).or_else(|| prose_hint_ms(&words, now_ms));
    let found = |class, rule, evidence| Relayed { class, rule, evidence, hint_ms, status: None };

    for rule in rules {
        // Anchored at word starts when the rule starts with a word character, so
        // that 64 rules cost what 64 phrases do; else a plain scan.
        let at_word = rule.contains.as_bytes().first().is_some_and(|b| is_word_byte(*b));
        let found_rule = if at_word {
            words.each(rule.contains.as_bytes(), false, &mut |_| true)
        } else {
            positions(lower.as_bytes(), rule.contains.as_bytes()).next().is_some()
        };
        if found_rule {
            return found(rule.class, Rule::ConfigToolErrorRules, quoted(&rule.contains));
        }
    }
    if let Some((class, phrase)) = first_phrase(&words, EXPIRED_HANDLES) {
        return found(class, Rule::ToolErrorExpiredHandle, quoted(phrase));
    }
    if let Some((class, phrase)) = first_phrase(&words, VETOES) {
        return found(class, Rule::ToolErrorVocabulary, quoted(phrase));
    }
    let (json_identifier, json_status) = parsed.as_ref().map(read_json).unwrap_or((None, None));
    if let Some((class, id)) = json_identifier.or_else(|| prose_identifier(text, &words.budget)) {
        return found(class, Rule::ToolErrorProviderCode, quoted(&id));
    }
    if let Some((class, phrase)) = first_phrase(&words, THROTTLE_WORDS) {
        return found(class, Rule::ToolErrorVocabulary, quoted(phrase));
    }
    if let Some(status) = json_status.or_else(|| prose_status(lower)) {
        let class = overrides.iter().find(|(s, _)| *s == status).map_or_else(|| status_class(status), |(_, c)| *c);
        return Relayed { status: Some(status), ..found(class, Rule::ToolErrorStatus, crate::cat::cat!("upstream HTTP ", status)) };
    }
    if let Some((class, phrase)) = first_phrase(&words, PERMISSION_WORDS).or_else(|| first_phrase(&words, TRANSIENT_WORDS)) {
        return found(class, Rule::ToolErrorVocabulary, quoted(phrase));
    }
    let rule = if words.budget.get() == 0 { Rule::ToolErrorScanLimit } else { Rule::ToolError };
    found(D, rule, String::new())
}

/// Lower-cases configured rule text once, at load.
pub fn text_rule(contains: &str, class: OutcomeClass) -> TextRule {
    TextRule { contains: contains.to_ascii_lowercase(), class }
}

/// Rules of a tool, then the global ones.
pub fn rules_for<'a>(tool: &'a [TextRule], global: &'a [TextRule]) -> Vec<&'a TextRule> {
    tool.iter().chain(global.iter()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_764_460_800_000;

    fn read_text(text: &str) -> (OutcomeClass, Option<u64>) {
        let r = read(text, None, &[], &[], NOW);
        (r.class, r.hint_ms)
    }

    #[test]
    fn statuses_need_words_around_them() {
        assert_eq!(read_text("Brave API error: 429 Too Many Requests").0, T);
        assert_eq!(read_text("Failed to fetch https://x.y/ - status code 503").0, R);
        assert_eq!(read_text("upstream returned HTTP 404").0, D);
        assert_eq!(read_text("Cannot reserve 429 items: only 200 in stock").0, D);
        assert_eq!(read_text("order ORD-503 has no refundable amount").0, D);
    }

    #[test]
    fn wording_and_identifiers() {
        assert_eq!(read_text("Error code: 529 - {'type': 'error', 'error': {'type': 'overloaded_error'}}").0, T);
        assert_eq!(read_text("An error occurred (ThrottlingException) when calling the InvokeModel operation").0, T);
        assert_eq!(read_text("rpc error: code = Unavailable desc = connection refused").0, R);
        assert_eq!(read_text("Permission Denied: API rate limit exceeded for user ID 1.").0, T);
        assert_eq!(read_text("Request too large for gpt-4o: rate_limit_exceeded").0, D);
        assert_eq!(read_text("dial tcp 127.0.0.1:3333: connect: connection refused").0, R);
        assert_eq!(read_text("Access denied - path outside allowed directories").0, P);
        assert_eq!(read_text("amount_paise must be an integer").0, D);
    }

    #[test]
    fn waits_in_prose() {
        assert_eq!(read_text("Please try again in 9.816s.").1, Some(9816));
        assert_eq!(read_text("Rate limit reached. Please try again in 644ms.").1, Some(644));
        assert_eq!(read_text("GitHub API rate limit exceeded. Retry after 29m59s.").1, Some(1_799_000));
        assert_eq!(read_text("Retry after: 21 seconds.").1, Some(21_000));
        assert_eq!(read_text("Timed out while waiting for response. Waited 30.0 seconds.").1, None);
        assert_eq!(read_text("rate limited, resets at 2025-11-30T00:00:05Z").1, Some(5000));
        let google = r#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[{"retryDelay":"53s"}]}}"#;
        let r = read("quota", Some(google), &[], &[], NOW);
        assert_eq!((r.class, r.hint_ms), (T, Some(53_000)));
    }

    #[test]
    fn configured_rules_come_first() {
        let rule = text_rule("E_BUSY", R);
        let r = read("device e_busy, permission denied", None, &[&rule], &[], NOW);
        assert_eq!((r.class, r.rule), (R, Rule::ConfigToolErrorRules));
    }
}

#[cfg(test)]
mod cost {
    use super::*;

    #[test]
    fn a_text_built_to_compare_everywhere_stops_at_the_limit() {
        let rules: Vec<TextRule> = (0..128).map(|i| text_rule(&alloc::format!("e_busy_{i}"), R)).collect();
        let refs: Vec<&TextRule> = rules.iter().collect();
        let text = "e_a ".repeat(1024);
        let r = read(&text, None, &refs, &[], 0);
        assert_eq!((r.class, r.rule), (D, Rule::ToolErrorScanLimit));
    }

    /// Run under callgrind to see where a worst-case read goes (`--ignored`).
    #[test]
    #[ignore]
    fn worst_case_read() {
        let rules: Vec<TextRule> = (0..128).map(|i| text_rule(&alloc::format!("e_busy_{i}"), R)).collect();
        let refs: Vec<&TextRule> = rules.iter().collect();
        let text = "e_a ".repeat(1024);
        let structured = alloc::format!("\"{}\"", "e_b ".repeat(1023));
        let r = read(&text, Some(&structured), &refs, &[], 0);
        assert_eq!(r.class, D);
    }
}
