//! A policy published once in Redis for a whole fleet of workers: the same
//! deployment that holds the shared account budget.
//!
//! The layout (the Python host's `agent_retry_policy.fleet` uses the same):
//! - `{prefix}:wasm`: the component's bytes;
//! - `{prefix}:config`: the configuration (JSON text);
//! - `{prefix}:wasm.sig`: optional detached Ed25519 signature of the `.wasm`
//!   (64 raw bytes or 128 hex digits);
//! - `{prefix}:vectors`: optional vectors the update ships with (JSON text in
//!   the format of `tests/vectors/*.json`), run by every worker's gate;
//! - `{prefix}:revision`: an integer that grows with every publication: one
//!   more than the last, or the server's time in ms if that is larger, so that
//!   it never repeats after Redis loses its state (a worker that tried revision
//!   N before would otherwise miss a new publication numbered N);
//! - channel `{prefix}:updates`: a message per publication (it only wakes workers).
//!
//! [`publish_policy`] writes all of it in one transaction, so a worker reading
//! with one `MGET` never sees a `.wasm` of one publication with the
//! configuration of another. A worker learns of an update from the channel at
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

    /// The current revision (0: nothing published yet).
    pub fn revision(&self) -> Result<u64, String> {
        let mut connection = self.connect()?;
        let revision: Option<u64> = redis::cmd("GET").arg(self.key("revision")).query(&mut connection).map_err(|e| e.to_string())?;
        Ok(revision.unwrap_or(0))
    }

    /// The published policy, read in one `MGET` (one publication's parts).
    pub fn read(&self) -> Result<Publication, String> {
        let mut connection = self.connect()?;
        type Parts = (Option<Vec<u8>>, Option<Vec<u8>>, Option<Vec<u8>>, Option<u64>, Option<Vec<u8>>);
        let (wasm, config, signature, revision, vectors): Parts = redis::cmd("MGET")
            .arg(self.key("wasm"))
            .arg(self.key("config"))
            .arg(self.key("wasm.sig"))
            .arg(self.key("revision"))
            .arg(self.key("vectors"))
            .query(&mut connection)
            .map_err(|e| e.to_string())?;
        let missing = |what: &str| format!("nothing published at {} (`agent-retry publish` writes it)", self.key(what));
        Ok(Publication {
            wasm: wasm.ok_or_else(|| missing("wasm"))?,
            config: config.ok_or_else(|| missing("config"))?,
            signature,
            vectors,
            revision: revision.unwrap_or(0),
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
    pub signature: Option<Vec<u8>>,
    pub vectors: Option<Vec<u8>>,
    pub revision: u64,
}

/// The next revision: INCR, or the server's time in ms if larger (the same
/// script in the Python and Node hosts' publishers).
pub const NEXT_REVISION_LUA: &str = "local r = redis.call('INCR', KEYS[1]) local t = redis.call('TIME') local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) if r < ms then redis.call('SET', KEYS[1], ms) r = ms end return r";

/// Publishes a policy for every worker of the fleet in one transaction and
/// announces it; returns the new revision. Workers gate it as any update: a
/// worker refuses what does not pass and keeps its last good policy.
pub fn publish_policy(source: &FleetSource, wasm: &[u8], config_json: &str, signature: Option<&[u8]>, vectors: Option<&str>) -> Result<u64, String> {
    let mut connection = source.connect()?;
    let mut pipe = redis::pipe();
    pipe.atomic().cmd("SET").arg(source.key("wasm")).arg(wasm).ignore().cmd("SET").arg(source.key("config")).arg(config_json).ignore();
    match signature {
        Some(signature) => pipe.cmd("SET").arg(source.key("wasm.sig")).arg(signature).ignore(),
        None => pipe.cmd("DEL").arg(source.key("wasm.sig")).ignore(),
    };
    match vectors {
        Some(vectors) => pipe.cmd("SET").arg(source.key("vectors")).arg(vectors).ignore(),
        None => pipe.cmd("DEL").arg(source.key("vectors")).ignore(),
    };
    pipe.cmd("EVAL").arg(NEXT_REVISION_LUA).arg(1).arg(source.key("revision")).cmd("PUBLISH").arg(source.channel()).arg("published").ignore();
    let (revision,): (u64,) = pipe.query(&mut connection).map_err(|e| e.to_string())?;
    Ok(revision)
}
