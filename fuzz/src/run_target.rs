//! `run`: an arbitrary configuration and an arbitrary sequence of begin-call /
//! record-outcome / report, with arbitrary outcomes, times and entropy, through
//! a [`Run`], checked after every step:
//!
//! - a retry's delay is exactly the full-jitter draw (`oracle::delay_ms`) with the
//!   hint as a floor, raised only to the account budget's granted wait: so it is
//!   ≤ `max-delay-ms` unless it honours a hint (or the account's wait ≤ `max-wait-ms`),
//!   and a hint it honours is never above `max-hint-ms`;
//! - steps never exceed `max-steps-per-run`; retries, replans and attempts per
//!   call stay within their budgets; counters only grow (none wraps) and
//!   `waited-ms` is the sum of the delays given;
//! - an escalation names a budget that is really spent, ends the run, and later
//!   calls are refused with its reason; a refused call changes nothing;
//! - messages, notes and reports stay bounded in size;
//! - after the sequence, a persistent transient failure ends in an escalation
//!   within the budgets;
//! - the same inputs and entropy give the same transcript (the case runs twice).

use std::sync::Arc;

use agent_retry_policy::account::{AccountBudget, Bucket, Reservation};
use agent_retry_policy::config::{Config, ONE_DAY_MS, ONE_YEAR_MS};
use agent_retry_policy::readable;
use agent_retry_policy::run::{At, Run};
use agent_retry_policy::types::{
    Action, Admission, CallRequest, Decision, Delivery, Escalation, EscalationReason, Failure, FailureKind, Outcome, OutcomeClass, RunError, RunReport,
    StatusCheckResult, TaskReport, TaskStatus, ToolHints, TransportError,
};
use arbitrary::{Arbitrary, Unstructured};
use serde_json::{Value, json};

use crate::oracle::{self, MAX_CLASSIFICATION_REASON_BYTES};
use crate::{DEFAULT_NOW_MS, invariant, nasty};
use agent_retry_policy::classify::classify;

/// Which call a record-outcome names.
#[derive(Clone, Debug)]
pub enum CallPick {
    /// The latest call begun.
    Latest,
    /// The n-th call begun (modulo the calls so far, 1-based).
    Nth(u32),
    /// Any number at all (unknown calls, 0).
    Raw(u32),
}

/// Which attempt a record-outcome names.
#[derive(Clone, Debug)]
pub enum AttemptPick {
    Current,
    Raw(u32),
}

#[derive(Clone, Debug)]
pub enum Op {
    Begin { request: CallRequest, dt_ms: u64 },
    Record { call: CallPick, attempt: AttemptPick, outcome: Outcome, dt_ms: u64, entropy: u64 },
    Report,
}

/// One decoded `run` input.
#[derive(Clone, Debug)]
pub struct RunCase {
    pub config_text: String,
    pub run_id: String,
    pub ops: Vec<Op>,
    /// The scripted account budget's answers, in turn (see [`Scripted`]).
    pub budget: Vec<u64>,
}

pub(crate) fn pick_u64(u: &mut Unstructured, common: &[u64], lo: u64, hi: u64) -> arbitrary::Result<u64> {
    if u.ratio(3, 4)? {
        let fitting: Vec<u64> = common.iter().copied().filter(|v| (lo..=hi).contains(v)).collect();
        if !fitting.is_empty() {
            return Ok(*u.choose(&fitting)?);
        }
    }
    u.int_in_range(lo..=hi)
}

pub(crate) fn string_from(u: &mut Unstructured, table: &[&str], max: usize) -> arbitrary::Result<String> {
    if u.ratio(4, 5)? {
        Ok(u.choose(table)?.to_string())
    } else {
        let s = String::arbitrary(u)?;
        Ok(s.chars().take(max).collect())
    }
}

const CLASSES: &[&str] = &["transient", "throttled", "deterministic", "permission", "unclassified"];

