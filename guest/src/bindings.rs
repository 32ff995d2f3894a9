//! The component's only contact with WIT: generated bindings, conversions between
//! the generated types and the core's, and what a `no_std` component needs
//! (allocator, panic handler, `cabi_realloc`). No policy logic lives here.

use ::core::cell::RefCell;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::{account, backoff, breaker, classify, config, hints, key, rules, run, session, shared, types as model};

wit_bindgen::generate!({ world: "agent-retry", path: "../wit", generate_all });

use agent_retry::policy::account_budget as import;
use agent_retry::policy::shared_state;
use agent_retry::policy::types as wit;
use exports::agent_retry::policy::policy::{Guest, GuestPolicy, GuestRun};

// The lying policy of the hosts' guard tests (target/hostile/liar.wasm): never in the shipped component.
#[cfg(feature = "liar")]
#[path = "liar.rs"]
mod liar;

#[global_allocator]
static ALLOC: crate::wasm_alloc::SizeClasses = crate::wasm_alloc::SizeClasses::new();

#[panic_handler]
fn panic(_: &::core::panic::PanicInfo) -> ! {
    // Unreachable by design (the core returns typed errors); if it happens, the
    // host sees a trap and survives it.
    ::core::arch::wasm32::unreachable()
}

/// wit-bindgen leaves `cabi_realloc` to wasi-libc, which a `no_std` guest lacks.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cabi_realloc(old: *mut u8, old_len: usize, align: usize, new_len: usize) -> *mut u8 {
    use alloc::alloc::{Layout, alloc, realloc};
    if new_len == 0 {
        return align as *mut u8;
    }
    let ptr = unsafe {
        if old_len == 0 {
            alloc(Layout::from_size_align_unchecked(new_len, align))
        } else {
            realloc(old, Layout::from_size_align_unchecked(old_len, align), new_len)
        }
    };
    if ptr.is_null() {
        ::core::arch::wasm32::unreachable()
    }
    ptr
}

/// `memcmp` comes from wasi-libc in a `std` guest; `no_std` must bring its own.
/// Volatile reads keep LLVM from turning the loop back into a call to itself.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, len: usize) -> i32 {
    for i in 0..len {
        let (x, y) = unsafe { (a.add(i).read_volatile(), b.add(i).read_volatile()) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
    }
    0
}

/// The host's entropy, or `wasi:random` (declared in the world) when it passes none.
fn entropy(host: Option<u64>) -> u64 {
    host.unwrap_or_else(wasi::random::random::get_random_u64)
}

/// The account budget and shared state imports, seen through the core's traits.
struct HostAccountBudget;

impl shared::SharedState for HostAccountBudget {
    fn load(&mut self, key: &str, now_ms: u64) -> shared::Loaded {
        let loaded = shared_state::load(key, now_ms);
        shared::Loaded { value: loaded.value, version: loaded.version, now_ms: loaded.now_ms }
    }

    fn store_if(&mut self, key: &str, expected_version: u64, value: &str, ttl_ms: u64) -> bool {
        shared_state::store_if(key, expected_version, value, ttl_ms)
    }
}

impl account::AccountBudget for HostAccountBudget {
    fn reserve(&mut self, account_id: &str, tokens: u32, bucket: account::Bucket, max_wait_ms: u64, now_ms: u64) -> account::Reservation {
        let bucket = import::Bucket { capacity: bucket.capacity, refill_interval_ms: bucket.refill_interval_ms };
        match import::reserve(account_id, tokens, bucket, max_wait_ms, now_ms) {
            import::Reservation::Granted(wait) => account::Reservation::Granted(wait),
            import::Reservation::Refused(wait) => account::Reservation::Refused(wait),
        }
    }

    fn refund(&mut self, account_id: &str, tokens: u32, bucket: account::Bucket, now_ms: u64) {
        let bucket = import::Bucket { capacity: bucket.capacity, refill_interval_ms: bucket.refill_interval_ms };
        import::refund(account_id, tokens, bucket, now_ms);
    }
}

