//! The fuzz targets' bodies, as plain functions of bytes: libFuzzer calls them
//! (`fuzz_targets/`, nightly) and so does the stable replay test
//! (`tests/replay.rs`), which runs the committed corpus and seeded mutations.
//!
//! Every target checks invariants, not only "no panic"; a broken one panics with
//! a message that says which. The inputs of `headers`, `tool_error`, `config` and
//! `json` are text, so that the corpus (`corpus/<target>/`) is readable:
//!
//! - `headers`, `tool_error`: optional directive lines first (`@status 429`,
//!   `@now 1764460800000`, `@host 503`, `@rpc -32603`, `@tool search`), then
//!   `Name: value` lines (`headers`) or the body (`tool_error`; a NUL byte starts
//!   the structured content);
//! - `config`: configuration JSON text; `json`: any text; `snapshot`: any text
//!   as an escalated run's snapshot (contract 0.9.0);
//! - `run`: bytes read by `arbitrary` into a configuration and a sequence of
//!   begin-call / record-outcome / report with arbitrary outcomes, times and
//!   entropy (see [`run`]);
//! - `flat`: bytes read by `arbitrary` into a configuration and a sequence of the
//!   component's flat exports (`begin-call`, `record-failure` with the headers as
//!   one text of lines, `record-success`, ..., `last-decision`, `report`), as
//!   `guest/src/bindings.rs` calls the core (see [`flat`]).

mod flat_target;
pub mod mutate;
pub mod nasty;
pub mod oracle;
mod run_target;
mod snapshot_target;
mod text_targets;

pub use flat_target::{FlatCase, FlatOutput, check_header_split, flat, flat_case};
pub use run_target::{RunCase, RunOutput, run, run_case};
pub use snapshot_target::snapshot;
pub use text_targets::{HeadersCase, TEXT_CONFIGS, ToolErrorCase, config, headers, json, text_configs, tool_error};

/// A target's body: one input, checked; a broken invariant panics.
pub type Target = fn(&[u8]);

/// Every target, by the name of its corpus directory and libFuzzer binary.
pub const TARGETS: &[(&str, Target)] =
    &[("headers", headers), ("config", config), ("json", json), ("tool_error", tool_error), ("run", run), ("flat", flat), ("snapshot", snapshot)];

/// The clock the text targets use unless `@now` says otherwise: 2025-11-30T00:00:00Z.
pub const DEFAULT_NOW_MS: u64 = 1_764_460_800_000;

static STRICT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether the invariants broken by the known bugs (README, "Findings") are
/// checked too: `AGENT_RETRY_FUZZ_STRICT=1`, or [`set_strict`] (the regression tests).
pub fn strict() -> bool {
    static FROM_ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    STRICT.load(std::sync::atomic::Ordering::Relaxed) || *FROM_ENV.get_or_init(|| std::env::var_os("AGENT_RETRY_FUZZ_STRICT").is_some_and(|v| v == "1"))
}

/// Turns the known bugs' invariants on for this process.
pub fn set_strict(on: bool) {
    STRICT.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// An invariant a known bug breaks (`$id` names it in the README's findings):
/// checked only in strict mode, so that the long runs go on finding others.
#[macro_export]
macro_rules! known_bug {
    ($id:literal, $cond:expr, $($what:tt)+) => {
        if !$cond && $crate::strict() {
            panic!("broken invariant (known bug {}): {}", $id, format!($($what)+));
        }
    };
}

/// Checks an invariant: panics with `what` and the values when it breaks.
#[macro_export]
macro_rules! invariant {
    ($cond:expr, $($what:tt)+) => {
        if !$cond {
            panic!("broken invariant: {}", format!($($what)+));
        }
    };
}
