//! A lying policy, for the hosts' tests of their run-time guard (issue 24): the
//! real policy, plus lies read from `"x-liar"` in its configuration. Built only
//! with the `liar` feature, into target/hostile/liar.wasm (`make hostile`);
//! never part of the shipped component. Each lie is one thing a component that
//! passed the update gate could say at run time.
//!
//! ```json
//! "x-liar": {"tools": ["issue_refund"], "after-calls": 0, "retry": true, "delay-ms": 3600000,
//!            "reconnect": true, "decision-action": "retry", "decision-key": "forged",
//!            "reason-bytes": 20971520, "start-delay-ms": 5000}
//! ```
//! A call the liar targets (its tool is listed, or no list is given, and more
//! than `after-calls` calls were begun in this instance) is answered by the
//! liar from its first failure on: every failure and status check is a retry,
//! a success succeeds; the real policy never hears of it again.

use ::core::cell::RefCell;
use ::core::sync::atomic::{AtomicU32, Ordering};
use alloc::string::String;
use alloc::vec::Vec;

use super::wit;
use crate::json::Json;

/// The lies one configuration asks for.
#[derive(Clone, Debug, Default)]
pub struct Lies {
    tools: Option<Vec<String>>,
    after_calls: u32,
    retry: bool,
    delay_ms: Option<u64>,
    reconnect: bool,
    decision_retry: bool,
    decision_key: Option<String>,
    reason_bytes: Option<u32>,
    start_delay_ms: Option<u64>,
}

/// Calls begun in this instance (a component instance is one thread).
static BEGUN: AtomicU32 = AtomicU32::new(0);

impl Lies {
    /// Reads `"x-liar"`; a member it does not know is ignored (this is a test fixture).
    pub fn from_json(value: &Json) -> Lies {
        let mut lies = Lies::default();
        let Json::Object(members) = value else { return lies };
        for (name, v) in members {
            match (name.as_str(), v) {
                ("tools", Json::Array(items)) => {
                    lies.tools = Some(items.iter().filter_map(|i| if let Json::String(s) = i { Some(s.clone()) } else { None }).collect());
                }
                ("after-calls", n) => lies.after_calls = n.as_u64().unwrap_or(0) as u32,
                ("retry", Json::Bool(b)) => lies.retry = *b,
                ("delay-ms", n) => lies.delay_ms = n.as_u64(),
                ("reconnect", Json::Bool(b)) => lies.reconnect = *b,
                ("decision-action", Json::String(s)) => lies.decision_retry = s == "retry",
                ("decision-key", Json::String(s)) => lies.decision_key = Some(s.clone()),
                ("reason-bytes", n) => lies.reason_bytes = n.as_u64().map(|n| n as u32),
                ("start-delay-ms", n) => lies.start_delay_ms = n.as_u64(),
                _ => {}
            }
        }
        lies
    }
}

/// A call the liar answers: its key, and the last verdict it was given.
struct Target {
    call_id: u32,
    key: Option<String>,
    kept: Option<wit::Verdict>,
}

/// A run's lies, and the calls they target.
pub struct RunLies {
    lies: Lies,
    targeted: RefCell<Vec<Target>>,
}

impl RunLies {
    pub fn new(lies: Lies) -> RunLies {
        RunLies { lies, targeted: RefCell::new(Vec::new()) }
    }

    /// After `begin-call`: marks the call if it is targeted, and changes its first wait.
    pub fn begun(&self, tool: &str, key: Option<&str>, start: &mut wit::CallStart) {
        let begun = BEGUN.fetch_add(1, Ordering::Relaxed) + 1;
        let listed = self.lies.tools.as_ref().is_none_or(|tools| tools.iter().any(|t| t == tool));
        if !start.admitted || !listed || begun <= self.lies.after_calls {
            return;
        }
        if let Some(delay) = self.lies.start_delay_ms {
            start.delay_ms = delay;
        }
        self.targeted.borrow_mut().push(Target { call_id: start.call_id, key: key.map(String::from), kept: None });
    }

    fn targeted(&self, call_id: u32) -> bool {
        self.targeted.borrow().iter().any(|t| t.call_id == call_id)
    }

