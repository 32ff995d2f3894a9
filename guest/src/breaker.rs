//! Circuit breakers: one per server and one per (server, tool), decided here and
//! kept by the host as short texts in the shared state (`shared.rs`), so that
//! every run and every worker of a fleet sees one state.
//!
//! A breaker counts only failures that say the server is unreachable or failing
//! (transport faults, 5xx, timeouts; [`counts_as_failure`]). It opens after
//! `failures-to-open` of them in a row, or when `failure-ratio-percent` of the
//! calls in a sliding window failed (at least `min-calls-in-window` of them). Open,
//! it refuses calls until its cooldown ends; then it lets exactly one probe
//! through (half-open), whose outcome closes it or opens it again with a longer
//! cooldown (Nygard, "Release It!", 2nd ed., ch. 5; resilience4j's
//! `CircuitBreaker` has the same three states and the ratio over a window).
//!
//! The window is two fixed windows, the previous one weighted by how much of it
//! still overlaps the sliding one: constant space whatever the traffic.
//!
//! Every change goes through compare-and-set: a change another worker made
//! first is read again and the decision made anew, so that of 32 runs that see
//! a cooldown end at once, one probes.

use alloc::string::String;

use crate::cat::{cat, cat_to};
use crate::config::BreakerConfig;
use crate::shared::SharedState;
use crate::types::{FailureKind, OutcomeClass};

/// The contract's `breaker-state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Closed,
    Open,
    HalfOpen,
}

impl Mode {
    pub const fn name(self) -> &'static str {
        match self {
            Mode::Closed => "closed",
            Mode::Open => "open",
            Mode::HalfOpen => "half-open",
        }
    }
}

/// One breaker's state, as stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct State {
    pub mode: Mode,
    /// Counted failures in a row (closed).
    pub consecutive: u32,
    /// When the current window began (store clock, ms).
    pub window_start_ms: u64,
    pub calls: u32,
    pub failures: u32,
    /// The previous window's counts.
    pub prev_calls: u32,
    pub prev_failures: u32,
    /// Open: when the cooldown ends. Half-open: when the probe's lease ends.
    pub until_ms: u64,
    /// The cooldown the breaker last opened with (it grows at each failed probe).
    pub cooldown_ms: u64,
}

/// The stored text's prefix: a text without it is not ours, and is dropped.
const FORMAT: &str = "b1";

/// The longest stored text the policy reads; a longer one is dropped.
const MAX_TEXT_BYTES: usize = 200;

/// How many times a change is tried against a store that keeps answering "changed
/// first": then the breaker is left as it is, and the call goes (fail open).
const MAX_TRIES: u32 = 4;

impl State {
    pub fn closed(now_ms: u64) -> State {
        State {
            mode: Mode::Closed,
            consecutive: 0,
            window_start_ms: now_ms,
            calls: 0,
            failures: 0,
            prev_calls: 0,
            prev_failures: 0,
            until_ms: 0,
            cooldown_ms: 0,
        }
    }

    /// `b1 <mode> <consecutive> <window-start-ms> <calls> <failures> <prev-calls>
    /// <prev-failures> <until-ms> <cooldown-ms>`, mode `c`, `o` or `h`.
    pub fn encode(&self) -> String {
        let mode = match self.mode {
            Mode::Closed => "c",
            Mode::Open => "o",
            Mode::HalfOpen => "h",
        };
        cat!(
            FORMAT,
            " ",
            mode,
            " ",
            self.consecutive,
            " ",
            self.window_start_ms,
            " ",
            self.calls,
            " ",
            self.failures,
            " ",
            self.prev_calls,
            " ",
            self.prev_failures,
            " ",
            self.until_ms,
            " ",
            self.cooldown_ms
        )
    }

