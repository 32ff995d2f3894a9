//! The instruments of docs/events.md, counted from the events (so that they
//! agree with the run report: the attempts summed over their labels equal the
//! report's `attempts`), printed as Prometheus text; and the run summary's
//! counts the demo prints ([`Counts`]).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use serde_json::{Value, json};

use crate::component::types::EscalationReason;
use crate::events::Event;
use crate::labels;

/// The wait histogram's upper bounds, in seconds (docs/events.md).
pub const WAIT_BUCKETS_S: [f64; 10] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// The bounds as every host prints them (the `le` label, the dump's keys).
pub const WAIT_BUCKET_LABELS: [&str; 10] = ["0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60"];

/// The summary counts of tool calls (what the demo prints). Connecting and
/// listing the tools are not tool calls: `attempts` here counts tool-call
/// attempts only, where the instruments ([`Instruments::attempts`]) count
/// every attempt, as the run report does.
#[derive(Default, Debug, Clone)]
pub struct Counts {
    /// Tool-call attempts sent (not `initialize` or `tools/list`).
    pub attempts: u64,
    /// Tool-call retries decided.
    pub retries: u64,
    /// The tool-call retries' waits, in ms of policy time.
    pub waited_ms: u64,
    /// Tool-call attempts by what came back (the MCP wrapper's outcome label).
    pub by_status: BTreeMap<String, u64>,
    /// Tool-call decisions by action.
    pub by_action: BTreeMap<String, u64>,
    /// Escalations by reason (every call, pseudo-calls included).
    pub escalations_by_reason: BTreeMap<String, u64>,
    /// Calls whose tool and arguments equal the run's previous call (a model
    /// repeating itself after an error is the clearest sign of a missing class).
    pub identical_consecutive_calls: u64,
    pub runs_ended_by_step_budget: u64,
}

/// A histogram of waits: its buckets (not cumulative), sum and count. The
/// sum is kept in whole ms (exact) and given in seconds.
#[derive(Default, Debug, Clone, PartialEq, Eq)]
pub struct Histogram {
    /// One count per bound of [`WAIT_BUCKETS_S`], then the count above the last.
    pub buckets: [u64; WAIT_BUCKETS_S.len() + 1],
    pub sum_ms: u64,
    pub count: u64,
}

impl Histogram {
    fn observe_ms(&mut self, ms: u64) {
        let seconds = ms as f64 / 1000.0;
        let slot = WAIT_BUCKETS_S.iter().position(|bound| seconds <= *bound).unwrap_or(WAIT_BUCKETS_S.len());
        self.buckets[slot] += 1;
        self.sum_ms = self.sum_ms.saturating_add(ms);
        self.count += 1;
    }

    /// The sum in seconds.
    pub fn sum(&self) -> f64 {
        self.sum_ms as f64 / 1000.0
    }

