//! Host memory of an offloaded job as DeepSpeed allocates it: PyTorch's pinned blocks (rounded
//! to powers of two), the offloaded fp32 master weights, and the larger of the start's and the
//! first step's transients (docs/benchmarks/memory-h200.md, "Host memory, stage by stage").

use super::super::shape;
use super::{JobMemory, Placement, Sharding, as_f64};

/// Host memory of a training process before any offloaded state (CUDA, NCCL, the framework).
pub(super) const HOST_BASE_BYTES: f64 = 1.57e9;

/// What a process's host memory grows by over forward, backward and the CPU optimizer's first
/// step beside the moments (measured 0.67–0.91 GB, the most for the mixture of experts).
pub(super) const STEP_HOST_BYTES: f64 = 1.0e9;

/// The sub-groups of one rank on each side, or a bound where they were not walked.
#[derive(Clone, Copy, Debug)]
pub(super) enum OnHost<'a> {
    /// Walked: the sub-groups (parameters in each) whose state stays on the GPU, and those on
    /// the host.
    Walked {
        on_gpu: &'a [f64],
        on_host: &'a [f64],
    },
    /// Not walked: `share` of the shard on the host, in sub-groups of at most `group`.
    Bound { share: f64, group: f64 },
}

/// The bytes PyTorch's caching host allocator takes for a pinned tensor of `bytes`: the next
/// power of two (`CachingHostAllocator`'s rounding).
pub(super) fn pinned_block(bytes: f64) -> f64 {
    if bytes <= 0.0 || !bytes.is_finite() {
        return bytes.max(0.0);
    }
    bytes.log2().ceil().exp2().max(bytes)
}

/// Pinned bytes of the sub-groups' fp32 gradient buffers: per power-of-two size, as many blocks
/// as sub-groups on the host of that size, and one where only sub-groups on the GPU have it
/// (theirs are freed to the allocator's cache and reused one after another).
pub(super) fn pinned_gradient_blocks(on_gpu: &[f64], on_host: &[f64], state: f64) -> f64 {
    let mut sizes: Vec<(f64, usize, bool)> = Vec::new();
    let mut count = |n: f64, host: bool| {
        let block = pinned_block(state * n);
        match sizes.iter_mut().find(|(b, _, _)| *b == block) {
            Some(entry) => {
                if host {
                    entry.1 += 1;
                } else {
                    entry.2 = true;
                }
            }
            None => sizes.push((block, usize::from(host), !host)),
        }
    };
    for &n in on_gpu {
        count(n, false);
    }
    for &n in on_host {
        count(n, true);
    }
    sizes
        .iter()
        .map(|&(block, host, gpu)| {
            block * as_f64(u64::try_from(host.max(usize::from(gpu))).unwrap_or(u64::MAX))
        })
        .sum()
}

impl JobMemory {
    /// Host memory of one rank's process with `r` of its optimizer state offloaded; `groups`:
    /// DeepSpeed's sub-groups of the rank's partition where they were walked.
    pub(super) fn host_per_rank(
        &self,
        placement: Placement,
        r: f64,
        groups: Option<&[f64]>,
    ) -> f64 {
        let p = self.parameters;
        let s = self.shard();
        let b = self.value_bytes;
        if self.sharding == Sharding::Zero(3) {
            let base = HOST_BASE_BYTES + b * s;
            return match placement {
                Placement::NoOffload => base,
                Placement::PartialOptimizer(ratio) => {
                    self.zero3_optimizer_on_host(self.groups_on_host(groups, ratio, r))
                }
                Placement::Optimizer => {
                    self.zero3_optimizer_on_host(self.groups_on_host(groups, 1.0, 1.0))
                }
                Placement::OptimizerAndParams => base + 21.5 * s + 4.75e9,
            };
        }
        if let Some(host) = self.megatron_host(placement, r) {
            return host;
        }
        // Without ZeRO-3's partitioned construction each rank builds the whole model on the
        // host first (fp32); DeepSpeed's estimators for the offloaded state, 1.125 × for whole
        // state (large pinned sub-groups), not measured.
        let base = HOST_BASE_BYTES + (b * s).max(4.0 * p);
        let state = if self.sharding == Sharding::Unsharded {
            p
        } else {
            s
        };
        let o = self.optimizer_bytes() + self.grad_bytes();
        base + match placement {
            Placement::NoOffload => 0.0,
            Placement::PartialOptimizer(_) => (3.0 + o * r) * state,
            Placement::Optimizer => (3.0 + 1.125 * o) * state,
            Placement::OptimizerAndParams => (3.0 + 1.125 * o + 2.0 * b) * state,
        }
    }

