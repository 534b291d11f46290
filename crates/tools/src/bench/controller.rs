//! `offload-bench controller --jobs N`: N TrainingJobs created in a burst against the local
//! control plane; time from creation to workload (p50/p99), the operator's CPU time and peak
//! RSS (the release `offload-operator` binary, as its own process).

use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, PostParams};
use offload_api::v1alpha1::TrainingJob;
use offload_testenv::devcluster::{ClusterOptions, DevCluster};
use serde_json::json;

use super::cluster::{
    Times, latencies_ms, setup_cluster, spawn_operator, wait_ready, watch_workloads,
};
use super::error::Result;
use super::measure::{cpu_seconds, machine, proc_status, summary};

/// Runs the burst.
pub async fn run(jobs: usize) -> Result<()> {
    println!(
        "# controller: {jobs} TrainingJobs in a burst ({})",
        machine()
    );
    let cluster = DevCluster::start(ClusterOptions::default()).await?;
    let client = setup_cluster(&cluster).await?;
    let (mut op, admin) = spawn_operator(&cluster, None)?;
    let pid = op.id();
    wait_ready(admin, Duration::from_secs(60)).await?;
    let cpu0 = cpu_seconds(pid).unwrap_or(0.0);

    let created = Times::default();
    let (seen, all_seen, watch) = watch_workloads(&client, "default", jobs);
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), "default");
    let start = Instant::now();
    futures::stream::iter(0..jobs)
        .map(|i| {
            let tjs = tjs.clone();
            let created = created.clone();
            async move {
                let name = format!("burst-{i}");
                let tj: TrainingJob = serde_json::from_value(json!({
                    "apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
                    "metadata": {"name": name, "annotations": {"offload.dev/profile": "auto"}},
                    "spec": {"framework": {"name": "DeepSpeed", "version": "0.19.8"},
                             "template": {"spec": {"containers": [{"name": "t", "image": "train:1"}]}}}
                }))
                .ok()?;
                let t = Instant::now();
                tjs.create(&PostParams::default(), &tj).await.ok()?;
                created.lock().ok()?.insert(name, t);
                Some(())
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    let create_wall = start.elapsed().as_secs_f64();
    let _ = tokio::time::timeout(Duration::from_secs(600), all_seen).await;
    let all_wall = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid).unwrap_or(0.0) - cpu0;
    let hwm = proc_status(pid, "VmHWM:").unwrap_or(0);
    let rss = proc_status(pid, "VmRSS:").unwrap_or(0);
    let _ = op.kill();
    let _ = op.wait();
    watch.abort();
    let latencies = latencies_ms(&created, &seen);
    let created = created.lock().map(|c| c.len()).unwrap_or(0);
    let n = latencies.len();
    let s = summary(latencies);
    println!(
        "created {created} TrainingJobs in {create_wall:.1} s (32 concurrent clients); {n} workloads seen after {all_wall:.1} s",
    );
    println!(
        "creation → workload Job: mean {:.0} ms, p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        s.mean, s.p50, s.p99, s.max
    );
    #[allow(clippy::cast_precision_loss)]
    let (hwm, rss) = (hwm as f64 / 1024.0, rss as f64 / 1024.0);
    println!(
        "operator CPU {cpu:.1} s over the burst ({:.0} % of one core), peak RSS {hwm:.0} MiB, RSS at end {rss:.0} MiB",
        cpu / all_wall * 100.0,
    );
    Ok(())
}
