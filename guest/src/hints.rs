//! Server hints read from response headers: how long to wait, and whether to retry.
//!
//! Wait hints, in order of precedence (the first header that parses wins; a
//! malformed one is reported as a problem and the next is tried):
//! 1. `retry-after-ms`: ms, a decimal number (Stainless SDKs, OpenAI, Anthropic).
//! 2. `x-amz-retry-after`: ms (the AWS SDKs' retry behaviour, smithy-rs).
//! 3. `retry-after`: delay-seconds or an HTTP-date (RFC 9110 §10.2.3), also in
//!    the lenient forms Python's `email.utils` reads (`UTC` for `GMT`, a one-digit
//!    day). Decimal seconds are accepted as the Stainless SDKs do. The draft
//!    RateLimit headers say Retry-After takes precedence over them.
//! 4. `grpc-retry-pushback-ms` (gRPC proposal A6, "gRPC Retry Design"): ms; a
//!    negative or malformed value means the server forbids a retry.
//! 5. `ratelimit`: `"policy";r=0;t=30` (draft-ietf-httpapi-ratelimit-headers):
//!    the longest `t` among the items with no quota left (`r` = 0 or absent). It
//!    is a list, and a list may span several header fields (RFC 9110 §5.3), so
//!    every `ratelimit` field is read, joined with commas, whether the host
//!    passes them separately or joined.
//! 6. OpenAI `x-ratelimit-reset-{requests,tokens}` (Go durations, `6m0s`) and
//!    Anthropic `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-reset`
//!    (RFC 3339): the latest reset among the limits whose matching `-remaining`
//!    header is 0 or absent, since each limit resets on its own.
//! 7. `ratelimit-reset` / `x-ratelimit-reset`: a number that is a Unix time in ms
//!    (≥ 10^12), a Unix time in seconds (≥ 10^9), or else seconds from now; vendors
//!    disagree, and those thresholds tell the forms apart for any date after 2001.
//!
//! Absolute times become ms from `now_ms`; a time in the past is a hint of 0. A
//! hint longer than `max-plausible-hint-ms` (default a year) is a header problem,
//! not a wait: no server means it, and a note must not say "room returns in
//! 584 million years".

use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::arith::{decimal_saturating, mul_saturating};
use crate::cat::cat;
use crate::text::excerpt;
use crate::time::{parse_http_date, parse_rfc3339};
use crate::types::HeaderProblem;

/// A wait hint: ms from now, and the header it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hint {
    pub wait_ms: u64,
    pub source: &'static str,
}

/// What the headers say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerHints {
    pub wait: Option<Hint>,
    /// `x-should-retry: true|false` (Stainless SDKs): the server's own verdict.
    pub should_retry: Option<bool>,
    pub problems: Vec<HeaderProblem>,
}

/// One header as the policy reads it: name and value, borrowed from the
/// host's list or from the flat path's `name: value` lines.
pub type Pair<'a> = (&'a str, &'a str);

/// The `name: value` lines of `record-failure`'s `headers`, joined with `\n`:
/// a name ends at the first `:`; a line without one is a name with no value.
/// Names and values are trimmed of ASCII whitespace only (HTTP's optional
/// whitespace is spaces and tabs, RFC 9110 §5.6.3), byte by byte: no character
/// decoding on the decision path.
pub fn split_lines(text: &str) -> Vec<Pair<'_>> {
    if text.is_empty() {
        return Vec::new();
    }
    // Room for a typical response's headers at once: growing by doubling cost
    // a quarter of the split.
    let mut pairs = Vec::with_capacity(16);
    let mut rest = text;
    while !rest.is_empty() {
        // `split_at_checked` and `get`, not indexing: a `str` index that can
        // panic brings in the panic's message machinery (7 KB of Unicode
        // tables), though these never do (the byte found is ASCII).
        let (line, after) = match find_ascii(rest, b'\n').and_then(|at| rest.split_at_checked(at)) {
            Some((line, after)) => (line, after.get(1..).unwrap_or("")),
            None => (rest, ""),
        };
        rest = after;
        let line = line.trim_ascii();
        if line.is_empty() {
            continue;
        }
        pairs.push(match find_ascii(line, b':').and_then(|at| line.split_at_checked(at)) {
            Some((name, value)) => (name.trim_ascii(), value.get(1..).unwrap_or("").trim_ascii()),
            None => (line, ""),
        });
    }
    pairs
}

