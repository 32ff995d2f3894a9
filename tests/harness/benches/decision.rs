//! What a decision costs in the Rust host: the scenario of `docs/benchmark.md`
//! (a keyed write failing 503 then succeeding, a read throttled with
//! `Retry-After` then succeeding, a read succeeding at once), reported per
//! successful call and per failed attempt, beside its baselines measured in the
//! same run: the no-op boundary floor (the same loop against a component that
//! does nothing, `make noop`) and the native core. A benchmark, not a test.
//!
//!     cargo bench -p agent-retry-harness --bench decision

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use agent_retry_host::component::types::{ActionKind, FailureKind, Observation};
use agent_retry_host::{Admission, EmbeddedAccounts, EntropySource, HostServices, Outcome, PolicyComponent, PolicyInstance, default_wasm_path};
use agent_retry_policy::account::NoAccountBudget;
use agent_retry_policy::classify::FailureView;
use agent_retry_policy::config::Config;
use agent_retry_policy::run::{Act, At, Run};
use agent_retry_policy::{readable, types as core};

/// The core's view of a failure as a host reports it.
fn view<'a>(kind: &'a core::FailureKind, headers: &'a [(&'a str, &'a str)], body: &'a str) -> FailureView<'a> {
    FailureView { kind, headers, body, structured_content: None, session_id_sent: false, delivery: core::Delivery::AnswerStarted }
}

/// Iterations of the scenario per round; a run is replaced every `PER_RUN`.
const ITERATIONS: u32 = 20_000;
const PER_RUN: u32 = 1_000;
const ROUNDS: usize = 15;
const CONFIG: &str = r#"{"max-steps-per-run": 1000000, "max-retries-per-run": 100000,
    "tools": {"issue_refund": {"effect": "write"}, "lookup_order": {"effect": "read"}}}"#;
const NOW_MS: u64 = 1_764_460_800_000;
const KEY: &str = "ar1-0123456789abcdef0123456789abcdef";

fn unavailable() -> Observation {
    Observation::new(FailureKind::HttpStatus(503), &[], "upstream unavailable")
}

fn throttled() -> Observation {
    Observation::new(FailureKind::HttpStatus(429), &[("retry-after".into(), "1".into())], "slow down")
}

/// A call of the scenario: its tool and key.
fn request(tool: &'static str, key: Option<&'static str>) -> (&'static str, Option<&'static str>) {
    (tool, key)
}

/// One way of making the scenario's calls: `scenario` runs all three calls,
/// `success` only the third, each `n` times; both return ns per iteration.
trait Subject {
    fn scenario(&mut self, n: u32) -> f64;
    fn success(&mut self, n: u32) -> f64;
}

/// The component's run path (`begin-call`, `record-failure`, `record-success`: verdicts only).
struct Flat {
    instance: PolicyInstance,
    /// Whether answers are checked: the no-op component answers fixed values.
    check: bool,
}

impl Flat {
    fn new(component: &PolicyComponent, check: bool) -> Self {
        let instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(1))).unwrap();
        Flat { instance, check }
    }

    fn iterations(&mut self, n: u32, with_failures: bool) -> f64 {
        let policy = self.instance.load_policy(CONFIG).unwrap().unwrap();
        let (refund, lookup, keyed) = (request("issue_refund", Some(KEY)), request("lookup_order", None), with_failures);
        let (unavailable, throttled) = (unavailable(), throttled());
        let started = Instant::now();
        let mut run = self.instance.start_run(&policy, "bench").unwrap().unwrap();
        for i in 0..n {
            if i % PER_RUN == PER_RUN - 1 {
                self.instance.drop_run(run).unwrap();
                run = self.instance.start_run(&policy, "bench").unwrap().unwrap();
            }
            let now = NOW_MS + u64::from(i);
            if keyed {
                for (call, failure) in [(&refund, &unavailable), (&lookup, &throttled)] {
                    let start = self.instance.begin_call(&run, None, call.0, call.1, None, now).unwrap().unwrap();
                    let verdict = self.instance.record_failure(&run, start.call_id, 1, failure, None, now, Some(u64::from(i))).unwrap().unwrap();
                    if self.check {
                        assert_eq!(verdict.action, ActionKind::Retry);
                    }
                    let done = self.instance.record_success(&run, start.call_id, 2, now).unwrap().unwrap();
                    if self.check {
                        assert_eq!(done.action, ActionKind::Succeed);
                    }
                }
            }
            let start = self.instance.begin_call(&run, None, lookup.0, lookup.1, None, now).unwrap().unwrap();
            let done = self.instance.record_success(&run, start.call_id, 1, now).unwrap().unwrap();
            if self.check {
                assert_eq!(done.action, ActionKind::Succeed);
            }
        }
        self.instance.drop_run(run).unwrap();
        self.instance.drop_policy(policy).unwrap();
        started.elapsed().as_nanos() as f64 / f64::from(n)
    }
}

