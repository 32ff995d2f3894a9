//! The fuzz targets on stable Rust, for CI: every file of `corpus/<target>/`,
//! then seeded mutations of them, through the same functions libFuzzer calls.
//! `FUZZ_REPLAY_MUTATIONS` sets the mutations per target (default below; `flat`
//! takes a twentieth, see [`replay_share`]); a
//! failing input is written to `artifacts/replay/<target>-<n>` to replay with
//! `cargo +nightly fuzz run <target> --features libfuzzer <file>`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::Instant;

use agent_retry_fuzz::TARGETS;
use agent_retry_fuzz::mutate::{Rng, mutate};

/// Mutations per target: the whole replay takes about 20 s of CPU in release.
const DEFAULT_MUTATIONS: usize = 50_000;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .filter(|e| e.path().is_file())
            .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap_or_default()))
            .collect(),
        Err(_) => Vec::new(),
    };
    out.sort();
    out
}

/// The fraction of `FUZZ_REPLAY_MUTATIONS` a target replays: a `flat` input
/// drives a whole run twice with header texts of up to 300 lines, the costliest
/// input of all, so it takes a twentieth and CI's replay keeps its time (the long
/// run and the component test cover it more).
fn replay_share(target: &str) -> usize {
    if target == "flat" { 20 } else { 1 }
}

/// Runs `body` on `input`; on a panic, saves the input and returns the message.
fn attempt(target: &str, body: fn(&[u8]), input: &[u8], label: &str) -> Result<(), String> {
    match catch_unwind(AssertUnwindSafe(|| body(input))) {
        Ok(()) => Ok(()),
        Err(panic) => {
            let message = panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
            let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("artifacts/replay");
            let _ = std::fs::create_dir_all(&dir);
            let path = dir.join(format!("{target}-{}", label.replace('/', "_")));
            let _ = std::fs::write(&path, input);
            Err(format!("{target} {label}: {message}\n    input saved to {}", path.display()))
        }
    }
}

#[test]
fn corpus_and_mutations() {
    let mutations: usize = std::env::var("FUZZ_REPLAY_MUTATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_MUTATIONS);
    let mut failures = Vec::new();
    for (target, body) in TARGETS {
        let started = Instant::now();
        let corpus = files(&corpus_dir().join(target));
        assert!(!corpus.is_empty(), "corpus/{target}/ is empty");
        for (name, input) in &corpus {
            if let Err(e) = attempt(target, *body, input, name) {
                failures.push(e);
            }
        }
        let mut rng = Rng(0x5EED_0000 + target.len() as u64);
        let mutations = mutations / replay_share(target);
        for i in 0..mutations {
            let (_, base) = &corpus[rng.below(corpus.len())];
            let (_, other) = &corpus[rng.below(corpus.len())];
            let input = mutate(base, other, &mut rng, 16 * 1024);
            if let Err(e) = attempt(target, *body, &input, &format!("mutation-{i}")) {
                failures.push(e);
                if failures.len() > 20 {
                    break;
                }
            }
        }
        eprintln!("{target}: {} corpus files and {mutations} mutations in {:.1} s", corpus.len(), started.elapsed().as_secs_f64());
    }
    assert!(failures.is_empty(), "{} inputs broke an invariant:\n{}", failures.len(), failures.join("\n"));
}

/// Runs a minimized reproducer of `corpus/regressions/` through its target with
/// the known bugs' invariants checked (`<target>--<bug>-<what>`): it passes once
/// the bug is fixed. Until then the test is ignored; `make -f fuzz/fuzz.mk
/// fuzz-regressions` runs them all.
fn regression(file: &str) {
    agent_retry_fuzz::set_strict(true);
    let path = corpus_dir().join("regressions").join(file);
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let target = file.split("--").next().unwrap_or("");
    let (_, body) = TARGETS.iter().find(|(name, _)| *name == target).unwrap_or_else(|| panic!("no target {target}"));
    body(&data);
}

#[test]
// Fixed (F1): the reproducer stays as a regression test.
fn f1_config_error_field_is_bounded() {
    regression("config--F1-unknown-field-echoed-whole");
}

#[test]
// Fixed (F1): the reproducer stays as a regression test.
fn f1_config_error_field_is_one_line() {
    regression("config--F1-field-path-spans-lines");
}

#[test]
// Fixed (F2): the reproducer stays as a regression test.
fn f2_json_unicode_escape_takes_four_hex_digits() {
    regression("json--F2-unicode-escape-plus-sign");
}

#[test]
// Fixed (F3): the reproducer stays as a regression test.
fn f3_classification_reason_is_bounded() {
    regression("tool_error--F3-identifier-with-long-prefix");
}

#[test]
// Fixed (F4): the reproducer stays as a regression test.
fn f4_header_problem_name_is_bounded() {
    regression("headers--F4-long-header-name-in-problem");
}

#[test]
// Fixed (F6): a task's own poll backoff (no pollInterval from the server) past
// max-hint-ms escalated server-wait-too-long with the backoff as the server's
// hint. Found by the `run` target's long run; the reproducer stays.
fn f6_a_task_poll_backoff_is_not_a_server_hint() {
    regression("run--F6-task-backoff-as-server-hint");
}
