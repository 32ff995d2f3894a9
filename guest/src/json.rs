//! A small JSON reader and writer for the configuration.
//!
//! serde_json with its number tables and map types made up a third of the
//! component; the configuration needs far less: objects in order, whole numbers,
//! strings, booleans, and errors that say where the text went wrong.

use alloc::string::String;
use alloc::vec::Vec;

use crate::cat::{Hex, cat, cat_to};

/// A parsed JSON value. Numbers keep their text, so that the reader of a field
/// decides what a number may be.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Number(String),
    String(String),
    Array(Vec<Json>),
    /// Members in document order; duplicate names are rejected when parsing.
    Object(Vec<(String, Json)>),
}

/// Nesting deeper than this is refused rather than risking the guest's stack.
const MAX_DEPTH: usize = 64;

impl Json {
    pub fn type_name(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "a boolean",
            Json::Number(_) => "a number",
            Json::String(_) => "a string",
            Json::Array(_) => "an array",
            Json::Object(_) => "an object",
        }
    }

    /// The number as a `u64` if it is written as a plain whole number that fits.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Json::Number(text) if text.bytes().all(|b| b.is_ascii_digit()) => text.parse().ok(),
            _ => None,
        }
    }
}

/// Parses one JSON document. The error says what was expected and at which byte.
pub fn parse(text: &str) -> Result<Json, String> {
    let mut parser = Parser { bytes: text.as_bytes(), pos: 0 };
    let value = parser.value(0)?;
    parser.skip_space();
    if parser.pos != parser.bytes.len() {
        return Err(parser.error("end of input"));
    }
    Ok(value)
}

/// Objects with fewer members than this check a name against each member: most
/// objects of a configuration have a handful, and a table for each cost an
/// allocation (10,000 tools are 10,000 small objects).
const LINEAR_NAMES: usize = 8;

/// The member names of one object so far, as an open-addressing hash table of
/// indexes into the members: checking a name costs O(1), so an object with n
/// members is parsed in O(n), not O(n²) (10,000 tools in a configuration).
#[derive(Default)]
pub(crate) struct NameSet {
    /// `member index + 1`, 0 for an empty slot; the length is a power of two.
    slots: Vec<u32>,
}

impl NameSet {
    /// Eight bytes a step (a byte a step cost a configuration of 10,000 tools
    /// about 8 wasm operators a byte, twice), then mixed so that the low bits the
    /// table uses depend on every byte.
    pub(crate) fn hash(name: &str) -> u64 {
        const K: u64 = 0x9e37_79b9_7f4a_7c15;
        let bytes = name.as_bytes();
        let mut h = bytes.len() as u64;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in chunks.by_ref() {
            h = (h.rotate_left(23) ^ word(chunk, 0)).wrapping_mul(K);
        }
        let tail = chunks.remainder();
        if !tail.is_empty() {
            let mut last = [0u8; 8];
            last[..tail.len()].copy_from_slice(tail);
            h = (h.rotate_left(23) ^ u64::from_le_bytes(last)).wrapping_mul(K);
        }
        h ^= h >> 32;
        h = h.wrapping_mul(K);
        h ^ (h >> 29)
    }

    /// Adds `name` (about to become `members[members.len()]`); false if present.
    /// Up to [`LINEAR_NAMES`] members a linear look costs less than a table.
    fn insert(&mut self, name: &str, members: &[(String, Json)]) -> bool {
        if members.len() < LINEAR_NAMES {
            return !members.iter().any(|(existing, _)| existing == name);
        }
        if (members.len() + 1) * 2 > self.slots.len() {
            // Grow and re-insert: amortised O(1).
            let size = ((members.len() + 1) * 4).next_power_of_two().max(16);
            self.slots = alloc::vec![0; size];
            for (i, (existing, _)) in members.iter().enumerate() {
                let mut at = Self::hash(existing) as usize & (size - 1);
                while self.slots[at] != 0 {
                    at = (at + 1) & (size - 1);
                }
                self.slots[at] = i as u32 + 1;
            }
        }
        let mask = self.slots.len() - 1;
        let mut at = Self::hash(name) as usize & mask;
        while self.slots[at] != 0 {
            if members[self.slots[at] as usize - 1].0 == name {
                return false;
            }
            at = (at + 1) & mask;
        }
        self.slots[at] = members.len() as u32 + 1;
        true
    }
}

/// The eight bytes of `bytes` from `at`, little-endian; `at + 8 <= bytes.len()`.
#[inline(always)]
fn word(bytes: &[u8], at: usize) -> u64 {
    let mut eight = [0u8; 8];
    eight.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(eight)
}