pub(crate) fn config_json(u: &mut Unstructured) -> arbitrary::Result<Value> {
    let base = pick_u64(u, &[1, 10, 100, 1000, 5000, ONE_DAY_MS], 1, ONE_DAY_MS)?;
    let max_delay = pick_u64(u, &[base, 1000, 30_000, ONE_DAY_MS], base, ONE_DAY_MS)?;
    let max_hint = pick_u64(u, &[0, 1000, 60_000, ONE_DAY_MS], 0, ONE_DAY_MS)?;
    let plausible_floor = max_hint.max(1000);
    let plausible = pick_u64(u, &[plausible_floor, ONE_YEAR_MS, 10 * ONE_YEAR_MS], plausible_floor, 10 * ONE_YEAR_MS)?;
    let mut config = json!({
        "base-delay-ms": base,
        "max-delay-ms": max_delay,
        "max-attempts-per-call": pick_u64(u, &[1, 2, 3, 4, 5, 10, 100], 1, 100)?,
        "max-retries-per-run": pick_u64(u, &[0, 1, 2, 3, 10, 100], 0, 100_000)?,
        "max-replans-per-run": pick_u64(u, &[0, 1, 2, 5], 0, 1000)?,
        "max-steps-per-run": pick_u64(u, &[1, 2, 3, 5, 10, 30, 100], 1, 1_000_000)?,
        "max-hint-ms": max_hint,
        "max-plausible-hint-ms": plausible,
        "max-message-chars": pick_u64(u, &[16, 300, 10_000], 16, 10_000)?,
        "default-effect": *u.choose(&["read", "write", "delete"])?,
    });
    let mut tools = serde_json::Map::new();
    for name in ["issue_refund", "lookup_order", "delete_asset", "search"] {
        let entry = match u.choose_index(5)? {
            0 => continue,
            1 => json!({"effect": *u.choose(&["read", "write", "delete"])?, "idempotent": bool::arbitrary(u)?}),
            2 => json!({"readOnlyHint": bool::arbitrary(u)?, "destructiveHint": bool::arbitrary(u)?, "idempotentHint": bool::arbitrary(u)?}),
            3 => {
                json!({"tool-error-rules": [{"contains": string_from(u, &["E_BUSY", "quota", "503", "://", "try again"], 40)?.trim().replace('\0', "") + "x", "class": *u.choose(CLASSES)?}]})
            }
            _ => json!({"effect": "write", "tool-error-rules": [{"contains": "denied", "class": *u.choose(CLASSES)?}]}),
        };
        tools.insert(name.to_string(), entry);
    }
    config["tools"] = Value::Object(tools);
    let mut overrides = serde_json::Map::new();
    for _ in 0..u.choose_index(3)? {
        let status = pick_u64(u, &[409, 429, 500, 503, 404, 410], 400, 599)?;
        overrides.insert(status.to_string(), json!(*u.choose(CLASSES)?));
    }
    config["status-overrides"] = Value::Object(overrides);
    if u.ratio(1, 3)? {
        config["tool-error-rules"] = json!([{"contains": *u.choose(&["rate", "http 5", "quota_low", "E_BUSY"])?, "class": *u.choose(CLASSES)?}]);
    }
    if u.ratio(1, 2)? {
        let capacity = pick_u64(u, &[1, 2, 5, 100, 1_000_000_000], 1, 1_000_000_000)?;
        let cost = |u: &mut Unstructured| pick_u64(u, &[0, 1, 2, capacity], 0, capacity.min(20));
        let mut account = json!({
            "account-id": string_from(u, &["acme", "a", "ünï"], 256)?,
            "capacity": capacity,
            "refill-interval-ms": pick_u64(u, &[1, 100, 1000, ONE_DAY_MS], 1, ONE_DAY_MS)?,
            "max-wait-ms": pick_u64(u, &[0, 100, 5000, ONE_DAY_MS], 0, ONE_DAY_MS)?,
            "attempt-cost": cost(u)?,
            "retry-cost": cost(u)?,
            "throttled-retry-cost": cost(u)?,
        });
        if account["account-id"].as_str().is_none_or(|id| id.is_empty() || id.len() > 256) {
            account["account-id"] = json!("acme");
        }
        if u.ratio(1, 2)? {
            let quota = pick_u64(u, &[1, 14, 500], 1, 1_000_000_000)?;
            let qcost = |u: &mut Unstructured| pick_u64(u, &[0, 1, 5, 14], 0, quota.min(20));
            account["retry-quota"] = json!({"capacity": quota, "retry-cost": qcost(u)?, "throttled-retry-cost": qcost(u)?, "success-refund": qcost(u)?});
        }
        config["account-budget"] = account;
    }
    Ok(config)
}

pub(crate) fn failure(u: &mut Unstructured) -> arbitrary::Result<Failure> {
    let kind = match u.choose_index(10)? {
        0..=4 => {
            FailureKind::HttpStatus(pick_u64(u, &[429, 503, 500, 502, 504, 408, 400, 401, 403, 404, 409, 410, 413, 422, 501, 529, 200, 0], 0, 65_535)? as u16)
        }
        5 | 6 => FailureKind::Transport(*u.choose(&[
            TransportError::Timeout,
            TransportError::ConnectionReset,
            TransportError::ConnectionRefused,
            TransportError::StreamClosed,
            TransportError::Tls,
            TransportError::NameResolution,
            TransportError::Other,
        ])?),
        7 => FailureKind::ProtocolError(if u.ratio(3, 4)? {
            *u.choose(&[-32603, -32602, -32601, -32000, -32001, -32002, -32022, -32042, -32700, i32::MIN])?
        } else {
            i32::arbitrary(u)?
        }),
        8 if u.ratio(1, 4)? => FailureKind::InputRequired,
        _ => FailureKind::ToolError(if u.ratio(1, 2)? { None } else { Some(pick_u64(u, &[429, 503, 403, 404, 200], 0, 65_535)? as u16) }),
    };
    let mut headers = Vec::new();
    for _ in 0..u.choose_index(4)? {
        headers.push((string_from(u, nasty::HEADER_NAMES, 64)?, string_from(u, nasty::HEADER_VALUES, 2000)?));
    }
    let body = if u.ratio(1, 3)? { String::new() } else { string_from(u, nasty::BODIES, 5000)? };
    let structured_content = if u.ratio(3, 4)? { None } else { Some(string_from(u, nasty::STRUCTURED, 5000)?) };
    Ok(Failure {
        kind,
        headers,
        body,
        structured_content,
        session_id_sent: u.arbitrary()?,
        delivery: *u.choose(&[Delivery::Unknown, Delivery::NotSent, Delivery::Sent, Delivery::AnswerStarted])?,
    })
}

