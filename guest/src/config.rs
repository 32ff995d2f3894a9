//! The policy's configuration: JSON in, validated strictly, every field defaulted.
//!
//! Parsing walks the JSON by hand rather than deriving, so that every error names
//! the field's full path and the rule it broke (a derived parser says "invalid
//! type ... at line 1 column 40" and leaves the user to find the field).

use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::cat::{cat, cat_to};
use crate::json::{self, Json};
use crate::relayed::{TextRule, text_rule};
use crate::types::{ConfigError, ConfigErrorKind, Effect, OutcomeClass};

/// The longest wait or delay any field accepts: one day.
pub const ONE_DAY_MS: u64 = 86_400_000;

/// A year: the default longest hint a server can mean (`max-plausible-hint-ms`).
pub const ONE_YEAR_MS: u64 = 365 * ONE_DAY_MS;

/// The most `tool-error-rules` one list may hold.
pub const MAX_TEXT_RULES: usize = 64;
/// The longest configuration text, in bytes (1 MiB): refused before it is read.
pub const MAX_CONFIG_BYTES: usize = 1 << 20;

/// One `tools` entry: how the policy treats the tool, and its own text rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolEntry {
    pub name: String,
    /// `None` when the entry gives only `tool-error-rules`: the effect then comes
    /// from the host's MCP hints or `default-effect`.
    pub policy: Option<ToolPolicy>,
    pub rules: Vec<TextRule>,
    /// The tool's own `idle-timeout-ms` and `attempt-timeout-ms`, if set.
    pub timeouts: Timeouts,
}

/// How the policy treats one tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolPolicy {
    pub effect: Effect,
    /// Repeating the call with the same arguments has no further effect.
    pub idempotent: bool,
}

/// The shared account budget: a token bucket per account, kept by the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountBudgetConfig {
    /// The account all workers share (e.g. the API key's account).
    pub account_id: String,
    /// The most tokens the bucket holds.
    pub capacity: u32,
    /// One token returns every this many ms.
    pub refill_interval_ms: u64,
    /// The longest the policy lets a call wait for room; longer escalates.
    pub max_wait_ms: u64,
    /// Tokens a first attempt takes.
    pub attempt_cost: u32,
    /// Tokens a retry after a transient failure takes.
    pub retry_cost: u32,
    /// Tokens a retry after a throttle (429, 529) takes. The server
    /// refused those before doing any work, so a lower cost than `retry-cost`
    /// (AWS charges 5 against 14) lets throttles drain the shared budget slower.
    pub throttled_retry_cost: u32,
    /// AWS standard mode's retry quota, if configured.
    pub retry_quota: Option<RetryQuotaConfig>,
    /// Retries as a share of calls (`ratio.rs`), if configured.
    pub retry_ratio: Option<RetryRatioConfig>,
}

/// A retry budget as a share of the account's calls over a sliding window,
/// with a floor per second (Finagle's `RetryBudget`, Linkerd's `retryBudget`,
/// Gateway API GEP-3388): retries beyond it fail fast.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryRatioConfig {
    /// Retries may be at most this share of the calls in the window, in percent.
    pub percent: u32,
    /// ...plus this many retries a second of the window, whatever the calls.
    pub min_retries_per_second: u32,
    /// The sliding window's length, in ms.
    pub window_ms: u64,
}

/// A second bucket per account that only retries draw from, and that successful
/// calls refill (AWS standard retry mode: 500 tokens, a retry costs 14, 5 after a
/// throttle, a success gives 1 back, or what its last retry took). When it is
/// empty a retry fails fast: a widespread outage ends in escalations, not in
/// every worker retrying.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetryQuotaConfig {
    /// Tokens the quota holds. Required.
    pub capacity: u32,
    /// One token returns every this many ms besides refunds.
    pub refill_interval_ms: u64,
    /// Tokens a retry after a transient failure takes.
    pub retry_cost: u32,
    /// Tokens a retry after a throttle takes.
    pub throttled_retry_cost: u32,
    /// Tokens a call that succeeds at its first attempt gives back.
    pub success_refund: u32,
}

/// The circuit breakers (`breaker.rs`): when they open, how long they stay
/// open, and what a call refused by one becomes. Absent: no breakers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Counted failures in a row that open a breaker.
    pub failures_to_open: u32,
    /// The share of failed calls in the window, in percent, that opens a breaker...
    pub failure_ratio_percent: u32,
    /// ...once the window holds at least this many calls.
    pub min_calls_in_window: u32,
    /// The sliding window's length, in ms.
    pub window_ms: u64,
    /// The first cooldown, in ms: an open breaker sends nothing for this long.
    pub cooldown_ms: u64,
    /// Each failed probe multiplies the cooldown by this, up to `max_cooldown_ms`.
    pub cooldown_multiplier: u32,
    pub max_cooldown_ms: u64,
    /// How long the one probe holds its place, in ms: if it never answers, another goes after this.
    pub probe_lease_ms: u64,
    /// Whether each tool on a server also has its own breaker.
    pub per_tool: bool,
    /// What a call refused by an open breaker becomes.
    pub when_open: WhenOpen,
}

/// What a call refused by an open breaker becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenOpen {
    /// A message for the model: another tool may do.
    Replan,
    /// A hand-off to a person.
    Escalate,
}

impl WhenOpen {
    pub const fn name(self) -> &'static str {
        match self {
            WhenOpen::Replan => "replan",
            WhenOpen::Escalate => "escalate",
        }
    }
}

/// A named set of defaults; the fields a configuration gives win.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// agent-retry's own defaults (docs/configuration.md).
    Default,
    /// The AWS SDKs' standard retry mode of 10 November 2026 ("retry
    /// behavior 2.1"): base delays 50 ms, and 1 s after a throttle, capped at
    /// 20 s; 3 attempts; a wait hint honoured up to the backoff plus 5 s; with
    /// an account budget, a retry quota of 500 (a retry costs 14, 5 after a
    /// throttle). Sources: docs/configuration.md, "Presets".
    Aws2026,
}

impl Preset {
    pub const fn name(self) -> &'static str {
        match self {
            Preset::Default => "default",
            Preset::Aws2026 => "aws-2026",
        }
    }

    /// The preset's fields, as JSON text.
    const fn fields(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Preset::Default => &[],
            Preset::Aws2026 => &[
                ("base-delay-ms", "50"),
                ("throttle-base-delay-ms", "1000"),
                ("max-delay-ms", "20000"),
                ("hint-cap-over-backoff-ms", "5000"),
                ("max-attempts-per-call", "3"),
            ],
        }
    }

    /// Adds the preset's fields the configuration does not give, and (AWS) a
    /// retry quota of 500 to an account budget that has none.
    fn fill(self, members: &mut Vec<(String, Json)>) {
        for (name, value) in self.fields() {
            if !members.iter().any(|(n, _)| n == name) {
                members.push((String::from(*name), Json::Number(String::from(*value))));
            }
        }
        if self == Preset::Aws2026
            && let Some((_, Json::Object(account))) = members.iter_mut().find(|(n, _)| n == "account-budget")
            && !account.iter().any(|(n, _)| n == "retry-quota")
        {
            account.push((String::from("retry-quota"), Json::Object(alloc::vec![(String::from("capacity"), Json::Number(String::from("500")))])));
        }
    }
}

