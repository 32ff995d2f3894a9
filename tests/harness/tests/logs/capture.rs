//! The wrapper's `tracing` lines, captured as JSON text for the tests that read
//! them. One subscriber serves the whole process, installed before the first
//! event: a per-thread subscriber misses the events whose callsites another
//! thread registered first, and a global one cannot tell tests apart, so these
//! tests take turns ([`capture`]) and each reads only what came while it held
//! the turn.

use std::sync::{Arc, Mutex, MutexGuard, Once, PoisonError};

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
    /// Everything captured, as text.
    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }

    /// The `agent_retry.attempt` lines so far, each its JSON `fields`.
    pub fn attempts(&self) -> Vec<Map<String, Value>> {
        self.text()
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter_map(|line| line.get("fields").and_then(Value::as_object).cloned())
            .filter(|fields| fields.get("event").and_then(Value::as_str) == Some("agent_retry.attempt"))
            .collect()
    }
}

/// Where the process's subscriber writes: the lines of the test holding the turn.
static SINK: Mutex<Option<Captured>> = Mutex::new(None);
/// The turn: one capturing test at a time.
static TURN: Mutex<()> = Mutex::new(());

/// A test's turn at the log: its lines go to `captured` until it is dropped.
pub struct Capture {
    pub captured: Captured,
    _turn: MutexGuard<'static, ()>,
}

impl Drop for Capture {
    fn drop(&mut self) {
        *SINK.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// Writes each line to the current test's [`Captured`], or nowhere between tests.
struct SinkWriter;

impl std::io::Write for SinkWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(captured) = SINK.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
            captured.write(buf)?;
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Waits for the turn, then captures the process's lines (a JSON subscriber at
/// INFO, the wrapper's level for every decision's words) until the result is dropped.
pub fn capture() -> Capture {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::fmt().json().with_writer(|| SinkWriter).finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber of this test binary");
    });
    // A test that failed holding the turn poisons it; the next one still runs.
    let turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
    let captured = Captured::default();
    *SINK.lock().unwrap_or_else(PoisonError::into_inner) = Some(captured.clone());
    Capture { captured, _turn: turn }
}
