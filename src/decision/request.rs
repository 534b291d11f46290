//! What a job asks for, independent of the object kind that carries it, and the one way each
//! kind's request is built: [`JobRequest::for_training_job`] and [`JobRequest::from_annotations`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;
use serde_json::Value;

use super::error::ResolveError;
use super::limits::NamespaceLimits;
use super::user_config::{ConfigFacts, UserConfig};
use offload_api::names;
use offload_api::quantity::{self, MAX_GPUS, ParameterCount};
use offload_api::v1alpha1::{
    DeepSpeedSpec, Framework, FrameworkSpec, ModeSetting, ModelHints, OffloadSpec, OverlapSetting,
    RatioSetting, TrainingJob,
};

/// What runs taught, as the caller holds it, and the time its lessons are aged to (part of the
/// input, so a decision stays a function of what it is given).
#[derive(Clone, Debug, PartialEq)]
pub struct LearnedView {
    /// The lessons.
    pub memory: std::sync::Arc<super::learned::LearnedMemory>,
    /// Now.
    pub now: jiff::Timestamp,
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
    /// What the operator knows of the model.
    pub model: Option<ModelHints>,
    /// The model's shape from its `config.json`, where the job references one and it was read.
    pub model_config: Option<super::shape::ModelShape>,
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
    /// The training container (index in the pod template) and its memory request as written:
    /// the decision raises the request to the host memory it counts on.
    pub training_container: Option<(usize, Option<u64>)>,
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
            model: None,
            model_config: None,
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
            training_container: None,
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
}

/// GPUs and memory a pod template asks for, read as Kubernetes quantities.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodResources {
    /// `nvidia.com/gpu` over the containers (limits, else requests): 0 when none asks.
    pub gpus: u64,
    /// The sum of the containers' memory limits, when every container has one; or the training
    /// container's own limit, where that is lower.
    pub memory_limit: Option<u64>,
    /// The training container: the first that asks for GPUs (or for DRA claims), else the
    /// first. Its memory request is what the host memory the decision counts on is written to.
    pub training_container: Option<usize>,
    /// The training container's memory request as the user wrote it.
    pub training_memory_request: Option<u64>,
    /// Where `memory_limit` comes from a LimitRange of the namespace rather than the pod's own
    /// limits, that range and what it sets, in words.
    pub memory_limit_source: Option<String>,
    /// The training container's CPU limit (cores; its own, or its namespace's default), and
    /// the LimitRange it comes from where it is not its own.
    pub training_cpu_limit: Option<(f64, Option<String>)>,
    /// The training container's CPU request (cores).
    pub training_cpu_request: Option<f64>,
}

/// A container's memory limit once its namespace's LimitRanges applied (`own`: its own), and
/// where a range set or lowered it, which and how.
fn namespace_bound(own: Option<u64>, limits: &NamespaceLimits) -> (Option<u64>, Option<String>) {
    match own {
        Some(b) => match &limits.container_max {
            Some(max) if max.bytes < b => (
                Some(max.bytes),
                Some(format!(
                    "the container memory max of LimitRange {:?} in its namespace",
                    max.range
                )),
            ),
            _ => (Some(b), None),
        },
        None => match limits
            .default_limit
            .as_ref()
            .or(limits.container_max.as_ref())
        {
            Some(d) => (
                Some(d.bytes),
                Some(format!(
                    "the default memory limit of LimitRange {:?} in its namespace, which a container that sets none gets",
                    d.range
                )),
            ),
            None => (None, None),
        },
    }
}

impl PodResources {
    /// Reads a pod spec. A quantity that is not one, a fraction of a GPU, or a count no machine
    /// has is an error naming the container; sums are checked.
    pub fn of(spec: Option<&PodSpec>) -> Result<PodResources, ResolveError> {
        PodResources::within(spec, &NamespaceLimits::default())
    }

