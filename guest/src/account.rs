//! The shared account budget, as the core sees it: a host service behind a trait.
//! In the component the trait is the `account-budget` import; natively, tests
//! pass any implementation.

/// The bucket's shape (see `wit/account-budget.wit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    pub capacity: u32,
    pub refill_interval_ms: u64,
}

/// The answer to a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reservation {
    /// Taken; wait this many ms before using them.
    Granted(u64),
    /// Not taken; room would come in this many ms.
    Refused(u64),
}

/// An atomic take-or-wait on one account's token bucket, and giving tokens back.
/// The host that keeps it also keeps the shared state (the breakers).
pub trait AccountBudget: crate::shared::SharedState {
    fn reserve(&mut self, account_id: &str, tokens: u32, bucket: Bucket, max_wait_ms: u64, now_ms: u64) -> Reservation;
    fn refund(&mut self, account_id: &str, tokens: u32, bucket: Bucket, now_ms: u64);
}

/// For runs whose configuration has no account budget: the core never calls it.
pub struct NoAccountBudget;

/// Nor any shared state: no breaker opens.
impl crate::shared::SharedState for NoAccountBudget {}

impl AccountBudget for NoAccountBudget {
    fn reserve(&mut self, _: &str, _: u32, _: Bucket, _: u64, _: u64) -> Reservation {
        Reservation::Granted(0)
    }

    fn refund(&mut self, _: &str, _: u32, _: Bucket, _: u64) {}
}
