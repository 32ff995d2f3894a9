//! Fleet updates through Redis, with `agent-retry watch` worker processes and
//! `agent-retry publish` / `publish_policy`: one publication reaches every
//! worker, a worker that was down takes it when it comes back, under a key only
//! the publication as signed is taken, and a watcher outlives Redis.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use agent_retry_harness::RedisServer;
use agent_retry_host::manifest::public_key_of;
use agent_retry_host::{FleetSource, default_wasm_path, publish_policy, sign_publication};
use serde_json::Value;
use sha2::{Digest, Sha256};

const BIN: &str = env!("CARGO_BIN_EXE_agent-retry");

fn config(attempts: u32) -> String {
    format!(r#"{{"default-effect": "read", "max-attempts-per-call": {attempts}}}"#)
}

/// The worker reports the configuration's SHA-256 (hex).
fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// An `agent-retry watch --fleet` process and its JSON lines.
struct Worker {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Value>,
}

impl Worker {
    fn start(url: &str, extra: &[&str]) -> Worker {
        let mut child = Command::new(BIN)
            .args(["watch", "--fleet", url])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let stdin = child.stdin.take().unwrap();
        let (send, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {line}: {e}"))).is_err() {
                    break;
                }
            }
        });
        Worker { child, stdin, lines }
    }

    /// The next line whose event is `event`, within 15 s.
    fn next(&self, event: &str) -> Value {
        loop {
            let line = self.lines.recv_timeout(Duration::from_secs(15)).unwrap_or_else(|_| panic!("no {event} line within 15 s"));
            if line["event"] == event {
                return line;
            }
        }
    }

    fn ask(&mut self, command: &str) -> Value {
        writeln!(self.stdin, "{command}").unwrap();
        self.next(match command {
            "decide" => "decided",
            other => other,
        })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wasm() -> Vec<u8> {
    std::fs::read(default_wasm_path()).expect("run `make wasm` first")
}

#[test]
fn one_publication_reaches_every_worker_process_and_a_worker_that_was_down_takes_it_when_back() {
    let redis = RedisServer::start();
    let fleet = FleetSource::new(redis.url());
    let first = publish_policy(&fleet, &wasm(), &config(4), None, None).unwrap();
    assert!(first > 0);
    // A long polling interval: the announcement on the channel is what wakes them.
    let mut workers: Vec<Worker> = (0..3).map(|_| Worker::start(&redis.url(), &["--interval-ms", "60000"])).collect();
    for worker in &mut workers {
        assert_eq!(worker.next("serving")["policy"]["config-sha256"], sha256_hex(&config(4)));
        assert_eq!(worker.ask("decide")["attempts-against-a-persistent-503"], 4);
    }
    // Let every worker subscribe before the publication (it reads the revision at
    // start; a publication between that read and its subscription would wait for the poll).
    std::thread::sleep(Duration::from_millis(500));
    let second = publish_policy(&fleet, &wasm(), &config(2), None, None).unwrap();
    assert!(second > first, "revisions grow: {first} then {second}");
    for worker in &mut workers {
        let serving = worker.next("serving");
        assert_eq!(serving["policy"]["config-sha256"], sha256_hex(&config(2)), "{serving}");
        assert_eq!(serving["policy"]["generation"], 2);
        assert_eq!(worker.ask("decide")["attempts-against-a-persistent-503"], 2, "new runs get the fleet's new budget");
    }
    // A worker down during the next publication takes it when it comes back.
    drop(workers.remove(0));
    // Published with the command line, as an operator does.
    let config_file = std::env::temp_dir().join(format!("agent-retry-fleet-{}.json", std::process::id()));
    std::fs::write(&config_file, config(3)).unwrap();
    let published = Command::new(BIN).args(["publish", "--redis", &redis.url(), "--config"]).arg(&config_file).output().unwrap();
    assert!(published.status.success(), "{}", String::from_utf8_lossy(&published.stderr));
    let said: Value = serde_json::from_slice(&published.stdout).unwrap();
    assert!(said["revision"].as_u64().unwrap() > second, "{said}");
    let mut back = Worker::start(&redis.url(), &["--interval-ms", "60000"]);
    assert_eq!(back.next("serving")["policy"]["config-sha256"], sha256_hex(&config(3)));
    assert_eq!(back.ask("decide")["attempts-against-a-persistent-503"], 3);
    for worker in &mut workers {
        assert_eq!(worker.next("serving")["policy"]["config-sha256"], sha256_hex(&config(3)));
    }
    let _ = std::fs::remove_file(config_file);
}

/// Issue 24, row 9: a publication onto a revision that is not an integer, or
/// would overflow, was reported as failed, yet `:wasm` and `:config` were
/// written (MULTI/EXEC does not roll back) and workers later served them. It
/// now fails before it writes anything, and a reader refuses the value by name.
#[test]
fn a_publication_onto_a_garbage_revision_writes_nothing() {
    let redis = RedisServer::start();
    let fleet = FleetSource::new(redis.url());
    let first = publish_policy(&fleet, &wasm(), &config(4), None, None).unwrap();
    let cli = |args: &[&str]| {
        let out = Command::new("redis-cli").args(["-p", &redis.port.to_string()]).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    for garbage in ["abc", "-5", "18446744073709551616", "9007199254740991"] {
        cli(&["SET", "agent-retry:policy:revision", garbage]);
        let refused = publish_policy(&fleet, &wasm(), &config(2), None, None).unwrap_err();
        assert!(refused.contains("nothing was written"), "{garbage}: {refused}");
        assert_eq!(cli(&["GET", "agent-retry:policy:config"]), config(4), "{garbage}: the configuration is the last good publication's");
        if garbage != "9007199254740991" {
            let read = fleet.revision().unwrap_err();
            assert!(read.contains("is not a revision"), "{garbage}: {read}");
        }
    }
    cli(&["SET", "agent-retry:policy:revision", &first.to_string()]);
    assert!(publish_policy(&fleet, &wasm(), &config(2), None, None).unwrap() > first, "a good revision publishes again");
    assert_eq!(cli(&["GET", "agent-retry:policy:config"]), config(2));
}

/// Issue 24, row 2: the signature covered the `.wasm` alone, so a
/// configuration rewritten in Redis after signing was taken (attempts on a
/// persistent 503 went from 4 to 100), and deleting `:vectors` dropped their
/// check. Now the signed manifest covers the whole publication.
#[test]
fn under_a_key_only_the_publication_as_signed_is_taken_and_the_last_good_one_serves() {
    let redis = RedisServer::start();
    let prefix = "team-a:policy";
    let fleet = FleetSource::new(redis.url()).with_prefix(prefix);
    let seed = [5u8; 32];
    let public_hex: String = public_key_of(&seed).iter().map(|b| format!("{b:02x}")).collect();
    let cli = |args: &[&str]| {
        let out = Command::new("redis-cli").args(["-p", &redis.port.to_string()]).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let key = |name: &str| format!("{prefix}:{name}");
    // Nothing announces a rewrite: the next revision (and a message) makes every worker read it.
    let bump = || {
        let next = cli(&["INCR", &key("revision")]);
        cli(&["PUBLISH", &key("updates"), "rewritten"]);
        next
    };
    let vectors = r#"{"description": "the fleet's promises", "cases": []}"#;
    let good = wasm();
    let manifest = sign_publication(&seed, &good, config(4).as_bytes(), Some(vectors.as_bytes()), Some(1_000));
    assert_eq!(publish_policy(&fleet, &good, &config(4), Some(&manifest), Some(vectors)).unwrap(), 1_000, "stored under the manifest's revision");
    let mut worker = Worker::start(&redis.url(), &["--prefix", prefix, "--interval-ms", "200", "--public-key", &public_hex]);
    let serving = worker.next("serving");
    assert_eq!(worker.ask("decide")["attempts-against-a-persistent-503"], 4);

    // The configuration rewritten in Redis, the signed .wasm untouched: refused.
    cli(&["SET", &key("config"), &config(100)]);
    bump();
    let refused = worker.next("refused");
    let reason = refused["reason"].as_str().unwrap();
    assert!(reason.contains("config-sha256") && reason.contains("changed after signing"), "{refused}");
    assert_eq!(worker.ask("decide")["attempts-against-a-persistent-503"], 4, "the old policy keeps serving");

    // The vectors deleted: refused.
    cli(&["SET", &key("config"), &config(4)]);
    cli(&["DEL", &key("vectors")]);
    bump();
    let refused = worker.next("refused");
    assert!(refused["reason"].as_str().unwrap().contains("removed after signing"), "{refused}");

    // The publication as signed, under another revision: refused.
    cli(&["SET", &key("vectors"), vectors]);
    let revision = bump();
    let refused = worker.next("refused");
    assert!(refused["reason"].as_str().unwrap().contains(&format!("is revision {revision}: not the revision it was signed for")), "{refused}");

    // Unsigned, then a signature over the .wasm alone (before 0.7): refused.
    publish_policy(&fleet, &good, &config(2), None, None).unwrap();
    let refused = worker.next("refused");
    assert!(refused["reason"].as_str().unwrap().contains(&format!("unsigned: no signed manifest at {prefix}:manifest")), "{refused}");
    cli(&["SET", &key("wasm.sig"), &"00".repeat(64)]);
    bump();
    let refused = worker.next("refused");
    assert!(refused["reason"].as_str().unwrap().contains("(before 0.7) is not accepted"), "{refused}");
    let status = worker.ask("status");
    assert_eq!(status["policy"], serving["policy"], "the last good policy serves");
    assert_eq!(status["refused"], 5);

    // A manifest whose revision is not greater than the stored one: nothing is written.
    let stale = sign_publication(&seed, &good, config(3).as_bytes(), None, Some(1_000));
    let refused = publish_policy(&fleet, &good, &config(3), Some(&stale), None).unwrap_err();
    assert!(refused.contains("is not greater than the stored revision") && refused.contains("nothing was written"), "{refused}");
    assert_eq!(cli(&["GET", &key("config")]), config(2));
    // A manifest that does not cover what is published: refused before anything is written.
    let refused = publish_policy(&fleet, &good, &config(100), Some(&stale), None).unwrap_err();
    assert!(refused.contains("config-sha256") && refused.contains("nothing was written"), "{refused}");

    // Signed and published with the command line, as an operator does: taken.
    let dir = std::env::temp_dir().join(format!("agent-retry-fleet-signed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("seed.hex"), format!("{}\n", "05".repeat(32))).unwrap();
    std::fs::write(dir.join("policy.json"), config(2)).unwrap();
    std::fs::write(dir.join("vectors.json"), vectors).unwrap();
    let wasm_path = default_wasm_path();
    let run = |args: &[&str]| {
        let out = Command::new(BIN).arg("--wasm").arg(&wasm_path).args(args).current_dir(&dir).output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, said, err) = run(&["sign", "--key", "seed.hex", "--config", "policy.json", "--vectors", "vectors.json", "--out", "policy.manifest"]);
    assert!(ok, "{err}");
    let said: Value = serde_json::from_str(&said).unwrap();
    assert_eq!(said["public-key"], public_hex.as_str());
    let (ok, _, err) = run(&["publish", "--redis", &redis.url(), "--prefix", prefix, "--config", "policy.json", "--manifest", "policy.manifest"]);
    assert!(!ok && err.contains("no vectors were published"), "the vectors signed but not given: {err}");
    let (ok, said, err) =
        run(&["publish", "--redis", &redis.url(), "--prefix", prefix, "--config", "policy.json", "--vectors", "vectors.json", "--manifest", "policy.manifest"]);
    assert!(ok, "{err}");
    let published: Value = serde_json::from_str(&said).unwrap();
    assert_eq!(published["revision"], said_revision(&dir.join("policy.manifest")));
    assert_eq!(worker.next("serving")["policy"]["config-sha256"], sha256_hex(&config(2)));
    assert_eq!(cli(&["EXISTS", &key("wasm.sig")]), "0", "a publication deletes a signature over the .wasm alone");
    let _ = std::fs::remove_dir_all(dir);
}

/// The revision line of a manifest file.
fn said_revision(path: &std::path::Path) -> u64 {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().find_map(|line| line.strip_prefix("revision ")).unwrap().parse().unwrap()
}

#[test]
fn a_watcher_outlives_redis_and_takes_the_next_publication_when_it_returns() {
    let mut redis = RedisServer::start();
    let port = redis.port;
    let fleet = FleetSource::new(redis.url());
    let before = publish_policy(&fleet, &wasm(), &config(4), None, None).unwrap();
    let mut worker = Worker::start(&redis.url(), &["--interval-ms", "200"]);
    let serving = worker.next("serving");
    redis.kill();
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(worker.ask("decide")["attempts-against-a-persistent-503"], 4, "the policy serves with Redis away");
    // Back, but empty (a restart without persistence): nothing to take, the last good serves.
    let redis = RedisServer::start_on(port);
    let refused = worker.next("refused");
    assert!(refused["reason"].as_str().unwrap().contains("nothing published"), "{refused}");
    assert_eq!(worker.ask("status")["policy"], serving["policy"]);
    // The revision never repeats after Redis lost it: a worker that tried `before` must see this one as new.
    let after = publish_policy(&FleetSource::new(redis.url()), &wasm(), &config(2), None, None).unwrap();
    assert!(after > before, "{before} then {after}");
    assert_eq!(worker.next("serving")["policy"]["config-sha256"], sha256_hex(&config(2)));
}

#[test]
fn a_file_watcher_reloads_on_sighup_and_says_why_it_refuses_an_update() {
    let dir = std::env::temp_dir().join(format!("agent-retry-watch-hup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config_file = dir.join("policy.json");
    std::fs::write(&config_file, config(4)).unwrap();
    let mut child = Command::new(BIN)
        .arg("--wasm")
        .arg(default_wasm_path())
        .args(["watch", "--interval-ms", "3600000", "--config"])
        .arg(&config_file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (send, lines) = channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = send.send(serde_json::from_str::<Value>(&line).unwrap());
        }
    });
    let next = || lines.recv_timeout(Duration::from_secs(15)).expect("a line within 15 s");
    assert_eq!(next()["event"], "serving");
    std::thread::sleep(Duration::from_millis(300)); // the signal handler is installed
    std::fs::write(&config_file, config(2)).unwrap();
    assert!(Command::new("kill").args(["-HUP", &child.id().to_string()]).status().unwrap().success());
    let serving = next();
    assert_eq!(serving["policy"]["config-sha256"], sha256_hex(&config(2)), "{serving}");
    std::fs::write(&config_file, r#"{"max-attempts-per-call": 0}"#).unwrap();
    assert!(Command::new("kill").args(["-HUP", &child.id().to_string()]).status().unwrap().success());
    let refused = next();
    assert_eq!(refused["event"], "refused", "{refused}");
    assert!(refused["reason"].as_str().unwrap().contains("max-attempts-per-call"), "{refused}");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_file_watcher_reloads_and_rolls_back_on_stdin_commands() {
    let dir = std::env::temp_dir().join(format!("agent-retry-watch-stdin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config_file = dir.join("policy.json");
    std::fs::write(&config_file, config(4)).unwrap();
    let mut child = Command::new(BIN)
        .arg("--wasm")
        .arg(default_wasm_path())
        .args(["watch", "--interval-ms", "3600000", "--config"])
        .arg(&config_file)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let (send, lines) = channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = send.send(serde_json::from_str::<Value>(&line).unwrap());
        }
    });
    // The next line whose event is `event` (the watcher may say more, e.g. a refusal twice).
    let next = |event: &str| loop {
        let line = lines.recv_timeout(Duration::from_secs(15)).unwrap_or_else(|_| panic!("no {event} line within 15 s"));
        if line["event"] == event {
            return line;
        }
    };
    let mut command = |line: &str| writeln!(stdin, "{line}").unwrap();
    let serving = next("serving");
    assert_eq!(serving["policy"]["generation"], 1, "{serving}");
    // The watcher's first poll (at its start) is done: only the command reloads.
    std::thread::sleep(Duration::from_millis(300));

    // `reload`: the changed configuration serves (the polling interval is an hour: the command did it).
    std::fs::write(&config_file, config(2)).unwrap();
    command("reload");
    let serving = next("serving");
    assert_eq!((serving["policy"]["generation"].as_u64(), serving["policy"]["config-sha256"].as_str()), (Some(2), Some(sha256_hex(&config(2)).as_str())));
    command("decide");
    assert_eq!(next("decided")["attempts-against-a-persistent-503"], 2, "new runs get the reloaded budget");

    // `rollback`: back to generation 1 and its budget.
    command("rollback");
    let rolled = next("rolled-back");
    assert_eq!((rolled["policy"]["generation"].as_u64(), rolled["policy"]["config-sha256"].as_str()), (Some(1), Some(sha256_hex(&config(4)).as_str())));
    command("decide");
    let decided = next("decided");
    assert_eq!((decided["policy"]["generation"].as_u64(), decided["attempts-against-a-persistent-503"].as_u64()), (Some(1), Some(4)), "{decided}");

    // A bad configuration on `reload`: refused, generation 1 serves on; `status` counts it all.
    std::fs::write(&config_file, r#"{"max-attempts-per-call": 0}"#).unwrap();
    command("reload");
    let refused = next("refused");
    assert!(refused["reason"].as_str().unwrap().contains("max-attempts-per-call"), "{refused}");
    assert_eq!(refused["serving"]["generation"], 1, "{refused}");
    command("status");
    let status = next("status");
    assert_eq!((status["accepted"].as_u64(), status["refused"].as_u64(), status["rolled-back"].as_u64()), (Some(1), Some(1), Some(1)), "{status}");
    assert_eq!(status["policy"]["generation"], 1, "{status}");
    // A second `rollback` returns to the policy rolled back from.
    command("rollback");
    assert_eq!(next("rolled-back")["policy"]["generation"], 2);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_publication_whose_vectors_fail_is_refused_by_every_worker() {
    let redis = RedisServer::start();
    let fleet = FleetSource::new(redis.url());
    let vectors = serde_json::json!({"description": "the fleet's promises", "cases": [{
    "description": "a read is retried after a 503",
    "steps": [
        {"op": "begin-call", "call": {"tool": "lookup_order"}},
        {"op": "record-outcome", "call-id": 1, "outcome": {"failure": {"kind": {"http-status": 503}}}, "expect": {"ok": {"action": {"retry": {"attempt": 2}}}}}
    ]}]})
    .to_string();
    publish_policy(&fleet, &wasm(), &config(4), None, Some(&vectors)).unwrap();
    let mut worker = Worker::start(&redis.url(), &["--interval-ms", "200"]);
    let serving = worker.next("serving");
    // One attempt a call: the shipped vector's retry cannot happen.
    publish_policy(&fleet, &wasm(), &config(1), None, Some(&vectors)).unwrap();
    let refused = worker.next("refused");
    assert!(refused["reason"].as_str().unwrap().contains("a read is retried after a 503"), "{refused}");
    assert_eq!(worker.ask("status")["policy"], serving["policy"]);
}