    /// [`PodResources::of`] as the pod will be created in a namespace with `limits`: a
    /// container without a memory limit gets the default (else the max), and no limit is
    /// above the max.
    pub fn within(
        spec: Option<&PodSpec>,
        limits: &NamespaceLimits,
    ) -> Result<PodResources, ResolveError> {
        let Some(spec) = spec else {
            return Ok(PodResources::default());
        };
        let mut from_range: Option<String> = None;
        let mut gpus: u64 = 0;
        let mut memory: Option<u64> = Some(0);
        let training = spec
            .containers
            .iter()
            .position(|c| {
                let r = c.resources.as_ref();
                r.and_then(|r| r.limits.as_ref())
                    .is_some_and(|l| l.contains_key(names::GPU_RESOURCE))
                    || r.and_then(|r| r.requests.as_ref())
                        .is_some_and(|l| l.contains_key(names::GPU_RESOURCE))
                    || r.and_then(|r| r.claims.as_ref())
                        .is_some_and(|c| !c.is_empty())
            })
            .or((!spec.containers.is_empty()).then_some(0));
        let mut training_request = None;
        let mut training_limit = None;
        let (mut cpu_limit, mut cpu_request) = (None, None);
        let ns_limits = limits;
        for (i, c) in spec.containers.iter().enumerate() {
            let resources = c.resources.as_ref();
            let limits = resources.and_then(|r| r.limits.as_ref());
            let requests = resources.and_then(|r| r.requests.as_ref());
            let bad = |what: &str, e: quantity::QuantityError| ResolveError::InvalidResources {
                detail: format!("container {:?} {what}: {e}", c.name),
            };
            if let Some(q) = limits
                .and_then(|l| l.get(names::GPU_RESOURCE))
                .or_else(|| requests.and_then(|r| r.get(names::GPU_RESOURCE)))
            {
                let n = quantity::device_count(q)
                    .map_err(|e| bad(&format!("resources {}", names::GPU_RESOURCE), e))?;
                gpus = gpus.checked_add(n).filter(|t| *t <= MAX_GPUS).ok_or_else(|| {
                    ResolveError::InvalidResources {
                        detail: format!(
                            "the pod's containers ask for more than {MAX_GPUS} {} in all, more than any node has",
                            names::GPU_RESOURCE
                        ),
                    }
                })?;
            }
            let own = limits
                .and_then(|l| l.get("memory"))
                .map(|q| quantity::bytes(q).map_err(|e| bad("limits.memory", e)))
                .transpose()?;
            let (limit, source) = namespace_bound(own, ns_limits);
            if Some(i) == training && source.is_some() {
                from_range = source;
            }
            memory = match (memory, limit) {
                (Some(total), Some(b)) => Some(total.saturating_add(b)),
                _ => None,
            };
            if Some(i) == training {
                let cpu = |m: Option<&BTreeMap<String, _>>, what: &str| {
                    m.and_then(|m| m.get("cpu"))
                        .map(|q| quantity::cpu_cores(q).map_err(|e| bad(what, e)))
                        .transpose()
                };
                cpu_limit = match cpu(limits, "limits.cpu")? {
                    Some(c) => Some((c, None)),
                    None => ns_limits
                        .cpu_default_limit
                        .as_ref()
                        .map(|(c, range)| (*c, Some(range.clone()))),
                };
                cpu_request = cpu(requests, "requests.cpu")?;
                training_limit = limit;
                training_request = requests
                    .and_then(|r| r.get("memory"))
                    .map(|q| quantity::bytes(q).map_err(|e| bad("requests.memory", e)))
                    .transpose()?;
            }
        }
        let mut pod_limit = memory.filter(|_| !spec.containers.is_empty());
        if let Some(max) = &ns_limits.pod_max
            && pod_limit.is_none_or(|p| p > max.bytes)
        {
            pod_limit = Some(max.bytes);
            from_range = Some(format!(
                "the pod memory max of LimitRange {:?} in its namespace",
                max.range
            ));
        }
        Ok(PodResources {
            gpus,
            memory_limit: match (pod_limit, training_limit) {
                (Some(p), Some(t)) => Some(p.min(t)),
                (p, t) => p.or(t),
            },
            training_container: training,
            training_memory_request: training_request,
            memory_limit_source: from_range,
            training_cpu_limit: cpu_limit,
            training_cpu_request: cpu_request,
        })
    }

