//! Builds a TrainingJob's workload (Indexed Job, headless Service, rendered config ConfigMap)
//! from its spec and resolution. Pure: no cluster access, so it is tested from fixtures.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, EnvVar, EnvVarSource, ObjectFieldSelector, PodSpec, Service, ServicePort,
    ServiceSpec,
};
use kube::api::ObjectMeta;
use kube::{Resource, ResourceExt};
use serde_json::Value;

use crate::decision::DeepSpeedConfigError;
use crate::decision::{FrameworkPlan, Resolution};
use crate::dra::api::ResourceClaimTemplate;
use crate::dra::claims;
use crate::render::deepspeed;
use crate::render::{self, ConfigMount};
use offload_api::names;
use offload_api::v1alpha1::TrainingJob;

/// Port of the rendezvous Service (torch.distributed default).
pub const RENDEZVOUS_PORT: i32 = 29500;

/// The objects of one TrainingJob's workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    /// The Indexed batch Job.
    pub job: Job,
    /// The headless rendezvous Service.
    pub service: Service,
    /// The rendered framework config, when the framework has one.
    pub config_map: Option<ConfigMap>,
    /// Copies of the pods' GPU claim templates that select only the decided class's GPUs
    /// (DRA; see [`pin_claims`]).
    pub claim_templates: Vec<ResourceClaimTemplate>,
}

/// Why a workload could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BuildError {
    /// The TrainingJob lacks a name or namespace (never the case for a stored object).
    #[error("the TrainingJob has no {0}")]
    Missing(&'static str),
    /// The user's DeepSpeed config cannot take the offload section.
    #[error(transparent)]
    DeepSpeed(#[from] DeepSpeedConfigError),
    /// The merged config does not fit in a ConfigMap.
    #[error(
        "the merged DeepSpeed config is {bytes} bytes, more than the {MAX_CONFIG_MAP_DATA} bytes a ConfigMap holds: shorten the config in deepspeed.configMapRef"
    )]
    ConfigTooLarge {
        /// Size of the merged config.
        bytes: usize,
    },
    /// The decision could not be written as JSON for the workload's annotation.
    #[error("recording the decision on the workload: {0}")]
    Serialize(String),
    /// A claim template the decision counted is gone.
    #[error("ResourceClaimTemplate {0} is gone: the job waits until it exists again")]
    ClaimTemplateGone(String),
}

/// Most bytes of data (keys and values) the API server accepts in one ConfigMap.
pub const MAX_CONFIG_MAP_DATA: usize = 1024 * 1024;

/// Name of the ConfigMap holding the rendered config.
pub fn config_map_name(job_name: &str) -> String {
    format!("{job_name}-offload")
}

/// Builds the workload. `res` is the job's resolution (`None` for a job that asked for no offload
/// configuration: it runs as written); `user_config` is the user's DeepSpeed JSON (already
/// parsed), if the job references one.
pub fn build_workload(
    tj: &TrainingJob,
    res: Option<&Resolution>,
    user_config: Option<&Value>,
    opts: &render::RenderOptions,
) -> Result<Workload, BuildError> {
    let Owned {
        name,
        namespace,
        owner,
        labels,
    } = owned(tj)?;
    let meta = |object_name: String| ObjectMeta {
        name: Some(object_name),
        namespace: Some(namespace.clone()),
        labels: Some(labels.clone()),
        owner_references: Some(vec![owner.clone()]),
        ..ObjectMeta::default()
    };

    let (config_map, mount) = framework_config(tj, res, user_config, &name, &meta)?;
    let template = pod_template(tj, res, mount.as_ref(), opts, &name);
    let queued = tj.labels().contains_key(names::KUEUE_QUEUE_LABEL);
    let job = Job {
        metadata: job_metadata(tj, res, meta(name.clone()))?,
        spec: Some(JobSpec {
            completions: Some(tj.spec.replicas),
            parallelism: Some(tj.spec.replicas),
            completion_mode: Some("Indexed".to_string()),
            backoff_limit: tj.spec.backoff_limit,
            suspend: queued.then_some(true),
            template,
            ..JobSpec::default()
        }),
        status: None,
    };
    let service = rendezvous_service(meta(name.clone()), &labels);
    Ok(Workload {
        job,
        service,
        config_map,
        claim_templates: Vec::new(),
    })
}