    /// `(le, cumulative count)` per bound, `+Inf` last.
    pub fn cumulative(&self) -> Vec<(&'static str, u64)> {
        let mut total = 0;
        let mut rows: Vec<(&'static str, u64)> = WAIT_BUCKET_LABELS
            .iter()
            .zip(self.buckets)
            .map(|(label, n)| {
                total += n;
                (*label, total)
            })
            .collect();
        rows.push(("+Inf", self.count));
        rows
    }
}

/// The instruments of docs/events.md, by their labels.
#[derive(Default, Debug, Clone, PartialEq, Eq)]
pub struct Instruments {
    /// `agent_retry_attempts_total` by (`class`, `action`).
    pub attempts: BTreeMap<(String, String), u64>,
    pub replans: u64,
    /// By the escalation reason's contract name.
    pub escalations: BTreeMap<String, u64>,
    /// By `found` / `absent` / `unknown`.
    pub status_checks: BTreeMap<String, u64>,
    /// By `retry` / `poll` / `admission`.
    pub waits: BTreeMap<String, u64>,
    pub wait_seconds: BTreeMap<String, Histogram>,
    pub account_waits: u64,
    pub account_refusals: u64,
    /// By `accepted` / `refused` / `rolled-back`.
    pub policy_updates: BTreeMap<String, u64>,
    /// `agent_retry_breaker_changes_total` by (`scope`, `to`).
    pub breaker_changes: BTreeMap<(String, String), u64>,
}

impl Instruments {
    /// The attempts summed over their labels: the run report's `attempts`.
    pub fn attempts_total(&self) -> u64 {
        self.attempts.values().sum()
    }
}

/// One change an event makes to an instrument of docs/events.md: the
/// Prometheus instruments ([`Metrics`]) and the OpenTelemetry ones (the `otel`
/// feature) apply the same list, so that they agree.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Change<'a> {
    /// `agent_retry.attempts` by `class` (`none` for an attempt no verdict answered) and `action`.
    Attempt {
        class: &'a str,
        action: &'a str,
    },
    Replan,
    Escalation {
        reason: &'static str,
    },
    StatusCheck {
        result: &'static str,
    },
    /// `agent_retry.breaker.changes` by `scope` and `to`.
    Breaker {
        scope: &'static str,
        to: &'static str,
    },
    /// `agent_retry.waits` and the wait histogram, by `why`.
    Wait {
        why: &'static str,
        wait_ms: u64,
    },
    AccountWait,
    AccountRefusal,
    PolicyUpdate {
        outcome: &'static str,
    },
}

/// What `event` changes in the instruments: an attempt the run report counts
/// (`sent`), a wait (an admission wait is also the account budget's), a
/// replan, an escalation (one of the account budget is also a refusal), a
/// status check, a live update.
pub(crate) fn changes(event: &Event) -> Vec<Change<'_>> {
    match event {
        Event::Attempt(e) if e.sent => vec![Change::Attempt { class: e.class.as_deref().unwrap_or("none"), action: &e.action }],
        Event::Attempt(_) | Event::TaskPoll(_) | Event::Resume(_) => vec![],
        Event::Wait(e) => {
            let wait = Change::Wait { why: e.why.as_str(), wait_ms: e.wait_ms };
            if e.why == crate::events::WaitReason::Admission { vec![wait, Change::AccountWait] } else { vec![wait] }
        }
        Event::Replan(_) => vec![Change::Replan],
        Event::Escalation(e) => {
            let escalation = Change::Escalation { reason: labels::reason(e.escalation.reason) };
            if e.escalation.reason == EscalationReason::AccountBudgetExhausted { vec![escalation, Change::AccountRefusal] } else { vec![escalation] }
        }
        Event::StatusCheck(e) => vec![Change::StatusCheck { result: labels::status_check(e.result) }],
        Event::Breaker(e) => vec![Change::Breaker { scope: e.scope, to: e.to }],
        Event::PolicyUpdate(e) => vec![Change::PolicyUpdate { outcome: e.outcome.as_str() }],
    }
}

#[derive(Default, Debug)]
struct State {
    counts: Counts,
    instruments: Instruments,
}

/// Thread-safe counters shared by every caller of a host.
#[derive(Default, Debug)]
pub struct Metrics {
    state: Mutex<State>,
}

impl Metrics {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes the summary counts directly (what no event says, such as identical consecutive calls).
    pub fn update(&self, f: impl FnOnce(&mut Counts)) {
        f(&mut self.lock().counts);
    }

    /// The summary counts.
    pub fn snapshot(&self) -> Counts {
        self.lock().counts.clone()
    }

    /// The instruments of docs/events.md.
    pub fn instruments(&self) -> Instruments {
        self.lock().instruments.clone()
    }

