//! The frameworks: what the declared framework and version can take, and how each one turns
//! the decided configuration into its own keys (DeepSpeed and FSDP here, Megatron-core in
//! [`megatron`]); the user's DeepSpeed config as the decision reads it ([`user_config`]).

use super::resolution::Why;
use offload_api::v1alpha1::ReasonCode;
use offload_api::v1alpha1::{Framework, NodeClass, OffloadMode};
use offload_api::version::{self, FrameworkVersion};

use super::error::ResolveError;
use super::request::{DeepSpeedRequest, JobRequest};
use super::settings::DEFAULT_ZERO_STAGE;
use crate::decision::model::memory::Placement;

mod megatron;
pub(in crate::decision) mod user_config;

use megatron::{check_megatron, megatron_plan};
pub(super) use megatron::{megatron_can_offload, megatron_offload_blocker};

/// How the framework receives the configuration.
#[derive(Clone, Debug, PartialEq)]
pub enum FrameworkPlan {
    /// DeepSpeed JSON keys.
    DeepSpeed(DeepSpeedPlan),
    /// Accelerate FSDP env vars.
    Fsdp(FsdpPlan),
    /// Megatron-core flags (and the NeMo / Megatron-Bridge overrides of the same settings).
    Megatron(MegatronPlan),
    /// `OFFLOAD_*` env vars only.
    Generic,
}

/// What to write into DeepSpeed's `zero_optimization`.
#[derive(Clone, Debug, PartialEq)]
pub struct DeepSpeedPlan {
    /// The declared version.
    pub version: FrameworkVersion,
    /// ZeRO stage.
    pub stage: u8,
    /// Whether to write `zero_optimization.stage` (the user's JSON does not state it).
    pub write_stage: bool,
    /// Write `offload_param` too.
    pub offload_params: bool,
    /// Write `super_offload: true` and `cpuadam_cores_perc`.
    pub super_offload: bool,
    /// Write `ratio` (partial offload).
    pub write_ratio: bool,
    /// Write a `zenflow` section (asynchronous updates, with consent).
    pub zenflow: bool,
    /// Write `zero_optimization.sub_group_size` (with a partial ratio, where the user's config
    /// sets none: the share offloaded is counted in whole sub-groups).
    pub sub_group_size: Option<u64>,
    /// Write `bf16.bf16_master_weights_and_grads` and `bf16.bf16_optimizer_states`: the
    /// optimizer state in bf16 under offload (with consent, where nothing in fp32 fits).
    pub bf16_optimizer_states: bool,
}

/// Accelerate FSDP switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsdpPlan {
    /// FSDP generation, 1 or 2.
    pub fsdp_version: u8,
    /// `FSDP_OFFLOAD_PARAMS`.
    pub offload_params: bool,
}

/// Megatron-core's hybrid device optimizer, as the decision sets it.
#[derive(Clone, Debug, PartialEq)]
pub struct MegatronPlan {
    /// The declared Megatron-core version.
    pub version: FrameworkVersion,
    /// `--optimizer-cpu-offload` (with `--use-precision-aware-optimizer`, which it requires).
    pub cpu_offload: bool,
    /// `--optimizer-offload-fraction`: the share of each rank's optimizer state on the host.
    pub fraction: f64,
    /// `--overlap-cpu-optimizer-d2h-h2d`: the gradients' copy to the host and the updated
    /// parameters' copy back overlap the CPU step.
    pub overlap: bool,
    /// `--use-distributed-optimizer`.
    pub distributed_optimizer: bool,
    /// `--manual-gc` (with `--manual-gc-interval`): with offload, a collection as training
    /// starts frees the hybrid device optimizer's first copy of the parameters.
    pub manual_gc: bool,
}

/// Steps between Megatron-LM's collections under `--manual-gc` (`--manual-gc-interval`, as
/// NVIDIA's own performance recipes set it): 0 would leave Python's collector off for the whole
/// run.
pub const MANUAL_GC_INTERVAL: u32 = 100;

