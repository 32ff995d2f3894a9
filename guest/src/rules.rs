//! The names of the rules a decision can name (`decision.rule`), in the fixed
//! order of the contract's `rule-names()`: the flat path (`verdict.rule-index`)
//! answers with an index into this list instead of a string.

/// Every rule, in contract order. Add new rules at the end: an index, once
/// published, keeps its meaning within a contract version.
pub const RULE_NAMES: &[&str] = &[
    "success",
    "empty-result",
    "status-check",
    "http-status",
    "config:status-overrides",
    "aws-error-code",
    "grpc-status",
    "x-envoy-overloaded",
    "413-retry-after",
    "transport",
    "json-rpc-code",
    "x-should-retry",
    "config:tool-error-rules",
    "tool-error:vocabulary",
    "tool-error:provider-code",
    "tool-error:status",
    "tool-error:host-status",
    "tool-error:scan-limit",
    "tool-error",
];

/// The index of `rule` in [`RULE_NAMES`]. Every rule the policy names is listed
/// (a test checks the ones the vectors reach, and `index_of_every_rule` the
/// literals); an unlisted one would answer `u16::MAX`.
pub fn rule_index(rule: &str) -> u16 {
    RULE_NAMES.iter().position(|name| *name == rule).map_or(u16::MAX, |i| i as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rule literal in the policy's sources is in the table.
    #[test]
    fn index_of_every_rule() {
        let sources = [include_str!("classify.rs"), include_str!("relayed.rs"), include_str!("run.rs")];
        let mut found = 0;
        for source in sources {
            for name in source.split('"').skip(1).step_by(2) {
                let looks_like_rule = name.starts_with("tool-error")
                    || name.starts_with("config:")
                    || [
                        "http-status",
                        "aws-error-code",
                        "grpc-status",
                        "x-envoy-overloaded",
                        "413-retry-after",
                        "transport",
                        "json-rpc-code",
                        "x-should-retry",
                    ]
                    .contains(&name);
                if looks_like_rule && !name.contains(' ') && name != "tool-error-rules" {
                    assert_ne!(rule_index(name), u16::MAX, "rule {name} is not in RULE_NAMES");
                    found += 1;
                }
            }
        }
        assert!(found >= 15, "{found}");
        for (i, name) in RULE_NAMES.iter().enumerate() {
            assert_eq!(rule_index(name), i as u16);
        }
    }
}
