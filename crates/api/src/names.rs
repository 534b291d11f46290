//! Well-known names: the API group, label and annotation keys, env var names and field managers.
//!
//! Every string that another component (the agent, the webhook, a training image, a user's
//! `kubectl`) relies on is defined here once. None of them lives under `nvidia.com/` (GPU Feature
//! Discovery) or `feature.node.kubernetes.io/` (Node Feature Discovery), so the agent never
//! fights those projects over a key.

/// API group of the CRDs.
pub const GROUP: &str = "offload.dev";
/// API version of the CRDs.
pub const VERSION: &str = "v1alpha1";

/// Annotation (and, for other job kinds and pods, label) that opts an object in, naming the
/// OffloadProfile to use or `auto` for the profile named [`DEFAULT_PROFILE`].
pub const PROFILE_ANNOTATION: &str = "offload.dev/profile";
/// The value of [`PROFILE_ANNOTATION`] that selects the [`DEFAULT_PROFILE`].
pub const PROFILE_AUTO: &str = "auto";
/// Name of the OffloadProfile used when a job asks for `auto`.
pub const DEFAULT_PROFILE: &str = "default";

/// Node label: `true` only for hardware-coherent unified memory (ATS addressing and C2C enabled).
pub const LABEL_UMA: &str = "offload.dev/uma";
/// Node label: NVML addressing mode, `ats`, `hmm` or `none`.
pub const LABEL_ADDRESSING_MODE: &str = "offload.dev/addressing-mode";
/// Node label: whether NVLink-C2C is enabled, `true` or `false`.
pub const LABEL_C2C: &str = "offload.dev/c2c";
/// Node label: result of the overlap self-test, `verified`, `failed` or `untested`.
pub const LABEL_OVERLAP: &str = "offload.dev/overlap";
/// Node annotation: the agent's versioned JSON report (see [`crate::report::NodeReport`]).
pub const ANNOTATION_NODE_REPORT: &str = "offload.dev/node-report";

/// All label keys the agent owns, for clean-up on uninstall.
pub const AGENT_LABELS: [&str; 4] = [LABEL_UMA, LABEL_ADDRESSING_MODE, LABEL_C2C, LABEL_OVERLAP];

/// Env var: `unified-memory`, `cpu-copy` or `disabled`.
pub const ENV_MODE: &str = "OFFLOAD_MODE";
/// Env var: `1` when the CPU update should overlap GPU work, else `0`.
pub const ENV_OVERLAP: &str = "OFFLOAD_OVERLAP";
/// Env var: share of optimizer state offloaded, a decimal in (0, 1].
pub const ENV_RATIO: &str = "OFFLOAD_RATIO";
/// Env var: `1` when host buffers should be pinned, else `0`.
pub const ENV_PIN_MEMORY: &str = "OFFLOAD_PIN_MEMORY";
/// Env var: the OffloadProfile the configuration was resolved with.
pub const ENV_PROFILE: &str = "OFFLOAD_PROFILE";
/// Env var: path of the rendered framework configuration file, where one is rendered.
pub const ENV_CONFIG_FILE: &str = "OFFLOAD_CONFIG_FILE";
/// Accelerate env var: offload FSDP parameters to the CPU (`true`/`false`).
pub const ENV_FSDP_OFFLOAD_PARAMS: &str = "FSDP_OFFLOAD_PARAMS";
/// Accelerate env var: FSDP generation (`1` or `2`).
pub const ENV_FSDP_VERSION: &str = "FSDP_VERSION";
/// Megatron-core's hybrid device optimizer flags as the decision sets them, space-separated, for
/// a launch line to expand (`torchrun pretrain_gpt.py … $OFFLOAD_MEGATRON_ARGS`).
pub const ENV_MEGATRON_ARGS: &str = "OFFLOAD_MEGATRON_ARGS";
/// The same settings as NeMo / Megatron-Bridge `optimizer.*` overrides, space-separated.
pub const ENV_NEMO_OVERRIDES: &str = "OFFLOAD_NEMO_OVERRIDES";
/// OpenMP's thread count: written on the training container, where it sets none, as its CPU
/// limit's whole cores (DeepSpeed's CPU Adam starts one thread per visible core otherwise).
pub const ENV_OMP_THREADS: &str = "OMP_NUM_THREADS";

