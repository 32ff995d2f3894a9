// Embeds the policy component when the crate carries one (the published crate:
// `make dist` copies it into component/ before `cargo package`). Then
// `PolicyComponent::load(None)` needs no file at run time; without it (the
// repository) the crate loads $AGENT_RETRY_WASM or the repository's build output.
use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(agent_retry_bundled)");
    println!("cargo::rerun-if-changed=component");
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let wasm = Path::new(&manifest).join("component/agent_retry_policy.wasm");
    if wasm.is_file() {
        println!("cargo::rustc-cfg=agent_retry_bundled");
        println!("cargo::rustc-env=AGENT_RETRY_BUNDLED_WASM={}", wasm.display());
    }
}
