//! The Rust host's integration tests that need a process of their own, one
//! binary with no harness (each was a binary of its own, and each compiled
//! rmcp, tokio and the host's generics again: about 50 s of a CI core apiece):
//! - the binary is its own stdio MCP server (`--serve-probe`, `--serve-demo
//!   FILE`), where libtest would write to the server's stdout;
//! - the log readers set tracing's per-thread subscriber, which misses events
//!   whose callsites another thread registered first: here nothing else runs.
//!
//! `main` runs the tests one after another, each in a runtime of the flavour it
//! was written for, and prints libtest's lines; a panic fails the binary. It
//! reads libtest's filters, `--exact`, `--skip` and `--list`.

mod lines;
mod mcp_probe;
mod outcome_words;
mod shared_connection;

use std::future::Future;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == mcp_probe::SERVE) {
        return runtime(Flavour::MultiThread).block_on(mcp_probe::serve_probe());
    }
    if let Some(i) = args.iter().position(|a| a == shared_connection::SERVE) {
        return runtime(Flavour::MultiThread).block_on(shared_connection::serve_demo(std::path::Path::new(&args[i + 1])));
    }
    let selection = Selection::from_args(&args[1..]);
    let mut ran = 0;
    let mut run = |name: &str, flavour: Flavour, test: &dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = ()>>>| {
        if !selection.wants(name) {
        } else if selection.list {
            println!("{name}: test");
        } else {
            runtime(flavour).block_on(test());
            println!("test {name} ... ok");
            ran += 1;
        }
    };
    use Flavour::{CurrentThread, MultiThread};
    run("mcp_probe::tools_without_hints_are_warned_about_once_per_connection", MultiThread, &|| {
        Box::pin(mcp_probe::tools_without_hints_are_warned_about_once_per_connection())
    });
    run("mcp_probe::a_traced_call_sends_its_attempt_spans_traceparent", MultiThread, &|| {
        Box::pin(mcp_probe::a_traced_call_sends_its_attempt_spans_traceparent())
    });
    run("outcome_words::the_same_observation_has_the_same_outcome_words_over_mcp_and_with_policy", CurrentThread, &|| {
        Box::pin(outcome_words::the_same_observation_has_the_same_outcome_words_over_mcp_and_with_policy())
    });
    run("shared_connection::two_concurrent_runs_share_one_stdio_server_process", MultiThread, &|| {
        Box::pin(shared_connection::two_concurrent_runs_share_one_stdio_server_process())
    });
    run("shared_connection::a_failure_on_an_old_session_leaves_the_new_one_alone", MultiThread, &|| {
        Box::pin(shared_connection::a_failure_on_an_old_session_leaves_the_new_one_alone())
    });
    run("shared_connection::a_closed_connection_stays_closed", MultiThread, &|| Box::pin(shared_connection::a_closed_connection_stays_closed()));
    run("shared_connection::a_run_is_charged_only_for_the_sessions_it_set_up", MultiThread, &|| {
        Box::pin(shared_connection::a_run_is_charged_only_for_the_sessions_it_set_up())
    });
    if !selection.list {
        println!("\ntest result: ok. {ran} passed; 0 failed");
    }
}

/// The tests libtest's arguments name: filters (`--exact` for whole names),
/// `--skip`, `--list`; its other options are taken with their values and ignored.
struct Selection {
    filters: Vec<String>,
    skips: Vec<String>,
    exact: bool,
    list: bool,
}

impl Selection {
    fn from_args(args: &[String]) -> Selection {
        let mut selection = Selection { filters: vec![], skips: vec![], exact: false, list: false };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--exact" => selection.exact = true,
                "--list" => selection.list = true,
                "--skip" => selection.skips.extend(args.next().cloned()),
                "--test-threads" | "--color" | "--format" | "--logfile" | "-Z" => {
                    args.next();
                }
                flag if flag.starts_with('-') => {}
                filter => selection.filters.push(filter.to_string()),
            }
        }
        selection
    }

    fn wants(&self, name: &str) -> bool {
        let matches = |pattern: &String| if self.exact { name == pattern } else { name.contains(pattern.as_str()) };
        (self.filters.is_empty() || self.filters.iter().any(matches)) && !self.skips.iter().any(matches)
    }
}

/// The runtime `#[tokio::main]` (multi-thread) or `#[tokio::test]` (current thread) gave the test.
enum Flavour {
    MultiThread,
    CurrentThread,
}

fn runtime(flavour: Flavour) -> tokio::runtime::Runtime {
    match flavour {
        Flavour::MultiThread => tokio::runtime::Builder::new_multi_thread(),
        Flavour::CurrentThread => tokio::runtime::Builder::new_current_thread(),
    }
    .enable_all()
    .build()
    .unwrap()
}
