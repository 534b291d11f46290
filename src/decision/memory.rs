//! The memory model of a training job: for each way of placing its training state — nothing
//! offloaded, part of the optimizer state on the host, all of it, optimizer state and
//! parameters — the bytes each GPU and each pod's host memory need, and whether a node class
//! holds them, with how much is left.
//!
//! ZeRO-3 is modelled as DeepSpeed 0.19.8 allocates it, measured on an H200 with Hugging Face
//! models built inside `deepspeed.zero.Init` (`docs/benchmarks/memory-h200.md`); per GPU, with
//! `s` the rank's shard of the parameters:
//! - without offload: 16 bytes per parameter of `s` (16-bit parameters and gradients, fp32
//!   master weights and the two Adam moments), DeepSpeed's reduce bucket (10⁹ bytes) and the
//!   framework's own buffers, and the larger of the step's activations ([`ModelShape`]: what the
//!   blocks as built keep for backward, and the loss's fp32 logits) and the optimizer step's
//!   conversion of one sub-group's gradients to fp32 (6 bytes per parameter of the largest
//!   sub-group);
//! - with a share of the optimizer state offloaded: the 16-bit parameters, 16 bytes per
//!   parameter whose state stays (fp32 master weights, their fp32 gradient buffer — allocated
//!   whole at start, not per step — and the moments), the bucket, and the larger of the
//!   activations at the loss's backward and at each gradient-bucket flush of the backward with
//!   what the flush holds on top ([`JobMemory::flushes`]: the reduce-scatter's flat copy, the
//!   largest gradient's copy back from the host, its fp64 norm chunks or fp32 copy), and 0.1 GB
//!   of copies on DeepSpeed's reduce stream. DeepSpeed offloads whole sub-groups, the last ones: the share that
//!   really leaves is worked out from the model's tensors ([`shape::offloaded_share`]) when its
//!   shape is known. A small share costs more than it frees: 2 bytes per parameter are added
//!   for fp32 gradients of the state that stays, so below about an eighth nothing is saved;
//! - all optimizer state offloaded: the 16-bit parameters, the bucket, the larger of the
//!   activations and the flushes as above; parameters too: the gathered parameters (at most
//!   10⁹) instead of the 16-bit parameters.
//! - on the host, per process: 1.57 GB and the 16-bit shard without offload. With optimizer
//!   state offloaded (a share or all of it), what DeepSpeed allocates, measured stage by stage
//!   (`JobMemory::zero3_optimizer_on_host`): pinned blocks, each rounded up to a power of two
//!   by PyTorch's caching host allocator (the flat 16-bit gradient buffer of the whole shard,
//!   and the fp32 gradient buffer of each offloaded sub-group), the offloaded fp32 master
//!   weights, and the larger of the start's and the first step's transients (the Adam moments
//!   are built at the first step). Never under the measured peaks, within 1 % for the Hugging
//!   Face decoders and 5 % for the bench's GPT decoder; parameters offloaded too: 21.5 bytes
//!   per parameter and 4.75 GB, fitted (within 6 %).
//!
//! What the GPU can hold: its memory less what is never the caching allocator's (the CUDA
//! context, NCCL, cuBLAS workspaces: 1.4 GiB) and the allocator's fragmentation: 2 % of the
//! GPU, or 1.4 × the step's largest activation (the loss's fp32 logits of a micro-batch) where
//! that is more ([`LARGE_ALLOCATION_FRAGMENTATION`]). On the H200 that is 136.2 GiB for most
//! jobs; measured, 135.9 GiB allocated trained and 136.9 GiB ran out.
//!
//! ZeRO-1/2, FSDP and jobs the operator knows nothing of (`Generic`) follow DeepSpeed's
//! estimators with the same terms and 5 % on top; they were not measured.
//!
//! Every figure is in bytes as `f64` (products of counts that could overflow an integer never
//! do in floating point); results are rounded up into `u64`, saturating.

use std::fmt;

use super::shape::{self, ModelShape};

/// Bytes of each GPU that are never the caching allocator's: the CUDA context, NCCL's buffers,
/// cuBLAS workspaces (measured 1.28 GiB on the H200).
pub const CONTEXT_RESERVE_BYTES: f64 = 1.4 * 1_073_741_824.0;
/// Share of each GPU kept for the caching allocator's fragmentation (measured: an allocation of
/// 112 MiB failed with 1.61 GiB reserved but unallocated).
pub const FRAGMENTATION_SHARE: f64 = 0.02;
/// Headroom the decision keeps for the caching allocator to place the step's largest activation
/// (the loss's fp32 logits of a micro-batch), as a multiple of it, where that is more than
/// [`FRAGMENTATION_SHARE`] of the GPU. Measured with Llama-3.2-3B at 18,432 tokens a micro-batch
/// (8.8 GiB of logits at a time) on the H200, as the GPU's memory less the CUDA context less
/// the peak allocated, over the logits: 1.05 × ran out (10.9 GiB reserved but unallocated);
/// 1.22 × and 1.31 × trained after retrying the allocator; 1.48 × and more trained without.
/// At 1.4 × the choice for that job is a 44 % share, 4 % slower a step than the 38 % that
/// trained nearest the limit.
pub const LARGE_ALLOCATION_FRAGMENTATION: f64 = 1.4;
/// Headroom under which a placement is called close to the limit, as a share of the GPU.
pub const CLOSE_TO_LIMIT_SHARE: f64 = 0.03;
/// Share of GPU memory kept for activations when the step's tokens are not known.
pub const ACTIVATION_MARGIN_SHARE: f64 = 0.10;
/// Partial offload of up to this share runs faster than offloading optimizer state and
/// parameters whole (measured crossover 0.43 at 1.1B parameters, 0.53 at 3.8B on an H200).
pub const PARTIAL_BEFORE_PARAMS_UP_TO: f64 = 0.45;
/// Tensors past which the sub-groups are bounded rather than walked.
const MAX_TENSORS: usize = 20_000;

