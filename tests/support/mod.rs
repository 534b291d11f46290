//! The operator's integration tests share the test environment's helpers.
#![allow(unused_imports)]

pub use offload_testenv::support::*;
