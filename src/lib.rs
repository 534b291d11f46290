//! offload-operator: the controller and admission webhook that make every training job's
//! CPU-offload configuration match the hardware its pods run on.
//!
//! The crate is laid out by concern, in the order a request flows through it:
//! - [`index`]: the operator's view of the GPU nodes (agent labels and report, cross-checked),
//!   parsed once per node change and shared by every caller;
//! - [`decision`]: the pure function that resolves a job's offload configuration, with a
//!   reason for every choice, and the one rule that picks a job's profile;
//! - [`render`]: turns a resolution into env vars, framework config and node affinity;
//! - [`controller`]: the TrainingJob and OffloadProfile controllers;
//! - [`cluster`]: the cluster as the decision's callers see it: the shared caches, the views
//!   over them (or over memory), what runs taught, and the tolerant reader that keeps one
//!   unreadable object from stopping a watch;
//! - [`webhook`]: the admission endpoints, job kinds and serving certificates;
//! - [`dra`]: what a GPU driver's ResourceSlices say, and the claims pinned to a decision;
//! - [`explain`]: `offload-operator explain`, the decision offline or against a cluster;
//! - [`sizer`]: the program that reads a model's own code to size its step, and how it runs;
//! - [`operator`]: the process that runs all of it (caches, webhook, leader election,
//!   controllers), and [`ops`]: what is around it (the admin server, metrics, the
//!   certificate authority, the installation check and clean-up).
//!
//! The API types, names, node report and version gates live in the `offload-api` crate; this crate
//! and its callers name them by that crate's paths alone.
#![deny(missing_docs)]
// Shipped functions fit on a screen (clippy counts code lines, not comments; threshold in
// clippy.toml); tests, which read as scenarios, are not held to it.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// No unwrap or expect outside tests (clippy.toml allows them there) and start-up, where each
// is allowed by name.
#![warn(clippy::unwrap_used, clippy::expect_used)]
// The operator's docs are read as its maintainers' (`cargo doc --document-private-items`,
// checked by the test command): a public item may point to the private one that does the work.
#![allow(rustdoc::private_intra_doc_links)]

pub mod cluster;
pub mod controller;
pub mod decision;
pub mod dra;
pub mod explain;
pub mod index;
pub mod operator;
pub mod ops;
pub mod render;
pub mod sizer;
pub mod webhook;
