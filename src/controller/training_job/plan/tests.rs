//! Table tests of the planner: each reconcile a TrainingJob goes through, as the plan made
//! from a snapshot and the cluster's view — no API server, no clock. The recorded node reports
//! stand in for GPU nodes (named as such); the same paths run against the real API server in
//! `tests/`.

use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::{reflector, watcher};
use serde_json::json;

use super::*;
use crate::cluster::learned::LearnedStore;
use crate::cluster::view::StoreView;
use crate::controller::conditions;
use crate::controller::training_job::planned::Following;
use crate::decision::runs::learned::RanAs;
use crate::decision::runs::learned::Run;
use crate::decision::{ConfigError, ModelConfigError};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use offload_api::v1alpha1::NodeClass;
use offload_api::v1alpha1::{JobPhase, OffloadProfile, StatePlacement};
use offload_testenv::fixtures;
use offload_testenv::support::controller::oom_job;
use offload_testenv::support::{pool_profile, reported_node};

use super::super::snapshot::Configs;

const NS: &str = "team";

fn now() -> jiff::Timestamp {
    "2026-12-07T12:00:00Z".parse().unwrap()
}

fn store<K>(objects: Vec<K>) -> reflector::Store<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, mut writer) = reflector::store();
    for object in objects {
        writer.apply_watcher_event(&watcher::Event::Apply(object));
    }
    reader
}

/// One H200 (a recorded report) in pool `pool`.
fn h200() -> Vec<Node> {
    vec![reported_node("h200-0", fixtures::H200_READING, "pool")]
}

/// The view over `nodes`, the given profiles, and what runs taught (`learned`).
fn view(
    nodes: Vec<Node>,
    profiles: Vec<OffloadProfile>,
    learned: Option<LearnedStore>,
) -> StoreView {
    let mut view = StoreView::from_stores(store(profiles), store(nodes));
    view.learned = learned;
    view
}

fn profile() -> Vec<OffloadProfile> {
    vec![pool_profile("pool", "pool", json!({}))]
}

/// A one-pod job of Mistral-7B's shape (40 layers, 4,096 tokens a step) under profile `pool`,
/// as the API server stores it: on an H200, a share of its optimizer state offloaded.
fn job(name: &str) -> TrainingJob {
    let mut tj = oom_job(name, "pool", "None", 40, 4096);
    tj.metadata.namespace = Some(NS.into());
    tj.metadata.uid = Some(format!("uid-{name}"));
    tj.metadata.generation = Some(1);
    tj
}

fn snapshot(tj: &TrainingJob, workload: Option<&Job>, pods: Vec<Pod>) -> Snapshot {
    Snapshot {
        job: tj.clone(),
        workload: workload.cloned(),
        pods: pods.into_iter().map(Arc::new).collect(),
        kueue_says: None,
        refusal: None,
        fresh: None,
        configs: Some(Configs {
            deepspeed: Ok::<_, ConfigError>(None),
            model: Ok::<_, ModelConfigError>(None),
        }),
        trace: Step::Decide(None),
        now: now(),
    }
}

fn ratio(res: &Resolution) -> f64 {
    res.status().offload_ratio
}

fn creation(plan: Plan) -> Creation {
    match plan {
        Plan::Create(c) => *c,
        Plan::Hold(h) => panic!("held: {} {}", h.reason, h.message),
        _ => panic!("not a creation"),
    }
}

fn following(plan: Plan) -> Following {
    match plan {
        Plan::Follow(f) => *f,
        _ => panic!("not a followed workload"),
    }
}

/// The job as it is once `c` was written (its spec at generation 2, its status, its workload
/// created), and its workload Job as the API server stores it.
fn created(tj: &TrainingJob, c: &Creation) -> (TrainingJob, Job) {
    let mut tj = tj.clone();
    tj.metadata.generation = Some(2);
    if let Some(res) = &c.resolution {
        tj.spec.offload = res.concrete_spec();
    }
    let (mut status, _) = c.status_at(Some(2));
    status::with_workload(
        &mut status,
        offload_api::v1alpha1::WorkloadRef {
            job: tj.name_any(),
            service: tj.name_any(),
            config_map: None,
        },
    );
    tj.status = Some(status);
    let mut workload = c.workload.job.clone();
    workload.metadata.uid = Some(format!("job-{}", tj.name_any()));
    (tj, workload)
}

