//! `cargo +nightly fuzz run tool_error --features libfuzzer`: the body is
//! [`agent_retry_fuzz::tool_error`], which the stable replay test runs too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_retry_fuzz::tool_error(data));
