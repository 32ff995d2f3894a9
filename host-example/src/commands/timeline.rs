//! `agent-retry timeline LOG.jsonl`: draws the wrapper's events (the JSON log
//! lines of docs/events.md, from any host) as an SVG on a time axis: one lane
//! per call when one run is drawn, one lane per run otherwise.
//!
//! The input is untrusted text: a line may carry a logger's prefix before its
//! first `{`, may be cut, huge, not UTF-8 or not ours; fields may be missing or
//! of the wrong type and `ts` may go backwards. Reading is one pass with a
//! bounded line buffer, and what is kept is capped per run and in runs, so
//! the cost is linear in the input and the memory bounded. Every text that
//! reaches the SVG goes through [`xml_escape`]. The output depends only on the
//! input (no clock, no hash order).
//!
//! This file is self-contained (std, serde_json, anyhow): the tests include it
//! with `#[path]` to drive the reader with generated input.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{self, BufRead, Write};
use std::path::PathBuf;

use serde_json::{Map, Value};

/// A line longer than this is skipped (counted), without being buffered whole.
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// Events kept per run; later ones are counted and named in the lane's label.
pub const MAX_EVENTS_PER_RUN: usize = 1_000;
/// Runs kept (lanes beyond this are no longer a readable picture); events of
/// later runs are counted.
pub const MAX_RUNS: usize = 100;
/// Lanes per call when one run is drawn; a run of more calls is drawn as one lane.
pub const MAX_CALL_LANES: usize = 100;
/// Policy updates kept (they are drawn across every lane).
pub const MAX_GLOBAL_EVENTS: usize = 200;
/// A kept text (label, detail, names) is cut to this many characters.
const MAX_TEXT_CHARS: usize = 300;
/// Timestamps outside (0, this) are not Unix seconds: treated as missing.
const MAX_PLAUSIBLE_TS: f64 = 1e11;
/// A wait longer than a week is not a wait the wrapper made: drawn without a length.
const MAX_PLAUSIBLE_WAIT_MS: f64 = 7.0 * 86_400_000.0;

pub struct TimelineOptions {
    /// The log file, or `-` for stdin.
    pub log: PathBuf,
    /// Where to write the SVG (stdout when absent).
    pub out: Option<PathBuf>,
    /// Draw this run only (one lane per call).
    pub run: Option<String>,
}

/// Reads `options.log`, writes the SVG, prints a summary to stderr.
pub fn timeline(options: TimelineOptions) -> anyhow::Result<()> {
    let timeline = if options.log.as_os_str() == "-" {
        read_events(io::stdin().lock(), options.run.as_deref())?
    } else {
        let file = std::fs::File::open(&options.log).map_err(|e| anyhow::anyhow!("cannot open {}: {e}", options.log.display()))?;
        read_events(io::BufReader::with_capacity(64 * 1024, file), options.run.as_deref())?
    };
    if timeline.runs.is_empty() {
        match &options.run {
            Some(run) => {
                let seen = timeline.stats.run_names_seen.join(", ");
                anyhow::bail!("no agent_retry events of run {run:?} in {} (runs seen: {seen})", options.log.display())
            }
            None => anyhow::bail!("no agent_retry.* events with a run in {}", options.log.display()),
        }
    }
    let svg = render_svg(&timeline);
    match &options.out {
        Some(path) => std::fs::write(path, svg.as_bytes()).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?,
        None => io::stdout().lock().write_all(svg.as_bytes())?,
    }
    let s = &timeline.stats;
    eprintln!(
        "timeline: {} events of {} run(s) drawn{}; {} lines read, {} not ours, {} malformed, {} too long, {} without a time, {} over the caps",
        timeline.runs.iter().map(|r| r.events.len()).sum::<usize>() + timeline.globals.len(),
        timeline.runs.len(),
        options.out.as_ref().map(|p| format!(" to {}", p.display())).unwrap_or_default(),
        s.lines,
        s.not_ours,
        s.malformed,
        s.too_long,
        s.untimed,
        s.dropped_events + s.dropped_runs_events,
    );
    Ok(())
}

