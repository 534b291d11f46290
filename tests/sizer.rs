//! The sizer in a real cluster: a TrainingJob that gives its model's config.json and tokens is
//! traced by a sizer Job in its namespace before its workload exists; the trace decides it, is
//! kept in the operator's namespace and decides the next job of the same step without a second
//! sizer; where the sizer cannot trace (the model's own code) or runs out of time, the counted
//! model decides and the reasons say why. A batch Job's env is written as it is created: the
//! first of a step is decided by the counted model and its step traced for the next, which the
//! trace decides. kwok stands in for the sizer's process (its pods end
//! with the trace the sizer writes, `crates/testenv/kwok/pod-sized.yaml`); the sizer program
//! itself runs for real in `tests/sizer_program.rs`.

use offload_testenv::support;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use offload_api::v1alpha1::{OffloadProfile, TrainingJob};
use offload_testenv::devcluster::ClusterOptions;
use offload_testenv::fixtures;
use serde_json::json;
use support::controller::wait_for_condition;
use support::*;

/// Nemotron-4-Minitron-4B's config.json, and the sizer's trace of it at one micro-batch of
/// 4,096 tokens (transformers 5.17, torch 2.11).
const CONFIG: &str = include_str!("../hack/gpu/models/new/nemotron-4b.json");
const TRACE: &str = include_str!("fixtures/traces/nemotron-4b-4096.json");
/// The same at 1,024 tokens.
const TRACE_1024: &str = include_str!("fixtures/traces/nemotron-4b-1024.json");

/// The operator (its webhook on, the sizer bounded by 10 s), once for this test binary.
fn start_operator(cluster: &'static offload_testenv::devcluster::DevCluster) {
    operator_with_webhook_and(cluster, |options| {
        options.sizer = Some(offload_operator::sizer::SizerOptions {
            namespace: OPERATOR_NAMESPACE.into(),
            timeout: Duration::from_secs(10),
            ..Default::default()
        });
    });
}

async fn setup(prefix: &str) -> (Client, String) {
    let cluster = cluster(ClusterOptions::full());
    start_operator(cluster);
    let client = client(cluster).await;
    apply_crds(&client).await;
    let ns = namespace(&client, prefix).await;
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &reported_node(&format!("{ns}-h200"), fixtures::H200_READING, &ns),
        )
        .await
        .unwrap();
    Api::<OffloadProfile>::all(client.clone())
        .create(&PostParams::default(), &pool_profile(&ns, &ns, json!({})))
        .await
        .unwrap();
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "model"}, "data": {"config.json": CONFIG}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    (client, ns)
}

/// A one-pod DeepSpeed job of the model at `tokens` per step whose pods carry `annotations`
/// (the sizer's pods carry them too: what the kwok stand-in ends them with).
async fn create_job(
    api: &Api<TrainingJob>,
    name: &str,
    ns: &str,
    tokens: i64,
    annotations: serde_json::Value,
) {
    let mut tj = support::controller::training_job(
        name,
        ns,
        json!({"name": "DeepSpeed", "version": "0.19.8"}),
        json!({"replicas": 1, "model": {"configMapRef": {"name": "model"}, "tokensPerStep": tokens}}),
    );
    tj.spec.template.metadata =
        Some(serde_json::from_value(json!({"annotations": annotations})).unwrap());
    api.create(&PostParams::default(), &tj).await.unwrap();
}

fn reasons(tj: &TrainingJob) -> String {
    tj.status
        .as_ref()
        .and_then(|s| s.offload.as_ref())
        .map(|o| {
            o.reasons
                .iter()
                .map(|r| r.message.clone())
                .collect::<Vec<_>>()
                .join(" | ")
        })
        .unwrap_or_default()
}

async fn sizer_jobs(client: &Client, ns: &str) -> Vec<Job> {
    Api::<Job>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(offload_api::names::LABEL_SIZER))
        .await
        .unwrap()
        .items
}

// One operator for both stories: an operator reconciles every namespace's jobs, so two in one
// cluster at once would each keep the other's traces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sizer_traces_a_model_before_its_workload_or_says_why_it_could_not() {
    let (client, ns) = setup("sizer").await;
    traced_once_for_every_job_of_the_step(&client, &ns).await;
    not_traced_then_counted(&client, &ns).await;
    another_kind_is_traced_for_the_jobs_that_come_after(&client, &ns).await;
}

