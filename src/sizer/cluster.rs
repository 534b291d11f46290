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

/// The sizer Job's name for the step `key` and `attempt`: one per step and namespace, whichever
/// job asked first.
pub fn job_name(key: &str, attempt: Attempt) -> String {
    format!("offload-sizer-{key}-{}", attempt.suffix())
}

/// A step as the sizer's Job takes it: its key and the sizer's arguments for it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StepArgs {
    /// The step's key ([`SizerRequest::key`]).
    pub key: String,
    /// The sizer's arguments after `--config` ([`SizerRequest::args`]).
    pub args: Vec<String>,
}

impl From<&SizerRequest> for StepArgs {
    fn from(step: &SizerRequest) -> Self {
        StepArgs {
            key: step.key(),
            args: step.args(),
        }
    }
}

/// A step of another kind's job still to be traced, as the webhook writes it on the job's pod
/// template ([`names::ANNOTATION_SIZER_STEP`]) for the operator to trace for the jobs of the
/// step that come after: its env is written at creation, so it cannot wait.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PendingStep {
    /// The step.
    #[serde(flatten)]
    pub step: StepArgs,
    /// The ConfigMap with the model's `config.json`, in the job's namespace.
    pub config_map: String,
    /// Its key.
    pub config_key: String,
}

/// Most bytes of a pending step's annotation.
const MAX_PENDING_BYTES: usize = 4096;

impl PendingStep {
    /// The annotation's value.
    pub fn annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// A pending step from its annotation, checked: a key of hex digits, the ConfigMap a name
    /// and its key a file name, and only the arguments the operator writes, with values of
    /// their form (a pod's annotation is the user's to write).
    pub fn parse(text: &str) -> Result<PendingStep, String> {
        if text.len() > MAX_PENDING_BYTES {
            return Err(format!("over {MAX_PENDING_BYTES} bytes"));
        }
        let p: PendingStep = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if p.step.key.is_empty()
            || p.step.key.len() > 40
            || !p.step.key.chars().all(|c| c.is_ascii_hexdigit())
        {
            return Err("the key is not the operator's".into());
        }
        offload_api::validation::object_name(&p.config_map)?;
        if p.config_key.is_empty()
            || p.config_key.len() > 253
            || !p
                .config_key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(format!("{:?} is not a ConfigMap key", p.config_key));
        }
        check_args(&p.step.args)?;
        Ok(p)
    }
}

/// Only the arguments [`SizerRequest::args`] writes, each value of its form.
fn check_args(args: &[String]) -> Result<(), String> {
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).map(String::as_str).unwrap_or_default();
        let ok = match args[i].as_str() {
            "--checkpointing" => {
                i += 1;
                continue;
            }
            "--micro-batch" | "--sequence" => value.parse::<u32>().is_ok_and(|n| n >= 1),
            "--dtype" => matches!(value, "bfloat16" | "float16" | "float32"),
            "--key" => {
                !value.is_empty()
                    && value.len() <= 40
                    && value.chars().all(|c| c.is_ascii_hexdigit())
            }
            "--attention" => offload_api::hints::attention_name(value).is_ok(),
            other => {
                return Err(format!(
                    "{:?} is not an argument the operator writes",
                    offload_api::text::bounded_to(other, 40)
                ));
            }
        };
        if !ok {
            return Err(format!(
                "{} {:?} is not a value it takes",
                args[i],
                offload_api::text::bounded_to(value, 40)
            ));
        }
        i += 2;
    }
    Ok(())
}

/// What a sizer Job is made for: the namespace it runs in, the image the job's pods run, where
/// they may run and pull from, and who asked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SizerSource {
    /// The job's namespace.
    pub namespace: String,
    /// The image of the job's training container.
    pub image: Option<String>,
    /// The job's pod template as far as its sizer shares it: image-pull secrets, node
    /// selector, tolerations, affinity.
    pub pod: PodSpec,
    /// The annotations of the job's pods (admission policies, sidecar opt-outs hold for its
    /// sizer too).
    pub annotations: Option<BTreeMap<String, String>>,
    /// What the sizer Job is labelled as made for ([`names::LABEL_SIZER_FOR`]).
    pub asked_by: String,
    /// Its owner, where one is to collect it.
    pub owner: Option<OwnerReference>,
}

