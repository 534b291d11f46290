//! The one way into the decision: the cluster view every caller hands in, and the two entry
//! points — a TrainingJob ([`decide`]) and another kind's request ([`decide_request`]) — that
//! pick the profile, build the request and resolve it. The controller, the webhook and
//! `offload-operator explain` call these; none assembles the decision's input itself.

use std::sync::Arc;

use super::request::JobRequest;
use super::selection::{ProfileNotFound, requested_profile, select_profile};
use super::{Resolution, ResolveError, resolve_offload};
use crate::decision::frameworks::user_config::ConfigError;
use crate::decision::frameworks::user_config::UserConfig;
use crate::decision::model::model_config::ModelConfigError;
use crate::decision::model::shape::ModelShape;
use crate::dra::DraOptions;
use crate::dra::api::ResourceClaimTemplate;
use crate::index::NodeIndex;
use offload_api::v1alpha1::{OffloadProfileSpec, TrainingJob};

/// The cluster state a decision is made against: the profiles and the node index, from the
/// operator's caches, or from files for `explain`.
pub trait ClusterView: Send + Sync {
    /// A profile by name.
    fn profile(&self, name: &str) -> Option<OffloadProfileSpec>;
    /// The node index (shared: a decision does not copy the node reports).
    fn nodes(&self) -> Arc<NodeIndex>;
    /// Dynamic Resource Allocation: the GPU driver and its GPU DeviceClasses (`None`: DRA is
    /// off, and claims count no GPUs).
    fn dra(&self) -> Option<DraOptions> {
        None
    }
    /// A ResourceClaimTemplate by namespace and name, where the view has them.
    fn claim_template(&self, _namespace: &str, _name: &str) -> Option<Arc<ResourceClaimTemplate>> {
        None
    }
    /// What runs taught the memory model, where the view holds it.
    fn learned(&self) -> Option<super::request::LearnedView> {
        None
    }
    /// The trace of `step` the view has for a job in `namespace` (the sizer's, where it ran;
    /// nothing by default).
    fn model_trace(
        &self,
        _namespace: &str,
        _step: &crate::decision::model::sizer::SizerRequest,
    ) -> crate::decision::model::sizer::TraceInput {
        crate::decision::model::sizer::TraceInput::None
    }
    /// Whether the operator traces models' steps (the sizer runs in the cluster).
    fn traces_models(&self) -> bool {
        false
    }
    /// Whether the API server runs the `ExtendedResourceToleration` admission plugin, as the
    /// operator was told: never assumed.
    fn extended_resource_toleration(&self) -> bool {
        false
    }
    /// The memory bounds the LimitRanges of `namespace` put on its pods' containers, where the
    /// view holds them.
    fn namespace_limits(&self, _namespace: &str) -> crate::decision::pod::limits::NamespaceLimits {
        crate::decision::pod::limits::NamespaceLimits::default()
    }
}

/// Why a job has no decision; each carries the condition reason and message.
#[derive(Clone, Debug, PartialEq)]
pub enum Unresolved {
    /// The decision refused the request.
    Decision(ResolveError),
    /// The named profile does not exist.
    ProfileNotFound(ProfileNotFound),
    /// The user's DeepSpeed config cannot be read or used.
    Config(ConfigError),
    /// The model's `config.json` cannot be read or describes no model.
    ModelConfig(ModelConfigError),
    /// The API server refused the operator's write of the decision into `spec.offload` (an
    /// admission webhook denied it, or the stored object breaks its schema): the job waits for
    /// its spec to change.
    SpecRefused(String),
}

impl Unresolved {
    /// The condition reason (and the webhook's denial category).
    pub fn reason(&self) -> &'static str {
        match self {
            Unresolved::Decision(e) => e.category(),
            Unresolved::ProfileNotFound(_) => "ProfileNotFound",
            Unresolved::Config(_) => "InvalidDeepSpeedConfig",
            Unresolved::ModelConfig(_) => "InvalidModelConfig",
            Unresolved::SpecRefused(_) => "SpecPatchRefused",
        }
    }

    /// The condition message: what is wrong and what to change.
    pub fn message(&self) -> String {
        match self {
            Unresolved::Decision(e) => e.to_string(),
            Unresolved::ProfileNotFound(e) => e.to_string(),
            Unresolved::Config(e) => e.to_string(),
            Unresolved::ModelConfig(e) => e.to_string(),
            Unresolved::SpecRefused(why) => format!(
                "the API server refused the decision's write into spec.offload ({why}): change the TrainingJob so it is accepted (it is tried again when its spec changes)"
            ),
        }
    }

    /// Whether the cluster may fix it later (a profile or a node may come, the user may fix a
    /// ConfigMap): the webhook admits such a TrainingJob with a warning, and the controller
    /// holds it and tries again when the cause changes.
    pub fn depends_on_cluster(&self) -> bool {
        match self {
            Unresolved::Decision(e) => e.depends_on_cluster(),
            Unresolved::ProfileNotFound(_) | Unresolved::Config(_) | Unresolved::ModelConfig(_) => {
                true
            }
            Unresolved::SpecRefused(_) => false,
        }
    }
}

impl From<ResolveError> for Unresolved {
    fn from(e: ResolveError) -> Self {
        Unresolved::Decision(e)
    }
}

