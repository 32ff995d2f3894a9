//! `flat`: the path every wrapper takes through the component's exports, as
//! `guest/src/bindings.rs` implements it: `begin-call`, `record-failure` (the
//! headers one text of `name: value` lines joined by "\n", split by
//! `hints::split_lines`), `record-poll-failure`, `record-success`,
//! `record-empty-result`, `record-status-check`, `record-task-status`, each
//! answered with a lean verdict, then `last-decision` and `report`.
//! `bindings.rs` compiles for wasm32 only, so this drives the same core
//! functions it calls (`Run::begin`, `Run::record_*`, `Run::last_decision`,
//! `hints::split_lines`, `classify::FailureView`), with its verdict mapping
//! restated in [`verdict_action`]. Checked after every step:
//!
//! - `last-decision` agrees with the verdict: the same action, delay, reconnect,
//!   class, attempt, hint, rule and cancel-task, a note exactly when the verdict
//!   says so, and no other call has a last decision; a refused step changes
//!   neither the last decision nor the report;
//! - a retry's delay is the full-jitter draw with the hint as a floor, cut to the
//!   time left, raised only to the account's grant: within `max-delay-ms` unless
//!   it honours a hint within `max-hint-ms` (or the account's wait), never past
//!   the time left; steps, retries and replans stay within their budgets;
//! - a 4xx other than 408 and 429 is never retried as is: only when the server
//!   or the configuration says so (a named rule), or on a new session;
//! - a write that may have applied and has no key is never resent without a
//!   status check; a retry and every effect record keep the call's key;
//! - splitting any header text is bounded: at most 64 headers read, values of
//!   at most 1,024 bytes, trimmed and on one line, problems bounded;
//! - the verdict's class, rule and hint are the classification's;
//! - the same inputs and entropy give the same transcript (the case runs twice).

use std::sync::Arc;

use agent_retry_policy::account::AccountBudget;
use agent_retry_policy::classify::{FailureView, classify_view};
use agent_retry_policy::config::{Config, ONE_YEAR_MS};
use agent_retry_policy::hints::{self, MAX_HEADER_VALUE_BYTES, MAX_HEADERS};
use agent_retry_policy::rules::Rule;
use agent_retry_policy::run::{Act, At, Run, Start, Verdict};
use agent_retry_policy::types::{
    Action, CallRequest, Decision, Delivery, Effect, Failure, FailureKind, Outcome, OutcomeClass, RunError, RunReport, StatusCheckResult, TaskReport,
    TaskStatus, ToolHints, TransportError,
};
use arbitrary::{Arbitrary, Unstructured};
use serde_json::{Value, json};

use crate::run_target::{AttemptPick, CallPick, Scripted, config_json, failure, pick_u64, string_from};
use crate::{DEFAULT_NOW_MS, invariant, nasty, oracle};

/// An observation as a wrapper sends it: the headers are one text.
#[derive(Clone, Debug)]
pub struct Observation {
    pub kind: FailureKind,
    pub headers: String,
    pub body: String,
    pub structured_content: Option<String>,
    pub session_id_sent: bool,
    pub delivery: Delivery,
}

/// What a report says, as the flat exports take it.
#[derive(Clone, Debug)]
pub enum Report {
    Success,
    EmptyResult(String),
    Failure(Observation),
    PollFailure(Observation),
    StatusCheck(StatusCheckResult),
    Task(TaskReport),
}

#[derive(Clone, Debug)]
pub enum FlatOp {
    Begin { request: CallRequest, dt_ms: u64 },
    Record { call: CallPick, attempt: AttemptPick, report: Report, time_left_ms: Option<u64>, dt_ms: u64, entropy: u64 },
    LastDecision { call: CallPick },
    Report,
}

/// One decoded `flat` input.
#[derive(Clone, Debug)]
pub struct FlatCase {
    pub config_text: String,
    pub ops: Vec<FlatOp>,
    pub budget: Vec<u64>,
}