fn outcome(u: &mut Unstructured) -> arbitrary::Result<Outcome> {
    Ok(match u.choose_index(24)? {
        0 | 1 => Outcome::Success,
        2 => Outcome::EmptyResult(string_from(u, &["", "[]", "null", "{\"content\":[]}"], 2000)?),
        3..=5 => Outcome::StatusCheck(*u.choose(&[StatusCheckResult::Found, StatusCheckResult::Absent, StatusCheckResult::Unknown])?),
        // A task's report (contract 0.6.0): a real id, or an odd or over-long one.
        20 | 21 => Outcome::Task(TaskReport {
            task_id: string_from(u, &["t-1", "t-2", ""], 300)?,
            status: *u.choose(&[TaskStatus::Working, TaskStatus::InputAnswered, TaskStatus::InputRequired, TaskStatus::Cancelled])?,
            poll_interval_ms: if u.ratio(1, 3)? { None } else { Some(pick_u64(u, &[0, 1, 100, 1000, 60_000, 120_000], 0, u64::MAX)?) },
            ttl_ms: if u.ratio(1, 2)? { None } else { Some(pick_u64(u, &[0, 1000, 300_000], 0, u64::MAX)?) },
            age_ms: if u.ratio(1, 2)? { None } else { Some(pick_u64(u, &[0, 999, 299_999], 0, u64::MAX)?) },
            message: if u.ratio(1, 2)? { String::new() } else { string_from(u, nasty::BODIES, 5000)? },
        }),
        22 => Outcome::PollFailure(failure(u)?),
        _ => Outcome::Failure(failure(u)?),
    })
}

impl RunCase {
    /// Reads a case from fuzz bytes (`None` if they run out before the configuration).
    pub fn decode(data: &[u8]) -> Option<RunCase> {
        let mut u = Unstructured::new(data);
        let config_text = config_json(&mut u).ok()?.to_string();
        let run_id = string_from(&mut u, &["run-1", "CASE-5016", "", "ünïcødé \u{202e} run"], 300).ok()?;
        let budget: Vec<u64> = (0..u.choose_index(8).unwrap_or(0)).map(|_| u64::arbitrary(&mut u).unwrap_or(0)).collect();
        let mut ops = Vec::new();
        while !u.is_empty() && ops.len() < 64 {
            let op = (|| -> arbitrary::Result<Op> {
                let dt_ms = pick_u64(&mut u, &[0, 1, 1000, 60_000], 0, ONE_YEAR_MS)?;
                Ok(match u.choose_index(10)? {
                    0..=2 => {
                        let tool = string_from(&mut u, nasty::TOOLS, 300)?;
                        let idempotency_key = match u.choose_index(3)? {
                            0 => None,
                            1 => Some(format!("key-{}", ops.len())),
                            _ => Some(String::arbitrary(&mut u)?),
                        };
                        let hints = if u.ratio(1, 2)? {
                            None
                        } else {
                            Some(ToolHints {
                                read_only: Option::<bool>::arbitrary(&mut u)?,
                                destructive: Option::<bool>::arbitrary(&mut u)?,
                                idempotent: Option::<bool>::arbitrary(&mut u)?,
                            })
                        };
                        Op::Begin { request: CallRequest { server: None, tool, idempotency_key, hints }, dt_ms }
                    }
                    3..=8 => {
                        let call = match u.choose_index(8)? {
                            0 => CallPick::Nth(u32::arbitrary(&mut u)?),
                            1 => CallPick::Raw(u32::arbitrary(&mut u)?),
                            _ => CallPick::Latest,
                        };
                        let attempt = if u.ratio(9, 10)? { AttemptPick::Current } else { AttemptPick::Raw(u32::arbitrary(&mut u)?) };
                        let entropy = if u.ratio(1, 4)? { *u.choose(&[0, u64::MAX, 1 << 63, 1])? } else { u64::arbitrary(&mut u)? };
                        Op::Record { call, attempt, outcome: outcome(&mut u)?, dt_ms, entropy }
                    }
                    _ => Op::Report,
                })
            })();
            match op {
                Ok(op) => ops.push(op),
                Err(_) => break,
            }
        }
        Some(RunCase { config_text, run_id, ops, budget })
    }
}

/// The account budget, scripted by the input: each reservation takes the next
/// answer `a`: refused (room in `a / 4` ms) if `a % 4 == 3`, else granted after
/// `(a / 4) % (max-wait + 1)` ms, as a real bucket never waits longer than asked.
#[derive(Clone, Debug)]
pub struct Scripted {
    answers: Vec<u64>,
    next: usize,
    /// The longest wait granted since the host last reset it.
    pub last_grant: u64,
}

