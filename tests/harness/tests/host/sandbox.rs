//! The sandbox: bad components are typed load errors, a guest that traps or
//! runs away is stopped without hurting the host, and no input makes the guest trap.

use std::sync::Arc;

use agent_retry_host::component::types::{Action, ActionKind, CallStart, Decision, FailureKind, Observation, RunError, StatusCheckResult, TransportError};
use agent_retry_host::component::{PolicyInstance, RunHandle};
use agent_retry_host::{EmbeddedAccounts, EntropySource, HostServices, LoadError, Outcome, PolicyComponent, PolicyFault, default_wasm_path};

/// Begins a call of `tool` (with `key`); `None` when it was not admitted.
fn begin(instance: &mut PolicyInstance, run: &RunHandle, tool: &str, key: Option<&str>, now: u64) -> Result<Option<CallStart>, PolicyFault> {
    Ok(instance.begin_call(run, None, tool, key, None, now)?.ok().filter(|start| start.admitted))
}

/// Reports `outcome` and reads the decision in words.
fn decide(
    instance: &mut PolicyInstance,
    run: &RunHandle,
    call_id: u32,
    attempt: u32,
    outcome: &Outcome,
    now: u64,
    entropy: Option<u64>,
) -> Result<Result<Decision, RunError>, PolicyFault> {
    match instance.record(run, call_id, attempt, outcome, None, now, entropy)? {
        Ok(_) => Ok(Ok(instance.last_decision(run, call_id)?.expect("a decision right after its verdict"))),
        Err(error) => Ok(Err(error)),
    }
}

fn services() -> HostServices {
    HostServices::new(Arc::new(EmbeddedAccounts::new()), EntropySource::seeded(7))
}

fn component() -> PolicyComponent {
    PolicyComponent::from_file(&default_wasm_path()).expect("run `make wasm` first")
}

#[test]
fn garbage_bytes_are_an_invalid_component() {
    let err = PolicyComponent::from_bytes(b"\0asm\x01\0\0\0garbage").err().expect("must fail");
    assert!(matches!(err, LoadError::Invalid { .. }), "{err}");
    let err = PolicyComponent::from_bytes(b"hello").err().expect("must fail");
    assert!(err.to_string().starts_with("not a valid WebAssembly component"), "{err}");
}

#[test]
fn a_truncated_component_is_invalid() {
    let bytes = std::fs::read(default_wasm_path()).expect("run `make wasm` first");
    let err = PolicyComponent::from_bytes(&bytes[..bytes.len() / 2]).err().expect("must fail");
    assert!(matches!(err, LoadError::Invalid { .. }), "{err}");
}

#[test]
fn a_missing_file_says_how_to_build_it() {
    let err = PolicyComponent::from_file(std::path::Path::new("/nonexistent/policy.wasm")).err().expect("must fail");
    assert!(matches!(err, LoadError::Read { .. }));
    assert!(err.to_string().contains("make wasm"), "{err}");
}

/// The component with its policy export renamed to another contract version
/// (the same length, so the binary stays valid).
fn component_speaking(version: &str) -> Vec<u8> {
    let bytes = std::fs::read(default_wasm_path()).expect("run `make wasm` first");
    let (from, to) = ("agent-retry:policy/policy@0.9.0".as_bytes(), format!("agent-retry:policy/policy@{version}"));
    assert_eq!(from.len(), to.len());
    // The name appears in the export and in the wiring of the core module: rename every one.
    let mut out = bytes.clone();
    let mut renamed = 0;
    for at in 0..bytes.len().saturating_sub(from.len()) {
        if &bytes[at..at + from.len()] == from {
            out[at..at + from.len()].copy_from_slice(to.as_bytes());
            renamed += 1;
        }
    }
    assert!(renamed > 0, "the export name is in the binary");
    out
}