/// Header text as wrappers build it, and as a broken or hostile one might:
/// `name: value` lines joined by "\n" (or "\r\n", blank lines, folded lines,
/// lines without a colon), many lines (past the 64 read), values past 1,024
/// bytes, or any text at all.
fn header_text(u: &mut Unstructured) -> arbitrary::Result<String> {
    match u.choose_index(8)? {
        0 => {
            let s = String::arbitrary(u)?;
            Ok(s.chars().take(4096).collect())
        }
        1 => {
            // Past the 64 headers read: the hint may come first or last.
            let n = pick_u64(u, &[63, 64, 65, 66, 200], 0, 300)? as usize;
            let mut text = String::new();
            let hint_first = bool::arbitrary(u)?;
            if hint_first {
                text.push_str("retry-after: 7\n");
            }
            for i in 0..n {
                text.push_str(&format!("x-filler-{i}: {i}\n"));
            }
            if !hint_first {
                text.push_str("retry-after: 7");
            }
            Ok(text)
        }
        2 => {
            // A value around the 1,024-byte limit, of digits (a hint) or filler.
            let len = pick_u64(u, &[1023, 1024, 1025, 2048], 0, 5000)? as usize;
            let fill = *u.choose(&["9", " ", "x", "é"])?;
            let name = string_from(u, nasty::HEADER_NAMES, 2000)?;
            Ok(format!("{name}: {}\nretry-after-ms: 250", fill.repeat(len)))
        }
        _ => {
            let sep = *u.choose(&["\n", "\n", "\n", "\r\n", "\n\n", "\n \t", " \n"])?;
            let mut lines = Vec::new();
            for _ in 0..u.choose_index(6)? {
                let name = string_from(u, nasty::HEADER_NAMES, 80)?;
                let value = string_from(u, nasty::HEADER_VALUES, 1100)?;
                lines.push(match u.choose_index(8)? {
                    0 => name,                               // no colon
                    1 => format!("{name}:{value}"),          // no space
                    2 => format!("  {name} :  {value}  \t"), // padded
                    3 => format!("{name}: {value}: {value}"),
                    _ => format!("{name}: {value}"),
                });
            }
            Ok(lines.join(sep))
        }
    }
}

fn observation(u: &mut Unstructured) -> arbitrary::Result<Observation> {
    let f = failure(u)?;
    Ok(Observation {
        kind: f.kind,
        headers: header_text(u)?,
        body: f.body,
        structured_content: f.structured_content,
        session_id_sent: f.session_id_sent,
        delivery: f.delivery,
    })
}

fn report(u: &mut Unstructured) -> arbitrary::Result<Report> {
    Ok(match u.choose_index(16)? {
        0 | 1 => Report::Success,
        2 => Report::EmptyResult(string_from(u, &["", "[]", "null"], 2000)?),
        3 | 4 => Report::StatusCheck(*u.choose(&[StatusCheckResult::Found, StatusCheckResult::Absent, StatusCheckResult::Unknown])?),
        5 => Report::Task(TaskReport {
            task_id: string_from(u, &["t-1", "t-2", ""], 300)?,
            status: *u.choose(&[TaskStatus::Working, TaskStatus::InputAnswered, TaskStatus::InputRequired, TaskStatus::Cancelled])?,
            poll_interval_ms: if u.ratio(1, 3)? { None } else { Some(pick_u64(u, &[0, 1, 1000, 120_000], 0, u64::MAX)?) },
            ttl_ms: if u.ratio(1, 2)? { None } else { Some(pick_u64(u, &[0, 1000, 300_000], 0, u64::MAX)?) },
            age_ms: if u.ratio(1, 2)? { None } else { Some(pick_u64(u, &[0, 999, 299_999], 0, u64::MAX)?) },
            message: string_from(u, &["", "working"], 300)?,
        }),
        6 => Report::PollFailure(observation(u)?),
        _ => Report::Failure(observation(u)?),
    })
}