struct Component;

pub struct Policy {
    config: Arc<config::Config>,
    #[cfg(feature = "liar")]
    lies: liar::Lies,
}

pub struct Run {
    run: RefCell<run::Run>,
    #[cfg(feature = "liar")]
    liar: liar::RunLies,
}

// A run in flight is one 128-byte block of the allocator's power-of-two
// classes (wit-bindgen keeps it as an `Option<Run>`): one byte more doubles
// it, and 100,000 runs no longer fit in an instance's 64 MiB
// (tests/harness/tests/host/sandbox.rs).
#[cfg(not(feature = "liar"))]
const _: () = assert!(::core::mem::size_of::<Option<Run>>() <= 128, "a run record past 128 bytes takes a 256-byte block");

impl Guest for Component {
    type Policy = Policy;
    type Run = Run;

    fn derive_idempotency_key(run_id: String, action_id: String) -> String {
        key::derive_idempotency_key(&run_id, &action_id)
    }

    fn rule_names() -> Vec<String> {
        rules::RULE_NAMES.iter().map(|name| String::from(*name)).collect()
    }

    fn read_probe_answer(http_status: Option<u16>, json_rpc_code: Option<i32>) -> wit::ProbeAnswer {
        match session::read_probe_answer(http_status, json_rpc_code) {
            model::ProbeAnswer::OlderServer => wit::ProbeAnswer::OlderServer,
            model::ProbeAnswer::Failure => wit::ProbeAnswer::Failure,
        }
    }
}

impl GuestPolicy for Policy {
    #[cfg(not(feature = "liar"))]
    fn from_json(text: String) -> Result<exports::agent_retry::policy::policy::Policy, wit::ConfigError> {
        match config::Config::from_json(&text) {
            Ok(config) => Ok(exports::agent_retry::policy::policy::Policy::new(Policy { config: Arc::new(config) })),
            Err(e) => Err(e.into()),
        }
    }

    /// The liar's `"x-liar"` is taken out before the real policy reads the rest.
    #[cfg(feature = "liar")]
    fn from_json(text: String) -> Result<exports::agent_retry::policy::policy::Policy, wit::ConfigError> {
        let mut lies = liar::Lies::default();
        let parsed = match crate::json::parse(&text) {
            Ok(crate::json::Json::Object(mut members)) => {
                if let Some(at) = members.iter().position(|(name, _)| name == "x-liar") {
                    lies = liar::Lies::from_json(&members.remove(at).1);
                }
                config::Config::from_parsed(crate::json::Json::Object(members))
            }
            _ => config::Config::from_json(&text),
        };
        match parsed {
            Ok(config) => Ok(exports::agent_retry::policy::policy::Policy::new(Policy { config: Arc::new(config), lies })),
            Err(e) => Err(e.into()),
        }
    }

    fn effective_config(&self) -> String {
        self.config.to_json()
    }

    fn classify(&self, observation: wit::Observation, now_ms: u64) -> wit::Classification {
        let kind = observation.kind.into();
        let pairs = hints::split_lines(&observation.headers);
        let view = view(&kind, &pairs, &observation);
        classify::classify_view(&view, &self.config, None, now_ms).into_classification().into()
    }

    fn next_delay(&self, retry: u32, hint_ms: Option<u64>, entropy_: Option<u64>) -> u64 {
        backoff::next_delay_ms(self.config.base_delay_ms, self.config.max_delay_ms, retry, hint_ms, entropy(entropy_))
    }

    fn start_run(&self, run_id: String) -> Result<exports::agent_retry::policy::policy::Run, wit::RunError> {
        let run = run::Run::start(Arc::clone(&self.config), &run_id)?;
        Ok(self.wrap(run))
    }