/// Where the ASCII `byte` first is in `text`. A plain loop over the first
/// [`SCAN_BEFORE_MEMCHR`] bytes, where most header lines and names end, then
/// `memchr` (through `str::find`) for the rest: `memchr`'s setup made a short
/// line cost more than its search (about 550 instructions a header line, three
/// quarters of what a header cost), and a plain loop alone made long values
/// cost about five times what `memchr` does.
fn find_ascii(text: &str, byte: u8) -> Option<usize> {
    let bytes = text.as_bytes();
    let head = bytes.len().min(SCAN_BEFORE_MEMCHR);
    let mut i = 0;
    while i < head {
        if bytes[i] == byte {
            return Some(i);
        }
        i += 1;
    }
    if head == bytes.len() {
        return None;
    }
    // An ASCII byte never sits inside a character: any boundary at or before
    // `head` is a correct place to go on from.
    let mut start = head;
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    text.get(start..)?.find(char::from(byte)).map(|at| start + at)
}

/// How many bytes [`find_ascii`] reads one by one before it calls `memchr`.
const SCAN_BEFORE_MEMCHR: usize = 64;

/// Every header the policy reads. A lookup names one of these, so the
/// headers are indexed once ([`Headers::new`]) and no lookup scans them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Name {
    XShouldRetry,
    RetryAfterMs,
    XAmzRetryAfter,
    RetryAfter,
    GrpcRetryPushbackMs,
    RateLimit,
    XRateLimitResetRequests,
    XRateLimitRemainingRequests,
    XRateLimitResetTokens,
    XRateLimitRemainingTokens,
    AnthropicRequestsReset,
    AnthropicRequestsRemaining,
    AnthropicTokensReset,
    AnthropicTokensRemaining,
    AnthropicInputTokensReset,
    AnthropicInputTokensRemaining,
    AnthropicOutputTokensReset,
    AnthropicOutputTokensRemaining,
    RateLimitReset,
    XRateLimitReset,
    XAmznErrorType,
    GrpcStatus,
    XEnvoyOverloaded,
}

/// The names of [`Name`]'s headers, lower-case, in its order.
const NAME_TEXT: [&str; 23] = [
    "x-should-retry",
    "retry-after-ms",
    "x-amz-retry-after",
    "retry-after",
    "grpc-retry-pushback-ms",
    "ratelimit",
    "x-ratelimit-reset-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-tokens",
    "x-ratelimit-remaining-tokens",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-output-tokens-reset",
    "anthropic-ratelimit-output-tokens-remaining",
    "ratelimit-reset",
    "x-ratelimit-reset",
    "x-amzn-errortype",
    "grpc-status",
    "x-envoy-overloaded",
];

/// Bit `n` is set if some name in [`NAME_TEXT`] is `n` bytes long (all are
/// under 64): most of a response's headers (`content-type`, `date`) are
/// turned away by their length alone.
const NAME_LENGTHS: u64 = {
    let mut mask = 0u64;
    let mut i = 0;
    while i < NAME_TEXT.len() {
        mask |= 1 << NAME_TEXT[i].len();
        i += 1;
    }
    mask
};

impl Name {
    /// The header's name, lower-case.
    pub fn text(self) -> &'static str {
        NAME_TEXT[self as usize]
    }

    fn of(name: &str) -> Option<usize> {
        if name.len() >= 64 || NAME_LENGTHS & (1 << name.len()) == 0 {
            return None;
        }
        NAME_TEXT.iter().position(|known| is_named(name, known))
    }
}

/// Header lookup by [`Name`], in any case; the first occurrence wins. Built in
/// one pass: a lookup over every header per name made each header of a
/// response cost about 1,900 fuel units, whatever its name.
pub struct Headers<'a> {
    pairs: &'a [Pair<'a>],
    /// For each [`Name`], its first header's place in `pairs` + 1; 0: absent.
    /// Bytes: [`within_limits`] keeps at most [`MAX_HEADERS`] headers, and a
    /// header past the 255th is not indexed.
    first: [u8; NAME_TEXT.len()],
    /// How many headers are ones the policy reads.
    known: u32,
}

