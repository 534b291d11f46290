//! Reason codes: what decided each field of a job's offload configuration, as a closed set a
//! runbook, an alert or a script can name. Each reason in `status.offload.reasons` carries one
//! beside its sentence; `offload-operator explain` gives the long account.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What decided one field of a job's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ReasonCode {
    // mode
    /// The job fits its GPUs without offload, the fastest configuration; the sentence gives the
    /// GPU memory it needs and the headroom left.
    FitsWithoutOffload,
    /// The job does not fit its GPUs without offload: the least offload that fits was chosen
    /// (a share of the optimizer state, then all of it, then parameters too).
    SmallestOffloadThatFits,
    /// What earlier runs of the job's shape proved chose the configuration: the fastest that
    /// trained, or the one a run that ran out of memory sends the job back to.
    ProvenByRuns,
    /// A trial of one rung faster than the fastest configuration that trained for the shape,
    /// which that run's own figures say fits; should it run out, the job goes back.
    FasterTrial,
    /// The job or its profile set the mode; the decision checked that it runs.
    ModeRequested,
    /// Without model hints, `mode: Auto` offloads all of the optimizer state so that the job
    /// runs whatever its size (`unknownSize: Safest`); model hints let it offload only what
    /// does not fit.
    NoModelHints,
    /// Without model hints on `unknownSize: TryFastest`: the job starts without offload and
    /// takes one rung more per GPU out-of-memory failure.
    TryFastest,
    /// The host memory the configuration counts on is written as the training container's
    /// memory request, so the scheduler and quota systems see it.
    HostMemoryRequested,
    /// The profile's `wholeCores`: the training container asks for whole cores of its own near
    /// the GPU (a Guaranteed pod under the static CPU manager).
    WholeCoresRequested,
    /// The profile's `wholeCores` could not be granted; the sentence names the missing
    /// condition.
    WholeCoresNotAsked,
    // nodeClass
    /// The pods are pinned to one node class by a required node affinity.
    PinnedToClass,
    /// No node class is required: the configuration runs on any GPU node the job may use.
    AnyNodeClass,
    /// The job's DRA claims are copied with selectors for the decided class's GPUs.
    ClaimsPinned,
    // overlap
    /// Overlap on: every chosen node's self-test measured at least the profile's minimum.
    OverlapVerified,
    /// Overlap set by the job or its profile.
    OverlapRequested,
    /// Overlap off: a chosen node has not verified it (no report, no self-test, failed).
    OverlapNotVerified,
    /// Overlap off: a chosen node's self-test measured less than the profile's minimum.
    OverlapBelowMinimum,
    /// Nothing is offloaded, so overlap, pinning and the ratio do not apply.
    NothingOffloaded,
    // pinMemory
    /// Pinned host memory set by the job or its profile.
    PinMemoryRequested,
    /// The agent could not allocate pinned memory on a chosen node.
    PinnedMemoryUnavailable,
    // offloadRatio
    /// The smallest share of the optimizer state whose offload fits.
    SmallestShareThatFits,
    /// The ratio set by the job or its profile, checked to fit.
    RatioRequested,
    /// All of the optimizer state is offloaded.
    WholeOptimizerState,
    /// The profile's ratio was lowered to 1: the framework or version cannot offload a share.
    RatioLowered,
    // framework
    /// The framework settings written, in one line.
    FrameworkSettings,
    /// DeepSpeed's SuperOffload on or off.
    SuperOffload,
    /// SuperOffload on Grace nodes whose kernel lacks what its setup guidance asks for (MPAM's
    /// resctrl partitions): it runs, with the CPU optimizer sharing caches and memory bandwidth.
    SuperOffloadSetup,
    /// DeepSpeed's ZenFlow on or off (only with consent: it changes the optimisation).
    ZenFlow,
    /// The optimizer state kept in bf16 under offload (only with consent: it changes the
    /// numerics), where nothing in fp32 fits.
    Bf16OptimizerStates,
    /// DeepSpeed's `offload_param`: parameters offloaded too, or kept on the GPU.
    ParametersOffloaded,
    /// A setting the declared framework version cannot take was lowered to one it can.
    SettingLowered,
    /// The framework has no switch for overlap here; it reaches the training code as env.
    NoOverlapSwitch,
    /// `OMP_NUM_THREADS` written for the training container's CPU limit.
    CpuThreads,
    /// Megatron-core's hybrid device optimizer flags.
    MegatronOptimizer,
    /// Megatron-LM's `--manual-gc`, which frees the hybrid optimizer's first copy of the
    /// parameters as training starts.
    MegatronGarbageCollection,
}

