//! The sizer in a real cluster: a TrainingJob that gives its model's config.json and tokens is
//! traced by a sizer Job in its namespace before its workload exists; the trace decides it, is
//! kept in the operator's namespace and decides the next job of the same step without a second
//! sizer; where the sizer cannot trace (the model's own code) or runs out of time, the counted
//! model decides and the reasons say why. A batch Job's pods wait for the trace the same way:
//! refused at creation while the sizer runs, then decided from it. kwok stands in for the sizer's process (its pods end
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
    another_kinds_pods_wait_for_the_trace(&client, &ns).await;
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

/// Batch Jobs that name the model by their annotations: their pods wait for the step's trace
/// (refused at creation while the sizer runs, created again by the Job controller) and are
/// decided from it; where the sizer runs out of time, the counted model decides and the pod's
/// reasons say why.
async fn another_kinds_pods_wait_for_the_trace(client: &Client, ns: &str) {
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let batch = |name: &str, tokens: u32, pod_annotations: serde_json::Value| -> Job {
        serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "labels": {"offload.dev/profile": ns},
                "annotations": {
                    "offload.dev/framework": "DeepSpeed",
                    "offload.dev/framework-version": "0.19.8",
                    "offload.dev/model-config": "model",
                    "offload.dev/tokens-per-step": tokens.to_string()
                }
            },
            "spec": {"template": {
                "metadata": {"annotations": pod_annotations},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "train", "image": "registry.example.com/train:1",
                    "resources": {"limits": {"nvidia.com/gpu": 1}}
                }]}
            }}
        }))
        .unwrap()
    };
    let traced = jobs
        .create(
            &PostParams::default(),
            &batch(
                "batch-1",
                1024,
                json!({"offload.dev/kwok-trace": TRACE_1024}),
            ),
        )
        .await
        .unwrap();
    // A sizer that never ends (another step: 512 tokens): its Job's deadline ends it.
    jobs.create(
        &PostParams::default(),
        &batch(
            "batch-slow",
            512,
            json!({"offload.dev/kwok-keep-running": "true"}),
        ),
    )
    .await
    .unwrap();
    // The Job itself says until when its pods wait; its template is left unconfigured.
    let annotations = traced.metadata.annotations.clone().unwrap_or_default();
    assert!(
        annotations.contains_key(offload_api::names::ANNOTATION_SIZER_WAIT_UNTIL),
        "{annotations:?}"
    );
    let template = traced.spec.as_ref().unwrap().template.clone();
    let env = serde_json::to_string(&template.spec.as_ref().unwrap().containers[0].env).unwrap();
    assert!(!env.contains("OFFLOAD_MODE"), "{env}");
    let created = traced.metadata.creation_timestamp.clone().unwrap().0;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    let pod_of = |job: &'static str| {
        let pods = pods.clone();
        async move {
            poll(
                &format!("a pod of {job}"),
                Duration::from_secs(120),
                || async {
                    pods.list(&ListParams::default().labels(&format!("job-name={job}")))
                        .await
                        .ok()?
                        .items
                        .into_iter()
                        .next()
                },
            )
            .await
        }
    };
    let pod_reasons = |pod: &k8s_openapi::api::core::v1::Pod| {
        pod.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(offload_api::names::ANNOTATION_REASONS).cloned())
            .unwrap_or_default()
    };
    let first = pod_of("batch-1").await;
    let waited = first
        .metadata
        .creation_timestamp
        .clone()
        .unwrap()
        .0
        .duration_since(created);
    println!(
        "the batch Job's first pod was created {:.1} s after the Job (the sizer's run and the Job controller's back-off)",
        waited.as_secs_f64()
    );
    assert!(
        pod_reasons(&first).contains("traced from the model's code"),
        "{}",
        pod_reasons(&first)
    );
    let env = serde_json::to_string(&first.spec.as_ref().unwrap().containers[0].env).unwrap();
    assert!(env.contains("OFFLOAD_MODE"), "{env}");
    // The slow step's pods waited for its sizer's deadline (10 s), refused at creation until
    // then, and the counted model decided.
    let slow = pod_of("batch-slow").await;
    let why = pod_reasons(&slow);
    assert!(why.contains("(TimedOut)"), "{why}");
    let slow_job = jobs.get("batch-slow").await.unwrap();
    let waited = slow
        .metadata
        .creation_timestamp
        .clone()
        .unwrap()
        .0
        .duration_since(slow_job.metadata.creation_timestamp.clone().unwrap().0);
    println!(
        "the slow step's first pod was created {:.1} s after its Job (sizer deadline 10 s)",
        waited.as_secs_f64()
    );
    assert!(waited.as_secs_f64() >= 10.0, "{waited:?}");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), ns);
    let refused = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("batch-slow"))
        .filter_map(|e| e.note)
        .find(|n| n.contains("waits for its model's step to be traced"));
    assert!(refused.is_some(), "no FailedCreate naming the wait");
    // A pod that claims a wait no webhook wrote is refused, and says why.
    let forged: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "forged", "labels": {"offload.dev/profile": ns},
            "annotations": {offload_api::names::ANNOTATION_SIZER_WAIT_UNTIL: "2099-01-01T00:00:00Z"}},
        "spec": {"containers": [{"name": "train", "image": "registry.example.com/train:1"}]}
    }))
    .unwrap();
    let err = pods
        .create(&PostParams::default(), &forged)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("further than the webhook ever writes"),
        "{err}"
    );
}
