//! Independent re-statements of what the policy promises, written from the
//! README and module docs rather than from the core's code, to check it against.

use agent_retry_policy::types::{Classification, OutcomeClass};

/// Full-jitter backoff as `backoff.rs`'s doc states it, in u128:
/// `floor(entropy × (min(cap, base × 2^(retry-1)) + 1) / 2^64)`, the hint a floor.
pub fn delay_ms(base: u64, cap: u64, retry: u32, hint_ms: Option<u64>, entropy: u64) -> u64 {
    let doublings = retry.max(1) - 1;
    let uncapped: u128 = if doublings >= 64 { u128::MAX } else { u128::from(base) << doublings };
    let ceiling = uncapped.min(u128::from(cap));
    let jitter = (u128::from(entropy) * (ceiling + 1)) >> 64;
    (jitter as u64).max(hint_ms.unwrap_or(0))
}

/// The most a retry's jittered part may be: `min(cap, base × 2^(retry-1))`.
pub fn ceiling_ms(base: u64, cap: u64, retry: u32) -> u64 {
    let doublings = retry.max(1) - 1;
    let uncapped: u128 = if doublings >= 64 { u128::MAX } else { u128::from(base) << doublings };
    uncapped.min(u128::from(cap)) as u64
}

/// Every rule name a classification may give (classify.rs, relayed.rs).
pub const RULES: &[&str] = &[
    "config:status-overrides",
    "http-status",
    "lost-session",
    "version-mismatch",
    "aws-error-code",
    "grpc-status",
    "x-envoy-overloaded",
    "413-retry-after",
    "transport",
    "json-rpc-code",
    "tool-error:host-status",
    "x-should-retry",
    "config:tool-error-rules",
    "tool-error:vocabulary",
    "tool-error:provider-code",
    "tool-error:status",
    "tool-error",
    "tool-error:scan-limit",
    "tool-error:expired-handle",
    "input-required",
];

/// Every header a wait hint may come from, and `text` for a wait written in a tool error.
pub const HINT_SOURCES: &[&str] = &[
    "retry-after-ms",
    "x-amz-retry-after",
    "retry-after",
    "grpc-retry-pushback-ms",
    "ratelimit",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-reset",
    "ratelimit-reset",
    "x-ratelimit-reset",
    "text",
];

/// The longest a classification's reason may be, in bytes: the failure's label,
/// class, rule, a short piece of evidence (an identifier, a phrase, a configured
/// rule of at most 256 bytes) and the server's verdict. Nothing in it may grow
/// with the size of a header or a body.
pub const MAX_CLASSIFICATION_REASON_BYTES: usize = 1024;

/// What a classification's header problems add to a decision's reason
/// (`; ignored <name> (<problem>)` each).
pub fn problems_bytes(c: &Classification) -> usize {
    c.header_problems.iter().map(|p| p.name.len() + p.problem.len() + 16).sum()
}

/// A header problem's value is an excerpt of at most 60 characters (and `…`).
pub const MAX_PROBLEM_VALUE_CHARS: usize = 61;

/// What every classification must satisfy, whatever the input.
pub fn check_classification(c: &Classification, max_plausible_hint_ms: u64, headers: usize, context: &str) {
    crate::invariant!(!matches!(c.class, OutcomeClass::Success | OutcomeClass::Semantic), "a failure classified as {:?} ({context})", c.class);
    crate::invariant!(RULES.contains(&c.rule.as_str()), "classification names no known rule: {:?} ({context})", c.rule);
    crate::invariant!(c.hint_ms.is_some() == c.hint_source.is_some(), "hint {:?} without source {:?} or the reverse ({context})", c.hint_ms, c.hint_source);
    if let Some(source) = &c.hint_source {
        crate::invariant!(HINT_SOURCES.contains(&source.as_str()), "unknown hint source {source:?} ({context})");
    }
    if let Some(hint) = c.hint_ms {
        crate::invariant!(hint <= max_plausible_hint_ms, "hint {hint} ms above max-plausible-hint-ms {max_plausible_hint_ms} ({context})");
    }
    crate::known_bug!(
        "F3",
        c.reason.len() <= MAX_CLASSIFICATION_REASON_BYTES,
        "classification reason of {} bytes (limit {MAX_CLASSIFICATION_REASON_BYTES}) ({context}): {}…",
        c.reason.len(),
        c.reason.chars().take(200).collect::<String>()
    );
    crate::invariant!(c.header_problems.len() <= headers + 16, "{} header problems for {headers} headers ({context})", c.header_problems.len());
    for p in &c.header_problems {
        crate::invariant!(p.value.chars().count() <= MAX_PROBLEM_VALUE_CHARS, "header problem value of {} chars ({context})", p.value.chars().count());
        crate::invariant!(!p.value.contains(['\n', '\r']), "header problem value spans lines: {:?} ({context})", p.value);
        crate::invariant!(p.problem.len() <= 200, "header problem text too long: {p:?} ({context})");
        crate::known_bug!(
            "F4",
            p.name.len() <= 64,
            "header problem name of {} bytes: {:?}… ({context})",
            p.name.len(),
            p.name.chars().take(80).collect::<String>()
        );
    }
}