    /// Counts one event (the fan-out calls this for every event it emits).
    pub fn count(&self, event: &Event) {
        let mut state = self.lock();
        let State { counts, instruments } = &mut *state;
        for change in changes(event) {
            match change {
                Change::Attempt { class, action } => *instruments.attempts.entry((class.to_string(), action.to_string())).or_default() += 1,
                Change::Replan => instruments.replans += 1,
                Change::Escalation { reason } => *instruments.escalations.entry(reason.to_string()).or_default() += 1,
                Change::StatusCheck { result } => *instruments.status_checks.entry(result.to_string()).or_default() += 1,
                Change::Breaker { scope, to } => *instruments.breaker_changes.entry((scope.to_string(), to.to_string())).or_default() += 1,
                Change::Wait { why, wait_ms } => {
                    *instruments.waits.entry(why.to_string()).or_default() += 1;
                    instruments.wait_seconds.entry(why.to_string()).or_default().observe_ms(wait_ms);
                }
                Change::AccountWait => instruments.account_waits += 1,
                Change::AccountRefusal => instruments.account_refusals += 1,
                Change::PolicyUpdate { outcome } => *instruments.policy_updates.entry(outcome.to_string()).or_default() += 1,
            }
        }
        match event {
            Event::Attempt(e) if e.context.step.is_some() && e.class.is_some() => {
                // The summary counts answered tool-call attempts and decisions, as in 0.7
                // (a stop or a refusal is not the policy's decision).
                if e.sent {
                    counts.attempts += 1;
                    *counts.by_status.entry(e.outcome.clone()).or_default() += 1;
                }
                *counts.by_action.entry(e.action.clone()).or_default() += 1;
                if e.action == "retry" {
                    counts.retries += 1;
                    counts.waited_ms += e.delay_ms.unwrap_or(0);
                }
            }
            Event::Escalation(e) => {
                *counts.escalations_by_reason.entry(labels::reason(e.escalation.reason).to_string()).or_default() += 1;
                if e.escalation.reason == EscalationReason::RunStepsSpent {
                    counts.runs_ended_by_step_budget += 1;
                }
            }
            _ => {}
        }
    }

    /// The instruments as JSON, for tests and dumps: each Prometheus name to
    /// its samples (`{"labels": {...}, "value": n}`, sorted by labels); the
    /// histogram's samples carry `buckets` (cumulative, by bound), `sum` and `count`.
    pub fn to_json(&self) -> Value {
        let i = self.instruments();
        let labelled = |map: &BTreeMap<String, u64>, label: &str| -> Value {
            map.iter().map(|(k, v)| json!({"labels": {label: k}, "value": v})).collect::<Vec<_>>().into()
        };
        let single = |value: u64| json!([{"labels": {}, "value": value}]);
        let histograms: Vec<Value> = i
            .wait_seconds
            .iter()
            .map(|(why, h)| {
                let buckets: serde_json::Map<String, Value> = h.cumulative().into_iter().map(|(le, n)| (le.to_string(), json!(n))).collect();
                json!({"labels": {"why": why}, "buckets": buckets, "sum": h.sum(), "count": h.count})
            })
            .collect();
        json!({
            "agent_retry_attempts_total": i.attempts.iter().map(|((class, action), v)| json!({"labels": {"class": class, "action": action}, "value": v})).collect::<Vec<_>>(),
            "agent_retry_replans_total": single(i.replans),
            "agent_retry_escalations_total": labelled(&i.escalations, "reason"),
            "agent_retry_status_checks_total": labelled(&i.status_checks, "result"),
            "agent_retry_waits_total": labelled(&i.waits, "why"),
            "agent_retry_wait_seconds": histograms,
            "agent_retry_account_waits_total": single(i.account_waits),
            "agent_retry_account_refusals_total": single(i.account_refusals),
            "agent_retry_policy_updates_total": labelled(&i.policy_updates, "outcome"),
            "agent_retry_breaker_changes_total": i.breaker_changes.iter().map(|((scope, to), v)| json!({"labels": {"scope": scope, "to": to}, "value": v})).collect::<Vec<_>>(),
        })
    }