impl Subject for Flat {
    fn scenario(&mut self, n: u32) -> f64 {
        self.iterations(n, true)
    }

    fn success(&mut self, n: u32) -> f64 {
        self.iterations(n, false)
    }
}

/// The component's calls with their words (every verdict followed by
/// `last-decision`, a refused call by `escalation`): what a host that logs
/// every decision pays.
struct Rich(PolicyInstance);

impl Rich {
    fn iterations(&mut self, n: u32, with_failures: bool) -> f64 {
        let instance = &mut self.0;
        let policy = instance.load_policy(CONFIG).unwrap().unwrap();
        let (refund, lookup) = (request("issue_refund", Some(KEY)), request("lookup_order", None));
        let (unavailable, throttled) = (Outcome::Failure(unavailable()), Outcome::Failure(throttled()));
        let started = Instant::now();
        let mut run = instance.start_run(&policy, "bench").unwrap().unwrap();
        let call_id = |admission: Admission| match admission {
            Admission::Send(ticket) => ticket.call_id,
            other => panic!("{other:?}"),
        };
        for i in 0..n {
            if i % PER_RUN == PER_RUN - 1 {
                instance.drop_run(run).unwrap();
                run = instance.start_run(&policy, "bench").unwrap().unwrap();
            }
            let now = NOW_MS + u64::from(i);
            if with_failures {
                for (call, failure) in [(&refund, &unavailable), (&lookup, &throttled)] {
                    let id = call_id(instance.begin(&run, None, call.0, call.1, None, now).unwrap().unwrap());
                    std::hint::black_box(instance.decide(&run, id, 1, failure, None, now, Some(u64::from(i))).unwrap().unwrap());
                    std::hint::black_box(instance.decide(&run, id, 2, &Outcome::Success, None, now, None).unwrap().unwrap());
                }
            }
            let id = call_id(instance.begin(&run, None, lookup.0, lookup.1, None, now).unwrap().unwrap());
            std::hint::black_box(instance.decide(&run, id, 1, &Outcome::Success, None, now, None).unwrap().unwrap());
        }
        instance.drop_run(run).unwrap();
        instance.drop_policy(policy).unwrap();
        started.elapsed().as_nanos() as f64 / f64::from(n)
    }
}

impl Subject for Rich {
    fn scenario(&mut self, n: u32) -> f64 {
        self.iterations(n, true)
    }

    fn success(&mut self, n: u32) -> f64 {
        self.iterations(n, false)
    }
}

/// The native core, lean (`Run::begin`, `record_failure`, `record_success`),
/// or with its words (the readable form: `readable::begin_call`,
/// `readable::record_outcome`, which read the last decision).
struct Native {
    rich: bool,
}

