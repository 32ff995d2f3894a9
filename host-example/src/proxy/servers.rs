//! Several upstream servers behind one HTTP proxy (`--servers FILE`), each
//! served at `/NAME/mcp` with settings of its own:
//!
//! ```json
//! {"orders": {"upstream": "https://orders.internal/mcp"},
//!  "files": {"command": ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/data"],
//!            "settings": {"key-argument": "request_id"}}}
//! ```
//!
//! A server without `settings` takes the `--settings` file's (or the
//! defaults). An unknown member, a bad or repeated name, or a server with
//! both or neither of `upstream` and `command` is refused at start, named.

use std::fmt;
use std::path::Path;

use serde::Deserialize;
use serde::de::{Deserializer, Error as _, MapAccess, Visitor};

use super::settings::Settings;

/// Where an upstream server is.
#[derive(Clone, Debug)]
pub enum Upstream {
    Url(String),
    Command(Vec<String>),
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct Entry {
    #[serde(default)]
    upstream: Option<String>,
    #[serde(default)]
    command: Option<Vec<String>>,
    #[serde(default)]
    settings: Option<serde_json::Value>,
}

/// The file's servers in their order; a name given twice is refused (a JSON
/// object's later member would silently win).
struct Entries(Vec<(String, Entry)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Servers;
        impl<'de> Visitor<'de> for Servers {
            type Value = Entries;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of servers by name")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
                let mut entries: Vec<(String, Entry)> = Vec::new();
                while let Some((name, entry)) = map.next_entry::<String, Entry>()? {
                    if entries.iter().any(|(seen, _)| *seen == name) {
                        return Err(A::Error::custom(format!("the server '{name}' is named twice")));
                    }
                    entries.push((name, entry));
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_map(Servers)
    }
}

/// One named server of the file.
pub struct Server {
    pub name: String,
    pub upstream: Upstream,
    pub settings: Settings,
}

/// Reads `path`; `defaults` are the settings of a server that names none.
pub fn read(path: &Path, defaults: &Settings) -> anyhow::Result<Vec<Server>> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read the servers file {}: {e}", path.display()))?;
    parse(&text, defaults).map_err(|e| anyhow::anyhow!("the servers file {}: {e}", path.display()))
}

pub fn parse(text: &str, defaults: &Settings) -> Result<Vec<Server>, String> {
    let Entries(entries) = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if entries.is_empty() {
        return Err("no servers".into());
    }
    entries
        .into_iter()
        .map(|(name, entry)| {
            if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
                return Err(format!("'{name}' is not a server name: 1 to 64 letters, digits, '-' or '_' (it is a path of the URL)"));
            }
            let upstream = match (entry.upstream, entry.command) {
                (Some(url), None) => Upstream::Url(url),
                (None, Some(command)) if !command.is_empty() => Upstream::Command(command),
                _ => return Err(format!("{name}: give exactly one of 'upstream' (a URL) and 'command' (a non-empty list)")),
            };
            let settings = match entry.settings {
                Some(settings) => Settings::parse(&settings.to_string()).map_err(|e| format!("{name}.settings: {e}"))?,
                None => defaults.clone(),
            };
            Ok(Server { name, upstream, settings })
        })
        .collect()
}
