//! `TrainingJob`: a distributed training job plus its offload configuration (namespaced).

use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{ModeSetting, NodeClass, OffloadMode, OverlapSetting, RatioSetting, Switch};
use super::megatron::MegatronSpec;
use super::model_hints::ModelHints;

fn default_replicas() -> i32 {
    1
}

/// A distributed training job: `replicas` pods from one template (an Indexed Job with a headless
/// Service for rendezvous), plus the offload configuration the operator resolves before any pod
/// starts.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "offload.dev",
    version = "v1alpha1",
    kind = "TrainingJob",
    doc = "A distributed training job whose CPU-offload configuration the operator resolves from the hardware before any pod starts.",
    plural = "trainingjobs",
    shortname = "tj",
    category = "offload",
    namespaced,
    status = "TrainingJobStatus",
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.offload.mode"}"#,
    printcolumn = r#"{"name":"Overlap","type":"string","jsonPath":".spec.offload.overlap"}"#,
    printcolumn = r#"{"name":"Ratio","type":"string","jsonPath":".spec.offload.offloadRatio"}"#,
    printcolumn = r#"{"name":"Resolution","type":"string","description":"Why the offload configuration is (or is not) resolved: the OffloadResolved condition's reason","jsonPath":".status.conditions[?(@.type==\"OffloadResolved\")].reason"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"GPU-Busy","type":"number","description":"Mean busy fraction of the job's GPUs, as the node agents observed them","jsonPath":".status.observed.gpuBusy"}"#,
    printcolumn = r#"{"name":"GPU-Mem","type":"string","description":"Highest GPU memory in use on one of the job's GPUs since its configuration started, beside what the decision estimated (GiB, with the CUDA context)","jsonPath":".status.observed.memory.gpu"}"#,
    printcolumn = r#"{"name":"Learned","type":"string","description":"What earlier runs of the job's shape taught its decision: the factors learned, a configuration that trained, a trial of a faster one","jsonPath":".status.offload.learned"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.framework.name == 'DeepSpeed' || !has(self.deepspeed)", "message": "spec.deepspeed is only valid with framework.name DeepSpeed"},
    {"rule": "self.framework.name != 'DeepSpeed' || has(self.framework.version)", "message": "framework.version is required for DeepSpeed: its config parser rejects keys the version does not know, so the operator must know the version"},
    {"rule": "self.framework.name != 'FSDP' || has(self.framework.version)", "message": "framework.version (the torch version) is required for FSDP"},
    {"rule": "self.framework.name == 'Megatron' || !has(self.megatron)", "message": "spec.megatron is only valid with framework.name Megatron"},
    {"rule": "self.framework.name != 'Megatron' || has(self.framework.version)", "message": "framework.version (the Megatron-core version) is required for Megatron: its argument parser rejects flags the version does not know"}
]))]
pub struct TrainingJobSpec {
    /// Number of pods (one rank group per pod). Each pod gets `JOB_COMPLETION_INDEX` and the
    /// rendezvous Service's name.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 10000))]
    pub replicas: i32,

    /// Retries before the workload is marked failed (the batch Job's `backoffLimit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub backoff_limit: Option<i32>,

    /// The training framework, which decides how the offload configuration is rendered.
    pub framework: FrameworkSpec,

    /// Offload configuration. Any `Auto` is replaced by a concrete value before a pod exists.
    #[serde(default)]
    pub offload: OffloadSpec,

    /// DeepSpeed specifics; only with `framework.name: DeepSpeed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deepspeed: Option<DeepSpeedSpec>,

    /// Megatron-core specifics; only with `framework.name: Megatron`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub megatron: Option<MegatronSpec>,

    /// What the operator knows of the model: with it, a job that fits in GPU memory runs
    /// without offload, and one that does not gets the smallest offload that fits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelHints>,

    /// Pod template of every replica. The operator adds env, the framework config mount and
    /// node affinity; everything else is used as written.
    #[schemars(schema_with = "pod_template_schema")]
    pub template: PodTemplateSpec,
}

