//! The refund lab: a deterministic model of agent runs against scripted faults
//! ("Agent Retry Policies: When to Retry a Tool, Replan the Task or Give Up", "Running the lab"). No network and no model: a scripted server
//! answers each attempt from the fault mix, and a scripted model changes its
//! arguments when an error names something it can fix, or calls again.
//!
//! Our policy's decisions come from the component (`PolicyComponent`, the
//! `.wasm` every host loads). The baselines (retry everything, peers' documented
//! retry layers) are written here: they are the comparison, not the product.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use agent_retry_host::component::types::{Action, Delivery, FailureKind, Observation, StatusCheckResult, TransportError};
use agent_retry_host::{Admission, Outcome};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, PolicyComponent, PolicyInstance};

use crate::faults::{Clears, FailureSpec, FaultMix, RunSpec};
use crate::rng::SplitMix64;

// ===== the scripted server =====

/// What one attempt got back.
#[derive(Clone, Debug)]
pub enum Answer {
    Success,
    Empty(String),
    Failure(FailureSpec),
}

/// The server of one run: answers attempts from the run's fault, keeps the
/// ledger of applied writes (a keyed write is applied once per key), and counts
/// what the lab reports.
pub struct Server<'a> {
    mix: &'a FaultMix,
    run: &'a RunSpec,
    /// Failed attempts of the faulted tool so far.
    fault_attempts: u32,
    first_failure_ms: Option<u64>,
    /// (step, argument version) pairs that failed with a request-bound fault.
    failed_requests: HashSet<(usize, u32)>,
    /// Writes applied per step.
    applied: Vec<u32>,
    keys_seen: HashSet<String>,
    /// A step's server-given wait: no attempt of it should come before.
    hint_until: BTreeMap<usize, u64>,
    /// Tool calls received: attempts plus status-check reads.
    pub calls: u32,
    /// Attempts that repeated a request that could not succeed.
    pub wasted: u32,
    /// Attempts sent before the server's hint had passed.
    pub early: u32,
}

impl<'a> Server<'a> {
    pub fn new(mix: &'a FaultMix, run: &'a RunSpec) -> Self {
        Server {
            mix,
            run,
            fault_attempts: 0,
            first_failure_ms: None,
            failed_requests: HashSet::new(),
            applied: vec![0; mix.workflow.len()],
            keys_seen: HashSet::new(),
            hint_until: BTreeMap::new(),
            calls: 0,
            wasted: 0,
            early: 0,
        }
    }

    fn apply(&mut self, step: usize, key: Option<&str>) {
        if let Some(key) = key
            && !self.keys_seen.insert(key.to_string())
        {
            return; // the first result, saved under the key: no new effect
        }
        self.applied[step] += 1;
    }

    /// One attempt of `step` with the model's `version` of the arguments.
    pub fn attempt(&mut self, step: usize, version: u32, key: Option<&str>, now_ms: u64) -> Answer {
        self.calls += 1;
        if self.hint_until.get(&step).is_some_and(|until| now_ms < *until) {
            self.early += 1;
        }
        let is_write = self.mix.workflow[step].effect == "write";
        let fault = self.run.fault.as_ref().filter(|f| f.tool == self.mix.workflow[step].tool);
        let Some(fault) = fault else {
            if is_write {
                self.apply(step, key);
            }
            return Answer::Success;
        };
        let failing = match fault.clears {
            Clears::AfterAttempts(n) => self.fault_attempts < n,
            Clears::AfterMs(ms) => self.first_failure_ms.is_none_or(|t| now_ms < t + ms),
            Clears::AfterFixes(n) => version < n,
            Clears::NeedsPerson | Clears::Never => true,
        };
        if !failing {
            if is_write {
                self.apply(step, key);
            }
            return Answer::Success;
        }
        if fault.clears.request_bound() && !self.failed_requests.insert((step, version)) {
            self.wasted += 1;
        }
        self.fault_attempts += 1;
        self.first_failure_ms.get_or_insert(now_ms);
        match &fault.failure {
            FailureSpec::Timeout { applied: true } if is_write => self.apply(step, key),
            FailureSpec::Http { headers, .. } => {
                if let Some(seconds) = retry_after_seconds(headers) {
                    self.hint_until.insert(step, now_ms + seconds * 1000);
                }
            }
            _ => {}
        }
        match &fault.failure {
            FailureSpec::Empty { detail } => Answer::Empty(detail.clone()),
            other => Answer::Failure(other.clone()),
        }
    }