/// DeepSpeed's reduce bucket (`reduce_bucket_size` 5·10⁸ in 16-bit), allocated at start.
const BUCKET_BYTES: f64 = 1e9;
/// The framework's own GPU buffers beside the bucket (measured 0.07–0.11 GB).
const FRAMEWORK_BYTES: f64 = 0.12e9;
/// What the GPU holds beyond the count whenever optimizer state is offloaded: copies on
/// DeepSpeed's reduce stream whose memory is reused only once the stream is done with them
/// (measured up to 0.09 GB: Qwen2.5-1.5B at a 5 % share).
const OFFLOAD_STREAM_BYTES: f64 = 0.1e9;
/// DeepSpeed's `reduce_bucket_size` default: gradient elements reduced at once.
const REDUCE_BUCKET_ELEMENTS: f64 = 5e8;
/// Elements of each fp64 chunk DeepSpeed's gradient norm converts at once
/// (`_constant_buffered_norm2`).
const NORM_CHUNK_ELEMENTS: f64 = 2.5e8;
/// `stage3_max_live_parameters`: gathered parameters alive at once.
const MAX_LIVE_PARAMETERS: f64 = 1e9;
/// `sub_group_size`'s default.
const DEFAULT_SUB_GROUP: f64 = 1e9;
/// Safety on the estimates of what was not measured (ZeRO-1/2, FSDP, `Generic`).
const UNMEASURED_SAFETY: f64 = 1.05;
/// Host memory of a training process before any offloaded state (CUDA, NCCL, the framework).
const HOST_BASE_BYTES: f64 = 1.57e9;
/// What a process's host memory grows by over forward, backward and the CPU optimizer's first
/// step beside the moments (measured 0.67–0.91 GB, the most for the mixture of experts).
const STEP_HOST_BYTES: f64 = 1.0e9;

/// A gradient-bucket flush in the backward of a job whose optimizer state is offloaded: the
/// activation bytes still kept at that moment, and the bytes the flush holds on top of them.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Flush {
    alive: f64,
    transient: f64,
}

/// The sub-groups of one rank on each side, or a bound where they were not walked.
#[derive(Clone, Copy, Debug)]
enum OnHost<'a> {
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
fn pinned_block(bytes: f64) -> f64 {
    if bytes <= 0.0 || !bytes.is_finite() {
        return bytes.max(0.0);
    }
    bytes.log2().ceil().exp2().max(bytes)
}

/// Pinned bytes of the sub-groups' fp32 gradient buffers: per power-of-two size, as many blocks
/// as sub-groups on the host of that size, and one where only sub-groups on the GPU have it
/// (theirs are freed to the allocator's cache and reused one after another).
fn pinned_gradient_blocks(on_gpu: &[f64], on_host: &[f64]) -> f64 {
    let mut sizes: Vec<(f64, usize, bool)> = Vec::new();
    let mut count = |n: f64, host: bool| {
        let block = pinned_block(4.0 * n);
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

/// How a job's training state is placed between GPU and host memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Placement {
    /// Everything on the GPUs.
    NoOffload,
    /// The optimizer state of this ratio of DeepSpeed's sub-groups (with its fp32 gradients)
    /// on the host.
    PartialOptimizer(f64),
    /// All optimizer state on the host.
    Optimizer,
    /// Optimizer state and parameters on the host (ZeRO-3 `offload_param`, FSDP CPU offload).
    OptimizerAndParams,
}

impl Placement {
    /// The placement in the status's words, with its share (0 where it has none).
    pub fn state(self) -> (offload_api::v1alpha1::StatePlacement, f64) {
        use offload_api::v1alpha1::StatePlacement;
        match self {
            Placement::NoOffload => (StatePlacement::NoOffload, 0.0),
            Placement::PartialOptimizer(r) => (StatePlacement::PartialOptimizer, r),
            Placement::Optimizer => (StatePlacement::Optimizer, 0.0),
            Placement::OptimizerAndParams => (StatePlacement::OptimizerAndParams, 0.0),
        }
    }

    /// The placement a status records (`ratio`: its share, for a partial placement).
    pub fn from_state(state: offload_api::v1alpha1::StatePlacement, ratio: f64) -> Placement {
        use offload_api::v1alpha1::StatePlacement;
        match state {
            StatePlacement::NoOffload => Placement::NoOffload,
            StatePlacement::PartialOptimizer => Placement::PartialOptimizer(ratio),
            StatePlacement::Optimizer => Placement::Optimizer,
            StatePlacement::OptimizerAndParams => Placement::OptimizerAndParams,
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::NoOffload => f.write_str("no offload"),
            Placement::PartialOptimizer(r) => {
                write!(f, "{:.0}% of the optimizer state offloaded", r * 100.0)
            }
            Placement::Optimizer => f.write_str("the optimizer state offloaded"),
            Placement::OptimizerAndParams => {
                f.write_str("optimizer state and parameters offloaded")
            }
        }
    }
}

/// How the framework shards training state over the data-parallel ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharding {
    /// DeepSpeed ZeRO at this stage (0 to 3).
    Zero(u8),
    /// PyTorch FSDP, fully sharded.
    Fsdp,
    /// Unknown to the operator (`Generic`): nothing assumed sharded.
    Unsharded,
}

