//! One agent run: its calls, its budgets and the effects it made.
//!
//! The host drives it: `begin` before a call's first attempt, a report after
//! every attempt (`record_success`, `record_empty_result`, `record_failure`)
//! and after every status check (`record_status_check`). Each answer says what to do
//! next. Budgets, checked in this order when a retry is due
//! (narrowest first, so the reason names the most specific limit):
//! - `max-attempts-per-call`: attempts of one call, the first included;
//! - `max-retries-per-run`: retries of all calls in the run;
//! - `max-steps-per-run` (the step budget): attempts plus status checks;
//! - `max-replans-per-run`: errors shown to the model.
//!
//! Any escalation ends the run: later calls get `RunError::RunEnded`.
//!
//! A call the server answers with a task (MCP 2026-07-28 Tasks extension) is
//! polled (`record_task_status`, `record_poll_failure`): polls are neither
//! attempts nor steps, and have their own budgets (`max-polls-per-task`,
//! `max-task-wait-ms`). The tool is never called again while its task lives;
//! the task's end is reported as the attempt's outcome.
//!
//! A decision is made lean ([`Verdict`]): no prose, no copy of what the host
//! passed beyond the failure's body. Its words (the reason, a replan's message,
//! a note) are built only when asked for ([`Run::last_decision`]), since most
//! retry loops never read them.

use alloc::boxed::Box;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::account::AccountBudget;
use crate::backoff::{ceiling_ms, full_jitter, next_delay_ms};
use crate::breaker::{self, Admit, BreakerChange};
use crate::budget::{self, Spend};
use crate::cat::{cat, cat_to};
use crate::chunked::Chunked;
use crate::classify::{Classified, FailureView, classify_view, failure_label, is_ambiguous};
use crate::config::{BreakerConfig, Config, ToolPolicy, WhenOpen};
use crate::escalation::{self, StopPoint};
use crate::rules::Rule;
use crate::text::excerpt;

#[path = "run/resume.rs"]
mod resume;

/// The most effects `Run::effects_page` returns in one call.
pub const MAX_EFFECTS_PAGE: usize = 1000;
use crate::config::OnTaskCancelled;
use crate::types::{
    AbandonReason, Action, AttemptMismatch, CallTicket, Decision, Effect, EffectRecord, EffectStatus, Escalation, EscalationReason, FailureKind, OutcomeClass,
    PollPlan, RetryPlan, RunError, RunReport, SizeLimit, StatusCheckResult, StatusCount, TaskReport, TaskStatus, ToolHints,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// An attempt is out; its outcome is due.
    Sending,
    /// A status check is due; it remembers the failure that asked for it.
    CheckingStatus { class: OutcomeClass, hint_ms: Option<u64> },
    /// Succeeded, replanned or escalated.
    Finished,
}

/// The task that answered a call's attempt, while it lives.
#[derive(Clone, Debug)]
struct Task {
    /// The call's index in the run.
    call: u32,
    id: String,
    /// Polls decided so far.
    polls: u32,
    /// Polls that failed in a row.
    failed_polls: u32,
    /// The sum of the poll waits decided, in ms.
    waited_ms: u64,
    /// When the task was first reported (host clock, ms): the polls' time
    /// counts from here, whether it passed in waits or in slow answers.
    first_at_ms: u64,
    /// When the task's time to live ends (host clock, ms), from the latest
    /// report that gave `ttl-ms`: kept, so that a poll after a failed poll is
    /// still bounded by it.
    expires_at_ms: Option<u64>,
}

/// What the call's last failed attempt returned; its text is in `Call::last_text`.
#[derive(Clone, Debug)]
enum LastError {
    Failure(FailureKind),
    EmptyResult,
    /// What the call's task last said (its text names the task).
    Task,
}

#[derive(Clone, Debug)]
struct Call {
    tool: String,
    key: Option<String>,
    policy: ToolPolicy,
    /// The attempt now out (or last out), 1-based.
    attempt: u32,
    phase: Phase,
    last_error: Option<LastError>,
    /// The last failure's body (or an empty result's detail), kept as given
    /// and excerpted only for a message or a note. The buffer is reused.
    last_text: String,
    /// Retry-quota tokens the call's last retry took (refunded if it then succeeds).
    quota_taken: u32,
    /// The call's place in `Run::effects`, if it has an effect there: finding it
    /// is O(1), so a run's cost grows linearly with its effects.
    effect_index: Option<u32>,
    /// Whether the server already refused the client's MCP revision once for
    /// this call: a second refusal means they share none.
    version_refused: bool,
    /// The breakers this call probes (bit 0: the server's, bit 1: the tool's),
    /// until its first answer decides them.
    probes: u8,
    /// The server the call went to, for its breakers (none: no breaker applies).
    server: Option<Box<str>>,
}

impl Call {
    fn new(server: Option<Box<str>>, tool: String, key: Option<String>, policy: ToolPolicy, probes: u8) -> Call {
        Call {
            tool,
            key,
            policy,
            attempt: 1,
            phase: Phase::Sending,
            last_error: None,
            last_text: String::new(),
            quota_taken: 0,
            effect_index: None,
            version_refused: false,
            probes,
            server,
        }
    }

    /// Whether a failed attempt may be repeated without first reading state.
    fn safe_to_repeat(&self) -> bool {
        self.policy.effect != Effect::Write || self.policy.idempotent || self.key.is_some()
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    attempts: u32,
    retries: u32,
    status_checks: u32,
    replans: u32,
    succeeded_calls: u32,
    waits: u32,
    waited_ms: u64,
}

/// What the host must do, without the text it may carry (the contract's
/// `action-kind`, with a retry's plan).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    /// `reconnect`: a new session first (the server lost it, or refused the revision).
    Retry {
        delay_ms: u64,
        attempt: u32,
        reconnect: bool,
    },
    Replan,
    CheckStatus,
    Succeed,
    Escalate,
    /// Poll the call's task after `delay_ms`.
    Poll {
        delay_ms: u64,
        reconnect: bool,
    },
}

/// A decision without its prose: the contract's `verdict`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub act: Act,
    pub class: OutcomeClass,
    /// The attempt this decision answers.
    pub attempt: u32,
    pub hint_ms: Option<u64>,
    pub rule: Rule,
    /// Whether the action carries text: a replan's message, a note, an escalation.
    pub has_note: bool,
    /// Whether the host must cancel the call's task before it acts.
    pub cancel_task: bool,
}

/// How a call's first attempt was admitted, lean (the escalation stays in the run).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    Send(CallTicket),
    Escalated,
    /// Not sent (a breaker is open): the call is over as a replan; its id.
    Replan(u32),
}

