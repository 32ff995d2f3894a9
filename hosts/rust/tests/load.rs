//! Where `PolicyComponent::load` finds the component: the argument, then
//! `$AGENT_RETRY_WASM`, then the component embedded in the crate (none in the
//! repository), then the repository's build output.

use std::path::Path;

use agent_retry_host::{BUNDLED_WASM, PolicyComponent, default_wasm_path};

#[test]
fn the_argument_then_the_environment_then_the_build_output() {
    // One test, so that nothing else in this binary reads the variable meanwhile.
    // SAFETY: the only test in this binary; no other thread reads the environment.
    unsafe { std::env::remove_var("AGENT_RETRY_WASM") };
    assert!(BUNDLED_WASM.is_none(), "a repository build embeds no component");
    let built = default_wasm_path();
    assert!(PolicyComponent::load(None).is_ok(), "the build output at {}: run `make wasm`", built.display());
    assert!(PolicyComponent::load(Some(&built)).is_ok());

    let missing = Path::new("/nonexistent/agent_retry_policy.wasm");
    let err = PolicyComponent::load(Some(missing)).err().expect("a missing argument fails").to_string();
    assert!(err.contains("/nonexistent/agent_retry_policy.wasm") && err.contains("AGENT_RETRY_WASM"), "{err}");

    // SAFETY: as above.
    unsafe { std::env::set_var("AGENT_RETRY_WASM", missing) };
    let err = PolicyComponent::load(None).err().expect("a missing $AGENT_RETRY_WASM fails, not falls back").to_string();
    assert!(err.contains("/nonexistent/agent_retry_policy.wasm"), "{err}");
    // SAFETY: as above.
    unsafe { std::env::set_var("AGENT_RETRY_WASM", &built) };
    assert!(PolicyComponent::load(None).is_ok());
    unsafe { std::env::remove_var("AGENT_RETRY_WASM") };
}
