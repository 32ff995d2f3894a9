//! What one decision costs in the Rust host (a benchmark, not a test): begin-call,
//! record-outcome of an HTTP 503 with a Retry-After header, and next-delay, through
//! the component in wasmtime, against the same calls on the native core (the
//! baseline, measured in the same run).
//!
//!     cargo bench -p agent-retry-host --bench decision

use std::sync::Arc;
use std::time::Instant;

use agent_retry_host::component::types::{CallRequest, Failure, FailureKind, Outcome};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};
use agent_retry_policy::account::NoAccountBudget;
use agent_retry_policy::config::Config;
use agent_retry_policy::run::Run;
use agent_retry_policy::{backoff, types as core};

const DECISIONS: u32 = 20_000;
/// Every run is replaced before its step budget runs out.
const PER_RUN: u32 = 1_000;
const CONFIG: &str = r#"{"max-steps-per-run": 1000000, "max-retries-per-run": 100000}"#;

fn component_ns() -> f64 {
    let component = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    let mut instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(1))).unwrap();
    let policy = instance.load_policy(CONFIG).unwrap().unwrap();
    let request = CallRequest { tool: "lookup_order".into(), idempotency_key: None, hints: None };
    let failure = Outcome::Failure(Failure {
        kind: FailureKind::HttpStatus(503),
        headers: vec![("retry-after".into(), "1".into())],
        body: "upstream unavailable".into(),
        structured_content: None,
    });
    let started = Instant::now();
    for batch in 0..DECISIONS / PER_RUN {
        let run = instance.start_run(&policy, &format!("bench-{batch}")).unwrap().unwrap();
        for i in 0..PER_RUN {
            let ticket = match instance.begin_call(&run, &request, 1_000).unwrap().unwrap() {
                agent_retry_host::component::types::Admission::Send(t) => t,
                other => panic!("{other:?}"),
            };
            std::hint::black_box(instance.record_outcome(&run, ticket.call_id, 1, &failure, 1_000, Some(u64::from(i))).unwrap().unwrap());
            std::hint::black_box(instance.next_delay(&policy, 2, Some(1000), Some(u64::from(i))).unwrap());
        }
        instance.drop_run(run).unwrap();
    }
    started.elapsed().as_nanos() as f64 / f64::from(DECISIONS)
}

fn native_ns() -> f64 {
    let config = Arc::new(Config::from_json(CONFIG).unwrap());
    let request = core::CallRequest { tool: "lookup_order".into(), idempotency_key: None, hints: None };
    let failure = core::Outcome::Failure(core::Failure {
        kind: core::FailureKind::HttpStatus(503),
        headers: vec![("retry-after".into(), "1".into())],
        body: "upstream unavailable".into(),
        structured_content: None,
    });
    let started = Instant::now();
    for batch in 0..DECISIONS / PER_RUN {
        let mut run = Run::new(Arc::clone(&config), &format!("bench-{batch}"));
        for i in 0..PER_RUN {
            let call_id = match run.begin_call(&request, 1_000, &mut NoAccountBudget).unwrap() {
                core::Admission::Send(t) => t.call_id,
                other => panic!("{other:?}"),
            };
            std::hint::black_box(run.record_outcome(call_id, 1, &failure, 1_000, u64::from(i), &mut NoAccountBudget).unwrap());
            std::hint::black_box(backoff::next_delay_ms(config.base_delay_ms, config.max_delay_ms, 2, Some(1000), u64::from(i)));
        }
    }
    started.elapsed().as_nanos() as f64 / f64::from(DECISIONS)
}

fn main() {
    // Warm up both once, then measure three rounds and report the median.
    let _ = (component_ns(), native_ns());
    let median = |f: fn() -> f64| {
        let mut v: Vec<f64> = (0..3).map(|_| f()).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        v[1]
    };
    let (wasm, native) = (median(component_ns), median(native_ns));
    println!("one decision (begin-call + record-outcome of a 503 with Retry-After + next-delay), median of 3 rounds of {DECISIONS}:");
    println!("  through the component in wasmtime 48   {:>8.2} µs", wasm / 1000.0);
    println!("  native core (baseline)                 {:>8.2} µs", native / 1000.0);
    println!("  ratio                                  {:>8.1}x", wasm / native);
}
