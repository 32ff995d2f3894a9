//! The conformance runner: the vectors in `tests/vectors/*.json` run against any
//! [`Subject`] (the native core, the component in wasmtime), and every step's
//! output is compared with the vector's expectation and across subjects.

pub mod native;

pub use agent_retry_host::vectors::{Case, CaseResult, Subject, VectorFile, load_dir, matcher, run_case};
