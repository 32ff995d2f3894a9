//! The harness's end-to-end tests that share a process, one binary: each
//! module was a test binary of its own, and each such binary compiled and
//! linked the host, rmcp, tokio and wasmtime again (about a minute of a CI
//! core apiece). The tests that read tracing's per-thread or global
//! subscriber are in the `logs` binary (logs/capture_missing.rs, guard_liar.rs,
//! policy_fails.rs, swap_attributed.rs).

mod accounts;
mod demo_server_2026;
mod mcp_e2e;
mod mcp_tasks;
mod mcp_versions;
mod observations;
mod resume;
mod sessions_after_cut;
mod shared_state;
mod transport_faults;
