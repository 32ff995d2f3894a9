//! `agent-retry timeline`: the drawing of a fixture log (golden structure),
//! escaping, malformed and hostile input, bounded memory on a huge stream.
//! The CLI is run as a user runs it; the reader is also driven in-process
//! (the module is included by path) with generated input that is never
//! written to disk.

use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

#[allow(dead_code)]
#[path = "../src/commands/timeline.rs"]
mod timeline;

const BIN: &str = env!("CARGO_BIN_EXE_agent-retry");

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/timeline").join(name)
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("agent-retry-timeline-{}-{name}", std::process::id()))
}

fn run(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(BIN).args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(bytes) = stdin {
        input.write_all(bytes).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn draw(log: &Path, extra: &[&str]) -> String {
    let out = temp(&format!("{}.svg", log.file_name().unwrap().to_string_lossy()));
    let mut args = vec!["timeline", log.to_str().unwrap(), "--out", out.to_str().unwrap()];
    args.extend_from_slice(extra);
    let output = run(&args, None);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let svg = std::fs::read_to_string(&out).unwrap();
    let _ = std::fs::remove_file(&out);
    svg
}

/// The value of `name="..."` in a tag, unescaped.
fn attribute(tag: &str, name: &str) -> Option<String> {
    let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    let end = start + tag[start..].find('"')?;
    Some(unescape(&tag[start..end]))
}

fn unescape(text: &str) -> String {
    text.replace("&#10;", "\n").replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&apos;", "'").replace("&amp;", "&")
}

/// The SVG's structure: `lane TITLE` per lane, then `kind | label` per event
/// in drawing order; policy updates under `global`.
fn structure(svg: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut global = false;
    for tag in svg.split('<').skip(1) {
        let tag = tag.split('>').next().unwrap();
        if tag.starts_with("g class=\"lane\"") {
            lines.push(format!("lane {}", attribute(tag, "data-lane").unwrap()));
        } else if tag.starts_with("g class=\"event\"") {
            let kind = attribute(tag, "data-kind").unwrap();
            if kind == "policy-update" && !global {
                global = true;
                lines.push("global".into());
            }
            lines.push(format!("{kind} | {}", attribute(tag, "data-label").unwrap()));
        }
    }
    lines
}

fn expected(name: &str) -> Vec<String> {
    std::fs::read_to_string(fixture(name)).unwrap().lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).map(str::to_string).collect()
}

/// A small XML well-formedness check: tags balance, attribute values are
/// quoted and hold no `<`, every `&` starts an entity, text holds no `<` or `>`
/// outside tags, and no character XML 1.0 forbids appears.
fn assert_well_formed(svg: &str) {
    let mut stack: Vec<String> = Vec::new();
    let bytes = svg.as_bytes();
    let mut i = 0;
    let check_entities = |text: &str| {
        for (at, _) in text.match_indices('&') {
            let rest = &text[at..];
            let end = rest.find(';').unwrap_or_else(|| panic!("a bare & in {text:?}"));
            let name = &rest[1..end];
            assert!(
                ["amp", "lt", "gt", "quot", "apos"].contains(&name) || (name.starts_with('#') && name[1..].chars().all(|c| c.is_ascii_digit())),
                "unknown entity &{name}; in {text:?}"
            );
        }
    };
    for c in svg.chars() {
        let code = c as u32;
        assert!(code >= 0x20 || c == '\n' || c == '\t' || c == '\r', "control character U+{code:04X} in the SVG");
        assert!(c != '\u{FFFE}' && c != '\u{FFFF}');
    }
    while i < bytes.len() {
        if bytes[i] == b'<' {
            // Find the tag's end outside quotes.
            let mut j = i + 1;
            let mut quote = None;
            while j < bytes.len() {
                match (quote, bytes[j]) {
                    (None, b'"') => quote = Some(b'"'),
                    (Some(q), b) if b == q => quote = None,
                    (Some(_), b'<') => panic!("a < inside an attribute value at {j}: {}", &svg[i..(j + 20).min(svg.len())]),
                    (None, b'>') => break,
                    _ => {}
                }
                j += 1;
            }
            assert!(j < bytes.len(), "an unclosed tag at {i}");
            let tag = &svg[i + 1..j];
            check_entities(tag);
            if let Some(name) = tag.strip_prefix('/') {
                let open = stack.pop().unwrap_or_else(|| panic!("</{name}> closes nothing"));
                assert_eq!(open, name.trim(), "tags do not balance");
            } else if !tag.ends_with('/') {
                stack.push(tag.split_whitespace().next().unwrap().to_string());
            }
            i = j + 1;
        } else {
            let next = svg[i..].find('<').map_or(svg.len(), |n| i + n);
            let text = &svg[i..next];
            assert!(!text.contains('>'), "a raw > in text: {text:?}");
            check_entities(text);
            i = next;
        }
    }
    assert!(stack.is_empty(), "unclosed: {stack:?}");
}

#[test]
fn one_run_is_drawn_with_a_lane_per_call_as_the_golden_structure_says() {
    let svg = draw(&fixture("events.jsonl"), &["--run", "CASE-1"]);
    assert_well_formed(&svg);
    assert_eq!(structure(&svg), expected("one-run.expected"), "{svg}");
    // The kinds' shapes: a bar per wait, a circle per attempt, a diamond per check.
    assert_eq!(svg.matches("<circle cx").count() - 6, 6, "6 attempts (the legend has 6 circles)");
    assert_eq!(svg.matches(r#"data-kind="wait""#).count(), 2);
    assert!(svg.contains("run CASE-1 (13 events)"), "the title counts the run's events");
    // The wait bar spans its wait_ms on the axis: 400 ms of a 3.001 s span.
    let bar = svg.split(r#"data-kind="wait" data-label="retry 400 ms""#).nth(1).unwrap();
    let width: f64 = attribute(bar.split("<rect").nth(1).unwrap(), "width").unwrap().parse().unwrap();
    let plot = 1200.0 - 230.0 - 40.0;
    assert!((width - plot * 0.4 / 3.001).abs() < 0.2, "bar width {width}");
    // The tooltip carries the fields: the escalation's note, the replan's message.
    assert!(svg.contains("note: delete_asset was refused: 403 forbidden"));
    assert!(svg.contains("message: order_id must look like ORD-1234"));
}

#[test]
fn several_runs_are_drawn_with_a_lane_per_run() {
    let svg = draw(&fixture("events.jsonl"), &[]);
    assert_well_formed(&svg);
    assert_eq!(structure(&svg), expected("all-runs.expected"));
    assert!(svg.contains("2 runs (15 events)"));
}

#[test]
fn the_drawing_depends_only_on_the_events_not_on_the_order_of_the_lines() {
    let text = std::fs::read_to_string(fixture("events.jsonl")).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.reverse();
    let reversed = temp("reversed.jsonl");
    std::fs::write(&reversed, lines.join("\n")).unwrap();
    let a = draw(&fixture("events.jsonl"), &[]);
    let b = draw(&reversed, &[]);
    let _ = std::fs::remove_file(&reversed);
    // Every event has its own time here, so ts decides the order whatever the file's.
    assert_eq!(a, b, "ts going backwards is drawn in time order");
    assert_eq!(a, draw(&fixture("events.jsonl"), &[]), "the same input gives the same bytes");
}

#[test]
fn text_from_the_log_cannot_inject_markup() {
    let hostile = [
        serde_json::json!({"event": "agent_retry.attempt", "ts": 1.0e9, "run": "R</text><script>alert(1)</script>", "call": 1, "tool": "t\"><foreignObject>",
                           "attempt": 1, "outcome": "x]]><!--", "action": "retry\" onload=\"alert(2)", "class": "&amp; &lt;"}),
        serde_json::json!({"event": "agent_retry.escalation", "ts": 1.0e9 + 1.0, "run": "R</text><script>alert(1)</script>", "call": 1, "tool": "t",
                           "reason": "<svg onload=alert(3)>", "note": "nul\u{0000}bell\u{0007}esc\u{001b}\u{FFFF} 'quoted' & done"}),
        serde_json::json!({"event": "agent_retry.policy_update", "ts": 1.0e9 + 2.0, "message": "<!DOCTYPE x [<!ENTITY e SYSTEM \"file:///etc/passwd\">]>"}),
    ];
    let log = temp("hostile.jsonl");
    std::fs::write(&log, hostile.iter().map(|v| v.to_string()).collect::<Vec<_>>().join("\n")).unwrap();
    let svg = draw(&log, &[]);
    let _ = std::fs::remove_file(&log);
    assert_well_formed(&svg);
    for raw in ["<script", "<foreignObject", "<svg onload", "<!DOCTYPE", "<!ENTITY", "<!--", "onload=\"alert", "\u{0000}", "\u{0007}", "\u{001b}"] {
        assert!(!svg.contains(raw), "{raw:?} reached the SVG unescaped");
    }
    assert!(svg.contains("R&lt;/text&gt;&lt;script&gt;alert(1)&lt;/script&gt;"), "the run id is kept, escaped");
    assert!(svg.contains("&amp;amp; &amp;lt;"), "an entity in the input is text, not an entity");
    assert!(svg.contains("escalated: &lt;svg onload=alert(3)&gt;"));
    assert!(svg.contains("&apos;quoted&apos; &amp; done"));
    assert_eq!(svg.matches("<svg").count(), 1);
}

#[test]
fn malformed_lines_are_counted_and_skipped_and_the_good_lines_are_drawn() {
    let good = |attempt: u32, ts: f64| {
        format!(
            r#"{{"event": "agent_retry.attempt", "ts": {ts}, "run": "R", "call": 1, "tool": "t", "attempt": {attempt}, "outcome": "ok {attempt}", "action": "succeed"}}"#
        )
    };
    let mut input: Vec<u8> = Vec::new();
    let mut line = |bytes: &[u8]| {
        input.extend_from_slice(bytes);
        input.push(b'\n');
    };
    line(good(1, 1.0e9).as_bytes());
    line(br#"{"event": "agent_retry.attempt", "ts": 1000000001, "run": "R", "#); // cut
    line(&[0xff, 0xfe, b'{', 0xc3, 0x28, b'}']); // not UTF-8
    line(b"");
    line(b"[1, 2, 3]");
    line(b"42");
    line(br#"{"event": 7, "run": "R"}"#);
    line(br#"{"event": "agent_retry.attempt", "run": {"nested": true}, "ts": "soon", "attempt": {"x": 1}, "outcome": ["a"], "action": null}"#);
    line(br#"{"event": "agent_retry.wait", "run": "R", "ts": 1000000002, "wait_ms": -5, "why": "retry"}"#);
    line(br#"{"event": "agent_retry.wait", "run": "R", "ts": 1000000002, "wait_ms": 1e308, "why": "retry"}"#);
    line(br#"{"event": "agent_retry.attempt", "run": "R", "ts": 1e300, "call": 1, "tool": "t", "attempt": 9, "outcome": "far future"}"#);
    // A 2 MiB line (past the 1 MiB cap) between good lines.
    let mut long = br#"{"event": "agent_retry.attempt", "run": "R", "outcome": ""#.to_vec();
    long.extend(std::iter::repeat_n(b'x', 2 << 20));
    long.extend_from_slice(br#""}"#);
    line(&long);
    line(good(2, 1.0e9 + 3.0).as_bytes());
    // A last line with no newline, past the cap.
    input.extend(std::iter::repeat_n(b'{', (1 << 20) + 10));

    let reader = BufReader::with_capacity(8192, input.as_slice());
    let timeline = timeline::read_events(reader, None).unwrap();
    let s = &timeline.stats;
    assert_eq!(s.lines, 14, "{s:?}");
    assert_eq!(s.too_long, 2, "{s:?}");
    assert_eq!(s.malformed, 2, "the cut line and the non-UTF-8 one: {s:?}");
    assert_eq!(s.not_ours, 4, "empty, array, number, event not a string: {s:?}");
    let runs: Vec<&str> = timeline.runs.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(runs, ["R", r#"{"nested":true}"#], "a run id of the wrong type is printed, not lost");
    let labels: Vec<&str> = timeline.runs[0].events.iter().map(|e| e.label.as_str()).collect();
    // The waits of -5 ms and of 1e308 ms have no usable length; 1e300 is no
    // time: that event takes its predecessor's in the file (the second wait's).
    assert_eq!(labels, ["ok 1", "retry ?", "retry ?", "far future", "ok 2"]);
    assert_eq!(s.untimed, 2, "ts \"soon\" and ts 1e300: {s:?}");
    assert!(timeline.runs[0].events.iter().all(|e| e.ts.is_some_and(f64::is_finite)));

    // And through the command line: it draws, well formed.
    let log = temp("malformed.jsonl");
    std::fs::write(&log, &input).unwrap();
    let svg = draw(&log, &[]);
    let _ = std::fs::remove_file(&log);
    assert_well_formed(&svg);
    assert!(svg.contains(r#"data-label="ok 2""#));
}

#[test]
fn events_without_a_time_or_fields_still_draw() {
    let input = concat!(
        r#"{"event": "agent_retry.attempt", "run": "R"}"#,
        "\n",
        r#"{"event": "agent_retry.escalation", "run": "R"}"#,
        "\n",
        r#"{"event": "agent_retry.status_check", "run": "R"}"#,
        "\n"
    );
    let output = run(&["timeline", "-"], Some(input.as_bytes()));
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let svg = String::from_utf8(output.stdout).unwrap();
    assert_well_formed(&svg);
    assert_eq!(structure(&svg), ["lane run", "attempt | attempt ?", "escalation | escalated: ?", "status-check | check: ?"]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("3 without a time"));
}

#[test]
fn a_run_that_is_not_in_the_log_is_an_error_naming_the_runs_seen() {
    let output = run(&["timeline", fixture("events.jsonl").to_str().unwrap(), "--run", "CASE-404"], None);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("CASE-404") && stderr.contains("CASE-1, CASE-2"), "{stderr}");
    let output = run(&["timeline", "-"], Some(b"just text\n{\"level\": \"INFO\"}\n"));
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("no agent_retry.* events"));
    let output = run(&["timeline", "/nonexistent/log.jsonl"], None);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot open /nonexistent/log.jsonl"));
}

/// Generated JSON lines, never held whole: `runs` runs round robin, `lines` in all.
struct Generated {
    lines: u64,
    runs: u64,
    next: u64,
    pending: Vec<u8>,
    at: usize,
}

impl Read for Generated {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.at == self.pending.len() {
            if self.next == self.lines {
                return Ok(0);
            }
            let n = self.next;
            self.next += 1;
            self.pending = format!(
                r#"INFO:agent_retry_policy.mcp:{{"event": "agent_retry.attempt", "ts": {:.3}, "run": "RUN-{}", "policy": "agent-retry:policy@0.7.0 wasm 1a2b3c4d5e6f", "step": {n}, "call": {n}, "tool": "lookup_order", "attempt": 1, "key": null, "outcome": "http 503", "class": "transient", "rule": "http-5xx", "action": "retry", "delay_ms": 200, "hint_ms": null, "escalation": null, "reason": "{}"}}"#,
                1.0e9 + n as f64 * 0.001,
                n % self.runs,
                "r".repeat(200)
            )
            .into_bytes();
            self.pending.push(b'\n');
            self.at = 0;
        }
        let n = out.len().min(self.pending.len() - self.at);
        out[..n].copy_from_slice(&self.pending[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// The process's peak resident memory (VmHWM), in KiB.
fn peak_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_huge_stream_is_read_in_one_pass_with_bounded_memory() {
    // 300,000 lines of ~560 bytes (~170 MB) over 150 runs: past both caps.
    let (lines, runs) = (300_000u64, 150u64);
    let before = peak_kib();
    let reader = BufReader::new(Generated { lines, runs, next: 0, pending: Vec::new(), at: 0 });
    let started = std::time::Instant::now();
    let timeline = timeline::read_events(reader, None).unwrap();
    let elapsed = started.elapsed();
    let grew_mib = (peak_kib().saturating_sub(before)) / 1024;
    let (max_runs, max_events) = (timeline::MAX_RUNS as u64, timeline::MAX_EVENTS_PER_RUN as u64);
    assert_eq!(timeline.stats.lines, lines);
    assert_eq!(timeline.runs.len() as u64, max_runs);
    assert!(timeline.runs.iter().all(|r| r.events.len() as u64 == max_events && r.dropped == lines / runs - max_events));
    assert_eq!(timeline.stats.dropped_events, max_runs * (lines / runs - max_events), "past the per-run cap, counted");
    assert_eq!(timeline.stats.dropped_runs_events, (runs - max_runs) * (lines / runs), "the runs past the cap, counted");
    // What is kept is capped (100 runs x 1,000 events, a detail cut to 600
    // characters): the peak grows by about 100 MiB however long the input.
    assert!(grew_mib < 256, "reading grew the peak memory by {grew_mib} MiB");
    eprintln!("{lines} lines read in {elapsed:?}, peak memory +{grew_mib} MiB");

    // One run of many events: cut at the per-run cap, the rest counted and named.
    let reader = BufReader::new(Generated { lines: 50_000, runs: 1, next: 0, pending: Vec::new(), at: 0 });
    let timeline = timeline::read_events(reader, Some("RUN-0")).unwrap();
    assert_eq!(timeline.runs[0].events.len(), timeline::MAX_EVENTS_PER_RUN);
    assert_eq!(timeline.runs[0].dropped, 50_000 - timeline::MAX_EVENTS_PER_RUN as u64);
    let svg = timeline::render_svg(&timeline);
    assert!(svg.contains("+49000 events not drawn"));
    assert_eq!(svg.matches(r#"data-kind="attempt""#).count(), timeline::MAX_EVENTS_PER_RUN);
}

#[test]
fn rfc3339_times_from_tracing_lines_are_read() {
    let line = |ts: &str| format!(r#"{{"timestamp": "{ts}", "event": "agent_retry.attempt", "run": "R", "outcome": "{ts}"}}"#);
    let input =
        [line("2025-12-03T00:00:02.5Z"), line("2025-12-03T01:00:03+01:00"), line("2025-12-03T00:00:01.000000001Z"), line("2025-13-03T00:00:00Z")].join("\n");
    let timeline = timeline::read_events(input.as_bytes(), None).unwrap();
    let times: Vec<(&str, f64)> = timeline.runs[0].events.iter().map(|e| (e.label.as_str(), e.ts.unwrap())).collect();
    assert_eq!(timeline.stats.untimed, 1, "month 13 is no time");
    // The bad one takes its predecessor's time in the file (00:00:01), and
    // equal times keep the file's order; +01:00 is read as an offset.
    assert_eq!(
        times,
        [
            ("2025-12-03T00:00:01.000000001Z", 1_764_720_001.0),
            ("2025-13-03T00:00:00Z", 1_764_720_001.0),
            ("2025-12-03T00:00:02.5Z", 1_764_720_002.5),
            ("2025-12-03T01:00:03+01:00", 1_764_720_003.0),
        ]
    );
}

#[test]
fn a_crowded_lane_keeps_the_telling_labels_and_drops_the_rest_to_tooltips() {
    // Ten successes and an escalation in the same millisecond: three label rows.
    let mut lines: Vec<String> = (0..10)
        .map(|i| {
            format!(r#"{{"event": "agent_retry.attempt", "ts": 1000000000.000, "run": "R", "call": {i}, "tool": "t", "outcome": "ok", "action": "succeed"}}"#)
        })
        .collect();
    lines.push(r#"{"event": "agent_retry.escalation", "ts": 1000000000.000, "run": "R", "call": 9, "reason": "permission-denied"}"#.into());
    lines.push(r#"{"event": "agent_retry.attempt", "ts": 1000000001.000, "run": "S", "call": 1, "outcome": "ok", "action": "succeed"}"#.into());
    let output = run(&["timeline", "-"], Some(lines.join("\n").as_bytes()));
    assert!(output.status.success());
    let svg = String::from_utf8(output.stdout).unwrap();
    assert_well_formed(&svg);
    let lane = svg.split(r#"<g class="lane" data-lane="R">"#).nth(1).unwrap().split(r#"<g class="lane""#).next().unwrap();
    assert_eq!(lane.matches(r#"<g class="event""#).count(), 11, "every event has its mark");
    let texts: Vec<&str> = lane.split("<text x=").skip(1).map(|t| t.split('>').nth(1).unwrap().trim_end_matches("</text")).collect();
    assert_eq!(texts.len(), 3, "one label per row: {texts:?}");
    assert_eq!(texts.iter().filter(|t| **t == "escalated: permission-denied").count(), 1, "{texts:?}");
    assert_eq!(lane.matches(r#"data-label="ok""#).count(), 10, "the dropped labels stay in data-label");
}