fn call_pick(u: &mut Unstructured) -> arbitrary::Result<CallPick> {
    Ok(match u.choose_index(8)? {
        0 => CallPick::Nth(u32::arbitrary(u)?),
        1 => CallPick::Raw(u32::arbitrary(u)?),
        _ => CallPick::Latest,
    })
}

impl FlatCase {
    /// Reads a case from fuzz bytes (`None` if they run out before the configuration).
    pub fn decode(data: &[u8]) -> Option<FlatCase> {
        let mut u = Unstructured::new(data);
        let config_text = config_json(&mut u).ok()?.to_string();
        let budget: Vec<u64> = (0..u.choose_index(8).unwrap_or(0)).map(|_| u64::arbitrary(&mut u).unwrap_or(0)).collect();
        let mut ops = Vec::new();
        while !u.is_empty() && ops.len() < 64 {
            let op = (|| -> arbitrary::Result<FlatOp> {
                let dt_ms = pick_u64(&mut u, &[0, 1, 1000, 60_000], 0, ONE_YEAR_MS)?;
                Ok(match u.choose_index(12)? {
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
                        FlatOp::Begin { request: CallRequest { server: None, tool, idempotency_key, hints }, dt_ms }
                    }
                    3..=9 => {
                        let call = call_pick(&mut u)?;
                        let attempt = if u.ratio(9, 10)? { AttemptPick::Current } else { AttemptPick::Raw(u32::arbitrary(&mut u)?) };
                        let time_left_ms = if u.ratio(2, 3)? { None } else { Some(pick_u64(&mut u, &[0, 1, 500, 30_000], 0, ONE_YEAR_MS)?) };
                        let entropy = if u.ratio(1, 4)? { *u.choose(&[0, u64::MAX, 1 << 63, 1])? } else { u64::arbitrary(&mut u)? };
                        FlatOp::Record { call, attempt, report: report(&mut u)?, time_left_ms, dt_ms, entropy }
                    }
                    10 => FlatOp::LastDecision { call: call_pick(&mut u)? },
                    _ => FlatOp::Report,
                })
            })();
            match op {
                Ok(op) => ops.push(op),
                Err(_) => break,
            }
        }
        Some(FlatCase { config_text, ops, budget })
    }
}

/// The verdict as `bindings.rs` hands it to a wrapper: the action's kind, its
/// delay and whether it needs a new session first.
pub fn verdict_action(v: &Verdict) -> (&'static str, u64, bool) {
    match v.act {
        Act::Retry { delay_ms, reconnect, .. } => ("retry", delay_ms, reconnect),
        Act::Replan => ("replan", 0, false),
        Act::CheckStatus => ("check-status", 0, false),
        Act::Succeed => ("succeed", 0, false),
        Act::Escalate => ("escalate", 0, false),
        Act::Poll { delay_ms, reconnect } => ("poll", delay_ms, reconnect),
    }
}

/// The same, read from a worded decision.
fn decision_action(d: &Decision) -> (&'static str, u64, bool) {
    match &d.action {
        Action::Retry(p) => ("retry", p.delay_ms, p.reconnect),
        Action::Replan(_) => ("replan", 0, false),
        Action::CheckStatus => ("check-status", 0, false),
        Action::Succeed(_) => ("succeed", 0, false),
        Action::Escalate(_) => ("escalate", 0, false),
        Action::Poll(p) => ("poll", p.delay_ms, p.reconnect),
    }
}

