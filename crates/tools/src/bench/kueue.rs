//! `offload-bench kueue --jobs N`: a burst of N TrainingJobs created without Kueue, then N more
//! in a Kueue queue, on a cluster with a real node (Kueue's controller runs there as a pod, from
//! its own chart) and simulated GPU nodes of both classes with quota for every job; time from
//! each creation to Kueue's admission and to a running pod. The release operator runs as its
//! own process (controller only), as in `offload-bench controller`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use offload_api::names;
use offload_api::v1alpha1::{JobPhase, OffloadProfile, TrainingJob};
use offload_testenv::deploy::{self, GPU_TAINT_KEY};
use offload_testenv::devcluster::{ClusterOptions, DevCluster, repo_root};
use offload_testenv::fixtures;
use serde_json::json;

use super::cluster::{apply_crds, reported_node, spawn_operator, wait_ready};
use super::error::{BenchError, Result};
use super::measure::{machine, summary};

/// GPUs per simulated node.
const GPUS_PER_NODE: usize = 8;
/// When each job was created, admitted and first running.
#[derive(Default)]
struct Times {
    created: HashMap<String, Instant>,
    admitted: HashMap<String, Instant>,
    running: HashMap<String, Instant>,
}

type Shared = Arc<Mutex<Times>>;

/// Runs both bursts and prints the figures.
pub async fn run(jobs: usize) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(BenchError::unexpected(
            "the Kueue benchmark needs root: Kueue runs on the real node (kubelet, containerd)",
        ));
    }
    println!(
        "# kueue: {jobs} TrainingJobs without Kueue, then {jobs} in a Kueue queue ({})",
        machine()
    );
    let cluster = DevCluster::start(ClusterOptions::with_real_node()).await?;
    let client = cluster.client().await?;
    apply_crds(&client).await?;
    deploy::prepare_real_node(&client)
        .await
        .map_err(|e| BenchError::unexpected(e.to_string()))?;
    // GPUs for both bursts at once (the first burst's pods keep running), half of each class.
    let per_class = (2 * jobs).div_ceil(2 * GPUS_PER_NODE);
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..per_class {
        for (name, fixture) in [
            (format!("gh200-{i}"), fixtures::GH200_REFERENCE),
            (format!("h200-{i}"), fixtures::H200_READING),
        ] {
            let mut node = reported_node(&name, fixture)?;
            let gpus = GPUS_PER_NODE.to_string();
            node.spec = Some(serde_json::from_value(json!({"taints": [
                {"key": GPU_TAINT_KEY, "value": "present", "effect": "NoSchedule"}]}))?);
            node.status = Some(serde_json::from_value(json!({
                "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": gpus},
                "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": gpus}
            }))?);
            if let Some(a) = node.metadata.annotations.as_mut() {
                a.insert("kwok.x-k8s.io/node".into(), "fake".into());
            }
            nodes.create(&PostParams::default(), &node).await?;
        }
    }
    let took =
        deploy::install_kueue(&cluster).map_err(|e| BenchError::unexpected(e.to_string()))?;
    println!(
        "helm install kueue → controller ready: {:.1} s",
        took.as_secs_f64()
    );
    setup_queues(&cluster, &client, per_class * GPUS_PER_NODE).await?;
    let (mut op, admin) = spawn_operator(&cluster, None)?;
    wait_ready(admin, Duration::from_secs(60)).await?;

    let plain = burst(&client, "plain", jobs, None).await;
    let queued = burst(&client, "queued", jobs, Some("burst")).await;
    let _ = op.kill();
    let _ = op.wait();
    let (plain, queued) = (plain?, queued?);
    report("without Kueue", &plain, false);
    report("in a Kueue queue", &queued, true);
    Ok(())
}

/// The chart's ResourceFlavors (rendered by `helm template`), a ClusterQueue with both and quota
/// for `gpus` per class, its LocalQueue, and a profile per class.
async fn setup_queues(cluster: &DevCluster, client: &kube::Client, gpus: usize) -> Result<()> {
    let out = cluster
        .helm()
        .args(["template", "offload-operator"])
        .arg(repo_root().join("charts/offload-operator"))
        .args(["--show-only", "templates/kueue-flavors.yaml"])
        .args(["--set", "kueue.resourceFlavors.enabled=true"])
        .output()?;
    if !out.status.success() {
        return Err(BenchError::Command {
            what: "helm template".into(),
            detail: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let flavors: Vec<serde_json::Value> = ["offload-discrete", "offload-coherent"]
        .iter()
        .map(|f| {
            json!({"name": f, "resources": [
                {"name": "cpu", "nominalQuota": 100_000},
                {"name": "memory", "nominalQuota": "100Ti"},
                {"name": "nvidia.com/gpu", "nominalQuota": gpus}
            ]})
        })
        .collect();
    let queues = [
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
               "metadata": {"name": "burst"},
               "spec": {"namespaceSelector": {},
                        "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                                            "flavors": flavors}]}}),
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
               "metadata": {"name": "burst", "namespace": "queued"},
               "spec": {"clusterQueue": "burst"}}),
    ];
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in ["plain", "queued"] {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        namespaces.create(&PostParams::default(), &ns).await?;
    }
    let mut manifest = String::from_utf8_lossy(&out.stdout).into_owned();
    for q in queues {
        manifest.push_str("\n---\n");
        manifest.push_str(&q.to_string());
    }
    kubectl_apply(cluster, &manifest)?;
    let profiles: Api<OffloadProfile> = Api::all(client.clone());
    for (name, uma) in [("coherent", "true"), ("discrete", "false")] {
        let profile: OffloadProfile = serde_json::from_value(json!({
            "apiVersion": "offload.dev/v1alpha1", "kind": "OffloadProfile",
            "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": {names::LABEL_UMA: uma}}}
        }))?;
        profiles.create(&PostParams::default(), &profile).await?;
    }
    Ok(())
}

