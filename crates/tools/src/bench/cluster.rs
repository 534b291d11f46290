//! The benchmarks' cluster: CRDs, simulated GPU nodes with recorded reports, the default
//! profile, and the release operator as its own process.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use offload_api::report::NodeReport;
use offload_api::v1alpha1::OffloadProfile;
use offload_testenv::devcluster::{DevCluster, free_port, repo_root};
use offload_testenv::fixtures;
use serde_json::json;

use super::error::{BenchError, Result};

/// A node carrying a recorded report and the labels the agent derives from it.
pub fn reported_node(name: &str, fixture: &str) -> Result<Node> {
    let mut report =
        NodeReport::parse(fixture).map_err(|e| BenchError::unexpected(format!("fixture: {e}")))?;
    report.node = name.to_string();
    let mut labels: BTreeMap<String, String> = offload_api::labels::published(&report);
    labels.insert("kubernetes.io/hostname".into(), name.into());
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {offload_api::names::ANNOTATION_NODE_REPORT: report.to_annotation()?}}
    }))?)
}

/// Applies the CRDs and waits until they are served.
pub async fn apply_crds(client: &kube::Client) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in offload_api::v1alpha1::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &PatchParams::apply("offload-bench").force(),
            &Patch::Apply(&crd),
        )
        .await?;
        tokio::time::timeout(
            Duration::from_secs(60),
            await_condition(api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .map_err(|_| BenchError::unexpected(format!("CRD {name} not established in 60 s")))?
        .map_err(|e| BenchError::unexpected(format!("waiting for CRD {name}: {e}")))?;
    }
    Ok(())
}

/// CRDs, 8 coherent and 8 discrete recorded nodes, and the `default` profile.
pub async fn setup_cluster(cluster: &DevCluster) -> Result<kube::Client> {
    let client = cluster.client().await?;
    apply_crds(&client).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..8 {
        nodes
            .create(
                &PostParams::default(),
                &reported_node(&format!("gh200-{i}"), fixtures::GH200_REFERENCE)?,
            )
            .await?;
        nodes
            .create(
                &PostParams::default(),
                &reported_node(&format!("h200-{i}"), fixtures::H200_READING)?,
            )
            .await?;
    }
    let profile: OffloadProfile = serde_json::from_value(json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "OffloadProfile",
        "metadata": {"name": "default"}, "spec": {}
    }))?;
    Api::<OffloadProfile>::all(client.clone())
        .create(&PostParams::default(), &profile)
        .await?;
    Ok(client)
}

/// Starts the release operator; returns it with its admin (metrics) port.
pub fn spawn_operator(cluster: &DevCluster, webhook_port: Option<u16>) -> Result<(Child, u16)> {
    spawn_operator_with(cluster, webhook_port, &[])
}

/// [`spawn_operator`] with `extra` arguments to `offload-operator run`.
pub fn spawn_operator_with(
    cluster: &DevCluster,
    webhook_port: Option<u16>,
    extra: &[&str],
) -> Result<(Child, u16)> {
    let bin = repo_root().join("target/release/offload-operator");
    if !bin.exists() {
        return Err(BenchError::unexpected(
            "build the release binaries first: cargo build --release --workspace --bins",
        ));
    }
    let admin = free_port()?;
    let mut cmd = Command::new(bin);
    cmd.env("KUBECONFIG", &cluster.kubeconfig)
        .env("RUST_LOG", "warn")
        .args(["run", "--admin-addr", &format!("127.0.0.1:{admin}")])
        .args(["--namespace", "offload-system"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    match webhook_port {
        Some(p) => cmd.args([
            "--webhook-addr",
            &format!("127.0.0.1:{p}"),
            "--webhook-names",
            "127.0.0.1",
        ]),
        None => cmd.args(["--webhook-addr", ""]),
    };
    cmd.args(extra);
    Ok((cmd.spawn()?, admin))
}

/// Waits until the operator at `admin_port` reports ready (its caches synced).
pub async fn wait_ready(admin_port: u16, timeout: Duration) -> Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut delay = Duration::from_millis(20);
    loop {
        if offload_testenv::http::ready(admin_port).await {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(BenchError::unexpected(format!(
                "the operator was not ready after {timeout:?}"
            )));
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(250));
    }
}

/// The operator's own measure of one admission handler: (sum seconds, count) of
/// `offload_operator_admission_duration_seconds{endpoint="…"}` from its `/metrics`.
pub async fn handler_seconds(admin_port: u16, endpoint: &str) -> Option<(f64, f64)> {
    offload_testenv::http::metrics(admin_port)
        .await?
        .sum_and_count(
            "offload_operator_admission_duration_seconds",
            &[("endpoint", endpoint)],
        )
}

/// When each object was created or first seen, by name.
pub type Times = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, Instant>>>;

/// Watches the workload Jobs (labelled with their TrainingJob) in `namespace`: when each was
/// first seen, a receiver told once `expected` have been, and the watch task (abort it when
/// done).
pub fn watch_workloads(
    client: &kube::Client,
    namespace: &str,
    expected: usize,
) -> (
    Times,
    tokio::sync::oneshot::Receiver<()>,
    tokio::task::JoinHandle<()>,
) {
    use futures::TryStreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let seen: Times = Times::default();
    let (all_seen_tx, all_seen) = tokio::sync::oneshot::channel::<()>();
    let workloads: Api<k8s_openapi::api::batch::v1::Job> =
        Api::namespaced(client.clone(), namespace);
    let seen_w = seen.clone();
    let watch = tokio::spawn(async move {
        let stream = watcher(
            workloads,
            watcher::Config::default().labels(offload_api::names::LABEL_TRAINING_JOB),
        )
        .touched_objects();
        futures::pin_mut!(stream);
        let mut all_seen_tx = Some(all_seen_tx);
        while let Ok(Some(job)) = stream.try_next().await {
            if let (Some(name), Ok(mut s)) = (job.metadata.name, seen_w.lock()) {
                s.entry(name).or_insert_with(Instant::now);
                if s.len() >= expected
                    && let Some(tx) = all_seen_tx.take()
                {
                    let _ = tx.send(());
                }
            }
        }
    });
    (seen, all_seen, watch)
}

/// Milliseconds from each creation to its workload's first sighting, for every name in both.
pub fn latencies_ms(created: &Times, seen: &Times) -> Vec<f64> {
    let (Ok(created), Ok(seen)) = (created.lock(), seen.lock()) else {
        return Vec::new();
    };
    created
        .iter()
        .filter_map(|(name, t0)| {
            seen.get(name)
                .map(|t1| t1.saturating_duration_since(*t0).as_secs_f64() * 1e3)
        })
        .collect()
}

/// Registers the chart's webhook configurations (`helm install`, operator, agent and default
/// profile off) pointing at an operator outside the cluster; returns the port they point at.
pub fn register_webhook(cluster: &DevCluster) -> Result<u16> {
    let port = free_port()?;
    let out = cluster
        .helm()
        .args(["install", "offload-operator"])
        .arg(repo_root().join("charts/offload-operator"))
        .args(["--namespace", "offload-system"])
        .args(["--set", "operator.enabled=false"])
        .args(["--set", "agent.enabled=false"])
        .args(["--set", "defaultProfile.create=false"])
        .args(["--set", &format!("webhook.url=https://127.0.0.1:{port}")])
        .output()?;
    if !out.status.success() {
        return Err(BenchError::Command {
            what: "helm install".into(),
            detail: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(port)
}
