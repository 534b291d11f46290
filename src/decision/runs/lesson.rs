//! What one run teaches: the observed peaks of a configuration that ran (or ran out of memory)
//! against the memory model of the same job, as the factors [`super::learned`] keeps.
//!
//! The model is solved for what it could not know, with everything it counts exactly held:
//! the activation factor is the smallest that makes the model's GPU figure for the placement
//! that ran reach the observed peak; the host factor is the observed host peak over the model's.
//! For a job without model hints the model's size is solved for first — from the host peak
//! where the run offloaded (its state is there, counted per parameter), else from the GPU peak
//! with the fewest activations — so that later runs of the same job are sized from it; both
//! solutions are upper bounds of the size, never under it.

use offload_api::quantity::MAX_PARAMETERS;
use offload_api::v1alpha1::{MemoryKind, NodeClass};

use super::learned::{self, LearnedFactors, LearnedMemory, RanAs, Run};
use crate::decision::error::ResolveError;
use crate::decision::frameworks;
use crate::decision::model::memory::CONTEXT_RESERVE_BYTES;
use crate::decision::model::memory::ClassMemory;
use crate::decision::model::memory::JobMemory;
use crate::decision::model::memory::Placement;
use crate::decision::model::sizing;
use crate::decision::request::JobRequest;

/// The host model's fit is at most this much over the measured peaks (whole offload): a size
/// solved from a host peak is taken at the peak raised by it, an upper bound.
const HOST_FIT_OVER: f64 = 1.05;

/// What a run of one configuration was observed to use.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    /// Where the configuration put the training state.
    pub placement: Placement,
    /// The node class it ran on.
    pub class: NodeClass,
    /// Memory of each of its GPUs, bytes.
    pub gpu_bytes: u64,
    /// The highest device memory in use on its GPUs (NVML's, with the CUDA context), bytes.
    pub gpu_peak: Option<u64>,
    /// What PyTorch's caching allocator said the job needed, bytes, where known: its
    /// `max_memory_allocated()` for a run that ran, or (out of GPU memory) what it had handed
    /// out plus what it asked for. The device figure (NVML) counts the allocator's cache and
    /// the CUDA context too, so without this the GPU peak is only an upper bound.
    pub allocated: Option<u64>,
    /// The highest host memory of a pod, bytes.
    pub host_peak: Option<u64>,
    /// It ran out of this memory.
    pub failed: Option<MemoryKind>,
    /// It finished its training (its workload succeeded; `explain`: the process exited 0).
    pub trained: bool,
    /// Its configuration was a trial of one faster than any that had trained for its shape.
    pub trial: bool,
    /// The shape key its configuration was decided for (`status.offload.estimate.shape`),
    /// where the decision sized the job: a job edited since (its model's config, its tokens,
    /// its parameters) ran the old shape, and its run teaches the new one nothing.
    pub decided_shape: Option<String>,
    /// Its median training step after the first, seconds, as its processes reported it.
    pub step_seconds: Option<f64>,
}

/// A run's lesson, to be recorded under `shape`.
#[derive(Clone, Debug, PartialEq)]
pub struct Lesson {
    /// The shape key (for a job without hints, its identity's).
    pub shape: String,
    /// The shape in words.
    pub described: String,
    /// What its activations were over the model's (1: as estimated).
    pub activations: f64,
    /// Its host peak over the model's, where observed.
    pub host: Option<f64>,
    /// For a job without hints, the size its peaks show.
    pub parameters: Option<f64>,
    /// Its GPU figure is the allocator's own (not the device's upper bound).
    pub allocator: bool,
    /// The configuration it ran.
    pub ran_as: RanAs,
    /// It finished its training.
    pub trained: bool,
    /// It was a trial of a faster configuration.
    pub trial: bool,
    /// Its median training step, seconds, where reported.
    pub step_seconds: Option<f64>,
    /// The lesson in a sentence.
    pub sentence: String,
}

impl Lesson {
    /// The run to record for `job` (`namespace/name/uid`) at `at`.
    pub fn run(&self, job: &str, failed: bool, at: jiff::Timestamp) -> Run {
        Run {
            job: job.to_string(),
            activations: self.activations,
            host: self.host,
            failed,
            parameters: self.parameters,
            allocator: self.allocator,
            ran_as: Some(self.ran_as),
            trained: self.trained && !failed,
            trial: self.trial,
            step_seconds: self.step_seconds,
            at: at.to_string(),
        }
    }

