//! A run's way back from an escalation: its snapshot (`run.snapshot`) and a
//! run rebuilt from one with a person's answer (`policy.resume-run`). The
//! document's form is `snapshot.rs`'s; this file maps a run onto it and back,
//! and applies the answer. Budgets are counters of what was spent: a resumed
//! run keeps them, so no answer can give one back.

use super::*;
use crate::snapshot::{self, CallRecord, Snapshot};
use crate::types::{ResumeAnswer, ResumedAction, ResumedCall, SnapshotError, SnapshotErrorKind};

impl Run {
    /// The call `begin` refused as it escalated the run, kept for a snapshot.
    pub(super) fn keep_pending(&mut self, server: Option<&str>, tool: &str, key: Option<&str>, hints: Option<&ToolHints>) {
        let server = server.filter(|_| self.config.circuit_breaker.is_some()).map(|s| Box::<str>::from(breaker::server_name(s)));
        let policy = self.config.tool_policy(tool, hints);
        let mut call = Call::new(server, String::from(tool), key.map(String::from), policy, 0);
        call.attempt = 0;
        call.phase = Phase::Finished;
        self.rare.get_or_insert_with(Box::default).pending = Some(call);
    }

    /// The answers a person may give to an escalation stopped by call `index`
    /// (else the call `begin` refused), and which are safe.
    pub(super) fn answers(&self, index: Option<usize>) -> Option<[(&'static str, snapshot::Safety); 4]> {
        let call = match index {
            Some(i) => &self.calls[i],
            None => self.rare.as_ref()?.pending.as_ref()?,
        };
        let status = call.effect_index.map(|i| self.effects[i as usize].1);
        Some(snapshot::answers(call.policy.effect, call.safe_to_repeat(), status))
    }

    /// The snapshot of an escalated run, with the stopped call's arguments.
    pub fn snapshot(&self, arguments: Option<&str>, now_ms: u64) -> Result<String, SnapshotError> {
        let (Some(reason), Some(escalated)) = (self.escalation, self.escalated.as_deref()) else {
            return Err(SnapshotError::new(SnapshotErrorKind::NotEscalated, "the run has not escalated: there is nothing to resume"));
        };
        if reason == EscalationReason::Aborted {
            return Err(SnapshotError::new(SnapshotErrorKind::NotEscalated, "a person aborted the run: it is over, and is not resumed again"));
        }
        if arguments.is_some_and(|a| a.len() > snapshot::MAX_ARGUMENTS_BYTES) {
            return Err(SnapshotError::new(SnapshotErrorKind::TooLarge, cat!("arguments-json is more than ", snapshot::MAX_ARGUMENTS_BYTES, " bytes")));
        }
        let calls_total = self.calls.len() as u32;
        if calls_total > snapshot::MAX_CALLS {
            return Err(SnapshotError::new(SnapshotErrorKind::TooLarge, cat!("the run has ", calls_total, " calls, more than ", snapshot::MAX_CALLS)));
        }
        let rare = self.rare.as_deref();
        let stopped = rare.and_then(|r| r.stopped);
        if let Some(open) = self.calls.iter().position(|c| c.phase != Phase::Finished) {
            let message = cat!("call ", open + 1, " is still open: abandon it (abandon-call) before taking a snapshot");
            return Err(SnapshotError::new(SnapshotErrorKind::CallsOpen, message));
        }
        let record = |index: usize, call: &Call| CallRecord {
            id: index as u32 + 1,
            tool: call.tool.clone(),
            server: call.server.as_deref().map(String::from),
            key: call.key.clone(),
            effect: call.policy.effect,
            idempotent: call.policy.idempotent,
            attempt: call.attempt,
            last_error: if index < self.calls.len() { self.last_error_text(index) } else { None },
        };
        let mut calls: Vec<CallRecord> =
            self.calls.iter().enumerate().filter(|(i, c)| c.effect_index.is_some() || stopped == Some(*i as u32)).map(|(i, c)| record(i, c)).collect();
        let (stopped, begun) = match (stopped, rare.and_then(|r| r.pending.as_ref())) {
            (Some(i), _) => (i + 1, true),
            (None, Some(pending)) => {
                calls.push(record(self.calls.len(), pending));
                (calls_total + 1, false)
            }
            (None, None) => return Err(SnapshotError::new(SnapshotErrorKind::NotEscalated, "the run's escalation stopped no call")),
        };
        let c = &self.counters;
        let counters = [
            c.attempts.into(),
            c.retries.into(),
            c.status_checks.into(),
            c.replans.into(),
            c.succeeded_calls.into(),
            c.waits.into(),
            c.waited_ms,
            rare.map_or(0, |r| r.tasks).into(),
            rare.map_or(0, |r| r.polls).into(),
            rare.map_or(0, |r| r.abandoned_calls).into(),
        ];
        let document = Snapshot {
            contract: String::from(snapshot::CONTRACT_VERSION),
            run_id: String::from(&*self.run_id),
            taken_at_ms: now_ms,
            reason,
            stopped,
            begun,
            calls_total,
            counters,
            statuses: self.statuses.to_vec(),
            calls,
            effects: self.effects.iter().map(|(i, s)| (i + 1, *s)).collect(),
            arguments: arguments.map(String::from),
            note: escalated.note.clone(),
        };
        let text = document.write();
        if text.len() > snapshot::MAX_SNAPSHOT_BYTES {
            let message = cat!("the snapshot would be ", text.len(), " bytes, more than the ", snapshot::MAX_SNAPSHOT_BYTES, "-byte limit");
            return Err(SnapshotError::new(SnapshotErrorKind::TooLarge, message));
        }
        Ok(text)
    }

    /// A run rebuilt from `text` under `config`, with the person's `answer` applied.
    pub fn resume(config: Arc<Config>, text: &str, answer: ResumeAnswer, now_ms: u64, budget: &mut dyn AccountBudget) -> Result<Run, SnapshotError> {
        if let ResumeAnswer::Done(Some(result)) = &answer
            && result.len() > snapshot::MAX_ARGUMENTS_BYTES
        {
            return Err(SnapshotError::new(
                SnapshotErrorKind::TooLarge,
                cat!("the done answer's result is more than ", snapshot::MAX_ARGUMENTS_BYTES, " bytes"),
            ));
        }
        let doc = Snapshot::read(text)?;
        let mut run = Run::new(config, &doc.run_id);
        let mut records = doc.calls.iter().peekable();
        for id in 1..=doc.calls_total + u32::from(!doc.begun) {
            let call = match records.next_if(|r| r.id == id) {
                Some(record) => rebuilt(record),
                // A call without an effect that did not stop the run: only its place matters.
                None => rebuilt(&CallRecord {
                    id,
                    tool: String::new(),
                    server: None,
                    key: None,
                    effect: Effect::Read,
                    idempotent: true,
                    attempt: 0,
                    last_error: None,
                }),
            };
            run.calls.push(call);
        }
        for (id, status) in &doc.effects {
            let index = *id as usize - 1;
            run.calls[index].effect_index = Some(run.effects.len() as u32);
            run.effects.push((*id - 1, *status));
        }
        let [attempts, retries, status_checks, replans, succeeded_calls, waits, waited_ms, tasks, polls, abandoned_calls] = doc.counters;
        let small = |v: u64| v as u32; // read within u32 (`snapshot.rs`)
        run.counters = Counters {
            attempts: small(attempts),
            retries: small(retries),
            status_checks: small(status_checks),
            replans: small(replans),
            succeeded_calls: small(succeeded_calls),
            waits: small(waits),
            waited_ms,
        };
        run.statuses = doc.statuses.into_boxed_slice();
        let rare = run.rare.get_or_insert_with(Box::default);
        (rare.tasks, rare.polls, rare.abandoned_calls) = (small(tasks), small(polls), small(abandoned_calls));
        let index = doc.stopped as usize - 1;
        let action = run.answer(index, doc.begun, &answer, now_ms, budget);
        let call = &run.calls[index];
        let ticket = match action {
            ResumedAction::Send => {
                let (idle_timeout_ms, attempt_timeout_ms) = run.config.timeouts(&call.tool);
                let delay_ms = run.last.as_ref().map_or(0, |l| match l.verdict.act {
                    Act::Retry { delay_ms, .. } => delay_ms,
                    _ => 0,
                });
                Some(CallTicket {
                    call_id: doc.stopped,
                    delay_ms,
                    effect: call.policy.effect,
                    safe_to_repeat: call.safe_to_repeat(),
                    idle_timeout_ms,
                    attempt_timeout_ms,
                })
            }
            _ => None,
        };
        let resumed = ResumedCall {
            call_id: doc.stopped,
            tool: call.tool.clone(),
            server: call.server.as_deref().map(String::from),
            idempotency_key: call.key.clone(),
            arguments_json: doc.arguments,
            action,
            ticket,
            attempt: call.attempt,
            result_text: match answer {
                ResumeAnswer::Done(result) if action == ResumedAction::Succeed => result,
                _ => None,
            },
        };
        run.rare.get_or_insert_with(Box::default).resumed = Some(resumed);
        Ok(run)
    }

    /// Applies a person's answer to the stopped call `index`.
    fn answer(&mut self, index: usize, begun: bool, answer: &ResumeAnswer, now_ms: u64, budget: &mut dyn AccountBudget) -> ResumedAction {
        let person = |class, basis| Failed { class, hint_ms: None, rule: Rule::Resumed, basis: Basis::Fixed(basis) };
        match answer {
            ResumeAnswer::Abort => {
                self.escalate(Some(index), EscalationReason::Aborted, None, now_ms);
                ResumedAction::Escalate
            }
            ResumeAnswer::Skip => {
                self.decide(index, Act::Replan, person(OutcomeClass::Permission, "a person skipped the call"), Step::Done, true);
                ResumedAction::Replan
            }
            ResumeAnswer::Done(_) => {
                let effect = (self.calls[index].policy.effect != Effect::Read).then_some(EffectStatus::Applied);
                self.succeed(index, effect, true, person(OutcomeClass::Success, "a person marked the call done"), Step::Done);
                ResumedAction::Succeed
            }
            ResumeAnswer::Retry => {
                // The person allowed it: the run's and the call's retry limits
                // are not asked, but the account's allowance is (it is the fleet's).
                match budget::withdraw(&self.config, Spend::FirstAttempt, None, now_ms, budget) {
                    Err(refused) => {
                        self.escalate(Some(index), refused.reason, Some(refused.resets_in_ms), now_ms);
                        ResumedAction::Escalate
                    }
                    Ok(taken) => {
                        self.counters.attempts = self.counters.attempts.saturating_add(1);
                        if begun {
                            self.counters.retries = self.counters.retries.saturating_add(1);
                        }
                        self.note_wait(taken.wait_ms);
                        let call = &mut self.calls[index];
                        let failed = call.attempt;
                        call.attempt += 1;
                        call.phase = Phase::Sending;
                        let next = call.attempt;
                        let act = Act::Retry { delay_ms: taken.wait_ms, attempt: next, reconnect: false };
                        let verdict = Verdict {
                            act,
                            class: OutcomeClass::Transient,
                            attempt: failed,
                            hint_ms: None,
                            rule: Rule::Resumed,
                            has_note: false,
                            cancel_task: false,
                        };
                        let step = Step::Retry {
                            retry: next.saturating_sub(1),
                            of: self.config.max_attempts_per_call.saturating_sub(1),
                            delay_ms: taken.wait_ms,
                            account_wait_ms: None,
                        };
                        self.keep_last(Last { index, verdict, basis: Basis::Fixed("a person answered retry"), step });
                        ResumedAction::Send
                    }
                }
            }
        }
    }

    /// After a resume: the stopped call and what to do with it.
    pub fn resumed_call(&self) -> Option<ResumedCall> {
        self.rare.as_ref()?.resumed.clone()
    }
}

/// A call of the snapshot, finished, as the run keeps it.
fn rebuilt(record: &CallRecord) -> Call {
    let policy = ToolPolicy { effect: record.effect, idempotent: record.idempotent };
    let mut call = Call::new(record.server.as_deref().map(Box::from), record.tool.clone(), record.key.clone(), policy, 0);
    call.attempt = record.attempt;
    call.phase = Phase::Finished;
    if let Some(error) = &record.last_error {
        call.last_error = Some(LastError::Task);
        call.last_text = error.clone();
    }
    call
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::{Bucket, NoAccountBudget, Reservation};
    use crate::types::{Delivery, TransportError};

    const NOW: u64 = 1_764_460_800_000;

    fn escalated(config: &str) -> Run {
        let mut run = Run::new(Arc::new(Config::from_json(config).unwrap()), "r-1");
        let Start::Send(ticket) = run.begin(None, "issue_refund".into(), None, None, NOW, &mut NoAccountBudget).unwrap() else { panic!("not admitted") };
        let kind = FailureKind::Transport(TransportError::Timeout);
        let view = FailureView { kind: &kind, headers: &[], body: "", structured_content: None, session_id_sent: false, delivery: Delivery::Sent };
        let verdict = run.record_failure(ticket.call_id, 1, &view, At::now(NOW), &mut NoAccountBudget).unwrap();
        assert_eq!(verdict.act, Act::CheckStatus);
        let verdict = run.record_status_check(ticket.call_id, 1, crate::types::StatusCheckResult::Unknown, At::now(NOW), &mut NoAccountBudget).unwrap();
        assert_eq!(verdict.act, Act::Escalate);
        run
    }

    const WRITE: &str = r#"{"tools": {"issue_refund": {"effect": "write"}}}"#;

    /// An account with no room: every reservation is refused for a second.
    struct Full;
    impl crate::shared::SharedState for Full {}
    impl AccountBudget for Full {
        fn reserve(&mut self, _: &str, _: u32, _: Bucket, _: u64, _: u64) -> Reservation {
            Reservation::Refused(1000)
        }
        fn refund(&mut self, _: &str, _: u32, _: Bucket, _: u64) {}
    }

    #[test]
    fn a_person_s_retry_keeps_the_counters_and_the_account_is_still_asked() {
        let run = escalated(WRITE);
        let text = run.snapshot(Some("{\"order_id\":\"A1\"}"), NOW).unwrap();
        let before = run.report();
        let config = Arc::new(Config::from_json(WRITE).unwrap());
        let resumed = Run::resume(Arc::clone(&config), &text, ResumeAnswer::Retry, NOW + 5, &mut NoAccountBudget).unwrap();
        let call = resumed.resumed_call().unwrap();
        assert_eq!((call.action, call.attempt, call.arguments_json.as_deref()), (ResumedAction::Send, 2, Some("{\"order_id\":\"A1\"}")));
        let after = resumed.report();
        assert_eq!((after.attempts, after.retries, after.status_checks), (before.attempts + 1, before.retries + 1, before.status_checks));
        assert_eq!(after.effects_total, 1);
        // With an account budget that has no room, the retry is refused and the run escalates again.
        let budgeted = r#"{"tools": {"issue_refund": {"effect": "write"}}, "account-budget": {"account-id": "a", "capacity": 1, "refill-interval-ms": 1000}}"#;
        let run = escalated(budgeted);
        let text = run.snapshot(None, NOW).unwrap();
        let resumed = Run::resume(Arc::new(Config::from_json(budgeted).unwrap()), &text, ResumeAnswer::Retry, NOW, &mut Full).unwrap();
        assert_eq!(resumed.resumed_call().unwrap().action, ResumedAction::Escalate);
        assert_eq!(resumed.escalation().map(|e| e.reason), Some(EscalationReason::AccountBudgetExhausted));
    }

    #[test]
    fn a_snapshot_waits_for_the_calls_in_flight_and_refuses_an_open_run() {
        let mut run = Run::new(Arc::new(Config::from_json(WRITE).unwrap()), "r-2");
        run.begin(None, "lookup".into(), None, None, NOW, &mut NoAccountBudget).unwrap();
        assert_eq!(run.snapshot(None, NOW).unwrap_err().kind, SnapshotErrorKind::NotEscalated);
        let huge = "x".repeat(snapshot::MAX_ARGUMENTS_BYTES + 1);
        let escalated = escalated(WRITE);
        assert_eq!(escalated.snapshot(Some(&huge), NOW).unwrap_err().kind, SnapshotErrorKind::TooLarge);
        let done = Run::resume(Arc::new(Config::default()), &escalated.snapshot(None, NOW).unwrap(), ResumeAnswer::Done(Some(huge)), NOW, &mut NoAccountBudget);
        assert_eq!(done.unwrap_err().kind, SnapshotErrorKind::TooLarge);
    }

    /// Writes the fuzz corpus's seeds (`cargo test -p agent-retry-policy --release -- --ignored write_fuzz_seeds`).
    #[test]
    #[ignore]
    fn write_fuzz_seeds() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fuzz/corpus/snapshot");
        std::fs::create_dir_all(dir).unwrap();
        let unknown = escalated(WRITE).snapshot(Some("{\"order_id\":\"A1\",\"amount_paise\":500}"), NOW).unwrap();
        std::fs::write(alloc::format!("{dir}/unknown-write"), unknown).unwrap();
        let mut refused = Run::new(Arc::new(Config::from_json(r#"{"max-steps-per-run": 1}"#).unwrap()), "r-3");
        let Start::Send(ticket) = refused.begin(None, "lookup".into(), None, None, NOW, &mut NoAccountBudget).unwrap() else { panic!() };
        refused.record_success(ticket.call_id, 1, NOW, &mut NoAccountBudget).unwrap();
        refused.begin(None, "issue_refund".into(), Some("ar1-00".into()), None, NOW, &mut NoAccountBudget).unwrap();
        std::fs::write(alloc::format!("{dir}/begin-refused"), refused.snapshot(None, NOW).unwrap()).unwrap();
    }
}
