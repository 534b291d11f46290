//! The operator's integration tests share the test environment's helpers.
#![allow(unused_imports, dead_code)]

pub mod controller;

pub use offload_testenv::support::*;