/// The framework's config as the workload mounts it: DeepSpeed's merged JSON in a ConfigMap of
/// its own (nothing for other frameworks or a job without a resolution).
fn framework_config(
    tj: &TrainingJob,
    res: Option<&Resolution>,
    user_config: Option<&Value>,
    name: &str,
    meta: &dyn Fn(String) -> ObjectMeta,
) -> Result<(Option<ConfigMap>, Option<ConfigMount>), BuildError> {
    Ok(match res.map(|r| (r, &r.framework)) {
        Some((res, FrameworkPlan::DeepSpeed(plan))) => {
            let empty = Value::Object(serde_json::Map::new());
            let merged = deepspeed::merge_config(user_config.unwrap_or(&empty), res, plan)?;
            // Compact: a config the user kept under the ConfigMap limit must not outgrow it here.
            let text = merged.to_string();
            let bytes = text.len() + deepspeed::CONFIG_FILE_NAME.len();
            if bytes > MAX_CONFIG_MAP_DATA {
                return Err(BuildError::ConfigTooLarge { bytes });
            }
            let mount = ConfigMount {
                config_map: config_map_name(name),
                key: deepspeed::CONFIG_FILE_NAME.to_string(),
                mount_path: tj
                    .spec
                    .deepspeed
                    .as_ref()
                    .and_then(|d| d.mount_path.clone())
                    .unwrap_or_else(|| deepspeed::DEFAULT_MOUNT_PATH.to_string()),
            };
            let mut data = BTreeMap::from([(mount.key.clone(), text)]);
            if res.report_allocator_peaks {
                data.insert(
                    render::MEMORY_REPORT_FILE.to_string(),
                    render::MEMORY_REPORT.to_string(),
                );
            }
            let cm = ConfigMap {
                metadata: meta(config_map_name(name)),
                data: Some(data),
                ..ConfigMap::default()
            };
            (Some(cm), Some(mount))
        }
        _ => (None, None),
    })
}

/// The pods' template: the user's, with the resolution rendered in, labelled with its job and
/// given the rendezvous env and subdomain.
fn pod_template(
    tj: &TrainingJob,
    res: Option<&Resolution>,
    mount: Option<&ConfigMount>,
    opts: &render::RenderOptions,
    name: &str,
) -> k8s_openapi::api::core::v1::PodTemplateSpec {
    let mut template = tj.spec.template.clone();
    if let Some(res) = res {
        render::apply_to_pod_template(&mut template, res, mount, opts);
        template
            .metadata
            .get_or_insert_with(ObjectMeta::default)
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                names::ANNOTATION_RESOLVED.to_string(),
                render::resolved_summary(res),
            );
        if let Some(trial) = &res.trial
            && let Some(a) = template
                .metadata
                .as_mut()
                .and_then(|m| m.annotations.as_mut())
        {
            a.insert(
                names::ANNOTATION_TRIAL.to_string(),
                trial.fallback.to_string(),
            );
        }
    }
    template
        .metadata
        .get_or_insert_with(ObjectMeta::default)
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(names::LABEL_TRAINING_JOB.to_string(), name.to_string());
    let spec = template.spec.get_or_insert_with(PodSpec::default);
    spec.subdomain = Some(name.to_string());
    if spec.restart_policy.is_none() {
        spec.restart_policy = Some("Never".to_string());
    }
    let rendezvous = rendezvous_env(name, tj.spec.replicas);
    for container in &mut spec.containers {
        let env = container.env.get_or_insert_with(Vec::new);
        env.retain(|e| !rendezvous.iter().any(|r| r.name == e.name));
        env.extend(rendezvous.iter().cloned());
    }
    template
}

/// The Job's metadata: Kueue's queue and priority labels from the TrainingJob, and the decision
/// it was built from.
fn job_metadata(
    tj: &TrainingJob,
    res: Option<&Resolution>,
    mut job_meta: ObjectMeta,
) -> Result<ObjectMeta, BuildError> {
    // Under Kueue: the queue (and priority) the TrainingJob names reach its Job, which is
    // created suspended so that Kueue admits it. Kueue changes only a suspended Job's
    // scheduling fields, never its env: the configuration is all in place before admission.
    for key in [names::KUEUE_QUEUE_LABEL, names::KUEUE_PRIORITY_LABEL] {
        if let Some(v) = tj.labels().get(key) {
            job_meta
                .labels
                .get_or_insert_with(BTreeMap::new)
                .insert(key.to_string(), v.clone());
        }
    }
    if let Some(res) = res {
        // The decision travels with the workload, so a status write lost to a crash between
        // creating the Job and recording the decision is restored from it.
        let record = serde_json::to_string(&res.status())
            .map_err(|e| BuildError::Serialize(e.to_string()))?;
        job_meta
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(names::ANNOTATION_DECISION.to_string(), record);
    }
    Ok(job_meta)
}