/// An attempt's timeouts, in ms: each is the tool's own, or none (the defaults apply).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timeouts {
    pub idle_ms: Option<u64>,
    pub attempt_ms: Option<u64>,
}

/// What a task the server cancelled leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnTaskCancelled {
    Replan,
    Escalate,
}

impl OnTaskCancelled {
    pub const fn name(self) -> &'static str {
        match self {
            OnTaskCancelled::Replan => "replan",
            OnTaskCancelled::Escalate => "escalate",
        }
    }
}

/// The configuration. `Config::default()` is what `{}` gives; the whole-number
/// fields' names, ranges and defaults are in `INT_FIELDS`, `ACCOUNT_FIELDS` and
/// `QUOTA_FIELDS` (the README's configuration reference is checked against them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The preset the configuration started from (its fields are filled in).
    pub preset: Preset,
    pub base_delay_ms: u64,
    /// The base delay after a throttle (429, 529); 0: `base_delay_ms`.
    pub throttle_base_delay_ms: u64,
    pub max_delay_ms: u64,
    /// A server's wait hint is honoured up to the jittered backoff plus this
    /// (AWS 2026: 5 s); 0: no cap (the hint is a floor, up to `max_hint_ms`).
    pub hint_cap_over_backoff_ms: u64,
    pub max_attempts_per_call: u32,
    pub max_retries_per_run: u32,
    pub max_replans_per_run: u32,
    pub max_steps_per_run: u32,
    pub max_hint_ms: u64,
    pub max_plausible_hint_ms: u64,
    pub max_message_chars: u32,
    pub idle_timeout_ms: u64,
    pub attempt_timeout_ms: u64,
    pub max_polls_per_task: u32,
    pub max_task_wait_ms: u64,
    pub task_poll_min_delay_ms: u64,
    pub task_poll_base_delay_ms: u64,
    pub task_poll_max_delay_ms: u64,
    pub on_task_cancelled: OnTaskCancelled,
    pub default_effect: Effect,
    /// Tool entries in the order given; names are unique.
    pub tools: Vec<ToolEntry>,
    /// `tools` by name: a hash table, so that finding a call's tool costs the
    /// same among 10 or 10,000 entries.
    pub tool_index: ToolIndex,
    /// Status overrides in the order given; statuses are unique.
    pub status_overrides: Vec<(u16, OutcomeClass)>,
    /// Text rules for every tool's errors, after the tool's own.
    pub tool_error_rules: Vec<TextRule>,
    pub account_budget: Option<AccountBudgetConfig>,
    pub circuit_breaker: Option<BreakerConfig>,
}

impl Default for Config {
    /// What `{}` gives: every whole-number field's default from `INT_FIELDS`.
    fn default() -> Self {
        let mut config = Config {
            preset: Preset::Default,
            base_delay_ms: 0,
            throttle_base_delay_ms: 0,
            max_delay_ms: 0,
            hint_cap_over_backoff_ms: 0,
            max_attempts_per_call: 0,
            max_retries_per_run: 0,
            max_replans_per_run: 0,
            max_steps_per_run: 0,
            max_hint_ms: 0,
            max_plausible_hint_ms: 0,
            max_message_chars: 0,
            idle_timeout_ms: 0,
            attempt_timeout_ms: 0,
            max_polls_per_task: 0,
            max_task_wait_ms: 0,
            task_poll_min_delay_ms: 0,
            task_poll_base_delay_ms: 0,
            task_poll_max_delay_ms: 0,
            on_task_cancelled: OnTaskCancelled::Replan,
            default_effect: Effect::Write,
            tools: Vec::new(),
            tool_index: ToolIndex::default(),
            status_overrides: Vec::new(),
            tool_error_rules: Vec::new(),
            account_budget: None,
            circuit_breaker: None,
        };
        for field in &INT_FIELDS {
            (field.set)(&mut config, field.default);
        }
        config
    }
}

#[inline(never)] // called from many places: one copy keeps the component small
fn error(kind: ConfigErrorKind, field: &str, message: impl Into<String>) -> ConfigError {
    // The field repeats keys as written: bounded and on one line, whatever the input.
    // `excerpt` folds lines itself and stops after 200 characters: a copy with the
    // lines replaced first cost a 100 KB tool name more than a call's fuel.
    let field = if field.len() <= 200 && !field.contains(['\n', '\r']) { field.to_string() } else { crate::text::excerpt(field, 200) };
    ConfigError { kind, field, message: message.into() }
}

/// A whole-number field of a record `T`: its name, range, default and place in
/// the record. Every whole-number field of the configuration is named once, in
/// one of the tables below, which drive parsing, defaults, validation and
/// `effective-config` alike. A cost's range and default are capped by its
/// bucket's capacity (`within_capacity`); `required` fields have no default.
struct IntField<T> {
    name: &'static str,
    min: u64,
    max: u64,
    default: u64,
    required: bool,
    within_capacity: bool,
    get: fn(&T) -> u64,
    set: fn(&mut T, u64),
}

/// A field with a default, and a required one; ranges keep every count in u32.
const fn int<T>(name: &'static str, min: u64, max: u64, default: u64, get: fn(&T) -> u64, set: fn(&mut T, u64)) -> IntField<T> {
    IntField { name, min, max, default, required: false, within_capacity: false, get, set }
}

const fn required<T>(name: &'static str, min: u64, max: u64, get: fn(&T) -> u64, set: fn(&mut T, u64)) -> IntField<T> {
    IntField { name, min, max, default: 0, required: true, within_capacity: false, get, set }
}

const fn cost<T>(name: &'static str, default: u64, get: fn(&T) -> u64, set: fn(&mut T, u64)) -> IntField<T> {
    IntField { name, min: 0, max: u32::MAX as u64, default, required: false, within_capacity: true, get, set }
}

const MAX_CAPACITY: u64 = 1_000_000_000;

