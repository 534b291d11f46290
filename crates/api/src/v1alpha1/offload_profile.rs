//! `OffloadProfile`: the cluster operator's offload policy (cluster-scoped).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{ModeSetting, NodeClass, OverlapSetting, RatioSetting};

/// Default for `minOverlapEfficiency`.
pub const DEFAULT_MIN_OVERLAP_EFFICIENCY: f64 = 0.8;

/// Default of `minObservedGpuBusy`. On the H200 (docs/benchmarks/observe-h200.md), a balanced
/// step pipelined kept its GPU 94 % busy and serialised 49 %; a GPU-heavy one 98 % and 80 %.
pub const DEFAULT_MIN_OBSERVED_GPU_BUSY: f64 = 0.6;

fn default_min_observed_gpu_busy() -> f64 {
    DEFAULT_MIN_OBSERVED_GPU_BUSY
}

fn default_min_overlap_efficiency() -> f64 {
    DEFAULT_MIN_OVERLAP_EFFICIENCY
}

fn default_true() -> bool {
    true
}

fn default_node_class_order() -> Vec<NodeClass> {
    vec![NodeClass::Coherent, NodeClass::Discrete]
}

/// Policy for resolving the offload configuration of the jobs that name this profile.
///
/// A job's own `spec.offload` values win over the profile's; the profile fills in whatever the
/// job leaves `Auto`, and its `nodeSelector` always narrows the nodes a job may use.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "offload.dev",
    version = "v1alpha1",
    kind = "OffloadProfile",
    doc = "A cluster-wide offload policy: how jobs that name it (annotation offload.dev/profile) get their offload mode, overlap, ratio and node class.",
    plural = "offloadprofiles",
    shortname = "ofp",
    category = "offload",
    status = "OffloadProfileStatus",
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode"}"#,
    printcolumn = r#"{"name":"Overlap","type":"string","jsonPath":".spec.overlap"}"#,
    printcolumn = r#"{"name":"UMA-Nodes","type":"integer","jsonPath":".status.nodes.coherent"}"#,
    printcolumn = r#"{"name":"Nodes","type":"integer","jsonPath":".status.nodes.total"}"#,
    printcolumn = r#"{"name":"Jobs","type":"integer","jsonPath":".status.jobs"}"#,
    printcolumn = r#"{"name":"Learned","type":"string","description":"Job shapes whose memory the operator learned from observed runs, and the runs behind them","jsonPath":".status.learned.summary"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.offloadRatio) || self.offloadRatio != 'None' || (has(self.mode) && self.mode == 'Disabled')", "message": "offloadRatio None means nothing is offloaded: it goes only with mode Disabled"}
]))]
pub struct OffloadProfileSpec {
    /// Offload mode for jobs that leave theirs `Auto`. `Auto` picks `UnifiedMemory` on
    /// hardware-coherent nodes and `CPUCopy` on every other GPU node.
    #[serde(default)]
    pub mode: ModeSetting,

    /// Overlap of the CPU optimizer update with GPU work. `Auto` switches it on only where the
    /// node agent's self-test measured an efficiency of at least `minOverlapEfficiency`.
    #[serde(default)]
    pub overlap: OverlapSetting,

    /// Lowest measured overlap efficiency (0 to 1) at which `overlap: Auto` turns overlap on.
    #[serde(default = "default_min_overlap_efficiency")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min_overlap_efficiency: f64,

    /// Lowest busy fraction (0 to 1) the GPUs of a running job with overlap on may be observed
    /// at before the job is flagged (`OverlapObserved=False` and a Warning Event): below it, the
    /// CPU update is not overlapping GPU work, or it outlasts the GPU part of each step. 0 turns
    /// the flag off.
    #[serde(default = "default_min_observed_gpu_busy")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub min_observed_gpu_busy: f64,

    /// Share of optimizer state to offload: `Auto` or a number greater than 0 and at most 1.
    /// `Auto` uses the node report and the job's model hints; without hints it is 1.
    #[serde(default)]
    pub offload_ratio: RatioSetting,

    /// Pin (page-lock) host buffers so copies run asynchronously. Turned off automatically on
    /// nodes whose agent could not allocate pinned memory.
    #[serde(default = "default_true")]
    pub pin_memory: bool,

    /// Narrows the nodes this profile may place jobs on. The selector is also written into the
    /// pods' node affinity, so it binds scheduling as well as the decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,

    /// Order in which node classes are tried when a job could run on either; the first class
    /// with enough GPUs for the whole job wins.
    #[serde(default = "default_node_class_order")]
    #[schemars(length(min = 1, max = 2))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub node_class_order: Vec<NodeClass>,

