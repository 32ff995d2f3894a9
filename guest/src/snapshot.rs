//! The snapshot of an escalated run: a versioned JSON document a person reads
//! and any host resumes (`run.snapshot`, `policy.resume-run`). It holds what the
//! run must keep to go on: its calls that made effects and the call that
//! stopped it (tool, server, key, effect, attempt), the effects, the budgets
//! spent and the escalation, with the answers that are safe. A digest over its
//! content (FNV-1a-128 over the document as this module writes it) catches a
//! document changed or cut after it was taken; it is no signature: a host that
//! keeps snapshots where others may write them signs them itself
//! (docs/host-authors.md).

use alloc::string::String;
use alloc::vec::Vec;

use crate::cat::{Hex, cat, cat_to};
use crate::json::{self, Json};
use crate::types::{Effect, EffectStatus, EscalationReason, SnapshotError, SnapshotErrorKind, StatusCount};

/// The contract this policy speaks (`wit/world.wit`); a snapshot of another
/// major (for 0.x, another `0.minor`) is refused, naming both.
pub const CONTRACT_VERSION: &str = "0.9.0";
/// The document's `format`.
pub const FORMAT: &str = "agent-retry-snapshot";
/// The longest snapshot taken or resumed, in bytes (2 MiB).
pub const MAX_SNAPSHOT_BYTES: usize = 2 << 20;
/// The longest `arguments-json` a snapshot keeps, in bytes (1 MiB).
pub const MAX_ARGUMENTS_BYTES: usize = 1 << 20;
/// The most calls a resumed run may have had: each is rebuilt in memory (about
/// 110 bytes on wasm32) within the resume's fuel, so a 1 KB document cannot
/// ask for megabytes.
pub const MAX_CALLS: u32 = 10_000;

/// A document's members, in the order it is written.
const MEMBERS: [&str; 16] = [
    "format",
    "contract",
    "run-id",
    "taken-at-ms",
    "reason",
    "stopped-call",
    "begun",
    "calls-total",
    "counters",
    "statuses",
    "calls",
    "effects",
    "arguments",
    "answers",
    "note",
    "digest",
];

/// The escalation reasons' names, as the WIT spells them.
const REASONS: [(EscalationReason, &str); 21] = [
    (EscalationReason::PermissionDenied, "permission-denied"),
    (EscalationReason::ReplansSpent, "replans-spent"),
    (EscalationReason::CallAttemptsSpent, "call-attempts-spent"),
    (EscalationReason::RunRetriesSpent, "run-retries-spent"),
    (EscalationReason::RunStepsSpent, "run-steps-spent"),
    (EscalationReason::ServerWaitTooLong, "server-wait-too-long"),
    (EscalationReason::RetryForbidden, "retry-forbidden"),
    (EscalationReason::AccountBudgetExhausted, "account-budget-exhausted"),
    (EscalationReason::RetryQuotaExhausted, "retry-quota-exhausted"),
    (EscalationReason::UnclassifiedFailure, "unclassified-failure"),
    (EscalationReason::StatusUnknown, "status-unknown"),
    (EscalationReason::ConnectionMisconfigured, "connection-misconfigured"),
    (EscalationReason::DeadlineTooNear, "deadline-too-near"),
    (EscalationReason::ProtocolVersionUnsupported, "protocol-version-unsupported"),
    (EscalationReason::InputRequired, "input-required"),
    (EscalationReason::TaskExpired, "task-expired"),
    (EscalationReason::TaskPollsSpent, "task-polls-spent"),
    (EscalationReason::TaskCancelled, "task-cancelled"),
    (EscalationReason::CircuitOpen, "circuit-open"),
    (EscalationReason::RetryBudgetExhausted, "retry-budget-exhausted"),
    (EscalationReason::Aborted, "aborted"),
];