/// The top level's whole-number fields, in the order `effective-config` writes them.
const INT_FIELDS: [IntField<Config>; 18] = [
    int("base-delay-ms", 1, ONE_DAY_MS, 1000, |c| c.base_delay_ms, |c, v| c.base_delay_ms = v),
    int("throttle-base-delay-ms", 0, ONE_DAY_MS, 0, |c| c.throttle_base_delay_ms, |c, v| c.throttle_base_delay_ms = v),
    int("max-delay-ms", 1, ONE_DAY_MS, 30_000, |c| c.max_delay_ms, |c, v| c.max_delay_ms = v),
    int("hint-cap-over-backoff-ms", 0, ONE_DAY_MS, 0, |c| c.hint_cap_over_backoff_ms, |c, v| c.hint_cap_over_backoff_ms = v),
    int("max-attempts-per-call", 1, 100, 4, |c| c.max_attempts_per_call.into(), |c, v| c.max_attempts_per_call = v as u32),
    int("max-retries-per-run", 0, 100_000, 10, |c| c.max_retries_per_run.into(), |c, v| c.max_retries_per_run = v as u32),
    int("max-replans-per-run", 0, 1000, 2, |c| c.max_replans_per_run.into(), |c, v| c.max_replans_per_run = v as u32),
    int("max-steps-per-run", 1, 1_000_000, 30, |c| c.max_steps_per_run.into(), |c, v| c.max_steps_per_run = v as u32),
    int("max-hint-ms", 0, ONE_DAY_MS, 60_000, |c| c.max_hint_ms, |c, v| c.max_hint_ms = v),
    int("max-plausible-hint-ms", 1000, 10 * ONE_YEAR_MS, ONE_YEAR_MS, |c| c.max_plausible_hint_ms, |c, v| c.max_plausible_hint_ms = v),
    int("max-message-chars", 16, 10_000, 300, |c| c.max_message_chars.into(), |c, v| c.max_message_chars = v as u32),
    int("idle-timeout-ms", 1, ONE_DAY_MS, 30_000, |c| c.idle_timeout_ms, |c, v| c.idle_timeout_ms = v),
    int("attempt-timeout-ms", 1, ONE_DAY_MS, 600_000, |c| c.attempt_timeout_ms, |c, v| c.attempt_timeout_ms = v),
    int("max-polls-per-task", 1, 1_000_000, 600, |c| c.max_polls_per_task.into(), |c, v| c.max_polls_per_task = v as u32),
    int("max-task-wait-ms", 1, ONE_DAY_MS, 600_000, |c| c.max_task_wait_ms, |c, v| c.max_task_wait_ms = v),
    int("task-poll-min-delay-ms", 0, ONE_DAY_MS, 100, |c| c.task_poll_min_delay_ms, |c, v| c.task_poll_min_delay_ms = v),
    int("task-poll-base-delay-ms", 1, ONE_DAY_MS, 1000, |c| c.task_poll_base_delay_ms, |c, v| c.task_poll_base_delay_ms = v),
    int("task-poll-max-delay-ms", 1, ONE_DAY_MS, 30_000, |c| c.task_poll_max_delay_ms, |c, v| c.task_poll_max_delay_ms = v),
];

/// Sets one of a tool entry's timeouts.
type SetTimeout = fn(&mut Timeouts, u64);

/// A tool entry's timeouts (none by default: the top level's apply).
const TIMEOUT_FIELDS: [(&str, SetTimeout); 2] = [("idle-timeout-ms", |t, v| t.idle_ms = Some(v)), ("attempt-timeout-ms", |t, v| t.attempt_ms = Some(v))];

/// `account-budget`'s whole-number fields; `capacity` first (the costs are capped by it).
const ACCOUNT_FIELDS: [IntField<AccountBudgetConfig>; 6] = [
    required("capacity", 1, MAX_CAPACITY, |a| a.capacity.into(), |a, v| a.capacity = v as u32),
    required("refill-interval-ms", 1, ONE_DAY_MS, |a| a.refill_interval_ms, |a, v| a.refill_interval_ms = v),
    int("max-wait-ms", 0, ONE_DAY_MS, 5000, |a| a.max_wait_ms, |a, v| a.max_wait_ms = v),
    cost("attempt-cost", 1, |a| a.attempt_cost.into(), |a, v| a.attempt_cost = v as u32),
    cost("retry-cost", 1, |a| a.retry_cost.into(), |a, v| a.retry_cost = v as u32),
    cost("throttled-retry-cost", 1, |a| a.throttled_retry_cost.into(), |a, v| a.throttled_retry_cost = v as u32),
];

/// `account-budget.retry-quota`'s fields: AWS standard retry mode's defaults.
const QUOTA_FIELDS: [IntField<RetryQuotaConfig>; 5] = [
    required("capacity", 1, MAX_CAPACITY, |q| q.capacity.into(), |q, v| q.capacity = v as u32),
    int("refill-interval-ms", 1, ONE_DAY_MS, ONE_DAY_MS, |q| q.refill_interval_ms, |q, v| q.refill_interval_ms = v),
    cost("retry-cost", 14, |q| q.retry_cost.into(), |q, v| q.retry_cost = v as u32),
    cost("throttled-retry-cost", 5, |q| q.throttled_retry_cost.into(), |q, v| q.throttled_retry_cost = v as u32),
    cost("success-refund", 1, |q| q.success_refund.into(), |q, v| q.success_refund = v as u32),
];

/// `account-budget.retry-ratio`'s fields: Finagle's and Linkerd's defaults
/// (20 %, 10 a second, 10 s).
const RATIO_FIELDS: [IntField<RetryRatioConfig>; 3] = [
    int("percent", 0, 1000, 20, |r| r.percent.into(), |r, v| r.percent = v as u32),
    int("min-retries-per-second", 0, 1_000_000, 10, |r| r.min_retries_per_second.into(), |r, v| r.min_retries_per_second = v as u32),
    int("window-ms", 1000, ONE_DAY_MS, 10_000, |r| r.window_ms, |r, v| r.window_ms = v),
];

/// `circuit-breaker`'s whole-number fields. The defaults follow resilience4j's
/// (50 % of at least 100 calls; 60 s open) scaled to an agent's few calls, with
/// five timeouts in a row enough to stop sending.
const BREAKER_FIELDS: [IntField<BreakerConfig>; 8] = [
    int("failures-to-open", 1, 10_000, 5, |b| b.failures_to_open.into(), |b, v| b.failures_to_open = v as u32),
    int("failure-ratio-percent", 1, 100, 50, |b| b.failure_ratio_percent.into(), |b, v| b.failure_ratio_percent = v as u32),
    int("min-calls-in-window", 1, 1_000_000, 20, |b| b.min_calls_in_window.into(), |b, v| b.min_calls_in_window = v as u32),
    int("window-ms", 1000, ONE_DAY_MS, 60_000, |b| b.window_ms, |b, v| b.window_ms = v),
    int("cooldown-ms", 1, ONE_DAY_MS, 30_000, |b| b.cooldown_ms, |b, v| b.cooldown_ms = v),
    int("cooldown-multiplier", 1, 16, 2, |b| b.cooldown_multiplier.into(), |b, v| b.cooldown_multiplier = v as u32),
    int("max-cooldown-ms", 1, ONE_DAY_MS, 300_000, |b| b.max_cooldown_ms, |b, v| b.max_cooldown_ms = v),
    int("probe-lease-ms", 1, ONE_DAY_MS, 60_000, |b| b.probe_lease_ms, |b, v| b.probe_lease_ms = v),
];

