//! Real pod creation through the API server: no webhook, a minimal peer webhook (no patch,
//! and replaying the operator's patch) and the operator's webhook, interleaved; then the same
//! through `kubectl create`.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use offload_testenv::devcluster::DevCluster;
use serde_json::json;

use super::super::cluster::handler_seconds;
use super::super::error::{BenchError, Result};
use super::super::measure::{Summary, summary};

/// How many pods of each kind, by how many clients.
pub struct Sizes {
    /// Pods of each kind through the kube client.
    pub pods: usize,
    /// Concurrent kube clients.
    pub clients: usize,
    /// Pods of each kind through `kubectl create`.
    pub kubectl_pods: usize,
}

/// The kinds of pod in the side-by-side creation run: what the API server does with each.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PodKind {
    /// Unlabelled: no webhook is called.
    Without,
    /// Unlabelled, created with the operator's configuration already written in (the pod the
    /// webhook produces, without the webhook).
    Preconfigured,
    /// Sent to the peer webhook, which allows without a patch.
    PeerNoop,
    /// Sent to the peer webhook, which answers with the patch the operator computed for the
    /// same pod (a fixed answer, no work).
    PeerReplay,
    /// Sent to the operator's webhook and mutated.
    Operator,
}

impl PodKind {
    const ALL: [PodKind; 5] = [
        Self::Without,
        Self::Preconfigured,
        Self::PeerNoop,
        Self::PeerReplay,
        Self::Operator,
    ];

    pub fn row(self) -> &'static str {
        match self {
            Self::Without => "no webhook called (unlabelled)",
            Self::Preconfigured => "no webhook called, configuration written by the client",
            Self::PeerNoop => "minimal webhook, allow without a patch",
            Self::PeerReplay => "minimal webhook, answers the operator's patch",
            Self::Operator => "the operator's webhook (mutates)",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Self::Without => "without",
            Self::Preconfigured => "preconfigured",
            Self::PeerNoop => "noop",
            Self::PeerReplay => "replay",
            Self::Operator => "with",
        }
    }

    pub fn labels(self) -> serde_json::Value {
        match self {
            Self::Without | Self::Preconfigured => json!({}),
            Self::PeerNoop => json!({"bench.offload.dev/peer": "noop"}),
            Self::PeerReplay => json!({"bench.offload.dev/peer": "replay"}),
            Self::Operator => json!({"offload.dev/profile": "auto"}),
        }
    }

    /// The pod to create; `configuration` is the operator's patch for it (applied by the
    /// client for `Preconfigured`).
    pub fn pod(self, name: &str, configuration: &json_patch::Patch) -> serde_json::Value {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "labels": self.labels()},
               "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
        if self == Self::Preconfigured {
            // Checked once in start_peer: the patch applies to this pod.
            let _ = json_patch::patch(&mut pod, configuration);
        }
        pod
    }
}

/// Real pod creation through the API server, four kinds interleaved in rounds so that all see
/// the same conditions: no webhook, a minimal peer webhook (no patch, and replaying the
/// operator's patch) and the operator's webhook; then the same through `kubectl create`.
pub async fn run(
    cluster: &DevCluster,
    podsapi: &Api<Pod>,
    (port, admin): (u16, u16),
    configuration: &json_patch::Patch,
    sizes: Sizes,
) -> Result<()> {
    let Sizes {
        pods,
        clients,
        kubectl_pods,
    } = sizes;
    let handler_before = handler_seconds(admin, "mutate-pod").await;
    let mut api = Tally::default();
    let rounds = 10;
    for round in 0..rounds {
        for kind in PodKind::ALL {
            let results: Vec<Result<f64>> = futures::stream::iter(0..pods / rounds)
                .map(|i| {
                    let podsapi = podsapi.clone();
                    async move {
                        let pod: Pod = serde_json::from_value(
                            kind.pod(&format!("{}-{round}-{i}", kind.prefix()), configuration),
                        )?;
                        let t = Instant::now();
                        podsapi.create(&PostParams::default(), &pod).await?;
                        Ok::<f64, BenchError>(t.elapsed().as_secs_f64() * 1e3)
                    }
                })
                .buffer_unordered(clients)
                .collect()
                .await;
            for r in results {
                api.record(kind, r);
            }
        }
    }
    println!(
        "\nreal pod creation through kube-apiserver (kube client), {clients} concurrent clients, {pods} pods of each kind, interleaved:"
    );
    api.table();
    if let (Some((s0, n0)), Some((s1, n1))) =
        (handler_before, handler_seconds(admin, "mutate-pod").await)
    {
        println!(
            "the operator's handler itself (its offload_operator_admission_duration_seconds, parse to answer): {:.0} calls, mean {:.3} ms",
            n1 - n0,
            (s1 - s0) / (n1 - n0) * 1e3
        );
    }

    // The same through kubectl, one process per pod, as a user creates one.
    if kubectl_pods > 0 {
        through_kubectl(cluster, configuration, kubectl_pods);
    }
    connections_and_api_server_view(cluster, port);
    Ok(())
}

