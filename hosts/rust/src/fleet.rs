//! A policy published once in Redis for a whole fleet of workers: the same
//! deployment that holds the shared account budget.
//!
//! The layout (the Python host's `agent_retry_policy.fleet` uses the same):
//! - `{prefix}:wasm`: the component's bytes;
//! - `{prefix}:config`: the configuration (JSON text);
//! - `{prefix}:manifest`: optional signed manifest ([`crate::manifest`]): one
//!   Ed25519 signature over the `.wasm`'s digest, the configuration's, the
//!   vectors' and the revision; under a key a worker takes nothing else (a
//!   `{prefix}:wasm.sig` of before 0.7, over the `.wasm` alone, is not
//!   accepted, and every publication deletes it);
//! - `{prefix}:vectors`: optional vectors the update ships with (JSON text in
//!   the format of `tests/vectors/*.json`), run by every worker's gate;
//! - `{prefix}:revision`: an integer that grows with every publication: one
//!   more than the last, or the server's time in ms if that is larger, so that
//!   it never repeats after Redis loses its state (a worker that tried revision
//!   N before would otherwise miss a new publication numbered N). A signed
//!   publication is stored under its manifest's revision exactly, which must
//!   be greater than the stored one;
//! - channel `{prefix}:updates`: a message per publication (it only wakes workers).
//!
//! [`publish_policy`] writes all of it in one script ([`PUBLISH_LUA`]), which
//! checks the revision before it writes anything: a worker reading with one
//! `MGET` never sees a `.wasm` of one publication with the configuration of
//! another, and a publication that fails writes nothing. A worker learns of an update from the channel at
//! once, and from polling `{prefix}:revision` otherwise (a missed message, a
//! reconnection, a worker that was down): either way it reads the revision it
//! has not tried yet and puts it through the same gate as a file update.

use std::time::Duration;

use crate::accounts::REDIS_TIMEOUT;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "agent-retry:policy";

/// Where a fleet's policy is published.
#[derive(Clone, Debug)]
pub struct FleetSource {
    /// `redis://host:port/db`.
    pub url: String,
    /// The keys' prefix ([`DEFAULT_PREFIX`] unless several policies share one Redis).
    pub prefix: String,
}

impl FleetSource {
    pub fn new(url: impl Into<String>) -> Self {
        FleetSource { url: url.into(), prefix: DEFAULT_PREFIX.into() }
    }

    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    fn key(&self, name: &str) -> String {
        format!("{}:{name}", self.prefix)
    }

    /// The channel a publication is announced on.
    pub fn channel(&self) -> String {
        self.key("updates")
    }

    fn connect(&self) -> Result<redis::Connection, String> {
        let client = crate::accounts::redis::client(&self.url).map_err(|e| format!("{}: {e}", self.url))?;
        let connection = client.get_connection_with_timeout(REDIS_TIMEOUT).map_err(|e| format!("{}: {e}", self.url))?;
        connection.set_read_timeout(Some(REDIS_TIMEOUT)).map_err(|e| e.to_string())?;
        connection.set_write_timeout(Some(REDIS_TIMEOUT)).map_err(|e| e.to_string())?;
        Ok(connection)
    }

    /// The current revision (0: nothing published yet); a value that is not a
    /// revision ([`parse_revision`]) is an error naming it.
    pub fn revision(&self) -> Result<u64, String> {
        let mut connection = self.connect()?;
        let revision: Option<Vec<u8>> = redis::cmd("GET").arg(self.key("revision")).query(&mut connection).map_err(|e| e.to_string())?;
        revision.map_or(Ok(0), |text| parse_revision(&text).map_err(|e| format!("{}: {e}", self.key("revision"))))
    }

    /// Where the signed manifest is stored.
    pub fn manifest_key(&self) -> String {
        self.key("manifest")
    }

    /// Where a signature over the `.wasm` alone was stored before 0.7.
    pub fn legacy_signature_key(&self) -> String {
        self.key("wasm.sig")
    }

