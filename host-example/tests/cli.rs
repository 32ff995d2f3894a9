//! The `agent-retry` command line, run as a user runs it.

use std::io::Write;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_agent-retry");

fn number_after(text: &str, label: &str) -> u64 {
    let line = text.lines().find(|l| l.starts_with(label)).unwrap_or_else(|| panic!("no line {label:?} in:\n{text}"));
    line[label.len()..].split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn the_demo_leaves_no_duplicate_effect_and_logs_one_line_per_attempt() {
    let log = std::env::temp_dir().join(format!("agent-retry-demo-test-{}.jsonl", std::process::id()));
    let output = Command::new(BIN).args(["demo", "--seed", "3", "--log"]).arg(&log).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(number_after(&stdout, "duplicate effects in ledger"), 0);
    // CASE-5011's 500 with x-should-retry: false escalates retry-forbidden (contract 0.2.0).
    assert_eq!(number_after(&stdout, "runs completed"), 9, "{stdout}");
    assert_eq!(number_after(&stdout, "runs escalated"), 3, "{stdout}");
    assert!(stdout.contains("\"retry-forbidden\": 1"), "{stdout}");
    let attempts = number_after(&stdout, "tool-call attempts (host)");
    let received = number_after(&stdout, "tool calls received (server)");
    assert_eq!(attempts, received, "the host's count of attempts is the server's");
    let lines = std::fs::read_to_string(&log).unwrap();
    let events: Vec<serde_json::Value> = lines.lines().map(|l| serde_json::from_str(l).expect("every log line is JSON")).collect();
    // A call escalated before it is sent has a line too, with attempt 0; the
    // wrapper's `tools/list` (a call of the run, no step) has lines of its own.
    let listing = events.iter().filter(|e| e["event"] == "agent_retry.attempt" && e["tool"] == "tools/list").count();
    assert!(listing >= 12, "each of the 12 runs lists the tools through the policy: {listing}");
    let sent: Vec<&serde_json::Value> =
        events.iter().filter(|e| e["event"] == "agent_retry.attempt" && e["attempt"].as_u64() > Some(0) && e.get("step").is_some()).collect();
    assert_eq!(sent.len() as u64, attempts, "one log line per attempt");
    // The fields of the Python and Node wrappers' lines (hosts/README.md); a
    // value that does not apply is absent here, null there.
    for event in &sent {
        for field in ["event", "run", "policy", "step", "call", "tool", "attempt", "outcome", "class", "rule", "action", "reason"] {
            assert!(event.get(field).is_some(), "{field} missing in {event}");
        }
        assert!(event.get("status").is_none(), "the outcome's field is `outcome` in every host: {event}");
    }
    assert!(sent.iter().any(|e| e["key"].as_str().is_some_and(|k| k.starts_with("ar1-"))), "a keyed write logs its key");
}

#[test]
fn decide_answers_json_lines() {
    let mut child = Command::new(BIN).arg("decide").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let steps = [
        r#"{"op": "begin-call", "call": {"tool": "lookup_order", "hints": {"read-only": true}}}"#,
        r#"{"op": "record-outcome", "call-id": 1, "outcome": {"failure": {"kind": {"http-status": 429}, "headers": [["retry-after", "3"]]}}}"#,
        r#"not json"#,
        r#"{"op": "classify", "failure": {"kind": {"http-status": 403}}}"#,
    ];
    child.stdin.take().unwrap().write_all(steps.join("\n").as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    let answers: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(answers.len(), 4);
    assert_eq!(answers[0]["ok"]["send"]["call-id"], 1);
    assert_eq!(answers[1]["ok"]["action"]["retry"]["delay-ms"], 3000);
    assert!(answers[2]["error"].as_str().unwrap().starts_with("not JSON"));
    assert_eq!(answers[3]["class"], "permission");
}

/// Issue 24, row 12: a 33 MB tool error through `decide` trapped the instance,
/// since that path skipped the input limits the library applies. It is cut to
/// 64 KiB as in every wrapper, and an id past 256 bytes is refused by name.
#[test]
fn decide_applies_the_input_limits() {
    let mut child = Command::new(BIN).arg("decide").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let body = format!("rate limit exceeded; {}", "x".repeat(33 << 20));
    let huge = serde_json::json!({"op": "record-outcome", "call-id": 1, "outcome": {"failure": {"kind": {"tool-error": null}, "body": body}}});
    let long_tool = "t".repeat(300);
    let steps = [
        r#"{"op": "begin-call", "call": {"tool": "lookup_order", "hints": {"read-only": true}}}"#.to_string(),
        huge.to_string(),
        format!(r#"{{"op": "begin-call", "call": {{"tool": "{long_tool}"}}}}"#),
        r#"{"op": "report"}"#.to_string(),
    ];
    let mut stdin = child.stdin.take().unwrap();
    std::thread::spawn(move || stdin.write_all(steps.join("\n").as_bytes()).unwrap());
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    let answers: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(answers.len(), 4, "{answers:?}");
    let action = &answers[1]["ok"]["action"];
    assert!(action["retry"].is_object(), "the relayed rate limit is read from the cut text, no trap: {}", answers[1]);
    let refused = answers[2]["error"].as_str().unwrap();
    assert!(refused.contains("tool is 300 bytes") && refused.contains("256-byte limit"), "{refused}");
    assert_eq!(answers[3]["calls"], 1, "the same instance goes on: {}", answers[3]);
}

/// A step that traps the component (a configuration far past the fuel budget)
/// gets the trap's cause; the next steps are served by a fresh instance with the
/// configuration in force, instead of every later step failing.
#[test]
fn decide_goes_on_after_a_trap_with_a_fresh_instance() {
    // A configuration's load has fuel for 20,000 tools by default: on a call's
    // tank alone (no more a byte), they run out, and that call traps.
    let mut child = Command::new(BIN).args(["decide", "--fuel-per-config-byte", "0"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let tools: Vec<String> = (0..20_000).map(|i| format!(r#""tool_{i:05}": {{"effect": "read"}}"#)).collect();
    let steps = [
        r#"{"op": "load-policy", "config": {"max-attempts-per-call": 2}}"#.to_string(),
        format!(r#"{{"op": "load-policy", "config": {{"tools": {{{}}}}}}}"#, tools.join(",")),
        r#"{"op": "begin-call", "call": {"tool": "lookup_order", "hints": {"read-only": true}}}"#.to_string(),
        r#"{"op": "record-outcome", "call-id": 1, "outcome": {"failure": {"kind": {"http-status": 503}}}}"#.to_string(),
        r#"{"op": "record-outcome", "call-id": 1, "outcome": {"failure": {"kind": {"http-status": 503}}}}"#.to_string(),
    ];
    child.stdin.take().unwrap().write_all(steps.join("\n").as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    let answers: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(answers.len(), 5);
    let trap = answers[1]["error"].as_str().unwrap();
    assert!(trap.contains("ran out of fuel"), "{trap}");
    assert!(answers[1]["recovered"].is_string());
    assert_eq!(answers[2]["ok"]["send"]["call-id"], 1, "the fresh instance serves");
    assert!(answers[3]["ok"]["action"]["retry"].is_object());
    // The configuration in force before the trap (2 attempts a call) still applies.
    assert_eq!(answers[4]["ok"]["action"]["escalate"]["reason"], "call-attempts-spent", "{}", answers[4]);
}

#[test]
fn call_reports_an_escalation_from_a_stdio_server() {
    let stdio = format!("{BIN} serve --stdio");
    let output = Command::new(BIN).args(["call", "--stdio", &stdio, "issue_refund", r#"{"order_id": "ORD-1", "amount_paise": 900000}"#]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    // The wrapper speaks the Tasks extension: the demo server answers a refund
    // above its approval limit with a task that asks a person, and with no
    // handler to answer, the run escalates with the question.
    assert_eq!(answer["outcome"], "escalated");
    assert_eq!(answer["reason"], "input-required");
    assert!(answer["note"].as_str().unwrap().contains("Approve a refund of 9000.00 rupees on order ORD-1?"), "{answer}");
    let log = String::from_utf8_lossy(&output.stderr);
    // Connecting and listing the tools are the run's first two calls; the tool's is one attempt, polled.
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("\"message\":\"attempt\"")).collect();
    let refund: Vec<&&str> = lines.iter().filter(|l| l.contains("\"tool\":\"issue_refund\"")).collect();
    assert!(!refund.is_empty() && refund.iter().all(|l| l.contains("\"attempt\":1,")), "{log}");
    assert!(lines.iter().any(|l| l.contains("\"tool\":\"initialize\"")) && lines.iter().any(|l| l.contains("\"tool\":\"tools/list\"")), "{log}");
}
