//! Text assembled piece by piece, without `core::fmt`.
//!
//! `format!` brings in `core::fmt`: `fmt::write`, the integer and hex
//! formatters, and an argument table at every call site, for text that is here
//! only ever strings, whole numbers and two zero-padded forms. Replacing it
//! took 2,690 bytes off the component (131,604 to 128,914 after wasm-opt); the
//! rest of `core::fmt` (the padding of `pad_integral`) stays, kept alive by
//! `core`'s own panic messages. `cat!("HTTP ", status)` builds a `String`;
//! `cat_to!(out; " call ", id)` appends to one.

use alloc::string::String;

/// A value that can be appended to text.
pub trait Piece {
    fn push_to(&self, out: &mut String);
}

impl Piece for str {
    fn push_to(&self, out: &mut String) {
        out.push_str(self);
    }
}

impl Piece for String {
    fn push_to(&self, out: &mut String) {
        out.push_str(self);
    }
}

impl Piece for char {
    fn push_to(&self, out: &mut String) {
        out.push(*self);
    }
}

impl<T: Piece + ?Sized> Piece for &T {
    fn push_to(&self, out: &mut String) {
        (**self).push_to(out);
    }
}

macro_rules! unsigned {
    ($($t:ty),*) => {$(
        impl Piece for $t {
            fn push_to(&self, out: &mut String) {
                push_decimal(out, *self as u64, 1);
            }
        }
    )*};
}
unsigned!(u8, u16, u32, u64, usize);

macro_rules! signed {
    ($($t:ty),*) => {$(
        impl Piece for $t {
            fn push_to(&self, out: &mut String) {
                if *self < 0 {
                    out.push('-');
                }
                push_decimal(out, (*self as i64).unsigned_abs(), 1);
            }
        }
    )*};
}
signed!(i32, i64);

/// A whole number in decimal with leading zeros up to `.1` digits (`{:04}`).
pub struct ZeroPadded(pub u64, pub usize);

impl Piece for ZeroPadded {
    fn push_to(&self, out: &mut String) {
        push_decimal(out, self.0, self.1);
    }
}

/// A whole number in lower-case hex with leading zeros up to `.1` digits (`{:032x}`).
pub struct Hex(pub u64, pub usize);

impl Piece for Hex {
    fn push_to(&self, out: &mut String) {
        let mut digits = [0u8; 16];
        let mut n = self.0;
        let mut start = digits.len();
        while n > 0 || start == digits.len() {
            start -= 1;
            digits[start] = b"0123456789abcdef"[(n & 15) as usize];
            n >>= 4;
        }
        push_padded(out, &digits[start..], self.1);
    }
}

#[inline(never)] // one copy for every integer type
fn push_decimal(out: &mut String, mut n: u64, min_digits: usize) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    push_padded(out, &digits[start..], min_digits);
}

fn push_padded(out: &mut String, digits: &[u8], min_digits: usize) {
    for _ in digits.len()..min_digits {
        out.push('0');
    }
    for &d in digits {
        out.push(d as char);
    }
}

/// `cat!(a, b, ...)`: a new `String` of the pieces in order.
macro_rules! cat {
    ($($piece:expr),* $(,)?) => {{
        let mut out = alloc::string::String::new();
        $( $crate::cat::Piece::push_to(&$piece, &mut out); )*
        out
    }};
}

/// `cat_to!(out; a, b, ...)`: appends the pieces to the `String` `out`.
macro_rules! cat_to {
    ($out:expr; $($piece:expr),* $(,)?) => {{
        let out: &mut alloc::string::String = &mut $out;
        $( $crate::cat::Piece::push_to(&$piece, out); )*
    }};
}

pub(crate) use {cat, cat_to};

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;

    #[test]
    fn numbers_read_as_format_writes_them() {
        for n in [0u64, 7, 10, 99, 100, 65_535, u32::MAX as u64, u64::MAX] {
            assert_eq!(cat!(n), format!("{n}"));
            assert_eq!(cat!(ZeroPadded(n, 4)), format!("{n:04}"));
        }
        for n in [0i64, -1, 42, i64::MIN, i64::MAX] {
            assert_eq!(cat!(n), format!("{n}"));
        }
        assert_eq!(cat!(i32::MIN, ' ', -32_602i32), format!("{} -32602", i32::MIN));
        for n in [0u64, 0x1f, u64::MAX, 0xab << 50] {
            assert_eq!(cat!(Hex(n, 16)), format!("{n:016x}"));
            assert_eq!(cat!(Hex(n, 4)), format!("{n:04x}"));
        }
    }

    #[test]
    fn pieces_join_in_order() {
        let mut out = cat!("HTTP ", 503u16, ": ", String::from("busy"), '!');
        cat_to!(out; " call ", 3u32, " (", "x", ")");
        assert_eq!(out, "HTTP 503: busy! call 3 (x)");
    }
}