/// Splitting `text` as `record-failure` does, checked: every non-blank line is
/// one header, and what the policy reads of them is bounded.
pub fn check_header_split(text: &str) {
    let pairs = hints::split_lines(text);
    let lines = text.split('\n').filter(|l| !l.trim_ascii().is_empty()).count();
    invariant!(pairs.len() == lines, "{} headers from {lines} non-blank lines", pairs.len());
    for (name, value) in &pairs {
        invariant!(!name.contains('\n') && !value.contains('\n') && !name.contains(':'), "header {name:?}: {value:?} spans lines or splits badly");
    }
    let (kept, problems) = hints::within_limits(&pairs);
    let first = pairs.len().min(MAX_HEADERS);
    let too_long = pairs[..first].iter().filter(|(_, v)| v.len() > MAX_HEADER_VALUE_BYTES).count();
    invariant!(kept.len() == first - too_long, "{} headers read of {} ({too_long} over {MAX_HEADER_VALUE_BYTES} bytes)", kept.len(), pairs.len());
    for (name, value) in kept.iter() {
        invariant!(value.len() <= MAX_HEADER_VALUE_BYTES, "a header value of {} bytes read", value.len());
        invariant!(name.trim_ascii() == *name && value.trim_ascii() == *value, "header {name:?}: {value:?} read untrimmed");
    }
    let expected = too_long + usize::from(pairs.len() > MAX_HEADERS);
    invariant!(problems.len() == expected, "{} header problems, {expected} expected", problems.len());
    for p in &problems {
        invariant!(
            p.name.len() <= 64 && p.value.chars().count() <= oracle::MAX_PROBLEM_VALUE_CHARS && p.problem.len() <= 200 && !p.problem.contains('\n'),
            "header problem unbounded: {} / {} / {} bytes",
            p.name.len(),
            p.value.len(),
            p.problem.len()
        );
    }
}

/// Whether the header text says `x-should-retry: true` among the headers read.
fn says_should_retry(text: &str) -> bool {
    let pairs = hints::split_lines(text);
    pairs.iter().take(MAX_HEADERS).any(|(n, v)| n.eq_ignore_ascii_case("x-should-retry") && v.eq_ignore_ascii_case("true"))
}

#[derive(Clone, Debug)]
struct FlatCall {
    tool: String,
    key: Option<String>,
    safe_to_repeat: bool,
    attempt: u32,
}

struct Driver {
    config: Arc<Config>,
    run: Run,
    budget: Scripted,
    now_ms: u64,
    calls: Vec<FlatCall>,
    /// The call the run's last decision is about (1-based), if any.
    last_call: Option<u32>,
    waits: u32,
    waited_ms: u128,
    transcript: Vec<String>,
    steps: Vec<Value>,
}

impl Driver {
    fn last(&self) -> Option<(u32, String)> {
        self.last_call.map(|id| (id, format!("{:?}", self.run.last_decision(id))))
    }

    fn check_report(&self, r: &RunReport, context: &str) {
        let c = &self.config;
        let steps = u64::from(r.attempts) + u64::from(r.status_checks);
        invariant!(steps <= u64::from(c.max_steps_per_run), "{steps} steps, max-steps-per-run {} ({context})", c.max_steps_per_run);
        invariant!(r.retries <= c.max_retries_per_run, "{} retries of {} ({context})", r.retries, c.max_retries_per_run);
        invariant!(r.replans <= c.max_replans_per_run, "{} replans of {} ({context})", r.replans, c.max_replans_per_run);
        invariant!(
            r.waits == self.waits && u128::from(r.waited_ms) == self.waited_ms,
            "report waits {}/{} ms vs {}/{} ms given ({context})",
            r.waits,
            r.waited_ms,
            self.waits,
            self.waited_ms
        );
        for e in self.run.effects_page(0, u32::MAX) {
            let key = self.calls.get((e.call_id as usize).wrapping_sub(1)).map(|c| &c.key);
            invariant!(key == Some(&e.idempotency_key), "effect of call {} with key {:?}, begun with {key:?} ({context})", e.call_id, e.idempotency_key);
        }
    }

    fn note_wait(&mut self, delay_ms: u64) {
        if delay_ms > 0 {
            self.waits += 1;
            self.waited_ms += u128::from(delay_ms);
        }
    }

