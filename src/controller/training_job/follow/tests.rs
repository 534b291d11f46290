#[test]
fn a_slimmed_workload_keeps_what_following_reads() {
    let mut job: Job = serde_json::from_value(serde_json::json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "llama", "namespace": "ml",
                     "annotations": {names::ANNOTATION_DECISION: "{}"}},
        "spec": {"template": {
            "metadata": {"labels": {"a": "b"}},
            "spec": {
                "initContainers": [{"name": render::GUARD_CONTAINER, "image": "agent",
                                    "args": ["verify"], "env": [{"name": "X", "value": "1"}]}],
                "containers": [{"name": "train", "image": "train:1"}],
                "volumes": [
                    {"name": render::CONFIG_VOLUME, "configMap": {"name": "llama-offload"}},
                    {"name": "data", "emptyDir": {}}
                ]}}},
        "status": {"active": 1}
    }))
    .unwrap();
    slim_workload(&mut job);
    let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert!(job.spec.as_ref().unwrap().template.metadata.is_none());
    assert!(pod.containers.is_empty());
    let init = pod.init_containers.as_ref().unwrap();
    assert_eq!(init.len(), 1);
    assert_eq!(init[0].name, render::GUARD_CONTAINER);
    assert!(init[0].image.is_none() && init[0].env.is_none());
    let volumes = pod.volumes.as_ref().unwrap();
    assert_eq!(volumes.len(), 1);
    assert_eq!(
        volumes[0].config_map.as_ref().unwrap().name,
        "llama-offload"
    );
    assert_eq!(job.status.as_ref().unwrap().active, Some(1));
    assert!(job.annotations().contains_key(names::ANNOTATION_DECISION));
    // A Job without a spec is left as it is.
    let mut bare = Job::default();
    slim_workload(&mut bare);
    assert!(bare.spec.is_none());
}

use super::*;
use crate::controller::training_job::workload::slim_workload;

fn pod(init: serde_json::Value) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "train-0"},
        "spec": {"nodeName": "gpu-3", "containers": []},
        "status": {"initContainerStatuses": [init]}
    }))
    .unwrap()
}

#[test]
fn the_guards_outcome_is_read_from_its_init_container() {
    let failed = pod(serde_json::json!({
        "name": "offload-verify", "ready": false, "restartCount": 1, "image": "a", "imageID": "",
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 1, "message": "offload-verify: configured for unified-memory offload ..."}}
    }));
    match guard_outcome(&failed) {
        Some(GuardOutcome::Failed(msg)) => {
            assert!(
                msg.starts_with("pod train-0 on node gpu-3: offload-verify:"),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
    let passed = pod(serde_json::json!({
        "name": "offload-verify", "ready": true, "restartCount": 0, "image": "a", "imageID": "",
        "state": {"terminated": {"exitCode": 0}}
    }));
    assert_eq!(
        guard_outcome(&passed),
        Some(GuardOutcome::Passed("gpu-3".into()))
    );
    let running = pod(serde_json::json!({
        "name": "offload-verify", "ready": false, "restartCount": 0, "image": "a", "imageID": "",
        "state": {"running": {}}
    }));
    assert_eq!(guard_outcome(&running), None);
    let other = pod(serde_json::json!({
        "name": "user-init", "ready": false, "restartCount": 0, "image": "a", "imageID": "",
        "state": {"terminated": {"exitCode": 3}}
    }));
    assert_eq!(guard_outcome(&other), None, "only the guard counts");
    // A huge message is bounded.
    let huge = pod(serde_json::json!({
        "name": "offload-verify", "ready": false, "restartCount": 0, "image": "a", "imageID": "",
        "state": {"terminated": {"exitCode": 1, "message": "x".repeat(100_000)}}
    }));
    let Some(GuardOutcome::Failed(msg)) = guard_outcome(&huge) else {
        panic!()
    };
    assert!(msg.len() < 1200);
}

#[test]
fn the_phase_is_running_only_once_a_pod_is_ready() {
    let job = |spec: serde_json::Value, status: serde_json::Value| -> Job {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
            "spec": spec, "status": status,
        }))
        .unwrap()
    };
    let template = serde_json::json!({"spec": {"containers": []}});
    let running = serde_json::json!({"template": template});
    let suspended = serde_json::json!({"template": template, "suspend": true});
    // Created, nothing reported yet.
    let mut bare = job(running.clone(), serde_json::json!({}));
    bare.status = None;
    assert_eq!(phase_of(&bare), JobPhase::Pending);
    let mut queued = job(suspended.clone(), serde_json::json!({}));
    queued.status = None;
    assert_eq!(phase_of(&queued), JobPhase::Queued);
    // A pod counted active while it is still pending (pulling, unscheduled) is not running.
    assert_eq!(
        phase_of(&job(
            running.clone(),
            serde_json::json!({"active": 1, "ready": 0})
        )),
        JobPhase::Pending
    );
    assert_eq!(
        phase_of(&job(running.clone(), serde_json::json!({"active": 1}))),
        JobPhase::Pending
    );
    assert_eq!(
        phase_of(&job(
            running.clone(),
            serde_json::json!({"active": 1, "ready": 1})
        )),
        JobPhase::Running
    );
    // Suspended again (Kueue preempted it): queued, whatever its pods were.
    assert_eq!(
        phase_of(&job(
            suspended.clone(),
            serde_json::json!({"active": 0, "ready": 0})
        )),
        JobPhase::Queued
    );
    let condition = |t: &str| {
        serde_json::json!({"conditions": [{"type": t, "status": "True",
            "lastProbeTime": null, "lastTransitionTime": null}]})
    };
    assert_eq!(
        phase_of(&job(running.clone(), condition("Complete"))),
        JobPhase::Succeeded
    );
    assert_eq!(
        phase_of(&job(suspended, condition("Failed"))),
        JobPhase::Failed
    );
    // A condition that is not true says nothing.
    let not_yet =
        serde_json::json!({"ready": 1, "conditions": [{"type": "Complete", "status": "False"}]});
    assert_eq!(phase_of(&job(running, not_yet)), JobPhase::Running);
}

