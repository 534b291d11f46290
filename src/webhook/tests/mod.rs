//! The endpoints driven in process with AdmissionReview fixtures, one module per concern.

mod envelope;
mod hostile;
mod kinds;
mod model_config;
mod profiles;
mod second_pass;
mod third_pass;
mod training_jobs;
mod trainjobs;

// The cluster view is an in-memory set of profiles and recorded nodes.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine as _;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::kinds::ApiFeatures;
use super::{ConfigSource, WebhookState, paths, router};
use crate::cluster::view::MemoryView;
use crate::index::NodeInfo;
use crate::ops::metrics::Metrics;
use offload_api::names;
use offload_api::report::NodeReport;
use offload_api::v1alpha1::OffloadProfileSpec;
use offload_testenv::fixtures;

pub(super) fn node(name: &str, fixture: &str) -> NodeInfo {
    NodeInfo::from_report(name, &NodeReport::parse(fixture).unwrap())
}

pub(super) fn app(nodes: Vec<NodeInfo>) -> axum::Router {
    app_with(nodes, ApiFeatures::default())
}

pub(super) fn app_with(nodes: Vec<NodeInfo>, features: ApiFeatures) -> axum::Router {
    app_full(nodes, features, BTreeMap::new())
}

pub(super) fn app_full(
    nodes: Vec<NodeInfo>,
    features: ApiFeatures,
    configs: BTreeMap<String, String>,
) -> axum::Router {
    let mut registry = Registry::default();
    let view = MemoryView {
        features,
        ..MemoryView::new(
            nodes,
            BTreeMap::from([("default".to_string(), OffloadProfileSpec::default())]),
        )
    };
    router(WebhookState {
        view: Arc::new(view),
        metrics: Metrics::new(&mut registry),
        configs: ConfigSource::Memory(configs),
        events: None,
    })
}

pub(super) fn coherent_cluster() -> axum::Router {
    app(vec![
        node("gh200-0", fixtures::GH200_REFERENCE),
        node("gh200-1", fixtures::GH200_REFERENCE),
    ])
}

pub(super) fn discrete_cluster() -> axum::Router {
    app(vec![node("h200-0", fixtures::H200_READING)])
}

pub(super) fn review(
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

pub(super) async fn post(app: axum::Router, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
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

/// The message of a denial; fails the test when `r` allowed the object.
pub(super) fn denial(r: &Value) -> &str {
    assert_eq!(r["allowed"], false, "{r}");
    r["status"]["message"].as_str().unwrap_or_default()
}

/// A review creating OffloadProfile `p` with `spec`.
pub(super) fn profile_review(spec: Value) -> Value {
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

/// The validating webhook's answer to creating TrainingJob `tj` in `app`'s cluster.
pub(super) async fn validate_new(app: axum::Router, tj: Value) -> Value {
    admit(
        app,
        paths::VALIDATE_TRAINING_JOB,
        tj_review("CREATE", tj, None),
    )
    .await
}

pub(super) async fn admit(app: axum::Router, path: &str, review: Value) -> Value {
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
pub(super) fn patch_of(response: &Value) -> Vec<Value> {
    let bytes: Vec<u8> = match &response["patch"] {
        Value::String(encoded) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap(),
        other => panic!("no base64 patch in the response: {other}"),
    };
    serde_json::from_slice(&bytes).unwrap()
}

/// Applies the response's JSON patch to `object`.
pub(super) fn patched(object: &Value, response: &Value) -> Value {
    let mut doc = object.clone();
    let patch: json_patch::Patch =
        serde_json::from_value(Value::Array(patch_of(response))).unwrap();
    json_patch::patch(&mut doc, &patch).unwrap();
    doc
}

pub(super) fn training_job(offload: Value, framework: Value) -> Value {
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

pub(super) fn tj_review(op: &str, object: Value, old: Option<Value>) -> Value {
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