    /// The status-check read for `step`'s write: was it applied?
    pub fn status_check(&mut self, step: usize) -> bool {
        self.calls += 1;
        self.applied[step] > 0
    }

    /// Duplicate effects of refund writes.
    pub fn doubled_refunds(&self) -> u32 {
        self.mix.workflow.iter().zip(&self.applied).filter(|(s, _)| s.is_refund).map(|(_, n)| n.saturating_sub(1)).sum()
    }
}

fn retry_after_seconds(headers: &BTreeMap<String, String>) -> Option<u64> {
    headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("retry-after")).and_then(|(_, v)| v.trim().parse().ok())
}

// ===== the hosts: how one call is handled =====

/// Simulated time and what waiting cost, shared by the model and the host.
pub struct Ctx<'a> {
    pub server: Server<'a>,
    pub mix: &'a FaultMix,
    pub now_ms: u64,
    pub waited_ms: u64,
}

/// How one call of the model ended, as the model sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallEnd {
    Done,
    /// An error is shown to the model (a replan, or a retry layer that gave up).
    ShownError,
    /// The run is handed to a person, for this reason.
    Escalated(String),
    /// The run's step budget stopped it.
    StepBudget,
}

/// The host side: the retry policy wrapped around each tool call.
pub trait Host {
    fn start_run(&mut self, run_id: &str) -> anyhow::Result<()>;
    fn call(&mut self, ctx: &mut Ctx, step: usize, version: u32) -> anyhow::Result<CallEnd>;
    /// The model wants to change its arguments after an error: may it?
    /// `None`: yes; `Some(reason)`: the run escalates.
    fn replan(&mut self) -> Option<String>;
    fn end_run(&mut self) -> anyhow::Result<()>;
}

/// The component makes every decision.
pub struct ComponentHost {
    instance: PolicyInstance,
    policy: agent_retry_host::component::PolicyHandle,
    run: Option<agent_retry_host::component::RunHandle>,
    run_id: String,
    keys: bool,
}

impl ComponentHost {
    /// One instance per row; `seed` seeds the jitter; all runs of the row share
    /// one embedded account budget.
    pub fn new(component: &PolicyComponent, config: &str, seed: u64, keys: bool) -> anyhow::Result<Self> {
        let services = HostServices::new(Arc::new(EmbeddedAccounts::on_host_clock()), EntropySource::seeded(seed));
        let mut instance = component.instantiate(services)?;
        let policy = instance.load_policy(config)?.map_err(|e| anyhow::anyhow!("config {}: {}", e.field, e.message))?;
        Ok(ComponentHost { instance, policy, run: None, run_id: String::new(), keys })
    }
}

fn outcome_of(answer: &Answer) -> Outcome {
    // An answer arrived for an HTTP status; a timeout or a reset came after the request was written.
    let failure = |kind: FailureKind, headers: Vec<(String, String)>, body: String| {
        let delivery = if matches!(kind, FailureKind::Transport(_)) { Delivery::Sent } else { Delivery::AnswerStarted };
        Outcome::Failure(Observation::new(kind, &headers, body).delivered(delivery))
    };
    match answer {
        Answer::Success => Outcome::Success,
        Answer::Empty(detail) => Outcome::EmptyResult(detail.clone()),
        Answer::Failure(FailureSpec::Http { status, headers, body }) => {
            failure(FailureKind::HttpStatus(*status), headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect(), body.clone())
        }
        Answer::Failure(FailureSpec::Timeout { .. }) => failure(FailureKind::Transport(TransportError::Timeout), vec![], String::new()),
        Answer::Failure(FailureSpec::Reset) => failure(FailureKind::Transport(TransportError::ConnectionReset), vec![], String::new()),
        Answer::Failure(FailureSpec::Empty { detail }) => Outcome::EmptyResult(detail.clone()),
    }
}

impl Host for ComponentHost {
    fn start_run(&mut self, run_id: &str) -> anyhow::Result<()> {
        self.run = Some(self.instance.start_run(&self.policy, run_id)?.map_err(|e| anyhow::anyhow!("run id: {e:?}"))?);
        self.run_id = run_id.to_string();
        Ok(())
    }

