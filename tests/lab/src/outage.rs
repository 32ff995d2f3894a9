//! The outage lab (issue 26): agents' runs against one MCP server that is down
//! for a minute and then recovers, with every decision made by the component.
//! It compares no breaker, a breaker in each of two hosts, and one breaker the
//! two hosts share (as through Redis), and counts what reached the dead server,
//! how soon after the recovery a call succeeded, and how the runs ended.
//!
//! The set-up: `RUNS` runs, half on each of two hosts (component instances),
//! each calling the read `lookup_order` `CALLS_PER_RUN` times, `THINK_MS` apart,
//! starting at a seeded offset in the first `THINK_MS`. An attempt takes
//! `LATENCY_MS`; from `DOWN_FROM_MS` to `DOWN_UNTIL_MS` every attempt the
//! server gets answers 503. A replan (a breaker refused the call, or opened
//! under it) is the model trying the same call again `REPLAN_WAIT_MS` later; an
//! escalation ends the run. Time is simulated: the runs share one clock.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use agent_retry_host::component::types::{Action, Delivery, FailureKind};
use agent_retry_host::component::{PolicyHandle, RunHandle};
use agent_retry_host::shared_state::EmbeddedSharedState;
use agent_retry_host::{Admission, EmbeddedAccounts, EntropySource, HostServices, Outcome, PolicyComponent, PolicyInstance};

use crate::rng::SplitMix64;

pub const RUNS: usize = 50;
pub const CALLS_PER_RUN: u32 = 10;
pub const THINK_MS: u64 = 2_000;
pub const LATENCY_MS: u64 = 50;
pub const DOWN_FROM_MS: u64 = 10_000;
pub const DOWN_UNTIL_MS: u64 = 70_000;
pub const REPLAN_WAIT_MS: u64 = 5_000;
/// Where the simulated clock starts (2025-11-30T00:00:00Z, as the vectors').
const EPOCH_MS: u64 = 1_764_460_800_000;
const SERVER: &str = "https://mcp.example/mcp";

/// The policy of every scenario: budgets that let a run ride out a minute's
/// outage (an agent that keeps trying), and the breaker when there is one.
pub fn config(breaker: bool) -> String {
    let base = r#""max-attempts-per-call": 4, "max-retries-per-run": 40, "max-replans-per-run": 40, "max-steps-per-run": 400,
        "tools": {"lookup_order": {"effect": "read"}}"#;
    let breaker = if breaker {
        r#", "circuit-breaker": {"failures-to-open": 5, "cooldown-ms": 5000, "cooldown-multiplier": 2, "max-cooldown-ms": 20000, "probe-lease-ms": 10000}"#
    } else {
        ""
    };
    format!("{{{base}{breaker}}}")
}

/// How the breakers are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    None,
    /// Each host its own (embedded) state.
    PerHost,
    /// One state for both hosts (what Redis gives a fleet).
    Shared,
}

