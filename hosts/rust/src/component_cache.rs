//! The compiled component, cached on disk so that a process start does not
//! compile it again (seconds in a debug build): wasmtime's own serialization,
//! keyed by the `.wasm`'s SHA-256 and the engine's compatibility hash
//! (wasmtime's version and the engine's configuration), the file carrying the
//! SHA-256 of what follows. An entry that is missing, unreadable, corrupt or
//! of another engine is ignored and written again; writing is best effort and
//! atomic (a temporary file renamed into place), so that a failed write costs
//! only the compile it would have saved.
//!
//! Loading an entry runs its machine code, so on Unix an entry is read only
//! from a directory and a file that this user owns and nobody else can write
//! (the rule `ssh` applies to its keys); the directory is created `0700` and
//! entries `0600`. A cache that fails the check is neither read nor written.

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
    if let Err(e) = create_dir(&dir).and_then(|()| store(&dir, &path, &component)) {
        tracing::debug!(target: "agent_retry", path = %path.display(), error = %e, "the compiled component was not cached");
    }
    Ok((component, false))
}

/// The cached entry, if it is whole and this engine's: `None` otherwise.
fn load(engine: &Engine, path: &Path) -> Option<Component> {
    let file = match path.parent().map_or(Ok(()), private_dir).and_then(|()| read_private_file(path)) {
        Ok(file) => file,
        Err(why) => {
            // Said out loud when there is something to distrust (an entry, or a directory others
            // may write, which an old umask may have left): otherwise the cache is silently off.
            if path.exists() || (why != NO_ENTRY && path.parent().is_some_and(Path::exists)) {
                tracing::warn!(target: "agent_retry", path = %path.display(), why, "the cached component is not trusted: compiling instead");
            }
            return None;
        }
    };
    if file.len() < 32 {
        return None;
    }
    let (digest, artifact) = file.split_at(32);
    // A truncated or altered file fails here, before wasmtime reads it.
    if Sha256::digest(artifact).as_slice() != digest {
        return None;
    }
    // SAFETY: `Component::deserialize` runs the machine code it is given, so
    // it must be code wasmtime compiled. It is: the file and its directory
    // belong to this user and nobody else can write them (checked above, on
    // Unix), it was written below from `Component::serialize` under a name
    // keyed by the .wasm's SHA-256 and this engine's compatibility hash, its
    // content matches the SHA-256 written with it (a truncated or damaged
    // file is refused above), and wasmtime checks its own header (its
    // version and the engine's configuration) and refuses a mismatch.
    unsafe { Component::deserialize(engine, artifact) }.ok()
}

/// Writes the entry atomically: a temporary file in the same directory, renamed into place.
fn store(dir: &Path, path: &Path, component: &Component) -> anyhow::Result<()> {
    private_dir(dir).map_err(|why| anyhow::anyhow!("{}: {why}", dir.display()))?;
    let artifact = component.serialize()?;
    let mut file = Vec::with_capacity(32 + artifact.len());
    file.extend_from_slice(&Sha256::digest(&artifact));
    file.extend_from_slice(&artifact);
    let temporary = dir.join(format!(".{}.{}.{:x}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("entry"), std::process::id(), nanos()));
    write_new_private(&temporary, &file)?;
    if let Err(e) = std::fs::rename(&temporary, path) {
        let _ = std::fs::remove_file(&temporary);
        return Err(e.into());
    }
    Ok(())
}

fn nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
}

/// Creates the cache directory (and its parents) readable by this user only.
fn create_dir(dir: &Path) -> anyhow::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    Ok(builder.create(dir)?)
}

/// A new file (never an existing one, nor through a symlink) readable by this user only.
fn write_new_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)?.write_all(bytes)
}

/// `Ok` when `dir` (followed if a symlink) is a directory this user owns that
/// no one else may write; the reason otherwise.
fn private_dir(dir: &Path) -> Result<(), &'static str> {
    let meta = std::fs::metadata(dir).map_err(|_| "the cache directory cannot be read")?;
    if !meta.is_dir() {
        return Err("the cache path is not a directory");
    }
    owned_and_private(&meta)
}

const NO_ENTRY: &str = "no entry";

/// The bytes of `path` when it is a regular file (never followed through a
/// symlink) this user owns that no one else may write. The file is opened
/// once and checked and read through that one handle, so that it cannot be
/// swapped between the check and the read.
fn read_private_file(path: &Path) -> Result<Vec<u8>, &'static str> {
    use std::io::Read;
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NOFOLLOW);
    let mut file =
        options.open(path).map_err(|e| if e.kind() == std::io::ErrorKind::NotFound { NO_ENTRY } else { "the entry cannot be opened (a symlink?)" })?;
    let meta = file.metadata().map_err(|_| "the entry cannot be read")?;
    if !meta.file_type().is_file() {
        return Err("the entry is not a regular file");
    }
    owned_and_private(&meta)?;
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.read_to_end(&mut bytes).map_err(|_| "the entry cannot be read")?;
    Ok(bytes)
}

#[cfg(unix)]
fn owned_and_private(meta: &std::fs::Metadata) -> Result<(), &'static str> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err("owned by another user");
    }
    if meta.mode() & 0o022 != 0 {
        return Err("writable by group or others");
    }
    Ok(())
}

#[cfg(not(unix))]
fn owned_and_private(_meta: &std::fs::Metadata) -> Result<(), &'static str> {
    Ok(())
}
