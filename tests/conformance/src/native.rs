//! The native subject: the policy core linked as a Rust library.

use std::sync::Arc;

use agent_retry_host::accounts as host;
use agent_retry_host::{AccountBudgetBackend, EmbeddedAccounts};
use agent_retry_policy::account::{AccountBudget, Bucket, Reservation};
use agent_retry_policy::classify::FailureView;
use agent_retry_policy::config::Config;
use agent_retry_policy::run::{Act, Run, Start, Verdict};
use agent_retry_policy::types::{CallRequest, Failure, Outcome};
use agent_retry_policy::{backoff, classify, hints, key, rules};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use agent_retry_host::vectors::runner::{Subject, result_json};

/// The host's embedded account budget, seen through the core's trait: the same
/// bucket implementation serves both subjects.
struct Accounts<'a>(&'a EmbeddedAccounts);

impl AccountBudget for Accounts<'_> {
    fn reserve(&mut self, account_id: &str, tokens: u32, bucket: Bucket, max_wait_ms: u64, now_ms: u64) -> Reservation {
        let bucket = host::Bucket { capacity: bucket.capacity, refill_interval_ms: bucket.refill_interval_ms };
        match self.0.reserve(account_id, tokens, bucket, max_wait_ms, now_ms) {
            host::Reservation::Granted(w) => Reservation::Granted(w),
            host::Reservation::Refused(w) => Reservation::Refused(w),
        }
    }

    fn refund(&mut self, account_id: &str, tokens: u32, bucket: Bucket, now_ms: u64) {
        let bucket = host::Bucket { capacity: bucket.capacity, refill_interval_ms: bucket.refill_interval_ms };
        self.0.refund(account_id, tokens, bucket, now_ms);
    }
}

pub struct Native {
    config: Option<Arc<Config>>,
    run: Option<Run>,
    accounts: EmbeddedAccounts,
}

impl Default for Native {
    fn default() -> Self {
        // The vectors run on one simulated clock.
        Native { config: None, run: None, accounts: EmbeddedAccounts::on_host_clock() }
    }
}

impl Native {
    pub fn new() -> Self {
        Self::default()
    }

    fn config(&self) -> Result<&Arc<Config>, String> {
        self.config.as_ref().ok_or_else(|| "no policy loaded".to_string())
    }
}

fn input<T: DeserializeOwned>(value: &Value, what: &str) -> Result<T, String> {
    serde_json::from_value(value.clone()).map_err(|e| format!("bad {what} {value}: {e}"))
}

fn output<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

impl Subject for Native {
    fn load_policy(&mut self, config_text: &str) -> Result<Value, String> {
        Ok(match Config::from_json(config_text) {
            Ok(config) => {
                let effective: Value = serde_json::from_str(&config.to_json()).map_err(|e| format!("effective config: {e}"))?;
                self.config = Some(Arc::new(config));
                result_json(Ok(effective))
            }
            Err(e) => result_json(Err(output(&e))),
        })
    }

    fn classify(&mut self, failure: &Value, now_ms: u64) -> Result<Value, String> {
        let failure: Failure = input(failure, "failure")?;
        Ok(output(&classify::classify(&failure, self.config()?, None, now_ms)))
    }

    fn next_delay(&mut self, retry: u32, hint_ms: Option<u64>, entropy: u64) -> Result<Value, String> {
        let c = self.config()?;
        Ok(Value::from(backoff::next_delay_ms(c.base_delay_ms, c.max_delay_ms, retry, hint_ms, entropy)))
    }

    fn derive_idempotency_key(&mut self, run_id: &str, action_id: &str) -> Result<Value, String> {
        Ok(Value::from(key::derive_idempotency_key(run_id, action_id)))
    }

    fn start_run(&mut self, run_id: &str) -> Result<Value, String> {
        match Run::start(Arc::clone(self.config()?), run_id) {
            Ok(run) => {
                self.run = Some(run);
                Ok(serde_json::json!({ "ok": null }))
            }
            Err(e) => Ok(result_json(Err(output(&e)))),
        }
    }

    fn begin_call(&mut self, call: &Value, now_ms: u64) -> Result<Value, String> {
        let call: CallRequest = input(call, "call")?;
        let run = self.run.as_mut().ok_or("no run")?;
        let result = run.begin_call(&call, now_ms, &mut Accounts(&self.accounts));
        Ok(result_json(result.map(|a| output(&a)).map_err(|e| output(&e))))
    }

