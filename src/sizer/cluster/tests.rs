use k8s_openapi::api::batch::v1::JobStatus;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStateWaiting, PodStatus,
};
use serde_json::json;

use super::*;
use crate::decision::tests::traced::{NEMOTRON, job_of};

const TRACE: &str = include_str!("../../../tests/fixtures/traces/nemotron-4b-4096.json");

fn training_job() -> TrainingJob {
    serde_json::from_value(json!({
        "apiVersion": "offload.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "t", "namespace": "team-a", "uid": "u-1"},
        "spec": {
            "replicas": 1,
            "framework": {"name": "DeepSpeed", "version": "0.19.8"},
            "model": {"configMapRef": {"name": "m"}, "tokensPerStep": 4096},
            "template": {
                "metadata": {"annotations": {"sidecar.istio.io/inject": "false"}},
                "spec": {
                    "imagePullSecrets": [{"name": "registry"}],
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                    "containers": [
                        {"name": "log", "image": "busybox"},
                        {"name": "train", "image": "registry.example.com/train:1",
                         "resources": {"limits": {"nvidia.com/gpu": 1}}}
                    ]
                }
            }
        }
    }))
    .unwrap()
}

fn step() -> StepArgs {
    StepArgs::from(&SizerRequest::of(&job_of(NEMOTRON, 4096, None)).unwrap())
}

#[test]
fn the_sizer_job_runs_the_shipped_sizer_from_the_training_image_bounded_and_with_nothing_to_reach()
{
    let tj = SizerSource::of_training_job(&training_job());
    let options = SizerOptions::default();
    assert_eq!(first_attempt(&tj, &options), Some(Attempt::JobImage));
    let image = image_of(&tj, Attempt::JobImage, &options).unwrap();
    // The training container (the one asking for a GPU), not the first.
    assert_eq!(image, "registry.example.com/train:1");
    let job = sizer_job(
        &tj,
        &step(),
        "m",
        "config.json",
        &image,
        Attempt::JobImage,
        &options,
    );
    assert_eq!(job.metadata.namespace.as_deref(), Some("team-a"));
    assert_eq!(
        job.metadata.name.as_deref(),
        Some(job_name(&step().key, Attempt::JobImage).as_str())
    );
    let owner = &job.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("TrainingJob", "u-1")
    );
    let spec = job.spec.as_ref().unwrap();
    assert_eq!(spec.backoff_limit, Some(0));
    assert_eq!(spec.active_deadline_seconds, Some(300));
    let pod = spec.template.spec.as_ref().unwrap();
    assert_eq!(pod.automount_service_account_token, Some(false));
    assert_eq!(pod.image_pull_secrets.as_ref().unwrap()[0].name, "registry");
    assert!(pod.tolerations.is_some());
    let c = &pod.containers[0];
    assert_eq!(
        c.command.as_deref(),
        Some(&["python3".to_string(), "-c".to_string()][..])
    );
    let args = c.args.as_ref().unwrap();
    // The sizer this release ships, its step's arguments and the termination log.
    assert_eq!(args[0], crate::sizer::SCRIPT);
    assert!(args.windows(2).any(|w| w == ["--sequence", "4096"]));
    assert!(
        args.windows(2)
            .any(|w| w[0] == "--key" && w[1] == step().key)
    );
    assert!(args.ends_with(&["--termination-log".into(), "/dev/termination-log".into()]));
    // No GPU, no download, no capability.
    let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert!(!limits.contains_key("nvidia.com/gpu"));
    let env: Vec<(&str, &str)> = c
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.as_str(), e.value.as_deref().unwrap_or_default()))
        .collect();
    assert!(env.contains(&("HF_HUB_OFFLINE", "1")) && env.contains(&("CUDA_VISIBLE_DEVICES", "")));
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    // The job's pods' annotations hold for its sizer.
    let annotations = spec
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .as_ref()
        .unwrap();
    assert_eq!(annotations["sidecar.istio.io/inject"], "false");
    // The model's ConfigMap, mounted as config.json.
    let volume = &pod.volumes.as_ref().unwrap()[0];
    assert_eq!(volume.config_map.as_ref().unwrap().name, "m");
}

#[test]
fn without_the_jobs_image_the_sizer_image_runs_and_without_either_nothing_does() {
    let tj = SizerSource::of_training_job(&training_job());
    let no_job_image = SizerOptions {
        job_image: false,
        ..SizerOptions::default()
    };
    assert_eq!(first_attempt(&tj, &no_job_image), None);
    let with_image = SizerOptions {
        job_image: false,
        image: Some("ghcr.io/offload-dev/offload-sizer:0.1.0".into()),
        ..SizerOptions::default()
    };
    assert_eq!(first_attempt(&tj, &with_image), Some(Attempt::SizerImage));
    assert_ne!(
        job_name(&step().key, Attempt::JobImage),
        job_name(&step().key, Attempt::SizerImage)
    );
}