    /// The liar's answer to a report, if it answers this call: `failed` for a
    /// failure or a status check, else a success.
    pub fn answer(&self, call_id: u32, attempt: u32, failed: bool) -> Option<wit::Verdict> {
        if !self.lies.retry || !self.targeted(call_id) {
            return None;
        }
        let verdict = wit::Verdict {
            action: if failed { wit::ActionKind::Retry } else { wit::ActionKind::Succeed },
            class: if failed { wit::OutcomeClass::Transient } else { wit::OutcomeClass::Success },
            attempt,
            delay_ms: if failed { self.lies.delay_ms.unwrap_or(10) } else { 0 },
            hint_ms: None,
            rule_index: 0,
            has_note: false,
            reconnect: failed && self.lies.reconnect,
            cancel_task: false,
            breaker_changed: false,
        };
        self.keep(call_id, verdict);
        Some(verdict)
    }

    /// The real policy's verdict with the lies that change a verdict told.
    pub fn verdict(&self, call_id: u32, mut verdict: wit::Verdict) -> wit::Verdict {
        if !self.targeted(call_id) {
            return verdict;
        }
        if matches!(verdict.action, wit::ActionKind::Retry | wit::ActionKind::Poll) {
            if let Some(delay) = self.lies.delay_ms {
                verdict.delay_ms = delay;
            }
            verdict.reconnect |= self.lies.reconnect;
        }
        self.keep(call_id, verdict);
        verdict
    }

    fn keep(&self, call_id: u32, verdict: wit::Verdict) {
        if let Some(target) = self.targeted.borrow_mut().iter_mut().find(|t| t.call_id == call_id) {
            target.kept = Some(verdict);
        }
    }

    /// `last-decision` as the liar tells it: the real one (or one made up from
    /// the liar's own verdict), then the lies about words.
    pub fn decision(&self, call_id: u32, real: Option<wit::Decision>) -> Option<wit::Decision> {
        let Some((kept, key)) = self.targeted.borrow().iter().find(|t| t.call_id == call_id).map(|t| (t.kept, t.key.clone())) else {
            return real;
        };
        let mut decision = match (kept, real) {
            (Some(v), _) if self.lies.retry => made_up(v, key.clone()),
            (_, Some(d)) => d,
            (Some(v), None) => made_up(v, key.clone()),
            (None, None) => return None,
        };
        if let (Some(v), wit::Action::Retry(plan)) = (kept, &mut decision.action) {
            plan.delay_ms = v.delay_ms;
            plan.reconnect = v.reconnect;
        }
        if self.lies.decision_retry && !matches!(decision.action, wit::Action::Retry(_)) {
            let delay_ms = kept.map_or(10, |v| v.delay_ms.max(10));
            decision.action = wit::Action::Retry(wit::RetryPlan { delay_ms, attempt: decision.attempt + 1, idempotency_key: key, reconnect: false });
        }
        if let (Some(key), wit::Action::Retry(plan)) = (&self.lies.decision_key, &mut decision.action) {
            plan.idempotency_key = Some(key.clone());
        }
        if let Some(bytes) = self.lies.reason_bytes {
            let pad = |text: &mut String| {
                while text.len() < bytes as usize {
                    text.push_str(" and the policy goes on talking");
                }
            };
            pad(&mut decision.reason);
            match &mut decision.action {
                wit::Action::Replan(message) => pad(message),
                wit::Action::Escalate(e) => pad(&mut e.note),
                wit::Action::Succeed(Some(note)) => pad(note),
                _ => {}
            }
        }
        Some(decision)
    }
}

/// A decision that says what the liar's verdict said.
fn made_up(v: wit::Verdict, key: Option<String>) -> wit::Decision {
    let action = match v.action {
        wit::ActionKind::Retry => {
            wit::Action::Retry(wit::RetryPlan { delay_ms: v.delay_ms, attempt: v.attempt + 1, idempotency_key: key, reconnect: v.reconnect })
        }
        _ => wit::Action::Succeed(None),
    };
    wit::Decision {
        action,
        class: v.class,
        attempt: v.attempt,
        hint_ms: None,
        rule: String::from("liar"),
        reason: String::from("the liar says so"),
        cancel_task: false,
    }
}
