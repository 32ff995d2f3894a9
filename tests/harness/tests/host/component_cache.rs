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

/// Loading an entry runs its machine code: on Unix only a private directory's
/// private, regular entry is served (the hostile review of issue 25 found any
/// entry deserialised, wherever it came from).
#[cfg(unix)]
mod only_private_entries_are_served {
    use std::os::unix::fs::PermissionsExt;

    use agent_retry_host::component_cache::{ComponentCache, compile};

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
    }

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Compiles through the cache: whether the cache served it.
    fn served(engine: &wasmtime::Engine, wasm: &[u8], dir: &Path) -> bool {
        compile(engine, wasm, &ComponentCache::Dir(dir.to_path_buf())).unwrap().1
    }

    #[test]
    fn a_new_cache_is_private_and_served() {
        let wasm = std::fs::read(default_wasm_path()).expect("run `make wasm` first");
        let engine = wasmtime::Engine::default();
        let dir = scratch("private").join("nested");
        assert!(!served(&engine, &wasm, &dir), "nothing cached yet");
        assert_eq!(mode(&dir), 0o700, "the directory is created for this user only");
        assert_eq!(mode(&entry(&dir)), 0o600, "the entry is written for this user only");
        assert!(served(&engine, &wasm, &dir), "a private entry is served");
        let _ = std::fs::remove_dir_all(dir.parent().unwrap());
    }

    #[test]
    fn a_directory_others_may_write_is_neither_read_nor_written() {
        let wasm = std::fs::read(default_wasm_path()).expect("run `make wasm` first");
        let engine = wasmtime::Engine::default();
        let dir = scratch("shared-dir");
        assert!(!served(&engine, &wasm, &dir));
        let path = entry(&dir);
        chmod(&dir, 0o777);
        assert!(!served(&engine, &wasm, &dir), "an entry in a world-writable directory is not run");
        chmod(&dir, 0o770);
        assert!(!served(&engine, &wasm, &dir), "nor in a group-writable one");
        std::fs::remove_file(&path).unwrap();
        assert!(!served(&engine, &wasm, &dir));
        assert!(!path.exists(), "nothing is written into a directory others may write");
        chmod(&dir, 0o700);
        assert!(!served(&engine, &wasm, &dir));
        assert!(served(&engine, &wasm, &dir), "private again: cached and served");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_entry_others_may_write_or_a_symlink_is_replaced_not_run() {
        let wasm = std::fs::read(default_wasm_path()).expect("run `make wasm` first");
        let engine = wasmtime::Engine::default();
        let dir = scratch("shared-entry");
        assert!(!served(&engine, &wasm, &dir));
        let path = entry(&dir);

        chmod(&path, 0o666);
        assert!(!served(&engine, &wasm, &dir), "a world-writable entry is not run");
        assert_eq!(mode(&path), 0o600, "it is replaced by a private one");
        assert!(served(&engine, &wasm, &dir));

        // A symlink to a good entry elsewhere: not followed, replaced by a private file.
        let elsewhere = scratch("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        let target = elsewhere.join("entry.cwasm");
        std::fs::rename(&path, &target).unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        assert!(!served(&engine, &wasm, &dir), "a symlinked entry is not run");
        assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_file(), "the symlink was replaced by a file");
        assert!(served(&engine, &wasm, &dir));
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&elsewhere);
    }
}
