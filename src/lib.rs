//! offload-operator: makes every training job's CPU-offload configuration match the hardware
//! its pods run on.
//!
//! The crate is laid out by concern:
//! - [`api`]: the `offload.dev/v1alpha1` types and their CRDs;
//! - [`names`]: label, annotation and env var names shared by every component;
//! - [`report`]: the node agent's versioned report, written by the agent and read here;
//! - [`decision`]: the pure function that resolves a job's offload configuration;
//! - [`render`]: turns a resolution into env vars, framework config and node affinity;
//! - `certs` and `devcluster` (feature `runtime`): a small CA, and a local control plane made of
//!   the real upstream binaries for tests and the demo.
#![deny(missing_docs)]

#[cfg(feature = "runtime")]
pub mod admin;
pub mod api;
#[cfg(feature = "runtime")]
pub mod certs;
#[cfg(feature = "runtime")]
pub mod controller;
pub mod decision;
#[cfg(feature = "runtime")]
pub mod devcluster;
#[cfg(feature = "runtime")]
pub mod metrics;
pub mod names;
#[cfg(feature = "runtime")]
pub mod operator;
pub mod render;
pub mod report;
pub mod version;
#[cfg(feature = "runtime")]
pub mod webhook;
