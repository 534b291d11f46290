//! `offload-bench sizer-wait --jobs N`: how much later a TrainingJob's workload is created when
//! the operator traces its model first. The release operator (its own process) against the
//! local control plane with kwok; N jobs of one model (a `config.json` and tokens) created one
//! after another, creation → workload Job, three ways: the sizer off; the first job of a step
//! (the sizer's Job created, scheduled, run and read, its trace kept); the later jobs of the
//! step (the kept trace). kwok stands in for the sizer's process (its pod ends with the trace
//! the sizer writes, `crates/testenv/kwok/pod-sized.yaml`): what the operator adds is measured;
//! the sizer's own run (`offload-bench sizer`) and pulling the job's image come on top.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node};
use kube::api::{Api, PostParams};
use offload_api::v1alpha1::TrainingJob;
use offload_testenv::devcluster::{ClusterOptions, DevCluster};
use serde_json::json;

use super::cluster::{apply_crds, spawn_operator_with, wait_ready, watch_workloads};
use super::error::Result;
use super::measure::{machine, summary};

const CONFIG: &str = include_str!("../../../../hack/gpu/models/new/nemotron-4b.json");
const TRACE: &str = include_str!("../../../../tests/fixtures/traces/nemotron-4b-4096.json");

/// Runs the three ways.
pub async fn run(jobs: usize) -> Result<()> {
    println!(
        "# sizer-wait: {jobs} TrainingJobs each way, one after another ({})",
        machine()
    );
    let cluster = DevCluster::start(ClusterOptions::full()).await?;
    let client = cluster.client().await?;
    apply_crds(&client).await?;
    for ns in ["offload-system", "off", "on"] {
        let n: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &n)
            .await?;
    }
    let node: Node = offload_testenv::support::reported_node(
        "h200-0",
        offload_testenv::fixtures::H200_READING,
        "bench",
    );
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await?;
    let profile = offload_testenv::support::pool_profile("default", "bench", json!({}));
    Api::<offload_api::v1alpha1::OffloadProfile>::all(client.clone())
        .create(&PostParams::default(), &profile)
        .await?;
    let mut rows = Vec::new();
    for (ns, sizer, steps) in [("off", false, 1), ("first", true, jobs), ("on", true, 1)] {
        if ns == "first" {
            let n: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
            Api::<Namespace>::all(client.clone())
                .create(&PostParams::default(), &n)
                .await?;
        }
        for i in 0..steps {
            // The same model under another name: another config.json, another step.
            let mut config: serde_json::Value = serde_json::from_str(CONFIG)?;
            config["_name_or_path"] = format!("copy-{i}").into();
            let cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": format!("model-{i}")},
                "data": {"config.json": config.to_string()}
            }))?;
            Api::<ConfigMap>::namespaced(client.clone(), ns)
                .create(&PostParams::default(), &cm)
                .await?;
        }
        let (mut op, admin) = spawn_operator_with(
            &cluster,
            None,
            &[&format!("--sizer={sizer}"), "--sizer-timeout=60s"],
        )?;
        wait_ready(admin, Duration::from_secs(60)).await?;
        let ms = one_by_one(&client, ns, jobs, steps).await?;
        let traced = traced_jobs(&client, ns).await?;
        let _ = op.kill();
        let _ = op.wait();
        let what = match ns {
            "off" => "the sizer off",
            "first" => "the sizer on: each the first job of its step",
            _ => "the sizer on: jobs of one step (the first traced, then its kept trace)",
        };
        rows.push((what, ms, traced));
    }
    println!(
        "\n| TrainingJobs | jobs | decided from a trace | creation → workload: p50 / max (ms) |"
    );
    println!("|---|---|---|---|");
    for (what, ms, traced) in rows {
        let n = ms.len();
        let s = summary(ms);
        println!("| {what} | {n} | {traced} | {:.0} / {:.0} |", s.p50, s.max);
    }
    Ok(())
}

/// How many of `ns`'s TrainingJobs were decided from their model's trace, once every one's
/// decision is in its status (written just after its workload), or after 30 s.
async fn traced_jobs(client: &kube::Client, ns: &str) -> Result<usize> {
    let api = Api::<TrainingJob>::namespaced(client.clone(), ns);
    let start = Instant::now();
    loop {
        let items = api.list(&Default::default()).await?.items;
        let decided: Vec<Vec<String>> = items
            .iter()
            .filter_map(|tj| {
                let o = tj.status.as_ref()?.offload.as_ref()?;
                Some(o.reasons.iter().map(|r| r.message.clone()).collect())
            })
            .collect();
        if decided.len() == items.len() || start.elapsed() > Duration::from_secs(30) {
            return Ok(decided
                .iter()
                .filter(|r| r.iter().any(|m| m.contains("traced from the model's code")))
                .count());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Creates `jobs` TrainingJobs in `ns` one after another (job `i` of model `i` mod `models`),
/// each once the one before has its workload: creation → workload, ms.
async fn one_by_one(
    client: &kube::Client,
    ns: &str,
    jobs: usize,
    models: usize,
) -> Result<Vec<f64>> {
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), ns);
    let mut out = Vec::new();
    for i in 0..jobs {
        let name = format!("step-{i}");
        let (seen, all_seen, watch) = watch_workloads(client, ns, i + 1);
        let tj: TrainingJob = serde_json::from_value(json!({
            "apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": name, "annotations": {"offload.dev/profile": "default"}},
            "spec": {
                "replicas": 1,
                "framework": {"name": "DeepSpeed", "version": "0.19.8"},
                "model": {"configMapRef": {"name": format!("model-{}", i % models.max(1))},
                          "tokensPerStep": 4096},
                "template": {
                    "metadata": {"annotations": {"offload.dev/kwok-trace": TRACE}},
                    "spec": {"containers": [{"name": "t", "image": "train:1",
                        "resources": {"limits": {"nvidia.com/gpu": 1}}}]}
                }
            }
        }))?;
        let t0 = Instant::now();
        tjs.create(&PostParams::default(), &tj).await?;
        let _ = tokio::time::timeout(Duration::from_secs(120), all_seen).await;
        watch.abort();
        if let Some(t1) = seen.lock().ok().and_then(|s| s.get(&name).copied()) {
            out.push(t1.saturating_duration_since(t0).as_secs_f64() * 1e3);
        }
    }
    Ok(out)
}
