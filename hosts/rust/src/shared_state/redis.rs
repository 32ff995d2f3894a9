//! The shared state on Redis, for workers on many machines: every text is a
//! hash `{value, version}` under `agent-retry:state:` and the policy's key,
//! read and compare-and-set by Lua scripts, on the server's clock. While Redis
//! does not answer, [`FallbackSharedState`] keeps the state in this process.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{EmbeddedSharedState, Loaded, MAX_VALUE_BYTES, SharedStateBackend};
use crate::accounts::{AccountsError, REDIS_TIMEOUT};

/// Reads a text. KEYS[1]: its key; ARGV[1]: the longest text to return, in
/// bytes. Returns {present (1|0), value, version, server-now-ms}. A key of
/// another type, or a hash without a number for its version (another program's
/// key, an operator's mistake), reads as absent: the next store replaces it. A
/// text past the longest is not read (`HSTRLEN`: it would cost the server
/// and every reader its memory) but its version is returned, so that the next
/// store replaces it too.
const STATE_LOAD_LUA: &str = r#"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if redis.call('TYPE', KEYS[1])['ok'] ~= 'hash' then return {0, '', 0, now} end
local version = tonumber(redis.call('HGET', KEYS[1], 'version'))
if version == nil then return {0, '', 0, now} end
local size = redis.call('HSTRLEN', KEYS[1], 'value')
if size == 0 or size > tonumber(ARGV[1]) then return {0, '', version, now} end
return {1, redis.call('HGET', KEYS[1], 'value'), version, now}
"#;

/// Compare-and-set. KEYS[1]: the key. ARGV: expected-version, value, ttl-ms.
/// Stores the value at version + 1 if the version is still the expected one (0:
/// absent, or unreadable as above), to expire ttl-ms later; returns 1 if stored.
const STATE_STORE_LUA: &str = r#"
local kind = redis.call('TYPE', KEYS[1])['ok']
local current = 0
if kind == 'hash' then current = tonumber(redis.call('HGET', KEYS[1], 'version')) or 0 end
if current ~= tonumber(ARGV[1]) then return 0 end
if kind ~= 'hash' and kind ~= 'none' then redis.call('DEL', KEYS[1]) end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'version', current + 1)
redis.call('PEXPIRE', KEYS[1], math.max(1, tonumber(ARGV[3])))
return 1
"#;

/// The prefix of every key the shared state keeps in Redis.
pub const STATE_PREFIX: &str = "agent-retry:state:";

/// A connection to Redis holding the texts. One connection, shared by the
/// process's workers; a failed exchange drops it and the next one reconnects.
pub struct RedisSharedState {
    url: String,
    client: redis::Client,
    connection: Mutex<Option<redis::Connection>>,
    load: redis::Script,
    store: redis::Script,
}

impl RedisSharedState {
    /// Connects and checks that the server speaks Redis, within [`REDIS_TIMEOUT`].
    pub fn connect(url: &str) -> Result<Self, AccountsError> {
        let client = crate::accounts::redis::client(url).map_err(|e| AccountsError::BadUrl { url: url.to_string(), reason: e.to_string() })?;
        let state = RedisSharedState {
            url: url.to_string(),
            client,
            connection: Mutex::new(None),
            load: redis::Script::new(STATE_LOAD_LUA),
            store: redis::Script::new(STATE_STORE_LUA),
        };
        let unreachable = |reason: String| AccountsError::Unreachable { url: url.to_string(), reason };
        let mut connection = state.client.get_connection_with_timeout(REDIS_TIMEOUT).map_err(|e| unreachable(e.to_string()))?;
        connection.set_read_timeout(Some(REDIS_TIMEOUT)).map_err(|e| unreachable(e.to_string()))?;
        let pong: String = redis::cmd("PING").query(&mut connection).map_err(|e| unreachable(e.to_string()))?;
        if pong != "PONG" {
            return Err(unreachable(format!("PING answered {pong:?}")));
        }
        *state.connection.lock().unwrap_or_else(|p| p.into_inner()) = Some(connection);
        Ok(state)
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// One exchange within [`REDIS_TIMEOUT`], connecting first if needed; a
    /// failed one drops the connection (it may be broken mid-reply).
    fn exchange<T>(&self, run: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>) -> Result<T, String> {
        let mut guard = self.connection.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            let connection = self.client.get_connection_with_timeout(REDIS_TIMEOUT).map_err(|e| e.to_string())?;
            connection.set_read_timeout(Some(REDIS_TIMEOUT)).map_err(|e| e.to_string())?;
            connection.set_write_timeout(Some(REDIS_TIMEOUT)).map_err(|e| e.to_string())?;
            *guard = Some(connection);
        }
        let result = run(guard.as_mut().expect("set above")).map_err(|e| e.to_string());
        if result.is_err() {
            *guard = None;
        }
        result
    }

