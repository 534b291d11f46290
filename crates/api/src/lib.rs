//! The `offload.dev` API shared by the operator and the node agent.
//!
//! - [`v1alpha1`]: the `offload.dev/v1alpha1` CRD types (`TrainingJob`, `OffloadProfile`) and the
//!   CRDs generated from them;
//! - [`names`]: every label, annotation, env var and field-manager name another component
//!   relies on;
//! - [`labels`]: the node labels the agent writes and the operator reads, typed, with their
//!   one vocabulary of values;
//! - [`report`]: the agent's versioned node report, and the checks that reject an impossible one;
//! - [`observed`]: the agent's summary of what the GPUs of configured pods did, per window;
//! - [`version`]: framework versions and the feature gates that depend on them;
//! - [`quantity`]: Kubernetes quantities and model sizes read as numbers, without overflow;
//! - [`validation`]: Kubernetes' rules for names, label selectors and mount paths;
//! - [`text`]: text other writers wrote, made safe to show in a status or a terminal;
//! - [`trace`]: what the sizer traced of a model's training step, checked.
#![deny(missing_docs)]
// Shipped functions fit on a screen (clippy counts code lines, not comments; threshold in
// clippy.toml); tests, which read as scenarios, are not held to it.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// No unwrap or expect outside tests (clippy.toml allows them there) and start-up, where each
// is allowed by name.
#![warn(clippy::unwrap_used, clippy::expect_used)]

pub mod allocator;
pub mod duration;
pub mod hints;
pub mod labels;
pub mod names;
pub mod observed;
pub mod quantity;
pub mod report;
pub mod text;
pub mod trace;
pub mod v1alpha1;
pub mod validation;
pub mod version;