/// The run's counters, in the order the document writes them.
pub const COUNTERS: [&str; 10] =
    ["attempts", "retries", "status-checks", "replans", "succeeded-calls", "waits", "waited-ms", "tasks", "polls", "abandoned-calls"];

/// One call the snapshot keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallRecord {
    /// Its id in the run (1-based).
    pub id: u32,
    pub tool: String,
    pub server: Option<String>,
    pub key: Option<String>,
    pub effect: Effect,
    pub idempotent: bool,
    /// Its last attempt (0: never sent).
    pub attempt: u32,
    /// Its last error, in words, if it failed.
    pub last_error: Option<String>,
}

impl CallRecord {
    /// Whether a failed attempt may be repeated without first reading state.
    pub fn safe_to_repeat(&self) -> bool {
        self.effect != Effect::Write || self.idempotent || self.key.is_some()
    }
}

/// The document, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The contract it was taken under (of this major: `read` refuses others).
    pub contract: String,
    pub run_id: String,
    pub taken_at_ms: u64,
    pub reason: EscalationReason,
    /// The call that stopped the run; `begun` false: `begin-call` refused it,
    /// and its id is the next one.
    pub stopped: u32,
    pub begun: bool,
    /// Calls begun in the run.
    pub calls_total: u32,
    /// In the order of [`COUNTERS`].
    pub counters: [u64; 10],
    pub statuses: Vec<StatusCount>,
    /// The calls that made effects and the stopped one, by id.
    pub calls: Vec<CallRecord>,
    /// (call id, status), in the order made.
    pub effects: Vec<(u32, EffectStatus)>,
    pub arguments: Option<String>,
    pub note: String,
}

/// Whether a person may give an answer without looking first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Safety {
    Safe,
    /// The call's write may or may not have been applied: look before answering so.
    CheckFirst,
}

impl Safety {
    fn name(self) -> &'static str {
        match self {
            Safety::Safe => "safe",
            Safety::CheckFirst => "check first",
        }
    }
}

/// The answers `retry`, `done`, `skip` and `abort`, and whether each is safe
/// for a call with `effect` whose effect so far is `status`: resending a write
/// without a key that was or may have been applied, skipping one, or saying it
/// was applied when nobody knows, needs a look first.
pub fn answers(effect: Effect, safe_to_repeat: bool, status: Option<EffectStatus>) -> [(&'static str, Safety); 4] {
    // Applied or maybe applied: a resend without a key doubles it, and a
    // model told "skipped" may make it again another way.
    let made = status.is_some();
    let retry = if made && !safe_to_repeat { Safety::CheckFirst } else { Safety::Safe };
    let done = if effect == Effect::Read || status == Some(EffectStatus::Applied) { Safety::Safe } else { Safety::CheckFirst };
    let skip = if made { Safety::CheckFirst } else { Safety::Safe };
    [("retry", retry), ("done", done), ("skip", skip), ("abort", Safety::Safe)]
}

/// The note's sentence on the answers, e.g. "A person may answer (resume-run):
/// retry (check first), done (check first), skip (check first) or abort (safe)."
pub fn answers_sentence(answers: &[(&str, Safety); 4]) -> String {
    let mut text = String::from(" A person may answer (resume-run):");
    for (i, (name, safety)) in answers.iter().enumerate() {
        let joint = match i {
            0 => " ",
            3 => " or ",
            _ => ", ",
        };
        cat_to!(text; joint, name, " (", safety.name(), ")");
    }
    text.push('.');
    text
}

pub fn reason_name(reason: EscalationReason) -> &'static str {
    REASONS.iter().find(|(r, _)| *r == reason).map_or("", |(_, name)| name)
}

fn effect_name(effect: Effect) -> &'static str {
    effect.name()
}

fn status_name(status: EffectStatus) -> &'static str {
    match status {
        EffectStatus::Applied => "applied",
        EffectStatus::Unknown => "unknown",
    }
}

