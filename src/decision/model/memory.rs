//! The memory model of a training job: for each way of placing its training state — nothing
//! offloaded, part of the optimizer state on the host, all of it, optimizer state and
//! parameters — the bytes each GPU and each pod's host memory need, and whether a node class
//! holds them, with how much is left.
//!
//! ZeRO-3 is modelled as DeepSpeed 0.19.8 allocates it, per GPU and per host, for each
//! placement: the 16-bit parameters, gradients and the optimizer state where each placement
//! keeps them, DeepSpeed's buckets and the backward's gradient flushes, the step's activations
//! ([`ModelShape`], or a trace), and the room the CUDA context and the caching allocator take.
//! Each term and what it was fitted to: `docs/benchmarks/memory-h200.md`, "The counted model's
//! terms". ZeRO-1/2, FSDP and `Generic` jobs follow DeepSpeed's estimators with the same terms
//! and 5 % on top (not measured).
//!
//! The host's side is in [`host`], the backward's gradient flushes in [`flushes`], what a job's
//! own failures teach in [`corrections`], and the figures in sentences in [`describe`].
//!
//! Every figure is in bytes as `f64` (products of counts that could overflow an integer never
//! do in floating point); results are rounded up into `u64`, saturating.

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

/// DeepSpeed's reduce bucket (`reduce_bucket_size` 5·10⁸ in 16-bit), allocated at start.
const BUCKET_BYTES: f64 = 1e9;
/// Bytes a parameter of one piece of optimizer state in bf16 (not measured: DeepSpeed's own
/// account of `bf16_optimizer_states`, about 6 bytes a parameter on the host for the master
/// weights and both moments).
const STATE_BYTES_BF16: f64 = 2.0;
/// The framework's own GPU buffers beside the bucket (measured 0.07–0.11 GB).
const FRAMEWORK_BYTES: f64 = 0.12e9;
/// What the GPU holds beyond the count whenever optimizer state is offloaded: copies on
/// DeepSpeed's reduce stream whose memory is reused only once the stream is done with them
/// (measured up to 0.09 GB: Qwen2.5-1.5B at a 5 % share).
const OFFLOAD_STREAM_BYTES: f64 = 0.1e9;
/// `stage3_max_live_parameters`: gathered parameters alive at once.
const MAX_LIVE_PARAMETERS: f64 = 1e9;
/// Safety on the estimates of what was not measured (ZeRO-1/2, FSDP, `Generic`).
const UNMEASURED_SAFETY: f64 = 1.05;

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

