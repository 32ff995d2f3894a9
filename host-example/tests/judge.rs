//! The host-conformance judge certifies the Rust host, and fails a host that
//! ignores the policy.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_agent-retry");

fn exam() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/judge/exam.json").display().to_string()
}

#[test]
fn the_rust_host_passes_every_rule() {
    let output = Command::new(BIN).args(["judge", "--exam", &exam(), "--", BIN, "exam"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.lines().any(|l| l == "8 passed, 0 failed"), "{stdout}");
}

#[test]
fn a_host_without_the_policy_fails_the_exam() {
    let output = Command::new(BIN).args(["judge", "--exam", &exam(), "--", BIN, "exam", "--no-policy"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "{stdout}");
    // The naive client declares no tasks extension and sets no idle timeout of its own: the task rule fails too.
    for rule in [
        "same idempotency key",
        "shorter than the server's hint",
        "never repeated",
        "never applied twice",
        "status check precedes",
        "budgets say so",
        "never calls the tool again",
    ] {
        assert!(stdout.lines().any(|l| l.starts_with("FAIL") && l.contains(rule)), "{rule}: {stdout}");
    }
}
