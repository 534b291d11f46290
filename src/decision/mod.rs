//! The offload decision: a pure function from (job request, profile, nodes) to a concrete
//! configuration with a reason for every choice.
//!
//! No I/O happens here. The controller and the webhook both call [`resolve_offload`]; the same
//! inputs always give the same output, whatever order the nodes come in.

mod nodes;

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};

pub use nodes::{NodeInfo, class_requirements};

use crate::api::{
    DeepSpeedSpec, Framework, FrameworkSpec, ModeSetting, ModelHints, NodeClass, OffloadMode,
    OffloadProfileSpec, OffloadSpec, OverlapSetting, RatioSetting, Switch, TrainingJobSpec,
};
use crate::report::{NodeMemoryModel, OverlapVerdict};
use crate::version::{self, FrameworkVersion, VersionError};

/// Default ZeRO stage when neither the job nor the user's DeepSpeed JSON names one.
pub const DEFAULT_ZERO_STAGE: u8 = 3;
/// `cpuadam_cores_perc` written with SuperOffload: DeepSpeed's own example value.
pub const SUPER_OFFLOAD_CPU_SHARE: f64 = 0.9;
/// Smallest ratio `offloadRatio: Auto` picks; below it offload is not worth its copies.
pub const MIN_AUTO_RATIO: f64 = 0.05;

/// What a job asks for, independent of the object kind that carries it.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRequest {
    /// The job's offload settings (each may be `Auto`).
    pub offload: OffloadSpec,
    /// Framework and version.
    pub framework: FrameworkSpec,
    /// DeepSpeed specifics (only read for DeepSpeed).
    pub deepspeed: DeepSpeedRequest,
    /// Model hints for `offloadRatio: Auto`.
    pub model: Option<ModelHints>,
    /// Number of pods.
    pub pods: u32,
    /// GPUs each pod asks for (at least 1).
    pub gpus_per_pod: u32,
}

/// DeepSpeed specifics of a request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeepSpeedRequest {
    /// ZeRO stage stated in the user's DeepSpeed JSON, if any.
    pub stage_in_config: Option<u8>,
    /// ZeRO stage stated in the job spec, if any.
    pub stage_in_spec: Option<u8>,
    /// Offload parameters too (`offload_param`).
    pub offload_params: bool,
    /// Explicit SuperOffload request.
    pub super_offload: Option<bool>,
}

impl JobRequest {
    /// The request of a TrainingJob. `stage_in_config` is the ZeRO stage found in the user's
    /// DeepSpeed ConfigMap, if the caller read one.
    pub fn from_training_job(
        spec: &TrainingJobSpec,
        gpus_per_pod: u32,
        stage_in_config: Option<u8>,
    ) -> Self {
        let ds = spec.deepspeed.clone().unwrap_or_default();
        JobRequest {
            offload: spec.offload.clone(),
            framework: spec.framework.clone(),
            deepspeed: DeepSpeedRequest::from_spec(&ds, stage_in_config),
            model: spec.model,
            pods: u32::try_from(spec.replicas.max(1)).unwrap_or(1),
            gpus_per_pod: gpus_per_pod.max(1),
        }
    }
}

impl DeepSpeedRequest {
    /// From the job spec's DeepSpeed section.
    pub fn from_spec(ds: &DeepSpeedSpec, stage_in_config: Option<u8>) -> Self {
        DeepSpeedRequest {
            stage_in_config,
            stage_in_spec: ds.zero_stage,
            offload_params: ds.offload_params,
            super_offload: ds.super_offload,
        }
    }
}

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

/// How the framework receives the configuration.
#[derive(Clone, Debug, PartialEq)]
pub enum FrameworkPlan {
    /// DeepSpeed JSON keys.
    DeepSpeed(DeepSpeedPlan),
    /// Accelerate FSDP env vars.
    Fsdp(FsdpPlan),
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
}

