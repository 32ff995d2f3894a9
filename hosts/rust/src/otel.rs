//! OpenTelemetry spans and metrics of the events (docs/events.md, "Traces"
//! and "Metrics"), through the `opentelemetry` API crate only (cargo feature
//! `otel`). The instruments are those the Prometheus text counts, from the
//! same changes ([`crate::mcp::metrics`]). The spans: a span per call
//! (`execute_tool {tool}`), a child span per attempt (`tools/call {tool}` over
//! MCP, `attempt {tool}` for the any-call helper), waits, status checks, task
//! polls and escalations as span events on the call span, and the attempt
//! span's W3C trace context for the request's `params._meta`. The same spans,
//! attributes and statuses as the Python and Node hosts. Without a tracer (a
//! meter) in the wrapper's options no span (no measurement) is recorded.

use std::sync::Arc;

pub use opentelemetry;
use opentelemetry::global::BoxedTracer;
use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer, TracerProvider};
use opentelemetry::{Context, InstrumentationScope, KeyValue};
use serde_json::Value;

use crate::events::{AttemptEvent, Event};

/// The instrumentation scope's name (the tracer's).
pub const SCOPE: &str = "agent-retry-host";

/// The tracer the wrappers make their spans with: give one in the options'
/// `tracer` to record spans (none by default: nothing is recorded).
#[derive(Clone)]
pub struct OtelTracer(Arc<BoxedTracer>);

impl std::fmt::Debug for OtelTracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OtelTracer")
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope::builder(SCOPE).with_version(env!("CARGO_PKG_VERSION")).build()
}

impl OtelTracer {
    /// A tracer of `provider` (e.g. an `opentelemetry_sdk` `SdkTracerProvider`).
    pub fn from_provider<P, T, S>(provider: &P) -> Self
    where
        P: TracerProvider<Tracer = T>,
        T: Tracer<Span = S> + Send + Sync + 'static,
        S: opentelemetry::trace::Span + Send + Sync + 'static,
    {
        OtelTracer(Arc::new(BoxedTracer::new(Box::new(provider.tracer_with_scope(scope())))))
    }

    /// A tracer of the global provider (`opentelemetry::global::set_tracer_provider`).
    pub fn global() -> Self {
        OtelTracer(Arc::new(opentelemetry::global::tracer_with_scope(scope())))
    }
}

/// The instruments of docs/events.md through the OpenTelemetry metrics API:
/// give one in the options' `meter` to record them (none by default). Their
/// names, units and attributes are the Python and Node hosts'.
#[derive(Clone)]
pub struct OtelMeter(Arc<Instruments>);

struct Instruments {
    attempts: Counter<u64>,
    replans: Counter<u64>,
    escalations: Counter<u64>,
    status_checks: Counter<u64>,
    breaker_changes: Counter<u64>,
    waits: Counter<u64>,
    wait_duration: Histogram<f64>,
    account_waits: Counter<u64>,
    account_refusals: Counter<u64>,
    policy_updates: Counter<u64>,
}

impl std::fmt::Debug for OtelMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OtelMeter")
    }
}

impl OtelMeter {
    /// The instruments of a meter of `provider` (e.g. an `opentelemetry_sdk` `SdkMeterProvider`).
    pub fn from_provider<P: MeterProvider>(provider: &P) -> Self {
        Self::of(&provider.meter_with_scope(scope()))
    }

    /// The instruments of the global provider (`opentelemetry::global::set_meter_provider`).
    pub fn global() -> Self {
        Self::of(&opentelemetry::global::meter_with_scope(scope()))
    }

    fn of(meter: &Meter) -> Self {
        let counter =
            |name: &'static str, unit: &'static str, description: &'static str| meter.u64_counter(name).with_unit(unit).with_description(description).build();
        OtelMeter(Arc::new(Instruments {
            attempts: counter("agent_retry.attempts", "{attempt}", "Attempts whose verdict was read"),
            replans: counter("agent_retry.replans", "{call}", "Calls that ended with a replan"),
            escalations: counter("agent_retry.escalations", "{call}", "Calls that ended with an escalation"),
            status_checks: counter("agent_retry.status_checks", "{check}", "Status checks"),
            breaker_changes: counter("agent_retry.breaker.changes", "{change}", "Circuit breaker state changes"),
            waits: counter("agent_retry.waits", "{wait}", "Waits before a retry, a poll or an admission"),
            wait_duration: meter
                .f64_histogram("agent_retry.wait.duration")
                .with_unit("s")
                .with_description("How long the wrapper waited")
                .with_boundaries(crate::mcp::metrics::WAIT_BUCKETS_S.to_vec())
                .build(),
            account_waits: counter("agent_retry.account.waits", "{wait}", "Admission waits"),
            account_refusals: counter("agent_retry.account.refusals", "{call}", "Calls not admitted"),
            policy_updates: counter("agent_retry.policy_updates", "{update}", "Live policy updates"),
        }))
    }