impl Native {
    fn iterations(&self, n: u32, with_failures: bool) -> f64 {
        let config = Arc::new(Config::from_json(CONFIG).unwrap());
        let unavailable = core::FailureKind::HttpStatus(503);
        let throttled = core::FailureKind::HttpStatus(429);
        let hint = [("retry-after", "1")];
        let failures =
            [("issue_refund", Some(KEY), view(&unavailable, &[], "upstream unavailable")), ("lookup_order", None, view(&throttled, &hint, "slow down"))];
        let rich_failures = [
            core::Outcome::Failure(core::Failure {
                kind: unavailable,
                headers: vec![],
                body: "upstream unavailable".into(),
                structured_content: None,
                session_id_sent: false,
                delivery: core::Delivery::AnswerStarted,
            }),
            core::Outcome::Failure(core::Failure {
                kind: throttled,
                headers: vec![("retry-after".into(), "1".into())],
                body: "slow down".into(),
                structured_content: None,
                session_id_sent: false,
                delivery: core::Delivery::AnswerStarted,
            }),
        ];
        let budget = &mut NoAccountBudget;
        let begin = |run: &mut Run, tool: &str, key: Option<&str>, now| {
            let start = if self.rich {
                let request = core::CallRequest { server: None, tool: tool.into(), idempotency_key: key.map(String::from), hints: None };
                match readable::begin_call(run, &request, now, &mut NoAccountBudget).unwrap() {
                    core::Admission::Send(t) => t.call_id,
                    other => panic!("{other:?}"),
                }
            } else {
                match run.begin(None, tool.into(), key.map(String::from), None, now, &mut NoAccountBudget).unwrap() {
                    agent_retry_policy::run::Start::Send(t) => t.call_id,
                    other => panic!("{other:?}"),
                }
            };
            std::hint::black_box(start)
        };
        let started = Instant::now();
        let mut run = Run::new(Arc::clone(&config), "bench");
        for i in 0..n {
            if i % PER_RUN == PER_RUN - 1 {
                run = Run::new(Arc::clone(&config), "bench");
            }
            let now = NOW_MS + u64::from(i);
            if with_failures {
                for ((tool, key, failure), rich_failure) in failures.iter().zip(&rich_failures) {
                    let id = begin(&mut run, tool, *key, now);
                    if self.rich {
                        std::hint::black_box(
                            readable::record_outcome(&mut run, id, 1, rich_failure, At { now_ms: now, time_left_ms: None, entropy: u64::from(i) }, budget)
                                .unwrap(),
                        );
                        std::hint::black_box(
                            readable::record_outcome(&mut run, id, 2, &core::Outcome::Success, At { now_ms: now, time_left_ms: None, entropy: 0 }, budget)
                                .unwrap(),
                        );
                    } else {
                        let verdict = run.record_failure(id, 1, failure, At { now_ms: now, time_left_ms: None, entropy: u64::from(i) }, budget).unwrap();
                        assert!(matches!(verdict.act, Act::Retry { .. }));
                        std::hint::black_box(run.record_success(id, 2, now, budget).unwrap());
                    }
                }
            }
            let id = begin(&mut run, "lookup_order", None, now);
            if self.rich {
                std::hint::black_box(
                    readable::record_outcome(&mut run, id, 1, &core::Outcome::Success, At { now_ms: now, time_left_ms: None, entropy: 0 }, budget).unwrap(),
                );
            } else {
                std::hint::black_box(run.record_success(id, 1, now, budget).unwrap());
            }
        }
        started.elapsed().as_nanos() as f64 / f64::from(n)
    }
}

impl Subject for Native {
    fn scenario(&mut self, n: u32) -> f64 {
        self.iterations(n, true)
    }

    fn success(&mut self, n: u32) -> f64 {
        self.iterations(n, false)
    }
}

/// The fuel each call of the scenario burns over one run of `PER_RUN`
/// iterations, by call (the two failures apart), as `bench.py` and `npm run
/// bench` print it: (name, median, most).
fn fuel_per_call(component: &PolicyComponent) -> Vec<(&'static str, u64, u64)> {
    let mut instance = component.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(1))).unwrap();
    let policy = instance.load_policy(CONFIG).unwrap().unwrap();
    let run = instance.start_run(&policy, "fuel").unwrap().unwrap();
    let names = ["begin-call", "record-failure 503", "record-failure 429", "record-success"];
    let mut fuel: Vec<Vec<u64>> = vec![Vec::new(); names.len()];
    let (refund, lookup) = (request("issue_refund", Some(KEY)), request("lookup_order", None));
    let (unavailable, throttled) = (unavailable(), throttled());
    for i in 0..PER_RUN {
        let now = NOW_MS + u64::from(i);
        for (call, failure, slot) in [(&refund, &unavailable, 1), (&lookup, &throttled, 2)] {
            let start = instance.begin_call(&run, None, call.0, call.1, None, now).unwrap().unwrap();
            fuel[0].push(instance.fuel_used_by_last_call());
            let verdict = instance.record_failure(&run, start.call_id, 1, failure, None, now, Some(u64::from(i))).unwrap().unwrap();
            fuel[slot].push(instance.fuel_used_by_last_call());
            instance.record_success(&run, start.call_id, verdict.attempt + 1, now).unwrap().unwrap();
            fuel[3].push(instance.fuel_used_by_last_call());
        }
        let start = instance.begin_call(&run, None, lookup.0, lookup.1, None, now).unwrap().unwrap();
        fuel[0].push(instance.fuel_used_by_last_call());
        instance.record_success(&run, start.call_id, 1, now).unwrap().unwrap();
        fuel[3].push(instance.fuel_used_by_last_call());
    }
    names
        .iter()
        .zip(fuel)
        .map(|(name, mut units)| {
            units.sort_unstable();
            (*name, units[units.len() / 2], units[units.len() - 1])
        })
        .collect()
}

