//! Idempotency keys: derived once per intended call from stable inputs, never per
//! attempt (a new key on each attempt protects nothing: "Agent Retry Policies: When to Retry a Tool, Replan the Task or Give Up").

use alloc::string::String;

use crate::cat::{Hex, cat};

const FNV128_OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
const FNV128_PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013B;

/// FNV-1a-128 over `parts`, a 0x00 byte between each two.
pub fn fnv1a_128(parts: &[&[u8]]) -> u128 {
    let mut hash = FNV128_OFFSET;
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            hash ^= 0;
            hash = hash.wrapping_mul(FNV128_PRIME);
        }
        for byte in part.iter() {
            hash ^= u128::from(*byte);
            hash = hash.wrapping_mul(FNV128_PRIME);
        }
    }
    hash
}

/// `ar1-` and 32 lower-case hex digits of FNV-1a-128 over `run_id`, a 0x00 byte
/// and `action_id`. The separator keeps ("ab","c") and ("a","bc") apart.
pub fn derive_idempotency_key(run_id: &str, action_id: &str) -> String {
    let hash = fnv1a_128(&[run_id.as_bytes(), action_id.as_bytes()]);
    cat!("ar1-", Hex((hash >> 64) as u64, 16), Hex(hash as u64, 16))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_and_separated() {
        // FNV-1a-128 of the empty input is the offset basis; of "a" a published value.
        assert_eq!(fnv1a_128(&[b""]), FNV128_OFFSET);
        assert_eq!(fnv1a_128(&[b"a"]), 0xd228cb696f1a8caf78912b704e4a8964);
        let k = derive_idempotency_key("run-7", "step-3");
        assert_eq!(k, derive_idempotency_key("run-7", "step-3"));
        assert_eq!(k.len(), 36);
        assert!(k.starts_with("ar1-"));
        assert_ne!(derive_idempotency_key("ab", "c"), derive_idempotency_key("a", "bc"));
        assert_ne!(k, derive_idempotency_key("run-7", "step-4"));
    }
}
