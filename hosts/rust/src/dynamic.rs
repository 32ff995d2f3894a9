//! The component called through wasmtime's dynamic API, every value in its
//! canonical JSON form: what the conformance runner and `agent-retry decide` use.

use std::sync::Arc;

use serde_json::Value;
use wasmtime::component::{ResourceAny, Val};

use crate::canonical::{to_json, to_val};
use crate::shared_state::EmbeddedSharedState;
use crate::steps::Subject;
use crate::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, PolicyInstance};

const INTERFACE: &str = crate::component::POLICY_INTERFACE;

pub struct DynamicPolicy {
    instance: PolicyInstance,
    policy: Option<ResourceAny>,
    run: Option<ResourceAny>,
    /// The size of the last configuration loaded (its effective-config gets the load's tank).
    config_bytes: usize,
    /// The most fuel one call on a call's tank burned (a load's tank is larger).
    most_call_fuel: u64,
    /// Whether a call failed inside the guest.
    broken: bool,
    /// The shared state the instance imports, on a clock that never moves:
    /// nothing expires within a case.
    shared: Arc<EmbeddedSharedState>,
}

impl DynamicPolicy {
    /// A fresh instance with its own embedded account budget.
    pub fn new(component: &PolicyComponent) -> Result<Self, String> {
        // Every report passes entropy, so the guest never draws its own;
        // a fixed seed keeps even that path reproducible.
        let shared = Arc::new(EmbeddedSharedState::with_clock(|| 0));
        let services = HostServices::new(Arc::new(EmbeddedAccounts::on_host_clock()), EntropySource::seeded(0)).with_shared_state(shared.clone());
        let instance = component.instantiate(services).map_err(|e| format!("instantiate: {e:#}"))?;
        Ok(DynamicPolicy { instance, policy: None, run: None, config_bytes: 0, most_call_fuel: 0, broken: false, shared })
    }

    /// Calls `name` in the policy interface. `leading` are resource arguments;
    /// `args` are JSON converted by the function's parameter types.
    fn call(&mut self, name: &str, leading: Vec<Val>, args: &[&Value]) -> Result<Val, String> {
        // A configuration's load runs on its own tank, as through the typed API.
        // A configuration's load and its effective-config (as long) run on the
        // load's own tank, as through the typed API.
        let config_bytes = match (name, args) {
            ("[static]policy.from-json", [Value::String(text)]) => Some(text.len()),
            ("[method]policy.effective-config", _) => Some(self.config_bytes),
            _ => None,
        };
        let (store, instance) = match config_bytes {
            Some(bytes) => {
                let fuel = self.instance.config_load_fuel(bytes);
                self.instance.raw_on(fuel)
            }
            None => self.instance.raw(),
        };
        let interface = instance.get_export_index(&mut *store, None, INTERFACE).ok_or("no policy interface")?;
        let index = instance.get_export_index(&mut *store, Some(&interface), name).ok_or_else(|| format!("no export {name}"))?;
        let func = instance.get_func(&mut *store, index).ok_or_else(|| format!("{name} is not a function"))?;
        let ty = func.ty(&*store);
        let mut params = leading;
        let skip = params.len();
        for ((param, ty), json) in ty.params().skip(skip).zip(args) {
            params.push(to_val(json, &ty).map_err(|e| format!("{name}: {param}: {e}"))?);
        }
        let mut results = vec![Val::Bool(false); ty.results().len()];
        // Named as the typed fault names it, so that a refusal says why.
        let called = func.call(&mut *store, &params, &mut results);
        if let Err(e) = called {
            // A call that failed inside the guest leaves the instance unusable.
            self.broken = true;
            return Err(format!("{name}: {}", self.instance.raw_fault(&e)));
        }
        if config_bytes.is_none() {
            self.most_call_fuel = self.most_call_fuel.max(self.instance.fuel_used_by_last_call());
        }
        results.pop().ok_or_else(|| format!("{name} returned nothing"))
    }

    /// Whether a call failed inside the guest (a trap, fuel, memory): the
    /// instance must not be entered again.
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// The most fuel any one call burned so far, of those on a call's tank
    /// (every call but `from-json` and `effective-config`).
    pub fn most_fuel_in_one_call(&self) -> u64 {
        self.most_call_fuel
    }