/// The first part of a decision's reason: what the outcome was.
#[derive(Clone, Debug)]
enum Basis {
    Fixed(&'static str),
    Failure(Classified),
}

/// The second part of a decision's reason: what the run made of it.
#[derive(Clone, Copy, Debug)]
enum Step {
    Done,
    Retry {
        retry: u32,
        of: u32,
        delay_ms: u64,
        account_wait_ms: Option<u64>,
    },
    Replan {
        replan: u32,
        of: u32,
    },
    CheckStatus,
    DeleteGone,
    Escalate(EscalationReason),
    Poll {
        poll: u32,
        delay_ms: u64,
    },
    TaskCancelled,
    /// A breaker stopped the call: the model is told, or a person.
    CircuitOpen(Down),
}

/// The run's last decision, kept so that its words can be built on demand.
#[derive(Clone, Debug)]
struct Last {
    index: usize,
    verdict: Verdict,
    basis: Basis,
    step: Step,
}

/// A report as the run reads it, borrowed from the host's arguments.
enum Reported<'a> {
    Success,
    EmptyResult(&'a str),
    Failure(&'a FailureView<'a>),
    StatusCheck(StatusCheckResult),
    Task(&'a TaskReport),
    PollFailure(&'a FailureView<'a>),
}

/// What failed, for the decision about it.
struct Failed {
    class: OutcomeClass,
    hint_ms: Option<u64>,
    rule: Rule,
    basis: Basis,
}

/// When a report is made, and what a retry it decides may take: the host's
/// clock, the time left to the call's or the run's deadline (if the host has
/// one), and the entropy of a retry's jitter.
#[derive(Clone, Copy, Debug)]
pub struct At {
    pub now_ms: u64,
    pub time_left_ms: Option<u64>,
    pub entropy: u64,
}

impl At {
    /// A report at `now_ms`, with no deadline and no jitter to draw.
    pub fn now(now_ms: u64) -> At {
        At { now_ms, time_left_ms: None, entropy: 0 }
    }
}

/// What a retry may take, beyond the run's budgets.
#[derive(Clone, Copy)]
struct Bounds {
    /// The time left to the call's or the run's deadline, if the host has one.
    time_left_ms: Option<u64>,
    /// Whether the retry needs a new session first.
    reconnect: bool,
    /// A breaker of the call's server that is open (or probing): no retry goes.
    down: Option<Down>,
}

/// An open breaker that stops a call: until when, by the store's clock, and
/// whether it is the tool's own (else the server's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Down {
    until_ms: u64,
    now_ms: u64,
    tool_level: bool,
}

/// What most runs never have, allocated at the first: their tasks (the live
/// ones, and what the report counts) and the calls the host abandoned.
#[derive(Clone, Debug, Default)]
struct Rare {
    live: Vec<Task>,
    /// Calls answered by a task.
    tasks: u32,
    /// Polls decided.
    polls: u32,
    /// Calls the host stopped (`abandon-call`).
    abandoned_calls: u32,
    /// The breakers' changes the last `begin` or report made.
    breaker_changes: Vec<BreakerChange>,
    /// The call whose failure escalated the run (its index), for a snapshot.
    stopped: Option<u32>,
    /// The call `begin` refused when it escalated the run, for a snapshot:
    /// a person may answer `retry` and it is begun then.
    pending: Option<Call>,
    /// The stopped call and what to do with it, after a resume.
    resumed: Option<crate::types::ResumedCall>,
}

/// One agent run.
#[derive(Clone, Debug)]
pub struct Run {
    config: Arc<Config>,
    /// Boxed slices, not a `String` and a `Vec`: 4 bytes less each on wasm32,
    /// which keep a run within 128 bytes (see `bindings.rs`).
    run_id: Box<str>,
    /// In chunks (`chunked.rs`): a long run never copies all its calls.
    calls: Chunked<Call>,
    counters: Counters,
    /// Attempts per HTTP status, ascending by status.
    statuses: Box<[StatusCount]>,
    /// The effects made, in order: the call's index and status (the record
    /// names the call's tool and key, built only when a host asks).
    effects: Vec<(u32, EffectStatus)>,
    escalation: Option<EscalationReason>,
    /// The hand-off, once the run has escalated. Boxed, as `last`: a run in
    /// flight that has decided nothing holds a pointer, not the record (100,000
    /// runs must fit in one instance's 64 MiB).
    escalated: Option<Box<Escalation>>,
    /// The last decision; its box, allocated at the run's first decision, is
    /// reused by every later one.
    last: Option<Box<Last>>,
    /// Its tasks and abandoned calls ([`Rare`]), allocated at the first: most runs have none, and a run
    /// whose record grew past 128 bytes on wasm32 would take a 256-byte block
    /// (100,000 runs in flight must fit in one instance's 64 MiB).
    rare: Option<Box<Rare>>,
    /// A finished call's text buffer, if small, for the next call that fails:
    /// a run of calls that each fail once allocates one buffer, not one a call.
    spare_text: String,
}

/// The largest buffer a run keeps as its spare (bytes of capacity): a run
/// keeps at most one, so a small one costs little and a large one is freed.
const MAX_SPARE_TEXT_BYTES: usize = 1024;

impl Run {
    /// A run, or `too-large` for a run id longer than [`crate::types::MAX_ID_BYTES`].
    pub fn start(config: Arc<Config>, run_id: &str) -> Result<Run, RunError> {
        SizeLimit::check("run-id", run_id)?;
        Ok(Run::new(config, run_id))
    }

    pub fn new(config: Arc<Config>, run_id: &str) -> Run {
        Run {
            config,
            run_id: Box::from(run_id),
            calls: Chunked::default(),
            counters: Counters::default(),
            statuses: Box::default(),
            effects: Vec::new(),
            escalation: None,
            escalated: None,
            last: None,
            rare: None,
            spare_text: String::new(),
        }
    }

    /// The live task of call `index`, if any.
    fn task(&self, index: usize) -> Option<&Task> {
        self.rare.as_ref()?.live.iter().find(|t| t.call as usize == index)
    }

    fn task_mut(&mut self, index: usize) -> Option<&mut Task> {
        self.rare.as_mut()?.live.iter_mut().find(|t| t.call as usize == index)
    }

    /// Ends call `index`'s task, if it has one; whether it had.
    fn end_task(&mut self, index: usize) -> bool {
        let Some(book) = self.rare.as_mut() else { return false };
        let before = book.live.len();
        book.live.retain(|t| t.call as usize != index);
        book.live.len() != before
    }

    fn effects_total(&self) -> u32 {
        u32::try_from(self.effects.len()).unwrap_or(u32::MAX)
    }

    /// The effects from the `start`-th, at most `max_count` (and [`MAX_EFFECTS_PAGE`]).
    pub fn effects_page(&self, start: u32, max_count: u32) -> Vec<EffectRecord> {
        let start = (start as usize).min(self.effects.len());
        let count = (max_count as usize).min(MAX_EFFECTS_PAGE);
        self.effects[start..].iter().take(count).map(|e| self.effect_record(*e)).collect()
    }

    fn effect_record(&self, (index, status): (u32, EffectStatus)) -> EffectRecord {
        let call = &self.calls[index as usize];
        EffectRecord { call_id: index + 1, tool: call.tool.clone(), idempotency_key: call.key.clone(), status }
    }

    /// The effects as a report or an escalation lists them ([`escalation::bounded`]).
    fn bounded_effects(&self) -> Vec<EffectRecord> {
        escalation::bounded(&self.effects).into_iter().map(|e| self.effect_record(e)).collect()
    }

    /// Steps taken: attempts sent plus status checks asked for.
    fn steps(&self) -> u32 {
        self.counters.attempts.saturating_add(self.counters.status_checks)
    }

    fn ensure_open(&self) -> Result<(), RunError> {
        match self.escalation {
            Some(reason) => Err(RunError::RunEnded(reason)),
            None => Ok(()),
        }
    }

    fn call_index(&self, call_id: u32) -> Result<usize, RunError> {
        let index = (call_id as usize).wrapping_sub(1);
        match self.calls.get(index) {
            None => Err(RunError::UnknownCall(call_id)),
            Some(call) if call.phase == Phase::Finished => Err(RunError::CallFinished(call_id)),
            Some(_) => Ok(index),
        }
    }

    fn note_wait(&mut self, delay_ms: u64) {
        if delay_ms > 0 {
            self.counters.waits = self.counters.waits.saturating_add(1);
            self.counters.waited_ms = self.counters.waited_ms.saturating_add(delay_ms);
        }
    }

    fn set_effect(&mut self, index: usize, status: Option<EffectStatus>) {
        let position = self.calls[index].effect_index.map(|i| i as usize);
        match (position, status) {
            (Some(i), Some(status)) => self.effects[i].1 = status,
            (Some(i), None) => {
                // Withdrawn (a status check found the write absent): rare, so
                // shifting the later effects' places by one is fine.
                self.effects.remove(i);
                self.calls[index].effect_index = None;
                for call in self.calls.iter_mut() {
                    if let Some(j) = call.effect_index.filter(|j| *j as usize > i) {
                        call.effect_index = Some(j - 1);
                    }
                }
            }
            (None, Some(status)) => {
                self.calls[index].effect_index = Some(self.effects.len() as u32);
                self.effects.push((index as u32, status));
            }
            (None, None) => {}
        }
    }

    /// The call's last error in words: `HTTP 503: upstream unavailable`, or an
    /// empty result's message.
    fn last_error_text(&self, index: usize) -> Option<String> {
        let call = &self.calls[index];
        let limit = self.config.max_message_chars as usize;
        match call.last_error.as_ref()? {
            LastError::Failure(kind) => {
                let label = failure_label(kind);
                let body = excerpt(&call.last_text, limit);
                Some(if body.is_empty() { label } else { cat!(label, ": ", body) })
            }
            LastError::EmptyResult => Some(excerpt(&cat!(call.tool, " returned an empty or unusable result: ", call.last_text), limit)),
            LastError::Task => Some(excerpt(&call.last_text, limit)),
        }
    }

    /// Ends the run with an escalation. `index` is the call that stopped it, if any.
    fn escalate(&mut self, index: Option<usize>, reason: EscalationReason, resets_in_ms: Option<u64>, now_ms: u64) {
        self.escalate_with(index, reason, None, resets_in_ms, now_ms);
    }

