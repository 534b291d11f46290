//! Reading a report: the schema version first, then what the agent could never have
//! measured (figures out of range, a verdict without its figure, GPUs that contradict the
//! memory model) is refused with what is wrong.

use super::*;

/// Most GPUs a report may list; a node with more is not a node this project knows.
pub const MAX_GPUS: usize = 64;
/// Least memory a listed GPU may have (1 GiB).
pub const MIN_GPU_MEMORY: u64 = 1 << 30;
/// Most memory a GPU may have: 512 GiB, above every GPU made (288 GB is the largest today).
pub const MAX_GPU_MEMORY: u64 = 1 << 39;

/// The most memory a GPU of this product name can have, bytes, and the family that says so
/// (`None`: not a known family, only [`MAX_GPU_MEMORY`] bounds it). Each bound is the largest
/// variant of the family with a little over its NVML total.
pub fn gpu_memory_bound(product: &str) -> (u64, Option<&'static str>) {
    const GB: u64 = 1_000_000_000;
    // Longest names first: "GH200" before "H200", "GB200" before "B200".
    const FAMILIES: &[(&str, u64)] = &[
        ("GB300", 300 * GB),
        ("B300", 300 * GB),
        ("GB200", 200 * GB),
        ("B200", 200 * GB),
        ("GH200", 155 * GB),
        ("H200", 155 * GB),
        ("H100", 103 * GB),
        ("H800", 103 * GB),
        ("A100", 88 * GB),
        ("A800", 88 * GB),
        ("L40", 52 * GB),
        ("A40", 52 * GB),
        ("A10", 26 * GB),
        ("L4", 26 * GB),
        ("T4", 17 * GB),
    ];
    let upper = product.to_ascii_uppercase();
    FAMILIES
        .iter()
        .find(|(family, _)| {
            upper
                .split(|c: char| !c.is_ascii_alphanumeric())
                .any(|w| w == *family)
        })
        .map_or((MAX_GPU_MEMORY, None), |(family, bound)| {
            (*bound, Some(*family))
        })
}

/// Why `bytes` of memory cannot be a GPU of `product`'s, or `None` where it can be.
pub fn impossible_gpu_memory(product: &str, bytes: u64) -> Option<String> {
    if bytes < MIN_GPU_MEMORY {
        return Some(format!("{bytes} bytes of memory, less than any GPU has"));
    }
    let (bound, family) = gpu_memory_bound(product);
    (bytes > bound).then(|| match family {
        Some(f) => format!(
            "{bytes} bytes of memory, more than a {f} has (at most {:.0} GB)",
            bound as f64 / 1e9
        ),
        None => format!(
            "{bytes} bytes of memory, more than any GPU has (at most {} GiB)",
            bound >> 30
        ),
    })
}
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

/// The longest sentence a report's witnesses may carry.
pub const MAX_WITNESS_SENTENCE: usize = 400;

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
        self.check_gpus()?;
        self.check_witnesses()?;
        self.selftest.check()
    }

    /// The witnesses say what the memory model rests on: NVML's word is the model, the kernel
    /// never makes a node unified; their lists and sentence are bounded.
    fn check_witnesses(&self) -> Result<(), ReportError> {
        let impossible = |msg: String| Err(ReportError::Impossible(msg));
        if let Some(arch) = &self.cpu_architecture
            && (arch.is_empty()
                || arch.len() > 32
                || !arch.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        {
            return impossible(format!(
                "cpuArchitecture {:?} is not an architecture's name",
                arch.chars().take(40).collect::<String>()
            ));
        }
        let Some(w) = &self.memory_witnesses else {
            return Ok(());
        };
        if w.nvml != self.memory_model {
            return impossible(format!(
                "memoryWitnesses.nvml is {} but memoryModel is {}: the model is NVML's word",
                w.nvml, self.memory_model
            ));
        }
        if w.memory_only_nodes.len() > super::MAX_MEMORY_ONLY_NODES {
            return impossible(format!(
                "memoryWitnesses lists {} memory-only NUMA nodes, more than {}",
                w.memory_only_nodes.len(),
                super::MAX_MEMORY_ONLY_NODES
            ));
        }
        if w.used.chars().count() > MAX_WITNESS_SENTENCE {
            return impossible(format!(
                "memoryWitnesses.used is longer than {MAX_WITNESS_SENTENCE} characters"
            ));
        }
        Ok(())
    }

    /// The node's part: its GPUs, its date, its memory model.
    fn check_gpus(&self) -> Result<(), ReportError> {
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
            if let Some(why) = impossible_gpu_memory(&g.name, g.memory_total_bytes) {
                return impossible(format!("GPU {} ({}) reports {why}", g.uuid, g.name));
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
        Ok(())
    }
}

impl SelfTestReport {
    /// The self-test's part: figures in range, a verdict with the figure it rests on.
    fn check(&self) -> Result<(), ReportError> {
        let impossible = |msg: String| Err(ReportError::Impossible(msg));
        let s = self;
        if s.per_gpu.len() > MAX_GPUS {
            return impossible(format!(
                "selftest.perGpu lists {} GPUs, more than the {MAX_GPUS} a node can have",
                s.per_gpu.len()
            ));
        }
        s.check_fractions()?;
        if s.verdict != OverlapVerdict::Untested && s.efficiency.is_none() {
            return impossible(format!(
                "selftest.verdict is {} without an efficiency",
                s.verdict
            ));
        }
        s.check_figures()?;
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

    /// The efficiencies and the threshold are fractions; each GPU's CPU update rate is one
    /// hardware measures.
    fn check_fractions(&self) -> Result<(), ReportError> {
        let unit = |name: &str, v: f64| -> Result<(), ReportError> {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(ReportError::Impossible(format!(
                    "selftest.{name} {v} is outside 0–1"
                )))
            }
        };
        unit("threshold", self.threshold)?;
        for (name, value) in [
            ("efficiency", self.efficiency),
            ("efficiencyMin", self.efficiency_min),
            ("efficiencyMax", self.efficiency_max),
        ] {
            if let Some(e) = value {
                unit(name, e)?;
            }
        }
        for gpu in &self.per_gpu {
            if let Some(e) = gpu.efficiency {
                unit("perGpu[].efficiency", e)?;
            }
            if let Some(v) = gpu.cpu_update_rate
                && !(v.is_finite() && CPU_UPDATE_RATES.contains(&v))
            {
                return Err(ReportError::Impossible(format!(
                    "selftest.perGpu[{}].cpuUpdateRate {v:e} is outside {:e}–{:e}, what hardware measures",
                    gpu.index,
                    CPU_UPDATE_RATES.start(),
                    CPU_UPDATE_RATES.end()
                )));
            }
        }
        Ok(())
    }

    /// Every timing, rate and bandwidth is a finite, non-negative figure.
    fn check_figures(&self) -> Result<(), ReportError> {
        let s = self;
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
                return Err(ReportError::Impossible(format!(
                    "selftest.{name} {v} is not a finite, non-negative figure"
                )));
            }
        }
        Ok(())
    }
}
