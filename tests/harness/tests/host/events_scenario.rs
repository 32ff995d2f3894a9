//! The shared events scenario (docs/events.md, "One scenario, three hosts"):
//! tests/events/scenario.json through `with_policy` with the fake clock and
//! the fixed entropy; what was emitted is written to target/events/rust.json
//! and, when tests/events/expected.json exists, compared with it. The spans
//! and the OpenTelemetry metrics are recorded with the SDK's in-memory
//! exporters (the tests build the crate with its `otel` feature).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use agent_retry_host::any_call::{AnyCallError, Observed, PolicyRun, WithPolicyOptions};
use agent_retry_host::component::types::{FailureKind, Observation};
use agent_retry_host::events::{Event, RetryHooks};
use agent_retry_host::mcp::Metrics;
use agent_retry_host::otel::opentelemetry::Value as OtelValue;
use agent_retry_host::otel::opentelemetry::trace::{SpanKind, Status};
use agent_retry_host::otel::{OtelMeter, OtelTracer};
use agent_retry_host::testing::{FakeClock, fixed_entropy};
use agent_retry_host::{EmbeddedAccounts, HostServices, PolicyComponent, default_wasm_path};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::{Value, json};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[derive(Default)]
struct Log(Mutex<Vec<Value>>);

impl RetryHooks for Log {
    fn on_event(&self, event: &Event) {
        self.0.lock().unwrap().push(event.to_log());
    }
}

/// A readable failure of the vectors (`{kind, headers: [[name, value]], body}`) as the observation.
fn observation(failure: &Value) -> Observation {
    let kind = match &failure["kind"] {
        Value::Object(kind) if kind.contains_key("http-status") => FailureKind::HttpStatus(kind["http-status"].as_u64().unwrap() as u16),
        other => panic!("the scenario's failure kinds are http-status: {other}"),
    };
    let headers: Vec<(String, String)> = serde_json::from_value(failure["headers"].clone()).unwrap_or_default();
    Observation::new(kind, &headers, failure["body"].as_str().unwrap_or_default())
}

fn attribute(value: &OtelValue) -> Value {
    match value {
        OtelValue::Bool(flag) => json!(flag),
        OtelValue::I64(whole) => json!(whole),
        OtelValue::F64(number) => json!(number),
        other => json!(other.as_str()),
    }
}

/// The spans as the three hosts dump them: in the order they ended, each
/// with its name, kind, parent's name, status, attributes and events.
fn span_dump(spans: &[SpanData]) -> Vec<Value> {
    let attributes = |values: &[agent_retry_host::otel::opentelemetry::KeyValue]| -> Value {
        Value::Object(values.iter().map(|kv| (kv.key.to_string(), attribute(&kv.value))).collect())
    };
    spans
        .iter()
        .map(|span| {
            let parent = spans.iter().find(|p| p.span_context.span_id() == span.parent_span_id).map(|p| p.name.to_string());
            let kind = match span.span_kind {
                SpanKind::Client => "client",
                SpanKind::Server => "server",
                SpanKind::Producer => "producer",
                SpanKind::Consumer => "consumer",
                SpanKind::Internal => "internal",
            };
            let status = match span.status {
                Status::Unset => "unset",
                Status::Error { .. } => "error",
                Status::Ok => "ok",
            };
            let events: Vec<Value> = span.events.iter().map(|e| json!({"name": e.name, "attributes": attributes(&e.attributes)})).collect();
            json!({"name": span.name, "kind": kind, "parent": parent, "status": status, "attributes": attributes(&span.attributes), "events": events})
        })
        .collect()
}

