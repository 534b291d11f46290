//! The witnesses of a node's memory model: NVML's addressing mode and C2C state, and the
//! kernel's NUMA view of GPU memory. A coherent platform shows its GPU memory as memory-only
//! NUMA nodes in NUMA mode (GH200 as often deployed) and not at all in CDMM mode (the driver
//! manages GPU memory; Grace Blackwell under Kubernetes), so the kernel's view tells the two
//! modes apart but never makes a node unified on its own: only NVML's ATS with C2C does.

use serde::{Deserialize, Serialize};

use super::{GpuReport, NodeMemoryModel};

/// Memory-only NUMA nodes a report lists at most (a 4-GPU GH200 in NUMA mode shows 32).
pub const MAX_MEMORY_ONLY_NODES: usize = 256;

/// Memory-only NUMA nodes that together hold at least this share of the GPUs' memory are taken
/// as the GPUs' memory (NUMA mode); the driver and firmware keep the rest.
pub const GPU_MEMORY_SHARE: f64 = 0.5;

/// What the kernel shows of the GPUs' memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, strum::Display)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum KernelGpuMemory {
    /// Memory-only NUMA nodes hold about the GPUs' memory: a coherent platform in NUMA mode.
    NumaNodes,
    /// No memory-only NUMA node holds it: a discrete GPU, or a coherent platform in CDMM mode.
    NotNumaNodes,
}

/// A NUMA node without CPUs, and its memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemoryOnlyNode {
    /// The node's number (`/sys/devices/system/node/nodeN`).
    pub node: u32,
    /// Its `MemTotal`, bytes.
    pub bytes: u64,
}

/// What each witness said of the node's memory, and which the classification used.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemoryWitnesses {
    /// NVML's addressing mode and C2C state alone.
    pub nvml: NodeMemoryModel,
    /// The kernel's NUMA view, where `/sys/devices/system/node` could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelGpuMemory>,
    /// The memory-only NUMA nodes with memory, as read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory_only_nodes: Vec<MemoryOnlyNode>,
    /// Whether the witnesses agree.
    pub agree: bool,
    /// Which witnesses the classification used, and what they said, in one sentence.
    pub used: String,
}

impl MemoryWitnesses {
    /// The witnesses of a node whose GPUs NVML read as `gpus` (its classification `nvml`) and
    /// whose kernel shows `memory_only` (`None`: unreadable).
    pub fn weigh(
        nvml: NodeMemoryModel,
        gpus: &[GpuReport],
        memory_only: Option<Vec<MemoryOnlyNode>>,
    ) -> MemoryWitnesses {
        let gpu_bytes: u64 = gpus.iter().map(|g| g.memory_total_bytes).sum();
        let kernel = memory_only.as_ref().map(|m| {
            let held: u64 = m.iter().map(|n| n.bytes).fold(0, u64::saturating_add);
            #[allow(clippy::cast_precision_loss)]
            let holds = gpu_bytes > 0 && held as f64 >= GPU_MEMORY_SHARE * gpu_bytes as f64;
            if holds {
                KernelGpuMemory::NumaNodes
            } else {
                KernelGpuMemory::NotNumaNodes
            }
        });
        let coherent = nvml == NodeMemoryModel::Coherent;
        let (agree, used) = match (coherent, kernel) {
            (true, Some(KernelGpuMemory::NumaNodes)) => (
                true,
                "NVML (ATS with NVLink-C2C) and the kernel (GPU memory as NUMA nodes: NUMA mode) agree".to_string(),
            ),
            (true, Some(KernelGpuMemory::NotNumaNodes)) => (
                true,
                "NVML (ATS with NVLink-C2C); the kernel shows no GPU memory node, as in CDMM mode (the driver manages GPU memory)".to_string(),
            ),
            (true, None) => (
                true,
                "NVML (ATS with NVLink-C2C); the kernel's NUMA view could not be read".to_string(),
            ),
            (false, Some(KernelGpuMemory::NumaNodes)) => (
                false,
                format!(
                    "NVML says {nvml}, but the kernel shows memory-only NUMA nodes holding about the GPUs' memory, as a coherent platform in NUMA mode does: not classified unified, NVML's word stands"
                ),
            ),
            (false, _) => (true, format!("NVML ({nvml}); the kernel shows no GPU memory node")),
        };
        let mut nodes = memory_only.unwrap_or_default();
        nodes.truncate(MAX_MEMORY_ONLY_NODES);
        MemoryWitnesses {
            nvml,
            kernel,
            memory_only_nodes: nodes,
            agree,
            used,
        }
    }
}
