//! The Rust host's integration tests, one binary in the test-only harness crate
//! (compiled without optimisation, the host optimised as a dependency): each
//! module was a test binary of its own, and each such binary compiled and
//! linked the host, rmcp, tokio and wasmtime again (about a minute of a CI core
//! apiece). The tests that need a process of their own stay apart:
//! `hosts/rust/tests/load.rs` sets `AGENT_RETRY_WASM`; `own_process/` reads
//! tracing's per-thread subscriber and is its own stdio server.

mod any_call;
mod component_cache;
mod demo_fixture;
mod events_scenario;
mod guard_runs;
mod live;
mod live_events;
mod live_order;
mod metrics_agree;
mod sandbox;