/// Pod creation with `kubectl create -f -`, one process per pod, `kubectl_pods` of each kind.
fn through_kubectl(cluster: &DevCluster, configuration: &json_patch::Patch, kubectl_pods: usize) {
    let mut cli = Tally::default();
    for i in 0..kubectl_pods {
        for kind in PodKind::ALL {
            let manifest = kind
                .pod(&format!("kubectl-{}-{i}", kind.prefix()), configuration)
                .to_string();
            let t = Instant::now();
            let ok = run_with_stdin(
                cluster
                    .kubectl()
                    .args(["create", "--namespace", "bench", "-f", "-"]),
                &manifest,
            );
            cli.record(kind, ok.map(|()| t.elapsed().as_secs_f64() * 1e3));
        }
    }
    println!(
        "\nreal pod creation with `kubectl create -f -` (one process per pod), {kubectl_pods} pods of each kind, interleaved:"
    );
    cli.table();
}

/// The connections to the webhook port after the run, and the API server's own measure of each
/// webhook call.
fn connections_and_api_server_view(cluster: &DevCluster, port: u16) {
    // Connections to the webhook port: the API server's open ones, and those closed in the last
    // minute (they linger in TIME-WAIT; the load phase's own connections may be among them).
    let sockets = |state: &str| -> Option<usize> {
        let out = Command::new("ss")
            .args([
                "-tan",
                "state",
                state,
                &format!("( sport = :{port} or dport = :{port} )"),
            ])
            .output()
            .ok()?;
        Some(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .count()
                .saturating_sub(1),
        )
    };
    if let (Some(open), Some(closed)) = (sockets("established"), sockets("time-wait")) {
        println!(
            "\nconnections to the operator's webhook port after the run: {} open (each seen from both ends), {closed} closed in the last minute (TIME-WAIT)",
            open
        );
    }
    // The API server's own view of each webhook call.
    if let Ok(out) = cluster
        .kubectl()
        .args(["get", "--raw", "/metrics"])
        .output()
    {
        let metrics = offload_testenv::http::Metrics::parse(&String::from_utf8_lossy(&out.stdout));
        println!(
            "kube-apiserver's own measure of each webhook call (apiserver_admission_webhook_admission_duration_seconds):"
        );
        for (hook, row) in [
            ("noop.bench.offload.dev", PodKind::PeerNoop.row()),
            ("replay.bench.offload.dev", PodKind::PeerReplay.row()),
            ("pods.mutate.offload.dev", PodKind::Operator.row()),
        ] {
            if let Some((sum, count)) = metrics.sum_and_count(
                "apiserver_admission_webhook_admission_duration_seconds",
                &[("name", hook)],
            ) {
                println!(
                    "- {row}: {count:.0} calls, mean {:.2} ms",
                    sum / count * 1e3
                );
            }
        }
    }
}

/// Creation latencies and failures by pod kind.
#[derive(Default)]
struct Tally {
    lat: HashMap<&'static str, Vec<f64>>,
    failed: HashMap<&'static str, usize>,
}

impl Tally {
    /// Records one creation; the first failure of a kind is printed.
    fn record(&mut self, kind: PodKind, result: Result<f64>) {
        match result {
            Ok(ms) => self.lat.entry(kind.prefix()).or_default().push(ms),
            Err(e) => {
                let n = self.failed.entry(kind.prefix()).or_default();
                if *n == 0 {
                    eprintln!("{}: creation failed: {e}", kind.row());
                }
                *n += 1;
            }
        }
    }

    /// Prints one row per pod kind, with what each adds to the creation of the unlabelled pod
    /// and of the same configured pod created without a webhook.
    fn table(&self) {
        let (lat, failed) = (&self.lat, &self.failed);
        println!(
            "| pods | created | failed | mean ms | p50 ms | p99 ms | added p50 (vs unlabelled) | added p50 (vs configured by the client) |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        let p50_of =
            |kind: PodKind| summary(lat.get(kind.prefix()).cloned().unwrap_or_default()).p50;
        let base = p50_of(PodKind::Without);
        let configured = p50_of(PodKind::Preconfigured);
        let added = |p50: f64, base: f64| {
            format!(
                "{:+.2} ms ({:+.1} %)",
                p50 - base,
                (p50 / base - 1.0) * 100.0
            )
        };
        for kind in PodKind::ALL {
            let l = lat.get(kind.prefix()).cloned().unwrap_or_default();
            let n = l.len();
            let Summary { mean, p50, p99, .. } = summary(l);
            let (vs_base, vs_configured) = match kind {
                PodKind::Without => ("—".to_string(), "—".to_string()),
                PodKind::Preconfigured => (added(p50, base), "—".to_string()),
                PodKind::PeerNoop => (added(p50, base), "—".to_string()),
                PodKind::PeerReplay | PodKind::Operator => {
                    (added(p50, base), added(p50, configured))
                }
            };
            println!(
                "| {} | {n} | {} | {mean:.2} | {p50:.2} | {p99:.2} | {vs_base} | {vs_configured} |",
                kind.row(),
                failed.get(kind.prefix()).copied().unwrap_or(0)
            );
        }
    }
}

fn run_with_stdin(cmd: &mut Command, input: &str) -> Result<()> {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(BenchError::Command {
            what: "kubectl create".into(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}
