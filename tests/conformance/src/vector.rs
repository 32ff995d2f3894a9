//! The vector file format (see `tests/vectors/README.md`).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// The clock at the start of every case unless a step says otherwise:
/// 2025-11-30T00:00:00Z.
pub const DEFAULT_START_MS: u64 = 1_764_460_800_000;

/// The entropy a step uses when it gives none: the middle of the range.
pub const DEFAULT_ENTROPY: u64 = 0x8000_0000_0000_0000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VectorFile {
    pub description: String,
    pub cases: Vec<Case>,
    #[serde(skip)]
    pub path: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub description: String,
    #[serde(default)]
    pub comment: Option<String>,
    /// The policy configuration (default `{}`).
    #[serde(default = "empty_object")]
    pub config: Value,
    pub steps: Vec<Value>,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// Reads every `*.json` file in `dir`, sorted by name.
pub fn load_dir(dir: &Path) -> Result<Vec<VectorFile>, String> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json") && !p.file_name().is_some_and(|n| n == "schema.json"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let mut file: VectorFile = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            file.path = path;
            Ok(file)
        })
        .collect()
}

/// A u64 written as a JSON number or a `0x` hex string (JSON numbers lose
/// precision above 2^53 in JavaScript).
pub fn parse_u64(value: &Value) -> Result<u64, String> {
    match value {
        Value::Number(n) => n.as_u64().ok_or_else(|| format!("{n} is not a u64")),
        Value::String(s) => {
            let hex = s.strip_prefix("0x").ok_or_else(|| format!("\"{s}\" is not a 0x hex u64"))?;
            u64::from_str_radix(hex, 16).map_err(|e| format!("\"{s}\": {e}"))
        }
        other => Err(format!("{other} is not a u64")),
    }
}
