//! The compiled-component cache: a second load is served from it, and an
//! entry that is truncated, altered or missing is ignored and written again.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_retry_host::component_cache::{ComponentCache, entry_name};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("agent-retry-cache-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The one entry in `dir` (the test's own directory holds nothing else once written).
fn entry(dir: &Path) -> PathBuf {
    let entries: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "cwasm")).collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    entries[0].clone()
}

/// The component decides (a 503 is retried): the loaded code works.
fn decides(component: &PolicyComponent) {
    let mut instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(1))).unwrap();
    let policy = instance.load_policy("{}").unwrap().unwrap();
    let classified = instance
        .classify(&policy, &agent_retry_host::component::types::Observation::new(agent_retry_host::component::types::FailureKind::HttpStatus(503), &[], ""), 0)
        .unwrap();
    assert_eq!(classified.class.to_string(), "transient");
}

#[test]
fn a_cached_component_is_served_and_a_damaged_entry_is_rewritten() {
    let wasm = std::fs::read(default_wasm_path()).expect("run `make wasm` first");
    let dir = scratch("damage");
    let cache = ComponentCache::Dir(dir.clone());

    let first = PolicyComponent::from_bytes_cached(&wasm, &cache).unwrap();
    decides(&first);
    let path = entry(&dir);
    let whole = std::fs::read(&path).unwrap();
    let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
    assert!(path.file_name().unwrap().to_str().unwrap().starts_with(&entry_name_prefix(&wasm)));

    // Served from the cache: the entry is not written again.
    let second = PolicyComponent::from_bytes_cached(&wasm, &cache).unwrap();
    decides(&second);
    assert_eq!(std::fs::metadata(&path).unwrap().modified().unwrap(), modified, "a good entry is read, not rewritten");

    // Truncated: ignored (compiled again, and it works) and written whole again.
    std::fs::write(&path, &whole[..whole.len() / 2]).unwrap();
    decides(&PolicyComponent::from_bytes_cached(&wasm, &cache).unwrap());
    assert_eq!(std::fs::read(&path).unwrap(), whole, "the truncated entry was rewritten");

    // Bytes flipped in the middle (the machine code): refused by its digest, rewritten.
    let mut flipped = whole.clone();
    let middle = flipped.len() / 2;
    for byte in &mut flipped[middle..middle + 64] {
        *byte ^= 0xff;
    }
    std::fs::write(&path, &flipped).unwrap();
    decides(&PolicyComponent::from_bytes_cached(&wasm, &cache).unwrap());
    assert_eq!(std::fs::read(&path).unwrap(), whole, "the altered entry was rewritten");

    // Empty, and not even a digest long.
    std::fs::write(&path, b"").unwrap();
    decides(&PolicyComponent::from_bytes_cached(&wasm, &cache).unwrap());
    assert_eq!(std::fs::read(&path).unwrap(), whole);

    // No temporary file is left behind.
    let leftovers: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).filter(|n| n.to_string_lossy().ends_with(".tmp")).collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The entry's name starts with the .wasm's SHA-256 (the rest is the engine's hash).
fn entry_name_prefix(wasm: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(wasm).iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn another_wasm_gets_another_entry_and_off_writes_nothing() {
    let wasm = std::fs::read(default_wasm_path()).expect("run `make wasm` first");
    let dir = scratch("off");
    PolicyComponent::from_bytes_cached(&wasm, &ComponentCache::Off).unwrap();
    assert!(!dir.exists());
    let engine = wasmtime::Engine::default();
    assert_ne!(entry_name(&engine, &wasm), entry_name(&engine, b"\0asm another"));
    assert!(ComponentCache::Off.dir().is_none());
    assert_eq!(ComponentCache::Dir(dir.clone()).dir(), Some(dir));
}

#[test]
fn an_unwritable_cache_dir_costs_only_the_compile() {
    let wasm = std::fs::read(default_wasm_path()).expect("run `make wasm` first");
    // A file where the directory should be: nothing can be written under it.
    let blocker = scratch("blocked");
    std::fs::write(&blocker, b"not a directory").unwrap();
    let component = PolicyComponent::from_bytes_cached(&wasm, &ComponentCache::Dir(blocker.join("cache"))).unwrap();
    decides(&component);
    let _ = std::fs::remove_file(&blocker);
}