/// A pod of `workload` whose training container ended as `terminated` says.
fn pod_of(workload: &Job, terminated: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("{}-0", workload.metadata.name.as_deref().unwrap()),
                     "namespace": NS,
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "controller": true,
                                          "name": workload.metadata.name, "uid": workload.metadata.uid}]},
        "spec": {"nodeName": "h200-0", "containers": []},
        "status": {"phase": "Failed", "containerStatuses": [{
            "name": "train", "ready": false, "restartCount": 0, "image": "t", "imageID": "",
            "state": {"terminated": terminated}}]}
    }))
    .unwrap()
}

fn cuda_out_of_memory() -> serde_json::Value {
    json!({"exitCode": 1, "reason": "Error",
           "message": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.99 GiB. GPU 0 has a total capacity of 139.80 GiB of which 2.29 GiB is free. Of the allocated memory 134.10 GiB is allocated by PyTorch, and 1.90 GiB is reserved by PyTorch but unallocated."})
}

fn condition<'a>(list: &'a [Condition], type_: &str) -> &'a Condition {
    list.iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} in {list:?}"))
}

#[test]
fn a_first_decision_writes_the_spec_then_creates_the_workload() {
    let tj = job("first");
    let view = view(h200(), profile(), None);
    let c = creation(plan(
        &snapshot(&tj, None, vec![]),
        &view,
        &RenderOptions::default(),
    ));
    let res = c.resolution.as_ref().unwrap();
    assert_eq!(res.placement.state().0, StatePlacement::PartialOptimizer);
    assert!(c.trial.is_none());
    let spec = c.spec.as_ref().expect("spec.offload is written");
    assert_eq!(spec["spec"]["offload"]["mode"], json!("CPUCopy"));
    assert_eq!(c.workload.job.metadata.name.as_deref(), Some("first"));
    let (status, first) = c.status_at(Some(2));
    assert!(first);
    assert_eq!(status.observed_generation, Some(2));
    let resolved = condition(
        &status.conditions,
        conditions::ConditionType::OffloadResolved.as_str(),
    );
    assert_eq!(
        (resolved.status.as_str(), resolved.reason.as_str()),
        ("True", "Resolved")
    );
    // Planned again once written: the spec says it already, nothing more to write there.
    let (tj, _) = created(&tj, &c);
    let mut again = tj.clone();
    again.status = None;
    let c = creation(plan(
        &snapshot(&again, None, vec![]),
        &view,
        &RenderOptions::default(),
    ));
    assert!(c.spec.is_none());
}

#[test]
fn a_job_no_node_can_take_is_held_once_and_decided_when_a_node_comes() {
    let tj = job("held");
    let empty = view(Vec::new(), profile(), None);
    let Plan::Hold(held) = plan(
        &snapshot(&tj, None, vec![]),
        &empty,
        &RenderOptions::default(),
    ) else {
        panic!("not held");
    };
    assert_eq!(held.reason, "NoReportedNodes");
    let status = held.status.expect("the status says it");
    // Held again with the same status: nothing to write, the metric still set.
    let mut said = tj.clone();
    said.status = Some(status);
    let Plan::Hold(again) = plan(
        &snapshot(&said, None, vec![]),
        &empty,
        &RenderOptions::default(),
    ) else {
        panic!("not held");
    };
    assert!(again.status.is_none());
    // A node reports: decided.
    let c = creation(plan(
        &snapshot(&said, None, vec![]),
        &view(h200(), profile(), None),
        &RenderOptions::default(),
    ));
    assert!(c.resolution.is_some());
}

#[test]
fn a_profile_created_or_edited_is_what_decides() {
    let tj = job("profiled");
    let Plan::Hold(held) = plan(
        &snapshot(&tj, None, vec![]),
        &view(h200(), Vec::new(), None),
        &RenderOptions::default(),
    ) else {
        panic!("not held");
    };
    assert_eq!(held.reason, "ProfileNotFound");
    // The profile is created, then edited to force CPU copy of everything.
    let c = creation(plan(
        &snapshot(&tj, None, vec![]),
        &view(h200(), profile(), None),
        &RenderOptions::default(),
    ));
    let partial = c.resolution.unwrap();
    let edited = vec![pool_profile("pool", "pool", json!({"offloadRatio": "1.0"}))];
    let c = creation(plan(
        &snapshot(&tj, None, vec![]),
        &view(h200(), edited, None),
        &RenderOptions::default(),
    ));
    let all = c.resolution.unwrap();
    assert!(ratio(&all) > ratio(&partial), "{}", all.summary());
}