/// Validated framework facts.
pub(super) struct FrameworkFacts {
    pub(super) version: Option<FrameworkVersion>,
    pub(super) stage: u8,
    pub(super) stage_defaulted: bool,
}

/// Checks the declared framework, version and ZeRO stage before anything else is decided.
pub(super) fn check(job: &JobRequest) -> Result<FrameworkFacts, ResolveError> {
    let kind = job.framework.name;
    let version = match (kind, job.framework.version.as_deref()) {
        (Framework::Generic, _) => None,
        (_, None) => return Err(ResolveError::MissingVersion { framework: kind }),
        (_, Some(v)) => Some(FrameworkVersion::parse(v)?),
    };
    let minimum = match kind {
        Framework::DeepSpeed => Some(version::deepspeed::MIN_SUPPORTED),
        Framework::Fsdp => Some(version::torch::MIN_SUPPORTED),
        Framework::Megatron => Some(version::megatron::MIN_SUPPORTED),
        Framework::Generic => None,
    };
    if let (Some(v), Some(min)) = (&version, minimum)
        && !v.at_least(min.0, min.1, min.2)
    {
        return Err(ResolveError::UnsupportedVersion {
            framework: kind,
            version: v.to_string(),
            minimum: version::deepspeed::show(min),
        });
    }
    let ds = &job.deepspeed;
    let (stage, stage_defaulted) = match (ds.stage_in_spec, ds.stage_in_config) {
        (Some(s), Some(c)) if s != c => {
            return Err(ResolveError::StageConflict { spec: s, config: c });
        }
        (Some(s), _) | (None, Some(s)) => (s, false),
        (None, None) => (DEFAULT_ZERO_STAGE, true),
    };
    if kind == Framework::DeepSpeed {
        if ds.offload_params == Some(true) && stage != 3 {
            return Err(ResolveError::FrameworkCannot {
                problem: format!(
                    "deepspeed.offloadParams needs ZeRO stage 3, the job uses stage {stage}"
                ),
                change: "set deepspeed.offloadParams to false or use ZeRO stage 3".to_string(),
            });
        }
        if ds.super_offload == Some(true)
            && let Some(v) = &version
            && !version::deepspeed::has(v, version::deepspeed::SUPER_OFFLOAD)
        {
            return Err(ResolveError::FrameworkCannot {
                problem: format!(
                    "deepspeed.superOffload needs DeepSpeed {} or newer, the image has {v}",
                    version::deepspeed::show(version::deepspeed::SUPER_OFFLOAD)
                ),
                change: "upgrade DeepSpeed or remove deepspeed.superOffload".to_string(),
            });
        }
    }
    if kind == Framework::Megatron {
        check_megatron(job, version.as_ref())?;
    }
    Ok(FrameworkFacts {
        version,
        stage,
        stage_defaulted,
    })
}

/// Whether the framework can take a ratio below 1, or why not.
pub(super) fn partial_ratio_support(
    job: &JobRequest,
    facts: &FrameworkFacts,
) -> Result<(), String> {
    match job.framework.name {
        Framework::Generic => Ok(()),
        Framework::Fsdp => Err("FSDP has no partial-offload switch".to_string()),
        Framework::Megatron => match megatron_offload_blocker(job, facts.version.as_ref()) {
            None => Ok(()),
            Some(b) => Err(format!("{}: {}", b.problem, b.change)),
        },
        Framework::DeepSpeed => {
            let Some(v) = &facts.version else {
                return Err("the DeepSpeed version is unknown".to_string());
            };
            if facts.stage != 3 {
                Err(format!(
                    "DeepSpeed offload_optimizer.ratio needs ZeRO stage 3, the job uses stage {}",
                    facts.stage
                ))
            } else if !version::deepspeed::has(v, version::deepspeed::RATIO) {
                Err(format!(
                    "DeepSpeed offload_optimizer.ratio needs DeepSpeed {} or newer, the image has {v}",
                    version::deepspeed::show(version::deepspeed::RATIO)
                ))
            } else {
                Ok(())
            }
        }
    }
}

