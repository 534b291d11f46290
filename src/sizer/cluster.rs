//! The sizer in a cluster: a short, bounded CPU Job in the job's namespace that traces its
//! model's step before any of its pods exist, and what its pod says when it ends. Pure: the
//! controller creates what [`sizer_job`] builds and reads its Job and pods through [`outcome`].
//!
//! The Job runs the sizer this release ships (`python3 -c`, its text in the container's
//! arguments) on the model's own `config.json` (the job's ConfigMap, mounted), from the job's
//! own image where allowed (its libraries build the model as the job will), else from the
//! chart's sizer image. It asks for no GPU and reaches nothing: no service-account token,
//! nothing downloaded, all capabilities dropped, bounded by `activeDeadlineSeconds`.

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerStatus, EnvVar, KeyToPath, Pod,
    PodSpec, PodTemplateSpec, ResourceRequirements, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use offload_api::names;
use offload_api::trace::{ModelTrace, TraceError};
use offload_api::v1alpha1::TrainingJob;

use super::SizerOptions;
use crate::decision::SizerRequest;

/// Where the sizer's inputs are mounted in its container.
const MOUNT: &str = "/offload-sizer";
/// The container's name.
pub const CONTAINER: &str = "sizer";
/// How long a finished sizer Job is kept (its pod's message is read before).
const TTL_AFTER_FINISHED: i32 = 600;

/// Which image a sizer Job runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// The job's own training image: the libraries that will build the model.
    JobImage,
    /// The chart's sizer image (pinned torch and transformers).
    SizerImage,
}

impl Attempt {
    fn suffix(self) -> &'static str {
        match self {
            Attempt::JobImage => "j",
            Attempt::SizerImage => "s",
        }
    }
}

/// The sizer Job's name for `step` and `attempt`: one per step and namespace, whichever job
/// asked first.
pub fn job_name(step: &SizerRequest, attempt: Attempt) -> String {
    format!("offload-sizer-{}-{}", step.key(), attempt.suffix())
}

/// The image `attempt` runs for `tj`: its training container's, or the sizer image; `None`
/// where there is none.
pub fn image_of(tj: &TrainingJob, attempt: Attempt, options: &SizerOptions) -> Option<String> {
    match attempt {
        Attempt::JobImage => {
            let spec = tj.spec.template.spec.as_ref()?;
            let resources = crate::decision::PodResources::training_container_of(spec)?;
            spec.containers.get(resources)?.image.clone()
        }
        Attempt::SizerImage => options.image.clone(),
    }
    .filter(|i| !i.is_empty())
}

/// The first attempt for `tj`: its own image where allowed and it names one, else the sizer
/// image; `None` where neither can run.
pub fn first_attempt(tj: &TrainingJob, options: &SizerOptions) -> Option<Attempt> {
    if options.job_image && image_of(tj, Attempt::JobImage, options).is_some() {
        return Some(Attempt::JobImage);
    }
    image_of(tj, Attempt::SizerImage, options).map(|_| Attempt::SizerImage)
}

/// The Job that traces `step` for `tj` with `image`, reading the model's `config.json` from key
/// `key` of ConfigMap `config_map` in the job's namespace.
pub fn sizer_job(
    tj: &TrainingJob,
    step: &SizerRequest,
    config_map: &str,
    key: &str,
    image: &str,
    attempt: Attempt,
    options: &SizerOptions,
) -> Job {
    let template = tj.spec.template.spec.clone().unwrap_or_default();
    let container = container(step, image, options);
    let labels: BTreeMap<String, String> = [
        (names::LABEL_SIZER.to_string(), step.key()),
        (names::LABEL_SIZER_FOR.to_string(), tj.name_any()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "offload-operator".to_string(),
        ),
    ]
    .into();
    let pod_annotations = tj
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.clone());
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(step, attempt)),
            namespace: tj.namespace(),
            labels: Some(labels.clone()),
            owner_references: owner(tj).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            active_deadline_seconds: Some(
                i64::try_from(options.timeout.as_secs().max(1)).unwrap_or(i64::MAX),
            ),
            ttl_seconds_after_finished: Some(TTL_AFTER_FINISHED),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    // The job's pods' annotations (admission policies, sidecar opt-outs) hold
                    // for its sizer too.
                    annotations: pod_annotations,
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    containers: vec![container],
                    // Where the job's pods may pull their image and run, its sizer may.
                    image_pull_secrets: template.image_pull_secrets,
                    node_selector: template.node_selector,
                    tolerations: template.tolerations,
                    affinity: template.affinity,
                    volumes: Some(vec![Volume {
                        name: "model-config".into(),
                        config_map: Some(ConfigMapVolumeSource {
                            name: config_map.into(),
                            items: Some(vec![KeyToPath {
                                key: key.into(),
                                path: "config.json".into(),
                                ..Default::default()
                            }]),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The sizer's container: the shipped sizer on the mounted `config.json`, nothing downloaded,
/// no GPU, no capability.
fn container(step: &SizerRequest, image: &str, options: &SizerOptions) -> Container {
    let mut args = vec![
        super::SCRIPT.to_string(),
        "--config".into(),
        format!("{MOUNT}/config.json"),
    ];
    args.extend(step.args());
    args.extend(["--termination-log".into(), "/dev/termination-log".into()]);
    let env = [
        // Nothing is downloaded and no GPU is touched: the config is all the sizer reads.
        ("HF_HUB_OFFLINE", "1"),
        ("TRANSFORMERS_OFFLINE", "1"),
        ("CUDA_VISIBLE_DEVICES", ""),
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("HOME", "/tmp"),
        ("OMP_NUM_THREADS", "2"),
    ]
    .into_iter()
    .map(|(name, value)| EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    })
    .collect();
    let resources: BTreeMap<String, Quantity> = [
        ("cpu".to_string(), Quantity(options.cpu.clone())),
        ("memory".to_string(), Quantity(options.memory.clone())),
    ]
    .into();
    Container {
        name: CONTAINER.into(),
        image: Some(image.into()),
        command: Some(vec!["python3".into(), "-c".into()]),
        args: Some(args),
        env: Some(env),
        resources: Some(ResourceRequirements {
            limits: Some(resources.clone()),
            requests: Some(resources),
            ..Default::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: "model-config".into(),
            mount_path: MOUNT.into(),
            read_only: Some(true),
            ..Default::default()
        }]),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        termination_message_policy: Some("File".into()),
        ..Default::default()
    }
}

fn owner(tj: &TrainingJob) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: TrainingJob::api_version(&()).into(),
        kind: TrainingJob::kind(&()).into(),
        name: tj.name_any(),
        uid: tj.metadata.uid.clone()?,
        controller: Some(false),
        block_owner_deletion: Some(false),
    })
}

