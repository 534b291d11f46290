//! Which configured pod on this node holds which GPU, how busy those GPUs were, and how much CPU
//! the pod used: the summary the operator turns into each TrainingJob's `status.observed`.
//!
//! - GPUs per pod come from the kubelet's pod-resources API (`List` on its local socket), the
//!   way GPU metrics exporters attribute devices: the device IDs the device plugin handed out.
//! - "Configured" means the operator wrote the pod's configuration (its `offload.dev/resolved`
//!   annotation); only those pods, and only on this node, are observed.
//! - Busy fractions and GPU memory come from a [`UtilizationSource`] (NVML) sampled over the
//!   window; CPU and host memory from the pod's cgroup (`cpu.stat` and `memory.peak` in cgroup
//!   v2, `cpuacct.usage` and `memory.max_usage_in_bytes` in v1; systemd or cgroupfs layout).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use offload_api::names;
use offload_api::observed::{
    BusySource, HostMemorySource, MAX_PODS, OBSERVED_SCHEMA_VERSION, ObservedSummary,
    PodObservation,
};
use serde_json::json;

use crate::utilization::{Method, UtilizationSource};

/// Where the kubelet serves the pod-resources API.
pub const POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

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
    pod_cgroup_in(root, uid, Controller::Cpu)
}

/// The pod's cgroup directory for host memory: the same as [`pod_cgroup`] in cgroup v2, the
/// `memory` hierarchy's in v1.
pub fn pod_memory_cgroup(root: &Path, uid: &str) -> Option<PathBuf> {
    pod_cgroup_in(root, uid, Controller::Memory)
}

/// Which v1 hierarchy a search looks in.
#[derive(Clone, Copy)]
enum Controller {
    Cpu,
    Memory,
}

fn pod_cgroup_in(root: &Path, uid: &str, controller: Controller) -> Option<PathBuf> {
    let cgroupfs = format!("pod{uid}");
    let systemd = format!("-pod{}.slice", uid.replace('-', "_"));
    let is_pod = |name: &str| name == cgroupfs || name.ends_with(&systemd);
    let mut read = 0usize;
    hierarchy_roots(root, controller)
        .into_iter()
        .find_map(|top| {
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

/// Where pods' CPU (or memory) accounting lives under `root`: the unified tree (v2), else v1's
/// `cpuacct` hierarchy (mounted alone or with `cpu`) or `memory` hierarchy, else `root` itself.
fn hierarchy_roots(root: &Path, controller: Controller) -> Vec<PathBuf> {
    if root.join("cgroup.controllers").exists() {
        return vec![root.to_path_buf()];
    }
    let (names, marker): (&[&str], &str) = match controller {
        Controller::Cpu => (&["cpuacct", "cpu,cpuacct", "cpuacct,cpu"], "cpuacct.usage"),
        Controller::Memory => (&["memory"], "memory.usage_in_bytes"),
    };
    let v1: Vec<PathBuf> = names
        .iter()
        .map(|h| root.join(h))
        .filter(|p| p.join(marker).exists())
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

/// The cgroup's host memory high-water mark: `memory.peak` (v2), else
/// `memory.max_usage_in_bytes` (v1).
pub fn host_memory_peak(dir: &Path) -> Option<(u64, HostMemorySource)> {
    let read = |file: &str| -> Option<u64> {
        std::fs::read_to_string(dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    read("memory.peak")
        .map(|b| (b, HostMemorySource::CgroupPeak))
        .or_else(|| {
            read("memory.max_usage_in_bytes").map(|b| (b, HostMemorySource::CgroupMaxUsage))
        })
}

/// The cgroup's host memory now: `memory.current` (v2), else `memory.usage_in_bytes` (v1).
pub fn host_memory_current(dir: &Path) -> Option<u64> {
    ["memory.current", "memory.usage_in_bytes"]
        .iter()
        .find_map(|f| {
            std::fs::read_to_string(dir.join(f))
                .ok()?
                .trim()
                .parse()
                .ok()
        })
}

/// Most PIDs read from one pod's cgroups, and most directories walked for them.
pub const MAX_POD_PIDS: usize = 4096;
const MAX_POD_CGROUP_DIRS: usize = 256;

/// The processes in a pod's cgroup and the cgroups below it (its containers), as the agent's
/// PID namespace numbers them (a process outside it reads as 0 and is left out). Bounded by
/// [`MAX_POD_PIDS`].
pub fn pod_pids(dir: &Path) -> std::collections::BTreeSet<u32> {
    let mut pids = std::collections::BTreeSet::new();
    let mut queue = std::collections::VecDeque::from([(dir.to_path_buf(), 0usize)]);
    let mut walked = 0usize;
    while let Some((d, depth)) = queue.pop_front() {
        walked += 1;
        if walked > MAX_POD_CGROUP_DIRS {
            break;
        }
        if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
            for pid in text.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
                if pid != 0 && pids.len() < MAX_POD_PIDS {
                    pids.insert(pid);
                }
            }
        }
        if depth < 3
            && let Ok(children) = std::fs::read_dir(&d)
        {
            for c in children.flatten() {
                if c.file_type().is_ok_and(|t| t.is_dir()) {
                    queue.push_back((c.path(), depth + 1));
                }
            }
        }
    }
    pids
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
    /// Its cgroup directory for memory (the same as `cgroup` in cgroup v2), when found.
    pub memory_cgroup: Option<PathBuf>,
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
            let uid = p.metadata.uid.as_deref();
            let cgroup = uid.and_then(|uid| pod_cgroup(cgroup_root, uid));
            let memory_cgroup = uid.and_then(|uid| pod_memory_cgroup(cgroup_root, uid));
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
                memory_cgroup,
            })
        })
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out.truncate(MAX_PODS);
    Ok(out)
}