    fn call(&mut self, ctx: &mut Ctx, step: usize, version: u32) -> anyhow::Result<CallEnd> {
        let run = self.run.as_ref().ok_or_else(|| anyhow::anyhow!("no run"))?;
        let tool = &ctx.mix.workflow[step];
        let key =
            if self.keys && tool.takes_key { Some(self.instance.derive_idempotency_key(&self.run_id, &format!("step-{step}-v{version}"))?) } else { None };
        let ticket = match self.instance.begin(run, None, &tool.tool, key.as_deref(), None, ctx.now_ms)? {
            Ok(Admission::Send(ticket)) => ticket,
            Ok(Admission::Escalate(e)) => return Ok(CallEnd::Escalated(agent_retry_host::labels::reason(e.reason).to_string())),
            Ok(Admission::Replan(..)) => anyhow::bail!("a breaker refused a call, and the lab names no server"),
            Err(e) => anyhow::bail!("run error: {e:?}"),
        };
        ctx.now_ms += ticket.delay_ms;
        ctx.waited_ms += ticket.delay_ms;
        let mut key = key;
        let mut attempt = 1;
        loop {
            let answer = ctx.server.attempt(step, version, key.as_deref(), ctx.now_ms);
            ctx.now_ms += ctx.mix.attempt_ms;
            let mut outcome = outcome_of(&answer);
            loop {
                let decision = match self.instance.decide(run, ticket.call_id, attempt, &outcome, None, ctx.now_ms, None)? {
                    Ok(decision) => decision,
                    Err(e) => anyhow::bail!("run error: {e:?}"),
                };
                match decision.action {
                    Action::Retry(plan) => {
                        ctx.now_ms += plan.delay_ms;
                        ctx.waited_ms += plan.delay_ms;
                        key = plan.idempotency_key;
                        attempt = plan.attempt;
                        break;
                    }
                    Action::CheckStatus => {
                        let found = ctx.server.status_check(step);
                        ctx.now_ms += ctx.mix.attempt_ms;
                        outcome = Outcome::StatusCheck(if found { StatusCheckResult::Found } else { StatusCheckResult::Absent });
                    }
                    Action::Replan(_) => return Ok(CallEnd::ShownError),
                    Action::Succeed(_) => return Ok(CallEnd::Done),
                    Action::Escalate(e) => return Ok(CallEnd::Escalated(agent_retry_host::labels::reason(e.reason).to_string())),
                    // The lab's simulated server answers no call with a task.
                    Action::Poll(_) => anyhow::bail!("a poll for a call the simulated server answered without a task"),
                }
            }
        }
    }

    fn replan(&mut self) -> Option<String> {
        None // the component counted the replan when it decided it
    }

    fn end_run(&mut self) -> anyhow::Result<()> {
        if let Some(run) = self.run.take() {
            self.instance.drop_run(run)?;
        }
        Ok(())
    }
}

/// A retry layer that is not ours: it sees a failure and either retries after a
/// delay or gives up (the error goes to the model). It never escalates: the
/// agent loop around it does what the seed's does.
pub trait RetryLayer {
    /// After attempt `attempt` (1 = the first request) failed: `Some(delay)` retries.
    fn decide(&mut self, failure: &FailureSpec, attempt: u32, rng: &mut SplitMix64) -> Option<u64>;
    /// The call succeeded at `attempt`.
    fn on_success(&mut self, _attempt: u32) {}
    /// An empty 200 is a failure to retry too (most layers never see it: nothing is raised).
    fn retries_empty(&self) -> bool {
        false
    }
}

/// A host whose retries are a [`RetryLayer`]; the agent loop's replan limit and
/// step budget are the same as the component's.
pub struct LayerHost {
    layer: Box<dyn RetryLayer>,
    keys: bool,
    run_id: String,
    rng: SplitMix64,
}

impl LayerHost {
    pub fn new(layer: Box<dyn RetryLayer>, keys: bool, seed: u64) -> Self {
        LayerHost { layer, keys, run_id: String::new(), rng: SplitMix64::new(seed) }
    }
}

impl Host for LayerHost {
    fn start_run(&mut self, run_id: &str) -> anyhow::Result<()> {
        self.run_id = run_id.to_string();
        Ok(())
    }

