//! One Rust worker of the cross-host account test (hosts/python/tests/test_redis_accounts.py,
//! hosts/typescript/test/redis-accounts.test.ts; its twins are accounts_draw.py and
//! accounts-draw.ts): connects a `SharedAccounts` to Redis, prints `ready`, reads
//! the common start (epoch ms) from stdin, asks for one token at a time (max wait
//! 0) until the end, and prints one JSON line: {"host", "grants": [epoch ms of each
//! token granted], "asked", "fallbacks"}.
//!
//!     accounts-draw URL ACCOUNT CAPACITY INTERVAL_MS WORKERS DURATION_MS

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_retry_host::accounts::{AccountBudgetBackend, Bucket, Reservation};
use agent_retry_host::{RedisAccounts, SharedAccounts};

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, account, capacity, interval_ms, workers, duration_ms] = args.as_slice() else {
        anyhow::bail!("usage: accounts-draw URL ACCOUNT CAPACITY INTERVAL_MS WORKERS DURATION_MS");
    };
    let accounts = SharedAccounts::new(RedisAccounts::connect(url)?, workers.parse()?);
    let bucket = Bucket { capacity: capacity.parse()?, refill_interval_ms: interval_ms.parse()? };
    println!("ready");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    let start: u64 = line.trim().parse()?;
    let end = start + duration_ms.parse::<u64>()?;
    while now_ms() < start {
        std::thread::sleep(Duration::from_millis(1));
    }
    let (mut grants, mut asked) = (Vec::new(), 0u64);
    loop {
        let now = now_ms();
        if now >= end {
            break;
        }
        asked += 1;
        if let Reservation::Granted(_) = accounts.reserve(account, 1, bucket, 0, now) {
            grants.push(now_ms());
        }
        std::thread::sleep(Duration::from_millis(3));
    }
    println!("{}", serde_json::json!({ "host": "rust", "grants": grants, "asked": asked, "fallbacks": accounts.fallbacks() }));
    Ok(())
}
