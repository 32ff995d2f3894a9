//! The native subject: the policy core linked as a Rust library.

use std::sync::Arc;

use agent_retry_host::accounts as host;
use agent_retry_host::{AccountBudgetBackend, EmbeddedAccounts};
use agent_retry_policy::account::{AccountBudget, Bucket, Reservation};
use agent_retry_policy::classify::FailureView;
use agent_retry_policy::config::Config;
use agent_retry_policy::run::{Act, At, Run, Start, Verdict};
use agent_retry_policy::shared::{Loaded, MemoryState, SharedState};
use agent_retry_policy::types::{Delivery, FailureKind, ResumeAnswer, StatusCheckResult, TaskReport, ToolHints};
use agent_retry_policy::{backoff, classify, hints, key, rules, session};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use agent_retry_host::vectors::runner::{Subject, result_json};

/// The host's embedded account budget, seen through the core's trait: the same
/// bucket implementation serves both subjects. The shared state is the core's
/// own in-memory store: nothing expires within a case, as in the component's runner.
struct Accounts<'a>(&'a EmbeddedAccounts, &'a mut MemoryState);

impl SharedState for Accounts<'_> {
    fn load(&mut self, key: &str, now_ms: u64) -> Loaded {
        self.1.load(key, now_ms)
    }

    fn store_if(&mut self, key: &str, expected_version: u64, value: &str, ttl_ms: u64) -> bool {
        self.1.store_if(key, expected_version, value, ttl_ms)
    }
}

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
    shared: MemoryState,
}