/// What an event is drawn as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Attempt,
    Wait,
    StatusCheck,
    TaskPoll,
    Replan,
    Escalation,
    PolicyUpdate,
    /// Another `agent_retry.*` event (e.g. `cancel_task`, `hook_failed`).
    Other,
}

impl Kind {
    fn of(event: &str) -> Kind {
        match event {
            "agent_retry.attempt" => Kind::Attempt,
            "agent_retry.wait" => Kind::Wait,
            "agent_retry.status_check" => Kind::StatusCheck,
            "agent_retry.task_poll" => Kind::TaskPoll,
            "agent_retry.replan" => Kind::Replan,
            "agent_retry.escalation" => Kind::Escalation,
            "agent_retry.policy_update" => Kind::PolicyUpdate,
            _ => Kind::Other,
        }
    }

    /// The name in the SVG's `data-kind` (what the tests and readers select on).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Attempt => "attempt",
            Kind::Wait => "wait",
            Kind::StatusCheck => "status-check",
            Kind::TaskPoll => "task-poll",
            Kind::Replan => "replan",
            Kind::Escalation => "escalation",
            Kind::PolicyUpdate => "policy-update",
            Kind::Other => "other",
        }
    }
}

/// One event as it is drawn: already cut to size.
#[derive(Clone, Debug)]
pub struct Event {
    pub kind: Kind,
    /// Unix seconds, when the line had a usable time; filled from the run's
    /// neighbours before drawing.
    pub ts: Option<f64>,
    /// The line's position in the input: the order of events with equal times.
    pub seq: u64,
    pub call: Option<String>,
    pub tool: Option<String>,
    /// What picks the colour: the action, else the class (attempts); the
    /// result, status or why of the other kinds.
    pub tone: String,
    /// The short text drawn next to the mark.
    pub label: String,
    /// Every field, for the mark's tooltip.
    pub detail: String,
    /// A wait's length in seconds.
    pub duration: Option<f64>,
}

pub struct Run {
    pub id: String,
    pub events: Vec<Event>,
    /// Events past [`MAX_EVENTS_PER_RUN`], counted only.
    pub dropped: u64,
}

#[derive(Default, Debug)]
pub struct Stats {
    pub lines: u64,
    /// Lines that are JSON objects but not `agent_retry.*` events (or not JSON
    /// at all after a prefix: text lines of other loggers).
    pub not_ours: u64,
    /// Lines that start an object but do not parse, or are not UTF-8.
    pub malformed: u64,
    pub too_long: u64,
    pub untimed: u64,
    pub dropped_events: u64,
    /// Events of runs past [`MAX_RUNS`].
    pub dropped_runs_events: u64,
    /// The first few run ids seen (for the error when `--run` matches none).
    pub run_names_seen: Vec<String>,
}

pub struct Timeline {
    pub runs: Vec<Run>,
    /// Policy updates: drawn as a line across every lane.
    pub globals: Vec<Event>,
    pub stats: Stats,
}

enum LineRead {
    Line,
    TooLong,
    Eof,
}

/// Reads one line into `buf` (without its newline); a line past `max` bytes
/// is consumed without being kept.
fn read_line_bounded<R: BufRead>(reader: &mut R, buf: &mut Vec<u8>, max: usize) -> io::Result<LineRead> {
    buf.clear();
    let mut too_long = false;
    let mut any = false;
    loop {
        let available = match reader.fill_buf() {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(if !any {
                LineRead::Eof
            } else if too_long {
                LineRead::TooLong
            } else {
                LineRead::Line
            });
        }
        any = true;
        let (chunk, done) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], Some(i + 1)),
            None => (available, None),
        };
        if !too_long {
            if buf.len() + chunk.len() > max {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        let used = done.unwrap_or(available.len());
        reader.consume(used);
        if done.is_some() {
            return Ok(if too_long { LineRead::TooLong } else { LineRead::Line });
        }
    }
}

