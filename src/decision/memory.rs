//! The memory model of a training job: for each way of placing its training state — nothing
//! offloaded, part of the optimizer state on the host, all of it, optimizer state and
//! parameters — the bytes each GPU and each pod's host memory need, and whether a node class
//! holds them.
//!
//! It starts from DeepSpeed's own estimators (`estimate_zero2/3_model_states_mem_needs`: 16-bit
//! parameters and gradients, fp32 master weights, Adam moments and fp32 gradients, sharded by
//! the ZeRO stage over the data-parallel ranks) and adds what they leave out, calibrated on an
//! H200 with DeepSpeed 0.19.8 (`docs/benchmarks/memory-h200.md`):
//! - activations: 36 bytes per token per unit of width per layer in 16-bit (34 saved tensors
//!   of a transformer block with fused attention, and a little more), plus the logits
//!   (10 bytes per token per vocabulary entry); with activation checkpointing only each
//!   layer's input is kept, and one layer's activations are recomputed at a time;
//! - at the optimizer step, the fp32 gradients of the optimizer state still on the GPU;
//! - ZeRO-3's gathered parameters (at most `stage3_max_live_parameters`, 10⁹, in 16-bit) and
//!   its reduce bucket (10⁹ bytes);
//! - on the host, per process: a base of 1.5 GB and 2 bytes per parameter of the rank's shard;
//!   with any optimizer state offloaded, 3 bytes per parameter of the shard (pinned staging,
//!   the CPU optimizer's working set) and the offloaded state — 16 bytes per offloaded
//!   parameter in part, 18 when all of it (pinned buffers are rounded up to powers of two by
//!   PyTorch's host allocator, and whole state comes in DeepSpeed's large default sub-groups),
//!   plus the 16-bit parameters twice when they are offloaded too;
//! - 5 % on top of the GPU figure, and 7 % of each GPU kept free for the CUDA context, NCCL
//!   and the allocator's fragmentation.
//!
//! Every figure is in bytes as `f64` (products of counts that could overflow an integer never
//! do in floating point); results are rounded up into `u64`, saturating.

use std::fmt;

/// Bytes of GPU memory kept free of the estimate: the CUDA context, NCCL's buffers and the
/// caching allocator's fragmentation (measured: a run at 132.5 GiB allocated held 137.9 GiB of
/// an H200's 139.8).
pub const GPU_USABLE_SHARE: f64 = 0.93;
/// Safety on top of the GPU estimate.
pub const GPU_SAFETY: f64 = 1.05;
/// Share of GPU memory kept for activations when the step's tokens are not known.
pub const ACTIVATION_MARGIN_SHARE: f64 = 0.10;
/// Vocabulary assumed when the hints give none (current LLMs: 32k to 256k).
pub const DEFAULT_VOCAB: u64 = 128_000;
/// Partial offload of up to this share runs faster than offloading optimizer state and
/// parameters whole (measured crossover 0.43 at 1.1B parameters, 0.53 at 3.8B on an H200).
pub const PARTIAL_BEFORE_PARAMS_UP_TO: f64 = 0.45;

/// Saved activation bytes per token per unit of width per layer, in 16-bit.
const ACTIVATION_BYTES: f64 = 36.0;
/// Logit bytes per token per vocabulary entry (16-bit logits, their fp32 copy and gradient).
const LOGIT_BYTES: f64 = 10.0;
/// ZeRO-3's reduce bucket (`reduce_bucket_size` 5·10⁸ in 16-bit).
const BUCKET_BYTES: f64 = 1e9;
/// `stage3_max_live_parameters`: gathered parameters alive at once.
const MAX_LIVE_PARAMETERS: f64 = 1e9;
/// Parameters per optimizer sub-group DeepSpeed converts to fp32 at once by default
/// (`sub_group_size` 10⁹, which a group exceeds by up to one parameter tensor).
const DEFAULT_SUB_GROUP: f64 = 1.1e9;
/// Host memory of a training process before any offloaded state (CUDA, NCCL, the framework).
const HOST_BASE_BYTES: f64 = 1.5e9;
/// Host bytes per parameter of the shard whenever optimizer state is offloaded.
const HOST_OFFLOAD_OVERHEAD: f64 = 3.0;
/// Host bytes per offloaded byte of wholly offloaded state (against 1 for a partial share).
const HOST_WHOLE_FACTOR: f64 = 1.125;

