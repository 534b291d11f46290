//! Reading the node's GPUs through NVML.
//!
//! [`NvmlSource`] is the seam: [`RealNvml`] reads the driver through nvml-wrapper; tests use
//! [`RecordedNvml`], a test double that replays a recorded or reference reading of hardware that
//! is not here (a GH200, an HMM PCIe GPU). Nothing here panics on what the driver says.

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::MigMode;
use nvml_wrapper::sys_exports::field_id::{
    NVML_FI_DEV_C2C_LINK_COUNT, NVML_FI_DEV_C2C_LINK_GET_MAX_BW,
};
use nvml_wrapper_sys::bindings::{
    nvmlC2cModeInfo_v1_t, nvmlDeviceAddressingMode_t, nvmlReturn_enum_NVML_SUCCESS,
};
use offload_api::report::{
    AddressingMode, C2cInfo, GpuReport, MemoryOnlyNode, NodeMemoryModel, NvmlInfo,
};

/// Everything NVML said about the node.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeReading {
    /// Library and driver facts, or the error.
    pub nvml: NvmlInfo,
    /// GPUs; empty when NVML failed or there are none.
    pub gpus: Vec<GpuReport>,
    /// The kernel's NUMA nodes without CPUs that hold memory (`None`: not read).
    pub memory_only_nodes: Option<Vec<MemoryOnlyNode>>,
}

impl NodeReading {
    /// The node's memory model: unknown when NVML failed.
    pub fn memory_model(&self) -> NodeMemoryModel {
        if !self.nvml.available {
            return NodeMemoryModel::Unknown;
        }
        NodeMemoryModel::classify(&self.gpus)
    }
}

/// What one GPU is doing now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GpuActivity {
    /// NVML index.
    pub index: u32,
    /// Processes with a compute context on it (host PIDs).
    pub processes: Vec<u32>,
    /// Percent of the last sample period a kernel ran, when NVML says.
    pub utilization_percent: Option<u32>,
}

/// Utilization at or above which a GPU counts as busy even without a visible process (a
/// process in another PID namespace NVML cannot name, MPS, a short-lived context).
pub const BUSY_UTILIZATION_PERCENT: u32 = 5;

/// Why the GPUs are not free for a self-test, if they are not: one line naming each busy GPU.
pub fn busy(activity: &[GpuActivity]) -> Option<String> {
    let busy: Vec<String> = activity
        .iter()
        .filter(|a| {
            !a.processes.is_empty()
                || a.utilization_percent
                    .is_some_and(|u| u >= BUSY_UTILIZATION_PERCENT)
        })
        .map(|a| {
            let mut parts = Vec::new();
            if !a.processes.is_empty() {
                let shown: Vec<String> = a.processes.iter().take(4).map(u32::to_string).collect();
                parts.push(format!(
                    "{} compute process(es) (pid {})",
                    a.processes.len(),
                    shown.join(", ")
                ));
            }
            if let Some(u) = a.utilization_percent {
                parts.push(format!("{u} % busy"));
            }
            format!("GPU {}: {}", a.index, parts.join(", "))
        })
        .collect();
    (!busy.is_empty()).then(|| busy.join("; "))
}

/// A source of NVML readings.
pub trait NvmlSource {
    /// Reads the node. Never fails: errors are part of the reading.
    fn read(&self) -> NodeReading;

    /// What every GPU is doing now (compute processes, utilization). An error when NVML cannot
    /// say: the caller then treats the GPUs as busy rather than measure over a job.
    fn activity(&self) -> Result<Vec<GpuActivity>, String>;
}

/// The real driver, through nvml-wrapper.
#[derive(Debug, Default)]
pub struct RealNvml;

impl NvmlSource for RealNvml {
    fn activity(&self) -> Result<Vec<GpuActivity>, String> {
        let nvml = Nvml::init().map_err(|e| describe_init_error(&e))?;
        let count = nvml
            .device_count()
            .map_err(|e| format!("nvmlDeviceGetCount failed: {e}"))?;
        let mut out = Vec::new();
        for index in 0..count {
            let device = nvml
                .device_by_index(index)
                .map_err(|e| format!("GPU {index}: {e}"))?;
            let processes = device
                .running_compute_processes()
                .map_err(|e| format!("GPU {index}: listing compute processes failed: {e}"))?
                .into_iter()
                .map(|p| p.pid)
                .collect();
            out.push(GpuActivity {
                index,
                processes,
                utilization_percent: device.utilization_rates().ok().map(|u| u.gpu),
            });
        }
        Ok(out)
    }

