//! Issue 24, row 1 and "Updates": one update at a time in the Rust
//! `LivePolicy`, and a candidate older than the serving policy refused as
//! `older` ([`UpdateError::Older`]), as in the Python and Node hosts.
//!
//! Before: two `reload()`s at once (the watcher's and SIGHUP's, or a fleet
//! worker's channel and polling threads) each read, gated and swapped on their
//! own; the one that read the older files finished last and served, and
//! `poll()` saw nothing new, so it served for good.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agent_retry_host::live::GATE_VECTORS;
use agent_retry_host::{FleetSource, Integrity, LivePolicy, PolicySource, UpdateError, default_wasm_path, publish_policy};

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn config(attempts: u32) -> String {
    format!(r#"{{"default-effect": "read", "max-attempts-per-call": {attempts}}}"#)
}

const NO_CASES: &str = r#"{"description": "no cases", "cases": []}"#;

/// Vectors that take a while to gate: the gate's own cases, `times` over (they
/// pass under any configuration the gate accepts). An update shipped with them
/// is slow to check, one shipped with none is quick: the older read finishes last.
fn slow_vectors(times: usize) -> String {
    let gate: serde_json::Value = serde_json::from_str(GATE_VECTORS).unwrap();
    let cases: Vec<serde_json::Value> = (0..times).flat_map(|_| gate["cases"].as_array().unwrap().clone()).collect();
    serde_json::json!({"description": "the gate's cases, over and over", "cases": cases}).to_string()
}

/// A folder with the component, a configuration and shipped vectors, as an operator deploys them.
fn deployed(name: &str) -> (Dir, PolicySource) {
    let dir = std::env::temp_dir().join(format!("agent-retry-live-order-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(default_wasm_path(), dir.join("policy.wasm")).expect("run `make wasm` first");
    std::fs::write(dir.join("policy.json"), config(4)).unwrap();
    std::fs::write(dir.join("vectors.json"), NO_CASES).unwrap();
    let source = PolicySource {
        wasm: dir.join("policy.wasm"),
        config: dir.join("policy.json"),
        integrity: Integrity::Unchecked,
        vectors: Some(dir.join("vectors.json")),
        gate_vectors: vec![],
    };
    (Dir(dir), source)
}

/// Writes `text` to `path` and gives it the modification time `at`.
fn write_at(path: &Path, text: &str, at: SystemTime) {
    std::fs::write(path, text).unwrap();
    File::options().write(true).open(path).unwrap().set_modified(at).unwrap();
}

fn ns(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

#[test]
fn two_reloads_at_once_end_with_the_newest_files_serving() {
    let (_dir, source) = deployed("race");
    let live = Arc::new(LivePolicy::open(source.clone()).unwrap());
    let vectors = source.vectors.clone().unwrap();
    let slow = slow_vectors(8);
    let base = SystemTime::now();
    let trials = 10;
    let mut stale = Vec::new();
    for trial in 0..trials {
        // The first reload reads files that are slow to gate...
        let older = base + Duration::from_secs(2 * trial + 1);
        write_at(&source.config, &config(3), older);
        write_at(&vectors, &slow, older);
        let first = {
            let live = Arc::clone(&live);
            std::thread::spawn(move || live.reload())
        };
        std::thread::sleep(Duration::from_millis(30)); // it has read (a read takes well under a millisecond)
        // ...the files change, and a second reload reads the newest, quick to gate.
        let newer = older + Duration::from_secs(1);
        write_at(&source.config, &config(2), newer);
        write_at(&vectors, NO_CASES, newer);
        let second = {
            let live = Arc::clone(&live);
            std::thread::spawn(move || live.reload())
        };
        let (first, second) = (first.join().unwrap(), second.join().unwrap());
        assert!(first.is_ok() && second.is_ok(), "trial {trial}: {first:?} {second:?}");
        if live.current().config_json != config(2) {
            stale.push(trial);
        }
        assert!(live.poll().is_none(), "trial {trial}: nothing new since the newest files");
    }
    assert!(stale.is_empty(), "{} of {trials} trials ended serving the older files: trials {stale:?}", stale.len());
    assert_eq!(live.current().identity.generation, 1 + 2 * trials, "every reload was accepted");
}

#[test]
fn files_older_than_the_serving_ones_are_refused_as_older() {
    let (_dir, source) = deployed("older");
    let live = LivePolicy::open(source.clone()).unwrap();
    let serving_ns = [&source.wasm, &source.config, source.vectors.as_ref().unwrap()]
        .iter()
        .map(|path| ns(std::fs::metadata(path).unwrap().modified().unwrap()))
        .max()
        .unwrap();
    assert_eq!(live.reload().unwrap().generation, 2, "the same files again: the same time is not older");
    let good = live.current();

    // An old copy put back with its times (`cp -p`): a minute before the serving files.
    let back = UNIX_EPOCH + Duration::from_nanos(serving_ns) - Duration::from_secs(60);
    write_at(&source.config, &config(2), back);
    for path in [&source.wasm, source.vectors.as_ref().unwrap()] {
        File::options().write(true).open(path).unwrap().set_modified(back).unwrap();
    }
    let refused = live.reload().unwrap_err();
    let UpdateError::Older { candidate, serving, .. } = &refused else { panic!("not refused as older: {refused}") };
    assert_eq!((*candidate, *serving), (ns(back), serving_ns));
    let said = refused.to_string();
    assert!(said.starts_with("older than the serving policy: the files' newest modification time"), "{said}");
    assert!(said.contains("use rollback()"), "{said}");
    assert!(Arc::ptr_eq(&live.current(), &good), "the serving policy is unchanged");
    assert_eq!(live.last_refusal(), Some(said));
    assert!(live.poll().is_none(), "a refused change is tried once");
    assert_eq!(live.metrics().refused.load(std::sync::atomic::Ordering::Relaxed), 1);

    // The configuration touched now (the rest still a minute back): its time is after the serving one's.
    File::options().write(true).open(&source.config).unwrap().set_modified(SystemTime::now()).unwrap();
    let taken = live.poll().expect("a change").unwrap();
    assert_eq!((taken.generation, live.current().config_json.as_str()), (3, config(2).as_str()));
    // Rollback is not an update: never refused as older; and what comes next is
    // compared with the policy rolled back to.
    assert_eq!(live.rollback().unwrap().generation, 2);
    assert!(Arc::ptr_eq(&live.current(), &good));
    assert_eq!(live.reload().unwrap().generation, 4, "newer than the policy rolled back to");
}

/// A redis-server of the test's own on a free loopback port, killed on drop
/// (as `agent_retry_harness::RedisServer`, which depends on this crate).
struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    fn start() -> RedisServer {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server is not installed: apt-get install redis-server (.ci/run does)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start on port {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        RedisServer { child, port }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wasm() -> Vec<u8> {
    std::fs::read(default_wasm_path()).expect("run `make wasm` first")
}

/// Four workers of one process, each with its channel and polling threads; two
/// publications 20 ms apart, the first slow to gate. Before: 3 of 4 workers
/// still served the first after 13 s. Every worker serves the second within 10 s.
#[test]
fn four_fleet_workers_serve_the_second_of_two_publications_20_ms_apart() {
    let redis = RedisServer::start();
    let fleet = FleetSource::new(redis.url()).with_prefix("order-test:race");
    publish_policy(&fleet, &wasm(), &config(4), None, None).unwrap();
    let workers: Vec<Arc<LivePolicy>> = (0..4).map(|_| Arc::new(LivePolicy::open_fleet(fleet.clone(), Integrity::Unchecked).unwrap())).collect();
    let _watchers: Vec<_> = workers.iter().map(|live| live.watch(Duration::from_millis(50))).collect();
    std::thread::sleep(Duration::from_millis(500)); // every channel thread subscribed
    let slow = slow_vectors(8);
    let first = publish_policy(&fleet, &wasm(), &config(3), None, Some(&slow)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let second = publish_policy(&fleet, &wasm(), &config(2), None, None).unwrap();
    assert!(second > first);
    let deadline = Instant::now() + Duration::from_secs(10);
    let serving_second = || workers.iter().filter(|live| live.current().config_json == config(2)).count();
    while serving_second() < workers.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let stale: Vec<String> = workers.iter().filter(|live| live.current().config_json != config(2)).map(|live| live.current().config_json.clone()).collect();
    assert!(stale.is_empty(), "{} of {} workers do not serve the second publication after 10 s: {stale:?}", stale.len(), workers.len());
    for live in &workers {
        assert!(live.poll().is_none(), "nothing new after the second publication");
    }
}

#[test]
fn a_publication_older_than_the_serving_one_is_refused_as_older() {
    let redis = RedisServer::start();
    let fleet = FleetSource::new(redis.url()).with_prefix("order-test:older");
    let old = publish_policy(&fleet, &wasm(), &config(4), None, None).unwrap();
    let live = LivePolicy::open_fleet(fleet.clone(), Integrity::Unchecked).unwrap();
    std::thread::sleep(Duration::from_millis(2)); // the next revision is the server's time in ms, or one more
    let new = publish_policy(&fleet, &wasm(), &config(3), None, None).unwrap();
    assert!(new > old);
    assert_eq!(live.poll().expect("a new revision").unwrap().generation, 2);
    let serving = live.current();

    // Redis restored from an old dump: the older publication's configuration and revision.
    let mut connection = redis::Client::open(redis.url()).unwrap().get_connection().unwrap();
    let _: () =
        redis::cmd("MSET").arg("order-test:older:config").arg(config(4)).arg("order-test:older:revision").arg(old.to_string()).query(&mut connection).unwrap();
    let refused = live.poll().expect("a revision not tried yet").unwrap_err();
    let UpdateError::Older { candidate, serving: serving_revision, .. } = &refused else { panic!("not refused as older: {refused}") };
    assert_eq!((*candidate, *serving_revision), (old, new));
    assert!(refused.to_string().contains(&format!("(revision {old}) is older than the serving policy's, revision {new}")), "{refused}");
    assert!(live.poll().is_none(), "a refused revision is tried once");
    assert!(matches!(live.reload(), Err(UpdateError::Older { .. })));
    assert!(Arc::ptr_eq(&live.current(), &serving), "the serving policy is unchanged");
    assert!(live.last_refusal().is_some_and(|why| why.contains("older")));

    // Rollback is not an update: it returns to the older publication's policy.
    assert_eq!(live.rollback().unwrap().generation, 1);
    assert_eq!(live.current().config_json, config(4));
    assert_eq!(live.rollback().unwrap().generation, 2);
    // The next publication numbers past both: taken.
    let latest = publish_policy(&fleet, &wasm(), &config(2), None, None).unwrap();
    assert!(latest > new);
    assert_eq!(live.poll().expect("a new revision").unwrap().generation, 3);
    assert_eq!(live.current().config_json, config(2));
}
