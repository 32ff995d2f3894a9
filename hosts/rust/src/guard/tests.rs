//! Every case of `tests/vectors/guard/guard.json` replayed: the first
//! violation and the event it refused must be the case's `expect`.

use std::path::Path;

use serde_json::{Value, json};

use super::*;
use crate::vectors::guard::{GuardFile, replay};

fn guard_vectors() -> GuardFile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors/guard/guard.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("guard.json parses")
}

#[test]
fn every_guard_vector_names_the_same_first_violation_at_the_same_event() {
    let file = guard_vectors();
    assert!(file.cases.len() >= 67, "the whole file: {} cases", file.cases.len());
    let mut failures = Vec::new();
    for case in &file.cases {
        let got = match replay(case) {
            Ok(Some((event, v))) => {
                assert!(!v.detail.is_empty() && v.to_string().starts_with(&format!("invariant {}: ", v.invariant)));
                json!({"violation": v.invariant.name(), "event": event})
            }
            Ok(None) => json!({"violation": null}),
            Err(e) => json!({"error": e}),
        };
        if got != case.expect {
            failures.push(format!("{}: expected {}, got {got}", case.description, case.expect));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), file.cases.len(), failures.join("\n"));
}

#[test]
fn a_violation_stays_for_the_rest_of_the_run() {
    let mut guard = RunGuard::from_config(&Value::Null);
    let call = guard.begin("issue_refund", Some("k"), None, 0).unwrap();
    let seen = Seen { http_status: Some(403), ..Seen::ANSWERED };
    guard.attempted(call, seen);
    let asked = Asked { action: ActionKind::Retry, delay_ms: 10, hint_ms: None, reconnect: false, cancel_task: false };
    let first = guard.verdict(call, &asked).unwrap_err();
    assert_eq!(first.invariant, Invariant::ClientErrorRepeated);
    let other = guard.begin("lookup_order", None, None, 10_000).unwrap_err();
    assert_eq!(other.invariant, Invariant::DelayOverCap);
    assert_eq!(guard.tripped(), Some(&first), "the first violation is the run's");
}

#[test]
fn a_configuration_that_is_not_json_takes_every_default() {
    let mut guard = RunGuard::from_config_text("{not json");
    let call = guard.begin("lookup_order", None, None, 0).unwrap();
    guard.attempted(call, Seen::of(&Outcome::Success));
    let at_cap = Asked { action: ActionKind::Retry, delay_ms: defaults::MAX_DELAY_MS, hint_ms: None, reconnect: false, cancel_task: false };
    assert_eq!(guard.verdict(call, &at_cap), Ok(()));
    let over = Asked { delay_ms: u64::MAX, ..at_cap };
    assert_eq!(guard.verdict(call, &over).unwrap_err().invariant, Invariant::DelayOverCap);
}

#[test]
fn cap_reads_each_field_of_the_configuration_and_the_retry_wait_cap() {
    let guard = RunGuard::from_config(&json!({"max-delay-ms": 1000, "max-polls-per-task": 7, "account-budget": {"max-wait-ms": 5000}}));
    assert_eq!(guard.cap("max-delay-ms"), Some(1000));
    assert_eq!(guard.cap("max-polls-per-task"), Some(7));
    assert_eq!(guard.cap("retry-wait-cap-ms"), Some(5000));
    assert_eq!(guard.cap("max-hint-ms"), Some(defaults::MAX_HINT_MS));
    assert_eq!(RunGuard::from_config(&json!({})).cap("retry-wait-cap-ms"), Some(defaults::MAX_DELAY_MS));
    assert_eq!(guard.cap("max-wait-ms"), None);
    assert!(RunGuard::CAP_FIELDS.iter().all(|field| guard.cap(field).is_some()));
}

#[test]
fn a_retry_speaking_header_is_read_case_insensitively() {
    assert!(speaks_of_retrying("X-Should-Retry: TRUE"));
    assert!(!speaks_of_retrying("x-should-retry: false"));
    assert!(speaks_of_retrying("content-type: text/plain\nGrpc-Status: 14"));
    assert!(!speaks_of_retrying("retry-after: 3"));
}