/// What the memory model placed, for the framework's keys.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct MemoryPlan {
    /// Where it placed the state, when the job gives model hints.
    pub(super) placement: Option<Placement>,
    /// The sub-group size to write with a partial ratio.
    pub(super) sub_group_size: Option<u64>,
    /// `placement` is a rung of `unknownSize: TryFastest`, not what the model sized.
    pub(super) rung: bool,
    /// The placement keeps the optimizer state in bf16 (a consenting job that fits nothing in
    /// fp32).
    pub(super) bf16_states: bool,
}

/// How the framework realises the configuration, with the reasons (one or two sentences).
#[allow(clippy::too_many_arguments)]
pub(super) fn plan(
    job: &JobRequest,
    facts: &FrameworkFacts,
    mode: OffloadMode,
    overlap: bool,
    ratio: f64,
    node_class: Option<NodeClass>,
    profile_allows_zenflow: bool,
    memory: MemoryPlan,
) -> (FrameworkPlan, Vec<Why>) {
    let mut why: Vec<Why> = Vec::new();
    let mut plan = plan_inner(
        job, facts, mode, overlap, ratio, node_class, memory, &mut why,
    );
    if let FrameworkPlan::DeepSpeed(ds) = &mut plan {
        ds.zenflow = zenflow(
            job,
            facts,
            ds,
            mode,
            overlap,
            ratio,
            profile_allows_zenflow,
            &mut why,
        );
        if ds.zenflow {
            ds.super_offload = false;
        }
        if ds.bf16_optimizer_states {
            why.push(Why::summed(
                ReasonCode::Bf16OptimizerStates,
                "optimizer state in bf16 under offload: nothing in fp32 fits, and the job consented (it changes the numerics)",
                "bf16.bf16_master_weights_and_grads and bf16.bf16_optimizer_states: the master weights, gradients and Adam moments in bf16, about half the host memory of the offloaded state in fp32; written because no configuration in fp32 fits and the job (spec.deepspeed.bf16OptimizerStates, its own config) or its profile (allowBf16OptimizerStates) consented to the change in numerics",
            ));
        }
        // What overlap means in the keys written.
        match mode {
            OffloadMode::CpuCopy if !ds.zenflow => why.push(Why::summed(
                ReasonCode::NoOverlapSwitch,
                format!(
                    "overlap {}: DeepSpeed's CPU offload has no overlap key here; OFFLOAD_OVERLAP={} tells the training code",
                    if overlap { "on" } else { "off" },
                    u8::from(overlap)
                ),
                format!(
                    "overlap {} writes no DeepSpeed key on this node: DeepSpeed's CPU offload has no overlap switch here short of ZenFlow (asynchronous updates, which need consent); OFFLOAD_OVERLAP={} tells the training code",
                    if overlap { "on" } else { "off" },
                    u8::from(overlap)
                ),
            )),
            OffloadMode::UnifiedMemory if !overlap && !ds.super_offload => {
                say(
                    &mut why,
                    ReasonCode::SuperOffload,
                    "SuperOffload off: overlap is off for this job",
                )
            }
            _ => {}
        }
    } else if let FrameworkPlan::Fsdp(_) = plan
        && mode != OffloadMode::Disabled
    {
        say(
            &mut why,
            ReasonCode::NoOverlapSwitch,
            format!(
                "FSDP has no switch for overlapping the optimizer update with GPU work: OFFLOAD_OVERLAP={} reaches the training code as env only",
                u8::from(overlap)
            ),
        );
    }
    (plan, why)
}

