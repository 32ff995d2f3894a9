//! Short, single-line text for the model and the log: bodies and header values
//! come from servers and may be long, multi-line or hostile.

use alloc::string::String;

/// At most `max_chars` characters of `text`, on one line: control characters
/// (newlines included) become spaces, runs of spaces collapse, and a cut is marked
/// with `…`. Never splits a character.
pub fn excerpt(text: &str, max_chars: usize) -> String {
    let mut out = String::new();
    let mut count = 0;
    let mut last_space = true; // drops leading whitespace
    let mut chars = text.chars();
    for c in chars.by_ref() {
        let c = if c.is_control() || c.is_whitespace() { ' ' } else { c };
        if c == ' ' && last_space {
            continue;
        }
        if count == max_chars {
            // One more visible character exists: mark the cut.
            out.truncate(out.trim_end().len());
            out.push('…');
            return out;
        }
        last_space = c == ' ';
        out.push(c);
        count += 1;
    }
    out.truncate(out.trim_end().len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_lines_and_cuts_on_characters() {
        assert_eq!(excerpt("  amount must be\n an integer\r\n", 100), "amount must be an integer");
        assert_eq!(excerpt("ééééé", 3), "ééé…");
        assert_eq!(excerpt("abc", 3), "abc");
        assert_eq!(excerpt("", 3), "");
        assert_eq!(excerpt("a\u{0}b", 10), "a b");
    }
}
