//! `offload-bench noop-operator`: the peer of `offload-bench scale --peer noop`. An operator
//! that decides nothing but makes the API requests the operator makes for each TrainingJob —
//! server-side applies of the job's ConfigMap, Service and workload Job, its status, an Event —
//! and answers every admission request over the operator's own TLS (the same certificates,
//! published the same way) without looking at it. Against it the burst measures what the API
//! server, etcd and kwok cost on this machine, apart from the operator's decisions.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use offload_api::names;
use offload_api::v1alpha1::TrainingJob;
use offload_operator::webhook::tls::ManagedCerts;
use offload_operator::webhook::{CertMode, WebhookOptions, serve_router};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::error::{BenchError, Result};

const MANAGER: &str = "offload-noop-peer";
/// TrainingJobs worked on at once.
const CONCURRENCY: usize = 16;

/// What the admission answers took, for the bench's `handler_seconds` (the operator's metric
/// name, so the bench reads both alike).
#[derive(Default)]
struct Handled {
    nanos: AtomicU64,
    count: AtomicU64,
}

/// Runs the peer until killed: the webhook on `webhook_addr`, `/readyz` and `/metrics` on
/// `admin_addr`, the certificates' Secret in `namespace`.
pub async fn run(
    webhook_addr: SocketAddr,
    admin_addr: SocketAddr,
    namespace: String,
) -> Result<()> {
    let client = kube::Client::try_default().await?;
    let handled = Arc::new(Handled::default());
    let ready = Arc::new(AtomicBool::new(false));

    let admission = Router::new().fallback(answer).with_state(handled.clone());
    let options = WebhookOptions {
        addr: webhook_addr,
        certs: CertMode::Managed(ManagedCerts::chart(&namespace, vec!["127.0.0.1".into()])),
        check_interval: Duration::from_secs(3600),
    };
    let (_rotator, _addr, webhook) =
        serve_router(client.clone(), options, admission, CancellationToken::new())
            .await
            .map_err(|e| BenchError::unexpected(format!("peer webhook: {e}")))?;

    let admin = Router::new()
        .route("/readyz", get(readyz))
        .with_state(ready.clone())
        .merge(
            Router::new()
                .route("/metrics", get(metrics))
                .with_state(handled),
        );
    let listener = tokio::net::TcpListener::bind(admin_addr).await?;
    let admin = async move {
        let _ = axum::serve(listener, admin).await;
    };

    let jobs: Api<TrainingJob> = Api::all(client.clone());
    let controller = async move {
        let stream = watcher(jobs, watcher::Config::default()).default_backoff();
        let seen = Arc::new(std::sync::Mutex::new(
            std::collections::HashSet::<String>::new(),
        ));
        stream
            .filter_map(|event| {
                let out = match event {
                    Ok(watcher::Event::InitDone) => {
                        ready.store(true, Ordering::Release);
                        None
                    }
                    Ok(watcher::Event::Apply(tj) | watcher::Event::InitApply(tj)) => Some(tj),
                    _ => None,
                };
                futures::future::ready(out)
            })
            .filter(|tj| {
                let key = format!("{}/{}", tj.namespace().unwrap_or_default(), tj.name_any());
                let new = seen.lock().map(|mut s| s.insert(key)).unwrap_or(false);
                futures::future::ready(new)
            })
            .for_each_concurrent(CONCURRENCY, |tj| {
                let client = client.clone();
                async move {
                    if let Err(e) = work(&client, &tj).await {
                        eprintln!("noop peer: {}: {e}", tj.name_any());
                    }
                }
            })
            .await;
    };
    tokio::join!(webhook, admin, controller);
    Ok(())
}