fn circuit_breaker(path: &str, value: Json) -> Result<BreakerConfig, ConfigError> {
    let mut fields = Fields::new(path, value)?;
    let mut breaker = BreakerConfig {
        failures_to_open: 0,
        failure_ratio_percent: 0,
        min_calls_in_window: 0,
        window_ms: 0,
        cooldown_ms: 0,
        cooldown_multiplier: 0,
        max_cooldown_ms: 0,
        probe_lease_ms: 0,
        per_tool: true,
        when_open: WhenOpen::Replan,
    };
    read_ints(&mut fields, &mut breaker, &BREAKER_FIELDS)?;
    if breaker.max_cooldown_ms < breaker.cooldown_ms {
        let message = cat!("must be at least cooldown-ms (", breaker.cooldown_ms, "), not ", breaker.max_cooldown_ms);
        return Err(error(ConfigErrorKind::OutOfRange, &join(path, "max-cooldown-ms"), message));
    }
    if let Some((p, v)) = fields.take("per-tool") {
        breaker.per_tool = boolean(&p, v)?;
    }
    if let Some((p, v)) = fields.take("when-open") {
        breaker.when_open = one_of(&p, v, &[("replan", WhenOpen::Replan), ("escalate", WhenOpen::Escalate)])?;
    }
    fields.finish()?;
    Ok(breaker)
}

/// Reads `table`'s fields from `fields` into `record`, defaults for the absent
/// ones. The first field of a table with costs is its capacity.
#[inline(never)]
fn read_ints<T>(fields: &mut Fields, record: &mut T, table: &[IntField<T>]) -> Result<(), ConfigError> {
    let mut capacity = u64::MAX;
    for (i, field) in table.iter().enumerate() {
        let max = if field.within_capacity { field.max.min(capacity) } else { field.max };
        let value = match fields.take(field.name) {
            Some((path, value)) => whole_number(&path, &value, field.min, max)?,
            None if field.required => return Err(error(ConfigErrorKind::OutOfRange, &join(fields.path, field.name), "is required")),
            None => field.default.min(max),
        };
        if i == 0 && field.name == "capacity" {
            capacity = value;
        }
        (field.set)(record, value);
    }
    Ok(())
}

/// `"name":value` pairs of `table`'s fields, for `effective-config`.
fn write_ints<T>(out: &mut String, record: &T, table: &[IntField<T>]) {
    for field in table {
        if !out.ends_with('{') {
            out.push(',');
        }
        json::write_string(out, field.name);
        out.push(':');
        cat_to!(*out; (field.get)(record));
    }
}

#[inline(never)]
fn join(parent: &str, key: &str) -> String {
    // Concatenated by hand: `format!` costs a configuration of many tools dearly.
    let mut path = String::with_capacity(parent.len() + 1 + key.len());
    if !parent.is_empty() {
        path.push_str(parent);
        path.push('.');
    }
    path.push_str(key);
    path
}

/// A JSON object whose fields are taken one by one; whatever is left is unknown.
struct Fields<'a> {
    path: &'a str,
    members: Vec<(String, Json)>,
}

impl<'a> Fields<'a> {
    fn new(path: &'a str, value: Json) -> Result<Self, ConfigError> {
        match value {
            Json::Object(members) => Ok(Fields { path, members }),
            other => Err(error(ConfigErrorKind::WrongType, path, cat!("must be a JSON object, not ", other.type_name()))),
        }
    }

    #[inline(never)]
    fn take(&mut self, key: &str) -> Option<(String, Json)> {
        let index = self.members.iter().position(|(name, _)| name == key)?;
        let (_, value) = self.members.remove(index);
        Some((join(self.path, key), value))
    }

    fn finish(self) -> Result<(), ConfigError> {
        match self.members.first() {
            None => Ok(()),
            Some((key, _)) => Err(error(
                ConfigErrorKind::UnknownField,
                &join(self.path, key),
                "is not a field of this object (see the configuration reference in the README)",
            )),
        }
    }
}

#[inline(never)]
fn whole_number(path: &str, value: &Json, min: u64, max: u64) -> Result<u64, ConfigError> {
    let rule = || cat!("must be a whole number from ", min, " to ", max, ", not ");
    match (value, value.as_u64()) {
        (Json::Number(_), Some(v)) if (min..=max).contains(&v) => Ok(v),
        (Json::Number(n), _) => Err(error(ConfigErrorKind::OutOfRange, path, cat!(rule(), crate::text::excerpt(n, 40)))),
        (other, _) => Err(error(ConfigErrorKind::WrongType, path, cat!(rule(), other.type_name()))),
    }
}

#[inline(never)]
fn boolean(path: &str, value: Json) -> Result<bool, ConfigError> {
    match value {
        Json::Bool(b) => Ok(b),
        other => Err(error(ConfigErrorKind::WrongType, path, cat!("must be true or false, not ", other.type_name()))),
    }
}

#[inline(never)]
fn string(path: &str, value: Json) -> Result<String, ConfigError> {
    match value {
        Json::String(s) if !s.is_empty() && s.len() <= 256 => Ok(s),
        Json::String(_) => Err(error(ConfigErrorKind::OutOfRange, path, "must be a string of 1 to 256 bytes")),
        other => Err(error(ConfigErrorKind::WrongType, path, cat!("must be a string, not ", other.type_name()))),
    }
}

/// A string that must be one of `choices`.
fn one_of<T: Copy>(path: &str, value: Json, choices: &[(&str, T)]) -> Result<T, ConfigError> {
    // The rule's words, only when there is an error to word.
    let rule = || {
        let mut rule = String::from("must be one of");
        for (i, (name, _)) in choices.iter().enumerate() {
            rule.push_str(if i == 0 { " \"" } else { ", \"" });
            rule.push_str(name);
            rule.push('"');
        }
        rule
    };
    match value {
        Json::String(s) => match choices.iter().find(|(name, _)| *name == s) {
            Some((_, choice)) => Ok(*choice),
            None => Err(error(ConfigErrorKind::OutOfRange, path, cat!(rule(), ", not \"", crate::text::excerpt(&s, 40), "\""))),
        },
        other => Err(error(ConfigErrorKind::WrongType, path, cat!(rule(), ", not ", other.type_name()))),
    }
}