    /// Allow an explicit-copy (`CPUCopy`) configuration to land on coherent nodes. Off by default:
    /// copy offload on a coherent node causes extra copies and page-migration conflicts.
    #[serde(default, rename = "allowCPUCopyOnCoherentNodes")]
    pub allow_cpu_copy_on_coherent_nodes: bool,

    /// Add the start-up guard to the pods this profile configures: an init container (the
    /// agent image, `offload-agent verify`) that checks, inside the pod's own GPUs, that the
    /// node is what the configuration assumes, and fails the pod with the reason when it is
    /// not. Only where the operator runs with an agent image and the pod requests GPUs.
    #[serde(default = "default_true")]
    pub startup_guard: bool,

    /// Consent, for every DeepSpeed job of this profile that leaves `deepspeed.zenFlow` unset,
    /// to ZenFlow on discrete nodes with overlap on: part of each update is applied
    /// asynchronously (a change to the optimisation, measured faster on PCIe GPUs).
    #[serde(default, rename = "allowZenFlow")]
    pub allow_zen_flow: bool,

    /// Consent, for every DeepSpeed job of this profile that leaves
    /// `deepspeed.bf16OptimizerStates` unset, to the optimizer state kept in bf16 under offload
    /// where the job fits no configuration in fp32 (a change to the numerics; about half the
    /// host memory of the offloaded state).
    #[serde(default)]
    pub allow_bf16_optimizer_states: bool,

    /// How many times a TrainingJob whose training pod runs out of GPU or host memory is
    /// re-decided with that evidence and recreated (its estimate raised past what failed); after
    /// that it is held with the figures. 0: never.
    #[serde(default = "default_max_memory_retries")]
    #[schemars(range(min = 0, max = 10))]
    pub max_memory_retries: u32,

    /// Whether this profile's decisions learn from what jobs really used (the observed GPU and
    /// host peaks of a configuration that ran, and out-of-memory failures) and use it for later
    /// jobs of the same shape on the same node class. `false`: the model's figures alone, and
    /// nothing is learned. What was learned is kept in the ConfigMap
    /// `offload-operator-learned` of the operator's namespace; delete it to forget everything.
    #[serde(default = "default_true")]
    pub learn_memory: bool,

    /// Whose runs teach a job's decision. `Namespace` (the default): only the runs of jobs in
    /// the job's own namespace, so one tenant's pods never move another tenant's
    /// configuration. `Cluster`: the runs of every namespace's jobs under this profile, for
    /// namespaces that share what they learn (one team's, or one that trusts them all). Either
    /// way each run's figures are checked for plausibility before they count.
    #[serde(default)]
    pub learning_scope: LearningScope,

    /// How many trials of a faster configuration a job shape may get on a node class: where the
    /// fastest configuration that trained for the shape left room to spare, and its runs' own
    /// figures say a faster rung fits (a smaller share of the optimizer state, or none), the
    /// next TrainingJob of the shape tries it; a trial keeps the CUDA context and the GPU's
    /// fragmentation share but not the room a first decision keeps for the allocator beside
    /// the step's logits. Should a trial run out of GPU memory, the job goes back to the
    /// configuration that trained, and no later trial goes as far. Where the runs' steps were
    /// timed (`reportAllocatorPeaks`), a trial that trained but stepped more than 5 % slower
    /// than the configuration it left is left too, and bounds later trials the same way. Each trial
    /// is said in the decision's reasons (`status.offload.trial`) and its Event. Only with
    /// `learnMemory`, and only for TrainingJobs (the operator recreates those after an
    /// out-of-memory). 0: never.
    #[serde(default = "default_faster_trials")]
    #[schemars(range(min = 0, max = 10))]
    pub faster_trials: u32,

    /// How a job with no model hints (no size the memory model can work from) starts.
    /// `Safest` (the default): every offload on (optimizer state and parameters), which runs
    /// whatever the model's size but is the slowest. `TryFastest`: without offload first, then
    /// one step more offload each time it runs out of memory (bounded by `maxMemoryRetries`);
    /// a re-run of the same job starts where the last one ran.
    #[serde(default)]
    pub unknown_size: UnknownSize,

    /// Whether the training container reports PyTorch's own memory figures
    /// (`torch.cuda.max_memory_allocated()` and `max_memory_reserved()`) when each process
    /// exits, so that what is learned is what the job needed, not NVML's device figure (which
    /// counts the caching allocator's cache and the CUDA context, and reads "almost the whole
    /// GPU" near the limit). The operator writes a `sitecustomize.py` beside the rendered
    /// framework config and sets `PYTHONPATH` to its directory in containers whose env does not
    /// set `PYTHONPATH`; it appends one line per process to the termination log (and the last
    /// lines of an exception that ended it), with the median time of its training iterations
    /// after the first (an iteration starts at the first module forward after an optimizer
    /// step), which ranks the configurations that trained (`fasterTrials`). Off by default: an
    /// image whose own `ENV` sets `PYTHONPATH` would lose it. Without it, the device's figure
    /// is learned as an upper bound, and configurations are ranked by the model's order alone.
    #[serde(default)]
    pub report_allocator_peaks: bool,