/// How a job's training state is placed between GPU and host memory.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Placement {
    /// Everything on the GPUs.
    NoOffload,
    /// This share of the optimizer state (with its fp32 gradients) on the host.
    PartialOptimizer(f64),
    /// All optimizer state on the host.
    Optimizer,
    /// Optimizer state and parameters on the host (ZeRO-3 `offload_param`, FSDP CPU offload).
    OptimizerAndParams,
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

/// What the activations are sized from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activations {
    /// The step's shape.
    Shape {
        /// Tokens per micro-batch on one GPU.
        tokens: f64,
        /// Model width.
        hidden: f64,
        /// Layers.
        layers: f64,
        /// Vocabulary size.
        vocab: f64,
        /// Activation checkpointing.
        checkpointing: bool,
    },
    /// Unknown: [`ACTIVATION_MARGIN_SHARE`] of the GPU.
    Margin,
}

/// The job as the memory model sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct JobMemory {
    /// Total trainable parameters.
    pub parameters: f64,
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
    /// What the activations are sized from.
    pub activations: Activations,
    /// The pod's memory limit, when every container has one.
    pub pod_memory_limit: Option<u64>,
    /// `zero_optimization.sub_group_size` of the user's config; without one, DeepSpeed's
    /// default, or with a partial ratio the one the operator writes
    /// ([`operator_sub_group_size`]).
    pub sub_group_size: Option<f64>,
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
    /// states allocatable memory.
    pub host_per_pod: Option<u64>,
    /// Where that share is, for reasons: `h200-0: 125.0 GiB allocatable for 1 pod`.
    pub host_node: String,
}

impl ClassMemory {
    /// GPU memory the estimate may use.
    pub fn gpu_budget(&self) -> f64 {
        as_f64(self.gpu_bytes) * GPU_USABLE_SHARE
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
    /// Bytes per GPU that are activations (for advice).
    pub activations: f64,
}

/// Whether an estimate fits a class, and the figures that say so.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    /// The GPUs hold it.
    pub gpu: bool,
    /// The host memory holds it (within the pod's limit and its share of the node); `true`
    /// when the nodes state no allocatable memory.
    pub host: bool,
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

    /// fp32 gradient bytes per parameter the optimizer step converts (mixed precision only).
    fn fp32_grad_bytes(&self) -> f64 {
        if self.mixed() { 4.0 } else { 0.0 }
    }

    /// Activation bytes per GPU.
    pub fn activation_bytes(&self, class: &ClassMemory) -> f64 {
        let scale = self.value_bytes / 2.0;
        match self.activations {
            Activations::Shape {
                tokens,
                hidden,
                layers,
                vocab,
                checkpointing,
            } => {
                let per_layer = tokens * hidden * scale;
                let blocks = if checkpointing {
                    2.0 * per_layer * layers + ACTIVATION_BYTES * per_layer
                } else {
                    ACTIVATION_BYTES * per_layer * layers
                };
                blocks + LOGIT_BYTES * tokens * vocab
            }
            Activations::Margin => as_f64(class.gpu_bytes) * ACTIVATION_MARGIN_SHARE,
        }
    }