/// Reads the events of every run (or of `only_run`) from JSON log lines.
pub fn read_events<R: BufRead>(mut reader: R, only_run: Option<&str>) -> io::Result<Timeline> {
    let mut timeline = Timeline { runs: Vec::new(), globals: Vec::new(), stats: Stats::default() };
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut buf = Vec::with_capacity(4096);
    let mut seq = 0u64;
    loop {
        match read_line_bounded(&mut reader, &mut buf, MAX_LINE_BYTES)? {
            LineRead::Eof => break,
            LineRead::TooLong => {
                timeline.stats.lines += 1;
                timeline.stats.too_long += 1;
                continue;
            }
            LineRead::Line => timeline.stats.lines += 1,
        }
        seq += 1;
        let Some(start) = buf.iter().position(|&b| b == b'{') else {
            timeline.stats.not_ours += 1;
            continue;
        };
        let object = match serde_json::from_slice::<Value>(trim_end(&buf[start..])) {
            Ok(Value::Object(object)) => object,
            Ok(_) => {
                timeline.stats.not_ours += 1;
                continue;
            }
            Err(_) => {
                timeline.stats.malformed += 1;
                continue;
            }
        };
        let fields = Fields::of(&object);
        let Some(name) = fields.str("event").filter(|e| e.starts_with("agent_retry.")) else {
            timeline.stats.not_ours += 1;
            continue;
        };
        let event = make_event(&fields, name, seq);
        if event.ts.is_none() {
            timeline.stats.untimed += 1;
        }
        let run = fields.text("run");
        if event.kind == Kind::PolicyUpdate || (run.is_none() && only_run.is_none()) {
            // Policy updates concern the process, not a run; an event of no run
            // is drawn across the lanes too rather than lost.
            if timeline.globals.len() < MAX_GLOBAL_EVENTS {
                timeline.globals.push(event);
            } else {
                timeline.stats.dropped_events += 1;
            }
            continue;
        }
        let Some(run) = run else { continue };
        if timeline.stats.run_names_seen.len() < 10 && !timeline.stats.run_names_seen.contains(&run) {
            timeline.stats.run_names_seen.push(run.clone());
        }
        if only_run.is_some_and(|only| only != run) {
            continue;
        }
        let slot = match index.get(&run) {
            Some(&slot) => slot,
            None if timeline.runs.len() < MAX_RUNS => {
                index.insert(run.clone(), timeline.runs.len());
                timeline.runs.push(Run { id: run, events: Vec::new(), dropped: 0 });
                timeline.runs.len() - 1
            }
            None => {
                timeline.stats.dropped_runs_events += 1;
                continue;
            }
        };
        let run = &mut timeline.runs[slot];
        if run.events.len() < MAX_EVENTS_PER_RUN {
            run.events.push(event);
        } else {
            run.dropped += 1;
            timeline.stats.dropped_events += 1;
        }
    }
    for run in &mut timeline.runs {
        settle(&mut run.events);
    }
    settle(&mut timeline.globals);
    Ok(timeline)
}

fn trim_end(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(0, |i| i + 1);
    &bytes[..end]
}

/// Gives an event without a time its predecessor's (or, first in its run, its
/// successor's), then orders by time, stably, so a log whose `ts` goes
/// backwards is drawn in time order and equal times keep the file's order.
fn settle(events: &mut [Event]) {
    let mut last = None;
    for event in events.iter_mut() {
        match event.ts {
            Some(ts) => last = Some(ts),
            None => event.ts = last,
        }
    }
    let first = events.iter().find_map(|e| e.ts);
    for event in events.iter_mut().filter(|e| e.ts.is_none()) {
        event.ts = first;
    }
    events.sort_by(|a, b| a.ts.unwrap_or(0.0).total_cmp(&b.ts.unwrap_or(0.0)).then(a.seq.cmp(&b.seq)));
}

/// A log line's fields: flattened (the hosts' lines), or under `fields` (a
/// `tracing` JSON line without `flatten_event`).
struct Fields<'a> {
    top: &'a Map<String, Value>,
    nested: Option<&'a Map<String, Value>>,
}