    fn call(&mut self, ctx: &mut Ctx, step: usize, version: u32) -> anyhow::Result<CallEnd> {
        let tool = &ctx.mix.workflow[step];
        let key = (self.keys && tool.takes_key).then(|| format!("{}/step-{step}-v{version}", self.run_id));
        let mut attempt = 1;
        loop {
            if ctx.server.calls >= ctx.mix.step_budget {
                return Ok(CallEnd::StepBudget);
            }
            let answer = ctx.server.attempt(step, version, key.as_deref(), ctx.now_ms);
            ctx.now_ms += ctx.mix.attempt_ms;
            match answer {
                Answer::Success => {
                    self.layer.on_success(attempt);
                    return Ok(CallEnd::Done);
                }
                // A 200 raises nothing: most retry layers never see an empty result.
                Answer::Empty(_) if !self.layer.retries_empty() => return Ok(CallEnd::ShownError),
                answer => {
                    let failure = match answer {
                        Answer::Failure(failure) => failure,
                        Answer::Empty(detail) => FailureSpec::Empty { detail },
                        Answer::Success => unreachable!("handled above"),
                    };
                    match self.layer.decide(&failure, attempt, &mut self.rng) {
                        Some(delay) => {
                            ctx.now_ms += delay;
                            ctx.waited_ms += delay;
                            attempt += 1;
                        }
                        None => return Ok(CallEnd::ShownError),
                    }
                }
            }
        }
    }

    fn replan(&mut self) -> Option<String> {
        None // the agent loop counts replans against the mix's limit
    }

    fn end_run(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}

// ===== the agent loop =====

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunEnd {
    Completed,
    Escalated(String),
    /// Stopped by the step budget (the component says `run-steps-spent`).
    Looped,
}

#[derive(Clone, Debug)]
pub struct RunResult {
    pub id: String,
    pub end: RunEnd,
    pub calls: u32,
    pub wasted: u32,
    pub doubled: u32,
    pub early: u32,
    pub waited_ms: u64,
    pub ended_ms: u64,
}

/// Runs one run of the mix through a host. The scripted model: when an error is
/// shown and the run's fault on this tool is one it can fix (a request-bound
/// fault that clears after fixes it has not all made), it changes its arguments
/// (a replan, within the replan limit); otherwise it calls again unchanged.
///
/// Runs follow one another on one worker: a run starts at `start_ms`, when the
/// one before ended (so an account budget shared by the runs sees real gaps).
pub fn run_one(mix: &FaultMix, run: &RunSpec, host: &mut dyn Host, host_counts_replans: bool, start_ms: u64) -> anyhow::Result<RunResult> {
    let mut ctx = Ctx { server: Server::new(mix, run), mix, now_ms: start_ms, waited_ms: 0 };
    host.start_run(&run.id)?;
    let mut replans = 0;
    let mut end = RunEnd::Completed;
    'steps: for step in 0..mix.workflow.len() {
        let mut version = 0;
        loop {
            match host.call(&mut ctx, step, version)? {
                CallEnd::Done => break,
                CallEnd::StepBudget => {
                    end = RunEnd::Looped;
                    break 'steps;
                }
                CallEnd::Escalated(reason) => {
                    end = if reason == "run-steps-spent" { RunEnd::Looped } else { RunEnd::Escalated(reason) };
                    break 'steps;
                }
                CallEnd::ShownError => {
                    ctx.now_ms += mix.model_turn_ms;
                    let fixable =
                        run.fault.as_ref().is_some_and(|f| f.tool == mix.workflow[step].tool && matches!(f.clears, Clears::AfterFixes(n) if version < n));
                    if fixable {
                        if host_counts_replans {
                            if replans >= mix.replan_limit {
                                end = RunEnd::Escalated("replans-spent".into());
                                break 'steps;
                            }
                            replans += 1;
                        }
                        if let Some(reason) = host.replan() {
                            end = RunEnd::Escalated(reason);
                            break 'steps;
                        }
                        version += 1;
                    }
                }
            }
        }
    }
    host.end_run()?;
    Ok(RunResult {
        id: run.id.clone(),
        end,
        calls: ctx.server.calls,
        wasted: ctx.server.wasted,
        doubled: ctx.server.doubled_refunds(),
        early: ctx.server.early,
        waited_ms: ctx.waited_ms,
        ended_ms: ctx.now_ms,
    })
}

