//! Judge mode: after a host has run the exam (tests/judge/exam.json) against the
//! server, check from the server's side what a correct host must have done.
//! Each rule is one verdict; the exam's order ids (`J-1` …) tie calls to rules.

use serde_json::Value;

use crate::tools::{CallRecord, DemoState, lock};

/// One rule's result.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub rule: &'static str,
    pub passed: bool,
    pub detail: String,
}

fn calls(state: &DemoState, tool: &str, order_id: &str) -> Vec<CallRecord> {
    state.calls_to(tool).into_iter().filter(|c| c.arguments["order_id"] == order_id).collect()
}

fn verdict(rule: &'static str, failures: Vec<String>, ok: String) -> Verdict {
    if failures.is_empty() { Verdict { rule, passed: true, detail: ok } } else { Verdict { rule, passed: false, detail: failures.join("; ") } }
}

fn gap_ms(calls: &[CallRecord]) -> Option<u64> {
    Some(calls.get(1)?.at_ms.saturating_sub(calls.first()?.at_ms))
}

/// Checks every rule against what the server saw. `max_attempts_per_call` is the
/// exam configuration's: a persistent failure gets exactly that many attempts.
pub fn judge(state: &DemoState, max_attempts_per_call: usize) -> Vec<Verdict> {
    let mut verdicts = Vec::new();

    // A transient failure is retried, with the same idempotency key.
    let refund = calls(state, "issue_refund", "J-1");
    let keys: Vec<&Value> = refund.iter().map(|c| &c.arguments["idempotency_key"]).collect();
    let blip = calls(state, "lookup_order", "J-8");
    let mut failures = Vec::new();
    if refund.len() < 2 {
        failures.push(format!("J-1: the write that timed out was sent {} time(s), not retried", refund.len()));
    }
    if keys.iter().any(|k| !k.is_string()) || keys.windows(2).any(|w| w[0] != w[1]) {
        failures.push(format!("J-1: the keys were not one and the same: {keys:?}"));
    }
    if blip.len() < 2 {
        failures.push(format!("J-8: a 503 was not retried ({} call)", blip.len()));
    }
    verdicts.push(verdict(
        "a transient failure is retried with the same idempotency key",
        failures,
        format!("J-1 sent {} times with key {}; J-8 retried", refund.len(), keys.first().map_or("-".into(), |k| k.to_string())),
    ));

    // No wait is shorter than the server's hint.
    let mut failures = Vec::new();
    let mut seen = Vec::new();
    for (order, hint_ms) in [("J-2", 1000u64), ("J-8", 600)] {
        match gap_ms(&calls(state, "lookup_order", order)) {
            Some(gap) if gap >= hint_ms => seen.push(format!("{order}: {gap} ms after a {hint_ms} ms hint")),
            Some(gap) => failures.push(format!("{order}: retried {gap} ms after a {hint_ms} ms hint")),
            None => failures.push(format!("{order}: not retried")),
        }
    }
    verdicts.push(verdict("no wait is shorter than the server's hint", failures, seen.join(", ")));

    // A 400 or a 403 is never repeated.
    let bad_request = calls(state, "lookup_order", "J-3").len();
    let forbidden = calls(state, "issue_refund", "J-4").len();
    let mut failures = Vec::new();
    if bad_request != 1 {
        failures.push(format!("J-3: the 400 was sent {bad_request} times"));
    }
    if forbidden != 1 {
        failures.push(format!("J-4: the 403 was sent {forbidden} times"));
    }
    verdicts.push(verdict("a 400 / 403 is never repeated", failures, "J-3 and J-4 sent once each".into()));

    // A write is never applied twice.
    let ledger = lock(&state.ledger);
    let mut failures = Vec::new();
    if ledger.duplicate_refunds() > 0 || ledger.duplicate_notes() > 0 {
        failures.push(format!("{} duplicate refunds, {} duplicate notes", ledger.duplicate_refunds(), ledger.duplicate_notes()));
    }
    let refunds_j1 = ledger.refunds.iter().filter(|r| r.order_id == "J-1").count();
    let notes = |order: &str| ledger.notes.iter().filter(|n| n.order_id == order).count();
    for (what, count) in [("J-1 refunds", refunds_j1), ("J-5 notes", notes("J-5")), ("J-6 notes", notes("J-6"))] {
        if count != 1 {
            failures.push(format!("{what}: {count} applied, 1 intended"));
        }
    }
    let detail = format!("{} refunds, {} notes, no duplicate", ledger.refunds.len(), ledger.notes.len());
    drop(ledger);
    verdicts.push(verdict("a write is never applied twice", failures, detail));

    // A status check precedes any resend of an unkeyed write.
    let mut failures = Vec::new();
    let log = lock(&state.calls).clone();
    for order in ["J-5", "J-6"] {
        let mine: Vec<&CallRecord> = log.iter().filter(|c| c.arguments["order_id"] == order).collect();
        let writes: Vec<usize> = mine.iter().enumerate().filter(|(_, c)| c.tool == "record_note").map(|(i, _)| i).collect();
        for pair in writes.windows(2) {
            if !mine[pair[0] + 1..pair[1]].iter().any(|c| c.tool == "list_notes") {
                failures.push(format!("{order}: record_note resent without a status check"));
            }
        }
        if !mine.iter().any(|c| c.tool == "list_notes") {
            failures.push(format!("{order}: the ambiguous write was never checked"));
        }
    }
    let resent = calls(state, "record_note", "J-5").len();
    if resent != 1 {
        failures.push(format!("J-5: the write the check found applied was sent {resent} times"));
    }
    verdicts.push(verdict(
        "a status check precedes any resend of an unkeyed write",
        failures,
        format!("J-5 checked, not resent; J-6 checked, then resent ({} sends)", calls(state, "record_note", "J-6").len()),
    ));

    // Calls stop when the budgets say so: no fewer attempts (a blip is retried),
    // no more (the budget ends it).
    let persistent = calls(state, "lookup_order", "J-7").len();
    let allowed = max_attempts_per_call;
    let failures = if persistent == allowed { vec![] } else { vec![format!("J-7: {persistent} attempts against a persistent 503, {allowed} due")] };
    verdicts.push(verdict("calls stop when the budgets say so", failures, format!("J-7: {allowed} attempts, then stop")));

    // A host polling a task never calls the tool again (MCP 2026-07-28 Tasks):
    // J-9's refund (the first run, so the first task) is answered by a task whose second poll gets a 503.
    let mut failures = Vec::new();
    let sent = calls(state, "issue_refund", "J-9").len();
    let task = state.tasks_created().into_iter().find(|t| t.tool == "issue_refund" && t.arguments["order_id"] == "J-9");
    let polls = task.as_ref().map_or(0, |t| state.task_requests("tasks/get", &t.task_id).len());
    let refunds = lock(&state.ledger).refunds.iter().filter(|r| r.order_id == "J-9").count();
    if task.is_none() {
        failures.push("J-9: not answered by a task (the host did not declare io.modelcontextprotocol/tasks)".to_string());
    }
    if sent != 1 {
        failures.push(format!("J-9: issue_refund sent {sent} times while its task lived"));
    }
    if task.is_some() && polls < 3 {
        failures.push(format!("J-9: the task was polled {polls} times; a failed poll is polled again until it completes"));
    }
    if refunds != 1 {
        failures.push(format!("J-9: {refunds} refunds applied, 1 intended"));
    }
    verdicts.push(verdict(
        "a host polling a task never calls the tool again",
        failures,
        format!("J-9 sent once, its task polled {polls} times through a 503, one refund"),
    ));

    // A host never resends a request that is still reporting progress: a 2 s
    // export reports every 200 ms, under an idle timeout of 700 ms.
    let reports = lock(&state.ledger).reports.clone();
    let runs = state.calls_to("export_report").len();
    let mut failures = Vec::new();
    if runs != 1 {
        failures.push(format!("export_report sent {runs} times; its progress should have kept the attempt alive"));
    }
    if !reports.iter().any(|r| r.finished && r.progress_token.is_some()) {
        failures.push(format!("no export ran to the end with a progress token: {reports:?}"));
    }
    verdicts.push(verdict(
        "a host never resends a request that is still reporting progress",
        failures,
        format!("export_report sent once, {} progress notifications", reports.iter().map(|r| r.notifications).sum::<u32>()),
    ));

    verdicts
}
