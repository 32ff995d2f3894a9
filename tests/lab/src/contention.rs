//! Brooker's contention simulation ("Exponential Backoff And Jitter", AWS
//! Architecture Blog, 2015; the published simulator is
//! aws-samples/aws-arch-backoff-simulator `src/backoff_simulator.py`), re-done
//! here with the component computing the delays where it can.
//!
//! The set-up, as published: one row under optimistic concurrency; N clients
//! start at t = 0 and each must write it once: read the version, write it back
//! conditionally; a write with a stale version fails and the client backs off
//! (`attempt` counts failures, the n-th backoff is drawn from
//! `expo(n) = min(cap, base · 2^n)`, base 5 ms, cap 2 s) and reads again. Every
//! message takes |Normal(10 ms, 2 ms)|. Time is simulated; `calls` counts writes
//! that reach the row; a point is the mean over `runs` simulations.
//!
//! In the component the first retry's ceiling is `base-delay-ms`, so Brooker's
//! `expo(1) = 10 ms` is `base-delay-ms: 10`; the conflict is a 409 that the
//! configuration makes transient (`status-overrides`).

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;

use agent_retry_host::component::types::{Action, Delivery, FailureKind, Observation};
use agent_retry_host::component::{PolicyHandle, RunHandle};
use agent_retry_host::{Admission, Outcome};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, PolicyInstance};

use crate::rng::SplitMix64;

pub const BASE_MS: f64 = 5.0;
pub const CAP_MS: f64 = 2000.0;
pub const NET_MEAN_MS: f64 = 10.0;
pub const NET_SD_MS: f64 = 2.0;

/// The component's configuration for the contention rows: Brooker's base and
/// cap, no limit that would stop a client before it has written, the conflict
/// retryable.
pub fn component_config(extra: &str) -> String {
    let base = r#""base-delay-ms": 10, "max-delay-ms": 2000, "max-attempts-per-call": 100, "max-retries-per-run": 100000,
        "max-steps-per-run": 100000, "status-overrides": {"409": "transient"},
        "tools": {"write_row": {"effect": "write", "idempotent": true}}"#;
    if extra.is_empty() { format!("{{{base}}}") } else { format!("{{{base}, {extra}}}") }
}

/// How a client waits: before its first read, and after each failed write.
pub trait Strategy {
    /// A new simulation of `clients` clients.
    fn begin(&mut self, clients: usize, sim: u64) -> anyhow::Result<()>;
    /// Before the client's first read; `None`: it gives up.
    fn admit(&mut self, client: usize, now_ms: f64) -> anyhow::Result<Option<f64>>;
    /// After the `attempt`-th failed write; `None`: it gives up.
    fn failed(&mut self, client: usize, attempt: u32, now_ms: f64) -> anyhow::Result<Option<f64>>;
    fn succeeded(&mut self, client: usize, now_ms: f64) -> anyhow::Result<()>;
    fn end(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}

fn expo(n: u32) -> f64 {
    (BASE_MS * 2f64.powi(n.min(1000) as i32)).min(CAP_MS)
}

/// Brooker's "None": no backoff at all.
pub struct NoBackoff;
/// Equal jitter: `expo/2 + rand(0, expo/2)`.
pub struct EqualJitter(SplitMix64);
/// Decorrelated jitter: `sleep = min(cap, rand(base, sleep · 3))`, per client.
pub struct Decorrelated(SplitMix64, Vec<f64>);

impl EqualJitter {
    pub fn new(seed: u64) -> Self {
        EqualJitter(SplitMix64::new(seed))
    }
}

impl Decorrelated {
    pub fn new(seed: u64) -> Self {
        Decorrelated(SplitMix64::new(seed), Vec::new())
    }
}

impl Strategy for NoBackoff {
    fn begin(&mut self, _: usize, _: u64) -> anyhow::Result<()> {
        Ok(())
    }
    fn admit(&mut self, _: usize, _: f64) -> anyhow::Result<Option<f64>> {
        Ok(Some(0.0))
    }
    fn failed(&mut self, _: usize, _: u32, _: f64) -> anyhow::Result<Option<f64>> {
        Ok(Some(0.0))
    }
    fn succeeded(&mut self, _: usize, _: f64) -> anyhow::Result<()> {
        Ok(())
    }
}

impl Strategy for EqualJitter {
    fn begin(&mut self, _: usize, _: u64) -> anyhow::Result<()> {
        Ok(())
    }
    fn admit(&mut self, _: usize, _: f64) -> anyhow::Result<Option<f64>> {
        Ok(Some(0.0))
    }
    fn failed(&mut self, _: usize, attempt: u32, _: f64) -> anyhow::Result<Option<f64>> {
        let v = expo(attempt);
        Ok(Some(v / 2.0 + self.0.uniform(0.0, v / 2.0)))
    }
    fn succeeded(&mut self, _: usize, _: f64) -> anyhow::Result<()> {
        Ok(())
    }
}

impl Strategy for Decorrelated {
    fn begin(&mut self, clients: usize, _: u64) -> anyhow::Result<()> {
        self.1 = vec![BASE_MS; clients];
        Ok(())
    }
    fn admit(&mut self, _: usize, _: f64) -> anyhow::Result<Option<f64>> {
        Ok(Some(0.0))
    }
    fn failed(&mut self, client: usize, _: u32, _: f64) -> anyhow::Result<Option<f64>> {
        let sleep = self.0.uniform(BASE_MS, self.1[client] * 3.0).min(CAP_MS);
        self.1[client] = sleep;
        Ok(Some(sleep))
    }
    fn succeeded(&mut self, _: usize, _: f64) -> anyhow::Result<()> {
        Ok(())
    }
}

/// The component decides: each client is a run; its first read waits for the
/// admission (`begin-call`: the account budget), each conflict is recorded and
/// the component's retry delay (full jitter, floored by the account budget's
/// wait) is slept. With an `account-budget` in `extra`, every simulation gets its
/// own account (`sim-N`), so no bucket carries over.
pub struct ComponentStrategy {
    instance: PolicyInstance,
    extra: String,
    policy: Option<PolicyHandle>,
    runs: Vec<(RunHandle, u32, u32)>, // (run, the current call id, its attempt)
}

impl ComponentStrategy {
    pub fn new(component: &PolicyComponent, extra: &str, entropy: EntropySource) -> anyhow::Result<Self> {
        let instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::on_host_clock()), entropy))?;
        Ok(ComponentStrategy { instance, extra: extra.to_string(), policy: None, runs: Vec::new() })
    }
}