// ===== the policies compared =====

/// The article's baseline: every failure, an empty result included, retried 3
/// times, waiting 1, 2, 4 s (the seed's `2 ** attempt`), no hint read.
pub struct RetryEverything;

impl RetryLayer for RetryEverything {
    fn decide(&mut self, _: &FailureSpec, attempt: u32, _: &mut SplitMix64) -> Option<u64> {
        (attempt <= 3).then(|| 1000 << (attempt - 1))
    }
    fn retries_empty(&self) -> bool {
        true
    }
}

/// tenacity's `@retry(stop=stop_after_attempt(3))`: any exception, no wait.
pub struct Tenacity;

impl RetryLayer for Tenacity {
    fn decide(&mut self, _: &FailureSpec, attempt: u32, _: &mut SplitMix64) -> Option<u64> {
        (attempt < 3).then_some(0)
    }
}

/// The Anthropic and OpenAI SDKs (Stainless `_base_client`): 2 retries of 408,
/// 409, 429, ≥ 500, timeouts and connection errors; `Retry-After` if 0 < x ≤ 60 s,
/// else `min(0.5 s · 2^n, 8 s) · (1 − 0.25 · rand)`, n = retries so far.
pub struct StainlessSdk;

impl RetryLayer for StainlessSdk {
    fn decide(&mut self, failure: &FailureSpec, attempt: u32, rng: &mut SplitMix64) -> Option<u64> {
        let retryable = match failure {
            FailureSpec::Http { status, .. } => matches!(status, 408 | 409 | 429) || *status >= 500,
            FailureSpec::Timeout { .. } | FailureSpec::Reset => true,
            FailureSpec::Empty { .. } => false,
        };
        if !retryable || attempt > 2 {
            return None;
        }
        if let FailureSpec::Http { headers, .. } = failure
            && let Some(seconds) = retry_after_seconds(headers).filter(|s| (1..=60).contains(s))
        {
            return Some(seconds * 1000);
        }
        let backoff = (500.0 * 2f64.powi(attempt as i32 - 1)).min(8000.0);
        Some((backoff * (1.0 - 0.25 * rng.next_f64())) as u64)
    }
}

/// AWS SDK standard retry mode (botocore, retry mode version 2.1): 3 attempts;
/// 500/502/503/504, connection errors and timeouts (transient), throttling (a 429
/// is taken as `TooManyRequestsException`); delay `rand · min(scale · 2^(n−1), 20 s)`,
/// scale 1 s after a throttle and 50 ms otherwise (it reads `x-amz-retry-after`,
/// not `Retry-After`); the client's retry quota: 500 tokens, 14 per transient
/// retry, 5 per throttled retry, refunded on success. One client for all runs.
pub struct AwsStandard {
    quota: u32,
    last_cost: u32,
}

impl Default for AwsStandard {
    fn default() -> Self {
        AwsStandard { quota: 500, last_cost: 0 }
    }
}

impl RetryLayer for AwsStandard {
    fn decide(&mut self, failure: &FailureSpec, attempt: u32, rng: &mut SplitMix64) -> Option<u64> {
        let throttled = matches!(failure, FailureSpec::Http { status: 429, .. });
        let transient = match failure {
            FailureSpec::Http { status, .. } => matches!(status, 500 | 502 | 503 | 504),
            FailureSpec::Timeout { .. } | FailureSpec::Reset => true,
            FailureSpec::Empty { .. } => false,
        };
        if !(throttled || transient) || attempt >= 3 {
            return None;
        }
        let cost = if throttled { 5 } else { 14 };
        if self.quota < cost {
            return None;
        }
        self.quota -= cost;
        self.last_cost = cost;
        let scale = if throttled { 1000.0 } else { 50.0 };
        Some((rng.next_f64() * (scale * 2f64.powi(attempt as i32 - 1)).min(20_000.0)) as u64)
    }

    fn on_success(&mut self, attempt: u32) {
        let refund = if attempt == 1 { 1 } else { self.last_cost };
        self.quota = (self.quota + refund).min(500);
    }
}

