//! Why a job cannot be resolved now. Every message says what to change.

use offload_api::v1alpha1::Framework;
use offload_api::version::VersionError;

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
    /// An offload ratio outside (0, 1] (the API's schema refuses one; this guards every other
    /// path into the decision).
    #[error(
        "the offload ratio {value} (from {origin}) is out of range: use a number greater than 0 and at most 1, or Auto"
    )]
    RatioOutOfRange {
        /// The value.
        value: f64,
        /// `the job` or `the profile`.
        origin: String,
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
    /// The pod template's own constraints leave out every node the profile may use (or every
    /// node of the class the job asks for).
    #[error(
        "{detail}: no node the profile {profile:?} may use{class} is left for the pods; change the pod template's nodeSelector, affinity or tolerations, or add nodes it matches"
    )]
    TemplateLeavesNoNodes {
        /// Profile name.
        profile: String,
        /// ` of class Coherent`, when one class was asked for.
        class: String,
        /// What the constraints leave out, node by node.
        detail: String,
    },
    /// UnifiedMemory asked for where no coherent node exists.
    #[error(
        "mode UnifiedMemory needs a hardware-coherent node (ATS over NVLink-C2C, e.g. GH200) but none of the {discrete} reported node(s) matching OffloadProfile {profile:?} is one: set spec.offload.mode to Auto or CPUCopy, or add coherent nodes"
    )]
    NoCoherentNodes {
        /// Profile name.
        profile: String,
        /// Discrete nodes that do match.
        discrete: usize,
    },
    /// The pod template's resources cannot be read (a GPU count that is not a whole number, a
    /// quantity that is not one, more GPUs than any node has).
    #[error("{detail}: fix the pod template's resources")]
    InvalidResources {
        /// What is wrong, naming the container.
        detail: String,
    },
    /// A field of the job that the objects the operator creates from it cannot carry.
    #[error("{field}: {detail}")]
    InvalidSpec {
        /// The field.
        field: &'static str,
        /// What is wrong and what to write instead.
        detail: String,
    },
    /// The model hints cannot be true.
    #[error("{detail}")]
    InvalidModelHints {
        /// What is wrong and what to write instead.
        detail: String,
    },
    /// No node class holds the job's pods at once.
    #[error("{detail}")]
    InsufficientGpus {
        /// What the job needs and what the largest class has.
        detail: String,
    },
    /// No placement of the job's training state fits any class's GPU and host memory.
    #[error("{detail}")]
    DoesNotFit {
        /// The figures, and what would fit.
        detail: String,
    },
    /// A configuration the job or profile asks for explicitly would not fit in memory.
    #[error("{setting} asks for {placement}, which cannot run: {detail}")]
    ConfigurationDoesNotFit {
        /// Where the setting comes from (`spec.offload.mode Disabled`, `the profile's offloadRatio 0.1`).
        setting: String,
        /// What it would place where.
        placement: String,
        /// The figures and what to change.
        detail: String,
    },
    /// CPUCopy asked for where only coherent nodes exist and the profile forbids copy there.
    #[error(
        "mode CPUCopy needs a discrete GPU node but all {coherent} node(s) matching OffloadProfile {profile:?} are coherent, where copy offload causes extra copies and page-migration conflicts: set spec.offload.mode to Auto or UnifiedMemory, or set allowCPUCopyOnCoherentNodes in the profile"
    )]
    CopyOnCoherentNotAllowed {
        /// Profile name.
        profile: String,
        /// Coherent nodes that match.
        coherent: usize,
    },
    /// The pod's DRA claims cannot be sized (a template missing, a shared claim, a request
    /// for all of a node's GPUs, a request that does not read).
    #[error("the pod's DRA claims: {0}")]
    Claims(crate::dra::claims::ClaimError),
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
            ResolveError::RatioOutOfRange { .. } => "InvalidOffloadRatio",
            ResolveError::InvalidSelector { .. } => "InvalidProfileSelector",
            ResolveError::NoReportedNodes { .. } => "NoReportedNodes",
            ResolveError::NoCoherentNodes { .. } => "NoCoherentNodes",
            ResolveError::TemplateLeavesNoNodes { .. } => "TemplateLeavesNoNodes",
            ResolveError::CopyOnCoherentNotAllowed { .. } => "CopyOnCoherentNotAllowed",
            ResolveError::InvalidResources { .. } => "InvalidResources",
            ResolveError::InvalidSpec { .. } => "InvalidSpec",
            ResolveError::InvalidModelHints { .. } => "InvalidModelHints",
            ResolveError::InsufficientGpus { .. } => "InsufficientGPUs",
            ResolveError::DoesNotFit { .. } => "InsufficientMemory",
            ResolveError::ConfigurationDoesNotFit { .. } => "ConfigurationDoesNotFit",
            ResolveError::Claims(e) if e.depends_on_cluster() => "ClaimTemplateNotFound",
            ResolveError::Claims(_) => "InvalidResourceClaims",
        }
    }

    /// Whether a change of nodes or profiles could make the job resolvable (the controller
    /// retries those); the rest need the job itself to change. Memory and capacity depend on
    /// the cluster: larger or more nodes may come.
    pub fn depends_on_cluster(&self) -> bool {
        matches!(
            self,
            ResolveError::InvalidSelector { .. }
                | ResolveError::NoReportedNodes { .. }
                | ResolveError::NoCoherentNodes { .. }
                | ResolveError::TemplateLeavesNoNodes { .. }
                | ResolveError::CopyOnCoherentNotAllowed { .. }
                | ResolveError::InsufficientGpus { .. }
                | ResolveError::DoesNotFit { .. }
                | ResolveError::ConfigurationDoesNotFit { .. }
        ) || matches!(self, ResolveError::Claims(e) if e.depends_on_cluster())
    }
}