impl SizerSource {
    /// A TrainingJob's.
    pub fn of_training_job(tj: &TrainingJob) -> SizerSource {
        let spec = tj.spec.template.spec.clone().unwrap_or_default();
        SizerSource {
            namespace: tj.namespace().unwrap_or_default(),
            image: training_image(&spec),
            annotations: tj
                .spec
                .template
                .metadata
                .as_ref()
                .and_then(|m| m.annotations.clone()),
            asked_by: tj.name_any(),
            owner: owner(tj),
            pod: shared(spec),
        }
    }

    /// A configured pod's, of another kind (its owner keeps nothing of the sizer's: the Job is
    /// collected after it ends).
    pub fn of_pod(pod: &Pod) -> SizerSource {
        let spec = pod.spec.clone().unwrap_or_default();
        SizerSource {
            namespace: pod.namespace().unwrap_or_default(),
            image: training_image(&spec),
            annotations: pod.metadata.annotations.clone(),
            asked_by: pod.name_any(),
            owner: None,
            pod: shared(spec),
        }
    }
}

/// What a sizer's pod shares with the job's: where it may pull its image and run.
fn shared(spec: PodSpec) -> PodSpec {
    PodSpec {
        image_pull_secrets: spec.image_pull_secrets,
        node_selector: spec.node_selector,
        tolerations: spec.tolerations,
        affinity: spec.affinity,
        ..Default::default()
    }
}

/// The training container's image: the first that asks for a GPU, else the first.
fn training_image(spec: &PodSpec) -> Option<String> {
    let at = crate::decision::PodResources::training_container_of(spec)?;
    spec.containers.get(at)?.image.clone()
}

/// The image `attempt` runs for `source`: its training container's, or the sizer image; `None`
/// where there is none.
pub fn image_of(source: &SizerSource, attempt: Attempt, options: &SizerOptions) -> Option<String> {
    match attempt {
        Attempt::JobImage => source.image.clone(),
        Attempt::SizerImage => options.image.clone(),
    }
    .filter(|i| !i.is_empty())
}

/// The first attempt for `source`: its own image where allowed and it names one, else the
/// sizer image; `None` where neither can run.
pub fn first_attempt(source: &SizerSource, options: &SizerOptions) -> Option<Attempt> {
    if options.job_image && image_of(source, Attempt::JobImage, options).is_some() {
        return Some(Attempt::JobImage);
    }
    image_of(source, Attempt::SizerImage, options).map(|_| Attempt::SizerImage)
}

/// The Job that traces `step` for `source` with `image`, reading the model's `config.json` from
/// key `key` of ConfigMap `config_map` in the job's namespace.
pub fn sizer_job(
    source: &SizerSource,
    step: &StepArgs,
    config_map: &str,
    key: &str,
    image: &str,
    attempt: Attempt,
    options: &SizerOptions,
) -> Job {
    let container = container(step, image, options);
    let mut labels: BTreeMap<String, String> = [
        (names::LABEL_SIZER.to_string(), step.key.clone()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "offload-operator".to_string(),
        ),
    ]
    .into();
    // A pod's name may be longer than a label value takes: then the Job names no one.
    if offload_api::validation::label_value(&source.asked_by).is_ok() {
        labels.insert(names::LABEL_SIZER_FOR.to_string(), source.asked_by.clone());
    }
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(&step.key, attempt)),
            namespace: Some(source.namespace.clone()),
            labels: Some(labels.clone()),
            owner_references: source.owner.clone().map(|o| vec![o]),
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
                    annotations: source.annotations.clone(),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".into()),
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    containers: vec![container],
                    // Where the job's pods may pull their image and run, its sizer may.
                    image_pull_secrets: source.pod.image_pull_secrets.clone(),
                    node_selector: source.pod.node_selector.clone(),
                    tolerations: source.pod.tolerations.clone(),
                    affinity: source.pod.affinity.clone(),
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
fn container(step: &StepArgs, image: &str, options: &SizerOptions) -> Container {
    let mut args = vec![
        super::SCRIPT.to_string(),
        "--config".into(),
        format!("{MOUNT}/config.json"),
    ];
    args.extend(step.args.iter().cloned());
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
