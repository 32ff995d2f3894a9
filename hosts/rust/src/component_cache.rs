//! The compiled component, cached on disk so that a process start does not
//! compile it again (seconds in a debug build): wasmtime's own serialization,
//! keyed by the `.wasm`'s SHA-256 and the engine's compatibility hash
//! (wasmtime's version and the engine's configuration), the file carrying the
//! SHA-256 of what follows. An entry that is missing, unreadable, corrupt or
//! of another engine is ignored and written again; writing is best effort and
//! atomic (a temporary file renamed into place), so that a failed write costs
//! only the compile it would have saved.

use std::hash::Hasher;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Set to any value but `0` or empty: no cache is read or written.
pub const NO_CACHE_ENV: &str = "AGENT_RETRY_NO_CACHE";
/// The cache directory, instead of the default under the user's cache dir.
pub const CACHE_DIR_ENV: &str = "AGENT_RETRY_CACHE_DIR";

/// Where compiled components are cached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ComponentCache {
    /// `$AGENT_RETRY_CACHE_DIR`, else `$XDG_CACHE_HOME/agent-retry`, else
    /// `~/.cache/agent-retry`; none when `$AGENT_RETRY_NO_CACHE` is set.
    #[default]
    Default,
    /// This directory (created when needed).
    Dir(PathBuf),
    /// Always compile.
    Off,
}

impl ComponentCache {
    /// The directory to use, if any.
    pub fn dir(&self) -> Option<PathBuf> {
        match self {
            ComponentCache::Off => None,
            ComponentCache::Dir(dir) => Some(dir.clone()),
            ComponentCache::Default => {
                if std::env::var_os(NO_CACHE_ENV).is_some_and(|v| !v.is_empty() && v != "0") {
                    return None;
                }
                let env_dir = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
                env_dir(CACHE_DIR_ENV)
                    .or_else(|| env_dir("XDG_CACHE_HOME").map(|d| d.join("agent-retry")))
                    .or_else(|| env_dir("HOME").map(|d| d.join(".cache").join("agent-retry")))
            }
        }
    }
}

/// Feeds what `Engine::precompile_compatibility_hash` hashes into SHA-256
/// (stable across processes, unlike the standard library's hasher).
struct Sha256Hasher(Sha256);

impl Hasher for Sha256Hasher {
    fn finish(&self) -> u64 {
        let digest = self.0.clone().finalize();
        u64::from_le_bytes(digest[..8].try_into().unwrap_or_default())
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The entry's file name: the `.wasm`'s SHA-256 and 16 hex of the engine's
/// compatibility hash (which covers wasmtime's version and the engine's configuration).
pub fn entry_name(engine: &Engine, wasm: &[u8]) -> String {
    let mut hasher = Sha256Hasher(Sha256::new());
    std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut hasher);
    let engine_digest = hasher.0.finalize();
    format!("{}-{}.cwasm", hex(&Sha256::digest(wasm)), hex(&engine_digest[..8]))
}

/// Compiles `wasm`, or loads what an earlier process compiled from the same
/// bytes with a compatible engine. `Ok` with whether the cache served it.
pub fn compile(engine: &Engine, wasm: &[u8], cache: &ComponentCache) -> wasmtime::Result<(Component, bool)> {
    let Some(dir) = cache.dir() else {
        return Ok((Component::new(engine, wasm)?, false));
    };
    let path = dir.join(entry_name(engine, wasm));
    if let Some(component) = load(engine, &path) {
        return Ok((component, true));
    }
    let component = Component::new(engine, wasm)?;
    if let Err(e) = store(&dir, &path, &component) {
        tracing::debug!(target: "agent_retry", path = %path.display(), error = %e, "the compiled component was not cached");
    }
    Ok((component, false))
}

/// The cached entry, if it is whole and this engine's: `None` otherwise.
fn load(engine: &Engine, path: &Path) -> Option<Component> {
    let file = std::fs::read(path).ok()?;
    if file.len() < 32 {
        return None;
    }
    let (digest, artifact) = file.split_at(32);
    // A truncated or altered file fails here, before wasmtime reads it.
    if Sha256::digest(artifact).as_slice() != digest {
        return None;
    }
    // SAFETY: `Component::deserialize` runs the machine code it is given, so
    // it must be code wasmtime compiled. It is: the file is ours (written
    // below, from `Component::serialize`, under a name keyed by the .wasm's
    // SHA-256 and this engine's compatibility hash), its content is checked
    // against the SHA-256 written with it (so a truncated or altered file is
    // refused above), and wasmtime checks its own header (its version and
    // the engine's configuration) and refuses a mismatch with an error. The
    // cache directory must not be writable by anyone the process does not
    // trust, as for any code it loads.
    unsafe { Component::deserialize(engine, artifact) }.ok()
}

/// Writes the entry atomically: a temporary file in the same directory, renamed into place.
fn store(dir: &Path, path: &Path, component: &Component) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let artifact = component.serialize()?;
    let mut file = Vec::with_capacity(32 + artifact.len());
    file.extend_from_slice(&Sha256::digest(&artifact));
    file.extend_from_slice(&artifact);
    let temporary = dir.join(format!(".{}.{}.{:x}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("entry"), std::process::id(), nanos()));
    std::fs::write(&temporary, &file)?;
    if let Err(e) = std::fs::rename(&temporary, path) {
        let _ = std::fs::remove_file(&temporary);
        return Err(e.into());
    }
    Ok(())
}

fn nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}
