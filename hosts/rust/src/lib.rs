//! The host side of agent-retry in Rust: load the policy component in wasmtime,
//! give it what it imports (the account budget and entropy), and call it.
//!
//! The policy lives in the component; this crate owns only the mechanism: the
//! sandbox, the imports, and the loop that calls, sleeps and retries.

pub mod accounts;
pub mod any_call;
mod call_core;
pub mod canonical;
pub mod component;
pub mod component_cache;
pub mod config_defaults;
mod display;
pub mod dynamic;
pub mod entropy;
pub mod events;
pub mod fault;
pub mod fleet;
pub mod guard;
pub mod labels;
mod limit;
pub mod limits;
pub mod live;
pub mod manifest;
pub mod mcp;
#[cfg(feature = "otel")]
pub mod otel;
pub mod shared_state;
pub mod steps;
pub mod testing;
pub mod time_source;
pub mod vectors;
mod verdicts;

pub use accounts::{AccountBudgetBackend, AccountsError, EmbeddedAccounts, RedisAccounts, SharedAccounts};
pub use any_call::{AnyCallError, Attempt, CallOptions, Observed, PolicyRun, ToObservation, WithPolicyOptions, observe_response};
pub use component::{
    Admission, BUNDLED_WASM, ComponentCache, HostServices, LoadError, Outcome, PolicyComponent, PolicyInstance, SandboxLimits, default_wasm_path,
};
pub use entropy::EntropySource;
pub use events::{Event, RetryHooks};
pub use fault::PolicyFault;
pub use fleet::{FleetSource, publish_policy};
pub use live::{Integrity, LivePolicy, Loaded, PolicyIdentity, PolicySource, UpdateError, UpdateMetrics};
pub use manifest::{ManifestError, sign_publication};
