//! The reconcile against a mocked API server (tower-test, as kube-rs's controller-rs does): the
//! caches are filled in memory with recorded node reports, every request the reconcile makes is
//! answered by a stand-in that records it, and the test reads what was written and in which
//! order. Seconds, no cluster; the same paths run against the real API server in `tests/`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::ops::events::{Recorder, Reporter};
use http::{Request, Response, StatusCode};
use k8s_openapi::api::batch::v1::Job;
use kube::client::Body;
use kube::runtime::{reflector, watcher};
use kube::{Client, Resource};
use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use super::reconcile_job;
use crate::controller::Context;
use crate::ops::metrics::Metrics;
use offload_api::v1alpha1::{JobPhase, ModeSetting, OffloadProfile, TrainingJob};
use offload_testenv::fixtures;
use offload_testenv::support::controller::training_job;
use offload_testenv::support::{pool_profile, reported_node};

const NS: &str = "team";

/// One request the reconcile made.
#[derive(Debug, Clone)]
struct Call {
    method: String,
    path: String,
    body: Value,
}

impl Call {
    fn is(&self, method: &str, path_end: &str) -> bool {
        self.method == method && self.path.ends_with(path_end)
    }
}

/// The stand-in API server: a GET of the workload Job is answered from `job` (404 without one);
/// every server-side apply is answered with the object as it would be stored (the job's
/// `spec.offload` patch moves its generation on); Events are accepted.
fn answer(tj: &Value, job: Option<&Value>, call: &Call) -> (StatusCode, Value) {
    let job_path = format!("/apis/batch/v1/namespaces/{NS}/jobs/");
    let tj_path = format!("/apis/offload.dev/v1alpha1/namespaces/{NS}/trainingjobs/");
    match call.method.as_str() {
        "GET" if call.path.starts_with(&job_path) => match job {
            Some(job) => (StatusCode::OK, job.clone()),
            None => (
                StatusCode::NOT_FOUND,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                       "reason": "NotFound", "code": 404, "message": "jobs.batch not found"}),
            ),
        },
        "PATCH" if call.path.starts_with(&tj_path) => {
            let mut stored = tj.clone();
            json_patch::merge(&mut stored, &call.body);
            if !call.path.ends_with("/status") {
                let generation = tj["metadata"]["generation"].as_i64().unwrap_or(1);
                stored["metadata"]["generation"] = json!(generation + 1);
            }
            (StatusCode::OK, stored)
        }
        "PATCH" | "POST" => {
            let mut stored = call.body.clone();
            stored["metadata"]["namespace"] = json!(NS);
            stored["metadata"]["uid"] = json!("00000000-0000-0000-0000-00000000beef");
            (StatusCode::OK, stored)
        }
        _ => (
            StatusCode::NOT_FOUND,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                   "reason": "NotFound", "code": 404, "message": "not served by the stand-in"}),
        ),
    }
}

/// A client whose every request `answer` handles; the requests, in order.
fn mocked_client(tj: &TrainingJob, job: Option<&Job>) -> (Client, Arc<Mutex<Vec<Call>>>) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let recorded = calls.clone();
    let tj = serde_json::to_value(tj).unwrap();
    let job = job.map(|j| serde_json::to_value(j).unwrap());
    tokio::spawn(async move {
        while let Some((request, send)) = handle.next_request().await {
            let (parts, body) = request.into_parts();
            let bytes = body.collect_bytes().await.unwrap();
            let call = Call {
                method: parts.method.to_string(),
                path: parts.uri.path().to_string(),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            };
            let (status, reply) = answer(&tj, job.as_ref(), &call);
            recorded.lock().unwrap().push(call);
            let response = Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                .unwrap();
            send.send_response(response);
        }
    });
    (Client::new(service, NS), calls)
}

/// A store holding `objects`.
fn store<K>(objects: Vec<K>) -> reflector::Store<K>
where
    K: Resource + Clone + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, mut writer) = reflector::store();
    for object in objects {
        writer.apply_watcher_event(&watcher::Event::Apply(object));
    }
    reader
}