/// Accelerate FSDP switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsdpPlan {
    /// FSDP generation, 1 or 2.
    pub fsdp_version: u8,
    /// `FSDP_OFFLOAD_PARAMS`.
    pub offload_params: bool,
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
    /// Offload ratio in (0, 1].
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
            offload_ratio: RatioSetting::Fixed(self.ratio),
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

/// Why a job cannot be resolved now. Every message says what to change.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResolveError {
    /// The framework version does not parse.
    #[error(transparent)]
    InvalidVersion(#[from] VersionError),
    /// The framework version is missing.
    #[error(
        "framework.version is required for {framework:?}: set it to the version installed in the image"
    )]
    MissingVersion {
        /// The framework.
        framework: Framework,
    },
    /// The framework version is older than the operator supports.
    #[error(
        "{framework:?} {version} is older than {minimum}, the oldest version the operator renders configuration for: upgrade the image or set framework.name to Generic"
    )]
    UnsupportedVersion {
        /// The framework.
        framework: Framework,
        /// The declared version.
        version: String,
        /// The oldest supported version.
        minimum: String,
    },
    /// The framework (at this version or stage) cannot take what was asked.
    #[error("{problem}: {change}")]
    FrameworkCannot {
        /// What cannot be done.
        problem: String,
        /// What to change.
        change: String,
    },
    /// The ZeRO stage in the spec and in the user's JSON disagree.
    #[error(
        "deepspeed.zeroStage is {spec} but the DeepSpeed config in the ConfigMap says stage {config}: remove one of them or make them agree"
    )]
    StageConflict {
        /// Stage in the spec.
        spec: u8,
        /// Stage in the config.
        config: u8,
    },
    /// The profile's node selector is not a valid selector.
    #[error("OffloadProfile {profile:?} has an invalid nodeSelector ({detail}): fix the profile")]
    InvalidSelector {
        /// Profile name.
        profile: String,
        /// Parse error.
        detail: String,
    },
    /// No node matching the profile has an agent report.
    #[error(
        "no GPU node matching OffloadProfile {profile:?} has been reported by offload-agent yet: check that the agent DaemonSet runs on your GPU nodes and that the profile's nodeSelector matches them"
    )]
    NoReportedNodes {
        /// Profile name.
        profile: String,
    },
    /// UnifiedMemory asked for where no coherent node exists.
    #[error(
        "mode UnifiedMemory needs a hardware-coherent node (ATS over NVLink-C2C, e.g. GH200) but none of the {discrete} reported node(s) matching OffloadProfile {profile:?} is one: set offload.mode to Auto or CPUCopy, or add coherent nodes"
    )]
    NoCoherentNodes {
        /// Profile name.
        profile: String,
        /// Discrete nodes that do match.
        discrete: usize,
    },
    /// CPUCopy asked for where only coherent nodes exist and the profile forbids copy there.
    #[error(
        "mode CPUCopy needs a discrete GPU node but all {coherent} node(s) matching OffloadProfile {profile:?} are coherent, where copy offload causes extra copies and page-migration conflicts: set offload.mode to Auto or UnifiedMemory, or set allowCPUCopyOnCoherentNodes in the profile"
    )]
    CopyOnCoherentNotAllowed {
        /// Profile name.
        profile: String,
        /// Coherent nodes that match.
        coherent: usize,
    },
}