    /// Reads a stored text, or `None` if the policy cannot trust it: not ours,
    /// malformed, counts that contradict each other, or a wait longer than the
    /// configuration allows from `now_ms` (a worker with a clock far ahead, or a
    /// hostile writer, cannot lock a server out past `max-cooldown-ms`).
    pub fn decode(text: &str, config: &BreakerConfig, now_ms: u64) -> Option<State> {
        if text.len() > MAX_TEXT_BYTES {
            return None;
        }
        let mut parts = text.split(' ');
        if parts.next()? != FORMAT {
            return None;
        }
        let mode = match parts.next()? {
            "c" => Mode::Closed,
            "o" => Mode::Open,
            "h" => Mode::HalfOpen,
            _ => return None,
        };
        let mut numbers = [0u64; 8];
        for slot in &mut numbers {
            let part = parts.next()?;
            if part.is_empty() || part.len() > 20 || !part.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            *slot = part.parse().ok()?;
        }
        if parts.next().is_some() {
            return None;
        }
        let small = |n: u64| u32::try_from(n).ok();
        let state = State {
            mode,
            consecutive: small(numbers[0])?,
            window_start_ms: numbers[1],
            calls: small(numbers[2])?,
            failures: small(numbers[3])?,
            prev_calls: small(numbers[4])?,
            prev_failures: small(numbers[5])?,
            until_ms: numbers[6],
            cooldown_ms: numbers[7],
        };
        let longest_wait = match mode {
            Mode::Closed => 0,
            Mode::Open => config.max_cooldown_ms,
            Mode::HalfOpen => config.probe_lease_ms,
        };
        let plausible = state.failures <= state.calls
            && state.prev_failures <= state.prev_calls
            && state.until_ms <= now_ms.saturating_add(longest_wait)
            && state.cooldown_ms <= config.max_cooldown_ms;
        plausible.then_some(state)
    }

    /// Moves the window to `now_ms`: the current one becomes the previous one
    /// once it is over, and both are forgotten after two.
    fn roll(&mut self, config: &BreakerConfig, now_ms: u64) {
        let window = config.window_ms;
        if now_ms < self.window_start_ms {
            // The store's clock went back: start again rather than trust either.
            *self = State { window_start_ms: now_ms, calls: 0, failures: 0, prev_calls: 0, prev_failures: 0, ..*self };
            return;
        }
        let elapsed = now_ms - self.window_start_ms;
        if elapsed < window {
            return;
        }
        if elapsed < 2 * window {
            self.prev_calls = self.calls;
            self.prev_failures = self.failures;
            self.window_start_ms += window;
        } else {
            self.prev_calls = 0;
            self.prev_failures = 0;
            self.window_start_ms = now_ms;
        }
        self.calls = 0;
        self.failures = 0;
    }

    /// Whether the failures in the sliding window reach the ratio: the
    /// previous window's counts weigh what is left of it in the sliding one.
    /// Counts are scaled by `window-ms` to stay in whole numbers.
    fn ratio_reached(&self, config: &BreakerConfig, now_ms: u64) -> bool {
        let window = u128::from(config.window_ms);
        let elapsed = u128::from(now_ms.saturating_sub(self.window_start_ms)).min(window);
        let weight = window - elapsed;
        let calls = u128::from(self.calls) * window + u128::from(self.prev_calls) * weight;
        let failures = u128::from(self.failures) * window + u128::from(self.prev_failures) * weight;
        calls >= u128::from(config.min_calls_in_window) * window && failures * 100 >= u128::from(config.failure_ratio_percent) * calls
    }

    fn open(&mut self, cooldown_ms: u64, now_ms: u64) {
        self.mode = Mode::Open;
        self.cooldown_ms = cooldown_ms;
        self.until_ms = now_ms.saturating_add(cooldown_ms);
    }
}

/// What a breaker says of a call about to be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    Send,
    /// Send it as the breaker's one probe.
    Probe,
    /// Not sent: open (or probing) until then (store clock, ms).
    Refused {
        until_ms: u64,
        now_ms: u64,
    },
}

/// What an answered attempt says of the server, for its breakers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The server answered: a result, a tool's error, a 4xx, a throttle.
    Answered,
    /// Unreachable or failing: a transport fault, a 5xx, a timeout.
    Failed,
}

/// What a failed attempt says of its server: only a failure that says the
/// server is unreachable or failing counts (a transport fault, a 5xx, a 408, a
/// timeout); a tool's error, a 4xx, a throttle or a lost session is an answer
/// from a server that works. Throttles are the account budget's: a breaker
/// that counted them would black out every tool of a busy, healthy server.
/// `None`: it says nothing either way (a misconfigured connection, an
/// unclassified answer).
pub fn outcome(kind: &FailureKind, class: OutcomeClass) -> Option<Outcome> {
    match class {
        OutcomeClass::Misconfigured | OutcomeClass::Unclassified => None,
        OutcomeClass::Transient if matches!(kind, FailureKind::Transport(_) | FailureKind::HttpStatus(408 | 500..=599)) => Some(Outcome::Failed),
        _ => Some(Outcome::Answered),
    }
}

