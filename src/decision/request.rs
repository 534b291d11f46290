//! What a job asks for, independent of the object kind that carries it, and the one way each
//! kind's request is built: [`JobRequest::for_training_job`] and [`JobRequest::from_annotations`].

use std::collections::BTreeMap;

use serde_json::Value;

use super::annotations::model_annotations;
use super::error::ResolveError;
use crate::decision::frameworks::user_config::ConfigFacts;
use crate::decision::frameworks::user_config::UserConfig;
use crate::decision::pod::resources::PodResources;
use offload_api::names;
use offload_api::v1alpha1::{
    DeepSpeedSpec, Framework, FrameworkSpec, ModeSetting, ModelHints, OffloadSpec, OverlapSetting,
    RatioSetting, TrainingJob,
};

/// What runs taught, as the caller holds it, and the time its lessons are aged to (part of the
/// input, so a decision stays a function of what it is given).
#[derive(Clone, Debug, PartialEq)]
pub struct LearnedView {
    /// The lessons.
    pub memory: std::sync::Arc<crate::decision::runs::learned::LearnedMemory>,
    /// Now.
    pub now: jiff::Timestamp,
    /// The namespace whose jobs' runs count (`None`: every namespace's).
    pub namespace: Option<String>,
    /// The job being decided (`namespace/name/uid`), whose own trial taken does not count
    /// against it.
    pub job: Option<String>,
}

impl LearnedView {
    /// The view a job in `namespace` decides with under a profile of `scope`: its namespace's
    /// runs alone unless the profile shares them across namespaces.
    pub fn for_job(
        self,
        scope: offload_api::v1alpha1::LearningScope,
        namespace: &str,
    ) -> LearnedView {
        LearnedView {
            namespace: match scope {
                offload_api::v1alpha1::LearningScope::Namespace => Some(namespace.to_string()),
                offload_api::v1alpha1::LearningScope::Cluster => None,
            },
            ..self
        }
    }

    /// The same view, deciding the job whose run will be recorded as `job`.
    pub fn of_run(self, job: String) -> LearnedView {
        LearnedView {
            job: Some(job),
            ..self
        }
    }

    /// [`crate::decision::runs::learned::LearnedMemory::reserved_trials`] that count here.
    pub fn reserved_trials(
        &self,
        profile: &str,
        class: offload_api::v1alpha1::NodeClass,
        shape: &str,
    ) -> usize {
        self.memory.reserved_trials(
            profile,
            class,
            shape,
            self.now,
            self.namespace.as_deref(),
            self.job.as_deref(),
        )
    }

    /// [`crate::decision::runs::learned::LearnedMemory::factors`] of the runs that count here.
    pub fn factors(
        &self,
        profile: &str,
        class: offload_api::v1alpha1::NodeClass,
        shape: &str,
    ) -> Option<crate::decision::runs::learned::LearnedFactors> {
        self.memory
            .factors_of(profile, class, shape, self.now, self.namespace.as_deref())
    }

    /// [`crate::decision::runs::learned::LearnedMemory::evidence`] of the runs that count here.
    pub fn evidence(
        &self,
        profile: &str,
        class: offload_api::v1alpha1::NodeClass,
        shape: &str,
    ) -> Vec<crate::decision::runs::learned::RanRecord> {
        self.memory
            .evidence_of(profile, class, shape, self.now, self.namespace.as_deref())
    }
}