fn conflict() -> Outcome {
    Outcome::Failure(Observation::new(FailureKind::HttpStatus(409), &[], "version conflict").delivered(Delivery::AnswerStarted))
}

impl Strategy for ComponentStrategy {
    fn begin(&mut self, clients: usize, sim: u64) -> anyhow::Result<()> {
        let extra = self.extra.replace("{sim}", &sim.to_string());
        let config = component_config(&extra);
        let policy = self.instance.load_policy(&config)?.map_err(|e| anyhow::anyhow!("config {}: {}", e.field, e.message))?;
        self.runs.clear();
        for client in 0..clients {
            let run = self.instance.start_run(&policy, &format!("client-{client}"))?.map_err(|e| anyhow::anyhow!("run id: {e:?}"))?;
            self.runs.push((run, 0, 1));
        }
        self.policy = Some(policy);
        Ok(())
    }

    fn admit(&mut self, client: usize, now_ms: f64) -> anyhow::Result<Option<f64>> {
        let (run, call_id, attempt) = &mut self.runs[client];
        match self.instance.begin(run, None, "write_row", None, None, now_ms as u64)? {
            Ok(Admission::Send(ticket)) => {
                *call_id = ticket.call_id;
                *attempt = 1;
                Ok(Some(ticket.delay_ms as f64))
            }
            // No server is named: no breaker applies, so no replan comes.
            Ok(Admission::Escalate(_) | Admission::Replan(..)) => Ok(None),
            Err(e) => anyhow::bail!("run error: {e:?}"),
        }
    }

    fn failed(&mut self, client: usize, _: u32, now_ms: f64) -> anyhow::Result<Option<f64>> {
        let (run, call_id, attempt) = &mut self.runs[client];
        match self.instance.decide(run, *call_id, *attempt, &conflict(), None, now_ms as u64, None)? {
            Ok(decision) => match decision.action {
                Action::Retry(plan) => {
                    *attempt = plan.attempt;
                    Ok(Some(plan.delay_ms as f64))
                }
                Action::Escalate(_) => Ok(None),
                other => anyhow::bail!("unexpected decision for a conflict: {other:?}"),
            },
            Err(e) => anyhow::bail!("run error: {e:?}"),
        }
    }