impl<'a> Fields<'a> {
    fn of(top: &'a Map<String, Value>) -> Self {
        Fields { top, nested: top.get("fields").and_then(Value::as_object) }
    }

    fn get(&self, name: &str) -> Option<&'a Value> {
        self.nested.and_then(|n| n.get(name)).or_else(|| self.top.get(name)).filter(|v| !v.is_null())
    }

    fn str(&self, name: &str) -> Option<&'a str> {
        self.get(name).and_then(Value::as_str)
    }

    /// A field as text: strings as they are, numbers and booleans printed,
    /// objects and arrays as JSON; cut to size.
    fn text(&self, name: &str) -> Option<String> {
        let value = self.get(name)?;
        let text = match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        Some(cut(&text, MAX_TEXT_CHARS))
    }

    fn number(&self, name: &str) -> Option<f64> {
        match self.get(name)? {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        }
        .filter(|n: &f64| n.is_finite())
    }

    /// `ts` (Unix seconds), else `timestamp` (RFC 3339, as `tracing` writes it).
    fn time(&self) -> Option<f64> {
        self.number("ts").or_else(|| self.str("timestamp").and_then(parse_rfc3339)).filter(|t| *t > 0.0 && *t < MAX_PLAUSIBLE_TS)
    }
}

/// Cuts `text` to `max` characters, marking the cut.
fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

fn make_event(fields: &Fields, name: &str, seq: u64) -> Event {
    let kind = Kind::of(name);
    let t = |field: &str| fields.text(field);
    let or = |a: Option<String>, b: &str| a.unwrap_or_else(|| b.to_string());
    let (tone, label, duration) = match kind {
        Kind::Attempt => {
            let action = t("action");
            let tone = action.clone().or_else(|| t("class")).unwrap_or_default();
            let label = t("outcome").or(action).unwrap_or_else(|| format!("attempt {}", or(t("attempt"), "?")));
            (tone, label, None)
        }
        Kind::Wait => {
            let wait_ms = fields.number("wait_ms").filter(|ms| (0.0..=MAX_PLAUSIBLE_WAIT_MS).contains(ms));
            let why = or(t("why"), "wait");
            let label = match wait_ms {
                Some(ms) => format!("{why} {}", seconds_text(ms / 1000.0)),
                None => format!("{why} ?"),
            };
            (why, label, wait_ms.map(|ms| ms / 1000.0))
        }
        Kind::StatusCheck => {
            let result = or(t("result"), "?");
            (result.clone(), format!("check: {result}"), None)
        }
        Kind::TaskPoll => {
            let status = or(t("status"), "?");
            (status.clone(), format!("poll: {status}"), None)
        }
        Kind::Replan => ("replan".into(), "replan".into(), None),
        Kind::Escalation => {
            let reason = t("reason").or_else(|| t("escalation"));
            ("escalate".into(), format!("escalated: {}", reason.unwrap_or_else(|| "?".into())), None)
        }
        Kind::PolicyUpdate => {
            let message = t("message").or_else(|| t("kind")).unwrap_or_else(|| "policy update".into());
            ("policy-update".into(), message, None)
        }
        Kind::Other => ("other".into(), name.trim_start_matches("agent_retry.").to_string(), None),
    };
    let mut detail = cut(name, MAX_TEXT_CHARS);
    let listed = [
        "tool",
        "call",
        "step",
        "attempt",
        "key",
        "outcome",
        "class",
        "rule",
        "action",
        "delay_ms",
        "hint_ms",
        "escalation",
        "reason",
        "why",
        "wait_ms",
        "check_tool",
        "result",
        "task_id",
        "status",
        "message",
        "note",
        "identity",
        "serving",
        "kind",
        "hook",
        "error",
        "policy",
    ];
    for field in listed {
        if let Some(value) = t(field) {
            let _ = write!(detail, "\n{field}: {value}");
        }
    }
    Event { kind, ts: fields.time(), seq, call: t("call"), tool: t("tool"), tone: cut(&tone, 40), label: cut(&label, 40), detail: cut(&detail, 600), duration }
}