/// A change of a breaker's state, for the host's log and counters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub from: Mode,
    pub to: Mode,
    pub until_ms: Option<u64>,
    pub why: String,
}

/// A change, with the breaker it happened to (the contract's `breaker-change`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerChange {
    pub server: String,
    pub tool: Option<String>,
    pub change: Change,
}

impl BreakerChange {
    pub fn new(server: &str, tool: Option<&str>, change: Change) -> BreakerChange {
        BreakerChange { server: String::from(server), tool: tool.map(String::from), change }
    }
}

/// The admission rule, on a state read at `now_ms`: the state after it and
/// the change, if any.
pub fn admit(state: &mut State, config: &BreakerConfig, now_ms: u64) -> (Admit, Option<Change>) {
    match state.mode {
        Mode::Closed => (Admit::Send, None),
        Mode::Open | Mode::HalfOpen if now_ms < state.until_ms => (Admit::Refused { until_ms: state.until_ms, now_ms }, None),
        from => {
            let why = if from == Mode::Open {
                cat!("the cooldown of ", state.cooldown_ms, " ms is over: one probe goes")
            } else {
                cat!("the last probe did not answer within ", config.probe_lease_ms, " ms: another goes")
            };
            state.mode = Mode::HalfOpen;
            state.until_ms = now_ms.saturating_add(config.probe_lease_ms);
            (Admit::Probe, Some(Change { from, to: Mode::HalfOpen, until_ms: Some(state.until_ms), why }))
        }
    }
}

/// Counts an outcome: `probe` says the call was let through as the probe.
pub fn record(state: &mut State, outcome: Outcome, probe: bool, config: &BreakerConfig, now_ms: u64) -> Option<Change> {
    match state.mode {
        Mode::Closed => {
            state.roll(config, now_ms);
            state.calls = state.calls.saturating_add(1);
            if outcome == Outcome::Answered {
                state.consecutive = 0;
                return None;
            }
            state.failures = state.failures.saturating_add(1);
            state.consecutive = state.consecutive.saturating_add(1);
            let why = if state.consecutive >= config.failures_to_open {
                cat!(state.consecutive, if state.consecutive == 1 { " failure in a row" } else { " failures in a row" })
            } else if state.ratio_reached(config, now_ms) {
                cat!("at least ", config.failure_ratio_percent, "% of the calls in the last ", config.window_ms, " ms failed")
            } else {
                return None;
            };
            state.open(config.cooldown_ms, now_ms);
            Some(Change { from: Mode::Closed, to: Mode::Open, until_ms: Some(state.until_ms), why })
        }
        // The probe's answer decides; a call sent before the breaker opened
        // says nothing the probe will not.
        Mode::HalfOpen if probe => {
            if outcome == Outcome::Answered {
                *state = State::closed(now_ms);
                return Some(Change { from: Mode::HalfOpen, to: Mode::Closed, until_ms: None, why: String::from("the probe was answered") });
            }
            let grown = state.cooldown_ms.max(config.cooldown_ms).saturating_mul(config.cooldown_multiplier.into()).min(config.max_cooldown_ms);
            state.open(grown, now_ms);
            let mut why = String::from("the probe failed: the cooldown is now ");
            cat_to!(why; grown, " ms");
            Some(Change { from: Mode::HalfOpen, to: Mode::Open, until_ms: Some(state.until_ms), why })
        }
        Mode::Open | Mode::HalfOpen => None,
    }
}

/// The most bytes of a server's name the breakers keep (and the messages show).
pub const MAX_SERVER_NAME_BYTES: usize = 256;

