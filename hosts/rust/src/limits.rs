//! What a host passes to the policy, bounded before it crosses the boundary:
//! lowering a value into the guest costs its size in memory and copying, so a
//! 40 MB tool error or 5,800 headers must be cut here, not in the guest
//! (contract 0.3.0 and later; the Python and Node hosts apply the same limits).

use std::borrow::Cow;

use crate::component::types::{Action, Decision, Escalation, Observation};

/// The most bytes of an observation's body (or tool-error text, or an empty result's detail) passed.
pub const MAX_BODY_BYTES: usize = 65_536;
/// The most bytes of structured content passed; longer is dropped (cut JSON is not JSON).
pub const MAX_STRUCTURED_BYTES: usize = 65_536;
/// The most header lines passed (the policy reads 64 and names the rest).
pub const MAX_HEADERS: usize = 128;
/// The most bytes of one header name or value passed (the policy parses values up to 1,024).
pub const MAX_HEADER_VALUE_BYTES: usize = 4_096;
/// The longest run id, action id, tool name or idempotency key.
pub const MAX_ID_BYTES: usize = 256;
/// The longest server a call may name (a URL or a command line; the policy's breakers keep at most 256 bytes of it).
pub const MAX_SERVER_BYTES: usize = 4_096;
/// The longest configuration text.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;
/// The longest snapshot of an escalated run passed to `resume-run`, or lifted from `run.snapshot` (2 MiB).
pub const MAX_SNAPSHOT_BYTES: usize = 2 << 20;
/// The most bytes of a call's arguments kept in a snapshot, or of a `done` answer's result (1 MiB).
pub const MAX_ARGUMENTS_BYTES: usize = 1 << 20;
/// The most bytes of a text lifted from the policy (a reason, a message, a note) the host logs or returns; longer is cut.
pub const MAX_LIFTED_TEXT_BYTES: usize = 65_536;

/// `text` cut to at most `max` bytes, at a character boundary.
pub fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A text lifted from the policy (a reason, a message, a note, a last
/// error), cut to [`MAX_LIFTED_TEXT_BYTES`] at a character boundary with
/// ` … [cut: N bytes]` (N the bytes removed): a hostile policy's 20 MB
/// reason must not become a 20 MB log line.
pub fn cut_lifted_text(text: String) -> String {
    if text.len() <= MAX_LIFTED_TEXT_BYTES {
        return text;
    }
    let kept = cut(&text, MAX_LIFTED_TEXT_BYTES);
    format!("{kept} … [cut: {} bytes]", text.len() - kept.len())
}

/// An escalation with its texts cut ([`cut_lifted_text`]).
pub fn bounded_escalation(mut escalation: Escalation) -> Escalation {
    escalation.note = cut_lifted_text(escalation.note);
    escalation.last_error = escalation.last_error.map(cut_lifted_text);
    escalation
}

/// A decision with its texts cut ([`cut_lifted_text`]).
pub fn bounded_decision(mut decision: Decision) -> Decision {
    decision.reason = cut_lifted_text(decision.reason);
    decision.action = match decision.action {
        Action::Replan(message) => Action::Replan(cut_lifted_text(message)),
        Action::Succeed(note) => Action::Succeed(note.map(cut_lifted_text)),
        Action::Escalate(escalation) => Action::Escalate(bounded_escalation(escalation)),
        other => other,
    };
    decision
}

/// Whether every header line is within the limits: at most [`MAX_HEADERS`]
/// lines, each name and value at most [`MAX_HEADER_VALUE_BYTES`].
fn headers_within(lines: &str) -> bool {
    lines.is_empty()
        || (lines.split('\n').count() <= MAX_HEADERS
            && lines.split('\n').all(|line| match line.split_once(':') {
                Some((name, value)) => name.len() <= MAX_HEADER_VALUE_BYTES && value.trim().len() <= MAX_HEADER_VALUE_BYTES,
                None => line.len() <= MAX_HEADER_VALUE_BYTES,
            }))
}

/// Header lines cut to the limits: the first [`MAX_HEADERS`] lines, each
/// name and value cut to [`MAX_HEADER_VALUE_BYTES`].
fn bounded_header_lines(lines: &str) -> String {
    let mut out = String::new();
    for (i, line) in lines.split('\n').take(MAX_HEADERS).enumerate() {
        if i > 0 {
            out.push('\n');
        }
        match line.split_once(':') {
            Some((name, value)) => {
                out.push_str(cut(name, MAX_HEADER_VALUE_BYTES));
                out.push_str(": ");
                out.push_str(cut(value.trim(), MAX_HEADER_VALUE_BYTES));
            }
            None => out.push_str(cut(line, MAX_HEADER_VALUE_BYTES)),
        }
    }
    out
}

/// The observation as the host passes it: borrowed when it is within every limit.
pub fn bounded_observation(observation: &Observation) -> Cow<'_, Observation> {
    let within = observation.body.len() <= MAX_BODY_BYTES
        && observation.structured_content.as_ref().is_none_or(|s| s.len() <= MAX_STRUCTURED_BYTES)
        && headers_within(&observation.headers);
    if within {
        return Cow::Borrowed(observation);
    }
    Cow::Owned(Observation {
        kind: observation.kind,
        headers: if headers_within(&observation.headers) { observation.headers.clone() } else { bounded_header_lines(&observation.headers) },
        body: cut(&observation.body, MAX_BODY_BYTES).to_string(),
        structured_content: observation.structured_content.clone().filter(|s| s.len() <= MAX_STRUCTURED_BYTES),
        session_id_sent: observation.session_id_sent,
        delivery: observation.delivery,
    })
}