/// Every env var name the operator may write into a container; the webhook removes none but
/// these when it re-renders, so a user's own env is never touched.
pub const OPERATOR_ENV: [&str; 10] = [
    ENV_MODE,
    ENV_OVERLAP,
    ENV_RATIO,
    ENV_PIN_MEMORY,
    ENV_PROFILE,
    ENV_CONFIG_FILE,
    ENV_FSDP_OFFLOAD_PARAMS,
    ENV_FSDP_VERSION,
    ENV_MEGATRON_ARGS,
    ENV_NEMO_OVERRIDES,
];

/// Annotation on other job kinds and Pods: requested mode (`Auto`, `UnifiedMemory`, `CPUCopy`,
/// `Disabled`); like `spec.offload.mode` of a TrainingJob.
pub const ANNOTATION_MODE: &str = "offload.dev/mode";
/// Annotation on other job kinds and Pods: requested overlap (`Auto`, `Enabled`, `Disabled`).
pub const ANNOTATION_OVERLAP: &str = "offload.dev/overlap";
/// Annotation on other job kinds and Pods: requested offload ratio (`Auto` or a decimal).
pub const ANNOTATION_RATIO: &str = "offload.dev/offload-ratio";
/// Annotation on other job kinds and Pods: framework (`DeepSpeed`, `FSDP`, `Megatron`,
/// `Generic`).
pub const ANNOTATION_FRAMEWORK: &str = "offload.dev/framework";
/// Annotation on other job kinds and Pods: framework version.
pub const ANNOTATION_FRAMEWORK_VERSION: &str = "offload.dev/framework-version";
/// Annotation on other job kinds and Pods of a Megatron-core job: its tensor-parallel size, as
/// `spec.megatron.tensorParallel` of a TrainingJob (1 when unset).
pub const ANNOTATION_MEGATRON_TENSOR_PARALLEL: &str = "offload.dev/megatron-tensor-parallel";
/// Annotation on other job kinds and Pods of a Megatron-core job: its pipeline-parallel size,
/// as `spec.megatron.pipelineParallel` (1 when unset).
pub const ANNOTATION_MEGATRON_PIPELINE_PARALLEL: &str = "offload.dev/megatron-pipeline-parallel";
/// Annotation on other job kinds and Pods of a Megatron-core job: `false` where it runs
/// without the distributed optimizer, as `spec.megatron.distributedOptimizer` (on when unset).
pub const ANNOTATION_MEGATRON_DISTRIBUTED_OPTIMIZER: &str =
    "offload.dev/megatron-distributed-optimizer";
