//! Runs every vector in `tests/vectors/` twice: natively against the policy core,
//! and through the built component in wasmtime. Both must meet every expectation
//! and give identical outputs, step by step. Prints `N passed, N failed`.

use std::path::Path;
use std::process::ExitCode;

use agent_retry_host::dynamic::DynamicPolicy;
use agent_retry_host::{PolicyComponent, default_wasm_path};
use conformance::native::Native;
use conformance::{load_dir, run_case, run_case_flat};

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
    let (mut native_passed, mut wasm_passed, mut flat_passed, mut cases) = (0u32, 0u32, 0u32, 0u32);
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
            // The flat hot path must decide exactly what the rich path decides,
            // natively and in the component.
            let native_flat = run_case_flat(case, &mut Native::new());
            flat_passed += u32::from(report("native, flat", &same_outputs(&native_flat, &native.outputs)));
            let wasm_flat = match DynamicPolicy::new(&component) {
                Ok(mut subject) => run_case_flat(case, &mut subject),
                Err(e) => conformance::CaseResult { outputs: vec![], failure: Some(e) },
            };
            flat_passed += u32::from(report("wasmtime, flat", &same_outputs(&wasm_flat, &native.outputs)));
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
    println!("flat hot path: {flat_passed} of {} runs (native and wasmtime) passed, outputs identical to the rich path's", 2 * cases);
    println!("{passed} passed, {failed} failed");
    if failed == 0 && cases > 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// The case's failure, or a failure if its outputs are not `rich`'s.
fn same_outputs(flat: &conformance::CaseResult, rich: &[serde_json::Value]) -> Option<String> {
    if flat.failure.is_some() {
        return flat.failure.clone();
    }
    if flat.outputs.len() != rich.len() {
        return Some(format!("the flat path gave {} outputs, the rich path {}", flat.outputs.len(), rich.len()));
    }
    let step = flat.outputs.iter().zip(rich).position(|(a, b)| a != b)?;
    Some(format!("the flat path's output differs from the rich path's at step {}:\n     flat: {}\n     rich: {}", step + 1, flat.outputs[step], rich[step]))
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