impl<'a> Headers<'a> {
    /// `pairs` must be trimmed ([`within_limits`] trims them).
    pub fn new(pairs: &'a [Pair<'a>]) -> Self {
        let mut first = [0u8; NAME_TEXT.len()];
        let mut known = 0;
        for (i, (name, _)) in pairs.iter().take(u8::MAX as usize).enumerate() {
            if let Some(k) = Name::of(name) {
                known += 1;
                if first[k] == 0 {
                    first[k] = (i + 1) as u8; // at most 255: `take` above
                }
            }
        }
        Headers { pairs, first, known }
    }

    /// Whether any header is one the policy reads: most failures carry none.
    pub fn any_known(&self) -> bool {
        self.known > 0
    }

    /// The value of the first header named `name`, if any.
    pub fn get(&self, name: Name) -> Option<&'a str> {
        let at = self.first[name as usize] as usize;
        self.pairs.get(at.checked_sub(1)?).map(|(_, v)| *v)
    }

    /// Every field named `name`, joined with `, ` (a list-valued header).
    pub fn get_list(&self, name: Name) -> Option<String> {
        let from = (self.first[name as usize] as usize).checked_sub(1)?;
        let mut joined = String::new();
        for (_, value) in self.pairs[from..].iter().filter(|(n, _)| is_named(n, name.text())) {
            if !joined.is_empty() {
                joined.push_str(", ");
            }
            joined.push_str(value);
        }
        Some(joined)
    }
}

/// Whether header name `name` is `lower` (lower-case) in any case. A plain
/// loop: it runs for every header whose length is a known name's
/// ([`Headers::new`]), and at the component's size optimisation
/// `eq_ignore_ascii_case` is a call with a call per byte.
fn is_named(name: &str, lower: &str) -> bool {
    let (name, lower) = (name.as_bytes(), lower.as_bytes());
    if name.len() != lower.len() {
        return false;
    }
    let mut i = 0;
    while i < name.len() {
        if name[i].to_ascii_lowercase() != lower[i] {
            return false;
        }
        i += 1;
    }
    true
}

fn is_trimmed(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.first().is_some_and(u8::is_ascii_whitespace) && !bytes.last().is_some_and(u8::is_ascii_whitespace)
}

/// The most headers the policy reads (the rest are named in one problem).
pub const MAX_HEADERS: usize = 64;
/// The longest header value the policy parses, in bytes.
pub const MAX_HEADER_VALUE_BYTES: usize = 1024;

