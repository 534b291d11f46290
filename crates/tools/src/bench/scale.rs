//! `offload-bench scale`: a cluster of thousands of simulated GPU nodes (kwok) in three classes,
//! their reports published through the agent's own publishing code, then TrainingJobs and
//! opted-in batch Jobs created in one burst, at the same time, against the release operator
//! (controller and webhook) as its own process.
//!
//! Prints: time until every TrainingJob is resolved and its workload exists (per job p50/p99,
//! total, jobs/s), the webhook's latency during the burst (as the creating client sees it and as
//! the handler measures itself), the operator's CPU and peak RSS, and the API requests the
//! operator made per job (from the API server's own request counter).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, ListParams, PostParams};
use offload_api::names;
use offload_api::report::NodeReport;
use offload_api::v1alpha1::{OffloadProfile, TrainingJob};
use offload_testenv::devcluster::{ClusterOptions, DevCluster};
use offload_testenv::fixtures;
use offload_testenv::support::kwok_node;
use serde_json::json;

use super::cluster::{
    Times, apply_crds, handler_seconds, latencies_ms, register_webhook, spawn_operator, wait_ready,
    watch_workloads,
};
use super::error::{BenchError, Result};
use super::measure::{cpu_seconds, machine, proc_status, summary};

/// Sizes of one run.
pub struct Sizes {
    /// Simulated GPU nodes (a third each coherent, HMM and discrete).
    pub nodes: usize,
    /// TrainingJobs in the burst.
    pub jobs: usize,
    /// Opted-in batch Jobs created through the webhook during the burst.
    pub batch_jobs: usize,
}

/// What runs against the burst instead of the operator.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Peer {
    /// `offload-bench noop-operator`: the operator's requests per job, nothing decided.
    Noop,
}

const NAMESPACE: &str = "scale";

/// The class prefix of node `i` of [`nodes`], with its fixture.
const CLASSES: [(&str, &str); 3] = [
    ("gh200", fixtures::GH200_REFERENCE),
    ("hmm", fixtures::HMM_UNPINNED),
    ("h200", fixtures::H200_READING),
];

/// GPU memory of a node named by [`node_names`] (its class's fixture), each fixture read once.
pub(super) fn gpu_bytes_of(node: &str) -> Option<u64> {
    static TOTALS: std::sync::OnceLock<Vec<(&'static str, Option<u64>)>> =
        std::sync::OnceLock::new();
    let totals = TOTALS.get_or_init(|| {
        CLASSES
            .iter()
            .map(|(class, fixture)| {
                let total = NodeReport::parse(fixture)
                    .ok()
                    .and_then(|r| r.gpus.first().map(|g| g.memory_total_bytes));
                (*class, total)
            })
            .collect()
    });
    totals
        .iter()
        .find(|(class, _)| node.starts_with(&format!("{class}-")))
        .and_then(|(_, total)| *total)
}

/// The names [`nodes`] gives `count` nodes, in order.
pub(super) fn node_names(count: usize) -> Vec<String> {
    (0..count)
        .map(|i| format!("{}-{i:05}", CLASSES[i % CLASSES.len()].0))
        .collect()
}

/// Creates the nodes and publishes each one's report with the agent's code; returns the
/// seconds it took.
pub(super) async fn nodes(client: &kube::Client, count: usize) -> Result<f64> {
    let start = Instant::now();
    let api: Api<Node> = Api::all(client.clone());
    let classes = CLASSES;
    let results: Vec<Result<()>> = futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            let client = client.clone();
            let (class, fixture) = classes[i % classes.len()];
            async move {
                let name = format!("{class}-{i:05}");
                api.create(&PostParams::default(), &kwok_node(&name, &[], &[]))
                    .await?;
                let mut report = NodeReport::parse(fixture)
                    .map_err(|e| BenchError::unexpected(format!("fixture: {e}")))?;
                report.node = name;
                offload_agent::daemon::publish(&client, &report)
                    .await
                    .map_err(|e| BenchError::unexpected(e.to_string()))?;
                Ok(())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    Ok(start.elapsed().as_secs_f64())
}

/// The API server's request counter, summed by (resource, verb).
pub(super) async fn request_counts(
    client: &kube::Client,
) -> Result<BTreeMap<(String, String), f64>> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await?;
    let mut out = BTreeMap::new();
    let metrics = offload_testenv::http::Metrics::parse(&text);
    for (labels, value) in metrics.samples("apiserver_request_total") {
        let label = |key: &str| labels.get(key).unwrap_or_default().to_string();
        let resource = match label("subresource").as_str() {
            "" => label("resource"),
            sub => format!("{}/{sub}", label("resource")),
        };
        *out.entry((resource, label("verb"))).or_insert(0.0) += value;
    }
    Ok(out)
}

fn batch_job(i: usize) -> Result<Job> {
    let labels = json!({names::PROFILE_ANNOTATION: names::PROFILE_AUTO});
    Ok(serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": format!("batch-{i}"), "labels": labels},
        "spec": {"suspend": true, "template": {
            "metadata": {"labels": labels},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "train", "image": "registry.example.com/train:1",
                "env": [{"name": "FRAMEWORK", "value": "deepspeed"}],
                "resources": {"limits": {names::GPU_RESOURCE: "1"}}}]}}}
    }))?)
}

