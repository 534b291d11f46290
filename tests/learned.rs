//! What a job really used flows back, through the real API server: a job without model hints
//! runs with every offload on, its pods' observed peaks (a node's recorded summary, written as
//! the agent writes it) are learned into the operator's ConfigMap, the profile says so, the
//! lesson survives an operator restart, and a re-run of the same job is decided from it —
//! without offload, the fastest configuration. Deleting the ConfigMap forgets it.

use offload_testenv::support;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use offload_api::names;
use offload_api::observed::{
    BusySource, HostMemorySource, OBSERVED_SCHEMA_VERSION, ObservedSummary, PodObservation,
};
use offload_api::v1alpha1::{OffloadProfile, StatePlacement, TrainingJob};
use offload_testenv::devcluster::ClusterOptions;
use offload_testenv::fixtures;
use serde_json::json;
use support::controller::{create_training_job, wait_for_condition};
use support::*;

/// The H200's memory as NVML reads it.
const H200_BYTES: u64 = 150_754_820_096;
const GIB: u64 = 1 << 30;

fn start_operator(
    client: &Client,
    ns: &str,
) -> (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<Result<(), offload_operator::operator::RunError>>,
) {
    let token = tokio_util::sync::CancellationToken::new();
    let handle = tokio::spawn(offload_operator::operator::run(
        client.clone(),
        offload_operator::operator::RunOptions {
            learned_namespace: Some(ns.to_string()),
            ..operator_options()
        },
        token.clone(),
    ));
    (token, handle)
}

/// What a Qwen2.5-1.5B-shaped job used on the H200 with everything offloaded
/// (`docs/benchmarks/closed-loop-h200.md`, case 1): 29.6 GiB of GPU, 39.4 GiB of host.
fn window(node: &str, ns: &str, pod: &str, job: &str, host: u64) -> String {
    ObservedSummary {
        schema_version: OBSERVED_SCHEMA_VERSION,
        node: node.into(),
        observed_at: jiff::Timestamp::now().to_string(),
        window_seconds: 60.0,
        source: BusySource::RecordedTrace,
        pods: vec![PodObservation {
            namespace: ns.into(),
            name: pod.into(),
            training_job: Some(job.into()),
            gpus: vec!["GPU-0".into()],
            gpu_busy: 0.9,
            samples: 600,
            cpu_cores: Some(4.0),
            gpu_memory_peak_bytes: Some(29 * GIB + 600 * (1 << 20)),
            gpu_memory_total_bytes: Some(H200_BYTES),
            process_gpu_memory_peak_bytes: None,
            host_memory_peak_bytes: Some(host),
            host_memory_source: Some(HostMemorySource::CgroupPeak),
            allocator_peak_bytes: None,
            step_seconds: None,
        }],
    }
    .to_annotation()
    .unwrap()
}

async fn annotate(client: &Client, node: &str, value: &str) {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {names::ANNOTATION_OBSERVED: value}}}),
            ),
        )
        .await
        .unwrap();
}

/// The job's pod, once bound.
async fn bound_pod(client: &Client, ns: &str, job: &str) -> String {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    wait_list(
        pods,
        kube::runtime::watcher::Config::default()
            .labels(&format!("{}={job}", names::LABEL_TRAINING_JOB)),
        &format!("the pod of {job} bound"),
        Duration::from_secs(60),
        |pods| {
            pods.iter()
                .find(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some()))
                .and_then(|p| p.metadata.name.clone())
        },
    )
    .await
}

