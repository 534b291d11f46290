//! In-process router tests: realistic AdmissionReview bodies for every endpoint and kind, and
//! malformed ones. The cluster view is an in-memory set of profiles and recorded nodes.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine as _;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::admit::ClusterView;
use super::{WebhookState, paths, router};
use crate::api::OffloadProfileSpec;
use crate::index::{NodeIndex, NodeInfo};
use crate::metrics::Metrics;
use crate::names;
use crate::report::NodeReport;
use offload_testenv::fixtures;

struct InMemoryView {
    profiles: BTreeMap<String, OffloadProfileSpec>,
    nodes: Arc<NodeIndex>,
}

impl ClusterView for InMemoryView {
    fn profile(&self, name: &str) -> Option<OffloadProfileSpec> {
        self.profiles.get(name).cloned()
    }
    fn nodes(&self) -> Arc<NodeIndex> {
        self.nodes.clone()
    }
}

fn node(name: &str, fixture: &str) -> NodeInfo {
    let r = NodeReport::parse(fixture).unwrap();
    NodeInfo::from_metadata(
        name,
        r.labels(),
        &BTreeMap::from([(
            names::ANNOTATION_NODE_REPORT.to_string(),
            fixture.to_string(),
        )]),
    )
}

fn app(nodes: Vec<NodeInfo>) -> axum::Router {
    let mut registry = Registry::default();
    let view = InMemoryView {
        profiles: BTreeMap::from([("default".to_string(), OffloadProfileSpec::default())]),
        nodes: Arc::new(NodeIndex::new(nodes)),
    };
    router(WebhookState {
        view: Arc::new(view),
        metrics: Metrics::new(&mut registry),
    })
}

fn coherent_cluster() -> axum::Router {
    app(vec![
        node("gh200-0", fixtures::GH200_REFERENCE),
        node("gh200-1", fixtures::GH200_REFERENCE),
    ])
}

fn discrete_cluster() -> axum::Router {
    app(vec![node("h200-0", fixtures::H200_READING)])
}

fn review(
    group: &str,
    version: &str,
    kind: &str,
    resource: &str,
    op: &str,
    object: Value,
    old: Option<Value>,
) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "requestKind": {"group": group, "version": version, "kind": kind},
            "requestResource": {"group": group, "version": version, "resource": resource},
            "name": object.pointer("/metadata/name").cloned().unwrap_or(Value::Null),
            "namespace": "team-a",
            "operation": op,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

async fn post(app: axum::Router, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let res = app
        .oneshot(
            Request::post(path)
                .header("content-type", "application/json")
                .body(Body::from(body))
                .unwrap(),
        )
        .await
        .unwrap();
    let status = res.status();
    let bytes = axum::body::to_bytes(res.into_body(), 64 << 20)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn admit(app: axum::Router, path: &str, review: Value) -> Value {
    let (status, body) = post(app, path, serde_json::to_vec(&review).unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let response = body["response"].clone();
    assert_eq!(
        response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002",
        "the uid is kept"
    );
    response
}

/// The patch: a base64 string, as the API documents `response.patch` (Go's `[]byte`).
fn patch_of(response: &Value) -> Vec<Value> {
    let bytes: Vec<u8> = match &response["patch"] {
        Value::String(encoded) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap(),
        other => panic!("no base64 patch in the response: {other}"),
    };
    serde_json::from_slice(&bytes).unwrap()
}

/// Applies the response's JSON patch to `object`.
fn patched(object: &Value, response: &Value) -> Value {
    let mut doc = object.clone();
    let patch: json_patch::Patch =
        serde_json::from_value(Value::Array(patch_of(response))).unwrap();
    json_patch::patch(&mut doc, &patch).unwrap();
    doc
}

fn training_job(offload: Value, framework: Value) -> Value {
    json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": "llama", "namespace": "team-a", "annotations": {"offload.dev/profile": "auto"}},
        "spec": {
            "replicas": 1,
            "framework": framework,
            "offload": offload,
            "template": {"spec": {"containers": [{"name": "train", "image": "train:1"}]}}
        }
    })
}

fn tj_review(op: &str, object: Value, old: Option<Value>) -> Value {
    review(
        "offload.dev",
        "v1alpha1",
        "TrainingJob",
        "trainingjobs",
        op,
        object,
        old,
    )
}

// ---- malformed bodies ------------------------------------------------------------------------