    /// [`Run::escalate`], with a detail for the note (e.g. a deadline's numbers).
    fn escalate_with(&mut self, index: Option<usize>, reason: EscalationReason, detail: Option<&str>, resets_in_ms: Option<u64>, now_ms: u64) {
        self.escalation = Some(reason);
        if let Some(i) = index {
            self.rare.get_or_insert_with(Box::default).stopped = Some(i as u32);
        }
        let last_error = index.and_then(|i| self.last_error_text(i));
        let stop_call = index.map(|i| {
            let call = &mut self.calls[i];
            call.phase = Phase::Finished;
            (i, call.attempt)
        });
        let effects = self.bounded_effects();
        let stop = StopPoint { run_id: &self.run_id, call: stop_call.map(|(i, attempt)| (self.calls[i].tool.as_str(), i as u32 + 1, attempt)) };
        let mut note = escalation::note(&stop, reason, detail, last_error.as_deref(), resets_in_ms, now_ms, &effects, self.effects.len());
        // A person's abort is final: nobody answers it.
        if let Some(answers) = self.answers(index).filter(|_| reason != EscalationReason::Aborted) {
            note.push_str(&crate::snapshot::answers_sentence(&answers));
        }
        self.escalated = Some(Box::new(Escalation { reason, last_error, resets_in_ms, effects, effects_total: self.effects_total(), note }));
    }

    /// Keeps `failed` and `step` as the run's last decision and answers it.
    fn decide(&mut self, index: usize, act: Act, failed: Failed, step: Step, has_note: bool) -> Verdict {
        let verdict =
            Verdict { act, class: failed.class, attempt: self.calls[index].attempt, hint_ms: failed.hint_ms, rule: failed.rule, has_note, cancel_task: false };
        self.keep_last(Last { index, verdict, basis: failed.basis, step });
        verdict
    }

    /// Keeps what the call's last attempt returned, in its buffer (or the
    /// run's spare one).
    fn keep_text(&mut self, index: usize, error: LastError, text: &str) {
        let call = &mut self.calls[index];
        call.last_error = Some(error);
        if call.last_text.capacity() == 0 {
            call.last_text = core::mem::take(&mut self.spare_text);
        }
        call.last_text.clear();
        call.last_text.push_str(text);
    }

    fn keep_last(&mut self, last: Last) {
        // A finished call's text served only the words of its last decision:
        // free it once another call's decision takes that place, so that a
        // run keeps the bodies of its calls in flight only.
        if let Some(previous) = self.last.as_ref().map(|kept| kept.index).filter(|i| *i != last.index) {
            let call = &mut self.calls[previous];
            if call.phase == Phase::Finished {
                let text = core::mem::take(&mut call.last_text);
                if text.capacity() <= MAX_SPARE_TEXT_BYTES && text.capacity() > self.spare_text.capacity() {
                    self.spare_text = text;
                }
            }
        }
        match &mut self.last {
            Some(kept) => **kept = last,
            None => self.last = Some(Box::new(last)),
        }
    }

    fn escalate_call(&mut self, index: usize, failed: Failed, reason: EscalationReason, resets_in_ms: Option<u64>, now_ms: u64) -> Verdict {
        self.escalate(Some(index), reason, resets_in_ms, now_ms);
        self.decide(index, Act::Escalate, failed, Step::Escalate(reason), true)
    }

    fn deadline_too_near(&mut self, index: usize, failed: Failed, detail: &str, resets_in_ms: Option<u64>, now_ms: u64) -> Verdict {
        self.escalate_with(Some(index), EscalationReason::DeadlineTooNear, Some(detail), resets_in_ms, now_ms);
        self.decide(index, Act::Escalate, failed, Step::Escalate(EscalationReason::DeadlineTooNear), true)
    }

    /// Asks to begin a call of `tool` on `server`: checks the breakers, the
    /// step budget, and takes the first attempt's share of the account budget.
    #[allow(clippy::too_many_arguments)]
    pub fn begin(
        &mut self,
        server: Option<String>,
        tool: String,
        key: Option<String>,
        hints: Option<&ToolHints>,
        now_ms: u64,
        budget: &mut dyn AccountBudget,
    ) -> Result<Start, RunError> {
        self.ensure_open()?;
        SizeLimit::check("tool", &tool)?;
        if let Some(server) = &server {
            SizeLimit::check_within("server", server, crate::types::MAX_SERVER_BYTES)?;
        }
        if let Some(key) = &key {
            SizeLimit::check("idempotency-key", key)?;
        }
        self.forget_breaker_changes();
        if self.steps() >= self.config.max_steps_per_run {
            self.keep_pending(server.as_deref(), &tool, key.as_deref(), hints);
            self.escalate(None, EscalationReason::RunStepsSpent, None, now_ms);
            return Ok(Start::Escalated);
        }
        let breaker = self.config.circuit_breaker.clone();
        let server = server.filter(|_| breaker.is_some()).map(|raw| Box::<str>::from(breaker::server_name(&raw)));
        let mut probes = 0;
        if let (Some(config), Some(name)) = (&breaker, &server) {
            match self.admit_breakers(config, name, &tool, now_ms, budget) {
                Ok(probing) => probes = probing,
                Err(down) => return Ok(self.refuse(config, server, tool, key, hints, down, now_ms)),
            }
        }
        let delay_ms = match budget::withdraw(&self.config, Spend::FirstAttempt, None, now_ms, budget) {
            Ok(taken) => taken.wait_ms,
            Err(refused) => {
                if let (Some(config), Some(name)) = (&breaker, &server) {
                    self.release_probes(config, name, &tool, probes, budget);
                }
                self.keep_pending(server.as_deref(), &tool, key.as_deref(), hints);
                self.escalate(None, refused.reason, Some(refused.resets_in_ms), now_ms);
                return Ok(Start::Escalated);
            }
        };
        let policy = self.config.tool_policy(&tool, hints);
        let call = Call::new(server, tool, key, policy, probes);
        let safe_to_repeat = call.safe_to_repeat();
        // The first call gets room for one (`Chunked::push`): most runs in
        // flight have one call out, and 100,000 runs must fit in one
        // instance's 64 MiB.
        self.calls.push(call);
        self.counters.attempts += 1;
        self.note_wait(delay_ms);
        let call_id = self.calls.len() as u32; // fewer than max-steps-per-run (≤ 10^6)
        let (idle_timeout_ms, attempt_timeout_ms) = self.config.timeouts(&self.calls[call_id as usize - 1].tool);
        Ok(Start::Send(CallTicket { call_id, delay_ms, effect: policy.effect, safe_to_repeat, idle_timeout_ms, attempt_timeout_ms }))
    }

    /// A call an open breaker stops before it is sent: a replan (the call is
    /// kept, finished, so that its decision can be read) or an escalation.
    #[allow(clippy::too_many_arguments)]
    fn refuse(
        &mut self,
        config: &BreakerConfig,
        server: Option<Box<str>>,
        tool: String,
        key: Option<String>,
        hints: Option<&ToolHints>,
        down: Down,
        now_ms: u64,
    ) -> Start {
        let resets_in_ms = down.until_ms.saturating_sub(down.now_ms);
        if config.when_open == WhenOpen::Escalate {
            self.keep_pending(server.as_deref(), &tool, key.as_deref(), hints);
            self.escalate(None, EscalationReason::CircuitOpen, Some(resets_in_ms), now_ms);
            return Start::Escalated;
        }
        let policy = self.config.tool_policy(&tool, hints);
        let mut call = Call::new(server, tool, key, policy, 0);
        call.attempt = 0;
        self.calls.push(call);
        let index = self.calls.len() - 1;
        let failed = Failed {
            class: OutcomeClass::Transient,
            hint_ms: Some(resets_in_ms),
            rule: Rule::CircuitOpen,
            basis: Basis::Fixed("a circuit breaker of the server is open"),
        };
        let verdict = self.replan_or_escalate(index, failed, now_ms);
        if verdict.act != Act::Replan {
            return Start::Escalated;
        }
        if let Some(last) = self.last.as_mut() {
            last.step = Step::CircuitOpen(down);
        }
        Start::Replan(index as u32 + 1)
    }

