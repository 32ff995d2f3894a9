//! The fuzz targets' inputs through the component in wasmtime: every corpus
//! file and a seeded sample of mutations, as conformance steps, run against the
//! native core (`conformance::native::Native`) and the component
//! (`agent_retry_host::dynamic::DynamicPolicy`). No call may trap or fault, and
//! both must give the same answer at every step, and no call on a call's tank
//! may burn more than half of it. The typed API is called too
//! (`PolicyInstance`: from-json, effective-config, classify), for no
//! `PolicyFault` and the fuel each call burns.
//!
//! Needs the component (`make wasm`); `AGENT_RETRY_WASM` names another build.
//! `FUZZ_COMPONENT_MUTATIONS` sets the mutations per target (default below).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use agent_retry_fuzz::mutate::{Rng, mutate};
use agent_retry_fuzz::{FlatCase, HeadersCase, RunCase, TEXT_CONFIGS, ToolErrorCase, flat_case, run_case};
use agent_retry_host::dynamic::DynamicPolicy;
use agent_retry_host::steps::{StepState, run_step};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, PolicyInstance, default_wasm_path};
use agent_retry_policy::types::{Delivery, Failure, FailureKind, TransportError};
use conformance::native::Native;
use serde_json::{Value, json};

const DEFAULT_MUTATIONS: usize = 300;

/// A call must leave the sandbox's fuel budget 2x headroom (as the host's
/// sandbox test asks of the worst tool error).
const MAX_FUEL_PER_CALL: u64 = agent_retry_host::component::FUEL_PER_CALL / 2;

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../corpus").join(target);
    let mut names: Vec<_> = std::fs::read_dir(&dir).map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect()).unwrap_or_default();
    names.sort();
    names.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

/// Corpus files, then seeded mutations of them.
fn inputs(target: &str, mutations: usize) -> Vec<Vec<u8>> {
    let mut all = corpus(target);
    assert!(!all.is_empty(), "corpus/{target}/ is empty");
    let mut rng = Rng(0xC0_4D00 + target.len() as u64);
    for _ in 0..mutations {
        let base = all[rng.below(all.len())].clone();
        let other = all[rng.below(all.len())].clone();
        all.push(mutate(&base, &other, &mut rng, 16 * 1024));
    }
    all
}

/// The steps for one input of `target`.
fn steps(target: &str, data: &[u8]) -> Vec<Value> {
    let classify_all = |failure: &Failure, now_ms: u64| -> Vec<Value> {
        let failure = serde_json::to_value(failure).expect("a failure serializes");
        TEXT_CONFIGS
            .iter()
            .flat_map(|(_, config)| [json!({"op": "load-policy", "config-text": config}), json!({"op": "classify", "failure": failure, "now-ms": now_ms})])
            .collect()
    };
    let text = String::from_utf8_lossy(data).into_owned();
    match target {
        "headers" => {
            let case = HeadersCase::parse(data);
            classify_all(&case.failure, case.now_ms)
        }
        "tool_error" => {
            let case = ToolErrorCase::parse(data);
            classify_all(&case.failure, case.now_ms)
        }
        // The JSON reader is reached through from-json.
        "config" | "json" => vec![json!({"op": "load-policy", "config-text": text})],
        "run" => RunCase::decode(data).map(|case| run_case(&case).steps).unwrap_or_default(),
        // The host joins the headers into the text of lines the component splits.
        "flat" => FlatCase::decode(data).map(|case| flat_case(&case).steps).unwrap_or_default(),
        other => panic!("no target {other}"),
    }
}

/// Runs `steps` against both subjects; `Err` says where they part, which
/// faulted, or which call of the component burned more than `MAX_FUEL_PER_CALL`.
/// `Ok` is the most fuel one call burned (of those on a call's tank).
fn compare(component: &PolicyComponent, steps: &[Value]) -> Result<u64, String> {
    let mut native = Native::new();
    let mut wasm = DynamicPolicy::new(component)?;
    let (mut native_state, mut wasm_state) = (StepState::default(), StepState::default());
    for (i, step) in steps.iter().enumerate() {
        let expected = run_step(&mut native, step, &mut native_state).map_err(|e| format!("step {i}: the native core failed: {e}"))?;
        let got = run_step(&mut wasm, step, &mut wasm_state).map_err(|e| format!("step {i}: the component faulted: {e}"))?;
        if expected != got {
            let step_text: String = step.to_string().chars().take(600).collect();
            return Err(format!("step {i} {step_text}\n      native:    {expected}\n      component: {got}"));
        }
        let fuel = wasm.most_fuel_in_one_call();
        if fuel > MAX_FUEL_PER_CALL {
            return Err(format!("step {i}: a call burned {fuel} fuel (limit {MAX_FUEL_PER_CALL})"));
        }
    }
    Ok(wasm.most_fuel_in_one_call())
}

