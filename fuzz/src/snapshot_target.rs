//! The `snapshot` target: any text as a snapshot of an escalated run
//! (`policy.resume-run`). Refused with a typed error, or read; a document
//! read is written back to one that reads the same, and resumes with each of
//! the four answers without a panic, keeping every counter it had (no answer
//! gives a budget back).

use std::sync::Arc;

use agent_retry_policy::account::NoAccountBudget;
use agent_retry_policy::config::Config;
use agent_retry_policy::run::Run;
use agent_retry_policy::snapshot::Snapshot;
use agent_retry_policy::types::ResumeAnswer;

use crate::{DEFAULT_NOW_MS, invariant};

pub fn snapshot(data: &[u8]) {
    let raw = String::from_utf8_lossy(data);
    // A mutation breaks the digest: read the content unsealed, seal it again, so
    // that hostile content (not only hostile bytes) reaches the reader and the resume.
    let _ = Snapshot::read(&raw);
    let Ok(document) = Snapshot::read_unsealed(&raw) else { return };
    let text = document.write();
    let again = Snapshot::read(&text);
    invariant!(again.as_ref() == Ok(&document), "a snapshot written back reads otherwise: {again:?}");
    let config = Arc::new(Config::default());
    for answer in [ResumeAnswer::Retry, ResumeAnswer::Done(Some("done".into())), ResumeAnswer::Skip, ResumeAnswer::Abort] {
        let resumed = Run::resume(Arc::clone(&config), &text, answer.clone(), DEFAULT_NOW_MS, &mut NoAccountBudget);
        let Ok(run) = resumed else { continue };
        let report = run.report();
        let [attempts, retries, status_checks, replans, succeeded, ..] = document.counters;
        invariant!(u64::from(report.attempts) >= attempts && u64::from(report.retries) >= retries, "{answer:?} gave attempts back: {report:?}");
        invariant!(u64::from(report.status_checks) >= status_checks && u64::from(report.replans) >= replans, "{answer:?} gave a budget back: {report:?}");
        invariant!(u64::from(report.succeeded_calls) >= succeeded, "{answer:?} lost a success: {report:?}");
        invariant!(run.resumed_call().is_some(), "{answer:?}: a resumed run names no call");
    }
}
