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
        // observations.json has its own format ([`ObservationFile`]).
        .filter(|p| p.extension().is_some_and(|x| x == "json") && p.file_name().is_none_or(|n| n != "schema.json" && n != OBSERVATIONS_FILE))
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

/// The vector file of raw transport observations, in the directory of the others.
pub const OBSERVATIONS_FILE: &str = "observations.json";

/// `observations.json`: what a host's capture code must make of an answer,
/// and the verdict that observation must produce (every case is attempt 1 of
/// the read tool `lookup_order`, under the file's `config`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObservationFile {
    pub description: String,
    pub config: Value,
    pub cases: Vec<ObservationCase>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObservationCase {
    pub description: String,
    #[serde(default)]
    pub comment: Option<String>,
    /// The demo server's fault object that produces the answer.
    pub answer: Value,
    /// Whether the request carried `Mcp-Session-Id` (a 2025-11-25 handshake session).
    #[serde(rename = "session-id-sent")]
    pub session_id_sent: bool,
    /// The readable failure the capture code must produce from the answer.
    pub observation: Value,
    /// `{"action", "class", "rule", "reconnect"}` of the verdict.
    pub expect: Value,
}

/// Parses `observations.json`'s text.
pub fn parse_observation_file(text: &str) -> Result<ObservationFile, String> {
    serde_json::from_str(text).map_err(|e| e.to_string())
}