fn training_job(i: usize) -> Result<TrainingJob> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": format!("tj-{i}"), "annotations": {names::PROFILE_ANNOTATION: names::PROFILE_AUTO}},
        "spec": {"replicas": 2,
                 "framework": {"name": "DeepSpeed", "version": "0.19.8"},
                 "template": {"spec": {"containers": [{"name": "t", "image": "train:1",
                    "resources": {"limits": {names::GPU_RESOURCE: "1"}}}]}}}
    }))?)
}

/// A control plane with kwok, the CRDs applied and namespaces `offload-system` and
/// `namespace`.
pub(super) async fn kwok_cluster(namespace: &str) -> Result<(DevCluster, kube::Client)> {
    let cluster = DevCluster::start(ClusterOptions {
        kwok: true,
        ..ClusterOptions::default()
    })
    .await?;
    let client = cluster.client().await?;
    apply_crds(&client).await?;
    for ns in ["offload-system", namespace] {
        let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &obj)
            .await?;
    }
    Ok((cluster, client))
}

/// Runs the benchmark.
pub async fn run(sizes: Sizes, peer: Option<Peer>) -> Result<()> {
    let Sizes {
        nodes: node_count,
        jobs,
        batch_jobs,
    } = sizes;
    println!(
        "# scale: {node_count} simulated GPU nodes, {jobs} TrainingJobs and {batch_jobs} opted-in batch Jobs in one burst ({})",
        machine()
    );
    let (cluster, client) = kwok_cluster(NAMESPACE).await?;
    let took = nodes(&client, node_count).await?;
    println!(
        "\n{node_count} nodes created and their reports published (agent code, 32 at a time) in {took:.1} s"
    );
    let profile: OffloadProfile = serde_json::from_value(json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "OffloadProfile",
        "metadata": {"name": names::DEFAULT_PROFILE}, "spec": {}
    }))?;
    Api::<OffloadProfile>::all(client.clone())
        .create(&PostParams::default(), &profile)
        .await?;
    let port = register_webhook(&cluster)?;
    let (mut op, admin) = match peer {
        None => spawn_operator(&cluster, Some(port))?,
        Some(Peer::Noop) => spawn_noop(&cluster, port)?,
    };
    let what = match peer {
        None => "operator",
        Some(Peer::Noop) => "no-op peer (the operator's requests per job, nothing decided)",
    };
    let pid = op.id();
    let ready_from = Instant::now();
    wait_ready(admin, Duration::from_secs(120)).await?;
    println!(
        "{what} ready (caches of {node_count} nodes synced, webhook serving) in {:.1} s, RSS {:.0} MiB",
        ready_from.elapsed().as_secs_f64(),
        mib(proc_status(pid, "VmRSS:").unwrap_or(0))
    );

    let components = cluster.pids();
    let outcome = burst(&client, admin, pid, &components, jobs, batch_jobs).await;
    let _ = op.kill();
    let _ = op.wait();
    outcome
}

#[allow(clippy::cast_precision_loss)]
fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Starts `offload-bench noop-operator` (this binary) against `cluster`, its webhook on `port`.
fn spawn_noop(cluster: &DevCluster, port: u16) -> Result<(std::process::Child, u16)> {
    let admin = offload_testenv::devcluster::free_port()?;
    let child = std::process::Command::new(std::env::current_exe()?)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .args([
            "noop-operator",
            "--webhook-addr",
            &format!("127.0.0.1:{port}"),
        ])
        .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()?;
    Ok((child, admin))
}