    fn resume_run(&self, snapshot: String, answer: wit::ResumeAnswer, now_ms: u64) -> Result<exports::agent_retry::policy::policy::Run, wit::SnapshotError> {
        let answer = match answer {
            wit::ResumeAnswer::Retry => model::ResumeAnswer::Retry,
            wit::ResumeAnswer::Done(result) => model::ResumeAnswer::Done(result),
            wit::ResumeAnswer::Skip => model::ResumeAnswer::Skip,
            wit::ResumeAnswer::Abort => model::ResumeAnswer::Abort,
        };
        let run = run::Run::resume(Arc::clone(&self.config), &snapshot, answer, now_ms, &mut HostAccountBudget)?;
        Ok(self.wrap(run))
    }
}

impl Policy {
    fn wrap(&self, run: run::Run) -> exports::agent_retry::policy::policy::Run {
        exports::agent_retry::policy::policy::Run::new(Run {
            run: RefCell::new(run),
            #[cfg(feature = "liar")]
            liar: liar::RunLies::new(self.lies.clone()),
        })
    }
}

impl Run {
    /// The contract's verdict, with whether the report changed a breaker.
    fn verdict(&self, verdict: run::Verdict) -> wit::Verdict {
        let mut verdict: wit::Verdict = verdict.into();
        verdict.breaker_changed = self.run.borrow().breaker_changed();
        verdict
    }
}

impl GuestRun for Run {
    fn begin_call(
        &self,
        server: Option<String>,
        tool: String,
        key: Option<String>,
        hints: Option<wit::ToolHints>,
        now_ms: u64,
    ) -> Result<wit::CallStart, wit::RunError> {
        let hints = hints.map(Into::into);
        #[cfg(feature = "liar")]
        let (liar_tool, liar_key) = (tool.clone(), key.clone());
        let start = self.run.borrow_mut().begin(server, tool, key, hints.as_ref(), now_ms, &mut HostAccountBudget)?;
        let breaker_changed = self.run.borrow().breaker_changed();
        let refused = |call_id, replan| wit::CallStart {
            admitted: false,
            call_id,
            delay_ms: 0,
            effect: wit::Effect::Read,
            safe_to_repeat: false,
            idle_timeout_ms: 0,
            attempt_timeout_ms: 0,
            replan,
            breaker_changed,
        };
        #[allow(unused_mut)]
        let mut start = match start {
            run::Start::Send(t) => wit::CallStart {
                admitted: true,
                call_id: t.call_id,
                delay_ms: t.delay_ms,
                effect: t.effect.into(),
                safe_to_repeat: t.safe_to_repeat,
                idle_timeout_ms: t.idle_timeout_ms,
                attempt_timeout_ms: t.attempt_timeout_ms,
                replan: false,
                breaker_changed,
            },
            run::Start::Escalated => refused(0, false),
            run::Start::Replan(call_id) => refused(call_id, true),
        };
        #[cfg(feature = "liar")]
        self.liar.begun(&liar_tool, liar_key.as_deref(), &mut start);
        Ok(start)
    }

    fn record_success(&self, call_id: u32, attempt: u32, now_ms: u64) -> Result<wit::Verdict, wit::RunError> {
        #[cfg(feature = "liar")]
        if let Some(verdict) = self.liar.answer(call_id, attempt, false) {
            return Ok(verdict);
        }
        // Two statements: the run's `RefMut` must be gone before `verdict` borrows it.
        let verdict = self.run.borrow_mut().record_success(call_id, attempt, now_ms, &mut HostAccountBudget)?;
        let verdict = self.verdict(verdict);
        #[cfg(feature = "liar")]
        let verdict = self.liar.verdict(call_id, verdict);
        Ok(verdict)
    }

    fn record_empty_result(&self, call_id: u32, attempt: u32, detail: String, now_ms: u64) -> Result<wit::Verdict, wit::RunError> {
        let verdict = self.run.borrow_mut().record_empty_result(call_id, attempt, &detail, now_ms, &mut HostAccountBudget)?;
        Ok(self.verdict(verdict))
    }

