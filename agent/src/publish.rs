//! Publishing: labels and the report annotation on this agent's own Node, by server-side apply
//! with field manager `offload-agent`, so it owns exactly its keys and never touches others'.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use offload_operator::names;
use offload_operator::report::NodeReport;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::sync::Notify;

use crate::probe::RealNvml;
use crate::report;
use crate::selftest::SelfTestOptions;

/// The apply document that sets the agent's labels and annotation on `node`.
pub fn apply_document(report: &NodeReport) -> Result<serde_json::Value, serde_json::Error> {
    Ok(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": report.node,
            "labels": report.labels(),
            "annotations": {names::ANNOTATION_NODE_REPORT: report.to_annotation()?},
        }
    }))
}

/// Applies the report to its node.
pub async fn publish(client: &Client, report: &NodeReport) -> Result<(), String> {
    let doc = apply_document(report).map_err(|e| format!("serialising the report: {e}"))?;
    Api::<Node>::all(client.clone())
        .patch(
            &report.node,
            &PatchParams::apply(names::AGENT_MANAGER).force(),
            &Patch::Apply(&doc),
        )
        .await
        .map_err(|e| format!("applying labels to node {}: {e}", report.node))?;
    Ok(())
}

/// Removes every label and annotation the agent owns: applying an empty document under the
/// agent's field manager releases (and so deletes) the fields it set.
pub async fn remove(client: &Client, node: &str) -> Result<(), String> {
    let doc = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}});
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::apply(names::AGENT_MANAGER).force(),
            &Patch::Apply(&doc),
        )
        .await
        .map_err(|e| format!("removing labels from node {node}: {e}"))?;
    Ok(())
}