/// What is wrong in a TrainingJob itself, whatever the cluster: a name its Service and pods
/// cannot carry, a config mount over the system. Checked for every TrainingJob, opted in or
/// not, since the operator creates its workload either way.
pub fn check_training_job(tj: &TrainingJob) -> Result<(), ResolveError> {
    let name = tj.metadata.name.as_deref().unwrap_or_default();
    // Pods of an Indexed Job are named and host-named `<name>-<index>`: room for the index.
    let digits = tj.spec.replicas.max(1).saturating_sub(1).max(1).ilog10() as usize + 1;
    let max = offload_api::validation::MAX_DNS_LABEL - 1 - digits;
    offload_api::validation::dns_label(name, max).map_err(|e| ResolveError::InvalidSpec {
        field: "metadata.name",
        detail: format!(
            "{e}: it names the job's headless Service and, with the replica index, its pods' hostnames"
        ),
    })?;
    if let Some(queue) = tj
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(offload_api::names::KUEUE_QUEUE_LABEL))
    {
        offload_api::validation::object_name(queue).map_err(|e| ResolveError::InvalidSpec {
            field: "metadata.labels[kueue.x-k8s.io/queue-name]",
            detail: format!(
                "{e}: it must name a Kueue LocalQueue, and Kueue's own webhook refuses any other name"
            ),
        })?;
    }
    if let Some(path) = tj
        .spec
        .deepspeed
        .as_ref()
        .and_then(|d| d.mount_path.as_deref())
    {
        offload_api::validation::mount_path(path).map_err(|detail| ResolveError::InvalidSpec {
            field: "spec.deepspeed.mountPath",
            detail,
        })?;
    }
    Ok(())
}

/// Decides a TrainingJob against `view`, with its DeepSpeed config and its model's
/// `config.json` as read (`Ok(None)`: it references none).
pub fn decide(
    tj: &TrainingJob,
    config: Result<Option<&UserConfig>, &ConfigError>,
    model: Result<Option<&ModelShape>, &ModelConfigError>,
    view: &dyn ClusterView,
) -> Result<Resolution, Unresolved> {
    check_training_job(tj)?;
    let profile = select_profile(requested_profile(tj), |name| view.profile(name))
        .map_err(Unresolved::ProfileNotFound)?;
    let config = config.map_err(|e| Unresolved::Config(e.clone()))?;
    let model = model.map_err(|e| Unresolved::ModelConfig(e.clone()))?;
    let mut request = JobRequest::for_training_job(tj, config, model, view)?;
    let namespace = tj.metadata.namespace.as_deref().unwrap_or_default();
    request.learned = view
        .learned()
        .filter(|_| profile.spec.learn_memory)
        .map(|l| {
            l.for_job(profile.spec.learning_scope, namespace)
                .of_run(super::request::run_id(tj))
        });
    Ok(resolve_offload(
        &request,
        &profile.name,
        &profile.spec,
        &view.nodes(),
    )?)
}

/// The step the sizer would trace for `tj` (see [`super::SizerRequest`]) and the trace `view`
/// has of it, from the same request [`decide`] builds; `None` where the job cannot be traced or
/// cannot be decided at all.
pub fn sizer_step(
    tj: &TrainingJob,
    config: Option<&UserConfig>,
    model: Option<&ModelShape>,
    view: &dyn ClusterView,
) -> Option<(super::SizerRequest, super::TraceInput)> {
    let request = JobRequest::for_training_job(tj, config, model, view).ok()?;
    super::SizerRequest::of(&request).map(|step| (step, request.model_trace))
}

/// What a run of `tj`'s configuration teaches (see [`crate::decision::runs::lesson::lesson`]), with the profile
/// it is learned under; `None` where the profile does not learn or the run teaches nothing.
pub fn lesson_of(
    tj: &TrainingJob,
    config: Result<Option<&UserConfig>, &ConfigError>,
    model: Result<Option<&ModelShape>, &ModelConfigError>,
    view: &dyn ClusterView,
    observed: &crate::decision::runs::lesson::Observed,
) -> Result<Option<(String, crate::decision::runs::lesson::Lesson)>, Unresolved> {
    check_training_job(tj)?;
    let profile = select_profile(requested_profile(tj), |name| view.profile(name))
        .map_err(Unresolved::ProfileNotFound)?;
    if !profile.spec.learn_memory {
        return Ok(None);
    }
    let config = config.map_err(|e| Unresolved::Config(e.clone()))?;
    let model = model.map_err(|e| Unresolved::ModelConfig(e.clone()))?;
    let request = JobRequest::for_training_job(tj, config, model, view)?;
    Ok(crate::decision::runs::lesson::lesson(&request, observed)?.map(|l| (profile.name, l)))
}

/// Decides another kind's request (see [`JobRequest::from_annotations`]) against `view`, with
/// the profile its label names.
pub fn decide_request(
    requested: Option<&str>,
    request: &JobRequest,
    namespace: &str,
    view: &dyn ClusterView,
) -> Result<Resolution, Unresolved> {
    let profile = select_profile(requested, |name| view.profile(name))
        .map_err(Unresolved::ProfileNotFound)?;
    let with_learned;
    let request = match view.learned().filter(|_| profile.spec.learn_memory) {
        Some(learned) => {
            with_learned =
                request.with_learned(learned.for_job(profile.spec.learning_scope, namespace));
            &with_learned
        }
        None => request,
    };
    Ok(resolve_offload(
        request,
        &profile.name,
        &profile.spec,
        &view.nodes(),
    )?)
}
