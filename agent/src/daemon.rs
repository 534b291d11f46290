//! The agent's daemon (`offload-agent run`): the loop that measures and publishes, the loop that
//! observes configured pods, and the HTTP server beside them (`/metrics`, `/healthz`, a
//! re-test on demand).
//!
//! Publishing writes labels and the report annotation on this agent's own Node, by server-side
//! apply with field manager `offload-agent`, so it owns exactly its keys and never touches
//! others'.

use backon::BackoffBuilder as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use offload_api::names;
use offload_api::report::NodeReport;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::assemble;
use crate::probe::RealNvml;
use crate::selftest::SelfTestOptions;

/// The apply document that sets the agent's labels and annotation on `node`.
pub fn apply_document(report: &NodeReport) -> Result<serde_json::Value, serde_json::Error> {
    Ok(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": report.node,
            "labels": offload_api::labels::published(report),
            "annotations": {names::ANNOTATION_NODE_REPORT: report.to_annotation()?},
        }
    }))
}

/// Why the agent could not do its job.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// An API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The report could not be serialised (a bug, never input).
    #[error("serialising the report: {0}")]
    Serialize(#[from] serde_json::Error),
    /// A recorded report to replay could not be read.
    #[error("{path}: {detail}")]
    Replay {
        /// The file.
        path: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The admin address could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// Address.
        addr: SocketAddr,
        /// Error.
        #[source]
        source: std::io::Error,
    },
    /// Cleaning some nodes failed; the others were cleaned.
    #[error("{failed} of {total} node(s) could not be cleaned (see above)")]
    Cleanup {
        /// Nodes that failed.
        failed: usize,
        /// Nodes tried.
        total: usize,
    },
}

/// Applies the report to its node.
pub async fn publish(client: &Client, report: &NodeReport) -> Result<(), AgentError> {
    let doc = apply_document(report)?;
    Api::<Node>::all(client.clone())
        .patch(
            &report.node,
            &PatchParams::apply(names::AGENT_MANAGER).force(),
            &Patch::Apply(&doc),
        )
        .await
        .map_err(|source| AgentError::Kube {
            action: format!("applying labels to node {}", report.node),
            source,
        })?;
    Ok(())
}

/// Removes every label and annotation the agent owns: applying an empty document under the
/// agent's field manager releases (and so deletes) the fields it set.
pub async fn remove(client: &Client, node: &str) -> Result<(), AgentError> {
    let doc = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}});
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::apply(names::AGENT_MANAGER).force(),
            &Patch::Apply(&doc),
        )
        .await
        .map_err(|source| AgentError::Kube {
            action: format!("removing labels from node {node}"),
            source,
        })?;
    // The observation is written under its own manager: released apart.
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::apply(crate::attribution::OBSERVER_MANAGER).force(),
            &Patch::Apply(&doc),
        )
        .await
        .map_err(|source| AgentError::Kube {
            action: format!("removing the observation from node {node}"),
            source,
        })?;
    Ok(())
}

