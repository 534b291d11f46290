//! The node report: what the agent measured on a node, published as the versioned JSON
//! annotation `offload.dev/node-report`, and the labels derived from it.
//!
//! The agent writes it and the operator reads it with these same types, so the two can never
//! disagree on a field name. Readers accept only [`REPORT_SCHEMA_VERSION`]; anything else is a
//! clear error, never a guess.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::labels::NodeLabels;

/// Version of the report's JSON schema this code writes. Bump on any change; readers accept
/// every version in [`READABLE_SCHEMA_VERSIONS`].
pub const REPORT_SCHEMA_VERSION: u32 = 2;
/// Schema versions this code reads: version 1 is version 2 without the repeated-measurement,
/// per-GPU and postponement fields.
pub const READABLE_SCHEMA_VERSIONS: [u32; 2] = [1, 2];

/// How a GPU addresses host memory, as NVML's `nvmlDeviceGetAddressingMode` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
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

impl AddressingMode {
    /// Value of the `offload.dev/addressing-mode` label. `Unknown` is published as `none`: only
    /// `ats` ever leads to a unified-memory decision, so the conservative value is the safe one.
    pub fn label_value(self) -> &'static str {
        match self {
            AddressingMode::Ats => "ats",
            AddressingMode::Hmm => "hmm",
            AddressingMode::None | AddressingMode::Unknown => "none",
        }
    }

    /// Reads a value of the `offload.dev/addressing-mode` label.
    pub fn from_label(value: &str) -> Option<Self> {
        match value {
            "ats" => Some(AddressingMode::Ats),
            "hmm" => Some(AddressingMode::Hmm),
            "none" => Some(AddressingMode::None),
            _ => None,
        }
    }
}

/// The memory model of a node, from its GPUs' addressing mode and C2C state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
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

/// Verdict of the overlap self-test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OverlapVerdict {
    /// Pipelined step overlapped CPU and GPU work at or above the agent's threshold.
    Verified,
    /// Overlap was measured below the threshold.
    Failed,
    /// Not measured (no GPU, no CUDA, test disabled or errored).
    Untested,
}

impl OverlapVerdict {
    /// Value of the `offload.dev/overlap` label.
    pub fn label_value(self) -> &'static str {
        match self {
            OverlapVerdict::Verified => "verified",
            OverlapVerdict::Failed => "failed",
            OverlapVerdict::Untested => "untested",
        }
    }

    /// Reads a value of the `offload.dev/overlap` label.
    pub fn from_label(value: &str) -> Option<Self> {
        match value {
            "verified" => Some(OverlapVerdict::Verified),
            "failed" => Some(OverlapVerdict::Failed),
            "untested" => Some(OverlapVerdict::Untested),
            _ => None,
        }
    }
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
    /// Overlap self-test results.
    pub selftest: SelfTestReport,
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

/// Most GPUs a report may list; a node with more is not a node this project knows.
pub const MAX_GPUS: usize = 64;
/// Least memory a listed GPU may have (1 GiB).
pub const MIN_GPU_MEMORY: u64 = 1 << 30;
/// Most memory a listed GPU may have (64 TiB, far above any GPU).
pub const MAX_GPU_MEMORY: u64 = 1 << 46;
/// CPU optimizer update rates a self-test can measure, parameters per second (a slow core to
/// far beyond any node).
pub const CPU_UPDATE_RATES: std::ops::RangeInclusive<f64> = 1e3..=1e13;
/// GPU compute rates a self-test can measure, FLOP/s (far below and above any GPU).
pub const GPU_FLOPS: std::ops::RangeInclusive<f64> = 1e9..=1e17;

/// A report that could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReportError {
    /// Not JSON, or a field of the wrong type.
    #[error("node report is not valid JSON for schema version {REPORT_SCHEMA_VERSION}: {0}")]
    Malformed(String),
    /// A schema version this code does not know.
    #[error(
        "node report has schema version {found}, this operator reads versions {READABLE_SCHEMA_VERSIONS:?}: upgrade the operator or the agent so they match"
    )]
    UnsupportedVersion {
        /// The version found.
        found: u64,
    },
    /// Well-formed, but what it says cannot be true (a figure out of range, a verdict with no
    /// measurement, a memory model its own GPUs contradict).
    #[error("node report is not believable: {0}")]
    Impossible(String),
    /// Larger than any node annotation can be.
    #[error(
        "node report is {bytes} bytes, more than the {MAX_REPORT_BYTES} a node's annotations can hold"
    )]
    TooLarge {
        /// Its size.
        bytes: usize,
    },
}