#[test]
fn a_component_of_another_contract_version_is_refused_naming_both() {
    // 0.8.0 is the contract before this one and 1.0.0 a later major: both are refused too.
    for other in ["1.0.0", "2.0.0", "0.8.0", "0.3.0"] {
        let err = PolicyComponent::from_bytes(&component_speaking(other)).err().expect("must be refused");
        assert!(matches!(err, LoadError::Incompatible { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains(&format!("agent-retry:policy@{other}")) && text.contains("agent-retry:policy@0.9.0"), "{text}");
    }
    // A patch release of the same contract is compatible.
    assert!(PolicyComponent::from_bytes(&component_speaking("0.9.9")).is_ok());
}

#[test]
fn the_component_imports_only_the_account_budget_the_shared_state_and_random() {
    let mut imports = component().imports();
    imports.sort();
    assert_eq!(
        imports,
        ["agent-retry:policy/account-budget@0.9.0", "agent-retry:policy/shared-state@0.9.0", "agent-retry:policy/types@0.9.0", "wasi:random/random@0.2.6"],
        "the README lists exactly these"
    );
}

#[test]
fn a_runaway_guest_is_stopped_and_the_host_goes_on() {
    // So little fuel that parsing a configuration cannot finish: the call traps.
    let starved = component().with_fuel_per_call(500).with_fuel_per_config_byte(0);
    let mut instance = starved.instantiate(services()).unwrap();
    let err = instance.load_policy("{}").err().expect("out of fuel must trap");
    assert_eq!(err, PolicyFault::OutOfFuel { fuel: 500 });
    // A trapped instance is not re-entered...
    assert!(instance.load_policy("{}").is_err());
    // ...and a fresh one from a normal component works.
    let mut fresh = component().instantiate(services()).unwrap();
    assert!(fresh.load_policy("{}").unwrap().is_ok());
}

#[test]
fn a_guest_that_asks_for_too_much_memory_traps_without_hurting_the_host() {
    // 80 MiB of configuration: the host refuses it before it crosses...
    let huge = format!("{{\"tools\": {{\"t\": {{\"effect\": \"{}\"}}}}}}", "x".repeat(80 << 20));
    let mut instance = component().instantiate(services()).unwrap();
    let refused = instance.load_policy(&huge).expect("no trap").err().expect("refused");
    assert_eq!(refused.kind, agent_retry_host::component::types::ConfigErrorKind::TooLarge, "{}", refused.message);
    assert!(instance.load_policy("{}").unwrap().is_ok(), "and the instance serves on");
    // ...and passed raw, it is more than the instance's 64 MiB memory cap: refused as that.
    use agent_retry_host::steps::Subject;
    let mut raw = agent_retry_host::dynamic::DynamicPolicy::new(&component()).unwrap();
    let err = raw.load_policy(&huge).expect_err("over the cap");
    assert!(err.contains("memory cap"), "{err}");
    let mut fresh = component().instantiate(services()).unwrap();
    assert!(fresh.load_policy("{}").unwrap().is_ok());
}

/// xorshift64*: deterministic garbage.
struct Garbage(u64);

impl Garbage {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn text(&mut self, max: usize) -> String {
        const PIECES: &[&str] = &[
            "1",
            "0",
            "-",
            ".",
            "e",
            "s",
            "ms",
            "h",
            "GMT",
            ",",
            ";",
            "=",
            "r",
            "t",
            "\"",
            " ",
            "\n",
            "é",
            "😀",
            "\0",
            "Sun",
            "Nov",
            "2025",
            "T",
            "Z",
            ":",
            "+",
            "x",
            "99999999999999999999",
        ];
        let len = (self.next() % max as u64) as usize;
        (0..len).map(|_| PIECES[(self.next() % PIECES.len() as u64) as usize]).collect()
    }
}

#[test]
fn garbage_failures_and_configs_never_trap_the_guest() {
    const HEADERS: &[&str] = &[
        "retry-after",
        "retry-after-ms",
        "ratelimit",
        "x-ratelimit-reset",
        "ratelimit-reset",
        "x-should-retry",
        "x-ratelimit-reset-requests",
        "x-ratelimit-remaining-requests",
        "anthropic-ratelimit-tokens-reset",
        "x-other",
    ];
    let mut g = Garbage(0x9E37_79B9_7F4A_7C15);
    let mut instance = component().instantiate(services()).unwrap();
    // Configurations: random text must be a typed error or a policy, never a trap.
    for _ in 0..300 {
        let text = g.text(40);
        let loaded = instance.load_policy(&text).expect("a bad configuration must not trap");
        if let Ok(policy) = loaded {
            instance.drop_policy(policy).unwrap();
        }
    }
    let policy = instance.load_policy(r#"{"max-steps-per-run": 1000000, "max-retries-per-run": 100000, "max-replans-per-run": 1000}"#).unwrap().unwrap();
    let mut run = instance.start_run(&policy, "garbage").unwrap().unwrap();
    let mut decisions = 0;
    for _ in 0..2000 {
        let tool = g.text(8);
        let Some(ticket) = begin(&mut instance, &run, &tool, None, g.next()).expect("no trap") else { break };
        let kind = match g.next() % 4 {
            0 => FailureKind::HttpStatus(g.next() as u16),
            1 => FailureKind::Transport(TransportError::Timeout),
            2 => FailureKind::ProtocolError(g.next() as i32),
            _ => FailureKind::ToolError(Some(g.next() as u16)),
        };
        let headers: Vec<(String, String)> = (0..g.next() % 4).map(|_| (HEADERS[(g.next() % HEADERS.len() as u64) as usize].to_string(), g.text(12))).collect();
        let structured_content = g.next().is_multiple_of(2).then(|| g.text(40));
        let mut failure = Observation::new(kind, &headers, g.text(30));
        failure.structured_content = structured_content;
        failure.session_id_sent = g.next().is_multiple_of(2);
        let now = g.next() >> 20;
        let policy_answer = instance.classify(&policy, &failure, now).expect("classify must not trap");
        assert!(!policy_answer.reason.is_empty());
        let decision = decide(&mut instance, &run, ticket.call_id, 1, &Outcome::Failure(failure), now, Some(g.next())).expect("no trap");
        if let Ok(decision) = decision {
            decisions += 1;
            if let Action::Escalate(_) = decision.action {
                // Most random statuses are unclassified: start over with a new run.
                instance.drop_run(run).unwrap();
                run = instance.start_run(&policy, "garbage").unwrap().unwrap();
                continue;
            }
            if let Action::CheckStatus = decision.action {
                let _ = instance.record_status_check(&run, ticket.call_id, 1, StatusCheckResult::Found, None, now, None);
            }
        }
    }
    assert_eq!(decisions, 2000, "every garbage failure gets a decision");
    instance.report(&run).expect("report after garbage");
}

/// The most a tool error can make the policy read: 4096 bytes of text and 4096
/// of structured content, made of words that all start like the 64 + 64
/// configured rules (so that every rule compares with every word), and a
/// natural relayed error beside it. The cost is fuel, not time: deterministic.
#[test]
fn a_worst_case_tool_error_stays_inside_the_fuel_budget() {
    use agent_retry_host::component::FUEL_PER_CALL;
    let rules: Vec<String> = (0..64).map(|i| format!(r#"{{"contains": "e_busy_{i}", "class": "transient"}}"#)).collect();
    let rules = rules.join(",");
    let config = format!(r#"{{"tool-error-rules": [{rules}], "tools": {{"t": {{"effect": "read", "tool-error-rules": [{rules}]}}}}}}"#);
    let mut instance = component().instantiate(services()).unwrap();
    let policy = instance.load_policy(&config).unwrap().unwrap();
    let run = instance.start_run(&policy, "worst-case").unwrap().unwrap();
    let mut fuel_of = |body: String, structured_content: Option<String>| {
        let ticket = begin(&mut instance, &run, "t", None, 1).unwrap().expect("admitted");
        let mut failure = Observation::new(FailureKind::ToolError(None), &[], body);
        failure.structured_content = structured_content;
        instance.record_failure(&run, ticket.call_id, 1, &failure, None, 1, Some(1)).expect("no trap").unwrap();
        let fuel = instance.fuel_used_by_last_call();
        (fuel, instance.last_decision(&run, ticket.call_id).unwrap().expect("a decision"))
    };
    let (hostile, decision) = fuel_of("e_a ".repeat(1024), Some(format!("\"{}\"", "e_b ".repeat(1023))));
    assert!(matches!(decision.action, Action::Replan(_)), "{decision:?}");
    assert_eq!(decision.rule, "tool-error:scan-limit");
    let (natural, decision) = fuel_of("Rate limit reached for gpt-4o on tokens per min (TPM). Please try again in 644ms.".into(), None);
    assert!(matches!(decision.action, Action::Retry(_)), "{decision:?}");
    let ticket = begin(&mut instance, &run, "t", None, 1).unwrap().expect("admitted");
    let http = Observation::new(FailureKind::HttpStatus(503), &[("retry-after".into(), "1".into())], "upstream unavailable");
    instance.record_failure(&run, ticket.call_id, 1, &http, None, 1, Some(1)).unwrap().unwrap();
    let http = instance.fuel_used_by_last_call();
    println!(
        "fuel of one record-failure: hostile 8 KB tool error {hostile}, natural relayed rate limit {natural}, HTTP 503 with Retry-After {http}, budget {FUEL_PER_CALL}"
    );
    assert!(hostile < FUEL_PER_CALL / 2, "{hostile} fuel leaves less than 2x headroom");
}

/// The most headers a host passes: 5,800 of 5 KB, cut by the
/// host to its limits and joined as `name: value` lines (hundreds of KB), then
/// split by the policy. A split that looked at every byte in its own loop
/// burned 17.8 M of the 20 M fuel a call has (and ran out in the Node host,
/// which counts more); finding line ends and colons with `memchr` costs about 3.3 M.
#[test]
fn the_most_headers_a_host_passes_split_inside_a_quarter_of_the_fuel_budget() {
    use agent_retry_host::component::FUEL_PER_CALL;
    let mut instance = component().instantiate(services()).unwrap();
    let policy = instance.load_policy("{}").unwrap().unwrap();
    let run = instance.start_run(&policy, "headers").unwrap().unwrap();
    let start = begin(&mut instance, &run, "lookup", None, 1).unwrap().expect("admitted");
    let mut headers: Vec<(String, String)> = vec![("Retry-After".into(), "7".into())];
    headers.extend((0..5_800).map(|i| (format!("x-{i}"), "v".repeat(5_000))));
    let failure = Observation::new(FailureKind::HttpStatus(429), &headers, "e".repeat(1_000));
    let verdict = instance.record_failure(&run, start.call_id, 1, &failure, None, 1, Some(5)).expect("no trap").unwrap();
    let fuel = instance.fuel_used_by_last_call();
    println!("record-failure with 5,800 headers of 5 KB: {fuel} fuel of {FUEL_PER_CALL}");
    assert_eq!(verdict.hint_ms, Some(7_000), "{verdict:?}");
    assert!(fuel < FUEL_PER_CALL / 4, "{fuel} fuel leaves less than 4x headroom");
}

/// A long run's escalation and report stay bounded, and every effect stays
/// available by page: 30,000 keyed writes, then a 403. The escalation once ran
/// out of fuel from 8,359 writes (no note, the list of writes lost) and
/// `report()` trapped from 27,624.
#[test]
fn a_long_runs_escalation_and_report_stay_bounded_and_every_effect_is_paged() {
    const WRITES: u32 = 30_000;
    let mut instance = component().instantiate(services()).unwrap();
    let policy = instance.load_policy(r#"{"max-steps-per-run": 1000000}"#).unwrap().unwrap();
    let run = instance.start_run(&policy, "long").unwrap().unwrap();
    let mut fuel = Vec::new();
    for i in 0..WRITES {
        let key = format!("ar1-{i:032x}");
        let ticket = begin(&mut instance, &run, "issue_refund", Some(&key), 1).unwrap().expect("admitted");
        instance.record_success(&run, ticket.call_id, 1, 1).unwrap().unwrap();
        fuel.push(instance.fuel_used_by_last_call());
    }
    let mean = |range: std::ops::Range<usize>| fuel[range.clone()].iter().sum::<u64>() / range.len() as u64;
    let (first, last) = (mean(0..1000), mean(WRITES as usize - 1000..WRITES as usize));
    let report = instance.report(&run).expect("report() no longer traps on a long run");
    let report_fuel = instance.fuel_used_by_last_call();
    assert_eq!((report.effects.len(), report.effects_total), (20, WRITES));
    let ticket = begin(&mut instance, &run, "issue_refund", None, 1).unwrap().expect("admitted");
    let forbidden = Observation::new(FailureKind::HttpStatus(403), &[], "needs approval");
    instance.record_failure(&run, ticket.call_id, 1, &forbidden, None, 1, Some(1)).expect("no trap").unwrap();
    let verdict_fuel = instance.fuel_used_by_last_call();
    let decision = instance.last_decision(&run, ticket.call_id).expect("no trap").expect("a decision");
    let escalation_fuel = verdict_fuel.max(instance.fuel_used_by_last_call());
    let Action::Escalate(escalation) = decision.action else { panic!("{:?}", decision.action) };
    assert_eq!((escalation.effects.len(), escalation.effects_total), (20, WRITES));
    assert_eq!(escalation.effects[10].call_id, WRITES - 9, "the first ten, then the last ten");
    assert!(escalation.note.contains("29980 more") && escalation.note.len() < 3000, "{}", escalation.note.len());
    // Nothing a person needs is lost: every effect, in order, page by page.
    let all = instance.all_effects(&run).unwrap();
    assert_eq!(all.len(), WRITES as usize);
    assert!(all.iter().enumerate().all(|(i, e)| e.call_id == i as u32 + 1 && e.idempotency_key.as_deref() == Some(format!("ar1-{i:032x}").as_str())));
    assert_eq!(instance.effects(&run, 0, 5_000).unwrap().len(), 1_000, "a page holds at most 1,000");
    println!(
        "{WRITES} writes: a success took {first} fuel on average among the first 1,000 and {last} among the last; the report {report_fuel}; the escalation {escalation_fuel}"
    );
    // The cost of a success does not grow with the effects before it (amortised:
    // a growing list is copied now and then); a report and an escalation are bounded.
    assert!(last < 2 * first, "{first} -> {last}");
    assert!(report_fuel < 1_000_000 && escalation_fuel < 1_000_000, "{report_fuel} {escalation_fuel}");
}

/// A run's calls are kept in chunks (the core's `chunked.rs`): 250,000 calls of one
/// run fit in the 64 MiB cap, where a list that doubled ran out at 131,072
/// calls, and no `begin-call` pays for copying the calls before it (one cost
/// 5.8 M fuel at the 65,537th).
#[test]
fn a_run_of_250_000_calls_fits_and_no_call_pays_for_the_earlier_ones() {
    const CALLS: u32 = 250_000;
    let mut instance = component().instantiate(services()).unwrap();
    let policy = instance.load_policy(r#"{"max-steps-per-run": 1000000, "tools": {"issue_refund": {"effect": "write"}}}"#).unwrap().unwrap();
    let run = instance.start_run(&policy, "long").unwrap().unwrap();
    let key = format!("ar1-{:032x}", 7);
    let (mut costliest, mut at) = (0, 0);
    for i in 0..CALLS {
        let (tool, key) = if i % 2 == 0 { ("lookup_order", None) } else { ("issue_refund", Some(key.as_str())) };
        let start = instance.begin_call(&run, None, tool, key, None, 1).expect("no trap").unwrap();
        assert!(start.admitted && start.call_id == i + 1, "call {i}: {start:?}");
        let fuel = instance.fuel_used_by_last_call();
        if fuel > costliest {
            (costliest, at) = (fuel, i + 1);
        }
        instance.record_success(&run, start.call_id, 1, 1).expect("no trap").unwrap();
    }
    let memory = instance.memory_bytes();
    println!("{CALLS} calls in one run: {memory} bytes of memory; the costliest begin-call {costliest} fuel (call {at})");
    assert_eq!(instance.report(&run).unwrap().calls, CALLS);
    assert!(costliest < 100_000, "call {at} cost {costliest} fuel");
}

/// A host aggregating MCP servers has hundreds of namespaced tools, some
/// thousands: 10,000 load inside the configuration's fuel budget (a call's,
/// plus FUEL_PER_CONFIG_BYTE a byte: its cost is linear in the text and it is
/// loaded off the decision path; the per-call tank alone held about 2,000), and
/// a call finds its tool by hash. Duplicate names are found by hashing, not by
/// comparing every pair (that ran out of fuel at about 355 tools).
#[test]
fn a_configuration_with_ten_thousand_namespaced_tools_loads_inside_its_fuel_budget() {
    const TOOLS: usize = 10_000;
    use agent_retry_host::component::{FUEL_PER_CALL, FUEL_PER_CONFIG_BYTE};
    let tools: Vec<String> = (0..TOOLS).map(|i| format!(r#""mcp__github__create_pull_request_review_{i:05}": {{"effect": "write"}}"#)).collect();
    let config = format!(r#"{{"tools": {{{}}}}}"#, tools.join(","));
    let tank = FUEL_PER_CALL + FUEL_PER_CONFIG_BYTE * config.len() as u64;
    let mut instance = component().instantiate(services()).unwrap();
    let policy = instance.load_policy(&config).expect("no trap").unwrap();
    let load_fuel = instance.fuel_used_by_last_call();
    let run = instance.start_run(&policy, "many-tools").unwrap().unwrap();
    let tool = format!("mcp__github__create_pull_request_review_{:05}", TOOLS - 1);
    let ticket = begin(&mut instance, &run, &tool, None, 1).unwrap().expect("admitted");
    let begin_fuel = instance.fuel_used_by_last_call();
    assert!(!ticket.safe_to_repeat, "the tool's entry (a write) applies");
    // Its effective-config is as long, and gets the load's tank (on a call's it ran out).
    let effective: serde_json::Value = serde_json::from_str(&instance.effective_config(&policy).expect("no trap")).unwrap();
    let effective_fuel = instance.fuel_used_by_last_call();
    assert_eq!(effective["tools"].as_object().map(|t| t.len()), Some(TOOLS), "{:.200}", effective.to_string());
    println!("effective-config of {TOOLS} tools: {effective_fuel} fuel");
    println!(
        "{TOOLS} tools ({} bytes): from-json {load_fuel} fuel ({:.0} a byte, {:.0}% of its {tank}), begin-call of the last tool {begin_fuel}",
        config.len(),
        load_fuel as f64 / config.len() as f64,
        100.0 * load_fuel as f64 / tank as f64
    );
    assert!(load_fuel < tank / 2, "{load_fuel} of {tank}");
    // The tool is found by its hash: a scan of 1,000 names took 1,089,991.
    assert!(begin_fuel < 20_000, "{begin_fuel}");
    // A duplicate among them is still found, by name.
    let duplicated = config.replacen("_00001\"", "_00000\"", 1);
    let Err(err) = instance.load_policy(&duplicated).expect("no trap") else { panic!("a duplicate tool must be refused") };
    assert!(err.message.contains("appears twice"), "{err:?}");
    // The dynamic API (the vector runner, `agent-retry decide`) gives it the same tank.
    let mut dynamic = agent_retry_host::dynamic::DynamicPolicy::new(&component()).unwrap();
    let loaded = agent_retry_host::steps::Subject::load_policy(&mut dynamic, &config).expect("no trap");
    assert!(loaded.get("ok").is_some(), "loads through the dynamic API too");
    // On the per-call tank alone it runs out, as it did: the budget is what lets it load.
    let mut starved = component().with_fuel_per_config_byte(0).instantiate(services()).unwrap();
    assert_eq!(starved.load_policy(&config).err(), Some(PolicyFault::OutOfFuel { fuel: FUEL_PER_CALL }));
}

/// The costliest shapes of text per byte, each just under the 1 MiB limit,
/// answer a configuration error (they have no known field), never run out of
/// fuel: at most about 435 fuel a byte here (an array of zeros) against the 2,000 the budget gives (the Node host counts up to 904).
/// A tool name of 100 KB is refused as too long without its error costing more
/// than a call (making its field path once burned all of a call's fuel).
#[test]
fn the_costliest_configurations_within_the_size_limit_do_not_run_out_of_fuel() {
    const LIMIT: usize = 1 << 20;
    let fill = |open: &str, item: &dyn Fn(usize) -> String, close: &str| {
        let mut text = String::from(open);
        for i in 0.. {
            let next = item(i);
            if text.len() + next.len() + 1 + close.len() > LIMIT {
                break;
            }
            if i > 0 {
                text.push(',');
            }
            text.push_str(&next);
        }
        text + close
    };
    let shapes = [
        ("members", fill("{", &|i| format!(r#""k{i}":{i}"#), "}")),
        ("zeros", fill(r#"{"x":["#, &|_| "0".into(), "]}")),
        ("empty strings", fill(r#"{"x":["#, &|_| r#""""#.into(), "]}")),
        ("empty objects", fill(r#"{"x":["#, &|_| "{}".into(), "]}")),
    ];
    for (name, text) in shapes {
        assert!(text.len() <= LIMIT && text.len() > LIMIT - 16, "{name}: {}", text.len());
        let mut instance = component().instantiate(services()).unwrap();
        let started = std::time::Instant::now();
        let answer = instance.load_policy(&text).unwrap_or_else(|fault| panic!("{name}: {fault}"));
        let took = started.elapsed();
        let fuel = instance.fuel_used_by_last_call();
        println!("{name}: {} bytes, {fuel} fuel ({:.0} a byte), {took:?}", text.len(), fuel as f64 / text.len() as f64);
        assert!(answer.is_err(), "{name}: no known field, refused");
    }
    let long_name = format!(r#"{{"tools": {{"{}": {{"effect": "write"}}}}}}"#, "a".repeat(100_000));
    let mut instance = component().instantiate(services()).unwrap();
    let err = instance.load_policy(&long_name).expect("no trap").err().expect("too long");
    assert!(err.message.contains("1 to 256 bytes") && err.field.len() < 260, "{err:?}");
    assert!(instance.fuel_used_by_last_call() < 5_000_000, "{}", instance.fuel_used_by_last_call());
}

/// A hostile component built by tests/hostile/build.mjs (`make hostile`).
fn hostile(name: &str) -> Vec<u8> {
    let path = default_wasm_path().parent().and_then(|p| p.parent()).expect("target/").join(format!("hostile/{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (run `make hostile`)", path.display()))
}

const FAILURE_503: fn() -> Observation = || Observation::new(FailureKind::HttpStatus(503), &[("Retry-After".into(), "2".into())], "");

/// The call fails with the expected fault, the instance is not entered again, and
/// a fresh instance of the good component serves.
fn contained(
    name: &str,
    limits: agent_retry_host::SandboxLimits,
    call: impl FnOnce(&mut agent_retry_host::PolicyInstance) -> Result<(), PolicyFault>,
) -> (PolicyFault, std::time::Duration) {
    let component = PolicyComponent::from_bytes(&hostile(name)).unwrap_or_else(|e| panic!("{name} passes the load checks: {e}")).with_limits(limits);
    let mut instance = component.instantiate(services()).unwrap();
    let start = std::time::Instant::now();
    let fault = call(&mut instance).expect_err("the hostile call must fail");
    let took = start.elapsed();
    assert!(instance.is_broken());
    match instance.derive_idempotency_key("r", "a") {
        Err(PolicyFault::InstanceUnusable { first_fault }) => assert_eq!(first_fault, fault.to_string()),
        other => panic!("a broken instance must not be entered again: {other:?}"),
    }
    let mut fresh = self::component().instantiate(services()).unwrap();
    let policy = fresh.load_policy("{}").unwrap().unwrap();
    assert_eq!(fresh.classify(&policy, &FAILURE_503(), 0).unwrap().class, agent_retry_host::component::types::OutcomeClass::Transient);
    (fault, took)
}

fn classify_503(instance: &mut agent_retry_host::PolicyInstance) -> Result<(), PolicyFault> {
    let policy = instance.load_policy("{}")?.expect("the config loads");
    instance.classify(&policy, &FAILURE_503(), 0).map(drop)
}

#[test]
fn an_endless_loop_runs_out_of_fuel_with_a_typed_fault() {
    let limits = agent_retry_host::SandboxLimits::default();
    let (fault, took) = contained("endless-loop", limits, classify_503);
    assert_eq!(fault, PolicyFault::OutOfFuel { fuel: limits.fuel_per_call }, "{fault}");
    eprintln!("endless loop cut off after {took:?} at {} fuel", limits.fuel_per_call);
    // The limit is the host's to set.
    let small = agent_retry_host::SandboxLimits { fuel_per_call: 2_000_000, ..limits };
    let (fault, _) = contained("endless-loop", small, |i| {
        let policy = i.load_policy("{}")?.expect("the config loads");
        i.classify(&policy, &FAILURE_503(), 0).map(drop)
    });
    assert_eq!(fault, PolicyFault::OutOfFuel { fuel: 2_000_000 });
}

#[test]
fn a_memory_bomb_stops_at_the_configured_cap_with_a_typed_fault() {
    for cap in [agent_retry_host::SandboxLimits::default().max_memory_bytes, 8 << 20] {
        let limits = agent_retry_host::SandboxLimits { max_memory_bytes: cap, ..Default::default() };
        let (fault, _) = contained("memory-bomb", limits, classify_503);
        assert_eq!(fault, PolicyFault::MemoryExceeded { max_memory_bytes: cap }, "{fault}");
    }
}

#[test]
fn a_trap_is_a_typed_trap_with_its_cause() {
    let (fault, _) = contained("trap", Default::default(), classify_503);
    assert!(matches!(&fault, PolicyFault::Trap { cause } if cause.contains("unreachable")), "{fault}");
}

#[test]
fn values_that_break_the_contract_are_boundary_violations() {
    let (fault, _) = contained("enum-out-of-range", Default::default(), classify_503);
    assert!(matches!(&fault, PolicyFault::BoundaryViolation { cause } if cause.contains("discriminant")), "{fault}");
    let (fault, _) = contained("invalid-utf8", Default::default(), |i| i.derive_idempotency_key("run", "step").map(drop));
    assert!(matches!(&fault, PolicyFault::BoundaryViolation { cause } if cause.contains("utf-8")), "{fault}");
    let (fault, _) = contained("pointer-out-of-bounds", Default::default(), |i| i.derive_idempotency_key("run", "step").map(drop));
    assert!(matches!(&fault, PolicyFault::BoundaryViolation { cause } if cause.contains("out of bounds")), "{fault}");
}

#[test]
fn components_with_foreign_imports_another_world_or_major_are_refused_at_load() {
    let refusal = |name: &str| PolicyComponent::from_bytes(&hostile(name)).err().unwrap_or_else(|| panic!("{name} must be refused")).to_string();
    let text = refusal("extra-import");
    assert!(text.contains("wasi:filesystem/preopens"), "{text}");
    let text = refusal("extra-import-sockets");
    assert!(text.contains("wasi:sockets/instance-network"), "{text}");
    let text = refusal("wrong-world");
    assert!(text.contains("another world") && text.contains("acme:scheduler/policy@"), "{text}");
    let text = refusal("other-major");
    assert!(text.contains("this host speaks agent-retry:policy@0.9.0") && text.contains("the component speaks agent-retry:policy@"), "{text}");
}

/// Freed memory is reused across sizes: bodies of 20, 10, 5, 2.5 and 1.25 MB
/// in turn on one instance (passed raw, without the host's 64 KiB cut) once
/// exhausted the 64 MiB cap, every size class taking fresh memory; a fresh
/// instance accepted each of them.
#[test]
fn one_instance_takes_shrinking_bodies_that_a_fresh_one_takes() {
    use agent_retry_host::steps::Subject;
    let mut policy = agent_retry_host::dynamic::DynamicPolicy::new(&component()).unwrap();
    policy.load_policy("{}").unwrap();
    for size in [20 << 20, 10 << 20, 5 << 20, 5 << 19, 5 << 18] {
        let failure = serde_json::json!({"kind": {"http-status": 503}, "headers": "", "body": "x".repeat(size), "structured-content": null,
            "session-id-sent": false, "delivery": "answer-started"});
        let class = policy.classify(&failure, 0).unwrap_or_else(|e| panic!("a body of {size} bytes: {e}"));
        assert_eq!(class["class"], "transient", "{size}");
    }
}

/// A run keeps the bodies of its calls in flight only: 2,000 calls, each
/// failing once with a 60 KB body and then succeeding (120 MB of bodies), fit
/// in one instance's 64 MiB.
#[test]
fn a_run_does_not_keep_the_bodies_of_finished_calls() {
    let mut instance = component().instantiate(services()).unwrap();
    let config = r#"{"max-steps-per-run": 100000, "max-retries-per-run": 100000, "tools": {"lookup_order": {"effect": "read"}}}"#;
    let policy = instance.load_policy(config).unwrap().unwrap();
    let run = instance.start_run(&policy, "bodies").unwrap().unwrap();
    let failure = Observation::new(FailureKind::HttpStatus(503), &[], "b".repeat(60_000));
    for i in 0..2_000u32 {
        let start = begin(&mut instance, &run, "lookup_order", None, 1).unwrap().expect("admitted");
        let verdict = instance.record_failure(&run, start.call_id, 1, &failure, None, 1, Some(1)).unwrap_or_else(|e| panic!("call {i}: {e}")).unwrap();
        assert_eq!(verdict.action, ActionKind::Retry, "call {i}");
        let retried = verdict.attempt + 1;
        instance.record_success(&run, start.call_id, retried, 1).unwrap().unwrap();
    }
    println!("2,000 calls with a 60 KB body each: {} bytes of linear memory", instance.memory_bytes());
    assert!(instance.memory_bytes() < 16 << 20, "{} bytes", instance.memory_bytes());
}

/// Memory per run in flight is bounded: 100,000 runs, each with a call begun,
/// live in one instance within its 64 MiB cap.
#[test]
fn a_hundred_thousand_runs_in_flight_fit_in_one_instance() {
    let mut instance = component().instantiate(services()).unwrap();
    let policy = instance.load_policy("{}").unwrap().unwrap();
    let mut runs = Vec::with_capacity(100_000);
    for i in 0..100_000u32 {
        let run = instance.start_run(&policy, &format!("CASE-{i:06}")).unwrap_or_else(|e| panic!("run {i}: {e}")).unwrap();
        let admitted = instance
            .begin_call(&run, None, "lookup_order", Some("ar1-00000000000000000000000000000000"), None, 1)
            .unwrap_or_else(|e| panic!("run {i}: {e} ({} bytes)", instance.memory_bytes()))
            .unwrap();
        assert!(admitted.admitted);
        runs.push(run);
    }
    let memory_bytes = instance.memory_bytes();
    println!("100,000 runs in flight: {memory_bytes} bytes of linear memory ({} per run)", memory_bytes / 100_000);
    assert!(memory_bytes <= 64 << 20);
}
