//! The node report: what the agent measured on a node, published as the versioned JSON
//! annotation `offload.dev/node-report`. The labels derived from it are [`crate::labels`]'s.
//!
//! The agent writes it and the operator reads it with these same types, so the two can never
//! disagree on a field name. Readers accept only [`REPORT_SCHEMA_VERSION`]; anything else is a
//! clear error, never a guess.

use serde::{Deserialize, Serialize};

mod check;
mod witness;
pub use check::{
    CPU_UPDATE_RATES, GPU_FLOPS, MAX_GPU_MEMORY, MAX_GPUS, MAX_REPORT_BYTES, MAX_WITNESS_SENTENCE,
    MIN_GPU_MEMORY, ReportError, gpu_memory_bound, impossible_gpu_memory,
};
pub use witness::{
    GPU_MEMORY_SHARE, KernelGpuMemory, MAX_MEMORY_ONLY_NODES, MemoryOnlyNode, MemoryWitnesses,
};

/// Version of the report's JSON schema this code writes. Bump on any change; readers accept
/// every version in [`READABLE_SCHEMA_VERSIONS`].
pub const REPORT_SCHEMA_VERSION: u32 = 3;
/// Schema versions this code reads: version 1 is version 2 without the repeated-measurement,
/// per-GPU and postponement fields; version 2 is version 3 without the memory model's
/// witnesses.
pub const READABLE_SCHEMA_VERSIONS: [u32; 3] = [1, 2, 3];

/// How a GPU addresses host memory, as NVML's `nvmlDeviceGetAddressingMode` reports it. One
/// spelling for JSON, text and the `offload.dev/addressing-mode` label (see
/// [`crate::labels::LabelValue`] for what the label may carry).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::Display,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantNames,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum AddressingMode {
    /// Hardware address translation services: coherent access to system memory.
    Ats,
    /// Heterogeneous memory management: software page migration (x86 PCIe GPUs too).
    Hmm,
    /// Neither.
    None,
    /// The driver could not say (symbol missing in an older NVML, or the call failed).
    Unknown,
}

/// The memory model of a node, from its GPUs' addressing mode and C2C state.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, strum::Display,
)]
#[serde(rename_all = "kebab-case")]
#[strum(serialize_all = "kebab-case")]
pub enum NodeMemoryModel {
    /// Hardware-coherent unified memory: every GPU in ATS mode with C2C enabled.
    Coherent,
    /// GPUs with HMM (software page migration), not hardware-coherent.
    Hmm,
    /// Classic discrete GPUs.
    Discrete,
    /// NVML could not be read, or the GPUs disagree.
    Unknown,
    /// NVML works but the node has no GPU.
    NoGpu,
}

impl NodeMemoryModel {
    /// Classifies a node from its GPUs. Coherent needs every GPU to be ATS with C2C on: a mixed
    /// node is not a unified-memory node.
    pub fn classify(gpus: &[GpuReport]) -> NodeMemoryModel {
        if gpus.is_empty() {
            return NodeMemoryModel::NoGpu;
        }
        let coherent = |g: &GpuReport| g.addressing_mode == AddressingMode::Ats && g.c2c.enabled;
        if gpus.iter().all(coherent) {
            NodeMemoryModel::Coherent
        } else if gpus.iter().any(coherent) {
            NodeMemoryModel::Unknown
        } else if gpus
            .iter()
            .all(|g| g.addressing_mode == AddressingMode::Hmm)
        {
            NodeMemoryModel::Hmm
        } else {
            NodeMemoryModel::Discrete
        }
    }
}

/// Verdict of the overlap self-test. One spelling for JSON, text and the `offload.dev/overlap`
/// label.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    strum::Display,
    strum::EnumString,
    strum::IntoStaticStr,
    strum::VariantNames,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum OverlapVerdict {
    /// Pipelined step overlapped CPU and GPU work at or above the agent's threshold.
    Verified,
    /// Overlap was measured below the threshold.
    Failed,
    /// Not measured (no GPU, no CUDA, test disabled or errored).
    Untested,
}

