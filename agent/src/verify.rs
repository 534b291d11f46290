//! The start-up guard (`offload-agent verify`): run as an init container of a pod the operator
//! configured, inside the pod's own GPU allocation, before the training framework starts. It
//! fails fast, with a message a person can act on, when the node is not what the configuration
//! assumes: unified-memory residency on GPUs without hardware coherence, a node class that
//! changed since the node was labelled (a driver change, a stale label), pinned host memory that
//! the pod cannot get, fewer CPU cores than the decision counted on (the guard runs with the
//! training container's CPU limit, so its own cgroup shows the quota and cpuset the training
//! process will get), or no driver at all.

use offload_api::report::{AddressingMode, GpuReport, NodeMemoryModel};
use offload_api::v1alpha1::{NodeClass, OffloadMode};

use crate::probe::NvmlSource;

/// What the pod's configuration assumes about its node (from the operator's rendering).
#[derive(Clone, Debug, PartialEq)]
pub struct Expected {
    /// The offload mode written into the pod.
    pub mode: OffloadMode,
    /// The node class the decision placed the pod on.
    pub node_class: Option<NodeClass>,
    /// Whether the configuration pins host memory.
    pub pin_memory: bool,
    /// This node's name, for the message.
    pub node: String,
    /// The CPU cores the decision counted on for the optimizer update (the training
    /// container's CPU limit), where it counted on a limit.
    pub cpu_cores: Option<f64>,
    /// The pod asked for whole cores of its own near its GPUs (a Guaranteed pod under the
    /// kubelet's static CPU manager): the guard says whether it got them.
    pub whole_cores: bool,
}

/// The CPU this container gets, as its cgroup and its affinity say.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CpuSeen {
    /// The CFS quota in cores (`cpu.max`, or v1's `cpu.cfs_quota_us` over its period); `None`:
    /// no quota.
    pub quota_cores: Option<f64>,
    /// The CPUs the process may run on (its affinity: the cpuset), by number, in order; empty
    /// where unknown.
    pub cpus: Vec<u32>,
}

impl CpuSeen {
    /// Reads the cgroup under `root` (cgroup v2's `cpu.max`, else v1's quota and period) and
    /// this process's affinity.
    pub fn read(root: &std::path::Path) -> CpuSeen {
        let text = |p: &std::path::Path| std::fs::read_to_string(p).ok();
        let v2 = text(&root.join("cpu.max")).and_then(|t| quota_v2(&t));
        let v1 = || {
            ["cpu", "cpu,cpuacct"].iter().find_map(|d| {
                let quota = text(&root.join(d).join("cpu.cfs_quota_us"))?;
                let period = text(&root.join(d).join("cpu.cfs_period_us"))?;
                quota_v1(&quota, &period)
            })
        };
        CpuSeen {
            quota_cores: v2.or_else(v1).flatten(),
            cpus: affinity_list(),
        }
    }

    /// How many CPUs the cpuset holds; `None` where unknown.
    pub fn cpuset(&self) -> Option<u32> {
        u32::try_from(self.cpus.len()).ok().filter(|n| *n > 0)
    }

    /// The cores available: the quota, bounded by the cpuset.
    pub fn cores(&self) -> Option<f64> {
        match (self.quota_cores, self.cpuset()) {
            (Some(q), Some(s)) => Some(q.min(f64::from(s))),
            (q, s) => q.or(s.map(f64::from)),
        }
    }

    fn describe(&self) -> String {
        let quota = self.quota_cores.map_or("no CFS quota".to_string(), |q| {
            format!("a CFS quota of {q} cores")
        });
        let set = self
            .cpuset()
            .map_or(String::new(), |s| format!(" and {s} CPUs in its cpuset"));
        format!("{quota}{set}")
    }
}

/// cgroup v2 `cpu.max` (`max 100000` or `200000 100000`): `Some(None)` without a quota.
pub fn quota_v2(text: &str) -> Option<Option<f64>> {
    let mut parts = text.split_whitespace();
    let (quota, period) = (parts.next()?, parts.next()?);
    if quota == "max" {
        return Some(None);
    }
    let (q, p): (f64, f64) = (quota.parse().ok()?, period.parse().ok()?);
    (q > 0.0 && p > 0.0).then_some(Some(q / p))
}