/// The headless Service that gives the pods stable names for the rendezvous.
fn rendezvous_service(metadata: ObjectMeta, labels: &BTreeMap<String, String>) -> Service {
    Service {
        metadata,
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            selector: Some(labels.clone()),
            publish_not_ready_addresses: Some(true),
            ports: Some(vec![ServicePort {
                name: Some("rendezvous".to_string()),
                port: RENDEZVOUS_PORT,
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// For a job pinned through its DRA claims ([`Resolution::gpu_claims`]): a copy of each GPU
/// claim's template that selects only the decided class's GPUs, owned by the TrainingJob and
/// named `<job>-<claim>`, and the Job's pods pointed at the copies. `template` looks a
/// template up in the job's namespace. Nothing to do for a job pinned by labels.
pub fn pin_claims(
    workload: &mut Workload,
    tj: &TrainingJob,
    res: &Resolution,
    template: &dyn Fn(&str) -> Option<std::sync::Arc<ResourceClaimTemplate>>,
) -> Result<(), BuildError> {
    let Some(pinning) = &res.gpu_claims else {
        return Ok(());
    };
    let min_gpu_memory = res.memory.as_ref().map(|m| {
        crate::decision::model::memory::gpu_memory_for(
            m.gpu_bytes as f64,
            m.gpu_allocator_room_bytes as f64,
        )
    });
    // Nothing to pin: any class, and no memory the GPUs must have.
    if res.node_class.is_none() && min_gpu_memory.is_none() {
        return Ok(());
    }
    let Owned {
        name,
        namespace,
        owner,
        labels,
    } = owned(tj)?;
    let pod = workload
        .job
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut());
    let Some(pod) = pod else {
        return Ok(());
    };
    for (entry, original) in &pinning.claims {
        let source =
            template(original).ok_or_else(|| BuildError::ClaimTemplateGone(original.clone()))?;
        let copy_name = claims::pinned_name(&name, entry);
        workload.claim_templates.push(claims::pinned_template(
            &source,
            &copy_name,
            &namespace,
            owner.clone(),
            labels.clone(),
            claims::Pin {
                class: res.node_class,
                min_gpu_memory,
            },
            &pinning.dra,
        ));
        for claim in pod.resource_claims.iter_mut().flatten() {
            if &claim.name == entry {
                claim.resource_claim_template_name = Some(copy_name.clone());
            }
        }
    }
    Ok(())
}

/// What every object a TrainingJob owns carries: its name, namespace, owner reference and the
/// label that names the job.
struct Owned {
    name: String,
    namespace: String,
    owner: k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference,
    labels: BTreeMap<String, String>,
}

fn owned(tj: &TrainingJob) -> Result<Owned, BuildError> {
    let name = tj
        .metadata
        .name
        .clone()
        .ok_or(BuildError::Missing("name"))?;
    let namespace = tj
        .metadata
        .namespace
        .clone()
        .ok_or(BuildError::Missing("namespace"))?;
    let owner = tj
        .controller_owner_ref(&())
        .ok_or(BuildError::Missing("uid"))?;
    let labels = BTreeMap::from([(names::LABEL_TRAINING_JOB.to_string(), name.clone())]);
    Ok(Owned {
        name,
        namespace,
        owner,
        labels,
    })
}

/// torchrun rendezvous env (`PET_*` are torchrun's env forms of its flags): rank 0 is pod
/// `<name>-0` of the headless Service.
fn rendezvous_env(name: &str, replicas: i32) -> Vec<EnvVar> {
    let plain = |n: &str, v: String| EnvVar {
        name: n.to_string(),
        value: Some(v),
        value_from: None,
    };
    vec![
        plain("MASTER_ADDR", format!("{name}-0.{name}")),
        plain("MASTER_PORT", RENDEZVOUS_PORT.to_string()),
        plain("PET_NNODES", replicas.to_string()),
        EnvVar {
            name: "PET_NODE_RANK".to_string(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                        .to_string(),
                    api_version: None,
                }),
                ..EnvVarSource::default()
            }),
        },
    ]
}