    fn read(&self) -> NodeReading {
        let reading = match Nvml::init() {
            Ok(nvml) => read_with(&nvml),
            Err(e) => NodeReading {
                nvml: NvmlInfo {
                    available: false,
                    error: Some(describe_init_error(&e)),
                    ..NvmlInfo::default()
                },
                gpus: Vec::new(),
                memory_only_nodes: None,
            },
        };
        NodeReading {
            memory_only_nodes: crate::topology::memory_only_nodes(std::path::Path::new("/sys")),
            ..reading
        }
    }
}

fn describe_init_error(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(inner) => {
            format!(
                "NVML library could not be loaded ({inner}): is the NVIDIA driver installed and mounted into the pod?"
            )
        }
        NvmlError::DriverNotLoaded => "the NVIDIA kernel driver is not loaded".to_string(),
        NvmlError::NoPermission => "no permission to talk to the NVIDIA driver".to_string(),
        other => format!("NVML initialisation failed: {other}"),
    }
}

fn read_with(nvml: &Nvml) -> NodeReading {
    let info = NvmlInfo {
        available: true,
        error: None,
        driver_version: nvml.sys_driver_version().ok(),
        nvml_version: nvml.sys_nvml_version().ok(),
        cuda_driver_version: nvml.sys_cuda_driver_version().ok(),
    };
    let count = match nvml.device_count() {
        Ok(n) => n,
        Err(e) => {
            return NodeReading {
                nvml: NvmlInfo {
                    error: Some(format!("nvmlDeviceGetCount failed: {e}")),
                    ..info
                },
                gpus: Vec::new(),
                memory_only_nodes: None,
            };
        }
    };
    let mut gpus = Vec::new();
    let mut errors = Vec::new();
    for index in 0..count {
        match nvml.device_by_index(index) {
            Ok(device) => gpus.push(read_device(nvml, index, &device)),
            Err(e) => errors.push(format!("GPU {index}: {e}")),
        }
    }
    NodeReading {
        nvml: NvmlInfo {
            error: (!errors.is_empty()).then(|| errors.join("; ")),
            ..info
        },
        gpus,
        memory_only_nodes: None,
    }
}

fn read_device(nvml: &Nvml, index: u32, device: &nvml_wrapper::Device<'_>) -> GpuReport {
    let c2c_enabled = c2c_enabled(nvml, device);
    let (link_count, max_bw) = if c2c_enabled == Some(true) {
        c2c_fields(device)
    } else {
        (None, None)
    };
    let numa_node = device
        .numa_node_id()
        .ok()
        .and_then(|n| i32::try_from(n).ok());
    let sys = std::path::Path::new("/sys");
    let local = device
        .pci_info()
        .ok()
        .and_then(|p| crate::topology::local_cpus(sys, &p.bus_id));
    GpuReport {
        index,
        uuid: device.uuid().unwrap_or_default(),
        name: device.name().unwrap_or_else(|_| "unknown".to_string()),
        architecture: device.architecture().ok().map(|a| a.to_string()),
        pci_device_id: device.pci_info().ok().map(|p| p.pci_device_id >> 16),
        memory_total_bytes: device.memory_info().map(|m| m.total).unwrap_or(0),
        addressing_mode: addressing_mode(nvml, device),
        c2c: C2cInfo {
            enabled: c2c_enabled.unwrap_or(false),
            link_count,
            max_bandwidth_mbps: max_bw,
        },
        numa_node,
        local_cpu_count: local.as_ref().map(|l| l.1),
        local_cpus: local.map(|l| l.0),
        numa_memory_bytes: numa_node.and_then(|n| crate::topology::numa_memory_bytes(sys, n)),
        pcie_generation: device.current_pcie_link_gen().ok(),
        pcie_width: device.current_pcie_link_width().ok(),
        mig_enabled: matches!(device.mig_mode(), Ok(MigMode { current: 1, .. })),
    }
}

