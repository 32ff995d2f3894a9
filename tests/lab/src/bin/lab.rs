//! `agent-retry-lab`: prints the refund lab, the contention simulation and the
//! outage with and without circuit breakers (deterministic: `make lab-check`
//! compares the output with tests/lab/expected.txt) and, with `--svg DIR`,
//! writes the plots, the contention table (`DIR/contention.md`) and the
//! outage table (`DIR/outage.md`).
//!
//!     agent-retry-lab [--faults FILE] [--svg DIR] [--runs N] [--clients 10,20,...] [--only lab|simulate|outage]

use std::path::PathBuf;

use agent_retry_lab::{contention, faults::FaultMix, outage, plots, report};

fn main() -> anyhow::Result<()> {
    let mut faults: Option<PathBuf> = None;
    let mut svg: Option<PathBuf> = None;
    let mut runs = 100;
    let mut clients: Vec<u32> = (1..=10).map(|i| i * 10).collect();
    let mut only: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| anyhow::anyhow!("{arg} needs a value"));
        match arg.as_str() {
            "--faults" => faults = Some(value()?.into()),
            "--svg" => svg = Some(value()?.into()),
            "--runs" => runs = value()?.parse()?,
            "--clients" => clients = value()?.split(',').map(|s| s.trim().parse()).collect::<Result<_, _>>()?,
            "--only" => only = Some(value()?),
            other => anyhow::bail!("unknown argument {other} (see the file's doc comment)"),
        }
    }
    let component = agent_retry_host::PolicyComponent::from_file(&agent_retry_host::default_wasm_path())?;
    if only.as_deref() != Some("simulate") && only.as_deref() != Some("outage") {
        let (mix, source) = match &faults {
            Some(path) => (FaultMix::from_file(path)?, path.display().to_string()),
            None => (FaultMix::builtin(), "tests/lab/faults.json".to_string()),
        };
        print!("{}", report::lab(&component, &mix, &source, 42)?.text);
    }
    if only.as_deref() != Some("lab") && only.as_deref() != Some("outage") {
        let (text, rows) = report::contention(&component, &clients, runs, 12345)?;
        print!("{text}");
        if let Some(dir) = &svg {
            std::fs::create_dir_all(dir)?;
            plots::contention(dir, &rows)?;
            let delays = contention::component_delays(&component, 9, 10_000, 7)?;
            plots::delays(dir, &delays, 9, 2000)?;
            let page = format!(
                "<!-- Written by `make lab` (tests/lab/src/contention.rs): do not edit. -->\n# Brooker's contention simulation\n\nThe rows, what they compare and the target: [lab](lab.md#2-brookers-contention-simulation).\n\n```\n{text}```\n\n![calls against clients](contention-calls.svg)\n![completion time against clients](contention-time.svg)\n"
            );
            std::fs::write(dir.join("contention.md"), page)?;
            eprintln!("wrote {0}/contention.md, {0}/contention-calls.svg, {0}/contention-time.svg, {0}/delays.svg", dir.display());
        }
    }
    if only.is_none() || only.as_deref() == Some("outage") {
        let rows = outage::scenarios(&component, 2026)?;
        let table = outage::table(&rows);
        print!("{table}");
        if let Some(dir) = &svg {
            std::fs::create_dir_all(dir)?;
            plots::outage(dir, &rows)?;
            let page = format!(
                "<!-- Written by `make lab` (tests/lab/src/outage.rs): do not edit. -->\n# The outage lab\n\n```\n{table}```\n\n![attempts per second](outage.svg)\n"
            );
            std::fs::write(dir.join("outage.md"), page)?;
            eprintln!("wrote {0}/outage.svg, {0}/outage.md", dir.display());
        }
    }
    Ok(())
}
