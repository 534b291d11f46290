//! The GPU memory of a placement: the model's state on each GPU as the framework shards and
//! offloads it, beside the step's activations and the framework's buffers.

use super::flushes::Flush;
use super::{
    BUCKET_BYTES, FRAMEWORK_BYTES, JobMemory, MAX_LIVE_PARAMETERS, OFFLOAD_STREAM_BYTES, Placement,
    Sharding, UNMEASURED_SAFETY,
};

impl JobMemory {
    /// The bytes `placement` needs on each GPU with `kept` of the optimizer state there and
    /// activations of `act` bytes (`factor` times the model's: what was learned scales them).
    pub(super) fn gpu_bytes(
        &self,
        placement: Placement,
        kept: f64,
        act: f64,
        factor: f64,
        flushes: &[Flush],
    ) -> f64 {
        let p = self.parameters;
        let s = self.shard();
        let b = self.value_bytes;
        let o = self.optimizer_bytes();
        let c = BUCKET_BYTES + FRAMEWORK_BYTES;
        let live = b * p.min(MAX_LIVE_PARAMETERS);
        // ZeRO-3 over several ranks gathers each layer's parameters whole while it runs (not
        // measured: one GPU gathers nothing it does not hold).
        let gathered = if self.ranks > 1 {
            2.0 * b * self.largest_layer()
        } else {
            0.0
        };
        // The master gradients the optimizer needs in mixed precision.
        let f = self.grad_bytes();
        // With optimizer state offloaded the peak is the loss's backward or a gradient flush,
        // whichever is higher.
        let offloaded = flushes
            .iter()
            .map(|f| factor * f.alive + f.transient)
            .fold(act, f64::max)
            + OFFLOAD_STREAM_BYTES;
        match (self.sharding, placement) {
            (Sharding::Zero(3), Placement::NoOffload) => {
                (b + b + o) * s + c + gathered + act.max((b + 4.0) * self.largest_group())
            }
            (Sharding::Zero(3), Placement::PartialOptimizer(_)) => {
                b * s + (o + self.state_bytes()) * kept * s + c + gathered + offloaded
            }
            (Sharding::Zero(3), Placement::Optimizer) => b * s + c + gathered + offloaded,
            (Sharding::Zero(3), Placement::OptimizerAndParams) => c + offloaded + live,
            (Sharding::Fsdp, Placement::OptimizerAndParams) => (act + c + live) * UNMEASURED_SAFETY,
            (Sharding::Fsdp, _) => ((b + b + o + f) * s + act + c + live) * UNMEASURED_SAFETY,
            (Sharding::Zero(2), _) => {
                (b * p + (b + o) * kept * s + act.max(f * kept * s) + 2.0 * c) * UNMEASURED_SAFETY
            }
            (Sharding::Zero(1), _) => {
                ((b + b) * p + o * kept * s + act.max(f * kept * s) + c) * UNMEASURED_SAFETY
            }
            (Sharding::Zero(_), _) => ((b + b + o + f) * p + act + c) * UNMEASURED_SAFETY,
            (Sharding::Megatron { .. }, _) => {
                self.megatron_gpu(kept, act, factor, c) * self.megatron_safety()
            }
            (Sharding::Unsharded, _) => {
                ((b + b) * p + o * kept * p + act.max(f * kept * p) + c) * UNMEASURED_SAFETY
            }
        }
    }
}