impl Default for Native {
    fn default() -> Self {
        // The vectors run on one simulated clock.
        Native { config: None, run: None, accounts: EmbeddedAccounts::on_host_clock(), shared: MemoryState::default() }
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

/// An `observation` in canonical JSON: its headers as `name: value` lines.
#[derive(Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct Observation {
    kind: FailureKind,
    headers: String,
    body: String,
    structured_content: Option<String>,
    session_id_sent: bool,
    delivery: Delivery,
}

impl Observation {
    /// The core's view of it, over `pairs` (its header lines, split as the component splits them).
    fn view<'a>(&'a self, pairs: &'a [hints::Pair<'a>]) -> FailureView<'a> {
        FailureView {
            kind: &self.kind,
            headers: pairs,
            body: &self.body,
            structured_content: self.structured_content.as_deref(),
            session_id_sent: self.session_id_sent,
            delivery: self.delivery,
        }
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

    fn classify(&mut self, observation: &Value, now_ms: u64) -> Result<Value, String> {
        let observation: Observation = input(observation, "observation")?;
        let pairs = hints::split_lines(&observation.headers);
        Ok(output(&classify::classify_view(&observation.view(&pairs), self.config()?, None, now_ms).into_classification()))
    }

    fn read_probe_answer(&mut self, http_status: Option<u16>, json_rpc_code: Option<i32>) -> Result<Value, String> {
        Ok(output(&session::read_probe_answer(http_status, json_rpc_code)))
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

    fn report(&mut self) -> Result<Value, String> {
        Ok(output(&self.run.as_ref().ok_or("no run")?.report()))
    }

    fn effects(&mut self, start: u32, max_count: u32) -> Result<Value, String> {
        Ok(output(&self.run.as_ref().ok_or("no run")?.effects_page(start, max_count)))
    }

    fn rule_names(&mut self) -> Result<Value, String> {
        Ok(output(&rules::RULE_NAMES))
    }

    fn begin_call(&mut self, server: &Value, tool: &Value, idempotency_key: &Value, hints: &Value, now_ms: u64) -> Result<Value, String> {
        let server: Option<String> = input(server, "server")?;
        let tool: String = input(tool, "tool")?;
        let key: Option<String> = input(idempotency_key, "idempotency-key")?;
        let hints: Option<ToolHints> = input(hints, "hints")?;
        let run = self.run.as_mut().ok_or("no run")?;
        let start = run.begin(server, tool, key, hints.as_ref(), now_ms, &mut Accounts(&self.accounts, &mut self.shared));
        let changed = run.breaker_changed();
        Ok(result_json(start.map(|s| call_start(&s, changed)).map_err(|e| output(&e))))
    }

    fn take_breaker_changes(&mut self) -> Result<Value, String> {
        let run = self.run.as_mut().ok_or("no run")?;
        let changes: Vec<Value> = run
            .take_breaker_changes()
            .into_iter()
            .map(|c| {
                json!({"server": c.server, "tool": c.tool, "old-state": c.change.from.name(), "new-state": c.change.to.name(), "until-ms": c.change.until_ms, "why": c.change.why})
            })
            .collect();
        Ok(Value::from(changes))
    }

    fn put_shared_state(&mut self, key: &str, value: &str) -> Result<(), String> {
        // As a store's write: the next version, whatever the last was.
        let version = self.shared.load(key, 0).version;
        self.shared.store_if(key, version, value, u64::MAX);
        Ok(())
    }

    fn shared_state(&mut self, key: &str) -> Result<Value, String> {
        Ok(self.shared.load(key, 0).value.map_or(Value::Null, Value::from))
    }

    fn record_success(&mut self, call_id: u32, attempt: u32, now_ms: u64) -> Result<Value, String> {
        let run = self.run.as_mut().ok_or("no run")?;
        let verdict = run.record_success(call_id, attempt, now_ms, &mut Accounts(&self.accounts, &mut self.shared));
        Ok(result_json(verdict.map(|v| verdict_json(&v, run.breaker_changed())).map_err(|e| output(&e))))
    }

    fn record_empty_result(&mut self, call_id: u32, attempt: u32, detail: &str, now_ms: u64) -> Result<Value, String> {
        let run = self.run.as_mut().ok_or("no run")?;
        let verdict = run.record_empty_result(call_id, attempt, detail, now_ms, &mut Accounts(&self.accounts, &mut self.shared));
        Ok(result_json(verdict.map(|v| verdict_json(&v, run.breaker_changed())).map_err(|e| output(&e))))
    }

    fn record_failure(
        &mut self,
        call_id: u32,
        attempt: u32,
        observation: &Value,
        time_left_ms: Option<u64>,
        now_ms: u64,
        entropy: u64,
    ) -> Result<Value, String> {
        let observation: Observation = input(observation, "observation")?;
        let pairs = hints::split_lines(&observation.headers);
        let run = self.run.as_mut().ok_or("no run")?;
        let verdict = run.record_failure(
            call_id,
            attempt,
            &observation.view(&pairs),
            At { now_ms, time_left_ms, entropy },
            &mut Accounts(&self.accounts, &mut self.shared),
        );
        Ok(result_json(verdict.map(|v| verdict_json(&v, run.breaker_changed())).map_err(|e| output(&e))))
    }

    fn record_status_check(
        &mut self,
        call_id: u32,
        attempt: u32,
        result: &Value,
        time_left_ms: Option<u64>,
        now_ms: u64,
        entropy: u64,
    ) -> Result<Value, String> {
        let result: StatusCheckResult = input(result, "status-check-result")?;
        let run = self.run.as_mut().ok_or("no run")?;
        let verdict = run.record_status_check(call_id, attempt, result, At { now_ms, time_left_ms, entropy }, &mut Accounts(&self.accounts, &mut self.shared));
        Ok(result_json(verdict.map(|v| verdict_json(&v, run.breaker_changed())).map_err(|e| output(&e))))
    }

    fn record_task_status(&mut self, call_id: u32, attempt: u32, task: &Value, time_left_ms: Option<u64>, now_ms: u64, entropy: u64) -> Result<Value, String> {
        let task: TaskReport = input(task, "task-report")?;
        let run = self.run.as_mut().ok_or("no run")?;
        let verdict = run.record_task_status(call_id, attempt, &task, At { now_ms, time_left_ms, entropy }, &mut Accounts(&self.accounts, &mut self.shared));
        Ok(result_json(verdict.map(|v| verdict_json(&v, run.breaker_changed())).map_err(|e| output(&e))))
    }

    fn record_poll_failure(
        &mut self,
        call_id: u32,
        attempt: u32,
        observation: &Value,
        time_left_ms: Option<u64>,
        now_ms: u64,
        entropy: u64,
    ) -> Result<Value, String> {
        let observation: Observation = input(observation, "observation")?;
        let pairs = hints::split_lines(&observation.headers);
        let run = self.run.as_mut().ok_or("no run")?;
        let verdict = run.record_poll_failure(
            call_id,
            attempt,
            &observation.view(&pairs),
            At { now_ms, time_left_ms, entropy },
            &mut Accounts(&self.accounts, &mut self.shared),
        );
        Ok(result_json(verdict.map(|v| verdict_json(&v, run.breaker_changed())).map_err(|e| output(&e))))
    }

    fn abandon_call(&mut self, call_id: u32, attempt: u32, sent: bool, why: &str) -> Result<Value, String> {
        let why = serde_json::from_value(Value::from(why)).map_err(|e| format!("why: {e}"))?;
        let run = self.run.as_mut().ok_or("no run")?;
        Ok(result_json(
            run.abandon_call(call_id, attempt, sent, why, &mut Accounts(&self.accounts, &mut self.shared)).map(|()| Value::Null).map_err(|e| output(&e)),
        ))
    }

    fn last_decision(&mut self, call_id: u32) -> Result<Value, String> {
        Ok(output(&self.run.as_ref().ok_or("no run")?.last_decision(call_id)))
    }

    fn escalation(&mut self) -> Result<Value, String> {
        Ok(output(&self.run.as_ref().ok_or("no run")?.escalation()))
    }

    fn snapshot(&mut self, arguments_json: Option<&str>, now_ms: u64) -> Result<Value, String> {
        let run = self.run.as_ref().ok_or("no run")?;
        Ok(result_json(run.snapshot(arguments_json, now_ms).map(Value::from).map_err(|e| output(&e))))
    }

    fn resume_run(&mut self, snapshot: &str, answer: &Value, now_ms: u64) -> Result<Value, String> {
        let answer: ResumeAnswer = input(answer, "answer")?;
        let config = Arc::clone(self.config()?);
        let resumed = Run::resume(config, snapshot, answer, now_ms, &mut Accounts(&self.accounts, &mut self.shared));
        Ok(match resumed {
            Ok(run) => {
                let call = run.resumed_call().map(|c| {
                    let ticket = c.ticket.as_ref().map(|t| call_start(&Start::Send(t.clone()), false));
                    let mut value = output(&c);
                    value["ticket"] = ticket.unwrap_or(Value::Null);
                    value
                });
                self.run = Some(run);
                result_json(Ok(call.unwrap_or(Value::Null)))
            }
            Err(e) => result_json(Err(output(&e))),
        })
    }
}

