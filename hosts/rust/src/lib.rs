//! The host side of agent-retry in Rust: load the policy component in wasmtime,
//! give it what it imports (the account budget and entropy), and call it.
//!
//! The policy lives in the component; this crate owns only the mechanism: the
//! sandbox, the imports, and the loop that calls, sleeps and retries.

pub mod accounts;
pub mod canonical;
pub mod component;
pub mod config_defaults;
pub mod dynamic;
pub mod entropy;
pub mod fault;
pub mod fleet;
pub mod guard;
pub mod labels;
pub mod limits;
pub mod live;
pub mod manifest;
pub mod mcp;
pub mod steps;
pub mod vectors;

pub use accounts::{AccountBudgetBackend, AccountsError, EmbeddedAccounts, RedisAccounts, SharedAccounts};
pub use component::{Admission, BUNDLED_WASM, HostServices, LoadError, Outcome, PolicyComponent, PolicyInstance, SandboxLimits, default_wasm_path};
pub use entropy::EntropySource;
pub use fault::PolicyFault;
pub use fleet::{FleetSource, publish_policy};
pub use live::{Integrity, LivePolicy, Loaded, PolicyIdentity, PolicySource, UpdateError, UpdateMetrics};
pub use manifest::{ManifestError, sign_publication};