    fn record_failure(
        &self,
        call_id: u32,
        attempt: u32,
        observation: wit::Observation,
        time_left_ms: Option<u64>,
        now_ms: u64,
        entropy: u64,
    ) -> Result<wit::Verdict, wit::RunError> {
        #[cfg(feature = "liar")]
        if let Some(verdict) = self.liar.answer(call_id, attempt, true) {
            return Ok(verdict);
        }
        let kind = observation.kind.into();
        let pairs = hints::split_lines(&observation.headers);
        let view = view(&kind, &pairs, &observation);
        let verdict = self.run.borrow_mut().record_failure(call_id, attempt, &view, run::At { now_ms, time_left_ms, entropy }, &mut HostAccountBudget)?;
        let verdict = self.verdict(verdict);
        #[cfg(feature = "liar")]
        let verdict = self.liar.verdict(call_id, verdict);
        Ok(verdict)
    }

    fn record_status_check(
        &self,
        call_id: u32,
        attempt: u32,
        result: wit::StatusCheckResult,
        time_left_ms: Option<u64>,
        now_ms: u64,
        entropy: u64,
    ) -> Result<wit::Verdict, wit::RunError> {
        #[cfg(feature = "liar")]
        if let Some(verdict) = self.liar.answer(call_id, attempt, true) {
            return Ok(verdict);
        }
        let verdict =
            self.run.borrow_mut().record_status_check(call_id, attempt, result.into(), run::At { now_ms, time_left_ms, entropy }, &mut HostAccountBudget)?;
        let verdict = self.verdict(verdict);
        #[cfg(feature = "liar")]
        let verdict = self.liar.verdict(call_id, verdict);
        Ok(verdict)
    }

    fn record_task_status(
        &self,
        call_id: u32,
        attempt: u32,
        task: wit::TaskReport,
        time_left_ms: Option<u64>,
        now_ms: u64,
        entropy: u64,
    ) -> Result<wit::Verdict, wit::RunError> {
        let report = model::TaskReport {
            task_id: task.task_id,
            status: task.status.into(),
            poll_interval_ms: task.poll_interval_ms,
            ttl_ms: task.ttl_ms,
            age_ms: task.age_ms,
            message: task.message,
        };
        let verdict = self.run.borrow_mut().record_task_status(call_id, attempt, &report, run::At { now_ms, time_left_ms, entropy }, &mut HostAccountBudget)?;
        let verdict = self.verdict(verdict);
        #[cfg(feature = "liar")]
        let verdict = self.liar.verdict(call_id, verdict);
        Ok(verdict)
    }

    fn record_poll_failure(
        &self,
        call_id: u32,
        attempt: u32,
        observation: wit::Observation,
        time_left_ms: Option<u64>,
        now_ms: u64,
        entropy: u64,
    ) -> Result<wit::Verdict, wit::RunError> {
        let kind = observation.kind.into();
        let pairs = hints::split_lines(&observation.headers);
        let view = view(&kind, &pairs, &observation);
        let verdict = self.run.borrow_mut().record_poll_failure(call_id, attempt, &view, run::At { now_ms, time_left_ms, entropy }, &mut HostAccountBudget)?;
        Ok(self.verdict(verdict))
    }

    fn abandon_call(&self, call_id: u32, attempt: u32, sent: bool, why: wit::AbandonReason) -> Result<(), wit::RunError> {
        let why = match why {
            wit::AbandonReason::Cancelled => model::AbandonReason::Cancelled,
            wit::AbandonReason::Deadline => model::AbandonReason::Deadline,
        };
        Ok(self.run.borrow_mut().abandon_call(call_id, attempt, sent, why, &mut HostAccountBudget)?)
    }

    fn last_decision(&self, call_id: u32) -> Option<wit::Decision> {
        let decision = self.run.borrow().last_decision(call_id).map(Into::into);
        #[cfg(feature = "liar")]
        let decision = self.liar.decision(call_id, decision);
        decision
    }

