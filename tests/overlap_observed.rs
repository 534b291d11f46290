//! A running job's observed GPU-busy fraction, from the agent's summary on its Node to the
//! TrainingJob's `status.observed`, the `OverlapObserved` condition, the Warning Event, the
//! per-job metrics and `kubectl get tj`, through the real API server, with the job's pods
//! created and bound to simulated nodes. The summaries are recorded ones (source
//! `recorded-trace`), written on the Nodes as the agent writes them.

use offload_testenv::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use offload_api::names;
use offload_api::observed::{
    BusySource, HostMemorySource, OBSERVED_SCHEMA_VERSION, ObservedSummary, PodObservation,
};
use offload_api::v1alpha1::{OffloadProfile, TrainingJob};
use offload_testenv::devcluster::{ClusterOptions, free_port};
use offload_testenv::fixtures;
use serde_json::json;
use support::controller::{create_training_job, wait_for_condition};
use support::*;

fn deepspeed() -> serde_json::Value {
    json!({"name": "DeepSpeed", "version": "0.19.8"})
}

/// The recorded summary of one node: each (pod, job, busy, cpu cores) one pod with one GPU.
fn summary(node: &str, ns: &str, pods: &[(&str, &str, f64, f64)]) -> String {
    summary_with_memory(node, ns, pods, None)
}

/// The H200's memory as NVML reads it (the recorded report's).
const H200_BYTES: u64 = 150_754_820_096;

/// The same, each pod's GPU at `gpu_peak` bytes at its highest (of an H200) and its host memory
/// at 40 GiB, where given.
fn summary_with_memory(
    node: &str,
    ns: &str,
    pods: &[(&str, &str, f64, f64)],
    gpu_peak: Option<u64>,
) -> String {
    ObservedSummary {
        schema_version: OBSERVED_SCHEMA_VERSION,
        node: node.into(),
        observed_at: jiff::Timestamp::now().to_string(),
        window_seconds: 60.0,
        source: BusySource::RecordedTrace,
        pods: pods
            .iter()
            .enumerate()
            .map(|(i, (pod, job, busy, cpu))| PodObservation {
                namespace: ns.into(),
                name: (*pod).into(),
                training_job: Some((*job).into()),
                gpus: vec![format!("GPU-{i}")],
                gpu_busy: *busy,
                samples: 600,
                cpu_cores: Some(*cpu),
                gpu_memory_peak_bytes: gpu_peak,
                gpu_memory_total_bytes: gpu_peak.map(|_| H200_BYTES),
                process_gpu_memory_peak_bytes: None,
                host_memory_peak_bytes: gpu_peak.map(|_| 40 << 30),
                host_memory_source: gpu_peak.map(|_| HostMemorySource::CgroupPeak),
                allocator_peak_bytes: None,
                step_seconds: None,
            })
            .collect(),
    }
    .to_annotation()
    .unwrap()
}

/// The job's pods and the nodes they are bound to, once all `count` are bound.
async fn pods_of(client: &Client, ns: &str, job: &str, count: usize) -> Vec<(String, String)> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    wait_list(
        pods,
        kube::runtime::watcher::Config::default()
            .labels(&format!("{}={job}", names::LABEL_TRAINING_JOB)),
        &format!("{count} pods of {job} bound"),
        Duration::from_secs(60),
        |pods| {
            let bound: Vec<(String, String)> = pods
                .iter()
                .filter_map(|p| {
                    let node = p.spec.as_ref()?.node_name.clone()?;
                    Some((p.metadata.name.clone()?, node))
                })
                .collect();
            (bound.len() >= count).then_some(bound)
        },
    )
    .await
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

