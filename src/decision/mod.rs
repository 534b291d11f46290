//! The offload decision: a pure function from (job request, profile, nodes) to a concrete
//! configuration with a reason for every choice.
//!
//! No I/O happens here. The controller, the webhook and `offload-operator explain` all come in
//! through [`decide`] (a TrainingJob) or [`decide_request`] (another kind's request), which
//! build the request one way ([`JobRequest`]), pick the profile ([`selection`]) and call
//! [`resolve_offload`]; the same inputs always give the same output, whatever order the nodes
//! come in. It runs as steps, each in its own module, each giving its value and its reason:
//! framework facts ([`framework`]) → the job's [`memory`] model → placement: mode, node class
//! and what fits ([`placement`], [`fit`]) → [`overlap`] → [`pinning`] → offload [`ratio`] → the
//! framework's keys ([`framework`]).

mod constraints;
mod entry;
mod error;
mod fit;
mod framework;
pub mod learned;
pub mod lesson;
pub mod memory;
pub mod model_config;
mod overlap;
mod pinning;
mod placement;
mod ratio;
mod request;
mod selection;
pub mod shape;
mod user_config;

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

pub use constraints::PodConstraints;
pub use entry::{ClusterView, Unresolved, check_training_job, decide, decide_request, lesson_of};
pub use error::ResolveError;
pub use framework::{
    DeepSpeedPlan, FrameworkPlan, FsdpPlan, ZENFLOW_TOPK_RATIO, ZENFLOW_UPDATE_INTERVAL,
};
pub use model_config::{MODEL_CONFIG_KEY, ModelConfigError};
pub use request::{AdmittedRequest, DeepSpeedRequest, JobRequest, LearnedView, PodResources};
pub use selection::{
    ProfileNotFound, SelectedProfile, builtin_default_profile, explicit_offload, opted_in,
    profile_name, profile_name_for, requested_profile, select_profile,
};
pub use shape::ModelShape;
pub use user_config::{ConfigError, ConfigFacts, Precision, UserConfig};

use crate::index::NodeIndex;
use offload_api::report::NodeMemoryModel;
use offload_api::v1alpha1::{
    NodeClass, OffloadMode, OffloadProfileSpec, OffloadSpec, OverlapSetting, RatioSetting, Switch,
};

/// Default ZeRO stage when neither the job nor the user's DeepSpeed JSON names one.
pub const DEFAULT_ZERO_STAGE: u8 = 3;
/// `cpuadam_cores_perc` written with SuperOffload: DeepSpeed's own example value.
pub const SUPER_OFFLOAD_CPU_SHARE: f64 = 0.9;
/// Smallest ratio `offloadRatio: Auto` picks; below it offload is not worth its copies.
pub const MIN_AUTO_RATIO: f64 = 0.05;

/// The setting a reason explains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Field {
    /// The offload mode.
    Mode,
    /// The node class the pods are pinned to.
    NodeClass,
    /// Overlap on or off.
    Overlap,
    /// The offload ratio.
    OffloadRatio,
    /// Pinned host memory.
    PinMemory,
    /// How the framework realises the configuration.
    Framework,
}

impl Field {
    /// Every field; a resolution carries at least one reason for each.
    pub const ALL: [Field; 6] = [
        Field::Mode,
        Field::NodeClass,
        Field::Overlap,
        Field::OffloadRatio,
        Field::PinMemory,
        Field::Framework,
    ];

    /// The spec field name, as shown in status.
    pub fn as_str(self) -> &'static str {
        match self {
            Field::Mode => "mode",
            Field::NodeClass => "nodeClass",
            Field::Overlap => "overlap",
            Field::OffloadRatio => "offloadRatio",
            Field::PinMemory => "pinMemory",
            Field::Framework => "framework",
        }
    }
}

/// Why one setting has its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reason {
    /// The setting explained.
    pub field: Field,
    /// A sentence a person can act on.
    pub message: String,
}