    /// [`PodResources::of`] with the GPUs the pod's DRA claims request (templates looked up
    /// in `namespace` through `view`), and those claims (entry → template).
    pub fn with_claims(
        spec: Option<&PodSpec>,
        namespace: &str,
        view: &dyn super::ClusterView,
    ) -> Result<(PodResources, Option<crate::dra::claims::ClaimPinning>), ResolveError> {
        let mut resources = PodResources::within(spec, &view.namespace_limits(namespace))?;
        let (Some(spec), Some(dra)) = (spec, view.dra()) else {
            return Ok((resources, None));
        };
        if spec.resource_claims.as_ref().is_none_or(Vec::is_empty) {
            return Ok((resources, None));
        }
        let claimed = crate::dra::claims::claimed_gpus(
            spec,
            &|name| view.claim_template(namespace, name),
            &dra,
        )
        .map_err(ResolveError::Claims)?;
        resources.gpus = resources
            .gpus
            .checked_add(claimed.gpus)
            .filter(|n| *n <= MAX_GPUS)
            .ok_or_else(|| ResolveError::InvalidResources {
                detail: format!(
                    "more than {MAX_GPUS} GPUs a pod, device plugin and claims together"
                ),
            })?;
        let pinning = if claimed.claims.is_empty() {
            None
        } else {
            Some(crate::dra::claims::ClaimPinning {
                dra,
                claims: claimed.claims,
            })
        };
        Ok((resources, pinning))
    }

    /// GPUs per pod for the decision: at least 1.
    pub fn gpus_per_pod(&self) -> u32 {
        u32::try_from(self.gpus.max(1)).unwrap_or(u32::MAX)
    }
}

/// A TrainingJob's identity for what is learned without model hints: its namespace and name, and
/// a digest of what it runs (framework, DeepSpeed settings, replicas, pod template).
pub fn identity(tj: &TrainingJob) -> String {
    use sha2::Digest;
    let spec = &tj.spec;
    let text = serde_json::json!({
        "framework": spec.framework,
        "deepspeed": spec.deepspeed,
        "replicas": spec.replicas,
        "template": spec.template,
    })
    .to_string();
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
        model_config: Option<&super::shape::ModelShape>,
        view: &dyn super::ClusterView,
    ) -> Result<JobRequest, ResolveError> {
        let spec = &tj.spec;
        let namespace = tj.metadata.namespace.as_deref().unwrap_or_default();
        let (resources, gpu_claims) =
            PodResources::with_claims(spec.template.spec.as_ref(), namespace, view)?;
        let ds = spec.deepspeed.clone().unwrap_or_default();
        let mut deepspeed = DeepSpeedRequest::from_spec(&ds, config.and_then(|c| c.stage));
        deepspeed.zenflow_in_config = config.is_some_and(|c| c.zenflow);
        let offload = super::AdmittedRequest::original(tj)
            .or_else(|| recorded_request(tj))
            .unwrap_or_else(|| spec.offload.clone());
        Ok(JobRequest {
            offload,
            framework: spec.framework.clone(),
            deepspeed,
            model: spec.model.clone(),
            model_config: model_config.copied(),
            hints_from_annotations: false,
            learned: None,
            identity: Some(identity(tj)),
            memory_failures: tj
                .status
                .as_ref()
                .map(|s| s.memory_failures.clone())
                .unwrap_or_default(),
            constraints: super::PodConstraints::of(spec.template.spec.as_ref()),
            pods: u32::try_from(spec.replicas.max(1)).unwrap_or(1),
            gpus_per_pod: resources.gpus_per_pod(),
            pod_memory_limit: resources.memory_limit,
            pod_memory_limit_source: resources.memory_limit_source.clone(),
            cpu_limit: resources.training_cpu_limit.clone(),
            cpu_request: resources.training_cpu_request,
            training_container: resources
                .training_container
                .map(|i| (i, resources.training_memory_request)),
            config: config.map(|c| c.facts).unwrap_or_default(),
            hold_for_capacity: true,
            gpu_claim_entries: gpu_claims
                .as_ref()
                .map(|p| p.claims.keys().cloned().collect())
                .unwrap_or_default(),
            gpu_claims,
        })
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
            "DeepSpeed, FSDP or Generic",
        )?
        .unwrap_or(Framework::Generic);
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
                hints_from_annotations: model.is_some(),
                memory_failures: Vec::new(),
                learned: None,
                identity: None,
                model,
                model_config: None,
                constraints: super::PodConstraints::default(),
                pods,
                gpus_per_pod: resources.gpus_per_pod(),
                pod_memory_limit: resources.memory_limit,
                pod_memory_limit_source: resources.memory_limit_source.clone(),
                cpu_limit: resources.training_cpu_limit.clone(),
                cpu_request: resources.training_cpu_request,
                training_container: resources
                    .training_container
                    .map(|i| (i, resources.training_memory_request)),
                config: ConfigFacts::default(),
                hold_for_capacity: false,
                gpu_claims: None,
                gpu_claim_entries: Vec::new(),
            },
        ))
    }

    /// GPUs the whole job needs at once.
    pub fn gpu_demand(&self) -> u64 {
        u64::from(self.pods) * u64::from(self.gpus_per_pod)
    }
}