/// One discrete (H200) and two coherent (GH200) recorded nodes of pool `pool`.
fn mixed_pool() -> Vec<k8s_openapi::api::core::v1::Node> {
    vec![
        reported_node("h200-0", fixtures::H200_READING, "pool"),
        reported_node("gh200-0", fixtures::GH200_REFERENCE, "pool"),
        reported_node("gh200-1", fixtures::GH200_REFERENCE, "pool"),
    ]
}

/// The controller's context over `nodes` (pool `pool`), the pool's profile, and `workloads` as
/// the leader's Job cache.
fn context(
    client: Client,
    nodes: Vec<k8s_openapi::api::core::v1::Node>,
    workloads: Vec<Job>,
) -> Context {
    let profiles: Vec<OffloadProfile> = vec![pool_profile("pool", "pool", json!({}))];
    let profiles = store(profiles);
    let mut registry = Registry::default();
    Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "offload-operator".into(),
                instance: None,
            },
        ),
        client,
        metrics: Metrics::new(&mut registry),
        view: crate::cluster::view::StoreView::from_stores(profiles.clone(), store(nodes)),
        profiles,
        jobs: store(Vec::new()),
        render: Default::default(),
        workloads: Some(store(workloads)),
        pods: None,
        failed_creates: None,
    }
}

/// A TrainingJob of two one-GPU replicas under profile `pool`, as the API server stores it.
fn stored_job(name: &str, offload: Value) -> TrainingJob {
    let mut tj = training_job(
        name,
        "pool",
        json!({"name": "DeepSpeed", "version": "0.19.8"}),
        json!({"offload": offload}),
    );
    tj.metadata.namespace = Some(NS.into());
    tj.metadata.uid = Some(format!("uid-{name}"));
    tj.metadata.generation = Some(1);
    tj
}

fn calls(recorded: &Arc<Mutex<Vec<Call>>>) -> Vec<Call> {
    recorded.lock().unwrap().clone()
}

#[tokio::test]
async fn a_new_job_is_decided_patched_then_given_its_workload() {
    let tj = stored_job("llama", json!({}));
    let (client, recorded) = mocked_client(&tj, None);
    let ctx = context(client, mixed_pool(), Vec::new());
    reconcile_job(&tj, &ctx).await.unwrap();
    let calls = calls(&recorded);
    let at = |method: &str, path_end: &str| {
        calls
            .iter()
            .position(|c| c.is(method, path_end))
            .unwrap_or_else(|| panic!("no {method} …{path_end} in {calls:#?}"))
    };
    // The decision reaches spec.offload before anything that could start a pod exists.
    let spec_patch = at("PATCH", "/trainingjobs/llama");
    let job_apply = at("PATCH", "/jobs/llama");
    let status = at("PATCH", "/trainingjobs/llama/status");
    assert!(spec_patch < job_apply && job_apply < status, "{calls:#?}");
    // The decision part and the workload part, each by its own field manager (one writer per
    // field: the recovery can clear the workload reference).
    let workload = calls
        .iter()
        .rposition(|c| c.is("PATCH", "/trainingjobs/llama/status"))
        .unwrap();
    assert!(workload > status, "{calls:#?}");
    assert!(
        calls[status].body["status"].get("workload").is_none()
            && calls[status].body["status"].get("phase").is_none(),
        "{}",
        calls[status].body
    );
    let offload = &calls[spec_patch].body["spec"]["offload"];
    assert_eq!(offload["mode"], "UnifiedMemory", "{offload}");

    // The Job carries the decision in its pods' env and pins them to the coherent nodes.
    let job: Job = serde_json::from_value(calls[job_apply].body.clone()).unwrap();
    let pod = job.spec.unwrap().template.spec.unwrap();
    let env: BTreeMap<String, String> = pod.containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    assert_eq!(env["OFFLOAD_MODE"], "unified-memory");
    assert_eq!(env["USER_SETTING"], "kept");
    let terms = offload_testenv::support::required_node_terms(&pod);
    assert!(
        terms[0]
            .match_expressions
            .iter()
            .flatten()
            .any(|e| e.key == offload_api::names::LABEL_UMA),
        "{terms:?}"
    );
    // The status records the generation the spec patch produced and the workload.
    let decided = &calls[status].body["status"];
    assert_eq!(decided["observedGeneration"], 2, "{decided}");
    let part = &calls[workload].body["status"];
    assert_eq!(part["workload"]["job"], "llama", "{part}");
    assert_eq!(part["phase"], "Pending", "{part}");
    assert!(part.get("offload").is_none(), "{part}");
}

