//! Progress: `export_report {seconds}` works that long, sending
//! `notifications/progress` every progress interval for the request's
//! `_meta.progressToken` (none without a token), then answers "report ready".
//! Each run is recorded in the ledger when it starts and when it ends, so a test
//! can show a long read was not run twice.

use std::time::Duration;

use rmcp::RoleServer;
use rmcp::model::{CallToolResult, ErrorData, ProgressNotificationParam};
use rmcp::service::RequestContext;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::ledger::ReportRun;
use crate::tools::{DemoServer, args, text_result, tool_error};

/// Longer exports are refused (a demo server should not be held for hours).
const MAX_SECONDS: f64 = 600.0;

#[derive(Deserialize)]
struct ReportArgs {
    seconds: f64,
}

impl DemoServer {
    pub(crate) async fn export_report(&self, arguments: &Map<String, Value>, context: &RequestContext<RoleServer>) -> Result<CallToolResult, ErrorData> {
        let a: ReportArgs = args(arguments)?;
        if !(0.0..=MAX_SECONDS).contains(&a.seconds) {
            return Ok(tool_error(Some(422), &format!("seconds must be between 0 and {MAX_SECONDS}")));
        }
        let token = context.meta.get_progress_token();
        let token_json = token.as_ref().and_then(|t| serde_json::to_value(t).ok());
        let run = self.with_ledger(|ledger| {
            let report_id = format!("RP-{}", ledger.reports.len() + 1);
            ledger.reports.push(ReportRun { report_id: report_id.clone(), seconds: a.seconds, progress_token: token_json, notifications: 0, finished: false });
            ledger.reports.len() - 1
        })?;
        let interval = Duration::from_millis(self.state.timings().progress_interval_ms.max(1));
        let total = Duration::from_secs_f64(a.seconds);
        let steps = total.as_nanos().div_ceil(interval.as_nanos()).max(1) as u32;
        let started = tokio::time::Instant::now();
        for step in 1..=steps {
            let until = started + (interval * step).min(total);
            tokio::select! {
                // The client went away or cancelled: the run ends unfinished.
                _ = context.ct.cancelled() => return Err(ErrorData::internal_error("export cancelled", None)),
                _ = tokio::time::sleep_until(until) => {}
            }
            if let Some(token) = &token {
                let note = ProgressNotificationParam::new(token.clone(), f64::from(step))
                    .with_total(f64::from(steps))
                    .with_message(format!("exported {step} of {steps}"));
                // A client gone mid-export cannot be told; the run goes on.
                if context.peer.notify_progress(note).await.is_ok() {
                    self.with_ledger(|ledger| ledger.reports[run].notifications += 1)?;
                }
            }
        }
        let report_id = self.with_ledger(|ledger| {
            ledger.reports[run].finished = true;
            ledger.reports[run].report_id.clone()
        })?;
        Ok(text_result("report ready", json!({ "report_id": report_id, "seconds": a.seconds })))
    }
}
