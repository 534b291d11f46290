//! The decision's shared settings: the defaults and bounds every step reads, and how a job's
//! setting and its profile's combine ([`effective`]).

use std::fmt;

/// Default ZeRO stage when neither the job nor the user's DeepSpeed JSON names one.
pub const DEFAULT_ZERO_STAGE: u8 = 3;
/// `cpuadam_cores_perc` written with SuperOffload: DeepSpeed's own example value.
pub const SUPER_OFFLOAD_CPU_SHARE: f64 = 0.9;
/// Smallest ratio `offloadRatio: Auto` picks; below it offload is not worth its copies.
pub const MIN_AUTO_RATIO: f64 = 0.05;

/// Most nodes a claim-pinned job's affinity lists as excluded; with more, the job is pinned
/// by the agent's labels instead.
pub const MAX_EXCLUDED_NODES: usize = 128;

/// Where an effective setting came from, for reasons.
#[derive(Clone, Copy)]
pub(crate) enum Source {
    Job,
    Profile,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Job => "the job",
            Source::Profile => "the profile",
        })
    }
}

/// The job's value unless it is `Auto`, then the profile's.
pub(crate) fn effective<T: PartialEq + Copy>(job: T, profile: T, auto: T) -> (T, Source) {
    if job != auto {
        (job, Source::Job)
    } else {
        (profile, Source::Profile)
    }
}