/// Annotation on other job kinds and Pods of a Megatron-core job: `true` where it runs with
/// `--sequence-parallel`, as `spec.megatron.sequenceParallel` (off when unset).
pub const ANNOTATION_MEGATRON_SEQUENCE_PARALLEL: &str = "offload.dev/megatron-sequence-parallel";
/// Annotation on other job kinds and Pods of a Megatron-core job: `local` or
/// `transformer_engine`, Megatron-LM's `--transformer-impl`, as
/// `spec.megatron.transformerImpl` (`transformer_engine` when unset).
pub const ANNOTATION_MEGATRON_TRANSFORMER_IMPL: &str = "offload.dev/megatron-transformer-impl";
/// Annotation on other job kinds and Pods of a Megatron-core job: `false` where its training
/// loop does not run Megatron-LM's `--manual-gc`, as `spec.megatron.manualGc` (on when unset).
pub const ANNOTATION_MEGATRON_MANUAL_GC: &str = "offload.dev/megatron-manual-gc";
/// Annotation on other job kinds and Pods of a Megatron-core job: `adam`, `sgd` or `muon`,
/// Megatron-LM's `--optimizer`, as `spec.megatron.optimizer` (`adam` when unset).
pub const ANNOTATION_MEGATRON_OPTIMIZER: &str = "offload.dev/megatron-optimizer";
/// Annotation on other job kinds and Pods of a Megatron-core job: `true` where it runs with
/// `--fp8-param-gather`, as `spec.megatron.fp8ParamGather` (off when unset).
pub const ANNOTATION_MEGATRON_FP8_PARAM_GATHER: &str = "offload.dev/megatron-fp8-param-gather";
/// Annotation on other job kinds and Pods of a Megatron-core job: `delayed`, `tensorwise`,
/// `blockwise` or `mxfp8`, Megatron-LM's `--fp8-recipe`, as `spec.megatron.fp8Recipe`
/// (`delayed` when unset).
pub const ANNOTATION_MEGATRON_FP8_RECIPE: &str = "offload.dev/megatron-fp8-recipe";
/// Annotation on other job kinds and Pods of a Megatron-core job: `true` where it runs with
/// `--use-megatron-fsdp`, as `spec.megatron.megatronFsdp` (off when unset).
pub const ANNOTATION_MEGATRON_FSDP: &str = "offload.dev/megatron-fsdp";
/// Annotation a cluster operator sets on a Node whose witnesses of unified memory disagree (its
/// agent's report and the GPU driver's ResourceSlices): the memory model the agent reports
/// (`coherent`, `discrete` or `hmm`), confirmed, so the node is used as its agent classed it.
/// Any other value leaves the node unused.
pub const ANNOTATION_MEMORY_MODEL_CONFIRMED: &str = "offload.dev/memory-model-confirmed";
/// Annotation on other job kinds and Pods: the model's total parameters, as in
/// `spec.model.parameters` of a TrainingJob (`8B`, `8000000000`).
pub const ANNOTATION_MODEL_PARAMETERS: &str = "offload.dev/model-parameters";
/// Annotation on other job kinds and Pods: tokens per GPU per optimizer step.
pub const ANNOTATION_TOKENS_PER_STEP: &str = "offload.dev/tokens-per-step";
/// Annotation on other job kinds and Pods: tokens in one sequence of a micro-batch.
pub const ANNOTATION_SEQUENCE_LENGTH: &str = "offload.dev/sequence-length";
/// Annotation on other job kinds and Pods: the attention implementation the training code asks
/// `transformers` for (`sdpa`, `eager`, `flash_attention_2`).
pub const ANNOTATION_ATTENTION: &str = "offload.dev/attention";
/// Annotation on other job kinds and Pods: the model's width (hidden size).
pub const ANNOTATION_HIDDEN_SIZE: &str = "offload.dev/hidden-size";
/// Annotation on other job kinds and Pods: the model's layers.
pub const ANNOTATION_LAYERS: &str = "offload.dev/layers";
/// Annotation on other job kinds and Pods: the model's vocabulary size.
pub const ANNOTATION_VOCAB_SIZE: &str = "offload.dev/vocab-size";
/// Annotation on other job kinds and Pods: the model's MLP (intermediate) size.
pub const ANNOTATION_INTERMEDIATE_SIZE: &str = "offload.dev/intermediate-size";
/// Annotation on other job kinds and Pods: the model's attention (query) heads.
pub const ANNOTATION_ATTENTION_HEADS: &str = "offload.dev/attention-heads";
/// Annotation on other job kinds and Pods: the model's key/value heads.
pub const ANNOTATION_KEY_VALUE_HEADS: &str = "offload.dev/key-value-heads";
/// Annotation on other job kinds and Pods: the width of one attention head.
pub const ANNOTATION_HEAD_DIM: &str = "offload.dev/head-dim";
/// Annotation on other job kinds and Pods: `true` where input and output embeddings are tied.
pub const ANNOTATION_TIED_EMBEDDINGS: &str = "offload.dev/tied-embeddings";
/// Annotation on other job kinds and Pods: `false` where a `GPT` model's positions are not
/// rotary (learned or ALiBi).
pub const ANNOTATION_ROTARY_EMBEDDINGS: &str = "offload.dev/rotary-embeddings";
/// Annotation on other job kinds and Pods: `Llama` or `GPT`, how the blocks are built.
pub const ANNOTATION_ARCHITECTURE: &str = "offload.dev/architecture";
/// Annotation on other job kinds and Pods: routed experts per MoE layer.
pub const ANNOTATION_EXPERTS: &str = "offload.dev/experts";
/// Annotation on other job kinds and Pods: experts each token is routed to.
pub const ANNOTATION_EXPERTS_PER_TOKEN: &str = "offload.dev/experts-per-token";
/// Annotation on other job kinds and Pods: shared experts every token goes through.
pub const ANNOTATION_SHARED_EXPERTS: &str = "offload.dev/shared-experts";
/// Annotation on other job kinds and Pods: the MLP size of one expert.
pub const ANNOTATION_EXPERT_INTERMEDIATE_SIZE: &str = "offload.dev/expert-intermediate-size";
/// Annotation on other job kinds and Pods: a ConfigMap in the object's namespace holding the
/// model's `config.json` (key `config.json`), as `spec.model.configMapRef` of a TrainingJob.
pub const ANNOTATION_MODEL_CONFIG: &str = "offload.dev/model-config";
/// Annotation on other job kinds and Pods: `true` where the training code recomputes
/// activations in backward.
pub const ANNOTATION_ACTIVATION_CHECKPOINTING: &str = "offload.dev/activation-checkpointing";
/// Annotation the webhook writes on configured objects of other kinds and Pods: every reason
/// of the decision, one `field: reason` a line, as a TrainingJob's `status.offload.reasons`.
pub const ANNOTATION_REASONS: &str = "offload.dev/reasons";
/// Kueue's label naming the LocalQueue a job is submitted to: a TrainingJob carrying it gets a
/// workload Job carrying it, created suspended, which Kueue admits.
pub const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// Kueue's label naming a job's WorkloadPriorityClass; carried to the workload Job too.
pub const KUEUE_PRIORITY_LABEL: &str = "kueue.x-k8s.io/priority-class";

