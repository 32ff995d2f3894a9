//! Every effect the server applied, so a test can prove none was applied twice.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Refund {
    pub refund_id: String,
    pub order_id: String,
    pub amount_paise: i64,
    pub idempotency_key: Option<String>,
}

/// Serialised whole to the ledger file of `agent-retry serve --ledger`.
#[derive(Default, Debug, Serialize, Deserialize)]
#[serde(default)]
pub struct Ledger {
    pub refunds: Vec<Refund>,
    /// Asset id → content. Uploads use a caller-chosen id: a repeat overwrites.
    pub assets: BTreeMap<String, String>,
    /// How many times each asset id was written.
    pub uploads: BTreeMap<String, u32>,
    /// Notes on orders: a write with no key and no idempotence, on purpose.
    pub notes: Vec<Note>,
    /// `archive_orders` runs (a write that only runs as a task), in order.
    pub archives: Vec<Archive>,
    /// Every round of `confirm_order` (an MRTR continuation), in order: the
    /// first asks, the one that comes back with the answer confirms or declines.
    pub confirmations: Vec<ConfirmRound>,
    /// Every `export_report` run, in order (a read that takes a while).
    pub reports: Vec<ReportRun>,
    /// The task ids of every `tasks/cancel` the server received, in order: a
    /// test of a host in another process reads them from the ledger file.
    pub cancelled_tasks: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Archive {
    pub archive_id: String,
    pub before: String,
}

/// What one round of `confirm_order` did.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum RoundOutcome {
    /// Answered `input_required`: nothing applied.
    Asked,
    /// The person confirmed: the effect (the order confirmed) was applied.
    Confirmed,
    /// The person declined: nothing applied.
    Declined,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ConfirmRound {
    pub order_id: String,
    /// The `requestState` the round came back with (`None` on the first round).
    pub request_state: Option<String>,
    pub outcome: RoundOutcome,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ReportRun {
    pub report_id: String,
    pub seconds: f64,
    /// The request's `_meta.progressToken`, if it carried one.
    pub progress_token: Option<serde_json::Value>,
    /// `notifications/progress` sent for this run.
    pub notifications: u32,
    /// The run reached "report ready" (false: cancelled or cut off).
    pub finished: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Note {
    pub order_id: String,
    pub text: String,
}

impl Ledger {
    /// Applies a refund, or returns the one already applied with this key
    /// (Stripe-style: a repeat with the same key returns the first result).
    pub fn issue_refund(&mut self, order_id: &str, amount_paise: i64, key: Option<&str>) -> (Refund, bool) {
        if let Some(key) = key
            && let Some(existing) = self.refunds.iter().find(|r| r.idempotency_key.as_deref() == Some(key))
        {
            return (existing.clone(), false);
        }
        let refund = Refund {
            refund_id: format!("RF-{}", self.refunds.len() + 1),
            order_id: order_id.to_string(),
            amount_paise,
            idempotency_key: key.map(str::to_string),
        };
        self.refunds.push(refund.clone());
        (refund, true)
    }

    /// Notes written more than once (same order, same text): each is a duplicate.
    pub fn duplicate_notes(&self) -> usize {
        let mut seen: BTreeMap<(&str, &str), usize> = BTreeMap::new();
        for note in &self.notes {
            *seen.entry((&note.order_id, &note.text)).or_default() += 1;
        }
        seen.values().map(|n| n.saturating_sub(1)).sum()
    }

    /// How many times `order_id` was confirmed (the effect of `confirm_order`).
    pub fn confirmed(&self, order_id: &str) -> usize {
        self.confirmations.iter().filter(|r| r.order_id == order_id && r.outcome == RoundOutcome::Confirmed).count()
    }

    /// Refunds applied more than once for one order: each is a duplicate.
    pub fn duplicate_refunds(&self) -> usize {
        let mut per_order: BTreeMap<&str, usize> = BTreeMap::new();
        for refund in &self.refunds {
            *per_order.entry(&refund.order_id).or_default() += 1;
        }
        per_order.values().map(|n| n.saturating_sub(1)).sum()
    }
}

impl Ledger {
    /// Reads a ledger file; a missing file is an empty ledger.
    pub fn load(path: &Path) -> anyhow::Result<Ledger> {
        match std::fs::read_to_string(path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("ledger file {}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Ledger::default()),
            Err(e) => Err(anyhow::anyhow!("ledger file {}: {e}", path.display())),
        }
    }

    /// Writes the ledger to `path` through a rename, so a reader (or a server
    /// killed mid-write) never sees half of it.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let temporary = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&temporary, serde_json::to_vec(self)?)?;
        std::fs::rename(&temporary, path)
    }
}
