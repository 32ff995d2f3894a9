//! The agent-retry policy core.
//!
//! Everything here is pure: no clock, no sleep, no randomness and no I/O. The host
//! passes `now_ms` and entropy in, and the outside services the policy uses, the
//! shared account budget and the shared state of the circuit breakers, are reached
//! through the [`account::AccountBudget`] and [`shared::SharedState`] traits.
//! The same code runs natively (tests, the conformance runner) and inside the
//! component, where `bindings.rs` is the only file that knows about WIT.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

pub mod account;
pub mod arith;
pub mod backoff;
pub mod breaker;
pub mod budget;
pub mod cat;
pub mod chunked;
pub mod classify;
pub mod config;
pub mod escalation;
pub mod hints;
pub mod json;
pub mod key;
pub mod ratio;
pub mod readable;
pub mod relayed;
pub mod rules;
pub mod run;
pub mod session;
pub mod shared;
pub mod snapshot;
pub mod text;
pub mod time;
pub mod types;

#[cfg(target_arch = "wasm32")]
mod bindings;
#[cfg(target_arch = "wasm32")]
mod wasm_alloc;
