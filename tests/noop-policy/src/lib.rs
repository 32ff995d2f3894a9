//! The boundary floor: a component that exports the same world as the policy,
//! with the same signatures, and does no work. Each export answers a fixed,
//! well-formed value (a retry of 0 ms, a call admitted as call 1), so a host
//! runs its retry loop against it unchanged; what a benchmark measures on it is
//! the cost of crossing the boundary, which no policy can go below.
//!
//!     cargo build -p agent-retry-noop --target wasm32-wasip2 --profile wasm-release
//!
//! (`make noop`: target/noop/agent_retry_noop.wasm). Never a policy to serve.
#![cfg_attr(target_arch = "wasm32", no_std)]

#[cfg(target_arch = "wasm32")]
mod component;
