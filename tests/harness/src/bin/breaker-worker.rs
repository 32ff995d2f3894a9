//! One Rust worker of the cross-host breaker test
//! (hosts/python/tests/test_redis_shared_state.py; its twins are
//! breaker_worker.py and breaker-worker.ts): the component with a breaker
//! configuration and the shared state on Redis at URL, one run, and:
//! - `open`: a call of `lookup_order` on SERVER fails twice with 503, which
//!   opens the breakers; prints the verdict's action and the changes;
//! - `call`: begins a call of `lookup_order` on SERVER; prints whether it was
//!   admitted or refused as a replan, and the message.
//!
//!     breaker-worker URL SERVER open|call

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use agent_retry_host::component::types::{Action, Delivery, FailureKind, Observation};
use agent_retry_host::shared_state::FallbackSharedState;
use agent_retry_host::{Admission, EmbeddedAccounts, EntropySource, HostServices, Outcome, PolicyComponent};
use serde_json::json;

const CONFIG: &str = r#"{"tools": {"lookup_order": {"effect": "read"}}, "circuit-breaker": {"failures-to-open": 2, "cooldown-ms": 60000}}"#;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, server, mode] = args.as_slice() else {
        anyhow::bail!("usage: breaker-worker URL SERVER open|call");
    };
    let component = PolicyComponent::from_file(&agent_retry_host::default_wasm_path())?;
    let services = HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::Os).with_shared_state(Arc::new(FallbackSharedState::open(url)?));
    let mut instance = component.instantiate(services)?;
    let policy = instance.load_policy(CONFIG)?.map_err(|e| anyhow::anyhow!("{}: {}", e.field, e.message))?;
    let run = instance.start_run(&policy, "breaker-worker")?.map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let begun = instance.begin(&run, Some(server), "lookup_order", None, None, now_ms())?.map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let line = match (mode.as_str(), begun) {
        ("call", Admission::Send(_)) => json!({"host": "rust", "mode": "call", "admitted": true, "replan": false, "message": null}),
        ("call", Admission::Replan(_, decision)) => {
            let message = match decision.action {
                Action::Replan(message) => message,
                _ => String::new(),
            };
            json!({"host": "rust", "mode": "call", "admitted": false, "replan": true, "message": message})
        }
        ("call", Admission::Escalate(e)) => json!({"host": "rust", "mode": "call", "admitted": false, "replan": false, "message": e.note}),
        ("open", Admission::Send(start)) => {
            let failure =
                || Outcome::Failure(Observation { delivery: Delivery::Sent, ..Observation::new(FailureKind::HttpStatus(503), &[], "upstream unavailable") });
            let mut action = String::new();
            for attempt in 1..=2 {
                let decision = instance.decide(&run, start.call_id, attempt, &failure(), None, now_ms(), Some(0))?.map_err(|e| anyhow::anyhow!("{e:?}"))?;
                action = agent_retry_host::labels::verdict_action(&decision.action).to_string();
            }
            let changes: Vec<_> = instance
                .take_breaker_changes(&run)?
                .into_iter()
                .map(|c| json!({"old": agent_retry_host::labels::breaker_state(c.old_state), "new": agent_retry_host::labels::breaker_state(c.new_state), "tool": c.tool}))
                .collect();
            json!({"host": "rust", "mode": "open", "action": action, "changes": changes})
        }
        (mode, begun) => anyhow::bail!("{mode}: unexpected {begun}"),
    };
    println!("{line}");
    Ok(())
}