/// Queued, admitted, preempted: `Suspended` is the state that stays while the Job waits again,
/// however often it is reconciled, until Kueue admits it once more.
#[test]
fn a_preempted_job_stays_suspended_until_admitted_again() {
    let tj: TrainingJob = serde_json::from_value(serde_json::json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": "t", "namespace": "ml",
                     "labels": {names::KUEUE_QUEUE_LABEL: "team-a"}},
        "spec": {"replicas": 1, "framework": {"name": "DeepSpeed"}, "template": {}}
    }))
    .unwrap();
    let job = |suspend: bool| -> Job {
        serde_json::from_value(serde_json::json!({"spec": {"suspend": suspend, "template": {}}}))
            .unwrap()
    };
    let step = |existing: &[Condition], suspend: bool, kueue: Option<&str>| -> Vec<Condition> {
        let c = admission(&tj, &job(suspend), existing, Some(1), kueue).unwrap();
        let mut list = existing.to_vec();
        conditions::set(&mut list, c);
        list
    };
    let reason = |list: &[Condition]| -> (String, String) {
        let c = list
            .iter()
            .find(|c| conditions::ConditionType::Admitted.is(c))
            .unwrap();
        (c.status.clone(), c.reason.clone())
    };
    let queued = step(&[], true, None);
    assert_eq!(reason(&queued), ("False".into(), "Queued".into()));
    let admitted = step(&queued, false, None);
    assert_eq!(reason(&admitted), ("True".into(), "Admitted".into()));
    let mut now = step(&admitted, true, Some("Preempted to accommodate a workload"));
    for _ in 0..5 {
        assert_eq!(reason(&now), ("False".into(), "Suspended".into()));
        now = step(&now, true, Some("Preempted to accommodate a workload"));
    }
    let again = step(&now, false, None);
    assert_eq!(reason(&again), ("True".into(), "Admitted".into()));
    // A job that was never admitted is only queued, however long it waits.
    let mut waiting = queued;
    for _ in 0..3 {
        waiting = step(&waiting, true, Some("insufficient quota"));
        assert_eq!(reason(&waiting), ("False".into(), "Queued".into()));
    }
}
