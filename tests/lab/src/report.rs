//! The tables, as text (the same text `make lab-check` compares with
//! `tests/lab/expected.txt`).

use std::fmt::Write;

use crate::contention::ContentionRow;
use crate::lab::{Policy, RowTotals};

fn cell(ours: u32, seed: Option<Option<u32>>) -> String {
    match seed {
        Some(Some(theirs)) => format!("{ours} ({theirs})"),
        _ => ours.to_string(),
    }
}

/// The lab table: one line per policy; the article's figure in parentheses where it gives one.
pub fn lab_table(title: &str, rows: &[(&Policy, RowTotals)], show_seed: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{title}");
    let _ = writeln!(
        out,
        "{:<52} {:>9} {:>7} {:>9} {:>7} {:>9} {:>9} {:>5} {:>8}",
        "policy", "completed", "doubled", "wasted", "looped", "escalated", "calls", "early", "waited s"
    );
    for (policy, t) in rows {
        let seed = |i: usize| policy.seed.filter(|_| show_seed).map(|s| s[i]);
        let _ = writeln!(
            out,
            "{:<52} {:>9} {:>7} {:>9} {:>7} {:>9} {:>9} {:>5} {:>8.1}",
            policy.name,
            cell(t.completed, seed(0)),
            cell(t.doubled, seed(1)),
            cell(t.wasted, seed(2)),
            cell(t.looped, seed(3)),
            cell(t.escalated, seed(4)),
            cell(t.calls, seed(5)),
            t.early,
            t.waited_ms as f64 / 1000.0
        );
    }
    out
}

/// Escalations by reason, per policy (only the rows with escalations).
pub fn escalations(rows: &[(&Policy, RowTotals)]) -> String {
    let mut out = String::new();
    for (policy, t) in rows.iter().filter(|(_, t)| !t.escalations.is_empty()) {
        let reasons: Vec<String> = t.escalations.iter().map(|(r, n)| format!("{r} {n}")).collect();
        let _ = writeln!(out, "  {:<50} {}", policy.name, reasons.join(", "));
    }
    out
}

/// The contention table: completion time and write calls per client count.
pub fn contention_table(rows: &[ContentionRow], clients: &[u32]) -> String {
    let mut out = String::new();
    let _ = write!(out, "{:<52}", "policy (time ms / calls)");
    for n in clients {
        let _ = write!(out, " {:>14}", format!("{n} clients"));
    }
    let _ = writeln!(out);
    for row in rows {
        let _ = write!(out, "{:<52}", row.name);
        for point in &row.points {
            let done = if point.completed_pct < 100.0 { "*" } else { "" };
            let _ = write!(out, " {:>14}", format!("{:.0} / {:.0}{done}", point.time_ms, point.calls));
        }
        let _ = writeln!(out);
    }
    out
}

/// The lab's output: the text, and each table's rows (name, totals).
pub struct LabOutput {
    pub text: String,
    pub tables: Vec<(String, Vec<(String, RowTotals)>)>,
}

/// Runs every policy on the mix, and on each of its variants; `source` names the mix.
pub fn lab(component: &agent_retry_host::PolicyComponent, mix: &crate::faults::FaultMix, source: &str, seed: u64) -> anyhow::Result<LabOutput> {
    let policies = crate::lab::policies();
    let mut text = String::new();
    let mut tables = Vec::new();
    let mut mixes = vec![(String::from("the fault mix"), mix.clone())];
    for name in mix.variants.keys() {
        if let Some(variant) = mix.variant(name) {
            mixes.push((format!("variant {name}"), variant));
        }
    }
    for (index, (label, mix)) in mixes.iter().enumerate() {
        let mut rows = Vec::new();
        for policy in &policies {
            let (totals, _) = crate::lab::run_policy(component, mix, policy, seed)?;
            rows.push((policy, totals));
        }
        let title = if index == 0 {
            format!(
                "The refund lab: {} runs of {source}, step budget {}, replan limit {}; the article's figure in parentheses",
                mix.runs.len(),
                mix.step_budget,
                mix.replan_limit
            )
        } else {
            let notes: Vec<String> =
                mix.runs.iter().zip(&mixes[0].1.runs).filter(|(a, b)| a.note != b.note).map(|(a, _)| format!("{}: {}", a.id, a.note)).collect();
            format!("The same lab, {label} ({})", notes.join("; "))
        };
        let _ = writeln!(text, "{}", lab_table(&title, &rows, index == 0));
        let _ = writeln!(text, "escalations by reason:");
        let _ = writeln!(text, "{}", escalations(&rows));
        tables.push((label.clone(), rows.into_iter().map(|(p, t)| (p.name.to_string(), t)).collect()));
    }
    Ok(LabOutput { text, tables })
}

/// The contention simulation's table, and at 50 clients the check of the target:
/// each coordinated row makes fewer calls than full jitter and finishes sooner
/// than decorrelated jitter.
pub fn contention(component: &agent_retry_host::PolicyComponent, clients: &[u32], runs: u32, seed: u64) -> anyhow::Result<(String, Vec<ContentionRow>)> {
    let rows = crate::contention::run_all(component, clients, runs, seed)?;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "Brooker's contention simulation: one row under optimistic concurrency, network |N(10 ms, 2 ms)|, base 5 ms, cap 2 s, mean of {runs} simulations (simulated time); \
         time of the last write's answer (ms) / writes that reached the row; * = not every client wrote"
    );
    text.push_str(&contention_table(&rows, clients));
    for row in rows.iter().filter(|r| r.points.iter().any(|p| p.completed_pct < 100.0)) {
        let done: Vec<String> = row.points.iter().map(|p| format!("{}: {:.0}%", p.clients, p.completed_pct)).collect();
        let _ = writeln!(text, "  clients that wrote, {}: {}", row.name, done.join(", "));
    }
    if let Some(at) = clients.iter().position(|&n| n == 50) {
        let find = |name: &str| rows.iter().find(|r| r.name == name).map(|r| r.points[at]);
        if let (Some(full), Some(decorrelated)) = (find("full jitter"), find("decorrelated jitter")) {
            let _ = writeln!(
                text,
                "target at 50 clients: fewer calls than full jitter ({:.0}) and less time than decorrelated jitter ({:.0} ms)",
                full.calls, decorrelated.time_ms
            );
            for row in rows.iter().filter(|r| r.name.starts_with("account budget") || r.name.starts_with("retry quota")) {
                let p = row.points[at];
                let met = p.calls < full.calls && p.time_ms < decorrelated.time_ms && p.completed_pct >= 100.0;
                let why = if p.completed_pct < 100.0 { format!(" (only {:.0}% of the clients wrote)", p.completed_pct) } else { String::new() };
                let _ = writeln!(text, "  {:<52} {:>5.0} calls {:>6.0} ms  {}{why}", row.name, p.calls, p.time_ms, if met { "met" } else { "NOT met" });
            }
        }
    }
    Ok((text, rows))
}