/// Whether to write ZenFlow: only with consent (the job's `deepspeed.zenFlow`, a `zenflow`
/// section in the user's own config, or the profile's `allowZenFlow` for jobs that leave it
/// unset), only for copy offload with overlap on, a full ratio, a DeepSpeed that has it and a
/// ZeRO stage from 1 to 3.
#[allow(clippy::too_many_arguments)]
fn zenflow(
    job: &JobRequest,
    facts: &FrameworkFacts,
    plan: &DeepSpeedPlan,
    mode: OffloadMode,
    overlap: bool,
    ratio: f64,
    profile_allows: bool,
    why: &mut Vec<Why>,
) -> bool {
    let ds = &job.deepspeed;
    let (consent, by) = match (ds.zen_flow, ds.zenflow_in_config, profile_allows) {
        (Some(false), _, _) => (false, "deepspeed.zenFlow is false"),
        (Some(true), _, _) => (true, "deepspeed.zenFlow is true"),
        (None, true, _) => (true, "the job's DeepSpeed config has a zenflow section"),
        (None, false, true) => (true, "the profile allows it (allowZenFlow)"),
        (None, false, false) => (false, ""),
    };
    if !consent {
        if ds.zen_flow == Some(false) {
            say(why, ReasonCode::ZenFlow, format!("ZenFlow off: {by}"));
        }
        return false;
    }
    let blocker = if mode == OffloadMode::Disabled {
        Some("offload is disabled".to_string())
    } else if !version::deepspeed::has(&plan.version, version::deepspeed::ZENFLOW) {
        Some(format!(
            "DeepSpeed {} predates it (it needs {} or newer)",
            plan.version,
            version::deepspeed::show(version::deepspeed::ZENFLOW)
        ))
    } else if facts.stage == 0 {
        Some("it needs ZeRO stage 1, 2 or 3".to_string())
    } else if !overlap {
        Some("overlap is off for this job".to_string())
    } else if ratio < 1.0 {
        Some(format!(
            "the offload ratio is {ratio}: ZenFlow is written only for full offload"
        ))
    } else {
        None
    };
    match blocker {
        Some(b) => {
            say(
                why,
                ReasonCode::ZenFlow,
                format!("ZenFlow not written although {by}: {b}"),
            );
            false
        }
        None => {
            let where_ = if mode == OffloadMode::UnifiedMemory {
                " (on a coherent node, where SuperOffload would otherwise be used)"
            } else {
                ""
            };
            why.push(Why::summed(
                ReasonCode::ZenFlow,
                format!(
                    "ZenFlow on because {by}: the CPU update of the less important gradient columns is asynchronous, every {ZENFLOW_UPDATE_INTERVAL} steps"
                ),
                format!(
                    "ZenFlow on because {by}{where_}: the CPU update of the less important gradient columns is applied asynchronously every {ZENFLOW_UPDATE_INTERVAL} steps (a change to the optimisation, measured faster on a PCIe H200)"
                ),
            ));
            true
        }
    }
}

/// `zenflow.update_interval` the operator writes.
pub const ZENFLOW_UPDATE_INTERVAL: u32 = 4;
/// `zenflow.topk_ratio` the operator writes.
pub const ZENFLOW_TOPK_RATIO: f64 = 0.05;

fn say(why: &mut Vec<Why>, code: ReasonCode, message: impl Into<String>) {
    why.push(Why::new(code, message));
}