    fn begin(&mut self, request: &CallRequest) {
        let before = (self.run.report(), self.last());
        self.budget.last_grant = 0;
        let result = self.run.begin(
            request.server.clone(),
            request.tool.clone(),
            request.idempotency_key.clone(),
            request.hints.as_ref(),
            self.now_ms,
            &mut self.budget,
        );
        self.steps.push(json!({"op": "begin-call", "call": serde_json::to_value(request).unwrap_or(Value::Null), "now-ms": self.now_ms}));
        self.transcript.push(format!("begin {result:?}"));
        let context = format!("begin-call {} of {:?}", self.calls.len() + 1, request.tool);
        match result {
            Err(e) => invariant!((self.run.report(), self.last()) == before, "a refused begin-call changed the run: {e:?} ({context})"),
            Ok(Start::Escalated) => invariant!(self.run.escalation().is_some(), "begin-call escalated with no hand-off ({context})"),
            // The fuzzed calls name no server: no breaker applies.
            Ok(Start::Replan(id)) => panic!("broken invariant: call {id} refused by a breaker without a server ({context})"),
            Ok(Start::Send(t)) => {
                invariant!(t.call_id as usize == self.calls.len() + 1, "call id {} for call {} ({context})", t.call_id, self.calls.len() + 1);
                invariant!(t.delay_ms == self.budget.last_grant, "ticket delay {} vs the account's grant {} ({context})", t.delay_ms, self.budget.last_grant);
                let policy = self.config.tool_policy(&request.tool, request.hints.as_ref());
                let safe = policy.effect != Effect::Write || policy.idempotent || request.idempotency_key.is_some();
                invariant!(t.safe_to_repeat == safe && t.effect == policy.effect, "ticket {t:?} vs policy {policy:?} ({context})");
                self.note_wait(t.delay_ms);
                self.calls.push(FlatCall { tool: request.tool.clone(), key: request.idempotency_key.clone(), safe_to_repeat: t.safe_to_repeat, attempt: 1 });
            }
        }
        self.check_report(&self.run.report(), &context);
    }