fn observed_busy(tj: &TrainingJob) -> Option<f64> {
    tj.status.as_ref()?.observed.as_ref().map(|o| o.gpu_busy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observations_reach_status_condition_event_metrics_and_kubectl() {
    // Pods really exist and are bound to nodes: a node's observation counts only for the pods
    // that run on it.
    let cluster = cluster(ClusterOptions::full());
    let client = client(cluster).await;
    apply_crds(&client).await;
    let (admin, token, operator) = operator_with_metrics(&client);
    let ns = namespace(&client, "observed").await;
    let (node, other) = two_nodes_and_a_profile(&client, &ns).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    // Its two pods on two nodes (one per node).
    create_training_job(&api, "overlapped", &ns, deepspeed(), json!({"template": {"metadata": {"labels": {"spread": "overlapped"}}, "spec": { "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [ {"labelSelector": {"matchLabels": {"spread": "overlapped"}}, "topologyKey": "kubernetes.io/hostname"}]}}, "containers": [{"name": "train", "image": "registry.example.com/train:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}})).await;
    create_training_job(
        &api,
        "serial",
        &ns,
        deepspeed(),
        json!({"offload": {"overlap": "Disabled"}}),
    )
    .await;
    for job in ["overlapped", "serial"] {
        wait_for_condition(&api, job, "WorkloadCreated", "True").await;
    }
    let overlapped = api.get("overlapped").await.unwrap();
    assert!(
        overlapped.status.unwrap().offload.unwrap().overlap,
        "the verified H200 gives overlap"
    );
    let overlapped_pods = pods_of(&client, &ns, "overlapped", 2).await;
    let serial_pods = pods_of(&client, &ns, "serial", 2).await;
    let on = |pods: &[(String, String)], n: &str| {
        pods.iter()
            .find(|(_, at)| at == n)
            .map(|(p, _)| p.clone())
            .expect("a pod on the node")
    };
    let (first_pod, second_pod) = (on(&overlapped_pods, &node), on(&overlapped_pods, &other));

    // A third node's agent claims the job's pods, which do not run there: not believed.
    let stranger = format!("{ns}-stranger");
    nodes
        .create(
            &PostParams::default(),
            &reported_node(&stranger, fixtures::H200_READING, "elsewhere"),
        )
        .await
        .unwrap();
    annotate(
        &client,
        &stranger,
        &summary(&stranger, &ns, &[(&first_pod, "overlapped", 0.01, 0.1)]),
    )
    .await;

    // The agent on the first node saw both jobs: the overlapped one's GPU idle 42 % of the time.
    let serial_here: Vec<String> = serial_pods
        .iter()
        .filter(|(_, at)| *at == node)
        .map(|(p, _)| p.clone())
        .collect();
    // Its GPU at 137 GiB of the H200's 140.4 at its highest: within 3 % of the limit.
    let mut seen: Vec<(&str, &str, f64, f64)> = vec![(&first_pod, "overlapped", 0.58, 3.5)];
    if let Some(p) = serial_here.first() {
        seen.push((p, "serial", 0.3, 2.0));
    }
    annotate(
        &client,
        &node,
        &summary_with_memory(&node, &ns, &seen, Some(137 << 30)),
    )
    .await;
    flagged_on_the_first_node(&api, &node).await;
    near_its_gpus_memory(&client, &api, &ns).await;

    // The job without overlap gets its figures, and no verdict: there is nothing to overlap.
    if serial_here.is_empty() {
        let other_serial = on(&serial_pods, &other);
        annotate(
            &client,
            &other,
            &summary(&other, &ns, &[(&other_serial, "serial", 0.3, 2.0)]),
        )
        .await;
    }
    the_serial_job_has_figures_and_no_verdict(&api).await;

    a_warning_event_says_it_once(&client, &ns).await;

    // A summary that does not parse, on another node, changes nothing and stops nothing.
    annotate(&client, &other, "{\"schemaVersion\": 1, \"pods\": 7}").await;

    overlapping_on_both_nodes(
        &client,
        &api,
        &ns,
        [(&node, &first_pod), (&other, &second_pod)],
    )
    .await;

    metrics_and_kubectl_show_it(cluster, admin, &ns).await;

    token.cancel();
    operator.await.unwrap().unwrap();
}

/// The operator in process with its admin server (metrics) on a port of its own: the port, the
/// token that stops it, and its task.
fn operator_with_metrics(
    client: &Client,
) -> (
    u16,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<Result<(), offload_operator::operator::RunError>>,
) {
    let admin = free_port().unwrap();
    let token = tokio_util::sync::CancellationToken::new();
    let operator = tokio::spawn(offload_operator::operator::run(
        client.clone(),
        offload_operator::operator::RunOptions {
            admin_addr: format!("127.0.0.1:{admin}").parse().unwrap(),
            ..operator_options()
        },
        token.clone(),
    ));
    (admin, token, operator)
}

/// Two reported H200 nodes in the test's pool and its profile (flagging under 60 % busy).
async fn two_nodes_and_a_profile(client: &Client, ns: &str) -> (String, String) {
    let node = format!("{ns}-h200");
    let other = format!("{ns}-h200-b");
    let nodes: Api<Node> = Api::all(client.clone());
    for n in [&node, &other] {
        nodes
            .create(
                &PostParams::default(),
                &reported_node(n, fixtures::H200_READING, ns),
            )
            .await
            .unwrap();
    }
    Api::<OffloadProfile>::all(client.clone())
        .create(
            &PostParams::default(),
            &pool_profile(ns, ns, json!({"minObservedGpuBusy": 0.6})),
        )
        .await
        .unwrap();
    (node, other)
}

/// The overlapped job flagged from the first node's window: condition, message, figures.
async fn flagged_on_the_first_node(api: &Api<TrainingJob>, node: &str) {
    let flagged = wait_for_condition(api, "overlapped", "OverlapObserved", "False").await;
    let status = flagged.status.unwrap();
    let cond = status
        .conditions
        .iter()
        .find(|c| c.type_ == "OverlapObserved")
        .unwrap();
    assert_eq!(cond.reason, "GPUsIdle");
    assert!(
        cond.message.starts_with(
            "GPUs busy 58 % of the time with overlap on: the CPU update is not overlapping"
        ),
        "{}",
        cond.message
    );
    let observed = status.observed.unwrap();
    assert_eq!((observed.gpu_busy, observed.gpus), (0.58, 1));
    assert_eq!(observed.cpu_cores, Some(3.5));
    assert_eq!(observed.nodes.len(), 1);
    assert_eq!(observed.nodes[0].node, node);
}

/// The job's GPU peak beside its estimate, the `GPUMemoryHeadroom` condition False and a
/// Warning Event.
async fn near_its_gpus_memory(client: &Client, api: &Api<TrainingJob>, ns: &str) {
    let near = wait_for_condition(api, "overlapped", "GPUMemoryHeadroom", "False").await;
    let status = near.status.unwrap();
    let cond = status
        .conditions
        .iter()
        .find(|c| c.type_ == "GPUMemoryHeadroom")
        .unwrap();
    assert_eq!(cond.reason, "NearGPUMemoryLimit");
    assert!(
        cond.message
            .starts_with("GPU memory peaked at 137.0 GiB of the GPU's 140.4 GiB (97.6 %) with "),
        "{}",
        cond.message
    );
    let memory = status.observed.unwrap().memory.unwrap();
    assert_eq!(memory.gpu_peak_bytes, Some(137 << 30));
    assert_eq!(memory.host_peak_bytes, Some(40 << 30));
    assert_eq!(memory.windows, 1);
    let estimate = status.offload.unwrap().estimate;
    assert_eq!(
        memory.gpu_estimate_bytes.is_some(),
        estimate.is_some(),
        "the estimate beside the peak where the decision sized the job"
    );
    assert!(memory.gpu.starts_with("137.0"), "{}", memory.gpu);
    poll(
        "the NearGPUMemoryLimit Event",
        Duration::from_secs(60),
        || {
            let events: Api<Event> = Api::namespaced(client.clone(), ns);
            async move {
                let list = events.list(&ListParams::default()).await.ok()?.items;
                list.into_iter().find(|e| {
                    e.reason.as_deref() == Some("NearGPUMemoryLimit")
                        && e.type_.as_deref() == Some("Warning")
                })
            }
        },
    )
    .await;
}

/// The job without overlap gets its figures, and no verdict: there is nothing to overlap.
async fn the_serial_job_has_figures_and_no_verdict(api: &Api<TrainingJob>) {
    let serial = wait_list(
        api.clone(),
        kube::runtime::watcher::Config::default().fields("metadata.name=serial"),
        "the serial job's observation",
        Duration::from_secs(60),
        |tjs| {
            tjs.first()
                .filter(|t| observed_busy(t) == Some(0.3))
                .cloned()
        },
    )
    .await;
    assert!(
        serial
            .status
            .as_ref()
            .unwrap()
            .conditions
            .iter()
            .all(|c| c.type_ != "OverlapObserved")
    );
}

/// A Warning Event says the flag once.
async fn a_warning_event_says_it_once(client: &Client, ns: &str) {
    let events = poll("the GPUsIdle Event", Duration::from_secs(60), || {
        let events: Api<Event> = Api::namespaced(client.clone(), ns);
        async move {
            let list = events.list(&ListParams::default()).await.ok()?.items;
            let found: Vec<Event> = list
                .into_iter()
                .filter(|e| {
                    e.reason.as_deref() == Some("GPUsIdle")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                            == Some("overlapped")
                })
                .collect();
            (!found.is_empty()).then_some(found)
        }
    })
    .await;
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
}

/// The per-job metrics and `kubectl get tj` show the latest figure.
async fn metrics_and_kubectl_show_it(
    cluster: &offload_testenv::devcluster::DevCluster,
    admin: u16,
    ns: &str,
) {
    let metrics = offload_testenv::http::metrics(admin).await.unwrap();
    let series = [("namespace", ns), ("trainingjob", "overlapped")];
    let busy = metrics.value("offload_operator_job_gpu_busy_ratio", &series);
    assert_eq!(busy, Some(0.96), "the busy-ratio series");
    let flag = metrics.value("offload_operator_job_overlap_flagged", &series);
    assert_eq!(flag, Some(0.0), "the flag series");

    let table = kubectl(cluster, &["get", "tj", "-n", ns]);
    let header = table.lines().next().unwrap();
    assert!(header.contains("GPU-BUSY"), "{table}");
    assert!(header.contains("GPU-MEM"), "{table}");
    let row = table.lines().find(|l| l.starts_with("overlapped")).unwrap();
    assert!(row.contains("0.96"), "{table}");
    assert!(row.contains("137.0/") || row.contains("137.0Gi"), "{table}");
}

/// The next window: the job now overlaps, across both nodes (weighted by GPUs).
async fn overlapping_on_both_nodes(
    client: &Client,
    api: &Api<TrainingJob>,
    ns: &str,
    [(node, first_pod), (other, second_pod)]: [(&str, &str); 2],
) {
    // A forged window on the other node: its pod used more host memory than the node has
    // (512 GiB). Not believed: the next figures are the first node's alone.
    let forged = summary_with_memory(
        other,
        ns,
        &[(second_pod, "overlapped", 0.01, 2.0)],
        Some(1 << 30),
    )
    .replace(&(40u64 << 30).to_string(), &(600u64 << 30).to_string());
    annotate(client, other, &forged).await;
    annotate(
        client,
        node,
        &summary_with_memory(
            node,
            ns,
            &[(first_pod, "overlapped", 0.94, 3.0)],
            Some(100 << 30),
        ),
    )
    .await;
    let first_alone = wait_list(
        api.clone(),
        kube::runtime::watcher::Config::default().fields("metadata.name=overlapped"),
        "the first node's next window",
        Duration::from_secs(60),
        |tjs| {
            tjs.first()
                .and_then(|t| t.status.clone())
                .and_then(|s| s.observed)
                .filter(|o| o.gpu_busy == 0.94)
        },
    )
    .await;
    assert_eq!(first_alone.gpus, 1, "the forged window is not counted");
    let memory = first_alone.memory.unwrap();
    assert_eq!(
        memory.gpu_peak_bytes,
        Some(137 << 30),
        "the highest of the configuration is kept"
    );
    assert_eq!(memory.host_peak_bytes, Some(40 << 30));
    assert_eq!(memory.windows, 2);
    annotate(
        client,
        other,
        &summary_with_memory(
            other,
            ns,
            &[(second_pod, "overlapped", 0.98, 2.0)],
            Some(100 << 30),
        ),
    )
    .await;
    let recovered = wait_list(
        api.clone(),
        kube::runtime::watcher::Config::default().fields("metadata.name=overlapped"),
        "the overlapped job observed on both nodes",
        Duration::from_secs(60),
        |tjs| {
            tjs.first()
                .and_then(|t| t.status.clone())
                .filter(|s| s.observed.as_ref().is_some_and(|o| o.gpus == 2))
        },
    )
    .await;
    assert!(
        recovered
            .conditions
            .iter()
            .any(|c| c.type_ == "OverlapObserved" && c.status == "True" && c.reason == "GPUsBusy"),
        "{:?}",
        recovered.conditions
    );
    let observed = recovered.observed.unwrap();
    assert_eq!((observed.gpu_busy, observed.gpus), (0.96, 2));
    assert_eq!(observed.cpu_cores, Some(5.0));
}