/// The canonical JSON of a `call-start`, as the component answers it.
fn call_start(start: &Start, breaker_changed: bool) -> Value {
    let refused = |call_id: u32, replan: bool| {
        json!({
            "admitted": false, "call-id": call_id, "delay-ms": 0, "effect": "read", "safe-to-repeat": false, "idle-timeout-ms": 0, "attempt-timeout-ms": 0,
            "replan": replan, "breaker-changed": breaker_changed,
        })
    };
    match start {
        Start::Send(t) => json!({
            "admitted": true, "call-id": t.call_id, "delay-ms": t.delay_ms, "effect": output(&t.effect), "safe-to-repeat": t.safe_to_repeat,
            "idle-timeout-ms": t.idle_timeout_ms, "attempt-timeout-ms": t.attempt_timeout_ms, "replan": false, "breaker-changed": breaker_changed,
        }),
        Start::Escalated => refused(0, false),
        Start::Replan(call_id) => refused(*call_id, true),
    }
}

/// The canonical JSON of a `verdict`, as the component answers it.
fn verdict_json(v: &Verdict, breaker_changed: bool) -> Value {
    let (action, delay_ms, reconnect) = match v.act {
        Act::Retry { delay_ms, reconnect, .. } => ("retry", delay_ms, reconnect),
        Act::Replan => ("replan", 0, false),
        Act::CheckStatus => ("check-status", 0, false),
        Act::Succeed => ("succeed", 0, false),
        Act::Escalate => ("escalate", 0, false),
        Act::Poll { delay_ms, reconnect } => ("poll", delay_ms, reconnect),
    };
    json!({
        "action": action, "class": output(&v.class), "attempt": v.attempt, "delay-ms": delay_ms,
        "hint-ms": v.hint_ms, "rule-index": v.rule.index(), "has-note": v.has_note, "reconnect": reconnect, "cancel-task": v.cancel_task,
        "breaker-changed": breaker_changed,
    })
}