    /// Records the run in `store` under `profile` on `class`; whether it changed.
    pub fn record(
        &self,
        store: &mut LearnedMemory,
        profile: &str,
        class: NodeClass,
        run: Run,
    ) -> Result<bool, learned::LearnedError> {
        store.record(profile, class, &self.shape, &self.described, run)
    }
}

/// The smallest `x` in `[lo, hi]` with `f(x) >= target` for an `f` that does not fall (`hi` when
/// none reaches it); searched in log space.
fn solve(lo: f64, hi: f64, target: f64, f: impl Fn(f64) -> f64) -> f64 {
    if f(lo) >= target {
        return lo;
    }
    if f(hi) < target {
        return hi;
    }
    let (mut a, mut b) = (lo.ln(), hi.ln());
    for _ in 0..60 {
        let m = f64::midpoint(a, b);
        if f(m.exp()) >= target {
            b = m;
        } else {
            a = m;
        }
    }
    b.exp()
}

/// The GPU figure of `placement` for `jm` on `cm` with `activations` as the learned factor.
fn gpu_with(jm: &JobMemory, cm: &ClassMemory, placement: Placement, activations: f64) -> f64 {
    let mut jm = jm.clone();
    if let Some(class) = cm.class {
        jm.learned.insert(
            class,
            LearnedFactors {
                activations,
                runs: 1,
                ..LearnedFactors::default()
            },
        );
    }
    jm.estimate_checked(placement, cm).0.gpu
}

/// The shape a lesson is recorded under, in words: the model's, or the job's with the size its
/// peaks gave where it has no hints.
fn described(job: &JobRequest, jm: &JobMemory) -> String {
    if jm.inferred {
        format!(
            "{} (no model hints; {:.2}B parameters by its peaks)",
            job.identity.as_deref().unwrap_or_default(),
            jm.parameters / 1e9
        )
    } else {
        jm.shape.describe()
    }
}

/// What the run of `job` observed in `obs` teaches; `None` where it teaches nothing (no GPU
/// peak, or a job without hints that has no identity to learn under).
pub fn lesson(job: &JobRequest, obs: &Observed) -> Result<Option<Lesson>, ResolveError> {
    let facts = frameworks::check(job)?;
    let job = job.without_evidence();
    let Some(gpu_peak) = obs.gpu_peak.filter(|p| *p > 0 && *p <= obs.gpu_bytes) else {
        return Ok(None);
    };
    let believed = believed(obs);
    let obs = &believed;
    let cm = ClassMemory::ran_on(obs.class, obs.gpu_bytes);
    let needed = needed_of(obs, gpu_peak, &cm);
    #[allow(clippy::cast_precision_loss)]
    let host_peak = obs.host_peak.map(|h| h as f64).filter(|h| *h > 0.0);
    let Some((mut jm, mut parameters)) = model_of(&job, &facts, obs, &cm, needed, host_peak)?
    else {
        return Ok(None);
    };
    let counted = jm.parameters;
    match floor_of(&jm, &cm, obs, needed) {
        Floor::Under => {}
        Floor::NoStep => return Ok(None),
        Floor::Corrected(p) => {
            jm = jm.with_parameters(p);
            parameters = Some(p);
        }
    }
    if let Some(decided) = &obs.decided_shape
        && *decided != jm.shape_key
    {
        return Ok(None);
    }
    let (activations, capped) = activations_of(&jm, &cm, obs, needed);
    let est = jm.estimate_checked(obs.placement, &cm).0;
    let host = host_factor(host_peak, est.host_per_pod, obs.failed);
    let described = described(&job, &jm);
    let said = Said {
        gpu_peak,
        host_peak,
        est: &est,
        activations,
        host,
        capped,
        parameters,
        counted: (!jm.inferred && parameters.is_some()).then_some(counted),
    };
    let (placement, ratio) = obs.placement.state();
    Ok(Some(Lesson {
        shape: jm.shape_key.clone(),
        described,
        activations,
        host,
        parameters,
        allocator: obs.allocated.is_some_and(|a| a > 0),
        ran_as: RanAs {
            placement,
            ratio,
            ranks: jm.ranks.max(1),
            gpu_bytes: obs.gpu_bytes,
        },
        trained: obs.trained && obs.failed.is_none(),
        trial: obs.trial,
        step_seconds: obs
            .step_seconds
            .filter(|s| offload_api::observed::plausible_step(*s))
            .filter(|s| step_computable(*s, &jm)),
        sentence: said.sentence(obs),
    }))
}

