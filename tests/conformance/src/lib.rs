//! The conformance runner: the vectors in `tests/vectors/*.json` run against any
//! [`Subject`] (the native core, the component in wasmtime), and every step's
//! output is compared with the vector's expectation and across subjects.

pub mod matcher;
pub mod native;
pub mod runner;
pub mod vector;

pub use runner::{CaseResult, Subject, run_case};
pub use vector::{Case, VectorFile, load_dir};
