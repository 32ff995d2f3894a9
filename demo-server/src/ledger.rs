//! Every effect the server applied, so a test can prove none was applied twice.

use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Refund {
    pub refund_id: String,
    pub order_id: String,
    pub amount_paise: i64,
    pub idempotency_key: Option<String>,
}

#[derive(Default, Debug)]
pub struct Ledger {
    pub refunds: Vec<Refund>,
    /// Asset id → content. Uploads use a caller-chosen id: a repeat overwrites.
    pub assets: BTreeMap<String, String>,
    /// How many times each asset id was written.
    pub uploads: BTreeMap<String, u32>,
    /// Notes on orders: a write with no key and no idempotence, on purpose.
    pub notes: Vec<Note>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
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

    /// Refunds applied more than once for one order: each is a duplicate.
    pub fn duplicate_refunds(&self) -> usize {
        let mut per_order: BTreeMap<&str, usize> = BTreeMap::new();
        for refund in &self.refunds {
            *per_order.entry(&refund.order_id).or_default() += 1;
        }
        per_order.values().map(|n| n.saturating_sub(1)).sum()
    }
}
