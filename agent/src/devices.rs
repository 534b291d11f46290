//! What NVIDIA's GPU drivers call a GPU: the extended resource its device plugin hands out, the
//! DRA driver's name and how that driver names a whole GPU. Shared by the attribution of GPUs
//! to pods and the sampling of those GPUs.

use offload_api::names;

/// The extended resource GPUs are requested as.
pub const GPU_RESOURCE: &str = names::GPU_RESOURCE;

/// The DRA driver whose allocated devices are GPUs by default: NVIDIA's (`run --dra-driver`).
pub const DRA_DRIVER: &str = "gpu.nvidia.com";

/// The minor number in a device name NVIDIA's DRA driver gives a whole GPU (`gpu-3`).
pub fn dra_minor(device: &str) -> Option<u32> {
    device.strip_prefix("gpu-")?.parse().ok()
}