    fn record(&mut self, call_id: u32, attempt: u32, report: &Report, time_left_ms: Option<u64>, entropy: u64) {
        let before = (self.run.report(), self.last());
        self.budget.last_grant = 0;
        let at = At { now_ms: self.now_ms, time_left_ms, entropy };
        let budget: &mut dyn AccountBudget = &mut self.budget;
        // As bindings.rs: the header text split into pairs the view borrows.
        let with_view = |o: &Observation, f: &mut dyn FnMut(&FailureView<'_>) -> Result<Verdict, RunError>| {
            check_header_split(&o.headers);
            let pairs = hints::split_lines(&o.headers);
            let view = FailureView {
                kind: &o.kind,
                headers: &pairs,
                body: &o.body,
                structured_content: o.structured_content.as_deref(),
                session_id_sent: o.session_id_sent,
                delivery: o.delivery,
            };
            f(&view)
        };
        let run = &mut self.run;
        let result = match report {
            Report::Success => run.record_success(call_id, attempt, at.now_ms, budget),
            Report::EmptyResult(detail) => run.record_empty_result(call_id, attempt, detail, at.now_ms, budget),
            Report::StatusCheck(r) => run.record_status_check(call_id, attempt, *r, at, budget),
            Report::Task(t) => run.record_task_status(call_id, attempt, t, at, budget),
            Report::Failure(o) => with_view(o, &mut |view| run.record_failure(call_id, attempt, view, at, budget)),
            Report::PollFailure(o) => with_view(o, &mut |view| run.record_poll_failure(call_id, attempt, view, at, budget)),
        };
        let mut step = json!({
            "op": "record-outcome", "call-id": call_id, "attempt": attempt, "outcome": outcome_json(report), "now-ms": self.now_ms, "entropy": entropy,
        });
        if let Some(left) = time_left_ms {
            step["time-left-ms"] = json!(left);
        }
        self.steps.push(step);
        self.transcript.push(format!("record {result:?}"));
        let context = format!("record of call {call_id} attempt {attempt}: {}", report_name(report));
        let v = match result {
            Err(e) => {
                invariant!((self.run.report(), self.last()) == before, "a refused record changed the run or its last decision: {e:?} ({context})");
                if let RunError::RunEnded(reason) = e {
                    invariant!(before.0.escalation == Some(reason), "run-ended({reason:?}) in a run escalated for {:?} ({context})", before.0.escalation);
                }
                return;
            }
            Ok(v) => v,
        };
        let c = Arc::clone(&self.config);
        let index = call_id as usize - 1;
        let call = self.calls[index].clone();
        invariant!(v.attempt == call.attempt, "verdict for attempt {} of a call at attempt {} ({context})", v.attempt, call.attempt);
        self.last_call = Some(call_id);
        self.check_last_decision(call_id, &v, &call, &context);
        let (kind, delay_ms, reconnect) = verdict_action(&v);
        if let Some(hint) = v.hint_ms {
            invariant!(hint <= c.max_plausible_hint_ms, "hint {hint} above max-plausible-hint-ms ({context})");
        }
        if let Report::Failure(o) | Report::PollFailure(o) = report
            && !matches!(v.rule, Rule::StatusCheck | Rule::TaskStatus)
        {
            let pairs = hints::split_lines(&o.headers);
            let view = FailureView {
                kind: &o.kind,
                headers: &pairs,
                body: &o.body,
                structured_content: o.structured_content.as_deref(),
                session_id_sent: o.session_id_sent,
                delivery: o.delivery,
            };
            let classified = classify_view(&view, &c, Some(&call.tool), self.now_ms);
            if matches!(report, Report::Failure(_)) {
                invariant!(
                    (v.class, v.rule, v.hint_ms) == (classified.class, classified.rule, classified.hint_ms),
                    "verdict {:?}/{:?}/{:?} vs classification {:?}/{:?}/{:?} ({context})",
                    v.class,
                    v.rule,
                    v.hint_ms,
                    classified.class,
                    classified.rule,
                    classified.hint_ms
                );
            }
        }
        match v.act {
            Act::Retry { attempt: next, .. } => {
                invariant!(matches!(v.class, OutcomeClass::Transient | OutcomeClass::Throttled), "a retry of a {:?} outcome ({context})", v.class);
                invariant!(next == call.attempt + 1 && next <= c.max_attempts_per_call, "retry to attempt {next} of {} ({context})", c.max_attempts_per_call);
                let hint = v.hint_ms.unwrap_or(0);
                invariant!(hint <= c.max_hint_ms, "a retry honours a hint of {hint} ms above max-hint-ms {} ({context})", c.max_hint_ms);
                let mut drawn = oracle::delay_ms(c.base_delay_ms, c.max_delay_ms, v.attempt, v.hint_ms, entropy);
                if let Some(left) = time_left_ms {
                    drawn = drawn.min(left);
                }
                let expected = drawn.max(self.budget.last_grant);
                invariant!(delay_ms == expected, "retry delay {delay_ms} ms, expected {expected} (draw {drawn}, grant {}) ({context})", self.budget.last_grant);
                let max_wait = c.account_budget.as_ref().map_or(0, |a| a.max_wait_ms);
                invariant!(
                    delay_ms <= oracle::ceiling_ms(c.base_delay_ms, c.max_delay_ms, v.attempt).max(hint).max(max_wait),
                    "delay {delay_ms} above max-delay-ms, the hint and the account's wait ({context})"
                );
                if let Some(left) = time_left_ms {
                    invariant!(delay_ms <= left, "a retry after {delay_ms} ms with {left} ms left ({context})");
                }
                if let Report::Failure(o) = report {
                    self.check_retry_allowed(o, &v, reconnect, &call, &context);
                }
                self.calls[index].attempt = next;
                self.note_wait(delay_ms);
            }
            Act::Poll { .. } => self.note_wait(delay_ms),
            _ => {}
        }
        invariant!(kind != "check-status" || (!call.safe_to_repeat && v.class == OutcomeClass::Transient), "check-status on {call:?} ({context})");
        self.check_report(&self.run.report(), &context);
    }