fn opt_string(out: &mut String, value: Option<&str>) {
    match value {
        Some(text) => json::write_string(out, text),
        None => out.push_str("null"),
    }
}

impl Snapshot {
    /// The stopped call's record.
    pub fn stopped_call(&self) -> Option<&CallRecord> {
        self.calls.iter().find(|c| c.id == self.stopped)
    }

    /// The document without its digest: `{` and every member but the last.
    fn body(&self) -> String {
        let mut out = String::from("{\"format\":");
        json::write_string(&mut out, FORMAT);
        out.push_str(",\"contract\":");
        json::write_string(&mut out, &self.contract);
        out.push_str(",\"run-id\":");
        json::write_string(&mut out, &self.run_id);
        cat_to!(out; ",\"taken-at-ms\":", self.taken_at_ms, ",\"reason\":\"", reason_name(self.reason), "\",\"stopped-call\":", self.stopped);
        cat_to!(out; ",\"begun\":", if self.begun { "true" } else { "false" }, ",\"calls-total\":", self.calls_total, ",\"counters\":{");
        for (i, (name, value)) in COUNTERS.iter().zip(self.counters).enumerate() {
            cat_to!(out; if i > 0 { "," } else { "" }, "\"", name, "\":", value);
        }
        out.push_str("},\"statuses\":[");
        for (i, s) in self.statuses.iter().enumerate() {
            cat_to!(out; if i > 0 { "," } else { "" }, "[", s.status, ",", s.count, "]");
        }
        out.push_str("],\"calls\":[");
        for (i, c) in self.calls.iter().enumerate() {
            cat_to!(out; if i > 0 { "," } else { "" }, "{\"id\":", c.id, ",\"tool\":");
            json::write_string(&mut out, &c.tool);
            out.push_str(",\"server\":");
            opt_string(&mut out, c.server.as_deref());
            out.push_str(",\"key\":");
            opt_string(&mut out, c.key.as_deref());
            cat_to!(out; ",\"effect\":\"", effect_name(c.effect), "\",\"idempotent\":", if c.idempotent { "true" } else { "false" }, ",\"attempt\":", c.attempt);
            out.push_str(",\"last-error\":");
            opt_string(&mut out, c.last_error.as_deref());
            out.push('}');
        }
        out.push_str("],\"effects\":[");
        for (i, (id, status)) in self.effects.iter().enumerate() {
            cat_to!(out; if i > 0 { "," } else { "" }, "[", id, ",\"", status_name(*status), "\"]");
        }
        out.push_str("],\"arguments\":");
        opt_string(&mut out, self.arguments.as_deref());
        out.push_str(",\"answers\":{");
        if let Some(call) = self.stopped_call() {
            for (i, (name, safety)) in answers(call.effect, call.safe_to_repeat(), self.status_of(call.id)).iter().enumerate() {
                cat_to!(out; if i > 0 { "," } else { "" }, "\"", name, "\":\"", safety.name(), "\"");
            }
        }
        out.push_str("},\"note\":");
        json::write_string(&mut out, &self.note);
        out
    }

    /// The whole document: the body and its digest.
    pub fn write(&self) -> String {
        let mut out = self.body();
        let digest = digest(&out);
        cat_to!(out; ",\"digest\":\"", digest, "\"}");
        out
    }

    /// Reads a document: its size, form, contract and digest.
    pub fn read(text: &str) -> Result<Snapshot, SnapshotError> {
        Self::read_checking(text, true)
    }

    /// [`Snapshot::read`] without the digest and advice check: for the fuzz
    /// target, whose mutations would otherwise never get past the digest.
    pub fn read_unsealed(text: &str) -> Result<Snapshot, SnapshotError> {
        Self::read_checking(text, false)
    }