async fn burst(
    client: &kube::Client,
    admin: u16,
    pid: u32,
    components: &BTreeMap<&'static str, u32>,
    jobs: usize,
    batch_jobs: usize,
) -> Result<()> {
    let created = Times::default();
    let (seen, all_seen, watch) = watch_workloads(client, NAMESPACE, jobs);
    let before = request_counts(client).await?;
    let handler_before = handler_seconds(admin, "mutate-workload")
        .await
        .unwrap_or((0.0, 0.0));
    let meter = CpuMeter::start(pid, components);
    let start = Instant::now();

    let ((tj_errors, tjs), (batch_ms, unconfigured, batch_errors)) = tokio::join!(
        create_training_jobs(client, jobs, &created),
        create_batch_jobs(client, batch_jobs)
    );
    let create_wall = start.elapsed().as_secs_f64();
    let completed = tokio::time::timeout(Duration::from_secs(1800), all_seen)
        .await
        .is_ok();
    let all_wall = start.elapsed().as_secs_f64();
    let (cpu, parts, own) = meter.since();
    let hwm = proc_status(pid, "VmHWM:").unwrap_or(0);
    let rss = proc_status(pid, "VmRSS:").unwrap_or(0);
    let handler_after = handler_seconds(admin, "mutate-workload")
        .await
        .unwrap_or((0.0, 0.0));
    let after = request_counts(client).await?;
    watch.abort();

    let listed = tjs.list(&ListParams::default()).await?.items;
    let (resolved, modes) = resolved_by_mode(&listed);

    let latencies = latencies_ms(&created, &seen);
    let created = created.lock().map(|c| c.len()).unwrap_or(0);
    let n = latencies.len();
    let s = summary(latencies);
    println!(
        "\nburst: {created} TrainingJobs (24 clients) and {} batch Jobs (8 clients) created in {create_wall:.1} s; {} errors creating TrainingJobs, {} creating batch Jobs",
        batch_ms.len(),
        tj_errors.len(),
        batch_errors.len()
    );
    for e in tj_errors.iter().chain(&batch_errors).take(3) {
        println!("  e.g. {e}");
    }
    println!(
        "{n} of {jobs} workloads seen after {all_wall:.1} s{}; {resolved} of {} TrainingJobs resolved with their decision recorded ({})",
        if completed { "" } else { " (gave up waiting)" },
        listed.len(),
        modes
            .iter()
            .map(|(m, c)| format!("{c} {m}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    #[allow(clippy::cast_precision_loss)]
    let rate = n as f64 / all_wall;
    println!(
        "TrainingJob creation → workload Job: mean {:.0} ms, p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; {rate:.1} jobs/s over the burst",
        s.mean, s.p50, s.p99, s.max
    );
    let b = summary(batch_ms);
    let (hs, hc) = (
        handler_after.0 - handler_before.0,
        handler_after.1 - handler_before.1,
    );
    println!(
        "batch Job creation through the webhook (client side): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; {unconfigured} admitted without configuration; handler's own mean {:.3} ms over {hc:.0} requests",
        b.p50,
        b.p99,
        b.max,
        if hc > 0.0 { hs / hc * 1e3 } else { 0.0 }
    );
    println!(
        "operator: CPU {cpu:.1} s over {all_wall:.1} s ({:.0} % of one core), peak RSS {:.0} MiB, RSS at end {:.0} MiB",
        cpu / all_wall * 100.0,
        mib(hwm),
        mib(rss)
    );
    print_cpu_shares(all_wall, cpu, parts, own);
    requests_table(&before, &after, jobs, batch_jobs);
    Ok(())
}

/// CPU seconds of the operator (or its peer), of each control-plane component and of this
/// bench's own clients, from a starting point.
struct CpuMeter<'a> {
    pid: u32,
    components: &'a BTreeMap<&'static str, u32>,
    operator: f64,
    parts: BTreeMap<&'static str, f64>,
    own: f64,
}

impl<'a> CpuMeter<'a> {
    fn start(pid: u32, components: &'a BTreeMap<&'static str, u32>) -> Self {
        Self {
            pid,
            components,
            operator: cpu_seconds(pid).unwrap_or(0.0),
            parts: components
                .iter()
                .map(|(name, p)| (*name, cpu_seconds(*p).unwrap_or(0.0)))
                .collect(),
            own: cpu_seconds(std::process::id()).unwrap_or(0.0),
        }
    }

    /// (operator, each component, this bench) since the start.
    fn since(&self) -> (f64, Vec<(&'static str, f64)>, f64) {
        let parts = self
            .components
            .iter()
            .map(|(name, p)| {
                (
                    *name,
                    cpu_seconds(*p).unwrap_or(0.0) - self.parts.get(name).copied().unwrap_or(0.0),
                )
            })
            .collect();
        (
            cpu_seconds(self.pid).unwrap_or(0.0) - self.operator,
            parts,
            cpu_seconds(std::process::id()).unwrap_or(0.0) - self.own,
        )
    }
}

/// Each part's share of the machine's core-seconds over the burst.
fn print_cpu_shares(all_wall: f64, cpu: f64, parts: Vec<(&'static str, f64)>, own: f64) {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    #[allow(clippy::cast_precision_loss)]
    let capacity = all_wall * cores as f64;
    let mut shares = vec![("operator (or peer)", cpu)];
    shares.extend(parts);
    shares.push(("this bench's clients", own));
    println!(
        "\nCPU over the burst ({cores} cores, {capacity:.0} core-seconds in all): {}; {:.0} % of the machine in all",
        shares
            .iter()
            .map(|(n, c)| format!("{n} {c:.1} s ({:.0} %)", c / capacity * 100.0))
            .collect::<Vec<_>>()
            .join(", "),
        shares.iter().map(|(_, c)| c).sum::<f64>() / capacity * 100.0
    );
}

/// The API requests of the burst by resource and verb, and those the operator made per
/// TrainingJob: every request on the workload's kinds and on TrainingJobs, less the bench's
/// own creates and the watch requests.
fn requests_table(
    before: &BTreeMap<(String, String), f64>,
    after: &BTreeMap<(String, String), f64>,
    jobs: usize,
    batch_jobs: usize,
) {
    const OURS: [&str; 7] = [
        "trainingjobs",
        "trainingjobs/status",
        "jobs",
        "services",
        "configmaps",
        "events",
        "pods",
    ];
    println!("\nAPI requests during the burst (API server's apiserver_request_total):");
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
        if OURS.contains(&resource.as_str()) && verb != "WATCH" {
            operator += delta;
        }
    }
    #[allow(clippy::cast_precision_loss)]
    let bench = (jobs + batch_jobs) as f64;
    #[allow(clippy::cast_precision_loss)]
    let per_job = (operator - bench) / jobs.max(1) as f64;
    println!(
        "\noperator requests per TrainingJob: {per_job:.2} (requests on TrainingJobs and workload kinds, less the bench's {bench:.0} creates)"
    );
}

/// Creates `jobs` TrainingJobs from 24 clients, recording when each was created; the errors,
/// and the API of their namespace.
async fn create_training_jobs(
    client: &kube::Client,
    jobs: usize,
    created: &Times,
) -> (Vec<String>, Api<TrainingJob>) {
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), NAMESPACE);
    let results = futures::stream::iter(0..jobs)
        .map(|i| {
            let tjs = tjs.clone();
            let created = created.clone();
            async move {
                let tj = training_job(i)?;
                let t = Instant::now();
                tjs.create(&PostParams::default(), &tj).await?;
                if let Ok(mut c) = created.lock() {
                    c.insert(format!("tj-{i}"), t);
                }
                Ok::<(), BenchError>(())
            }
        })
        .buffer_unordered(24)
        .collect::<Vec<_>>()
        .await;
    let errors = results
        .into_iter()
        .filter_map(|r| r.err().map(|e| e.to_string()))
        .collect();
    (errors, tjs)
}

/// Creates `batch_jobs` opted-in batch Jobs from 8 clients through the webhook: each creation's
/// time in ms, how many came back without configuration, the errors.
async fn create_batch_jobs(
    client: &kube::Client,
    batch_jobs: usize,
) -> (Vec<f64>, usize, Vec<String>) {
    let batch: Api<Job> = Api::namespaced(client.clone(), NAMESPACE);
    let results = futures::stream::iter(0..batch_jobs)
        .map(|i| {
            let batch = batch.clone();
            async move {
                let job = batch_job(i)?;
                let t = Instant::now();
                let made = batch.create(&PostParams::default(), &job).await?;
                let ms = t.elapsed().as_secs_f64() * 1e3;
                let configured = made
                    .spec
                    .and_then(|s| s.template.spec)
                    .and_then(|p| p.containers.into_iter().next())
                    .and_then(|c| c.env)
                    .is_some_and(|env| env.iter().any(|e| e.name == names::ENV_MODE));
                Ok::<(f64, bool), BenchError>((ms, configured))
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    let mut batch_ms = Vec::new();
    let mut unconfigured = 0usize;
    let mut batch_errors = Vec::new();
    for r in results {
        match r {
            Ok((ms, configured)) => {
                batch_ms.push(ms);
                if !configured {
                    unconfigured += 1;
                }
            }
            Err(e) => batch_errors.push(e.to_string()),
        }
    }
    (batch_ms, unconfigured, batch_errors)
}

/// How many TrainingJobs were resolved with their decision recorded, and how many per mode.
fn resolved_by_mode(listed: &[TrainingJob]) -> (usize, BTreeMap<String, usize>) {
    let resolved = listed
        .iter()
        .filter(|tj| {
            tj.status.as_ref().is_some_and(|s| {
                s.offload.is_some()
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "WorkloadCreated" && c.status == "True")
            })
        })
        .count();
    let mut modes: BTreeMap<String, usize> = BTreeMap::new();
    for tj in listed {
        if let Some(d) = tj.status.as_ref().and_then(|s| s.offload.as_ref()) {
            *modes.entry(d.mode.env_value().to_string()).or_default() += 1;
        }
    }
    (resolved, modes)
}
