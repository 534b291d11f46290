//! Megatron-core's training state as the memory model counts it: each GPU holds 1/(tensor ×
//! pipeline) of the model, bf16 parameters and fp32 main gradients; the optimizer state (fp32
//! master weights and two moments) is sharded over the data-parallel ranks by the distributed
//! optimizer; the hybrid device optimizer steps a fraction of it on the host.
//!
//! Measured with Megatron-core 0.14.0 on an H100 (one GPU, GPT models of 3.0B and 5.3B
//! parameters built by its own `GPTModel`, 4,096 tokens; docs/benchmarks/megatron-h200.md): no
//! offload within 0.5 % of the count; with `--optimizer-cpu-offload` the GPU holds one more
//! fp32 copy of every parameter it keeps than the optimizer steps ([`FIRST_HYBRID_COPY_BYTES`]),
//! and the host one more of every parameter it offloads, unless Megatron-LM's `--manual-gc`
//! collects it before the first step (rendered with the offload flags; measured: gone on
//! every run with it, GPU and host). The layout measured (one GPU)
//! carries no safety; every other (data, tensor and pipeline parallelism, not measured) the
//! model's safety for unmeasured paths.

use std::fmt;

use super::{JobMemory, OFFLOAD_STREAM_BYTES, PartialShares, Placement, Sharding, as_f64};

/// What Megatron-core 0.14's hybrid device optimizer leaves on the GPU beyond the state it
/// steps: `DistributedOptimizer` builds it twice, the first time over the whole model chunk,
/// and the first one's fp32 copies of the parameters it keeps on the GPU (4 bytes each) stay
/// referenced by its own hooks until Python's cyclic collector runs. Measured: 13.2 bytes a
/// parameter after start at a 10 % fraction (6 for the parameters and gradients, 3.6 for the
/// copy the optimizer steps, 3.6 for this one), 16 bytes a kept parameter after the first
/// step. Whether the collector frees it before the peak depends on how many objects the
/// program made (a 32-layer model's runs did without it); it is counted where
/// `--manual-gc` is off (`spec.megatron.manualGc: false`). With `--manual-gc`, which collects
/// garbage as training starts, it was gone on every run (3.0B at 10 % and 50 %: 63.8 and 49.9
/// GiB held against 73.9 and 55.5 without; 3.5B at 27 % and 48 %), and on the host too.
pub const FIRST_HYBRID_COPY_BYTES: f64 = 4.0;

/// What unfused attention (`--transformer-impl local`) holds per element of one layer's
/// sequence² scores (per head, per sequence of the micro-batch) at its peak in the layer's
/// backward: the scores, their softmax, the dropout mask and output, and their gradients, in
/// 16-bit, not all at once. Measured with Megatron-core 0.14.0 on an H100 (attention
/// recomputed, 4,096 tokens): 7.9 bytes at 24 heads of width 128, 9.4 at 32 (what the
/// activations held beyond the per-token count).
pub const UNFUSED_SCORE_BYTES: f64 = 10.0;

/// Host memory of a Megatron-core training process before any offloaded state (CUDA, NCCL,
/// PyTorch and Megatron-core): 1.83 GB peak RSS measured without offload (Megatron-core
/// 0.14.0, torch 2.11 on an H100).
const MEGATRON_HOST_BASE_BYTES: f64 = 1.9e9;

/// What the GPU budget keeps free beyond Megatron-core's allocated peak: what its caching
/// allocator holds beyond what is allocated, and the part of the GPU's memory (as NVML counts
/// it, what the budget starts from) that CUDA cannot allocate. Measured with Megatron-core
/// 0.14.0 on an H100 (reserved less allocated at the peak): 2.2–3.3 GiB in every run of the
/// hybrid device optimizer that trained, 3.9 GiB where 70 % of the 5.3B ran out asking for 2 GiB
/// with 1.7 GiB free (74.3 GiB needed; the runs that trained held at most 73.9); 5.9 GiB without
/// offload, where torch's `AdamW` (no Transformer Engine or Apex) steps with full-size
/// temporaries after the backward's peak. NVML's 79.65 GiB against CUDA's 79.18 there: 3.9 +
/// 0.5, rounded up.
pub const MEGATRON_ALLOCATOR_RESERVE: f64 = 4.5 * 1_073_741_824.0;