#[test]
fn a_pod_out_of_gpu_memory_replaces_the_workload_within_the_bound() {
    let tj = job("oom");
    let view = view(h200(), profile(), None);
    let c = creation(plan(
        &snapshot(&tj, None, vec![]),
        &view,
        &RenderOptions::default(),
    ));
    let (tj, workload) = created(&tj, &c);
    let pod = pod_of(&workload, cuda_out_of_memory());
    let f = following(plan(
        &snapshot(&tj, Some(&workload), vec![pod.clone()]),
        &view,
        &RenderOptions::default(),
    ));
    let recovery = f.recovery.expect("a recovery");
    assert_eq!(recovery.failures.len(), 1);
    assert!(!recovery.exhausted);
    assert_eq!(recovery.condition.reason, names::REASON_REDECIDING);
    let recreating = recovery.replace.expect("the workload replaced");
    assert_eq!(recreating.created.reason, "Recreating");
    assert!(recreating.workload.is_none());
    assert_eq!(f.events[0].reason, names::EVENT_OUT_OF_MEMORY);
    // Past maxMemoryRetries (2): recorded, held, not replaced.
    let mut failed = tj.clone();
    let status = failed.status.as_mut().unwrap();
    for n in 0..2 {
        let mut f = recovery.failures[0].clone();
        f.pod = format!("earlier-{n}");
        status.memory_failures.push(f);
    }
    let f = following(plan(
        &snapshot(&failed, Some(&workload), vec![pod]),
        &view,
        &RenderOptions::default(),
    ));
    let recovery = f.recovery.unwrap();
    assert!(recovery.exhausted && recovery.replace.is_none());
    assert_eq!(recovery.condition.reason, "RetriesExhausted");
}

/// Two earlier runs of the shape (one ran out at the model's share, one trained with six
/// points more offloaded): the next job is a trial between them, taken in the learned store;
/// the trial runs out, and the job goes back to what trained.
#[test]
fn a_trial_is_taken_and_falls_back_to_what_trained() {
    let probe = job("probe");
    let plain = view(h200(), profile(), None);
    let c = creation(plan(
        &snapshot(&probe, None, vec![]),
        &plain,
        &RenderOptions::default(),
    ));
    let decided = c.resolution.unwrap();
    let shape = decided.memory.as_ref().unwrap().shape.clone();
    let r0 = ratio(&decided);
    let learned = LearnedStore::new("offload-system");
    let ran = |ratio: f64| RanAs {
        placement: StatePlacement::PartialOptimizer,
        ratio,
        ranks: 1,
        gpu_bytes: 150_754_820_096,
    };
    let r_trained = ((r0 + 0.06) * 100.0).round() / 100.0;
    for (who, ratio, failed) in [("failed", r0, true), ("trained", r_trained, false)] {
        let run = Run {
            job: format!("{NS}/{who}/1"),
            activations: if failed { 3.0 } else { 0.9 },
            host: None,
            failed,
            parameters: None,
            allocator: true,
            ran_as: Some(ran(ratio)),
            trained: !failed,
            trial: false,
            step_seconds: None,
            at: jiff::Timestamp::now().to_string(),
        };
        learned
            .record("pool", NodeClass::Discrete, &shape, "the shape", run)
            .unwrap();
    }
    let taught = view(h200(), profile(), Some(learned.clone()));
    let tj = job("trial");
    let c = creation(plan(
        &snapshot(&tj, None, vec![]),
        &taught,
        &RenderOptions::default(),
    ));
    let res = c.resolution.as_ref().unwrap();
    let trial = res.trial.as_ref().expect("a trial");
    assert!(ratio(res) < r_trained, "{}", res.summary());
    let take = c.trial.as_ref().expect("taken in the learned store");
    assert_eq!(take.reservation.shape, shape);
    assert_eq!(take.namespace.as_deref(), Some(NS));
    assert_eq!(take.bound, offload_api::v1alpha1::DEFAULT_FASTER_TRIALS);
    let fallback = trial.fallback;
    // The trial runs out: recorded with what it needed, and the workload replaced.
    let (tj, workload) = created(&tj, &c);
    let pod = pod_of(&workload, cuda_out_of_memory());
    let f = following(plan(
        &snapshot(&tj, Some(&workload), vec![pod]),
        &taught,
        &RenderOptions::default(),
    ));
    assert!(!f.lessons.is_empty(), "what ran out is a lesson");
    super::super::write::record(Some(&learned), f.lessons);
    let recovery = f.recovery.unwrap();
    assert!(
        recovery.condition.message.contains("a trial"),
        "{}",
        recovery.condition.message
    );
    // Decided again, with the failure: back to what trained, and no trial.
    let mut again = tj.clone();
    let status = again.status.as_mut().unwrap();
    status.memory_failures = recovery.failures;
    status.workload = None;
    let c = creation(plan(
        &snapshot(&again, None, vec![]),
        &taught,
        &RenderOptions::default(),
    ));
    let back = c.resolution.unwrap();
    assert!(
        back.trial.is_none() && c.trial.is_none(),
        "{}",
        back.summary()
    );
    assert_eq!(back.placement, fallback, "{}", back.summary());
}