/// The name a breaker knows a server by, the same whatever host derived it: a
/// URL's scheme and host lower-cased, without its user information, its
/// default port (80 for `http`, 443 for `https`), its query and its fragment
/// (a token in a query must not reach a store or the model), an empty path
/// written `/`; anything else (`stdio:` and a command line, a name the
/// operator gave) as it is. At most [`MAX_SERVER_NAME_BYTES`] bytes, cut at a
/// character boundary.
#[inline(never)]
pub fn server_name(raw: &str) -> String {
    // Bytes, and `str::get`: a `str` pattern, case mapping or an index that can
    // panic (its message formats the text) each cost the component kilobytes.
    let bytes = raw.as_bytes();
    let part = |from: usize, to: usize| raw.get(from..to).unwrap_or_default();
    let mut name = String::new();
    let scheme_end = bytes.windows(3).position(|w| w[0] == b':' && w[1] == b'/' && w[2] == b'/');
    match scheme_end.filter(|at| *at > 0 && bytes[..*at].iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))) {
        Some(at) => {
            let rest = at + 3;
            let end = bytes[rest..].iter().position(|b| matches!(b, b'?' | b'#')).map_or(bytes.len(), |e| rest + e);
            let path = bytes[rest..end].iter().position(|b| *b == b'/').map_or(end, |p| rest + p);
            let host = bytes[rest..path].iter().rposition(|b| *b == b'@').map_or(rest, |a| rest + a + 1);
            // A port follows the last `:` after an IPv6 literal's `]`.
            let colon = bytes[host..path].iter().rposition(|b| *b == b':').map(|c| host + c).filter(|c| !bytes[*c..path].contains(&b']'));
            let host_end = colon.unwrap_or(path);
            let lower = |name: &mut String, from: usize, to: usize| match part(from, to) {
                // Scheme, host and port are ASCII in any URL a client can send; other text is kept as it is.
                text if text.is_ascii() => text.bytes().for_each(|b| name.push(char::from(b.to_ascii_lowercase()))),
                text => name.push_str(text),
            };
            lower(&mut name, 0, at);
            name.push_str("://");
            lower(&mut name, host, host_end);
            let port = colon.map_or(&b""[..], |c| &bytes[c + 1..path]);
            let scheme = &bytes[..at];
            let default_port = (scheme.eq_ignore_ascii_case(b"http") && port == b"80") || (scheme.eq_ignore_ascii_case(b"https") && port == b"443");
            if !port.is_empty() && !default_port {
                name.push(':');
                name.push_str(part(host_end + 1, path));
            }
            name.push_str(if path == end { "/" } else { part(path, end) });
        }
        None => name.push_str(raw),
    }
    let mut end = name.len().min(MAX_SERVER_NAME_BYTES);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name.truncate(end);
    name
}

/// What the model is told of a server: a URL's scheme and host, or a command
/// without its arguments: a token in a path or an argument stays out of its context.
pub fn shown_name(name: &str) -> &str {
    let bytes = name.as_bytes();
    let end = match bytes.windows(3).position(|w| w[0] == b':' && w[1] == b'/' && w[2] == b'/') {
        Some(at) => bytes[at + 3..].iter().position(|b| *b == b'/').map_or(bytes.len(), |p| at + 3 + p),
        None => bytes.iter().position(|b| *b == b' ').unwrap_or(bytes.len()),
    };
    name.get(..end).unwrap_or(name)
}

/// The store key of a server's breaker, or of a tool's on it: the server's
/// length comes first, so that no server name and tool name can spell another pair's key.
pub fn key(server: &str, tool: Option<&str>) -> String {
    match tool {
        None => cat!("breaker:", server.len(), ":", server),
        Some(tool) => cat!("breaker:", server.len(), ":", server, ":", tool),
    }
}

/// How long a stored state is kept after its last change: past any window or
/// cooldown it could still matter for.
pub fn ttl_ms(config: &BreakerConfig) -> u64 {
    (2 * config.window_ms).max(config.max_cooldown_ms.saturating_add(config.probe_lease_ms)).saturating_add(60_000)
}