/// Parses RFC 3339 (`2026-12-03T01:57:42.123456Z`, or with an offset) to Unix seconds.
fn parse_rfc3339(text: &str) -> Option<f64> {
    let b = text.as_bytes();
    if b.len() < 20 || !text.is_ascii() || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |range: std::ops::Range<usize>| text.get(range)?.parse::<i64>().ok();
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &text[19..];
    let mut fraction = 0.0;
    if let Some(digits) = rest.strip_prefix('.') {
        let n = digits.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return None;
        }
        fraction = format!("0.{}", &digits[..n.min(9)]).parse().ok()?;
        rest = &digits[n..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && (rest.starts_with('+') || rest.starts_with('-')) && &rest[3..4] == ":" => {
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            sign * (rest[1..3].parse::<i64>().ok()? * 3600 + rest[4..6].parse::<i64>().ok()? * 60)
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + hour * 3600 + minute * 60 + second - offset) as f64 + fraction)
}

/// Escapes text for XML content and attribute values, and drops what XML 1.0
/// cannot hold at all (control characters other than tab and newline, U+FFFE/F).
pub fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push_str("&#10;"),
            '\t' => out.push(' '),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

fn seconds_text(seconds: f64) -> String {
    if seconds < 1.0 { format!("{:.0} ms", seconds * 1000.0) } else { format!("{seconds:.1} s") }
}

/// The colour of a tone (an action, class, result or status).
fn colour(tone: &str) -> &'static str {
    match tone {
        "succeed" | "success" | "found" | "completed" => "#2e7d32",
        "retry" | "transient" | "throttled" | "working" | "admission" => "#ef6c00",
        "replan" | "semantic" | "deterministic" | "input_required" => "#1565c0",
        "escalate" | "permission" | "misconfigured" | "unclassified" | "failed" | "cancelled" => "#c62828",
        "check-status" | "absent" => "#6a1b9a",
        "poll" | "needs-input" => "#00838f",
        "policy-update" => "#546e7a",
        _ => "#757575",
    }
}

const WIDTH: f64 = 1200.0;
const GUTTER: f64 = 230.0;
const RIGHT: f64 = 40.0;
const TOP: f64 = 64.0;
const LANE: f64 = 66.0;
const LABEL_ROWS: usize = 3;
/// An estimate of a label's width per character at font-size 10.
const CHAR_WIDTH: f64 = 5.8;

/// One horizontal band of the picture: a call of the one run drawn, or a run.
struct Lane<'a> {
    title: String,
    events: Vec<&'a Event>,
    note: String,
}

fn lanes(timeline: &Timeline) -> Vec<Lane<'_>> {
    let mut lanes: Vec<Lane> = Vec::new();
    let one_run = match timeline.runs.as_slice() {
        [run] if calls(run) <= MAX_CALL_LANES => Some(run),
        _ => None,
    };
    if let Some(run) = one_run {
        // One run: a lane per call, in the order the calls began.
        let mut slots: HashMap<Option<&str>, usize> = HashMap::new();
        for event in &run.events {
            let key = event.call.as_deref();
            let slot = *slots.entry(key).or_insert_with(|| {
                let title = match (key, event.tool.as_deref()) {
                    (Some(call), Some(tool)) => format!("call {call} · {tool}"),
                    (Some(call), None) => format!("call {call}"),
                    (None, Some(tool)) => tool.to_string(),
                    (None, None) => "run".to_string(),
                };
                lanes.push(Lane { title, events: Vec::new(), note: String::new() });
                lanes.len() - 1
            });
            lanes[slot].events.push(event);
        }
        if run.dropped > 0
            && let Some(last) = lanes.last_mut()
        {
            last.note = format!("+{} events not drawn", run.dropped);
        }
    } else {
        for run in &timeline.runs {
            let note = if run.dropped > 0 { format!("+{} events not drawn", run.dropped) } else { String::new() };
            lanes.push(Lane { title: run.id.clone(), events: run.events.iter().collect(), note });
        }
        // Runs in the order they began; equal starts by name (a stable order).
        lanes.sort_by(|a, b| start(a).total_cmp(&start(b)).then_with(|| a.title.cmp(&b.title)));
    }
    lanes
}