/// The headers the policy reads: the first [`MAX_HEADERS`], without values
/// longer than [`MAX_HEADER_VALUE_BYTES`], names and values trimmed of ASCII
/// whitespace (as [`split_lines`] trims); what was left out is named in the
/// problems. The cost of every later lookup is then bounded, whatever was sent.
pub fn within_limits<'a>(headers: &'a [Pair<'a>]) -> (alloc::borrow::Cow<'a, [Pair<'a>]>, Vec<HeaderProblem>) {
    let first = &headers[..headers.len().min(MAX_HEADERS)];
    let mut problems = Vec::new();
    if headers.len() > MAX_HEADERS {
        let text = cat!("only the first ", MAX_HEADERS, " of ", headers.len(), " headers were read");
        problems.push(HeaderProblem { name: String::from("(headers)"), value: String::new(), problem: text });
    }
    if first.iter().all(|(n, v)| v.len() <= MAX_HEADER_VALUE_BYTES && is_trimmed(n) && is_trimmed(v)) {
        return (alloc::borrow::Cow::Borrowed(first), problems);
    }
    let mut kept = Vec::with_capacity(first.len());
    for (name, value) in first {
        if value.len() > MAX_HEADER_VALUE_BYTES {
            let text = cat!("is ", value.len(), " bytes, longer than the ", MAX_HEADER_VALUE_BYTES, " the policy reads");
            problems.push(problem(&short_name(name), value, &text));
        } else {
            kept.push((name.trim_ascii(), value.trim_ascii()));
        }
    }
    (alloc::borrow::Cow::Owned(kept), problems)
}

/// A header name as a problem names it: lower-cased, at most 60 bytes (and `…`),
/// whatever was sent.
#[inline(never)]
fn short_name(name: &str) -> String {
    let mut name = name.trim_ascii().to_ascii_lowercase();
    if name.len() > 60 {
        let mut end = 60;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
        name.push('…');
    }
    name
}

fn problem(name: &str, value: &str, text: &str) -> HeaderProblem {
    HeaderProblem { name: name.to_string(), value: excerpt(value, 60), problem: text.to_string() }
}

fn until(now_ms: u64, at_ms: u64) -> u64 {
    at_ms.saturating_sub(now_ms)
}

/// A non-negative decimal number of `unit_ms` units, rounded up to whole ms and
/// saturating at `u64::MAX` (a hint that large is escalated, never waited out).
pub fn decimal_ms(text: &str, unit_ms: u64) -> Option<u64> {
    // Bytes, not chars: the digits and the point are ASCII, and this runs on
    // every wait hint.
    let bytes = text.as_bytes();
    let (int_part, frac_part) = match bytes.iter().position(|b| *b == b'.') {
        Some(dot) => (bytes.get(..dot)?, bytes.get(dot + 1..).filter(|f| !f.is_empty())?),
        None => (bytes, &[][..]),
    };
    if int_part.is_empty() || !int_part.iter().all(u8::is_ascii_digit) || !frac_part.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut ms = mul_saturating(decimal_saturating(int_part), unit_ms);
    // The fraction, to 9 digits, times the unit, rounded up, in u64 only:
    // frac × unit / 10^len = frac × q + frac × r / 10^len where unit = q × 10^len + r.
    let frac = frac_part.get(..frac_part.len().min(9)).unwrap_or(&[]);
    if !frac.is_empty() {
        let value = decimal_saturating(frac); // at most 9 digits: exact
        let scale = 10u64.pow(frac.len() as u32);
        let (q, r) = (unit_ms / scale, unit_ms % scale);
        let extra = mul_saturating(value, q).saturating_add((value * r).div_ceil(scale));
        ms = ms.saturating_add(extra);
    }
    Some(ms)
}

/// A Go duration (`1s`, `6m0s`, `12ms`, `1h2m3.5s`), as OpenAI sends, in ms, rounded up.
pub fn go_duration_ms(text: &str) -> Option<u64> {
    if text == "0" {
        return Some(0);
    }
    let mut rest = text;
    let mut total_ns: u64 = 0;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_len = rest.bytes().take_while(|b| b.is_ascii_digit() || *b == b'.').count();
        if number_len == 0 {
            return None;
        }
        let (number, after) = rest.split_at_checked(number_len)?;
        let unit_len = after.bytes().take_while(|b| !b.is_ascii_digit() && *b != b'.').count();
        let (unit, after) = after.split_at_checked(unit_len)?;
        let unit_ns: u64 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        // decimal_ms with a unit in ns gives ns.
        total_ns = total_ns.saturating_add(decimal_ms(number, unit_ns)?);
        rest = after;
    }
    Some(total_ns.div_ceil(1_000_000))
}

/// `RateLimit: "a";r=0;t=30, "b";r=5;t=10` → the longest `t` (s) of the items with
/// no quota left. `Ok(None)`: every item still has quota.
fn ratelimit_t_ms(value: &str) -> Result<Option<u64>, &'static str> {
    let mut longest: Option<u64> = None;
    let mut items = 0;
    for item in value.split(',') {
        let mut params = item.split(';');
        let name = params.next().unwrap_or("").trim_ascii();
        if name.is_empty() {
            return Err("an item has no policy name");
        }
        items += 1;
        let (mut remaining, mut reset) = (None, None);
        for param in params {
            let (key, val) = param.trim_ascii().split_once('=').ok_or("a parameter has no value")?;
            let number = || -> Result<u64, &'static str> {
                let val = val.trim_ascii();
                if val.is_empty() || !val.bytes().all(|b| b.is_ascii_digit()) {
                    return Err("r and t must be whole numbers");
                }
                decimal_ms(val, 1).ok_or("r and t must be whole numbers")
            };
            match key.trim_ascii() {
                "r" => remaining = Some(number()?),
                "t" => reset = Some(number()?),
                _ => {}
            }
        }
        if remaining.unwrap_or(0) == 0
            && let Some(t) = reset
        {
            let ms = mul_saturating(t, 1000);
            longest = Some(longest.map_or(ms, |l| l.max(ms)));
        }
    }
    if items == 0 { Err("no items") } else { Ok(longest) }
}

