//! The rules a decision can name (`decision.rule`), in the fixed order of the
//! contract's `rule-names()`: the flat path (`verdict.rule-index`) answers with
//! an index into that list instead of a string, and the core carries a
//! [`Rule`], so that naming one costs nothing until a host asks for words.

/// Every rule, in contract order. Add new rules at the end (here and in
/// [`RULE_NAMES`]): an index, once published, keeps its meaning within a
/// contract version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Rule {
    Success,
    EmptyResult,
    StatusCheck,
    HttpStatus,
    ConfigStatusOverrides,
    AwsErrorCode,
    GrpcStatus,
    EnvoyOverloaded,
    PayloadTooLargeRetryAfter,
    Transport,
    JsonRpcCode,
    ShouldRetry,
    ConfigToolErrorRules,
    ToolErrorVocabulary,
    ToolErrorProviderCode,
    ToolErrorStatus,
    ToolErrorHostStatus,
    ToolErrorScanLimit,
    ToolError,
    LostSession,
    VersionMismatch,
    TaskStatus,
    InputRequired,
    ToolErrorExpiredHandle,
    CircuitOpen,
    /// A person's answer to an escalation (`resume-run`).
    Resumed,
}

/// The rules' names, indexed by [`Rule::index`].
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
    "lost-session",
    "version-mismatch",
    "task-status",
    "input-required",
    "tool-error:expired-handle",
    "circuit-open",
    "resumed",
];

impl Rule {
    /// The rule's place in `rule-names()`.
    pub fn index(self) -> u16 {
        self as u16
    }

    /// The rule's name, as `decision.rule` says it.
    pub fn name(self) -> &'static str {
        RULE_NAMES.get(usize::from(self.index())).copied().unwrap_or("?")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each rule has its own name, in contract order (the last one listed
    /// checks that no name is missing at the end).
    #[test]
    fn every_rule_is_named() {
        let last = Rule::Resumed;
        assert_eq!(usize::from(last.index()) + 1, RULE_NAMES.len());
        assert_eq!(Rule::Success.name(), "success");
        assert_eq!(Rule::HttpStatus.name(), "http-status");
        assert_eq!(Rule::PayloadTooLargeRetryAfter.name(), "413-retry-after");
        assert_eq!(Rule::ConfigToolErrorRules.name(), "config:tool-error-rules");
        assert_eq!(Rule::ToolError.name(), "tool-error");
        assert_eq!(Rule::ToolErrorExpiredHandle.name(), "tool-error:expired-handle");
        assert_eq!(Rule::CircuitOpen.name(), "circuit-open");
        assert_eq!(last.name(), "resumed");
        assert_eq!(Rule::InputRequired.name(), "input-required");
        assert_eq!(Rule::VersionMismatch.name(), "version-mismatch");
        let mut names = RULE_NAMES.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), RULE_NAMES.len(), "a name is listed twice");
    }
}
