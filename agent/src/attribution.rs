//! Which configured pod on this node holds which GPU, how busy those GPUs were, and how much CPU
//! the pod used: the summary the operator turns into each TrainingJob's `status.observed`.
//!
//! - GPUs per pod come from the kubelet's pod-resources API (`List` on its local socket), the
//!   way GPU metrics exporters attribute devices: the device IDs the device plugin handed out.
//! - "Configured" means the operator wrote the pod's configuration (its `offload.dev/resolved`
//!   annotation); only those pods, and only on this node, are observed.
//! - Busy fractions come from a [`UtilizationSource`] (NVML) sampled over the window; CPU from the
//!   pod's cgroup (`cpu.stat`, cgroup v2, systemd or cgroupfs layout).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use offload_api::names;
use offload_api::observed::{
    BusySource, MAX_PODS, OBSERVED_SCHEMA_VERSION, ObservedSummary, PodObservation,
};
use serde_json::json;

use crate::utilization::{Method, UtilizationSource};

/// Where the kubelet serves the pod-resources API.
pub const POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// The extended resource GPUs are requested as.
pub const GPU_RESOURCE: &str = names::GPU_RESOURCE;

/// The DRA driver whose allocated devices are GPUs by default: NVIDIA's (`run --dra-driver`).
pub const DRA_DRIVER: &str = "gpu.nvidia.com";

/// The minor number in a device name NVIDIA's DRA driver gives a whole GPU (`gpu-3`).
pub fn dra_minor(device: &str) -> Option<u32> {
    device.strip_prefix("gpu-")?.parse().ok()
}

/// Field manager of the observation annotation: apart from the report's, so publishing one
/// never releases the other.
pub const OBSERVER_MANAGER: &str = "offload-agent-observer";

/// The kubelet's pod-resources API (`k8s.io/kubelet/pkg/apis/podresources/v1`), generated from
/// its vendored `.proto` (`vendor/kubelet/`) by `crates/tools/tests/kubelet_protos.rs`, which also checks
/// it for drift.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    include!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../vendor/kubelet/rust/podresources_v1.rs"
    ));
}

/// Why an observation could not be made.
#[derive(Debug, thiserror::Error)]
pub enum AttributionError {
    /// The kubelet's pod-resources socket could not be reached or answered an error.
    #[error("kubelet pod-resources API at {socket}: {detail}")]
    PodResources {
        /// The socket.
        socket: String,
        /// What failed.
        detail: String,
    },
    /// The API server could not be asked for this node's pods, or written to.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Sampling the GPUs failed for the whole window.
    #[error("sampling GPU utilization: {0}")]
    Sampling(String),
}

/// Lists every pod's assigned resources from the kubelet's pod-resources socket.
pub async fn list_pod_resources(
    socket: &Path,
    timeout: Duration,
) -> Result<Vec<v1::PodResources>, AttributionError> {
    let err = |detail: String| AttributionError::PodResources {
        socket: socket.display().to_string(),
        detail,
    };
    let path = socket.to_path_buf();
    // The URI is required by the transport and never resolved: the connector dials the socket.
    let endpoint = tonic::transport::Endpoint::from_static("http://kubelet.invalid")
        .connect_timeout(timeout)
        .timeout(timeout);
    let channel = endpoint
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|e| err(format!("connecting: {e}")))?;
    let answer = v1::pod_resources_lister_client::PodResourcesListerClient::new(channel)
        .list(v1::ListPodResourcesRequest {})
        .await
        .map_err(|status| err(format!("List: {}", status.message())))?;
    Ok(answer.into_inner().pod_resources)
}

/// The GPUs each pod holds (all its containers), sorted: the device IDs of device-plugin
/// `resource` (NVIDIA's plugin names GPUs by UUID) and the names of the devices DRA driver
/// `driver` allocated to its claims (NVIDIA's driver names them `gpu-<minor>`). Pods holding
/// none are left out.
pub fn devices_by_pod(
    pods: &[v1::PodResources],
    resource: &str,
    driver: Option<&str>,
) -> BTreeMap<(String, String), Vec<String>> {
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for pod in pods {
        let plugin = pod
            .containers
            .iter()
            .flat_map(|c| &c.devices)
            .filter(|d| d.resource_name == resource)
            .flat_map(|d| d.device_ids.iter().cloned());
        let claimed = pod
            .containers
            .iter()
            .flat_map(|c| &c.dynamic_resources)
            .flat_map(|d| &d.claim_resources)
            .filter(|r| driver.is_some_and(|d| r.driver_name == d))
            .map(|r| r.device_name.clone());
        let mut ids: Vec<String> = plugin.chain(claimed).collect();
        if ids.is_empty() {
            continue;
        }
        ids.sort();
        ids.dedup();
        out.insert((pod.namespace.clone(), pod.name.clone()), ids);
    }
    out
}