    fn read_checking(text: &str, sealed: bool) -> Result<Snapshot, SnapshotError> {
        if text.len() > MAX_SNAPSHOT_BYTES {
            let message = cat!("the snapshot is ", text.len(), " bytes, more than the ", MAX_SNAPSHOT_BYTES, "-byte limit");
            return Err(SnapshotError::new(SnapshotErrorKind::TooLarge, message));
        }
        let value = json::parse(text).map_err(|e| malformed(cat!("not valid JSON: ", e)))?;
        let Json::Object(members) = value else { return Err(bad("a snapshot must be a JSON object")) };
        let doc = Doc(&members);
        if doc.string("format")? != FORMAT {
            return Err(malformed(cat!("format must be \"", FORMAT, "\"")));
        }
        let contract = doc.string("contract")?;
        if !same_major(&contract, CONTRACT_VERSION) {
            let message = cat!("the snapshot was taken under contract ", crate::text::excerpt(&contract, 40), "; this policy speaks ", CONTRACT_VERSION);
            return Err(SnapshotError::new(SnapshotErrorKind::OtherContract, message));
        }
        if let Some((name, _)) = members.iter().find(|(name, _)| !MEMBERS.contains(&name.as_str())) {
            return Err(malformed(cat!(crate::text::excerpt(name, 40), " is not a member of a snapshot")));
        }
        let snapshot = Snapshot { contract, ..doc.snapshot()? };
        if !sealed {
            return Ok(snapshot);
        }
        let expected = doc.string("digest")?;
        // The answers a person reads are the ones the content gives: a changed
        // word of advice is a changed snapshot, though the digest does not cover it.
        let advice = match doc.get("answers")? {
            Json::Object(answers) => answers.iter().map(|(n, v)| (n.as_str(), v)).collect::<Vec<_>>(),
            _ => return Err(must("answers", "an object")),
        };
        let computed = snapshot.stopped_call().map(|call| answers(call.effect, call.safe_to_repeat(), snapshot.status_of(call.id)));
        let agrees = computed.is_some_and(|computed| {
            advice.len() == computed.len()
                && computed.iter().zip(&advice).all(|((name, safety), (n, v))| n == name && matches!(v, Json::String(t) if t == safety.name()))
        });
        if digest(&snapshot.body()) != expected || !agrees {
            return Err(SnapshotError::new(SnapshotErrorKind::Tampered, "the digest does not match the content: the snapshot was changed after it was taken"));
        }
        Ok(snapshot)
    }

    /// The last status of call `id`'s effect, if it made one.
    fn status_of(&self, id: u32) -> Option<EffectStatus> {
        self.effects.iter().rev().find(|(call, _)| *call == id).map(|(_, s)| *s)
    }
}

/// `fnv1a-128:` and 32 hex digits.
fn digest(body: &str) -> String {
    let hash = crate::key::fnv1a_128(&[body.as_bytes()]);
    cat!("fnv1a-128:", Hex((hash >> 64) as u64, 16), Hex(hash as u64, 16))
}

/// Whether two versions share a major (for 0.x, a `0.minor`): `0.9.0` and
/// `0.9.7` do, `0.8.0` and `0.9.0` do not. Bytes, not string slices: a
/// slice's panic path costs the component kilobytes.
fn same_major(a: &str, b: &str) -> bool {
    fn part(v: &str, n: usize) -> Option<&[u8]> {
        v.split('.').nth(n).map(str::as_bytes)
    }
    let majors = part(a, 0) == part(b, 0);
    majors && (part(a, 0) != Some(b"0".as_slice()) || part(a, 1) == part(b, 1))
}

#[inline(never)]
fn malformed(message: String) -> SnapshotError {
    SnapshotError::new(SnapshotErrorKind::Malformed, message)
}

/// `malformed` with a fixed message: one copy of the code for every rule.
#[inline(never)]
fn bad(message: &'static str) -> SnapshotError {
    malformed(String::from(message))
}

/// A field of the wrong type or out of range: `<field> must be <rule>`.
#[inline(never)]
fn must(name: &str, rule: &'static str) -> SnapshotError {
    malformed(cat!(name, " must be ", rule))
}

