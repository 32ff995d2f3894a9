//! The conformance vectors (`tests/vectors/*.json`, format in
//! `tests/vectors/README.md`): read, run against any [`Subject`] (the
//! component through [`crate::dynamic::DynamicPolicy`], the native core in the
//! conformance tests), and matched against their expectations. A live update's
//! gate runs the vectors the update ships with through the same code.

pub mod format;
pub mod matcher;
pub mod runner;

pub use format::{Case, VectorFile, load_dir, parse_file};
pub use runner::{CaseResult, Subject, run_case, run_case_flat, run_case_in};
