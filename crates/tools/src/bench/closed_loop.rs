//! `offload-bench closed-loop`: what the closed loop costs at scale. Thousands of simulated GPU
//! nodes (kwok), one TrainingJob without model hints per node with its pod bound there, then
//! rounds of observations: every node's agent summary (the annotation the agent writes, a
//! recorded window naming the node's pod with its GPU and host peaks) published at once.
//! Each round is followed to the end — every job's `status.observed.memory` holding the round's
//! window — against the release operator as its own process, which learns each job's size
//! from its peaks and keeps it in its ConfigMap.
//!
//! Prints per round: the time until every status holds it, the operator's CPU (total and per
//! observation) and RSS, every API request by resource and verb (the API server's own counter)
//! and the operator's requests per observation, and the learned ConfigMap's size.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use offload_api::names;
use offload_api::observed::{
    BusySource, HostMemorySource, OBSERVED_SCHEMA_VERSION, ObservedSummary, PodObservation,
};
use offload_api::v1alpha1::{OffloadProfile, TrainingJob};
use serde_json::json;

use super::cluster::{spawn_operator, wait_ready, watch_workloads};
use super::error::{BenchError, Result};
use super::measure::{cpu_seconds, machine, proc_status};
use super::scale::{gpu_bytes_of, kwok_cluster, node_names, nodes, request_counts};

const NAMESPACE: &str = "loop";
const GIB: u64 = 1 << 30;

fn training_job(i: usize) -> Result<TrainingJob> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": format!("tj-{i}"), "annotations": {names::PROFILE_ANNOTATION: names::DEFAULT_PROFILE}},
        "spec": {"replicas": 1,
                 "framework": {"name": "DeepSpeed", "version": "0.19.8"},
                 "template": {"spec": {"containers": [{"name": "t", "image": format!("train:{i}"),
                    "resources": {"limits": {names::GPU_RESOURCE: "1"}}}]}}}
    }))?)
}

/// The job's pod, bound to its node (as the scheduler would bind it).
fn pod(i: usize, node: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("tj-{i}-0"), "labels": {names::LABEL_TRAINING_JOB: format!("tj-{i}")}},
        "spec": {"nodeName": node, "containers": [{"name": "t", "image": "train:1"}],
                 "tolerations": [{"operator": "Exists"}]}
    }))?)
}

/// Node `node`'s window of round `round`: its job's pod at a third of its GPU, rising a GiB a
/// round, and 20 GiB of host memory.
fn window(node: &str, i: usize, round: u64) -> Result<String> {
    let total = gpu_bytes_of(node).unwrap_or(80 * GIB);
    Ok(ObservedSummary {
        schema_version: OBSERVED_SCHEMA_VERSION,
        node: node.into(),
        observed_at: jiff::Timestamp::now().to_string(),
        window_seconds: 60.0,
        source: BusySource::RecordedTrace,
        pods: vec![PodObservation {
            namespace: NAMESPACE.into(),
            name: format!("tj-{i}-0"),
            training_job: Some(format!("tj-{i}")),
            gpus: vec!["GPU-0".into()],
            gpu_busy: 0.9,
            samples: 600,
            cpu_cores: Some(4.0),
            gpu_memory_peak_bytes: Some(total / 3 + round * GIB),
            gpu_memory_total_bytes: Some(total),
            process_gpu_memory_peak_bytes: None,
            host_memory_peak_bytes: Some(20 * GIB + round * GIB),
            host_memory_source: Some(HostMemorySource::CgroupPeak),
            allocator_peak_bytes: None,
            step_seconds: None,
        }],
    }
    .to_annotation()?)
}

/// Jobs whose status holds `windows` windows of observed memory.
async fn observed(tjs: &Api<TrainingJob>, windows: i32) -> Result<usize> {
    Ok(tjs
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|tj| {
            tj.status
                .as_ref()
                .and_then(|s| s.observed.as_ref())
                .and_then(|o| o.memory.as_ref())
                .is_some_and(|m| m.windows >= windows)
        })
        .count())
}

/// Runs the benchmark with `count` nodes (and as many jobs) and `rounds` rounds.
pub async fn run(count: usize, rounds: u64) -> Result<()> {
    println!(
        "# closed loop: {count} simulated GPU nodes, one TrainingJob without hints on each, {rounds} rounds of observations from every node ({})",
        machine()
    );
    let (cluster, client) = kwok_cluster(NAMESPACE).await?;
    // No controller-manager here to make the namespace's default ServiceAccount the pods name.
    let sa: k8s_openapi::api::core::v1::ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default"}}))?;
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &sa)
        .await?;
    let took = nodes(&client, count).await?;
    println!("\n{count} nodes created with their reports in {took:.1} s");
    let profile: OffloadProfile = serde_json::from_value(json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "OffloadProfile",
        "metadata": {"name": names::DEFAULT_PROFILE}, "spec": {}
    }))?;
    Api::<OffloadProfile>::all(client.clone())
        .create(&PostParams::default(), &profile)
        .await?;
    let (mut op, admin) = spawn_operator(&cluster, None)?;
    let pid = op.id();
    wait_ready(admin, Duration::from_secs(120)).await?;
    let outcome = rounds_of(&client, pid, count, rounds).await;
    let _ = op.kill();
    let _ = op.wait();
    outcome
}