impl Scripted {
    /// A budget that gives `answers` in turn (the `flat` target's too).
    pub(crate) fn new(answers: Vec<u64>) -> Scripted {
        Scripted { answers, next: 0, last_grant: 0 }
    }
}

/// The fuzzed runs name no server: no breaker applies, and no shared state is used.
impl agent_retry_policy::shared::SharedState for Scripted {}

impl AccountBudget for Scripted {
    fn reserve(&mut self, account_id: &str, tokens: u32, bucket: Bucket, max_wait_ms: u64, _now_ms: u64) -> Reservation {
        invariant!(tokens >= 1 && tokens <= bucket.capacity, "reserve of {tokens} tokens from {account_id:?}, a bucket of {}", bucket.capacity);
        let a = if self.answers.is_empty() { 0 } else { self.answers[self.next % self.answers.len()] };
        self.next += 1;
        if a % 4 == 3 {
            Reservation::Refused(a / 4)
        } else {
            let wait = (a / 4) % (max_wait_ms + 1);
            self.last_grant = self.last_grant.max(wait);
            Reservation::Granted(wait)
        }
    }

    fn refund(&mut self, account_id: &str, tokens: u32, bucket: Bucket, _now_ms: u64) {
        invariant!(tokens >= 1 && tokens <= bucket.capacity, "refund of {tokens} tokens to {account_id:?}, a bucket of {}", bucket.capacity);
    }
}

#[derive(Clone, Debug)]
struct CallState {
    tool: String,
    key: Option<String>,
    attempt: u32,
    checking: bool,
    finished: bool,
    /// Whether the call's attempt was answered by a task that still lives.
    tasked: bool,
}

/// Drives a run and checks every answer.
struct Driver {
    config: Arc<Config>,
    run: Run,
    run_id: String,
    budget: Scripted,
    now_ms: u64,
    calls: Vec<CallState>,
    ended: Option<EscalationReason>,
    waits: u32,
    waited_ms: u128,
    report: RunReport,
    transcript: Vec<String>,
    /// The concrete steps taken, as the conformance steps' JSON (`tests/component.rs`).
    steps: Vec<Value>,
}

/// The longest a message for the model or a last error may be, in bytes.
fn message_limit(config: &Config, tool: &str) -> usize {
    tool.len() + 128 + 4 * config.max_message_chars as usize
}

impl Driver {
    fn check_report(&mut self, context: &str) {
        let r = self.run.report();
        let p = &self.report;
        let c = &self.config;
        for (name, now, before) in [
            ("calls", r.calls, p.calls),
            ("attempts", r.attempts, p.attempts),
            ("retries", r.retries, p.retries),
            ("status-checks", r.status_checks, p.status_checks),
            ("replans", r.replans, p.replans),
            ("succeeded-calls", r.succeeded_calls, p.succeeded_calls),
            ("waits", r.waits, p.waits),
        ] {
            invariant!(now >= before, "report {name} went down from {before} to {now} ({context})");
        }
        invariant!(r.waited_ms >= p.waited_ms, "waited-ms went down ({context})");
        let steps = u64::from(r.attempts) + u64::from(r.status_checks);
        invariant!(steps <= u64::from(c.max_steps_per_run), "{steps} steps, max-steps-per-run {} ({context})", c.max_steps_per_run);
        invariant!(r.retries <= c.max_retries_per_run, "{} retries, max-retries-per-run {} ({context})", r.retries, c.max_retries_per_run);
        invariant!(r.replans <= c.max_replans_per_run, "{} replans, max-replans-per-run {} ({context})", r.replans, c.max_replans_per_run);
        invariant!(r.calls as usize == self.calls.len(), "report says {} calls, {} were admitted ({context})", r.calls, self.calls.len());
        invariant!(
            r.attempts >= r.calls && r.succeeded_calls <= r.calls,
            "attempts {} / calls {} / succeeded {} ({context})",
            r.attempts,
            r.calls,
            r.succeeded_calls
        );
        invariant!(r.waits == self.waits, "report waits {} vs delays given {} ({context})", r.waits, self.waits);
        invariant!(u128::from(r.waited_ms) == self.waited_ms, "report waited-ms {} vs the sum of delays given {} ({context})", r.waited_ms, self.waited_ms);
        invariant!(r.escalation == self.ended, "report escalation {:?} vs {:?} ({context})", r.escalation, self.ended);
        invariant!(r.run_id == self.run_id, "report run id changed ({context})");
        invariant!(
            r.effects.len() <= 20 && r.effects.len() <= r.effects_total as usize,
            "report of {} effects of {} ({context})",
            r.effects.len(),
            r.effects_total
        );
        let page = self.run.effects_page(0, u32::MAX);
        invariant!(page.len() == (r.effects_total as usize).min(1000), "effects page of {} for {} effects ({context})", page.len(), r.effects_total);
        invariant!(r.effects.first() == page.first(), "the report's first effect is not the page's ({context})");
        self.report = r;
    }