#[tokio::test]
async fn unreadable_envelopes_get_400_with_a_json_error() {
    for path in [
        paths::VALIDATE_TRAINING_JOB,
        paths::VALIDATE_PROFILE,
        paths::MUTATE_TRAINING_JOB,
        paths::MUTATE_WORKLOAD,
        paths::MUTATE_POD,
    ] {
        for body in [
            b"".to_vec(),
            b"not json".to_vec(),
            b"{\"apiVersion\": 3}".to_vec(),
            b"[1,2]".to_vec(),
            vec![0xff, 0xfe, 0x00],
        ] {
            let (status, json) = post(coherent_cluster(), path, body.clone()).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body:?}");
            assert!(
                json["error"].as_str().unwrap().contains("AdmissionReview"),
                "{json}"
            );
        }
        // A review without a request.
        let (status, json) = post(
            coherent_cluster(),
            path,
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");
    }
}

#[tokio::test]
async fn garbage_inside_a_readable_envelope_is_denied_with_the_uid_kept() {
    let bad = json!({"apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "x"}, "spec": {"framework": {"name": "Caffe"}}});
    let r = admit(
        coherent_cluster(),
        paths::VALIDATE_TRAINING_JOB,
        tj_review("CREATE", bad, None),
    )
    .await;
    assert_eq!(r["allowed"], false);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("TrainingJob is invalid"),
        "{r}"
    );
    let bad_pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": "nope"}});
    let r = admit(
        coherent_cluster(),
        paths::MUTATE_POD,
        review("", "v1", "Pod", "pods", "CREATE", bad_pod, None),
    )
    .await;
    assert_eq!(r["allowed"], false);
}

// ---- TrainingJob -----------------------------------------------------------------------------

#[tokio::test]
async fn a_valid_training_job_is_admitted() {
    let tj = training_job(
        json!({"mode": "Auto"}),
        json!({"name": "DeepSpeed", "version": "0.19.8"}),
    );
    let r = admit(
        coherent_cluster(),
        paths::VALIDATE_TRAINING_JOB,
        tj_review("CREATE", tj, None),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");
    assert!(r.get("warnings").is_none_or(Value::is_null));
}

#[tokio::test]
async fn a_framework_that_cannot_take_the_request_is_denied_with_what_to_change() {
    let tj = training_job(
        json!({"offloadRatio": "0.5"}),
        json!({"name": "FSDP", "version": "2.7.1"}),
    );
    let r = admit(
        discrete_cluster(),
        paths::VALIDATE_TRAINING_JOB,
        tj_review("CREATE", tj, None),
    )
    .await;
    assert_eq!(r["allowed"], false);
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("FSDP has no partial-offload switch")
            && msg.contains("set offload.offloadRatio to 1 or Auto"),
        "{msg}"
    );

    let tj = training_job(json!({}), json!({"name": "DeepSpeed", "version": "0.9.0"}));
    let r = admit(
        discrete_cluster(),
        paths::VALIDATE_TRAINING_JOB,
        tj_review("CREATE", tj, None),
    )
    .await;
    assert_eq!(r["allowed"], false);
    assert!(r["status"]["message"].as_str().unwrap().contains("0.10.0"));
}

#[tokio::test]
async fn unified_memory_without_coherent_nodes_is_admitted_with_a_warning() {
    let tj = training_job(json!({"mode": "UnifiedMemory"}), json!({"name": "Generic"}));
    let r = admit(
        discrete_cluster(),
        paths::VALIDATE_TRAINING_JOB,
        tj_review("CREATE", tj, None),
    )
    .await;
    assert_eq!(r["allowed"], true);
    let warning = r["warnings"][0].as_str().unwrap();
    assert!(
        warning.contains("needs a hardware-coherent node"),
        "{warning}"
    );
}

#[tokio::test]
async fn a_running_job_cannot_be_reconfigured() {
    let mut old = training_job(
        json!({"mode": "CPUCopy", "overlap": "Enabled", "offloadRatio": "1", "pinMemory": "Enabled"}),
        json!({"name": "Generic"}),
    );
    old["status"] = json!({"workload": {"job": "llama", "service": "llama"}});
    let mut new = old.clone();
    new["spec"]["offload"]["mode"] = json!("Disabled");
    let r = admit(
        discrete_cluster(),
        paths::VALIDATE_TRAINING_JOB,
        tj_review("UPDATE", new, Some(old.clone())),
    )
    .await;
    assert_eq!(r["allowed"], false);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("spec.offload cannot change once the workload exists")
    );
    // Metadata-only changes pass.
    let mut labelled = old.clone();
    labelled["metadata"]["labels"] = json!({"team": "a"});
    let r = admit(
        discrete_cluster(),
        paths::VALIDATE_TRAINING_JOB,
        tj_review("UPDATE", labelled, Some(old)),
    )
    .await;
    assert_eq!(r["allowed"], true);
}