/// The pod template's schema names only what the operator relies on (`spec.containers`, each
/// with a `name`) and keeps the rest as given: embedding the full PodSpec schema makes the CRD
/// several hundred kilobytes, and the API server validates the pods the Job creates anyway.
fn pod_template_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "description": "Pod template of every replica (a core/v1 PodTemplateSpec). The operator adds env, the framework config mount and node affinity; everything else is used as written.",
        "required": ["spec"],
        "properties": {
            "metadata": {
                "type": "object",
                "description": "Labels and annotations of the pods.",
                "x-kubernetes-preserve-unknown-fields": true
            },
            "spec": {
                "type": "object",
                "description": "A core/v1 PodSpec.",
                "required": ["containers"],
                "properties": {
                    "containers": {
                        "type": "array",
                        "description": "Containers of the pod; the offload env is written into each.",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["name"],
                            "x-kubernetes-preserve-unknown-fields": true
                        }
                    }
                },
                "x-kubernetes-preserve-unknown-fields": true
            }
        }
    })
}

/// The training framework and its version.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FrameworkSpec {
    /// `DeepSpeed`, `FSDP` (PyTorch FSDP through Accelerate), `Megatron` (Megatron-core, and
    /// NeMo / Megatron-Bridge on top of it) or `Generic` (env vars only).
    pub name: Framework,
    /// Version of the framework in the image: the DeepSpeed version for DeepSpeed, the torch
    /// version for FSDP, the Megatron-core version for Megatron. Required for all three; keys
    /// and flags are only emitted where this version accepts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub version: Option<String>,
}

/// Training frameworks the operator renders configuration for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Framework {
    /// DeepSpeed ZeRO: `zero_optimization.offload_optimizer` / `offload_param` are rendered.
    DeepSpeed,
    /// PyTorch FSDP through Accelerate: `FSDP_OFFLOAD_PARAMS` and `FSDP_VERSION` are set.
    #[serde(rename = "FSDP")]
    Fsdp,
    /// Megatron-core (and NeMo / Megatron-Bridge, which build its optimizer from the same
    /// settings): its hybrid device optimizer's flags are rendered into `OFFLOAD_MEGATRON_ARGS`
    /// and the same settings as overrides into `OFFLOAD_NEMO_OVERRIDES`.
    Megatron,
    /// Any other framework: only the `OFFLOAD_*` env vars are set.
    Generic,
}

/// Offload settings of a job. Each `Auto` defers to the profile, then to the hardware.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.offloadRatio) || self.offloadRatio != 'None' || (has(self.mode) && self.mode == 'Disabled')", "message": "offloadRatio None means nothing is offloaded: it goes only with mode Disabled"}
]))]
pub struct OffloadSpec {
    /// `Auto`, `UnifiedMemory`, `CPUCopy` or `Disabled`.
    #[serde(default)]
    pub mode: ModeSetting,
    /// `Auto`, `Enabled` or `Disabled`.
    #[serde(default)]
    pub overlap: OverlapSetting,
    /// `Auto`, a number greater than 0 and at most 1, or `None` (nothing offloaded; with mode
    /// `Disabled`).
    #[serde(default)]
    pub offload_ratio: RatioSetting,
    /// `Auto`, `Enabled` or `Disabled`: pin host buffers.
    #[serde(default)]
    pub pin_memory: Switch,
}

impl OffloadSpec {
    /// Whether every field already holds a concrete value.
    pub fn is_concrete(&self) -> bool {
        self.mode != ModeSetting::Auto
            && self.overlap != OverlapSetting::Auto
            && self.offload_ratio != RatioSetting::Auto
            && self.pin_memory != Switch::Auto
    }
}

