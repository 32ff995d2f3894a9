//! Live policy updates in the Rust host: configuration and `.wasm` updates take
//! effect for new runs without a restart; a bad, foreign or tampered update is
//! refused and the last good policy keeps serving; rollback; a swap under load.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use agent_retry_host::component::types::{ActionKind, FailureKind, Observation};
use agent_retry_host::component::{PolicyInstance, RunHandle};
use agent_retry_host::live::manifest_path;
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, Integrity, LivePolicy, PolicySource, UpdateError, default_wasm_path, sign_publication};
use ed25519_dalek::{Signer, SigningKey};
use sha2::{Digest, Sha256};

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A folder with the component and a configuration, as an operator deploys them.
fn deployed(name: &str, config: &str) -> (Dir, PolicySource) {
    let dir = std::env::temp_dir().join(format!("agent-retry-live-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(default_wasm_path(), dir.join("policy.wasm")).expect("run `make wasm` first");
    std::fs::write(dir.join("policy.json"), config).unwrap();
    let source =
        PolicySource { wasm: dir.join("policy.wasm"), config: dir.join("policy.json"), integrity: Integrity::Unchecked, vectors: None, gate_vectors: vec![] };
    (Dir(dir), source)
}

/// A 503 as the wrapper observes it.
fn http_503() -> Observation {
    Observation::new(FailureKind::HttpStatus(503), &[], "")
}

/// Begins a read of `lookup_order` in `run`: its call id.
fn begin_read(instance: &mut PolicyInstance, run: &RunHandle) -> u32 {
    let start = instance.begin_call(run, None, "lookup_order", None, None, 1).unwrap().unwrap();
    assert!(start.admitted);
    start.call_id
}

/// Reports 503s from `attempt` on until the policy stops retrying: the last attempt made and the last action.
fn fail_503_until_done(instance: &mut PolicyInstance, run: &RunHandle, call_id: u32, mut attempt: u32) -> (u32, ActionKind) {
    loop {
        let verdict = instance.record_failure(run, call_id, attempt, &http_503(), None, 1, Some(1)).unwrap().unwrap();
        if verdict.action != ActionKind::Retry {
            return (attempt, verdict.action);
        }
        attempt = verdict.attempt + 1;
    }
}

/// Attempts a read makes against a persistent 503 under `live`'s current policy.
fn attempts_against_a_persistent_503(live: &LivePolicy) -> u32 {
    let loaded = live.current();
    let mut instance = loaded.component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(3))).unwrap();
    let policy = instance.load_policy(&loaded.config_json).unwrap().unwrap();
    let run = instance.start_run(&policy, "probe").unwrap().unwrap();
    let call_id = begin_read(&mut instance, &run);
    fail_503_until_done(&mut instance, &run, call_id, 1).0
}

const READS: &str = r#"{"default-effect": "read", "max-attempts-per-call": 4}"#;

#[test]
fn a_configuration_update_changes_a_budget_for_new_runs_without_a_restart() {
    let (_dir, source) = deployed("config", READS);
    let live = LivePolicy::open(source.clone()).unwrap();
    let before = live.current(); // a run in flight keeps this
    assert_eq!(attempts_against_a_persistent_503(&live), 4);
    // A run started before the update, one attempt made and a retry decided.
    let mut in_flight = before.component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(5))).unwrap();
    let policy = in_flight.load_policy(&before.config_json).unwrap().unwrap();
    let run = in_flight.start_run(&policy, "in-flight").unwrap().unwrap();
    let call_id = begin_read(&mut in_flight, &run);
    let verdict = in_flight.record_failure(&run, call_id, 1, &http_503(), None, 1, Some(1)).unwrap().unwrap();
    assert_eq!(verdict.action, ActionKind::Retry);

    std::fs::write(&source.config, r#"{"default-effect": "read", "max-attempts-per-call": 2}"#).unwrap();
    let identity = live.reload().unwrap();
    assert_eq!(identity.generation, 2);
    assert_ne!(identity.config_sha256, before.identity.config_sha256);
    assert_eq!(attempts_against_a_persistent_503(&live), 2, "new runs get the new budget");
    assert!(before.config_json.contains("\"max-attempts-per-call\": 4"), "the run in flight keeps its policy");
    // After the swap, the run in flight decides on: still the old budget of 4 attempts, not the new 2.
    let (attempts, last) = fail_503_until_done(&mut in_flight, &run, call_id, verdict.attempt + 1);
    assert_eq!(last, ActionKind::Escalate);
    assert_eq!(attempts, 4, "the run in flight finished on the policy it started with");
}