    fn take_breaker_changes(&self) -> Vec<wit::BreakerChange> {
        let mode = |m: breaker::Mode| match m {
            breaker::Mode::Closed => wit::BreakerState::Closed,
            breaker::Mode::Open => wit::BreakerState::Open,
            breaker::Mode::HalfOpen => wit::BreakerState::HalfOpen,
        };
        let changes = self.run.borrow_mut().take_breaker_changes();
        changes
            .into_iter()
            .map(|c| wit::BreakerChange {
                server: c.server,
                tool: c.tool,
                old_state: mode(c.change.from),
                new_state: mode(c.change.to),
                until_ms: c.change.until_ms,
                why: c.change.why,
            })
            .collect()
    }

    fn escalation(&self) -> Option<wit::Escalation> {
        self.run.borrow().escalation().map(Into::into)
    }

    fn report(&self) -> wit::RunReport {
        self.run.borrow().report().into()
    }

    fn effects(&self, start: u32, max_count: u32) -> Vec<wit::EffectRecord> {
        map_vec(self.run.borrow().effects_page(start, max_count))
    }

    fn snapshot(&self, arguments_json: Option<String>, now_ms: u64) -> Result<String, wit::SnapshotError> {
        Ok(self.run.borrow().snapshot(arguments_json.as_deref(), now_ms)?)
    }

    fn resumed_call(&self) -> Option<wit::ResumedCall> {
        let c = self.run.borrow().resumed_call()?;
        Some(wit::ResumedCall {
            call_id: c.call_id,
            tool: c.tool,
            server: c.server,
            idempotency_key: c.idempotency_key,
            arguments_json: c.arguments_json,
            action: c.action.into(),
            ticket: c.ticket.map(|t| wit::CallStart {
                admitted: true,
                call_id: t.call_id,
                delay_ms: t.delay_ms,
                effect: t.effect.into(),
                safe_to_repeat: t.safe_to_repeat,
                idle_timeout_ms: t.idle_timeout_ms,
                attempt_timeout_ms: t.attempt_timeout_ms,
                replan: false,
                breaker_changed: false,
            }),
            attempt: c.attempt,
            result_text: c.result_text,
        })
    }
}

export!(Component);

/// An observation as the core reads it, borrowing the host's strings.
fn view<'a>(kind: &'a model::FailureKind, pairs: &'a [hints::Pair<'a>], observation: &'a wit::Observation) -> classify::FailureView<'a> {
    classify::FailureView {
        kind,
        headers: pairs,
        body: &observation.body,
        structured_content: observation.structured_content.as_deref(),
        session_id_sent: observation.session_id_sent,
        delivery: observation.delivery.into(),
    }
}

// ===== conversions: the generated types and the core's have the same shapes =====

/// Converts a fieldless enum case by case.
macro_rules! enum_map {
    ($from:ty => $to:ty { $($case:ident),* $(,)? }) => {
        impl From<$from> for $to {
            fn from(value: $from) -> Self {
                match value { $(<$from>::$case => <$to>::$case),* }
            }
        }
    };
}

