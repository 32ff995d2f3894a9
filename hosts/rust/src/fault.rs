//! Why a call into the policy component failed, as a typed error with its cause.
//!
//! The same four causes as the Python host's `PolicyOutOfFuel`,
//! `PolicyMemoryExceeded`, `PolicyBoundaryViolation` (all `PolicyTrap`) and the
//! Node host's classes of the same names. After any of them the instance is
//! broken: later calls answer [`PolicyFault::InstanceUnusable`] naming the first
//! fault, without entering the guest, and the host instantiates a fresh one.

use std::fmt;

/// A failed call into the policy component.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyFault {
    /// The call burned its whole fuel (about one unit per wasm instruction): a
    /// runaway or hostile guest, cut off. `fuel`: what the call was given (a
    /// call's, or more for a configuration's load).
    OutOfFuel { fuel: u64 },
    /// The guest asked for more linear memory than the instance's cap.
    MemoryExceeded { max_memory_bytes: usize },
    /// The guest trapped (`unreachable`, a bounds check, a stack overflow...).
    Trap { cause: String },
    /// A value crossing the boundary broke the contract: an enum or variant case
    /// that does not exist, a string that is not UTF-8, a pointer outside the
    /// guest's memory, a result of the wrong shape.
    BoundaryViolation { cause: String },
    /// An earlier call on this instance failed; the instance is not entered again.
    InstanceUnusable { first_fault: String },
    /// An input over its limit ([`crate::limits`]), refused before it crossed
    /// the boundary: nothing ran, and the instance is fine.
    InputTooLarge { input: &'static str, size_bytes: usize, limit_bytes: usize },
}

impl PolicyFault {
    /// Reads a failed call: `memory_refused` says whether the limiter refused a
    /// `memory.grow` during it (the guest's allocator then traps on its own).
    pub(crate) fn of(error: &wasmtime::Error, memory_refused: bool, fuel: u64, max_memory_bytes: usize) -> PolicyFault {
        if memory_refused {
            return PolicyFault::MemoryExceeded { max_memory_bytes };
        }
        match error.downcast_ref::<wasmtime::Trap>() {
            Some(wasmtime::Trap::OutOfFuel) => PolicyFault::OutOfFuel { fuel },
            Some(_) => PolicyFault::Trap { cause: format!("{error:#}") },
            // Not a trap of the guest's code: wasmtime refused to lift or lower a value.
            None => PolicyFault::BoundaryViolation { cause: format!("{error:#}") },
        }
    }

    /// The fault's kind, for logs and metrics: `out-of-fuel`, `memory-exceeded`,
    /// `trap`, `boundary-violation`, `instance-unusable` or `input-too-large`.
    pub fn kind(&self) -> &'static str {
        match self {
            PolicyFault::OutOfFuel { .. } => "out-of-fuel",
            PolicyFault::MemoryExceeded { .. } => "memory-exceeded",
            PolicyFault::Trap { .. } => "trap",
            PolicyFault::BoundaryViolation { .. } => "boundary-violation",
            PolicyFault::InstanceUnusable { .. } => "instance-unusable",
            PolicyFault::InputTooLarge { .. } => "input-too-large",
        }
    }
}

impl fmt::Display for PolicyFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyFault::OutOfFuel { fuel } => {
                write!(f, "the policy ran out of fuel: the call burned all of its {fuel} units (a runaway guest, cut off)")
            }
            PolicyFault::MemoryExceeded { max_memory_bytes } => {
                write!(f, "the policy asked for more than its memory cap of {max_memory_bytes} bytes")
            }
            PolicyFault::Trap { cause } => write!(f, "the policy trapped: {cause}"),
            PolicyFault::BoundaryViolation { cause } => write!(f, "the policy broke the contract at the boundary: {cause}"),
            PolicyFault::InstanceUnusable { first_fault } => {
                write!(f, "this policy instance failed earlier and is not entered again (instantiate a new one): {first_fault}")
            }
            PolicyFault::InputTooLarge { input, size_bytes, limit_bytes } => {
                write!(f, "{input} is {size_bytes} bytes, more than the {limit_bytes} the policy takes; refused before the call")
            }
        }
    }
}

impl std::error::Error for PolicyFault {}