#[test]
fn kueue_suspends_then_admits_and_the_job_says_so() {
    let mut tj = job("queued");
    tj.metadata.labels =
        Some([(names::KUEUE_QUEUE_LABEL.to_string(), "team-a".to_string())].into());
    let view = view(h200(), profile(), None);
    let c = creation(plan(
        &snapshot(&tj, None, vec![]),
        &view,
        &RenderOptions::default(),
    ));
    let (tj, mut workload) = created(&tj, &c);
    workload.spec.as_mut().unwrap().suspend = Some(true);
    let mut snap = snapshot(&tj, Some(&workload), vec![]);
    snap.kueue_says = Some("insufficient quota".into());
    let f = following(plan(&snap, &view, &RenderOptions::default()));
    let part = f.status.expect("the workload part changes");
    assert_eq!(part.phase, JobPhase::Queued);
    let admitted = part.admitted.as_ref().unwrap();
    assert_eq!(
        (admitted.status.as_str(), admitted.reason.as_str()),
        ("False", "Queued")
    );
    assert!(admitted.message.contains("insufficient quota"));
    assert!(f.next.is_some(), "a queued job is looked at again");
    // Admitted: the Job runs.
    let mut written = tj.clone();
    let status = written.status.as_mut().unwrap();
    status.phase = Some(part.phase);
    for c in part.conditions() {
        conditions::set(&mut status.conditions, c.clone());
    }
    workload.spec.as_mut().unwrap().suspend = Some(false);
    let f = following(plan(
        &snapshot(&written, Some(&workload), vec![]),
        &view,
        &RenderOptions::default(),
    ));
    let admitted = f.status.unwrap().admitted.unwrap();
    assert_eq!(
        (admitted.status.as_str(), admitted.reason.as_str()),
        ("True", "Admitted")
    );
    assert!(f.next.is_none());
}

#[test]
fn a_node_deleted_under_a_running_job_leaves_its_decision_alone() {
    let tj = job("running");
    let c = creation(plan(
        &snapshot(&tj, None, vec![]),
        &view(h200(), profile(), None),
        &RenderOptions::default(),
    ));
    let (tj, workload) = created(&tj, &c);
    let gone = view(Vec::new(), profile(), None);
    let f = following(plan(
        &snapshot(&tj, Some(&workload), vec![]),
        &gone,
        &RenderOptions::default(),
    ));
    assert!(f.restore.is_none() && f.recovery.is_none() && f.lessons.is_empty());
    // Only the workload part is written (its phase and conditions), never the decision.
    if let Some(part) = f.status {
        assert_eq!(
            part.workload.as_ref().map(|w| w.job.as_str()),
            Some("running")
        );
    }
    // A Job of the job's name that it does not own is a conflict, said once.
    let mut foreign = workload.clone();
    foreign.metadata.owner_references = None;
    let f = following(plan(
        &snapshot(&tj, Some(&foreign), vec![]),
        &gone,
        &RenderOptions::default(),
    ));
    assert_eq!(f.status.unwrap().created.reason, "NameConflict");
    assert_eq!(f.events[0].reason, names::EVENT_NAME_CONFLICT);
}