/// What a job asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRequest {
    /// The job's offload settings (each may be `Auto`).
    pub offload: OffloadSpec,
    /// Framework and version.
    pub framework: FrameworkSpec,
    /// DeepSpeed specifics (only read for DeepSpeed).
    pub deepspeed: DeepSpeedRequest,
    /// Megatron-core's parallel layout (only read for Megatron; unset sizes are 1).
    pub megatron: offload_api::v1alpha1::MegatronSpec,
    /// What the operator knows of the model.
    pub model: Option<ModelHints>,
    /// The model's shape from its `config.json`, where the job references one and it was read.
    pub model_config: Option<crate::decision::model::shape::ModelShape>,
    /// The trace of the job's step by the sizer, where the view has one (see
    /// [`crate::decision::model::sizer::SizerRequest`]).
    pub model_trace: crate::decision::model::sizer::TraceInput,
    /// The model hints came from annotations (another kind), not `spec.model`: messages name
    /// the annotations.
    pub hints_from_annotations: bool,
    /// Configurations of this job that ran out of memory, oldest first (a TrainingJob's
    /// `status.memoryFailures`): each raises the estimates past what failed.
    pub memory_failures: Vec<offload_api::v1alpha1::MemoryFailure>,
    /// What runs of jobs taught the memory model, where the caller holds it.
    pub learned: Option<LearnedView>,
    /// Who the job is, for what is learned of a job without model hints: a re-run of the same
    /// TrainingJob (its namespace, name and pod template) is decided from its earlier runs'
    /// peaks. `None` for other kinds.
    pub identity: Option<String>,
    /// Where the pod template lets its pods run (its nodeSelector, required node affinity and
    /// tolerations): they narrow the candidate nodes.
    pub constraints: super::PodConstraints,
    /// Number of pods.
    pub pods: u32,
    /// GPUs each pod asks for (at least 1).
    pub gpus_per_pod: u32,
    /// The pod's memory limit, when every container states one, or the training container's
    /// own where lower (bytes), with its namespace's LimitRanges applied.
    pub pod_memory_limit: Option<u64>,
    /// Where that limit is a LimitRange's, not the pod's own: which and how, in words.
    pub pod_memory_limit_source: Option<String>,
    /// The training container's CPU limit (cores), and the LimitRange whose default it is
    /// where it is not its own.
    pub cpu_limit: Option<(f64, Option<String>)>,
    /// The training container's CPU request (cores).
    pub cpu_request: Option<f64>,
    /// The training container's memory limit (bytes; its own, or its namespace's).
    pub training_memory_limit: Option<u64>,
    /// The pod's other containers that keep it from being Guaranteed (no CPU or memory limit,
    /// or a request other than it).
    pub not_guaranteed: Vec<String>,
    /// The training container (index in the pod template) and its memory request as written:
    /// the decision raises the request to the host memory it counts on.
    pub training_container: Option<(usize, Option<u64>)>,
    /// The least memory request its namespace's LimitRanges take for the training container,
    /// and why: a request the decision writes is never below it.
    pub memory_request_floor: Option<(u64, String)>,
    /// What the user's framework config says that sizes memory.
    pub config: ConfigFacts,
    /// Whether a job no node class holds at once is refused now (a TrainingJob: the controller
    /// holds it until nodes arrive) rather than placed on the first class to wait for capacity
    /// (another kind, whose pods are created now; gang admission is a queue's job, e.g. Kueue).
    pub hold_for_capacity: bool,
    /// The pod's DRA claims that request GPUs (claim entry → its ResourceClaimTemplate), when
    /// the job is pinned to a node class through them (a TrainingJob: the operator writes a
    /// copy of each template that selects only the class's GPUs). Empty otherwise.
    pub gpu_claims: Option<crate::dra::claims::ClaimPinning>,
    /// The pod's claim entries whose devices are GPUs (any kind): the start-up guard shares
    /// them, as device-plugin GPUs are shared by requesting the same count.
    pub gpu_claim_entries: Vec<String>,
}

impl Default for JobRequest {
    /// One pod of one GPU, framework `Generic`, everything else left to the operator.
    fn default() -> Self {
        JobRequest {
            offload: OffloadSpec::default(),
            framework: FrameworkSpec {
                name: Framework::Generic,
                version: None,
            },
            deepspeed: DeepSpeedRequest::default(),
            megatron: Default::default(),
            model: None,
            model_config: None,
            model_trace: Default::default(),
            hints_from_annotations: false,
            memory_failures: Vec::new(),
            learned: None,
            identity: None,
            constraints: super::PodConstraints::default(),
            pods: 1,
            gpus_per_pod: 1,
            pod_memory_limit: None,
            pod_memory_limit_source: None,
            cpu_limit: None,
            cpu_request: None,
            training_memory_limit: None,
            not_guaranteed: Vec::new(),
            training_container: None,
            memory_request_floor: None,
            config: ConfigFacts::default(),
            hold_for_capacity: true,
            gpu_claims: None,
            gpu_claim_entries: Vec::new(),
        }
    }
}