/// The operator's writes for one TrainingJob, with nothing decided: its ConfigMap, headless
/// Service and workload Job (the pod template as written), its status, an Event.
async fn work(client: &kube::Client, tj: &TrainingJob) -> Result<()> {
    let ns = tj.namespace().unwrap_or_default();
    let name = tj.name_any();
    let owner = tj
        .controller_owner_ref(&())
        .ok_or_else(|| BenchError::unexpected("a TrainingJob without a uid"))?;
    let labels = json!({names::LABEL_TRAINING_JOB: name});
    let meta = |n: String| json!({"name": n, "namespace": ns, "labels": labels, "ownerReferences": [owner]});
    let apply = PatchParams::apply(MANAGER).force();
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(format!("{name}-offload")),
        "data": {"ds_config.json": "{}"}
    }))?;
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .patch(&format!("{name}-offload"), &apply, &Patch::Apply(&cm))
        .await?;
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": meta(name.clone()),
        "spec": {"clusterIP": "None", "selector": labels}
    }))?;
    Api::<Service>::namespaced(client.clone(), &ns)
        .patch(&name, &apply, &Patch::Apply(&svc))
        .await?;
    let mut template = serde_json::to_value(&tj.spec.template)?;
    template["metadata"]["labels"][names::LABEL_TRAINING_JOB] = json!(name);
    if template["spec"]["restartPolicy"].is_null() {
        template["spec"]["restartPolicy"] = json!("Never");
    }
    let replicas = tj.spec.replicas;
    let job: Job = serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": meta(name.clone()),
        "spec": {"completions": replicas, "parallelism": replicas, "completionMode": "Indexed",
                 "template": template}
    }))?;
    Api::<Job>::namespaced(client.clone(), &ns)
        .patch(&name, &apply, &Patch::Apply(&job))
        .await?;
    let status = json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name},
        "status": {"observedGeneration": tj.meta().generation}
    });
    Api::<TrainingJob>::namespaced(client.clone(), &ns)
        .patch_status(&name, &apply, &Patch::Apply(&status))
        .await?;
    let now = jiff::Timestamp::now().to_string();
    let event: Event = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": format!("{name}."), "namespace": ns},
        "involvedObject": {"apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
                           "name": name, "namespace": ns, "uid": tj.uid()},
        "reason": "WorkloadCreated", "message": "created by the no-op peer", "type": "Normal",
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        "source": {"component": MANAGER}
    }))?;
    Api::<Event>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &event)
        .await?;
    Ok(())
}

/// Allows every request unchanged, echoing its uid (what any webhook must at least do: read
/// the review and answer it).
async fn answer(State(handled): State<Arc<Handled>>, body: Bytes) -> impl IntoResponse {
    let start = Instant::now();
    let uid = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["request"]["uid"].as_str().map(str::to_string));
    let reply = match uid {
        Some(uid) => (
            StatusCode::OK,
            axum::Json(json!({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {"uid": uid, "allowed": true}
            })),
        ),
        None => (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": "not an AdmissionReview with a request uid"})),
        ),
    };
    let took = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    handled.nanos.fetch_add(took, Ordering::Relaxed);
    handled.count.fetch_add(1, Ordering::Relaxed);
    reply
}

async fn readyz(State(ready): State<Arc<AtomicBool>>) -> StatusCode {
    if ready.load(Ordering::Acquire) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// The answers' time in the operator's histogram names (sum and count, every endpoint as
/// `mutate-workload`, the one the bench reads).
async fn metrics(State(handled): State<Arc<Handled>>) -> String {
    #[allow(clippy::cast_precision_loss)]
    let sum = handled.nanos.load(Ordering::Relaxed) as f64 / 1e9;
    let count = handled.count.load(Ordering::Relaxed);
    format!(
        "# TYPE offload_operator_admission_duration_seconds histogram\n\
         offload_operator_admission_duration_seconds_sum{{endpoint=\"mutate-workload\"}} {sum}\n\
         offload_operator_admission_duration_seconds_count{{endpoint=\"mutate-workload\"}} {count}\n\
         # EOF\n"
    )
}