    fn policy(&self) -> Result<Val, String> {
        self.policy.map(Val::Resource).ok_or_else(|| "no policy loaded".into())
    }

    fn run(&self) -> Result<Val, String> {
        self.run.map(Val::Resource).ok_or_else(|| "no run".into())
    }
}

impl Subject for DynamicPolicy {
    fn load_policy(&mut self, config_text: &str) -> Result<Value, String> {
        self.config_bytes = config_text.len();
        let text = Value::from(config_text);
        match self.call("[static]policy.from-json", vec![], &[&text])? {
            Val::Result(Ok(Some(policy))) => {
                let Val::Resource(policy) = *policy else { return Err("from-json: not a resource".into()) };
                let effective = self.call("[method]policy.effective-config", vec![Val::Resource(policy)], &[])?;
                let Val::String(effective) = effective else { return Err("effective-config: not a string".into()) };
                self.policy = Some(policy);
                let effective: Value = serde_json::from_str(&effective).map_err(|e| format!("effective config: {e}"))?;
                Ok(serde_json::json!({ "ok": effective }))
            }
            other => Ok(to_json(&other)),
        }
    }

    fn classify(&mut self, observation: &Value, now_ms: u64) -> Result<Value, String> {
        let policy = self.policy()?;
        let result = self.call("[method]policy.classify", vec![policy], &[observation, &Value::from(now_ms)])?;
        Ok(to_json(&result))
    }

    fn read_probe_answer(&mut self, http_status: Option<u16>, json_rpc_code: Option<i32>) -> Result<Value, String> {
        let status = http_status.map_or(Value::Null, Value::from);
        let code = json_rpc_code.map_or(Value::Null, Value::from);
        Ok(to_json(&self.call("read-probe-answer", vec![], &[&status, &code])?))
    }

    fn next_delay(&mut self, retry: u32, hint_ms: Option<u64>, entropy: u64) -> Result<Value, String> {
        let policy = self.policy()?;
        let hint = hint_ms.map_or(Value::Null, Value::from);
        let result = self.call("[method]policy.next-delay", vec![policy], &[&Value::from(retry), &hint, &Value::from(entropy)])?;
        Ok(to_json(&result))
    }

    fn derive_idempotency_key(&mut self, run_id: &str, action_id: &str) -> Result<Value, String> {
        let result = self.call("derive-idempotency-key", vec![], &[&Value::from(run_id), &Value::from(action_id)])?;
        Ok(to_json(&result))
    }

    fn start_run(&mut self, run_id: &str) -> Result<Value, String> {
        let policy = self.policy()?;
        match self.call("[method]policy.start-run", vec![policy], &[&Value::from(run_id)])? {
            Val::Result(Ok(Some(run))) => {
                let Val::Resource(run) = *run else { return Err("start-run: not a resource".into()) };
                self.run = Some(run);
                Ok(serde_json::json!({ "ok": null }))
            }
            other => Ok(to_json(&other)),
        }
    }

    fn report(&mut self) -> Result<Value, String> {
        let run = self.run()?;
        Ok(to_json(&self.call("[method]run.report", vec![run], &[])?))
    }

    fn effects(&mut self, start: u32, max_count: u32) -> Result<Value, String> {
        let run = self.run()?;
        Ok(to_json(&self.call("[method]run.effects", vec![run], &[&Value::from(start), &Value::from(max_count)])?))
    }

    fn rule_names(&mut self) -> Result<Value, String> {
        Ok(to_json(&self.call("rule-names", vec![], &[])?))
    }

    fn begin_call(&mut self, server: &Value, tool: &Value, idempotency_key: &Value, hints: &Value, now_ms: u64) -> Result<Value, String> {
        let run = self.run()?;
        Ok(to_json(&self.call("[method]run.begin-call", vec![run], &[server, tool, idempotency_key, hints, &Value::from(now_ms)])?))
    }

    fn take_breaker_changes(&mut self) -> Result<Value, String> {
        let run = self.run()?;
        Ok(to_json(&self.call("[method]run.take-breaker-changes", vec![run], &[])?))
    }

    fn put_shared_state(&mut self, key: &str, value: &str) -> Result<(), String> {
        self.shared.put(key, value);
        Ok(())
    }

