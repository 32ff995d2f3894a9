//! Jitter randomness, supplied by the host: the OS by default, or a seed for runs
//! that must replay exactly.

use std::sync::Mutex;

/// Where a host's 64-bit entropy values come from.
pub enum EntropySource {
    /// The operating system's randomness (getrandom).
    Os,
    /// SplitMix64 from a seed: the same seed gives the same sequence, in any
    /// language (`x += 0x9E3779B97F4A7C15; z = x; z = (z ^ z>>30) * 0xBF58476D1CE4E5B9;
    /// z = (z ^ z>>27) * 0x94D049BB133111EB; return z ^ z>>31`, all mod 2^64).
    Seeded(Mutex<u64>),
    /// Always this value: no jitter at all (for comparison runs, never production).
    Fixed(u64),
}

impl EntropySource {
    pub fn seeded(seed: u64) -> Self {
        EntropySource::Seeded(Mutex::new(seed))
    }

    /// The next 64 bits.
    pub fn next_u64(&self) -> u64 {
        match self {
            EntropySource::Os => {
                let mut bytes = [0u8; 8];
                // The OS source failing is not survivable for a host anyway; fall back
                // to the longest delay in range, the safe side for a shared allowance.
                match getrandom::fill(&mut bytes) {
                    Ok(()) => u64::from_le_bytes(bytes),
                    Err(_) => u64::MAX,
                }
            }
            EntropySource::Seeded(state) => {
                let mut x = state.lock().unwrap_or_else(|p| p.into_inner());
                *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
                splitmix64_mix(*x)
            }
            EntropySource::Fixed(value) => *value,
        }
    }
}

fn splitmix64_mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_sequence_is_splitmix64() {
        // SplitMix64 with seed 0: the reference sequence's first two values.
        let source = EntropySource::seeded(0);
        assert_eq!(source.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(source.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        let os = EntropySource::Os;
        assert_ne!(os.next_u64(), os.next_u64());
    }
}
