//! `offload-bench admission`: the admission handlers in process (no TLS, no HTTP), by cluster
//! size: what a request costs the operator's CPU when it needs a decision over every reported
//! node, and when it does not; and the whole of the webhook's request handling (the router, the
//! review read from its bytes, the answer written) for a review as kube-apiserver sends it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview};
use offload_api::report::NodeReport;
use offload_api::v1alpha1::OffloadProfileSpec;
use offload_operator::cluster::view::MemoryView;
use offload_operator::index::NodeInfo;
use offload_operator::ops::metrics::Metrics;
use offload_operator::webhook::admit::{self, Review, Verdict};
use offload_operator::webhook::{ConfigSource, WebhookState, paths, router};
use offload_testenv::fixtures;
use serde_json::json;

use super::error::{BenchError, Result};
use super::measure::machine;

/// `nodes` recorded nodes, half coherent and half discrete, and the default profile.
pub fn fixed_view(nodes: usize) -> Result<MemoryView> {
    let mut out = Vec::with_capacity(nodes);
    for i in 0..nodes {
        let (name, fixture) = if i % 2 == 0 {
            (format!("gh200-{i}"), fixtures::GH200_REFERENCE)
        } else {
            (format!("h200-{i}"), fixtures::H200_READING)
        };
        let report = NodeReport::parse(fixture)
            .map_err(|e| BenchError::unexpected(format!("fixture: {e}")))?;
        out.push(NodeInfo::from_report(name, &report));
    }
    Ok(MemoryView::new(
        out,
        BTreeMap::from([("default".to_string(), OffloadProfileSpec::default())]),
    ))
}

/// An admission request of a CREATE.
pub fn admission_request(
    kind: (&str, &str, &str, &str),
    object: serde_json::Value,
) -> Result<AdmissionRequest<DynamicObject>> {
    let (group, version, kind, resource) = kind;
    let review: AdmissionReview<DynamicObject> = serde_json::from_value(json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "00000000-0000-0000-0000-000000000001",
                    "kind": {"group": group, "version": version, "kind": kind},
                    "resource": {"group": group, "version": version, "resource": resource},
                    "namespace": "bench", "operation": "CREATE",
                    "userInfo": {"username": "bench"}, "object": object}
    }))?;
    review
        .try_into()
        .map_err(|e| BenchError::unexpected(format!("{e}")))
}

type Handler = fn(&AdmissionRequest<DynamicObject>, &Review) -> Verdict;

/// Times the handlers for each cluster size.
pub fn run(node_counts: &[usize], iterations: u32) -> Result<()> {
    println!("# admission handlers in process ({})", machine());
    println!(
        "\n{iterations} requests per cell, one thread; µs per request (requests/s on one core)\n"
    );
    println!(
        "| reported nodes | bare Pod (decision) | batch Job (decision) | Pod from a configured template (no decision) | batch Job as the API server sends it, body to answer (decision) |"
    );
    println!("|---|---|---|---|---|");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let labels = json!({"offload.dev/profile": "default"});
    let container = json!({"name": "train", "image": "train:1",
                           "resources": {"limits": {"nvidia.com/gpu": "1"}}});
    let bare = admission_request(
        ("", "v1", "Pod", "pods"),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "p", "namespace": "bench", "labels": labels},
               "spec": {"containers": [container]}}),
    )?;
    let job = admission_request(
        ("batch", "v1", "Job", "jobs"),
        json!({"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": "j", "namespace": "bench", "labels": labels},
               "spec": {"parallelism": 4, "completions": 4,
                        "template": {"metadata": {"labels": labels},
                                     "spec": {"restartPolicy": "Never", "containers": [container]}}}}),
    )?;
    for &nodes in node_counts {
        let view = fixed_view(nodes)?;
        // The pod a configured template produces: the bare pod with the webhook's patch applied.
        let review = Review::new(&view);
        let answer = admit::mutate_pod(&bare, &review).response;
        let patch: json_patch::Patch = answer
            .patch
            .as_deref()
            .and_then(|p| serde_json::from_slice(p).ok())
            .ok_or_else(|| BenchError::unexpected("the bare pod was not mutated"))?;
        let mut configured_pod = serde_json::to_value(bare.object.as_ref())?;
        json_patch::patch(&mut configured_pod, &patch)?;
        let configured = admission_request(("", "v1", "Pod", "pods"), configured_pod)?;
        let time =
            |req: &AdmissionRequest<DynamicObject>, f: Handler, patched: bool| -> Result<String> {
                let t = Instant::now();
                for _ in 0..iterations {
                    let v = f(req, &review);
                    if !v.response.allowed || v.response.patch.is_some() != patched {
                        return Err(BenchError::unexpected(format!(
                            "unexpected answer: {:?}",
                            v.response.result.message
                        )));
                    }
                }
                let us = t.elapsed().as_secs_f64() * 1e6 / f64::from(iterations);
                Ok(format!("{us:.1} ({:.0}/s)", 1e6 / us))
            };
        let served = runtime.block_on(time_router(fixed_view(nodes)?, iterations))?;
        println!(
            "| {nodes} | {} | {} | {} | {served} |",
            time(&bare, admit::mutate_pod, true)?,
            time(&job, admit::mutate_workload, true)?,
            time(&configured, admit::mutate_pod, false)?
        );
    }
    Ok(())
}

/// The webhook's router answering the recorded batch Job review `iterations` times: what one
/// request costs from its body to the answer's bytes (no TLS, no connection, no Event sent).
async fn time_router(view: MemoryView, iterations: u32) -> Result<String> {
    let mut registry = prometheus_client::registry::Registry::default();
    let app = router(WebhookState {
        view: Arc::new(view),
        metrics: Metrics::new(&mut registry),
        configs: ConfigSource::None,
        events: None,
    });
    let body = bytes::Bytes::from_static(fixtures::BATCH_JOB_REVIEW.as_bytes());
    let t = Instant::now();
    for _ in 0..iterations {
        let request = Request::post(paths::MUTATE_WORKLOAD)
            .header("content-type", "application/json")
            .body(Body::from(body.clone()))
            .map_err(|e| BenchError::unexpected(e.to_string()))?;
        let answer = app
            .clone()
            .oneshot(request)
            .await
            .map_err(|e| BenchError::unexpected(e.to_string()))?;
        let status = answer.status();
        let bytes = answer
            .into_body()
            .collect()
            .await
            .map_err(|e| BenchError::unexpected(e.to_string()))?
            .to_bytes();
        let review: serde_json::Value = serde_json::from_slice(&bytes)?;
        let patched = review.pointer("/response/allowed") == Some(&json!(true))
            && review.pointer("/response/patch").is_some();
        if status != StatusCode::OK || !patched {
            return Err(BenchError::unexpected(format!(
                "the recorded batch Job was not configured: {status} {review}"
            )));
        }
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / f64::from(iterations);
    Ok(format!("{us:.1} ({:.0}/s)", 1e6 / us))
}
