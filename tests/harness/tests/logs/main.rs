//! The harness tests that read the wrapper's log lines, one binary (each was a
//! test binary of its own, and each compiled and linked the host, rmcp, tokio
//! and wasmtime again: about 50 s of a CI core apiece). They share the
//! process's one subscriber and take turns at it (capture.rs): every test here
//! takes the turn, those that read no line too, or their lines would reach the
//! test holding it.

mod capture;
mod capture_missing;
mod guard_liar;
mod policy_fails;
mod swap_attributed;
