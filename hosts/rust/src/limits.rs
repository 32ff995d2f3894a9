//! What a host passes to the policy, bounded before it crosses the boundary:
//! lowering a value into the guest costs its size in memory and copying, so a
//! 40 MB tool error or 5,800 headers must be cut here, not in the guest
//! (contract 0.3.0 and later; the Python and Node hosts apply the same limits).

use std::borrow::Cow;

use crate::component::types::{Failure, Outcome};

/// The most bytes of a failure's body (or tool-error text) passed.
pub const MAX_BODY_BYTES: usize = 65_536;
/// The most bytes of structured content passed; longer is dropped (cut JSON is not JSON).
pub const MAX_STRUCTURED_BYTES: usize = 65_536;
/// The most headers passed (the policy reads 64 and names the rest).
pub const MAX_HEADERS: usize = 128;
/// The most bytes of one header name or value passed (the policy parses values up to 1,024).
pub const MAX_HEADER_VALUE_BYTES: usize = 4_096;
/// The longest run id, action id, tool name or idempotency key.
pub const MAX_ID_BYTES: usize = 256;
/// The longest configuration text.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

/// `text` cut to at most `max` bytes, at a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The failure as the host passes it: borrowed when it is within every limit.
pub fn bounded_failure(failure: &Failure) -> Cow<'_, Failure> {
    let within = failure.body.len() <= MAX_BODY_BYTES
        && failure.structured_content.as_ref().is_none_or(|s| s.len() <= MAX_STRUCTURED_BYTES)
        && failure.headers.len() <= MAX_HEADERS
        && failure.headers.iter().all(|(n, v)| n.len() <= MAX_HEADER_VALUE_BYTES && v.len() <= MAX_HEADER_VALUE_BYTES);
    if within {
        return Cow::Borrowed(failure);
    }
    Cow::Owned(Failure {
        kind: failure.kind,
        headers: failure
            .headers
            .iter()
            .take(MAX_HEADERS)
            .map(|(n, v)| (cut(n, MAX_HEADER_VALUE_BYTES).to_string(), cut(v, MAX_HEADER_VALUE_BYTES).to_string()))
            .collect(),
        body: cut(&failure.body, MAX_BODY_BYTES).to_string(),
        structured_content: failure.structured_content.clone().filter(|s| s.len() <= MAX_STRUCTURED_BYTES),
    })
}

/// The outcome as the host passes it.
pub fn bounded_outcome(outcome: &Outcome) -> Cow<'_, Outcome> {
    match outcome {
        Outcome::Failure(failure) => match bounded_failure(failure) {
            Cow::Borrowed(_) => Cow::Borrowed(outcome),
            Cow::Owned(failure) => Cow::Owned(Outcome::Failure(failure)),
        },
        Outcome::EmptyResult(detail) if detail.len() > MAX_BODY_BYTES => Cow::Owned(Outcome::EmptyResult(cut(detail, MAX_BODY_BYTES).to_string())),
        _ => Cow::Borrowed(outcome),
    }
}

/// `Err((input, size))` if `value` is longer than `max` bytes.
pub fn check(input: &'static str, value: &str, max: usize) -> Result<(), (&'static str, usize, usize)> {
    if value.len() > max { Err((input, value.len(), max)) } else { Ok(()) }
}

/// A failure's headers as `record-failure` takes them: `name: value` lines
/// joined with `\n`. A line break inside a name or value (which HTTP forbids,
/// RFC 9110 §5.5) becomes a space, so that it cannot start another header.
pub fn header_lines(headers: &[(String, String)]) -> String {
    let mut lines = String::with_capacity(headers.iter().map(|(n, v)| n.len() + v.len() + 3).sum());
    for (i, (name, value)) in headers.iter().enumerate() {
        if i > 0 {
            lines.push('\n');
        }
        push_one_line(&mut lines, name);
        lines.push_str(": ");
        push_one_line(&mut lines, value);
    }
    lines
}

fn push_one_line(out: &mut String, text: &str) {
    if text.contains(['\r', '\n']) {
        out.extend(text.chars().map(|c| if c == '\r' || c == '\n' { ' ' } else { c }));
    } else {
        out.push_str(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::component::types::FailureKind;

    #[test]
    fn a_huge_failure_is_cut_before_it_crosses_and_a_small_one_is_not_copied() {
        let small = Failure { kind: FailureKind::HttpStatus(503), headers: vec![("a".into(), "b".into())], body: "x".into(), structured_content: None };
        assert!(matches!(bounded_failure(&small), Cow::Borrowed(_)));
        let huge = Failure {
            kind: FailureKind::ToolError(None),
            headers: (0..5_800).map(|i| (format!("h{i}"), "v".repeat(70_000))).collect(),
            body: "é".repeat(20_000_000),
            structured_content: Some("{}".repeat(40_000)),
        };
        let cut = bounded_failure(&huge);
        assert_eq!(cut.headers.len(), MAX_HEADERS);
        assert!(cut.headers.iter().all(|(_, v)| v.len() == MAX_HEADER_VALUE_BYTES));
        assert_eq!(cut.body.len(), MAX_BODY_BYTES, "cut at a character boundary: é is 2 bytes");
        assert_eq!(cut.structured_content, None, "cut JSON is not JSON: dropped");
    }
}