/// How the framework shards training state over the data-parallel ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharding {
    /// DeepSpeed ZeRO at this stage (0 to 3).
    Zero(u8),
    /// PyTorch FSDP, fully sharded.
    Fsdp,
    /// Megatron-core: each GPU holds 1/`model_parallel` of the model (tensor × pipeline
    /// parallel), its activations split over `tensor` (all of them with sequence parallelism,
    /// those of attention and the MLP without); with the distributed optimizer the optimizer
    /// state is sharded over the data-parallel ranks.
    Megatron {
        /// Tensor-parallel size.
        tensor: u32,
        /// Tensor × pipeline-parallel size.
        model_parallel: u32,
        /// `--use-distributed-optimizer`.
        distributed: bool,
        /// `--sequence-parallel`.
        sequence: bool,
        /// `--transformer-impl local`: unfused attention, whose sequence² scores a layer
        /// holds while it runs.
        unfused_attention: bool,
        /// Megatron-LM's `--manual-gc`: the hybrid device optimizer's first copy
        /// ([`megatron::FIRST_HYBRID_COPY_BYTES`]) is collected before the first step.
        first_copy_freed: bool,
    },
    /// Unknown to the operator (`Generic`): nothing assumed sharded.
    Unsharded,
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
        crate::decision::runs::learned::LearnedFactors,
    >,
    /// Sized from observed runs of the job (it gives no hints), not from hints.
    pub inferred: bool,
    /// What earlier runs of the shape ran and how they ended, per node class: what the
    /// decision takes as proof or bound ([`crate::decision::runs::proven`]).
    pub ran: std::collections::BTreeMap<
        offload_api::v1alpha1::NodeClass,
        Vec<crate::decision::runs::learned::RanRecord>,
    >,
    /// Trials of the shape other jobs took whose runs are not known yet, per node class: they
    /// count toward `fasterTrials` at once ([`crate::decision::runs::learned::Reservation`]).
    pub reserved_trials: std::collections::BTreeMap<offload_api::v1alpha1::NodeClass, usize>,
    /// The model as its own code traced it, where the job has a trace of its step: its
    /// parameters, tensors, activations and gradients' order replace the counted shape's.
    pub traced: Option<std::sync::Arc<Traced>>,
    /// Why the step was not traced, where a trace was sought (for reasons).
    pub untraced: Option<String>,
    /// The per-type count's parameters, where runs of the shape that trained showed fewer
    /// (`parameters` is then what they showed: the count's floor, corrected).
    pub counted_parameters: Option<f64>,
    /// Whether the budget keeps the allocator's room for the step's largest activation
    /// ([`LARGE_ALLOCATION_FRAGMENTATION`] of the fp32 logits). `true` for every decision but a
    /// trial of a faster rung ([`crate::decision::runs::proven`]), which keeps the fragmentation share alone
    /// and lets its run tell whether the step needed more: it falls back should it run out.
    pub logits_room: bool,
    /// The optimizer state, master weights and gradients kept in bf16 (DeepSpeed's
    /// `bf16_optimizer_states` with `bf16_master_weights_and_grads`): 2 bytes each a parameter
    /// where fp32 takes 4. Only a rung of consenting jobs under offload sets it.
    pub bf16_states: bool,
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
    /// The memory a run had: its GPU's, on its class, host memory not checked (what a run
    /// teaches is read against what it ran on).
    pub fn ran_on(class: offload_api::v1alpha1::NodeClass, gpu_bytes: u64) -> ClassMemory {
        ClassMemory {
            gpu_bytes,
            gpu_node: String::new(),
            host_per_pod: None,
            host_node: String::new(),
            class: Some(class),
        }
    }

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
    pub learned: crate::decision::runs::learned::LearnedFactors,
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
        if self.bf16_states {
            3.0 * STATE_BYTES_BF16
        } else if self.mixed() {
            12.0
        } else {
            8.0
        }
    }

    /// Bytes a parameter of each piece of optimizer state (the master weights, each Adam
    /// moment, the master gradients) takes.
    pub(super) fn state_bytes(&self) -> f64 {
        if self.bf16_states {
            STATE_BYTES_BF16
        } else {
            4.0
        }
    }

    /// Bytes a parameter of the master gradients mixed precision keeps beside the 16-bit ones
    /// (none in fp32, where the gradients are the master's).
    fn grad_bytes(&self) -> f64 {
        if self.mixed() {
            self.state_bytes()
        } else {
            0.0
        }
    }

    /// The job with its optimizer state, master weights and gradients in bf16.
    pub fn with_bf16_states(&self) -> JobMemory {
        JobMemory {
            bf16_states: true,
            ..self.clone()
        }
    }

    /// The job as a trial of a faster rung sees it ([`crate::decision::runs::proven`]): the allocator's room
    /// beside the step's logits not kept ([`JobMemory::logits_room`]).
    pub fn as_trial(&self) -> JobMemory {
        JobMemory {
            logits_room: false,
            ..self.clone()
        }
    }

    /// The job with `parameters` parameters instead (the count corrected by what runs showed).
    pub fn with_parameters(&self, parameters: f64) -> JobMemory {
        JobMemory {
            parameters,
            ..self.clone()
        }
    }

    /// The job with `tokens` per micro-batch instead (for advice).
    pub fn with_tokens(&self, tokens: f64) -> JobMemory {
        JobMemory {
            tokens: Some(tokens),
            ..self.clone()
        }
    }

    /// The model at the step's tokens per micro-batch (its sliding window's sequence set).
    pub fn shape_at_tokens(&self) -> ModelShape {
        self.tokens
            .map_or(self.shape, |tokens| self.shape.at_tokens(tokens))
    }

    /// Activation bytes per GPU at the step's peak.
    pub fn activation_bytes(&self, class: &ClassMemory) -> f64 {
        if let Some(t) = &self.traced {
            return t.peak(self.tokens);
        }
        match self.tokens {
            Some(tokens) => {
                tokens
                    * self
                        .shape_at_tokens()
                        .activation_peak_per_token(self.checkpointing)
                    * (self.value_bytes / 2.0)
            }
            None => as_f64(class.gpu_bytes) * ACTIVATION_MARGIN_SHARE,
        }
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
        let act = self.activation_bytes(class) * self.activation_factor();
        let r = match placement {
            Placement::NoOffload => 0.0,
            Placement::PartialOptimizer(_) => share.clamp(0.0, 1.0),
            Placement::Optimizer | Placement::OptimizerAndParams => 1.0,
        };
        let learned = self.learned_on(class);
        let gpu_with =
            |factor: f64| self.gpu_bytes(placement, 1.0 - r, act * factor, factor, flushes);
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
    pub fn learned_on(
        &self,
        class: &ClassMemory,
    ) -> crate::decision::runs::learned::LearnedFactors {
        class
            .class
            .and_then(|c| self.learned.get(&c).copied())
            .unwrap_or_default()
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
            PartialShares::Within(_) | PartialShares::AtLeast(_) => None,
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

    /// GPU memory this job's estimates may use on `class`: the class's budget, less the room
    /// the allocator needs ([`JobMemory::allocator_room`]) where that is more than the
    /// fragmentation share.
    pub fn gpu_budget(&self, class: &ClassMemory) -> f64 {
        let total = as_f64(class.gpu_bytes);
        let fragmentation = (FRAGMENTATION_SHARE * total).max(self.allocator_room());
        (total - CONTEXT_RESERVE_BYTES - fragmentation).max(0.0)
    }

    /// What the caching allocator holds beyond what is allocated at the peak: room to place the
    /// step's largest activation ([`LARGE_ALLOCATION_FRAGMENTATION`] of it), and for
    /// Megatron-core the reserve measured with it ([`megatron::MEGATRON_ALLOCATOR_RESERVE`]).
    pub fn allocator_room(&self) -> f64 {
        let largest = if self.logits_room {
            LARGE_ALLOCATION_FRAGMENTATION * self.largest_activation()
        } else {
            0.0
        };
        match self.sharding {
            Sharding::Megatron { .. } => largest.max(megatron::MEGATRON_ALLOCATOR_RESERVE),
            _ => largest,
        }
    }

    /// Bytes of the step's largest single activation: the loss's fp32 logits of a micro-batch
    /// (0 when its tokens are not known).
    pub fn largest_activation(&self) -> f64 {
        if let Some(t) = &self.traced {
            return t.largest_activation(self.tokens);
        }
        self.tokens.map_or(0.0, |t| 4.0 * self.shape.vocab * t)
    }

    /// The factor kept on the activations: none on a trace, else the model type's standing.
    pub fn activation_factor(&self) -> f64 {
        if self.traced.is_some() {
            1.0
        } else {
            self.shape.standing.factor()
        }
    }

    /// GPU memory left under what the GPU can hold with `est` (negative: over).
    pub fn headroom(&self, est: &Estimate, class: &ClassMemory) -> f64 {
        self.gpu_budget(class) - est.gpu
    }
}

/// The memory a GPU must have for an estimate of `estimate` bytes to fit it, with `room` bytes
/// the allocator needs beyond it ([`JobMemory::allocator_room`]): the inverse of
/// [`JobMemory::gpu_budget`], rounded up to MiB (what a DRA claim's selector asks for).
pub fn gpu_memory_for(estimate: f64, room: f64) -> u64 {
    let needed = estimate.max(0.0) + CONTEXT_RESERVE_BYTES;
    let total = (needed / (1.0 - FRAGMENTATION_SHARE)).max(needed + room.max(0.0));
    bytes(total).div_ceil(1 << 20).saturating_mul(1 << 20)
}

mod corrections;
mod describe;
mod flushes;
mod gpu;
mod groups;
mod host;
mod megatron;
mod traced;

pub use corrections::{
    Corrections, GPU_FAILURE_MARGIN, HOST_FAILURE_MARGIN, HOST_FAILURE_MIN_BYTES,
};
use flushes::Flush;
use groups::MAX_TENSORS;
pub use groups::{PartialShares, operator_sub_group_size};
pub use traced::Traced;

#[cfg(test)]
mod tests;
