//! Empty: this package only holds `tests/component.rs` (see Cargo.toml).