/// The API server caps all of an object's annotations at 256 KiB: a report larger than that
/// never came from a node.
pub const MAX_REPORT_BYTES: usize = 256 * 1024;

impl NodeReport {
    /// Parses the annotation value, checking the schema version before anything else so an agent
    /// newer than the operator gets a message about versions, not about fields; then rejects a
    /// report whose figures cannot be true (see [`NodeReport::check`]).
    pub fn parse(json: &str) -> Result<NodeReport, ReportError> {
        if json.len() > MAX_REPORT_BYTES {
            return Err(ReportError::TooLarge { bytes: json.len() });
        }
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(|e| ReportError::Malformed(e.to_string()))?;
        match value
            .get("schemaVersion")
            .and_then(serde_json::Value::as_u64)
        {
            Some(v) if READABLE_SCHEMA_VERSIONS.iter().any(|r| u64::from(*r) == v) => {}
            Some(found) => return Err(ReportError::UnsupportedVersion { found }),
            None => {
                return Err(ReportError::Malformed(
                    "missing or non-numeric schemaVersion".to_string(),
                ));
            }
        }
        let report: NodeReport =
            serde_json::from_value(value).map_err(|e| ReportError::Malformed(e.to_string()))?;
        report.check()?;
        Ok(report)
    }

    /// Rejects what the agent could never have measured: an efficiency or threshold outside
    /// 0–1, a negative or non-finite rate or time, rates no hardware has, a verdict without the
    /// figure it rests on, a memory model that the listed GPUs contradict, more than
    /// [`MAX_GPUS`] GPUs, a GPU listed twice, GPU memory no GPU has, a date that is not one.
    pub fn check(&self) -> Result<(), ReportError> {
        let impossible = |msg: String| Err(ReportError::Impossible(msg));
        if self.gpus.len() > MAX_GPUS {
            return impossible(format!(
                "{} GPUs listed, more than the {MAX_GPUS} a node can have",
                self.gpus.len()
            ));
        }
        let mut seen_uuid = std::collections::BTreeSet::new();
        let mut seen_index = std::collections::BTreeSet::new();
        for g in &self.gpus {
            if !seen_uuid.insert(g.uuid.as_str()) || !seen_index.insert(g.index) {
                return impossible(format!("GPU {} (index {}) listed twice", g.uuid, g.index));
            }
            if !(MIN_GPU_MEMORY..=MAX_GPU_MEMORY).contains(&g.memory_total_bytes) {
                return impossible(format!(
                    "GPU {} has {} bytes of memory, which no GPU has",
                    g.uuid, g.memory_total_bytes
                ));
            }
        }
        if self.generated_at.parse::<jiff::Timestamp>().is_err() {
            return impossible(format!(
                "generatedAt {:?} is not an RFC 3339 time",
                self.generated_at
            ));
        }
        let expected = if self.nvml.available {
            NodeMemoryModel::classify(&self.gpus)
        } else {
            NodeMemoryModel::Unknown
        };
        if self.memory_model != expected {
            return impossible(format!(
                "memoryModel is {} but its GPUs make the node {expected}",
                self.memory_model
            ));
        }
        let s = &self.selftest;
        if s.per_gpu.len() > MAX_GPUS {
            return impossible(format!(
                "selftest.perGpu lists {} GPUs, more than the {MAX_GPUS} a node can have",
                s.per_gpu.len()
            ));
        }
        let unit = |name: &str, v: f64| -> Result<(), ReportError> {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(ReportError::Impossible(format!(
                    "selftest.{name} {v} is outside 0–1"
                )))
            }
        };
        unit("threshold", s.threshold)?;
        for (name, value) in [
            ("efficiency", s.efficiency),
            ("efficiencyMin", s.efficiency_min),
            ("efficiencyMax", s.efficiency_max),
        ] {
            if let Some(e) = value {
                unit(name, e)?;
            }
        }
        for gpu in &s.per_gpu {
            if let Some(e) = gpu.efficiency {
                unit("perGpu[].efficiency", e)?;
            }
        }
        if s.verdict != OverlapVerdict::Untested && s.efficiency.is_none() {
            return impossible(format!(
                "selftest.verdict is {} without an efficiency",
                s.verdict.label_value()
            ));
        }
        let figures = [
            ("cpuUpdateRate", s.cpu_update_rate),
            ("gpuFlops", s.gpu_flops),
            ("tGpuMs", s.t_gpu_ms),
            ("tCpuMs", s.t_cpu_ms),
            ("tSerialMs", s.t_serial_ms),
            ("tPipelinedMs", s.t_pipelined_ms),
            ("durationMs", s.duration_ms),
            ("pipelinedOverMax", s.pipelined_over_max),
            ("serialOverPipelined", s.serial_over_pipelined),
            ("bandwidth.h2dPinned", s.bandwidth.h2d_pinned),
            ("bandwidth.d2hPinned", s.bandwidth.d2h_pinned),
            ("bandwidth.h2dPageable", s.bandwidth.h2d_pageable),
            ("bandwidth.d2hPageable", s.bandwidth.d2h_pageable),
            ("bandwidth.directHostRead", s.bandwidth.direct_host_read),
            ("bandwidth.directHostWrite", s.bandwidth.direct_host_write),
        ];
        for (name, value) in figures {
            if let Some(v) = value
                && !(v.is_finite() && v >= 0.0)
            {
                return impossible(format!(
                    "selftest.{name} {v} is not a finite, non-negative figure"
                ));
            }
        }
        for (name, value, range) in [
            ("cpuUpdateRate", s.cpu_update_rate, CPU_UPDATE_RATES),
            ("gpuFlops", s.gpu_flops, GPU_FLOPS),
        ] {
            if let Some(v) = value
                && !range.contains(&v)
            {
                return impossible(format!(
                    "selftest.{name} {v:e} is outside {:e}–{:e}, what hardware measures",
                    range.start(),
                    range.end()
                ));
            }
        }
        Ok(())
    }

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

    /// The labels the agent publishes for this report. A node without a GPU, or whose NVML
    /// could not be read, gets no memory-model labels at all (not `uma=false`, which would
    /// make it match a discrete node's affinity); only `offload.dev/overlap: untested` says the
    /// agent runs there.
    pub fn labels(&self) -> BTreeMap<String, String> {
        match self.memory_model {
            NodeMemoryModel::Unknown | NodeMemoryModel::NoGpu => BTreeMap::from([(
                crate::names::LABEL_OVERLAP.to_string(),
                self.selftest.verdict.label_value().to_string(),
            )]),
            _ => NodeLabels::from_report(self).to_map(),
        }
    }
}