/// What of `obs` is believed. PyTorch allocates within the GPU: a run that did not run out
/// cannot have held more than its memory, so such a figure is not the allocator's and the
/// device's figure stands. A run out of memory held what it had plus what it asked, which may
/// be more.
fn believed(obs: &Observed) -> Observed {
    Observed {
        allocated: obs
            .allocated
            .filter(|a| obs.failed.is_some() || *a <= obs.gpu_bytes),
        ..obs.clone()
    }
}

/// The host peak over what the model estimated for each pod, within the store's bounds; a pod
/// killed for host memory needed more than it got, at least a VPA bump more.
fn host_factor(host_peak: Option<f64>, estimated: f64, failed: Option<MemoryKind>) -> Option<f64> {
    host_peak
        .filter(|_| estimated > 0.0)
        .map(|h| h / estimated)
        .map(|h| {
            if failed == Some(MemoryKind::Host) {
                h.max(1.2)
            } else {
                h
            }
            .clamp(learned::MIN_HOST, learned::MAX_FACTOR)
        })
}

/// More than any GPU computes, FLOP/s (the bf16 dense peaks of the largest GPUs are below
/// 2.5·10¹⁵): a step faster than its training arithmetic at this rate is no step.
const MAX_GPU_FLOPS: f64 = 1e16;

/// Whether a step of `seconds` can be a training step of `jm` on one GPU: forward and backward
/// cost about 6 FLOP a parameter a token, which no GPU does faster than [`MAX_GPU_FLOPS`].
/// Without the step's tokens there is no bound but the step's own.
fn step_computable(seconds: f64, jm: &JobMemory) -> bool {
    jm.tokens
        .is_none_or(|tokens| seconds >= 6.0 * jm.parameters * tokens / MAX_GPU_FLOPS)
}

/// Where a run's need stands against the model's floor: the weights, gradients and optimizer
/// state its configuration holds on the GPU.
enum Floor {
    /// At or above it: the run is learned against the model as it is.
    Under,
    /// Below it and no step of the job: a window before its first step, a figure that cannot be
    /// true. It teaches nothing.
    NoStep,
    /// Below a floor the model could not know: a counted model whose per-type terms build more
    /// parameters than the model has. The most parameters the run allows (an upper bound).
    Corrected(f64),
}

/// Where `needed` stands against `jm`'s floor for the run `obs`. A run that trained, with the
/// allocator's own figure, measured its whole step: below a counted floor its peak corrects the
/// count rather than being discarded. A traced model's parameters are the model's own: its
/// floor stands.
fn floor_of(jm: &JobMemory, cm: &ClassMemory, obs: &Observed, needed: f64) -> Floor {
    if obs.failed.is_some() || needed >= gpu_with(jm, cm, obs.placement, 0.0) {
        return Floor::Under;
    }
    let measured = obs.trained && obs.allocated.is_some_and(|a| a > 0);
    if !measured || jm.traced.is_some() || jm.inferred {
        return Floor::NoStep;
    }
    let p = solve(1e6, jm.parameters, needed, |p| {
        gpu_with(
            &jm.with_parameters(p),
            cm,
            obs.placement,
            learned::MIN_ACTIVATIONS,
        )
    });
    // Half the count is past any per-type term's error (the hints' own bound): such a figure is
    // no step of this model.
    if p < 0.5 * jm.parameters {
        Floor::NoStep
    } else {
        Floor::Corrected(p)
    }
}

/// What the job needed of the GPU, as the estimate counts it (without the CUDA context): the
/// allocator's own figure where it is known; else the device's peak less the context, which
/// still counts the allocator's cache (an upper bound); and a run out of GPU memory without
/// the allocator's words needed at least all it could have.
fn needed_of(obs: &Observed, gpu_peak: u64, cm: &ClassMemory) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    match (obs.allocated.filter(|a| *a > 0), obs.failed) {
        (Some(a), _) => a as f64,
        (None, Some(MemoryKind::Gpu)) => {
            (gpu_peak as f64 - CONTEXT_RESERVE_BYTES).max(cm.gpu_budget())
        }
        (None, _) => (gpu_peak as f64 - CONTEXT_RESERVE_BYTES).max(0.0),
    }
}