    /// A 4xx is not retried as is, and a write that may have applied without a
    /// key is not resent without a status check.
    fn check_retry_allowed(&self, o: &Observation, v: &Verdict, reconnect: bool, call: &FlatCall, context: &str) {
        if let FailureKind::HttpStatus(status @ 400..=499) = o.kind
            && status != 408
            && status != 429
        {
            let said = match v.rule {
                Rule::ConfigStatusOverrides => {
                    self.config.status_overrides.iter().any(|(s, class)| *s == status && matches!(class, OutcomeClass::Transient | OutcomeClass::Throttled))
                }
                Rule::ShouldRetry => says_should_retry(&o.headers),
                Rule::PayloadTooLargeRetryAfter => status == 413,
                Rule::AwsErrorCode | Rule::GrpcStatus | Rule::EnvoyOverloaded => true,
                Rule::LostSession | Rule::VersionMismatch => reconnect,
                _ => false,
            };
            invariant!(said, "a {status} retried by rule {:?}, reconnect {reconnect} ({context})", v.rule);
        }
        if !call.safe_to_repeat {
            let not_run = matches!(o.kind, FailureKind::Transport(TransportError::ConnectionRefused))
                || (matches!(o.kind, FailureKind::Transport(_)) && o.delivery == Delivery::NotSent)
                || v.class == OutcomeClass::Throttled
                || reconnect;
            invariant!(not_run, "an unkeyed write that may have applied resent without a status check: {:?} ({context})", o.kind);
        }
    }

    fn check_last_decision(&self, call_id: u32, v: &Verdict, call: &FlatCall, context: &str) {
        let Some(d) = self.run.last_decision(call_id) else { panic!("broken invariant: no last-decision after a verdict ({context})") };
        invariant!(decision_action(&d) == verdict_action(v), "last-decision {:?} vs verdict {:?} ({context})", decision_action(&d), verdict_action(v));
        invariant!(
            (d.class, d.attempt, d.hint_ms, d.rule.as_str(), d.cancel_task) == (v.class, v.attempt, v.hint_ms, v.rule.name(), v.cancel_task),
            "last-decision {d:?} vs verdict {v:?} ({context})"
        );
        let has_note = matches!(d.action, Action::Replan(_) | Action::Escalate(_) | Action::Succeed(Some(_)));
        invariant!(has_note == v.has_note, "verdict has-note {} for {:?} ({context})", v.has_note, d.action);
        if let Action::Retry(plan) = &d.action {
            invariant!(plan.idempotency_key == call.key, "a retry changed the key: {:?} to {:?} ({context})", call.key, plan.idempotency_key);
            invariant!(
                matches!(v.act, Act::Retry { attempt, .. } if attempt == plan.attempt),
                "retry plan attempt {} vs verdict {v:?} ({context})",
                plan.attempt
            );
        }
        for other in [0, call_id.wrapping_sub(1), call_id.wrapping_add(1)] {
            if other != call_id {
                invariant!(self.run.last_decision(other).is_none(), "call {other} has a last decision after call {call_id}'s ({context})");
            }
        }
    }
}

fn report_name(report: &Report) -> &'static str {
    match report {
        Report::Success => "success",
        Report::EmptyResult(_) => "empty-result",
        Report::Failure(_) => "failure",
        Report::PollFailure(_) => "poll-failure",
        Report::StatusCheck(_) => "status-check",
        Report::Task(_) => "task-status",
    }
}