/// The gate loads a candidate and reads its effective-config, both linear in the
/// configuration: a host aggregating MCP servers can ship 10,000 tools (the
/// effective-config ran out of a call's fuel, so the gate refused it).
#[test]
fn a_configuration_of_ten_thousand_tools_passes_the_gate() {
    let (_dir, source) = deployed("many-tools", READS);
    let live = LivePolicy::open(source.clone()).unwrap();
    let tools: Vec<String> = (0..10_000).map(|i| format!(r#""mcp__github__create_pull_request_review_{i:05}": {{"effect": "write"}}"#)).collect();
    std::fs::write(&source.config, format!(r#"{{"default-effect": "read", "max-attempts-per-call": 4, "tools": {{{}}}}}"#, tools.join(","))).unwrap();
    let identity = live.reload().unwrap_or_else(|e| panic!("refused: {e}"));
    assert_eq!(identity.generation, 2);
    assert_eq!(attempts_against_a_persistent_503(&live), 4, "the new policy decides");
}

#[test]
fn a_bad_configuration_is_refused_and_the_last_good_one_keeps_serving() {
    let (_dir, source) = deployed("bad-config", READS);
    let live = LivePolicy::open(source.clone()).unwrap();
    std::fs::write(&source.config, r#"{"max-attempts-per-call": 0}"#).unwrap();
    let err = live.reload().unwrap_err();
    assert!(matches!(&err, UpdateError::Config(why) if why.contains("max-attempts-per-call")), "{err}");
    assert_eq!(live.current().identity.generation, 1);
    assert!(live.last_refusal().unwrap().contains("max-attempts-per-call"));
    assert_eq!(attempts_against_a_persistent_503(&live), 4, "the old policy still decides");
}

#[test]
fn a_broken_or_foreign_component_is_refused_and_rollback_returns_to_the_previous_policy() {
    let (_dir, source) = deployed("wasm", READS);
    let live = LivePolicy::open(source.clone()).unwrap();
    let good = std::fs::read(&source.wasm).unwrap();

    std::fs::write(&source.wasm, b"\0asm not really").unwrap();
    assert!(matches!(live.reload().unwrap_err(), UpdateError::Load(_)));

    // The same component, speaking another major contract version.
    let foreign = rename_all(&good, b"agent-retry:policy/policy@0.9.0", b"agent-retry:policy/policy@1.0.0");
    std::fs::write(&source.wasm, &foreign).unwrap();
    let err = live.reload().unwrap_err().to_string();
    assert!(err.contains("agent-retry:policy@1.0.0") && err.contains("agent-retry:policy@0.9.0"), "{err}");
    // And the contract before this one, naming both versions.
    let previous = rename_all(&good, b"agent-retry:policy/policy@0.9.0", b"agent-retry:policy/policy@0.8.0");
    std::fs::write(&source.wasm, &previous).unwrap();
    let err = live.reload().unwrap_err().to_string();
    assert!(err.contains("agent-retry:policy@0.8.0") && err.contains("agent-retry:policy@0.9.0"), "{err}");
    assert_eq!(live.current().identity.generation, 1, "nothing was swapped in");

    std::fs::write(&source.wasm, &good).unwrap();
    std::fs::write(&source.config, r#"{"default-effect": "read", "max-attempts-per-call": 3}"#).unwrap();
    live.reload().unwrap();
    assert_eq!(attempts_against_a_persistent_503(&live), 3);
    let back = live.rollback().unwrap();
    assert_eq!(back.generation, 1);
    assert_eq!(attempts_against_a_persistent_503(&live), 4);
    // The next update after a rollback gets a number no policy had before.
    assert_eq!(live.reload().unwrap().generation, 3);
}

#[test]
fn a_pinned_digest_refuses_a_tampered_component() {
    let (_dir, mut source) = deployed("pinned", READS);
    let bytes = std::fs::read(&source.wasm).unwrap();
    let digest: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    source.integrity = Integrity::PinnedSha256(digest.clone());
    let live = LivePolicy::open(source.clone()).unwrap();
    assert_eq!(live.current().identity.wasm_sha256, digest);
    // One byte changed in the component's name section or code: the digest no longer matches.
    let mut tampered = bytes.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    std::fs::write(&source.wasm, &tampered).unwrap();
    let err = live.reload().unwrap_err();
    assert!(matches!(&err, UpdateError::Integrity(why) if why.contains(&digest)), "{err}");
}

/// Issue 24, row 2, for files: under a key the signed manifest
/// (`<wasm>.manifest`) covers the `.wasm`, the configuration and the vectors;
/// before, a signature covered the `.wasm` alone, so a configuration edited
/// after signing was taken.
#[test]
fn with_a_key_configured_only_a_signed_publication_is_accepted() {
    let (_dir, mut source) = deployed("signed", READS);
    let seed = [7u8; 32];
    source.integrity = Integrity::Ed25519(SigningKey::from_bytes(&seed).verifying_key().to_bytes());
    let manifest = manifest_path(&source.wasm);
    let bytes = std::fs::read(&source.wasm).unwrap();

    // Unsigned: refused at start; a signature over the .wasm alone (before 0.7) is named and refused.
    let err = LivePolicy::open(source.clone()).err().expect("an unsigned publication is refused");
    assert!(err.to_string().contains("unsigned: no signed manifest at"), "{err}");
    std::fs::write(sig_path(&source.wasm), SigningKey::from_bytes(&seed).sign(&bytes).to_bytes()).unwrap();
    let err = LivePolicy::open(source.clone()).err().expect("a signature over the .wasm alone is refused");
    assert!(err.to_string().contains("(before 0.7) is not accepted: sign the whole publication"), "{err}");

    // Signed for files: accepted.
    std::fs::write(&manifest, sign_publication(&seed, &bytes, READS.as_bytes(), None, None)).unwrap();
    let live = LivePolicy::open(source.clone()).unwrap();
    assert_eq!(attempts_against_a_persistent_503(&live), 4);

    // The configuration edited after signing (4 attempts became 8): refused, the signed one keeps serving.
    let eight = r#"{"default-effect": "read", "max-attempts-per-call": 8}"#;
    std::fs::write(&source.config, eight).unwrap();
    let err = live.reload().unwrap_err();
    assert!(matches!(&err, UpdateError::Integrity(why) if why.contains("config-sha256") && why.contains("changed after signing")), "{err}");
    assert_eq!((live.current().identity.generation, attempts_against_a_persistent_503(&live)), (1, 4));

    // Signed by another key: refused.
    std::fs::write(&manifest, sign_publication(&[9; 32], &bytes, eight.as_bytes(), None, None)).unwrap();
    let err = live.reload().unwrap_err();
    assert!(matches!(&err, UpdateError::Integrity(why) if why.contains("does not verify")), "{err}");

    // Tampered after signing: one byte of the .wasm changed (its last section's, so that it would still load).
    std::fs::write(&manifest, sign_publication(&seed, &bytes, eight.as_bytes(), None, None)).unwrap();
    let mut tampered = bytes.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    std::fs::write(&source.wasm, &tampered).unwrap();
    let err = live.reload().unwrap_err();
    assert!(matches!(&err, UpdateError::Integrity(why) if why.contains("wasm-sha256") && why.contains("changed after signing")), "{err}");

    // Vectors configured but not signed: refused as added after signing.
    std::fs::write(&source.wasm, &bytes).unwrap();
    let vectors = source.wasm.with_file_name("vectors.json");
    std::fs::write(&vectors, r#"{"description": "shipped", "cases": []}"#).unwrap();
    let mut with_vectors = source.clone();
    with_vectors.vectors = Some(vectors.clone());
    let err = LivePolicy::open(with_vectors.clone()).err().expect("unsigned vectors are refused");
    assert!(err.to_string().contains("added after signing"), "{err}");
    assert_eq!(live.metrics().refused.load(Ordering::Relaxed), 3);

    // The configuration re-signed: accepted (the edited budget serves now).
    assert_eq!(live.reload().unwrap().generation, 2);
    assert_eq!(attempts_against_a_persistent_503(&live), 8);
}

#[test]
fn the_watcher_picks_up_a_changed_configuration() {
    let (_dir, source) = deployed("watch", READS);
    let live = Arc::new(LivePolicy::open(source.clone()).unwrap());
    let _watcher = live.watch(Duration::from_millis(20));
    std::thread::sleep(Duration::from_millis(50));
    std::fs::write(&source.config, r#"{"default-effect": "read", "max-attempts-per-call": 2}"#).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while live.current().identity.generation == 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(live.current().identity.generation, 2);
    assert_eq!(attempts_against_a_persistent_503(&live), 2);
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

fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Four workers decide without pause while the policy is swapped back and forth
/// twenty times: no decision fails, and each is made wholly by one generation.
#[test]
fn decisions_never_fail_while_the_policy_is_swapped_under_load() {
    let (_dir, source) = deployed("load", READS);
    // Two byte-different builds of the component, swapped in turn with the configuration.
    let build_a = std::fs::read(&source.wasm).unwrap();
    let build_b = with_custom_section(&build_a, b"build-b");
    let (digest_a, digest_b) = (hex_sha256(&build_a), hex_sha256(&build_b));
    let live = Arc::new(LivePolicy::open(source.clone()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (live, stop) = (Arc::clone(&live), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut made: Vec<(u64, String, u32)> = Vec::new(); // (generation, .wasm digest, attempts allowed)
                while !stop.load(Ordering::Relaxed) {
                    let loaded = live.current();
                    let mut instance = loaded.component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(w))).unwrap();
                    let policy = instance.load_policy(&loaded.config_json).unwrap().unwrap();
                    for run_number in 0..20 {
                        let run = instance.start_run(&policy, &format!("w{w}-{run_number}")).unwrap().unwrap();
                        let call_id = begin_read(&mut instance, &run);
                        let (attempts, _) = fail_503_until_done(&mut instance, &run, call_id, 1);
                        made.push((loaded.identity.generation, loaded.identity.wasm_sha256.clone(), attempts));
                        instance.drop_run(run).unwrap();
                    }
                }
                made
            })
        })
        .collect();
    let mut swapped_in = std::collections::BTreeMap::new();
    for swap in 0..20 {
        let (wasm, attempts) = if swap % 2 == 0 { (&build_b, 2) } else { (&build_a, 4) };
        std::fs::write(&source.wasm, wasm).unwrap();
        std::fs::write(&source.config, format!(r#"{{"default-effect": "read", "max-attempts-per-call": {attempts}}}"#)).unwrap();
        let identity = live.reload().unwrap();
        swapped_in.insert(identity.generation, identity.wasm_sha256);
        std::thread::sleep(Duration::from_millis(15));
    }
    stop.store(true, Ordering::Relaxed);
    let made: Vec<(u64, String, u32)> = workers.into_iter().flat_map(|w| w.join().expect("no worker failed")).collect();
    assert!(made.len() >= 80, "{} decisions", made.len());
    // Generation 1 is build A allowing 4 attempts; generation g >= 2 was written by
    // swap g - 2: build B and 2 attempts when g is even, build A and 4 when odd.
    for (generation, wasm_sha256, attempts) in &made {
        let (expected_digest, expected_attempts) = if *generation == 1 || generation % 2 == 1 { (&digest_a, 4) } else { (&digest_b, 2) };
        assert_eq!(*attempts, expected_attempts, "a decision of generation {generation} mixed policies");
        assert_eq!(wasm_sha256, expected_digest, "generation {generation} runs the build it was swapped in with");
        if *generation > 1 {
            assert_eq!(swapped_in.get(generation), Some(expected_digest), "reload() said which build generation {generation} is");
        }
    }
    let generations: std::collections::BTreeSet<u64> = made.iter().map(|(g, ..)| *g).collect();
    let builds: std::collections::BTreeSet<&str> = made.iter().map(|(_, d, _)| d.as_str()).collect();
    println!("{} decisions across {} generations during 20 swaps of the .wasm and the configuration", made.len(), generations.len());
    assert!(generations.len() > 2, "the swaps were seen by the workers: {generations:?}");
    assert_eq!(builds.len(), 2, "both builds decided");
}

fn sig_path(wasm: &Path) -> PathBuf {
    let mut path = wasm.as_os_str().to_owned();
    path.push(".sig");
    PathBuf::from(path)
}

fn rename_all(bytes: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut out = bytes.to_vec();
    for at in 0..bytes.len().saturating_sub(from.len()) {
        if &bytes[at..at + from.len()] == from {
            out[at..at + from.len()].copy_from_slice(to);
        }
    }
    out
}

/// Every hostile component of tests/hostile/build.mjs offered as an update: the
/// gate refuses it (at load, or because a gate vector faults), saying why, and
/// the last good policy keeps serving.
#[test]
fn every_hostile_component_is_refused_by_the_gate_and_the_last_good_policy_serves() {
    let hostile_dir = default_wasm_path().parent().and_then(|p| p.parent()).expect("target/").join("hostile");
    let (_dir, source) = deployed("hostile", READS);
    let live = LivePolicy::open(source.clone()).unwrap();
    let good = live.current().identity.clone();
    let expected: [(&str, &str); 10] = [
        ("endless-loop", "out of fuel"),
        ("memory-bomb", "memory cap"),
        ("trap", "trapped"),
        ("enum-out-of-range", "boundary"),
        ("invalid-utf8", "boundary"),
        ("pointer-out-of-bounds", "boundary"),
        ("extra-import", "wasi:filesystem"),
        ("extra-import-sockets", "wasi:sockets"),
        ("wrong-world", "another world"),
        ("other-major", "this host speaks agent-retry:policy@0.9.0"),
    ];
    for (name, why) in expected {
        let bytes = std::fs::read(hostile_dir.join(format!("{name}.wasm"))).unwrap_or_else(|e| panic!("{name}: {e} (run `make hostile`)"));
        std::fs::write(&source.wasm, bytes).unwrap();
        let err = live.reload().expect_err(name);
        assert!(matches!(err, UpdateError::Load(_) | UpdateError::Gate(_)), "{name}: {err}");
        assert!(err.to_string().contains(why), "{name}: {err}");
        assert_eq!(live.last_refusal().as_deref(), Some(err.to_string().as_str()));
        assert_eq!(live.current().identity, good, "{name}: the last good policy keeps serving");
        assert_eq!(attempts_against_a_persistent_503(&live), 4);
    }
}

/// The vectors an update ships with run in the gate: a case without its own
/// configuration runs in the update's, so the same vectors pass with 4 attempts
/// and refuse an update that allows 2; malformed vectors are refused too.
#[test]
fn an_update_is_refused_when_the_vectors_it_ships_with_fail() {
    let (dir, mut source) = deployed("vectors", READS);
    let vectors_path = dir.0.join("policy.vectors.json");
    let vectors = serde_json::json!({"description": "what this deployment relies on", "cases": [{
    "description": "a read is tried four times against a persistent 503",
    "steps": [
        {"op": "begin-call", "call": {"tool": "lookup_order"}},
        {"op": "record-outcome", "call-id": 1, "outcome": {"failure": {"kind": {"http-status": 503}}}, "expect": {"ok": {"action": {"retry": {"attempt": 2}}}}},
        {"op": "record-outcome", "call-id": 1, "outcome": {"failure": {"kind": {"http-status": 503}}}, "expect": {"ok": {"action": {"retry": {"attempt": 3}}}}},
        {"op": "record-outcome", "call-id": 1, "outcome": {"failure": {"kind": {"http-status": 503}}}, "expect": {"ok": {"action": {"retry": {"attempt": 4}}}}},
        {"op": "record-outcome", "call-id": 1, "outcome": {"failure": {"kind": {"http-status": 503}}}, "expect": {"ok": {"action": {"escalate": {"reason": "call-attempts-spent"}}}}}
    ]}]});
    std::fs::write(&vectors_path, vectors.to_string()).unwrap();
    source.vectors = Some(vectors_path.clone());
    let live = LivePolicy::open(source.clone()).expect("the shipped vectors pass with 4 attempts");
    std::fs::write(&source.config, r#"{"default-effect": "read", "max-attempts-per-call": 2}"#).unwrap();
    let err = live.reload().unwrap_err();
    assert!(matches!(err, UpdateError::Gate(_)), "{err}");
    let text = err.to_string();
    assert!(text.contains("vectors") && text.contains("a read is tried four times against a persistent 503"), "{text}");
    assert_eq!(live.current().identity.generation, 1, "the last good policy serves");
    for malformed in ["not json", r#"{"cases": []}"#, r#"{"description": "x", "cases": [{"description": "y", "steps": [{"op": "fly"}]}]}"#] {
        std::fs::write(&source.config, READS).unwrap();
        std::fs::write(&vectors_path, malformed).unwrap();
        let err = live.reload().expect_err(malformed);
        assert!(err.to_string().contains("vectors"), "{malformed}: {err}");
    }
}

/// The gate runs tests/vectors/gate.json on every candidate, its cases without
/// `config` under the candidate's own configuration: a configuration that makes
/// the write the gate probes idempotent lets an unkeyed write that timed out be
/// resent, and the update is refused naming the case. The last good policy serves.
#[test]
fn the_gate_vectors_run_under_the_candidates_configuration_and_name_the_failing_case() {
    let (_dir, source) = deployed("gate", READS);
    let live = LivePolicy::open(source.clone()).unwrap();
    std::fs::write(&source.config, r#"{"tools": {"self_test_write": {"effect": "write", "idempotent": true}}}"#).unwrap();
    let err = live.reload().unwrap_err();
    assert!(matches!(err, UpdateError::Gate(_)), "{err}");
    let text = err.to_string();
    assert!(text.contains("gate.json") && text.contains("an unkeyed write that timed out is never resent without a status check"), "{text}");
    assert_eq!(live.current().identity.generation, 1, "the last good policy serves");
    assert_eq!(attempts_against_a_persistent_503(&live), 4);
}

/// An operator's gate vector files run after gate.json, on every candidate:
/// one that the candidate fails refuses it, naming the file and the case.
#[test]
fn an_operators_gate_vectors_refuse_an_update_naming_the_file_and_the_case() {
    let (dir, mut source) = deployed("operator-gate", READS);
    let gate_path = dir.0.join("ours.gate.json");
    let vectors = serde_json::json!({"description": "what this operator relies on", "cases": [{
    "description": "a read gets at least four attempts against a persistent 503",
    "steps": [
        {"op": "begin-call", "call": {"tool": "lookup_order"}},
        {"op": "record-outcome", "call-id": 1, "outcome": {"failure": {"kind": {"http-status": 503}}}, "expect": {"ok": {"action": {"retry": {"attempt": 2}}}}},
        {"op": "record-outcome", "call-id": 1, "outcome": {"failure": {"kind": {"http-status": 503}}}, "expect": {"ok": {"action": {"retry": {"attempt": 3}}}}},
        {"op": "record-outcome", "call-id": 1, "outcome": {"failure": {"kind": {"http-status": 503}}}, "expect": {"ok": {"action": {"retry": {"attempt": 4}}}}}
    ]}]});
    std::fs::write(&gate_path, vectors.to_string()).unwrap();
    source.gate_vectors = vec![gate_path.clone()];
    let live = LivePolicy::open(source.clone()).expect("4 attempts pass the operator's gate");
    std::fs::write(&source.config, r#"{"default-effect": "read", "max-attempts-per-call": 2}"#).unwrap();
    let err = live.reload().unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, UpdateError::Gate(_)), "{err}");
    assert!(text.contains("ours.gate.json") && text.contains("a read gets at least four attempts against a persistent 503"), "{text}");
    assert_eq!(live.current().identity.generation, 1, "the last good policy serves");
}
