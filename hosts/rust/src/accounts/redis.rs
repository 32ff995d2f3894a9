//! The Redis backend: the same GCRA as the embedded one, run atomically on the
//! server by a Lua script, with the server's clock, so that workers on many
//! machines draw on one bucket per account. Configured by a `redis://` URL.

use std::sync::Mutex;
use std::time::Duration;

use super::{Bucket, Reservation};

/// GCRA on the server. KEYS[1]: the account's key. ARGV: tokens, capacity,
/// refill-interval-ms, max-wait-ms. Returns {granted (1|0), wait-ms}; 0 tokens are
/// granted at once and change nothing, as in `gcra`. Time is the
/// server's (`TIME`), so workers' clocks need not agree.
const GCRA_LUA: &str = r#"
local tokens = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local interval = tonumber(ARGV[3])
local max_wait = tonumber(ARGV[4])
if tokens == 0 then return {1, 0} end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
local new_tat = tat + tokens * interval
local wait = new_tat - capacity * interval - now
if wait < 0 then wait = 0 end
if wait > max_wait then return {0, wait} end
redis.call('SET', KEYS[1], new_tat, 'PX', math.max(1, new_tat - now) + 1000)
return {1, wait}
"#;

/// The refund: move the TAT back by `tokens` intervals, not before now.
/// KEYS[1]: the account's key. ARGV: tokens, refill-interval-ms.
const REFUND_LUA: &str = r#"
local back = tonumber(ARGV[1]) * tonumber(ARGV[2])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat <= now then return 0 end
local new_tat = math.max(tat - back, now)
redis.call('SET', KEYS[1], new_tat, 'PX', math.max(1, new_tat - now) + 1000)
return 1
"#;

/// How long one Redis exchange may take before it counts as a failure.
pub const REDIS_TIMEOUT: Duration = Duration::from_millis(500);

/// Why Redis could not be used.
#[derive(Debug)]
pub enum AccountsError {
    /// The URL is not a Redis URL.
    BadUrl { url: String, reason: String },
    /// Redis did not answer, or answered something that is not Redis.
    Unreachable { url: String, reason: String },
}

impl std::fmt::Display for AccountsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AccountsError::BadUrl { url, reason } => write!(f, "account budget: {url:?} is not a redis:// URL: {reason}"),
            AccountsError::Unreachable { url, reason } => write!(f, "account budget: Redis at {url} is unusable: {reason}"),
        }
    }
}

impl std::error::Error for AccountsError {}

/// A connection to Redis holding the buckets. One connection, shared by the
/// process's workers; a failed exchange drops it and the next one reconnects.
pub struct RedisAccounts {
    url: String,
    client: redis::Client,
    connection: Mutex<Option<redis::Connection>>,
    script: redis::Script,
    refund_script: redis::Script,
    prefix: String,
}

impl RedisAccounts {
    /// Connects and checks that the server speaks Redis and runs the script:
    /// a bad URL, a closed port or a server answering garbage is an error here,
    /// within [`REDIS_TIMEOUT`], not a hang later.
    pub fn connect(url: &str) -> Result<Self, AccountsError> {
        let client = redis::Client::open(url).map_err(|e| AccountsError::BadUrl { url: url.to_string(), reason: e.to_string() })?;
        let accounts = RedisAccounts {
            url: url.to_string(),
            client,
            connection: Mutex::new(None),
            script: redis::Script::new(GCRA_LUA),
            refund_script: redis::Script::new(REFUND_LUA),
            prefix: "agent-retry:account:".to_string(),
        };
        let mut connection = accounts.open().map_err(|reason| AccountsError::Unreachable { url: url.to_string(), reason })?;
        let pong: String = redis::cmd("PING").query(&mut connection).map_err(|e| AccountsError::Unreachable { url: url.to_string(), reason: e.to_string() })?;
        if pong != "PONG" {
            return Err(AccountsError::Unreachable { url: url.to_string(), reason: format!("PING answered {pong:?}") });
        }
        accounts
            .script
            .prepare_invoke()
            .load(&mut connection)
            .map_err(|e| AccountsError::Unreachable { url: url.to_string(), reason: format!("cannot load the GCRA script: {e}") })?;
        *accounts.connection.lock().unwrap_or_else(|p| p.into_inner()) = Some(connection);
        Ok(accounts)
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    fn open(&self) -> Result<redis::Connection, String> {
        let connection = self.client.get_connection_with_timeout(REDIS_TIMEOUT).map_err(|e| e.to_string())?;
        connection.set_read_timeout(Some(REDIS_TIMEOUT)).map_err(|e| e.to_string())?;
        connection.set_write_timeout(Some(REDIS_TIMEOUT)).map_err(|e| e.to_string())?;
        Ok(connection)
    }

    /// The take-or-wait, on the server. `Err` when Redis failed: the caller
    /// decides what to do (see [`super::SharedAccounts`]).
    pub fn try_reserve(&self, account_id: &str, tokens: u32, bucket: Bucket, max_wait_ms: u64) -> Result<Reservation, String> {
        let mut guard = self.connection.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(self.open()?);
        }
        let Some(connection) = guard.as_mut() else { return Err("no connection".into()) };
        let result: Result<(i64, i64), redis::RedisError> = self
            .script
            .key(format!("{}{account_id}", self.prefix))
            .arg(tokens)
            .arg(bucket.capacity)
            .arg(bucket.refill_interval_ms)
            .arg(max_wait_ms)
            .invoke(connection);
        match result {
            Ok((1, wait)) => Ok(Reservation::Granted(wait.max(0) as u64)),
            Ok((_, wait)) => Ok(Reservation::Refused(wait.max(0) as u64)),
            Err(e) => {
                // The connection may be broken mid-reply: start afresh next time.
                *guard = None;
                Err(e.to_string())
            }
        }
    }

    /// Gives tokens back, on the server. `Err` when Redis failed.
    pub fn try_refund(&self, account_id: &str, tokens: u32, bucket: Bucket) -> Result<(), String> {
        let mut guard = self.connection.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(self.open()?);
        }
        let Some(connection) = guard.as_mut() else { return Err("no connection".into()) };
        let result: Result<i64, redis::RedisError> =
            self.refund_script.key(format!("{}{account_id}", self.prefix)).arg(tokens).arg(bucket.refill_interval_ms).invoke(connection);
        result.map(|_| ()).map_err(|e| {
            *guard = None;
            e.to_string()
        })
    }
}