#[tokio::test]
async fn mutation_resolves_auto_at_creation_and_keeps_the_request() {
    let tj = training_job(
        json!({"mode": "Auto", "overlap": "Auto", "offloadRatio": "Auto", "pinMemory": "Auto"}),
        json!({"name": "DeepSpeed", "version": "0.19.8"}),
    );
    let r = admit(
        coherent_cluster(),
        paths::MUTATE_TRAINING_JOB,
        tj_review("CREATE", tj.clone(), None),
    )
    .await;
    assert_eq!(r["allowed"], true);
    for op in patch_of(&r) {
        let path = op["path"].as_str().unwrap();
        assert!(
            path.starts_with("/spec/offload") || path.starts_with("/metadata/annotations"),
            "{op}"
        );
    }
    let out = patched(&tj, &r);
    assert_eq!(
        out["spec"]["offload"],
        json!({"mode": "UnifiedMemory", "overlap": "Enabled", "offloadRatio": "1", "pinMemory": "Enabled"})
    );
    // The original request is kept, beside what was written, so the controller explains the
    // decision from it for as long as the spec holds what the webhook wrote.
    let record: Value = serde_json::from_str(
        out["metadata"]["annotations"][names::ANNOTATION_REQUESTED]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(record["requested"]["mode"], "Auto");
    assert_eq!(record["wrote"], out["spec"]["offload"]);
    // Re-invocation on the mutated object changes nothing.
    let again = admit(
        coherent_cluster(),
        paths::MUTATE_TRAINING_JOB,
        tj_review("CREATE", out, None),
    )
    .await;
    assert!(again.get("patch").is_none_or(Value::is_null), "{again}");
}

// ---- OffloadProfile --------------------------------------------------------------------------

fn profile_review(spec: Value) -> Value {
    review(
        "offload.dev",
        "v1alpha1",
        "OffloadProfile",
        "offloadprofiles",
        "CREATE",
        json!({"apiVersion": "offload.dev/v1alpha1", "kind": "OffloadProfile", "metadata": {"name": "p"}, "spec": spec}),
        None,
    )
}

#[tokio::test]
async fn profiles_with_bad_or_empty_selectors() {
    let r = admit(
        coherent_cluster(),
        paths::VALIDATE_PROFILE,
        profile_review(
            json!({"nodeSelector": {"matchExpressions": [{"key": "pool", "operator": "Near"}]}}),
        ),
    )
    .await;
    assert_eq!(r["allowed"], false);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("spec.nodeSelector is not a valid label selector")
    );
    let r = admit(
        coherent_cluster(),
        paths::VALIDATE_PROFILE,
        profile_review(json!({"nodeSelector": {"matchLabels": {"pool": "nowhere"}}})),
    )
    .await;
    assert_eq!(r["allowed"], true);
    assert!(
        r["warnings"][0]
            .as_str()
            .unwrap()
            .contains("matches none of the 2 GPU node(s)")
    );
    let r = admit(
        coherent_cluster(),
        paths::VALIDATE_PROFILE,
        profile_review(json!({"mode": "Auto"})),
    )
    .await;
    assert_eq!(r["allowed"], true);
}

// ---- other kinds and Pods --------------------------------------------------------------------

fn container() -> Value {
    json!({"name": "train", "image": "train:1", "env": [{"name": "KEEP", "value": "me"}], "resources": {"limits": {"nvidia.com/gpu": "1"}}})
}

fn opted_meta(name: &str) -> Value {
    json!({"name": name, "namespace": "team-a", "labels": {"offload.dev/profile": "auto"}, "annotations": {"offload.dev/framework": "Generic"}})
}

fn env_of(template: &Value) -> BTreeMap<String, String> {
    template["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["value"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn assert_configured(template: &Value, mode: &str) {
    let env = env_of(template);
    assert_eq!(env["OFFLOAD_MODE"], mode, "{template}");
    assert_eq!(env["KEEP"], "me");
    let exprs = &template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0]["matchExpressions"];
    assert!(
        exprs
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["key"] == names::LABEL_UMA),
        "{exprs}"
    );
}

