//! The shared state, as the core sees it: short texts under keys, kept by the
//! host (in memory, or in Redis for a fleet) behind compare-and-set. In the
//! component it is the `shared-state` import; natively, tests pass any
//! implementation. Only the core gives the texts meaning (`breaker.rs`).

use alloc::string::String;

/// What a load found: the text, its version (0: none), and the store's clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loaded {
    pub value: Option<String>,
    pub version: u64,
    pub now_ms: u64,
}

/// Texts under keys with compare-and-set. The default is no store at all: a
/// load finds nothing and a store fails, so no breaker ever opens.
pub trait SharedState {
    fn load(&mut self, _key: &str, now_ms: u64) -> Loaded {
        Loaded { value: None, version: 0, now_ms }
    }

    fn store_if(&mut self, _key: &str, _expected_version: u64, _value: &str, _ttl_ms: u64) -> bool {
        false
    }
}

/// A store in memory for one process: tests and the native conformance runner.
#[derive(Clone, Debug, Default)]
pub struct MemoryState {
    /// (key, text, version): a handful of keys, so a list does.
    entries: alloc::vec::Vec<(String, String, u64)>,
}

impl SharedState for MemoryState {
    fn load(&mut self, key: &str, now_ms: u64) -> Loaded {
        match self.entries.iter().find(|e| e.0 == key) {
            Some((_, value, version)) => Loaded { value: Some(value.clone()), version: *version, now_ms },
            None => Loaded { value: None, version: 0, now_ms },
        }
    }

    fn store_if(&mut self, key: &str, expected_version: u64, value: &str, _ttl_ms: u64) -> bool {
        match self.entries.iter_mut().find(|e| e.0 == key) {
            Some(entry) if entry.2 == expected_version => {
                entry.1 = String::from(value);
                entry.2 += 1;
                true
            }
            Some(_) => false,
            None if expected_version == 0 => {
                self.entries.push((String::from(key), String::from(value), 1));
                true
            }
            None => false,
        }
    }
}