/// The cgroup directory of a pod under `root` (the host's `/sys/fs/cgroup`). cgroup v2: the
/// unified tree at `root`; v1: the `cpuacct` hierarchy below it (`cpuacct` or `cpu,cpuacct`).
/// The kubelet names a pod's cgroup `pod<uid>` (cgroupfs driver) or
/// `kubepods[-<qos>]-pod<uid with _>.slice` (systemd driver), below `kubepods` or
/// `kubepods.slice` and its QoS children, which sit at the top of the tree or below the
/// kubelet's `--cgroup-root` (up to [`MAX_ROOT_DEPTH`] levels down). The search is bounded: at
/// most [`MAX_CGROUP_DIRS`] directories are read.
pub fn pod_cgroup(root: &Path, uid: &str) -> Option<PathBuf> {
    let cgroupfs = format!("pod{uid}");
    let systemd = format!("-pod{}.slice", uid.replace('-', "_"));
    let is_pod = |name: &str| name == cgroupfs || name.ends_with(&systemd);
    let mut read = 0usize;
    hierarchy_roots(root).into_iter().find_map(|top| {
        // (directory, levels below `top`, levels below the first `kubepods*` when inside one)
        let mut queue = std::collections::VecDeque::from([(top, 0usize, None::<usize>)]);
        while let Some((dir, depth, inside)) = queue.pop_front() {
            if read >= MAX_CGROUP_DIRS {
                return None;
            }
            read += 1;
            let Ok(children) = std::fs::read_dir(&dir) else {
                continue;
            };
            for child in children.flatten() {
                if !child.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let name = child.file_name();
                let Some(name) = name.to_str() else { continue };
                let path = child.path();
                match inside {
                    Some(below) => {
                        if is_pod(name) {
                            return Some(path);
                        }
                        // kubepods / QoS / pod.
                        if below < 1 {
                            queue.push_back((path, depth + 1, Some(below + 1)));
                        }
                    }
                    None if name.starts_with("kubepods") => {
                        if is_pod(name) {
                            return Some(path);
                        }
                        queue.push_back((path, depth + 1, Some(0)));
                    }
                    None if depth + 1 < MAX_ROOT_DEPTH => {
                        queue.push_back((path, depth + 1, None));
                    }
                    None => {}
                }
            }
        }
        None
    })
}

/// How deep below the cgroup root the kubelet's `kubepods` cgroup is looked for.
pub const MAX_ROOT_DEPTH: usize = 3;

/// How many cgroup directories one search reads at most.
pub const MAX_CGROUP_DIRS: usize = 4096;

/// Where pods' CPU accounting lives under `root`: the unified tree (v2), else v1's `cpuacct`
/// hierarchy (mounted alone or with `cpu`), else `root` itself.
fn hierarchy_roots(root: &Path) -> Vec<PathBuf> {
    if root.join("cgroup.controllers").exists() {
        return vec![root.to_path_buf()];
    }
    let v1: Vec<PathBuf> = ["cpuacct", "cpu,cpuacct", "cpuacct,cpu"]
        .iter()
        .map(|h| root.join(h))
        .filter(|p| p.join("cpuacct.usage").exists())
        .collect();
    if v1.is_empty() {
        vec![root.to_path_buf()]
    } else {
        v1
    }
}

/// CPU time a cgroup has used, in microseconds: `usage_usec` of its `cpu.stat` (cgroup v2),
/// else its `cpuacct.usage` (v1, nanoseconds).
pub fn cpu_usage_usec(dir: &Path) -> Option<u64> {
    if let Ok(text) = std::fs::read_to_string(dir.join("cpu.stat"))
        && let Some(v) = text
            .lines()
            .find_map(|l| l.strip_prefix("usage_usec "))
            .and_then(|v| v.trim().parse().ok())
    {
        return Some(v);
    }
    let ns: u64 = std::fs::read_to_string(dir.join("cpuacct.usage"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(ns / 1000)
}

/// A configured pod on this node that holds GPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedPod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Its TrainingJob, from the `offload.dev/training-job` label.
    pub training_job: Option<String>,
    /// Device IDs from the pod-resources API.
    pub devices: Vec<String>,
    /// Its cgroup directory, when found.
    pub cgroup: Option<PathBuf>,
}

/// The configured pods on `node` that hold GPUs: this node's pods from the API server (their
/// annotations say which the operator configured), joined with the kubelet's device assignment.
pub async fn configured_pods(
    client: &Client,
    node: &str,
    assigned: &BTreeMap<(String, String), Vec<String>>,
    cgroup_root: &Path,
) -> Result<Vec<ObservedPod>, AttributionError> {
    let pods = Api::<Pod>::all(client.clone())
        .list_metadata(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .map_err(|source| AttributionError::Kube {
            action: format!("listing the pods of node {node}"),
            source,
        })?;
    let mut out: Vec<ObservedPod> = pods
        .items
        .into_iter()
        .filter(|p| {
            p.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(names::ANNOTATION_RESOLVED))
        })
        .filter_map(|p| {
            let namespace = p.metadata.namespace.clone()?;
            let name = p.metadata.name.clone()?;
            let devices = assigned.get(&(namespace.clone(), name.clone()))?.clone();
            let cgroup = p
                .metadata
                .uid
                .as_deref()
                .and_then(|uid| pod_cgroup(cgroup_root, uid));
            Some(ObservedPod {
                training_job: p
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(names::LABEL_TRAINING_JOB).cloned()),
                namespace,
                name,
                devices,
                cgroup,
            })
        })
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out.truncate(MAX_PODS);
    Ok(out)
}