/// `offload-agent cleanup`: one node, or every node (the uninstall hook). Every node is tried;
/// each outcome is logged.
pub async fn cleanup(client: &Client, node: Option<&str>) -> Result<(), AgentError> {
    let names: Vec<String> = match node {
        Some(n) => vec![n.to_string()],
        None => Api::<Node>::all(client.clone())
            .list_metadata(&Default::default())
            .await
            .map_err(|source| AgentError::Kube {
                action: "listing nodes".to_string(),
                source,
            })?
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect(),
    };
    let total = names.len();
    let mut failed = 0;
    for name in names {
        match remove(client, &name).await {
            Ok(()) => tracing::info!(node = %name, "removed offload.dev labels and report"),
            Err(e) => {
                tracing::error!(node = %name, error = %e, "cleanup failed");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        return Err(AgentError::Cleanup { failed, total });
    }
    Ok(())
}

/// Settings of the publishing loop.
#[derive(Clone, Debug)]
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
    /// Observe the GPUs of configured pods and publish the summary; `None`: off.
    pub observe: Option<ObserveConfig>,
}

/// Where and how often the agent observes configured pods.
#[derive(Clone, Debug)]
pub struct ObserveConfig {
    /// Length of each window (one summary per window).
    pub window: Duration,
    /// The kubelet's pod-resources socket.
    pub pod_resources: std::path::PathBuf,
    /// The host's cgroup root as mounted in the agent's container.
    pub cgroup_root: std::path::PathBuf,
    /// The GPU driver whose DRA devices (`gpu-<minor>`) count as GPUs; `None`: only
    /// `nvidia.com/gpu` device-plugin GPUs.
    pub dra_driver: Option<String>,
    /// A recorded utilization trace replayed in place of NVML (a stand-in for GPUs that are
    /// not here); `None`: NVML.
    pub recorded: Option<std::sync::Arc<crate::utilization::RecordedUtilization>>,
}

/// Builds this round's report: a replayed recording, or a fresh measurement (never over a job
/// unless `force`; the previous result's verdict stands unless the new one is clear).
fn measure(
    cfg: &LoopConfig,
    previous: Option<&NodeReport>,
    force: bool,
) -> Result<NodeReport, AgentError> {
    match &cfg.replay {
        Some(path) => {
            let replay_err = |detail: String| AgentError::Replay {
                path: path.display().to_string(),
                detail,
            };
            let text = std::fs::read_to_string(path).map_err(|e| replay_err(e.to_string()))?;
            let recorded = NodeReport::parse(&text).map_err(|e| replay_err(e.to_string()))?;
            let source = crate::probe::RecordedNvml::from_report(&text)
                .map_err(|e| replay_err(e.to_string()))?;
            Ok(assemble::assemble(
                &cfg.node,
                crate::probe::NvmlSource::read(&source),
                recorded.selftest,
            ))
        }
        None => Ok(assemble::build(
            &cfg.node,
            &RealNvml,
            &cfg.options,
            assemble::SelfTestRun {
                enabled: cfg.selftest,
                force,
                previous: previous.map(|r| &r.selftest),
            },
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
    published_at: Gauge<f64, std::sync::atomic::AtomicU64>,
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
        r.register(
            "report_published_timestamp_seconds",
            "When the node's report was last published, Unix seconds (a stale one alerts)",
            self.published_at.clone(),
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
            report.memory_model == offload_api::report::NodeMemoryModel::Coherent,
        ));
    }
}

#[derive(Clone)]
struct AppState {
    registry: Arc<Mutex<Registry>>,
    rerun: Arc<Notify>,
    force: Arc<std::sync::atomic::AtomicBool>,
}

/// The agent's metrics as its `/metrics` serves them, none measured yet (what the reference
/// pages list).
pub fn metrics_registry() -> Registry {
    let mut registry = Registry::default();
    Gauges::default().register(&mut registry);
    registry
}

/// Measures, publishes, then waits for the interval or a `POST /rerun`, until `shutdown`.
/// Publishing failures are retried with back-off; the admin server (`/healthz`, `/metrics`,
/// `POST /rerun`) runs beside the loop and stops with it.
pub async fn run_loop(
    client: Client,
    cfg: LoopConfig,
    shutdown: CancellationToken,
) -> Result<(), AgentError> {
    let gauges = Arc::new(Gauges::default());
    let mut registry = Registry::default();
    gauges.register(&mut registry);
    let state = AppState {
        registry: Arc::new(Mutex::new(registry)),
        rerun: Arc::new(Notify::new()),
        force: Arc::default(),
    };
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .route("/rerun", post(rerun))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind(cfg.addr)
        .await
        .map_err(|source| AgentError::Bind {
            addr: cfg.addr,
            source,
        })?;
    // The loop ends the server when it returns (once, an error), as well as on shutdown.
    let stop_server = shutdown.child_token();
    let server_stop = stop_server.clone();
    let server = async move {
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(server_stop.cancelled_owned())
            .await
        {
            tracing::error!(error = %e, "agent server stopped");
        }
    };
    let work = async {
        let outcome = measure_and_publish(&client, &cfg, &gauges, &state, &shutdown).await;
        stop_server.cancel();
        outcome
    };
    let observing = async {
        if let (Some(observe), false) = (cfg.observe.clone(), cfg.once) {
            observe_loop(&client, &cfg.node, observe, &stop_server).await;
        }
    };
    let ((), outcome, ()) = tokio::join!(server, work, observing);
    outcome
}

/// One summary per window, until `stop`: the configured pods on this node that hold GPUs, their
/// GPUs sampled with NVML over the window, their CPU from their cgroups. A window that fails (no
/// socket, no NVML, the API away) is logged and the next one tried; nothing here stops the
/// self-test loop.
async fn observe_loop(
    client: &Client,
    node: &str,
    observe: ObserveConfig,
    stop: &CancellationToken,
) {
    use crate::attribution;
    let mut published_pods = true; // clear a summary a previous run may have left
    loop {
        let round = observe_window(client, node, &observe);
        let outcome = tokio::select! {
            o = round => o,
            () = stop.cancelled() => return,
        };
        match outcome {
            Ok(summary) => {
                let has_pods = !summary.pods.is_empty();
                if has_pods || published_pods {
                    match attribution::publish_observed(client, &summary).await {
                        Ok(()) => {
                            tracing::info!(pods = summary.pods.len(), "observation published");
                            published_pods = has_pods;
                        }
                        Err(e) => tracing::warn!(error = %e, "publishing the observation failed"),
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "observation window failed; trying the next");
                tokio::select! {
                    () = tokio::time::sleep(observe.window) => {},
                    () = stop.cancelled() => return,
                }
            }
        }
    }
}

/// One window: the configured pods on this node that hold GPUs, sampled over the window (by
/// NVML, or the recorded trace where the agent replays one).
async fn observe_window(
    client: &Client,
    node: &str,
    observe: &ObserveConfig,
) -> Result<offload_api::observed::ObservedSummary, crate::attribution::AttributionError> {
    use crate::attribution;
    use offload_api::observed::BusySource;
    let listed =
        attribution::list_pod_resources(&observe.pod_resources, Duration::from_secs(10)).await?;
    let assigned = attribution::devices_by_pod(
        &listed,
        crate::devices::GPU_RESOURCE,
        observe.dra_driver.as_deref(),
    );
    let pods = if assigned.is_empty() {
        Vec::new()
    } else {
        attribution::configured_pods(client, node, &assigned, &observe.cgroup_root).await?
    };
    let node_name = node.to_string();
    let window = observe.window;
    let recorded = observe.recorded.clone();
    let interval = Duration::from_millis(100);
    tokio::task::spawn_blocking(move || {
        if pods.is_empty() {
            // Nothing to sample: wait the window out, then say so.
            std::thread::sleep(window);
            let none = &crate::utilization::NoGpus;
            return attribution::summarize(
                &node_name,
                &[],
                none,
                &|_| None,
                window,
                interval,
                BusySource::NvmlDevice,
            );
        }
        if let Some(trace) = recorded {
            let resolve = |id: &str| trace.index_of(id);
            return attribution::summarize(
                &node_name,
                &pods,
                trace.as_ref(),
                &resolve,
                window,
                interval,
                BusySource::RecordedTrace,
            );
        }
        let nvml = crate::utilization::NvmlUtilization::new()
            .map_err(attribution::AttributionError::Sampling)?;
        attribution::summarize(
            &node_name,
            &pods,
            &nvml,
            &|id| nvml.index_of(id),
            window,
            interval,
            BusySource::NvmlDevice,
        )
    })
    .await
    .map_err(|e| attribution::AttributionError::Sampling(e.to_string()))?
}

async fn measure_and_publish(
    client: &Client,
    cfg: &LoopConfig,
    gauges: &Gauges,
    state: &AppState,
    shutdown: &CancellationToken,
) -> Result<(), AgentError> {
    let cfg = Arc::new(cfg.clone());
    // What this node published last (before a restart too): its verdict stands until a clear
    // new measurement, and its figures are kept when a round must not measure.
    let mut last: Option<NodeReport> = published_report(client, &cfg.node).await;
    let mut force = false;
    loop {
        let round = cfg.clone();
        let previous = last.clone();
        // NVML and CUDA block; keep them off the async workers.
        let built =
            tokio::task::spawn_blocking(move || measure(&round, previous.as_ref(), force)).await;
        match built {
            Ok(Err(e)) => return Err(e),
            Ok(Ok(report)) => {
                if let Some(why) = &report.selftest.postponed {
                    tracing::info!(node = %report.node, reason = %why, "self-test postponed");
                }
                gauges.set(&report);
                tracing::info!(
                    node = %report.node,
                    model = %report.memory_model,
                    verdict = %report.selftest.verdict,
                    efficiency = report.selftest.efficiency.unwrap_or(f64::NAN),
                    "measured"
                );
                // Doubling from 1 s to a minute, with jitter so that a restarted API
                // server is not met by every node at once.
                let mut delays = backon::ExponentialBuilder::default()
                    .with_min_delay(Duration::from_secs(1))
                    .with_max_delay(Duration::from_secs(60))
                    .with_jitter()
                    .without_max_times()
                    .build();
                while let Err(e) = publish(client, &report).await {
                    gauges.publish_errors.inc();
                    tracing::warn!(error = %e, "publishing failed; retrying");
                    let delay = delays.next().unwrap_or(Duration::from_secs(60));
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {},
                        () = shutdown.cancelled() => return Ok(()),
                    }
                }
                gauges.published_at.set(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0.0, |d| d.as_secs_f64()),
                );
                last = Some(report);
            }
            Err(e) => tracing::error!(error = %e, "measurement task failed"),
        }
        if cfg.once {
            return Ok(());
        }
        force = false;
        tokio::select! {
            () = tokio::time::sleep(cfg.interval) => {},
            () = state.rerun.notified() => {
                force = state.force.swap(false, std::sync::atomic::Ordering::Relaxed);
                tracing::info!(force, "re-run requested");
            }
            () = shutdown.cancelled() => return Ok(()),
        }
    }
}

/// The report this agent published on its node before, if it is there and readable.
async fn published_report(client: &Client, node: &str) -> Option<NodeReport> {
    let node = Api::<Node>::all(client.clone())
        .get_opt(node)
        .await
        .ok()??;
    let text = node
        .metadata
        .annotations?
        .get(names::ANNOTATION_NODE_REPORT)?
        .clone();
    NodeReport::parse(&text).ok()
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

/// `POST /rerun` re-runs the self-test now unless the GPUs are in use; `POST /rerun?force=true`
/// runs it even then (it disturbs a running job: an explicit choice).
async fn rerun(
    State(state): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<RerunQuery>,
) -> StatusCode {
    if q.force {
        state
            .force
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
    state.rerun.notify_one();
    StatusCode::ACCEPTED
}

/// Query of `POST /rerun`.
#[derive(serde::Deserialize)]
struct RerunQuery {
    #[serde(default)]
    force: bool,
}