fn effect(path: &str, value: Json) -> Result<Effect, ConfigError> {
    one_of(path, value, &[("read", Effect::Read), ("write", Effect::Write), ("delete", Effect::Delete)])
}

/// Classes a status may be overridden to: the failure classes a status can have.
fn override_class(path: &str, value: Json) -> Result<OutcomeClass, ConfigError> {
    let classes = [OutcomeClass::Transient, OutcomeClass::Throttled, OutcomeClass::Deterministic, OutcomeClass::Permission, OutcomeClass::Unclassified];
    let choices: Vec<(&str, OutcomeClass)> = classes.iter().map(|c| (c.name(), *c)).collect();
    one_of(path, value, &choices)
}

/// Classes a text rule may give.
fn rule_class(path: &str, value: Json) -> Result<OutcomeClass, ConfigError> {
    override_class(path, value)
}

/// `tool-error-rules`: `[{"contains": "E_BUSY", "class": "transient"}, ...]`.
fn text_rules(path: &str, value: Json) -> Result<Vec<TextRule>, ConfigError> {
    let items = match value {
        Json::Array(items) if items.len() <= MAX_TEXT_RULES => items,
        Json::Array(_) => return Err(error(ConfigErrorKind::OutOfRange, path, cat!("may hold at most ", MAX_TEXT_RULES, " rules"))),
        other => return Err(error(ConfigErrorKind::WrongType, path, cat!("must be an array of rules, not ", other.type_name()))),
    };
    let mut rules = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let item_path = cat!(path, "[", i, "]");
        let mut fields = Fields::new(&item_path, item)?;
        let contains = match fields.take("contains") {
            Some((p, v)) => string(&p, v)?,
            None => return Err(error(ConfigErrorKind::OutOfRange, &join(&item_path, "contains"), "is required")),
        };
        let class = match fields.take("class") {
            Some((p, v)) => rule_class(&p, v)?,
            None => return Err(error(ConfigErrorKind::OutOfRange, &join(&item_path, "class"), "is required")),
        };
        fields.finish()?;
        rules.push(text_rule(&contains, class));
    }
    Ok(rules)
}

/// One `tools` entry: either `{"effect": .., "idempotent": ..}` or MCP annotations
/// `{"readOnlyHint": .., "destructiveHint": .., "idempotentHint": ..}`, and
/// optionally the tool's own `tool-error-rules` (alone, they leave the effect to
/// the host's hints or `default-effect`).
fn tool_entry(name: String, path: &str, value: Json) -> Result<ToolEntry, ConfigError> {
    let mut fields = Fields::new(path, value)?;
    let rules = match fields.take("tool-error-rules") {
        Some((p, v)) => text_rules(&p, v)?,
        None => Vec::new(),
    };
    let mut timeouts = Timeouts::default();
    for (field, set) in TIMEOUT_FIELDS {
        if let Some((p, v)) = fields.take(field) {
            set(&mut timeouts, whole_number(&p, &v, 1, ONE_DAY_MS)?);
        }
    }
    let has_own = !rules.is_empty() || timeouts != Timeouts::default();
    if has_own && fields.members.is_empty() {
        return Ok(ToolEntry { name, policy: None, rules, timeouts });
    }
    let policy = tool_policy(path, Json::Object(fields.members))?;
    Ok(ToolEntry { name, policy: Some(policy), rules, timeouts })
}

fn tool_policy(path: &str, value: Json) -> Result<ToolPolicy, ConfigError> {
    let mut fields = Fields::new(path, value)?;
    let effect_field = fields.take("effect");
    let idempotent_field = fields.take("idempotent");
    let read_only = fields.take("readOnlyHint").map(|(p, v)| boolean(&p, v)).transpose()?;
    let destructive = fields.take("destructiveHint").map(|(p, v)| boolean(&p, v)).transpose()?;
    let idempotent_hint = fields.take("idempotentHint").map(|(p, v)| boolean(&p, v)).transpose()?;
    fields.finish()?;
    let uses_hints = read_only.is_some() || destructive.is_some() || idempotent_hint.is_some();
    match effect_field {
        Some((effect_path, effect_value)) => {
            if uses_hints {
                return Err(error(
                    ConfigErrorKind::OutOfRange,
                    path,
                    "give either \"effect\" or MCP hints (readOnlyHint, destructiveHint, idempotentHint), not both",
                ));
            }
            let effect = effect(&effect_path, effect_value)?;
            let idempotent = match idempotent_field {
                Some((p, v)) => boolean(&p, v)?,
                None => false,
            };
            Ok(ToolPolicy { effect, idempotent })
        }
        None => {
            if let Some((p, _)) = idempotent_field {
                return Err(error(ConfigErrorKind::OutOfRange, &p, "goes with \"effect\"; with MCP hints use \"idempotentHint\""));
            }
            if !uses_hints {
                return Err(error(
                    ConfigErrorKind::OutOfRange,
                    path,
                    "needs \"effect\" or at least one MCP hint (readOnlyHint, destructiveHint, idempotentHint)",
                ));
            }
            let hints = crate::types::ToolHints { read_only, destructive, idempotent: idempotent_hint };
            Ok(effect_from_hints(&hints, Effect::Write))
        }
    }
}

/// The effect MCP annotations describe. The spec's defaults apply to absent hints
/// (`readOnlyHint` false, `idempotentHint` false); `destructiveHint` does not say
/// delete (an overwrite is destructive too), so a non-read tool is `fallback`
/// unless `fallback` is read, which a tool not marked read-only cannot be.
pub fn effect_from_hints(hints: &crate::types::ToolHints, fallback: Effect) -> ToolPolicy {
    if hints.read_only == Some(true) {
        return ToolPolicy { effect: Effect::Read, idempotent: true };
    }
    let effect = if fallback == Effect::Read { Effect::Write } else { fallback };
    ToolPolicy { effect, idempotent: hints.idempotent == Some(true) }
}

