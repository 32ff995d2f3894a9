//! The account budget's figures (a benchmark, not a test): the cost of one
//! take-or-wait in each backend, and the 429s the demo server returns to 16
//! workers with and without the shared budget, for the same workload.
//!
//!     cargo bench -p agent-retry-harness --bench accounts

use std::sync::Arc;
use std::time::Instant;

use agent_retry_harness::{RedisServer, run_workers};
use agent_retry_host::accounts::{AccountBudgetBackend, Bucket};
use agent_retry_host::{EmbeddedAccounts, EntropySource, RedisAccounts, SharedAccounts};

fn per_call_ns(backend: &dyn AccountBudgetBackend, calls: u32) -> f64 {
    let bucket = Bucket { capacity: 1_000_000_000, refill_interval_ms: 1 };
    let started = Instant::now();
    for i in 0..calls {
        std::hint::black_box(backend.reserve("bench", 1, bucket, 0, u64::from(i)));
    }
    started.elapsed().as_nanos() as f64 / f64::from(calls)
}

const WORKERS: u32 = 16;
const ALLOWANCE: (u32, u64) = (60, 1000);
const WITH_BUDGET: &str = r#"{"base-delay-ms": 50, "max-delay-ms": 400, "max-hint-ms": 5000, "max-steps-per-run": 1000, "max-retries-per-run": 100,
    "account-budget": {"account-id": "bench-account", "capacity": 20, "refill-interval-ms": 30, "max-wait-ms": 20000}}"#;
const WITHOUT_BUDGET: &str = r#"{"base-delay-ms": 50, "max-delay-ms": 400, "max-hint-ms": 5000, "max-steps-per-run": 1000, "max-retries-per-run": 100}"#;

fn main() {
    let redis = RedisServer::start();
    let embedded = EmbeddedAccounts::new();
    let shared = SharedAccounts::new(RedisAccounts::connect(&redis.url()).expect("redis"), 1);
    let embedded_ns = per_call_ns(&embedded, 200_000);
    let redis_ns = per_call_ns(&shared, 5_000);
    println!("one take-or-wait (reserve), mean over the calls of one run:");
    println!("  embedded (in-process GCRA)   {:>10.0} ns", embedded_ns);
    println!("  redis (Lua GCRA, loopback)   {:>10.0} ns   ({:.0}x the embedded cost)", redis_ns, redis_ns / embedded_ns);

    println!("\n16 workers x 8 lookups against an allowance of 60 calls per 1000 ms window:");
    let seeded = |w: u32| EntropySource::seeded(u64::from(w));
    let none = run_workers(WORKERS, Some(ALLOWANCE), vec![], WITHOUT_BUDGET, 8, |_| Arc::new(EmbeddedAccounts::new()), seeded);
    let shared_embedded: Arc<dyn AccountBudgetBackend> = Arc::new(EmbeddedAccounts::new());
    let embedded_run = run_workers(WORKERS, Some(ALLOWANCE), vec![], WITH_BUDGET, 8, move |_| Arc::clone(&shared_embedded), seeded);
    let url = redis.url();
    let redis_run = run_workers(
        WORKERS,
        Some(ALLOWANCE),
        vec![],
        WITH_BUDGET,
        8,
        move |_| Arc::new(SharedAccounts::new(RedisAccounts::connect(&url).expect("redis"), WORKERS)) as Arc<dyn AccountBudgetBackend>,
        seeded,
    );
    for (name, run) in [("no shared budget", &none), ("embedded budget", &embedded_run), ("redis budget", &redis_run)] {
        println!(
            "  {name:<18} 429s from the server: {:>3}   calls received: {:>3}   admitted per window: {:?}",
            run.refused, run.server_calls, run.admitted_per_window
        );
    }
}