/// cgroup v1 quota and period (`-1`: no quota).
pub fn quota_v1(quota: &str, period: &str) -> Option<Option<f64>> {
    let q: i64 = quota.trim().parse().ok()?;
    if q < 0 {
        return Some(None);
    }
    let p: f64 = period.trim().parse().ok()?;
    #[allow(clippy::cast_precision_loss)]
    (q > 0 && p > 0.0).then_some(Some(q as f64 / p))
}

/// The CPUs in this process's affinity mask, in order (empty where it cannot be read).
fn affinity_list() -> Vec<u32> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &raw mut set) };
    if rc != 0 {
        return Vec::new();
    }
    let size = u32::try_from(libc::CPU_SETSIZE).unwrap_or(0);
    // SAFETY: `set` was filled by the kernel above; every index is below CPU_SETSIZE.
    (0..size)
        .filter(|&i| unsafe { libc::CPU_ISSET(i as usize, &set) })
        .collect()
}

/// Where whole cores were asked: whether the cpuset is the pod's own (as many CPUs as counted)
/// and on its GPUs' socket (within their local CPUs), as a warning where not. `None`: it is.
fn whole_cores_warning(
    cpu: &CpuSeen,
    counted: Option<f64>,
    gpus: &[GpuReport],
    node: &str,
) -> Option<String> {
    let set = cpu.cpuset()?;
    if let Some(counted) = counted
        && f64::from(set) > counted + 0.01
    {
        return Some(format!(
            "whole cores were asked ({counted}), but this pod's cpuset on node {node} has {set} CPUs: the kubelet did not give it cores of its own (its cpuManagerPolicy is not static, or the pod is not Guaranteed), so the optimizer update runs under a quota wherever the kernel places it"
        ));
    }
    let local: Vec<u32> = gpus
        .iter()
        .filter_map(|g| g.local_cpus.as_deref().and_then(crate::topology::cpu_list))
        .flatten()
        .collect();
    if local.is_empty() {
        return None;
    }
    let away: Vec<String> = cpu
        .cpus
        .iter()
        .filter(|c| !local.contains(c))
        .map(u32::to_string)
        .collect();
    (!away.is_empty()).then(|| {
        format!(
            "this pod's cores {} on node {node} are not local to its GPUs (local CPUs {}): every copy of offloaded state crosses the socket link; the kubelet aligns cores with GPUs only under topologyManagerPolicy single-numa-node or restricted",
            away.join(","),
            gpus.iter()
                .filter_map(|g| g.local_cpus.as_deref())
                .collect::<Vec<_>>()
                .join(" and ")
        )
    })
}

/// The node matches; with anything worth a line in the pod's log.
#[derive(Clone, Debug, PartialEq)]
pub struct Verified {
    /// One line: what was checked.
    pub summary: String,
    /// Mismatches that do not make the configuration wrong (it works, maybe not at its best).
    pub warnings: Vec<String>,
}

/// Why the node is not what the configuration assumes. Each message says what to do.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Mismatch {
    /// No NVML in the pod.
    #[error(
        "this pod sees no NVIDIA driver ({error}), but it was configured for {mode} offload on a \
         {class} GPU node ({node}). Run it with the NVIDIA container runtime (the pod's \
         runtimeClassName) and an nvidia.com/gpu request, or remove its offload.dev/profile label"
    )]
    NoDriver {
        /// NVML's error.
        error: String,
        /// Configured mode.
        mode: String,
        /// Assumed class.
        class: String,
        /// Node name.
        node: String,
    },
    /// NVML works but shows no GPU.
    #[error(
        "NVML sees no GPU in this pod on node {node}, but it was configured for {mode} offload: \
         request nvidia.com/gpu in the pod, or remove its offload.dev/profile label"
    )]
    NoGpu {
        /// Configured mode.
        mode: String,
        /// Node name.
        node: String,
    },
    /// Unified memory configured on GPUs that are not hardware-coherent.
    #[error(
        "configured for unified-memory offload, which needs hardware-coherent host memory \
         (NVML addressing mode ATS with NVLink-C2C), but on node {node} {detail}: this is not a \
         unified-memory node. Its offload.dev labels are stale (a driver or firmware change?): \
         restart the offload-agent pod on {node} so it re-labels the node, then recreate this job"
    )]
    NotCoherent {
        /// Which GPUs fall short, and how.
        detail: String,
        /// Node name.
        node: String,
    },
    /// Pinned host memory configured but refused.
    #[error(
        "configured with pinned host memory (pin_memory), but page-locking {mib} MiB in this pod \
         on node {node} failed: {error}. Raise the pod's memory limit, or set \
         spec.offload.pinMemory: Disabled in the job (slower copies)"
    )]
    PinRefused {
        /// Size tried.
        mib: usize,
        /// The driver's error.
        error: String,
        /// Node name.
        node: String,
    },
    /// Fewer CPU cores than the decision counted on.
    #[error(
        "configured for {counted} CPU cores of optimizer update (the training container's CPU \
         limit, which sized the offloaded share and the CPU Adam threads), but this pod on node \
         {node} gets {seen} ({detail}). Give the training container the cores it asks for (a \
         runtime or kubelet setting that narrows the pod's CPUs?), or recreate the job with the \
         CPU limit it really gets so the decision counts those"
    )]
    CpuShort {
        /// Cores counted.
        counted: f64,
        /// Cores seen.
        seen: f64,
        /// The quota and cpuset, in words.
        detail: String,
        /// Node name.
        node: String,
    },
}

