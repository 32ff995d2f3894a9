//! A live policy's updates as events: `on_policy_update` told of an accepted
//! update, a refusal (with its kind) and a rollback, and the policy_updates
//! counter by outcome; a hook that panics does not stop the update.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use agent_retry_host::events::{PolicyUpdateEvent, PolicyUpdateOutcome, RetryHooks};
use agent_retry_host::mcp::Metrics;
use agent_retry_host::{Integrity, LivePolicy, PolicySource, default_wasm_path};

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[derive(Default)]
struct Updates(Mutex<Vec<PolicyUpdateEvent>>);

impl RetryHooks for Updates {
    fn on_policy_update(&self, event: &PolicyUpdateEvent) {
        self.0.lock().unwrap().push(event.clone());
        panic!("a hook that panics after recording");
    }
}

#[test]
fn updates_refusals_and_rollbacks_are_events_and_counted() {
    let dir = std::env::temp_dir().join(format!("agent-retry-live-events-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = Dir(dir.clone());
    std::fs::copy(default_wasm_path(), dir.join("policy.wasm")).expect("run `make wasm` first");
    std::fs::write(dir.join("policy.json"), "{}").unwrap();
    let source =
        PolicySource { wasm: dir.join("policy.wasm"), config: dir.join("policy.json"), integrity: Integrity::Unchecked, vectors: None, gate_vectors: vec![] };
    let updates = Arc::new(Updates::default());
    let metrics = Arc::new(Metrics::new());
    let live = LivePolicy::open(source.clone()).unwrap().with_telemetry(Some(updates.clone()), Some(metrics.clone()));

    std::fs::write(&source.config, r#"{"max-attempts-per-call": 2}"#).unwrap();
    let accepted = live.reload().unwrap();
    std::fs::write(&source.config, r#"{"max-attempts-per-call": 0}"#).unwrap();
    live.reload().unwrap_err();
    let back = live.rollback().unwrap();

    let seen = updates.0.lock().unwrap().clone();
    let outcomes: Vec<PolicyUpdateOutcome> = seen.iter().map(|e| e.outcome).collect();
    assert_eq!(outcomes, [PolicyUpdateOutcome::Accepted, PolicyUpdateOutcome::Refused, PolicyUpdateOutcome::RolledBack]);
    assert_eq!(seen[0].identity.as_deref(), Some(accepted.to_string().as_str()));
    assert_eq!(seen[1].kind.as_deref(), Some("config"));
    assert!(seen[1].reason.as_deref().unwrap().contains("max-attempts-per-call"), "{:?}", seen[1]);
    assert_eq!(seen[1].serving.as_deref(), Some(accepted.to_string().as_str()));
    assert_eq!(seen[2].identity.as_deref(), Some(back.to_string().as_str()));
    let counted = metrics.instruments().policy_updates;
    assert_eq!(counted.get("accepted"), Some(&1));
    assert_eq!(counted.get("refused"), Some(&1));
    assert_eq!(counted.get("rolled-back"), Some(&1));
    assert!(metrics.to_prometheus().contains("agent_retry_policy_updates_total{outcome=\"rolled-back\"} 1\n"));
}
