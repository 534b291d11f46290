//! The CPU a pod really gets. Offload is only as fast as the CPU update of the offloaded
//! optimizer state, and the node's self-test measures that rate with all of the agent pod's
//! cores. A training container with a CPU limit (a CFS quota: DeepSpeed's CPU Adam still
//! starts one thread per visible core, and is throttled) updates at its limit's share of that
//! rate; one without a limit shares the node's cores with the other pods the node holds.
//!
//! - **Limit.** The container's own CPU limit, or its namespace's LimitRange default: its
//!   cores. Under the kubelet's `static` CPU manager, a Guaranteed container whose whole-core
//!   request equals its limit gets those cores to itself.
//! - **Node share.** No limit: the node's allocatable cores over the job's pods the node holds
//!   (its GPUs over the pod's GPUs).
//!
//! The self-test's rate scales with cores: Adam on fp32 state is memory-bound and parallel, and
//! the per-thread rate is what the agent measured divided by its threads.

use crate::index::NodeInfo;

use crate::decision::request::JobRequest;

/// Where the cores a training container counts on come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Basis {
    /// Its CPU limit (a CFS quota), from the LimitRange named where not its own.
    Limit {
        /// The LimitRange whose default it is, where not the container's own.
        range: Option<String>,
        /// The node's kubelet gives it those cores to itself (static CPU manager, a whole-core
        /// request equal to the limit).
        exclusive: bool,
    },
    /// No limit: the node's allocatable cores shared by the job's pods it holds.
    NodeShare {
        /// The node's allocatable cores.
        node_cores: u64,
        /// The job's pods it holds.
        pods: u64,
    },
}

/// The cores a training container counts on, on one node.
#[derive(Clone, Debug, PartialEq)]
pub struct PodCores {
    /// Cores.
    pub cores: f64,
    /// Where they come from.
    pub basis: Basis,
}

/// What a node offers a pod's CPU: its allocatable cores, its GPUs, its kubelet's CPU manager
/// policy and the threads its self-test measured with.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeCpu {
    /// Allocatable cores.
    pub cpus: Option<u64>,
    /// GPUs.
    pub gpus: u32,
    /// The kubelet's CPU manager policy is `static`.
    pub static_policy: bool,
    /// The threads the self-test measured its CPU rate with.
    pub threads: Option<f64>,
}

impl NodeCpu {
    /// What `node` offers.
    pub fn of(node: &NodeInfo) -> NodeCpu {
        NodeCpu {
            cpus: node.allocatable.cpus,
            gpus: node.gpu_count(),
            static_policy: node
                .parsed_report()
                .and_then(|r| r.cpu_manager_policy.as_deref())
                == Some("static"),
            threads: measured_threads(node),
        }
    }
}

impl PodCores {
    /// The cores of `job`'s training container on a node offering `node`; `None` where
    /// neither a limit nor the node's allocatable cores are known.
    pub fn of(job: &JobRequest, node: &NodeCpu) -> Option<PodCores> {
        if let Some((cores, range)) = &job.cpu_limit {
            let exclusive = range.is_none()
                && cores.fract() == 0.0
                && job.cpu_request.is_none_or(|r| (r - cores).abs() < 1e-9)
                && node.static_policy;
            return Some(PodCores {
                cores: *cores,
                basis: Basis::Limit {
                    range: range.clone(),
                    exclusive,
                },
            });
        }
        let node_cores = node.cpus?;
        let gpus = u64::from(node.gpus).max(1);
        let pods = (gpus / u64::from(job.gpus_per_pod.max(1))).max(1);
        #[allow(clippy::cast_precision_loss)]
        Some(PodCores {
            cores: node_cores as f64 / pods as f64,
            basis: Basis::NodeShare { node_cores, pods },
        })
    }

    /// The cores in words, for reasons.
    pub fn describe(&self) -> String {
        match &self.basis {
            Basis::Limit {
                range: None,
                exclusive: true,
            } => format!(
                "the training container's {} cores (its CPU limit, whole cores of its own under the node's static CPU manager)",
                self.cores
            ),
            Basis::Limit { range: None, .. } => format!(
                "the training container's {} cores (its CPU limit, a CFS quota)",
                self.cores
            ),
            Basis::Limit { range: Some(r), .. } => format!(
                "the training container's {} cores (the default CPU limit of LimitRange {r:?} in its namespace, a CFS quota)",
                self.cores
            ),
            Basis::NodeShare { node_cores, pods } => format!(
                "the training container's share of the node's cores ({node_cores} allocatable over the {pods} pods of the job it holds: {:.1}; it sets no CPU limit)",
                self.cores
            ),
        }
    }