impl fmt::Display for Sharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Sharding::Zero(s) => write!(f, "ZeRO-{s}"),
            Sharding::Fsdp => f.write_str("FSDP"),
            Sharding::Unsharded => f.write_str("no sharding"),
        }
    }
}

/// The job as the memory model sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct JobMemory {
    /// Total trainable parameters.
    pub parameters: f64,
    /// The model's shape (derived from the parameter count when the job gives none).
    pub shape: ModelShape,
    /// Tokens per micro-batch on one GPU; `None`: a margin of GPU memory is kept instead.
    pub tokens: Option<f64>,
    /// Activation checkpointing.
    pub checkpointing: bool,
    /// Data-parallel ranks (replicas × GPUs per pod), one per GPU.
    pub ranks: u64,
    /// GPUs (ranks) per pod.
    pub gpus_per_pod: u64,
    /// Pods.
    pub pods: u64,
    /// How state is sharded.
    pub sharding: Sharding,
    /// Bytes of a parameter and a gradient: 2 in mixed 16-bit precision, 4 in fp32.
    pub value_bytes: f64,
    /// The pod's memory limit, when every container has one.
    pub pod_memory_limit: Option<u64>,
    /// Where that limit is a LimitRange's of the job's namespace: which and how, in words.
    pub pod_memory_limit_source: Option<String>,
    /// `zero_optimization.sub_group_size` of the user's config; without one, DeepSpeed's
    /// default, or with a partial ratio the one the operator writes
    /// ([`operator_sub_group_size`]).
    pub sub_group_size: Option<f64>,
    /// What the job's own failures taught: every GPU and host figure is multiplied by these
    /// (1 without evidence).
    pub corrections: Corrections,
    /// The job's shape as what was learned is keyed by ([`JobMemory::shape_key`]).
    pub shape_key: String,
    /// What runs of this shape taught, per node class (none: the model's figures stand).
    pub learned: std::collections::BTreeMap<
        offload_api::v1alpha1::NodeClass,
        super::learned::LearnedFactors,
    >,
    /// Sized from observed runs of the job (it gives no hints), not from hints.
    pub inferred: bool,
    /// What earlier runs of the shape ran and how they ended, per node class: what the
    /// decision takes as proof or bound ([`super::proven`]).
    pub ran: std::collections::BTreeMap<
        offload_api::v1alpha1::NodeClass,
        Vec<super::learned::RanRecord>,
    >,
}

/// Multipliers on the estimates, from configurations of the job that ran out of memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Corrections {
    /// On every GPU figure.
    pub gpu: f64,
    /// On every host figure.
    pub host: f64,
}

impl Default for Corrections {
    fn default() -> Self {
        Corrections {
            gpu: 1.0,
            host: 1.0,
        }
    }
}

/// Margin over what a failed configuration had when its estimate is raised past it (the VPA
/// bumps host memory by 20 % after an OOM; a GPU figure is known more closely).
pub const GPU_FAILURE_MARGIN: f64 = 1.05;
/// Host: at least this much more after an out-of-memory kill (as the VPA's bump).
pub const HOST_FAILURE_MARGIN: f64 = 1.2;
/// Host: and at least this many bytes more (the VPA's 100 MiB).
pub const HOST_FAILURE_MIN_BYTES: f64 = 100.0 * 1024.0 * 1024.0;

impl Corrections {
    /// From the failures, oldest first: each failed configuration needed more than it had, so
    /// the figures are raised until its estimate is past that (by the margin). Each recorded
    /// estimate was made with the corrections of the failures before it, so they compound.
    ///
    /// A GPU failure with the allocator's figures is raised to what it needed (allocated plus
    /// asked) by the margin; without them, to the GPU it had. A host failure is raised as the
    /// VPA raises a request after an OOM kill, `max(+20 %, +100 MiB)` over what the pod had
    /// (its limit, else its estimate), and never past the node's share it had (the bump that
    /// would not fit anywhere teaches nothing).
    pub fn from_failures(failures: &[offload_api::v1alpha1::MemoryFailure]) -> Corrections {
        use offload_api::v1alpha1::MemoryKind;
        let mut c = Corrections::default();
        #[allow(clippy::cast_precision_loss)]
        let bytes = |v: Option<i64>| v.filter(|b| *b > 0).map(|b| b as f64);
        for f in failures {
            // Not sized when it failed (a job without hints on its offload ladder): there is
            // no estimate to raise; the ladder, or the size its runs show, moves on.
            let Some(estimate) = bytes(f.estimate_bytes) else {
                continue;
            };
            let budget = bytes(f.budget_bytes);
            let factor = match f.kind {
                MemoryKind::Gpu => {
                    let needed = bytes(f.needed_bytes).or(budget).unwrap_or(estimate);
                    (needed / estimate).max(1.0) * GPU_FAILURE_MARGIN
                }
                MemoryKind::Host => {
                    let limit = bytes(f.limit_bytes);
                    let had = limit.unwrap_or(estimate);
                    let mut target = (had * HOST_FAILURE_MARGIN).max(had + HOST_FAILURE_MIN_BYTES);
                    if limit.is_none()
                        && let Some(share) = budget
                    {
                        target = target.min(share.max(estimate));
                    }
                    (target / estimate).max(1.0)
                }
            };
            match f.kind {
                MemoryKind::Gpu => c.gpu = (c.gpu * factor).min(1e3),
                MemoryKind::Host => c.host = (c.host * factor).min(1e3),
            }
        }
        c
    }
}