    /// The breakers a call of `tool` on `server` must pass: the server's, then
    /// the tool's. `Ok` carries the probes the call makes; a probe taken
    /// before the other breaker refuses is given back.
    fn admit_breakers(&mut self, config: &BreakerConfig, server: &str, tool: &str, now_ms: u64, host: &mut dyn AccountBudget) -> Result<u8, Down> {
        let mut probes = 0;
        for (bit, tool_key) in [(1u8, None), (2u8, Some(tool))] {
            if tool_key.is_some() && !config.per_tool {
                break;
            }
            let key = breaker::key(server, tool_key);
            let admitted = breaker::update(host, &key, config, now_ms, |state, now| {
                let (admit, change) = breaker::admit(state, config, now);
                let changed = change.is_some();
                ((admit, change), changed)
            });
            // A store that keeps refusing leaves the breaker as it is: the call goes.
            let Some((admit, change)) = admitted else { continue };
            if let Some(change) = change {
                self.note_breaker_change(server, tool_key, change);
            }
            match admit {
                Admit::Send => {}
                Admit::Probe => probes |= bit,
                Admit::Refused { until_ms, now_ms } => {
                    self.release_probes(config, server, tool, probes, host);
                    return Err(Down { until_ms, now_ms, tool_level: tool_key.is_some() });
                }
            }
        }
        Ok(probes)
    }

    /// Gives back probes a call took but will not make (it was not sent): the
    /// next call may probe at once instead of waiting out the lease.
    fn release_probes(&mut self, config: &BreakerConfig, server: &str, tool: &str, probes: u8, host: &mut dyn AccountBudget) {
        for (bit, tool_key) in [(1u8, None), (2u8, Some(tool))] {
            if probes & bit == 0 {
                continue;
            }
            // No clock here (`abandon-call` has none): any time reads the
            // state as plausible, and a lease that ended at 0 has ended.
            breaker::update(host, &breaker::key(server, tool_key), config, u64::MAX, |state, _| {
                let held = state.mode == breaker::Mode::HalfOpen;
                if held {
                    state.until_ms = 0;
                }
                ((), held)
            });
        }
    }

    /// Counts what the call's attempt said of its server in the call's
    /// breakers (`None`: nothing, e.g. a misconfigured connection), and says
    /// whether one of them is open now, or probing with another call.
    fn record_breakers(&mut self, index: usize, outcome: Option<breaker::Outcome>, now_ms: u64, host: &mut dyn AccountBudget) -> Option<Down> {
        let config = self.config.circuit_breaker.clone()?;
        let call = &mut self.calls[index];
        let server = call.server.clone()?;
        let probes = core::mem::take(&mut call.probes);
        let tool = call.tool.clone();
        let mut down = None;
        for (bit, tool_key) in [(1u8, None), (2u8, Some(tool.as_str()))] {
            if tool_key.is_some() && !config.per_tool {
                break;
            }
            let key = breaker::key(&server, tool_key);
            let probe = probes & bit != 0;
            let recorded = breaker::update(host, &key, &config, now_ms, |state, now| {
                let change = outcome.and_then(|outcome| breaker::record(state, outcome, probe, &config, now));
                let open = state.mode != breaker::Mode::Closed && now < state.until_ms;
                let changed = change.is_some() || (outcome.is_some() && state.mode == breaker::Mode::Closed);
                ((change, open.then_some(Down { until_ms: state.until_ms, now_ms: now, tool_level: tool_key.is_some() })), changed)
            });
            let Some((change, open)) = recorded else { continue };
            if let Some(change) = change {
                self.note_breaker_change(&server, tool_key, change);
            }
            down = down.or(open);
        }
        down
    }

    fn note_breaker_change(&mut self, server: &str, tool: Option<&str>, change: breaker::Change) {
        let rare = self.rare.get_or_insert_with(Box::default);
        rare.breaker_changes.push(BreakerChange::new(server, tool, change));
    }

    fn forget_breaker_changes(&mut self) {
        if let Some(rare) = self.rare.as_mut() {
            rare.breaker_changes.clear();
        }
    }

    /// Whether the last `begin` or report changed a breaker.
    pub fn breaker_changed(&self) -> bool {
        self.rare.as_ref().is_some_and(|r| !r.breaker_changes.is_empty())
    }

    /// The breakers' changes the last `begin` or report made; forgotten once read.
    pub fn take_breaker_changes(&mut self) -> Vec<BreakerChange> {
        self.rare.as_mut().map(|r| core::mem::take(&mut r.breaker_changes)).unwrap_or_default()
    }

    /// Records an attempt that returned a usable result.
    pub fn record_success(&mut self, call_id: u32, attempt: u32, now_ms: u64, budget: &mut dyn AccountBudget) -> Result<Verdict, RunError> {
        self.record(call_id, attempt, Reported::Success, At::now(now_ms), budget)
    }

    /// Records an attempt whose result was empty or unusable.
    pub fn record_empty_result(&mut self, call_id: u32, attempt: u32, detail: &str, now_ms: u64, budget: &mut dyn AccountBudget) -> Result<Verdict, RunError> {
        self.record(call_id, attempt, Reported::EmptyResult(detail), At::now(now_ms), budget)
    }

    /// Records a failed attempt, as the host observed it.
    pub fn record_failure(
        &mut self,
        call_id: u32,
        attempt: u32,
        failure: &FailureView<'_>,
        at: At,
        budget: &mut dyn AccountBudget,
    ) -> Result<Verdict, RunError> {
        self.record(call_id, attempt, Reported::Failure(failure), at, budget)
    }

    /// Records what a status check found.
    pub fn record_status_check(
        &mut self,
        call_id: u32,
        attempt: u32,
        result: StatusCheckResult,
        at: At,
        budget: &mut dyn AccountBudget,
    ) -> Result<Verdict, RunError> {
        self.record(call_id, attempt, Reported::StatusCheck(result), at, budget)
    }

    /// Records what the server said of the call's task.
    pub fn record_task_status(&mut self, call_id: u32, attempt: u32, task: &TaskReport, at: At, budget: &mut dyn AccountBudget) -> Result<Verdict, RunError> {
        self.record(call_id, attempt, Reported::Task(task), at, budget)
    }

    /// Records a failed poll of the call's task, as the host observed it.
    pub fn record_poll_failure(
        &mut self,
        call_id: u32,
        attempt: u32,
        failure: &FailureView<'_>,
        at: At,
        budget: &mut dyn AccountBudget,
    ) -> Result<Verdict, RunError> {
        self.record(call_id, attempt, Reported::PollFailure(failure), at, budget)
    }

    /// Ends a call the host stopped (cancelled, or past its deadline) before a
    /// verdict ended it. An attempt that had left without an answer may have
    /// applied a write or a delete: it is an `unknown` effect, as a timeout's
    /// is, so a later escalation's note names it. No budget moves: the host
    /// stopped, the policy decided nothing.
    pub fn abandon_call(&mut self, call_id: u32, attempt: u32, sent: bool, _why: AbandonReason, budget: &mut dyn AccountBudget) -> Result<(), RunError> {
        // An escalated run still takes this: the host closes its calls in
        // flight, so that a snapshot knows which writes may have been applied.
        let index = self.call_index(call_id)?;
        let expected = self.calls[index].attempt;
        if attempt != expected {
            return Err(RunError::AttemptMismatch(AttemptMismatch { call_id, expected, reported: attempt }));
        }
        let call = &self.calls[index];
        // A pending status check's effect is already unknown; an answered one is in the effects.
        if sent && call.phase == Phase::Sending && call.policy.effect != Effect::Read && call.effect_index.is_none() {
            self.set_effect(index, Some(EffectStatus::Unknown));
        }
        self.end_task(index);
        self.calls[index].phase = Phase::Finished;
        self.forget_breaker_changes();
        // A probe that left may still be answered: only one never sent gives its place back.
        let probes = core::mem::take(&mut self.calls[index].probes);
        if let (Some(config), Some(server), true) = (self.config.circuit_breaker.clone(), self.calls[index].server.clone(), probes != 0 && !sent) {
            let tool = self.calls[index].tool.clone();
            self.release_probes(&config, &server, &tool, probes, budget);
        }
        let rare = self.rare.get_or_insert_with(Box::default);
        rare.abandoned_calls = rare.abandoned_calls.saturating_add(1);
        Ok(())
    }

