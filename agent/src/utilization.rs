//! Observing what the GPUs of running jobs do: NVML's device utilization (the share of time a
//! kernel ran), sampled over a window. The busy fraction of a GPU whose job overlaps its CPU
//! optimizer work is close to 1; a job that serialises the two leaves its GPU idle for the CPU
//! part of every step. The GPUs' memory in use is sampled over the same window: its high-water
//! mark is what the job really needed.

use std::time::{Duration, Instant};

use serde::Serialize;

/// Something that says how busy each GPU was in its last sample period (percent).
pub trait UtilizationSource {
    /// Percent per GPU index, for the GPUs asked (all when empty).
    fn utilization(&self, devices: &[u32]) -> Result<Vec<(u32, u32)>, String>;

    /// Each GPU's memory now, for the GPUs asked (all when empty); none where the source cannot
    /// say (the default).
    fn memory(&self, devices: &[u32]) -> Result<Vec<MemorySample>, String> {
        let _ = devices;
        Ok(Vec::new())
    }

    /// Each GPU's busy fraction over a whole window (each says how it was measured). By default the
    /// mean of [`UtilizationSource::utilization`] samples taken every `interval`; a source
    /// with activity counters measures the window from them instead.
    fn over_window(
        &self,
        devices: &[u32],
        window: Duration,
        interval: Duration,
    ) -> Result<Vec<GpuObservation>, String> {
        observe(self, devices, window, interval)
    }
}

/// How a window's busy fractions were measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Method {
    /// The mean of utilization samples (NVML: the share of each sample period in which a
    /// kernel ran, which reads many short kernels spread over a period as busy).
    Sampled,
    /// NVML GPM's graphics-engine activity between two counter snapshots at the window's ends
    /// (Hopper and later): the share of the window in which the GPU computed.
    GpmGraphics,
}

/// NVML, initialised once for the whole window.
pub struct NvmlUtilization {
    nvml: nvml_wrapper::Nvml,
    /// Read GPM counters where every observed GPU has them.
    prefer_gpm: bool,
}

impl NvmlUtilization {
    /// Loads NVML; the error says why it could not. Windows are measured with GPM counters
    /// where the GPUs have them (see [`Method`]), else sampled.
    pub fn new() -> Result<Self, String> {
        nvml_wrapper::Nvml::init()
            .map(|nvml| NvmlUtilization {
                nvml,
                prefer_gpm: true,
            })
            .map_err(|e| format!("NVML initialisation failed: {e}"))
    }

    /// The same, always sampling (as on GPUs without GPM).
    pub fn sampling_only() -> Result<Self, String> {
        Self::new().map(|n| NvmlUtilization {
            prefer_gpm: false,
            ..n
        })
    }

    /// The GPUs asked, or every GPU when none is.
    fn indices(&self, devices: &[u32]) -> Result<Vec<u32>, String> {
        if !devices.is_empty() {
            return Ok(devices.to_vec());
        }
        let n = self
            .nvml
            .device_count()
            .map_err(|e| format!("nvmlDeviceGetCount failed: {e}"))?;
        Ok((0..n).collect())
    }

    /// GPM's graphics activity of `devices` over `window`; `Ok(None)` when a GPU has no GPM
    /// (before Hopper, or an NVML without its symbols), known before the window starts.
    fn gpm_window(
        &self,
        devices: &[u32],
        window: Duration,
        interval: Duration,
    ) -> Result<Option<Vec<GpuObservation>>, String> {
        use nvml_wrapper::enums::gpm::GpmMetricId;
        let mut first = Vec::new();
        for &i in devices {
            let d = self
                .nvml
                .device_by_index(i)
                .map_err(|e| format!("GPU {i}: {e}"))?;
            if !d.gpm_support().unwrap_or(false) {
                return Ok(None);
            }
            match d.gpm_sample() {
                Ok(s) => first.push((i, d, s)),
                Err(_) => return Ok(None),
            }
        }
        // The counters measure the window by themselves; memory is sampled while it passes.
        let mut memory = MemoryPeaks::default();
        let start = Instant::now();
        loop {
            memory.sample(self, devices);
            let left = window.saturating_sub(start.elapsed());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(interval.min(left).max(Duration::from_millis(1)));
        }
        let mut memory = memory.finish();
        first
            .into_iter()
            .map(|(i, d, s1)| {
                let s2 = d
                    .gpm_sample()
                    .map_err(|e| format!("GPU {i}: GPM sample: {e}"))?;
                let metrics = nvml_wrapper::gpm::gpm_metrics_get(
                    &self.nvml,
                    &s1,
                    &s2,
                    &[GpmMetricId::GraphicsUtil],
                )
                .map_err(|e| format!("GPU {i}: GPM metrics: {e}"))?;
                let value = metrics
                    .into_iter()
                    .next()
                    .ok_or_else(|| format!("GPU {i}: GPM returned no metric"))?
                    .map_err(|e| format!("GPU {i}: GPM graphics activity: {e}"))?
                    .value;
                if !value.is_finite() {
                    return Err(format!("GPU {i}: GPM graphics activity is {value}"));
                }
                Ok(GpuObservation {
                    index: i,
                    busy_fraction: (value / 100.0).clamp(0.0, 1.0),
                    samples: 2,
                    method: Method::GpmGraphics,
                    memory: memory.remove(&i),
                })
            })
            .collect::<Result<Vec<_>, String>>()
            .map(Some)
    }
}