/// The report as a conformance step's outcome: the headers as the pairs the
/// component's `split_lines` gives back from the text the host joins.
fn outcome_json(report: &Report) -> Value {
    let failure = |o: &Observation| Failure {
        kind: o.kind,
        headers: hints::split_lines(&o.headers).into_iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
        body: o.body.clone(),
        structured_content: o.structured_content.clone(),
        session_id_sent: o.session_id_sent,
        delivery: o.delivery,
    };
    let outcome = match report {
        Report::Success => Outcome::Success,
        Report::EmptyResult(d) => Outcome::EmptyResult(d.clone()),
        Report::Failure(o) => Outcome::Failure(failure(o)),
        Report::PollFailure(o) => Outcome::PollFailure(failure(o)),
        Report::StatusCheck(r) => Outcome::StatusCheck(*r),
        Report::Task(t) => Outcome::Task(t.clone()),
    };
    serde_json::to_value(outcome).unwrap_or(Value::Null)
}

/// The result of one pass: every answer, and the conformance steps taken.
pub struct FlatOutput {
    pub transcript: Vec<String>,
    pub steps: Vec<Value>,
}

/// Runs a decoded case once, checking every answer.
pub fn flat_case(case: &FlatCase) -> FlatOutput {
    let config = Config::from_json(&case.config_text).unwrap_or_else(|e| panic!("broken invariant: a valid configuration refused: {e:?}"));
    let config = Arc::new(config);
    let run = Run::start(Arc::clone(&config), "run-1").expect("run-1 starts");
    let mut d = Driver {
        config,
        run,
        budget: Scripted::new(case.budget.clone()),
        now_ms: DEFAULT_NOW_MS,
        calls: Vec::new(),
        last_call: None,
        waits: 0,
        waited_ms: 0,
        transcript: Vec::new(),
        steps: vec![json!({"op": "load-policy", "config-text": case.config_text}), json!({"op": "start-run", "run-id": "run-1"})],
    };
    let pick = |d: &Driver, call: &CallPick| {
        let n = d.calls.len() as u32;
        match call {
            CallPick::Latest => n,
            CallPick::Nth(i) => i % (n + 1),
            CallPick::Raw(id) => *id,
        }
    };
    for op in &case.ops {
        match op {
            FlatOp::Begin { request, dt_ms } => {
                d.now_ms = d.now_ms.saturating_add(*dt_ms);
                d.begin(request);
            }
            FlatOp::Record { call, attempt, report, time_left_ms, dt_ms, entropy } => {
                d.now_ms = d.now_ms.saturating_add(*dt_ms);
                let call_id = pick(&d, call);
                let attempt = match attempt {
                    AttemptPick::Current => d.calls.get((call_id as usize).wrapping_sub(1)).map_or(1, |c| c.attempt),
                    AttemptPick::Raw(a) => *a,
                };
                d.record(call_id, attempt, report, *time_left_ms, *entropy);
            }
            FlatOp::LastDecision { call } => {
                let call_id = pick(&d, call);
                let decision = d.run.last_decision(call_id);
                invariant!(decision.is_none() || d.last_call == Some(call_id), "last-decision for call {call_id}, the last decided is {:?}", d.last_call);
                d.transcript.push(format!("last-decision {decision:?}"));
            }
            FlatOp::Report => {
                d.steps.push(json!({"op": "report"}));
                d.transcript.push(format!("report {:?}", d.run.report()));
            }
        }
    }
    d.steps.push(json!({"op": "report"}));
    d.transcript.push(format!("report {:?}", d.run.report()));
    FlatOutput { transcript: d.transcript, steps: d.steps }
}

/// `flat`: a decoded case, twice: every invariant on the first pass, and the
/// same transcript on the second.
pub fn flat(data: &[u8]) {
    let Some(case) = FlatCase::decode(data) else { return };
    let first = flat_case(&case);
    let second = flat_case(&case);
    invariant!(first.transcript == second.transcript, "the same inputs and entropy gave different verdicts");
}
