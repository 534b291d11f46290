//! The node agent's library: NVML probe, overlap self-test, report assembly and publishing,
//! and the observation of configured pods' GPUs (attribution).
//! The binary `offload-agent` is a thin CLI over it.
#![deny(missing_docs)]

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