    /// The instruments in the Prometheus text exposition format (0.0.4).
    pub fn to_prometheus(&self) -> String {
        let i = self.instruments();
        let mut out = String::new();
        let mut counter = |name: &str, help: &str, rows: Vec<(String, u64)>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (labels, value) in rows {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let labelled = |map: &BTreeMap<String, u64>, label: &str| map.iter().map(|(k, v)| (format!("{{{label}=\"{}\"}}", escape(k)), *v)).collect();
        let attempts = i.attempts.iter().map(|((class, action), v)| (format!("{{class=\"{}\",action=\"{}\"}}", escape(class), escape(action)), *v)).collect();
        counter("agent_retry_attempts_total", "Attempts whose verdict was read, by class and action.", attempts);
        counter("agent_retry_replans_total", "Calls ended with a message for the model.", vec![(String::new(), i.replans)]);
        counter("agent_retry_escalations_total", "Calls ended with an escalation, by reason.", labelled(&i.escalations, "reason"));
        counter("agent_retry_status_checks_total", "Status checks answered, by result.", labelled(&i.status_checks, "result"));
        counter("agent_retry_waits_total", "Waits before an attempt or a poll, by why.", labelled(&i.waits, "why"));
        let name = "agent_retry_wait_seconds";
        let _ = writeln!(out, "# HELP {name} Waits before an attempt or a poll, in seconds, by why.\n# TYPE {name} histogram");
        for (why, h) in &i.wait_seconds {
            let why = escape(why);
            for (le, n) in h.cumulative() {
                let _ = writeln!(out, "{name}_bucket{{why=\"{why}\",le=\"{le}\"}} {n}");
            }
            let _ = writeln!(out, "{name}_sum{{why=\"{why}\"}} {}", h.sum());
            let _ = writeln!(out, "{name}_count{{why=\"{why}\"}} {}", h.count);
        }
        let mut counter = |name: &str, help: &str, rows: Vec<(String, u64)>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (labels, value) in rows {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        counter("agent_retry_account_waits_total", "Admission waits of the account budget.", vec![(String::new(), i.account_waits)]);
        counter("agent_retry_account_refusals_total", "Calls the account budget did not admit.", vec![(String::new(), i.account_refusals)]);
        counter("agent_retry_policy_updates_total", "Live policy updates, by outcome.", labelled(&i.policy_updates, "outcome"));
        let breakers = i.breaker_changes.iter().map(|((scope, to), v)| (format!("{{scope=\"{}\",to=\"{}\"}}", escape(scope), escape(to)), *v)).collect();
        counter("agent_retry_breaker_changes_total", "Circuit breaker state changes, by scope and new state.", breakers);
        out
    }
}

/// A label value in the exposition format: backslash, quote and line feed escaped.
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EventContext, WaitEvent, WaitReason};

    fn context() -> EventContext {
        EventContext { run: "r".into(), policy: "p".into(), step: Some(1), call: Some(1), tool: "t".into() }
    }

    #[test]
    fn a_wait_lands_in_its_bucket_and_the_text_is_cumulative() {
        let metrics = Metrics::new();
        for wait_ms in [40, 1000, 1001, 120_000] {
            metrics.count(&Event::Wait(WaitEvent { context: context(), attempt: 2, why: WaitReason::Retry, wait_ms, hint_ms: None }));
        }
        let text = metrics.to_prometheus();
        assert!(text.contains("agent_retry_wait_seconds_bucket{why=\"retry\",le=\"0.05\"} 1\n"), "{text}");
        assert!(text.contains("agent_retry_wait_seconds_bucket{why=\"retry\",le=\"1\"} 2\n"), "{text}");
        assert!(text.contains("agent_retry_wait_seconds_bucket{why=\"retry\",le=\"2.5\"} 3\n"), "{text}");
        assert!(text.contains("agent_retry_wait_seconds_bucket{why=\"retry\",le=\"60\"} 3\n"), "{text}");
        assert!(text.contains("agent_retry_wait_seconds_bucket{why=\"retry\",le=\"+Inf\"} 4\n"), "{text}");
        assert!(text.contains("agent_retry_wait_seconds_count{why=\"retry\"} 4\n"), "{text}");
        assert!(text.contains("agent_retry_waits_total{why=\"retry\"} 4\n"), "{text}");
    }

    #[test]
    fn a_label_value_cannot_break_the_exposition() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