    fn check_escalation(&self, e: &Escalation, stop_tool: &str, context: &str) {
        let r = self.run.report();
        invariant!(e.effects == r.effects && e.effects_total == r.effects_total, "the escalation's effects are not the run's ({context})");
        invariant!(e.note.starts_with(&format!("Run {} stopped: ", self.run_id)), "note does not start with the run: {:?} ({context})", e.note);
        if let Some(last) = &e.last_error {
            let limit = message_limit(&self.config, "");
            invariant!(last.len() <= limit, "last error of {} bytes (limit {limit}) ({context})", last.len());
        }
        let effects: usize = e.effects.iter().map(|x| x.tool.len() + x.idempotency_key.as_ref().map_or(0, String::len) + 96).sum();
        let limit = 1024 + self.run_id.len() + stop_tool.len() + e.last_error.as_ref().map_or(0, String::len) + effects;
        invariant!(e.note.len() <= limit, "escalation note of {} bytes (limit {limit}) ({context})", e.note.len());
    }

    fn begin(&mut self, request: &CallRequest) -> Result<Admission, RunError> {
        let before = self.run.report();
        self.budget.last_grant = 0;
        let result = readable::begin_call(&mut self.run, request, self.now_ms, &mut self.budget);
        self.steps.push(json!({"op": "begin-call", "call": serde_json::to_value(request).unwrap_or(Value::Null), "now-ms": self.now_ms}));
        self.transcript.push(format!("begin {result:?}"));
        let context = format!("begin-call {} of {:?}", self.calls.len() + 1, request.tool);
        match &result {
            Err(e) => {
                invariant!(self.run.report() == before, "a refused begin-call changed the run: {e:?} ({context})");
                match (e, self.ended) {
                    (RunError::RunEnded(reason), Some(ended)) => invariant!(*reason == ended, "run-ended({reason:?}) after {ended:?} ({context})"),
                    (RunError::TooLarge(_), None) => invariant!(
                        request.tool.len() > 256 || request.idempotency_key.as_ref().is_some_and(|k| k.len() > 256),
                        "too-large for a tool of {} bytes ({context})",
                        request.tool.len()
                    ),
                    (other, ended) => panic!("broken invariant: begin-call refused with {other:?}, run ended: {ended:?} ({context})"),
                }
            }
            Ok(Admission::Send(ticket)) => {
                invariant!(self.ended.is_none(), "a call admitted after the run ended ({context})");
                invariant!(ticket.call_id as usize == self.calls.len() + 1, "call id {} for call {} ({context})", ticket.call_id, self.calls.len() + 1);
                invariant!(
                    ticket.delay_ms == self.budget.last_grant,
                    "ticket delay {} vs the account's grant {} ({context})",
                    ticket.delay_ms,
                    self.budget.last_grant
                );
                let policy = self.config.tool_policy(&request.tool, request.hints.as_ref());
                let safe = policy.effect != agent_retry_policy::types::Effect::Write || policy.idempotent || request.idempotency_key.is_some();
                invariant!(ticket.effect == policy.effect && ticket.safe_to_repeat == safe, "ticket {ticket:?} vs policy {policy:?} ({context})");
                if ticket.delay_ms > 0 {
                    self.waits += 1;
                    self.waited_ms += u128::from(ticket.delay_ms);
                }
                self.calls.push(CallState {
                    tool: request.tool.clone(),
                    key: request.idempotency_key.clone(),
                    attempt: 1,
                    checking: false,
                    finished: false,
                    tasked: false,
                });
            }
            Ok(Admission::Escalate(e)) => {
                invariant!(self.ended.is_none(), "escalated again after the run ended ({context})");
                let steps = before.attempts + before.status_checks;
                match e.reason {
                    EscalationReason::RunStepsSpent => {
                        invariant!(steps >= self.config.max_steps_per_run, "run-steps-spent at {steps} steps ({context})")
                    }
                    EscalationReason::AccountBudgetExhausted => {
                        invariant!(self.config.account_budget.is_some(), "account budget exhausted without one ({context})")
                    }
                    other => panic!("broken invariant: begin-call escalated for {other:?} ({context})"),
                }
                self.ended = Some(e.reason);
                self.check_escalation(e, "", &context);
            }
            // The fuzzed calls name no server: no breaker applies.
            Ok(Admission::Replan(d)) => panic!("broken invariant: a breaker refused a call without a server: {d:?} ({context})"),
        }
        self.check_report(&context);
        result
    }