/// `Err((input, size))` if `value` is longer than `max` bytes.
pub fn check(input: &'static str, value: &str, max: usize) -> Result<(), (&'static str, usize, usize)> {
    if value.len() > max { Err((input, value.len(), max)) } else { Ok(()) }
}

/// Headers as an observation carries them: `name: value` lines
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
    use crate::component::types::{Delivery, FailureKind};

    fn observation(headers: String, body: String, structured_content: Option<String>) -> Observation {
        Observation { kind: FailureKind::ToolError(None), headers, body, structured_content, session_id_sent: true, delivery: Delivery::AnswerStarted }
    }

    #[test]
    fn a_huge_observation_is_cut_before_it_crosses_and_a_small_one_is_not_copied() {
        let small = observation("a: b".into(), "x".into(), None);
        assert!(matches!(bounded_observation(&small), Cow::Borrowed(_)));
        let pairs: Vec<(String, String)> = (0..5_800).map(|i| (format!("h{i}"), "v".repeat(70_000))).collect();
        let huge = observation(header_lines(&pairs), "é".repeat(20_000_000), Some("{}".repeat(40_000)));
        let cut = bounded_observation(&huge);
        let lines: Vec<&str> = cut.headers.split('\n').collect();
        assert_eq!(lines.len(), MAX_HEADERS);
        assert!(lines.iter().all(|l| l.split_once(": ").is_some_and(|(_, v)| v.len() == MAX_HEADER_VALUE_BYTES)));
        assert_eq!(cut.body.len(), MAX_BODY_BYTES, "cut at a character boundary: é is 2 bytes");
        assert_eq!(cut.structured_content, None, "cut JSON is not JSON: dropped");
        assert!(cut.session_id_sent && cut.delivery == Delivery::AnswerStarted, "the facts that are not text pass unchanged");
    }

    #[test]
    fn a_lifted_text_is_cut_at_a_character_boundary_and_says_how_much() {
        assert_eq!(cut_lifted_text("short".into()), "short");
        let exact = "a".repeat(MAX_LIFTED_TEXT_BYTES);
        assert_eq!(cut_lifted_text(exact.clone()), exact);
        let huge = format!("a{}", "é".repeat(10_000_000));
        let cut = cut_lifted_text(huge.clone());
        let (kept, suffix) = cut.split_once(" … [cut: ").unwrap();
        assert_eq!(kept.len(), MAX_LIFTED_TEXT_BYTES - 1, "é is 2 bytes: one byte short of the limit");
        assert_eq!(suffix, format!("{} bytes]", huge.len() - kept.len()));
    }

    #[test]
    fn header_lines_keep_one_header_a_line() {
        let pairs = vec![("Retry-After".to_string(), "1".to_string()), ("x-evil".to_string(), "a\r\nretry-after: 0".to_string())];
        assert_eq!(header_lines(&pairs), "Retry-After: 1\nx-evil: a  retry-after: 0");
    }
}
