//! The Redis backend: the same GCRA as the embedded one, run atomically on the
//! server by a Lua script, with the server's clock, so that workers on many
//! machines draw on one bucket per account. Configured by a `redis://` URL.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{Bucket, Reservation};

/// GCRA on the server. KEYS[1]: the account's key. ARGV: tokens, capacity,
/// refill-interval-ms, max-wait-ms, floor-tat-ms, not-after-ms. Returns {granted (1|0),
/// wait-ms, repaired (1|0), tat-ms, server-now-ms}; 0 tokens are granted at once and change
/// nothing, as in `gcra`. Time is the server's (`TIME`), so workers' clocks need
/// not agree.
///
/// Three faults are handled here, where they are seen:
/// - a request that reaches the script after `not-after-ms` (server time; 0:
///   none) takes nothing and answers granted -1: its client gave up on it (a
///   paused or overloaded server ran it late), so it must not spend tokens;
/// - a key of another type, or a value that is not a number (an operator's
///   mistake, another program's key): repaired to an empty bucket (the
///   conservative state: the allowance holds) and reported (`repaired`), where
///   it used to send every worker to its local share silently;
/// - a key that is gone while the worker last saw a later TAT (Redis restarted
///   without persistence, `FLUSHALL`, a failover to a stale replica): the
///   bucket is re-created from that TAT (`floor-tat-ms`), not full.
const GCRA_LUA: &str = r#"
local tokens = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local interval = tonumber(ARGV[3])
local max_wait = tonumber(ARGV[4])
local floor = tonumber(ARGV[5])
local not_after = tonumber(ARGV[6]) or 0
if tokens == 0 then return {1, 0, 0, 0, 0} end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if not_after > 0 and now > not_after then return {-1, 0, 0, 0, now} end
local kind = redis.call('TYPE', KEYS[1])['ok']
local tat = floor
local repaired = 0
if kind == 'string' then
  tat = tonumber(redis.call('GET', KEYS[1]))
end
if (kind ~= 'string' and kind ~= 'none') or tat == nil then
  redis.call('DEL', KEYS[1])
  tat = now + capacity * interval
  repaired = 1
end
if tat < now then tat = now end
local new_tat = tat + tokens * interval
local wait = new_tat - capacity * interval - now
if wait < 0 then wait = 0 end
if wait > max_wait then
  if repaired == 1 then redis.call('SET', KEYS[1], tat, 'PX', math.max(1, tat - now) + 1000) end
  return {0, wait, repaired, tat, now}
end
redis.call('SET', KEYS[1], new_tat, 'PX', math.max(1, new_tat - now) + 1000)
return {1, wait, repaired, new_tat, now}
"#;

/// The refund: move the TAT back by `tokens` intervals, not before now.
/// KEYS[1]: the account's key. ARGV: tokens, refill-interval-ms, not-after-ms
/// (as in the take: a refund run after its client gave up does nothing). A key
/// of another type or not a number is left to the next reservation to repair.
const REFUND_LUA: &str = r#"
local back = tonumber(ARGV[1]) * tonumber(ARGV[2])
local not_after = tonumber(ARGV[3]) or 0
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if not_after > 0 and now > not_after then return 0 end
if redis.call('TYPE', KEYS[1])['ok'] ~= 'string' then return 0 end
local tat = tonumber(redis.call('GET', KEYS[1]))
if tat == nil or tat <= now then return 0 end
local new_tat = math.max(tat - back, now)
redis.call('SET', KEYS[1], new_tat, 'PX', math.max(1, new_tat - now) + 1000)
return 1
"#;

/// How long one Redis exchange may take before it counts as a failure, the
/// connection included when there is none.
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
    /// Per account, the latest TAT this process saw on the server: the floor a
    /// lost key is re-created from.
    seen_tats: Mutex<HashMap<String, u64>>,
    /// Per account, how far the bucket's schedule (its TAT) was ahead of the
    /// server's clock at this process's latest exchange: the calls already
    /// granted to some worker that are still to come.
    seen_backlogs: Mutex<HashMap<String, u64>>,
    repairs: AtomicU64,
    /// The server's clock minus this process's wall clock, in ms, as last
    /// measured (`None` before the first measure): turns a deadline into the
    /// server's time.
    server_offset_ms: Mutex<Option<i64>>,
}