enum_map!(wit::TransportError => model::TransportError { Timeout, ConnectionReset, ConnectionRefused, StreamClosed, Tls, NameResolution, Other });
enum_map!(wit::Delivery => model::Delivery { Unknown, NotSent, Sent, AnswerStarted });
enum_map!(model::OutcomeClass => wit::OutcomeClass { Success, Transient, Throttled, Deterministic, Permission, Semantic, Misconfigured, NeedsInput, Unclassified });
enum_map!(wit::TaskStatus => model::TaskStatus { Working, InputAnswered, InputRequired, Cancelled });
enum_map!(model::Effect => wit::Effect { Read, Write, Delete });
enum_map!(model::EscalationReason => wit::EscalationReason {
    PermissionDenied, ReplansSpent, CallAttemptsSpent, RunRetriesSpent, RunStepsSpent,
    ServerWaitTooLong, RetryForbidden, AccountBudgetExhausted, RetryQuotaExhausted, UnclassifiedFailure, StatusUnknown,
    ConnectionMisconfigured, DeadlineTooNear, ProtocolVersionUnsupported, InputRequired, TaskExpired, TaskPollsSpent, TaskCancelled, CircuitOpen,
    RetryBudgetExhausted, Aborted,
});
enum_map!(model::ResumedAction => wit::ResumedAction { Send, Succeed, Replan, Escalate });
enum_map!(model::SnapshotErrorKind => wit::SnapshotErrorKind { Malformed, Tampered, OtherContract, TooLarge, NotEscalated, CallsOpen });
enum_map!(model::EffectStatus => wit::EffectStatus { Applied, Unknown });
enum_map!(wit::StatusCheckResult => model::StatusCheckResult { Found, Absent, Unknown });
enum_map!(model::ConfigErrorKind => wit::ConfigErrorKind { Syntax, UnknownField, WrongType, OutOfRange, TooLarge });

fn map_vec<A, B: From<A>>(items: Vec<A>) -> Vec<B> {
    items.into_iter().map(Into::into).collect()
}

impl From<wit::FailureKind> for model::FailureKind {
    fn from(kind: wit::FailureKind) -> Self {
        match kind {
            wit::FailureKind::HttpStatus(s) => model::FailureKind::HttpStatus(s),
            wit::FailureKind::Transport(e) => model::FailureKind::Transport(e.into()),
            wit::FailureKind::ProtocolError(c) => model::FailureKind::ProtocolError(c),
            wit::FailureKind::ToolError(s) => model::FailureKind::ToolError(s),
            wit::FailureKind::InputRequired => model::FailureKind::InputRequired,
        }
    }
}

impl From<wit::ToolHints> for model::ToolHints {
    fn from(h: wit::ToolHints) -> Self {
        model::ToolHints { read_only: h.read_only, destructive: h.destructive, idempotent: h.idempotent }
    }
}

impl From<run::Verdict> for wit::Verdict {
    fn from(v: run::Verdict) -> Self {
        let (action, delay_ms, reconnect) = match v.act {
            run::Act::Retry { delay_ms, reconnect, .. } => (wit::ActionKind::Retry, delay_ms, reconnect),
            run::Act::Replan => (wit::ActionKind::Replan, 0, false),
            run::Act::CheckStatus => (wit::ActionKind::CheckStatus, 0, false),
            run::Act::Succeed => (wit::ActionKind::Succeed, 0, false),
            run::Act::Escalate => (wit::ActionKind::Escalate, 0, false),
            run::Act::Poll { delay_ms, reconnect } => (wit::ActionKind::Poll, delay_ms, reconnect),
        };
        let rule_index = v.rule.index();
        let (class, attempt, hint_ms, has_note, cancel_task) = (v.class.into(), v.attempt, v.hint_ms, v.has_note, v.cancel_task);
        // `Run::verdict` sets `breaker-changed`, which only the run knows.
        wit::Verdict { action, class, attempt, delay_ms, hint_ms, rule_index, has_note, reconnect, cancel_task, breaker_changed: false }
    }
}

impl From<model::HeaderProblem> for wit::HeaderProblem {
    fn from(p: model::HeaderProblem) -> Self {
        wit::HeaderProblem { name: p.name, value: p.value, problem: p.problem }
    }
}

impl From<model::Classification> for wit::Classification {
    fn from(c: model::Classification) -> Self {
        wit::Classification {
            class: c.class.into(),
            hint_ms: c.hint_ms,
            hint_source: c.hint_source,
            server_says_retry: c.server_says_retry,
            rule: c.rule,
            reason: c.reason,
            header_problems: map_vec(c.header_problems),
        }
    }
}

