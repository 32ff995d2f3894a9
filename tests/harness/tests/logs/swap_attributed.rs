//! A swap under load, attributed from the log: workers run agent runs through
//! the MCP wrapper (against the demo server, every call a 503) while the
//! `.wasm` (two byte-different builds, in turn) and the configuration are
//! swapped twenty times. Each run takes `LivePolicy::current()` when it starts,
//! and the wrapper's attempt lines name its policy; from the captured lines
//! alone: every run's lines name exactly one generation, its identity is the
//! one `reload()` swapped in (so the build's digest), and the run's decisions
//! are that generation's configuration's (2 or 4 attempts, then an escalation).

use crate::capture::capture;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use agent_retry_demo_server::faults::{Fault, rule};
use agent_retry_demo_server::{DemoState, FaultScript, serve_http};
use agent_retry_host::mcp::{CallError, Metrics, RetryingToolCaller, RetryingToolCallerOptions, connect_http};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, Integrity, LivePolicy, PolicySource, default_wasm_path};
use serde_json::{Map, Value, json};

fn reads(attempts: u32) -> String {
    format!(r#"{{"default-effect": "read", "max-attempts-per-call": {attempts}, "base-delay-ms": 1, "max-delay-ms": 2}}"#)
}

/// The same component with a custom section appended: another digest, the same policy.
fn with_custom_section(wasm: &[u8], payload: &[u8]) -> Vec<u8> {
    let name = b"agent-retry-test";
    let mut body = vec![name.len() as u8];
    body.extend_from_slice(name);
    body.extend_from_slice(payload);
    assert!(body.len() < 128, "a one-byte LEB128 size");
    let mut out = wasm.to_vec();
    out.extend_from_slice(&[0, body.len() as u8]);
    out.extend_from_slice(&body);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_decision_under_swaps_of_the_wasm_and_the_configuration_is_attributed_to_one_generation_from_the_log() {
    let capture = capture();
    let captured = &capture.captured;

    let dir = std::env::temp_dir().join(format!("agent-retry-swap-attributed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let source =
        PolicySource { wasm: dir.join("policy.wasm"), config: dir.join("policy.json"), integrity: Integrity::Unchecked, vectors: None, gate_vectors: vec![] };
    let build_a = std::fs::read(default_wasm_path()).expect("run `make wasm` first");
    let build_b = with_custom_section(&build_a, b"build-b");
    std::fs::write(&source.wasm, &build_a).unwrap();
    std::fs::write(&source.config, reads(4)).unwrap();
    let live = Arc::new(LivePolicy::open(source.clone()).unwrap());
    let digest_a = live.current().identity.wasm_sha256.clone();

    let fault = Fault::Http { status: 503, headers: vec![], body: "scripted 503".into() };
    let server = serve_http("127.0.0.1:0".parse().unwrap(), DemoState::new(FaultScript::new(vec![rule("lookup_order", None, fault)]), None)).await.unwrap();
    let client = connect_http(&server.url).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4u64)
        .map(|w| {
            let (live, stop, peer) = (Arc::clone(&live), Arc::clone(&stop), client.peer().clone());
            tokio::spawn(async move {
                let mut runs = Vec::new();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    // A run takes the serving policy when it starts, and keeps it.
                    let loaded = live.current();
                    let instance = loaded.component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(w))).unwrap();
                    let options = RetryingToolCallerOptions { policy_identity: Some(loaded.identity.to_string()), ..Default::default() };
                    let run_id = format!("w{w}-{n}");
                    n += 1;
                    let mut caller = RetryingToolCaller::start(peer.clone(), instance, &loaded.config_json, &run_id, options, Arc::new(Metrics::new()))
                        .await
                        .unwrap_or_else(|e| panic!("{run_id}: {e:#}"));
                    match caller.call("lookup_order", json!({"order_id": "ORD-1"}).as_object().cloned().unwrap()).await {
                        Err(CallError::Escalated(_)) => {}
                        other => panic!("{run_id}: a persistent 503 escalates, got {other:?}"),
                    }
                    runs.push(run_id);
                }
                runs
            })
        })
        .collect();

    // generation -> the identity `reload()` swapped in, as the log prints it, and its build and budget.
    let mut swapped_in: BTreeMap<u64, (String, String, u64)> = BTreeMap::new();
    let first = live.current().identity.clone();
    swapped_in.insert(first.generation, (first.to_string(), digest_a.clone(), 4));
    let mut digest_b = String::new();
    for swap in 0..20 {
        let (wasm, attempts) = if swap % 2 == 0 { (build_b.clone(), 2) } else { (build_a.clone(), 4) };
        std::fs::write(&source.wasm, &wasm).unwrap();
        std::fs::write(&source.config, reads(attempts)).unwrap();
        let reloading = Arc::clone(&live);
        let identity = tokio::task::spawn_blocking(move || reloading.reload()).await.unwrap().unwrap();
        if swap % 2 == 0 {
            digest_b = identity.wasm_sha256.clone();
        }
        swapped_in.insert(identity.generation, (identity.to_string(), identity.wasm_sha256.clone(), u64::from(attempts)));
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut runs = Vec::new();
    for worker in workers {
        runs.extend(worker.await.expect("no worker failed"));
    }
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    assert_ne!(digest_a, digest_b, "two byte-different builds");

    // From the log alone: the attempt lines of each run.
    let text = captured.text();
    let mut by_run: BTreeMap<String, Vec<Map<String, Value>>> = BTreeMap::new();
    for line in text.lines() {
        let Ok(line) = serde_json::from_str::<Value>(line) else { continue };
        let Some(fields) = line.get("fields").and_then(Value::as_object) else { continue };
        if fields.get("event").and_then(Value::as_str) != Some("agent_retry.attempt") {
            continue;
        }
        let run = fields.get("run").and_then(Value::as_str).expect("every attempt line names its run").to_string();
        by_run.entry(run).or_default().push(fields.clone());
    }
    assert!(runs.len() >= 40, "{} runs", runs.len());
    let mut generations = BTreeSet::new();
    let mut builds = BTreeSet::new();
    for run in &runs {
        let lines = by_run.get(run).unwrap_or_else(|| panic!("{run} logged nothing"));
        let policies: BTreeSet<&str> = lines.iter().map(|l| l.get("policy").and_then(Value::as_str).expect("every line names its policy")).collect();
        assert_eq!(policies.len(), 1, "{run}'s lines name exactly one policy: {policies:?}");
        let policy = *policies.iter().next().unwrap();
        let generation: u64 = policy
            .strip_prefix("generation ")
            .and_then(|rest| rest.split(' ').next())
            .and_then(|g| g.parse().ok())
            .unwrap_or_else(|| panic!("{run}: the policy field names a generation: {policy}"));
        let (identity, digest, attempts) = swapped_in.get(&generation).unwrap_or_else(|| panic!("{run}: generation {generation} was never swapped in"));
        assert_eq!(policy, identity, "{run}: the line is the identity reload() swapped in for generation {generation}");
        assert!(policy.contains(&format!("wasm {}", &digest[..12])), "{run}: {policy} names the build's digest");
        // The tool call's decisions (the tools/list pseudo-call has no step): that generation's budget.
        let decisions: Vec<&Map<String, Value>> = lines.iter().filter(|l| l.get("step").is_some()).collect();
        let actions: Vec<&str> = decisions.iter().map(|l| l.get("action").and_then(Value::as_str).unwrap_or_default()).collect();
        let mut expected = vec!["retry"; *attempts as usize - 1];
        expected.push("escalate");
        assert_eq!(actions, expected, "{run} (generation {generation}, {attempts} attempts) decided with its own policy");
        assert_eq!(decisions.last().and_then(|l| l.get("escalation")), Some(&json!("call-attempts-spent")), "{run}");
        generations.insert(generation);
        builds.insert(digest.clone());
    }
    println!("{} runs, each attributed from the log, across {} generations and {} builds during 20 swaps", runs.len(), generations.len(), builds.len());
    assert!(generations.len() > 2, "the swaps were seen by the workers: {generations:?}");
    assert_eq!(builds.len(), 2, "both builds decided: {builds:?}");
}
