//! The conformance vectors (`tests/vectors/*.json`, format in
//! `tests/vectors/README.md`): read, run against any [`Subject`] (the
//! component through [`crate::dynamic::DynamicPolicy`], the native core in the
//! conformance tests), and matched against their expectations. A live update's
//! gate runs the vectors the update ships with through the same code.

pub mod format;
pub mod guard;
pub mod matcher;
pub mod runner;

pub use format::{Case, OBSERVATIONS_FILE, ObservationCase, ObservationFile, VectorFile, load_dir, parse_file, parse_observation_file};
pub use runner::{CaseResult, OBSERVED_TOOL, Subject, run_case, run_case_in, run_observation_case, verdict_summary};
