//! The fault script: which calls fail, and how. A JSON array of rules; the first
//! rule that matches a call decides its fault.
//!
//! ```json
//! [{"tool": "issue_refund", "when": {"order_id": "ORD-3"}, "call": 1,
//!   "fault": {"kind": "timeout-after-apply", "delay-ms": 500}}]
//! ```
//! - `tool`: the tool's name, or `"*"`.
//! - `when`: arguments the call must carry (a subset match); default: any.
//! - `call`: which matching call (1 = the first) fails; or
//! - `first`: the first N matching calls fail; with neither, every one.
//!
//! A rule may name a method instead of a tool (`server/discover`, `tools/list`,
//! `tasks/get`...): it counts that method's requests (see
//! [`FaultScript::next_for_method`] and [`FaultScript::next_for_task_request`]).
//! `{"tool": "tasks/get", "call": 2, "fault": {"kind": "drop"}}` cuts the
//! connection of the second poll of any task.

use serde::Deserialize;
use serde_json::Value;

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Fault {
    /// An HTTP error answered before the call runs (streamable HTTP only; over
    /// stdio it becomes a tool error reporting the status).
    Http {
        status: u16,
        #[serde(default)]
        headers: Vec<(String, String)>,
        #[serde(default)]
        body: String,
    },
    /// A JSON-RPC error object, with `data` if given (servers relay an
    /// upstream's error there).
    #[serde(rename = "json-rpc-error")]
    JsonRpcError {
        code: i32,
        message: String,
        #[serde(default)]
        data: Option<serde_json::Value>,
    },
    /// A result with `isError: true`; `status` is the upstream status the result reports.
    ToolError {
        #[serde(default)]
        status: Option<u16>,
        message: String,
    },
    /// A result with `isError: true` relaying an upstream failure the way most
    /// MCP servers do: only as text (and, if given, structured content), with no
    /// status or headers the client could read.
    ToolText {
        text: String,
        #[serde(default)]
        structured: Option<Value>,
    },
    /// A successful result with nothing in it.
    Empty,
    /// The connection is dropped before the call runs.
    Drop,
    /// The call runs (the write is applied), then the answer is held back this
    /// long: a client with a shorter timeout sees a timeout on an applied write.
    #[serde(rename_all = "kebab-case")]
    TimeoutAfterApply { delay_ms: u64 },
}

