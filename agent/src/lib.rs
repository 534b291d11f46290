//! The node agent's library: NVML probe, overlap self-test, report assembly and publishing,
//! and the observation of configured pods' GPUs (attribution).
//! The binary `offload-agent` is a thin CLI over it.
#![deny(missing_docs)]

pub mod attribution;
pub mod observe;
pub mod probe;
pub mod publish;
pub mod report;
pub mod selftest;
pub mod verify;