/// Name of the Kubeflow Trainer TrainJob CRD (the webhook reads which field it takes per-job
/// pod settings in).
pub const TRAINJOB_CRD: &str = "trainjobs.trainer.kubeflow.org";

/// Annotation the operator writes on mutated objects and on the pods of a TrainingJob: the
/// resolved configuration in one line (for `kubectl describe`).
pub const ANNOTATION_RESOLVED: &str = "offload.dev/resolved";

/// Annotation the agent writes on its own Node: what it observed the GPUs of configured pods
/// doing over its latest window (see [`crate::observed`]).
pub const ANNOTATION_OBSERVED: &str = "offload.dev/observed";

/// Annotation on the pods of a TrainingJob whose configuration is a trial of one faster than the
/// fastest that trained for its shape: the configuration it goes back to should it run out of
/// memory (`kubectl get pods -o yaml` shows which pods are trials).
pub const ANNOTATION_TRIAL: &str = "offload.dev/trial";

/// Annotation on a TrainingJob's workload Job: the decision it was built from, as JSON in the
/// shape of the TrainingJob's `status.offload`. A status lost between creating the workload and
/// recording the decision (a crash, an outage) is restored from it.
pub const ANNOTATION_DECISION: &str = "offload.dev/decision";

/// Annotation the operator writes on an opted-in batch Job whose pod ran out of memory: what
/// failed, with which configuration (other kinds are not recreated; JobSets, PyTorchJobs and
/// TrainJobs get the Event only).
pub const ANNOTATION_OUT_OF_MEMORY: &str = "offload.dev/out-of-memory";

/// Label the webhook puts on the pod templates it configures (batch Job, JobSet, PyTorchJob,
/// TrainJob): their pods are watched for out-of-memory failures.
pub const LABEL_CONFIGURED: &str = "offload.dev/configured";