/// This process's wall clock, in ms since the epoch.
fn wall_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// A client for `url` whose connections say nothing before the first command:
/// redis-rs sends `CLIENT SETINFO` twice on connecting and ignores the
/// answers, so a server that accepts but never answers (paused) cost two read
/// timeouts there before the exchange itself had begun.
pub(crate) fn client(url: &str) -> redis::RedisResult<redis::Client> {
    use redis::IntoConnectionInfo;
    let info = url.into_connection_info()?;
    let settings = info.redis_settings().clone().set_skip_set_lib_name();
    redis::Client::open(info.set_redis_settings(settings))
}

impl RedisAccounts {
    /// Connects and checks that the server speaks Redis and runs the script:
    /// a bad URL, a closed port or a server answering garbage is an error here,
    /// within [`REDIS_TIMEOUT`], not a hang later.
    pub fn connect(url: &str) -> Result<Self, AccountsError> {
        let client = client(url).map_err(|e| AccountsError::BadUrl { url: url.to_string(), reason: e.to_string() })?;
        let accounts = RedisAccounts {
            url: url.to_string(),
            client,
            connection: Mutex::new(None),
            script: redis::Script::new(GCRA_LUA),
            refund_script: redis::Script::new(REFUND_LUA),
            prefix: "agent-retry:account:".to_string(),
            seen_tats: Mutex::new(HashMap::new()),
            seen_backlogs: Mutex::new(HashMap::new()),
            repairs: AtomicU64::new(0),
            server_offset_ms: Mutex::new(None),
        };
        let mut connection = accounts.open().map_err(|reason| AccountsError::Unreachable { url: url.to_string(), reason })?;
        let pong: String = redis::cmd("PING").query(&mut connection).map_err(|e| AccountsError::Unreachable { url: url.to_string(), reason: e.to_string() })?;
        if pong != "PONG" {
            return Err(AccountsError::Unreachable { url: url.to_string(), reason: format!("PING answered {pong:?}") });
        }
        let (seconds, micros): (i64, i64) =
            redis::cmd("TIME").query(&mut connection).map_err(|e| AccountsError::Unreachable { url: url.to_string(), reason: format!("TIME: {e}") })?;
        accounts.measured(seconds * 1000 + micros / 1000);
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

    /// The connection for one exchange that must end by `deadline`: connecting
    /// (when there is no connection) and the exchange share the one timeout.
    fn connection_until<'a>(&self, guard: &'a mut Option<redis::Connection>, deadline: Instant) -> Result<&'a mut redis::Connection, String> {
        let left = |what: &str| {
            deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()).ok_or_else(|| format!("{what}: no time left of {REDIS_TIMEOUT:?}"))
        };
        if guard.is_none() {
            let connection = self.client.get_connection_with_timeout(left("connect")?).map_err(|e| e.to_string())?;
            *guard = Some(connection);
        }
        let connection = guard.as_mut().ok_or("no connection")?;
        let remaining = left("exchange")?;
        connection.set_read_timeout(Some(remaining)).map_err(|e| e.to_string())?;
        connection.set_write_timeout(Some(remaining)).map_err(|e| e.to_string())?;
        Ok(connection)
    }

    /// Keeps the server's clock, read at `server_now_ms`, against this process's.
    fn measured(&self, server_now_ms: i64) {
        *self.server_offset_ms.lock().unwrap_or_else(|p| p.into_inner()) = Some(server_now_ms - wall_ms());
    }

    /// The server's time past which an exchange that must end by `deadline` is
    /// no longer awaited (0 before the server's clock was measured: none). The
    /// offset was read late by the answer's way back, which makes this a little
    /// early: a request that late is given up on in any case.
    fn not_after_ms(&self, deadline: Instant) -> i64 {
        let Some(offset) = *self.server_offset_ms.lock().unwrap_or_else(|p| p.into_inner()) else { return 0 };
        let left = deadline.saturating_duration_since(Instant::now()).as_millis() as i64;
        wall_ms() + offset + left
    }

    /// Keys of another type or values not a number repaired so far (each also logged).
    pub fn repairs(&self) -> u64 {
        self.repairs.load(Ordering::Relaxed)
    }

    /// The take-or-wait, on the server, within [`REDIS_TIMEOUT`] in all. `Err`
    /// when Redis failed: the caller decides what to do (see [`super::SharedAccounts`]).
    pub fn try_reserve(&self, account_id: &str, tokens: u32, bucket: Bucket, max_wait_ms: u64) -> Result<Reservation, String> {
        let deadline = Instant::now() + REDIS_TIMEOUT;
        let floor = self.seen_tats.lock().unwrap_or_else(|p| p.into_inner()).get(account_id).copied().unwrap_or(0);
        let mut guard = self.connection.lock().unwrap_or_else(|p| p.into_inner());
        let key = format!("{}{account_id}", self.prefix);
        let result: Result<(i64, i64, i64, i64, i64), String> = self.connection_until(&mut guard, deadline).and_then(|connection| {
            self.script
                .key(&key)
                .arg(tokens)
                .arg(bucket.capacity)
                .arg(bucket.refill_interval_ms)
                .arg(max_wait_ms)
                .arg(floor)
                .arg(self.not_after_ms(deadline))
                .invoke(connection)
                .map_err(|e| e.to_string())
        });
        let (granted, wait, repaired, tat, server_now) = result.inspect_err(|_| {
            // The connection may be broken mid-reply: start afresh next time.
            *guard = None;
        })?;
        drop(guard);
        // 0: a take of 0 tokens, answered without reading the clock.
        if server_now > 0 {
            self.measured(server_now);
        }
        if granted == -1 {
            return Err(format!("the take reached Redis after its deadline ({REDIS_TIMEOUT:?}): nothing was taken"));
        }
        if repaired == 1 {
            self.repairs.fetch_add(1, Ordering::Relaxed);
            tracing::error!(target: "agent_retry", redis = self.url, key, "account budget: the account's key held something other than a number \
                (another program's key, an operator's mistake); replaced with an empty bucket, so the allowance holds");
        }
        if tat > 0 {
            let mut seen = self.seen_tats.lock().unwrap_or_else(|p| p.into_inner());
            let entry = seen.entry(account_id.to_string()).or_insert(0);
            *entry = (*entry).max(tat as u64);
            let backlog = u64::try_from(tat.saturating_sub(server_now)).unwrap_or(0);
            self.seen_backlogs.lock().unwrap_or_else(|p| p.into_inner()).insert(account_id.to_string(), backlog);
        }
        Ok(if granted == 1 { Reservation::Granted(wait.max(0) as u64) } else { Reservation::Refused(wait.max(0) as u64) })
    }

    /// How far ahead of the server's clock the account's schedule was at this
    /// process's latest exchange, in ms (0 if never seen): when Redis fails, the
    /// calls granted until then are still to come.
    pub fn last_seen_backlog_ms(&self, account_id: &str) -> u64 {
        self.seen_backlogs.lock().unwrap_or_else(|p| p.into_inner()).get(account_id).copied().unwrap_or(0)
    }

    /// Gives tokens back, on the server. `Err` when Redis failed.
    pub fn try_refund(&self, account_id: &str, tokens: u32, bucket: Bucket) -> Result<(), String> {
        let deadline = Instant::now() + REDIS_TIMEOUT;
        let mut guard = self.connection.lock().unwrap_or_else(|p| p.into_inner());
        let result = self.connection_until(&mut guard, deadline).and_then(|connection| {
            self.refund_script
                .key(format!("{}{account_id}", self.prefix))
                .arg(tokens)
                .arg(bucket.refill_interval_ms)
                .arg(self.not_after_ms(deadline))
                .invoke::<i64>(connection)
                .map_err(|e| e.to_string())
        });
        // A refund moves the TAT back: the floor this process remembers moves with it.
        if result.is_ok()
            && let Some(seen) = self.seen_tats.lock().unwrap_or_else(|p| p.into_inner()).get_mut(account_id)
        {
            *seen = seen.saturating_sub(u64::from(tokens).saturating_mul(bucket.refill_interval_ms));
        }
        result.map(|_| ()).inspect_err(|_| *guard = None)
    }
}