fn account_budget(path: &str, value: Json) -> Result<AccountBudgetConfig, ConfigError> {
    let mut fields = Fields::new(path, value)?;
    let account_id = match fields.take("account-id") {
        Some((p, v)) => string(&p, v)?,
        None => return Err(error(ConfigErrorKind::OutOfRange, &join(path, "account-id"), "is required")),
    };
    let mut account = AccountBudgetConfig {
        account_id,
        capacity: 0,
        refill_interval_ms: 0,
        max_wait_ms: 0,
        attempt_cost: 0,
        retry_cost: 0,
        throttled_retry_cost: 0,
        retry_quota: None,
        retry_ratio: None,
    };
    read_ints(&mut fields, &mut account, &ACCOUNT_FIELDS)?;
    account.retry_quota = match fields.take("retry-quota") {
        None | Some((_, Json::Null)) => None,
        Some((p, v)) => {
            let mut quota_fields = Fields::new(&p, v)?;
            let mut quota = RetryQuotaConfig { capacity: 0, refill_interval_ms: 0, retry_cost: 0, throttled_retry_cost: 0, success_refund: 0 };
            read_ints(&mut quota_fields, &mut quota, &QUOTA_FIELDS)?;
            quota_fields.finish()?;
            Some(quota)
        }
    };
    account.retry_ratio = match fields.take("retry-ratio") {
        None | Some((_, Json::Null)) => None,
        Some((p, v)) => {
            let mut ratio_fields = Fields::new(&p, v)?;
            let mut ratio = RetryRatioConfig { percent: 0, min_retries_per_second: 0, window_ms: 0 };
            read_ints(&mut ratio_fields, &mut ratio, &RATIO_FIELDS)?;
            ratio_fields.finish()?;
            Some(ratio)
        }
    };
    fields.finish()?;
    Ok(account)
}

impl Config {
    /// Parses and validates a JSON configuration.
    pub fn from_json(text: &str) -> Result<Config, ConfigError> {
        if text.len() > MAX_CONFIG_BYTES {
            let message = cat!("the configuration is ", text.len(), " bytes, more than the ", MAX_CONFIG_BYTES, "-byte limit");
            return Err(error(ConfigErrorKind::TooLarge, "", message));
        }
        let value = json::parse(text).map_err(|e| error(ConfigErrorKind::Syntax, "", cat!("not valid JSON: ", e)))?;
        Self::from_value(value)
    }

    /// Validates a configuration already parsed (the liar fixture's, without its lies).
    #[cfg(feature = "liar")]
    pub fn from_parsed(value: Json) -> Result<Config, ConfigError> {
        Self::from_value(value)
    }

    fn from_value(value: Json) -> Result<Config, ConfigError> {
        let mut f = Fields::new("", value).map_err(|mut e| {
            e.message = String::from("the configuration must be a JSON object");
            e
        })?;
        let preset = match f.take("preset") {
            Some((p, v)) => one_of(&p, v, &[("default", Preset::Default), ("aws-2026", Preset::Aws2026)])?,
            None => Preset::Default,
        };
        preset.fill(&mut f.members);
        let mut config = Config { preset, ..Config::default() };
        read_ints(&mut f, &mut config, &INT_FIELDS)?;
        if config.max_delay_ms < config.base_delay_ms {
            let message = cat!("must be at least base-delay-ms (", config.base_delay_ms, "), not ", config.max_delay_ms);
            return Err(error(ConfigErrorKind::OutOfRange, "max-delay-ms", message));
        }
        if config.max_delay_ms < config.throttle_base_delay_ms {
            let message = cat!("must be at least throttle-base-delay-ms (", config.throttle_base_delay_ms, "), not ", config.max_delay_ms);
            return Err(error(ConfigErrorKind::OutOfRange, "max-delay-ms", message));
        }
        if config.task_poll_max_delay_ms < config.task_poll_min_delay_ms {
            let message = cat!("must be at least task-poll-min-delay-ms (", config.task_poll_min_delay_ms, "), not ", config.task_poll_max_delay_ms);
            return Err(error(ConfigErrorKind::OutOfRange, "task-poll-max-delay-ms", message));
        }
        if config.task_poll_max_delay_ms < config.task_poll_base_delay_ms {
            let message = cat!("must be at least task-poll-base-delay-ms (", config.task_poll_base_delay_ms, "), not ", config.task_poll_max_delay_ms);
            return Err(error(ConfigErrorKind::OutOfRange, "task-poll-max-delay-ms", message));
        }
        if config.max_plausible_hint_ms < config.max_hint_ms {
            let message = cat!("must be at least max-hint-ms (", config.max_hint_ms, "), not ", config.max_plausible_hint_ms);
            return Err(error(ConfigErrorKind::OutOfRange, "max-plausible-hint-ms", message));
        }
        let default_effect = match f.take("default-effect") {
            Some((p, v)) => effect(&p, v)?,
            None => config.default_effect,
        };
        let on_task_cancelled = match f.take("on-task-cancelled") {
            Some((p, v)) => one_of(&p, v, &[("replan", OnTaskCancelled::Replan), ("escalate", OnTaskCancelled::Escalate)])?,
            None => config.on_task_cancelled,
        };
        let mut tools = Vec::new();
        if let Some((path, value)) = f.take("tools") {
            let entries = Fields::new(&path, value)?;
            for (name, entry) in entries.members {
                let entry_path = join(&path, &name);
                if name.is_empty() || name.len() > 256 {
                    return Err(error(ConfigErrorKind::OutOfRange, &entry_path, "a tool name must be 1 to 256 bytes"));
                }
                tools.push(tool_entry(name, &entry_path, entry)?);
            }
        }
        let mut status_overrides = Vec::new();
        if let Some((path, value)) = f.take("status-overrides") {
            let entries = Fields::new(&path, value)?;
            for (status, class) in entries.members {
                let entry_path = join(&path, &status);
                let code = match status.parse::<u16>() {
                    Ok(code) if (400..=599).contains(&code) && status.len() == 3 => code,
                    _ => return Err(error(ConfigErrorKind::OutOfRange, &entry_path, "a key must be an HTTP error status from \"400\" to \"599\"")),
                };
                status_overrides.push((code, override_class(&entry_path, class)?));
            }
        }
        let tool_error_rules = match f.take("tool-error-rules") {
            Some((p, v)) => text_rules(&p, v)?,
            None => Vec::new(),
        };
        let account_budget = match f.take("account-budget") {
            None | Some((_, Json::Null)) => None,
            Some((p, v)) => Some(account_budget(&p, v)?),
        };
        let circuit_breaker = match f.take("circuit-breaker") {
            None | Some((_, Json::Null)) => None,
            Some((p, v)) => Some(circuit_breaker(&p, v)?),
        };
        f.finish()?;
        let tool_index = ToolIndex::build(&tools);
        Ok(Config { default_effect, on_task_cancelled, tools, tool_index, status_overrides, tool_error_rules, account_budget, circuit_breaker, ..config })
    }