    fn record(&mut self, call_id: u32, attempt: u32, outcome: Reported<'_>, at: At, budget: &mut dyn AccountBudget) -> Result<Verdict, RunError> {
        let now_ms = at.now_ms;
        self.ensure_open()?;
        self.forget_breaker_changes();
        let index = self.call_index(call_id)?;
        let expected = self.calls[index].attempt;
        if attempt != expected {
            return Err(RunError::AttemptMismatch(AttemptMismatch { call_id, expected, reported: attempt }));
        }
        let pending = match self.calls[index].phase {
            Phase::CheckingStatus { class, hint_ms } => Some(Failed { class, hint_ms, rule: Rule::StatusCheck, basis: Basis::Fixed("") }),
            _ => None,
        };
        if pending.is_none() && matches!(outcome, Reported::Success | Reported::EmptyResult(_) | Reported::Failure(_)) {
            // A task that completed or failed is over: its outcome is the attempt's.
            self.end_task(index);
        }
        match (outcome, pending) {
            (Reported::StatusCheck(result), Some(failed)) => Ok(self.on_status_check(index, result, failed, at, budget)),
            (Reported::StatusCheck(_), None) => Err(RunError::NoStatusCheckPending(call_id)),
            (_, Some(_)) => Err(RunError::StatusCheckPending(call_id)),
            (Reported::Task(task), None) => {
                SizeLimit::check("task-id", &task.task_id)?;
                Ok(self.on_task_status(index, task, at))
            }
            (Reported::PollFailure(_), None) if self.task(index).is_none() => Err(RunError::NoTask(call_id)),
            (Reported::PollFailure(failure), None) => Ok(self.on_poll_failure(index, failure, at)),
            (Reported::Success, None) => {
                self.record_breakers(index, Some(breaker::Outcome::Answered), now_ms, budget);
                let call = &self.calls[index];
                budget::deposit(&self.config, call.attempt > 1, call.quota_taken, now_ms, budget);
                let effect = self.calls[index].policy.effect;
                let status = if effect == Effect::Read { None } else { Some(EffectStatus::Applied) };
                let done = Failed { class: OutcomeClass::Success, hint_ms: None, rule: Rule::Success, basis: Basis::Fixed("the call succeeded") };
                Ok(self.succeed(index, status, false, done, Step::Done))
            }
            (Reported::EmptyResult(detail), None) => {
                self.record_breakers(index, Some(breaker::Outcome::Answered), now_ms, budget);
                self.keep_text(index, LastError::EmptyResult, detail);
                // The server answered 2xx: a write it answered has been applied.
                if self.calls[index].policy.effect != Effect::Read {
                    self.set_effect(index, Some(EffectStatus::Applied));
                }
                let failed = Failed {
                    class: OutcomeClass::Semantic,
                    hint_ms: None,
                    rule: Rule::EmptyResult,
                    basis: Basis::Fixed("empty or unusable result is semantic"),
                };
                Ok(self.replan_or_escalate(index, failed, now_ms))
            }
            (Reported::Failure(failure), None) => Ok(self.on_failure(index, failure, at, budget)),
        }
    }

    fn succeed(&mut self, index: usize, effect: Option<EffectStatus>, has_note: bool, outcome: Failed, step: Step) -> Verdict {
        self.calls[index].phase = Phase::Finished;
        self.counters.succeeded_calls = self.counters.succeeded_calls.saturating_add(1);
        if effect.is_some() {
            self.set_effect(index, effect);
        }
        self.decide(index, Act::Succeed, outcome, step, has_note)
    }

    fn replan_or_escalate(&mut self, index: usize, failed: Failed, now_ms: u64) -> Verdict {
        if self.counters.replans >= self.config.max_replans_per_run {
            return self.escalate_call(index, failed, EscalationReason::ReplansSpent, None, now_ms);
        }
        self.counters.replans += 1;
        self.calls[index].phase = Phase::Finished;
        let step = Step::Replan { replan: self.counters.replans, of: self.config.max_replans_per_run };
        self.decide(index, Act::Replan, failed, step, true)
    }

    fn on_failure(&mut self, index: usize, failure: &FailureView<'_>, at: At, budget: &mut dyn AccountBudget) -> Verdict {
        let At { now_ms, time_left_ms, entropy } = at;
        if let FailureKind::HttpStatus(status) = *failure.kind {
            match self.statuses.binary_search_by_key(&status, |s| s.status) {
                Ok(i) => self.statuses[i].count = self.statuses[i].count.saturating_add(1),
                Err(i) => {
                    // A new status is rare (a run sees a few): the slice is rebuilt.
                    let mut statuses = core::mem::take(&mut self.statuses).into_vec();
                    statuses.insert(i, StatusCount { status, count: 1 });
                    self.statuses = statuses.into_boxed_slice();
                }
            }
        }
        let classified = classify_view(failure, &self.config, Some(&self.calls[index].tool), now_ms);
        self.keep_text(index, LastError::Failure(*failure.kind), failure.body);
        let (class, hint_ms, rule) = (classified.class, classified.hint_ms, classified.rule);
        let down = self.record_breakers(index, breaker::outcome(failure.kind, class), now_ms, budget);
        let ambiguous = is_ambiguous(&classified);
        // A lost session's 404 says nothing of the target: it is not "already gone".
        let gone = matches!(classified.status, Some(404 | 410)) && rule != Rule::LostSession;
        let server_forbids = classified.server_says_retry == Some(false);
        let failed = Failed { class, hint_ms, rule, basis: Basis::Failure(classified) };
        if self.calls[index].policy.effect == Effect::Delete && gone {
            // Deleting what is already gone is the delete's goal reached, whatever
            // `x-should-retry` says. If an earlier attempt of this call failed
            // ambiguously, that attempt did it.
            let earlier = self.calls[index].effect_index.is_some();
            let effect = earlier.then_some(EffectStatus::Applied);
            return self.succeed(index, effect, true, failed, Step::DeleteGone);
        }
        match class {
            OutcomeClass::Permission => self.escalate_call(index, failed, EscalationReason::PermissionDenied, None, now_ms),
            OutcomeClass::Misconfigured => self.escalate_call(index, failed, EscalationReason::ConnectionMisconfigured, None, now_ms),
            OutcomeClass::NeedsInput => self.escalate_call(index, failed, EscalationReason::InputRequired, None, now_ms),
            OutcomeClass::Deterministic => self.replan_or_escalate(index, failed, now_ms),
            OutcomeClass::Transient | OutcomeClass::Throttled => {
                if rule == Rule::VersionMismatch {
                    if self.calls[index].version_refused {
                        return self.escalate_call(index, failed, EscalationReason::ProtocolVersionUnsupported, None, now_ms);
                    }
                    self.calls[index].version_refused = true;
                }
                if ambiguous && self.calls[index].policy.effect != Effect::Read {
                    self.set_effect(index, Some(EffectStatus::Unknown));
                }
                // With `hint-cap-over-backoff-ms` the wait is capped instead (AWS 2026).
                if let Some(hint) = hint_ms.filter(|h| *h > self.config.max_hint_ms && self.config.hint_cap_over_backoff_ms == 0) {
                    return self.escalate_call(index, failed, EscalationReason::ServerWaitTooLong, Some(hint), now_ms);
                }
                // The model cannot fix it, and the server says a retry will not either.
                if server_forbids {
                    return self.escalate_call(index, failed, EscalationReason::RetryForbidden, hint_ms, now_ms);
                }
                if ambiguous && !self.calls[index].safe_to_repeat() {
                    if self.steps() >= self.config.max_steps_per_run {
                        return self.escalate_call(index, failed, EscalationReason::RunStepsSpent, None, now_ms);
                    }
                    self.counters.status_checks += 1;
                    self.calls[index].phase = Phase::CheckingStatus { class, hint_ms };
                    return self.decide(index, Act::CheckStatus, failed, Step::CheckStatus, false);
                }
                let reconnect = matches!(rule, Rule::LostSession | Rule::VersionMismatch);
                self.retry_or_escalate(index, failed, Bounds { time_left_ms, reconnect, down }, now_ms, entropy, budget)
            }
            // Unclassified, and the classes classify never gives a failure.
            OutcomeClass::Unclassified | OutcomeClass::Success | OutcomeClass::Semantic => {
                self.escalate_call(index, failed, EscalationReason::UnclassifiedFailure, None, now_ms)
            }
        }
    }

