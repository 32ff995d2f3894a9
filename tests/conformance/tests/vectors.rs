//! Runs every vector in `tests/vectors/` twice: natively against the policy core,
//! and through the built component in wasmtime. Both must meet every expectation
//! and give identical outputs, step by step. `observations.json` runs in its
//! pure form on both (each observation reported as attempt 1 of `lookup_order`;
//! the verdict must match the case's `expect`). Prints `N passed, N failed`.

use std::path::Path;
use std::process::ExitCode;

use agent_retry_host::dynamic::DynamicPolicy;
use agent_retry_host::vectors::{OBSERVATIONS_FILE, parse_observation_file, run_observation_case};
use agent_retry_host::{PolicyComponent, default_wasm_path};
use conformance::native::Native;
use conformance::{load_dir, run_case};

fn main() -> ExitCode {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../vectors");
    let files = match load_dir(&dir) {
        Ok(files) => files,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let wasm_path = std::env::var_os("AGENT_RETRY_WASM").map(Into::into).unwrap_or_else(default_wasm_path);
    let component = match PolicyComponent::from_file(&wasm_path) {
        Ok(component) => component,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (mut passed, mut failed) = (0u32, 0u32);
    // Every case's native outputs, one line a case, for other hosts to compare
    // byte for byte (`make test-hosts-agree`).
    let mut dump = String::new();
    let (mut native_passed, mut wasm_passed, mut cases) = (0u32, 0u32, 0u32);
    for file in &files {
        let name = file.path.file_name().and_then(|n| n.to_str()).unwrap_or("?");
        for case in &file.cases {
            cases += 1;
            let native = run_case(case, &mut Native::new());
            dump.push_str(&format!(
                "{} {}\n",
                canonical_text(&serde_json::json!([name, case.description])),
                canonical_text(&serde_json::Value::Array(native.outputs.clone()))
            ));
            let wasm = match DynamicPolicy::new(&component) {
                Ok(mut subject) => run_case(case, &mut subject),
                Err(e) => conformance::CaseResult { outputs: vec![], failure: Some(e) },
            };
            let mut report = |subject: &str, failure: &Option<String>| match failure {
                None => {
                    passed += 1;
                    true
                }
                Some(why) => {
                    failed += 1;
                    println!("FAIL [{subject}] {name}: {}\n     {why}", case.description);
                    false
                }
            };
            native_passed += u32::from(report("native", &native.failure));
            // The component must also give exactly the native outputs.
            let identical = if wasm.failure.is_none() && wasm.outputs != native.outputs {
                let step = wasm.outputs.iter().zip(&native.outputs).position(|(a, b)| a != b).unwrap_or(0);
                Some(format!(
                    "outputs differ from native at step {}:\n     wasm:   {}\n     native: {}",
                    step + 1,
                    wasm.outputs.get(step).map_or("-".into(), |v| v.to_string()),
                    native.outputs.get(step).map_or("-".into(), |v| v.to_string())
                ))
            } else {
                wasm.failure.clone()
            };
            wasm_passed += u32::from(report("wasmtime", &identical));
        }
    }
    let dump_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/vector-outputs-rust.jsonl");
    if let Err(e) = std::fs::write(&dump_path, dump) {
        eprintln!("cannot write {}: {e}", dump_path.display());
    }
    println!("vectors: {cases} cases in {} files", files.len());
    println!("native: {native_passed} of {cases} cases passed");
    println!("wasmtime: {wasm_passed} of {cases} cases passed, outputs identical to native");
    let (observed, observed_failed) = observations(&dir.join(OBSERVATIONS_FILE), &component);
    println!("observations: {} of {observed} cases passed (native and wasmtime, verdicts identical)", observed - observed_failed);
    passed += observed - observed_failed;
    failed += observed_failed;
    println!("{passed} passed, {failed} failed");
    if failed == 0 && cases > 0 && observed > 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// `observations.json` in its pure form, natively and in the component: every
/// case's verdict must match its `expect`, and both must give the same one.
/// Returns (cases, failed).
fn observations(path: &Path, component: &PolicyComponent) -> (u32, u32) {
    let file = match std::fs::read_to_string(path).map_err(|e| e.to_string()).and_then(|text| parse_observation_file(&text)) {
        Ok(file) => file,
        Err(e) => {
            println!("FAIL {}: {e}", path.display());
            return (1, 1);
        }
    };
    let mut failed = 0;
    for case in &file.cases {
        let native = run_observation_case(&file.config, case, &mut Native::new());
        let wasm = DynamicPolicy::new(component).and_then(|mut subject| run_observation_case(&file.config, case, &mut subject));
        let failure = match (&native, &wasm) {
            (Err(why), _) => Some(format!("[native] {why}")),
            (_, Err(why)) => Some(format!("[wasmtime] {why}")),
            (Ok(a), Ok(b)) if a != b => Some(format!("the verdicts differ: native {a}, wasmtime {b}")),
            _ => None,
        };
        if let Some(why) = failure {
            failed += 1;
            println!("FAIL [observations] {}\n     {why}", case.description);
        }
    }
    (file.cases.len() as u32, failed)
}

/// Compact JSON with object keys sorted, whatever map order serde_json was built with.
fn canonical_text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let fields: Vec<String> = keys.iter().map(|k| format!("{}:{}", serde_json::Value::from(k.as_str()), canonical_text(&map[*k]))).collect();
            format!("{{{}}}", fields.join(","))
        }
        serde_json::Value::Array(items) => format!("[{}]", items.iter().map(canonical_text).collect::<Vec<_>>().join(",")),
        other => other.to_string(),
    }
}