impl ResolveError {
    /// A fixed CamelCase category: the condition reason and the metrics label.
    pub fn category(&self) -> &'static str {
        match self {
            ResolveError::InvalidVersion(_) => "InvalidFrameworkVersion",
            ResolveError::MissingVersion { .. } => "MissingFrameworkVersion",
            ResolveError::UnsupportedVersion { .. } => "UnsupportedFrameworkVersion",
            ResolveError::FrameworkCannot { .. } => "FrameworkCannotTakeConfig",
            ResolveError::StageConflict { .. } => "ZeroStageConflict",
            ResolveError::InvalidSelector { .. } => "InvalidProfileSelector",
            ResolveError::NoReportedNodes { .. } => "NoReportedNodes",
            ResolveError::NoCoherentNodes { .. } => "NoCoherentNodes",
            ResolveError::CopyOnCoherentNotAllowed { .. } => "CopyOnCoherentNotAllowed",
        }
    }

    /// Whether a change of nodes or profiles could make the job resolvable (the controller
    /// retries those); the rest need the job itself to change.
    pub fn depends_on_cluster(&self) -> bool {
        matches!(
            self,
            ResolveError::InvalidSelector { .. }
                | ResolveError::NoReportedNodes { .. }
                | ResolveError::NoCoherentNodes { .. }
                | ResolveError::CopyOnCoherentNotAllowed { .. }
        )
    }
}

/// Where an effective setting came from, for reasons.
#[derive(Clone, Copy)]
enum Source {
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
fn effective<T: PartialEq + Copy>(job: T, profile: T, auto: T) -> (T, Source) {
    if job != auto {
        (job, Source::Job)
    } else {
        (profile, Source::Profile)
    }
}

struct Reasons(Vec<Reason>);

impl Reasons {
    fn add(&mut self, field: Field, message: impl Into<String>) {
        self.0.push(Reason {
            field,
            message: message.into(),
        });
    }
}

/// Validated framework facts.
struct FrameworkFacts {
    version: Option<FrameworkVersion>,
    stage: u8,
    stage_defaulted: bool,
}

fn check_framework(job: &JobRequest) -> Result<FrameworkFacts, ResolveError> {
    let kind = job.framework.name;
    let version = match (kind, job.framework.version.as_deref()) {
        (Framework::Generic, _) => None,
        (_, None) => return Err(ResolveError::MissingVersion { framework: kind }),
        (_, Some(v)) => Some(FrameworkVersion::parse(v)?),
    };
    let minimum = match kind {
        Framework::DeepSpeed => Some(version::deepspeed::MIN_SUPPORTED),
        Framework::Fsdp => Some(version::torch::MIN_SUPPORTED),
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
        if ds.offload_params && stage != 3 {
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
    Ok(FrameworkFacts {
        version,
        stage,
        stage_defaulted,
    })
}

/// The candidate nodes of one class, sorted by name.
struct ClassNodes<'a> {
    class: NodeClass,
    nodes: Vec<&'a NodeInfo>,
}

impl ClassNodes<'_> {
    fn gpus(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.gpu_count())).sum()
    }
}

