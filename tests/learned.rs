//! What a job really used flows back, through the real API server: a job without model hints
//! runs with every offload on, its pods' observed peaks (a node's recorded summary, written as
//! the agent writes it) are learned into the operator's ConfigMap, the profile says so, the
//! lesson survives an operator restart, and a re-run of the same job is decided from it —
//! without offload, the fastest configuration. Deleting the ConfigMap forgets it. And the steps
//! the reporter timed rank what trained: a faster share that stepped slower is left.

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
            sizer: None,
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

/// A test cluster with one recorded H200 node in a namespace of its own (`prefix`) and a profile
/// of that name for it (`extra` on its spec): the cluster, a client, the namespace, the node.
async fn setup(
    prefix: &str,
    extra: serde_json::Value,
) -> (
    &'static offload_testenv::devcluster::DevCluster,
    Client,
    String,
    String,
) {
    let cluster = cluster(ClusterOptions::full());
    let client = client(cluster).await;
    apply_crds(&client).await;
    let ns = namespace(&client, prefix).await;
    let node = format!("{ns}-h200");
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &reported_node(&node, fixtures::H200_READING, &ns),
        )
        .await
        .unwrap();
    Api::<OffloadProfile>::all(client.clone())
        .create(&PostParams::default(), &pool_profile(&ns, &ns, extra))
        .await
        .unwrap();
    (cluster, client, ns, node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_run_used_is_learned_survives_a_restart_and_decides_its_rerun() {
    let (cluster, client, ns, node) = setup("learned", json!({})).await;
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
        why.iter().any(|m| m.contains("learned from 1 run")),
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

/// A window of a pod's peaks as the agent writes it: `gpu` bytes of GPU memory (NVML's device
/// figure), `host` bytes of host memory.
fn window_of(node: &str, ns: &str, pod: &str, job: &str, gpu: u64, host: u64) -> String {
    let mut summary: ObservedSummary =
        serde_json::from_str(&window(node, ns, pod, job, host)).unwrap();
    summary.pods[0].gpu_memory_peak_bytes = Some(gpu);
    summary.to_annotation().unwrap()
}

/// A one-pod job of Mistral-7B's shape (40 layers, 4,096 tokens a step) whose pod kwok completes
/// with the reporter's line `report` as its termination message, or `trial_report` where the pod
/// is a trial (a stand-in for the training process, named as such).
fn reported_job(name: &str, profile: &str, report: &str, trial_report: &str) -> TrainingJob {
    let mut tj = support::controller::training_job(
        name,
        profile,
        json!({"name": "DeepSpeed", "version": "0.19.8"}),
        json!({"replicas": 1, "backoffLimit": 0, "model": {"architecture": "Llama", "hiddenSize": 4096,
            "layers": 40, "intermediateSize": 14336, "attentionHeads": 32, "keyValueHeads": 8,
            "vocabSize": 32000, "tokensPerStep": 4096}}),
    );
    tj.spec.template.metadata = Some(
        serde_json::from_value(json!({"annotations": {
            "offload.dev/kwok-report": report,
            "offload.dev/kwok-report-trial": trial_report,
        }}))
        .unwrap(),
    );
    tj
}

/// The loop ranks what trained by the steps its processes timed, through the real API server:
/// a job's pod trains and reports PyTorch's peak and a 2,000 ms step (the reporter's line in its
/// termination message); the next job of the shape takes a faster share, which trains but
/// steps in 2,300 ms; the job after it goes back to the first share and says why with both
/// steps. The learned ConfigMap keeps each run's step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_faster_share_that_trains_slower_is_left_for_the_configuration_that_stepped_faster() {
    let (cluster, client, ns, node) = setup(
        "stepped",
        json!({"reportAllocatorPeaks": true, "fasterTrials": 1}),
    )
    .await;
    let (token, operator) = start_operator(&client, &ns);
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let line = |allocated: u64, step_ms: u32| {
        format!(
            "offload.dev/allocator rank=0 allocated={allocated} reserved={} step_ms={step_ms}.0 steps=40",
            allocated + GIB
        )
    };
    // The shape's first decision, by the model alone: a share of the optimizer state.
    let probe = |name: &str| reported_job(name, &ns, "", "");
    api.create(&PostParams::default(), &probe("probe"))
        .await
        .unwrap();
    let decided = wait_for_condition(&api, "probe", "OffloadResolved", "True").await;
    let first_offload = decided.status.unwrap().offload.unwrap();
    assert_eq!(
        first_offload.placement,
        Some(StatePlacement::PartialOptimizer)
    );
    let r0 = first_offload.offload_ratio;
    let estimate = u64::try_from(first_offload.estimate.unwrap().gpu_bytes).unwrap();
    api.delete("probe", &DeleteParams::foreground())
        .await
        .unwrap();

    // Each run: its pod completes with the reporter's line; the agent's window of its peaks.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let run = |name: &'static str, report: String, trial_report: String, gpu: u64| {
        let (api, client, ns, node, cms) = (
            api.clone(),
            client.clone(),
            ns.clone(),
            node.clone(),
            cms.clone(),
        );
        async move {
            api.create(
                &PostParams::default(),
                &reported_job(name, &ns, &report, &trial_report),
            )
            .await
            .unwrap();
            let pod = bound_pod(&client, &ns, name).await;
            annotate(
                &client,
                &node,
                &window_of(&node, &ns, &pod, name, gpu, 60 * GIB),
            )
            .await;
            let tj = wait_list(
                api.clone(),
                kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}")),
                &format!("{name} succeeded"),
                Duration::from_secs(60),
                |jobs| {
                    let tj = jobs.first()?;
                    (tj.status.as_ref()?.phase == Some(offload_api::v1alpha1::JobPhase::Succeeded))
                        .then(|| TrainingJob::clone(tj))
                },
            )
            .await;
            poll(
                &format!("{name}'s step learned"),
                Duration::from_secs(60),
                || async {
                    let cm = cms.get_opt("offload-operator-learned").await.ok()??;
                    let text = cm.data?.get("memory.json")?.clone();
                    let store: serde_json::Value = serde_json::from_str(&text).ok()?;
                    store["entries"]
                        .as_array()?
                        .iter()
                        .flat_map(|e| e["runs"].as_array().into_iter().flatten())
                        .any(|r| {
                            r["job"]
                                .as_str()
                                .is_some_and(|j| j.contains(&format!("/{name}/")))
                                && r["trained"] == true
                                && r["stepSeconds"].is_number()
                        })
                        .then_some(())
                },
            )
            .await;
            tj
        }
    };
    let allocated = estimate - 3 * GIB;
    let first = run(
        "first",
        line(allocated, 2000),
        String::new(),
        allocated + 4 * GIB,
    )
    .await;
    let ran = first.status.unwrap().offload.unwrap();
    assert!((ran.offload_ratio - r0).abs() < 1e-9, "{ran:?}");
    assert!(ran.trial.is_none());

    // The next job of the shape takes a faster share (the model's own from the first run's
    // figures, or a trial: its pod reports the same either way); it trains, 15 % slower.
    let slower = line(allocated + GIB, 2300);
    let second = run("second", slower.clone(), slower, allocated + 5 * GIB).await;
    let tried = second.status.unwrap().offload.unwrap();
    assert!(
        tried.offload_ratio < r0 - 0.005,
        "{} after {r0}",
        tried.offload_ratio
    );

    // The job after it goes back to what stepped faster, and says why.
    api.create(&PostParams::default(), &reported_job("third", &ns, "", ""))
        .await
        .unwrap();
    let third = wait_for_condition(&api, "third", "OffloadResolved", "True").await;
    let back = third.status.unwrap().offload.unwrap();
    assert!(
        (back.offload_ratio - r0).abs() < 1e-9,
        "back to {r0}: {back:?}"
    );
    assert!(back.trial.is_none());
    let why: Vec<&str> = back.reasons.iter().map(|r| r.message.as_str()).collect();
    assert!(
        why.iter()
            .any(|m| m.contains("the fastest that trained (2000 ms a step;")
                && m.contains(" 2300 ms)")),
        "{why:?}"
    );
    let shown = kubectl(cluster, &["get", "trainingjobs", "third", "-n", &ns]);
    assert!(shown.contains("2000 ms a step;"), "{shown}");
    token.cancel();
    operator.await.unwrap().unwrap();
}