/// Per successful call and per failed attempt, in ns (docs/benchmark.md).
#[derive(Clone, Copy)]
struct Figures {
    success_ns: f64,
    failed_attempt_ns: f64,
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn main() {
    let wasm = PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first");
    let noop_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/noop/agent_retry_noop.wasm");
    let noop = PolicyComponent::from_file(&noop_path).expect("run `make noop` first");
    let mut subjects: Vec<(&str, Box<dyn Subject>)> = vec![
        ("component, verdicts (wasmtime 48, fuel on)", Box::new(Flat::new(&wasm, true))),
        (
            "component, with every decision's words",
            Box::new(Rich(wasm.instantiate(HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(1))).unwrap())),
        ),
        ("no-op floor: the same calls, no work", Box::new(Flat::new(&noop, false))),
        ("native core, lean", Box::new(Native { rich: false })),
        ("native core, with every decision's words", Box::new(Native { rich: true })),
    ];
    // Rounds interleave the subjects, so that a slower moment of the machine
    // falls on all of them; the first round warms up and is dropped.
    let mut samples: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); subjects.len()];
    for round in 0..=ROUNDS {
        for (i, (_, subject)) in subjects.iter_mut().enumerate() {
            let scenario = subject.scenario(ITERATIONS);
            let success = subject.success(ITERATIONS);
            if round > 0 {
                samples[i].0.push(scenario);
                samples[i].1.push(success);
            }
        }
    }
    // The failed attempt is a difference of two timings, so it moves more than
    // either; the flat path and the floor of one round ran seconds apart, and
    // their ratio round by round shows how far one run's ratio can be trusted.
    let failed_attempt_ns = |(scenario, success): &(Vec<f64>, Vec<f64>)| -> Vec<f64> {
        scenario.iter().zip(success).map(|(scenario, success)| ((scenario - 3.0 * success) / 2.0).max(1.0)).collect()
    };
    let mut per_round: Vec<f64> = failed_attempt_ns(&samples[0]).iter().zip(failed_attempt_ns(&samples[2])).map(|(flat, floor)| flat / floor).collect();
    per_round.sort_by(f64::total_cmp);
    let figures: Vec<Figures> = samples
        .into_iter()
        .map(|(scenario, success)| {
            let (scenario, success) = (median(scenario), median(success));
            // Three successful calls and two failed attempts make the scenario.
            Figures { success_ns: success, failed_attempt_ns: ((scenario - 3.0 * success) / 2.0).max(0.0) }
        })
        .collect();
    println!("docs/benchmark.md's scenario, median of {ROUNDS} rounds of {ITERATIONS} iterations:");
    println!("  {:<46} {:>16} {:>18}", "", "successful call", "failed attempt");
    for ((name, _), f) in subjects.iter().zip(&figures) {
        println!("  {name:<46} {:>13.0} ns {:>15.0} ns", f.success_ns, f.failed_attempt_ns);
    }
    let (flat, rich, floor, native, native_rich) = (figures[0], figures[1], figures[2], figures[3], figures[4]);
    println!("ratios:");
    println!("  failed attempt, verdicts / no-op floor        {:>6.2}x  (target: at most 1.5x)", flat.failed_attempt_ns / floor.failed_attempt_ns);
    let quartile = |q: usize| per_round[(per_round.len() - 1) * q / 4];
    println!(
        "    the same, round by round: median {:.2}x, middle half {:.2}x to {:.2}x, all {:.2}x to {:.2}x",
        quartile(2),
        quartile(1),
        quartile(3),
        quartile(0),
        quartile(4)
    );
    println!("  successful call, verdicts / no-op floor       {:>6.2}x", flat.success_ns / floor.success_ns);
    println!("  failed attempt, with words / verdicts         {:>6.2}x", rich.failed_attempt_ns / flat.failed_attempt_ns);
    println!("  failed attempt, verdicts / native core        {:>6.2}x", flat.failed_attempt_ns / native.failed_attempt_ns);
    println!("  failed attempt, native words / native lean    {:>6.2}x", native_rich.failed_attempt_ns / native.failed_attempt_ns);
    println!("  successful call, native words / native lean   {:>6.2}x", native_rich.success_ns / native.success_ns);
    let fuel: Vec<String> = fuel_per_call(&wasm).iter().map(|(name, median, most)| format!("{name} {median} / {most}")).collect();
    println!("fuel per call over a run of {PER_RUN} iterations (median / most): {}", fuel.join(", "));
}