/// DeepSpeed specifics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeepSpeedSpec {
    /// ConfigMap (same namespace) holding the user's DeepSpeed JSON. The operator merges its
    /// offload section into a copy and leaves every other key as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<ConfigMapKeyRef>,
    /// ZeRO stage (0 to 3) when the user's JSON does not state one; 3 when neither does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3))]
    pub zero_stage: Option<u8>,
    /// Also offload parameters (`offload_param`, ZeRO stage 3 only). Unset lets the operator
    /// decide: on for full copy offload (`CPUCopy`, ratio 1) at ZeRO stage 3, where it was
    /// measured about 1.5 times faster on a PCIe H200 at 0.3B and 2B parameters; off elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload_params: Option<bool>,
    /// SuperOffload (`super_offload`). Unset lets the operator switch it on for overlapped
    /// offload on coherent nodes only; `true` asks for it on any node (DeepSpeed ≥ 0.18.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub super_offload: Option<bool>,
    /// ZenFlow (`zero_optimization.zenflow`, DeepSpeed ≥ 0.17.5): the CPU update of the less
    /// important gradient columns is applied asynchronously, every few steps, so the GPU does
    /// not wait for it. That changes the optimisation, so it is never on without consent:
    /// `true` here, or unset under a profile with `allowZenFlow`. `false` keeps it off.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "zenFlow")]
    pub zen_flow: Option<bool>,
    /// The optimizer state kept in bf16 under offload (`bf16.bf16_master_weights_and_grads`
    /// and `bf16.bf16_optimizer_states`, DeepSpeed ≥ 0.19.1): about half the host memory the
    /// offloaded state takes in fp32. It changes the numerics, so it is never on without
    /// consent: `true` here, or unset under a profile with `allowBf16OptimizerStates`; then
    /// written only where the job fits no fp32 configuration. `false` keeps it off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bf16_optimizer_states: Option<bool>,
    /// Directory where the rendered `ds_config.json` is mounted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^/[^\x00]*$"))]
    pub mount_path: Option<String>,
}

/// A key of a ConfigMap in the job's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKeyRef {
    /// Name of the ConfigMap.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key holding the file: under `spec.deepspeed`, the DeepSpeed JSON (`ds_config.json` when
    /// unset); under `spec.model`, the model's Hugging Face `config.json` (`config.json` when
    /// unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Observed state of a TrainingJob.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingJobStatus {
    /// `Pending` (not resolved or no pod running yet), `Queued` (waiting in its Kueue queue),
    /// `Running`, `Succeeded` or `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<JobPhase>,
    /// The resolved offload configuration and why it was chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload: Option<OffloadDecisionStatus>,
    /// Names of the objects created for the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadRef>,
    /// `metadata.generation` the status was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// What the job's GPUs were observed doing while it ran, from the node agents; absent
    /// until an agent has observed one of its pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<ObservedOverlap>,
    /// Out-of-memory failures of the job's earlier configurations, oldest first: the evidence
    /// its later decisions were made with (at most the profile's `maxMemoryRetries` + 1).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 11))]
    pub memory_failures: Vec<MemoryFailure>,
    /// Conditions: `OffloadResolved`, `WorkloadCreated`, `Admitted` (for a job in a Kueue queue:
    /// whether Kueue let its workload run), `PodsScheduled` (whether the cluster created and
    /// placed the workload's pods), `NodeVerified` (the start-up guard),
    /// `OverlapObserved` (whether a job with overlap on keeps its GPUs busy), `MemoryRecovery`
    /// (whether a configuration that ran out of memory was replaced).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Which memory ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum MemoryKind {
    /// A GPU's (`CUDA out of memory`).
    #[serde(rename = "GPU")]
    Gpu,
    /// The host's (the container was `OOMKilled`).
    Host,
}

/// One configuration of the job that ran out of memory, and the figures it was decided with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryFailure {
    /// Which memory ran out.
    pub kind: MemoryKind,
    /// The configuration that ran out (`mode=CPUCopy overlap=false ratio=0.2 …`).
    pub configuration: String,
    /// What the decision estimated that configuration needs of that memory, bytes (per GPU, or
    /// per pod on the host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate_bytes: Option<i64>,
    /// What it had of that memory, bytes: what the GPU can hold, or the pod's limit or share
    /// of the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_bytes: Option<i64>,
    /// For host memory: the pod's memory limit, bytes, where it had one (killed at its limit);
    /// absent where it had none (the node ran out, and the pod had its estimate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<i64>,
    /// For GPU memory: what PyTorch's allocator had handed out plus what it asked for when the
    /// allocation failed, bytes (from its out-of-memory text): what the job needed at least.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needed_bytes: Option<i64>,
    /// The pod that failed.
    pub pod: String,
    /// What the pod said (its termination message, bounded).
    #[schemars(length(max = 1024))]
    pub message: String,
    /// When it was seen (RFC 3339).
    pub seen_at: String,
}