/// Resolves a job's offload configuration.
///
/// `profile_name` and `profile` are the profile the job names (`auto` already mapped to
/// `default`); `nodes` are all nodes the caller knows (unreported ones are ignored).
pub fn resolve_offload(
    job: &JobRequest,
    profile_name: &str,
    profile: &OffloadProfileSpec,
    nodes: &[NodeInfo],
) -> Result<Resolution, ResolveError> {
    let facts = check_framework(job)?;
    let mut reasons = Reasons(Vec::new());

    // Candidate nodes: reported by the agent and matching the profile's selector.
    let selector =
        match &profile.node_selector {
            Some(sel) => Some(Selector::try_from(sel.clone()).map_err(|e| {
                ResolveError::InvalidSelector {
                    profile: profile_name.to_string(),
                    detail: e.to_string(),
                }
            })?),
            None => None,
        };
    let mut sorted: Vec<&NodeInfo> = nodes
        .iter()
        .filter(|n| selector.as_ref().is_none_or(|s| s.matches(&n.labels)))
        .filter(|n| n.class().is_some())
        .collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let class_nodes = |class: NodeClass| ClassNodes {
        class,
        nodes: sorted
            .iter()
            .copied()
            .filter(|n| n.class() == Some(class))
            .collect(),
    };
    let coherent = class_nodes(NodeClass::Coherent);
    let discrete = class_nodes(NodeClass::Discrete);
    let demand = u64::from(job.pods) * u64::from(job.gpus_per_pod);

    // Mode and node class.
    let (requested_mode, mode_source) =
        effective(job.offload.mode, profile.mode, ModeSetting::Auto);
    let (mode, chosen): (OffloadMode, Option<&ClassNodes>) = match requested_mode {
        ModeSetting::Disabled => {
            reasons.add(Field::Mode, format!("offload disabled by {mode_source}"));
            reasons.add(
                Field::NodeClass,
                "no node class required: without offload the configuration fits any GPU node",
            );
            (OffloadMode::Disabled, None)
        }
        ModeSetting::UnifiedMemory => {
            if coherent.nodes.is_empty() {
                if sorted.is_empty() {
                    return Err(ResolveError::NoReportedNodes {
                        profile: profile_name.to_string(),
                    });
                }
                return Err(ResolveError::NoCoherentNodes {
                    profile: profile_name.to_string(),
                    discrete: discrete.nodes.len(),
                });
            }
            reasons.add(
                Field::Mode,
                format!(
                    "UnifiedMemory requested by {mode_source}; {} coherent node(s) available",
                    coherent.nodes.len()
                ),
            );
            reasons.add(Field::NodeClass, capacity_message(&coherent, demand));
            (OffloadMode::UnifiedMemory, Some(&coherent))
        }
        ModeSetting::CpuCopy => {
            if !discrete.nodes.is_empty() {
                reasons.add(
                    Field::Mode,
                    format!(
                        "CPUCopy requested by {mode_source}; {} discrete node(s) available",
                        discrete.nodes.len()
                    ),
                );
                reasons.add(Field::NodeClass, capacity_message(&discrete, demand));
                (OffloadMode::CpuCopy, Some(&discrete))
            } else if coherent.nodes.is_empty() {
                return Err(ResolveError::NoReportedNodes {
                    profile: profile_name.to_string(),
                });
            } else if profile.allow_cpu_copy_on_coherent_nodes {
                reasons.add(
                    Field::Mode,
                    format!("CPUCopy requested by {mode_source} on coherent nodes, which profile {profile_name:?} allows (allowCPUCopyOnCoherentNodes)"),
                );
                reasons.add(Field::NodeClass, capacity_message(&coherent, demand));
                (OffloadMode::CpuCopy, Some(&coherent))
            } else {
                return Err(ResolveError::CopyOnCoherentNotAllowed {
                    profile: profile_name.to_string(),
                    coherent: coherent.nodes.len(),
                });
            }
        }
        ModeSetting::Auto => {
            let order = if profile.node_class_order.is_empty() {
                vec![NodeClass::Coherent, NodeClass::Discrete]
            } else {
                profile.node_class_order.clone()
            };
            let available: Vec<&ClassNodes> = order
                .iter()
                .map(|c| match c {
                    NodeClass::Coherent => &coherent,
                    NodeClass::Discrete => &discrete,
                })
                .filter(|c| !c.nodes.is_empty())
                .collect();
            let Some(first) = available.first().copied() else {
                return Err(ResolveError::NoReportedNodes {
                    profile: profile_name.to_string(),
                });
            };
            let fitting = available.iter().copied().find(|c| c.gpus() >= demand);
            let pick = fitting.unwrap_or(first);
            let mode = match pick.class {
                NodeClass::Coherent => OffloadMode::UnifiedMemory,
                NodeClass::Discrete => OffloadMode::CpuCopy,
            };
            let why_mode = match pick.class {
                NodeClass::Coherent => {
                    "coherent nodes (ATS over NVLink-C2C) keep offloaded state resident in unified memory"
                }
                NodeClass::Discrete => {
                    "discrete nodes have no hardware-coherent host memory, so offload copies to host memory and back"
                }
            };
            reasons.add(
                Field::Mode,
                format!("Auto (from {mode_source}) chose {mode}: {why_mode}"),
            );
            let class_why = match (available.len(), fitting.is_some()) {
                (1, _) => format!("only {} nodes match the profile", pick.class),
                (_, true) if std::ptr::eq(pick, first) => format!(
                    "{} comes first in the profile's nodeClassOrder and has enough GPUs",
                    pick.class
                ),
                (_, true) => format!(
                    "{} comes earlier in nodeClassOrder but has too few GPUs ({} of {demand})",
                    first.class,
                    first.gpus()
                ),
                (_, false) => format!(
                    "no class has {demand} GPUs; {} comes first in nodeClassOrder",
                    pick.class
                ),
            };
            reasons.add(
                Field::NodeClass,
                format!("{class_why}; {}", capacity_message(pick, demand)),
            );
            (mode, Some(pick))
        }
    };
    let node_class = chosen.map(|c| c.class);

    // Overlap.
    let (requested_overlap, overlap_source) =
        effective(job.offload.overlap, profile.overlap, OverlapSetting::Auto);
    let measured = chosen
        .map(|c| lowest_efficiency(&c.nodes))
        .unwrap_or_default();
    let overlap_efficiency = measured.lowest.as_ref().map(|(_, e)| *e);
    let overlap = if mode == OffloadMode::Disabled {
        reasons.add(Field::Overlap, "off: offload is disabled");
        false
    } else {
        match requested_overlap {
            OverlapSetting::Disabled => {
                reasons.add(Field::Overlap, format!("off: disabled by {overlap_source}"));
                false
            }
            OverlapSetting::Enabled => {
                reasons.add(
                    Field::Overlap,
                    format!("on: enabled by {overlap_source}; {}", measured.describe()),
                );
                true
            }
            OverlapSetting::Auto => {
                let threshold = profile.min_overlap_efficiency;
                match (&measured.blocker, measured.lowest.as_ref()) {
                    (Some(blocker), _) => {
                        reasons.add(Field::Overlap, format!("off: {blocker}"));
                        false
                    }
                    (None, Some((node, e))) if *e >= threshold => {
                        reasons.add(
                            Field::Overlap,
                            format!("on: self-test verified overlap on every chosen node, lowest efficiency {e:.2} on {node} (minimum {threshold:.2})"),
                        );
                        true
                    }
                    (None, Some((node, e))) => {
                        reasons.add(
                            Field::Overlap,
                            format!("off: self-test measured efficiency {e:.2} on {node}, below the profile's minimum {threshold:.2}"),
                        );
                        false
                    }
                    (None, None) => {
                        reasons.add(
                            Field::Overlap,
                            "off: no chosen node has an overlap measurement",
                        );
                        false
                    }
                }
            }
        }
    };

    // Pinned memory.
    let (pin_request, pin_source) = match job.offload.pin_memory {
        Switch::Enabled => (true, Source::Job),
        Switch::Disabled => (false, Source::Job),
        Switch::Auto => (profile.pin_memory, Source::Profile),
    };
    let unpinnable = chosen.and_then(|c| {
        c.nodes.iter().find_map(|n| {
            n.parsed_report()
                .filter(|r| !r.selftest.pinned_memory)
                .map(|r| (n.name.clone(), r.selftest.pinned_error.clone()))
        })
    });
    let pin_memory = if mode == OffloadMode::Disabled {
        reasons.add(Field::PinMemory, "off: offload is disabled");
        false
    } else {
        match (pin_request, pin_source, unpinnable) {
            (false, _, _) => {
                reasons.add(Field::PinMemory, format!("off: set by {pin_source}"));
                false
            }
            (true, Source::Profile, Some((node, err))) => {
                reasons.add(
                    Field::PinMemory,
                    format!("off: the agent could not allocate pinned memory on {node} ({}); pageable buffers are used", err.unwrap_or_else(|| "no detail".into())),
                );
                false
            }
            (true, Source::Job, Some((node, _))) => {
                reasons.add(
                    Field::PinMemory,
                    format!("on: set by the job, although the agent could not allocate pinned memory on {node}; raise the container's memlock limit"),
                );
                true
            }
            (true, _, None) => {
                reasons.add(Field::PinMemory, format!("on: set by {pin_source}"));
                true
            }
        }
    };

    // Offload ratio.
    let partial_ratio_support = partial_ratio_support(job, &facts);
    let (requested_ratio, ratio_source) = effective(
        job.offload.offload_ratio,
        profile.offload_ratio,
        RatioSetting::Auto,
    );
    let ratio = if mode == OffloadMode::Disabled {
        reasons.add(
            Field::OffloadRatio,
            "1: offload is disabled, the ratio has no effect",
        );
        1.0
    } else {
        match requested_ratio {
            RatioSetting::Fixed(r) if r < 1.0 => match (&partial_ratio_support, ratio_source) {
                (Ok(()), _) => {
                    reasons.add(Field::OffloadRatio, format!("{r}: set by {ratio_source}"));
                    r
                }
                (Err(why), Source::Job) => {
                    return Err(ResolveError::FrameworkCannot {
                        problem: format!("offloadRatio {r} needs partial offload, but {why}"),
                        change: "set offload.offloadRatio to 1 or Auto".to_string(),
                    });
                }
                (Err(why), Source::Profile) => {
                    reasons.add(
                        Field::OffloadRatio,
                        format!("1: the profile asks for {r}, lowered because {why}"),
                    );
                    1.0
                }
            },
            RatioSetting::Fixed(r) => {
                reasons.add(Field::OffloadRatio, format!("{r}: set by {ratio_source}"));
                r
            }
            RatioSetting::Auto => {
                let (auto, why) = auto_ratio(job.model, chosen);
                match (&partial_ratio_support, auto < 1.0) {
                    (Err(cannot), true) => {
                        reasons.add(
                            Field::OffloadRatio,
                            format!("1: {why}, which would give {auto}, lowered because {cannot}"),
                        );
                        1.0
                    }
                    _ => {
                        reasons.add(Field::OffloadRatio, format!("{auto}: {why}"));
                        auto
                    }
                }
            }
        }
    };

    // Framework plan.
    let framework = plan_framework(job, &facts, mode, overlap, ratio, node_class, &mut reasons);

    Ok(Resolution {
        profile: profile_name.to_string(),
        mode,
        overlap,
        ratio,
        pin_memory,
        node_class,
        node_selector: profile.node_selector.clone(),
        overlap_efficiency,
        framework,
        reasons: reasons.0,
    })
}