/// DeepSpeed specifics of a request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeepSpeedRequest {
    /// ZeRO stage stated in the user's DeepSpeed JSON, if any.
    pub stage_in_config: Option<u8>,
    /// ZeRO stage stated in the job spec, if any.
    pub stage_in_spec: Option<u8>,
    /// Offload parameters too (`offload_param`): asked for, refused, or left to the operator.
    pub offload_params: Option<bool>,
    /// Explicit SuperOffload request.
    pub super_offload: Option<bool>,
    /// The job's ZenFlow consent (`true`), refusal (`false`) or nothing.
    pub zen_flow: Option<bool>,
    /// The user's DeepSpeed JSON already has a `zenflow` section (their own consent).
    pub zenflow_in_config: bool,
    /// The job's consent (`true`) or refusal (`false`) to bf16 optimizer states under offload.
    pub bf16_optimizer_states: Option<bool>,
    /// The user's DeepSpeed JSON trains in bf16 (`bf16.enabled`).
    pub bf16_in_config: bool,
    /// The user's DeepSpeed JSON already keeps the optimizer state in bf16 (their consent).
    pub bf16_states_in_config: bool,
}

/// The id a TrainingJob's runs are recorded under: `namespace/name/uid`.
pub fn run_id(tj: &TrainingJob) -> String {
    format!(
        "{}/{}/{}",
        tj.metadata.namespace.as_deref().unwrap_or_default(),
        tj.metadata.name.as_deref().unwrap_or_default(),
        tj.metadata.uid.as_deref().unwrap_or_default()
    )
}

/// A TrainingJob's identity for what is learned without model hints: its namespace and name, and
/// a digest of what it runs (framework, DeepSpeed settings, replicas, pod template).
pub fn identity(tj: &TrainingJob) -> String {
    use sha2::Digest;
    let spec = &tj.spec;
    let mut value = serde_json::json!({
        "framework": spec.framework,
        "deepspeed": spec.deepspeed,
        "replicas": spec.replicas,
        "template": spec.template,
    });
    // Only where given, so the identities of jobs written before it stay as they were.
    if let (Some(m), Some(map)) = (spec.megatron, value.as_object_mut()) {
        map.insert("megatron".into(), serde_json::json!(m));
    }
    let text = value.to_string();
    let digest = sha2::Sha256::digest(text.as_bytes());
    let short: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!(
        "{}/{}@{short}",
        tj.metadata.namespace.as_deref().unwrap_or_default(),
        tj.metadata.name.as_deref().unwrap_or_default()
    )
}

impl JobRequest {
    /// The request of a TrainingJob, with the user's DeepSpeed config where one was read.
    /// Where the webhook resolved `Auto` at creation and the spec still holds what it wrote,
    /// the request is what the user asked for; once the user edits `spec.offload`, the spec is
    /// the request.
    pub fn for_training_job(
        tj: &TrainingJob,
        config: Option<&UserConfig>,
        model_config: Option<&crate::decision::model::shape::ModelShape>,
        view: &dyn super::ClusterView,
    ) -> Result<JobRequest, ResolveError> {
        let spec = &tj.spec;
        let namespace = tj.metadata.namespace.as_deref().unwrap_or_default();
        let (resources, gpu_claims) =
            PodResources::with_claims(spec.template.spec.as_ref(), namespace, view)?;
        let ds = spec.deepspeed.clone().unwrap_or_default();
        let mut deepspeed = DeepSpeedRequest::from_spec(&ds, config.and_then(|c| c.stage));
        deepspeed.zenflow_in_config = config.is_some_and(|c| c.zenflow);
        deepspeed.bf16_in_config = config.is_some_and(|c| c.bf16);
        deepspeed.bf16_states_in_config = config.is_some_and(|c| c.bf16_states);
        let offload = super::AdmittedRequest::original(tj)
            .or_else(|| recorded_request(tj))
            .unwrap_or_else(|| spec.offload.clone());
        let request = JobRequest {
            offload,
            framework: spec.framework.clone(),
            deepspeed,
            megatron: spec.megatron.unwrap_or_default(),
            model: spec.model.clone(),
            model_config: model_config.copied(),
            model_trace: Default::default(),
            hints_from_annotations: false,
            learned: None,
            identity: Some(identity(tj)),
            memory_failures: tj
                .status
                .as_ref()
                .map(|s| s.memory_failures.clone())
                .unwrap_or_default(),
            constraints: super::PodConstraints::of(spec.template.spec.as_ref())
                .in_namespace(spec.template.spec.as_ref(), resources.cpu_default_request)
                .on_cluster(view),
            pods: u32::try_from(spec.replicas.max(1)).unwrap_or(1),
            config: config.map(|c| c.facts).unwrap_or_default(),
            hold_for_capacity: true,
            gpu_claim_entries: gpu_claims
                .as_ref()
                .map(|p| p.claims.keys().cloned().collect())
                .unwrap_or_default(),
            gpu_claims,
            ..JobRequest::default()
        }
        .with_resources(&resources);
        Ok(request.with_trace(namespace, view))
    }