#[allow(clippy::too_many_arguments)]
fn plan_inner(
    job: &JobRequest,
    facts: &FrameworkFacts,
    mode: OffloadMode,
    overlap: bool,
    ratio: f64,
    node_class: Option<NodeClass>,
    memory: MemoryPlan,
    why: &mut Vec<Why>,
) -> FrameworkPlan {
    match (job.framework.name, &facts.version) {
        (Framework::DeepSpeed, Some(version)) => {
            let ds = &job.deepspeed;
            let super_offload = super_offload(ds, version, mode, overlap, node_class, why);
            let write_ratio = mode != OffloadMode::Disabled
                && facts.stage == 3
                && version::deepspeed::has(version, version::deepspeed::RATIO)
                && (ratio < 1.0 || super_offload);
            let offload_params = offload_params(ds, facts, mode, ratio, super_offload, memory, why);
            let stage_note = if facts.stage_defaulted {
                format!(
                    "ZeRO stage {} assumed (neither deepspeed.zeroStage nor the config names one) and written",
                    facts.stage
                )
            } else {
                format!("ZeRO stage {}", facts.stage)
            };
            let what = match mode {
                OffloadMode::Disabled => "offload_optimizer.device none".to_string(),
                _ if offload_params => "offload_optimizer and offload_param on the CPU".to_string(),
                _ => "offload_optimizer on the CPU".to_string(),
            };
            say(
                why,
                ReasonCode::FrameworkSettings,
                format!("DeepSpeed {version}: {what}, {stage_note}, pin_memory written explicitly"),
            );
            FrameworkPlan::DeepSpeed(DeepSpeedPlan {
                version: version.clone(),
                stage: facts.stage,
                write_stage: facts.stage_defaulted,
                offload_params,
                super_offload,
                write_ratio,
                zenflow: false,
                sub_group_size: memory.sub_group_size.filter(|_| write_ratio && ratio < 1.0),
                bf16_optimizer_states: memory.bf16_states && mode != OffloadMode::Disabled,
            })
        }
        (Framework::Fsdp, Some(version)) => fsdp_plan(version, mode, memory, why),
        (Framework::Megatron, Some(version)) => {
            megatron_plan(job, version, mode, overlap, ratio, why)
        }
        _ => {
            say(
                why,
                ReasonCode::FrameworkSettings,
                "Generic: the configuration reaches the process through OFFLOAD_* env vars only",
            );
            FrameworkPlan::Generic
        }
    }
}

/// Whether DeepSpeed's SuperOffload is written: asked for, or overlapped offload on a coherent
/// node where the version has it.
fn super_offload(
    ds: &DeepSpeedRequest,
    version: &FrameworkVersion,
    mode: OffloadMode,
    overlap: bool,
    node_class: Option<NodeClass>,
    why: &mut Vec<Why>,
) -> bool {
    let can_super = version::deepspeed::has(version, version::deepspeed::SUPER_OFFLOAD);
    match (mode, ds.super_offload) {
        (OffloadMode::Disabled, _) => false,
        (_, Some(false)) => {
            say(
                why,
                ReasonCode::SuperOffload,
                "SuperOffload off: deepspeed.superOffload is false",
            );
            false
        }
        (_, Some(true)) => {
            if node_class == Some(NodeClass::Discrete) {
                say(
                    why,
                    ReasonCode::SuperOffload,
                    "SuperOffload on because deepspeed.superOffload asks for it; note it was measured 2.2x slower than plain CPU offload on a PCIe H200",
                );
            } else {
                say(
                    why,
                    ReasonCode::SuperOffload,
                    "SuperOffload on: deepspeed.superOffload asks for it",
                );
            }
            true
        }
        (OffloadMode::UnifiedMemory, None) if overlap && can_super => {
            if version::deepspeed::has(version, version::deepspeed::SUPER_OFFLOAD_RECOMMENDED) {
                say(
                    why,
                    ReasonCode::SuperOffload,
                    "SuperOffload on: overlapped offload on a coherent node",
                );
            } else {
                say(
                    why,
                    ReasonCode::SuperOffload,
                    format!(
                        "SuperOffload on: overlapped offload on a coherent node; DeepSpeed {version} has it, but {} carries its fixes",
                        version::deepspeed::show(version::deepspeed::SUPER_OFFLOAD_RECOMMENDED)
                    ),
                );
            }
            true
        }
        (OffloadMode::UnifiedMemory, None) if overlap => {
            say(
                why,
                ReasonCode::SettingLowered,
                format!(
                    "SuperOffload lowered to DeepSpeed's standard asynchronous CPU offload: DeepSpeed {version} predates SuperOffload (upgrade to {} or newer to use it)",
                    version::deepspeed::show(version::deepspeed::SUPER_OFFLOAD_RECOMMENDED)
                ),
            );
            false
        }
        (OffloadMode::CpuCopy, None) if overlap => {
            say(
                why,
                ReasonCode::SuperOffload,
                "standard asynchronous CPU offload, not SuperOffload: SuperOffload targets coherent nodes and was measured slower on PCIe",
            );
            false
        }
        (_, None) => false,
    }
}