/// What one node class offers a job: its smallest GPU, and the least host memory one of the
/// job's pods can have on any of its nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassMemory {
    /// Memory of the smallest GPU of the class's nodes.
    pub gpu_bytes: u64,
    /// The node with that GPU.
    pub gpu_node: String,
    /// Host memory one pod can have: the node's allocatable memory shared by as many of the
    /// job's pods as the node can hold, on the node where that is least; `None` when no node
    /// states allocatable memory (then host memory is not checked).
    pub host_per_pod: Option<u64>,
    /// Where that share is, for reasons: `h200-0: 125.0 GiB allocatable for 1 pod`.
    pub host_node: String,
    /// The class, where the figures are a class's (what was learned is per class).
    pub class: Option<offload_api::v1alpha1::NodeClass>,
}

impl ClassMemory {
    /// GPU memory the estimate may use: the GPU less the CUDA context and the allocator's
    /// fragmentation.
    pub fn gpu_budget(&self) -> f64 {
        let total = as_f64(self.gpu_bytes);
        (total - CONTEXT_RESERVE_BYTES - FRAGMENTATION_SHARE * total).max(0.0)
    }
}

/// What a placement needs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimate {
    /// The placement.
    pub placement: Placement,
    /// Bytes per GPU.
    pub gpu: f64,
    /// Bytes of host memory per pod.
    pub host_per_pod: f64,
    /// Bytes per GPU that are activations (for advice), as the model counts them.
    pub activations: f64,
    /// Bytes per GPU the estimate has without any activations: the part the model counts
    /// exactly (what was learned never changes it).
    pub structural: f64,
    /// What was learned for this shape on the class, in effect in these figures.
    pub learned: super::learned::LearnedFactors,
    /// The share of the optimizer state DeepSpeed really puts on the host (for a partial ratio:
    /// its whole sub-groups), where known.
    pub offloaded_share: Option<f64>,
}

/// Whether an estimate fits a class, and the figures that say so.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    /// The GPUs hold it.
    pub gpu: bool,
    /// The host memory holds it (within the pod's limit and its share of the node); `true`
    /// when neither is known (see [`Fit::host_checked`]).
    pub host: bool,
    /// Whether host memory was checked at all.
    pub host_checked: bool,
}

impl Fit {
    /// Both fit.
    pub fn ok(self) -> bool {
        self.gpu && self.host
    }
}

fn as_f64(n: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let v = n as f64;
    v
}

/// Bytes as GiB with one decimal.
pub fn gib(bytes: f64) -> String {
    format!("{:.1} GiB", bytes / f64::from(1u32 << 30))
}

/// Rounds a figure up into bytes (saturating; figures are finite and non-negative).
pub fn bytes(value: f64) -> u64 {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let b = value.max(0.0).ceil() as u64;
    b
}

/// How a partial ratio maps to the share DeepSpeed really offloads.
#[derive(Clone, Debug)]
pub enum PartialShares {
    /// The model's sub-groups, walked: the share of each ratio is exact.
    Groups(Vec<f64>),
    /// Only a bound: the share lands within this much of the ratio.
    Within(f64),
}

impl PartialShares {
    /// The share on the GPU side and the share on the host side to check for `ratio`.
    pub fn bounds(&self, ratio: f64) -> (f64, f64) {
        match self {
            PartialShares::Groups(g) => {
                let s = shape::offloaded_share(g, ratio);
                (s, s)
            }
            PartialShares::Within(g) => ((ratio - g).max(0.0), (ratio + g).min(1.0)),
        }
    }
}

impl JobMemory {
    fn shard(&self) -> f64 {
        self.parameters / as_f64(self.ranks.max(1))
    }

    fn mixed(&self) -> bool {
        self.value_bytes < 4.0
    }

    /// Optimizer bytes per parameter: fp32 master weights and two moments in mixed precision,
    /// the two moments in fp32.
    fn optimizer_bytes(&self) -> f64 {
        if self.mixed() { 12.0 } else { 8.0 }
    }

    /// The job with `tokens` per micro-batch instead (for advice).
    pub fn with_tokens(&self, tokens: f64) -> JobMemory {
        JobMemory {
            tokens: Some(tokens),
            ..self.clone()
        }
    }

    /// Activation bytes per GPU at the step's peak.
    pub fn activation_bytes(&self, class: &ClassMemory) -> f64 {
        match self.tokens {
            Some(tokens) => {
                tokens
                    * self.shape.activation_peak_per_token(self.checkpointing)
                    * (self.value_bytes / 2.0)
            }
            None => as_f64(class.gpu_bytes) * ACTIVATION_MARGIN_SHARE,
        }
    }

    /// The sub-group size in effect: the user's, else DeepSpeed's default, or for a partial
    /// ratio the operator's.
    fn group_size(&self, partial: bool) -> f64 {
        self.sub_group_size.unwrap_or_else(|| {
            if partial {
                as_f64(operator_sub_group_size(self.parameters, self.ranks))
            } else {
                DEFAULT_SUB_GROUP
            }
        })
    }