impl NvmlUtilization {
    /// The NVML index of a device the kubelet assigned (NVIDIA's device plugin names GPUs by
    /// UUID); `None` for an ID NVML does not know.
    pub fn index_of(&self, device_id: &str) -> Option<u32> {
        if let Some(minor) = crate::devices::dra_minor(device_id) {
            // A DRA device (`gpu-<minor>`): the GPU with that minor number.
            let count = self.nvml.device_count().ok()?;
            return (0..count).find(|&i| {
                self.nvml
                    .device_by_index(i)
                    .and_then(|d| d.minor_number())
                    .is_ok_and(|m| m == minor)
            });
        }
        self.nvml.device_by_uuid(device_id).ok()?.index().ok()
    }
}

/// A recorded NVML utilization trace, replayed in place of NVML: a stand-in for GPUs that are
/// not here (the local real node, tests). The file names where and how it was recorded, and
/// each GPU's UUID (its device ID, as NVIDIA's device plugin hands it out) with its samples;
/// each call returns every GPU's next sample, from the start again after the last.
#[derive(Debug)]
pub struct RecordedUtilization {
    gpus: Vec<RecordedGpu>,
    next: std::sync::atomic::AtomicUsize,
    next_memory: std::sync::atomic::AtomicUsize,
}

/// The file a [`RecordedUtilization`] is read from.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UtilizationTrace {
    /// Where, when and how it was recorded.
    pub recorded: String,
    /// Interval between samples when recorded, milliseconds.
    pub interval_ms: u64,
    /// The GPUs, in NVML index order.
    pub gpus: Vec<RecordedGpu>,
}

/// One GPU of a recorded trace.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecordedGpu {
    /// Its UUID (`GPU-…`).
    pub uuid: String,
    /// NVML device utilization samples, percent.
    pub percent: Vec<u32>,
    /// NVML device memory in use, bytes, sampled as the percents were (none: the recording
    /// says nothing of memory).
    #[serde(default)]
    pub memory_used_bytes: Vec<u64>,
    /// The GPU's memory, bytes; given with `memoryUsedBytes`.
    #[serde(default)]
    pub memory_total_bytes: Option<u64>,
}

/// Most samples per GPU a trace may hold.
pub const MAX_TRACE_SAMPLES: usize = 100_000;

impl RecordedUtilization {
    /// Reads and checks a trace: at least one GPU, unique UUIDs, 1 to [`MAX_TRACE_SAMPLES`]
    /// samples each, every one a percent.
    pub fn read(path: &std::path::Path) -> Result<Self, String> {
        let what = || format!("utilization trace {}", path.display());
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", what()))?;
        let trace: UtilizationTrace =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", what()))?;
        Self::new(trace).map_err(|e| format!("{}: {e}", what()))
    }