    fn retry_or_escalate(&mut self, index: usize, failed: Failed, bounds: Bounds, now_ms: u64, entropy: u64, budget: &mut dyn AccountBudget) -> Verdict {
        // The server failed lately (this call's failure, or others'): nothing is sent to it.
        if let Some(down) = bounds.down {
            return self.circuit_open(index, failed, down, now_ms);
        }
        let config = Arc::clone(&self.config);
        let attempt = self.calls[index].attempt;
        let spent = if attempt >= config.max_attempts_per_call {
            Some(EscalationReason::CallAttemptsSpent)
        } else if self.counters.retries >= config.max_retries_per_run {
            Some(EscalationReason::RunRetriesSpent)
        } else if self.steps() >= config.max_steps_per_run {
            Some(EscalationReason::RunStepsSpent)
        } else {
            None
        };
        if let Some(reason) = spent {
            return self.escalate_call(index, failed, reason, None, now_ms);
        }
        // Attempt n failed: this is retry number n. A throttle may have a
        // base of its own (AWS 2026: 1 s against 50 ms).
        let base_delay_ms = match config.throttle_base_delay_ms {
            ms if ms > 0 && failed.class == OutcomeClass::Throttled => ms,
            _ => config.base_delay_ms,
        };
        let jittered = full_jitter(ceiling_ms(base_delay_ms, config.max_delay_ms, attempt), entropy);
        // The server's hint is a floor; with a cap, only up to the backoff plus the cap.
        let hint_ms = match config.hint_cap_over_backoff_ms {
            0 => failed.hint_ms,
            cap => failed.hint_ms.map(|hint| hint.min(jittered.saturating_add(cap))),
        };
        // A server that asks to wait until the deadline or past it is not
        // waited for: the model, or a person, hears it now, with both numbers.
        if let Some(left) = bounds.time_left_ms
            && (left == 0 || hint_ms.is_some_and(|hint| hint >= left))
        {
            let detail = match hint_ms {
                Some(asks) => cat!("the server asks to wait ", asks, " ms; ", left, " ms remain"),
                None => String::from("no time remains before the deadline"),
            };
            let hint_ms = failed.hint_ms;
            return self.deadline_too_near(index, failed, &detail, hint_ms, now_ms);
        }
        // Jitter never waits past the deadline.
        let mut delay_ms = jittered.max(hint_ms.unwrap_or(0));
        if let Some(left) = bounds.time_left_ms {
            delay_ms = delay_ms.min(left);
        }
        let spend = Spend::Retry { throttled: failed.class == OutcomeClass::Throttled };
        let taken = match budget::withdraw(&config, spend, bounds.time_left_ms, now_ms, budget) {
            Ok(taken) => taken,
            Err(refused) if refused.reason == EscalationReason::DeadlineTooNear => {
                let left = bounds.time_left_ms.unwrap_or(0);
                let detail = cat!("the account budget has room in ", refused.resets_in_ms, " ms; ", left, " ms remain");
                return self.deadline_too_near(index, failed, &detail, Some(refused.resets_in_ms), now_ms);
            }
            Err(refused) => return self.escalate_call(index, failed, refused.reason, Some(refused.resets_in_ms), now_ms),
        };
        let mut account_wait_ms = None;
        if taken.wait_ms > delay_ms {
            account_wait_ms = Some(taken.wait_ms);
            delay_ms = taken.wait_ms;
        }
        self.counters.retries += 1;
        self.counters.attempts += 1;
        self.note_wait(delay_ms);
        let call = &mut self.calls[index];
        call.attempt += 1;
        call.phase = Phase::Sending;
        call.quota_taken = taken.quota_taken;
        let next = call.attempt;
        let step = Step::Retry { retry: attempt, of: config.max_attempts_per_call - 1, delay_ms, account_wait_ms };
        // The verdict answers the failed attempt, not the retry it plans.
        let verdict = Verdict {
            act: Act::Retry { delay_ms, attempt: next, reconnect: bounds.reconnect },
            class: failed.class,
            attempt,
            hint_ms: failed.hint_ms,
            rule: failed.rule,
            has_note: false,
            cancel_task: false,
        };
        self.keep_last(Last { index, verdict, basis: failed.basis, step });
        verdict
    }

    /// A call whose retry an open breaker stops: a replan or an escalation, as configured.
    fn circuit_open(&mut self, index: usize, failed: Failed, down: Down, now_ms: u64) -> Verdict {
        let resets_in_ms = down.until_ms.saturating_sub(down.now_ms);
        let when_open = self.config.circuit_breaker.as_ref().map_or(WhenOpen::Replan, |b| b.when_open);
        if when_open == WhenOpen::Escalate {
            return self.escalate_call(index, failed, EscalationReason::CircuitOpen, Some(resets_in_ms), now_ms);
        }
        let verdict = self.replan_or_escalate(index, failed, now_ms);
        if let Some(last) = self.last.as_mut().filter(|_| verdict.act == Act::Replan) {
            last.step = Step::CircuitOpen(down);
        }
        verdict
    }

    /// What the server said of the call's task: poll again, or stop waiting.
    fn on_task_status(&mut self, index: usize, report: &TaskReport, at: At) -> Verdict {
        let now_ms = at.now_ms;
        let first = self.task(index).is_none();
        if first {
            let book = self.rare.get_or_insert_with(Box::default);
            book.tasks = book.tasks.saturating_add(1);
            book.live.push(Task { call: index as u32, id: String::new(), polls: 0, failed_polls: 0, waited_ms: 0, first_at_ms: now_ms, expires_at_ms: None });
            // The server took the call: a write may apply from now on.
            if self.calls[index].policy.effect != Effect::Read {
                self.set_effect(index, Some(EffectStatus::Unknown));
            }
        }
        let task = self.task_mut(index).expect("pushed at the first report");
        if task.id != report.task_id {
            task.id.clear();
            task.id.push_str(&report.task_id);
        }
        task.failed_polls = 0;
        if let Some(ttl) = report.ttl_ms {
            // Created `age-ms` ago; without a `createdAt`, no later than first seen.
            let created_at = report.age_ms.map_or(task.first_at_ms, |age| now_ms.saturating_sub(age));
            task.expires_at_ms = Some(created_at.saturating_add(ttl));
        }
        // The note and the message stay within max-message-chars, however long the server's text.
        let text = excerpt(&report.message, self.config.max_message_chars as usize);
        let status = match report.status {
            TaskStatus::Working => "working",
            TaskStatus::InputAnswered => "input answered",
            TaskStatus::InputRequired => "input required",
            TaskStatus::Cancelled => "cancelled",
        };
        let task_text = cat!("task ", report.task_id, " ", status, if text.is_empty() { "" } else { ": " }, text);
        self.keep_text(index, LastError::Task, &task_text);
        // An implausible interval is ignored, as an implausible header hint is.
        let interval = report.poll_interval_ms.filter(|ms| *ms <= self.config.max_plausible_hint_ms);
        let failed = |class| Failed { class, hint_ms: interval, rule: Rule::TaskStatus, basis: Basis::Fixed("the server answered with a task") };
        match report.status {
            TaskStatus::InputRequired => {
                let detail = cat!("task ", report.task_id, " asks: ", text);
                self.stop_task(index, failed(OutcomeClass::NeedsInput), EscalationReason::InputRequired, &detail, now_ms)
            }
            TaskStatus::Cancelled => {
                self.end_task(index);
                match self.config.on_task_cancelled {
                    OnTaskCancelled::Escalate => self.escalate_call(index, failed(OutcomeClass::Deterministic), EscalationReason::TaskCancelled, None, now_ms),
                    OnTaskCancelled::Replan => {
                        let verdict = self.replan_or_escalate(index, failed(OutcomeClass::Deterministic), now_ms);
                        if let Some(last) = self.last.as_mut().filter(|_| verdict.act == Act::Replan) {
                            last.step = Step::TaskCancelled;
                        }
                        verdict
                    }
                }
            }
            TaskStatus::Working | TaskStatus::InputAnswered => {
                // Only a wait the server asks for can be too long: the policy's own backoff is capped by
                // task-poll-max-delay-ms, and is no hint (fuzzing's F6 took it for one).
                if let Some(asked) = interval.filter(|ms| *ms > self.config.max_hint_ms) {
                    let detail = cat!("task ", report.task_id, ": the server asks to poll every ", asked, " ms");
                    return self.stop_task(index, failed(OutcomeClass::Transient), EscalationReason::ServerWaitTooLong, &detail, now_ms);
                }
                let config = &self.config;
                let task = self.task(index).expect("set above");
                // The server's interval is a floor; without one, the wait grows.
                let grown = config.task_poll_base_delay_ms.saturating_mul(1u64 << task.polls.min(32)).min(config.task_poll_max_delay_ms);
                // Never faster than task-poll-min-delay-ms: an interval of 0 is a hot loop.
                let delay_ms = interval.unwrap_or(grown).max(config.task_poll_min_delay_ms);
                self.poll_or_stop(index, delay_ms, false, failed(OutcomeClass::Transient), at)
            }
        }
    }