/// Reads the state under `key`, lets `change` decide, and stores what it
/// changed with compare-and-set, reading again if another worker changed it
/// first. `change` answers its result and whether the state changed. `None`:
/// the store kept refusing, and nothing was changed.
pub fn update<R>(
    store: &mut dyn SharedState,
    key: &str,
    config: &BreakerConfig,
    now_ms: u64,
    mut change: impl FnMut(&mut State, u64) -> (R, bool),
) -> Option<R> {
    for _ in 0..MAX_TRIES {
        let loaded = store.load(key, now_ms);
        let now = loaded.now_ms;
        let mut state = loaded.value.as_deref().and_then(|text| State::decode(text, config, now)).unwrap_or_else(|| State::closed(now));
        let (result, changed) = change(&mut state, now);
        if !changed || store.store_if(key, loaded.version, &state.encode(), ttl_ms(config)) {
            return Some(result);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::shared::MemoryState;

    const NOW: u64 = 1_764_460_800_000;

    fn config(extra: &str) -> BreakerConfig {
        let text = alloc::format!(r#"{{"circuit-breaker": {{{extra}}}}}"#);
        Config::from_json(&text).unwrap().circuit_breaker.unwrap()
    }

    #[test]
    fn the_text_round_trips_and_anything_else_is_dropped() {
        let c = config("");
        let mut state = State::closed(NOW);
        state.calls = 7;
        state.failures = 3;
        assert_eq!(State::decode(&state.encode(), &c, NOW), Some(state));
        state.open(c.cooldown_ms, NOW);
        assert_eq!(State::decode(&state.encode(), &c, NOW), Some(state));
        for bad in [
            "",
            "b1",
            "b2 c 0 0 0 0 0 0 0 0",
            "b1 x 0 0 0 0 0 0 0 0",
            "b1 c 0 0 0 0 0 0 0",
            "b1 c 0 0 0 0 0 0 0 0 0",
            "b1 c 0 0 1 2 0 0 0 0",
            "b1 c -1 0 0 0 0 0 0 0",
            "b1 c 99999999999 0 0 0 0 0 0 0",
            "b1  c 0 0 0 0 0 0 0 0",
        ] {
            assert_eq!(State::decode(bad, &c, NOW), None, "{bad:?}");
        }
        // Open for an hour, where the cooldown is at most five minutes: a skewed or hostile writer.
        let hour = alloc::format!("b1 o 0 {NOW} 0 0 0 0 {} 30000", NOW + 3_600_000);
        assert_eq!(State::decode(&hour, &c, NOW), None);
        assert_eq!(State::decode(&"b1 c 0 0 0 0 0 0 0 0 ".repeat(20), &c, NOW), None);
    }

    #[test]
    fn consecutive_failures_open_and_an_answer_in_between_resets_them() {
        let c = config(r#""failures-to-open": 3"#);
        let mut s = State::closed(NOW);
        assert_eq!(record(&mut s, Outcome::Failed, false, &c, NOW), None);
        assert_eq!(record(&mut s, Outcome::Failed, false, &c, NOW), None);
        assert_eq!(record(&mut s, Outcome::Answered, false, &c, NOW), None);
        assert_eq!(record(&mut s, Outcome::Failed, false, &c, NOW), None);
        assert_eq!(record(&mut s, Outcome::Failed, false, &c, NOW), None);
        let change = record(&mut s, Outcome::Failed, false, &c, NOW).unwrap();
        assert_eq!((change.from, change.to, change.until_ms), (Mode::Closed, Mode::Open, Some(NOW + c.cooldown_ms)));
        assert_eq!(change.why, "3 failures in a row");
    }

    #[test]
    fn the_ratio_opens_only_past_the_minimum_and_the_old_window_fades() {
        let c = config(r#""failures-to-open": 100, "min-calls-in-window": 10, "failure-ratio-percent": 50, "window-ms": 10000"#);
        let mut s = State::closed(NOW);
        for _ in 0..4 {
            assert_eq!(record(&mut s, Outcome::Answered, false, &c, NOW), None);
            assert_eq!(record(&mut s, Outcome::Failed, false, &c, NOW), None);
        }
        // 9 calls, 5 failed: under the minimum of 10.
        assert_eq!(record(&mut s, Outcome::Failed, false, &c, NOW), None);
        let change = record(&mut s, Outcome::Failed, false, &c, NOW + 1).unwrap();
        assert_eq!(change.to, Mode::Open);
        // Ten calls, four failed; 17 s later they weigh 30 %: with one more failure,
        // 4 calls in the window, under the minimum.
        let mut later = State::closed(NOW);
        for failed in [true, false, true, false, true, false, true, false, false, false] {
            record(&mut later, if failed { Outcome::Failed } else { Outcome::Answered }, false, &c, NOW);
        }
        assert_eq!(later.mode, Mode::Closed);
        assert_eq!(record(&mut later, Outcome::Failed, false, &c, NOW + 17_000), None);
        assert_eq!((later.prev_calls, later.prev_failures, later.calls, later.failures), (10, 4, 1, 1));
    }

    #[test]
    fn one_probe_after_the_cooldown_and_its_outcome_decides() {
        let c = config(r#""failures-to-open": 1, "cooldown-ms": 1000, "cooldown-multiplier": 3, "max-cooldown-ms": 5000, "probe-lease-ms": 700"#);
        let mut s = State::closed(NOW);
        record(&mut s, Outcome::Failed, false, &c, NOW);
        assert_eq!(admit(&mut s, &c, NOW + 999).0, Admit::Refused { until_ms: NOW + 1000, now_ms: NOW + 999 });
        assert_eq!(admit(&mut s, &c, NOW + 1000).0, Admit::Probe);
        assert_eq!(admit(&mut s, &c, NOW + 1001).0, Admit::Refused { until_ms: NOW + 1700, now_ms: NOW + 1001 });
        // A late answer of a call sent before the breaker opened decides nothing.
        assert_eq!(record(&mut s, Outcome::Answered, false, &c, NOW + 1100), None);
        let failed = record(&mut s, Outcome::Failed, true, &c, NOW + 1200).unwrap();
        assert_eq!((failed.to, failed.until_ms), (Mode::Open, Some(NOW + 1200 + 3000)));
        assert_eq!(admit(&mut s, &c, NOW + 4200).0, Admit::Probe);
        let again = record(&mut s, Outcome::Failed, true, &c, NOW + 4300).unwrap();
        assert_eq!(again.until_ms, Some(NOW + 4300 + 5000), "grown, and capped at max-cooldown-ms");
        // A probe that never answers: after its lease, another goes.
        assert_eq!(admit(&mut s, &c, NOW + 9300).0, Admit::Probe);
        let (lost, change) = admit(&mut s, &c, NOW + 10_000);
        assert_eq!((lost, change.map(|c| (c.from, c.to))), (Admit::Probe, Some((Mode::HalfOpen, Mode::HalfOpen))));
        let closed = record(&mut s, Outcome::Answered, true, &c, NOW + 10_100).unwrap();
        assert_eq!((closed.to, s.cooldown_ms, s.consecutive), (Mode::Closed, 0, 0));
    }

    #[test]
    fn of_many_runs_that_see_the_cooldown_end_one_probes() {
        let c = config(r#""failures-to-open": 1, "cooldown-ms": 1000"#);
        let mut store = MemoryState::default();
        let key = key("https://mcp.example/mcp", None);
        update(&mut store, &key, &c, NOW, |s, now| ((), record(s, Outcome::Failed, false, &c, now).is_some())).unwrap();
        let probes = (0..32)
            .filter(|_| {
                update(&mut store, &key, &c, NOW + 1000, |s, now| {
                    let (a, change) = admit(s, &c, now);
                    (a, change.is_some())
                }) == Some(Admit::Probe)
            })
            .count();
        assert_eq!(probes, 1);
    }

    #[test]
    fn a_store_that_always_refuses_changes_nothing_and_lets_calls_go() {
        struct Refusing;
        impl SharedState for Refusing {}
        let c = config(r#""failures-to-open": 1"#);
        let key = key("s", None);
        assert_eq!(update(&mut Refusing, &key, &c, NOW, |s, now| ((), record(s, Outcome::Failed, false, &c, now).is_some())), None);
        let admitted = update(&mut Refusing, &key, &c, NOW, |s, now| {
            let (admit, change) = admit(s, &c, now);
            (admit, change.is_some())
        });
        assert_eq!(admitted, Some(Admit::Send));
    }

    #[test]
    fn a_server_is_named_alike_whatever_host_derived_it() {
        for (raw, name) in [
            ("HTTPS://user:pw@MCP.Example.com:443/mcp?token=x#f", "https://mcp.example.com/mcp"),
            ("http://mcp.example.com:80", "http://mcp.example.com/"),
            ("http://mcp.example.com:8080/a/B?q", "http://mcp.example.com:8080/a/B"),
            ("http://[::1]:3000/mcp", "http://[::1]:3000/mcp"),
            ("http://[::1]/mcp", "http://[::1]/mcp"),
            ("stdio:node Server.js --Port 1", "stdio:node Server.js --Port 1"),
            ("orders", "orders"),
        ] {
            assert_eq!(server_name(raw), name, "{raw}");
        }
        let long = alloc::format!("stdio:{}", "é".repeat(300));
        let cut = server_name(&long);
        assert!(cut.len() <= MAX_SERVER_NAME_BYTES && cut.len() >= MAX_SERVER_NAME_BYTES - 1 && long.starts_with(&cut));
    }

    #[test]
    fn the_model_is_shown_a_host_or_a_command_never_a_path_or_an_argument() {
        assert_eq!(shown_name("https://actions.zapier.com/mcp/sk-ak-SECRET/sse"), "https://actions.zapier.com");
        assert_eq!(shown_name("stdio:npx server --api-key sk-SECRET"), "stdio:npx");
        assert_eq!(shown_name("orders"), "orders");
    }

    #[test]
    fn keys_cannot_collide() {
        assert_ne!(key("a:b", Some("c")), key("a", Some("b:c")));
        assert_ne!(key("a:1:b", None), key("a", Some("b")));
    }
}