fn placement(tj: &TrainingJob) -> Option<StatePlacement> {
    tj.status.as_ref()?.offload.as_ref()?.placement
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_run_used_is_learned_survives_a_restart_and_decides_its_rerun() {
    let cluster = cluster(ClusterOptions::full());
    let client = client(cluster).await;
    apply_crds(&client).await;
    let ns = namespace(&client, "learned").await;
    let node = format!("{ns}-h200");
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &reported_node(&node, fixtures::H200_READING, &ns),
        )
        .await
        .unwrap();
    Api::<OffloadProfile>::all(client.clone())
        .create(&PostParams::default(), &pool_profile(&ns, &ns, json!({})))
        .await
        .unwrap();
    let (token, first) = start_operator(&client, &ns);
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let spec = || json!({"replicas": 1});
    let framework = || json!({"name": "DeepSpeed", "version": "0.19.8"});
    create_training_job(&api, "rerun", &ns, framework(), spec()).await;
    let tj = wait_for_condition(&api, "rerun", "WorkloadCreated", "True").await;
    let first_placement = placement(&tj);
    assert!(
        matches!(
            first_placement,
            Some(StatePlacement::OptimizerAndParams | StatePlacement::Optimizer)
        ),
        "without hints every offload is on: {first_placement:?}"
    );

    // A window of its peaks: learned, written to the ConfigMap, counted on the profile.
    let pod = bound_pod(&client, &ns, "rerun").await;
    annotate(
        &client,
        &node,
        &window(&node, &ns, &pod, "rerun", 39 * GIB + 400 * (1 << 20)),
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let stored = poll(
        "the lesson written to the learned ConfigMap",
        Duration::from_secs(60),
        || async {
            let cm = cms.get_opt("offload-operator-learned").await.ok()??;
            let text = cm.data?.get("memory.json")?.clone();
            text.contains("\"parameters\"").then_some(text)
        },
    )
    .await;
    assert!(stored.contains(&format!("{ns}/rerun")), "{stored}");
    let profiles: Api<OffloadProfile> = Api::all(client.clone());
    poll(
        "the profile counts the run",
        Duration::from_secs(60),
        || async {
            let p = profiles.get(&ns).await.ok()?;
            let learned = p.status?.learned?;
            (learned.runs == 1 && learned.shapes == 1).then_some(())
        },
    )
    .await;
    let shown = kubectl(cluster, &["get", "offloadprofiles", &ns]);
    assert!(
        shown.contains("LEARNED") && shown.contains("1 shapes / 1 runs"),
        "{shown}"
    );

    // A restart: the new operator reads the lesson back from the ConfigMap.
    token.cancel();
    first.await.unwrap().unwrap();
    let (token, second) = start_operator(&client, &ns);

    // The same job again (deleted, its workload gone, created with the same spec).
    api.delete("rerun", &DeleteParams::foreground())
        .await
        .unwrap();
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    poll(
        "the first run's Job gone",
        Duration::from_secs(60),
        || async {
            (api.get_opt("rerun").await.ok()?.is_none()
                && jobs.get_opt("rerun").await.ok()?.is_none())
            .then_some(())
        },
    )
    .await;
    create_training_job(&api, "rerun", &ns, framework(), spec()).await;
    let rerun = wait_for_condition(&api, "rerun", "WorkloadCreated", "True").await;
    let decision = rerun.status.as_ref().unwrap().offload.clone().unwrap();
    assert_eq!(
        decision.placement,
        Some(StatePlacement::NoOffload),
        "{decision:?}"
    );
    let why: Vec<&str> = decision
        .reasons
        .iter()
        .map(|r| r.message.as_str())
        .collect();
    assert!(
        why.iter()
            .any(|m| m.contains("from the peaks of its observed runs")),
        "{why:?}"
    );
    let estimate = decision.estimate.unwrap();
    assert_eq!(estimate.learned.unwrap().runs, 1);

    // Another job of another spec learns nothing from it.
    create_training_job(&api, "other", &ns, framework(), json!({"replicas": 1, "template": {"spec": {"containers": [{"name": "train", "image": "registry.example.com/other:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}})).await;
    let other = wait_for_condition(&api, "other", "WorkloadCreated", "True").await;
    assert_eq!(placement(&other), first_placement);

    // Forgetting: the ConfigMap deleted, the profile counts nothing.
    cms.delete("offload-operator-learned", &DeleteParams::default())
        .await
        .unwrap();
    poll("the profile forgets", Duration::from_secs(60), || async {
        let p = profiles.get(&ns).await.ok()?;
        p.status?.learned.is_none_or(|l| l.runs == 0).then_some(())
    })
    .await;
    token.cancel();
    second.await.unwrap().unwrap();
}
