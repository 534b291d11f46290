//! Megatron-core's training state as the memory model counts it: each GPU holds 1/(tensor ×
//! pipeline) of the model, bf16 parameters and fp32 main gradients; the optimizer state (fp32
//! master weights and two moments) is sharded over the data-parallel ranks by the distributed
//! optimizer; the hybrid device optimizer steps a fraction of it on the host. Not measured:
//! every figure carries the model's safety for unmeasured paths.

use std::fmt;

use super::host::HOST_BASE_BYTES;
use super::{JobMemory, OFFLOAD_STREAM_BYTES, PartialShares, Placement, Sharding, as_f64};

/// How [`Sharding::Megatron`] shows itself.
pub(super) fn describe(
    f: &mut fmt::Formatter<'_>,
    tensor: u32,
    model_parallel: u32,
    distributed: bool,
    sequence: bool,
) -> fmt::Result {
    write!(
        f,
        "Megatron-core (tensor {tensor} × pipeline {}{}{})",
        model_parallel / tensor.max(1),
        if sequence && tensor > 1 {
            ", sequence parallel"
        } else {
            ""
        },
        if distributed {
            ", distributed optimizer"
        } else {
            ""
        }
    )
}

/// Of a layer's activations (34 units of sequence × batch × hidden bytes, without the
/// attention scores a fused attention never stores), what one tensor-parallel rank holds:
/// attention's and the MLP's 24 split over the group, the layer norms' and dropouts' 10 split
/// only with sequence parallelism (Korthikanti et al., "Reducing Activation Recomputation in
/// Large Transformer Models", 2022, table 2).
pub(super) fn tensor_parallel_share(tensor: u32, sequence: bool) -> f64 {
    let t = f64::from(tensor.max(1));
    if sequence || tensor <= 1 {
        1.0 / t
    } else {
        (10.0 + 24.0 / t) / 34.0
    }
}

impl JobMemory {
    /// Megatron-core: the parameters one GPU holds, and the optimizer state it steps (its
    /// shard of them with the distributed optimizer). `None` for other frameworks.
    pub(super) fn megatron_parts(&self) -> Option<(f64, f64)> {
        let Sharding::Megatron {
            model_parallel,
            distributed,
            ..
        } = self.sharding
        else {
            return None;
        };
        let on_gpu = self.parameters / f64::from(model_parallel.max(1));
        let data_parallel = (as_f64(self.ranks.max(1)) / f64::from(model_parallel.max(1))).max(1.0);
        Some((
            on_gpu,
            if distributed {
                on_gpu / data_parallel
            } else {
                on_gpu
            },
        ))
    }

    /// One GPU's bytes before the safety factor: bf16 parameters and fp32 main gradients of
    /// what it holds, the optimizer state it keeps (`kept` of its shard), its share of the
    /// activations (`act`: [`tensor_parallel_share`]), and `fixed` (buffers and the framework).
    pub(super) fn megatron_gpu(&self, kept: f64, act: f64, fixed: f64) -> f64 {
        let (tensor, sequence) = match self.sharding {
            Sharding::Megatron {
                tensor, sequence, ..
            } => (tensor, sequence),
            _ => (1, false),
        };
        let p = self.parameters;
        let (on_gpu, stepped) = self.megatron_parts().unwrap_or((p, p));
        let stream = if kept < 1.0 {
            OFFLOAD_STREAM_BYTES
        } else {
            0.0
        };
        (self.value_bytes + 4.0) * on_gpu
            + self.optimizer_bytes() * kept * stepped
            + act * tensor_parallel_share(tensor, sequence)
            + fixed
            + stream
    }

    /// The host memory of one rank: Megatron-core builds the model on the GPU; its hybrid
    /// device optimizer keeps, for each offloaded parameter of the rank's shard, an fp32 copy,
    /// a pinned fp32 gradient and the two Adam moments (16 bytes), after a pinned 16-bit copy
    /// at start. `None` for other frameworks.
    pub(super) fn megatron_host(&self, placement: Placement, share: f64) -> Option<f64> {
        let (_, stepped) = self.megatron_parts()?;
        let offloaded = match placement {
            Placement::NoOffload => 0.0,
            Placement::PartialOptimizer(_) => share * stepped,
            Placement::Optimizer | Placement::OptimizerAndParams => stepped,
        };
        Some((HOST_BASE_BYTES + (16.0 + self.value_bytes) * offloaded) * super::UNMEASURED_SAFETY)
    }

    /// The hybrid device optimizer offloads whole tensors of the rank's shard, from the first,
    /// until the fraction is reached: the share lands over the fraction by at most one tensor.
    /// `None` for other frameworks.
    pub(super) fn megatron_partial_shares(&self) -> Option<PartialShares> {
        let Sharding::Megatron { tensor, .. } = self.sharding else {
            return None;
        };
        let (_, stepped) = self.megatron_parts()?;
        // A tensor-parallel group splits the large matrices; a piece of the shard is at most
        // the whole shard.
        let largest = (self.shape.largest_tensor() / f64::from(tensor.max(1))).min(stepped);
        Some(PartialShares::Within((largest / stepped.max(1.0)).min(1.0)))
    }
}
