//! Framework versions (Python packages, so PEP 440) and the feature gates that depend on them.

use std::fmt;
use std::str::FromStr;

use pep440_rs::Version;

/// A parsed framework version such as `0.18.9` or `2.6.0+cu124`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FrameworkVersion(Version);

/// A version string that is not a PEP 440 version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("framework.version {input:?} is not a version number (expected e.g. 0.18.9): {detail}")]
pub struct VersionError {
    input: String,
    detail: String,
}

impl FrameworkVersion {
    /// Parses a version as pip would.
    pub fn parse(input: &str) -> Result<Self, VersionError> {
        Version::from_str(input.trim())
            .map(FrameworkVersion)
            .map_err(|e| VersionError {
                input: input.to_string(),
                detail: e.to_string(),
            })
    }

    /// A plain release version `major.minor.patch`.
    pub fn release(major: u64, minor: u64, patch: u64) -> Self {
        FrameworkVersion(Version::new([major, minor, patch]))
    }

    /// Whether this version is at least `major.minor.patch`. Pre-releases of that version count
    /// as older, so `0.18.0rc1` is not `>= 0.18.0`.
    pub fn at_least(&self, major: u64, minor: u64, patch: u64) -> bool {
        *self >= Self::release(major, minor, patch)
    }
}

impl fmt::Display for FrameworkVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// DeepSpeed feature gates (see FACTS: keys of `zero_optimization.offload_optimizer`).
pub mod deepspeed {
    use super::FrameworkVersion;

    /// Oldest DeepSpeed the operator renders configuration for.
    pub const MIN_SUPPORTED: (u64, u64, u64) = (0, 10, 0);
    /// `offload_optimizer.ratio` (partial offload, ZeRO stage 3, DeepSpeedCPUAdam).
    pub const RATIO: (u64, u64, u64) = (0, 12, 3);
    /// `offload_optimizer.super_offload` and `cpuadam_cores_perc`.
    pub const SUPER_OFFLOAD: (u64, u64, u64) = (0, 18, 0);
    /// The release whose SuperOffload fixes make it the sensible minimum.
    pub const SUPER_OFFLOAD_RECOMMENDED: (u64, u64, u64) = (0, 18, 9);
    /// `bf16.bf16_master_weights_and_grads` and `bf16.bf16_optimizer_states` beside
    /// `offload_optimizer`: the optimizer state kept in bf16 (first in the 0.19.1 release).
    pub const BF16_OPTIMIZER_STATES: (u64, u64, u64) = (0, 19, 1);
    /// `zero_optimization.zenflow` (first in the 0.17.5 release).
    pub const ZENFLOW: (u64, u64, u64) = (0, 17, 5);

    /// Whether `v` is at least the version triple `at`.
    pub fn has(v: &FrameworkVersion, at: (u64, u64, u64)) -> bool {
        v.at_least(at.0, at.1, at.2)
    }

    /// Formats a version triple.
    pub fn show(at: (u64, u64, u64)) -> String {
        format!("{}.{}.{}", at.0, at.1, at.2)
    }
}

/// PyTorch FSDP feature gates.
pub mod torch {
    use super::FrameworkVersion;

    /// FSDP2 (`CPUOffloadPolicy`, `FSDP_VERSION=2` in Accelerate) needs torch 2.6.
    pub const FSDP2: (u64, u64, u64) = (2, 6, 0);
    /// Oldest torch with FSDP `CPUOffload`.
    pub const MIN_SUPPORTED: (u64, u64, u64) = (1, 12, 0);

    /// Whether `v` is at least the version triple `at`.
    pub fn has(v: &FrameworkVersion, at: (u64, u64, u64)) -> bool {
        v.at_least(at.0, at.1, at.2)
    }
}

/// Megatron-core feature gates (its `megatron/training/arguments.py`, release by release).
pub mod megatron {
    use super::FrameworkVersion;

    /// Oldest Megatron-core the operator renders flags for.
    pub const MIN_SUPPORTED: (u64, u64, u64) = (0, 9, 0);
    /// The hybrid device optimizer: `--optimizer-cpu-offload`, `--optimizer-offload-fraction`,
    /// `--overlap-cpu-optimizer-d2h-h2d`, `--no-pin-cpu-grads` / `--no-pin-cpu-params` (with
    /// `--use-precision-aware-optimizer`, which the offload requires) — first in core_v0.12.0.
    pub const CPU_OFFLOAD: (u64, u64, u64) = (0, 12, 0);

    /// Whether `v` is at least the version triple `at`.
    pub fn has(v: &FrameworkVersion, at: (u64, u64, u64)) -> bool {
        v.at_least(at.0, at.1, at.2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_orders_pep440_versions() {
        let v = FrameworkVersion::parse("0.18.9").unwrap();
        assert!(v.at_least(0, 18, 0));
        assert!(v.at_least(0, 18, 9));
        assert!(!v.at_least(0, 19, 0));
        assert!(
            FrameworkVersion::parse("2.6.0+cu124")
                .unwrap()
                .at_least(2, 6, 0)
        );
        assert!(
            !FrameworkVersion::parse("0.18.0rc1")
                .unwrap()
                .at_least(0, 18, 0)
        );
        assert!(FrameworkVersion::parse("0.19").unwrap().at_least(0, 18, 9));
    }

    #[test]
    fn rejects_garbage_with_the_input_in_the_message() {
        let err = FrameworkVersion::parse("latest").unwrap_err();
        assert!(err.to_string().contains("\"latest\""), "{err}");
    }
}
