//! Component start-up (load + instantiate), compiled vs served from the
//! compiled-component cache; prints both and the ratio, and writes them to
//! docs/benchmark.md under "Component start-up".
//!
//!     cargo run --release -p agent-retry-host --example startup [-- --runs N] [-- --no-write]

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_retry_host::{ComponentCache, EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};

/// Loads and instantiates once; the time it took.
fn start(wasm: &[u8], cache: &ComponentCache) -> Duration {
    let started = Instant::now();
    let component = PolicyComponent::from_bytes_cached(wasm, cache).expect("the component loads");
    let _instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(1))).expect("it instantiates");
    started.elapsed()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let runs = args.iter().position(|a| a == "--runs").and_then(|i| args.get(i + 1)).and_then(|n| n.parse().ok()).unwrap_or(5usize).max(1);
    let write = !args.iter().any(|a| a == "--no-write");
    let path = default_wasm_path();
    let wasm = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (run `make wasm` first)", path.display()));
    let dir = std::env::temp_dir().join(format!("agent-retry-startup-{}", std::process::id()));
    let cache = ComponentCache::Dir(dir.clone());
    let cold = median((0..runs).map(|_| start(&wasm, &ComponentCache::Off)).collect());
    start(&wasm, &cache); // writes the entry
    let cached = median((0..runs).map(|_| start(&wasm, &cache)).collect());
    let _ = std::fs::remove_dir_all(&dir);
    let ratio = cold.as_secs_f64() / cached.as_secs_f64().max(1e-9);
    let profile = if cfg!(debug_assertions) { "debug" } else { "release" };
    println!("component start-up ({profile} build, {} bytes, median of {runs}):", wasm.len());
    println!("  compiled       {:>9.1} ms", cold.as_secs_f64() * 1000.0);
    println!("  from the cache {:>9.1} ms", cached.as_secs_f64() * 1000.0);
    println!("  ratio          {ratio:>9.1}x");
    if write {
        let section = format!(
            "## Component start-up\n\n\
             Loading and instantiating the policy component ({} bytes), compiled by\n\
             wasmtime vs deserialised from the compiled-component cache\n\
             (`ComponentCache`, hosts/rust/README.md), median of {runs} in one\n\
             process, {profile} build. Written by `cargo run --release -p\n\
             agent-retry-host --example startup`; the figures depend on the\n\
             machine, the ratio is what to compare.\n\n\
             | start-up | ms |\n|---|---|\n| compiled | {:.1} |\n| from the cache | {:.1} |\n| ratio | {ratio:.1}x |\n",
            wasm.len(),
            cold.as_secs_f64() * 1000.0,
            cached.as_secs_f64() * 1000.0,
        );
        let doc = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/benchmark.md");
        let text = std::fs::read_to_string(&doc).unwrap_or_default();
        let updated = replace_section(&text, "## Component start-up", &section);
        std::fs::write(&doc, updated).expect("docs/benchmark.md is writable");
        println!("written to {}", doc.display());
    }
}

/// `text` with the section under `heading` (up to the next `## ` heading) replaced by `section`, or it appended.
fn replace_section(text: &str, heading: &str, section: &str) -> String {
    let Some(start) = text.find(&format!("\n{heading}\n")).map(|i| i + 1) else {
        let separator = if text.ends_with("\n\n") || text.is_empty() {
            ""
        } else if text.ends_with('\n') {
            "\n"
        } else {
            "\n\n"
        };
        return format!("{text}{separator}{section}");
    };
    let rest = &text[start + heading.len()..];
    let end = rest.find("\n## ").map_or(text.len(), |i| start + heading.len() + i + 1);
    format!("{}{section}{}{}", &text[..start], if end < text.len() { "\n" } else { "" }, &text[end..])
}
