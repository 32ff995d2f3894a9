//! A demo MCP server for agent-retry's tests and demo: a refund desk
//! (`lookup_order`, `check_refund_policy`, `issue_refund`, `list_refunds`,
//! `record_note`, `list_notes`) and an asset store (`upload_asset`,
//! `delete_asset`, `list_assets`), and the MCP 2026-07-28 kinds of answer:
//! tasks ([`tasks`]: `issue_refund` for a client of the tasks extension,
//! `archive_orders`), a continuation ([`continuation`]: `confirm_order`) and
//! progress ([`progress`]: `export_report`).
//!
//! It fails the way real services do, on a script ([`faults`]); it enforces an
//! account allowance shared by all clients ([`allowance`]); and it keeps a
//! [`ledger`] of applied effects so a duplicate refund is detectable. Served over
//! streamable HTTP ([`http`]) and stdio.

pub mod allowance;
pub mod continuation;
pub mod era;
pub mod faults;
pub mod http;
pub mod judge;
pub mod ledger;
pub mod progress;
pub mod tasks;
pub mod tls;
pub mod tools;

pub use allowance::Allowance;
pub use era::Era;
pub use faults::{Fault, FaultRule, FaultScript};
pub use http::{HttpOptions, HttpServer, serve_http, serve_http_options, serve_http_with};
pub use ledger::Ledger;
pub use tasks::{TaskEvent, TaskRecord};
pub use tls::TestAuthority;
pub use tools::{CallRecord, DemoServer, DemoState, Timings};