    /// Where partial offload's share can land: DeepSpeed offloads whole optimizer sub-groups
    /// (the last ones), so the share offloaded differs from the ratio by up to a sub-group and
    /// the largest parameter tensor.
    pub fn partial_granularity(&self) -> f64 {
        let shard = self.shard().max(1.0);
        let group = self
            .sub_group_size
            .unwrap_or_else(|| as_f64(operator_sub_group_size(self.parameters, self.ranks)));
        let largest = match self.activations {
            Activations::Shape { hidden, vocab, .. } => (vocab * hidden).max(4.0 * hidden * hidden),
            Activations::Margin => 0.02 * self.parameters,
        };
        ((group + largest) / shard).min(1.0)
    }

    /// The bytes `placement` needs on each GPU and on the host.
    pub fn estimate(&self, placement: Placement, class: &ClassMemory) -> Estimate {
        let p = self.parameters;
        let s = self.shard();
        let b = self.value_bytes;
        let o = self.optimizer_bytes();
        let f = self.fp32_grad_bytes();
        let act = self.activation_bytes(class);
        let live = b * p.min(MAX_LIVE_PARAMETERS);
        let step_group = self.sub_group_size.unwrap_or(DEFAULT_SUB_GROUP);
        // Share of the optimizer state on the host.
        let r = match placement {
            Placement::NoOffload => 0.0,
            Placement::PartialOptimizer(r) => r.clamp(0.0, 1.0),
            Placement::Optimizer | Placement::OptimizerAndParams => 1.0,
        };
        let kept = 1.0 - r;
        let gpu = match (self.sharding, placement) {
            (Sharding::Zero(3), Placement::OptimizerAndParams)
            | (Sharding::Fsdp, Placement::OptimizerAndParams) => act + BUCKET_BYTES + live,
            (Sharding::Zero(3), Placement::NoOffload) => {
                (b + b + o) * s + act.max(f * s.min(step_group)) + BUCKET_BYTES + live
            }
            (Sharding::Zero(3), _) => {
                let steady = b * s + (b + o) * kept * s;
                let at_step = f * kept * s;
                let gathered = if placement == Placement::Optimizer {
                    0.0
                } else {
                    live
                };
                steady + act.max(at_step) + BUCKET_BYTES + gathered
            }
            (Sharding::Fsdp, _) => (b + b + o + f) * s + act + BUCKET_BYTES + live,
            (Sharding::Zero(2), _) => {
                b * p + (b + o) * kept * s + act.max(f * kept * s) + 2.0 * BUCKET_BYTES
            }
            (Sharding::Zero(1), _) => {
                (b + b) * p + o * kept * s + act.max(f * kept * s) + BUCKET_BYTES
            }
            (Sharding::Zero(_), _) => (b + b + o + f) * p + act + BUCKET_BYTES,
            (Sharding::Unsharded, _) => {
                (b + b) * p + o * kept * p + act.max(f * kept * p) + BUCKET_BYTES
            }
        } * GPU_SAFETY;

        // Host, per rank.
        let whole_model_on_host = match self.sharding {
            // Without ZeRO-3's partitioned construction each rank builds the whole model on
            // the host first (fp32).
            Sharding::Zero(0..=2) | Sharding::Unsharded => 4.0 * p,
            _ => 0.0,
        };
        let base = HOST_BASE_BYTES + (b * s).max(whole_model_on_host);
        let sharded_state = match self.sharding {
            Sharding::Unsharded => p,
            _ => s,
        };
        let offloaded = match placement {
            Placement::NoOffload => 0.0,
            Placement::PartialOptimizer(_) => (HOST_OFFLOAD_OVERHEAD + (o + f) * r) * sharded_state,
            Placement::Optimizer => {
                (HOST_OFFLOAD_OVERHEAD + HOST_WHOLE_FACTOR * (o + f)) * sharded_state
            }
            // The 16-bit parameters twice: their partition and the pinned buffer they are
            // fetched through.
            Placement::OptimizerAndParams => {
                (HOST_OFFLOAD_OVERHEAD + HOST_WHOLE_FACTOR * (o + f) + 2.0 * b) * sharded_state
            }
        };
        let per_rank = base + offloaded;
        Estimate {
            placement,
            gpu,
            host_per_pod: per_rank * as_f64(self.gpus_per_pod.max(1)),
            activations: act,
        }
    }