/// Whether any of the eight bytes in `w` is a quote, a backslash or a control
/// byte (below 0x20): the bytes that end a run of plain string content. The
/// byte-wise tests of "Bit Twiddling Hacks" (Sean Eron Anderson, "Determine if a
/// word has a zero byte" and "has a byte less than n"), exact for "any".
#[inline(always)]
fn ends_plain_run(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let has_zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGHS;
    let quote = has_zero(w ^ (ONES * u64::from(b'"')));
    let backslash = has_zero(w ^ (ONES * u64::from(b'\\')));
    let control = w.wrapping_sub(ONES * 0x20) & !w & HIGHS;
    quote | backslash | control != 0
}

struct Parser<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn error(&self, expected: &str) -> String {
        match self.bytes.get(self.pos) {
            Some(b) if b.is_ascii_graphic() => cat!("expected ", expected, " at byte ", self.pos, ", found '", *b as char, "'"),
            Some(_) => cat!("expected ", expected, " at byte ", self.pos),
            None => cat!("expected ", expected, " at byte ", self.pos, ", found the end"),
        }
    }

    fn skip_space(&mut self) {
        while matches!(self.bytes.get(self.pos), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> bool {
        self.skip_space();
        if self.bytes.get(self.pos) == Some(&byte) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn literal(&mut self, word: &str, value: Json) -> Result<Json, String> {
        if self.bytes[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(value)
        } else {
            Err(self.error("a JSON value"))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Json, String> {
        if depth > MAX_DEPTH {
            return Err(cat!("nesting deeper than ", MAX_DEPTH, " levels at byte ", self.pos));
        }
        self.skip_space();
        match self.bytes.get(self.pos) {
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => self.string().map(Json::String),
            Some(b't') => self.literal("true", Json::Bool(true)),
            Some(b'f') => self.literal("false", Json::Bool(false)),
            Some(b'n') => self.literal("null", Json::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(self.error("a JSON value")),
        }
    }

    fn object(&mut self, depth: usize) -> Result<Json, String> {
        self.pos += 1;
        let mut members: Vec<(String, Json)> = Vec::new();
        let mut names = NameSet::default();
        if self.eat(b'}') {
            return Ok(Json::Object(members));
        }
        loop {
            self.skip_space();
            if self.bytes.get(self.pos) != Some(&b'"') {
                return Err(self.error("a member name in quotes"));
            }
            let start = self.pos;
            let name = self.string()?;
            if !names.insert(&name, &members) {
                return Err(cat!("member \"", crate::text::excerpt(&name, 40), "\" appears twice (at byte ", start, ")"));
            }
            if !self.eat(b':') {
                return Err(self.error("':'"));
            }
            let value = self.value(depth + 1)?;
            members.push((name, value));
            if self.eat(b'}') {
                return Ok(Json::Object(members));
            }
            if !self.eat(b',') {
                return Err(self.error("',' or '}'"));
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Json, String> {
        self.pos += 1;
        let mut items = Vec::new();
        if self.eat(b']') {
            return Ok(Json::Array(items));
        }
        loop {
            items.push(self.value(depth + 1)?);
            if self.eat(b']') {
                return Ok(Json::Array(items));
            }
            if !self.eat(b',') {
                return Err(self.error("',' or ']'"));
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self.bytes.get(self.pos..self.pos + 4).ok_or_else(|| self.error("4 hex digits"))?;
        // from_str_radix alone would take a sign ("\u+041").
        if !digits.iter().all(u8::is_ascii_hexdigit) {
            return Err(self.error("4 hex digits"));
        }
        let text = core::str::from_utf8(digits).map_err(|_| self.error("4 hex digits"))?;
        let value = u32::from_str_radix(text, 16).map_err(|_| self.error("4 hex digits"))?;
        self.pos += 4;
        Ok(value)
    }

    fn string(&mut self) -> Result<String, String> {
        self.pos += 1; // the opening quote
        let mut out = String::new();
        loop {
            // The run of plain bytes. It starts and ends at ASCII bytes (a quote,
            // a backslash, a control byte or the input's end) of the &str the
            // parser was given, so it is valid UTF-8 as it stands.
            let start = self.pos;
            // On locals, not `self`: the byte loop is the parser's hottest.
            let (bytes, mut at) = (self.bytes, self.pos);
            // Eight bytes a step while none of them ends the run, then byte by byte.
            while at + 8 <= bytes.len() && !ends_plain_run(word(bytes, at)) {
                at += 8;
            }
            while at < bytes.len() {
                let b = bytes[at];
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                at += 1;
            }
            self.pos = at;
            // SAFETY: see above; checking it again cost a configuration of many tools dearly.
            let run = unsafe { core::str::from_utf8_unchecked(&self.bytes[start..self.pos]) };
            match self.bytes.get(self.pos) {
                // Most strings have no escape: one allocation of the right size.
                Some(b'"') if out.is_empty() => {
                    self.pos += 1;
                    return Ok(String::from(run));
                }
                Some(b'"') => {
                    out.push_str(run);
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    out.push_str(run);
                    self.pos += 1;
                    let escape = *self.bytes.get(self.pos).ok_or_else(|| self.error("an escape"))?;
                    self.pos += 1;
                    let c = match escape {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => {
                            let high = self.hex4()?;
                            let code = if (0xD800..0xDC00).contains(&high) {
                                if self.bytes.get(self.pos..self.pos + 2) != Some(b"\\u") {
                                    return Err(self.error("a low surrogate escape"));
                                }
                                self.pos += 2;
                                let low = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&low) {
                                    return Err(self.error("a low surrogate escape"));
                                }
                                0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
                            } else {
                                high
                            };
                            char::from_u32(code).ok_or_else(|| self.error("a valid \\u escape"))?
                        }
                        _ => {
                            self.pos -= 1;
                            return Err(self.error("a valid escape"));
                        }
                    };
                    out.push(c);
                }
                _ => return Err(self.error("a closing quote")),
            }
        }
    }

    fn number(&mut self) -> Result<Json, String> {
        let start = self.pos;
        let digits = |p: &mut Self| {
            let from = p.pos;
            while matches!(p.bytes.get(p.pos), Some(b'0'..=b'9')) {
                p.pos += 1;
            }
            p.pos > from
        };
        if self.bytes[self.pos] == b'-' {
            self.pos += 1;
        }
        // JSON allows no leading zeros: "0" stands alone.
        if self.bytes.get(self.pos) == Some(&b'0') {
            self.pos += 1;
        } else if !digits(self) {
            return Err(self.error("a digit"));
        }
        if self.bytes.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            if !digits(self) {
                return Err(self.error("a digit"));
            }
        }
        if matches!(self.bytes.get(self.pos), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.bytes.get(self.pos), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if !digits(self) {
                return Err(self.error("a digit"));
            }
        }
        let text = core::str::from_utf8(&self.bytes[start..self.pos]).unwrap_or("0");
        Ok(Json::Number(String::from(text)))
    }
}

/// Appends `text` as a JSON string literal.
pub fn write_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => cat_to!(*out; "\\u", Hex(c as u64, 4)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use alloc::vec;

    #[test]
    fn parses_documents() {
        let doc = parse(r#" {"a": [1, -2.5e3, true, null], "b": {"c": "x\"\u00e9\ud83d\ude00"}} "#).unwrap();
        let Json::Object(members) = doc else { panic!() };
        assert_eq!(members[0].0, "a");
        assert_eq!(members[0].1, Json::Array(vec![Json::Number("1".into()), Json::Number("-2.5e3".into()), Json::Bool(true), Json::Null]));
        assert_eq!(members[1].1, Json::Object(vec![("c".into(), Json::String("x\"é😀".into()))]));
        assert_eq!(Json::Number("18446744073709551615".into()).as_u64(), Some(u64::MAX));
        assert_eq!(Json::Number("18446744073709551616".into()).as_u64(), None);
        assert_eq!(Json::Number("1.0".into()).as_u64(), None);
    }

    #[test]
    fn rejects_bad_text_with_a_position() {
        for (text, expected) in [
            ("", "expected a JSON value at byte 0"),
            ("{", "expected a member name in quotes at byte 1"),
            ("{\"a\" 1}", "expected ':' at byte 5"),
            ("[1,]", "expected a JSON value at byte 3"),
            ("{\"a\":1,\"a\":2}", "member \"a\" appears twice"),
            ("\"\\x\"", "expected a valid escape at byte 2"),
            ("\"\\ud800\"", "expected a low surrogate escape"),
            ("01", "expected end of input at byte 1"),
            ("-", "expected a digit at byte 1"),
            ("1.", "expected a digit"),
            ("tru", "expected a JSON value"),
            ("\"a\nb\"", "expected a closing quote"),
        ] {
            let error = parse(text).unwrap_err();
            assert!(error.contains(expected), "{text:?}: {error}");
        }
        assert!(parse(&"[".repeat(100)).unwrap_err().contains("nesting deeper than 64"));
    }

    #[test]
    fn writes_strings_that_parse_back() {
        let text = "a\"b\\c\nd\u{1}é";
        let mut out = String::new();
        write_string(&mut out, text);
        assert_eq!(parse(&out).unwrap(), Json::String(text.to_string()));
    }
}