/// The memory model the run is learned against: the job's hints', or for a job without hints
/// the size its peaks show (with that size); `None` where the run teaches no size.
fn model_of(
    job: &JobRequest,
    facts: &frameworks::FrameworkFacts,
    obs: &Observed,
    cm: &ClassMemory,
    needed: f64,
    host_peak: Option<f64>,
) -> Result<Option<(JobMemory, Option<f64>)>, ResolveError> {
    if let Some(jm) = sizing::unlearned_memory(job, facts)? {
        return Ok(Some((jm, None)));
    }
    // Only a run that ran shows a size: one that ran out of memory shows only that it needed
    // more (the ladder, or the failure's record, moves it on).
    if job.identity.is_none() || obs.failed.is_some() {
        return Ok(None);
    }
    #[allow(clippy::cast_precision_loss)]
    let max = MAX_PARAMETERS as f64;
    let Some(probe) = sizing::sized_as(job, facts, 1e9) else {
        return Ok(None);
    };
    let sized = |p: f64| JobMemory {
        parameters: p,
        ..probe.clone()
    };
    let p = match host_peak {
        Some(h) if obs.placement != Placement::NoOffload => {
            solve(1e6, max, h * HOST_FIT_OVER, |p| {
                sized(p).estimate_checked(obs.placement, cm).0.host_per_pod
            })
        }
        _ => solve(1e6, max, needed, |p| {
            gpu_with(&sized(p), cm, obs.placement, learned::MIN_ACTIVATIONS)
        }),
    };
    Ok(sizing::sized_as(job, facts, p).map(|jm| {
        let parameters = jm.parameters;
        (jm, Some(parameters))
    }))
}

/// The activation factor the run shows, and whether it was capped: a run that ran proves its
/// configuration fits, so its lesson never says otherwise and the next decision never offloads
/// more than what ran (the factor is kept where the model, with the store's growth margin,
/// still fits the placement in the GPU's budget).
fn activations_of(jm: &JobMemory, cm: &ClassMemory, obs: &Observed, needed: f64) -> (f64, bool) {
    let activations = solve(learned::MIN_ACTIVATIONS, learned::MAX_FACTOR, needed, |a| {
        gpu_with(jm, cm, obs.placement, a)
    });
    if obs.failed.is_some() {
        return (activations, false);
    }
    let fits = solve(
        learned::MIN_ACTIVATIONS,
        learned::MAX_FACTOR,
        cm.gpu_budget(),
        |a| gpu_with(jm, cm, obs.placement, a * (1.0 + learned::GROWTH_MARGIN)),
    );
    if fits < activations {
        (fits, true)
    } else {
        (activations, false)
    }
}

/// A lesson's figures, for its sentence.
struct Said<'a> {
    gpu_peak: u64,
    host_peak: Option<f64>,
    est: &'a crate::decision::model::memory::Estimate,
    activations: f64,
    host: Option<f64>,
    capped: bool,
    parameters: Option<f64>,
    /// The count the parameters correct, where they correct one.
    counted: Option<f64>,
}

impl Said<'_> {
    #[allow(clippy::cast_precision_loss)]
    fn sentence(&self, obs: &Observed) -> String {
        let gib = crate::decision::model::memory::gib;
        let allocator = match obs.allocated.filter(|a| *a > 0) {
            Some(a) => format!("PyTorch's allocator: {}", gib(a as f64)),
            None => "the device's figure, with the allocator's cache: an upper bound".into(),
        };
        let host_said = match self.host_peak {
            Some(h) => format!(
                " and {} of host memory (estimated {})",
                gib(h),
                gib(self.est.host_per_pod)
            ),
            None => String::new(),
        };
        format!(
            "{} with {} peaked at {} of GPU memory ({allocator}; the model estimated {} with the CUDA context){host_said}: activations ×{:.2}{}{}{}{}",
            if obs.failed.is_some() {
                "ran out of memory"
            } else {
                "ran"
            },
            obs.placement,
            gib(self.gpu_peak as f64),
            gib(self.est.gpu + CONTEXT_RESERVE_BYTES),
            self.activations,
            self.host
                .map_or(String::new(), |h| format!(", host ×{h:.2}")),
            if self.capped {
                " (at most: it ran, so the model keeps it fitting)"
            } else {
                ""
            },
            self.parameters.map_or(String::new(), |p| format!(
                "; its peaks show at most {:.2}B parameters{}",
                p / 1e9,
                match self.counted {
                    Some(c) => format!(
                        ", where the count has {:.2}B: later decisions of the shape are sized at that",
                        c / 1e9
                    ),
                    None => " (the job gives no model hints)".into(),
                }
            )),
            obs.step_seconds.map_or(String::new(), |t| format!(
                "; a step took {:.0} ms (the median after the first)",
                t * 1000.0
            )),
        )
    }
}