/// A JSON object's members, read by name with errors that name the field.
struct Doc<'a>(&'a [(String, Json)]);

impl Doc<'_> {
    fn get(&self, name: &str) -> Result<&Json, SnapshotError> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v).ok_or_else(|| must(name, "given"))
    }

    fn string(&self, name: &str) -> Result<String, SnapshotError> {
        match self.get(name)? {
            Json::String(text) => Ok(text.clone()),
            _ => Err(must(name, "a string")),
        }
    }

    fn opt_string(&self, name: &str) -> Result<Option<String>, SnapshotError> {
        match self.get(name)? {
            Json::Null => Ok(None),
            _ => self.string(name).map(Some),
        }
    }

    fn number(&self, name: &str, max: u64) -> Result<u64, SnapshotError> {
        number(name, self.get(name)?, max)
    }

    fn boolean(&self, name: &str) -> Result<bool, SnapshotError> {
        match self.get(name)? {
            Json::Bool(b) => Ok(*b),
            _ => Err(must(name, "a boolean")),
        }
    }

    fn array(&self, name: &str) -> Result<&[Json], SnapshotError> {
        match self.get(name)? {
            Json::Array(items) => Ok(items),
            _ => Err(must(name, "an array")),
        }
    }

    fn snapshot(&self) -> Result<Snapshot, SnapshotError> {
        let run_id = self.string("run-id")?;
        if run_id.len() > crate::types::MAX_ID_BYTES {
            return Err(bad("run-id is longer than 256 bytes"));
        }
        let reason_text = self.string("reason")?;
        let reason = REASONS.iter().find(|(_, n)| *n == reason_text).map(|(r, _)| *r).ok_or_else(|| bad("reason is not an escalation reason"))?;
        let calls_total = self.number("calls-total", MAX_CALLS.into())? as u32;
        let begun = self.boolean("begun")?;
        let stopped = self.number("stopped-call", u64::from(calls_total) + 1)? as u32;
        if stopped == 0 || begun != (stopped <= calls_total) {
            return Err(bad("stopped-call must be a call of the run, or the next one when begun is false"));
        }
        let counters_doc = match self.get("counters")? {
            Json::Object(members) => Doc(members),
            _ => return Err(must("counters", "an object")),
        };
        let mut counters = [0u64; 10];
        for (slot, name) in counters.iter_mut().zip(COUNTERS) {
            let max = if name == "waited-ms" { u64::MAX } else { u32::MAX.into() };
            *slot = counters_doc.number(name, max).map_err(|_| must("counters", "whole numbers in range"))?;
        }
        let mut statuses = Vec::new();
        for item in self.array("statuses")? {
            let pair = pair(item, "statuses")?;
            let status = number("statuses", &pair[0], 599)? as u16;
            let count = number("statuses", &pair[1], u32::MAX.into())? as u32;
            if statuses.last().is_some_and(|s: &StatusCount| s.status >= status) {
                return Err(bad("statuses must be in ascending order, each once"));
            }
            statuses.push(StatusCount { status, count });
        }
        let mut calls: Vec<CallRecord> = Vec::new();
        for item in self.array("calls")? {
            let Json::Object(members) = item else { return Err(bad("each of calls must be an object")) };
            let call = Doc(members).call(calls_total)?;
            if calls.last().is_some_and(|c| c.id >= call.id) {
                return Err(bad("calls must be in ascending order of id, each once"));
            }
            calls.push(call);
        }
        let mut effects = Vec::new();
        for item in self.array("effects")? {
            let pair = pair(item, "effects")?;
            let id = number("effects", &pair[0], calls_total.into())? as u32;
            let status = match &pair[1] {
                Json::String(s) if s == "applied" => EffectStatus::Applied,
                Json::String(s) if s == "unknown" => EffectStatus::Unknown,
                _ => return Err(bad("an effect's status must be \"applied\" or \"unknown\"")),
            };
            if !calls.iter().any(|c| c.id == id) || effects.iter().any(|(other, _)| *other == id) {
                return Err(bad("effects must name calls that calls lists, each once"));
            }
            effects.push((id, status));
        }
        let arguments = self.opt_string("arguments")?;
        if arguments.as_ref().is_some_and(|a| a.len() > MAX_ARGUMENTS_BYTES) {
            return Err(SnapshotError::new(SnapshotErrorKind::TooLarge, "arguments is longer than 1 MiB"));
        }
        let snapshot = Snapshot {
            contract: String::new(),
            run_id,
            taken_at_ms: self.number("taken-at-ms", u64::MAX)?,
            reason,
            stopped,
            begun,
            calls_total,
            counters,
            statuses,
            calls,
            effects,
            arguments,
            note: self.string("note")?,
        };
        if snapshot.calls.iter().any(|c| c.id > calls_total && c.id != stopped) {
            return Err(bad("calls lists a call the run did not begin"));
        }
        if snapshot.stopped_call().is_none() {
            return Err(bad("calls must list the stopped call"));
        }
        Ok(snapshot)
    }

    fn call(&self, calls_total: u32) -> Result<CallRecord, SnapshotError> {
        let id = self.number("id", u64::from(calls_total) + 1)? as u32;
        if id == 0 {
            return Err(bad("a call's id must be from 1"));
        }
        let effect = match self.string("effect")?.as_str() {
            "read" => Effect::Read,
            "write" => Effect::Write,
            "delete" => Effect::Delete,
            _ => return Err(bad("a call's effect must be read, write or delete")),
        };
        let tool = self.string("tool")?;
        let key = self.opt_string("key")?;
        let server = self.opt_string("server")?;
        if tool.len() > crate::types::MAX_ID_BYTES
            || key.as_ref().is_some_and(|k| k.len() > crate::types::MAX_ID_BYTES)
            || server.as_ref().is_some_and(|s| s.len() > 256)
        {
            return Err(bad("a call's tool, key or server is past its limit"));
        }
        Ok(CallRecord {
            id,
            tool,
            server,
            key,
            effect,
            idempotent: self.boolean("idempotent")?,
            attempt: self.number("attempt", 100)? as u32,
            last_error: self.opt_string("last-error")?,
        })
    }
}