    /// Records what `event` changes in the instruments.
    pub(crate) fn record(&self, event: &Event) {
        use crate::mcp::metrics::Change;
        let i = &self.0;
        for change in crate::mcp::metrics::changes(event) {
            match change {
                Change::Attempt { class, action } => {
                    i.attempts.add(1, &[KeyValue::new("class", class.to_string()), KeyValue::new("action", action.to_string())]);
                }
                Change::Replan => i.replans.add(1, &[]),
                Change::Escalation { reason } => i.escalations.add(1, &[KeyValue::new("reason", reason)]),
                Change::StatusCheck { result } => i.status_checks.add(1, &[KeyValue::new("result", result)]),
                Change::Breaker { scope, to } => i.breaker_changes.add(1, &[KeyValue::new("scope", scope), KeyValue::new("to", to)]),
                Change::Wait { why, wait_ms } => {
                    i.waits.add(1, &[KeyValue::new("why", why)]);
                    i.wait_duration.record(wait_ms as f64 / 1000.0, &[KeyValue::new("why", why)]);
                }
                Change::AccountWait => i.account_waits.add(1, &[]),
                Change::AccountRefusal => i.account_refusals.add(1, &[]),
                Change::PolicyUpdate { outcome } => i.policy_updates.add(1, &[KeyValue::new("outcome", outcome)]),
            }
        }
    }
}

/// The fields of an event that the call span carries itself.
const SCOPE_FIELDS: [&str; 7] = ["event", "ts", "run", "policy", "step", "call", "tool"];

/// One call's spans while it runs: the call span, its open attempt span.
pub(crate) struct CallSpans {
    tracer: OtelTracer,
    call: Context,
    attempt: Option<Context>,
    attempts: i64,
    tool: String,
}

impl CallSpans {
    /// Starts the call span `execute_tool {tool}`, a child of the current span.
    pub(crate) fn start(tracer: &OtelTracer, run: &str, policy: &str, step: Option<u32>, tool: &str) -> Self {
        let mut attributes = vec![
            KeyValue::new("gen_ai.operation.name", "execute_tool"),
            KeyValue::new("gen_ai.tool.name", tool.to_string()),
            KeyValue::new("agent_retry.run", run.to_string()),
            KeyValue::new("agent_retry.policy", policy.to_string()),
        ];
        if let Some(step) = step {
            attributes.push(KeyValue::new("agent_retry.step", i64::from(step)));
        }
        let parent = Context::current();
        let span = tracer
            .0
            .span_builder(format!("execute_tool {tool}"))
            .with_kind(SpanKind::Internal)
            .with_attributes(attributes)
            .start_with_context(tracer.0.as_ref(), &parent);
        CallSpans { tracer: tracer.clone(), call: parent.with_span(span), attempt: None, attempts: 0, tool: tool.to_string() }
    }

    /// Starts the next attempt's span: over MCP a client span `tools/call
    /// {tool}`, for the any-call helper an internal `attempt {tool}`.
    pub(crate) fn attempt(&mut self, mcp: bool) {
        // An attempt not answered yet (a stop) is not left open behind the new one.
        self.fail_attempt("superseded");
        self.attempts += 1;
        let builder = if mcp {
            self.tracer
                .0
                .span_builder(format!("tools/call {}", self.tool))
                .with_kind(SpanKind::Client)
                .with_attributes([KeyValue::new("mcp.method.name", "tools/call"), KeyValue::new("gen_ai.tool.name", self.tool.clone())])
        } else {
            self.tracer.0.span_builder(format!("attempt {}", self.tool)).with_kind(SpanKind::Internal)
        };
        let span = builder.start_with_context(self.tracer.0.as_ref(), &self.call);
        self.attempt = Some(self.call.with_span(span));
    }