    /// Reads a text; `Err` when Redis failed. A text that is too long or not
    /// UTF-8 reads as absent, at its version: the next store replaces it.
    pub fn try_load(&self, key: &str) -> Result<Loaded, String> {
        let key = format!("{STATE_PREFIX}{key}");
        let (present, value, version, now): (i64, Vec<u8>, i64, i64) = self.exchange(|c| self.load.key(&key).arg(MAX_VALUE_BYTES).invoke(c))?;
        let value = if present == 1 { String::from_utf8(value).ok() } else { None };
        Ok(Loaded { value, version: u64::try_from(version).unwrap_or(0), now_ms: u64::try_from(now).unwrap_or(0) })
    }

    /// Compare-and-set; `Err` when Redis failed.
    pub fn try_store_if(&self, key: &str, expected_version: u64, value: &str, ttl_ms: u64) -> Result<bool, String> {
        let key = format!("{STATE_PREFIX}{key}");
        let stored: i64 = self.exchange(|c| self.store.key(&key).arg(expected_version).arg(value).arg(ttl_ms.max(1)).invoke(c))?;
        Ok(stored == 1)
    }
}

/// Redis while it answers; this process's own state while it does not (the
/// breakers of this worker alone: it neither sees the fleet's nor shows it its
/// own), trying Redis again every `retry_interval`. A change made locally is not
/// carried to Redis when it returns: the fleet's state there is newer.
pub struct FallbackSharedState {
    redis: RedisSharedState,
    local: EmbeddedSharedState,
    retry_interval: Duration,
    /// Since when Redis is not used (a failure), until `retry_at`.
    down: Mutex<Option<Instant>>,
    fallbacks: AtomicU64,
}

impl FallbackSharedState {
    pub fn new(redis: RedisSharedState) -> Self {
        FallbackSharedState {
            redis,
            local: EmbeddedSharedState::new(),
            retry_interval: Duration::from_secs(1),
            down: Mutex::new(None),
            fallbacks: AtomicU64::new(0),
        }
    }

    /// Connects to Redis at `url` (see [`RedisSharedState::connect`]).
    pub fn open(url: &str) -> Result<Self, AccountsError> {
        RedisSharedState::connect(url).map(Self::new)
    }

    /// How often to try Redis again while it is down.
    pub fn with_retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = interval;
        self
    }

    /// Switches to the local state so far.
    pub fn fallbacks(&self) -> u64 {
        self.fallbacks.load(Ordering::Relaxed)
    }

    /// Whether to use Redis now: not while it is down, until the retry is due.
    fn use_redis(&self) -> bool {
        let down = self.down.lock().unwrap_or_else(|p| p.into_inner());
        down.is_none_or(|since| since.elapsed() >= self.retry_interval)
    }

    fn answered(&self) {
        if self.down.lock().unwrap_or_else(|p| p.into_inner()).take().is_some() {
            tracing::info!(target: "agent_retry", redis = self.redis.url(), "shared state: Redis answers again; the breakers are the fleet's again");
        }
    }

    fn failed(&self, reason: &str) {
        let mut down = self.down.lock().unwrap_or_else(|p| p.into_inner());
        if down.is_none() {
            self.fallbacks.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(target: "agent_retry", redis = self.redis.url(), reason, "shared state: Redis failed; the breakers are this process's own until it answers");
        }
        *down = Some(Instant::now());
    }
}

impl SharedStateBackend for FallbackSharedState {
    fn load(&self, key: &str, now_ms: u64) -> Loaded {
        if self.use_redis() {
            match self.redis.try_load(key) {
                Ok(loaded) => {
                    self.answered();
                    return loaded;
                }
                Err(reason) => self.failed(&reason),
            }
        }
        self.local.load(key, now_ms)
    }

    fn store_if(&self, key: &str, expected_version: u64, value: &str, ttl_ms: u64) -> bool {
        if value.len() > MAX_VALUE_BYTES {
            return false;
        }
        if self.use_redis() {
            match self.redis.try_store_if(key, expected_version, value, ttl_ms) {
                Ok(stored) => {
                    self.answered();
                    return stored;
                }
                Err(reason) => self.failed(&reason),
            }
        }
        self.local.store_if(key, expected_version, value, ttl_ms)
    }
}