    /// The request with the trace of its step that `view` has (see
    /// [`crate::decision::model::sizer::SizerRequest`]); set by every constructor's caller once the model's
    /// `config.json` is in.
    pub fn with_trace(self, namespace: &str, view: &dyn super::ClusterView) -> JobRequest {
        let model_trace = crate::decision::model::sizer::SizerRequest::of(&self)
            .map_or_else(Default::default, |r| view.model_trace(namespace, &r));
        JobRequest {
            model_trace,
            ..self
        }
    }

    /// What another object kind asks for, from its opt-in label and annotations: the profile it
    /// names, and the request. `pods` and `resources` come from the kind's own fields.
    pub fn from_annotations(
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
        pods: u32,
        resources: PodResources,
    ) -> Result<(Option<String>, JobRequest), String> {
        let get = |key: &str| -> Option<&str> { annotations.get(key).map(String::as_str) };
        fn parse<T: serde::de::DeserializeOwned>(
            value: Option<&str>,
            key: &str,
            allowed: &str,
        ) -> Result<Option<T>, String> {
            value
                .map(|v| {
                    serde_json::from_value(Value::String(v.to_string()))
                        .map_err(|_| format!("annotation {key}: use {allowed}"))
                })
                .transpose()
        }
        let mode: ModeSetting = parse(
            get(names::ANNOTATION_MODE),
            names::ANNOTATION_MODE,
            "Auto, UnifiedMemory, CPUCopy or Disabled",
        )?
        .unwrap_or_default();
        let overlap: OverlapSetting = parse(
            get(names::ANNOTATION_OVERLAP),
            names::ANNOTATION_OVERLAP,
            "Auto, Enabled or Disabled",
        )?
        .unwrap_or_default();
        let offload_ratio: RatioSetting = match get(names::ANNOTATION_RATIO) {
            Some(v) => serde_json::from_value(Value::String(v.to_string()))
                .map_err(|e| format!("annotation {}: {e}", names::ANNOTATION_RATIO))?,
            None => RatioSetting::Auto,
        };
        let framework: Framework = parse(
            get(names::ANNOTATION_FRAMEWORK),
            names::ANNOTATION_FRAMEWORK,
            "DeepSpeed, FSDP, Megatron or Generic",
        )?
        .unwrap_or(Framework::Generic);
        let megatron = super::annotations::megatron_annotations(annotations, framework)?;
        let model = model_annotations(annotations)?;
        Ok((
            labels.get(names::PROFILE_ANNOTATION).cloned(),
            JobRequest {
                offload: OffloadSpec {
                    mode,
                    overlap,
                    offload_ratio,
                    pin_memory: Default::default(),
                },
                framework: FrameworkSpec {
                    name: framework,
                    version: get(names::ANNOTATION_FRAMEWORK_VERSION).map(str::to_string),
                },
                deepspeed: DeepSpeedRequest::default(),
                megatron,
                hints_from_annotations: model.is_some(),
                memory_failures: Vec::new(),
                learned: None,
                identity: None,
                model,
                model_config: None,
                model_trace: Default::default(),
                constraints: super::PodConstraints::default(),
                pods,
                config: ConfigFacts::default(),
                hold_for_capacity: false,
                gpu_claims: None,
                gpu_claim_entries: Vec::new(),
                ..JobRequest::default()
            }
            .with_resources(&resources),
        ))
    }