    /// A failed poll: poll again if a wait may fix it; the tool is never called again.
    fn on_poll_failure(&mut self, index: usize, failure: &FailureView<'_>, at: At) -> Verdict {
        let now_ms = at.now_ms;
        let classified = classify_view(failure, &self.config, Some(&self.calls[index].tool), now_ms);
        let task_id = self.task(index).map(|t| t.id.clone()).unwrap_or_default();
        let text = cat!("task ", task_id, " poll: ", failure.body);
        self.keep_text(index, LastError::Failure(*failure.kind), &text);
        let (class, hint_ms, rule) = (classified.class, classified.hint_ms, classified.rule);
        let reconnect = rule == Rule::LostSession;
        let failed = Failed { class, hint_ms, rule, basis: Basis::Failure(classified) };
        match class {
            OutcomeClass::Transient | OutcomeClass::Throttled => {
                let config = Arc::clone(&self.config);
                let task = self.task_mut(index).expect("a poll failure needs a task");
                task.failed_polls = task.failed_polls.saturating_add(1);
                let failed_polls = task.failed_polls;
                if failed_polls >= config.max_attempts_per_call {
                    let detail = cat!(failed_polls, " polls of task ", task_id, " failed in a row");
                    return self.stop_task(index, failed, EscalationReason::TaskPollsSpent, &detail, now_ms);
                }
                if let Some(hint) = hint_ms.filter(|h| *h > config.max_hint_ms) {
                    let detail = cat!("task ", task_id, ": the server asks to wait ", hint, " ms");
                    return self.stop_task(index, failed, EscalationReason::ServerWaitTooLong, &detail, now_ms);
                }
                let delay_ms = next_delay_ms(config.task_poll_base_delay_ms, config.task_poll_max_delay_ms, failed_polls, hint_ms, at.entropy);
                self.poll_or_stop(index, delay_ms.max(config.task_poll_min_delay_ms), reconnect, failed, at)
            }
            // The server no longer knows the task (or refuses the poll): its result is lost.
            OutcomeClass::Deterministic | OutcomeClass::Semantic => {
                let detail = cat!("the server no longer knows task ", task_id);
                self.end_task(index);
                self.escalate_with(Some(index), EscalationReason::TaskExpired, Some(&detail), None, now_ms);
                self.decide(index, Act::Escalate, failed, Step::Escalate(EscalationReason::TaskExpired), true)
            }
            OutcomeClass::Permission => self.stop_task(index, failed, EscalationReason::PermissionDenied, "", now_ms),
            OutcomeClass::Misconfigured => self.stop_task(index, failed, EscalationReason::ConnectionMisconfigured, "", now_ms),
            OutcomeClass::NeedsInput => self.stop_task(index, failed, EscalationReason::InputRequired, "", now_ms),
            OutcomeClass::Unclassified | OutcomeClass::Success => self.stop_task(index, failed, EscalationReason::UnclassifiedFailure, "", now_ms),
        }
    }

    /// Polls the call's task after `delay_ms`, unless a budget, the task's
    /// time to live or a deadline says to stop waiting.
    fn poll_or_stop(&mut self, index: usize, delay_ms: u64, reconnect: bool, failed: Failed, at: At) -> Verdict {
        let now_ms = at.now_ms;
        let config = Arc::clone(&self.config);
        let task = self.task(index).expect("a poll needs a task");
        let id = task.id.clone();
        // The time spent on the task: the waits decided, or the clock if the
        // answers themselves were slow.
        let spent_ms = task.waited_ms.max(now_ms.saturating_sub(task.first_at_ms));
        if task.polls >= config.max_polls_per_task || spent_ms.saturating_add(delay_ms) > config.max_task_wait_ms {
            let detail = cat!("task ", id, " was polled ", task.polls, " times over ", spent_ms, " ms");
            return self.stop_task(index, failed, EscalationReason::TaskPollsSpent, &detail, now_ms);
        }
        if let Some(expires_at) = task.expires_at_ms
            && now_ms.saturating_add(delay_ms) >= expires_at
        {
            let detail = cat!("task ", id, " expires in ", expires_at.saturating_sub(now_ms), " ms, before its next poll in ", delay_ms, " ms");
            return self.stop_task(index, failed, EscalationReason::TaskExpired, &detail, now_ms);
        }
        if let Some(left) = at.time_left_ms
            && delay_ms >= left
        {
            let detail = cat!("task ", id, ": the next poll is due in ", delay_ms, " ms; ", left, " ms remain");
            return self.stop_task(index, failed, EscalationReason::DeadlineTooNear, &detail, now_ms);
        }
        let task = self.task_mut(index).expect("a poll needs a task");
        task.polls += 1;
        task.waited_ms = task.waited_ms.saturating_add(delay_ms);
        let poll = task.polls;
        if let Some(book) = self.rare.as_mut() {
            book.polls = book.polls.saturating_add(1);
        }
        self.note_wait(delay_ms);
        self.decide(index, Act::Poll { delay_ms, reconnect }, failed, Step::Poll { poll, delay_ms }, false)
    }

    /// Stops waiting for a live task: escalates, and has the host cancel it.
    fn stop_task(&mut self, index: usize, failed: Failed, reason: EscalationReason, detail: &str, now_ms: u64) -> Verdict {
        let detail = if detail.is_empty() { None } else { Some(detail) };
        // A wait the server asked for is when room returns, as for a retry.
        let resets_in_ms = if reason == EscalationReason::ServerWaitTooLong { failed.hint_ms } else { None };
        self.escalate_with(Some(index), reason, detail, resets_in_ms, now_ms);
        let mut verdict = self.decide(index, Act::Escalate, failed, Step::Escalate(reason), true);
        verdict.cancel_task = self.end_task(index);
        if let Some(last) = self.last.as_mut() {
            last.verdict.cancel_task = verdict.cancel_task;
        }
        verdict
    }

    /// What the status check found. `failed` is the failure that asked for it.
    fn on_status_check(&mut self, index: usize, result: StatusCheckResult, mut failed: Failed, at: At, budget: &mut dyn AccountBudget) -> Verdict {
        let At { now_ms, time_left_ms, entropy } = at;
        match result {
            StatusCheckResult::Found => {
                failed.basis = Basis::Fixed("status check found the write applied");
                self.succeed(index, Some(EffectStatus::Applied), true, failed, Step::Done)
            }
            StatusCheckResult::Absent => {
                self.set_effect(index, None);
                self.calls[index].phase = Phase::Sending;
                failed.basis = Basis::Fixed("status check found the write absent");
                let down = self.record_breakers(index, None, now_ms, budget);
                self.retry_or_escalate(index, failed, Bounds { time_left_ms, reconnect: false, down }, now_ms, entropy, budget)
            }
            StatusCheckResult::Unknown => {
                failed.basis = Basis::Fixed("status check could not tell");
                self.escalate_call(index, failed, EscalationReason::StatusUnknown, None, now_ms)
            }
        }
    }

    /// The run's hand-off, once it has escalated.
    pub fn escalation(&self) -> Option<Escalation> {
        self.escalated.as_deref().cloned()
    }

    /// The run's last decision in words, if it was about call `call_id`.
    pub fn last_decision(&self, call_id: u32) -> Option<Decision> {
        let last = self.last.as_ref().filter(|last| last.index == (call_id as usize).wrapping_sub(1))?;
        let call = &self.calls[last.index];
        let verdict = &last.verdict;
        let action = match verdict.act {
            Act::Retry { delay_ms, attempt, reconnect } => Action::Retry(RetryPlan { delay_ms, attempt, idempotency_key: call.key.clone(), reconnect }),
            Act::Replan => Action::Replan(match call.last_error {
                _ if verdict.rule == Rule::Resumed => {
                    cat!("A person chose to skip this call of ", call.tool, ": go on without its result, and do not call it again for this task.")
                }
                _ if matches!(last.step, Step::CircuitOpen(_)) => circuit_message(call, &last.step, self.last_error_text(last.index)),
                Some(LastError::EmptyResult) => self.last_error_text(last.index).unwrap_or_default(),
                _ if verdict.rule == Rule::ToolErrorExpiredHandle => cat!(
                    call.tool,
                    " failed: ",
                    self.last_error_text(last.index).unwrap_or_default(),
                    " The handle it used is no longer valid: get a new one (a new snapshot, sandbox or cursor) before calling again."
                ),
                _ => cat!(call.tool, " failed: ", self.last_error_text(last.index).unwrap_or_default()),
            }),
            Act::CheckStatus => Action::CheckStatus,
            Act::Succeed => Action::Succeed(match (&last.step, &last.basis) {
                (Step::DeleteGone, Basis::Failure(c)) => Some(cat!("already deleted (", failure_label(&c.kind), ")")),
                _ if verdict.rule == Rule::Resumed => Some(String::from("a person marked it done")),
                _ if verdict.has_note => Some(String::from("already applied: a status check found it")),
                _ => None,
            }),
            Act::Escalate => Action::Escalate(self.escalation().expect("an escalated run keeps its hand-off")),
            Act::Poll { delay_ms, reconnect } => {
                Action::Poll(PollPlan { delay_ms, task_id: self.task(last.index).map(|t| t.id.clone()).unwrap_or_default(), reconnect })
            }
        };
        Some(Decision {
            action,
            class: verdict.class,
            attempt: verdict.attempt,
            hint_ms: verdict.hint_ms,
            rule: String::from(verdict.rule.name()),
            reason: reason_text(&last.basis, &last.step),
            cancel_task: verdict.cancel_task,
        })
    }