/// A resolved, concrete offload configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolution {
    /// Profile used.
    pub profile: String,
    /// Concrete mode.
    pub mode: OffloadMode,
    /// Overlap on or off.
    pub overlap: bool,
    /// Offload ratio: in (0, 1], 0 when nothing is offloaded.
    pub ratio: f64,
    /// Pin host buffers.
    pub pin_memory: bool,
    /// Node class the pods must land on; `None` when offload is disabled.
    pub node_class: Option<NodeClass>,
    /// The profile's node selector, also binding scheduling.
    pub node_selector: Option<LabelSelector>,
    /// Lowest overlap efficiency measured on the chosen nodes.
    pub overlap_efficiency: Option<f64>,
    /// Framework rendering plan.
    pub framework: FrameworkPlan,
    /// One or more reasons per [`Field`], in decision order.
    pub reasons: Vec<Reason>,
    /// Whether the pods get the start-up guard (the profile's `startupGuard`).
    pub startup_guard: bool,
    /// What the memory model estimated for the placement written, where the job gives model
    /// hints.
    pub memory: Option<MemoryEstimate>,
    /// The job's GPU claims (entry → ResourceClaimTemplate) through which it is pinned to the
    /// node class: each gets a copy of its template selecting only the class's GPUs, and the
    /// pods get no class labels in their node affinity (nodes classed by the GPU driver alone
    /// carry none). Empty: the pods are pinned by the agent's labels.
    pub gpu_claims: Option<crate::dra::claims::ClaimPinning>,
    /// Nodes whose two witnesses (agent and GPU driver) disagree, kept out of a claim-pinned
    /// job's node affinity: its claims' selectors see only the driver's word.
    pub exclude_nodes: Vec<String>,
    /// The pod's DRA claim entries whose devices are GPUs: the start-up guard shares them.
    pub gpu_claim_entries: Vec<String>,
    /// The memory request the training container gets, where the decision counts on more host
    /// memory than it requests.
    pub memory_request: Option<MemoryRequest>,
    /// The request this was decided from (`spec.offload` as the user asked).
    pub requested: OffloadSpec,
    /// Where the configuration puts the training state.
    pub placement: memory::Placement,
    /// The training container's index in the pod template, where the pod has containers.
    pub training_container: Option<usize>,
}

/// The host memory the decision counts on, written as the training container's memory request
/// where the user's is lower or absent, so the scheduler and quota systems see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryRequest {
    /// The training container's index in the pod template.
    pub container: usize,
    /// The request, bytes (a whole number of MiB).
    pub bytes: u64,
    /// The user's request it replaces, where there was one.
    pub raised_from: Option<u64>,
}

/// Most nodes a claim-pinned job's affinity lists as excluded; with more, the job is pinned
/// by the agent's labels instead.
pub const MAX_EXCLUDED_NODES: usize = 128;

/// The memory model's figures for the placement a resolution writes.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryEstimate {
    /// Where the training state is placed.
    pub placement: memory::Placement,
    /// Bytes per GPU.
    pub gpu_bytes: u64,
    /// Bytes of GPU memory the estimate may use on the class's smallest GPU.
    pub gpu_budget_bytes: u64,
    /// Bytes of host memory per pod.
    pub host_bytes_per_pod: u64,
    /// Host memory one pod can have, where the nodes state it.
    pub host_budget_bytes: Option<u64>,
    /// Of `gpu_bytes`, the part without activations (counted exactly).
    pub gpu_structural_bytes: u64,
    /// The job's shape key.
    pub shape: String,
    /// What was learned for the shape on the class, in effect in these figures.
    pub learned: learned::LearnedFactors,
}

impl MemoryEstimate {
    fn of(jm: &memory::JobMemory, est: &memory::Estimate, cm: &memory::ClassMemory) -> Self {
        MemoryEstimate {
            placement: est.placement,
            gpu_bytes: memory::bytes(est.gpu),
            gpu_budget_bytes: memory::bytes(cm.gpu_budget()),
            host_bytes_per_pod: memory::bytes(est.host_per_pod),
            host_budget_bytes: cm.host_per_pod,
            gpu_structural_bytes: memory::bytes(est.structural),
            shape: jm.shape_key.clone(),
            learned: est.learned,
        }
    }
}

