//! The start-up guard (`offload-agent verify`): run as an init container of a pod the operator
//! configured, inside the pod's own GPU allocation, before the training framework starts. It
//! fails fast, with a message a person can act on, when the node is not what the configuration
//! assumes: unified-memory residency on GPUs without hardware coherence, a node class that
//! changed since the node was labelled (a driver change, a stale label), pinned host memory that
//! the pod cannot get, or no driver at all.

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

/// Checks the node against the configuration. `pin` page-locks host memory the way the
/// framework will (`Err` with the driver's message when refused); it is called only when the
/// configuration pins.
pub fn verify(
    source: &dyn NvmlSource,
    expected: &Expected,
    pin: &dyn Fn() -> Result<(), String>,
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
    let coherent = |g: &GpuReport| g.addressing_mode == AddressingMode::Ats && g.c2c.enabled;
    if expected.mode == OffloadMode::UnifiedMemory
        || expected.node_class == Some(NodeClass::Coherent)
    {
        let short: Vec<String> = reading
            .gpus
            .iter()
            .filter(|g| !coherent(g))
            .map(describe)
            .collect();
        if !short.is_empty() {
            return Err(Mismatch::NotCoherent {
                detail: short.join("; "),
                node,
            });
        }
    } else if expected.node_class == Some(NodeClass::Discrete) && model == NodeMemoryModel::Coherent
    {
        warnings.push(format!(
            "node {node} is hardware-coherent but was labelled discrete: explicit CPU copies work \
             here, unified memory would too (restart the offload-agent pod on {node} to re-label it)"
        ));
    }
    if expected.pin_memory && expected.mode != OffloadMode::Disabled {
        pin().map_err(|error| Mismatch::PinRefused {
            mib: PIN_PROBE_BYTES >> 20,
            error,
            node: node.clone(),
        })?;
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
        )
        .unwrap();
        assert!(ok.summary.contains("Coherent"), "{}", ok.summary);
        assert!(ok.warnings.is_empty());
        let h200 = RecordedNvml::from_report(fixtures::H200_READING).unwrap();
        let ok = verify(
            &h200,
            &expected(OffloadMode::CpuCopy, NodeClass::Discrete, true),
            &pins,
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
        )
        .unwrap();
    }
}