/// How a sizer Job stands.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Still to end.
    Running,
    /// It traced the step.
    Traced(Box<ModelTrace>),
    /// It ended without a trace: the sizer's code, and what happened.
    Failed {
        /// A code a runbook can name (the sizer's, or `TimedOut`, `ImageNotRunnable`, …).
        code: String,
        /// What happened, in one sentence.
        message: String,
        /// The image could not build the model (no Python, no framework, a type it does not
        /// know): another image may.
        image_lacks: bool,
    },
}

/// Codes of a sizer failure that another image may not have.
const IMAGE_CODES: &[&str] = &["NoFramework", "UnknownModelType", "NotBuildable"];

/// Where a sizer Job stands, from the Job and its pods.
pub fn outcome(job: &Job, pods: &[Pod]) -> Outcome {
    let statuses: Vec<&ContainerStatus> = pods
        .iter()
        .filter_map(|p| p.status.as_ref()?.container_statuses.as_ref())
        .flatten()
        .filter(|c| c.name == CONTAINER)
        .collect();
    if let Some(o) = statuses.iter().find_map(|c| ended(c)) {
        return o;
    }
    if let Some(o) = statuses.iter().find_map(|c| not_started(c)) {
        return o;
    }
    let conditions = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .cloned()
        .unwrap_or_default();
    if let Some(c) = conditions
        .iter()
        .find(|c| c.type_ == "Failed" && c.status == "True")
    {
        let reason = c.reason.as_deref().unwrap_or_default();
        return if reason == "DeadlineExceeded" {
            failed(
                "TimedOut",
                "the sizer did not finish within its time (activeDeadlineSeconds)",
                false,
            )
        } else {
            failed(
                "SizerJobFailed",
                &format!(
                    "the sizer's Job failed ({reason}): {}",
                    offload_api::text::bounded_to(c.message.as_deref().unwrap_or_default(), 300)
                ),
                false,
            )
        };
    }
    if conditions
        .iter()
        .any(|c| c.type_ == "Complete" && c.status == "True")
    {
        return failed(
            "NoTrace",
            "the sizer's Job completed, but its pod is gone with its message",
            false,
        );
    }
    Outcome::Running
}

/// What a terminated sizer container says: a trace in its message is the answer, however the
/// Job ended; `None` while it runs.
fn ended(c: &ContainerStatus) -> Option<Outcome> {
    let t = c.state.as_ref()?.terminated.as_ref()?;
    let message = t.message.as_deref().unwrap_or_default();
    let no_python = t.exit_code == 127 || t.exit_code == 126;
    if message.trim().is_empty() {
        return Some(failed(
            if no_python {
                "ImageNotRunnable"
            } else {
                "NoTrace"
            },
            &format!(
                "the sizer's container ended with exit code {} and no message{}",
                t.exit_code,
                if t.exit_code == 127 {
                    " (no python3 in the image)"
                } else {
                    ""
                }
            ),
            no_python,
        ));
    }
    Some(match ModelTrace::parse(message) {
        Ok(trace) => Outcome::Traced(Box::new(trace)),
        Err(TraceError::Sizer(f)) => {
            let lacks = IMAGE_CODES.contains(&f.code.as_str());
            failed(&f.code, &f.message, lacks)
        }
        Err(e) => failed("UnreadableTrace", &e.to_string(), false),
    })
}

/// A sizer container that cannot start (its image cannot be pulled or run).
fn not_started(c: &ContainerStatus) -> Option<Outcome> {
    let w = c.state.as_ref()?.waiting.as_ref()?;
    let reason = w.reason.as_deref().unwrap_or_default();
    matches!(
        reason,
        "ErrImagePull"
            | "ImagePullBackOff"
            | "InvalidImageName"
            | "CreateContainerError"
            | "CreateContainerConfigError"
            | "RunContainerError"
    )
    .then(|| {
        failed(
            "ImageNotRunnable",
            &format!(
                "the sizer's container cannot start: {reason}: {}",
                offload_api::text::bounded_to(w.message.as_deref().unwrap_or_default(), 300)
            ),
            true,
        )
    })
}

fn failed(code: &str, message: &str, image_lacks: bool) -> Outcome {
    Outcome::Failed {
        code: offload_api::text::bounded_to(code, 64),
        message: offload_api::text::bounded_to(message, 512),
        image_lacks,
    }
}

#[cfg(test)]
mod tests;