#[tokio::test]
async fn batch_jobs_are_configured_once() {
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": opted_meta("j"),
        "spec": {"parallelism": 2, "template": {"spec": {"restartPolicy": "Never", "containers": [container()]}}}});
    let r = admit(
        coherent_cluster(),
        paths::MUTATE_WORKLOAD,
        review("batch", "v1", "Job", "jobs", "CREATE", job.clone(), None),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");
    let out = patched(&job, &r);
    assert_configured(&out["spec"]["template"], "unified-memory");
    assert!(
        out["metadata"]["annotations"][names::ANNOTATION_RESOLVED]
            .as_str()
            .unwrap()
            .contains("mode=UnifiedMemory")
    );
    let again = admit(
        coherent_cluster(),
        paths::MUTATE_WORKLOAD,
        review("batch", "v1", "Job", "jobs", "CREATE", out, None),
    )
    .await;
    assert!(
        again.get("patch").is_none_or(Value::is_null),
        "re-invocation adds nothing: {again}"
    );
}

#[tokio::test]
async fn jobsets_pytorchjobs_and_trainjobs_are_configured() {
    let jobset = json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": opted_meta("js"),
    "spec": {"replicatedJobs": [
        {"name": "leader", "replicas": 1, "template": {"spec": {"template": {"spec": {"containers": [container()]}}}}},
        {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 2, "template": {"spec": {"containers": [container()]}}}}}
    ]}});
    let r = admit(
        discrete_cluster(),
        paths::MUTATE_WORKLOAD,
        review(
            "jobset.x-k8s.io",
            "v1alpha2",
            "JobSet",
            "jobsets",
            "CREATE",
            jobset.clone(),
            None,
        ),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");
    let out = patched(&jobset, &r);
    for i in 0..2 {
        assert_configured(
            &out["spec"]["replicatedJobs"][i]["template"]["spec"]["template"],
            "cpu-copy",
        );
    }

    let ptj = json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": opted_meta("pt"),
    "spec": {"pytorchReplicaSpecs": {
        "Master": {"replicas": 1, "template": {"spec": {"containers": [container()]}}},
        "Worker": {"replicas": 3, "template": {"spec": {"containers": [container()]}}}
    }}});
    let r = admit(
        coherent_cluster(),
        paths::MUTATE_WORKLOAD,
        review(
            "kubeflow.org",
            "v1",
            "PyTorchJob",
            "pytorchjobs",
            "CREATE",
            ptj.clone(),
            None,
        ),
    )
    .await;
    // Four pods, two coherent GPUs: the only class still wins, pods wait for capacity.
    assert_eq!(r["allowed"], true, "{r}");
    let out = patched(&ptj, &r);
    assert_configured(
        &out["spec"]["pytorchReplicaSpecs"]["Master"]["template"],
        "unified-memory",
    );
    assert_configured(
        &out["spec"]["pytorchReplicaSpecs"]["Worker"]["template"],
        "unified-memory",
    );

    let tj = json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": opted_meta("tj"),
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 1, "env": [{"name": "KEEP", "value": "me"}]}}});
    let r = admit(
        coherent_cluster(),
        paths::MUTATE_WORKLOAD,
        review(
            "trainer.kubeflow.org",
            "v1alpha1",
            "TrainJob",
            "trainjobs",
            "CREATE",
            tj.clone(),
            None,
        ),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");
    let out = patched(&tj, &r);
    let env: Vec<&str> = out["spec"]["trainer"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(
        env.contains(&"KEEP") && env.contains(&"OFFLOAD_MODE"),
        "{env:?}"
    );
    let ov = &out["spec"]["podTemplateOverrides"][0];
    assert_eq!(ov["targetJobs"][0]["name"], "node");
    assert!(ov["spec"]["affinity"]["nodeAffinity"].is_object());
}

#[tokio::test]
async fn pods_are_the_last_safety_net() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": opted_meta("p"), "spec": {"containers": [container()]}});
    let r = admit(
        discrete_cluster(),
        paths::MUTATE_POD,
        review("", "v1", "Pod", "pods", "CREATE", pod.clone(), None),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");
    let out = patched(&pod, &r);
    assert_configured(&out, "cpu-copy");
    // An already configured pod passes unchanged.
    let r = admit(
        discrete_cluster(),
        paths::MUTATE_POD,
        review("", "v1", "Pod", "pods", "CREATE", out, None),
    )
    .await;
    assert!(r.get("patch").is_none_or(Value::is_null));
}

#[tokio::test]
async fn objects_that_cannot_be_configured_are_refused_with_the_reason() {
    let cases = [
        (
            "annotations",
            "offload.dev/mode",
            "UnifiedMemory",
            "needs a hardware-coherent node",
        ),
        (
            "annotations",
            "offload.dev/mode",
            "Sometimes",
            "annotation offload.dev/mode",
        ),
        (
            "labels",
            "offload.dev/profile",
            "missing",
            "OffloadProfile \"missing\" does not exist",
        ),
    ];
    for (map, key, value, expected) in cases {
        let mut meta = opted_meta("p");
        meta[map][key] = json!(value);
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [container()]}});
        let r = admit(
            discrete_cluster(),
            paths::MUTATE_POD,
            review("", "v1", "Pod", "pods", "CREATE", pod, None),
        )
        .await;
        assert_eq!(r["allowed"], false, "{map} {key}={value}: {r}");
        let message = r["status"]["message"].as_str().unwrap();
        assert!(message.contains(expected), "{map} {key}={value}: {message}");
    }

    let unknown = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": opted_meta("d"), "spec": {}});
    let r = admit(
        discrete_cluster(),
        paths::MUTATE_WORKLOAD,
        review(
            "apps",
            "v1",
            "Deployment",
            "deployments",
            "CREATE",
            unknown,
            None,
        ),
    )
    .await;
    assert_eq!(r["allowed"], false);
}