/// How [`Sharding::Megatron`] shows itself.
pub(super) fn describe(
    f: &mut fmt::Formatter<'_>,
    tensor: u32,
    model_parallel: u32,
    distributed: bool,
    sequence: bool,
    unfused_attention: bool,
) -> fmt::Result {
    write!(
        f,
        "Megatron-core (tensor {tensor} × pipeline {}{}{}{})",
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
        },
        if unfused_attention {
            ", local layers (unfused attention)"
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
    /// what it holds, the optimizer state it keeps (`kept` of its shard), with offload the
    /// hybrid optimizer's first copy ([`FIRST_HYBRID_COPY_BYTES`]), its share of the
    /// activations (`act`: [`tensor_parallel_share`]; `factor`, what is learned or kept on
    /// them, applies to unfused attention's scores too), and `fixed` (buffers and the
    /// framework).
    pub(super) fn megatron_gpu(&self, kept: f64, act: f64, factor: f64, fixed: f64) -> f64 {
        let (tensor, sequence, unfused) = match self.sharding {
            Sharding::Megatron {
                tensor,
                sequence,
                unfused_attention,
                ..
            } => (tensor, sequence, unfused_attention),
            _ => (1, false, false),
        };
        let p = self.parameters;
        let (on_gpu, stepped) = self.megatron_parts().unwrap_or((p, p));
        let (stream, first_copy) = if kept < 1.0 {
            (
                OFFLOAD_STREAM_BYTES,
                self.first_copy_bytes() * kept * on_gpu,
            )
        } else {
            (0.0, 0.0)
        };
        (self.value_bytes + 4.0) * on_gpu
            + self.optimizer_bytes() * kept * stepped
            + first_copy
            + act * tensor_parallel_share(tensor, sequence)
            + if unfused {
                factor * self.unfused_scores(tensor)
            } else {
                0.0
            }
            + fixed
            + stream
    }

    /// Bytes one layer's unfused attention holds for its sequence² scores on one
    /// tensor-parallel rank ([`UNFUSED_SCORE_BYTES`] a score, its share of the heads). The
    /// micro-batch's tokens are counted as one sequence, the most scores they can make (a
    /// micro-batch of several sequences makes fewer).
    fn unfused_scores(&self, tensor: u32) -> f64 {
        let tokens = self.tokens.unwrap_or(0.0);
        let heads = (self.shape.heads / f64::from(tensor.max(1))).ceil();
        UNFUSED_SCORE_BYTES * heads * tokens * tokens * (self.value_bytes / 2.0)
    }

    /// Bytes a parameter of the hybrid device optimizer's first copy still held at the peak:
    /// [`FIRST_HYBRID_COPY_BYTES`], or none where `--manual-gc` collects it before the first
    /// step (measured: every run with it held none, GPU and host).
    fn first_copy_bytes(&self) -> f64 {
        match self.sharding {
            Sharding::Megatron {
                first_copy_freed: true,
                ..
            } => 0.0,
            _ => FIRST_HYBRID_COPY_BYTES,
        }
    }

    /// The safety on a Megatron-core GPU estimate: none on the layout measured (one GPU: no tensor,
    /// pipeline or data parallelism), [`super::UNMEASURED_SAFETY`] on every other.
    pub(super) fn megatron_safety(&self) -> f64 {
        match self.sharding {
            Sharding::Megatron { model_parallel, .. } if model_parallel <= 1 && self.ranks <= 1 => {
                1.0
            }
            _ => super::UNMEASURED_SAFETY,
        }
    }

    /// The host memory of one rank: Megatron-core builds the model on the GPU; its hybrid
    /// device optimizer keeps, for each offloaded parameter of the rank's shard, an fp32 copy,
    /// a pinned fp32 gradient and the two Adam moments (16 bytes), after a pinned 16-bit copy
    /// at start (kept in PyTorch's pinned-memory cache), and the first hybrid optimizer's fp32
    /// copy of it ([`FIRST_HYBRID_COPY_BYTES`]) unless `--manual-gc` collects it. Measured:
    /// 20.5–23.3 bytes an offloaded parameter of peak RSS over the run without offload,
    /// against the 22 counted; 4 bytes fewer with `--manual-gc`, against the 18 counted then:
    /// the safety stays on. `None` for other frameworks.
    pub(super) fn megatron_host(&self, placement: Placement, share: f64) -> Option<f64> {
        let (_, stepped) = self.megatron_parts()?;
        let offloaded = match placement {
            Placement::NoOffload => 0.0,
            Placement::PartialOptimizer(_) => share * stepped,
            Placement::Optimizer | Placement::OptimizerAndParams => stepped,
        };
        Some(
            (MEGATRON_HOST_BASE_BYTES
                + (16.0 + self.value_bytes + self.first_copy_bytes()) * offloaded)
                * super::UNMEASURED_SAFETY,
        )
    }

    /// The hybrid device optimizer offloads whole tensors of the rank's shard, from the first,
    /// until the fraction is reached: the share is the fraction or over it by at most one
    /// tensor (the GPU estimate counts the fraction, the host's the most). `None` for other
    /// frameworks.
    pub(super) fn megatron_partial_shares(&self) -> Option<PartialShares> {
        let Sharding::Megatron { tensor, .. } = self.sharding else {
            return None;
        };
        let (_, stepped) = self.megatron_parts()?;
        // A tensor-parallel group splits the large matrices; a piece of the shard is at most
        // the whole shard.
        let largest = (self.shape.largest_tensor() / f64::from(tensor.max(1))).min(stepped);
        Some(PartialShares::AtLeast(
            (largest / stepped.max(1.0)).min(1.0),
        ))
    }
}