impl Resolution {
    /// The job's `spec.offload` with every `Auto` replaced by the concrete value.
    pub fn concrete_spec(&self) -> OffloadSpec {
        OffloadSpec {
            mode: self.mode.as_setting(),
            overlap: if self.overlap {
                OverlapSetting::Enabled
            } else {
                OverlapSetting::Disabled
            },
            offload_ratio: if self.mode == OffloadMode::Disabled {
                RatioSetting::None
            } else {
                RatioSetting::Fixed(self.ratio)
            },
            pin_memory: if self.pin_memory {
                Switch::Enabled
            } else {
                Switch::Disabled
            },
        }
    }

    /// Whether DeepSpeed SuperOffload is on.
    pub fn super_offload(&self) -> bool {
        matches!(&self.framework, FrameworkPlan::DeepSpeed(p) if p.super_offload)
    }

    /// The reasons joined into one paragraph, for Events.
    pub fn summary(&self) -> String {
        self.reasons
            .iter()
            .map(|r| format!("{}: {}", r.field.as_str(), r.message))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

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

#[derive(Default)]
struct Reasons(Vec<Reason>);

impl Reasons {
    fn add(&mut self, field: Field, message: impl Into<String>) {
        self.0.push(Reason {
            field,
            message: message.into(),
        });
    }
}

/// Resolves a job's offload configuration.
///
/// `profile_name` and `profile` are the profile the job uses (see [`select_profile`]); `nodes`
/// is every node the caller knows (nodes that are not candidates are skipped).
pub fn resolve_offload(
    job: &JobRequest,
    profile_name: &str,
    profile: &OffloadProfileSpec,
    nodes: &NodeIndex,
) -> Result<Resolution, ResolveError> {
    let facts = framework::check(job)?;
    partial_ratio_supported(job, &facts)?;
    let memory = fit::job_memory(job, &facts, profile_name)?;
    let mut reasons = Reasons::default();

    // Nodes whose agent and GPU driver disagree: a claim-pinned job's affinity excludes them
    // by name (its claims' selectors see only the driver's word); past a bound it is pinned by
    // the agent's labels instead.
    let exclude_nodes = disagreeing_nodes(job, nodes);
    let by_claims = job.gpu_claims.is_some() && exclude_nodes.len() <= MAX_EXCLUDED_NODES;
    let candidates =
        placement::Candidates::select(nodes, profile_name, profile, by_claims, &job.constraints)?;
    let placement = placement::choose(
        &placement::Context {
            job,
            facts: &facts,
            memory: memory.as_ref(),
            profile_name,
            profile,
        },
        &candidates,
    )?;
    reasons.add(Field::Mode, &placement.mode_why);
    let memory_request = memory_request(job, placement.memory.as_ref());
    if let Some(why) = memory_request.map(|r| memory_request_reason(job, &r)) {
        reasons.add(Field::Mode, why);
    }
    reasons.add(Field::NodeClass, &placement.class_why);

    let (overlap, overlap_efficiency, why) = overlap::decide(job, profile, &placement);
    reasons.add(Field::Overlap, why);

    let (pin_memory, why) = pinning::decide(job, profile, &placement);
    reasons.add(Field::PinMemory, why);

    let (ratio, why) = ratio::decide(job, profile, &facts, &placement)?;
    reasons.add(Field::OffloadRatio, why);

    let memory_plan = framework::MemoryPlan {
        placement: placement
            .memory
            .as_ref()
            .map(|c| c.placement)
            .or(placement.rung),
        rung: placement.memory.is_none() && placement.rung.is_some(),
        sub_group_size: match (&memory, job.config.sub_group_size) {
            (Some(jm), None) => Some(memory::operator_sub_group_size(jm.parameters, jm.ranks)),
            _ => None,
        },
    };
    let (framework, whys) = framework::plan(
        job,
        &facts,
        placement.mode,
        overlap,
        ratio,
        placement.class(),
        profile.allow_zen_flow,
        memory_plan,
    );
    for why in whys {
        reasons.add(Field::Framework, why);
    }
    let (gpu_claims, exclude_nodes) =
        claim_pinning(job, &placement, by_claims, exclude_nodes, &mut reasons);
    let state = state_placement(placement.mode, ratio, &framework, memory_plan.placement);

    Ok(Resolution {
        profile: profile_name.to_string(),
        mode: placement.mode,
        overlap,
        ratio,
        pin_memory,
        node_class: placement.class(),
        node_selector: profile.node_selector.clone(),
        overlap_efficiency,
        framework,
        reasons: reasons.0,
        startup_guard: profile.startup_guard,
        memory: match (placement.memory.as_ref(), memory.as_ref()) {
            (Some(c), Some(jm)) => Some(MemoryEstimate::of(jm, &c.estimate, &c.class)),
            _ => None,
        },
        gpu_claims,
        exclude_nodes,
        gpu_claim_entries: job.gpu_claim_entries.clone(),
        placement: state,
        memory_request,
        requested: job.offload.clone(),
        training_container: job.training_container.map(|(i, _)| i),
    })
}

/// Where the configuration puts the training state: what the model placed (or the rung), else
/// what the mode, the ratio and the framework's keys say.
fn state_placement(
    mode: OffloadMode,
    ratio: f64,
    framework: &FrameworkPlan,
    placed: Option<memory::Placement>,
) -> memory::Placement {
    if let Some(p) = placed {
        return p;
    }
    let params = match framework {
        FrameworkPlan::DeepSpeed(d) => d.offload_params,
        FrameworkPlan::Fsdp(f) => f.offload_params,
        FrameworkPlan::Generic => false,
    };
    match mode {
        OffloadMode::Disabled => memory::Placement::NoOffload,
        _ if params => memory::Placement::OptimizerAndParams,
        _ if ratio < 1.0 => memory::Placement::PartialOptimizer(ratio),
        _ => memory::Placement::Optimizer,
    }
}

/// The training container's memory request where the chosen placement's host estimate is more
/// than the user requests (rounded up to MiB); never lower than the user's.
fn memory_request(job: &JobRequest, choice: Option<&fit::MemoryChoice>) -> Option<MemoryRequest> {
    const MIB: u64 = 1 << 20;
    let (container, requested) = job.training_container?;
    let bytes = memory::bytes(choice?.estimate.host_per_pod)
        .div_ceil(MIB)
        .saturating_mul(MIB);
    (requested.is_none_or(|r| r < bytes)).then_some(MemoryRequest {
        container,
        bytes,
        raised_from: requested,
    })
}

fn memory_request_reason(job: &JobRequest, r: &MemoryRequest) -> String {
    #[allow(clippy::cast_precision_loss)]
    let gib = |b: u64| memory::gib(b as f64);
    let from = match r.raised_from {
        Some(was) => format!("raised from {}", gib(was)),
        None => "it requested none".to_string(),
    };
    let limit = job
        .pod_memory_limit
        .map(|l| format!(", within its limit of {}", gib(l)))
        .unwrap_or_default();
    format!(
        "host memory: the training container (the pod template's container {}) requests {} ({from}){limit}: what this configuration counts on, so the scheduler and quota systems (Kueue) see it",
        r.container,
        gib(r.bytes)
    )
}

/// A fixed partial ratio the framework cannot write is refused, saying what to change.
fn partial_ratio_supported(
    job: &JobRequest,
    facts: &framework::FrameworkFacts,
) -> Result<(), ResolveError> {
    if let (RatioSetting::Fixed(r), Err(why)) = (
        job.offload.offload_ratio,
        framework::partial_ratio_support(job, facts),
    ) && r < 1.0
    {
        return Err(ResolveError::FrameworkCannot {
            problem: format!("spec.offload.offloadRatio {r} needs partial offload, but {why}"),
            change: "set spec.offload.offloadRatio to 1 or Auto".to_string(),
        });
    }
    Ok(())
}

/// For a job with GPU claims: the nodes whose agent and GPU driver disagree (its affinity
/// excludes them by name, as its claims' selectors see only the driver's word).
fn disagreeing_nodes(job: &JobRequest, nodes: &NodeIndex) -> Vec<String> {
    if job.gpu_claims.is_none() {
        return Vec::new();
    }
    nodes
        .nodes()
        .filter(|n| n.witness() == crate::index::Witness::Disagree)
        .map(|n| n.name.clone())
        .collect()
}

/// The claim pinning written for a claim-pinned job (and the nodes it excludes), with its
/// reason; none for a job pinned by the agent's labels.
fn claim_pinning(
    job: &JobRequest,
    placement: &placement::Placement,
    by_claims: bool,
    exclude_nodes: Vec<String>,
    reasons: &mut Reasons,
) -> (Option<crate::dra::claims::ClaimPinning>, Vec<String>) {
    match (placement.class(), &job.gpu_claims) {
        (Some(class), Some(pinning)) if by_claims => {
            reasons.add(
                Field::NodeClass,
                format!(
                    "GPUs from DRA claims ({}): each claim's template is copied with a selector on the GPU driver's addressingMode attribute, so the scheduler allocates only {class} GPUs{}",
                    pinning.claims.keys().cloned().collect::<Vec<_>>().join(", "),
                    if exclude_nodes.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; nodes whose agent and driver disagree are excluded: {}",
                            exclude_nodes.join(", ")
                        )
                    }
                ),
            );
            if placement.memory.is_some() {
                reasons.add(
                    Field::NodeClass,
                    "the copies also select GPUs by memory capacity: at least what this configuration needs on each",
                );
            }
            (Some(pinning.clone()), exclude_nodes)
        }
        // Any class will do, but the GPUs must hold the configuration: the copies select by
        // memory alone.
        (None, Some(pinning)) if by_claims && placement.memory.is_some() => {
            reasons.add(
                Field::NodeClass,
                format!(
                    "GPUs from DRA claims ({}): each claim's template is copied with a selector on the device's memory capacity, so the scheduler allocates only GPUs this configuration fits on",
                    pinning.claims.keys().cloned().collect::<Vec<_>>().join(", "),
                ),
            );
            (Some(pinning.clone()), exclude_nodes)
        }
        _ => (None, Vec::new()),
    }
}