/// Lifecycle phase of a TrainingJob.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum JobPhase {
    /// Waiting for resolution or for pods to start.
    Pending,
    /// Resolved and waiting in its Kueue queue: the workload Job is suspended until Kueue admits
    /// it (or suspended again by Kueue, on preemption or eviction); it resumes with the same
    /// configuration.
    Queued,
    /// At least one pod is running.
    Running,
    /// The workload completed.
    Succeeded,
    /// The workload failed.
    Failed,
}

/// The decision recorded in status.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OffloadDecisionStatus {
    /// Concrete mode.
    pub mode: OffloadMode,
    /// Whether overlap is on.
    pub overlap: bool,
    /// Share of the optimizer state offloaded: in (0, 1], 0 when nothing is offloaded.
    pub offload_ratio: f64,
    /// Whether host buffers are pinned.
    pub pin_memory: bool,
    /// Node class the pods are pinned to; absent when offload is disabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_class: Option<NodeClass>,
    /// Profile used.
    pub profile: String,
    /// Lowest overlap efficiency measured on the chosen nodes, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap_efficiency: Option<f64>,
    /// Whether DeepSpeed SuperOffload is on.
    #[serde(default)]
    pub super_offload: bool,
    /// Where the training state was placed: what the memory model sized, or for a job without
    /// model hints the rung it was put on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<StatePlacement>,
    /// One reason per choice, in the order they were made.
    #[serde(default)]
    pub reasons: Vec<DecisionReason>,
    /// What the memory model estimated for the configuration written, where it sized the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<MemoryEstimateStatus>,
    /// The request the decision was made from (`spec.offload` before the operator wrote its
    /// concrete values): a later decision of the same job (after it ran out of memory) starts
    /// from it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested: Option<OffloadSpec>,
    /// Set where this configuration is a trial: one rung faster than the fastest that trained
    /// for the job's shape on its node class, which that run's figures say fits (the profile's
    /// `fasterTrials`). Should it run out of memory, the job goes back to the configuration
    /// that trained, and the trial is never made again for the shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trial: Option<TrialStatus>,
    /// What earlier runs of the job's shape taught this decision, in a few words for `kubectl
    /// get` (`2 runs: activations ×0.93; trial, 36% trained`); absent where nothing was learned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned: Option<String>,
}

/// A trial of a faster configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrialStatus {
    /// The configuration that trained, which the job goes back to if this one runs out of
    /// memory (`30% of the optimizer state offloaded`).
    pub fallback: String,
    /// What the run that trained needed of each GPU, and what the trial is estimated to need,
    /// in a sentence.
    pub evidence: String,
}

/// Where a configuration puts the training state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum StatePlacement {
    /// Everything on the GPUs.
    NoOffload,
    /// A share of the optimizer state (`offloadRatio`) on the host.
    PartialOptimizer,
    /// All optimizer state on the host, parameters on the GPUs.
    Optimizer,
    /// Optimizer state and parameters on the host.
    OptimizerAndParams,
}

/// The memory model's figures for the configuration written.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryEstimateStatus {
    /// Bytes per GPU.
    pub gpu_bytes: i64,
    /// What each GPU can hold of it (its memory less the CUDA context and fragmentation).
    pub gpu_budget_bytes: i64,
    /// Bytes of host memory per pod.
    pub host_bytes: i64,
    /// Host memory a pod can have (its limit or its share of the node), where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_budget_bytes: Option<i64>,
    /// Of `gpuBytes`, the part without activations: what the model counts exactly (parameters,
    /// gradients, optimizer state, buffers), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_structural_bytes: Option<i64>,
    /// The job's shape as what the operator learns is keyed by (a digest of the framework, its
    /// sharding, the precision, the model and its batch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub shape: Option<String>,
    /// What runs of the same shape taught, in effect in these figures; absent where nothing was
    /// learned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learned: Option<LearnedFactorsStatus>,
}