/// A JSON value with its objects' keys sorted (whatever order serde_json's map keeps).
fn sorted(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().map(|(k, v)| (k, sorted(v))).collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

#[tokio::test]
async fn the_shared_scenario_emits_the_expected_events_and_metrics() {
    let scenario: Value = serde_json::from_str(&std::fs::read_to_string(root().join("tests/events/scenario.json")).unwrap()).unwrap();
    let component = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    let entropy = fixed_entropy(scenario["entropy_seed"].as_u64().unwrap());
    let instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), entropy)).unwrap();
    let clock = Arc::new(FakeClock::new(scenario["clock_start_ms"].as_u64().unwrap()));
    let log = Arc::new(Log::default());
    let metrics = Arc::new(Metrics::new());
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
    let metric_exporter = InMemoryMetricExporter::default();
    let meter_provider = SdkMeterProvider::builder().with_reader(PeriodicReader::builder(metric_exporter.clone()).build()).build();
    let options = WithPolicyOptions {
        tracer: Some(OtelTracer::from_provider(&provider)),
        meter: Some(OtelMeter::from_provider(&meter_provider)),
        clock: clock.clone(),
        policy_identity: Some(scenario["policy_identity"].as_str().unwrap().to_string()),
        hooks: Some(log.clone()),
        metrics: Some(metrics.clone()),
        ..Default::default()
    };
    let mut run = PolicyRun::start(instance, &scenario["config"].to_string(), scenario["run_id"].as_str().unwrap(), options).unwrap();
    let mut ends = Vec::new();
    for call in scenario["calls"].as_array().unwrap() {
        let answers = call["answers"].as_array().unwrap().clone();
        let result = run
            .with_policy(call["tool"].as_str().unwrap(), |attempt| {
                let answer = answers[(attempt.number as usize - 1).min(answers.len() - 1)].clone();
                async move {
                    match answer.get("ok") {
                        Some(value) => Ok(value.clone()),
                        None => Err(Observed(observation(&answer["failure"]))),
                    }
                }
            })
            .await;
        ends.push(match result {
            Ok(value) => json!({"ok": value}),
            Err(AnyCallError::Replan { message, rule }) => json!({"replan": {"rule": rule, "message": message}}),
            Err(AnyCallError::Escalated(e)) => json!({"escalate": e.reason.to_string()}),
            Err(other) => panic!("{other}"),
        });
    }
    let report = run.finish().unwrap();
    let events = log.0.lock().unwrap().clone();
    let spans = span_dump(&exporter.get_finished_spans().unwrap());
    let dump = sorted(json!({"events": events, "spans": spans.clone(), "metrics": metrics.to_json()}));
    let out = root().join("target/events");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("rust.json"), serde_json::to_string_pretty(&dump).unwrap() + "\n").unwrap();

    // What the scenario says happens, whatever expected.json holds.
    assert_eq!(ends[0], json!({"ok": {"price_cents": 1200}}));
    assert!(ends[1].get("replan").is_some(), "a 400 on a write is the model's to fix: {}", ends[1]);
    assert_eq!(ends[2], json!({"escalate": "permission-denied"}));
    assert_eq!(metrics.instruments().attempts_total(), u64::from(report.attempts));
    assert_eq!(clock.sleeps().len(), 2, "two retries: {:?}", clock.sleeps());
    assert!(clock.sleeps()[1] >= 1000, "the 429's Retry-After: {:?}", clock.sleeps());
    assert!(events.iter().all(|e| e.get("ts").is_none()));
    let names: Vec<&str> = spans.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names.iter().filter(|n| n.starts_with("execute_tool ")).count(), 3, "a span per call: {names:?}");
    assert_eq!(names.iter().filter(|n| n.starts_with("attempt ")).count(), 5, "a span per attempt: {names:?}");

    // The OpenTelemetry instruments count what the Prometheus ones count.
    meter_provider.force_flush().unwrap();
    let otel = otel_points(&metric_exporter);
    let prometheus: Vec<(String, String, u64)> =
        metrics.instruments().attempts.iter().map(|((class, action), n)| (class.clone(), action.clone(), *n)).collect();
    assert_eq!(otel.attempts, prometheus, "agent_retry.attempts by class and action");
    assert_eq!(otel.wait_count, 2, "two waits in agent_retry.wait.duration");
    assert_eq!(otel.wait_bounds, vec![0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]);
    assert_eq!(otel.escalations, vec![("permission-denied".to_string(), 1)]);

    let expected_path = root().join("tests/events/expected.json");
    if let Ok(text) = std::fs::read_to_string(&expected_path) {
        let expected: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(dump["events"], expected["events"], "events differ from tests/events/expected.json (dump: target/events/rust.json)");
        assert_eq!(dump["metrics"], expected["metrics"], "metrics differ from tests/events/expected.json (dump: target/events/rust.json)");
        assert_eq!(dump["spans"], expected["spans"], "spans differ from tests/events/expected.json (dump: target/events/rust.json)");
    } else {
        eprintln!("no tests/events/expected.json yet: the dump is written, not compared");
    }
}

