//! `offload-bench webhook`: pod mutation over TLS on loopback at increasing concurrency
//! (throughput, p50/p99/p99.9), beside a minimal peer webhook on the same stack; then real pod
//! creation through the API server with and without the webhook, side by side.

mod creation;
mod peer;

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, ServiceAccount};
use kube::api::{Api, PostParams};
use offload_testenv::devcluster::{ClusterOptions, DevCluster};
use offload_testenv::http::{TlsConnection, trusting};
use serde_json::json;

pub use peer::serve as peer_webhook;

use super::cluster::{register_webhook, setup_cluster, spawn_operator, wait_ready};
use super::error::{BenchError, Result};
use super::measure::{cpu_seconds, machine, summary};

fn pod_review(i: usize) -> Result<Vec<u8>> {
    Ok(serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": format!("00000000-0000-0000-0000-{i:012}"),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "bench", "operation": "CREATE",
            "userInfo": {"username": "bench"},
            "object": {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("p-{i}"), "namespace": "bench", "labels": {"offload.dev/profile": "auto"}},
                "spec": {"containers": [{"name": "train", "image": "train:1", "env": [{"name": "KEEP", "value": "1"}],
                                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        }
    }))?)
}

/// `concurrency` keep-alive connections sending the same review for `duration`; the number of
/// answers and their latencies in ms.
async fn load(
    port: u16,
    path: &'static str,
    tls: Arc<rustls::ClientConfig>,
    concurrency: usize,
    duration: Duration,
) -> Result<(usize, Vec<f64>)> {
    let body = bytes::Bytes::from(pod_review(1)?);
    let deadline = Instant::now() + duration;
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let tls = tls.clone();
            let body = body.clone();
            tokio::spawn(async move {
                let mut conn = TlsConnection::connect(port, tls).await?;
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let (_, answer) = conn.post(path, body.clone()).await?;
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                    if answer.len() < 50 {
                        return Err(BenchError::unexpected("short response"));
                    }
                }
                Ok::<_, BenchError>(lat)
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(
            t.await
                .map_err(|e| BenchError::unexpected(e.to_string()))??,
        );
    }
    Ok((all.len(), all))
}

/// Creates a namespace and its default ServiceAccount (there may be no controller-manager).
async fn namespace(client: &kube::Client, name: &str) -> Result<()> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    let _ = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await;
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"}}))?;
    let _ = Api::<ServiceAccount>::namespaced(client.clone(), name)
        .create(&PostParams::default(), &sa)
        .await;
    Ok(())
}

/// Runs the whole webhook benchmark.
pub async fn run(seconds: u64, pods: usize, clients: usize, kubectl_pods: usize) -> Result<()> {
    println!("# webhook ({})", machine());
    let cluster = DevCluster::start(ClusterOptions::default()).await?;
    let client = setup_cluster(&cluster).await?;
    namespace(&client, "offload-system").await?;
    // Register the pod webhook (as the chart does, by URL for an operator outside the cluster).
    let port = register_webhook(&cluster)?;
    let (mut op, admin) = spawn_operator(&cluster, Some(port))?;
    wait_ready(admin, Duration::from_secs(60)).await?;
    // The CA the operator generated (it is ready only once its webhook serves), to trust it.
    let secret = Api::<Secret>::namespaced(client.clone(), "offload-system")
        .get(offload_api::names::WEBHOOK_SECRET)
        .await?;
    let ca = secret
        .data
        .and_then(|d| d.get("ca.crt").map(|b| b.0.clone()))
        .ok_or_else(|| BenchError::unexpected("the operator's Secret has no ca.crt"))?;
    let tls = trusting(&ca)?;
    // The bench namespace and the peer webhook (it needs the operator's patch for a bench pod).
    namespace(&client, "bench").await?;
    let podsapi: Api<Pod> = Api::namespaced(client.clone(), "bench");
    let peer = peer::start(&cluster, &client, &podsapi, port, &tls).await?;

    let op_pid = op.id();
    let peer_pid = peer.child.id();
    println!(
        "\npod mutation over TLS on loopback ({seconds} s per level, keep-alive connections), the operator's webhook and the minimal peer answering the same patch:"
    );
    println!(
        "| concurrency | mutations/s | p50 ms | p99 ms | p99.9 ms | operator CPU % | peer answers/s | peer p50 ms | peer p99 ms | peer CPU % |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for c in [1usize, 2, 4, 8, 16, 32, 64] {
        let mut row = format!("| {c} ");
        for (pid, port, path, tls) in [
            (op_pid, port, "/mutate/pod", &tls),
            (peer_pid, peer.port, "/replay", &peer.tls),
        ] {
            let cpu0 = cpu_seconds(pid).unwrap_or(0.0);
            let t = Instant::now();
            let (n, lat) = load(port, path, tls.clone(), c, Duration::from_secs(seconds)).await?;
            let wall = t.elapsed().as_secs_f64();
            let cpu = cpu_seconds(pid).unwrap_or(0.0) - cpu0;
            let s = summary(lat);
            #[allow(clippy::cast_precision_loss)]
            let rate = n as f64 / wall;
            if pid == op_pid {
                row += &format!(
                    "| {rate:.0} | {:.3} | {:.3} | {:.3} | {:.0} ",
                    s.p50,
                    s.p99,
                    s.p999,
                    cpu / wall * 100.0
                );
            } else {
                row += &format!(
                    "| {rate:.0} | {:.3} | {:.3} | {:.0} |",
                    s.p50,
                    s.p99,
                    cpu / wall * 100.0
                );
            }
        }
        println!("{row}");
    }

    let created = creation::run(
        &cluster,
        &podsapi,
        (port, admin),
        &peer.configuration,
        creation::Sizes {
            pods,
            clients,
            kubectl_pods,
        },
    )
    .await;
    let _ = op.kill();
    let _ = op.wait();
    created
}
