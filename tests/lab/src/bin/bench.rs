//! `agent-retry-bench`: the figures only the lab crate can take (the component's
//! size, compile and precompiled-load time, instantiation, memory per instance
//! and per in-flight run, the lab and the simulation), each as a ratio against a
//! baseline measured in the same run where one exists; gathers the outputs of the
//! other benchmarks (`make bench` writes them to target/bench/*.txt) into one JSON
//! report, and prints a table. Figures, never assertions.
//!
//!     agent-retry-bench [--out target/bench/report.json] [--outputs target/bench]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use agent_retry_host::Admission;
use agent_retry_host::component::types::{FailureKind, Observation};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};
use agent_retry_lab::{faults::FaultMix, report};
use serde_json::json;

const SIZE_LIMIT: u64 = 112_000;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    statm.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()).unwrap_or(0) * 4096
}

fn services() -> HostServices {
    HostServices::new(Arc::new(EmbeddedAccounts::on_host_clock()), EntropySource::seeded(1))
}

fn main() -> anyhow::Result<()> {
    let mut out = PathBuf::from("target/bench/report.json");
    let mut outputs = PathBuf::from("target/bench");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--out" => out = args.next().ok_or_else(|| anyhow::anyhow!("--out needs a path"))?.into(),
            "--outputs" => outputs = args.next().ok_or_else(|| anyhow::anyhow!("--outputs needs a folder"))?.into(),
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    let wasm = default_wasm_path();
    let bytes = std::fs::read(&wasm)?;
    let size = bytes.len() as u64;

    // Compiling the component (cranelift) against loading it precompiled.
    let compile_ms = median(
        (0..3)
            .map(|_| {
                let t = Instant::now();
                let _ = PolicyComponent::from_bytes(&bytes).expect("the component loads");
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect(),
    );
    let mut config = wasmtime::Config::new();
    config.concurrency_support(false);
    config.consume_fuel(true);
    let engine = wasmtime::Engine::new(&config)?;
    let precompiled = wasmtime::component::Component::new(&engine, &bytes)?.serialize()?;
    let load_ms = median(
        (0..5)
            .map(|_| {
                let t = Instant::now();
                // SAFETY: the bytes were serialized just above by the same engine configuration.
                let _ = unsafe { wasmtime::component::Component::deserialize(&engine, &precompiled) }.expect("deserializes");
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect(),
    );

    // One decision (begin-call + record-failure of a 503), the baseline for instantiation.
    let component = PolicyComponent::from_bytes(&bytes)?;
    let mut instance = component.instantiate(services())?;
    let policy = instance.load_policy(r#"{"max-steps-per-run": 1000000, "max-retries-per-run": 100000}"#)?.map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let failure = Observation::new(FailureKind::HttpStatus(503), &[], "unavailable");
    let decision_us = median(
        (0..3)
            .map(|round| {
                let run = instance.start_run(&policy, &format!("bench-{round}")).unwrap().unwrap();
                let t = Instant::now();
                for _ in 0..2000 {
                    let Ok(Admission::Send(ticket)) = instance.begin(&run, None, "lookup_order", None, None, 1000).unwrap() else { panic!("not admitted") };
                    std::hint::black_box(instance.record_failure(&run, ticket.call_id, 1, &failure, None, 1000, Some(7)).unwrap().unwrap());
                }
                let us = t.elapsed().as_secs_f64() * 1e6 / 2000.0;
                instance.drop_run(run).unwrap();
                us
            })
            .collect(),
    );
    let instantiate_us = median(
        (0..3)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..100 {
                    std::hint::black_box(component.instantiate(services()).unwrap());
                }
                t.elapsed().as_secs_f64() * 1e6 / 100.0
            })
            .collect(),
    );

    // Memory: 200 live instances; 10,000 runs in flight in one instance (one call each).
    let before = rss_bytes();
    // Each with a policy loaded and one run begun: an untouched instance is a copy-on-write image.
    let instances: Vec<_> = (0..200)
        .map(|i| {
            let mut instance = component.instantiate(services()).unwrap();
            let policy = instance.load_policy("{}").unwrap().unwrap();
            let run = instance.start_run(&policy, &format!("CASE-{i}")).unwrap().unwrap();
            let _ = instance.begin_call(&run, None, "lookup_order", None, None, 1000).unwrap();
            (instance, policy, run)
        })
        .collect();
    let per_instance = rss_bytes().saturating_sub(before) / 200;
    drop(instances);
    let mut instance = component.instantiate(services())?;
    let policy = instance.load_policy("{}")?.map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let before = rss_bytes();
    let mut runs = Vec::new();
    for i in 0..10_000 {
        let run = instance.start_run(&policy, &format!("CASE-{i}"))?.map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let _ = instance.begin_call(&run, None, "lookup_order", None, None, 1000)?;
        runs.push(run);
    }
    let per_run = rss_bytes().saturating_sub(before) / 10_000;

    // The lab and the simulation, wall time.
    let t = Instant::now();
    let lab = report::lab(&component, &FaultMix::builtin(), "tests/lab/faults.json", 42)?;
    let lab_ms = t.elapsed().as_secs_f64() * 1000.0;
    let lab_decisions: u32 = lab.tables.iter().flat_map(|(_, rows)| rows.iter().map(|(_, t)| t.calls)).sum();
    let clients: Vec<u32> = (1..=10).map(|i| i * 10).collect();
    let t = Instant::now();
    let (_, sim) = report::contention(&component, &clients, 100, 12345)?;
    let sim_ms = t.elapsed().as_secs_f64() * 1000.0;

    let table = vec![
        ("component size", format!("{size} bytes"), format!("limit {SIZE_LIMIT}"), format!("{:.3}", size as f64 / SIZE_LIMIT as f64)),
        ("compile (cranelift)", format!("{compile_ms:.1} ms"), format!("precompiled load {load_ms:.2} ms"), format!("{:.0}x", compile_ms / load_ms)),
        ("instantiate", format!("{instantiate_us:.1} µs"), format!("one decision {decision_us:.2} µs"), format!("{:.0}x", instantiate_us / decision_us)),
        (
            "memory per instance (policy, one run)",
            format!("{} KiB", per_instance / 1024),
            "memory cap 64 MiB".into(),
            format!("{:.4}", per_instance as f64 / (64 << 20) as f64),
        ),
        ("memory per in-flight run", format!("{per_run} bytes"), String::new(), String::new()),
        (
            "the lab (2 mixes x 14 policies)",
            format!("{lab_ms:.0} ms"),
            format!("{lab_decisions} tool calls"),
            format!("{:.1} µs a call", lab_ms * 1000.0 / f64::from(lab_decisions)),
        ),
        ("the simulation (9 rows x 10 counts x 100)", format!("{sim_ms:.0} ms"), String::new(), String::new()),
    ];
    let mut gathered = serde_json::Map::new();
    let mut ratios: Vec<String> = Vec::new();
    for name in ["decision", "accounts", "hosts"] {
        if let Ok(text) = std::fs::read_to_string(outputs.join(format!("{name}.txt"))) {
            let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            // Their own ratio lines, as printed (each is against a baseline of the same run).
            for line in lines.iter().filter(|l| l.contains("ratio") || l.contains("x the")) {
                ratios.push(format!("{name}: {}", line.trim()));
            }
            gathered.insert(name.to_string(), json!(lines));
        }
    }
    let report = json!({
        "component": {"path": wasm.display().to_string(), "bytes": size, "limit-bytes": SIZE_LIMIT},
        "compile-ms": compile_ms, "precompiled-load-ms": load_ms, "compile-over-load": compile_ms / load_ms,
        "decision-us": decision_us, "instantiate-us": instantiate_us, "instantiate-over-decision": instantiate_us / decision_us,
        "memory-per-instance-bytes": per_instance, "memory-per-in-flight-run-bytes": per_run,
        "lab-ms": lab_ms, "lab-tool-calls": lab_decisions, "lab": lab.tables.iter().map(|(name, rows)| json!({"mix": name, "rows": rows.iter().map(|(p, t)| json!({"policy": p, "totals": t})).collect::<Vec<_>>()})).collect::<Vec<_>>(),
        "simulation-ms": sim_ms, "simulation": sim,
        "other-benchmarks": gathered,
    });
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&report)? + "\n")?;
    println!("{:<44} {:>16} {:>32} {:>12}", "benchmark", "figure", "baseline (same run)", "ratio");
    for (name, figure, baseline, ratio) in &table {
        println!("{name:<44} {figure:>16} {baseline:>32} {ratio:>12}");
    }
    for line in &ratios {
        println!("{line}");
    }
    println!("report: {}", out.display());
    Ok(())
}
