//! The shared state on Redis (the circuit breakers' store): the same
//! compare-and-set semantics as the embedded store, the server's clock, a
//! wrong-typed key replaced, Redis killed under it, and exactly one probe of
//! 32 runs on separate connections when a cooldown ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_retry_harness::RedisServer;
use agent_retry_host::shared_state::{EmbeddedSharedState, FallbackSharedState, RedisSharedState, STATE_PREFIX, SharedStateBackend};
use agent_retry_host::{Admission, EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, default_wasm_path};

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn unique(name: &str) -> String {
    format!("{name}-{}-{}", std::process::id(), now_ms())
}

fn redis() -> (String, Option<RedisServer>) {
    match std::env::var("AGENT_RETRY_REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let server = RedisServer::start();
            (server.url(), Some(server))
        }
    }
}

/// The contract's compare-and-set, whatever the store.
fn check_semantics(store: &dyn SharedStateBackend) {
    let key = unique("semantics");
    let first = store.load(&key, 7);
    assert_eq!((first.value, first.version), (None, 0));
    assert!(store.store_if(&key, 0, "a", 60_000));
    assert!(!store.store_if(&key, 0, "b", 60_000), "another worker stored first");
    let second = store.load(&key, 7);
    assert_eq!((second.value.as_deref(), second.version), (Some("a"), 1));
    assert!(store.store_if(&key, 1, "c", 60_000));
    assert!(!store.store_if(&key, 1, "d", 60_000));
    assert_eq!(store.load(&key, 7).value.as_deref(), Some("c"));
    assert!(!store.store_if(&key, 2, &"x".repeat(1025), 60_000), "a text over 1,024 bytes is refused");
}

#[test]
fn the_embedded_and_the_redis_store_have_the_same_semantics() {
    check_semantics(&EmbeddedSharedState::new());
    let (url, _server) = redis();
    check_semantics(&FallbackSharedState::open(&url).unwrap());
}

#[test]
fn redis_answers_with_its_own_clock_and_expires_texts_at_their_ttl() {
    let (url, _server) = redis();
    let store = RedisSharedState::connect(&url).unwrap();
    let key = unique("clock");
    // A caller an hour off does not move the store's clock.
    let loaded = store.try_load(&key).unwrap();
    assert!(loaded.now_ms.abs_diff(now_ms()) < 5_000, "{} vs {}", loaded.now_ms, now_ms());
    assert!(store.try_store_if(&key, 0, "a", 100).unwrap());
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(store.try_load(&key).unwrap().version, 0, "expired");
}

#[test]
fn a_wrong_typed_key_reads_as_absent_and_is_replaced_by_the_next_store() {
    let server = RedisServer::start();
    let store = RedisSharedState::connect(&server.url()).unwrap();
    let key = unique("wrong-type");
    let full = format!("{STATE_PREFIX}{key}");
    let out = std::process::Command::new("redis-cli").args(["-p", &server.port.to_string(), "LPUSH", &full, "junk"]).output().unwrap();
    assert!(out.status.success());
    assert_eq!(store.try_load(&key).unwrap().version, 0);
    assert!(store.try_store_if(&key, 0, "b1 c 0 0 0 0 0 0 0 0", 60_000).unwrap());
    assert_eq!(store.try_load(&key).unwrap().value.as_deref(), Some("b1 c 0 0 0 0 0 0 0 0"));
}

#[test]
fn redis_killed_the_store_answers_from_the_process_logs_once_and_returns() {
    let mut server = RedisServer::start();
    let port = server.port;
    let store = FallbackSharedState::open(&server.url()).unwrap().with_retry_interval(Duration::from_millis(100));
    let key = unique("failover");
    assert!(store.store_if(&key, 0, "fleet", 60_000));
    server.kill();
    let local = store.load(&key, 1);
    assert_eq!((local.value, local.version, local.now_ms), (None, 0, 1), "the process's own state, on the caller's clock");
    assert!(store.store_if(&key, 0, "local", 60_000));
    assert_eq!(store.load(&key, 1).value.as_deref(), Some("local"));
    assert_eq!(store.fallbacks(), 1, "the switch is counted (and logged) once");
    let _back = RedisServer::start_on(port);
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(store.load(&key, 1).version, 0, "Redis again (restarted empty): the local text is not carried back");
    assert_eq!(store.fallbacks(), 1);
}

/// Issue 26: "half-open lets exactly one probe through under 32 concurrent runs".
#[test]
fn of_32_runs_on_separate_redis_connections_exactly_one_probes_after_the_cooldown() {
    let (url, _server) = redis();
    let component = PolicyComponent::from_file(&default_wasm_path()).unwrap();
    let server = unique("https://probe.example/mcp");
    let config = r#"{"tools": {"lookup_order": {"effect": "read"}}, "circuit-breaker": {"failures-to-open": 1, "cooldown-ms": 300}}"#;
    let instance = |store: Arc<dyn SharedStateBackend>| {
        let services = HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(1)).with_shared_state(store);
        let mut instance = component.instantiate(services).unwrap();
        let policy = instance.load_policy(config).unwrap().unwrap();
        let run = instance.start_run(&policy, "probe").unwrap().unwrap();
        (instance, run)
    };
    // Open it: one 503.
    let (mut opener, run) = instance(Arc::new(FallbackSharedState::open(&url).unwrap()));
    let Admission::Send(start) = opener.begin(&run, Some(&server), "lookup_order", None, None, now_ms()).unwrap().unwrap() else { panic!("admitted") };
    let failure = agent_retry_host::Outcome::Failure(agent_retry_host::component::types::Observation::new(
        agent_retry_host::component::types::FailureKind::HttpStatus(503),
        &[],
        "down",
    ));
    opener.decide(&run, start.call_id, 1, &failure, None, now_ms(), Some(0)).unwrap().unwrap();
    let runs: Vec<_> = (0..32).map(|_| instance(Arc::new(FallbackSharedState::open(&url).unwrap()))).collect();
    std::thread::sleep(Duration::from_millis(350));
    let admitted = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(std::sync::Barrier::new(32));
    let threads: Vec<_> = runs
        .into_iter()
        .map(|(mut instance, run)| {
            let (admitted, barrier, server) = (Arc::clone(&admitted), Arc::clone(&barrier), server.clone());
            std::thread::spawn(move || {
                barrier.wait();
                match instance.begin(&run, Some(&server), "lookup_order", None, None, now_ms()).unwrap().unwrap() {
                    Admission::Send(_) => {
                        admitted.fetch_add(1, Ordering::SeqCst);
                    }
                    Admission::Replan(..) => {}
                    Admission::Escalate(e) => panic!("escalated: {}", e.note),
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(admitted.load(Ordering::SeqCst), 1, "exactly one probe of 32");
}