async fn rounds_of(client: &kube::Client, pid: u32, count: usize, rounds: u64) -> Result<()> {
    let names = node_names(count);
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), NAMESPACE);
    let (_, all_seen, watch) = watch_workloads(client, NAMESPACE, count);
    let start = Instant::now();
    let created: Vec<Result<()>> = futures::stream::iter(0..count)
        .map(|i| {
            let tjs = tjs.clone();
            async move {
                tjs.create(&PostParams::default(), &training_job(i)?)
                    .await?;
                Ok(())
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    created.into_iter().collect::<Result<Vec<()>>>()?;
    tokio::time::timeout(Duration::from_secs(1800), all_seen)
        .await
        .map_err(|_| BenchError::unexpected("the workloads were not all created"))?
        .map_err(|_| BenchError::unexpected("the workload watch ended"))?;
    watch.abort();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let bound: Vec<Result<()>> = futures::stream::iter(names.iter().enumerate())
        .map(|(i, node)| {
            let pods = pods.clone();
            async move {
                pods.create(&PostParams::default(), &pod(i, node)?).await?;
                Ok(())
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    bound.into_iter().collect::<Result<Vec<()>>>()?;
    println!(
        "{count} TrainingJobs decided, their workloads created and a pod of each bound to its node in {:.1} s; operator RSS {:.0} MiB",
        start.elapsed().as_secs_f64(),
        mib(proc_status(pid, "VmRSS:").unwrap_or(0))
    );
    for round in 1..=rounds {
        one_round(client, &tjs, pid, &names, round).await?;
    }
    Ok(())
}

/// One round: every node publishes a new observation window; the jobs' statuses are waited
/// for, and the operator's CPU, memory, requests and learned store reported.
async fn one_round(
    client: &kube::Client,
    tjs: &Api<TrainingJob>,
    pid: u32,
    names: &[String],
    round: u64,
) -> Result<()> {
    let count = names.len();
    let nodes_api: Api<Node> = Api::all(client.clone());
    let before = request_counts(client).await?;
    let cpu0 = cpu_seconds(pid).unwrap_or(0.0);
    let t0 = Instant::now();
    let published: Vec<Result<()>> = futures::stream::iter(names.iter().enumerate())
        .map(|(i, node)| {
            let api = nodes_api.clone();
            async move {
                let value = window(node, i, round)?;
                api.patch(
                    node,
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"annotations": {names::ANNOTATION_OBSERVED: value}}}),
                    ),
                )
                .await?;
                Ok(())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    published.into_iter().collect::<Result<Vec<()>>>()?;
    let publish_s = t0.elapsed().as_secs_f64();
    let windows = i32::try_from(round).unwrap_or(i32::MAX);
    let mut seen = 0;
    let deadline = Instant::now() + Duration::from_secs(900);
    while Instant::now() < deadline {
        seen = observed(tjs, windows).await?;
        if seen >= count {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let wall = t0.elapsed().as_secs_f64();
    // The store writes in batches every few seconds: let the last one land.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let cpu = cpu_seconds(pid).unwrap_or(0.0) - cpu0;
    let after = request_counts(client).await?;
    let cm: Option<ConfigMap> = Api::namespaced(client.clone(), "offload-system")
        .get_opt("offload-operator-learned")
        .await?;
    let stored = cm
        .and_then(|c| c.data)
        .and_then(|d| d.get("memory.json").map(String::len))
        .unwrap_or(0);
    println!(
        "\nround {round}: {count} windows published in {publish_s:.1} s (32 at a time); {seen} of {count} jobs' statuses hold it after {wall:.1} s"
    );
    #[allow(clippy::cast_precision_loss)]
    let per = cpu / count.max(1) as f64 * 1e3;
    println!(
        "operator: CPU {cpu:.1} s ({per:.2} ms per observation), peak RSS {:.0} MiB, RSS {:.0} MiB; learned ConfigMap {:.0} KiB",
        mib(proc_status(pid, "VmHWM:").unwrap_or(0)),
        mib(proc_status(pid, "VmRSS:").unwrap_or(0)),
        stored as f64 / 1024.0
    );
    requests(&before, &after, count);
    Ok(())
}

#[allow(clippy::cast_precision_loss)]
fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The round's API requests by resource and verb, and the operator's per observation: its
/// writes and reads on TrainingJobs, ConfigMaps, Events and Jobs (the bench's node patches and
/// status lists, kwok's pod lists and status patches left out).
fn requests(
    before: &BTreeMap<(String, String), f64>,
    after: &BTreeMap<(String, String), f64>,
    count: usize,
) {
    println!("| resource | verb | requests |");
    println!("|---|---|---|");
    let mut operator = 0.0;
    for ((resource, verb), value) in after {
        let delta = value
            - before
                .get(&(resource.clone(), verb.clone()))
                .unwrap_or(&0.0);
        if delta < 0.5 {
            continue;
        }
        println!("| {resource} | {verb} | {delta:.0} |");
        // kwok lists pods and updates their status, and the bench lists TrainingJobs: the
        // operator's are its writes and reads of these kinds (it lists only when a watch starts).
        let ours = matches!(
            resource.as_str(),
            "trainingjobs" | "trainingjobs/status" | "configmaps" | "events" | "jobs"
        );
        if ours && verb != "WATCH" && verb != "LIST" {
            operator += delta;
        }
    }
    #[allow(clippy::cast_precision_loss)]
    let per = operator / count.max(1) as f64;
    println!("\noperator requests per observation: {per:.2}");
}
