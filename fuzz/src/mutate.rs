//! A small, seeded mutator for the stable replay test: deterministic, so that a
//! failure in CI is reproduced by the same seed (SplitMix64, the hosts' seeded
//! entropy source).

/// SplitMix64.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform-enough integer in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Tokens a mutation may splice in: what breaks parsers of numbers, dates, JSON and text.
const TOKENS: &[&[u8]] = &[
    b"0",
    b"-1",
    b"18446744073709551616",
    b"99999999999999999999999999",
    b"1e308",
    b"NaN",
    b".",
    b",",
    b";",
    b"=",
    b":",
    b"\"",
    b"\\u",
    b"\\ud800",
    b"{",
    b"}",
    b"[",
    b"]",
    b"\n",
    b"\r\n",
    b"\0",
    b"\xff",
    b"\xc3",
    b"\xe2\x80\xae",
    b"GMT",
    b"Z",
    b"ms",
    b"h",
    b"retry-after: ",
    b"ratelimit: ",
    b"x-amzn-ErrorType: ",
    b"x-should-retry: false",
    b"@status 429\n",
    b"@status 503\n",
    b"@rpc -32603\n",
    b"HTTP 503",
    b"rate limit",
    b"try again in ",
    b"ThrottlingException",
    b"\"tools\":{",
    b"\"account-budget\":{\"account-id\":\"a\",\"capacity\":1,\"refill-interval-ms\":1}",
];

/// One to four mutations of `input`; `other` is another corpus entry to splice from.
pub fn mutate(input: &[u8], other: &[u8], rng: &mut Rng, max_len: usize) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = if out.is_empty() { 0 } else { rng.below(out.len() + 1) };
        match rng.below(9) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] = rng.next_u64() as u8;
            }
            2 if !out.is_empty() => {
                let len = 1 + rng.below(out.len().min(16));
                let from = rng.below(out.len() - len + 1);
                out.drain(from..from + len);
            }
            3 => {
                let token = TOKENS[rng.below(TOKENS.len())];
                out.splice(at..at, token.iter().copied());
            }
            4 if !other.is_empty() => {
                let from = rng.below(other.len());
                let len = 1 + rng.below((other.len() - from).min(64));
                out.splice(at..at, other[from..from + len].iter().copied());
            }
            5 if !out.is_empty() => {
                // Repeat a piece: long values, deep nesting.
                let from = rng.below(out.len());
                let len = 1 + rng.below((out.len() - from).min(8));
                let piece: Vec<u8> = out[from..from + len].to_vec();
                let times = 1 + rng.below(200);
                for _ in 0..times {
                    out.splice(at..at, piece.iter().copied());
                }
            }
            6 if !out.is_empty() => {
                // A digit run made longer or a number changed.
                let i = rng.below(out.len());
                out[i] = b'0' + rng.below(10) as u8;
            }
            7 => {
                let n = rng.next_u64().to_string();
                out.splice(at..at, n.bytes());
            }
            _ => {
                if !out.is_empty() {
                    out.truncate(rng.below(out.len() + 1));
                }
            }
        }
    }
    out.truncate(max_len);
    out
}
