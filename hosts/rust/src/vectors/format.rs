//! The vector file format (see `tests/vectors/README.md`).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

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
    /// The policy configuration; without one, the runner's default (`{}` for
    /// the shared vectors, the update's own configuration for the vectors an
    /// update ships with).
    #[serde(default)]
    pub config: Option<Value>,
    pub steps: Vec<Value>,
}

/// Reads every `*.json` file in `dir`, sorted by name.
pub fn load_dir(dir: &Path) -> Result<Vec<VectorFile>, String> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json") && p.file_name().is_none_or(|n| n != "schema.json"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let mut file = parse_file(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            file.path = path;
            Ok(file)
        })
        .collect()
}

/// Parses one vector file's text.
pub fn parse_file(text: &str) -> Result<VectorFile, String> {
    serde_json::from_str(text).map_err(|e| e.to_string())
}