/// Factors learned from runs of a job shape, as a decision applied them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LearnedFactorsStatus {
    /// On the activation part of the GPU estimate.
    pub activations: f64,
    /// On the host estimate.
    pub host: f64,
    /// Runs behind them.
    pub runs: i32,
}

/// Why one setting got its value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DecisionReason {
    /// The setting: `mode`, `nodeClass`, `overlap`, `offloadRatio`, `pinMemory` or `framework`.
    pub field: String,
    /// What decided it, one of a closed set (the book's reason reference lists each); absent
    /// only in statuses written before codes existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<super::ReasonCode>,
    /// One sentence with the figures that decide it; `offload-operator explain` gives the long
    /// account.
    pub message: String,
}

/// The job's GPUs as the node agents observed them over their latest windows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedOverlap {
    /// Mean busy fraction of all the job's observed GPUs (0 to 1): the share of time a kernel
    /// ran. A job that overlaps its CPU optimizer work keeps it near 1; one that serialises
    /// the two leaves the GPUs idle for the CPU part of every step.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub gpu_busy: f64,
    /// GPUs observed.
    pub gpus: i32,
    /// CPU the job's observed pods used, in cores, where their cgroups were readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_cores: Option<f64>,
    /// End of the oldest window that went into these figures (RFC 3339).
    pub observed_at: String,
    /// Length of the agents' window in seconds.
    pub window_seconds: f64,
    /// Per node, sorted by name.
    #[serde(default)]
    #[schemars(length(max = 512))]
    pub nodes: Vec<NodeObservation>,
    /// The memory the job's configuration was observed to use: the highest since it started
    /// (kept across windows while the configuration is the same), beside the estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ObservedMemory>,
}

/// The memory a configuration of the job was observed to use, at its highest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedMemory {
    /// The configuration it ran with (in the words of `memoryFailures`).
    pub configuration: String,
    /// Highest GPU memory in use on any one of the job's GPUs (NVML's device figure: the
    /// job's allocations, its CUDA context and anything else on the GPU), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_peak_bytes: Option<i64>,
    /// The same counting only the job's own processes, where NVML gave it, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_gpu_peak_bytes: Option<i64>,
    /// Memory of the job's smallest observed GPU, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_total_bytes: Option<i64>,
    /// What the decision estimated a GPU holds, with the CUDA context's reserve (what the device
    /// figure counts), bytes; absent where the decision did not size the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_estimate_bytes: Option<i64>,
    /// Highest host memory of any one of the job's pods (its cgroup), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_peak_bytes: Option<i64>,
    /// What the decision estimated a pod holds in host memory, bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_estimate_bytes: Option<i64>,
    /// The GPU peak beside the estimate, for `kubectl get` (`61.2/64.0Gi`; `61.2Gi` without an
    /// estimate).
    #[serde(default)]
    pub gpu: String,
    /// End of the first window that observed the configuration (RFC 3339).
    pub since: String,
    /// Windows that went into these figures.
    pub windows: i32,
}

/// One node's share of a job, as its agent observed it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeObservation {
    /// The node.
    pub node: String,
    /// Mean busy fraction of the job's GPUs on this node (0 to 1).
    #[schemars(range(min = 0.0, max = 1.0))]
    pub gpu_busy: f64,
    /// The job's GPUs on this node.
    pub gpus: i32,
    /// CPU the job's pods on this node used, in cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_cores: Option<f64>,
    /// End of the node's window (RFC 3339).
    pub observed_at: String,
}

/// Objects the operator created for the job (all owned by it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadRef {
    /// The Indexed batch/v1 Job.
    pub job: String,
    /// The headless rendezvous Service.
    pub service: String,
    /// The ConfigMap with the rendered framework configuration, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<String>,
}