fn pod_with(state: ContainerState) -> Pod {
    Pod {
        status: Some(PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                name: CONTAINER.into(),
                state: Some(state),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn terminated(exit_code: i32, message: &str) -> Pod {
    pod_with(ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code,
            message: Some(message.into()),
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn job_with(condition: Option<(&str, &str)>) -> Job {
    Job {
        status: condition.map(|(type_, reason)| JobStatus {
            conditions: Some(vec![k8s_openapi::api::batch::v1::JobCondition {
                type_: type_.into(),
                status: "True".into(),
                reason: Some(reason.into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn what_the_sizers_pod_says_is_the_outcome() {
    let running = job_with(None);
    assert_eq!(outcome(&running, &[]), Outcome::Running);
    // The trace, as the termination message carries it.
    match outcome(&running, &[terminated(0, TRACE)]) {
        Outcome::Traced(t) => assert_eq!(t.parameters, 4_190_509_056),
        other => panic!("{other:?}"),
    }
    // The sizer's own failure: its code, and whether another image may do.
    let refused = r#"{"apiVersion": "offload.dev/v1alpha1", "kind": "ModelTraceError", "version": 1, "error": {"code": "NoFramework", "message": "this image has no torch"}}"#;
    assert!(matches!(
        outcome(&running, &[terminated(3, refused)]),
        Outcome::Failed { code, image_lacks: true, .. } if code == "NoFramework"
    ));
    let custom = refused.replace("NoFramework", "CustomCode");
    assert!(matches!(
        outcome(&running, &[terminated(3, &custom)]),
        Outcome::Failed { code, image_lacks: false, .. } if code == "CustomCode"
    ));
    // No python3 in the image: the shell's 127, no message.
    assert!(matches!(
        outcome(&running, &[terminated(127, "")]),
        Outcome::Failed { code, image_lacks: true, .. } if code == "ImageNotRunnable"
    ));
    // A message that is no trace is not believed.
    assert!(matches!(
        outcome(&running, &[terminated(0, "{\"kind\": 7}")]),
        Outcome::Failed { code, .. } if code == "UnreadableTrace"
    ));
    // An image that cannot be pulled.
    let pull = pod_with(ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some("ImagePullBackOff".into()),
            message: Some("pull access denied".into()),
        }),
        ..Default::default()
    });
    assert!(matches!(
        outcome(&running, &[pull]),
        Outcome::Failed { code, image_lacks: true, .. } if code == "ImageNotRunnable"
    ));
    // The Job's deadline.
    assert!(matches!(
        outcome(&job_with(Some(("Failed", "DeadlineExceeded"))), &[]),
        Outcome::Failed { code, .. } if code == "TimedOut"
    ));
    assert!(matches!(
        outcome(&job_with(Some(("Complete", "Completed"))), &[]),
        Outcome::Failed { code, .. } if code == "NoTrace"
    ));
}

#[test]
fn a_pending_step_reads_back_as_written_and_nothing_but_the_operators_arguments_passes() {
    let pending = PendingStep {
        step: step(),
        config_map: "model".into(),
        config_key: "config.json".into(),
    };
    assert_eq!(
        PendingStep::parse(&pending.annotation()),
        Ok(pending.clone())
    );
    let with = |edit: &dyn Fn(&mut PendingStep)| {
        let mut p = pending.clone();
        edit(&mut p);
        PendingStep::parse(&p.annotation())
    };
    // A pod's annotation is its user's to write: only the operator's arguments, of their form.
    assert!(with(&|p| p.step.args.push("--output".into())).is_err());
    assert!(
        with(&|p| p
            .step
            .args
            .extend(["--config".into(), "/etc/shadow".into()]))
        .is_err()
    );
    assert!(with(&|p| p.step.args[1] = "-1".into()).is_err());
    assert!(with(&|p| p.step.key = "../../x".into()).is_err());
    assert!(with(&|p| p.config_map = "Not A Name".into()).is_err());
    assert!(with(&|p| p.config_key = "a/b".into()).is_err());
    assert!(PendingStep::parse("{").is_err());
    assert!(PendingStep::parse(&"x".repeat(5000)).is_err());
    // The checkpointing flag takes no value.
    assert!(with(&|p| p.step.args.push("--checkpointing".into())).is_ok());
}