    /// Whether the training container asks for its cores as whole cores of its own, near its
    /// GPU: its CPU limit (whole cores, which the job states) becomes its CPU request too, and
    /// its memory limit and request one figure (the user's limit, else the host memory the
    /// decision counts on), so the pod is Guaranteed. Only where every node of the chosen class
    /// runs the kubelet's `static` CPU manager (as the agent reads it) and the pod's other
    /// containers already set requests equal to limits; the reasons say which condition is
    /// missing otherwise. The cores lie on the GPU's socket only where the kubelet's
    /// `topologyManagerPolicy` is `single-numa-node` or `restricted`: the start-up guard checks
    /// the cores it got against its GPUs' local CPUs and warns when they are not. A Guaranteed
    /// pod is killed at its memory limit. Off by default.
    #[serde(default)]
    pub whole_cores: bool,
}

/// Whose runs teach a profile's decisions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum LearningScope {
    /// Only the runs of the job's own namespace.
    #[default]
    Namespace,
    /// The runs of every namespace.
    Cluster,
}

/// How a job the memory model cannot size starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum UnknownSize {
    /// Every offload on: it runs whatever the size; the slowest.
    #[default]
    Safest,
    /// No offload first, more offload after each out-of-memory failure.
    TryFastest,
}

fn default_max_memory_retries() -> u32 {
    DEFAULT_MAX_MEMORY_RETRIES
}

fn default_faster_trials() -> u32 {
    DEFAULT_FASTER_TRIALS
}

/// Trials of a faster configuration per job shape and node class, by default.
pub const DEFAULT_FASTER_TRIALS: u32 = 2;

/// Re-decisions after running out of memory, by default.
pub const DEFAULT_MAX_MEMORY_RETRIES: u32 = 2;

impl Default for OffloadProfileSpec {
    fn default() -> Self {
        OffloadProfileSpec {
            mode: ModeSetting::Auto,
            overlap: OverlapSetting::Auto,
            min_overlap_efficiency: DEFAULT_MIN_OVERLAP_EFFICIENCY,
            min_observed_gpu_busy: DEFAULT_MIN_OBSERVED_GPU_BUSY,
            offload_ratio: RatioSetting::Auto,
            pin_memory: true,
            node_selector: None,
            node_class_order: default_node_class_order(),
            allow_cpu_copy_on_coherent_nodes: false,
            startup_guard: true,
            allow_zen_flow: false,
            allow_bf16_optimizer_states: false,
            max_memory_retries: DEFAULT_MAX_MEMORY_RETRIES,
            learn_memory: true,
            learning_scope: LearningScope::Namespace,
            faster_trials: DEFAULT_FASTER_TRIALS,
            unknown_size: UnknownSize::Safest,
            report_allocator_peaks: false,
            whole_cores: false,
        }
    }
}

/// What the operator currently observes for a profile.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OffloadProfileStatus {
    /// Reported GPU nodes matching the profile's selector, by memory model.
    #[serde(default)]
    pub nodes: NodeCounts,
    /// Number of TrainingJobs resolved with this profile.
    #[serde(default)]
    pub jobs: i32,
    /// `metadata.generation` the status was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// What this profile's decisions learned from observed runs; absent while nothing is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned: Option<LearnedSummary>,
    /// Conditions: `Ready` says whether any job could resolve with this profile now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// What a profile's decisions learned.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LearnedSummary {
    /// Job shapes (per node class) with something learned.
    pub shapes: i32,
    /// Runs behind them.
    pub runs: i32,
    /// `3 shapes / 7 runs`, for `kubectl get offloadprofiles`.
    pub summary: String,
}

/// Node counts of a profile, by memory model and overlap result.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeCounts {
    /// All reported GPU nodes matching the selector.
    #[serde(default)]
    pub total: i32,
    /// Hardware-coherent unified-memory nodes (ATS and C2C).
    #[serde(default)]
    pub coherent: i32,
    /// Nodes whose GPUs use HMM (software page migration).
    #[serde(default)]
    pub hmm: i32,
    /// Discrete GPU nodes without HMM or ATS.
    #[serde(default)]
    pub discrete: i32,
    /// Nodes whose overlap self-test passed.
    #[serde(default)]
    pub overlap_verified: i32,
    /// Nodes whose overlap self-test failed.
    #[serde(default)]
    pub overlap_failed: i32,
    /// Nodes matching the selector whose agent publication cannot be used (unreadable or
    /// impossible report, labels that contradict it, no GPU); the `Ready` condition says why.
    #[serde(default)]
    pub ignored: i32,
}