    /// The configuration in force, every default filled in, as JSON that
    /// `from_json` accepts and turns back into the same configuration.
    pub fn to_json(&self) -> String {
        let mut out = String::from("{");
        let field = |out: &mut String, name: &str, value: &str| {
            if out.len() > 1 {
                out.push(',');
            }
            json::write_string(out, name);
            out.push(':');
            out.push_str(value);
        };
        field(&mut out, "preset", &cat!("\"", self.preset.name(), "\""));
        write_ints(&mut out, self, &INT_FIELDS);
        field(&mut out, "default-effect", &cat!("\"", self.default_effect.name(), "\""));
        field(&mut out, "on-task-cancelled", &cat!("\"", self.on_task_cancelled.name(), "\""));
        let mut tools = String::from("{");
        for (i, entry) in self.tools.iter().enumerate() {
            if i > 0 {
                tools.push(',');
            }
            json::write_string(&mut tools, &entry.name);
            tools.push_str(":{");
            // Members after the first are led by a comma.
            let mut lead = "";
            if let Some(tool) = entry.policy {
                cat_to!(tools; "\"effect\":\"", tool.effect.name(), "\",\"idempotent\":", if tool.idempotent { "true" } else { "false" });
                lead = ",";
            }
            for (name, ms) in [("idle-timeout-ms", entry.timeouts.idle_ms), ("attempt-timeout-ms", entry.timeouts.attempt_ms)] {
                if let Some(ms) = ms {
                    cat_to!(tools; lead, "\"", name, "\":", ms);
                    lead = ",";
                }
            }
            if !entry.rules.is_empty() {
                cat_to!(tools; lead, "\"tool-error-rules\":", rules_json(&entry.rules));
            }
            tools.push('}');
        }
        tools.push('}');
        field(&mut out, "tools", &tools);
        let mut overrides = String::from("{");
        for (i, (status, class)) in self.status_overrides.iter().enumerate() {
            if i > 0 {
                overrides.push(',');
            }
            cat_to!(overrides; "\"", status, "\":\"", class.name(), "\"");
        }
        overrides.push('}');
        field(&mut out, "status-overrides", &overrides);
        field(&mut out, "tool-error-rules", &rules_json(&self.tool_error_rules));
        let account = match &self.account_budget {
            None => String::from("null"),
            Some(a) => {
                let mut account = String::from("{\"account-id\":");
                json::write_string(&mut account, &a.account_id);
                write_ints(&mut account, a, &ACCOUNT_FIELDS);
                account.push_str(",\"retry-quota\":");
                match &a.retry_quota {
                    None => account.push_str("null"),
                    Some(q) => {
                        account.push('{');
                        write_ints(&mut account, q, &QUOTA_FIELDS);
                        account.push('}');
                    }
                }
                account.push_str(",\"retry-ratio\":");
                match &a.retry_ratio {
                    None => account.push_str("null"),
                    Some(r) => {
                        account.push('{');
                        write_ints(&mut account, r, &RATIO_FIELDS);
                        account.push('}');
                    }
                }
                account.push('}');
                account
            }
        };
        field(&mut out, "account-budget", &account);
        let breaker = match &self.circuit_breaker {
            None => String::from("null"),
            Some(b) => {
                let mut breaker = String::from("{");
                write_ints(&mut breaker, b, &BREAKER_FIELDS);
                cat_to!(breaker; ",\"per-tool\":", if b.per_tool { "true" } else { "false" }, ",\"when-open\":\"", b.when_open.name(), "\"}");
                breaker
            }
        };
        field(&mut out, "circuit-breaker", &breaker);
        out.push('}');
        out
    }

    /// An attempt's idle and absolute timeouts for `tool`, in ms: the tool's
    /// own, else the top level's.
    pub fn timeouts(&self, tool: &str) -> (u64, u64) {
        let own = self.tool_entry(tool).map(|e| e.timeouts).unwrap_or_default();
        (own.idle_ms.unwrap_or(self.idle_timeout_ms), own.attempt_ms.unwrap_or(self.attempt_timeout_ms))
    }

    /// How the policy treats `tool`: the `tools` entry, else the host's MCP
    /// hints, else `default-effect` (not idempotent).
    pub fn tool_policy(&self, tool: &str, hints: Option<&crate::types::ToolHints>) -> ToolPolicy {
        if let Some(policy) = self.tool_entry(tool).and_then(|e| e.policy) {
            return policy;
        }
        match hints {
            Some(hints) => effect_from_hints(hints, self.default_effect),
            None => ToolPolicy { effect: self.default_effect, idempotent: false },
        }
    }
}

/// Open addressing over FNV-1a hashes of the tool names: `slots[i]` is an entry's
/// index + 1, or 0 for an empty slot; the length is a power of two, at least
/// twice the entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolIndex {
    slots: Vec<u32>,
}

impl ToolIndex {
    fn build(tools: &[ToolEntry]) -> ToolIndex {
        if tools.is_empty() {
            return ToolIndex::default();
        }
        let size = (tools.len() * 2).next_power_of_two();
        let mut slots = alloc::vec![0u32; size];
        for (i, entry) in tools.iter().enumerate() {
            let mut at = json::NameSet::hash(&entry.name) as usize & (size - 1);
            while slots[at] != 0 {
                at = (at + 1) & (size - 1);
            }
            slots[at] = i as u32 + 1;
        }
        ToolIndex { slots }
    }
}

impl Config {
    /// The `tools` entry named `tool`, if any.
    pub fn tool_entry(&self, tool: &str) -> Option<&ToolEntry> {
        let slots = &self.tool_index.slots;
        if slots.is_empty() {
            return None;
        }
        let mut at = json::NameSet::hash(tool) as usize & (slots.len() - 1);
        while slots[at] != 0 {
            let entry = &self.tools[slots[at] as usize - 1];
            if entry.name == tool {
                return Some(entry);
            }
            at = (at + 1) & (slots.len() - 1);
        }
        None
    }

    /// The text rules for `tool`'s errors: its own, then the global ones.
    pub fn text_rules_for(&self, tool: Option<&str>) -> Vec<&TextRule> {
        let own = tool.and_then(|t| self.tool_entry(t)).map_or(&[][..], |e| &e.rules[..]);
        crate::relayed::rules_for(own, &self.tool_error_rules)
    }
}

