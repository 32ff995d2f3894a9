//! What the integration tests that read the wrapper's log lines share: a
//! tracing subscriber keeping every `agent_retry` event's fields as a JSON
//! object (set per thread: these tests run one at a time, main.rs).

use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};
use tracing::field::{Field, Visit};
use tracing::span;

/// Every `agent_retry` line, its fields as JSON.
#[derive(Clone, Default)]
pub struct Lines(pub Arc<Mutex<Vec<Map<String, Value>>>>);

struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), json!(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), json!(value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), json!(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(field.name().into(), json!(format!("{value:?}")));
    }
}

impl tracing::Subscriber for Lines {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if event.metadata().target() == "agent_retry" {
            let mut fields = Fields(Map::new());
            event.record(&mut fields);
            self.0.lock().unwrap().push(fields.0);
        }
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}