/// How much host memory the guard pins to check that pinning works.
pub const PIN_PROBE_BYTES: usize = 64 << 20;

fn describe(g: &GpuReport) -> String {
    let mode = match g.addressing_mode {
        AddressingMode::Ats => "ATS",
        AddressingMode::Hmm => "HMM",
        AddressingMode::None => "none",
        AddressingMode::Unknown => "unknown",
    };
    format!(
        "GPU {} ({}) reports addressing mode {mode} and NVLink-C2C {}",
        g.index,
        g.name,
        if g.c2c.enabled { "on" } else { "off" }
    )
}

/// Unified memory, or a node labelled coherent, needs every GPU coherent (ATS over NVLink-C2C);
/// a coherent node labelled discrete works, with a warning to re-label it.
fn check_coherence(
    expected: &Expected,
    gpus: &[GpuReport],
    model: NodeMemoryModel,
    node: &str,
) -> Result<Option<String>, Mismatch> {
    let coherent = |g: &GpuReport| g.addressing_mode == AddressingMode::Ats && g.c2c.enabled;
    if expected.mode == OffloadMode::UnifiedMemory
        || expected.node_class == Some(NodeClass::Coherent)
    {
        let short: Vec<String> = gpus.iter().filter(|g| !coherent(g)).map(describe).collect();
        if !short.is_empty() {
            return Err(Mismatch::NotCoherent {
                detail: short.join("; "),
                node: node.to_string(),
            });
        }
    } else if expected.node_class == Some(NodeClass::Discrete) && model == NodeMemoryModel::Coherent
    {
        return Ok(Some(format!(
            "node {node} is hardware-coherent but was labelled discrete: explicit CPU copies work \
             here, unified memory would too (restart the offload-agent pod on {node} to re-label it)"
        )));
    }
    Ok(None)
}