/// What the test reads of the OpenTelemetry metrics.
#[derive(Default)]
struct OtelPoints {
    /// `agent_retry.attempts`: (class, action, count), sorted.
    attempts: Vec<(String, String, u64)>,
    /// `agent_retry.escalations`: (reason, count), sorted.
    escalations: Vec<(String, u64)>,
    wait_count: u64,
    wait_bounds: Vec<f64>,
}

fn otel_points(exporter: &InMemoryMetricExporter) -> OtelPoints {
    let mut points = OtelPoints::default();
    let text = |attributes: Vec<&agent_retry_host::otel::opentelemetry::KeyValue>, key: &str| {
        attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| kv.value.as_str().to_string()).unwrap_or_default()
    };
    // The last export holds the cumulative totals.
    let exported = exporter.get_finished_metrics().unwrap();
    let last = exported.last().expect("an export");
    for scope in last.scope_metrics() {
        for metric in scope.metrics() {
            match (metric.name(), metric.data()) {
                ("agent_retry.attempts", AggregatedMetrics::U64(MetricData::Sum(sum))) => {
                    for p in sum.data_points() {
                        points.attempts.push((text(p.attributes().collect(), "class"), text(p.attributes().collect(), "action"), p.value()));
                    }
                }
                ("agent_retry.escalations", AggregatedMetrics::U64(MetricData::Sum(sum))) => {
                    points.escalations.extend(sum.data_points().map(|p| (text(p.attributes().collect(), "reason"), p.value())));
                }
                ("agent_retry.wait.duration", AggregatedMetrics::F64(MetricData::Histogram(histogram))) => {
                    for p in histogram.data_points() {
                        points.wait_count += p.count();
                        points.wait_bounds = p.bounds().collect();
                    }
                }
                _ => {}
            }
        }
    }
    points.attempts.sort();
    points.escalations.sort();
    points
}

/// A call whose future is dropped mid-attempt (a timeout around it, a
/// cancelled task) ends its spans as stopped at once, not at the next call.
#[tokio::test]
async fn a_dropped_call_leaves_no_span_open() {
    let component = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    let instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), fixed_entropy(1))).unwrap();
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
    let options = WithPolicyOptions { tracer: Some(OtelTracer::from_provider(&provider)), ..Default::default() };
    let mut run = PolicyRun::start(instance, "{}", "run-dropped", options).unwrap();
    let never = run.with_policy("lookup_order", |_| std::future::pending::<Result<Value, Observed>>());
    assert!(tokio::time::timeout(std::time::Duration::from_millis(50), never).await.is_err(), "the attempt never answers");
    let spans = exporter.get_finished_spans().unwrap();
    let ended = |name: &str| spans.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("{name} still open: {spans:?}"));
    for span in [ended("execute_tool lookup_order"), ended("attempt lookup_order")] {
        let error_type = span.attributes.iter().find(|kv| kv.key.as_str() == "error.type").map(|kv| kv.value.as_str().to_string());
        assert_eq!(error_type.as_deref(), Some("cancelled"), "{span:?}");
        assert!(matches!(span.status, Status::Error { .. }), "{span:?}");
    }
}