/// Model hints of another object kind, each annotation as the `spec.model` field of a
/// TrainingJob: `offload.dev/model-parameters` (`8B`), `offload.dev/model-config` (a ConfigMap
/// holding the model's `config.json`), `offload.dev/tokens-per-step`, `offload.dev/architecture`,
/// `offload.dev/hidden-size`, `offload.dev/layers`, `offload.dev/intermediate-size`,
/// `offload.dev/attention-heads`, `offload.dev/key-value-heads`, `offload.dev/head-dim`,
/// `offload.dev/vocab-size`, `offload.dev/tied-embeddings`, `offload.dev/rotary-embeddings`,
/// `offload.dev/experts`,
/// `offload.dev/experts-per-token`, `offload.dev/shared-experts`,
/// `offload.dev/expert-intermediate-size`, `offload.dev/activation-checkpointing`. Every
/// message names the annotation.
fn model_annotations(annotations: &BTreeMap<String, String>) -> Result<Option<ModelHints>, String> {
    use offload_api::v1alpha1::{ExpertHints, ModelArchitecture};
    let get = |key: &str| -> Option<&str> { annotations.get(key).map(String::as_str) };
    use offload_api::hints::{self, CountHint};
    // Every hint's annotation but the three that size a model alone.
    let sizing = [
        names::ANNOTATION_MODEL_PARAMETERS,
        names::ANNOTATION_MODEL_CONFIG,
    ];
    let shape_keys: Vec<&str> = hints::COUNT_HINTS
        .iter()
        .map(|h| h.annotation)
        .chain(hints::OTHER_HINTS.iter().map(|(_, a)| *a))
        .filter(|a| !sizing.contains(a))
        .collect();
    let parameters = get(names::ANNOTATION_MODEL_PARAMETERS);
    let config = get(names::ANNOTATION_MODEL_CONFIG);
    let hidden_and_layers =
        get(names::ANNOTATION_HIDDEN_SIZE).is_some() && get(names::ANNOTATION_LAYERS).is_some();
    if parameters.is_none() && config.is_none() && !hidden_and_layers {
        if let Some(key) = shape_keys.iter().find(|k| get(k).is_some()) {
            return Err(format!(
                "annotation {key} needs {} (the model's total parameters, e.g. 8B), {} (a ConfigMap with its config.json), or {} and {}",
                names::ANNOTATION_MODEL_PARAMETERS,
                names::ANNOTATION_MODEL_CONFIG,
                names::ANNOTATION_HIDDEN_SIZE,
                names::ANNOTATION_LAYERS
            ));
        }
        return Ok(None);
    }
    let parameters = parameters
        .map(|p| {
            ParameterCount::parse(p)
                .map_err(|e| format!("annotation {}: {e}", names::ANNOTATION_MODEL_PARAMETERS))
        })
        .transpose()?;
    let config_map_ref = config
        .map(|name| {
            offload_api::validation::object_name(name)
                .map(|()| offload_api::v1alpha1::ConfigMapKeyRef {
                    name: name.to_string(),
                    key: None,
                })
                .map_err(|e| format!("annotation {}: {e}", names::ANNOTATION_MODEL_CONFIG))
        })
        .transpose()?;
    let count = |hint: &CountHint| -> Result<Option<i64>, String> {
        let (key, max) = (hint.annotation, hint.max);
        let min = u64::try_from(hint.min).unwrap_or(0);
        get(key)
            .map(|v| match v.trim().parse::<u64>() {
                Ok(n) if n >= min && i64::try_from(n).is_ok_and(|n| n <= max) => {
                    Ok(i64::try_from(n).unwrap_or(max))
                }
                Ok(_) if v.trim().parse::<u64>().is_ok_and(|n| n < min) => Err(format!(
                    "annotation {key}: use a whole number of at least {min}"
                )),
                Ok(_) => Err(format!(
                    "annotation {key}: {v} is too large (at most {max})"
                )),
                Err(e) if matches!(e.kind(), std::num::IntErrorKind::PosOverflow) => Err(format!(
                    "annotation {key}: {v} is too large (at most {max})"
                )),
                Err(_) => Err(format!("annotation {key}: {v:?} is not a whole number")),
            })
            .transpose()
    };
    let flag = |key: &str| -> Result<Option<bool>, String> {
        match get(key) {
            None => Ok(None),
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(v) => Err(format!("annotation {key}: {v:?} is not true or false")),
        }
    };
    let architecture = match get(names::ANNOTATION_ARCHITECTURE) {
        None => None,
        Some("Llama") => Some(ModelArchitecture::Llama),
        Some("GPT") => Some(ModelArchitecture::Gpt),
        Some(v) => {
            return Err(format!(
                "annotation {}: {v:?} is neither Llama nor GPT",
                names::ANNOTATION_ARCHITECTURE
            ));
        }
    };
    let experts = match (count(&hints::EXPERTS)?, count(&hints::EXPERTS_PER_TOKEN)?) {
        (None, None) => None,
        (Some(count_), Some(per_token)) => Some(ExpertHints {
            count: count_,
            per_token,
            shared: count(&hints::SHARED_EXPERTS)?,
            intermediate_size: count(&hints::EXPERT_INTERMEDIATE_SIZE)?,
        }),
        _ => {
            return Err(format!(
                "annotations {} and {} go together",
                names::ANNOTATION_EXPERTS,
                names::ANNOTATION_EXPERTS_PER_TOKEN
            ));
        }
    };
    Ok(Some(ModelHints {
        parameters,
        config_map_ref,
        tokens_per_step: count(&hints::TOKENS_PER_STEP)?,
        architecture,
        hidden_size: count(&hints::HIDDEN_SIZE)?,
        layers: count(&hints::LAYERS)?,
        intermediate_size: count(&hints::INTERMEDIATE_SIZE)?,
        attention_heads: count(&hints::ATTENTION_HEADS)?,
        key_value_heads: count(&hints::KEY_VALUE_HEADS)?,
        head_dim: count(&hints::HEAD_DIM)?,
        vocab_size: count(&hints::VOCAB_SIZE)?,
        tied_embeddings: flag(names::ANNOTATION_TIED_EMBEDDINGS)?,
        rotary_embeddings: flag(names::ANNOTATION_ROTARY_EMBEDDINGS)?,
        experts,
        activation_checkpointing: flag(names::ANNOTATION_ACTIVATION_CHECKPOINTING)?,
    }))
}

/// The request a TrainingJob's recorded decision was made from, as long as `spec.offload` still
/// holds that decision's concrete values (the operator wrote them); `None` once the user changed
/// it, or where nothing was recorded.
fn recorded_request(tj: &TrainingJob) -> Option<OffloadSpec> {
    use offload_api::v1alpha1::{OffloadMode, Switch};
    let d = tj.status.as_ref()?.offload.as_ref()?;
    let requested = d.requested.clone()?;
    let concrete = OffloadSpec {
        mode: d.mode.as_setting(),
        overlap: if d.overlap {
            OverlapSetting::Enabled
        } else {
            OverlapSetting::Disabled
        },
        offload_ratio: if d.mode == OffloadMode::Disabled {
            RatioSetting::None
        } else {
            RatioSetting::Fixed(d.offload_ratio)
        },
        pin_memory: if d.pin_memory {
            Switch::Enabled
        } else {
            Switch::Disabled
        },
    };
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