    fn record(&mut self, call_id: u32, attempt: u32, outcome: &Outcome, entropy: u64) -> Result<Decision, RunError> {
        let before = self.run.report();
        self.budget.last_grant = 0;
        let result =
            readable::record_outcome(&mut self.run, call_id, attempt, outcome, At { now_ms: self.now_ms, time_left_ms: None, entropy }, &mut self.budget);
        self.steps.push(json!({
            "op": "record-outcome", "call-id": call_id, "attempt": attempt,
            "outcome": serde_json::to_value(outcome).unwrap_or(Value::Null), "now-ms": self.now_ms, "entropy": entropy,
        }));
        self.transcript.push(format!("record {result:?}"));
        let context = format!("record-outcome of call {call_id} attempt {attempt}");
        let index = (call_id as usize).wrapping_sub(1);
        let known = self.calls.get(index).cloned();
        let c = Arc::clone(&self.config);
        match &result {
            Err(e) => {
                invariant!(self.run.report() == before, "a refused record-outcome changed the run: {e:?} ({context})");
                let consistent = match (e, &known) {
                    (RunError::RunEnded(reason), _) => self.ended == Some(*reason),
                    _ if self.ended.is_some() => false,
                    (RunError::UnknownCall(id), None) => *id == call_id,
                    (RunError::CallFinished(_), Some(k)) => k.finished,
                    (RunError::AttemptMismatch(m), Some(k)) => m.expected == k.attempt && m.reported == attempt && attempt != k.attempt,
                    (RunError::StatusCheckPending(_), Some(k)) => k.checking && !matches!(outcome, Outcome::StatusCheck(_)),
                    (RunError::NoStatusCheckPending(_), Some(k)) => !k.checking && matches!(outcome, Outcome::StatusCheck(_)),
                    (RunError::NoTask(_), Some(k)) => !k.checking && !k.tasked && matches!(outcome, Outcome::PollFailure(_)),
                    (RunError::TooLarge(l), Some(_)) => l.input == "task-id" && matches!(outcome, Outcome::Task(t) if t.task_id.len() > 256),
                    _ => false,
                };
                invariant!(consistent, "record-outcome refused with {e:?}; call state {known:?}, ended {:?} ({context})", self.ended);
            }
            Ok(d) => {
                let Some(k) = known else { panic!("broken invariant: a decision for unknown call {call_id} ({context})") };
                invariant!(self.ended.is_none() && !k.finished && attempt == k.attempt, "a decision for {k:?}, ended {:?} ({context})", self.ended);
                invariant!(d.attempt == k.attempt, "decision attempt {} for attempt {} ({context})", d.attempt, k.attempt);
                if let Some(hint) = d.hint_ms {
                    invariant!(hint <= c.max_plausible_hint_ms, "hint {hint} above max-plausible-hint-ms ({context})");
                }
                let known_rule =
                    oracle::RULES.contains(&d.rule.as_str()) || ["success", "empty-result", "status-check", "task-status"].contains(&d.rule.as_str());
                invariant!(known_rule, "decision names no known rule: {:?} ({context})", d.rule);
                // A failure's decision carries its classification's reason (checked
                // by `check_classification`) and a few words more.
                let base = match outcome {
                    Outcome::Failure(f) if !k.checking => {
                        let classification = classify(f, &c, Some(&k.tool), self.now_ms);
                        oracle::check_classification(&classification, c.max_plausible_hint_ms, f.headers.len(), &context);
                        invariant!(
                            d.class == classification.class && d.rule == classification.rule && d.hint_ms == classification.hint_ms,
                            "decision {:?}/{}/{:?} vs classification {:?}/{}/{:?} ({context})",
                            d.class,
                            d.rule,
                            d.hint_ms,
                            classification.class,
                            classification.rule,
                            classification.hint_ms
                        );
                        classification.reason.len() + oracle::problems_bytes(&classification)
                    }
                    _ => MAX_CLASSIFICATION_REASON_BYTES,
                };
                let limit = base + 512;
                invariant!(
                    d.reason.len() <= limit,
                    "decision reason of {} bytes (limit {limit}) ({context}): {}…",
                    d.reason.len(),
                    d.reason.chars().take(200).collect::<String>()
                );
                let steps_before = before.attempts + before.status_checks;
                let call = &mut self.calls[index];
                let had_task = call.tasked || matches!(outcome, Outcome::Task(_));
                // A task ends with the attempt's outcome, or when the policy stops waiting.
                call.tasked = matches!(outcome, Outcome::Task(_) | Outcome::PollFailure(_)) && matches!(d.action, Action::Poll(_));
                invariant!(!d.cancel_task || (had_task && matches!(d.action, Action::Escalate(_))), "cancel-task on {d:?} without a live task ({context})");
                match &d.action {
                    Action::Retry(plan) => {
                        invariant!(matches!(d.class, OutcomeClass::Transient | OutcomeClass::Throttled), "a retry of a {:?} outcome ({context})", d.class);
                        invariant!(
                            plan.attempt == d.attempt + 1 && plan.attempt <= c.max_attempts_per_call,
                            "retry to attempt {} of {} ({context})",
                            plan.attempt,
                            c.max_attempts_per_call
                        );
                        invariant!(plan.idempotency_key == call.key, "a retry changed the idempotency key ({context})");
                        let hint = d.hint_ms.unwrap_or(0);
                        invariant!(hint <= c.max_hint_ms, "a retry honours a hint of {hint} ms above max-hint-ms {} ({context})", c.max_hint_ms);
                        let drawn = oracle::delay_ms(c.base_delay_ms, c.max_delay_ms, d.attempt, d.hint_ms, entropy);
                        let expected = drawn.max(self.budget.last_grant);
                        invariant!(
                            plan.delay_ms == expected,
                            "retry {} delay {} ms; full jitter gives {drawn} (base {}, cap {}, hint {:?}, entropy {entropy:#x}), the account granted {} ({context})",
                            d.attempt,
                            plan.delay_ms,
                            c.base_delay_ms,
                            c.max_delay_ms,
                            d.hint_ms,
                            self.budget.last_grant
                        );
                        let max_wait = c.account_budget.as_ref().map_or(0, |a| a.max_wait_ms);
                        invariant!(
                            plan.delay_ms <= oracle::ceiling_ms(c.base_delay_ms, c.max_delay_ms, d.attempt).max(hint).max(max_wait),
                            "delay {} above the cap, the hint and the account's wait ({context})",
                            plan.delay_ms
                        );
                        invariant!(steps_before < c.max_steps_per_run && before.retries < c.max_retries_per_run, "a retry past the run's budgets ({context})");
                        call.attempt = plan.attempt;
                        call.checking = false;
                        if plan.delay_ms > 0 {
                            self.waits += 1;
                            self.waited_ms += u128::from(plan.delay_ms);
                        }
                    }
                    Action::CheckStatus => {
                        invariant!(
                            d.class == OutcomeClass::Transient && call.key.is_none(),
                            "check-status for a {:?} outcome, key {:?} ({context})",
                            d.class,
                            call.key
                        );
                        invariant!(steps_before < c.max_steps_per_run, "a status check past the step budget ({context})");
                        call.checking = true;
                    }
                    Action::Replan(message) => {
                        invariant!(matches!(d.class, OutcomeClass::Deterministic | OutcomeClass::Semantic), "a replan of a {:?} outcome ({context})", d.class);
                        let limit = message_limit(&c, &call.tool);
                        invariant!(message.len() <= limit, "replan message of {} bytes (limit {limit}) ({context})", message.len());
                        invariant!(before.replans < c.max_replans_per_run, "a replan past max-replans-per-run ({context})");
                        call.finished = true;
                    }
                    Action::Succeed(note) => {
                        invariant!(note.as_ref().is_none_or(|n| n.len() <= 128), "succeed note {note:?} ({context})");
                        call.finished = true;
                    }
                    Action::Poll(plan) => {
                        invariant!(had_task, "a poll for a call without a task ({context})");
                        invariant!(
                            plan.delay_ms <= c.max_hint_ms.max(c.task_poll_max_delay_ms),
                            "a poll after {} ms, past max-hint-ms {} and task-poll-max-delay-ms {} ({context})",
                            plan.delay_ms,
                            c.max_hint_ms,
                            c.task_poll_max_delay_ms
                        );
                        if plan.delay_ms > 0 {
                            self.waits += 1;
                            self.waited_ms += u128::from(plan.delay_ms);
                        }
                    }
                    Action::Escalate(e) => {
                        let ok = match e.reason {
                            EscalationReason::CallAttemptsSpent => d.attempt >= c.max_attempts_per_call,
                            EscalationReason::RunRetriesSpent => before.retries >= c.max_retries_per_run,
                            EscalationReason::RunStepsSpent => steps_before >= c.max_steps_per_run,
                            EscalationReason::ReplansSpent => before.replans >= c.max_replans_per_run,
                            EscalationReason::ServerWaitTooLong => d.hint_ms.is_some_and(|h| h > c.max_hint_ms) && e.resets_in_ms == d.hint_ms,
                            EscalationReason::PermissionDenied => d.class == OutcomeClass::Permission,
                            EscalationReason::UnclassifiedFailure => d.class == OutcomeClass::Unclassified,
                            EscalationReason::RetryForbidden => matches!(d.class, OutcomeClass::Transient | OutcomeClass::Throttled),
                            EscalationReason::StatusUnknown => matches!(outcome, Outcome::StatusCheck(StatusCheckResult::Unknown)),
                            EscalationReason::AccountBudgetExhausted | EscalationReason::RetryQuotaExhausted => c.account_budget.is_some(),
                            EscalationReason::RetryBudgetExhausted => c.account_budget.as_ref().is_some_and(|a| a.retry_ratio.is_some()),
                            // Only a person's answer aborts a run (`resume-run`), never a report.
                            EscalationReason::Aborted => false,
                            EscalationReason::ConnectionMisconfigured => d.class == OutcomeClass::Misconfigured,
                            // The fuzzed runs carry no deadline.
                            EscalationReason::DeadlineTooNear => false,
                            EscalationReason::ProtocolVersionUnsupported => d.rule == "version-mismatch",
                            EscalationReason::InputRequired => d.class == OutcomeClass::NeedsInput,
                            EscalationReason::TaskExpired | EscalationReason::TaskPollsSpent | EscalationReason::TaskCancelled => had_task,
                            // The fuzzed calls name no server: no breaker applies.
                            EscalationReason::CircuitOpen => false,
                        };
                        invariant!(ok, "escalated for {:?} with budgets not spent: decision {d:?}, report before {before:?} ({context})", e.reason);
                        call.finished = true;
                        let tool = call.tool.clone();
                        self.ended = Some(e.reason);
                        self.check_escalation(e, &tool, &context);
                    }
                }
            }
        }
        self.check_report(&context);
        result
    }

