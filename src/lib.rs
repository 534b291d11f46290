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
//! - [`view`]: the cluster as the decision's callers see it (caches or memory);
//! - [`webhook`]: the admission endpoints, job kinds and serving certificates;
//! - [`caches`], [`operator`], [`admin`], [`metrics`], [`certs`]: the process around them.
//!
//! The API types, names, node report and version gates live in the `offload-api` crate; this crate
//! and its callers name them by that crate's paths alone.
#![deny(missing_docs)]

pub mod admin;
pub mod caches;
pub mod certs;
pub mod check;
pub mod controller;
pub mod decision;
pub mod dra;
pub mod explain;
pub mod guard;
pub mod index;
pub mod learned;
pub mod metrics;
pub mod operator;
pub mod render;
pub mod view;
pub mod webhook;