impl From<model::EffectRecord> for wit::EffectRecord {
    fn from(e: model::EffectRecord) -> Self {
        wit::EffectRecord { call_id: e.call_id, tool: e.tool, idempotency_key: e.idempotency_key, status: e.status.into() }
    }
}

impl From<model::Escalation> for wit::Escalation {
    fn from(e: model::Escalation) -> Self {
        wit::Escalation {
            reason: e.reason.into(),
            last_error: e.last_error,
            resets_in_ms: e.resets_in_ms,
            effects: map_vec(e.effects),
            effects_total: e.effects_total,
            note: e.note,
        }
    }
}

impl From<model::Decision> for wit::Decision {
    fn from(d: model::Decision) -> Self {
        let action = match d.action {
            model::Action::Retry(p) => {
                wit::Action::Retry(wit::RetryPlan { delay_ms: p.delay_ms, attempt: p.attempt, idempotency_key: p.idempotency_key, reconnect: p.reconnect })
            }
            model::Action::Replan(message) => wit::Action::Replan(message),
            model::Action::CheckStatus => wit::Action::CheckStatus,
            model::Action::Succeed(note) => wit::Action::Succeed(note),
            model::Action::Escalate(e) => wit::Action::Escalate(e.into()),
            model::Action::Poll(p) => wit::Action::Poll(wit::PollPlan { delay_ms: p.delay_ms, task_id: p.task_id, reconnect: p.reconnect }),
        };
        let (class, attempt, hint_ms, cancel_task) = (d.class.into(), d.attempt, d.hint_ms, d.cancel_task);
        wit::Decision { action, class, attempt, hint_ms, rule: d.rule, reason: d.reason, cancel_task }
    }
}

impl From<model::RunReport> for wit::RunReport {
    fn from(r: model::RunReport) -> Self {
        wit::RunReport {
            run_id: r.run_id,
            calls: r.calls,
            attempts: r.attempts,
            retries: r.retries,
            status_checks: r.status_checks,
            replans: r.replans,
            tasks: r.tasks,
            polls: r.polls,
            succeeded_calls: r.succeeded_calls,
            abandoned_calls: r.abandoned_calls,
            waits: r.waits,
            waited_ms: r.waited_ms,
            escalation: r.escalation.map(Into::into),
            statuses: r.statuses.into_iter().map(|s| wit::StatusCount { status: s.status, count: s.count }).collect(),
            effects: map_vec(r.effects),
            effects_total: r.effects_total,
        }
    }
}

impl From<model::RunError> for wit::RunError {
    fn from(e: model::RunError) -> Self {
        match e {
            model::RunError::UnknownCall(id) => wit::RunError::UnknownCall(id),
            model::RunError::CallFinished(id) => wit::RunError::CallFinished(id),
            model::RunError::StatusCheckPending(id) => wit::RunError::StatusCheckPending(id),
            model::RunError::NoStatusCheckPending(id) => wit::RunError::NoStatusCheckPending(id),
            model::RunError::RunEnded(reason) => wit::RunError::RunEnded(reason.into()),
            model::RunError::NoTask(id) => wit::RunError::NoTask(id),
            model::RunError::AttemptMismatch(m) => {
                wit::RunError::AttemptMismatch(wit::AttemptMismatch { call_id: m.call_id, expected: m.expected, reported: m.reported })
            }
            model::RunError::TooLarge(l) => wit::RunError::TooLarge(wit::SizeLimit { input: l.input, size_bytes: l.size_bytes, limit_bytes: l.limit_bytes }),
        }
    }
}

impl From<model::SnapshotError> for wit::SnapshotError {
    fn from(e: model::SnapshotError) -> Self {
        wit::SnapshotError { kind: e.kind.into(), message: e.message }
    }
}

impl From<model::ConfigError> for wit::ConfigError {
    fn from(e: model::ConfigError) -> Self {
        wit::ConfigError { kind: e.kind.into(), field: e.field, message: e.message }
    }
}
