//! `agent-retry sign`: writes the signed manifest of a publication (the
//! `.wasm`, the configuration, the vectors or none, the fleet revision or none
//! for files) with an Ed25519 seed ([`agent_retry_host::manifest`]).

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use agent_retry_host::fleet::MAX_REVISION;
use agent_retry_host::manifest::{public_key_of, sign_publication};
use serde_json::json;

pub struct SignOptions {
    /// A file holding the Ed25519 seed as 64 hex digits.
    pub key: PathBuf,
    pub wasm: PathBuf,
    pub config: PathBuf,
    pub vectors: Option<PathBuf>,
    /// The fleet revision to publish under (default: now, in ms).
    pub revision: Option<u64>,
    /// Sign for files (revision none).
    pub files: bool,
    /// Where to write the manifest (default: stdout).
    pub out: Option<PathBuf>,
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// The seed in `path`: 64 hex digits (surrounding whitespace ignored).
fn seed(path: &Path) -> anyhow::Result<[u8; 32]> {
    let text = String::from_utf8(read(path)?).unwrap_or_default();
    let hex = text.trim();
    let wrong = || anyhow::anyhow!("--key {}: the file must hold the Ed25519 seed as 64 hex digits", path.display());
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(wrong());
    }
    let mut seed = [0u8; 32];
    for (i, byte) in seed.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| wrong())?;
    }
    Ok(seed)
}

pub fn sign(options: SignOptions) -> anyhow::Result<()> {
    let seed = seed(&options.key)?;
    let revision = match (options.files, options.revision) {
        (true, _) => None,
        (false, Some(revision)) if (1..=MAX_REVISION).contains(&revision) => Some(revision),
        (false, Some(revision)) => anyhow::bail!("--revision {revision}: a revision is from 1 to {MAX_REVISION}"),
        // A fleet's default: now in ms, as an unsigned publication's revision is.
        (false, None) => Some(SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis().try_into()?),
    };
    let vectors = options.vectors.as_deref().map(read).transpose()?;
    let manifest = sign_publication(&seed, &read(&options.wasm)?, &read(&options.config)?, vectors.as_deref(), revision);
    match &options.out {
        None => print!("{manifest}"),
        Some(out) => {
            std::fs::write(out, &manifest).map_err(|e| anyhow::anyhow!("{}: {e}", out.display()))?;
            let public_key: String = public_key_of(&seed).iter().map(|b| format!("{b:02x}")).collect();
            println!("{}", json!({ "event": "signed", "manifest": out.display().to_string(), "revision": revision, "public-key": public_key }));
        }
    }
    Ok(())
}