    /// The sub-groups whose optimizer state DeepSpeed puts on the host for `ratio` (the last
    /// `n − ⌊(1 − ratio)·n⌋`), or where they were not walked a bound for `share` of the shard.
    pub(super) fn groups_on_host<'a>(
        &self,
        groups: Option<&'a [f64]>,
        ratio: f64,
        share: f64,
    ) -> OnHost<'a> {
        // A walk whose groups do not add up to the shard (a shape given beside a parameter
        // count it does not describe) is not trusted for block sizes.
        let total: f64 = groups.map_or(0.0, |g| g.iter().sum());
        let s = self.shard();
        match groups {
            Some(g) if !g.is_empty() && (total - s).abs() <= 0.01 * s => {
                let first = shape::first_on_host(g.len(), ratio);
                OnHost::Walked {
                    on_gpu: &g[..first],
                    on_host: &g[first..],
                }
            }
            _ => OnHost::Bound {
                share: share.clamp(0.0, 1.0),
                group: self.group_bound(share < 1.0),
            },
        }
    }

    /// Host memory of one ZeRO-3 rank whose optimizer state is offloaded, as DeepSpeed 0.19.8
    /// allocates it (`stage3.py`, measured per stage of the run in
    /// `docs/benchmarks/memory-h200.md`):
    /// - pinned, through PyTorch's caching host allocator, which rounds every block up to a
    ///   power of two and keeps freed blocks: the flat 16-bit gradient buffer of the whole
    ///   shard, and each sub-group's fp32 gradient buffer — kept for the sub-groups on the
    ///   host; those of the sub-groups on the GPU are pinned, copied and freed one at a time,
    ///   so one block of each of their sizes stays cached;
    /// - the fp32 master weights of the offloaded sub-groups (4 bytes a parameter);
    /// - the larger of two transients: the unpinned copy of the flat gradient buffer at start,
    ///   and at the first step the Adam moments (8 bytes a parameter, built then), a 16-bit
    ///   copy of the largest offloaded sub-group and what forward and backward add.
    pub(super) fn zero3_optimizer_on_host(&self, on_host: OnHost<'_>) -> f64 {
        let s = self.shard();
        let b = self.value_bytes;
        // The master weights, each moment and the master gradients: 4 bytes a parameter in
        // fp32, 2 in bf16.
        let sb = self.state_bytes();
        let flat = pinned_block(b * s);
        let (groups, offloaded, largest) = match on_host {
            OnHost::Walked { on_gpu, on_host } => {
                let blocks = pinned_gradient_blocks(on_gpu, on_host, sb);
                let offloaded: f64 = on_host.iter().sum();
                let largest = on_host.iter().copied().fold(0.0, f64::max);
                (blocks, offloaded, largest)
            }
            OnHost::Bound { share, group } => {
                // A block is less than twice what it holds; one block of the sub-groups on the
                // GPU stays cached.
                let offloaded = share * s;
                let cached = if share < 1.0 { 2.0 * sb * group } else { 0.0 };
                (
                    2.0 * sb * offloaded + cached,
                    offloaded,
                    group.min(offloaded),
                )
            }
        };
        let start = b * s;
        let first_step = STEP_HOST_BYTES + 2.0 * sb * offloaded + b * largest;
        HOST_BASE_BYTES + flat + groups + sb * offloaded + start.max(first_step)
    }
}