/// `nvmlDeviceGetAddressingMode` (NVML 13, driver R580+), through the raw symbol: the generated
/// convenience method panics when the symbol is absent, so its presence is checked first.
fn addressing_mode(nvml: &Nvml, device: &nvml_wrapper::Device<'_>) -> AddressingMode {
    let Ok(get) = nvml.lib().nvmlDeviceGetAddressingMode.as_ref() else {
        return AddressingMode::Unknown;
    };
    let mut mode = nvmlDeviceAddressingMode_t {
        version: ADDRESSING_MODE_V1,
        value: 0,
    };
    // SAFETY: the symbol exists, the handle is valid for `device`'s lifetime, and `mode` is a
    // properly versioned out-parameter.
    let ret = unsafe { get(device.handle(), &mut mode) };
    if ret != nvmlReturn_enum_NVML_SUCCESS {
        return AddressingMode::Unknown;
    }
    addressing_mode_from_raw(mode.value)
}

/// Version word of `nvmlDeviceAddressingMode_v1_t`: `sizeof | (1 << 24)`.
pub const ADDRESSING_MODE_V1: u32 =
    (std::mem::size_of::<nvmlDeviceAddressingMode_t>() as u32) | (1 << 24);

/// NONE=0, HMM=1, ATS=2; anything else is unknown.
pub fn addressing_mode_from_raw(value: u32) -> AddressingMode {
    match value {
        0 => AddressingMode::None,
        1 => AddressingMode::Hmm,
        2 => AddressingMode::Ats,
        _ => AddressingMode::Unknown,
    }
}

/// `nvmlDeviceGetC2cModeInfoV` (NVML 12.3+), raw symbol checked for presence.
fn c2c_enabled(nvml: &Nvml, device: &nvml_wrapper::Device<'_>) -> Option<bool> {
    let get = nvml.lib().nvmlDeviceGetC2cModeInfoV.as_ref().ok()?;
    let mut info = nvmlC2cModeInfo_v1_t { isC2cEnabled: 0 };
    // SAFETY: as above.
    let ret = unsafe { get(device.handle(), &mut info) };
    (ret == nvmlReturn_enum_NVML_SUCCESS).then_some(info.isC2cEnabled != 0)
}

fn c2c_fields(device: &nvml_wrapper::Device<'_>) -> (Option<u32>, Option<u64>) {
    use nvml_wrapper::enums::device::SampleValue;
    use nvml_wrapper::structs::device::FieldId;
    let Ok(values) = device.field_values_for(&[
        FieldId(NVML_FI_DEV_C2C_LINK_COUNT),
        FieldId(NVML_FI_DEV_C2C_LINK_GET_MAX_BW),
    ]) else {
        return (None, None);
    };
    let as_u64 = |v: &SampleValue| match v {
        SampleValue::U32(x) => Some(u64::from(*x)),
        SampleValue::U64(x) => Some(*x),
        SampleValue::I64(x) => u64::try_from(*x).ok(),
        _ => None,
    };
    let mut out = (None, None);
    for (i, sample) in values.into_iter().enumerate() {
        let Ok(sample) = sample else { continue };
        let Ok(value) = sample.value else { continue };
        match i {
            0 => out.0 = as_u64(&value).and_then(|v| u32::try_from(v).ok()),
            _ => out.1 = as_u64(&value),
        }
    }
    out
}

/// Number of NUMA nodes the OS shows (GPU memory appears as memory-only nodes on GH200 in NUMA
/// mode).
pub fn os_numa_nodes() -> Option<u32> {
    let entries = std::fs::read_dir("/sys/devices/system/node").ok()?;
    let n = entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("node") && name[4..].chars().all(|c| c.is_ascii_digit())
        })
        .count();
    u32::try_from(n).ok().filter(|n| *n > 0)
}

/// A test double standing in for hardware that is not here: replays the GPUs and NVML facts of
/// a recorded (or reference) node report.
#[derive(Clone, Debug)]
pub struct RecordedNvml {
    reading: NodeReading,
    activity: Vec<GpuActivity>,
}