fn kubectl_apply(cluster: &DevCluster, manifest: &str) -> Result<()> {
    use std::io::Write;
    let mut child = cluster
        .kubectl()
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(manifest.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(BenchError::Command {
            what: "kubectl apply".into(),
            detail: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(())
}

/// Creates `jobs` TrainingJobs in `ns` (32 concurrent clients), alternating the two classes, in
/// `queue` if given; returns once each is running (or after 15 minutes).
async fn burst(
    client: &kube::Client,
    ns: &str,
    jobs: usize,
    queue: Option<&str>,
) -> Result<(Shared, f64)> {
    let times = Shared::default();
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), ns);
    let (done_tx, done) = tokio::sync::oneshot::channel::<()>();
    let watch = tokio::spawn(follow(tjs.clone(), times.clone(), jobs, done_tx));
    let start = Instant::now();
    let results = futures::stream::iter(0..jobs)
        .map(|i| {
            let tjs = tjs.clone();
            let times = times.clone();
            async move {
                let name = format!("burst-{i}");
                let profile = if i % 2 == 0 { "coherent" } else { "discrete" };
                let tj: TrainingJob = serde_json::from_value(deploy::queued_training_job(
                    &name, queue, profile, None, false,
                ))?;
                let t = Instant::now();
                tjs.create(&PostParams::default(), &tj).await?;
                if let Ok(mut times) = times.lock() {
                    times.created.insert(name, t);
                }
                Ok::<(), BenchError>(())
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let failed = results.iter().filter(|r| r.is_err()).count();
    if let Some(Err(e)) = results.into_iter().find(Result::is_err) {
        eprintln!("{failed} creations failed, the first: {e}");
    }
    let _ = tokio::time::timeout(Duration::from_secs(900), done).await;
    let wall = start.elapsed().as_secs_f64();
    watch.abort();
    Ok((times, wall))
}

/// Watches the jobs: when each is first admitted (its `Admitted` condition true) and first
/// running; tells `done` once all `jobs` run.
async fn follow(
    tjs: Api<TrainingJob>,
    times: Shared,
    jobs: usize,
    done: tokio::sync::oneshot::Sender<()>,
) {
    let stream = watcher(tjs, watcher::Config::default()).touched_objects();
    futures::pin_mut!(stream);
    let mut done = Some(done);
    while let Ok(Some(tj)) = stream.try_next().await {
        let (Some(name), Some(status)) = (tj.metadata.name.clone(), tj.status.as_ref()) else {
            continue;
        };
        let Ok(mut t) = times.lock() else { return };
        let now = Instant::now();
        if status
            .conditions
            .iter()
            .any(|c| c.type_ == "Admitted" && c.status == "True")
        {
            t.admitted.entry(name.clone()).or_insert(now);
        }
        if status.phase == Some(JobPhase::Running) {
            t.running.entry(name).or_insert(now);
        }
        if t.running.len() >= jobs
            && let Some(tx) = done.take()
        {
            let _ = tx.send(());
        }
    }
}

fn report(what: &str, (times, wall): &(Shared, f64), queued: bool) {
    let Ok(t) = times.lock() else { return };
    let since = |seen: &HashMap<String, Instant>| -> Vec<f64> {
        t.created
            .iter()
            .filter_map(|(n, t0)| {
                Some(seen.get(n)?.saturating_duration_since(*t0).as_secs_f64() * 1e3)
            })
            .collect()
    };
    println!(
        "\n## {what}: {} created, {} running after {wall:.1} s",
        t.created.len(),
        t.running.len()
    );
    let line = |label: &str, ms: Vec<f64>| {
        let n = ms.len();
        let s = summary(ms);
        println!(
            "{label} ({n} jobs): mean {:.0} ms, p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
            s.mean, s.p50, s.p99, s.max
        );
    };
    if queued {
        line("creation → admitted by Kueue", since(&t.admitted));
    }
    line("creation → running", since(&t.running));
}
