//! Capped exponential backoff with full jitter (Brooker, "Exponential Backoff And
//! Jitter", 2015): `delay = random(0, min(cap, base × 2^(retry - 1)))`, with the
//! server's hint as a floor. Full jitter spreads competing workers over the whole
//! range, which in Brooker's simulation completes the same work with the fewest
//! calls; a fixed delay or un-jittered backoff makes workers retry in lock-step.
//!
//! The draw is exact integer arithmetic so that every host reproduces it:
//! `floor(entropy × (ceiling + 1) / 2^64)`, a uniform integer in `0..=ceiling`
//! for a uniform 64-bit `entropy` (Lemire's multiply-shift).

/// The largest delay retry number `retry` may draw (1 is the first retry; 0 is
/// read as 1): `min(max_delay_ms, base_delay_ms × 2^(retry - 1))`, saturating.
pub fn ceiling_ms(base_delay_ms: u64, max_delay_ms: u64, retry: u32) -> u64 {
    let doublings = retry.saturating_sub(1);
    let factor = 1u64.checked_shl(doublings).unwrap_or(u64::MAX);
    let factor = if doublings >= 64 { u64::MAX } else { factor };
    crate::arith::mul_saturating(base_delay_ms, factor).min(max_delay_ms)
}

/// A uniform integer in `0..=ceiling` from 64 bits of entropy.
pub fn full_jitter(ceiling: u64, entropy: u64) -> u64 {
    ((u128::from(entropy) * (u128::from(ceiling) + 1)) >> 64) as u64
}

/// The delay before retry number `retry`, in ms.
pub fn next_delay_ms(base_delay_ms: u64, max_delay_ms: u64, retry: u32, hint_ms: Option<u64>, entropy: u64) -> u64 {
    let jittered = full_jitter(ceiling_ms(base_delay_ms, max_delay_ms, retry), entropy);
    jittered.max(hint_ms.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_double_then_cap() {
        let seq: [u64; 7] = core::array::from_fn(|i| ceiling_ms(1000, 30_000, i as u32 + 1));
        assert_eq!(seq, [1000, 2000, 4000, 8000, 16_000, 30_000, 30_000]);
        assert_eq!(ceiling_ms(1000, 30_000, 0), 1000);
    }

    #[test]
    fn saturates_up_to_u32_max() {
        for retry in [63, 64, 65, 1000, u32::MAX - 1, u32::MAX] {
            assert_eq!(ceiling_ms(1000, 30_000, retry), 30_000, "{retry}");
            assert_eq!(ceiling_ms(u64::MAX, u64::MAX, retry), u64::MAX, "{retry}");
        }
        assert_eq!(ceiling_ms(1, u64::MAX, 64), 1 << 63);
        assert_eq!(ceiling_ms(1, u64::MAX, 65), u64::MAX);
        assert_eq!(full_jitter(u64::MAX, u64::MAX), u64::MAX);
        assert_eq!(next_delay_ms(u64::MAX, u64::MAX, u32::MAX, Some(u64::MAX), u64::MAX), u64::MAX);
    }

    #[test]
    fn exact_draws() {
        // The draw is floor(e * (c + 1) / 2^64): the ends and the middle.
        assert_eq!(full_jitter(1000, 0), 0);
        assert_eq!(full_jitter(1000, u64::MAX), 1000);
        assert_eq!(full_jitter(1000, 1 << 63), 500);
        assert_eq!(full_jitter(0, u64::MAX), 0);
        // One entropy value through a whole sequence of retries (base 1000, cap 30000).
        let e = 0x9E37_79B9_7F4A_7C15; // 2^64 / golden ratio
        let seq: [u64; 6] = core::array::from_fn(|i| next_delay_ms(1000, 30_000, i as u32 + 1, None, e));
        assert_eq!(seq, [618, 1236, 2472, 4944, 9889, 18_541]);
    }

    #[test]
    fn hint_is_a_floor() {
        assert_eq!(next_delay_ms(1000, 30_000, 1, Some(3000), u64::MAX), 3000);
        assert_eq!(next_delay_ms(1000, 30_000, 5, Some(3000), u64::MAX), 16_000);
        assert_eq!(next_delay_ms(1000, 30_000, 1, Some(45_000), 0), 45_000);
    }

    #[test]
    fn draws_are_uniform_enough() {
        // 10,000 evenly spaced entropy values cover 0..=9 in equal shares.
        let mut counts = [0u32; 10];
        for i in 0..10_000u64 {
            let e = i.wrapping_mul(u64::MAX / 10_000);
            counts[full_jitter(9, e) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (990..=1010).contains(&c)), "{counts:?}");
    }
}
