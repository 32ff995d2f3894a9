//! `cargo +nightly fuzz run snapshot --features libfuzzer`: the body is
//! [`agent_retry_fuzz::snapshot`], which the stable replay test runs too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_retry_fuzz::snapshot(data));
