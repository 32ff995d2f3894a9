//! The instruments count what the run report counts (issue 25: "it counts 5
//! attempts where the run report says 7"): the MCP wrapper against the demo
//! server, its `initialize` and `tools/list` included, and the events it
//! emits on the way (waits, escalations, the hooks).

use std::sync::{Arc, Mutex};

use agent_retry_demo_server::faults::{Fault, rule};
use agent_retry_demo_server::{DemoState, FaultScript, serve_http};
use agent_retry_host::events::{AttemptEvent, EscalationEvent, Event, RetryHooks, WaitEvent};
use agent_retry_host::mcp::{CallError, Clock, McpConnection, Metrics, RetryingToolCaller, RetryingToolCallerOptions, ToolAnswer};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};
use serde_json::{Map, Value, json};

fn args(value: Value) -> Map<String, Value> {
    value.as_object().cloned().unwrap()
}

fn http(status: u16, headers: &[(&str, &str)]) -> Fault {
    Fault::Http { status, headers: headers.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(), body: format!("scripted {status}") }
}

/// Records every event, and panics in `on_wait` (a broken hook must not break the call).
#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<Event>>,
    retries: Mutex<Vec<AttemptEvent>>,
    escalations: Mutex<Vec<EscalationEvent>>,
}

impl RetryHooks for Recorder {
    fn on_wait(&self, _event: &WaitEvent) {
        panic!("a hook that panics");
    }
    fn on_retry(&self, event: &AttemptEvent) {
        self.retries.lock().unwrap().push(event.clone());
    }
    fn on_escalate(&self, event: &EscalationEvent) {
        self.escalations.lock().unwrap().push(event.clone());
    }
    fn on_event(&self, event: &Event) {
        self.events.lock().unwrap().push(event.clone());
    }
}

#[tokio::test]
async fn the_attempts_total_equals_the_run_reports_attempts() {
    // Two 503s then a success, then a 403 that escalates: 5 tool-call
    // attempts, plus the `initialize` and `tools/list` calls of the policy.
    let faults =
        vec![rule("lookup_order", Some(1), http(503, &[])), rule("lookup_order", Some(2), http(503, &[])), rule("lookup_order", Some(4), http(403, &[]))];
    let state = DemoState::new(FaultScript::new(faults), None);
    let server = serve_http("127.0.0.1:0".parse().unwrap(), state).await.unwrap();
    let component = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    let instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(1))).unwrap();
    let metrics = Arc::new(Metrics::new());
    let recorder = Arc::new(Recorder::default());
    let options = RetryingToolCallerOptions { attempt_timeout_ms: Some(4000), clock: Clock::scaled(0.01), hooks: Some(recorder.clone()), ..Default::default() };
    let config = r#"{"base-delay-ms": 200, "max-delay-ms": 2000}"#;
    let mut caller =
        RetryingToolCaller::connect(McpConnection::http(&server.url), instance, config, "run-metrics", options, Arc::clone(&metrics)).await.unwrap();
    let answer = caller.call("lookup_order", args(json!({"order_id": "ORD-1"}))).await.unwrap();
    assert!(matches!(answer, ToolAnswer::Done { .. }), "{answer:?}");
    let stopped = caller.call("lookup_order", args(json!({"order_id": "ORD-2"}))).await;
    assert!(matches!(stopped, Err(CallError::Escalated(_))), "{stopped:?}");
    let report = caller.finish().await.unwrap();
    server.stop().await;

    let instruments = metrics.instruments();
    assert_eq!(report.attempts, 6, "4 tool-call attempts and initialize + tools/list: {report:?}");
    assert_eq!(instruments.attempts_total(), u64::from(report.attempts), "{instruments:?}");
    // The summary still counts tool calls apart (what the demo prints).
    assert_eq!(metrics.snapshot().attempts, 4);
    assert_eq!(instruments.attempts.get(&("transient".to_string(), "retry".to_string())), Some(&2), "{instruments:?}");
    assert_eq!(instruments.escalations.values().sum::<u64>(), 1);
    assert_eq!(instruments.waits.get("retry"), Some(&u64::from(report.retries)));
    let text = metrics.to_prometheus();
    // What a scraper sums: every `agent_retry_attempts_total` sample (the 0.7
    // text had one sample counting tool calls only, 4 here).
    let scraped: u64 =
        text.lines().filter(|line| line.starts_with("agent_retry_attempts_total")).map(|line| line.rsplit(' ').next().unwrap().parse::<u64>().unwrap()).sum();
    assert_eq!(scraped, u64::from(report.attempts), "{text}");
    assert!(text.contains(&format!("agent_retry_waits_total{{why=\"retry\"}} {}\n", report.retries)), "{text}");

    // The hooks saw the same: two retries, one escalation with its note,
    // though `on_wait` panicked at every wait.
    assert_eq!(recorder.retries.lock().unwrap().len(), 2);
    let escalations = recorder.escalations.lock().unwrap();
    assert_eq!(escalations.len(), 1);
    assert!(!escalations[0].note().is_empty());
    let events = recorder.events.lock().unwrap();
    let waits = events.iter().filter(|e| matches!(e, Event::Wait(_))).count();
    assert_eq!(waits as u32, report.retries, "every retry's wait is an event");
    let sent = events.iter().filter(|e| matches!(e, Event::Attempt(a) if a.sent)).count();
    assert_eq!(sent as u32, report.attempts);
}