    /// The open attempt's context, for the attempt's own code to trace under.
    pub(crate) fn attempt_context(&self) -> Option<Context> {
        self.attempt.clone()
    }

    /// The open attempt span's `traceparent` (and `tracestate`), for the
    /// request's `params._meta` (MCP SEP-414); none when it is not recorded.
    pub(crate) fn trace_meta(&self) -> Option<(String, Option<String>)> {
        let attempt = self.attempt.as_ref()?;
        let span = attempt.span();
        let context = span.span_context();
        if !context.is_valid() {
            return None;
        }
        let parent = format!("00-{}-{}-{:02x}", context.trace_id(), context.span_id(), context.trace_flags().to_u8());
        let state = context.trace_state().header();
        Some((parent, (!state.is_empty()).then_some(state)))
    }

    /// Ends the open attempt span with its verdict's event.
    fn end_attempt(&mut self, event: &AttemptEvent) {
        let Some(attempt) = self.attempt.take() else { return };
        let span = attempt.span();
        let number = i64::from(event.attempt);
        span.set_attribute(KeyValue::new("agent_retry.attempt", number));
        if number > 1 {
            span.set_attribute(KeyValue::new("http.request.resend_count", number - 1));
        }
        if let Some(class) = &event.class {
            span.set_attribute(KeyValue::new("agent_retry.class", class.clone()));
        }
        span.set_attribute(KeyValue::new("agent_retry.action", event.action.clone()));
        if let Some(rule) = &event.rule {
            span.set_attribute(KeyValue::new("agent_retry.rule", rule.clone()));
        }
        // A failure, or an empty result.
        if event.outcome != "success" {
            span.set_attribute(KeyValue::new("error.type", event.outcome.clone()));
            span.set_status(Status::error(event.outcome.clone()));
        }
        span.end();
    }

    /// Ends the open attempt span with no verdict (stopped, or an error nothing maps).
    fn fail_attempt(&mut self, error_type: &str) {
        let Some(attempt) = self.attempt.take() else { return };
        let span = attempt.span();
        span.set_attribute(KeyValue::new("error.type", error_type.to_string()));
        span.set_status(Status::error(error_type.to_string()));
        span.end();
    }

    /// Records `event`: an attempt's verdict ends the attempt span; a wait, a
    /// status check, a task poll or an escalation is an event on the call span.
    pub(crate) fn record(&mut self, event: &Event) {
        match event {
            // A verdict of the tool call's attempt (not a pseudo-call's, not a stop).
            Event::Attempt(e) if e.action != "stop" && e.context.step.is_some() && e.context.call.is_some() => self.end_attempt(e),
            Event::Wait(_) | Event::StatusCheck(_) | Event::TaskPoll(_) | Event::Escalation(_) | Event::Breaker(_) | Event::Resume(_) => {
                let Value::Object(fields) = event.to_log() else { return };
                let attributes = fields
                    .into_iter()
                    .filter(|(name, _)| !SCOPE_FIELDS.contains(&name.as_str()))
                    .filter_map(|(name, value)| attribute(format!("agent_retry.{name}"), value))
                    .collect::<Vec<_>>();
                self.call.span().add_event(event.name(), attributes);
            }
            _ => {}
        }
    }

    /// Ends the call: `action` is `succeed`, `replan`, `escalate` (then
    /// `error_type` is the escalation reason) or `stop` (the host stopped it).
    pub(crate) fn end(mut self, action: &str, error_type: Option<&str>) {
        self.fail_attempt(error_type.unwrap_or(action));
        let span = self.call.span();
        span.set_attribute(KeyValue::new("agent_retry.action", action.to_string()));
        span.set_attribute(KeyValue::new("agent_retry.attempts", self.attempts));
        if let Some(error_type) = error_type {
            span.set_attribute(KeyValue::new("error.type", error_type.to_string()));
            span.set_status(Status::error(error_type.to_string()));
        }
        span.end();
    }
}

/// A JSON field as an attribute; a null is left out (an attribute cannot be null).
fn attribute(name: String, value: Value) -> Option<KeyValue> {
    Some(match value {
        Value::String(text) => KeyValue::new(name, text),
        Value::Bool(flag) => KeyValue::new(name, flag),
        Value::Number(number) => match number.as_i64() {
            Some(whole) => KeyValue::new(name, whole),
            None => KeyValue::new(name, number.as_f64()?),
        },
        Value::Null | Value::Array(_) | Value::Object(_) => return None,
    })
}