/// Job sizes crafted to overflow (JobSet's schema allows 5 × (2³¹−1) × (2³¹−1) pods, or any
/// unsigned 64-bit count before validation) get a clear denial naming the field; the handler
/// answered nothing before, closing the connection on an arithmetic overflow.
#[tokio::test]
async fn crafted_job_sizes_are_denied_with_the_field_named() {
    let max = i64::from(i32::MAX);
    let template =
        json!({"spec": {"parallelism": max, "template": {"spec": {"containers": [container()]}}}});
    let cases = [
        (
            ("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
            json!({"replicatedJobs": [
                {"name": "a", "replicas": 5, "template": template},
                {"name": "b", "replicas": max, "template": template}
            ]}),
            "/spec/replicatedJobs",
        ),
        (
            ("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets"),
            json!({"replicatedJobs": [{"name": "a", "replicas": u64::MAX, "template":
                {"spec": {"parallelism": u64::MAX, "template": {"spec": {"containers": [container()]}}}}}]}),
            "/spec/replicatedJobs",
        ),
        (
            ("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs"),
            json!({"pytorchReplicaSpecs": {
                "Master": {"replicas": u64::MAX, "template": {"spec": {"containers": [container()]}}},
                "Worker": {"replicas": u64::MAX, "template": {"spec": {"containers": [container()]}}}}}),
            "/spec/pytorchReplicaSpecs",
        ),
        (
            ("batch", "v1", "Job", "jobs"),
            json!({"parallelism": -3, "template": {"spec": {"containers": [container()]}}}),
            "/spec/parallelism",
        ),
    ];
    for ((group, version, kind, resource), spec, field) in cases {
        let obj = json!({"apiVersion": format!("{group}/{version}"), "kind": kind,
                         "metadata": opted_meta("big"), "spec": spec});
        let r = admit(
            discrete_cluster(),
            paths::MUTATE_WORKLOAD,
            review(group, version, kind, resource, "CREATE", obj, None),
        )
        .await;
        assert_eq!(r["allowed"], false, "{kind}: {r}");
        let message = r["status"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{kind}: {message}");
    }
}

/// An UPDATE review carries the old and the new object; for a TrainingJob near the API
/// server's object size limit that is well over 2 MiB, which the webhook refused with 413.
#[tokio::test]
async fn reviews_as_large_as_the_api_server_sends_are_read() {
    let mut tj = training_job(json!({}), json!({"name": "Generic"}));
    tj["spec"]["template"]["spec"]["containers"][0]["env"] =
        json!([{"name": "BIG", "value": "x".repeat(1_500_000)}]);
    let body = serde_json::to_vec(&tj_review("UPDATE", tj.clone(), Some(tj))).unwrap();
    assert!(body.len() > 3_000_000, "{} bytes", body.len());
    let (status, answer) = post(discrete_cluster(), paths::VALIDATE_TRAINING_JOB, body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
}

/// Objects without the opt-in label pass unchanged even where a webhook configuration sends
/// them (the configurations select by the label; the handler does not rely on it).
#[tokio::test]
async fn unlabelled_objects_are_never_configured() {
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
                     "spec": {"template": {"spec": {"containers": [container()]}}}});
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                     "spec": {"containers": [container()]}});
    for (path, r) in [
        (
            paths::MUTATE_WORKLOAD,
            review("batch", "v1", "Job", "jobs", "CREATE", job, None),
        ),
        (
            paths::MUTATE_POD,
            review("", "v1", "Pod", "pods", "CREATE", pod, None),
        ),
    ] {
        let r = admit(discrete_cluster(), path, r).await;
        assert_eq!(r["allowed"], true, "{path}: {r}");
        assert!(r.get("patch").is_none_or(Value::is_null), "{path}: {r}");
    }
}