/// gRPC retries (design A6) with the example service config: 4 attempts,
/// `UNAVAILABLE` only, `random(0, min(100 ms · 2^(n−1), 1 s))`, and retry
/// throttling `maxTokens` 10, `tokenRatio` 0.1 (a retryable failure takes 1, a
/// success gives 0.1; retries only while tokens > 5). HTTP statuses map to gRPC
/// codes as gRPC's HTTP mapping does (429, 502, 503, 504 → UNAVAILABLE); a
/// timeout is DEADLINE_EXCEEDED, a reset UNAVAILABLE. One channel for all runs.
pub struct GrpcThrottled {
    /// Tokens × 1000 (grpc-java keeps them in fixed point).
    tokens_milli: u32,
}

impl Default for GrpcThrottled {
    fn default() -> Self {
        GrpcThrottled { tokens_milli: 10_000 }
    }
}

impl RetryLayer for GrpcThrottled {
    fn decide(&mut self, failure: &FailureSpec, attempt: u32, rng: &mut SplitMix64) -> Option<u64> {
        let unavailable = match failure {
            FailureSpec::Http { status, .. } => matches!(status, 429 | 502 | 503 | 504),
            FailureSpec::Reset => true,
            FailureSpec::Timeout { .. } | FailureSpec::Empty { .. } => false,
        };
        if !unavailable {
            return None;
        }
        self.tokens_milli = self.tokens_milli.saturating_sub(1000);
        if attempt >= 4 || self.tokens_milli <= 5000 {
            return None;
        }
        Some((rng.next_f64() * (100.0 * 2f64.powi(attempt as i32 - 1)).min(1000.0)) as u64)
    }

    fn on_success(&mut self, _attempt: u32) {
        self.tokens_milli = (self.tokens_milli + 100).min(10_000);
    }
}

/// One row of the lab table.
pub struct Policy {
    pub name: &'static str,
    pub kind: PolicyKind,
    /// The article's published figures for this row, if it has one:
    /// completed, doubled, wasted, looped, escalated, calls (`None`: not given).
    pub seed: Option<[Option<u32>; 6]>,
}

pub enum PolicyKind {
    /// The component, with this configuration; `keys`: issue_refund gets a key.
    Component { config: String, keys: bool },
    /// A retry layer written here; `keys`: issue_refund gets a key.
    Layer { make: fn() -> Box<dyn RetryLayer>, keys: bool },
}

const TOOLS: &str = r#""tools": {"lookup_order": {"effect": "read"}, "check_refund_policy": {"effect": "read"},
    "issue_refund": {"effect": "write"}, "record_note": {"effect": "write"}}"#;

fn component(extra: &str) -> PolicyKind {
    let config = if extra.is_empty() { format!("{{{TOOLS}}}") } else { format!("{{{TOOLS}, {extra}}}") };
    PolicyKind::Component { config, keys: true }
}