/// The whole report of one node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeReport {
    /// Always [`REPORT_SCHEMA_VERSION`] for reports this code writes.
    pub schema_version: u32,
    /// Version of the agent that wrote it.
    pub agent_version: String,
    /// Node name.
    pub node: String,
    /// When it was measured (RFC 3339).
    pub generated_at: String,
    /// NVML and driver facts, or why they could not be read.
    pub nvml: NvmlInfo,
    /// The node's GPUs.
    #[serde(default)]
    pub gpus: Vec<GpuReport>,
    /// Classification of the node.
    pub memory_model: NodeMemoryModel,
    /// NUMA nodes the OS shows (GPU memory shows up as memory-only nodes on GH200 in NUMA mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os_numa_nodes: Option<u32>,
    /// The kubelet's CPU manager policy as its state file says (`static`: a Guaranteed pod's
    /// whole-core CPU request gets those cores to itself; `none`: every pod shares the node's
    /// cores), where the agent could read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_manager_policy: Option<String>,
    /// What each witness of the memory model said (NVML, the kernel's NUMA view) and which the
    /// classification used (reports of schema version 3 on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_witnesses: Option<MemoryWitnesses>,
    /// The CPU architecture the agent runs on (`aarch64` on Grace, `x86_64`), where it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_architecture: Option<String>,
    /// The kernel's resource control (`resctrl`: MPAM on Arm, RDT on x86), where it was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resctrl: Option<Resctrl>,
    /// Overlap self-test results.
    pub selftest: SelfTestReport,
}

/// The kernel's resource control filesystem, which partitions caches and memory bandwidth (on
/// Grace: MPAM, which SuperOffload's setup guidance asks for).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resctrl {
    /// The kernel has it (`resctrl` in `/proc/filesystems`).
    pub supported: bool,
    /// It is mounted where the agent can see it (`/sys/fs/resctrl/info`).
    pub mounted: bool,
}

/// NVML availability and versions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NvmlInfo {
    /// Whether NVML initialised.
    pub available: bool,
    /// The exact error when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Driver version, e.g. `580.159`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// NVML library version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvml_version: Option<String>,
    /// CUDA driver API version, e.g. `13000`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_driver_version: Option<i32>,
}

/// One GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuReport {
    /// NVML index.
    pub index: u32,
    /// GPU UUID.
    pub uuid: String,
    /// Marketing name, e.g. `NVIDIA GH200 480GB`.
    pub name: String,
    /// Architecture, e.g. `Hopper`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// PCI device id (upper 16 bits of NVML's combined id), e.g. `0x2342`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_device_id: Option<u32>,
    /// Total GPU memory in bytes.
    pub memory_total_bytes: u64,
    /// Addressing mode.
    pub addressing_mode: AddressingMode,
    /// NVLink-C2C state.
    pub c2c: C2cInfo,
    /// NUMA node of the GPU, when NVML knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<i32>,
    /// The CPUs local to the GPU (its PCI device's `local_cpulist`, e.g. `0-31,64-95`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_cpus: Option<String>,
    /// How many CPUs that list holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_cpu_count: Option<u32>,
    /// Host memory of the GPU's NUMA node, bytes (its `meminfo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_memory_bytes: Option<u64>,
    /// Current PCIe generation (not the host link on coherent nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_generation: Option<u32>,
    /// Current PCIe width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_width: Option<u32>,
    /// Whether MIG is enabled.
    #[serde(default)]
    pub mig_enabled: bool,
}

/// NVLink-C2C state of a GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct C2cInfo {
    /// `isC2cEnabled` from `nvmlDeviceGetC2cModeInfoV`.
    pub enabled: bool,
    /// Number of C2C links, when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_count: Option<u32>,
    /// Maximum C2C bandwidth in MB/s, when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bandwidth_mbps: Option<u64>,
}

/// Results of the overlap self-test.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SelfTestReport {
    /// Verdict against `threshold`.
    pub verdict: OverlapVerdict,
    /// Efficiency threshold the verdict used.
    pub threshold: f64,
    /// Overlap efficiency, the median of the repetitions: the share of what a pipeline can hide
    /// that it hid, `(t_serial − t_pipelined) / (t_serial − max(t_gpu, t_cpu, t_copy))` (1: the
    /// pipelined step costs only its longest part; 0: it costs their sum).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efficiency: Option<f64>,
    /// Whether pinned host memory could be allocated; `false` means the pageable path was measured.
    #[serde(default = "yes")]
    pub pinned_memory: bool,
    /// Why pinned allocation failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_error: Option<String>,
    /// Host↔device bandwidths in GB/s.
    #[serde(default)]
    pub bandwidth: Bandwidths,
    /// CPU optimizer (Adam, fp32) update rate, parameters per second, all cores of the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_update_rate: Option<f64>,
    /// The CPU threads that rate was measured with (the agent pod's CPU set): a training pod
    /// with fewer cores updates at its share of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_threads: Option<u32>,
    /// GPU compute rate of the backward-like kernel, FLOP per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_flops: Option<f64>,
    /// GPU-only time of the K-chunk step, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t_gpu_ms: Option<f64>,
    /// CPU-only time of the K-chunk step, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t_cpu_ms: Option<f64>,
    /// Serial step time, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t_serial_ms: Option<f64>,
    /// Pipelined step time, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t_pipelined_ms: Option<f64>,
    /// Number of chunks K.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunks: Option<u32>,
    /// fp32 elements per chunk (the shape a peer benchmark must reproduce).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_elems: Option<u64>,
    /// The step's copies in the slower direction at the measured bandwidth, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t_copy_ms: Option<f64>,
    /// How long the whole self-test took, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    /// Why the test did not run or did not finish.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Timed repetitions the figures are the median of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<u32>,
    /// Lowest efficiency of one repetition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efficiency_min: Option<f64>,
    /// Highest efficiency of one repetition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efficiency_max: Option<f64>,
    /// Pipelined step over `max(t_gpu, t_cpu, t_copy)`: 1 is perfect overlap; about 1 + 1/chunks is
    /// what a correct pipeline pays for its fill and drain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipelined_over_max: Option<f64>,
    /// Serial step over pipelined step: how much overlap saves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial_over_pipelined: Option<f64>,
    /// Why the verdict is what it is: measured on which side of the threshold, or kept from
    /// the previous measurement because this one is too close to call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict_basis: Option<String>,
    /// When the figures were measured (RFC 3339); older than the report when a run was
    /// postponed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_at: Option<String>,
    /// Why this round did not measure (GPUs in use by a job), keeping the last figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postponed: Option<String>,
    /// Each GPU's own result when the GPUs were tested at once, one rank per GPU as a job runs
    /// (the top-level figures are the node's worst GPU).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_gpu: Vec<GpuSelfTest>,
}