/// One scenario's outcome.
#[derive(Clone, Debug)]
pub struct OutageRow {
    pub name: &'static str,
    /// Attempts the server got while it was down.
    pub sent_while_down: u32,
    /// Calls the breakers stopped before they were sent.
    pub refused: u32,
    /// From the recovery to the first successful attempt, in ms.
    pub first_success_after_ms: Option<u64>,
    pub completed: u32,
    pub escalated: u32,
    /// Attempts the server got in each simulated second.
    pub per_second: Vec<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Next {
    /// Begin the run's next call (or the same one again after a replan).
    Begin,
    /// Send attempt `n` of the call.
    Attempt(u32),
}

struct Agent {
    host: usize,
    run: RunHandle,
    call_id: u32,
    done_calls: u32,
    ended: bool,
    escalated: bool,
}

/// Runs one scenario.
pub fn run(component: &PolicyComponent, name: &'static str, sharing: Sharing, seed: u64) -> anyhow::Result<OutageRow> {
    let clock = Arc::new(AtomicU64::new(EPOCH_MS));
    let state = |clock: &Arc<AtomicU64>| {
        let clock = Arc::clone(clock);
        Arc::new(EmbeddedSharedState::with_clock(move || clock.load(Ordering::SeqCst)))
    };
    let shared = state(&clock);
    let mut hosts: Vec<(PolicyInstance, PolicyHandle)> = Vec::new();
    for host in 0..2u64 {
        let store = if sharing == Sharing::Shared { Arc::clone(&shared) } else { state(&clock) };
        let services = HostServices::new(Arc::new(EmbeddedAccounts::on_host_clock()), EntropySource::seeded(seed + host)).with_shared_state(store);
        let mut instance = component.instantiate(services)?;
        let policy = instance.load_policy(&config(sharing != Sharing::None))?.map_err(|e| anyhow::anyhow!("{}: {}", e.field, e.message))?;
        hosts.push((instance, policy));
    }
    let mut rng = SplitMix64::new(seed);
    let mut agents = Vec::new();
    let mut queue = BinaryHeap::new();
    for i in 0..RUNS {
        let host = i % 2;
        let (instance, policy) = &mut hosts[host];
        let run = instance.start_run(policy, &format!("run-{i}"))?.map_err(|e| anyhow::anyhow!("{e:?}"))?;
        agents.push(Agent { host, run, call_id: 0, done_calls: 0, ended: false, escalated: false });
        queue.push(Reverse((rng.uniform(0.0, THINK_MS as f64) as u64, i, Next::Begin)));
    }
    let mut row = OutageRow {
        name,
        sent_while_down: 0,
        refused: 0,
        first_success_after_ms: None,
        completed: 0,
        escalated: 0,
        per_second: vec![0; ((DOWN_UNTIL_MS + 60_000) / 1000) as usize],
    };
    while let Some(Reverse((at, i, next))) = queue.pop() {
        clock.store(EPOCH_MS + at, Ordering::SeqCst);
        let now = EPOCH_MS + at;
        let agent = &mut agents[i];
        let (instance, _) = &mut hosts[agent.host];
        let attempt = match next {
            Next::Begin => match instance.begin(&agent.run, Some(SERVER), "lookup_order", None, None, now)? {
                Ok(Admission::Send(start)) => {
                    agent.call_id = start.call_id;
                    queue.push(Reverse((at + start.delay_ms, i, Next::Attempt(1))));
                    continue;
                }
                Ok(Admission::Replan(..)) => {
                    row.refused += 1;
                    queue.push(Reverse((at + REPLAN_WAIT_MS, i, Next::Begin)));
                    continue;
                }
                Ok(Admission::Escalate(_)) => {
                    (agent.ended, agent.escalated) = (true, true);
                    continue;
                }
                Err(e) => anyhow::bail!("run error: {e:?}"),
            },
            Next::Attempt(n) => n,
        };
        // The attempt reaches the server now and is answered LATENCY_MS later.
        let down = (DOWN_FROM_MS..DOWN_UNTIL_MS).contains(&at);
        if let Some(count) = row.per_second.get_mut((at / 1000) as usize) {
            *count += 1;
        }
        let answered = at + LATENCY_MS;
        clock.store(EPOCH_MS + answered, Ordering::SeqCst);
        let outcome = if down {
            row.sent_while_down += 1;
            Outcome::Failure(agent_retry_host::component::types::Observation {
                delivery: Delivery::Sent,
                ..agent_retry_host::component::types::Observation::new(FailureKind::HttpStatus(503), &[], "upstream unavailable")
            })
        } else {
            Outcome::Success
        };
        let decision = instance
            .decide(&agent.run, agent.call_id, attempt, &outcome, None, EPOCH_MS + answered, Some(rng.next_u64()))?
            .map_err(|e| anyhow::anyhow!("run error: {e:?}"))?;
        match decision.action {
            Action::Retry(plan) => queue.push(Reverse((answered + plan.delay_ms, i, Next::Attempt(plan.attempt)))),
            Action::Replan(_) => queue.push(Reverse((answered + REPLAN_WAIT_MS, i, Next::Begin))),
            Action::Succeed(_) => {
                if at >= DOWN_UNTIL_MS && row.first_success_after_ms.is_none() {
                    row.first_success_after_ms = Some(answered - DOWN_UNTIL_MS);
                }
                agent.done_calls += 1;
                if agent.done_calls == CALLS_PER_RUN {
                    agent.ended = true;
                } else {
                    queue.push(Reverse((answered + THINK_MS, i, Next::Begin)));
                }
            }
            Action::Escalate(_) => (agent.ended, agent.escalated) = (true, true),
            Action::CheckStatus | Action::Poll(_) => anyhow::bail!("a read neither checks status nor polls"),
        }
    }
    row.completed = agents.iter().filter(|a| a.ended && !a.escalated).count() as u32;
    row.escalated = agents.iter().filter(|a| a.escalated).count() as u32;
    Ok(row)
}

/// The three scenarios, seeded alike.
pub fn scenarios(component: &PolicyComponent, seed: u64) -> anyhow::Result<Vec<OutageRow>> {
    Ok(vec![
        run(component, "no breaker", Sharing::None, seed)?,
        run(component, "a breaker in each host", Sharing::PerHost, seed)?,
        run(component, "one breaker both hosts share", Sharing::Shared, seed)?,
    ])
}

/// The table `make lab` prints and writes.
pub fn table(rows: &[OutageRow]) -> String {
    let mut out = format!(
        "Outage: {RUNS} runs on two hosts, {CALLS_PER_RUN} calls each; the server answers 503 from {} s to {} s (simulated)\n",
        DOWN_FROM_MS / 1000,
        DOWN_UNTIL_MS / 1000
    );
    out.push_str(&format!(
        "{:<30} {:>15} {:>15} {:>22} {:>10} {:>10}\n",
        "scenario", "sent while down", "refused unsent", "first success after", "completed", "escalated"
    ));
    for row in rows {
        let first = row.first_success_after_ms.map_or("never".to_string(), |ms| format!("{:.1} s", ms as f64 / 1000.0));
        out.push_str(&format!("{:<30} {:>15} {:>15} {:>22} {:>10} {:>10}\n", row.name, row.sent_while_down, row.refused, first, row.completed, row.escalated));
    }
    out
}
