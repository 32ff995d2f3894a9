//! The shared state the component imports (`shared-state`): short texts under
//! keys with compare-and-set, which only the policy gives meaning (its circuit
//! breakers). This backend keeps them in the process's memory, shared by every
//! run and instance that holds the same [`HostServices`](crate::HostServices).

mod redis;

pub use redis::{FallbackSharedState, RedisSharedState, STATE_PREFIX};

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The longest text a store keeps, in bytes: the policy's are about 60.
pub const MAX_VALUE_BYTES: usize = 1024;
/// The most keys the embedded store holds: a fleet's breakers are a few per server and tool.
pub const MAX_KEYS: usize = 10_000;

/// What `load` found (the contract's `loaded`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Loaded {
    pub value: Option<String>,
    /// 0 when nothing is stored.
    pub version: u64,
    /// The store's clock, in ms since the Unix epoch.
    pub now_ms: u64,
}

/// A shared state. `store_if` must be atomic across every caller.
pub trait SharedStateBackend: Send + Sync {
    fn load(&self, key: &str, now_ms: u64) -> Loaded;
    /// Stores `value` if the version is still `expected_version`; true if stored.
    fn store_if(&self, key: &str, expected_version: u64, value: &str, ttl_ms: u64) -> bool;
}

struct Entry {
    value: String,
    version: u64,
    expires_at_ms: u64,
}

/// The embedded store: in this process's memory. Its `now-ms` is the one the
/// caller passed (every caller is this process, on its own clock or a test's
/// fake one); entries expire on the process's clock.
pub struct EmbeddedSharedState {
    entries: Mutex<HashMap<String, Entry>>,
    clock: Box<dyn Fn() -> u64 + Send + Sync>,
}

impl Default for EmbeddedSharedState {
    fn default() -> Self {
        Self::new()
    }
}

impl EmbeddedSharedState {
    pub fn new() -> Self {
        let (epoch_ms, started) = (SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64), Instant::now());
        Self::with_clock(move || epoch_ms.saturating_add(started.elapsed().as_millis() as u64))
    }

    /// Entries expire on `clock` (ms): for tests.
    pub fn with_clock(clock: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        EmbeddedSharedState { entries: Mutex::new(HashMap::new()), clock: Box::new(clock) }
    }
}

impl EmbeddedSharedState {
    /// Stores `value` under `key` whatever its version, never to expire on
    /// the store's clock: for tests and vectors that put a state in place (a
    /// hostile or stale one).
    pub fn put(&self, key: &str, value: &str) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let version = entries.get(key).map_or(0, |e| e.version) + 1;
        entries.insert(key.to_owned(), Entry { value: value.to_owned(), version, expires_at_ms: u64::MAX });
    }

    /// The text under `key`, expired or not: for tests and vectors.
    pub fn get(&self, key: &str) -> Option<String> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).get(key).map(|e| e.value.clone())
    }
}

impl SharedStateBackend for EmbeddedSharedState {
    fn load(&self, key: &str, now_ms: u64) -> Loaded {
        let now = (self.clock)();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        match entries.get(key) {
            Some(entry) if entry.expires_at_ms > now => Loaded { value: Some(entry.value.clone()), version: entry.version, now_ms },
            Some(_) => {
                entries.remove(key);
                Loaded { value: None, version: 0, now_ms }
            }
            None => Loaded { value: None, version: 0, now_ms },
        }
    }

    fn store_if(&self, key: &str, expected_version: u64, value: &str, ttl_ms: u64) -> bool {
        if value.len() > MAX_VALUE_BYTES {
            return false;
        }
        let now = (self.clock)();
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let current = entries.get(key).filter(|e| e.expires_at_ms > now).map_or(0, |e| e.version);
        if current != expected_version {
            return false;
        }
        if current == 0 && entries.len() >= MAX_KEYS {
            entries.retain(|_, e| e.expires_at_ms > now);
            if entries.len() >= MAX_KEYS {
                return false;
            }
        }
        entries.insert(key.to_owned(), Entry { value: value.to_owned(), version: current + 1, expires_at_ms: now.saturating_add(ttl_ms) });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn store() -> (EmbeddedSharedState, Arc<AtomicU64>) {
        let now = Arc::new(AtomicU64::new(1_000));
        let clock = Arc::clone(&now);
        (EmbeddedSharedState::with_clock(move || clock.load(Ordering::SeqCst)), now)
    }

    #[test]
    fn a_store_succeeds_only_on_the_version_it_read() {
        let (s, _) = store();
        assert_eq!(s.load("k", 5), Loaded { value: None, version: 0, now_ms: 5 });
        assert!(s.store_if("k", 0, "a", 100));
        assert!(!s.store_if("k", 0, "b", 100), "another worker stored first");
        assert_eq!(s.load("k", 6), Loaded { value: Some("a".into()), version: 1, now_ms: 6 });
        assert!(s.store_if("k", 1, "c", 100));
        assert!(!s.store_if("k", 1, "d", 100));
        assert_eq!(s.load("k", 7).value.as_deref(), Some("c"));
    }

    #[test]
    fn an_expired_entry_is_gone_and_its_key_starts_again() {
        let (s, now) = store();
        assert!(s.store_if("k", 0, "a", 100));
        now.store(1_100, Ordering::SeqCst);
        assert_eq!(s.load("k", 0).version, 0);
        assert!(s.store_if("k", 0, "b", 100));
    }

    #[test]
    fn oversized_values_and_a_full_store_are_refused() {
        let (s, now) = store();
        assert!(!s.store_if("k", 0, &"x".repeat(MAX_VALUE_BYTES + 1), 100));
        for i in 0..MAX_KEYS {
            assert!(s.store_if(&i.to_string(), 0, "v", 50));
        }
        assert!(!s.store_if("new", 0, "v", 100), "full");
        assert!(s.store_if("0", 1, "w", 100), "a held key may still change");
        now.store(1_060, Ordering::SeqCst);
        assert!(s.store_if("new", 0, "v", 100), "the expired ones made room");
    }
}