/// The article's rows, then the rows this project adds, then peers' policies.
pub fn policies() -> Vec<Policy> {
    // classify without a run retry budget: the per-call limit is far away, so only
    // the step budget (30) ends a persistent transient failure, as in the seed.
    let classify = r#""max-attempts-per-call": 100, "max-retries-per-run": 100000, "max-steps-per-run": 30"#;
    // classify with the seed's run retry budget (4 per run) and 3 retries per call.
    let budget = |replans: u32| format!(r#""max-attempts-per-call": 4, "max-retries-per-run": 4, "max-steps-per-run": 30, "max-replans-per-run": {replans}"#);
    let s = |v: [Option<u32>; 6]| Some(v);
    vec![
        Policy {
            name: "retry everything, 3 retries, no keys, replan limit 2",
            kind: PolicyKind::Layer { make: || Box::new(RetryEverything), keys: false },
            seed: s([Some(34), Some(3), Some(173), Some(6), None, Some(374)]),
        },
        Policy {
            name: "same + idempotency keys",
            kind: PolicyKind::Layer { make: || Box::new(RetryEverything), keys: true },
            seed: s([Some(34), Some(0), Some(173), Some(6), None, Some(374)]),
        },
        Policy {
            name: "classify (component, no run retry budget)",
            kind: component(classify),
            seed: s([Some(34), Some(0), Some(0), Some(1), Some(5), Some(206)]),
        },
        Policy { name: "classify + run retry budget (4)", kind: component(&budget(2)), seed: s([Some(34), Some(0), Some(0), Some(0), Some(6), Some(183)]) },
        Policy {
            name: "no retries (component, 1 attempt per call)",
            kind: component(r#""max-attempts-per-call": 1, "max-steps-per-run": 30"#),
            seed: s([Some(23), None, None, None, None, None]),
        },
        Policy { name: "classify + budget, replan limit 0", kind: component(&budget(0)), seed: s([Some(25), None, None, None, None, None]) },
        Policy { name: "classify + budget, replan limit 1", kind: component(&budget(1)), seed: s([Some(32), None, None, None, None, None]) },
        Policy { name: "classify + budget, replan limit 2", kind: component(&budget(2)), seed: s([Some(34), None, None, None, None, None]) },
        Policy { name: "agent-retry defaults (full jitter, hints)", kind: component(""), seed: None },
        Policy {
            name: "defaults + account budget + retry quota",
            kind: component(r#""account-budget": {"account-id": "refund-desk", "capacity": 10, "refill-interval-ms": 1000, "retry-quota": {"capacity": 500}}"#),
            seed: None,
        },
        Policy { name: "AWS SDK standard mode (retry quota)", kind: PolicyKind::Layer { make: || Box::new(AwsStandard::default()), keys: false }, seed: None },
        Policy { name: "Anthropic/OpenAI SDK defaults", kind: PolicyKind::Layer { make: || Box::new(StainlessSdk), keys: false }, seed: None },
        Policy { name: "gRPC retry + throttling (10, 0.1)", kind: PolicyKind::Layer { make: || Box::new(GrpcThrottled::default()), keys: false }, seed: None },
        Policy { name: "tenacity stop_after_attempt(3), any exception", kind: PolicyKind::Layer { make: || Box::new(Tenacity), keys: false }, seed: None },
    ]
}

/// A row's totals over the runs of the mix.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RowTotals {
    pub completed: u32,
    pub doubled: u32,
    pub wasted: u32,
    pub looped: u32,
    pub escalated: u32,
    pub calls: u32,
    pub early: u32,
    pub waited_ms: u64,
    pub escalations: BTreeMap<String, u32>,
}

impl RowTotals {
    pub fn add(&mut self, run: &RunResult) {
        match &run.end {
            RunEnd::Completed => self.completed += 1,
            RunEnd::Looped => self.looped += 1,
            RunEnd::Escalated(reason) => {
                self.escalated += 1;
                *self.escalations.entry(reason.clone()).or_default() += 1;
            }
        }
        self.doubled += run.doubled;
        self.wasted += run.wasted;
        self.calls += run.calls;
        self.early += run.early;
        self.waited_ms += run.waited_ms;
    }
}

/// Runs every run of the mix under one policy. Seeded: the same inputs give
/// the same totals.
pub fn run_policy(component: &PolicyComponent, mix: &FaultMix, policy: &Policy, seed: u64) -> anyhow::Result<(RowTotals, Vec<RunResult>)> {
    let (mut host, host_counts_replans): (Box<dyn Host>, bool) = match &policy.kind {
        PolicyKind::Component { config, keys } => {
            // The mix's step budget and replan limit, unless the row sets its own.
            let config = with_defaults(config, mix);
            (Box::new(ComponentHost::new(component, &config, seed, *keys)?), false)
        }
        PolicyKind::Layer { make, keys } => (Box::new(LayerHost::new(make(), *keys, seed)), true),
    };
    let mut totals = RowTotals::default();
    let mut runs = Vec::new();
    // A fixed date, so that nothing depends on when the lab runs.
    let mut now_ms = 1_764_547_200_000;
    for run in &mix.runs {
        let result = run_one(mix, run, host.as_mut(), host_counts_replans, now_ms)?;
        now_ms = result.ended_ms + mix.model_turn_ms;
        totals.add(&result);
        runs.push(result);
    }
    Ok((totals, runs))
}

fn with_defaults(config: &str, mix: &FaultMix) -> String {
    let mut value: serde_json::Value = serde_json::from_str(config).expect("the lab's configurations are JSON");
    let object = value.as_object_mut().expect("an object");
    object.entry("max-steps-per-run").or_insert(mix.step_budget.into());
    object.entry("max-replans-per-run").or_insert(mix.replan_limit.into());
    value.to_string()
}