    /// A persistent transient failure (a timeout on every attempt of a call with
    /// a key) must end in an escalation within the budgets.
    fn persistent_failure(&mut self) {
        if self.ended.is_some() {
            return;
        }
        self.now_ms = self.now_ms.saturating_add(1);
        let request = CallRequest { server: None, tool: "fuzz_persistent".to_string(), idempotency_key: Some("persistent".to_string()), hints: None };
        let call_id = match self.begin(&request) {
            Ok(Admission::Send(ticket)) => ticket.call_id,
            Ok(Admission::Escalate(_)) => return,
            Ok(Admission::Replan(d)) => panic!("broken invariant: a breaker refused a call without a server: {d:?}"),
            Err(e) => panic!("broken invariant: an open run refused a call: {e:?}"),
        };
        let timeout = Outcome::Failure(Failure {
            kind: FailureKind::Transport(TransportError::Timeout),
            headers: Vec::new(),
            body: String::new(),
            structured_content: None,
            session_id_sent: false,
            delivery: Default::default(),
        });
        let mut attempt = 1;
        for i in 0..=self.config.max_attempts_per_call {
            self.now_ms = self.now_ms.saturating_add(1000);
            let entropy = u64::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            match self.record(call_id, attempt, &timeout, entropy) {
                Ok(Decision { action: Action::Retry(plan), .. }) => attempt = plan.attempt,
                Ok(Decision { action: Action::Escalate(e), .. }) => {
                    let budget = matches!(
                        e.reason,
                        EscalationReason::CallAttemptsSpent
                            | EscalationReason::RunRetriesSpent
                            | EscalationReason::RunStepsSpent
                            | EscalationReason::AccountBudgetExhausted
                            | EscalationReason::RetryQuotaExhausted
                    );
                    invariant!(budget, "a persistent timeout escalated for {:?}", e.reason);
                    return;
                }
                other => panic!("broken invariant: a persistent timeout with a key gave {other:?}"),
            }
        }
        panic!("broken invariant: a persistent timeout was not escalated within {} attempts", self.config.max_attempts_per_call);
    }
}

