//! tests/vectors/observations.json replayed through the real wrapper
//! (RetryingToolCaller over an McpConnection, the capturing HTTP client):
//! each case's `answer` is served by the demo server to the first call of
//! `lookup_order`, and the verdict the wrapper acted on for attempt 1 (its
//! `on_verdict` hook, as in the Python and Node tests) must be the one the
//! case `expect`s: action, class, rule and reconnect. A case with
//! `session-id-sent` runs on a 2025-11-25 session (the demo server's
//! handshake era: the wrapper falls back to `initialize` and sends
//! `Mcp-Session-Id`); the others on 2026-07-28 (modern era, no session). A
//! capture that maps an answer to an observation with another verdict fails
//! here (the conformance runner checks the case's observation gives it).

use std::path::Path;
use std::sync::{Arc, Mutex};

use agent_retry_demo_server::{DemoState, Era, Fault, FaultScript, HttpOptions, serve_http_options};
use agent_retry_host::component::types::Verdict;
use agent_retry_host::mcp::{McpConnection, Metrics, RetryingToolCaller, RetryingToolCallerOptions};
use agent_retry_host::vectors::{OBSERVED_TOOL, ObservationCase, matcher, parse_observation_file};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path, labels};
use serde_json::{Value, json};

fn instance() -> agent_retry_host::PolicyInstance {
    let component = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(23))).unwrap()
}

/// A verdict as `expect` names it; `rules` is the component's `rule-names()`.
fn summary(verdict: &Verdict, rules: &[String]) -> Value {
    let action = labels::action(verdict.action);
    let rule = rules.get(usize::from(verdict.rule_index)).cloned().unwrap_or_else(|| "?".into());
    json!({"action": action, "class": labels::class(verdict.class), "rule": rule, "reconnect": verdict.reconnect})
}

/// Every verdict the wrapper acted on: (tool, attempt, verdict as `expect` names it).
type Seen = Arc<Mutex<Vec<(String, u32, Value)>>>;

/// One case through the wrapper: the verdict it acted on for attempt 1 of the
/// call, and every verdict it acted on.
async fn replay(config: &Value, case: &ObservationCase) -> Result<(Value, Vec<(String, u32, Value)>), String> {
    let fault: Fault = serde_json::from_value(case.answer.clone()).map_err(|e| format!("answer {}: {e}", case.answer))?;
    let script = FaultScript::from_json(&json!([{"tool": OBSERVED_TOOL, "call": 1, "fault": case.answer}]).to_string())?;
    assert!(script.rules[0].fault == fault);
    let era = if case.session_id_sent { Era::Handshake } else { Era::Modern };
    let options = HttpOptions { sessions: case.session_id_sent, era, tls: None };
    let server = serve_http_options("127.0.0.1:0".parse().unwrap(), DemoState::new(script, None), options).await.map_err(|e| e.to_string())?;
    // Fast retries: a case that retries goes on to a second attempt, which succeeds.
    let mut config = config.clone();
    config["base-delay-ms"] = json!(10);
    config["max-delay-ms"] = json!(20);
    let mut policy = instance();
    let rules = policy.rule_names().map_err(|e| e.to_string())?;
    let seen: Seen = Arc::default();
    let hook = Arc::clone(&seen);
    let caller_options = RetryingToolCallerOptions { attempt_timeout_ms: Some(10_000), ..Default::default() }
        .on_verdict(move |tool, attempt, verdict| hook.lock().unwrap().push((tool.to_string(), attempt, summary(verdict, &rules))));
    let connection = McpConnection::http(&server.url);
    let mut caller = RetryingToolCaller::connect(connection, policy, &config.to_string(), "run-observations", caller_options, Arc::new(Metrics::new()))
        .await
        .map_err(|e| format!("connect: {e:#}"))?;
    let arguments = json!({"order_id": "A1"}).as_object().cloned().unwrap();
    let _ = caller.call(OBSERVED_TOOL, arguments).await;
    let _ = caller.finish().await;
    server.stop().await;
    let seen = seen.lock().unwrap().clone();
    let verdict_of = |attempt: u32| seen.iter().find(|(tool, a, _)| tool == OBSERVED_TOOL && *a == attempt).map(|(_, _, v)| v.clone());
    let first = verdict_of(1).ok_or_else(|| format!("no verdict on attempt 1 of {OBSERVED_TOOL}: {seen:?}"))?;
    // A retry (on a new session when it says reconnect) goes out, and succeeds.
    if first["action"] == "retry" && verdict_of(2).map(|v| v["action"].clone()) != Some(json!("succeed")) {
        return Err(format!("the retry (reconnect: {}) did not succeed: {seen:?}", first["reconnect"]));
    }
    Ok((first, seen))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wrapper_acts_on_the_verdict_of_every_observation() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../vectors/observations.json");
    let file = parse_observation_file(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(!file.cases.is_empty());
    let mut failures = Vec::new();
    for case in &file.cases {
        let result = replay(&file.config, case)
            .await
            .and_then(|(first, seen)| matcher::matches(&case.expect, &first).map_err(|miss| format!("verdict {first}: {miss}; every verdict: {seen:?}")));
        match result {
            Ok(()) => println!("ok   {}", case.description),
            Err(why) => {
                println!("FAIL {}\n     {why}", case.description);
                failures.push(case.description.clone());
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} cases failed: {failures:?}", failures.len(), file.cases.len());
}

#[test]
fn a_wrong_verdict_fails_the_comparison() {
    // The comparison must be able to fail: a lost session read as a plain 400.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../vectors/observations.json");
    let file = parse_observation_file(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let case = file.cases.iter().find(|c| c.expect["reconnect"] == json!(true)).expect("a case that reconnects");
    let mut wrong = case.expect.clone();
    wrong["reconnect"] = json!(false);
    assert!(matcher::matches(&case.expect, &wrong).is_err());
}