/// `offload-agent cleanup`: one node, or every node (the uninstall hook).
pub async fn cleanup(node: Option<&str>) -> ExitCode {
    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: no kubeconfig or service account: {e}");
            return ExitCode::FAILURE;
        }
    };
    let names: Vec<String> = match node {
        Some(n) => vec![n.to_string()],
        None => match Api::<Node>::all(client.clone())
            .list_metadata(&Default::default())
            .await
        {
            Ok(list) => list
                .items
                .into_iter()
                .filter_map(|n| n.metadata.name)
                .collect(),
            Err(e) => {
                eprintln!("error: listing nodes: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let mut failed = false;
    for name in names {
        match remove(&client, &name).await {
            Ok(()) => eprintln!("removed offload.dev labels and report from node {name}"),
            Err(e) => {
                eprintln!("error: {e}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Settings of the publishing loop.
pub struct LoopConfig {
    /// This node.
    pub node: String,
    /// Re-run interval.
    pub interval: Duration,
    /// Admin address.
    pub addr: SocketAddr,
    /// Run the GPU self-test.
    pub selftest: bool,
    /// Self-test settings.
    pub options: SelfTestOptions,
    /// Publish a recorded node report instead of reading this node (a stand-in for hardware
    /// that is not here, e.g. simulated nodes in the local demo).
    pub replay: Option<std::path::PathBuf>,
    /// Publish once and exit.
    pub once: bool,
}

/// Builds this round's report: a replayed recording, or a fresh measurement.
fn measure(cfg: &LoopConfig) -> Result<NodeReport, String> {
    match &cfg.replay {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
            let recorded =
                NodeReport::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            let source =
                crate::probe::RecordedNvml::from_report(&text).map_err(|e| e.to_string())?;
            Ok(report::assemble(
                &cfg.node,
                crate::probe::NvmlSource::read(&source),
                recorded.selftest,
            ))
        }
        None => Ok(report::build(
            &cfg.node,
            &RealNvml,
            &cfg.options,
            cfg.selftest,
        )),
    }
}

/// Gauges of the last measurement.
#[derive(Default)]
struct Gauges {
    efficiency: Gauge<f64, std::sync::atomic::AtomicU64>,
    h2d_pinned: Gauge<f64, std::sync::atomic::AtomicU64>,
    d2h_pinned: Gauge<f64, std::sync::atomic::AtomicU64>,
    h2d_pageable: Gauge<f64, std::sync::atomic::AtomicU64>,
    d2h_pageable: Gauge<f64, std::sync::atomic::AtomicU64>,
    cpu_update_rate: Gauge<f64, std::sync::atomic::AtomicU64>,
    gpu_flops: Gauge<f64, std::sync::atomic::AtomicU64>,
    coherent: Gauge,
    publish_errors: Gauge,
}

impl Gauges {
    fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("offload_agent");
        r.register(
            "overlap_efficiency",
            "Measured overlap efficiency (0-1)",
            self.efficiency.clone(),
        );
        r.register(
            "h2d_pinned_gbps",
            "Host-to-device pinned bandwidth, GB/s",
            self.h2d_pinned.clone(),
        );
        r.register(
            "d2h_pinned_gbps",
            "Device-to-host pinned bandwidth, GB/s",
            self.d2h_pinned.clone(),
        );
        r.register(
            "h2d_pageable_gbps",
            "Host-to-device pageable bandwidth, GB/s",
            self.h2d_pageable.clone(),
        );
        r.register(
            "d2h_pageable_gbps",
            "Device-to-host pageable bandwidth, GB/s",
            self.d2h_pageable.clone(),
        );
        r.register(
            "cpu_update_rate",
            "CPU Adam update rate, parameters/s",
            self.cpu_update_rate.clone(),
        );
        r.register(
            "gpu_flops",
            "GPU rate of the backward-like kernel, FLOP/s",
            self.gpu_flops.clone(),
        );
        r.register(
            "coherent",
            "1 when the node has hardware-coherent unified memory",
            self.coherent.clone(),
        );
        r.register(
            "publish_errors",
            "Failed attempts to publish the report",
            self.publish_errors.clone(),
        );
    }

    fn set(&self, report: &NodeReport) {
        let s = &report.selftest;
        self.efficiency.set(s.efficiency.unwrap_or(f64::NAN));
        self.h2d_pinned
            .set(s.bandwidth.h2d_pinned.unwrap_or(f64::NAN));
        self.d2h_pinned
            .set(s.bandwidth.d2h_pinned.unwrap_or(f64::NAN));
        self.h2d_pageable
            .set(s.bandwidth.h2d_pageable.unwrap_or(f64::NAN));
        self.d2h_pageable
            .set(s.bandwidth.d2h_pageable.unwrap_or(f64::NAN));
        self.cpu_update_rate
            .set(s.cpu_update_rate.unwrap_or(f64::NAN));
        self.gpu_flops.set(s.gpu_flops.unwrap_or(f64::NAN));
        self.coherent.set(i64::from(
            report.memory_model == offload_operator::report::NodeMemoryModel::Coherent,
        ));
    }
}

#[derive(Clone)]
struct AppState {
    registry: Arc<Mutex<Registry>>,
    rerun: Arc<Notify>,
}

/// Measures, publishes, then waits for the interval or a `POST /rerun`. Publishing failures are
/// retried with back-off; the agent keeps serving whatever the node says.
pub async fn run_loop(cfg: LoopConfig) -> ExitCode {
    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: no kubeconfig or service account: {e}");
            return ExitCode::FAILURE;
        }
    };
    let gauges = Arc::new(Gauges::default());
    let mut registry = Registry::default();
    gauges.register(&mut registry);
    let state = AppState {
        registry: Arc::new(Mutex::new(registry)),
        rerun: Arc::new(Notify::new()),
    };
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .route("/rerun", post(rerun))
        .with_state(state.clone());
    let listener = match tokio::net::TcpListener::bind(cfg.addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: binding {}: {e}", cfg.addr);
            return ExitCode::FAILURE;
        }
    };
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "agent server stopped");
        }
    });
    let cfg = Arc::new(cfg);
    loop {
        let round = cfg.clone();
        // NVML and CUDA block; keep them off the async workers.
        let built = tokio::task::spawn_blocking(move || measure(&round)).await;
        match built {
            Ok(Err(e)) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
            Ok(Ok(report)) => {
                gauges.set(&report);
                tracing::info!(
                    node = %report.node,
                    model = %report.memory_model,
                    verdict = report.selftest.verdict.label_value(),
                    efficiency = report.selftest.efficiency.unwrap_or(f64::NAN),
                    "measured"
                );
                let mut delay = Duration::from_secs(1);
                while let Err(e) = publish(&client, &report).await {
                    gauges.publish_errors.inc();
                    tracing::warn!(error = %e, "publishing failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(60));
                }
            }
            Err(e) => tracing::error!(error = %e, "measurement task failed"),
        }
        if cfg.once {
            return ExitCode::SUCCESS;
        }
        if cfg.once {
            return ExitCode::SUCCESS;
        }
        tokio::select! {
            _ = tokio::time::sleep(cfg.interval) => {},
            _ = state.rerun.notified() => tracing::info!("re-run requested"),
        }
    }
}

async fn metrics(State(state): State<AppState>) -> (StatusCode, String) {
    let mut body = String::new();
    let registry = match state.registry.lock() {
        Ok(r) => r,
        Err(p) => p.into_inner(),
    };
    match prometheus_client::encoding::text::encode(&mut body, &registry) {
        Ok(()) => (StatusCode::OK, body),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn rerun(State(state): State<AppState>) -> StatusCode {
    state.rerun.notify_one();
    StatusCode::ACCEPTED
}