/// The typed API: from-json and effective-config, and classify with the
/// target's configurations; no `PolicyFault`, and the fuel of each call.
fn typed(instance: &mut PolicyInstance, target: &str, data: &[u8], max_fuel: &mut u64) -> Result<(), String> {
    let mut note_fuel = |instance: &PolicyInstance, what: &str| -> Result<(), String> {
        let fuel = instance.fuel_used_by_last_call();
        *max_fuel = (*max_fuel).max(fuel);
        if fuel > MAX_FUEL_PER_CALL { Err(format!("{what} burned {fuel} fuel (limit {MAX_FUEL_PER_CALL})")) } else { Ok(()) }
    };
    let fault = |what: &str, e: agent_retry_host::PolicyFault| format!("{what}: PolicyFault {e}");
    match target {
        "config" | "json" => {
            let text = String::from_utf8_lossy(data);
            let loaded = instance.load_policy(&text).map_err(|e| fault("from-json", e))?;
            note_fuel(instance, "from-json")?;
            if let Ok(policy) = loaded {
                instance.effective_config(&policy).map_err(|e| fault("effective-config", e))?;
                note_fuel(instance, "effective-config")?;
                instance.drop_policy(policy).map_err(|e| fault("drop", e))?;
            }
        }
        "headers" | "tool_error" => {
            let (failure, now_ms) = if target == "headers" {
                let case = HeadersCase::parse(data);
                (case.failure, case.now_ms)
            } else {
                let case = ToolErrorCase::parse(data);
                (case.failure, case.now_ms)
            };
            let failure = to_wit(&failure);
            for (_, config) in TEXT_CONFIGS {
                let policy = instance.load_policy(config).map_err(|e| fault("from-json", e))?.map_err(|e| format!("config refused: {e:?}"))?;
                instance.classify(&policy, &failure, now_ms).map_err(|e| fault("classify", e))?;
                note_fuel(instance, "classify")?;
                instance.drop_policy(policy).map_err(|e| fault("drop", e))?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// The failure as the contract's observation (headers as `name: value` lines, as every host sends them).
fn to_wit(failure: &Failure) -> agent_retry_host::component::types::Observation {
    use agent_retry_host::component::types as wit;
    let kind = match failure.kind {
        FailureKind::HttpStatus(s) => wit::FailureKind::HttpStatus(s),
        FailureKind::ProtocolError(c) => wit::FailureKind::ProtocolError(c),
        FailureKind::ToolError(s) => wit::FailureKind::ToolError(s),
        FailureKind::InputRequired => wit::FailureKind::InputRequired,
        FailureKind::Transport(t) => wit::FailureKind::Transport(match t {
            TransportError::Timeout => wit::TransportError::Timeout,
            TransportError::ConnectionReset => wit::TransportError::ConnectionReset,
            TransportError::ConnectionRefused => wit::TransportError::ConnectionRefused,
            TransportError::StreamClosed => wit::TransportError::StreamClosed,
            TransportError::Tls => wit::TransportError::Tls,
            TransportError::NameResolution => wit::TransportError::NameResolution,
            TransportError::Other => wit::TransportError::Other,
        }),
    };
    let delivery = match failure.delivery {
        Delivery::Unknown => wit::Delivery::Unknown,
        Delivery::NotSent => wit::Delivery::NotSent,
        Delivery::Sent => wit::Delivery::Sent,
        Delivery::AnswerStarted => wit::Delivery::AnswerStarted,
    };
    wit::Observation {
        structured_content: failure.structured_content.clone(),
        session_id_sent: failure.session_id_sent,
        ..wit::Observation::new(kind, &failure.headers, failure.body.clone()).delivered(delivery)
    }
}

#[test]
fn fuzz_inputs_through_the_component() {
    let mutations: usize = std::env::var("FUZZ_COMPONENT_MUTATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_MUTATIONS);
    let component = PolicyComponent::from_file(&default_wasm_path()).unwrap_or_else(|e| panic!("{e} (run `make wasm` first)"));
    let services = || HostServices::new(Arc::new(EmbeddedAccounts::on_host_clock()), EntropySource::seeded(0));
    let mut failures = Vec::new();
    for target in ["headers", "config", "json", "tool_error", "run", "flat"] {
        let started = Instant::now();
        let all = inputs(target, mutations);
        let mut instance = component.instantiate(services()).expect("instantiate");
        let mut max_fuel = 0;
        for (i, data) in all.iter().enumerate() {
            let steps = steps(target, data);
            match compare(&component, &steps) {
                Ok(fuel) => max_fuel = max_fuel.max(fuel),
                Err(e) => failures.push(format!("{target} input {i}: {e}")),
            }
            if instance.is_broken() {
                instance = component.instantiate(services()).expect("instantiate");
            }
            if let Err(e) = typed(&mut instance, target, data, &mut max_fuel) {
                failures.push(format!("{target} input {i} (typed API): {e}"));
            }
            if failures.len() > 20 {
                break;
            }
        }
        eprintln!("{target}: {} inputs through the component in {:.1} s; most fuel in one call: {max_fuel}", all.len(), started.elapsed().as_secs_f64());
    }
    assert!(failures.is_empty(), "{} inputs differ or fault:\n{}", failures.len(), failures.join("\n"));
}

/// A configuration within the documented 1 MiB limit must load inside the fuel
/// budget (README: an input within its limit cannot spend a call's fuel). An
/// object of about 1 MiB with many members (`corpus/json/many-members` grown)
/// ran out of a call's fuel: F5 (fuzz/README.md), fixed by the configuration's
/// own budget (`FUEL_PER_CONFIG_BYTE`).
#[test]
fn f5_a_configuration_within_the_size_limit_loads_inside_the_fuel_budget() {
    let component = PolicyComponent::from_file(&default_wasm_path()).unwrap_or_else(|e| panic!("{e} (run `make wasm` first)"));
    let mut instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::on_host_clock()), EntropySource::seeded(0))).unwrap();
    // `{"k0":0,"k1":1,...}` up to 16 bytes short of 1 MiB (1,048,556 bytes, 71,385 members).
    let mut text = String::from("{");
    for i in 0.. {
        let member = format!("\"k{i}\":{i}");
        if text.len() + member.len() + 2 > (1 << 20) - 16 {
            break;
        }
        if i > 0 {
            text.push(',');
        }
        text.push_str(&member);
    }
    text.push('}');
    assert!(text.len() <= 1 << 20, "{} bytes", text.len());
    let answer = instance.load_policy(&text);
    let fuel = instance.fuel_used_by_last_call();
    assert!(answer.is_ok(), "from-json of {} bytes faulted: {:?} (fuel {fuel})", text.len(), answer.err());
}
