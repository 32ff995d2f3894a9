//! The proxy against a hostile or broken client, over raw stdio (no SDK, so
//! that anything can be sent): each test reproduces a defect a hostile review
//! of the first cut found, and failed before its fix.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_agent-retry");

struct Proxy {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    dir: std::path::PathBuf,
}

impl Proxy {
    /// `agent-retry proxy --settings S -- agent-retry serve --stdio ...`, initialized;
    /// `files` are written first into the test's directory, `{dir}` in `server`.
    fn start(name: &str, settings: &str, files: &[(&str, &str)], server: &[&str]) -> Proxy {
        let dir = std::env::temp_dir().join(format!("agent-retry-proxy-hostile-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (file, text) in files {
            std::fs::write(dir.join(file), text).unwrap();
        }
        let settings_path = dir.join("settings.json");
        std::fs::write(&settings_path, settings).unwrap();
        let mut child = Command::new(BIN)
            .args(["proxy", "--watch-ms", "0", "--settings"])
            .arg(&settings_path)
            .args(["--", BIN, "serve", "--stdio"])
            .args(server.iter().map(|a| a.replace("{dir}", &dir.to_string_lossy())))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut proxy = Proxy { child, stdin, stdout, dir };
        let capabilities = json!({"elicitation": {}});
        proxy.send(&json!({"jsonrpc": "2.0", "id": 100, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": capabilities, "clientInfo": {"name": "hostile", "version": "1"}}}));
        assert!(proxy.read().get("result").is_some(), "initialized");
        proxy.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        proxy
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
    }

    fn read(&mut self) -> Value {
        let mut line = String::new();
        assert!(self.stdout.read_line(&mut line).unwrap() > 0, "the proxy closed its stdout");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// 3 million bad lines from a client that does not read its errors: the proxy
/// reads no faster than the errors are taken (it held 2.4 GB for 10 million before).
#[test]
fn a_flood_of_bad_lines_from_a_client_that_does_not_read_keeps_memory_flat() {
    let mut proxy = Proxy::start("flood", "{}", &[], &[]);
    let before = proxy.rss_kib();
    let mut stdin = proxy.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let chunk = "x\n".repeat(100_000);
        for _ in 0..30 {
            if stdin.write_all(chunk.as_bytes()).is_err() {
                return;
            }
        }
    });
    std::thread::sleep(Duration::from_secs(3));
    let during = proxy.rss_kib();
    assert!(during < before + 64 * 1024, "the proxy's memory grew from {before} KiB to {during} KiB while nobody read its errors");
    // Reading now, the errors come, each a parse error for the client.
    let first = proxy.read();
    assert_eq!(first["error"]["code"], -32700, "{first}");
    drop(proxy);
    let _ = writer.join();
}

/// The client's answer to the server's request (here an elicitation) that is
/// over the limit fails that request, in the client's name; the client's own
/// request with the same id number gets its own answer, not that error.
#[test]
fn an_unreadable_answer_to_the_servers_request_fails_that_request_not_the_clients() {
    let mut proxy = Proxy::start("answer", r#"{"max-message-bytes": 2048}"#, &[], &[]);
    proxy.send(&json!({"jsonrpc": "2.0", "id": 0, "method": "tools/call", "params": {"name": "confirm_order", "arguments": {"order_id": "A-1"}}}));
    let deadline = Instant::now() + Duration::from_secs(20);
    let answer = loop {
        assert!(Instant::now() < deadline, "no answer to the client's request");
        let message = proxy.read();
        if message["method"] == "elicitation/create" {
            let huge = json!({"jsonrpc": "2.0", "id": message["id"], "result": {"action": "accept", "content": {"note": "y".repeat(3000)}}});
            proxy.send(&huge);
        } else if message["id"] == 0 && message.get("method").is_none() {
            break message;
        }
    };
    assert!(answer.get("error").is_none(), "the client's request 0 was answered with the error of the server's request 0: {answer}");
    assert_eq!(answer["result"]["isError"], true, "the continuation failed, as the policy says: {answer}");
}

/// The TypeScript SDK writes a message's id last: an oversized request or
/// answer written so is still refused under its id (the answer fails the
/// server's request; before, it was dropped and the server's request waited).
#[test]
fn an_oversized_message_with_its_id_last_is_refused_under_that_id() {
    let mut proxy = Proxy::start("id-last", r#"{"max-message-bytes": 2048}"#, &[], &[]);
    let huge = "y".repeat(3000);
    let request = format!(r#"{{"method":"tools/call","params":{{"name":"lookup_order","arguments":{{"order_id":"{huge}"}}}},"jsonrpc":"2.0","id":41}}"#);
    writeln!(proxy.stdin.as_mut().unwrap(), "{request}").unwrap();
    let refused = proxy.read();
    assert_eq!((refused["id"].clone(), refused["error"]["code"].clone()), (json!(41), json!(-32600)), "{refused}");

    proxy.send(&json!({"jsonrpc": "2.0", "id": 0, "method": "tools/call", "params": {"name": "confirm_order", "arguments": {"order_id": "A-1"}}}));
    let deadline = Instant::now() + Duration::from_secs(20);
    let answer = loop {
        assert!(Instant::now() < deadline, "no answer to the client's request: the server's request was left waiting");
        let message = proxy.read();
        if message["method"] == "elicitation/create" {
            let id = message["id"].clone();
            let answer = format!(r#"{{"result":{{"action":"accept","content":{{"note":"{huge}"}}}},"jsonrpc":"2.0","id":{id}}}"#);
            writeln!(proxy.stdin.as_mut().unwrap(), "{answer}").unwrap();
            proxy.stdin.as_mut().unwrap().flush().unwrap();
        } else if message["id"] == 0 && message.get("method").is_none() {
            break message;
        }
    };
    assert_eq!(answer["result"]["isError"], true, "the continuation failed at once: {answer}");
}

/// A key the client gave that the policy cannot be told (over 256 bytes) is
/// still the server's key: sent unchanged, and the call is an unkeyed write,
/// so a timeout is not resent blind (a derived key made two refunds before).
#[test]
fn a_key_over_the_limit_is_sent_unchanged_and_the_write_is_not_resent_blind() {
    let faults = r#"[{"tool": "issue_refund", "call": 1, "fault": {"kind": "timeout-after-apply", "delay-ms": 1500}}]"#;
    let server = ["--faults", "{dir}/faults.json", "--ledger", "{dir}/ledger.json"];
    let mut proxy = Proxy::start("key", r#"{"attempt-timeout-ms": 300}"#, &[("faults.json", faults)], &server);
    let key = "k".repeat(300);
    let arguments = json!({"order_id": "A-1", "amount_paise": 100, "idempotency_key": key});
    proxy.send(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "issue_refund", "arguments": arguments}}));
    let answer = proxy.read();
    assert_eq!(answer["id"], 1, "{answer}");
    std::thread::sleep(Duration::from_millis(1500));
    let ledger: Value = serde_json::from_str(&std::fs::read_to_string(proxy.dir.join("ledger.json")).unwrap()).unwrap();
    let refunds = ledger["refunds"].as_array().unwrap();
    assert_eq!(refunds.len(), 1, "one refund: {ledger}");
    assert_eq!(refunds[0]["idempotency_key"], key.as_str(), "the client's key, unchanged");
    assert_eq!(answer["result"]["isError"], true, "the ambiguous unkeyed write escalates, with no status check named: {answer}");
}