/// The memory model's figures for `placement` of a job on a class's nodes, and whether it
/// fits there; `None` without model hints or when the class has no node with a report of its
/// GPUs' memory. For `explain --candidates`, which shows every candidate beside the node's
/// figures, also those the decision would not write.
pub fn estimate_placement(
    job: &JobRequest,
    profile_name: &str,
    profile: &OffloadProfileSpec,
    nodes: &NodeIndex,
    class: NodeClass,
    placement: memory::Placement,
) -> Result<Option<(MemoryEstimate, bool)>, ResolveError> {
    let facts = framework::check(job)?;
    let Some(jm) = fit::job_memory(job, &facts, profile_name)? else {
        return Ok(None);
    };
    let candidates = placement::Candidates::select(
        nodes,
        profile_name,
        profile,
        job.gpu_claims.is_some(),
        &job.constraints,
    )?;
    let Some(cm) = fit::class_memory(candidates.of(class), job) else {
        return Ok(None);
    };
    let (est, fits) = jm.estimate_checked(placement, &cm);
    Ok(Some((MemoryEstimate::of(&jm, &est, &cm), fits.ok())))
}

/// Whether a memory model may host a configuration made for a class: the invariant the
/// affinity enforces, stated once so tests can check it.
pub fn class_admits(class: NodeClass, model: NodeMemoryModel) -> bool {
    match class {
        NodeClass::Coherent => model == NodeMemoryModel::Coherent,
        NodeClass::Discrete => matches!(model, NodeMemoryModel::Hmm | NodeMemoryModel::Discrete),
    }
}

#[cfg(test)]
mod tests;