    /// What happened in the run so far.
    pub fn report(&self) -> RunReport {
        let c = &self.counters;
        RunReport {
            run_id: String::from(&*self.run_id),
            calls: self.calls.len() as u32,
            attempts: c.attempts,
            retries: c.retries,
            status_checks: c.status_checks,
            replans: c.replans,
            tasks: self.rare.as_ref().map_or(0, |b| b.tasks),
            polls: self.rare.as_ref().map_or(0, |b| b.polls),
            succeeded_calls: c.succeeded_calls,
            abandoned_calls: self.rare.as_ref().map_or(0, |r| r.abandoned_calls),
            waits: c.waits,
            waited_ms: c.waited_ms,
            escalation: self.escalation,
            statuses: self.statuses.to_vec(),
            effects: self.bounded_effects(),
            effects_total: self.effects_total(),
        }
    }
}

/// What the model is told of a call an open breaker stopped: what failed, if
/// this call failed, and that the server (or the tool) is down for a while.
fn circuit_message(call: &Call, step: &Step, last_error: Option<String>) -> String {
    let Step::CircuitOpen(down) = *step else { return String::new() };
    let server = call.server.as_deref().map_or("the server", breaker::shown_name);
    let mut text = match last_error {
        Some(error) => cat!(call.tool, " failed: ", error, ". "),
        None => cat!(call.tool, " was not called. "),
    };
    let seconds = down.until_ms.saturating_sub(down.now_ms).div_ceil(1000);
    if down.tool_level {
        cat_to!(text; "The tool ", call.tool, " on ", server, " has failed repeatedly");
    } else {
        cat_to!(text; "The server ", server, " has failed repeatedly");
    }
    cat_to!(text; " and is not called for ", seconds, " s (circuit breaker open). Use another tool, or try again later.");
    text
}

/// A decision's reason, in the words the log and `explain` show.
fn reason_text(basis: &Basis, step: &Step) -> String {
    let mut text = match basis {
        Basis::Fixed(text) => String::from(*text),
        Basis::Failure(c) => {
            let mut text = c.reason();
            for problem in c.header_problems() {
                cat_to!(text; "; ignored ", problem.name, " (", problem.problem, ")");
            }
            if let (Some(hint), Some(source)) = (c.hint_ms, c.hint_source) {
                cat_to!(text; "; ", source, " hints ", hint, " ms");
            }
            text
        }
    };
    let step = match *step {
        Step::Done => return text,
        Step::Retry { retry, of, delay_ms, account_wait_ms } => {
            let mut step = cat!("; retry ", retry, " of ", of, " after ", delay_ms, " ms");
            if let Some(ms) = account_wait_ms {
                cat_to!(step; "; the account budget has room in ", ms, " ms");
            }
            step
        }
        Step::Replan { replan, of } => cat!("; replan ", replan, " of ", of),
        Step::CheckStatus => String::from("; a write without a key may have applied: check status before resending"),
        Step::DeleteGone => String::from("; a delete whose target is gone succeeded"),
        Step::Escalate(reason) => cat!("; escalate: ", escalation::reason_text(reason)),
        Step::Poll { poll, delay_ms } => cat!("; poll ", poll, " of the task after ", delay_ms, " ms"),
        Step::TaskCancelled => String::from("; the server cancelled the task: replan"),
        Step::CircuitOpen(down) => {
            let whose = if down.tool_level { "the tool's" } else { "the server's" };
            cat!("; ", whose, " circuit breaker is open for ", down.until_ms.saturating_sub(down.now_ms), " ms more: replan")
        }
    };
    text.push_str(&step);
    text
}

#[cfg(test)]
mod abandon_tests {
    use super::*;
    use crate::account::NoAccountBudget;
    use crate::types::{Delivery, TransportError};

    const NOW: u64 = 1_764_460_800_000;

    fn run() -> Run {
        let config = Config::from_json(r#"{"tools": {"search": {"effect": "read"}, "refund": {"effect": "write"}}}"#).unwrap();
        Run::new(Arc::new(config), "r")
    }

    fn begin(run: &mut Run, tool: &str) -> u32 {
        match run.begin(None, tool.into(), None, None, NOW, &mut NoAccountBudget).unwrap() {
            Start::Send(ticket) => ticket.call_id,
            Start::Escalated | Start::Replan(_) => panic!("not admitted"),
        }
    }

    fn timeout(run: &mut Run, call_id: u32, attempt: u32) -> Verdict {
        let kind = FailureKind::Transport(TransportError::Timeout);
        let view = FailureView { kind: &kind, headers: &[], body: "", structured_content: None, session_id_sent: false, delivery: Delivery::Sent };
        run.record_failure(call_id, attempt, &view, At::now(NOW), &mut NoAccountBudget).unwrap()
    }

    #[test]
    fn an_abandoned_call_is_closed_and_counted() {
        let mut run = run();
        let id = begin(&mut run, "search");
        run.abandon_call(id, 1, true, AbandonReason::Cancelled, &mut NoAccountBudget).unwrap();
        assert_eq!(run.record_success(id, 1, NOW, &mut NoAccountBudget), Err(RunError::CallFinished(id)));
        assert_eq!(run.abandon_call(id, 1, true, AbandonReason::Cancelled, &mut NoAccountBudget), Err(RunError::CallFinished(id)));
        let report = run.report();
        assert_eq!((report.calls, report.abandoned_calls, report.effects_total), (1, 1, 0), "a read makes no effect");
    }

    #[test]
    fn a_write_stopped_on_the_wire_is_an_unknown_effect_and_one_stopped_before_sending_is_none() {
        let mut run = run();
        let sent = begin(&mut run, "refund");
        run.abandon_call(sent, 1, true, AbandonReason::Deadline, &mut NoAccountBudget).unwrap();
        let unsent = begin(&mut run, "refund");
        run.abandon_call(unsent, 1, false, AbandonReason::Cancelled, &mut NoAccountBudget).unwrap();
        let report = run.report();
        assert_eq!(report.abandoned_calls, 2);
        assert_eq!(report.effects.iter().map(|e| (e.call_id, e.status)).collect::<Vec<_>>(), vec![(sent, EffectStatus::Unknown)]);
    }

    #[test]
    fn the_attempt_must_be_the_calls_current_one_and_nothing_changes_otherwise() {
        let mut run = run();
        let id = begin(&mut run, "search");
        let verdict = timeout(&mut run, id, 1);
        assert!(matches!(verdict.act, Act::Retry { .. }), "{verdict:?}");
        let wrong = run.abandon_call(id, 1, true, AbandonReason::Cancelled, &mut NoAccountBudget);
        assert_eq!(wrong, Err(RunError::AttemptMismatch(AttemptMismatch { call_id: id, expected: 2, reported: 1 })));
        assert_eq!(run.report().abandoned_calls, 0);
        run.abandon_call(id, 2, false, AbandonReason::Cancelled, &mut NoAccountBudget).unwrap();
        assert_eq!(run.report().abandoned_calls, 1);
        assert_eq!(run.abandon_call(9, 1, false, AbandonReason::Cancelled, &mut NoAccountBudget), Err(RunError::UnknownCall(9)));
    }

    #[test]
    fn an_unkeyed_write_awaiting_its_status_check_keeps_its_one_unknown_effect() {
        let mut run = run();
        let id = begin(&mut run, "refund");
        let verdict = timeout(&mut run, id, 1);
        assert!(matches!(verdict.act, Act::CheckStatus), "{verdict:?}");
        run.abandon_call(id, 1, true, AbandonReason::Deadline, &mut NoAccountBudget).unwrap();
        let report = run.report();
        assert_eq!(report.effects.iter().map(|e| e.status).collect::<Vec<_>>(), vec![EffectStatus::Unknown]);
        assert_eq!(run.record_status_check(id, 1, StatusCheckResult::Found, At::now(NOW), &mut NoAccountBudget), Err(RunError::CallFinished(id)));
    }
}