/// Samples the pods' GPUs over `window` (every `interval`) and reads their CPU before and after:
/// the summary to publish. `resolve` maps a device ID to the index `source` samples; a device
/// it cannot map is left out of the pod's figures (a pod with none left is not listed).
/// Blocking: run it off the async workers.
#[allow(clippy::too_many_arguments)]
pub fn summarize(
    node: &str,
    pods: &[ObservedPod],
    source: &dyn UtilizationSource,
    resolve: &dyn Fn(&str) -> Option<u32>,
    window: Duration,
    interval: Duration,
    busy_source: BusySource,
) -> Result<ObservedSummary, AttributionError> {
    let indices: Vec<Vec<u32>> = pods
        .iter()
        .map(|p| p.devices.iter().filter_map(|d| resolve(d)).collect())
        .collect();
    let mut all: Vec<u32> = indices.iter().flatten().copied().collect();
    all.sort_unstable();
    all.dedup();
    let cpu_before: Vec<Option<u64>> = pods
        .iter()
        .map(|p| p.cgroup.as_deref().and_then(cpu_usage_usec))
        .collect();
    let started = Instant::now();
    let gpus = if all.is_empty() {
        Vec::new()
    } else {
        source
            .over_window(&all, window, interval)
            .map_err(AttributionError::Sampling)?
    };
    // Counters, where the GPUs had them, say more than the source's sampling.
    let busy_source = if !gpus.is_empty() && gpus.iter().all(|g| g.method == Method::GpmGraphics) {
        BusySource::NvmlGpm
    } else {
        busy_source
    };
    let elapsed = started.elapsed().as_secs_f64().max(1e-3);
    let mut observed = Vec::new();
    for ((pod, idx), before) in pods.iter().zip(&indices).zip(&cpu_before) {
        let mine: Vec<_> = gpus.iter().filter(|g| idx.contains(&g.index)).collect();
        if mine.is_empty() {
            continue;
        }
        #[allow(clippy::cast_precision_loss)]
        let busy = mine.iter().map(|g| g.busy_fraction).sum::<f64>() / mine.len() as f64;
        let after = pod.cgroup.as_deref().and_then(cpu_usage_usec);
        #[allow(clippy::cast_precision_loss)]
        let cpu_cores = match (before, after) {
            (Some(b), Some(a)) if a >= *b => {
                Some(((a - b) as f64 / 1e6 / elapsed * 1000.0).round() / 1000.0)
            }
            _ => None,
        };
        observed.push(PodObservation {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            training_job: pod.training_job.clone(),
            gpus: pod.devices.clone(),
            gpu_busy: (busy.clamp(0.0, 1.0) * 1000.0).round() / 1000.0,
            samples: mine.iter().map(|g| g.samples).min().unwrap_or(0),
            cpu_cores,
        });
    }
    Ok(ObservedSummary {
        schema_version: OBSERVED_SCHEMA_VERSION,
        node: node.to_string(),
        observed_at: jiff::Timestamp::now().to_string(),
        window_seconds: (elapsed * 1000.0).round() / 1000.0,
        source: busy_source,
        pods: observed,
    })
}

/// Writes the summary on the node (its own field manager); an empty one removes the
/// annotation, so a node whose configured pods are gone says nothing stale.
pub async fn publish_observed(
    client: &Client,
    summary: &ObservedSummary,
) -> Result<(), AttributionError> {
    let annotations = if summary.pods.is_empty() {
        json!({})
    } else {
        let text = summary
            .to_annotation()
            .map_err(|e| AttributionError::Kube {
                action: "serialising the observation".into(),
                source: kube::Error::SerdeError(e),
            })?;
        json!({names::ANNOTATION_OBSERVED: text})
    };
    let doc = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": summary.node, "annotations": annotations}
    });
    Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .patch(
            &summary.node,
            &PatchParams::apply(OBSERVER_MANAGER).force(),
            &Patch::Apply(&doc),
        )
        .await
        .map_err(|source| AttributionError::Kube {
            action: format!("publishing the observation on node {}", summary.node),
            source,
        })?;
    Ok(())
}

#[cfg(test)]
mod tests;
