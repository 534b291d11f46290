//! What a job asks for, independent of the object kind that carries it.

use crate::api::{
    DeepSpeedSpec, FrameworkSpec, ModelHints, OffloadSpec, TrainingJob, TrainingJobSpec,
};

/// What a job asks for.
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
    /// Offload parameters too (`offload_param`): asked for, refused, or left to the operator.
    pub offload_params: Option<bool>,
    /// Explicit SuperOffload request.
    pub super_offload: Option<bool>,
    /// The job's ZenFlow consent (`true`), refusal (`false`) or nothing.
    pub zen_flow: Option<bool>,
    /// The user's DeepSpeed JSON already has a `zenflow` section (their own consent).
    pub zenflow_in_config: bool,
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

    /// GPUs the whole job needs at once.
    pub fn gpu_demand(&self) -> u64 {
        u64::from(self.pods) * u64::from(self.gpus_per_pod)
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
            .get(crate::names::ANNOTATION_REQUESTED)?;
        let record: AdmittedRequest = serde_json::from_str(text).ok()?;
        (record.wrote == tj.spec.offload).then_some(record.requested)
    }
}