    /// Checks a parsed trace (see [`RecordedUtilization::read`]).
    pub fn new(trace: UtilizationTrace) -> Result<Self, String> {
        if trace.gpus.is_empty() {
            return Err("no GPU in the trace".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for g in &trace.gpus {
            if !seen.insert(g.uuid.as_str()) {
                return Err(format!("GPU {} is listed twice", g.uuid));
            }
            if g.percent.is_empty() || g.percent.len() > MAX_TRACE_SAMPLES {
                return Err(format!(
                    "GPU {} has {} samples; 1 to {MAX_TRACE_SAMPLES} expected",
                    g.uuid,
                    g.percent.len()
                ));
            }
            if let Some(bad) = g.percent.iter().find(|&&p| p > 100) {
                return Err(format!("GPU {}: sample {bad} is not a percent", g.uuid));
            }
            match (g.memory_used_bytes.is_empty(), g.memory_total_bytes) {
                (true, None) => {}
                (false, Some(total)) if total > 0 => {
                    if g.memory_used_bytes.len() > MAX_TRACE_SAMPLES {
                        return Err(format!(
                            "GPU {} has {} memory samples; at most {MAX_TRACE_SAMPLES}",
                            g.uuid,
                            g.memory_used_bytes.len()
                        ));
                    }
                    if let Some(bad) = g.memory_used_bytes.iter().find(|&&b| b > total) {
                        return Err(format!(
                            "GPU {}: {bad} bytes in use is more than its {total}",
                            g.uuid
                        ));
                    }
                }
                _ => {
                    return Err(format!(
                        "GPU {}: memoryUsedBytes and a memoryTotalBytes above 0 go together",
                        g.uuid
                    ));
                }
            }
        }
        Ok(RecordedUtilization {
            gpus: trace.gpus,
            next: std::sync::atomic::AtomicUsize::new(0),
            next_memory: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// The index of the GPU with this UUID in the trace.
    /// A DRA device name (`gpu-<minor>`) stands for the trace's GPU at that position (the
    /// trace is a stand-in: its GPUs have no minor numbers).
    pub fn index_of(&self, device_id: &str) -> Option<u32> {
        if let Some(minor) = crate::devices::dra_minor(device_id) {
            return (usize::try_from(minor).ok()? < self.gpus.len()).then_some(minor);
        }
        self.gpus
            .iter()
            .position(|g| g.uuid == device_id)
            .and_then(|i| u32::try_from(i).ok())
    }
}

impl UtilizationSource for RecordedUtilization {
    fn memory(&self, devices: &[u32]) -> Result<Vec<MemorySample>, String> {
        let at = self
            .next_memory
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let all: Vec<u32> = if devices.is_empty() {
            (0..self.gpus.len())
                .filter_map(|i| u32::try_from(i).ok())
                .collect()
        } else {
            devices.to_vec()
        };
        Ok(all
            .into_iter()
            .filter_map(|i| {
                let g = self.gpus.get(i as usize)?;
                let total = g.memory_total_bytes?;
                let n = g.memory_used_bytes.len();
                let used = *g.memory_used_bytes.get(at.checked_rem(n)?)?;
                Some(MemorySample {
                    index: i,
                    used,
                    total,
                    processes: Vec::new(),
                })
            })
            .collect())
    }

    fn utilization(&self, devices: &[u32]) -> Result<Vec<(u32, u32)>, String> {
        let at = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pick = |i: u32| -> Option<(u32, u32)> {
            let g = self.gpus.get(i as usize)?;
            Some((i, g.percent[at % g.percent.len()]))
        };
        if devices.is_empty() {
            (0..self.gpus.len())
                .filter_map(|i| u32::try_from(i).ok())
                .map(|i| pick(i).ok_or_else(|| format!("GPU {i} is not in the trace")))
                .collect()
        } else {
            devices
                .iter()
                .map(|&i| pick(i).ok_or_else(|| format!("GPU {i} is not in the trace")))
                .collect()
        }
    }
}

/// A source with no GPU, for a window in which no configured pod holds one.
pub struct NoGpus;

impl UtilizationSource for NoGpus {
    fn utilization(&self, _: &[u32]) -> Result<Vec<(u32, u32)>, String> {
        Ok(Vec::new())
    }
}

impl UtilizationSource for NvmlUtilization {
    fn over_window(
        &self,
        devices: &[u32],
        window: Duration,
        interval: Duration,
    ) -> Result<Vec<GpuObservation>, String> {
        if self.prefer_gpm {
            let all = self.indices(devices)?;
            if let Some(gpus) = self.gpm_window(&all, window, interval)? {
                return Ok(gpus);
            }
        }
        observe(self, devices, window, interval)
    }

    fn utilization(&self, devices: &[u32]) -> Result<Vec<(u32, u32)>, String> {
        let all = self.indices(devices)?;
        all.into_iter()
            .map(|i| {
                let d = self
                    .nvml
                    .device_by_index(i)
                    .map_err(|e| format!("GPU {i}: {e}"))?;
                let u = d
                    .utilization_rates()
                    .map_err(|e| format!("GPU {i}: utilization: {e}"))?;
                Ok((i, u.gpu))
            })
            .collect()
    }

    fn memory(&self, devices: &[u32]) -> Result<Vec<MemorySample>, String> {
        use nvml_wrapper::enums::device::UsedGpuMemory;
        let all = self.indices(devices)?;
        all.into_iter()
            .map(|i| {
                let d = self
                    .nvml
                    .device_by_index(i)
                    .map_err(|e| format!("GPU {i}: {e}"))?;
                let m = d
                    .memory_info()
                    .map_err(|e| format!("GPU {i}: memory: {e}"))?;
                // Per-process figures where the driver keeps them (not under MIG or some vGPU
                // setups); the device figure stands without them.
                let processes = d
                    .running_compute_processes()
                    .map(|ps| {
                        ps.into_iter()
                            .filter_map(|p| match p.used_gpu_memory {
                                UsedGpuMemory::Used(b) if p.pid != 0 => Some((p.pid, b)),
                                _ => None,
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                Ok(MemorySample {
                    index: i,
                    used: m.used,
                    total: m.total,
                    processes,
                })
            })
            .collect()
    }
}

/// One GPU's memory at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemorySample {
    /// NVML index.
    pub index: u32,
    /// Bytes in use on the device (every process, and the driver's own).
    pub used: u64,
    /// The device's memory, bytes.
    pub total: u64,
    /// Bytes each compute process holds, by PID (as NVML sees PIDs: the host's), where NVML
    /// gives them.
    pub processes: Vec<(u32, u64)>,
}

/// One GPU's memory over a window.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuMemoryPeak {
    /// Highest bytes in use on the device in any sample.
    pub used: u64,
    /// The device's memory, bytes.
    pub total: u64,
    /// Highest bytes each process held, by PID.
    pub processes: std::collections::BTreeMap<u32, u64>,
    /// Samples behind it.
    pub samples: u32,
}

/// High-water marks of memory samples, per GPU. Figures no GPU can have (used above the total,
/// a total of 0) are left out, so one bad read cannot stand for the window.
#[derive(Debug, Default)]
pub struct MemoryPeaks(std::collections::BTreeMap<u32, GpuMemoryPeak>);

impl MemoryPeaks {
    /// Takes one sample of `devices` from `source`; a failed sample is skipped.
    pub fn sample<S: UtilizationSource + ?Sized>(&mut self, source: &S, devices: &[u32]) {
        let Ok(samples) = source.memory(devices) else {
            return;
        };
        for m in samples {
            if m.total == 0 || m.used > m.total {
                continue;
            }
            let peak = self.0.entry(m.index).or_default();
            peak.used = peak.used.max(m.used);
            peak.total = m.total;
            peak.samples = peak.samples.saturating_add(1);
            for (pid, bytes) in m.processes {
                if bytes <= m.total {
                    let p = peak.processes.entry(pid).or_default();
                    *p = (*p).max(bytes);
                }
            }
        }
    }

    /// The peaks, by GPU index.
    pub fn finish(self) -> std::collections::BTreeMap<u32, GpuMemoryPeak> {
        self.0
    }
}

/// One GPU's observation over a window.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuObservation {
    /// NVML index.
    pub index: u32,
    /// Mean of the utilization samples, 0 to 1.
    pub busy_fraction: f64,
    /// Samples taken (2 counter snapshots for GPM).
    pub samples: u32,
    /// How it was measured.
    pub method: Method,
    /// Its memory over the window, where the source says.
    pub memory: Option<GpuMemoryPeak>,
}

/// Samples every `interval` for `window` and averages per GPU. Samples that fail are skipped;
/// a window in which every sample failed is an error.
pub fn observe<S: UtilizationSource + ?Sized>(
    source: &S,
    devices: &[u32],
    window: Duration,
    interval: Duration,
) -> Result<Vec<GpuObservation>, String> {
    let start = Instant::now();
    let mut sums: std::collections::BTreeMap<u32, (u64, u32)> = Default::default();
    let mut memory = MemoryPeaks::default();
    let mut last_error = None;
    loop {
        memory.sample(source, devices);
        match source.utilization(devices) {
            Ok(v) => {
                for (i, pct) in v {
                    let e = sums.entry(i).or_default();
                    e.0 += u64::from(pct.min(100));
                    e.1 += 1;
                }
            }
            Err(e) => last_error = Some(e),
        }
        if start.elapsed() >= window {
            break;
        }
        std::thread::sleep(interval);
    }
    if sums.is_empty() {
        return Err(last_error.unwrap_or_else(|| "no GPU to observe".into()));
    }
    let mut memory = memory.finish();
    Ok(sums
        .into_iter()
        .map(|(index, (sum, n))| GpuObservation {
            index,
            #[allow(clippy::cast_precision_loss)]
            busy_fraction: sum as f64 / (100.0 * f64::from(n.max(1))),
            samples: n,
            method: Method::Sampled,
            memory: memory.remove(&index),
        })
        .collect())
}

#[cfg(test)]
mod tests;