/// One GPU's self-test when all GPUs of a node are tested at once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuSelfTest {
    /// NVML index of the GPU.
    pub index: u32,
    /// Median efficiency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efficiency: Option<f64>,
    /// This GPU's own verdict against the threshold (the node's is the weakest GPU's, with
    /// hysteresis).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<OverlapVerdict>,
    /// Lowest efficiency over this GPU's repetitions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efficiency_min: Option<f64>,
    /// Highest efficiency over this GPU's repetitions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efficiency_max: Option<f64>,
    /// GPU-only time of the step, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t_gpu_ms: Option<f64>,
    /// CPU-only time of the step, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t_cpu_ms: Option<f64>,
    /// Pipelined step, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t_pipelined_ms: Option<f64>,
    /// Serial step, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t_serial_ms: Option<f64>,
    /// CPU threads the GPU's rank used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_threads: Option<u32>,
    /// Optimizer elements per second the CPU updated for this GPU, on its share of cores (the
    /// node's `cpuUpdateRate` is the slowest GPU's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_update_rate: Option<f64>,
    /// Why this GPU's test did not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn yes() -> bool {
    true
}

impl SelfTestReport {
    /// A report for a test that did not run, with the reason.
    pub fn untested(threshold: f64, why: impl Into<String>) -> Self {
        SelfTestReport {
            verdict: OverlapVerdict::Untested,
            threshold,
            efficiency: None,
            pinned_memory: true,
            pinned_error: None,
            bandwidth: Bandwidths::default(),
            cpu_update_rate: None,
            cpu_threads: None,
            gpu_flops: None,
            t_gpu_ms: None,
            t_cpu_ms: None,
            t_serial_ms: None,
            t_pipelined_ms: None,
            chunks: None,
            chunk_elems: None,
            t_copy_ms: None,
            duration_ms: None,
            error: Some(why.into()),
            runs: None,
            efficiency_min: None,
            efficiency_max: None,
            pipelined_over_max: None,
            serial_over_pipelined: None,
            verdict_basis: None,
            measured_at: None,
            postponed: None,
            per_gpu: Vec::new(),
        }
    }
}

/// Host↔device bandwidths, GB/s.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Bandwidths {
    /// Host to device, pinned host memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub h2d_pinned: Option<f64>,
    /// Device to host, pinned host memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub d2h_pinned: Option<f64>,
    /// Host to device, pageable host memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub h2d_pageable: Option<f64>,
    /// Device to host, pageable host memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub d2h_pageable: Option<f64>,
    /// GPU kernel reading host memory directly (coherent nodes only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_host_read: Option<f64>,
    /// GPU kernel writing host memory directly (coherent nodes only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_host_write: Option<f64>,
}

impl NodeReport {
    /// Serialises the report as the annotation value.
    pub fn to_annotation(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }

    /// The node's addressing mode label: the common mode of all GPUs, `none` if they differ.
    pub fn addressing_mode(&self) -> AddressingMode {
        match self.gpus.first() {
            Some(first)
                if self
                    .gpus
                    .iter()
                    .all(|g| g.addressing_mode == first.addressing_mode) =>
            {
                first.addressing_mode
            }
            _ => AddressingMode::None,
        }
    }
}

#[cfg(test)]
mod tests;