/// Label on the sizer's Jobs and pods: the key of the step they trace.
pub const LABEL_SIZER: &str = "offload.dev/sizer";
/// Label on a sizer Job: the TrainingJob that asked for it (the one whose reconcile it wakes).
pub const LABEL_SIZER_FOR: &str = "offload.dev/sizer-for";
/// Annotation the webhook writes on the pod template of another kind's job whose model's step
/// is not traced yet: the step (JSON), which the operator traces for the jobs of it that come
/// after.
pub const ANNOTATION_SIZER_STEP: &str = "offload.dev/sizer-step";
/// Annotation the webhook writes on the pod template of another kind's job (batch Job, JobSet,
/// PyTorchJob) whose model's step is not traced yet: until when (RFC 3339) its pods wait for the
/// trace. Each pod is refused at creation while the sizer runs (its controller creates it again)
/// and decided as it is created; after this time the counted model decides.
pub const ANNOTATION_SIZER_WAIT_UNTIL: &str = "offload.dev/sizer-wait-until";
/// Annotation the webhook writes beside [`ANNOTATION_SIZER_WAIT_UNTIL`]: how many pods the job
/// runs, which its pods are decided for.
pub const ANNOTATION_WORKLOAD_PODS: &str = "offload.dev/workload-pods";
/// Label on the ConfigMaps that keep traces (in the operator's namespace): the step's key.
pub const LABEL_TRACE: &str = "offload.dev/trace";
/// Annotation on a trace ConfigMap: when the sizer finished (RFC 3339).
pub const ANNOTATION_TRACED_AT: &str = "offload.dev/traced-at";
/// Annotation on a trace ConfigMap: the image the sizer ran from.
pub const ANNOTATION_TRACED_BY: &str = "offload.dev/traced-by";

/// Label on every object and pod of a TrainingJob's workload: the TrainingJob's name.
pub const LABEL_TRAINING_JOB: &str = "offload.dev/training-job";

/// Annotation the webhook writes on a TrainingJob whose `Auto` values it resolved at creation:
/// the `spec.offload` the user asked for (JSON), so the controller explains the decision from
/// the original request, not from the concrete values that replaced it.
/// The operator writes it too, with every `spec.offload` it writes (a re-decision after an
/// out-of-memory), so the next decision is made from the user's request, never from the
/// operator's own earlier choice.
pub const ANNOTATION_REQUESTED: &str = "offload.dev/requested";

/// Condition on a TrainingJob saying whether a configuration that ran out of memory was
/// replaced (`True`, reason [`REASON_REDECIDING`]) or not (`False`).
pub const CONDITION_MEMORY_RECOVERY: &str = "MemoryRecovery";
/// `MemoryRecovery`'s reason while the workload that ran out is replaced by a new decision's:
/// the one state in which the webhook admits a change of `spec.offload` under an existing
/// workload reference.
pub const REASON_REDECIDING: &str = "Redeciding";

/// Secret the chart's operator keeps its managed webhook CA and serving certificate in.
pub const WEBHOOK_SECRET: &str = "offload-operator-webhook-tls";
/// Name of the chart's Mutating- and ValidatingWebhookConfiguration.
pub const WEBHOOK_CONFIGURATION: &str = "offload-operator";

/// Field manager of the operator's server-side applies: `spec.offload`, the workload objects,
/// and the decision part of a TrainingJob's status (`offload`, `OffloadResolved`).
pub const OPERATOR_MANAGER: &str = "offload-operator";
/// Field manager of the part of a TrainingJob's status that follows its workload (`phase`,
/// `workload`, `WorkloadCreated`). Kept apart from [`OPERATOR_MANAGER`] so that writing one part
/// can never drop fields of the other, even from a stale copy of the object.
pub const WORKLOAD_STATUS_MANAGER: &str = "offload-operator-workload";
/// Field manager of a TrainingJob's memory evidence (`status.memoryFailures`, the
/// `MemoryRecovery` condition).
pub const MEMORY_STATUS_MANAGER: &str = "offload-operator-memory";
/// Field manager of the agent's server-side applies.
pub const AGENT_MANAGER: &str = "offload-agent";