/// Whether parameters are offloaded too (`offload_param`): asked for, or what the memory plan
/// (or, without one, the measured full-copy case) says.
fn offload_params(
    ds: &DeepSpeedRequest,
    facts: &FrameworkFacts,
    mode: OffloadMode,
    ratio: f64,
    super_offload: bool,
    memory: MemoryPlan,
    why: &mut Vec<Why>,
) -> bool {
    match (ds.offload_params, mode, memory.placement) {
        (_, OffloadMode::Disabled, _) => false,
        (Some(asked), _, _) => asked,
        (None, _, Some(Placement::OptimizerAndParams)) if memory.rung => {
            say(
                why,
                ReasonCode::ParametersOffloaded,
                "offload_param on: the job ran out of GPU memory with the optimizer state offloaded, so parameters go too (unknownSize TryFastest)",
            );
            true
        }
        (None, _, Some(Placement::Optimizer)) if memory.rung => {
            say(
                why,
                ReasonCode::ParametersOffloaded,
                "offload_param off: unknownSize TryFastest offloads the optimizer state before the parameters",
            );
            false
        }
        (None, _, Some(Placement::OptimizerAndParams)) => {
            why.push(Why::summed(
                ReasonCode::ParametersOffloaded,
                "offload_param on: no partial share small enough to beat offloading parameters too fits the GPU, and both fit host memory",
                "offload_param on: the optimizer state does not fit on the GPU in a share small enough to beat offloading parameters too, and both fit host memory (measured faster than a partial share above 45% on a PCIe H200 with its 16 cores; fewer cores for the pod keep a partial share longer)",
            ));
            true
        }
        (None, _, Some(Placement::Optimizer)) => {
            say(
                why,
                ReasonCode::ParametersOffloaded,
                "offload_param off: parameters offloaded too would not fit host memory",
            );
            false
        }
        (None, _, Some(_)) => false,
        (None, OffloadMode::CpuCopy, None)
            if facts.stage == 3 && ratio >= 1.0 && !super_offload =>
        {
            why.push(Why::summed(
                ReasonCode::ParametersOffloaded,
                "offload_param on: with ZeRO-3 and full copy offload it steps faster, same training semantics; deepspeed.offloadParams: false keeps parameters on the GPU",
                "offload_param on (deepspeed.offloadParams unset): with ZeRO-3 and full copy offload it was measured about 1.5x faster on a PCIe H200 (0.3B and 2B parameters), with the same training semantics; set deepspeed.offloadParams: false to keep parameters on the GPU",
            ));
            true
        }
        (None, _, None) => false,
    }
}

/// FSDP's plan: its version from torch's, parameters offloaded for copy offload where memory
/// needs it.
fn fsdp_plan(
    version: &FrameworkVersion,
    mode: OffloadMode,
    memory: MemoryPlan,
    why: &mut Vec<Why>,
) -> FrameworkPlan {
    let fsdp_version = if version::torch::has(version, version::torch::FSDP2) {
        2
    } else {
        1
    };
    let offload_params =
        mode == OffloadMode::CpuCopy && memory.placement != Some(Placement::NoOffload);
    let message = match mode {
        OffloadMode::CpuCopy => {
            format!("FSDP{fsdp_version} (torch {version}) with CPU offload of parameters")
        }
        OffloadMode::UnifiedMemory => format!(
            "FSDP{fsdp_version} (torch {version}) without copy offload: FSDP has no unified-memory switch, so residency is left to the training code through OFFLOAD_MODE=unified-memory"
        ),
        OffloadMode::Disabled => {
            format!("FSDP{fsdp_version} (torch {version}) without offload")
        }
    };
    say(why, ReasonCode::FrameworkSettings, message);
    FrameworkPlan::Fsdp(FsdpPlan {
        fsdp_version,
        offload_params,
    })
}