fn capacity_message(class: &ClassNodes, demand: u64) -> String {
    let gpus = class.gpus();
    let names: Vec<&str> = class.nodes.iter().map(|n| n.name.as_str()).collect();
    let shown = if names.len() > 3 {
        format!("{}, … ({} nodes)", names[..3].join(", "), names.len())
    } else {
        names.join(", ")
    };
    if gpus >= demand {
        format!(
            "pods pinned to {} nodes ({shown}: {gpus} GPUs for {demand} requested)",
            class.class
        )
    } else {
        format!(
            "pods pinned to {} nodes ({shown}: {gpus} GPUs for {demand} requested, so pods wait for capacity)",
            class.class
        )
    }
}

/// The lowest measured efficiency among nodes, or what stops overlap being trusted.
#[derive(Default)]
struct Measured {
    lowest: Option<(String, f64)>,
    blocker: Option<String>,
}

impl Measured {
    fn describe(&self) -> String {
        match (&self.lowest, &self.blocker) {
            (Some((node, e)), _) => format!("lowest measured efficiency {e:.2} on {node}"),
            (None, Some(b)) => b.clone(),
            (None, None) => "no measurement".to_string(),
        }
    }
}

fn lowest_efficiency(nodes: &[&NodeInfo]) -> Measured {
    let mut out = Measured::default();
    for node in nodes {
        let efficiency = match &node.report {
            Some(Ok(r)) => r.selftest.efficiency,
            Some(Err(e)) => {
                out.blocker.get_or_insert_with(|| {
                    format!("the report of node {} is unreadable ({e})", node.name)
                });
                None
            }
            None => {
                out.blocker
                    .get_or_insert_with(|| format!("node {} has no agent report", node.name));
                None
            }
        };
        match node.overlap_verdict() {
            OverlapVerdict::Verified => {}
            OverlapVerdict::Failed => {
                out.blocker.get_or_insert_with(|| match efficiency {
                    Some(e) => format!(
                        "the self-test failed on node {} (efficiency {e:.2})",
                        node.name
                    ),
                    None => format!("the self-test failed on node {}", node.name),
                });
            }
            OverlapVerdict::Untested => {
                out.blocker.get_or_insert_with(|| {
                    format!("node {} has not run the overlap self-test", node.name)
                });
            }
        }
        if let Some(e) = efficiency
            && out.lowest.as_ref().is_none_or(|(_, low)| e < *low)
        {
            out.lowest = Some((node.name.clone(), e));
        }
    }
    out
}