fn number(name: &str, value: &Json, max: u64) -> Result<u64, SnapshotError> {
    match value.as_u64() {
        Some(v) if v <= max => Ok(v),
        _ => Err(must(name, "a whole number in range")),
    }
}

fn pair<'a>(item: &'a Json, name: &str) -> Result<&'a [Json], SnapshotError> {
    match item {
        Json::Array(items) if items.len() == 2 => Ok(items),
        _ => Err(must(name, "a list of pairs")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;

    fn sample() -> Snapshot {
        Snapshot {
            contract: CONTRACT_VERSION.to_string(),
            run_id: "CASE-1".to_string(),
            taken_at_ms: 1_764_460_800_000,
            reason: EscalationReason::CallAttemptsSpent,
            stopped: 2,
            begun: true,
            calls_total: 2,
            counters: [5, 3, 0, 0, 1, 3, 2100, 0, 0, 0],
            statuses: alloc::vec![StatusCount { status: 503, count: 4 }],
            calls: alloc::vec![CallRecord {
                id: 2,
                tool: "issue_refund".to_string(),
                server: Some("https://mcp.example".to_string()),
                key: None,
                effect: Effect::Write,
                idempotent: false,
                attempt: 4,
                last_error: Some("timeout".to_string()),
            }],
            effects: alloc::vec![(2, EffectStatus::Unknown)],
            arguments: Some("{\"order_id\":\"A1\"}".to_string()),
            note: "Run CASE-1 stopped.".to_string(),
        }
    }

    #[test]
    fn a_snapshot_round_trips_and_says_which_answers_are_safe() {
        let text = sample().write();
        assert_eq!(Snapshot::read(&text), Ok(sample()));
        assert!(text.contains("\"answers\":{\"retry\":\"check first\",\"done\":\"check first\",\"skip\":\"check first\",\"abort\":\"safe\"}"), "{text}");
        // Reformatted (as a store may): the digest is over the content, not its spacing.
        let spaced = text.replace(",\"", ", \"");
        assert_eq!(Snapshot::read(&spaced), Ok(sample()));
    }

    #[test]
    fn a_changed_cut_or_foreign_snapshot_is_refused_with_its_kind() {
        let text = sample().write();
        let kind = |t: &str| Snapshot::read(t).unwrap_err().kind;
        assert_eq!(kind(&text.replace("\"attempts\":5", "\"attempts\":0")), SnapshotErrorKind::Tampered);
        assert_eq!(kind(&text.replace("\"unknown\"]", "\"applied\"]")), SnapshotErrorKind::Tampered);
        // Advice made to look safer, or a member the format does not have.
        assert_eq!(kind(&text.replace("\"retry\":\"check first\"", "\"retry\":\"safe\"")), SnapshotErrorKind::Tampered);
        assert_eq!(kind(&text.replace("\"note\":", "\"extra\":1,\"note\":")), SnapshotErrorKind::Malformed);
        assert_eq!(kind(&text[..text.len() - 2]), SnapshotErrorKind::Malformed);
        let old = Snapshot::read(&text.replace("\"contract\":\"0.9.0\"", "\"contract\":\"0.8.0\"")).unwrap_err();
        assert_eq!(old.kind, SnapshotErrorKind::OtherContract);
        assert!(old.message.contains("0.8.0") && old.message.contains("0.9.0"), "{}", old.message);
        // A patch of this contract is read (its digest then fails: the content differs).
        assert_eq!(kind(&text.replace("\"contract\":\"0.9.0\"", "\"contract\":\"0.9.7\"")), SnapshotErrorKind::Tampered);
        assert_eq!(kind(&text.replace("\"stopped-call\":2", "\"stopped-call\":9")), SnapshotErrorKind::Malformed);
        assert_eq!(kind("[]"), SnapshotErrorKind::Malformed);
        assert_eq!(kind(&" ".repeat(MAX_SNAPSHOT_BYTES + 1)), SnapshotErrorKind::TooLarge);
    }

    #[test]
    fn an_applied_or_maybe_applied_write_without_a_key_says_check_first() {
        let sentence = |status| answers_sentence(&answers(Effect::Write, false, status));
        assert!(sentence(Some(EffectStatus::Applied)).contains("retry (check first), done (safe), skip (check first)"));
        assert!(sentence(Some(EffectStatus::Unknown)).contains("retry (check first), done (check first), skip (check first)"));
        assert!(sentence(None).contains("retry (safe), done (check first), skip (safe)"));
        assert!(answers_sentence(&answers(Effect::Write, true, Some(EffectStatus::Applied))).contains("retry (safe)"));
        assert!(answers_sentence(&answers(Effect::Read, true, None)).contains("retry (safe), done (safe), skip (safe) or abort (safe)"));
    }

    #[test]
    fn majors() {
        assert!(same_major("0.9.0", "0.9.7"));
        assert!(!same_major("0.8.0", "0.9.0"));
        assert!(!same_major("0.10.0", "0.1.0"));
        assert!(same_major("1.2.3", "1.0.0"));
        assert!(!same_major("2.0.0", "1.0.0"));
        assert!(!same_major("", "0.9.0"));
        assert!(!same_major("0", "0.9.0"));
    }

    #[test]
    fn the_version_is_the_wits() {
        assert!(include_str!("../../wit/world.wit").starts_with(&cat!("package agent-retry:policy@", CONTRACT_VERSION, ";")));
    }
}
