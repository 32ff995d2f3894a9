//! Integer arithmetic for the decision path, written so that wasm32 needs no
//! 128-bit libcall: `u64::saturating_mul` checks for overflow with a 64×64→128
//! multiply, which the component makes through a call to `__multi3`.

/// `a × b`, saturating at `u64::MAX`: the same result as `u64::saturating_mul`.
pub fn mul_saturating(a: u64, b: u64) -> u64 {
    if b != 0 && a > u64::MAX / b { u64::MAX } else { a * b }
}

/// The decimal digits of `digits` (ASCII `0`–`9` only, which the caller has
/// checked) as a number, saturating at `u64::MAX`.
pub fn decimal_saturating(digits: &[u8]) -> u64 {
    digits.iter().fold(0, |n: u64, d| mul_saturating(n, 10).saturating_add(u64::from(d - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_the_standard_saturating_multiply() {
        let values = [0, 1, 2, 9, 10, 1000, u64::from(u32::MAX), u64::MAX / 10, u64::MAX / 10 + 1, u64::MAX / 2, u64::MAX - 1, u64::MAX];
        for a in values {
            for b in values {
                assert_eq!(mul_saturating(a, b), a.saturating_mul(b), "{a} × {b}");
            }
        }
    }

    #[test]
    fn decimal_digits_saturate_exactly() {
        assert_eq!(decimal_saturating(b""), 0);
        assert_eq!(decimal_saturating(b"007"), 7);
        assert_eq!(decimal_saturating(b"18446744073709551615"), u64::MAX);
        assert_eq!(decimal_saturating(b"18446744073709551614"), u64::MAX - 1);
        assert_eq!(decimal_saturating(b"18446744073709551616"), u64::MAX);
        assert_eq!(decimal_saturating(b"99999999999999999999999"), u64::MAX);
        assert_eq!(decimal_saturating(b"000000000000000000000000001"), 1);
    }
}