/// Whether the framework can take a ratio below 1, or why not.
fn partial_ratio_support(job: &JobRequest, facts: &FrameworkFacts) -> Result<(), String> {
    match job.framework.name {
        Framework::Generic => Ok(()),
        Framework::Fsdp => Err("FSDP has no partial-offload switch".to_string()),
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

/// `offloadRatio: Auto`: the share of optimizer state the CPU can update within the GPU's
/// backward time, on the slowest chosen node.
fn auto_ratio(model: Option<ModelHints>, chosen: Option<&ClassNodes>) -> (f64, String) {
    let Some(hints) = model else {
        return (
            1.0,
            "Auto without model hints offloads all optimizer state (set spec.model to size it)"
                .to_string(),
        );
    };
    let Some(class) = chosen else {
        return (
            1.0,
            "Auto without nodes offloads all optimizer state".to_string(),
        );
    };
    let mut worst: Option<(f64, &str)> = None;
    for node in &class.nodes {
        let Some(report) = node.parsed_report() else {
            return (
                1.0,
                format!(
                    "Auto offloads all optimizer state: node {} has no readable report with CPU and GPU rates",
                    node.name
                ),
            );
        };
        let (Some(cpu), Some(gpu)) = (report.selftest.cpu_update_rate, report.selftest.gpu_flops)
        else {
            return (
                1.0,
                format!(
                    "Auto offloads all optimizer state: the report of node {} lacks CPU update or GPU rates",
                    node.name
                ),
            );
        };
        if cpu <= 0.0 || gpu <= 0.0 {
            return (
                1.0,
                format!(
                    "Auto offloads all optimizer state: node {} reports a zero rate",
                    node.name
                ),
            );
        }
        // Backward of a transformer costs about 4 FLOP per parameter per token.
        #[allow(clippy::cast_precision_loss)]
        let t_backward = 4.0 * hints.parameters as f64 * hints.tokens_per_step as f64 / gpu;
        #[allow(clippy::cast_precision_loss)]
        let t_cpu_all = hints.parameters as f64 / cpu;
        let share = t_backward / t_cpu_all;
        if worst.is_none_or(|(w, _)| share < w) {
            worst = Some((share, node.name.as_str()));
        }
    }
    match worst {
        None => (
            1.0,
            "Auto offloads all optimizer state: no chosen node".to_string(),
        ),
        Some((share, _)) if share >= 1.0 => (
            1.0,
            format!(
                "Auto: the CPU updates all optimizer state within the GPU's backward time on every chosen node ({share:.2}× headroom)"
            ),
        ),
        Some((share, node)) => {
            // Round down to two decimals so the CPU share never exceeds what was measured.
            let ratio = ((share * 100.0).floor() / 100.0).max(MIN_AUTO_RATIO);
            (
                ratio,
                format!(
                    "Auto: on {node}, the slowest chosen node, the CPU can update {:.0}% of optimizer state within the GPU's backward time",
                    share * 100.0
                ),
            )
        }
    }
}

fn plan_framework(
    job: &JobRequest,
    facts: &FrameworkFacts,
    mode: OffloadMode,
    overlap: bool,
    ratio: f64,
    node_class: Option<NodeClass>,
    reasons: &mut Reasons,
) -> FrameworkPlan {
    match (job.framework.name, &facts.version) {
        (Framework::DeepSpeed, Some(version)) => {
            let ds = &job.deepspeed;
            let can_super = version::deepspeed::has(version, version::deepspeed::SUPER_OFFLOAD);
            let super_offload = match (mode, ds.super_offload) {
                (OffloadMode::Disabled, _) => false,
                (_, Some(false)) => {
                    reasons.add(
                        Field::Framework,
                        "SuperOffload off: deepspeed.superOffload is false",
                    );
                    false
                }
                (_, Some(true)) => {
                    if node_class == Some(NodeClass::Discrete) {
                        reasons.add(Field::Framework, "SuperOffload on because deepspeed.superOffload asks for it; note it was measured 2.2x slower than plain CPU offload on a PCIe H200");
                    } else {
                        reasons.add(
                            Field::Framework,
                            "SuperOffload on: deepspeed.superOffload asks for it",
                        );
                    }
                    true
                }
                (OffloadMode::UnifiedMemory, None) if overlap && can_super => {
                    if version::deepspeed::has(
                        version,
                        version::deepspeed::SUPER_OFFLOAD_RECOMMENDED,
                    ) {
                        reasons.add(
                            Field::Framework,
                            "SuperOffload on: overlapped offload on a coherent node",
                        );
                    } else {
                        reasons.add(Field::Framework, format!("SuperOffload on: overlapped offload on a coherent node; DeepSpeed {version} has it, but {} carries its fixes", version::deepspeed::show(version::deepspeed::SUPER_OFFLOAD_RECOMMENDED)));
                    }
                    true
                }
                (OffloadMode::UnifiedMemory, None) if overlap => {
                    reasons.add(Field::Framework, format!("SuperOffload lowered to DeepSpeed's standard asynchronous CPU offload: DeepSpeed {version} predates SuperOffload (upgrade to {} or newer to use it)", version::deepspeed::show(version::deepspeed::SUPER_OFFLOAD_RECOMMENDED)));
                    false
                }
                (OffloadMode::CpuCopy, None) if overlap => {
                    reasons.add(Field::Framework, "standard asynchronous CPU offload, not SuperOffload: SuperOffload targets coherent nodes and was measured slower on PCIe");
                    false
                }
                (_, None) => false,
            };
            let write_ratio = mode != OffloadMode::Disabled
                && facts.stage == 3
                && version::deepspeed::has(version, version::deepspeed::RATIO)
                && (ratio < 1.0 || super_offload);
            let offload_params = ds.offload_params && mode != OffloadMode::Disabled;
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
            reasons.add(
                Field::Framework,
                format!("DeepSpeed {version}: {what}, {stage_note}, pin_memory written explicitly"),
            );
            FrameworkPlan::DeepSpeed(DeepSpeedPlan {
                version: version.clone(),
                stage: facts.stage,
                write_stage: facts.stage_defaulted,
                offload_params,
                super_offload,
                write_ratio,
            })
        }
        (Framework::Fsdp, Some(version)) => {
            let fsdp_version = if version::torch::has(version, version::torch::FSDP2) {
                2
            } else {
                1
            };
            let offload_params = mode == OffloadMode::CpuCopy;
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
            reasons.add(Field::Framework, message);
            FrameworkPlan::Fsdp(FsdpPlan {
                fsdp_version,
                offload_params,
            })
        }
        _ => {
            reasons.add(
                Field::Framework,
                "Generic: the configuration reaches the process through OFFLOAD_* env vars only",
            );
            FrameworkPlan::Generic
        }
    }
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