/// Extended resource name of NVIDIA GPUs, used to count how many GPUs a pod asks for.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Event reason (Normal, on a TrainingJob): its offload configuration was decided; the note is
/// the decision in one line.
pub const EVENT_OFFLOAD_RESOLVED: &str = "OffloadResolved";
/// Event reason (Normal, on a TrainingJob): its workload (an Indexed Job and a headless
/// Service) was created with the decided configuration.
pub const EVENT_WORKLOAD_CREATED: &str = "WorkloadCreated";
/// Event reason (Normal, on a TrainingJob): its configuration is a trial of one faster than the
/// fastest that trained for its shape; the note says what trained and what the job goes back to
/// should the trial run out of memory.
pub const EVENT_TRIAL: &str = "Trial";
/// Event reason (Warning, on a TrainingJob): a Job of the workload's name exists and is not
/// the TrainingJob's.
pub const EVENT_NAME_CONFLICT: &str = "NameConflict";
/// Event reason (Normal, on a TrainingJob): Kueue suspended its admitted workload again
/// (preemption, eviction); it resumes with the same configuration.
pub const EVENT_SUSPENDED: &str = "Suspended";
/// Event reason (Warning, on a TrainingJob): its GPUs were busy less than the profile's
/// `minObservedGpuBusy` with overlap on (the condition `OverlapObserved=False`).
pub const EVENT_GPUS_IDLE: &str = "GPUsIdle";
/// Event reason (Warning, on a TrainingJob): one of its GPUs came within 3 % of its memory (the
/// condition `GPUMemoryHeadroom=False`).
pub const EVENT_NEAR_GPU_MEMORY_LIMIT: &str = "NearGPUMemoryLimit";
/// Event reason (Warning, on a TrainingJob): the start-up guard failed a pod: the node is not
/// what the configuration assumed (the condition `NodeVerified=False`).
pub const EVENT_STARTUP_GUARD_FAILED: &str = "StartupGuardFailed";
/// Name of the start-up guard's init container (`offload-agent verify`), which the renderer
/// adds and the decision never counts as the training container.
pub const GUARD_CONTAINER: &str = "offload-verify";
/// Event reason (Warning, on a TrainingJob): a ResourceQuota refused the workload's pods
/// (the condition `PodsScheduled=False`, with the quota's words).
pub const EVENT_PODS_REFUSED_BY_QUOTA: &str = "PodsRefusedByQuota";
/// Event reason (Warning, on a TrainingJob): the LimitRanger refused the workload's pods
/// (the condition `PodsScheduled=False`, with the bound they break).
pub const EVENT_PODS_REFUSED_BY_LIMIT_RANGE: &str = "PodsRefusedByLimitRange";
/// Event reason (Warning, on a TrainingJob): an admission webhook refused the workload's pods
/// (the condition `PodsScheduled=False`, with the webhook's words).
pub const EVENT_PODS_REFUSED_BY_WEBHOOK: &str = "PodsRefusedByWebhook";
/// Event reason (Warning, on a TrainingJob): the API server refused the workload's pods for
/// another reason (the condition `PodsScheduled=False`, with its words).
pub const EVENT_PODS_REFUSED: &str = "PodsRefused";
/// Event reason (Warning, on a TrainingJob): the scheduler finds no node for a workload pod:
/// an untolerated taint, more than any node has (the condition `PodsScheduled=False`).
pub const EVENT_PODS_UNSCHEDULABLE: &str = "PodsUnschedulable";
/// Event reason (Warning): a training pod ran out of GPU or host memory; on a TrainingJob it is
/// decided again (condition `MemoryRecovery`), on a pod of another kind and its owner the
/// configuration that ran out is named.
pub const EVENT_OUT_OF_MEMORY: &str = "OutOfMemory";
/// Event reason (Normal, on a TrainingJob): the sizer traces its model's step; the workload is
/// created once it has, or after the sizer's time-out.
pub const EVENT_TRACING: &str = "Tracing";
/// Event reason (Warning, on a TrainingJob): the API server refused a write of its decision or
/// workload; the note says which and why.
pub const EVENT_APPLY_FAILED: &str = "ApplyFailed";
/// Event reason (Warning, on a TrainingJob): the object does not read as a TrainingJob (a
/// field of the wrong type); also the webhook's denial reason for such an object.
pub const EVENT_INVALID_OBJECT: &str = "InvalidObject";
/// Event reason (Normal, on an opted-in object of another kind): the webhook wrote its
/// configuration; the note is the decision in one line.
pub const EVENT_OFFLOAD_CONFIGURED: &str = "OffloadConfigured";