/// Checks the node against the configuration. `pin` page-locks host memory the way the
/// framework will (`Err` with the driver's message when refused); it is called only when the
/// configuration pins.
pub fn verify(
    source: &dyn NvmlSource,
    expected: &Expected,
    pin: &dyn Fn() -> Result<(), String>,
    cpu: &CpuSeen,
) -> Result<Verified, Mismatch> {
    let mode = expected.mode.env_value().to_string();
    let class = expected
        .node_class
        .map_or_else(|| "unknown".to_string(), |c| c.to_string());
    let node = expected.node.clone();
    let reading = source.read();
    if !reading.nvml.available {
        return Err(Mismatch::NoDriver {
            error: reading
                .nvml
                .error
                .unwrap_or_else(|| "NVML unavailable".into()),
            mode,
            class,
            node,
        });
    }
    if reading.gpus.is_empty() {
        return Err(Mismatch::NoGpu { mode, node });
    }
    let model = NodeMemoryModel::classify(&reading.gpus);
    let mut warnings = Vec::new();
    warnings.extend(check_coherence(expected, &reading.gpus, model, &node)?);
    if expected.pin_memory && expected.mode != OffloadMode::Disabled {
        pin().map_err(|error| Mismatch::PinRefused {
            mib: PIN_PROBE_BYTES >> 20,
            error,
            node: node.clone(),
        })?;
    }
    if let (Some(counted), Some(seen)) = (expected.cpu_cores, cpu.cores())
        && seen + 0.01 < counted
    {
        return Err(Mismatch::CpuShort {
            counted,
            seen,
            detail: cpu.describe(),
            node,
        });
    }
    if expected.whole_cores {
        warnings.extend(whole_cores_warning(
            cpu,
            expected.cpu_cores,
            &reading.gpus,
            &node,
        ));
    }
    let gpus: Vec<String> = reading
        .gpus
        .iter()
        .map(|g| format!("{} {}", g.index, g.name))
        .collect();
    Ok(Verified {
        summary: format!(
            "node {node} matches the configuration: mode {mode}, node class {class}, memory model \
             {model:?}, pinned memory {}, GPUs [{}]",
            if expected.pin_memory {
                "works"
            } else {
                "not used"
            },
            gpus.join(", ")
        ),
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use offload_testenv::fixtures;

    use super::*;
    use crate::probe::RecordedNvml;

    fn expected(mode: OffloadMode, class: NodeClass, pin: bool) -> Expected {
        Expected {
            mode,
            node_class: Some(class),
            pin_memory: pin,
            node: "gpu-7".into(),
            cpu_cores: None,
            whole_cores: false,
        }
    }

    fn pins() -> Result<(), String> {
        Ok(())
    }

    #[test]
    fn a_node_that_is_what_the_configuration_assumes_passes() {
        // Recorded readings: a GH200 (coherent) and an H200 (discrete).
        let gh = RecordedNvml::from_report(fixtures::GH200_REFERENCE).unwrap();
        let ok = verify(
            &gh,
            &expected(OffloadMode::UnifiedMemory, NodeClass::Coherent, false),
            &pins,
            &CpuSeen::default(),
        )
        .unwrap();
        assert!(ok.summary.contains("Coherent"), "{}", ok.summary);
        assert!(ok.warnings.is_empty());
        let h200 = RecordedNvml::from_report(fixtures::H200_READING).unwrap();
        let ok = verify(
            &h200,
            &expected(OffloadMode::CpuCopy, NodeClass::Discrete, true),
            &pins,
            &CpuSeen::default(),
        )
        .unwrap();
        assert!(ok.summary.contains("pinned memory works"));
    }

    #[test]
    fn unified_memory_on_a_discrete_gpu_fails_with_what_to_do() {
        let h200 = RecordedNvml::from_report(fixtures::H200_READING).unwrap();
        let err = verify(
            &h200,
            &expected(OffloadMode::UnifiedMemory, NodeClass::Coherent, false),
            &pins,
            &CpuSeen::default(),
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Mismatch::NotCoherent { .. }));
        assert!(
            msg.contains("H200") && msg.contains("addressing mode") && msg.contains("gpu-7"),
            "{msg}"
        );
        assert!(msg.contains("restart the offload-agent pod"), "{msg}");
    }

    #[test]
    fn a_coherent_node_labelled_discrete_only_warns() {
        let gh = RecordedNvml::from_report(fixtures::GH200_REFERENCE).unwrap();
        let ok = verify(
            &gh,
            &expected(OffloadMode::CpuCopy, NodeClass::Discrete, false),
            &pins,
            &CpuSeen::default(),
        )
        .unwrap();
        assert_eq!(ok.warnings.len(), 1, "{ok:?}");
    }

    #[test]
    fn no_driver_and_refused_pinning_fail() {
        let err = verify(
            &RecordedNvml::missing_library(),
            &expected(OffloadMode::CpuCopy, NodeClass::Discrete, true),
            &pins,
            &CpuSeen::default(),
        )
        .unwrap_err();
        assert!(matches!(err, Mismatch::NoDriver { .. }));
        assert!(err.to_string().contains("libnvidia-ml.so.1"), "{err}");
        let h200 = RecordedNvml::from_report(fixtures::H200_READING).unwrap();
        let refused = || Err("CUDA_ERROR_OUT_OF_MEMORY".to_string());
        let err = verify(
            &h200,
            &expected(OffloadMode::CpuCopy, NodeClass::Discrete, true),
            &refused,
            &CpuSeen::default(),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("spec.offload.pinMemory: Disabled"),
            "{err}"
        );
        // Not pinning: the probe is not even tried.
        verify(
            &h200,
            &expected(OffloadMode::CpuCopy, NodeClass::Discrete, false),
            &refused,
            &CpuSeen::default(),
        )
        .unwrap();
    }

    /// The training container was counted 8 cores (its CPU limit); the pod gets a quota of 2
    /// (the guard runs with the same limit, so its cgroup shows it): refused with the figures.
    #[test]
    fn fewer_cores_than_counted_fail_with_the_figures() {
        let h200 = RecordedNvml::from_report(fixtures::H200_READING).unwrap();
        let counted = Expected {
            cpu_cores: Some(8.0),
            ..expected(OffloadMode::CpuCopy, NodeClass::Discrete, false)
        };
        let two = CpuSeen {
            quota_cores: Some(2.0),
            cpus: (0..16).collect(),
        };
        let err = verify(&h200, &counted, &pins, &two).unwrap_err();
        assert!(matches!(err, Mismatch::CpuShort { .. }));
        let msg = err.to_string();
        assert!(
            msg.contains("8 CPU cores") && msg.contains("gets 2") && msg.contains("16 CPUs"),
            "{msg}"
        );
        // The quota it was counted, or a cpuset of as many whole cores: it passes; so does a
        // pod with no quota (its cpuset is the bound).
        for seen in [
            CpuSeen {
                quota_cores: Some(8.0),
                cpus: (0..16).collect(),
            },
            CpuSeen {
                quota_cores: None,
                cpus: (0..8).collect(),
            },
        ] {
            verify(&h200, &counted, &pins, &seen).unwrap();
        }
        let narrow = CpuSeen {
            quota_cores: None,
            cpus: (0..4).collect(),
        };
        assert!(verify(&h200, &counted, &pins, &narrow).is_err());
    }

    /// Whole cores asked (a Guaranteed pod under the static CPU manager, GPU 0 local to CPUs
    /// 0-15 as the agent read a real H100 node): the guard passes and says what the kubelet
    /// gave: cores of the pod's own on the GPU's socket, or which of that is missing.
    #[test]
    fn whole_cores_are_checked_for_being_the_pods_own_and_near_its_gpu() {
        let mut report: serde_json::Value = serde_json::from_str(fixtures::H200_READING).unwrap();
        report["gpus"][0]["localCpus"] = "0-15".into();
        report["gpus"][0]["localCpuCount"] = 16.into();
        let node = RecordedNvml::from_report(&report.to_string()).unwrap();
        let asked = Expected {
            cpu_cores: Some(4.0),
            whole_cores: true,
            ..expected(OffloadMode::CpuCopy, NodeClass::Discrete, false)
        };
        let seen = |cpus: Vec<u32>| CpuSeen {
            quota_cores: Some(4.0),
            cpus,
        };
        let own_near = verify(&node, &asked, &pins, &seen(vec![4, 5, 6, 7])).unwrap();
        assert!(own_near.warnings.is_empty(), "{:?}", own_near.warnings);
        let shared = verify(&node, &asked, &pins, &seen((0..32).collect())).unwrap();
        assert!(
            shared.warnings[0].contains("cpuset on node gpu-7 has 32 CPUs")
                && shared.warnings[0].contains("not static, or the pod is not Guaranteed"),
            "{:?}",
            shared.warnings
        );
        let far = verify(&node, &asked, &pins, &seen(vec![14, 15, 16, 17])).unwrap();
        assert!(
            far.warnings[0]
                .contains("cores 16,17 on node gpu-7 are not local to its GPUs (local CPUs 0-15)")
                && far.warnings[0].contains("single-numa-node or restricted"),
            "{:?}",
            far.warnings
        );
        // Not asked: nothing said of the cores.
        let plain = Expected {
            whole_cores: false,
            ..asked
        };
        assert!(
            verify(&node, &plain, &pins, &seen(vec![14, 15, 16, 17]))
                .unwrap()
                .warnings
                .is_empty()
        );
    }

    #[test]
    fn cgroup_quotas_read_in_both_versions() {
        assert_eq!(quota_v2("max 100000\n"), Some(None));
        assert_eq!(quota_v2("200000 100000"), Some(Some(2.0)));
        assert_eq!(quota_v2("150000 100000"), Some(Some(1.5)));
        assert_eq!(quota_v2("garbage"), None);
        assert_eq!(quota_v1("-1", "100000"), Some(None));
        assert_eq!(quota_v1("400000\n", "100000\n"), Some(Some(4.0)));
        assert_eq!(quota_v1("x", "100000"), None);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cpu.max"), "300000 100000\n").unwrap();
        assert_eq!(CpuSeen::read(dir.path()).quota_cores, Some(3.0));
        // This process's own affinity is read (at least one CPU).
        assert!(CpuSeen::read(dir.path()).cpuset().is_some_and(|n| n >= 1));
    }
}