    /// The request with its pods' resources: what every kind's constructor takes from them.
    fn with_resources(self, resources: &PodResources) -> JobRequest {
        JobRequest {
            gpus_per_pod: resources.gpus_per_pod(),
            pod_memory_limit: resources.memory_limit,
            pod_memory_limit_source: resources.memory_limit_source.clone(),
            cpu_limit: resources.training_cpu_limit.clone(),
            cpu_request: resources.training_cpu_request,
            training_memory_limit: resources.training_memory_limit,
            not_guaranteed: resources.not_guaranteed.clone(),
            training_container: resources
                .training_container
                .map(|i| (i, resources.training_memory_request)),
            memory_request_floor: resources.training_memory_floor.clone(),
            ..self
        }
    }

    /// The request decided with what runs taught (`learned`, as the job's profile scopes it).
    pub fn with_learned(&self, learned: LearnedView) -> JobRequest {
        JobRequest {
            learned: Some(learned),
            ..self.clone()
        }
    }

    /// The request as a run's lesson reads it: without the evidence of earlier runs (the
    /// lesson is about what this configuration used).
    pub fn without_evidence(&self) -> JobRequest {
        JobRequest {
            memory_failures: Vec::new(),
            learned: None,
            ..self.clone()
        }
    }

    /// The request of a model of `parameters` alone (its hints and `config.json` set aside):
    /// the size a job without hints is learned under.
    pub fn sized_as(&self, parameters: offload_api::quantity::ParameterCount) -> JobRequest {
        JobRequest {
            model: Some(ModelHints {
                parameters: Some(parameters),
                ..ModelHints::default()
            }),
            model_config: None,
            hints_from_annotations: false,
            ..self.clone()
        }
    }

    /// GPUs the whole job needs at once.
    pub fn gpu_demand(&self) -> u64 {
        u64::from(self.pods) * u64::from(self.gpus_per_pod)
    }
}

/// The request a TrainingJob's recorded decision was made from, as long as `spec.offload` still
/// holds that decision's concrete values (the operator wrote them); `None` once the user changed
/// it, or where nothing was recorded.
fn recorded_request(tj: &TrainingJob) -> Option<OffloadSpec> {
    let d = tj.status.as_ref()?.offload.as_ref()?;
    let requested = d.requested.clone()?;
    let concrete = super::resolution::spec_of(d.mode, d.overlap, d.offload_ratio, d.pin_memory);
    (tj.spec.offload == concrete).then_some(requested)
}

impl DeepSpeedRequest {
    /// From the job spec's DeepSpeed section.
    pub fn from_spec(ds: &DeepSpeedSpec, stage_in_config: Option<u8>) -> Self {
        DeepSpeedRequest {
            stage_in_config,
            stage_in_spec: ds.zero_stage,
            offload_params: ds.offload_params,
            super_offload: ds.super_offload,
            zen_flow: ds.zen_flow,
            zenflow_in_config: false,
            bf16_optimizer_states: ds.bf16_optimizer_states,
            bf16_in_config: false,
            bf16_states_in_config: false,
        }
    }
}

/// What the webhook recorded when it resolved a TrainingJob's `Auto` values at creation
/// (annotation `offload.dev/requested`): the user's request, and the concrete values it wrote
/// in its place.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdmittedRequest {
    /// `spec.offload` as the user sent it.
    pub requested: OffloadSpec,
    /// `spec.offload` as the webhook stored it.
    pub wrote: OffloadSpec,
}

impl AdmittedRequest {
    /// The annotation value.
    pub fn annotation(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }

    /// The user's original request, as long as `spec.offload` still holds exactly what the
    /// webhook wrote; `None` once the user changed it (then the spec is the request) or when
    /// there is no readable record.
    pub fn original(tj: &TrainingJob) -> Option<OffloadSpec> {
        let text = tj
            .metadata
            .annotations
            .as_ref()?
            .get(offload_api::names::ANNOTATION_REQUESTED)?;
        let record: AdmittedRequest = serde_json::from_str(text).ok()?;
        (record.wrote == tj.spec.offload).then_some(record.requested)
    }
}
