//! What a live policy update costs in the Rust host (a benchmark, not a test):
//! the latency of `reload()` (read, integrity, compile, contract and import
//! checks, configuration, gate vectors, swap) for a configuration change and for a
//! new `.wasm`, and what a decision costs while reloads run back to back on
//! another thread, against the same decisions at rest, in the same run.
//!
//!     cargo bench -p agent-retry-harness --bench update

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use agent_retry_host::component::types::{FailureKind, Observation};
use agent_retry_host::{Admission, EmbeddedAccounts, EntropySource, HostServices, Integrity, LivePolicy, PolicySource, default_wasm_path};

const RELOADS: usize = 20;
const DECISIONS: u32 = 20_000;
const PER_RUN: u32 = 1_000;

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

/// ns per decision (begin-call and record-failure of a 503 with Retry-After) on
/// the policy `live` serves, a fresh instance per batch of runs as a host takes
/// `current()` per run.
fn decision_ns(live: &LivePolicy) -> f64 {
    let failure = Observation::new(FailureKind::HttpStatus(503), &[("retry-after".into(), "1".into())], "upstream unavailable");
    let mut spent = Duration::ZERO;
    for batch in 0..DECISIONS / PER_RUN {
        let loaded = live.current();
        let mut instance = loaded.component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(1))).unwrap();
        let policy = instance.load_policy(&loaded.config_json).unwrap().unwrap();
        let run = instance.start_run(&policy, &format!("bench-{batch}")).unwrap().unwrap();
        let started = Instant::now();
        for i in 0..PER_RUN {
            let Admission::Send(ticket) = instance.begin(&run, None, "lookup_order", None, None, 1_000).unwrap().unwrap() else { panic!("admitted") };
            std::hint::black_box(instance.record_failure(&run, ticket.call_id, 1, &failure, None, 1_000, Some(u64::from(i))).unwrap().unwrap());
        }
        spent += started.elapsed();
    }
    spent.as_nanos() as f64 / f64::from(DECISIONS)
}

fn main() {
    let dir = std::env::temp_dir().join(format!("agent-retry-update-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let wasm = std::fs::read(default_wasm_path()).expect("run `make wasm` first");
    let source =
        PolicySource { wasm: dir.join("policy.wasm"), config: dir.join("policy.json"), integrity: Integrity::Unchecked, vectors: None, gate_vectors: vec![] };
    std::fs::write(&source.wasm, &wasm).unwrap();
    let config = |n: u32| format!(r#"{{"max-steps-per-run": 1000000, "max-retries-per-run": 100000, "max-attempts-per-call": {}}}"#, 10 + n % 50);
    std::fs::write(&source.config, config(0)).unwrap();
    let live = Arc::new(LivePolicy::open(source.clone()).unwrap());

    // A configuration update: the serving .wasm is not compiled again.
    let config_updates: Vec<Duration> = (1..=RELOADS as u32)
        .map(|n| {
            std::fs::write(&source.config, config(n)).unwrap();
            let started = Instant::now();
            live.reload().unwrap();
            started.elapsed()
        })
        .collect();
    // A new .wasm: the same code with a different custom section, so a new digest.
    let wasm_updates: Vec<Duration> = (0..RELOADS)
        .map(|n| {
            let mut bytes = wasm.clone();
            let payload = format!("update-{n}");
            bytes.extend_from_slice(&[0, 1 + 1 + payload.len() as u8, 1, b'x']);
            bytes.extend_from_slice(payload.as_bytes());
            std::fs::write(&source.wasm, &bytes).unwrap();
            let started = Instant::now();
            live.reload().unwrap();
            started.elapsed()
        })
        .collect();

    let at_rest = decision_ns(&live);
    // New .wasm files back to back on another thread (each compiled), decisions measured meanwhile.
    let reloading = Arc::new(AtomicBool::new(true));
    let reloader = {
        let (live, reloading, wasm, path) = (Arc::clone(&live), Arc::clone(&reloading), wasm.clone(), source.wasm.clone());
        std::thread::spawn(move || {
            for n in 0..RELOADS {
                let mut bytes = wasm.clone();
                let payload = format!("during-{n}");
                bytes.extend_from_slice(&[0, 1 + 1 + payload.len() as u8, 1, b'x']);
                bytes.extend_from_slice(payload.as_bytes());
                std::fs::write(&path, &bytes).unwrap();
                live.reload().unwrap();
            }
            reloading.store(false, Ordering::Relaxed);
        })
    };
    let mut during = Vec::new();
    while reloading.load(Ordering::Relaxed) {
        during.push(decision_ns(&live));
    }
    reloader.join().unwrap();
    let reloads = RELOADS;
    let during = during.iter().sum::<f64>() / during.len().max(1) as f64;
    let at_rest_again = decision_ns(&live);
    let _ = std::fs::remove_dir_all(dir);

    println!("live update in the Rust host ({RELOADS} reloads each, median; {} bytes of .wasm)", wasm.len());
    println!("  configuration change (read, gate vectors, swap; no compile)    : {:>8.1} ms", median(config_updates).as_secs_f64() * 1e3);
    println!("  new .wasm            (read, compile, gate vectors, swap):       {:>8.1} ms", median(wasm_updates).as_secs_f64() * 1e3);
    println!("decision (begin-call + record-failure of a 503), {DECISIONS} per measure:");
    println!("  at rest:                              {at_rest:>8.0} ns");
    println!("  while reloading back to back ({reloads:>3} reloads on another thread): {during:>8.0} ns = {:.2}x at rest", during / at_rest);
    println!("  at rest again:                        {at_rest_again:>8.0} ns");
}