    /// How partial ratios map to the offloaded share for this job: walked over the model's
    /// tensors when its shape is known, else bounded by a sub-group and the largest tensor.
    pub fn partial_shares(&self) -> PartialShares {
        if let Some(groups) = self.walked_groups(true) {
            return PartialShares::Groups(groups);
        }
        let shard = self.shard().max(1.0);
        PartialShares::Within((self.group_bound(true) / shard).min(1.0))
    }

    /// DeepSpeed's optimizer sub-groups of one rank's partition (parameters in each), walked
    /// over the model's tensors when its shape is known; `partial`: with the sub-group size a
    /// partial ratio is written with.
    fn walked_groups(&self, partial: bool) -> Option<Vec<f64>> {
        if !self.shape.known {
            return None;
        }
        let ranks = as_f64(self.ranks.max(1));
        let tensors = self.shape.tensors(MAX_TENSORS)?;
        let partitions: Vec<f64> = tensors.iter().map(|t| (t / ranks).ceil()).collect();
        Some(shape::sub_groups(&partitions, self.group_size(partial)))
    }

    /// The most parameters one sub-group can hold: it closes at the first tensor that takes it
    /// to the sub-group size.
    fn group_bound(&self, partial: bool) -> f64 {
        let largest = self.shape.largest_tensor() / as_f64(self.ranks.max(1));
        (self.group_size(partial) + largest).min(self.shard().max(1.0))
    }

    /// The largest optimizer sub-group without offload (what the step converts to fp32 at once).
    fn largest_group(&self) -> f64 {
        let ranks = as_f64(self.ranks.max(1));
        (self.group_size(false) + self.shape.largest_tensor() / ranks).min(self.shard())
    }

    /// The gradient-bucket flushes of one backward with the optimizer state offloaded, as
    /// DeepSpeed 0.19.8's ZeRO-3 runs them (`stage3.py`), over the model's gradients in the
    /// order the backward completes them. A bucket is reduced when the next gradient would take
    /// it past `reduce_bucket_size` (5·10⁸ elements), and once more at the end. While it is,
    /// the GPU holds on top of the activations still kept:
    /// - the reduce-scatter's flat copy of the bucket (a tensor larger than the bucket is
    ///   reduced alone, from its own gradient, of the same size): 2 bytes per element;
    /// - for its largest tensor (one at a time, the largest is the most), the rank's gradient
    ///   partition copied back from the pinned host buffer (2 bytes per element), then the
    ///   larger of the gradient norm's fp64 chunks (8 bytes per element, 2.5·10⁸ at a time)
    ///   and the fp32 copy for the optimizer (4 bytes per element);
    /// - the gradient that arrived (2 bytes per element), a tied embedding's gradient until
    ///   the backward completes it, and the activations' gradients in flight (4 bytes per unit
    ///   of width per token).
    ///
    /// Measured on the H200 (`docs/benchmarks/memory-h200.md`): Qwen2.5-7B's 545M-element
    /// output head makes 8 bytes per element of it; the bench's 3.8B GPT decoder 2.0 GB.
    fn flushes(&self, class: &ClassMemory) -> Vec<Flush> {
        let b = self.value_bytes;
        let ranks = as_f64(self.ranks.max(1));
        let half = b / 2.0;
        let copies = |largest: f64| {
            let part = largest / ranks;
            b * part + (8.0 * part.min(NORM_CHUNK_ELEMENTS)).max(4.0 * part)
        };
        let tokens = self.tokens;
        let saved = self.shape.saved_per_token(self.checkpointing);
        // Activations still kept when `freed` bytes per token are gone (the margin whole when
        // the step's tokens are not known).
        let alive = |freed: f64| match tokens {
            Some(t) => t * (saved - freed).max(0.0) * half,
            None => self.activation_bytes(class),
        };
        let in_flight = tokens.map_or(0.0, |t| 4.0 * self.shape.hidden * t * half);
        let tied = if self.shape.tied {
            b * self.shape.vocab * self.shape.hidden
        } else {
            0.0
        };
        let Some(gradients) = self
            .shape
            .backward_gradients(self.checkpointing, MAX_TENSORS)
        else {
            let largest = self.shape.largest_tensor();
            return vec![Flush {
                alive: alive(0.0),
                transient: b * REDUCE_BUCKET_ELEMENTS.max(largest)
                    + copies(largest)
                    + b * largest
                    + tied
                    + in_flight,
            }];
        };
        let mut out = Vec::new();
        let (mut elements, mut largest) = (0.0_f64, 0.0_f64);
        // The input embedding's gradient (the tied matrix's, whole only from there on).
        let embedding = gradients
            .len()
            .saturating_sub(1 + usize::from(self.shape.positions > 0.0));
        for (i, g) in gradients.iter().enumerate() {
            if elements > 0.0 && elements + g.numel > REDUCE_BUCKET_ELEMENTS {
                out.push(Flush {
                    alive: alive(g.freed),
                    transient: b * elements
                        + copies(largest)
                        + b * g.numel
                        + if i < embedding { tied } else { 0.0 }
                        + in_flight,
                });
                (elements, largest) = (0.0, 0.0);
            }
            elements += g.numel;
            largest = largest.max(g.numel);
        }
        if elements > 0.0 {
            let freed = gradients.last().map_or(0.0, |g| g.freed);
            out.push(Flush {
                alive: alive(freed),
                transient: b * elements + copies(largest) + in_flight,
            });
        }
        out
    }