impl ReasonCode {
    /// Every code, in the order the reference lists them.
    pub const ALL: [ReasonCode; 35] = [
        ReasonCode::FitsWithoutOffload,
        ReasonCode::SmallestOffloadThatFits,
        ReasonCode::ProvenByRuns,
        ReasonCode::FasterTrial,
        ReasonCode::ModeRequested,
        ReasonCode::NoModelHints,
        ReasonCode::TryFastest,
        ReasonCode::HostMemoryRequested,
        ReasonCode::WholeCoresRequested,
        ReasonCode::WholeCoresNotAsked,
        ReasonCode::PinnedToClass,
        ReasonCode::AnyNodeClass,
        ReasonCode::ClaimsPinned,
        ReasonCode::OverlapVerified,
        ReasonCode::OverlapRequested,
        ReasonCode::OverlapNotVerified,
        ReasonCode::OverlapBelowMinimum,
        ReasonCode::NothingOffloaded,
        ReasonCode::PinMemoryRequested,
        ReasonCode::PinnedMemoryUnavailable,
        ReasonCode::SmallestShareThatFits,
        ReasonCode::RatioRequested,
        ReasonCode::WholeOptimizerState,
        ReasonCode::RatioLowered,
        ReasonCode::FrameworkSettings,
        ReasonCode::SuperOffload,
        ReasonCode::SuperOffloadSetup,
        ReasonCode::ZenFlow,
        ReasonCode::Bf16OptimizerStates,
        ReasonCode::ParametersOffloaded,
        ReasonCode::SettingLowered,
        ReasonCode::NoOverlapSwitch,
        ReasonCode::CpuThreads,
        ReasonCode::MegatronOptimizer,
        ReasonCode::MegatronGarbageCollection,
    ];