/// A header read for a wait: `Ok(None)` is a valid header that asks for no wait.
type WaitParser = fn(&str, u64) -> Result<Option<u64>, &'static str>;

/// A vendor reset header read for a wait.
type ResetParser = fn(&str, u64) -> Option<u64>;

/// Reads every hint the headers carry. Waits above `max_plausible_ms` are problems.
pub fn read(headers: &[Pair<'_>], now_ms: u64, max_plausible_ms: u64) -> ServerHints {
    read_indexed(&Headers::new(headers), now_ms, max_plausible_ms)
}

/// [`read`] of headers already indexed.
pub fn read_indexed(headers: &Headers<'_>, now_ms: u64, max_plausible_ms: u64) -> ServerHints {
    let mut hints = ServerHints::default();
    if !headers.any_known() {
        return hints;
    }
    let plausible = |hints: &mut ServerHints, name: &str, value: &str, wait_ms: u64| {
        if wait_ms > max_plausible_ms {
            hints.problems.push(problem(name, value, "is a wait longer than max-plausible-hint-ms"));
            false
        } else {
            true
        }
    };

    if let Some(value) = headers.get(Name::XShouldRetry) {
        match value {
            v if v.eq_ignore_ascii_case("true") => hints.should_retry = Some(true),
            v if v.eq_ignore_ascii_case("false") => hints.should_retry = Some(false),
            v => hints.problems.push(problem(Name::XShouldRetry.text(), v, "must be true or false")),
        }
    }

    static SOURCES: [(Name, WaitParser); 5] = [
        (Name::RetryAfterMs, |v, _| decimal_ms(v, 1).map(Some).ok_or("must be a non-negative number of ms")),
        (Name::XAmzRetryAfter, |v, _| decimal_ms(v, 1).map(Some).ok_or("must be a non-negative number of ms")),
        (Name::RetryAfter, |v, now| {
            decimal_ms(v, 1000).or_else(|| parse_http_date(v).map(|at| until(now, at))).map(Some).ok_or("is neither delay-seconds nor an HTTP-date")
        }),
        (Name::GrpcRetryPushbackMs, |v, _| {
            decimal_ms(v, 1).filter(|_| !v.contains('.')).map(Some).ok_or("is negative or malformed: the server forbids a retry")
        }),
        (Name::RateLimit, |v, _| ratelimit_t_ms(v)),
    ];
    for &(header, parse) in &SOURCES {
        let joined;
        let value = if header == Name::RateLimit {
            joined = headers.get_list(header);
            joined.as_deref()
        } else {
            headers.get(header)
        };
        let Some(value) = value else { continue };
        let name = header.text();
        match parse(value, now_ms) {
            Ok(Some(wait_ms)) if plausible(&mut hints, name, value, wait_ms) => {
                hints.wait = Some(Hint { wait_ms, source: name });
                return hints;
            }
            Ok(_) => {}
            Err(text) => {
                if header == Name::GrpcRetryPushbackMs {
                    hints.should_retry = Some(false);
                }
                hints.problems.push(problem(name, value, text));
            }
        }
    }

    // Vendor resets: each limit resets on its own; wait for the latest exhausted one.
    let mut latest: Option<Hint> = None;
    static VENDOR: [(Name, Name, ResetParser); 6] = [
        (Name::XRateLimitResetRequests, Name::XRateLimitRemainingRequests, |v, _| go_duration_ms(v)),
        (Name::XRateLimitResetTokens, Name::XRateLimitRemainingTokens, |v, _| go_duration_ms(v)),
        (Name::AnthropicRequestsReset, Name::AnthropicRequestsRemaining, |v, now| parse_rfc3339(v).map(|at| until(now, at))),
        (Name::AnthropicTokensReset, Name::AnthropicTokensRemaining, |v, now| parse_rfc3339(v).map(|at| until(now, at))),
        (Name::AnthropicInputTokensReset, Name::AnthropicInputTokensRemaining, |v, now| parse_rfc3339(v).map(|at| until(now, at))),
        (Name::AnthropicOutputTokensReset, Name::AnthropicOutputTokensRemaining, |v, now| parse_rfc3339(v).map(|at| until(now, at))),
    ];
    for &(reset, remaining, parse) in &VENDOR {
        let Some(value) = headers.get(reset) else { continue };
        let reset_name = reset.text();
        let exhausted = headers.get(remaining).is_none_or(|r| r == "0");
        if !exhausted {
            continue;
        }
        match parse(value, now_ms) {
            Some(wait_ms) if !plausible(&mut hints, reset_name, value, wait_ms) => {}
            Some(wait_ms) if latest.as_ref().is_none_or(|l| wait_ms > l.wait_ms) => {
                latest = Some(Hint { wait_ms, source: reset_name });
            }
            Some(_) => {}
            None => {
                let rule = if reset_name.starts_with("anthropic") { "must be an RFC 3339 time" } else { "must be a Go duration such as 6m0s" };
                hints.problems.push(problem(reset_name, value, rule));
            }
        }
    }
    if latest.is_some() {
        hints.wait = latest;
        return hints;
    }

    for header in [Name::RateLimitReset, Name::XRateLimitReset] {
        let Some(value) = headers.get(header) else { continue };
        let name = header.text();
        match decimal_ms(value, 1000) {
            Some(ms) => {
                let seconds = ms / 1000;
                let wait_ms = if seconds >= 1_000_000_000_000 {
                    until(now_ms, seconds) // the number was Unix ms
                } else if seconds >= 1_000_000_000 {
                    until(now_ms, ms) // Unix seconds
                } else {
                    ms
                };
                if plausible(&mut hints, name, value, wait_ms) {
                    hints.wait = Some(Hint { wait_ms, source: name });
                    return hints;
                }
            }
            None => hints.problems.push(problem(name, value, "must be seconds or a Unix time")),
        }
    }
    hints
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_764_460_800_000; // 2025-11-30T00:00:00Z
    const YEAR_MS: u64 = 31_536_000_000;

    fn wait(pairs: &[(&str, &str)]) -> Option<(u64, &'static str)> {
        let headers: Vec<Pair<'_>> = pairs.to_vec();
        read(&headers, NOW, YEAR_MS).wait.map(|h| (h.wait_ms, h.source))
    }

    #[test]
    fn every_format() {
        assert_eq!(wait(&[("Retry-After", "2")]), Some((2000, "retry-after")));
        assert_eq!(wait(&[("retry-after", "1.5")]), Some((1500, "retry-after")));
        assert_eq!(wait(&[("retry-after", "Sun, 30 Nov 2025 00:01:00 GMT")]), Some((60_000, "retry-after")));
        assert_eq!(wait(&[("retry-after", "Sat, 29 Nov 2025 00:01:00 GMT")]), Some((0, "retry-after")));
        assert_eq!(wait(&[("retry-after-ms", "250.2"), ("retry-after", "9")]), Some((251, "retry-after-ms")));
        assert_eq!(wait(&[("RateLimit", "\"default\";r=0;t=30")]), Some((30_000, "ratelimit")));
        assert_eq!(wait(&[("ratelimit", "\"a\";r=5;t=30")]), None);
        assert_eq!(wait(&[("ratelimit", "\"a\";r=0;t=3, \"b\";t=7")]), Some((7000, "ratelimit")));
        assert_eq!(wait(&[("ratelimit", "\"a\";r=0;t=30"), ("retry-after", "4")]), Some((4000, "retry-after")));
        assert_eq!(wait(&[("x-ratelimit-reset-requests", "6m0s"), ("x-ratelimit-reset-tokens", "12ms")]), Some((360_000, "x-ratelimit-reset-requests")));
        assert_eq!(
            wait(&[("x-ratelimit-reset-requests", "1s"), ("x-ratelimit-remaining-requests", "3"), ("x-ratelimit-reset-tokens", "1h2m3.5s")]),
            Some((3_723_500, "x-ratelimit-reset-tokens"))
        );
        assert_eq!(wait(&[("anthropic-ratelimit-tokens-reset", "2025-11-30T00:00:05Z")]), Some((5000, "anthropic-ratelimit-tokens-reset")));
        assert_eq!(wait(&[("x-ratelimit-reset", "20")]), Some((20_000, "x-ratelimit-reset")));
        assert_eq!(wait(&[("x-ratelimit-reset", "1764460860")]), Some((60_000, "x-ratelimit-reset")));
        assert_eq!(wait(&[("ratelimit-reset", "1764460860000")]), Some((60_000, "ratelimit-reset")));
    }

    #[test]
    fn garbage_is_a_problem_not_a_hint() {
        let headers = [("retry-after", "soon\n"), ("x-should-retry", "maybe")];
        let hints = read(&headers, NOW, YEAR_MS);
        assert_eq!(hints.wait, None);
        assert_eq!(hints.should_retry, None);
        assert_eq!(hints.problems.len(), 2);
        assert!(hints.problems.iter().any(|p| p.name == "retry-after" && p.value == "soon"), "{:?}", hints.problems);
        for value in ["-1", "", ".", "1.", "1e3", "NaN", "0x10", "١٢"] {
            assert_eq!(wait(&[("retry-after", value)]), None, "{value}");
        }
        for value in ["", "s", "5", "1x", "..s", "1.2.3s"] {
            assert_eq!(go_duration_ms(value), None, "{value}");
        }
    }

    #[test]
    fn implausible_waits_are_problems_and_the_next_source_is_read() {
        assert_eq!(wait(&[("retry-after", "99999999999999999999999999999999999")]), None);
        assert_eq!(wait(&[("retry-after", "99999999999999999999999"), ("ratelimit", "\"a\";r=0;t=5")]), Some((5000, "ratelimit")));
        assert!(go_duration_ms("99999999999999999999h").unwrap() > 1_000_000_000_000);
    }

    #[test]
    fn flat_header_lines_split_at_the_first_colon() {
        let lines = "Retry-After: 2\r\nx-trace: a:b\n\nbare";
        assert_eq!(split_lines(lines), [("Retry-After", "2"), ("x-trace", "a:b"), ("bare", "")]);
        assert_eq!(wait(&split_lines(lines)), Some((2000, "retry-after")));
        assert!(split_lines("").is_empty());
    }

    /// The split before `find_ascii`: `split` and `split_once` on chars.
    fn split_lines_by_chars(text: &str) -> Vec<Pair<'_>> {
        let lines = text.split('\n').map(str::trim_ascii).filter(|l| !l.is_empty());
        lines.map(|l| l.split_once(':').map_or((l, ""), |(n, v)| (n.trim_ascii(), v.trim_ascii()))).collect()
    }

    #[test]
    fn the_split_is_the_char_splits_on_short_long_and_multibyte_lines() {
        let long = "v".repeat(100);
        let straddle = format!("{}é:{}", "n".repeat(63), "ü".repeat(40)); // 'é' spans bytes 63 and 64
        let texts = [
            String::from("a: 1\nb: 2"),
            format!("x-long: {long}\nnext: 1"),
            format!("{long}:{long}\n{long}"),
            format!("{straddle}\n{straddle}:x\n"),
            format!("{}\n: only a value\nname only\n\n\r\n  \t", "é".repeat(70)),
            format!("{}:{}", "ü".repeat(33), long),
            String::from("\n\n:\n::\n"),
        ];
        for text in &texts {
            assert_eq!(split_lines(text), split_lines_by_chars(text), "{text:?}");
        }
    }

    #[test]
    fn find_ascii_looks_past_the_plain_loop_and_never_into_a_character() {
        let text = format!("{}é:", "a".repeat(63));
        assert_eq!(find_ascii(&text, b':'), Some(65));
        assert_eq!(find_ascii(&"a".repeat(200), b':'), None);
        assert_eq!(find_ascii(&format!("{}:", "b".repeat(500)), b':'), Some(500));
        assert_eq!(find_ascii("ab:c", b':'), Some(2));
        assert_eq!(find_ascii("", b':'), None);
    }

    #[test]
    fn the_index_finds_the_first_of_each_name_in_any_case() {
        let pairs = [("Content-Type", "text/plain"), ("RETRY-AFTER", "7"), ("retry-after", "9"), ("RateLimit", "a"), ("x", "y"), ("ratelimit", "b")];
        let headers = Headers::new(&pairs);
        assert!(headers.any_known());
        assert_eq!(headers.get(Name::RetryAfter), Some("7"));
        assert_eq!(headers.get(Name::RetryAfterMs), None);
        assert_eq!(headers.get_list(Name::RateLimit).as_deref(), Some("a, b"));
        assert_eq!(headers.get_list(Name::XShouldRetry), None);
        assert!(!Headers::new(&[("content-type", "x"), ("date", "y")]).any_known());
        // Each variant names its own header (the enum and the texts are kept in step by position).
        let names = [
            (Name::XShouldRetry, "x-should-retry"),
            (Name::RetryAfterMs, "retry-after-ms"),
            (Name::XAmzRetryAfter, "x-amz-retry-after"),
            (Name::RetryAfter, "retry-after"),
            (Name::GrpcRetryPushbackMs, "grpc-retry-pushback-ms"),
            (Name::RateLimit, "ratelimit"),
            (Name::XRateLimitResetRequests, "x-ratelimit-reset-requests"),
            (Name::XRateLimitRemainingRequests, "x-ratelimit-remaining-requests"),
            (Name::XRateLimitResetTokens, "x-ratelimit-reset-tokens"),
            (Name::XRateLimitRemainingTokens, "x-ratelimit-remaining-tokens"),
            (Name::AnthropicRequestsReset, "anthropic-ratelimit-requests-reset"),
            (Name::AnthropicRequestsRemaining, "anthropic-ratelimit-requests-remaining"),
            (Name::AnthropicTokensReset, "anthropic-ratelimit-tokens-reset"),
            (Name::AnthropicTokensRemaining, "anthropic-ratelimit-tokens-remaining"),
            (Name::AnthropicInputTokensReset, "anthropic-ratelimit-input-tokens-reset"),
            (Name::AnthropicInputTokensRemaining, "anthropic-ratelimit-input-tokens-remaining"),
            (Name::AnthropicOutputTokensReset, "anthropic-ratelimit-output-tokens-reset"),
            (Name::AnthropicOutputTokensRemaining, "anthropic-ratelimit-output-tokens-remaining"),
            (Name::RateLimitReset, "ratelimit-reset"),
            (Name::XRateLimitReset, "x-ratelimit-reset"),
            (Name::XAmznErrorType, "x-amzn-errortype"),
            (Name::GrpcStatus, "grpc-status"),
            (Name::XEnvoyOverloaded, "x-envoy-overloaded"),
        ];
        assert_eq!(names.len(), NAME_TEXT.len());
        for (name, text) in names {
            assert_eq!(name.text(), text);
        }
        // Every name is indexed under itself, and a name of another length is not looked at.
        for (i, text) in NAME_TEXT.iter().enumerate() {
            assert_eq!(Name::of(text), Some(i));
            assert_eq!(Name::of(&text.to_ascii_uppercase()), Some(i));
        }
        assert_eq!(Name::of(&"x".repeat(64)), None);
        assert_eq!(Name::of("retry-afte"), None);
        // Past the 255th header, nothing is indexed (the policy reads at most 64).
        let many: Vec<Pair<'_>> = (0..300).map(|i| if i == 280 { ("retry-after", "1") } else { ("x-pad", "") }).collect();
        assert_eq!(Headers::new(&many).get(Name::RetryAfter), None);
    }

    #[test]
    fn list_headers_span_fields() {
        let split = [("RateLimit", "\"a\";r=5;t=1"), ("RateLimit", "\"b\";r=0;t=20")];
        assert_eq!(wait(&split), Some((20_000, "ratelimit")));
        assert_eq!(wait(&[("RateLimit", "\"a\";r=5;t=1, \"b\";r=0;t=20")]), Some((20_000, "ratelimit")));
    }

    #[test]
    fn aws_and_grpc_hints() {
        assert_eq!(wait(&[("x-amz-retry-after", "1500")]), Some((1500, "x-amz-retry-after")));
        assert_eq!(wait(&[("grpc-retry-pushback-ms", "250")]), Some((250, "grpc-retry-pushback-ms")));
        let headers = [("grpc-retry-pushback-ms", "-1")];
        assert_eq!(read(&headers, NOW, YEAR_MS).should_retry, Some(false));
    }
}
