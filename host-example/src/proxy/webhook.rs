//! Announces an escalation to a person: a JSON POST to the operator's URL, in
//! the background (the client's answer never waits for it), at most
//! [`TIMEOUT`] each. A failure is logged and counted, never retried: the
//! escalation is already in the client's result and the log.

use std::time::Duration;

use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(5);

pub struct Webhook {
    url: String,
    client: reqwest::Client,
}

impl Webhook {
    pub fn new(url: String) -> Self {
        let client = reqwest::Client::builder().timeout(TIMEOUT).build().unwrap_or_default();
        Webhook { url, client }
    }

    pub fn announce(&self, run: &str, tool: &str, server: &str, reason: &str, note: &str) {
        let body = json!({
            "event": "agent_retry.escalation",
            "run": run,
            "tool": tool,
            "server": server,
            "reason": reason,
            "note": note,
            "ts": agent_retry_host::events::unix_seconds(),
        });
        let (client, url, run) = (self.client.clone(), self.url.clone(), run.to_string());
        tokio::spawn(async move {
            let sent = client
                .post(&url)
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .and_then(|response| response.error_for_status());
            if let Err(e) = sent {
                tracing::warn!(target: "agent_retry", event = "agent_retry.webhook_failed", run = %run, url = %url, "the escalation could not be announced: {e}");
            }
        });
    }
}
