//! The refund lab's fault mix, as written in a data file (`tests/lab/faults.json`):
//! the agent's workflow, and for each run at most one scripted fault.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

/// A fault mix: the workflow every run follows, the budgets, and the runs.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct FaultMix {
    pub description: String,
    /// The tool calls of a run, in order; a run completes when all have succeeded.
    pub workflow: Vec<Step>,
    /// Tool calls a run may make (attempts plus status checks): the step budget.
    pub step_budget: u32,
    /// Errors the model may be shown and change its arguments for (the baselines' limit;
    /// the component has its own, `max-replans-per-run`, set to the same value).
    pub replan_limit: u32,
    /// Simulated time one attempt takes.
    pub attempt_ms: u64,
    /// Simulated time the model takes before its next call after an error.
    pub model_turn_ms: u64,
    pub runs: Vec<RunSpec>,
    /// Named variants: runs that replace the runs of the same id.
    #[serde(default)]
    pub variants: BTreeMap<String, Vec<RunSpec>>,
}

/// One tool of the workflow.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Step {
    pub tool: String,
    /// `read` or `write`.
    pub effect: String,
    /// The tool takes an idempotency key argument (`issue_refund` does).
    #[serde(default)]
    pub takes_key: bool,
    /// The read that tells whether a write was applied (`list_refunds`).
    #[serde(default)]
    pub status_check: Option<String>,
    /// Duplicates of this write are counted as doubled refunds.
    #[serde(default)]
    pub is_refund: bool,
}

/// One run and its fault, if any.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct RunSpec {
    pub id: String,
    #[serde(default)]
    pub note: String,
    #[serde(default)]
    pub fault: Option<Fault>,
}

/// A scripted fault on one tool of the workflow.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Fault {
    pub tool: String,
    pub failure: FailureSpec,
    pub clears: Clears,
}

/// What the failing attempt gets.
#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum FailureSpec {
    /// An HTTP status with headers and a body.
    Http {
        status: u16,
        #[serde(default)]
        headers: BTreeMap<String, String>,
        #[serde(default)]
        body: String,
    },
    /// No answer in time; `applied`: the write was made before the answer was lost.
    Timeout {
        #[serde(default)]
        applied: bool,
    },
    /// The connection was reset before the request was read.
    Reset,
    /// 200 with nothing usable.
    Empty { detail: String },
}

/// When the fault stops.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum Clears {
    /// After this many failed attempts: repeating the request succeeds (transient).
    AfterAttempts(u32),
    /// This long after the first failure: a retry before then fails again (a throttle).
    AfterMs(u64),
    /// After the model has changed its arguments this many times: repeating the
    /// same request cannot succeed (deterministic, semantic).
    AfterFixes(u32),
    /// Never, and a person must act: repeating it cannot succeed (permission).
    NeedsPerson,
    /// An outage that outlasts the run: repeating it might have succeeded, it did not.
    Never,
}

impl Clears {
    /// Repeating the identical request cannot succeed.
    pub fn request_bound(self) -> bool {
        matches!(self, Clears::AfterFixes(_) | Clears::NeedsPerson)
    }
}

impl FaultMix {
    pub fn from_json(text: &str) -> anyhow::Result<FaultMix> {
        let mix: FaultMix = serde_json::from_str(text)?;
        mix.validate()?;
        Ok(mix)
    }

    pub fn from_file(path: &Path) -> anyhow::Result<FaultMix> {
        let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        Self::from_json(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// The committed fault mix, compiled in.
    pub fn builtin() -> FaultMix {
        Self::from_json(include_str!("../faults.json")).expect("tests/lab/faults.json is valid")
    }

    fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(!self.workflow.is_empty(), "the workflow has no steps");
        let runs = self.runs.iter().chain(self.variants.values().flatten());
        for run in runs {
            if let Some(fault) = &run.fault {
                anyhow::ensure!(self.workflow.iter().any(|s| s.tool == fault.tool), "run {}: the fault's tool {} is not in the workflow", run.id, fault.tool);
            }
        }
        for (name, runs) in &self.variants {
            for run in runs {
                anyhow::ensure!(self.runs.iter().any(|r| r.id == run.id), "variant {name}: no run {}", run.id);
            }
        }
        Ok(())
    }

    /// The mix with a variant's runs in place of the runs of the same id.
    pub fn variant(&self, name: &str) -> Option<FaultMix> {
        let replacements = self.variants.get(name)?;
        let mut mix = self.clone();
        for replacement in replacements {
            if let Some(run) = mix.runs.iter_mut().find(|r| r.id == replacement.id) {
                *run = replacement.clone();
            }
        }
        Some(mix)
    }
}