async fn traced_once_for_every_job_of_the_step(client: &Client, ns: &str) {
    let (client, ns) = (client.clone(), ns.to_string());
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    create_job(
        &api,
        "first",
        &ns,
        4096,
        json!({"offload.dev/kwok-trace": TRACE}),
    )
    .await;
    let tj = wait_for_condition(&api, "first", "WorkloadCreated", "True").await;
    let why = reasons(&tj);
    assert!(why.contains("traced from the model's code"), "{why}");
    // The sizer ran once, from the job's own image, and ended before the workload was made.
    let sizers = sizer_jobs(&client, &ns).await;
    assert_eq!(sizers.len(), 1, "{sizers:?}");
    let sizer = &sizers[0];
    let image = sizer
        .spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .image
        .clone();
    assert_eq!(image.as_deref(), Some("registry.example.com/train:1"));
    let workload: Job = Api::namespaced(client.clone(), &ns)
        .get("first")
        .await
        .unwrap();
    let made = workload.metadata.creation_timestamp.unwrap().0;
    let sized = sizer.metadata.creation_timestamp.clone().unwrap().0;
    assert!(
        sized <= made,
        "the sizer ({sized}) before the workload ({made})"
    );
    // The trace is kept in the operator's namespace, for this namespace (the job's image).
    let kept = Api::<ConfigMap>::namespaced(client.clone(), OPERATOR_NAMESPACE)
        .list(&ListParams::default().labels(&format!(
            "{}={}",
            offload_api::names::LABEL_TRACE,
            sizer.metadata.labels.as_ref().unwrap()[offload_api::names::LABEL_SIZER]
        )))
        .await
        .unwrap()
        .items;
    let names: Vec<(String, Vec<String>)> = kept
        .iter()
        .map(|c| {
            (
                c.metadata.name.clone().unwrap_or_default(),
                c.data.clone().unwrap_or_default().into_keys().collect(),
            )
        })
        .collect();
    assert_eq!(kept.len(), 1, "{names:?}");
    assert!(kept[0].data.as_ref().unwrap().contains_key("trace.json"));
    // A second job of the same step is decided from the kept trace, with no second sizer.
    create_job(&api, "second", &ns, 4096, json!({})).await;
    let tj = wait_for_condition(&api, "second", "WorkloadCreated", "True").await;
    assert!(
        reasons(&tj).contains("traced from the model's code"),
        "{}",
        reasons(&tj)
    );
    assert_eq!(sizer_jobs(&client, &ns).await.len(), 1);
}

/// Where the sizer cannot trace (the model's own code) or runs out of time, the counted model
/// decides and the reasons say why.
async fn not_traced_then_counted(client: &Client, ns: &str) {
    let (client, ns) = (client.clone(), ns.to_string());
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    // The model's own code (auto_map): the sizer says so and exits 3.
    let custom = json!({"apiVersion": "offload.dev/v1alpha1", "kind": "ModelTraceError", "version": 1,
        "error": {"code": "CustomCode", "message": "model_type nemotron is built by the model's own code (auto_map), which the sizer does not run"}})
    .to_string();
    create_job(
        &api,
        "custom",
        &ns,
        3072,
        json!({"offload.dev/kwok-trace": custom, "offload.dev/kwok-sizer-exit": "3"}),
    )
    .await;
    // A sizer that never ends (another step: 2,048 tokens): its Job's deadline ends it.
    create_job(
        &api,
        "slow",
        &ns,
        2048,
        json!({"offload.dev/kwok-keep-running": "true"}),
    )
    .await;
    let tj = wait_for_condition(&api, "custom", "WorkloadCreated", "True").await;
    let why = reasons(&tj);
    assert!(why.contains("not traced (CustomCode)"), "{why}");
    assert!(why.contains("+40 % unmeasured type"), "{why}");
    let tj = wait_for_condition(&api, "slow", "WorkloadCreated", "True").await;
    let why = reasons(&tj);
    assert!(why.contains("(TimedOut)"), "{why}");
}

/// A batch Job that names the model by its annotations: its env is written as it is created, so
/// the first of its step is decided by the counted model while the operator traces the step;
/// the next Job of the step is decided from the trace.
async fn another_kind_is_traced_for_the_jobs_that_come_after(client: &Client, ns: &str) {
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let batch = |name: &str| -> Job {
        serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "labels": {"offload.dev/profile": ns},
                "annotations": {
                    "offload.dev/framework": "DeepSpeed",
                    "offload.dev/framework-version": "0.19.8",
                    "offload.dev/model-config": "model",
                    "offload.dev/tokens-per-step": "1024"
                }
            },
            "spec": {"template": {
                "metadata": {"annotations": {"offload.dev/kwok-trace": TRACE_1024}},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "train", "image": "registry.example.com/train:1",
                    "resources": {"limits": {"nvidia.com/gpu": 1}}
                }]}
            }}
        }))
        .unwrap()
    };
    let first = jobs
        .create(&PostParams::default(), &batch("batch-1"))
        .await
        .unwrap();
    let reasons = |job: &Job| {
        job.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(offload_api::names::ANNOTATION_REASONS).cloned())
            .unwrap_or_default()
    };
    assert!(
        reasons(&first).contains("not traced yet"),
        "{}",
        reasons(&first)
    );
    // Its pods carry the step; the operator traces it and keeps the trace.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    poll(
        "the batch Job's step traced and kept",
        Duration::from_secs(60),
        || async {
            let kept = cms
                .list(&ListParams::default().labels(offload_api::names::LABEL_TRACE))
                .await
                .ok()?;
            kept.items
                .iter()
                .any(|c| {
                    c.data.as_ref().is_some_and(|d| {
                        d.get("trace.json")
                            .is_some_and(|t| t.contains("\"sequence\":1024"))
                    })
                })
                .then_some(())
        },
    )
    .await;
    let second = jobs
        .create(&PostParams::default(), &batch("batch-2"))
        .await
        .unwrap();
    assert!(
        reasons(&second).contains("traced from the model's code"),
        "{}",
        reasons(&second)
    );
}