    fn succeeded(&mut self, client: usize, now_ms: f64) -> anyhow::Result<()> {
        let (run, call_id, attempt) = &self.runs[client];
        match self.instance.decide(run, *call_id, *attempt, &Outcome::Success, None, now_ms as u64, None)? {
            Ok(_) => Ok(()),
            Err(e) => anyhow::bail!("run error: {e:?}"),
        }
    }

    fn end(&mut self) -> anyhow::Result<()> {
        for (run, _, _) in self.runs.drain(..) {
            self.instance.drop_run(run)?;
        }
        if let Some(policy) = self.policy.take() {
            self.instance.drop_policy(policy)?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
enum Ev {
    /// The read request reaches the row.
    Read,
    /// The version reaches the client, which sends its write.
    ReadAnswer(u64),
    /// The conditional write reaches the row.
    Write(u64),
    /// The write's answer reaches the client.
    WriteAnswer(bool),
}

struct Event {
    at: f64,
    seq: u64,
    client: usize,
    ev: Ev,
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    /// Reversed: the earliest event (then the first scheduled) on top of the heap.
    fn cmp(&self, other: &Self) -> Ordering {
        other.at.total_cmp(&self.at).then(other.seq.cmp(&self.seq))
    }
}

/// One simulation's result.
#[derive(Clone, Copy, Debug, Default)]
pub struct SimResult {
    /// When the last message arrived (ms).
    pub time_ms: f64,
    /// Writes that reached the row.
    pub calls: u32,
    /// Clients that wrote.
    pub completed: u32,
}

/// One simulation of `clients` clients; `seed` drives the network delays.
pub fn simulate(clients: usize, strategy: &mut dyn Strategy, sim: u64, seed: u64) -> anyhow::Result<SimResult> {
    let mut net = SplitMix64::new(seed);
    let mut delay = move || net.normal(NET_MEAN_MS, NET_SD_MS).abs();
    strategy.begin(clients, sim)?;
    let mut queue = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |queue: &mut BinaryHeap<Event>, at: f64, client: usize, ev: Ev| {
        seq += 1;
        queue.push(Event { at, seq, client, ev });
    };
    for client in 0..clients {
        if let Some(wait) = strategy.admit(client, 0.0)? {
            push(&mut queue, wait + delay(), client, Ev::Read);
        }
    }
    let mut version = 0u64;
    let mut attempts = vec![0u32; clients];
    let mut result = SimResult::default();
    let mut now = 0.0;
    while let Some(Event { at, client, ev, .. }) = queue.pop() {
        debug_assert!(at >= now);
        now = at;
        match ev {
            Ev::Read => push(&mut queue, now + delay(), client, Ev::ReadAnswer(version)),
            Ev::ReadAnswer(seen) => push(&mut queue, now + delay(), client, Ev::Write(seen)),
            Ev::Write(seen) => {
                result.calls += 1;
                let ok = seen == version;
                if ok {
                    version += 1;
                }
                push(&mut queue, now + delay(), client, Ev::WriteAnswer(ok));
            }
            Ev::WriteAnswer(true) => {
                result.completed += 1;
                strategy.succeeded(client, now)?;
            }
            Ev::WriteAnswer(false) => {
                attempts[client] += 1;
                if let Some(backoff) = strategy.failed(client, attempts[client], now)? {
                    push(&mut queue, now + delay() + backoff, client, Ev::Read);
                }
            }
        }
    }
    result.time_ms = now;
    strategy.end()?;
    Ok(result)
}

/// A row's mean figures at one client count.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct ContentionPoint {
    pub clients: u32,
    pub time_ms: f64,
    pub calls: f64,
    pub completed_pct: f64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct ContentionRow {
    pub name: String,
    /// The component computed this row's delays.
    pub component: bool,
    pub points: Vec<ContentionPoint>,
}

/// The rows compared: Brooker's five, then the coordinated ones only the account
/// budget can give: its token bucket, the AWS retry quota with the constants of
/// 2024 (a retry costs 5) and of 10 November 2026 (14), and the ratio retry
/// budget (Finagle's and Linkerd's defaults).
pub fn row_specs() -> Vec<(&'static str, &'static str)> {
    // (name, how): "native:<kind>" or "component:<entropy>:<config extra>"
    vec![
        ("no jitter (exponential)", "component:fixed:"),
        ("full jitter", "component:seeded:"),
        ("equal jitter", "native:equal"),
        ("decorrelated jitter", "native:decorrelated"),
        ("no backoff", "native:none"),
        (
            "account budget: 1 token / 20 ms",
            r#"component:seeded:"account-budget": {"account-id": "sim-{sim}", "capacity": 1, "refill-interval-ms": 20, "max-wait-ms": 10000}"#,
        ),
        (
            "account budget: 1 token / 10 ms",
            r#"component:seeded:"account-budget": {"account-id": "sim-{sim}", "capacity": 1, "refill-interval-ms": 10, "max-wait-ms": 10000}"#,
        ),
        (
            "account budget: 10 tokens, 1 / 20 ms",
            r#"component:seeded:"account-budget": {"account-id": "sim-{sim}", "capacity": 10, "refill-interval-ms": 20, "max-wait-ms": 10000}"#,
        ),
        (
            "retry quota, AWS 2026 (500; 14 a retry; clients give up)",
            r#"component:seeded:"account-budget": {"account-id": "sim-{sim}", "capacity": 100000, "refill-interval-ms": 1, "retry-quota": {"capacity": 500}}"#,
        ),
        (
            "retry quota, AWS 2024 (500; 5 a retry; clients give up)",
            r#"component:seeded:"account-budget": {"account-id": "sim-{sim}", "capacity": 100000, "refill-interval-ms": 1, "retry-quota": {"capacity": 500, "retry-cost": 5}}"#,
        ),
        (
            "ratio budget (20 % of calls + 10/s; clients give up)",
            r#"component:seeded:"account-budget": {"account-id": "sim-{sim}", "capacity": 100000, "refill-interval-ms": 1, "retry-ratio": {}}"#,
        ),
    ]
}

fn strategy_for(component: &PolicyComponent, how: &str, seed: u64) -> anyhow::Result<Box<dyn Strategy>> {
    if let Some(kind) = how.strip_prefix("native:") {
        return Ok(match kind {
            "equal" => Box::new(EqualJitter::new(seed)),
            "decorrelated" => Box::new(Decorrelated::new(seed)),
            "none" => Box::new(NoBackoff),
            other => anyhow::bail!("unknown strategy {other}"),
        });
    }
    let rest = how.strip_prefix("component:").ok_or_else(|| anyhow::anyhow!("unknown strategy {how}"))?;
    let (entropy, extra) = rest.split_once(':').unwrap_or((rest, ""));
    let entropy = match entropy {
        // The largest entropy gives the ceiling itself: exponential backoff, no jitter.
        "fixed" => EntropySource::Fixed(u64::MAX),
        _ => EntropySource::seeded(seed),
    };
    Ok(Box::new(ComponentStrategy::new(component, extra, entropy)?))
}

/// Every row at every client count, `runs` simulations a point. Deterministic:
/// simulation `r` at `n` clients uses the same network seed in every row.
pub fn run_all(component: &PolicyComponent, clients: &[u32], runs: u32, seed: u64) -> anyhow::Result<Vec<ContentionRow>> {
    let mut rows = Vec::new();
    for (index, (name, how)) in row_specs().into_iter().enumerate() {
        let mut strategy = strategy_for(component, how, seed ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9))?;
        let mut points = Vec::new();
        for &n in clients {
            let (mut time, mut calls, mut completed) = (0.0, 0.0, 0.0);
            for r in 0..runs {
                let sim = u64::from(n) * 1_000_000 + u64::from(r);
                let result = simulate(n as usize, strategy.as_mut(), sim, seed.wrapping_add(sim))?;
                time += result.time_ms;
                calls += f64::from(result.calls);
                completed += f64::from(result.completed);
            }
            let runs = f64::from(runs);
            points.push(ContentionPoint { clients: n, time_ms: time / runs, calls: calls / runs, completed_pct: 100.0 * completed / (runs * f64::from(n)) });
        }
        rows.push(ContentionRow { name: name.to_string(), component: how.starts_with("component:"), points });
    }
    Ok(rows)
}

/// `count` delays the component gives for retry number `retry` (seeded), with
/// the contention configuration (base 10 ms, cap 2000 ms).
pub fn component_delays(component: &PolicyComponent, retry: u32, count: usize, seed: u64) -> anyhow::Result<Vec<u64>> {
    let mut instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::on_host_clock()), EntropySource::seeded(seed)))?;
    let policy = instance.load_policy(&component_config(""))?.map_err(|e| anyhow::anyhow!("config {}: {}", e.field, e.message))?;
    let mut entropy = SplitMix64::new(seed);
    (0..count).map(|_| Ok(instance.next_delay(&policy, retry, None, Some(entropy.next_u64()))?)).collect()
}
