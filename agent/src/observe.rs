//! Observing what the GPUs of running jobs do: NVML's device utilization (the share of time a
//! kernel ran), sampled over a window. The busy fraction of a GPU whose job overlaps its CPU
//! optimizer work is close to 1; a job that serialises the two leaves its GPU idle for the CPU
//! part of every step.

use std::time::{Duration, Instant};

use serde::Serialize;

/// Something that says how busy each GPU was in its last sample period (percent).
pub trait UtilizationSource {
    /// Percent per GPU index, for the GPUs asked (all when empty).
    fn utilization(&self, devices: &[u32]) -> Result<Vec<(u32, u32)>, String>;
}

/// NVML, initialised once for the whole window.
pub struct NvmlUtilization {
    nvml: nvml_wrapper::Nvml,
}

impl NvmlUtilization {
    /// Loads NVML; the error says why it could not.
    pub fn new() -> Result<Self, String> {
        nvml_wrapper::Nvml::init()
            .map(|nvml| NvmlUtilization { nvml })
            .map_err(|e| format!("NVML initialisation failed: {e}"))
    }
}

impl NvmlUtilization {
    /// The NVML index of a device the kubelet assigned (NVIDIA's device plugin names GPUs by
    /// UUID); `None` for an ID NVML does not know.
    pub fn index_of(&self, device_id: &str) -> Option<u32> {
        self.nvml.device_by_uuid(device_id).ok()?.index().ok()
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
    fn utilization(&self, devices: &[u32]) -> Result<Vec<(u32, u32)>, String> {
        let all: Vec<u32> = if devices.is_empty() {
            let n = self
                .nvml
                .device_count()
                .map_err(|e| format!("nvmlDeviceGetCount failed: {e}"))?;
            (0..n).collect()
        } else {
            devices.to_vec()
        };
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
}

/// One GPU's observation over a window.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuObservation {
    /// NVML index.
    pub index: u32,
    /// Mean of the utilization samples, 0 to 1.
    pub busy_fraction: f64,
    /// Samples taken.
    pub samples: u32,
}

/// Samples every `interval` for `window` and averages per GPU. Samples that fail are skipped;
/// a window in which every sample failed is an error.
pub fn observe(
    source: &dyn UtilizationSource,
    devices: &[u32],
    window: Duration,
    interval: Duration,
) -> Result<Vec<GpuObservation>, String> {
    let start = Instant::now();
    let mut sums: std::collections::BTreeMap<u32, (u64, u32)> = Default::default();
    let mut last_error = None;
    loop {
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
    Ok(sums
        .into_iter()
        .map(|(index, (sum, n))| GpuObservation {
            index,
            #[allow(clippy::cast_precision_loss)]
            busy_fraction: sum as f64 / (100.0 * f64::from(n.max(1))),
            samples: n,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// A recorded utilization trace (a stand-in for a GPU that is not here): replays percents.
    struct Trace {
        values: Vec<u32>,
        at: Cell<usize>,
    }

    impl UtilizationSource for Trace {
        fn utilization(&self, _: &[u32]) -> Result<Vec<(u32, u32)>, String> {
            let i = self.at.get();
            self.at.set(i + 1);
            match self.values.get(i % self.values.len()) {
                Some(&v) if v <= 100 => Ok(vec![(0, v)]),
                _ => Err("sample failed".into()),
            }
        }
    }

    #[test]
    fn the_busy_fraction_is_the_mean_of_the_samples() {
        let trace = Trace {
            values: vec![100, 0, 100, 60],
            at: Cell::new(0),
        };
        let o = observe(
            &trace,
            &[],
            Duration::from_millis(0),
            Duration::from_millis(0),
        )
        .unwrap();
        // One sample with a zero window.
        assert_eq!(o[0].samples, 1);
        assert_eq!(o[0].busy_fraction, 1.0);
        let trace = Trace {
            values: vec![100, 0, 100, 60, 101],
            at: Cell::new(0),
        };
        let o = observe(
            &trace,
            &[],
            Duration::from_millis(30),
            Duration::from_millis(1),
        )
        .unwrap();
        assert!(o[0].samples >= 4, "{o:?}");
        assert!(
            o[0].busy_fraction > 0.5 && o[0].busy_fraction < 0.8,
            "{o:?}"
        );
        let broken = Trace {
            values: vec![200],
            at: Cell::new(0),
        };
        assert!(observe(&broken, &[], Duration::ZERO, Duration::ZERO).is_err());
    }
}