    /// The bytes `placement` needs on each GPU and on the host, with `share` of the optimizer
    /// state on the host for a partial placement (the share DeepSpeed really offloads).
    fn estimate_with(
        &self,
        placement: Placement,
        share: f64,
        groups: Option<&[f64]>,
        flushes: &[Flush],
        class: &ClassMemory,
    ) -> Estimate {
        let p = self.parameters;
        let s = self.shard();
        let b = self.value_bytes;
        let o = self.optimizer_bytes();
        let act = self.activation_bytes(class) * self.shape.standing.factor();
        let c = BUCKET_BYTES + FRAMEWORK_BYTES;
        let live = b * p.min(MAX_LIVE_PARAMETERS);
        // ZeRO-3 over several ranks gathers each layer's parameters whole while it runs (not
        // measured: one GPU gathers nothing it does not hold).
        let gathered = if self.ranks > 1 {
            2.0 * b * self.shape.largest_layer()
        } else {
            0.0
        };
        let r = match placement {
            Placement::NoOffload => 0.0,
            Placement::PartialOptimizer(_) => share.clamp(0.0, 1.0),
            Placement::Optimizer | Placement::OptimizerAndParams => 1.0,
        };
        let kept = 1.0 - r;
        // fp32 gradients the optimizer needs in mixed precision.
        let f = if self.mixed() { 4.0 } else { 0.0 };
        let learned = self.learned_on(class);
        let gpu_with = |factor: f64| {
            let act = act * factor;
            // With optimizer state offloaded the peak is the loss's backward or a gradient
            // flush, whichever is higher.
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
                    b * s + (o + 4.0) * kept * s + c + gathered + offloaded
                }
                (Sharding::Zero(3), Placement::Optimizer) => b * s + c + gathered + offloaded,
                (Sharding::Zero(3), Placement::OptimizerAndParams) => c + offloaded + live,
                (Sharding::Fsdp, Placement::OptimizerAndParams) => {
                    (act + c + live) * UNMEASURED_SAFETY
                }
                (Sharding::Fsdp, _) => ((b + b + o + f) * s + act + c + live) * UNMEASURED_SAFETY,
                (Sharding::Zero(2), _) => {
                    (b * p + (b + o) * kept * s + act.max(f * kept * s) + 2.0 * c)
                        * UNMEASURED_SAFETY
                }
                (Sharding::Zero(1), _) => {
                    ((b + b) * p + o * kept * s + act.max(f * kept * s) + c) * UNMEASURED_SAFETY
                }
                (Sharding::Zero(_), _) => ((b + b + o + f) * p + act + c) * UNMEASURED_SAFETY,
                (Sharding::Unsharded, _) => {
                    ((b + b) * p + o * kept * p + act.max(f * kept * p) + c) * UNMEASURED_SAFETY
                }
            }
        };
        Estimate {
            placement,
            gpu: gpu_with(learned.activations) * self.corrections.gpu,
            host_per_pod: self.host_per_rank(placement, r, groups)
                * as_f64(self.gpus_per_pod.max(1))
                * self.corrections.host
                * learned.host,
            activations: act,
            structural: gpu_with(0.0) * self.corrections.gpu,
            learned,
            offloaded_share: matches!(placement, Placement::PartialOptimizer(_)).then_some(r),
        }
    }

    /// What was learned for this job's shape on `class`'s node class.
    pub fn learned_on(&self, class: &ClassMemory) -> super::learned::LearnedFactors {
        class
            .class
            .and_then(|c| self.learned.get(&c).copied())
            .unwrap_or_default()
    }

    /// Host memory of one rank's process with `r` of its optimizer state offloaded; `groups`:
    /// DeepSpeed's sub-groups of the rank's partition where they were walked.
    fn host_per_rank(&self, placement: Placement, r: f64, groups: Option<&[f64]>) -> f64 {
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
        // Without ZeRO-3's partitioned construction each rank builds the whole model on the
        // host first (fp32); DeepSpeed's estimators for the offloaded state, 1.125 × for whole
        // state (large pinned sub-groups), not measured.
        let base = HOST_BASE_BYTES + (b * s).max(4.0 * p);
        let state = if self.sharding == Sharding::Unsharded {
            p
        } else {
            s
        };
        let o = self.optimizer_bytes() + if self.mixed() { 4.0 } else { 0.0 };
        base + match placement {
            Placement::NoOffload => 0.0,
            Placement::PartialOptimizer(_) => (3.0 + o * r) * state,
            Placement::Optimizer => (3.0 + 1.125 * o) * state,
            Placement::OptimizerAndParams => (3.0 + 1.125 * o + 2.0 * b) * state,
        }
    }

    /// The sub-groups whose optimizer state DeepSpeed puts on the host for `ratio` (the last
    /// `n − ⌊(1 − ratio)·n⌋`), or where they were not walked a bound for `share` of the shard.
    fn groups_on_host<'a>(&self, groups: Option<&'a [f64]>, ratio: f64, share: f64) -> OnHost<'a> {
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
    fn zero3_optimizer_on_host(&self, on_host: OnHost<'_>) -> f64 {
        let s = self.shard();
        let b = self.value_bytes;
        let flat = pinned_block(b * s);
        let (groups, offloaded, largest) = match on_host {
            OnHost::Walked { on_gpu, on_host } => {
                let blocks = pinned_gradient_blocks(on_gpu, on_host);
                let offloaded: f64 = on_host.iter().sum();
                let largest = on_host.iter().copied().fold(0.0, f64::max);
                (blocks, offloaded, largest)
            }
            OnHost::Bound { share, group } => {
                // A block is less than twice what it holds; one block of the sub-groups on the
                // GPU stays cached.
                let offloaded = share * s;
                let cached = if share < 1.0 { 2.0 * 4.0 * group } else { 0.0 };
                (
                    2.0 * 4.0 * offloaded + cached,
                    offloaded,
                    group.min(offloaded),
                )
            }
        };
        let start = b * s;
        let first_step = STEP_HOST_BYTES + 8.0 * offloaded + b * largest;
        HOST_BASE_BYTES + flat + groups + 4.0 * offloaded + start.max(first_step)
    }

    /// The bytes `placement` needs on each GPU and on the host (a partial ratio taken as the
    /// share offloaded; [`JobMemory::estimate_checked`] accounts for DeepSpeed's sub-groups).
    pub fn estimate(&self, placement: Placement, class: &ClassMemory) -> Estimate {
        let share = match placement {
            Placement::PartialOptimizer(r) => r,
            _ => 0.0,
        };
        let groups = match placement {
            Placement::Optimizer if self.sharding == Sharding::Zero(3) => self.walked_groups(false),
            _ => None,
        };
        let flushes = self.flushes_for(placement, class);
        self.estimate_with(placement, share, groups.as_deref(), &flushes, class)
    }

    /// [`JobMemory::flushes`] where `placement` offloads under ZeRO-3 (none otherwise).
    fn flushes_for(&self, placement: Placement, class: &ClassMemory) -> Vec<Flush> {
        if self.sharding == Sharding::Zero(3) && placement != Placement::NoOffload {
            self.flushes(class)
        } else {
            Vec::new()
        }
    }

    /// Whether `estimate` fits `class`.
    pub fn fits(&self, estimate: &Estimate, class: &ClassMemory) -> Fit {
        let budget = class
            .host_per_pod
            .into_iter()
            .chain(self.pod_memory_limit)
            .min();
        Fit {
            gpu: estimate.gpu <= self.gpu_budget(class),
            host: budget.is_none_or(|b| estimate.host_per_pod <= as_f64(b)),
            host_checked: budget.is_some(),
        }
    }

    /// The smallest partial ratio (in hundredths, at least `floor`) whose state fits. `None`
    /// when no ratio below 1 fits.
    pub fn smallest_ratio(&self, class: &ClassMemory, floor: f64) -> Option<(f64, Estimate)> {
        let shares = self.partial_shares();
        let flushes = self.flushes_for(Placement::PartialOptimizer(0.5), class);
        (1..100)
            .map(|h| f64::from(h) / 100.0)
            .filter(|r| *r >= floor)
            .find_map(|r| {
                let (est, fit) = self.partial_checked(r, &shares, &flushes, class);
                fit.ok().then_some((r, est))
            })
    }

    fn partial_checked(
        &self,
        ratio: f64,
        shares: &PartialShares,
        flushes: &[Flush],
        class: &ClassMemory,
    ) -> (Estimate, Fit) {
        let placement = Placement::PartialOptimizer(ratio);
        let (gpu_share, host_share) = shares.bounds(ratio);
        let groups = match shares {
            PartialShares::Groups(g) => Some(g.as_slice()),
            PartialShares::Within(_) => None,
        };
        let on_gpu = self.estimate_with(placement, gpu_share, groups, flushes, class);
        let on_host = self.estimate_with(placement, host_share, groups, flushes, class);
        let est = Estimate {
            host_per_pod: on_host.host_per_pod,
            offloaded_share: matches!(shares, PartialShares::Groups(_)).then_some(gpu_share),
            ..on_gpu
        };
        (est, self.fits(&est, class))
    }

    /// The estimate of a fixed `placement` with DeepSpeed's sub-groups accounted for (as
    /// [`JobMemory::smallest_ratio`] checks it).
    pub fn estimate_checked(&self, placement: Placement, class: &ClassMemory) -> (Estimate, Fit) {
        match placement {
            Placement::PartialOptimizer(r) => self.partial_checked(
                r,
                &self.partial_shares(),
                &self.flushes_for(placement, class),
                class,
            ),
            _ => {
                let est = self.estimate(placement, class);
                let fit = self.fits(&est, class);
                (est, fit)
            }
        }
    }

    /// The job with `ranks` data-parallel ranks instead (for advice: would more GPUs do?).
    pub fn with_ranks(&self, ranks: u64) -> JobMemory {
        let pods = ranks.div_ceil(self.gpus_per_pod.max(1));
        JobMemory {
            ranks,
            pods,
            ..self.clone()
        }
    }

    /// GPU memory this job's estimates may use on `class`: the class's budget, less what the
    /// allocator needs to place the step's largest activation where that is more than the
    /// fragmentation share ([`LARGE_ALLOCATION_FRAGMENTATION`]).
    pub fn gpu_budget(&self, class: &ClassMemory) -> f64 {
        let total = as_f64(class.gpu_bytes);
        let largest = self.largest_activation();
        let fragmentation =
            (FRAGMENTATION_SHARE * total).max(LARGE_ALLOCATION_FRAGMENTATION * largest);
        (total - CONTEXT_RESERVE_BYTES - fragmentation).max(0.0)
    }

    /// Bytes of the step's largest single activation: the loss's fp32 logits of a micro-batch
    /// (0 when its tokens are not known).
    pub fn largest_activation(&self) -> f64 {
        self.tokens.map_or(0.0, |t| 4.0 * self.shape.vocab * t)
    }

    /// GPU memory left under what the GPU can hold with `est` (negative: over).
    pub fn headroom(&self, est: &Estimate, class: &ClassMemory) -> f64 {
        self.gpu_budget(class) - est.gpu
    }

    /// One sentence with the figures of `est` against `class`.
    pub fn describe(&self, est: &Estimate, class: &ClassMemory) -> String {
        let limit = self
            .pod_memory_limit
            .map(|l| match &self.pod_memory_limit_source {
                Some(from) => format!(" (pod limit {}: {from})", gib(as_f64(l))),
                None => format!(" (pod limit {})", gib(as_f64(l))),
            })
            .unwrap_or_default();
        let host = match (class.host_per_pod, self.pod_memory_limit) {
            (Some(share), _) => format!(
                "{} of host memory per pod of {} ({}){limit}",
                gib(est.host_per_pod),
                gib(as_f64(share)),
                class.host_node
            ),
            (None, Some(_)) => format!(
                "{} of host memory per pod{limit} (the nodes state no allocatable memory)",
                gib(est.host_per_pod)
            ),
            (None, None) => format!(
                "{} of host memory per pod, not checked: the nodes state no allocatable memory and the pod sets no limit",
                gib(est.host_per_pod)
            ),
        };
        let left = self.headroom(est, class);
        let total = as_f64(class.gpu_bytes);
        let room = if left >= 0.0 {
            format!(
                "{} headroom ({:.1}% of the GPU)",
                gib(left),
                100.0 * left / total.max(1.0)
            )
        } else {
            format!("{} over", gib(-left))
        };
        let share = est
            .offloaded_share
            .filter(|s| matches!(est.placement, Placement::PartialOptimizer(r) if (r - s).abs() > 0.005))
            .map(|s| format!(" (DeepSpeed's sub-groups put {:.0}% on the host)", s * 100.0))
            .unwrap_or_default();
        let learned = match class.class {
            Some(c) if !est.learned.is_neutral() => {
                let mut plain = self.clone();
                plain.learned.clear();
                let alone = plain.estimate_checked(est.placement, class).0.gpu;
                let budget = self.gpu_budget(class);
                let tried = if alone > budget && est.gpu <= budget {
                    ": without it the model would not have tried this placement"
                } else {
                    ""
                };
                format!(
                    " ({}; the model alone counts {} per GPU{tried})",
                    est.learned.describe(c),
                    gib(alone)
                )
            }
            _ => String::new(),
        };
        let learned = if self.inferred {
            format!(
                "{learned} (the job gives no model hints: sized as {:.2}B parameters from the peaks of its observed runs)",
                self.parameters / 1e9
            )
        } else {
            learned
        };
        let standing = self
            .shape
            .standing
            .said()
            .map_or(String::new(), |s| format!("; {s}"));
        format!(
            "needs about {} of the {} each GPU can hold on {}, {room}{share}, and {host}{learned}{standing}",
            gib(est.gpu),
            gib(self.gpu_budget(class)),
            class.gpu_node
        )
    }

    /// What would widen the headroom of `est` when it is close to the limit; `None` otherwise.
    pub fn close_to_limit(&self, est: &Estimate, class: &ClassMemory) -> Option<String> {
        let left = self.headroom(est, class);
        if left < 0.0 || left >= CLOSE_TO_LIMIT_SHARE * as_f64(class.gpu_bytes) {
            return None;
        }
        let mut ideas = Vec::new();
        if !self.checkpointing && self.tokens.is_some() {
            ideas.push(format!(
                "activation checkpointing (activations {} now)",
                gib(est.activations)
            ));
        }
        if self.tokens.is_some_and(|t| t > 1.0) {
            ideas.push("a smaller micro-batch".to_string());
        }
        ideas.push(format!(
            "a second GPU ({} in all now) to shard the state over",
            self.ranks
        ));
        Some(format!(
            "close to the limit ({} left): {} would widen the headroom",
            gib(left),
            ideas.join(", ")
        ))
    }
}

/// The memory a GPU must have for an estimate of `estimate` bytes to fit it, with `largest`
/// bytes of the step's largest activation: the inverse of [`JobMemory::gpu_budget`], rounded up
/// to MiB (what a DRA claim's selector asks for).
pub fn gpu_memory_for(estimate: f64, largest: f64) -> u64 {
    let needed = estimate.max(0.0) + CONTEXT_RESERVE_BYTES;
    let total = (needed / (1.0 - FRAGMENTATION_SHARE))
        .max(needed + LARGE_ALLOCATION_FRAGMENTATION * largest.max(0.0));
    bytes(total).div_ceil(1 << 20).saturating_mul(1 << 20)
}

/// The sub-group size the operator writes with a partial ratio where the user's config has
/// none: about a hundredth of the rank's shard (so the offloaded share lands within a few
/// hundredths of the ratio), between 10⁷ and 10⁹ parameters.
pub fn operator_sub_group_size(parameters: f64, ranks: u64) -> u64 {
    let per_rank = parameters / as_f64(ranks.max(1));
    let group = (per_rank / 100.0 / 1e6).ceil() * 1e6;
    bytes(group.clamp(1e7, 1e9))
}

#[cfg(test)]
mod tests;
