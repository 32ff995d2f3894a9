//! One set of outcome words (docs/events.md): the same observation reads the
//! same in an MCP call's `agent_retry.attempt` event and in a `with_policy`
//! call's, and every event's log line carries `ts`.

use crate::lines::Lines;

use std::sync::{Arc, Mutex};

use agent_retry_demo_server::faults::{Fault, rule};
use agent_retry_demo_server::{DemoState, FaultScript, serve_http};
use agent_retry_host::any_call::{AnyCallError, Observed, PolicyRun, WithPolicyOptions};
use agent_retry_host::component::types::{FailureKind, Observation};
use agent_retry_host::events::{Event, RetryHooks};
use agent_retry_host::mcp::{Clock, McpConnection, Metrics, RetryingToolCaller, RetryingToolCallerOptions, ToolAnswer};
use agent_retry_host::testing::{FakeClock, fixed_entropy};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};
use serde_json::{Map, Value, json};

const CONFIG: &str = r#"{"tools": {"lookup_order": {"effect": "read"}}}"#;
const TOOL_TEXT: &str = "order_id must look like ORD-<digits>";

/// The (outcome, action) of every attempt event of `tool`.
#[derive(Default)]
struct Attempts(Mutex<Vec<(String, String)>>);

impl RetryHooks for Attempts {
    fn on_event(&self, event: &Event) {
        if let Event::Attempt(attempt) = event
            && attempt.context.tool == "lookup_order"
        {
            self.0.lock().unwrap().push((attempt.outcome.clone(), attempt.action.clone()));
        }
    }
}

fn component() -> PolicyComponent {
    PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first")
}

/// A 503, then a tool error the policy knows no failure in (a replan), over MCP.
async fn over_mcp(lines: &Lines) -> Vec<(String, String)> {
    let faults = vec![
        rule("lookup_order", Some(1), Fault::Http { status: 503, headers: vec![], body: "busy".into() }),
        rule("lookup_order", Some(2), Fault::ToolText { text: TOOL_TEXT.into(), structured: None }),
    ];
    let server = serve_http("127.0.0.1:0".parse().unwrap(), DemoState::new(FaultScript::new(faults), None)).await.unwrap();
    let instance = component().instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(3))).unwrap();
    let attempts = Arc::new(Attempts::default());
    let options = RetryingToolCallerOptions { clock: Clock::scaled(0.01), hooks: Some(attempts.clone()), ..Default::default() };
    let _guard = tracing::subscriber::set_default(lines.clone());
    let mut caller =
        RetryingToolCaller::connect(McpConnection::http(&server.url), instance, CONFIG, "run-words-mcp", options, Arc::new(Metrics::new())).await.unwrap();
    let answer = caller.call("lookup_order", json!({"order_id": "A1"}).as_object().cloned().unwrap()).await.unwrap();
    assert!(matches!(answer, ToolAnswer::Replan(_)), "{answer:?}");
    caller.finish().await.unwrap();
    server.stop().await;
    attempts.0.lock().unwrap().clone()
}

/// The same two observations, through `with_policy`.
async fn through_with_policy() -> Vec<(String, String)> {
    let instance = component().instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), fixed_entropy(3))).unwrap();
    let attempts = Arc::new(Attempts::default());
    let options = WithPolicyOptions { clock: Arc::new(FakeClock::new(1_700_000_000_000)), hooks: Some(attempts.clone()), ..Default::default() };
    let mut run = PolicyRun::start(instance, CONFIG, "run-words-any", options).unwrap();
    let answers = [Observation::new(FailureKind::HttpStatus(503), &[], "busy"), Observation::new(FailureKind::ToolError(None), &[], TOOL_TEXT)];
    let result = run
        .with_policy("lookup_order", |attempt| {
            let observed = answers[attempt.number as usize - 1].clone();
            async move { Err::<Value, _>(Observed(observed)) }
        })
        .await;
    assert!(matches!(result, Err(AnyCallError::Replan { .. })), "{result:?}");
    attempts.0.lock().unwrap().clone()
}

pub async fn the_same_observation_has_the_same_outcome_words_over_mcp_and_with_policy() {
    let lines = Lines::default();
    let mcp = over_mcp(&lines).await;
    let any = through_with_policy().await;
    let expected = vec![("http 503".to_string(), "retry".to_string()), ("tool error".to_string(), "replan".to_string())];
    assert_eq!(mcp, expected, "the MCP wrapper's words");
    assert_eq!(any, expected, "the any-call helper's words");

    // Every event's line carries `ts`, Unix seconds of now.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let lines = lines.0.lock().unwrap();
    let events: Vec<&Map<String, Value>> =
        lines.iter().filter(|l| l.get("event").and_then(Value::as_str).is_some_and(|e| e.starts_with("agent_retry."))).collect();
    assert!(events.iter().any(|l| l["event"] == "agent_retry.attempt") && events.iter().any(|l| l["event"] == "agent_retry.wait"), "{lines:?}");
    for line in events {
        let ts = line.get("ts").and_then(Value::as_f64).unwrap_or_else(|| panic!("no ts: {line:?}"));
        assert!((now - ts).abs() < 120.0, "ts {ts} is Unix seconds of now ({now}): {line:?}");
    }
}
