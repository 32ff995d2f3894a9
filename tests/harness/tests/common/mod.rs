//! What the harness's log-reading tests share: the `tracing` lines captured as
//! JSON text (each test binary that captures is its own process, because a
//! subscriber is per thread or per process).

use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};

/// The tracing lines written so far, as text.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// A JSON subscriber writing here.
    pub fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
        let writer = self.clone();
        tracing_subscriber::fmt().json().with_writer(move || writer.clone()).finish()
    }

    /// Everything captured, as text.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }

    /// The `agent_retry.attempt` lines so far, each its JSON `fields`.
    #[allow(dead_code)] // not every test binary reads attempt lines
    pub fn attempts(&self) -> Vec<Map<String, Value>> {
        self.text()
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter_map(|line| line.get("fields").and_then(Value::as_object).cloned())
            .filter(|fields| fields.get("event").and_then(Value::as_str) == Some("agent_retry.attempt"))
            .collect()
    }
}
