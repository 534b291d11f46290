//! Dynamic Resource Allocation (`resource.k8s.io/v1`): the GPU driver's ResourceSlices as a
//! second witness of each node's memory model beside the agent's report ([`slices`]), and jobs
//! whose GPUs come from ResourceClaims: sized by the devices their claims request, and pinned
//! to the decided node class by a selector on the devices' addressing mode ([`claims`]).

pub mod api;
pub mod claims;
pub mod slices;

/// The GPU driver the operator reads by default: NVIDIA's DRA driver.
pub const DEFAULT_DRIVER: &str = "gpu.nvidia.com";

/// Which DRA driver publishes the GPUs, and which DeviceClasses stand for its GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraOptions {
    /// The driver's name, also the domain of its device attributes (`gpu.nvidia.com`).
    pub driver: String,
    /// DeviceClasses whose devices are that driver's whole GPUs (`gpu.nvidia.com`): a claim's
    /// request of one of these counts as GPUs.
    pub gpu_classes: Vec<String>,
}

impl Default for DraOptions {
    fn default() -> Self {
        DraOptions {
            driver: DEFAULT_DRIVER.to_string(),
            gpu_classes: vec![DEFAULT_DRIVER.to_string()],
        }
    }
}