    /// The share of the self-test's CPU update rate, measured with `threads`, these cores
    /// reach (at most all of it).
    pub fn share_of(&self, threads: f64) -> f64 {
        if threads > 0.0 {
            (self.cores / threads).clamp(0.0, 1.0)
        } else {
            1.0
        }
    }

    /// The CPU threads a training process should start for these cores, where a quota bounds
    /// them (at least 1); `None` where nothing does (it may use every core it sees).
    pub fn threads(&self) -> Option<u32> {
        match self.basis {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            Basis::Limit { .. } => Some((self.cores.floor() as u32).max(1)),
            Basis::NodeShare { .. } => None,
        }
    }
}

/// The threads the node's self-test measured its CPU rate with: the report's, else the node's
/// allocatable cores (the agent's pod sees them all).
fn measured_threads(node: &NodeInfo) -> Option<f64> {
    node.parsed_report()
        .and_then(|r| r.selftest.cpu_threads)
        .map(f64::from)
        .or_else(|| {
            #[allow(clippy::cast_precision_loss)]
            node.allocatable.cpus.map(|c| c as f64)
        })
        .filter(|t| *t > 0.0)
}

/// The largest partial share of the optimizer state that runs faster than offloading optimizer
/// state and parameters whole, for `job`'s training container on the node of `nodes` that
/// gives it the fewest cores, with those cores in words where they moved it.
///
/// Up to [`PARTIAL_BEFORE_PARAMS_UP_TO`](crate::decision::model::memory::PARTIAL_BEFORE_PARAMS_UP_TO) with the
/// [`CROSSOVER_CORES`] cores it was measured with. Fewer cores raise it, by far less than in
/// proportion: the CPU's update is bound by host memory bandwidth until few cores are left. On
/// `c` cores the crossover is `1 − (1 − r*)·(c/16)^k`, `k` = [`CROSSOVER_CORE_EXPONENT`]; more
/// cores than measured are not extrapolated, and the share is at most
/// [`MAX_PARTIAL_BEFORE_PARAMS`]. The step times this rests on: `docs/benchmarks/cpu-h200.md`.
pub fn partial_before_params<'n>(
    job: &JobRequest,
    nodes: impl IntoIterator<Item = &'n NodeCpu>,
) -> (f64, Option<String>) {
    use crate::decision::model::memory::PARTIAL_BEFORE_PARAMS_UP_TO;
    let fewest = nodes
        .into_iter()
        .filter_map(|n| PodCores::of(job, n))
        .min_by(|a, b| a.cores.total_cmp(&b.cores));
    match fewest {
        Some(cores) if cores.cores < CROSSOVER_CORES => {
            let crossover = (1.0
                - (1.0 - PARTIAL_BEFORE_PARAMS_UP_TO)
                    * (cores.cores.max(0.0) / CROSSOVER_CORES).powf(CROSSOVER_CORE_EXPONENT))
            .clamp(PARTIAL_BEFORE_PARAMS_UP_TO, MAX_PARTIAL_BEFORE_PARAMS);
            (crossover, Some(cores.describe()))
        }
        _ => (PARTIAL_BEFORE_PARAMS_UP_TO, None),
    }
}

/// The cores of the host the crossover [`crate::decision::model::memory::PARTIAL_BEFORE_PARAMS_UP_TO`] was
/// measured with (a PCIe H200's, all of them for its one GPU).
pub const CROSSOVER_CORES: f64 = 16.0;

/// How the crossover moves with the pod's share of [`CROSSOVER_CORES`]: its cube root, within
/// the exponents (0.33 to 0.46) that hold the crossovers measured at 16 cores (45 %, H200),
/// between 4 and 8 cores and at 6 cores (60 %, H100) — see [`partial_before_params`].
pub const CROSSOVER_CORE_EXPONENT: f64 = 1.0 / 3.0;

/// The largest share [`partial_before_params`] ever gives: past it a partial share keeps too
/// little on the GPU to be worth two optimizers.
pub const MAX_PARTIAL_BEFORE_PARAMS: f64 = 0.95;