impl RecordedNvml {
    /// From a node report fixture (see `crates/testenv/fixtures/README.md` for where each comes from).
    pub fn from_report(json: &str) -> Result<Self, offload_api::report::ReportError> {
        let report = offload_api::report::NodeReport::parse(json)?;
        Ok(RecordedNvml {
            reading: NodeReading {
                nvml: report.nvml,
                gpus: report.gpus,
                memory_only_nodes: report.memory_witnesses.map(|w| w.memory_only_nodes),
            },
            activity: Vec::new(),
        })
    }

    /// The same reading with the kernel's NUMA view `nodes` instead (`None`: unreadable).
    pub fn with_memory_only_nodes(mut self, nodes: Option<Vec<MemoryOnlyNode>>) -> Self {
        self.reading.memory_only_nodes = nodes;
        self
    }

    /// The same reading with GPUs in use (a job running), for the busy check.
    pub fn with_activity(mut self, activity: Vec<GpuActivity>) -> Self {
        self.activity = activity;
        self
    }

    /// A node whose NVML library is missing, with the loader's error text.
    pub fn missing_library() -> Self {
        RecordedNvml {
            reading: NodeReading {
                nvml: NvmlInfo {
                    available: false,
                    error: Some("NVML library could not be loaded (libnvidia-ml.so.1: cannot open shared object file: No such file or directory): is the NVIDIA driver installed and mounted into the pod?".to_string()),
                    ..NvmlInfo::default()
                },
                gpus: Vec::new(),
                memory_only_nodes: None,
            },
            activity: Vec::new(),
        }
    }
}

impl NvmlSource for RecordedNvml {
    fn read(&self) -> NodeReading {
        self.reading.clone()
    }

    fn activity(&self) -> Result<Vec<GpuActivity>, String> {
        if self.reading.nvml.available {
            Ok(self.activity.clone())
        } else {
            Err(self.reading.nvml.error.clone().unwrap_or_default())
        }
    }
}

#[cfg(test)]
mod tests {
    use offload_testenv::fixtures;

    use super::*;

    #[test]
    fn recorded_gh200_is_coherent_and_h200_discrete() {
        let gh = RecordedNvml::from_report(fixtures::GH200_REFERENCE)
            .unwrap()
            .read();
        assert_eq!(gh.memory_model(), NodeMemoryModel::Coherent);
        assert!(gh.gpus[0].name.contains("GH200"));
        assert_eq!(gh.gpus[0].pci_device_id, Some(0x2342));
        let h200 = RecordedNvml::from_report(fixtures::H200_READING)
            .unwrap()
            .read();
        assert_eq!(h200.memory_model(), NodeMemoryModel::Discrete);
        let hmm = RecordedNvml::from_report(fixtures::HMM_UNPINNED)
            .unwrap()
            .read();
        assert_eq!(hmm.memory_model(), NodeMemoryModel::Hmm);
    }

    #[test]
    fn a_missing_library_is_unknown_with_the_loader_error() {
        let r = RecordedNvml::missing_library().read();
        assert_eq!(r.memory_model(), NodeMemoryModel::Unknown);
        assert!(r.nvml.error.unwrap().contains("libnvidia-ml.so.1"));
    }

    #[test]
    fn raw_addressing_modes_map_as_the_header_says() {
        assert_eq!(addressing_mode_from_raw(0), AddressingMode::None);
        assert_eq!(addressing_mode_from_raw(1), AddressingMode::Hmm);
        assert_eq!(addressing_mode_from_raw(2), AddressingMode::Ats);
        assert_eq!(addressing_mode_from_raw(7), AddressingMode::Unknown);
        assert_eq!(
            ADDRESSING_MODE_V1, 0x0100_0008,
            "FACTS: version word 0x01000008"
        );
    }

    #[test]
    fn real_nvml_never_panics_here() {
        // On a machine without a driver this reports the loader error; with one, GPUs.
        let reading = RealNvml.read();
        if !reading.nvml.available {
            eprintln!(
                "no NVML on this machine: {}",
                reading.nvml.error.clone().unwrap_or_default()
            );
            assert!(reading.nvml.error.is_some());
            assert!(reading.gpus.is_empty());
        }
    }
}