impl fmt::Display for NodeMemoryModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeMemoryModel::Coherent => "coherent",
            NodeMemoryModel::Hmm => "hmm",
            NodeMemoryModel::Discrete => "discrete",
            NodeMemoryModel::Unknown => "unknown",
            NodeMemoryModel::NoGpu => "no-gpu",
        })
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn hostile_reports_are_refused_with_what_is_wrong() {
        let deep = format!("{}1{}", "[".repeat(50_000), "]".repeat(50_000));
        let huge = format!(
            r#"{{"schemaVersion": 2, "pad": "{}"}}"#,
            "x".repeat(MAX_REPORT_BYTES)
        );
        for (case, text, expect) in [
            ("empty", String::new(), "not valid JSON"),
            ("a list", "[]".to_string(), "schemaVersion"),
            (
                "a string version",
                r#"{"schemaVersion": "2"}"#.to_string(),
                "schemaVersion",
            ),
            (
                "a future version",
                r#"{"schemaVersion": 99}"#.to_string(),
                "upgrade",
            ),
            ("nested 50,000 deep", deep, "not valid JSON"),
            ("over 256 KiB", huge, "more than the"),
            (
                "fields of the wrong type",
                r#"{"schemaVersion": 2, "gpus": "many"}"#.to_string(),
                "not valid JSON",
            ),
        ] {
            let err = NodeReport::parse(&text).unwrap_err().to_string();
            assert!(err.contains(expect), "{case}: {err}");
        }
    }

    use super::*;
    use crate::names;

    // The recorded readings live with the test environment; read here as plain text.
    const GH200_REFERENCE: &str = include_str!("../../testenv/fixtures/node-report-gh200.json");
    const H200_READING: &str = include_str!("../../testenv/fixtures/node-report-h200.json");
    const HMM_UNPINNED: &str = include_str!("../../testenv/fixtures/node-report-hmm-unpinned.json");

    #[test]
    fn recorded_reports_parse_and_classify() {
        let gh = NodeReport::parse(GH200_REFERENCE).unwrap();
        assert_eq!(gh.memory_model, NodeMemoryModel::Coherent);
        assert_eq!(
            NodeMemoryModel::classify(&gh.gpus),
            NodeMemoryModel::Coherent
        );
        assert_eq!(gh.labels()[names::LABEL_UMA], "true");
        assert_eq!(gh.labels()[names::LABEL_ADDRESSING_MODE], "ats");
        let h200 = NodeReport::parse(H200_READING).unwrap();
        assert_eq!(
            NodeMemoryModel::classify(&h200.gpus),
            NodeMemoryModel::Discrete
        );
        assert_eq!(h200.labels()[names::LABEL_UMA], "false");
        assert_eq!(h200.labels()[names::LABEL_C2C], "false");
        let hmm = NodeReport::parse(HMM_UNPINNED).unwrap();
        assert_eq!(NodeMemoryModel::classify(&hmm.gpus), NodeMemoryModel::Hmm);
        assert_eq!(hmm.labels()[names::LABEL_UMA], "false");
        assert_eq!(hmm.labels()[names::LABEL_ADDRESSING_MODE], "hmm");
    }

    #[test]
    fn report_round_trips() {
        let gh = NodeReport::parse(GH200_REFERENCE).unwrap();
        let again = NodeReport::parse(&gh.to_annotation().unwrap()).unwrap();
        assert_eq!(gh, again);
    }

    #[test]
    fn bad_reports_get_specific_errors() {
        assert!(matches!(
            NodeReport::parse("{not json"),
            Err(ReportError::Malformed(_))
        ));
        assert!(matches!(
            NodeReport::parse(r#"{"schemaVersion": 7}"#),
            Err(ReportError::UnsupportedVersion { found: 7 })
        ));
        let err = NodeReport::parse(r#"{"agentVersion": "1"}"#).unwrap_err();
        assert!(err.to_string().contains("schemaVersion"), "{err}");
        let err = NodeReport::parse(r#"{"schemaVersion": 1, "node": 3}"#).unwrap_err();
        assert!(matches!(err, ReportError::Malformed(_)), "{err}");
    }

    /// Each edit makes the H200 reading impossible in one way; each is refused with a message
    /// that names the field.
    #[test]
    fn impossible_reports_are_refused_with_the_field_named() {
        let base: serde_json::Value = serde_json::from_str(H200_READING).unwrap();
        type Edit = fn(&mut serde_json::Value);
        let cases: [(&str, Edit); 13] = [
            ("efficiency 2", |r| r["selftest"]["efficiency"] = 2.0.into()),
            ("threshold -0.5", |r| {
                r["selftest"]["threshold"] = (-0.5).into()
            }),
            ("verdict is verified without an efficiency", |r| {
                r["selftest"].as_object_mut().unwrap().remove("efficiency");
            }),
            ("cpuUpdateRate -1", |r| {
                r["selftest"]["cpuUpdateRate"] = (-1.0).into()
            }),
            ("bandwidth.h2dPinned -55", |r| {
                r["selftest"]["bandwidth"]["h2dPinned"] = (-55.0).into()
            }),
            (
                "memoryModel is coherent but its GPUs make the node discrete",
                |r| r["memoryModel"] = "coherent".into(),
            ),
            ("65 GPUs listed", |r| {
                let gpu = r["gpus"][0].clone();
                r["gpus"] = serde_json::Value::Array(vec![gpu; 65]);
            }),
            // Found by an independent tester: one GPU listed 8 times, rates that give inf×
            // headroom or NaN %, reports dated "yesterday".
            ("listed twice", |r| {
                let gpu = r["gpus"][0].clone();
                r["gpus"] = serde_json::Value::Array(vec![gpu; 8]);
            }),
            ("selftest.cpuUpdateRate 1e308", |r| {
                r["selftest"]["cpuUpdateRate"] = 1e308.into()
            }),
            ("selftest.gpuFlops 1e-300", |r| {
                r["selftest"]["gpuFlops"] = 1e-300.into()
            }),
            ("generatedAt \"yesterday\"", |r| {
                r["generatedAt"] = "yesterday".into()
            }),
            ("bytes of memory, which no GPU has", |r| {
                r["gpus"][0]["memoryTotalBytes"] = 0.into()
            }),
            ("bytes of memory, which no GPU has", |r| {
                r["gpus"][0]["memoryTotalBytes"] = u64::MAX.into()
            }),
        ];
        for (expected, edit) in cases {
            let mut report = base.clone();
            edit(&mut report);
            let err = NodeReport::parse(&report.to_string()).unwrap_err();
            assert!(
                matches!(err, ReportError::Impossible(_)),
                "{expected}: {err}"
            );
            assert!(err.to_string().contains(expected), "{expected}: {err}");
        }
    }

    #[test]
    fn a_mixed_node_is_not_coherent() {
        let gh = NodeReport::parse(GH200_REFERENCE).unwrap();
        let h200 = NodeReport::parse(H200_READING).unwrap();
        let mixed = vec![gh.gpus[0].clone(), h200.gpus[0].clone()];
        assert_eq!(NodeMemoryModel::classify(&mixed), NodeMemoryModel::Unknown);
        assert_eq!(NodeMemoryModel::classify(&[]), NodeMemoryModel::NoGpu);
    }
}