    /// The published policy, read in one `MGET` (one publication's parts).
    pub fn read(&self) -> Result<Publication, String> {
        let mut connection = self.connect()?;
        type Parts = (Option<Vec<u8>>, Option<Vec<u8>>, Option<Vec<u8>>, Option<Vec<u8>>, Option<Vec<u8>>, Option<Vec<u8>>);
        let (wasm, config, manifest, revision, vectors, legacy): Parts = redis::cmd("MGET")
            .arg(self.key("wasm"))
            .arg(self.key("config"))
            .arg(self.key("manifest"))
            .arg(self.key("revision"))
            .arg(self.key("vectors"))
            .arg(self.key("wasm.sig"))
            .query(&mut connection)
            .map_err(|e| e.to_string())?;
        let missing = |what: &str| format!("nothing published at {} (`agent-retry publish` writes it)", self.key(what));
        Ok(Publication {
            wasm: wasm.ok_or_else(|| missing("wasm"))?,
            config: config.ok_or_else(|| missing("config"))?,
            manifest,
            legacy_signature: legacy.is_some(),
            vectors,
            revision: revision.map_or(Ok(0), |text| parse_revision(&text).map_err(|e| format!("{}: {e}", self.key("revision"))))?,
        })
    }

    /// Blocks until a publication is announced or `timeout` passes. `Err` when
    /// Redis cannot be reached (the caller waits and tries again).
    pub(crate) fn wait_for_announcement(&self, timeout: Duration) -> Result<bool, String> {
        let mut connection = self.connect()?;
        let mut pubsub = connection.as_pubsub();
        pubsub.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
        pubsub.subscribe(self.channel()).map_err(|e| e.to_string())?;
        match pubsub.get_message() {
            Ok(_) => Ok(true),
            Err(e) if e.is_timeout() => Ok(false),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// One publication, as read.
#[derive(Clone, Debug)]
pub struct Publication {
    pub wasm: Vec<u8>,
    pub config: Vec<u8>,
    /// The signed manifest (`{prefix}:manifest`), if any.
    pub manifest: Option<Vec<u8>>,
    /// Whether a signature over the `.wasm` alone (`{prefix}:wasm.sig`, before 0.7) is stored.
    pub legacy_signature: bool,
    pub vectors: Option<Vec<u8>>,
    /// 0 when nothing is stored at `{prefix}:revision`.
    pub revision: u64,
}

/// The largest revision: 2^53 − 1, so that every host (JavaScript's numbers
/// included) and Redis's Lua read it exactly.
pub const MAX_REVISION: u64 = (1 << 53) - 1;

/// The one revision parser (the Python and Node hosts' are checked against the
/// same vectors, `tests/vectors/fleet/revisions.json`): decimal digits, no sign,
/// space or leading zero, from 1 to [`MAX_REVISION`]. Anything else is refused
/// with what it is, never read as some number.
pub fn parse_revision(text: &[u8]) -> Result<u64, String> {
    let shown = || String::from_utf8_lossy(&text[..text.len().min(40)]).into_owned();
    let digits = !text.is_empty() && text.iter().all(u8::is_ascii_digit) && text[0] != b'0';
    let value = if digits && text.len() <= 16 { std::str::from_utf8(text).ok().and_then(|t| t.parse::<u64>().ok()) } else { None };
    match value {
        Some(revision) if revision <= MAX_REVISION => Ok(revision),
        _ => Err(format!("{:?} is not a revision (decimal digits from 1 to {MAX_REVISION})", shown())),
    }
}

/// A publication, written by one script so that it is all or nothing. KEYS:
/// wasm, config, manifest, vectors, revision, wasm.sig. ARGV: the wasm, the
/// configuration, the manifest, the vectors, the channel, "1" or "0" for
/// whether a manifest and vectors are given (else their keys are deleted), and
/// the manifest's revision ("" when unsigned). The stored revision is checked
/// first (the same rule as [`parse_revision`]); a value that is not one fails
/// the script before anything is written. A signed publication is stored under
/// its manifest's revision, refused (nothing written) unless that is a
/// revision greater than the stored one; an unsigned one gets one more than the
/// stored revision, or the server's time in ms if larger, so that it never
/// repeats after Redis loses its state. `wasm.sig` (a signature over the
/// `.wasm` alone, before 0.7) is always deleted. Returns the new revision.
pub const PUBLISH_LUA: &str = r#"
local current = redis.call('GET', KEYS[5])
local r = 0
if current then
  if string.len(current) > 16 or not string.match(current, '^[1-9][0-9]*$') or tonumber(current) > 9007199254740991 then
    return redis.error_reply('the revision at ' .. KEYS[5] .. ' is not a revision (decimal digits from 1 to 9007199254740991): nothing was written')
  end
  r = tonumber(current)
end
local next
if ARGV[8] ~= '' then
  if string.len(ARGV[8]) > 16 or not string.match(ARGV[8], '^[1-9][0-9]*$') or tonumber(ARGV[8]) > 9007199254740991 then
    return redis.error_reply('the revision of the manifest, ' .. ARGV[8] .. ', is not a revision (decimal digits from 1 to 9007199254740991): nothing was written')
  end
  next = tonumber(ARGV[8])
  if next <= r then
    return redis.error_reply('the revision of the manifest, ' .. ARGV[8] .. ', is not greater than the stored revision ' .. string.format('%d', r) .. ' at ' .. KEYS[5] .. ': sign it again for a newer revision; nothing was written')
  end
else
  if r >= 9007199254740991 then
    return redis.error_reply('the revision at ' .. KEYS[5] .. ' is the largest there is: nothing was written')
  end
  local t = redis.call('TIME')
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  next = r + 1
  if next < ms then next = ms end
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
if ARGV[6] == '1' then redis.call('SET', KEYS[3], ARGV[3]) else redis.call('DEL', KEYS[3]) end
if ARGV[7] == '1' then redis.call('SET', KEYS[4], ARGV[4]) else redis.call('DEL', KEYS[4]) end
redis.call('DEL', KEYS[6])
redis.call('SET', KEYS[5], string.format('%d', next))
redis.call('PUBLISH', ARGV[5], 'published')
return next
"#;

/// Publishes a policy for every worker of the fleet in one script and
/// announces it; returns the new revision. `manifest`: the signed manifest
/// ([`crate::manifest::sign_publication`]); the publication is stored under its
/// revision, and refused before anything is written when it is malformed, has
/// no revision (one signed for files), or does not cover this `.wasm`, this
/// configuration and these vectors. A stored revision that is not one, or a
/// manifest's revision not greater than it, fails it, and nothing is written.
/// Workers gate it as any update: a worker refuses what does not pass and
/// keeps its last good policy.
pub fn publish_policy(source: &FleetSource, wasm: &[u8], config_json: &str, manifest: Option<&str>, vectors: Option<&str>) -> Result<u64, String> {
    let revision = match manifest {
        Some(text) => {
            let at = "the manifest to publish";
            let parsed = crate::manifest::parse_manifest(text.as_bytes(), at).map_err(|e| e.to_string())?;
            crate::manifest::check_covers(&parsed, at, wasm, config_json.as_bytes(), vectors.map(str::as_bytes))
                .map_err(|e| format!("{e}: nothing was written"))?;
            let revision = parsed
                .revision
                .ok_or_else(|| format!("{at} has revision none (signed for files): sign it with a revision to publish it to a fleet; nothing was written"))?;
            revision.to_string()
        }
        None => String::new(),
    };
    let mut connection = source.connect()?;
    let flag = |given: bool| if given { "1" } else { "0" };
    redis::Script::new(PUBLISH_LUA)
        .key(source.key("wasm"))
        .key(source.key("config"))
        .key(source.key("manifest"))
        .key(source.key("vectors"))
        .key(source.key("revision"))
        .key(source.key("wasm.sig"))
        .arg(wasm)
        .arg(config_json)
        .arg(manifest.unwrap_or_default())
        .arg(vectors.unwrap_or_default())
        .arg(source.channel())
        .arg(flag(manifest.is_some()))
        .arg(flag(vectors.is_some()))
        .arg(revision)
        .invoke(&mut connection)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every host's parser gives the same answers (`tests/vectors/fleet/revisions.json`;
    /// before, Python took −5 and 2^64, Rust i64::MAX, Node none).
    #[test]
    fn the_revision_vectors() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/vectors/fleet/revisions.json");
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let cases = doc["cases"].as_array().unwrap();
        assert!(cases.len() >= 19);
        for case in cases {
            let got = parse_revision(case["text"].as_str().unwrap().as_bytes()).ok();
            assert_eq!(got, case["revision"].as_u64(), "{}", case["description"]);
        }
    }
}