/// Samples the pods' GPUs over `window` (every `interval`) and reads their CPU before and after
/// and their host memory: the summary to publish. `resolve` maps a device ID to the index
/// `source` samples; a device it cannot map is left out of the pod's figures (a pod with none
/// left is not listed). Blocking: run it off the async workers.
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
    let mut pids: Vec<std::collections::BTreeSet<u32>> = pods.iter().map(pids_of).collect();
    let started = Instant::now();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (gpus, host_sampled) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| sample_host_memory(pods, interval, &stop));
        let gpus = if all.is_empty() {
            Ok(Vec::new())
        } else {
            source.over_window(&all, window, interval)
        };
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let sampled = sampler.join().unwrap_or_else(|_| vec![None; pods.len()]);
        (gpus, sampled)
    });
    let gpus = gpus.map_err(AttributionError::Sampling)?;
    // Processes that started during the window count too.
    for (seen, pod) in pids.iter_mut().zip(pods) {
        seen.extend(pids_of(pod));
    }
    // Counters, where the GPUs had them, say more than the source's sampling.
    let busy_source = if !gpus.is_empty() && gpus.iter().all(|g| g.method == Method::GpmGraphics) {
        BusySource::NvmlGpm
    } else {
        busy_source
    };
    let elapsed = started.elapsed().as_secs_f64().max(1e-3);
    let mut observed = Vec::new();
    for (i, ((pod, idx), before)) in pods.iter().zip(&indices).zip(&cpu_before).enumerate() {
        let mine: Vec<_> = gpus.iter().filter(|g| idx.contains(&g.index)).collect();
        if mine.is_empty() {
            continue;
        }
        let cpu_cores = cores_used(
            *before,
            pod.cgroup.as_deref().and_then(cpu_usage_usec),
            elapsed,
        );
        let host = pod
            .memory_cgroup
            .as_deref()
            .and_then(host_memory_peak)
            .or_else(|| {
                host_sampled
                    .get(i)
                    .copied()
                    .flatten()
                    .map(|b| (b, HostMemorySource::SampledCurrent))
            });
        observed.push(observation(pod, &mine, &pids[i], cpu_cores, host));
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

/// The cores a pod's cgroup used over the window, from its CPU time before and after (`None`
/// where either read failed or the counter went back, as after a cgroup's re-creation).
fn cores_used(before: Option<u64>, after: Option<u64>, elapsed: f64) -> Option<f64> {
    match (before, after) {
        #[allow(clippy::cast_precision_loss)]
        (Some(b), Some(a)) if a >= b => {
            Some(((a - b) as f64 / 1e6 / elapsed * 1000.0).round() / 1000.0)
        }
        _ => None,
    }
}

/// One pod's observation from its GPUs' samples over the window, its processes, its cores and
/// its host memory.
fn observation(
    pod: &ObservedPod,
    mine: &[&crate::utilization::GpuObservation],
    pids: &std::collections::BTreeSet<u32>,
    cpu_cores: Option<f64>,
    host: Option<(u64, HostMemorySource)>,
) -> PodObservation {
    #[allow(clippy::cast_precision_loss)]
    let busy = mine.iter().map(|g| g.busy_fraction).sum::<f64>() / mine.len().max(1) as f64;
    let gpu_memory = gpu_memory_of(mine, pids);
    PodObservation {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        training_job: pod.training_job.clone(),
        gpus: pod.devices.clone(),
        gpu_busy: (busy.clamp(0.0, 1.0) * 1000.0).round() / 1000.0,
        samples: mine.iter().map(|g| g.samples).min().unwrap_or(0),
        cpu_cores,
        gpu_memory_peak_bytes: gpu_memory.map(|m| m.0),
        gpu_memory_total_bytes: gpu_memory.map(|m| m.1),
        process_gpu_memory_peak_bytes: gpu_memory.and_then(|m| m.2),
        host_memory_peak_bytes: host.map(|h| h.0),
        host_memory_source: host.map(|h| h.1),
        allocator_peak_bytes: None,
        step_seconds: None,
    }
}

/// The PIDs in a pod's cgroups (CPU hierarchy, else memory's).
fn pids_of(pod: &ObservedPod) -> std::collections::BTreeSet<u32> {
    pod.cgroup
        .as_deref()
        .or(pod.memory_cgroup.as_deref())
        .map(pod_pids)
        .unwrap_or_default()
}

/// The pod's GPU memory over the window: (highest in use on one of its GPUs, the smallest of
/// its GPUs, the highest its own processes held on one GPU where NVML named any of them).
/// `None` when no GPU of the pod was sampled for memory.
fn gpu_memory_of(
    mine: &[&crate::utilization::GpuObservation],
    pids: &std::collections::BTreeSet<u32>,
) -> Option<(u64, u64, Option<u64>)> {
    let peaks: Vec<_> = mine.iter().filter_map(|g| g.memory.as_ref()).collect();
    let used = peaks.iter().map(|m| m.used).max()?;
    let total = peaks.iter().map(|m| m.total).min()?;
    let process = peaks
        .iter()
        .filter_map(|m| {
            let own: Vec<u64> = m
                .processes
                .iter()
                .filter(|(pid, _)| pids.contains(pid))
                .map(|(_, b)| *b)
                .collect();
            (!own.is_empty()).then(|| {
                own.iter()
                    .fold(0u64, |a, b| a.saturating_add(*b))
                    .min(m.used)
            })
        })
        .max();
    Some((used.min(total), total, process))
}

/// Samples `memory.current` of each pod's memory cgroup every `interval` until `stop`: the
/// peak where the kernel keeps none (read only for those). One figure per pod, in order.
fn sample_host_memory(
    pods: &[ObservedPod],
    interval: Duration,
    stop: &std::sync::atomic::AtomicBool,
) -> Vec<Option<u64>> {
    let dirs: Vec<Option<&Path>> = pods
        .iter()
        .map(|p| {
            p.memory_cgroup
                .as_deref()
                .filter(|d| host_memory_peak(d).is_none())
        })
        .collect();
    let mut peaks = vec![None::<u64>; pods.len()];
    if dirs.iter().all(Option::is_none) {
        return peaks;
    }
    loop {
        for (peak, dir) in peaks.iter_mut().zip(&dirs) {
            if let Some(now) = dir.and_then(host_memory_current) {
                *peak = Some(peak.map_or(now, |p| p.max(now)));
            }
        }
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return peaks;
        }
        std::thread::sleep(interval.max(Duration::from_millis(10)));
    }
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
