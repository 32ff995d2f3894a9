//! The embedded backend: one bucket per account in this process's memory.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{AccountBudgetBackend, Bucket, Reservation, gcra, gcra_refund};

/// One bucket per account, in this process: shared by every run and every
/// component instance that holds the same `EmbeddedAccounts`.
#[derive(Default)]
pub struct EmbeddedAccounts {
    tats: Mutex<HashMap<String, u64>>,
}

impl EmbeddedAccounts {
    pub fn new() -> Self {
        Self::default()
    }
}

impl AccountBudgetBackend for EmbeddedAccounts {
    fn reserve(&self, account_id: &str, tokens: u32, bucket: Bucket, max_wait_ms: u64, now_ms: u64) -> Reservation {
        let mut tats = self.tats.lock().unwrap_or_else(|p| p.into_inner());
        let stored = tats.get(account_id).copied().unwrap_or(0);
        let (reservation, new_tat) = gcra(stored, tokens, bucket, max_wait_ms, now_ms);
        if new_tat != stored {
            tats.insert(account_id.to_string(), new_tat);
        }
        reservation
    }

    fn refund(&self, account_id: &str, tokens: u32, bucket: Bucket, now_ms: u64) {
        let mut tats = self.tats.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tat) = tats.get_mut(account_id) {
            *tat = gcra_refund(*tat, tokens, bucket, now_ms);
        }
    }
}