    fn record_outcome(&mut self, call_id: u32, attempt: u32, outcome: &Value, now_ms: u64, entropy: u64) -> Result<Value, String> {
        let outcome: Outcome = input(outcome, "outcome")?;
        let run = self.run.as_mut().ok_or("no run")?;
        let result = run.record_outcome(call_id, attempt, &outcome, now_ms, entropy, &mut Accounts(&self.accounts));
        Ok(result_json(result.map(|d| output(&d)).map_err(|e| output(&e))))
    }

    fn report(&mut self) -> Result<Value, String> {
        Ok(output(&self.run.as_ref().ok_or("no run")?.report()))
    }

    fn effects(&mut self, start: u32, max_count: u32) -> Result<Value, String> {
        Ok(output(&self.run.as_ref().ok_or("no run")?.effects_page(start, max_count)))
    }

    fn rule_names(&mut self) -> Result<Value, String> {
        Ok(output(&rules::RULE_NAMES))
    }

    fn begin_call_flat(&mut self, call: &Value, now_ms: u64) -> Result<Value, String> {
        let call: CallRequest = input(call, "call")?;
        let run = self.run.as_mut().ok_or("no run")?;
        let start = run.begin(call.tool, call.idempotency_key, call.hints.as_ref(), now_ms, &mut Accounts(&self.accounts));
        Ok(result_json(start.map(|s| call_start(&s)).map_err(|e| output(&e))))
    }

    fn record_success(&mut self, call_id: u32, attempt: u32, now_ms: u64) -> Result<Value, String> {
        let run = self.run.as_mut().ok_or("no run")?;
        let verdict = run.record_success(call_id, attempt, now_ms, &mut Accounts(&self.accounts));
        Ok(result_json(verdict.map(|v| verdict_json(&v)).map_err(|e| output(&e))))
    }

    fn record_failure(&mut self, call_id: u32, attempt: u32, failure: &Value, now_ms: u64, entropy: u64) -> Result<Value, String> {
        let failure: Failure = input(failure, "failure")?;
        let lines = agent_retry_host::limits::header_lines(&failure.headers);
        let pairs = hints::split_lines(&lines);
        let view = FailureView { kind: &failure.kind, headers: &pairs, body: &failure.body, structured_content: failure.structured_content.as_deref() };
        let run = self.run.as_mut().ok_or("no run")?;
        let verdict = run.record_failure(call_id, attempt, &view, now_ms, entropy, &mut Accounts(&self.accounts));
        Ok(result_json(verdict.map(|v| verdict_json(&v)).map_err(|e| output(&e))))
    }

    fn last_decision(&mut self, call_id: u32) -> Result<Value, String> {
        Ok(output(&self.run.as_ref().ok_or("no run")?.last_decision(call_id)))
    }

    fn escalation(&mut self) -> Result<Value, String> {
        Ok(output(&self.run.as_ref().ok_or("no run")?.escalation()))
    }
}

/// The canonical JSON of a `call-start`, as the component answers it.
fn call_start(start: &Start) -> Value {
    match start {
        Start::Send(t) => {
            json!({"admitted": true, "call-id": t.call_id, "delay-ms": t.delay_ms, "effect": output(&t.effect), "safe-to-repeat": t.safe_to_repeat})
        }
        Start::Escalated => json!({"admitted": false, "call-id": 0, "delay-ms": 0, "effect": "read", "safe-to-repeat": false}),
    }
}

/// The canonical JSON of a `verdict`, as the component answers it.
fn verdict_json(v: &Verdict) -> Value {
    let (action, delay_ms) = match v.act {
        Act::Retry { delay_ms, .. } => ("retry", delay_ms),
        Act::Replan => ("replan", 0),
        Act::CheckStatus => ("check-status", 0),
        Act::Succeed => ("succeed", 0),
        Act::Escalate => ("escalate", 0),
    };
    json!({
        "action": action, "class": output(&v.class), "attempt": v.attempt, "delay-ms": delay_ms,
        "hint-ms": v.hint_ms, "rule-index": v.rule.index(), "has-note": v.has_note,
    })
}