/// How many lanes a run would have drawn a lane per call.
fn calls(run: &Run) -> usize {
    let mut seen: Vec<Option<&str>> = run.events.iter().map(|e| e.call.as_deref()).collect();
    seen.sort_unstable();
    seen.dedup();
    seen.len()
}

fn start(lane: &Lane) -> f64 {
    lane.events.first().and_then(|e| e.ts).unwrap_or(0.0)
}

/// A tick step of 1, 2 or 5 times a power of ten giving about eight ticks.
fn tick_step(span: f64) -> f64 {
    let raw = (span / 8.0).max(1e-3);
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * power).find(|s| *s >= raw).unwrap_or(10.0 * power)
}

/// Draws the timeline. Marks are `<g class="event" data-kind=... data-label=...>`
/// inside `<g class="lane" data-lane=...>`: what a reader (or a test) selects on.
pub fn render_svg(timeline: &Timeline) -> String {
    let lanes = lanes(timeline);
    let times =
        lanes.iter().flat_map(|l| l.events.iter().copied()).chain(timeline.globals.iter()).filter_map(|e| e.ts.map(|t| (t, t + e.duration.unwrap_or(0.0))));
    let (t0, t1) = times.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (a, b)| (lo.min(a), hi.max(b)));
    let (t0, t1) = if t0.is_finite() { (t0, t1) } else { (0.0, 1.0) };
    let span = (t1 - t0).max(0.001);
    let plot = WIDTH - GUTTER - RIGHT;
    let x = |t: f64| GUTTER + (t - t0) / span * plot;
    let height = TOP + LANE * lanes.len() as f64 + 70.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="10">"#
    );
    svg.push_str("<rect x=\"0\" y=\"0\" width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n");
    let title = match timeline.runs.as_slice() {
        [run] => format!("agent-retry timeline: run {} ({} events)", run.id, run.events.len()),
        runs => format!("agent-retry timeline: {} runs ({} events)", runs.len(), runs.iter().map(|r| r.events.len()).sum::<usize>()),
    };
    let _ = writeln!(svg, r#"<text class="title" x="10" y="20" font-size="14" font-weight="bold">{}</text>"#, xml_escape(&title));
    // The time axis: seconds from the first event.
    let step = tick_step(span);
    let decimals = if step >= 1.0 { 0 } else { (-step.log10().floor()) as usize };
    let axis_bottom = TOP + LANE * lanes.len() as f64;
    let _ = writeln!(svg, r##"<g class="axis" stroke="#cfd8dc"><line x1="{GUTTER}" y1="{}" x2="{}" y2="{}"/></g>"##, TOP - 8.0, WIDTH - RIGHT, TOP - 8.0);
    let mut tick = 0.0;
    while tick <= span + step * 1e-9 {
        let tx = x(t0 + tick);
        let _ = writeln!(
            svg,
            r##"<line class="tick" x1="{tx:.1}" y1="{:.1}" x2="{tx:.1}" y2="{axis_bottom:.1}" stroke="#eceff1"/><text x="{tx:.1}" y="{:.1}" text-anchor="middle" fill="#546e7a">{tick:.decimals$} s</text>"##,
            TOP - 8.0,
            TOP - 14.0
        );
        tick += step;
    }
    for (i, lane) in lanes.iter().enumerate() {
        let top = TOP + LANE * i as f64;
        let mid = top + 18.0;
        let fill = if i % 2 == 0 { "#fafafa" } else { "#f3f5f7" };
        let _ = writeln!(svg, r#"<g class="lane" data-lane="{}">"#, xml_escape(&lane.title));
        let _ = writeln!(svg, r#"<rect x="0" y="{top:.1}" width="{WIDTH}" height="{LANE}" fill="{fill}" fill-opacity="0.6"/>"#);
        let _ = writeln!(
            svg,
            r#"<text class="lane-title" x="8" y="{:.1}" font-size="11"><title>{}</title>{}</text>"#,
            mid + 4.0,
            xml_escape(&lane.title),
            xml_escape(&cut(&lane.title, 36))
        );
        if !lane.note.is_empty() {
            let _ = writeln!(svg, r##"<text class="lane-note" x="8" y="{:.1}" fill="#c62828">{}</text>"##, mid + 18.0, xml_escape(&lane.note));
        }
        let _ = writeln!(svg, r##"<line x1="{GUTTER}" y1="{mid:.1}" x2="{}" y2="{mid:.1}" stroke="#b0bec5"/>"##, WIDTH - RIGHT);
        let places = label_places(&lane.events, &x);
        for (event, place) in lane.events.iter().zip(places) {
            draw_event(&mut svg, event, x(event.ts.unwrap_or(t0)), mid, place.map(|(lx, row)| (lx, mid + 17.0 + 11.0 * row as f64)), x);
        }
        svg.push_str("</g>\n");
    }
    for event in &timeline.globals {
        let gx = x(event.ts.unwrap_or(t0));
        let _ = writeln!(
            svg,
            r##"<g class="event" data-kind="{}" data-label="{}"><title>{}</title><line x1="{gx:.1}" y1="{:.1}" x2="{gx:.1}" y2="{axis_bottom:.1}" stroke="{}" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" fill="{}">{}</text></g>"##,
            event.kind.name(),
            xml_escape(&event.label),
            xml_escape(&event.detail),
            TOP - 4.0,
            colour(&event.tone),
            gx + 3.0,
            TOP + 6.0,
            colour(&event.tone),
            xml_escape(&event.label),
        );
    }
    legend(&mut svg, axis_bottom + 24.0);
    svg.push_str("</svg>\n");
    svg
}

/// How much a label is worth its room when a lane is crowded (lower first).
fn label_priority(event: &Event) -> u8 {
    match event.kind {
        Kind::Escalation => 0,
        Kind::Replan => 1,
        Kind::StatusCheck | Kind::TaskPoll => 2,
        Kind::Attempt if event.tone != "succeed" => 3,
        Kind::Wait => 4,
        Kind::Other | Kind::PolicyUpdate => 5,
        Kind::Attempt => 6,
    }
}

/// Where each event's label goes: (x, row) in the rows under the marks, the
/// most telling labels placed first; a label that fits in no row is not drawn
/// (it stays in the mark's tooltip and `data-label`).
fn label_places(events: &[&Event], x: &impl Fn(f64) -> f64) -> Vec<Option<(f64, usize)>> {
    let mut order: Vec<usize> = (0..events.len()).collect();
    order.sort_by_key(|&i| label_priority(events[i]));
    let mut rows: [Vec<(f64, f64)>; LABEL_ROWS] = Default::default();
    let mut places = vec![None; events.len()];
    for i in order {
        let event = events[i];
        let width = event.label.chars().count() as f64 * CHAR_WIDTH;
        // A label that would run past the right edge ends there instead.
        let lx = x(event.ts.unwrap_or(0.0)).min(WIDTH - 6.0 - width).max(GUTTER);
        let free = |row: &Vec<(f64, f64)>| row.iter().all(|&(a, b)| lx + width + 4.0 <= a || b + 4.0 <= lx);
        if let Some(row) = (0..LABEL_ROWS).find(|&r| free(&rows[r])) {
            rows[row].push((lx, lx + width));
            places[i] = Some((lx, row));
        }
    }
    places
}

/// Draws one event's mark at `ex` on the lane's line `mid`, its label at `label_at` (if it has room).
fn draw_event(svg: &mut String, event: &Event, ex: f64, mid: f64, label_at: Option<(f64, f64)>, x: impl Fn(f64) -> f64) {
    let colour = colour(&event.tone);
    let _ = write!(
        svg,
        r#"<g class="event" data-kind="{}" data-label="{}" data-tone="{}"><title>{}</title>"#,
        event.kind.name(),
        xml_escape(&event.label),
        xml_escape(&event.tone),
        xml_escape(&event.detail)
    );
    match event.kind {
        Kind::Attempt => {
            let _ = write!(svg, r##"<circle cx="{ex:.1}" cy="{mid:.1}" r="5.5" fill="{colour}" stroke="#263238" stroke-width="0.8"/>"##);
        }
        Kind::Wait => {
            let end = x(event.ts.unwrap_or(0.0) + event.duration.unwrap_or(0.0)).max(ex + 1.0);
            let _ = write!(svg, r#"<rect x="{ex:.1}" y="{:.1}" width="{:.1}" height="8" fill="{colour}" fill-opacity="0.35"/>"#, mid - 4.0, end - ex);
        }
        Kind::StatusCheck => {
            let _ = write!(
                svg,
                r#"<polygon points="{ex:.1},{:.1} {:.1},{mid:.1} {ex:.1},{:.1} {:.1},{mid:.1}" fill="{colour}"/>"#,
                mid - 7.0,
                ex + 7.0,
                mid + 7.0,
                ex - 7.0
            );
        }
        Kind::TaskPoll => {
            let _ = write!(svg, r#"<rect x="{:.1}" y="{:.1}" width="8" height="8" fill="{colour}"/>"#, ex - 4.0, mid - 4.0);
        }
        Kind::Replan => {
            let _ = write!(
                svg,
                r#"<polygon points="{ex:.1},{:.1} {:.1},{:.1} {:.1},{:.1}" fill="{colour}"/>"#,
                mid - 20.0,
                ex + 6.0,
                mid - 9.0,
                ex - 6.0,
                mid - 9.0
            );
        }
        Kind::Escalation => {
            let _ = write!(
                svg,
                r#"<line x1="{ex:.1}" y1="{:.1}" x2="{ex:.1}" y2="{mid:.1}" stroke="{colour}" stroke-width="2"/><polygon points="{ex:.1},{:.1} {:.1},{:.1} {ex:.1},{:.1}" fill="{colour}"/>"#,
                mid - 16.0,
                mid - 16.0,
                ex + 10.0,
                mid - 12.5,
                mid - 9.0
            );
        }
        _ => {
            let _ = write!(svg, r#"<line x1="{ex:.1}" y1="{:.1}" x2="{ex:.1}" y2="{:.1}" stroke="{colour}" stroke-width="2"/>"#, mid - 6.0, mid + 6.0);
        }
    }
    match label_at {
        Some((lx, ly)) => {
            let weight = if event.kind == Kind::Escalation { r#" font-weight="bold""# } else { "" };
            let _ = writeln!(svg, r#"<text x="{lx:.1}" y="{ly:.1}" fill="{colour}"{weight}>{}</text></g>"#, xml_escape(&event.label));
        }
        None => svg.push_str("</g>\n"),
    }
}

fn legend(svg: &mut String, y: f64) {
    let items = [
        ("succeed", "attempt: succeed"),
        ("retry", "attempt: retry"),
        ("replan", "replan"),
        ("escalate", "escalate"),
        ("check-status", "check-status"),
        ("poll", "poll"),
    ];
    let _ = writeln!(svg, r#"<g class="legend">"#);
    let mut lx = 10.0;
    for (tone, text) in items {
        let _ =
            writeln!(svg, r#"<circle cx="{lx:.1}" cy="{:.1}" r="5" fill="{}"/><text x="{:.1}" y="{:.1}">{text}</text>"#, y - 3.0, colour(tone), lx + 9.0, y);
        lx += 20.0 + text.len() as f64 * CHAR_WIDTH;
    }
    let _ = writeln!(
        svg,
        r##"<text x="10" y="{:.1}" fill="#546e7a">circle: attempt (colour: action) · bar: wait · diamond: status check · square: task poll · triangle: replan · flag: escalation · dashed line: policy update</text>"##,
        y + 18.0
    );
    svg.push_str("</g>\n");
}
