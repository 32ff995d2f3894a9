//! Counters of what the wrapper did, for the run summary and for Prometheus.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

#[derive(Default, Debug, Clone)]
pub struct Counts {
    pub attempts: u64,
    pub retries: u64,
    pub waited_ms: u64,
    pub by_status: BTreeMap<String, u64>,
    pub by_action: BTreeMap<String, u64>,
    pub escalations_by_reason: BTreeMap<String, u64>,
    /// Calls whose tool and arguments equal the run's previous call (a model
    /// repeating itself after an error is the clearest sign of a missing class).
    pub identical_consecutive_calls: u64,
    pub runs_ended_by_step_budget: u64,
}

/// Thread-safe counters shared by every caller of a host.
#[derive(Default, Debug)]
pub struct Metrics {
    counts: Mutex<Counts>,
}

impl Metrics {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn update(&self, f: impl FnOnce(&mut Counts)) {
        f(&mut self.counts.lock().unwrap_or_else(|p| p.into_inner()));
    }

    pub fn snapshot(&self) -> Counts {
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The counters in the Prometheus text exposition format.
    pub fn to_prometheus(&self) -> String {
        let c = self.snapshot();
        let mut out = String::new();
        let mut counter = |name: &str, help: &str, rows: Vec<(String, u64)>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (labels, value) in rows {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        counter("agent_retry_attempts_total", "Tool-call attempts sent.", vec![(String::new(), c.attempts)]);
        counter("agent_retry_retries_total", "Retries decided by the policy.", vec![(String::new(), c.retries)]);
        counter("agent_retry_waited_ms_total", "Time waited before retries, in ms of policy time.", vec![(String::new(), c.waited_ms)]);
        let labelled = |map: &BTreeMap<String, u64>, label: &str| map.iter().map(|(k, v)| (format!("{{{label}=\"{k}\"}}"), *v)).collect();
        counter("agent_retry_attempts_by_status_total", "Attempts by what came back.", labelled(&c.by_status, "status"));
        counter("agent_retry_decisions_total", "Decisions by action.", labelled(&c.by_action, "action"));
        counter("agent_retry_escalations_total", "Escalations by reason.", labelled(&c.escalations_by_reason, "reason"));
        counter(
            "agent_retry_identical_consecutive_calls_total",
            "Calls identical to the run's previous call.",
            vec![(String::new(), c.identical_consecutive_calls)],
        );
        counter(
            "agent_retry_runs_ended_by_step_budget_total",
            "Runs escalated because the step budget was spent.",
            vec![(String::new(), c.runs_ended_by_step_budget)],
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text() {
        let metrics = Metrics::new();
        metrics.update(|c| {
            c.attempts = 3;
            *c.by_status.entry("503".into()).or_default() += 2;
        });
        let text = metrics.to_prometheus();
        assert!(text.contains("# TYPE agent_retry_attempts_total counter\nagent_retry_attempts_total 3\n"), "{text}");
        assert!(text.contains("agent_retry_attempts_by_status_total{status=\"503\"} 2\n"), "{text}");
    }
}
