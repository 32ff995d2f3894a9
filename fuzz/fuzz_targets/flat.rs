//! `cargo +nightly fuzz run flat --features libfuzzer`: the body is
//! [`agent_retry_fuzz::flat`], which the stable replay test runs too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| agent_retry_fuzz::flat(data));