    fn shared_state(&mut self, key: &str) -> Result<Value, String> {
        Ok(self.shared.get(key).map_or(Value::Null, Value::from))
    }

    fn record_success(&mut self, call_id: u32, attempt: u32, now_ms: u64) -> Result<Value, String> {
        let run = self.run()?;
        let args = [&Value::from(call_id), &Value::from(attempt), &Value::from(now_ms)];
        Ok(to_json(&self.call("[method]run.record-success", vec![run], &args)?))
    }

    fn record_empty_result(&mut self, call_id: u32, attempt: u32, detail: &str, now_ms: u64) -> Result<Value, String> {
        let run = self.run()?;
        let args = [&Value::from(call_id), &Value::from(attempt), &Value::from(detail), &Value::from(now_ms)];
        Ok(to_json(&self.call("[method]run.record-empty-result", vec![run], &args)?))
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
        let run = self.run()?;
        let time_left = time_left_ms.map_or(Value::Null, Value::from);
        let args = [&Value::from(call_id), &Value::from(attempt), observation, &time_left, &Value::from(now_ms), &Value::from(entropy)];
        Ok(to_json(&self.call("[method]run.record-failure", vec![run], &args)?))
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
        let run = self.run()?;
        let time_left = time_left_ms.map_or(Value::Null, Value::from);
        let args = [&Value::from(call_id), &Value::from(attempt), result, &time_left, &Value::from(now_ms), &Value::from(entropy)];
        Ok(to_json(&self.call("[method]run.record-status-check", vec![run], &args)?))
    }

    fn record_task_status(&mut self, call_id: u32, attempt: u32, task: &Value, time_left_ms: Option<u64>, now_ms: u64, entropy: u64) -> Result<Value, String> {
        let run = self.run()?;
        let time_left = time_left_ms.map_or(Value::Null, Value::from);
        let args = [&Value::from(call_id), &Value::from(attempt), task, &time_left, &Value::from(now_ms), &Value::from(entropy)];
        Ok(to_json(&self.call("[method]run.record-task-status", vec![run], &args)?))
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
        let run = self.run()?;
        let time_left = time_left_ms.map_or(Value::Null, Value::from);
        let args = [&Value::from(call_id), &Value::from(attempt), observation, &time_left, &Value::from(now_ms), &Value::from(entropy)];
        Ok(to_json(&self.call("[method]run.record-poll-failure", vec![run], &args)?))
    }

    fn abandon_call(&mut self, call_id: u32, attempt: u32, sent: bool, why: &str) -> Result<Value, String> {
        let run = self.run()?;
        let args = [&Value::from(call_id), &Value::from(attempt), &Value::from(sent), &Value::from(why)];
        Ok(to_json(&self.call("[method]run.abandon-call", vec![run], &args)?))
    }

    fn last_decision(&mut self, call_id: u32) -> Result<Value, String> {
        let run = self.run()?;
        Ok(to_json(&self.call("[method]run.last-decision", vec![run], &[&Value::from(call_id)])?))
    }

    fn escalation(&mut self) -> Result<Value, String> {
        let run = self.run()?;
        Ok(to_json(&self.call("[method]run.escalation", vec![run], &[])?))
    }

    fn snapshot(&mut self, arguments_json: Option<&str>, now_ms: u64) -> Result<Value, String> {
        let run = self.run()?;
        let arguments = arguments_json.map_or(Value::Null, Value::from);
        Ok(to_json(&self.call("[method]run.snapshot", vec![run], &[&arguments, &Value::from(now_ms)])?))
    }

    fn resume_run(&mut self, snapshot: &str, answer: &Value, now_ms: u64) -> Result<Value, String> {
        let policy = self.policy()?;
        match self.call("[method]policy.resume-run", vec![policy], &[&Value::from(snapshot), answer, &Value::from(now_ms)])? {
            Val::Result(Ok(Some(run))) => {
                let Val::Resource(run) = *run else { return Err("resume-run: not a resource".into()) };
                self.run = Some(run);
                let call = self.call("[method]run.resumed-call", vec![Val::Resource(run)], &[])?;
                Ok(serde_json::json!({ "ok": to_json(&call) }))
            }
            other => Ok(to_json(&other)),
        }
    }
}