impl Fault {
    pub fn name(&self) -> String {
        match self {
            Fault::Http { status, .. } => format!("http-{status}"),
            Fault::JsonRpcError { code, .. } => format!("json-rpc-{code}"),
            Fault::ToolError { .. } => "tool-error".into(),
            Fault::ToolText { .. } => "tool-text".into(),
            Fault::Empty => "empty".into(),
            Fault::Drop => "drop".into(),
            Fault::TimeoutAfterApply { .. } => "timeout-after-apply".into(),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRule {
    pub tool: String,
    #[serde(default)]
    pub when: serde_json::Map<String, Value>,
    #[serde(default)]
    pub call: Option<u32>,
    #[serde(default)]
    pub first: Option<u32>,
    pub fault: Fault,
    /// Matching calls seen so far.
    #[serde(skip)]
    pub seen: u32,
}

#[derive(Clone, Debug, Default)]
pub struct FaultScript {
    pub rules: Vec<FaultRule>,
}

impl FaultScript {
    pub fn from_json(text: &str) -> Result<Self, String> {
        let rules: Vec<FaultRule> = serde_json::from_str(text).map_err(|e| format!("fault script: {e}"))?;
        Ok(FaultScript { rules })
    }

    pub fn new(rules: Vec<FaultRule>) -> Self {
        FaultScript { rules }
    }

    /// The fault for this call, if any. Every matching rule counts the call.
    pub fn next(&mut self, tool: &str, arguments: &serde_json::Map<String, Value>) -> Option<Fault> {
        let mut chosen = None;
        for rule in &mut self.rules {
            let tool_matches = rule.tool == "*" || rule.tool == tool;
            let args_match = rule.when.iter().all(|(k, v)| arguments.get(k) == Some(v));
            if !(tool_matches && args_match) {
                continue;
            }
            rule.seen += 1;
            let due = rule.call.is_none_or(|n| n == rule.seen) && rule.first.is_none_or(|n| rule.seen <= n);
            if chosen.is_none() && due {
                chosen = Some(rule.fault.clone());
            }
        }
        chosen
    }
}

impl FaultScript {
    /// The fault for a request that is not a tool call, named by its method:
    /// only rules that name the method exactly (not `*`) apply, and only
    /// HTTP-level faults (`http`, `drop`) are acted out for it.
    pub fn next_for_method(&mut self, method: &str) -> Option<Fault> {
        self.next_named(method, |fault| matches!(fault, Fault::Http { .. } | Fault::Drop))
    }

    /// The fault for a `tasks/get`, `tasks/update` or `tasks/cancel` request
    /// (rule `"tool": "tasks/get"` and so on, counted per method): `http` and
    /// `drop` as for any method, and also `json-rpc-error` (the method's
    /// answer) and `timeout-after-apply` (it is served, then its answer is held).
    pub fn next_for_task_request(&mut self, method: &str) -> Option<Fault> {
        self.next_named(method, |fault| matches!(fault, Fault::Http { .. } | Fault::Drop | Fault::JsonRpcError { .. } | Fault::TimeoutAfterApply { .. }))
    }

    fn next_named(&mut self, method: &str, acted_out: impl Fn(&Fault) -> bool) -> Option<Fault> {
        let mut chosen = None;
        for rule in self.rules.iter_mut().filter(|r| r.tool == method && r.when.is_empty()) {
            rule.seen += 1;
            let due = rule.call.is_none_or(|n| n == rule.seen) && rule.first.is_none_or(|n| rule.seen <= n);
            if chosen.is_none() && due && acted_out(&rule.fault) {
                chosen = Some(rule.fault.clone());
            }
        }
        chosen
    }
}

/// A rule, for tests: `rule("issue_refund", Some(1), fault)`.
pub fn rule(tool: &str, call: Option<u32>, fault: Fault) -> FaultRule {
    FaultRule { tool: tool.to_string(), when: Default::default(), call, first: None, fault, seen: 0 }
}

/// A rule for the first `n` calls to `tool`.
pub fn rule_first(tool: &str, n: u32, fault: Fault) -> FaultRule {
    FaultRule { tool: tool.to_string(), when: Default::default(), call: None, first: Some(n), fault, seen: 0 }
}

/// A rule that matches only calls carrying these arguments.
pub fn rule_when(tool: &str, when: Value, call: Option<u32>, fault: Fault) -> FaultRule {
    let when = when.as_object().cloned().unwrap_or_default();
    FaultRule { tool: tool.to_string(), when, call, first: None, fault, seen: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nth_matching_call_and_subset_match() {
        let mut script = FaultScript::from_json(
            r#"[{"tool": "issue_refund", "when": {"order_id": "A"}, "call": 2, "fault": {"kind": "http", "status": 503}},
                {"tool": "*", "fault": {"kind": "empty"}}]"#,
        )
        .unwrap();
        let a = json!({"order_id": "A", "amount_paise": 5}).as_object().cloned().unwrap();
        let b = json!({"order_id": "B"}).as_object().cloned().unwrap();
        assert_eq!(script.next("issue_refund", &a), Some(Fault::Empty));
        assert_eq!(script.next("issue_refund", &b), Some(Fault::Empty));
        assert_eq!(script.next("issue_refund", &a), Some(Fault::Http { status: 503, headers: vec![], body: String::new() }));
        assert!(FaultScript::from_json(r#"[{"tool": "x", "fault": {"kind": "nope"}}]"#).is_err());
    }
}