/// The result of one run of a case: every answer, and the concrete steps taken.
pub struct RunOutput {
    pub transcript: Vec<String>,
    pub steps: Vec<Value>,
}

/// Runs a decoded case once, checking every answer.
pub fn run_case(case: &RunCase) -> RunOutput {
    let config =
        Config::from_json(&case.config_text).unwrap_or_else(|e| panic!("broken invariant: a valid configuration refused: {e:?}\n{}", case.config_text));
    let config = Arc::new(config);
    // A run id over the limit is refused; the conformance steps then start "run-1".
    let (run, run_id) = match Run::start(Arc::clone(&config), &case.run_id) {
        Ok(run) => (run, case.run_id.clone()),
        Err(e) => {
            invariant!(matches!(&e, RunError::TooLarge(_)) && case.run_id.len() > 256, "start-run refused a run id of {} bytes: {e:?}", case.run_id.len());
            (Run::start(Arc::clone(&config), "run-1").expect("run-1 starts"), "run-1".to_string())
        }
    };
    let report = run.report();
    let mut d = Driver {
        config,
        run,
        run_id,
        budget: Scripted { answers: case.budget.clone(), next: 0, last_grant: 0 },
        now_ms: DEFAULT_NOW_MS,
        calls: Vec::new(),
        ended: None,
        waits: 0,
        waited_ms: 0,
        report,
        transcript: Vec::new(),
        steps: vec![json!({"op": "load-policy", "config-text": case.config_text}), json!({"op": "start-run", "run-id": case.run_id})],
    };
    for op in &case.ops {
        match op {
            Op::Begin { request, dt_ms } => {
                d.now_ms = d.now_ms.saturating_add(*dt_ms);
                let _ = d.begin(request);
            }
            Op::Record { call, attempt, outcome, dt_ms, entropy } => {
                d.now_ms = d.now_ms.saturating_add(*dt_ms);
                let n = d.calls.len() as u32;
                let call_id = match call {
                    CallPick::Latest => n,
                    CallPick::Nth(i) => i % (n + 1),
                    CallPick::Raw(id) => *id,
                };
                let attempt = match attempt {
                    AttemptPick::Current => d.calls.get((call_id as usize).wrapping_sub(1)).map_or(1, |c| c.attempt),
                    AttemptPick::Raw(a) => *a,
                };
                let _ = d.record(call_id, attempt, outcome, *entropy);
            }
            Op::Report => {
                d.steps.push(json!({"op": "report"}));
                d.transcript.push(format!("report {:?}", d.run.report()));
            }
        }
    }
    d.persistent_failure();
    d.steps.push(json!({"op": "report"}));
    d.transcript.push(format!("report {:?}", d.run.report()));
    RunOutput { transcript: d.transcript, steps: d.steps }
}

/// `run`: a decoded case, twice: every invariant on the first pass, and the
/// same transcript on the second (same inputs and entropy, same decisions).
pub fn run(data: &[u8]) {
    let Some(case) = RunCase::decode(data) else { return };
    let first = run_case(&case);
    let second = run_case(&case);
    invariant!(first.transcript == second.transcript, "the same inputs and entropy gave different decisions");
}
