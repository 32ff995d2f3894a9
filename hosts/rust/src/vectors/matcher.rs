//! Partial matching of an output against a vector's `expect`.
//!
//! - An object matches if every key it names matches (other keys are ignored).
//! - An array matches an array of the same length, item by item.
//! - `{"$contains": "text"}` matches a string that contains `text`.
//! - `{"$range": [lo, hi]}` matches a number with `lo <= n <= hi`.
//! - `{"$any": [m1, m2, ...]}` matches if any of the listed matchers matches.
//! - Anything else must be equal.

use serde_json::Value;

/// `Ok(())` or the path and reason of the first mismatch.
pub fn matches(expected: &Value, actual: &Value) -> Result<(), String> {
    check(expected, actual, "$")
}

fn check(expected: &Value, actual: &Value, path: &str) -> Result<(), String> {
    match expected {
        Value::Object(map) if map.len() == 1 && map.contains_key("$contains") => {
            let needle = map["$contains"].as_str().ok_or(format!("{path}: $contains takes a string"))?;
            match actual.as_str() {
                Some(text) if text.contains(needle) => Ok(()),
                _ => Err(format!("{path}: expected a string containing {needle:?}, got {actual}")),
            }
        }
        Value::Object(map) if map.len() == 1 && map.contains_key("$any") => {
            let options = map["$any"].as_array().filter(|o| !o.is_empty()).ok_or(format!("{path}: $any takes a non-empty list of matchers"))?;
            let mut misses = Vec::new();
            for (i, option) in options.iter().enumerate() {
                match check(option, actual, &format!("{path}.$any[{i}]")) {
                    Ok(()) => return Ok(()),
                    Err(miss) => misses.push(miss),
                }
            }
            Err(format!("{path}: no matcher of $any matches: {}", misses.join("; ")))
        }
        Value::Object(map) if map.len() == 1 && map.contains_key("$range") => {
            let bounds = map["$range"].as_array().filter(|b| b.len() == 2).ok_or(format!("{path}: $range takes [lo, hi]"))?;
            let (lo, hi) = (bounds[0].as_f64(), bounds[1].as_f64());
            match (actual.as_f64(), lo, hi) {
                (Some(n), Some(lo), Some(hi)) if lo <= n && n <= hi => Ok(()),
                _ => Err(format!("{path}: expected a number in {}, got {actual}", map["$range"])),
            }
        }
        Value::Object(map) => {
            let actual_map = actual.as_object().ok_or(format!("{path}: expected an object, got {actual}"))?;
            for (key, value) in map {
                let child = format!("{path}.{key}");
                let got = actual_map.get(key).ok_or(format!("{child}: missing in {actual}"))?;
                check(value, got, &child)?;
            }
            Ok(())
        }
        Value::Array(items) => {
            let actual_items = actual.as_array().ok_or(format!("{path}: expected an array, got {actual}"))?;
            if items.len() != actual_items.len() {
                return Err(format!("{path}: expected {} items, got {}: {actual}", items.len(), actual_items.len()));
            }
            for (i, (e, a)) in items.iter().zip(actual_items).enumerate() {
                check(e, a, &format!("{path}[{i}]"))?;
            }
            Ok(())
        }
        _ if expected == actual => Ok(()),
        _ => Err(format!("{path}: expected {expected}, got {actual}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn partial_and_operators() {
        let actual = json!({"ok": {"action": {"retry": {"delay-ms": 700, "attempt": 2}}, "reason": "HTTP 503 is transient"}});
        assert!(matches(&json!({"ok": {"action": {"retry": {"attempt": 2}}}}), &actual).is_ok());
        assert!(matches(&json!({"ok": {"action": {"retry": {"delay-ms": {"$range": [0, 1000]}}}}}), &actual).is_ok());
        assert!(matches(&json!({"ok": {"reason": {"$contains": "503"}}}), &actual).is_ok());
        assert!(matches(&json!({"ok": {"action": {"retry": {"attempt": 3}}}}), &actual).is_err());
        assert!(matches(&json!({"ok": {"action": "check-status"}}), &actual).is_err());
        assert!(matches(&json!({"err": null}), &actual).is_err());
        assert!(matches(&json!([1, 2]), &json!([1, 2, 3])).is_err());
        assert!(matches(&json!({"ok": {"reason": {"$contains": "429"}}}), &actual).is_err());
        let any = json!({"ok": {"action": {"$any": ["check-status", {"retry": {"attempt": 2}}]}}});
        assert!(matches(&any, &actual).is_ok());
        assert!(matches(&json!({"ok": {"action": {"$any": ["check-status", {"retry": {"attempt": 3}}]}}}), &actual).is_err());
        assert!(matches(&json!({"ok": {"$any": [{"missing": 1}, {"also-missing": null}]}}), &actual).is_err(), "a named key must be present");
    }
}
