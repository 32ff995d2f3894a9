//! `agent-retry lab` and `agent-retry simulate`: the refund lab on a fault mix
//! (the committed one, or the user's), and Brooker's contention simulation, with
//! the component making our policy's decisions (tests/lab, the agent-retry-lab crate).

use std::path::Path;

use agent_retry_host::PolicyComponent;
use agent_retry_lab::faults::FaultMix;
use agent_retry_lab::{contention, plots, report};

/// Prints the lab's tables for `faults` (default: tests/lab/faults.json, compiled in).
pub fn lab(wasm: &Path, faults: Option<&Path>, seed: u64) -> anyhow::Result<()> {
    let component = PolicyComponent::from_file(wasm)?;
    let (mix, source) = match faults {
        Some(path) => (FaultMix::from_file(path)?, path.display().to_string()),
        None => (FaultMix::builtin(), "tests/lab/faults.json".to_string()),
    };
    print!("{}", report::lab(&component, &mix, &source, seed)?.text);
    Ok(())
}

/// Prints the contention table; with `svg`, writes the plots there.
pub fn simulate(wasm: &Path, clients: &[u32], runs: u32, seed: u64, svg: Option<&Path>) -> anyhow::Result<()> {
    let component = PolicyComponent::from_file(wasm)?;
    let (text, rows) = report::contention(&component, clients, runs, seed)?;
    print!("{text}");
    if let Some(dir) = svg {
        std::fs::create_dir_all(dir)?;
        plots::contention(dir, &rows)?;
        let delays = contention::component_delays(&component, 9, 10_000, 7)?;
        plots::delays(dir, &delays, 9, 2000)?;
        println!("plots: {0}/contention-calls.svg, {0}/contention-time.svg, {0}/delays.svg", dir.display());
    }
    Ok(())
}
