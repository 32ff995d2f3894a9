//! `cargo +nightly fuzz run json --features libfuzzer`: the body is
//! [`agent_retry_fuzz::json`], which the stable replay test runs too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_retry_fuzz::json(data));
