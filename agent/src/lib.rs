//! The node agent's library: NVML probe, overlap self-test, report assembly and publishing,
//! and the observation of configured pods' GPUs (attribution).
//! The binary `offload-agent` is a thin CLI over it.
#![deny(missing_docs)]
// Shipped functions fit on a screen (clippy counts code lines, not comments; threshold in
// clippy.toml); tests, which read as scenarios, are not held to it.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// No unwrap or expect outside tests (clippy.toml allows them there) and start-up, where each
// is allowed by name.
#![warn(clippy::unwrap_used, clippy::expect_used)]

pub mod assemble;
pub mod attribution;
pub mod daemon;
pub mod devices;
pub mod observe_run;
pub mod probe;
pub mod selftest;
pub mod topology;
pub mod utilization;
pub mod verify;