    /// The fields of a configuration this code explains (`mode`, `nodeClass`, `overlap`,
    /// `pinMemory`, `offloadRatio`, `framework`).
    pub fn fields(self) -> &'static [&'static str] {
        use ReasonCode as C;
        match self {
            C::FitsWithoutOffload
            | C::SmallestOffloadThatFits
            | C::ModeRequested
            | C::TryFastest
            | C::HostMemoryRequested
            | C::WholeCoresRequested
            | C::WholeCoresNotAsked => &["mode"],
            C::ProvenByRuns | C::FasterTrial => &["mode", "offloadRatio"],
            C::NoModelHints => &["mode", "offloadRatio"],
            C::PinnedToClass | C::AnyNodeClass | C::ClaimsPinned => &["nodeClass"],
            C::OverlapVerified
            | C::OverlapRequested
            | C::OverlapNotVerified
            | C::OverlapBelowMinimum => &["overlap"],
            C::NothingOffloaded => &["overlap", "pinMemory", "offloadRatio"],
            C::PinMemoryRequested | C::PinnedMemoryUnavailable => &["pinMemory"],
            C::SmallestShareThatFits
            | C::RatioRequested
            | C::WholeOptimizerState
            | C::RatioLowered => &["offloadRatio"],
            C::FrameworkSettings
            | C::SuperOffload
            | C::SuperOffloadSetup
            | C::Bf16OptimizerStates
            | C::ZenFlow
            | C::ParametersOffloaded
            | C::SettingLowered
            | C::NoOverlapSwitch
            | C::CpuThreads
            | C::MegatronOptimizer
            | C::MegatronGarbageCollection => &["framework"],
        }
    }

    /// The code as it is written (`FitsWithoutOffload`).
    pub fn as_str(self) -> &'static str {
        match self {
            ReasonCode::FitsWithoutOffload => "FitsWithoutOffload",
            ReasonCode::SmallestOffloadThatFits => "SmallestOffloadThatFits",
            ReasonCode::ProvenByRuns => "ProvenByRuns",
            ReasonCode::FasterTrial => "FasterTrial",
            ReasonCode::ModeRequested => "ModeRequested",
            ReasonCode::NoModelHints => "NoModelHints",
            ReasonCode::TryFastest => "TryFastest",
            ReasonCode::HostMemoryRequested => "HostMemoryRequested",
            ReasonCode::WholeCoresRequested => "WholeCoresRequested",
            ReasonCode::WholeCoresNotAsked => "WholeCoresNotAsked",
            ReasonCode::PinnedToClass => "PinnedToClass",
            ReasonCode::AnyNodeClass => "AnyNodeClass",
            ReasonCode::ClaimsPinned => "ClaimsPinned",
            ReasonCode::OverlapVerified => "OverlapVerified",
            ReasonCode::OverlapRequested => "OverlapRequested",
            ReasonCode::OverlapNotVerified => "OverlapNotVerified",
            ReasonCode::OverlapBelowMinimum => "OverlapBelowMinimum",
            ReasonCode::NothingOffloaded => "NothingOffloaded",
            ReasonCode::PinMemoryRequested => "PinMemoryRequested",
            ReasonCode::PinnedMemoryUnavailable => "PinnedMemoryUnavailable",
            ReasonCode::SmallestShareThatFits => "SmallestShareThatFits",
            ReasonCode::RatioRequested => "RatioRequested",
            ReasonCode::WholeOptimizerState => "WholeOptimizerState",
            ReasonCode::RatioLowered => "RatioLowered",
            ReasonCode::FrameworkSettings => "FrameworkSettings",
            ReasonCode::SuperOffload => "SuperOffload",
            ReasonCode::SuperOffloadSetup => "SuperOffloadSetup",
            ReasonCode::ZenFlow => "ZenFlow",
            ReasonCode::Bf16OptimizerStates => "Bf16OptimizerStates",
            ReasonCode::ParametersOffloaded => "ParametersOffloaded",
            ReasonCode::SettingLowered => "SettingLowered",
            ReasonCode::NoOverlapSwitch => "NoOverlapSwitch",
            ReasonCode::CpuThreads => "CpuThreads",
            ReasonCode::MegatronOptimizer => "MegatronOptimizer",
            ReasonCode::MegatronGarbageCollection => "MegatronGarbageCollection",
        }
    }
}

impl std::fmt::Display for ReasonCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_listed_once_and_written_as_serde_writes_it() {
        let mut seen = std::collections::BTreeSet::new();
        for code in ReasonCode::ALL {
            assert!(seen.insert(code.as_str()), "{code} twice");
            assert_eq!(
                serde_json::to_value(code).unwrap(),
                serde_json::Value::String(code.as_str().to_string())
            );
        }
        // The source's variants, counted from the enum itself: a new one must join ALL.
        let source = include_str!("reason.rs");
        let body = &source[source.find("pub enum ReasonCode {").unwrap()..];
        let body = &body[..body.find("\n}\n").unwrap()];
        let variants = body
            .lines()
            .filter(|l| {
                let t = l.trim();
                t.ends_with(',') && !t.starts_with("//") && !t.starts_with('#')
            })
            .count();
        assert_eq!(variants, ReasonCode::ALL.len());
    }
}