#[tokio::test]
async fn a_mode_no_node_can_run_is_held_without_a_workload() {
    // Unified memory asked for where only a discrete node exists.
    let tj = stored_job("pinned", json!({"mode": "UnifiedMemory"}));
    let (client, recorded) = mocked_client(&tj, None);
    let discrete = vec![reported_node("h200-0", fixtures::H200_READING, "pool")];
    let ctx = context(client, discrete, Vec::new());
    reconcile_job(&tj, &ctx).await.unwrap();
    let calls = calls(&recorded);
    assert!(
        !calls
            .iter()
            .any(|c| (c.path.contains("/jobs/") && c.method == "PATCH")
                || c.is("PATCH", "/trainingjobs/pinned")),
        "nothing but the status is written: {calls:#?}"
    );
    let status = calls
        .iter()
        .find(|c| c.is("PATCH", "/trainingjobs/pinned/status"))
        .unwrap_or_else(|| panic!("no status in {calls:#?}"));
    let resolved = status.body["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "OffloadResolved")
        .unwrap();
    assert_eq!(resolved["status"], "False", "{resolved}");
}

#[tokio::test]
async fn a_job_with_its_workload_is_followed_never_decided_again() {
    // First pass: the workload as the operator builds it.
    let tj = stored_job("steady", json!({}));
    let (client, recorded) = mocked_client(&tj, None);
    reconcile_job(&tj, &context(client, mixed_pool(), Vec::new()))
        .await
        .unwrap();
    let first = calls(&recorded);
    let applied = first
        .iter()
        .find(|c| c.is("PATCH", "/jobs/steady"))
        .unwrap();
    let mut job: Job = serde_json::from_value(applied.body.clone()).unwrap();
    job.metadata.namespace = Some(NS.into());
    job.status = serde_json::from_value(json!({
        "succeeded": 2,
        "conditions": [{"type": "Complete", "status": "True"}]
    }))
    .unwrap();

    // The job as stored after the first pass, with a profile that would now decide otherwise:
    // the follow writes phase and workload only.
    let mut tj = stored_job("steady", json!({"mode": "CPUCopy"}));
    tj.spec.offload.mode = ModeSetting::CpuCopy;
    let (client, recorded) = mocked_client(&tj, Some(&job));
    reconcile_job(&tj, &context(client, mixed_pool(), vec![job]))
        .await
        .unwrap();
    let calls = calls(&recorded);
    assert!(
        !calls
            .iter()
            .any(|c| c.is("PATCH", "/trainingjobs/steady") || c.path.contains("/jobs/")),
        "neither the spec nor the workload is written again: {calls:#?}"
    );
    let statuses: Vec<&Value> = calls
        .iter()
        .filter(|c| c.is("PATCH", "/trainingjobs/steady/status"))
        .map(|c| &c.body["status"])
        .collect();
    let phase = statuses
        .iter()
        .find_map(|s| serde_json::from_value::<JobPhase>(s["phase"].clone()).ok());
    assert_eq!(phase, Some(JobPhase::Succeeded), "{statuses:#?}");
    // The stored job had lost its status: the decision is restored from the workload's own
    // record of it, not made again (which would now say CPUCopy).
    let restored = statuses.iter().find(|s| s["offload"].is_object());
    assert_eq!(
        restored.map(|s| s["offload"]["mode"].clone()),
        Some(json!("UnifiedMemory")),
        "{statuses:#?}"
    );
}