fn rules_json(rules: &[TextRule]) -> String {
    let mut out = String::from("[");
    for (i, rule) in rules.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"contains\":");
        json::write_string(&mut out, &rule.contains);
        cat_to!(out; ",\"class\":\"", rule.class.name(), "\"}");
    }
    out.push(']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> ConfigError {
        Config::from_json(text).unwrap_err()
    }

    /// The configuration reference (docs/configuration.md) names every field
    /// with the default the tables give (run from `guest/`, docs/ is one level up).
    #[test]
    fn the_readme_reference_matches_the_tables() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/configuration.md")).unwrap();
        fn check<T>(readme: &str, table: &[IntField<T>]) {
            for field in table {
                let row = readme.lines().find(|l| l.starts_with(&alloc::format!("| `{}` |", field.name)));
                let row = row.unwrap_or_else(|| panic!("the README has no row for {}", field.name));
                let default = row.split('|').nth(2).unwrap().trim();
                let expected = if field.required { "required".to_string() } else { field.default.to_string() };
                assert!(default.starts_with(&expected), "{}: the README says {default:?}, the table {expected}", field.name);
            }
        }
        let section = |from: &str, to: &str| {
            let start = readme.find(from).unwrap_or_else(|| panic!("no {from:?} in the README"));
            let end = start + readme[start..].find(to).unwrap_or_else(|| panic!("no {to:?} after {from:?}"));
            readme[start..end].to_string()
        };
        check(&section("## Configuration reference", "`account-budget`:"), &INT_FIELDS);
        check(&section("`account-budget`:", "`account-budget.retry-quota`:"), &ACCOUNT_FIELDS);
        check(&section("`account-budget.retry-quota`:", "`account-budget.retry-ratio`:"), &QUOTA_FIELDS);
        check(&section("`account-budget.retry-ratio`:", "`circuit-breaker`:"), &RATIO_FIELDS);
        check(&section("`circuit-breaker`:", "Effect resolution"), &BREAKER_FIELDS);
    }

    #[test]
    fn empty_object_gives_defaults() {
        assert_eq!(Config::from_json("{}").unwrap(), Config::default());
    }

    #[test]
    fn the_aws_2026_preset_fills_what_is_not_given() {
        let config = Config::from_json(
            r#"{"preset": "aws-2026", "max-attempts-per-call": 5, "account-budget": {"account-id": "a", "capacity": 10, "refill-interval-ms": 100}}"#,
        )
        .unwrap();
        assert_eq!((config.base_delay_ms, config.throttle_base_delay_ms, config.max_delay_ms, config.hint_cap_over_backoff_ms), (50, 1000, 20_000, 5000));
        assert_eq!(config.max_attempts_per_call, 5, "a field given wins");
        let quota = config.account_budget.as_ref().unwrap().retry_quota.as_ref().unwrap();
        assert_eq!((quota.capacity, quota.retry_cost, quota.throttled_retry_cost, quota.success_refund), (500, 14, 5, 1));
        assert_eq!(Config::from_json(&config.to_json()).unwrap(), config);
        assert_eq!(Config::from_json("{}").unwrap().preset, Preset::Default);
        assert_eq!(err(r#"{"preset": "aws-2024"}"#).field, "preset");
        assert_eq!(err(r#"{"throttle-base-delay-ms": 60000}"#).field, "max-delay-ms");
    }

    #[test]
    fn effective_config_round_trips() {
        let text = r#"{"base-delay-ms": 50, "tools": {"issue_refund": {"effect": "write"},
            "list_refunds": {"readOnlyHint": true},
            "search": {"tool-error-rules": [{"contains": "E_BUSY", "class": "transient"}]}},
            "status-overrides": {"409": "transient"},
            "tool-error-rules": [{"contains": "quota_low", "class": "throttled"}],
            "account-budget": {"account-id": "acme", "capacity": 10, "refill-interval-ms": 100, "retry-ratio": {"percent": 10}}}"#;
        let config = Config::from_json(text).unwrap();
        assert_eq!(config.account_budget.as_ref().unwrap().retry_ratio, Some(RetryRatioConfig { percent: 10, min_retries_per_second: 10, window_ms: 10_000 }));
        assert_eq!(Config::from_json(&config.to_json()).unwrap(), config);
        assert_eq!(config.tool_policy("list_refunds", None).effect, Effect::Read);
        assert_eq!(config.account_budget.as_ref().unwrap().max_wait_ms, 5000);
    }

    #[test]
    fn errors_name_the_field_and_rule() {
        let e = err(r#"{"base-delay-ms": "1s"}"#);
        assert_eq!((e.kind, e.field.as_str()), (ConfigErrorKind::WrongType, "base-delay-ms"));
        assert!(e.message.contains("whole number"), "{e:?}");

        let e = err(r#"{"max-attempts-per-call": 0}"#);
        assert_eq!((e.kind, e.field.as_str()), (ConfigErrorKind::OutOfRange, "max-attempts-per-call"));

        let e = err(r#"{"max-delay-ms": -5}"#);
        assert_eq!(e.kind, ConfigErrorKind::OutOfRange);

        let e = err(r#"{"base-delay-ms": 1.5}"#);
        assert_eq!(e.kind, ConfigErrorKind::OutOfRange);

        let e = err(r#"{"retries": 3}"#);
        assert_eq!((e.kind, e.field.as_str()), (ConfigErrorKind::UnknownField, "retries"));

        let e = err(r#"{"tools": {"t": {"effect": "launch"}}}"#);
        assert_eq!((e.kind, e.field.as_str()), (ConfigErrorKind::OutOfRange, "tools.t.effect"));

        let e = err(r#"{"tools": {"t": {"effect": "read", "readOnlyHint": true}}}"#);
        assert_eq!(e.field, "tools.t");

        let e = err(r#"{"status-overrides": {"200": "transient"}}"#);
        assert_eq!(e.field, "status-overrides.200");

        let e = err(r#"{"status-overrides": {"409": "success"}}"#);
        assert_eq!(e.field, "status-overrides.409");

        let e = err(r#"{"account-budget": {"capacity": 5, "refill-interval-ms": 10}}"#);
        assert_eq!(e.field, "account-budget.account-id");

        let e = err(r#"{"account-budget": {"account-id": "a", "capacity": 5, "refill-interval-ms": 10, "retry-cost": 6}}"#);
        assert_eq!(e.field, "account-budget.retry-cost");

        let e = err(r#"{"base-delay-ms": 5000, "max-delay-ms": 100}"#);
        assert_eq!(e.field, "max-delay-ms");

        let e = err(r#"{"tool-error-rules": [{"contains": "x", "class": "success"}]}"#);
        assert_eq!(e.field, "tool-error-rules[0].class");

        let e = err(r#"{"max-hint-ms": 86400000, "max-plausible-hint-ms": 1000}"#);
        assert_eq!(e.field, "max-plausible-hint-ms");

        assert_eq!(err("{").kind, ConfigErrorKind::Syntax);
        assert_eq!(err("[]").kind, ConfigErrorKind::WrongType);
        assert_eq!(err(&"[".repeat(10_000)).kind, ConfigErrorKind::Syntax);
    }
}

#[cfg(test)]
mod cost {
    /// Run under callgrind to see where loading many tools goes (`--ignored`).
    #[test]
    #[ignore]
    fn many_tools() {
        let tools: alloc::vec::Vec<alloc::string::String> =
            (0..1000).map(|i| alloc::format!(r#""mcp__github__create_pull_request_review_{i:04}": {{"effect": "write"}}"#)).collect();
        let config = alloc::format!(r#"{{"tools": {{{}}}}}"#, tools.join(","));
        assert_eq!(super::Config::from_json(&config).unwrap().tools.len(), 1000);
    }
}