    /// Whether `estimate` fits `class`.
    pub fn fits(&self, estimate: &Estimate, class: &ClassMemory) -> Fit {
        let host = match (class.host_per_pod, self.pod_memory_limit) {
            (None, None) => true,
            (share, limit) => {
                let budget = share
                    .into_iter()
                    .chain(limit)
                    .min()
                    .map_or(f64::MAX, as_f64);
                estimate.host_per_pod <= budget
            }
        };
        Fit {
            gpu: estimate.gpu <= class.gpu_budget(),
            host,
        }
    }

    /// The smallest partial ratio (in hundredths, at least `floor`) whose state fits: the GPU
    /// checked with the share that could stay there, the host with the share that could
    /// leave. `None` when no ratio below 1 fits.
    pub fn smallest_ratio(&self, class: &ClassMemory, floor: f64) -> Option<(f64, Estimate)> {
        (1..100)
            .map(|h| f64::from(h) / 100.0)
            .filter(|r| *r >= floor)
            .find_map(|r| {
                let (est, fit) = self.estimate_checked(Placement::PartialOptimizer(r), class);
                fit.ok().then_some((r, est))
            })
    }

    /// The estimate of a fixed `placement` with partial granularity accounted for (as
    /// [`JobMemory::smallest_ratio`] checks it).
    pub fn estimate_checked(&self, placement: Placement, class: &ClassMemory) -> (Estimate, Fit) {
        let est = match placement {
            Placement::PartialOptimizer(r) => {
                let g = self.partial_granularity();
                let on_gpu = self.estimate(Placement::PartialOptimizer((r - g).max(0.0)), class);
                let on_host = self.estimate(Placement::PartialOptimizer((r + g).min(1.0)), class);
                Estimate {
                    placement,
                    gpu: on_gpu.gpu,
                    host_per_pod: on_host.host_per_pod,
                    activations: on_gpu.activations,
                }
            }
            _ => self.estimate(placement, class),
        };
        let fit = self.fits(&est, class);
        (est, fit)
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

    /// One sentence with the figures of `est` against `class`.
    pub fn describe(&self, est: &Estimate, class: &ClassMemory) -> String {
        let limit = self
            .pod_memory_limit
            .map(|l| format!(" (pod limit {})", gib(as_f64(l))))
            .unwrap_or_default();
        let host = match class.host_per_pod {
            Some(share) => format!(
                "{} of host memory per pod of {} ({}){limit}",
                gib(est.host_per_pod),
                gib(as_f64(share)),
                class.host_node
            ),
            None => format!(
                "{} of host memory per pod{limit} (the nodes state no allocatable memory)",
                gib(est.host_per_pod)
            ),
        };
        format!(
            "needs about {} of {} per GPU on {} and {host}",
            gib(est.gpu),
            gib(class.gpu_budget()),
            class.gpu_node
        )
    }
}

/// The sub-group size the operator writes with a partial ratio where the user's config has
/// none: about a hundredth of the rank's shard (so the offloaded share lands within a few
/// hundredths of the ratio), between 10⁷ and 10⁹ parameters.
pub fn operator_sub_group_size(parameters: f64, ranks: u64) -> u64 {
    let per_rank = parameters / as_f64(ranks.max(1));
    let group = (per_rank / 100.0 / 1e6).ceil() * 1e6;
    bytes(group.clamp(1e7, 1e9))
}

/// A typical decoder's width for a parameter count: about 128 times wider than deep, 12 ×
/// width² parameters per layer.
pub fn typical_width(parameters: f64) -> f64 {
    (128.0 * parameters / 12.0).cbrt().max(64.0)
}

#[cfg(test)]
mod tests;
