//! The ladder of placements, fastest first (measured on an H200,
//! `docs/benchmarks/memory-h200.md`): no offload; a partial offload of the optimizer state up to
//! [`PARTIAL_BEFORE_PARAMS_UP_TO`]; optimizer state and parameters (ZeRO-3 copy offload, FSDP); a
//! larger partial share; all optimizer state — what a job may take of it, the fastest rung that
//! fits a class, and what would make a job that fits nowhere fit.

use crate::decision::frameworks::FrameworkFacts;
use crate::decision::frameworks::partial_ratio_support;
use crate::decision::model::memory::ClassMemory;
use crate::decision::model::memory::Estimate;
use crate::decision::model::memory::Fit;
use crate::decision::model::memory::JobMemory;
use crate::decision::model::memory::PARTIAL_BEFORE_PARAMS_UP_TO;
use crate::decision::model::memory::Placement;
use crate::decision::model::memory::Sharding;
use crate::decision::model::memory::gib;
use crate::decision::request::JobRequest;
use crate::decision::settings::MIN_AUTO_RATIO;
use offload_api::v1alpha1::{Framework, NodeClass};

/// Largest data-parallel size the advice looks at.
const MAX_ADVISED_RANKS: u64 = 4096;

/// The placement chosen for a class, with its figures.
#[derive(Clone, Debug)]
pub(in crate::decision) struct MemoryChoice {
    pub(in crate::decision) placement: Placement,
    pub(in crate::decision) estimate: Estimate,
    pub(in crate::decision) class: ClassMemory,
    /// The figures in a sentence.
    pub(in crate::decision) figures: String,
    /// The deciding figures in a few words ([`JobMemory::brief`]).
    pub(in crate::decision) brief: String,
    /// Where the figures come from, in a few words ([`JobMemory::brief`]).
    pub(in crate::decision) provenance: String,
    /// Chosen by what earlier runs proved ([`crate::decision::runs::proven`]), not by the model's figures
    /// alone: the figures say why.
    pub(in crate::decision) proven: bool,
    /// Set where the placement is a trial of a rung faster than the fastest that trained for
    /// the shape.
    pub(in crate::decision) trial: Option<Trial>,
    /// Where what trained was ranked by its steps over a less offloaded configuration that
    /// trained slower: both steps, short (`2000 ms a step; 35% 2300 ms`).
    pub(in crate::decision) stepped: Option<String>,
    /// The optimizer state kept in bf16: the rung a consenting job that fits nothing in fp32
    /// takes.
    pub(in crate::decision) bf16_states: bool,
}

/// A trial of a rung faster than the fastest configuration that trained.
#[derive(Clone, Debug, PartialEq)]
pub struct Trial {
    /// The configuration that trained, which the job goes back to should the trial run out.
    pub fallback: Placement,
    /// The evidence in a sentence.
    pub evidence: String,
}

/// Every placement tried on a class, and why none fits.
#[derive(Clone, Debug, Default)]
pub(in crate::decision) struct Tried(pub(in crate::decision) Vec<(Placement, Estimate, Fit)>);

/// What the framework, the version and the job's explicit settings allow.
#[derive(Clone, Debug)]
pub(in crate::decision) struct Allowed {
    /// Nothing offloaded.
    pub(in crate::decision) no_offload: bool,
    /// Any offload.
    pub(in crate::decision) offload: bool,
    /// A partial ratio: fixed by the job or profile, free (`Auto`), or not possible.
    pub(in crate::decision) partial: PartialRatio,
    /// All optimizer state, parameters kept on the GPU.
    pub(in crate::decision) whole_optimizer: bool,
    /// Optimizer state and parameters.
    pub(in crate::decision) with_params: bool,
    /// How many trials of a rung faster than the fastest that trained a shape may have (the
    /// profile's `fasterTrials`; 0 for a job that cannot recover from running out of memory,
    /// or whose share is fixed).
    pub(in crate::decision) trials: u32,
    /// The largest partial share that runs faster than offloading optimizer state and
    /// parameters whole, for the pod's CPU ([`crate::decision::pod::cpu::partial_before_params`]).
    pub(in crate::decision) partial_before_params: f64,
    /// Where the pod's cores moved that share from the measured one: the cores in words.
    pub(in crate::decision) cpu_note: Option<String>,
    /// The rung with the optimizer state in bf16 under offload.
    pub(in crate::decision) bf16_states: Bf16States,
}

/// Whether the rung with the optimizer state in bf16 may be taken, or only offered in the
/// advice of a job that fits nowhere.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(in crate::decision) enum Bf16States {
    /// Not for this job: not DeepSpeed ≥ 0.19.1 training in bf16 with offload, or refused.
    #[default]
    Unavailable,
    /// The job could take it, without consent yet.
    Offered,
    /// Consented: taken where nothing in fp32 fits.
    Allowed,
}

impl Allowed {
    /// How fast a placement runs for this job, for comparing choices (lower is faster), in
    /// [`fastest`]'s order: a partial share up to [`Allowed::partial_before_params`] before
    /// optimizer state and parameters.
    pub(in crate::decision) fn speed_rank(&self, p: Placement) -> (u8, u32) {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let hundredths = |r: f64| (r * 100.0).round() as u32;
        match p {
            Placement::NoOffload => (0, 0),
            Placement::PartialOptimizer(r) if r <= self.partial_before_params => (1, hundredths(r)),
            Placement::OptimizerAndParams => (2, 0),
            Placement::PartialOptimizer(r) => (3, hundredths(r)),
            Placement::Optimizer => (4, 0),
        }
    }
}

/// What partial offload may be.
#[derive(Clone, Debug, PartialEq)]
pub(in crate::decision) enum PartialRatio {
    /// The smallest share that fits, at least this floor.
    Free(f64),
    /// Exactly this share (the job's or profile's `offloadRatio`).
    Fixed(f64),
    /// Not possible, and why.
    No(String),
}

/// What may be placed where, from the framework, its version and stage, the class, and the
/// job's and profile's explicit settings (`fixed_ratio`: a ratio they state).
pub(in crate::decision) fn allowed(
    job: &JobRequest,
    facts: &FrameworkFacts,
    class: NodeClass,
    no_offload: bool,
    offload: bool,
    fixed_ratio: Option<f64>,
) -> Allowed {
    let partial = match (partial_ratio_support(job, facts), fixed_ratio) {
        (_, Some(r)) if r >= 1.0 => PartialRatio::No("the ratio is 1".into()),
        // Parameters offloaded with only part of the optimizer state is not a placement the
        // memory model sizes (nor one measured): asking for parameters asks for all of it.
        _ if job.framework.name == Framework::DeepSpeed
            && job.deepspeed.offload_params == Some(true) =>
        {
            PartialRatio::No("deepspeed.offloadParams offloads all optimizer state".into())
        }
        (Ok(()), Some(r)) => PartialRatio::Fixed(r),
        (Ok(()), None) => PartialRatio::Free(MIN_AUTO_RATIO),
        (Err(why), _) => PartialRatio::No(why),
    };
    let (whole_optimizer, with_params) = match job.framework.name {
        Framework::DeepSpeed => {
            let asked = job.deepspeed.offload_params;
            let stage3 = facts.stage == 3;
            (
                facts.stage >= 1 && asked != Some(true),
                // Parameters too only at ZeRO-3; on coherent nodes only when asked (measured on
                // a PCIe node only).
                stage3
                    && asked != Some(false)
                    && (class == NodeClass::Discrete || asked == Some(true)),
            )
        }
        // FSDP's CPU offload moves parameters, gradients and optimizer state together.
        Framework::Fsdp => (false, true),
        // Megatron-core's hybrid device optimizer offloads optimizer state only (0.12.0 on).
        Framework::Megatron => (
            crate::decision::frameworks::megatron_can_offload(job, facts),
            false,
        ),
        Framework::Generic => (true, false),
    };
    let whole_ok = fixed_ratio.is_none_or(|r| r >= 1.0);
    let bf16_states = bf16_states(job, facts, offload);
    Allowed {
        no_offload,
        offload,
        partial: if offload {
            partial
        } else {
            PartialRatio::No("offload is off".into())
        },
        whole_optimizer: offload && whole_optimizer && whole_ok,
        with_params: offload && with_params && whole_ok,
        trials: 0,
        partial_before_params: PARTIAL_BEFORE_PARAMS_UP_TO,
        cpu_note: None,
        bf16_states,
    }
}

/// Whether a DeepSpeed job may keep its optimizer state in bf16 under offload: DeepSpeed
/// 0.19.1 or newer, the job training in bf16 with ZeRO and offload possible; taken with the
/// job's consent (its spec, or its own config keeping the state in bf16), else offered (a
/// profile may consent).
fn bf16_states(job: &JobRequest, facts: &FrameworkFacts, offload: bool) -> Bf16States {
    let ds = &job.deepspeed;
    let takes = job.framework.name == Framework::DeepSpeed
        && offload
        && facts.stage >= 1
        && ds.bf16_in_config
        && ds.bf16_optimizer_states != Some(false)
        && facts.version.as_ref().is_some_and(|v| {
            offload_api::version::deepspeed::has(
                v,
                offload_api::version::deepspeed::BF16_OPTIMIZER_STATES,
            )
        });
    match (
        takes,
        ds.bf16_optimizer_states == Some(true) || ds.bf16_states_in_config,
    ) {
        (false, _) => Bf16States::Unavailable,
        (true, true) => Bf16States::Allowed,
        (true, false) => Bf16States::Offered,
    }
}

/// What the estimate counted the model as, for reasons.
pub(in crate::decision) fn model_note(jm: &JobMemory) -> String {
    if let Some(t) = &jm.traced {
        format!(
            " (model traced: {}, {} layers)",
            t.trace.model_class, t.trace.layers
        )
    } else if let Some(open) = jm.shape.open {
        format!(
            " (model counted as {:.2}B parameters, {}; {} not given: counted at the end of what the parameter count allows that keeps the most for backward — the other end is MLP {} with {} key/value heads; the model's config.json (spec.model.configMapRef) or those fields make the estimate exact)",
            jm.parameters / 1e9,
            jm.shape.describe(),
            open.missing(),
            open.other_intermediate,
            open.other_kv_heads
        )
    } else if jm.shape.known {
        format!(
            " (model counted as {:.2}B parameters, {})",
            jm.parameters / 1e9,
            jm.shape.describe()
        )
    } else {
        format!(
            " (model: {:.2}B parameters; its shape is not given, so a typical decoder of that size is assumed: spec.model.configMapRef or the shape fields make the estimate exact)",
            jm.parameters / 1e9
        )
    }
}

/// A placement chosen on `class`, with the model's figures and the note of how close to the
/// limit it comes.
fn chosen(
    jm: &JobMemory,
    class: &ClassMemory,
    placement: Placement,
    estimate: Estimate,
) -> MemoryChoice {
    let (brief, provenance) = jm.brief(&estimate, class);
    let mut figures = jm.describe(&estimate, class);
    if let Some(close) = jm.close_to_limit(&estimate, class) {
        figures.push_str("; ");
        figures.push_str(&close);
    }
    figures.push_str(&model_note(jm));
    if jm.bf16_states {
        figures.push_str("; the optimizer state in bf16 (consented: it changes the numerics), as nothing in fp32 fits");
    }
    MemoryChoice {
        placement,
        figures,
        brief,
        provenance,
        estimate,
        class: class.clone(),
        proven: false,
        trial: None,
        stepped: None,
        bf16_states: jm.bf16_states,
    }
}

/// Where the pod's cores decided that a partial share of `r` beats offloading parameters too
/// (a share above the one measured with 16 cores), what they allow.
fn partial_cores_note(allowed: &Allowed, r: f64) -> String {
    match &allowed.cpu_note {
        Some(cores) if r > PARTIAL_BEFORE_PARAMS_UP_TO && allowed.with_params => format!(
            "; with {cores}, a partial share up to {:.0}% runs faster than offloading parameters too (measured up to {:.0}% with the 16 cores of a PCIe H200's host: the CPU steps all of the optimizer state then, this share of it here)",
            allowed.partial_before_params * 100.0,
            PARTIAL_BEFORE_PARAMS_UP_TO * 100.0
        ),
        _ => String::new(),
    }
}

/// Where the pod's cores made parameters offloaded beat the partial share `r` the job needs.
fn params_cores_note(allowed: &Allowed, r: f64) -> String {
    allowed.cpu_note.as_ref().map_or_else(String::new, |cores| {
        format!(
            "; with {cores}, a partial share runs faster than offloading parameters too only up to {:.0}%, and this job needs {:.0}%",
            allowed.partial_before_params * 100.0,
            r * 100.0
        )
    })
}

/// The fastest placement `allowed` on `class` that fits, or everything tried.
pub(in crate::decision) fn fastest(
    jm: &JobMemory,
    class: &ClassMemory,
    allowed: &Allowed,
) -> Result<MemoryChoice, Tried> {
    let mut tried = Tried::default();
    let choice = |placement: Placement, estimate: Estimate| chosen(jm, class, placement, estimate);
    let try_fixed = |placement: Placement, tried: &mut Tried| {
        let (est, fit) = jm.estimate_checked(placement, class);
        tried.0.push((placement, est, fit));
        fit.ok().then_some(est)
    };
    if allowed.no_offload
        && let Some(est) = try_fixed(Placement::NoOffload, &mut tried)
    {
        return Ok(choice(Placement::NoOffload, est));
    }
    if !allowed.offload {
        return Err(tried);
    }
    let partial = match &allowed.partial {
        PartialRatio::Free(floor) => jm.smallest_ratio(class, *floor),
        PartialRatio::Fixed(r) => {
            try_fixed(Placement::PartialOptimizer(*r), &mut tried).map(|est| (*r, est))
        }
        PartialRatio::No(_) => None,
    };
    if let Some((r, est)) = partial
        && r <= allowed.partial_before_params
    {
        let mut c = choice(Placement::PartialOptimizer(r), est);
        c.figures.push_str(&partial_cores_note(allowed, r));
        return Ok(c);
    }
    if allowed.with_params
        && let Some(est) = try_fixed(Placement::OptimizerAndParams, &mut tried)
    {
        let mut c = choice(Placement::OptimizerAndParams, est);
        if let Some((r, _)) = partial {
            c.figures.push_str(&params_cores_note(allowed, r));
        }
        return Ok(c);
    }
    if let Some((r, est)) = partial {
        return Ok(choice(Placement::PartialOptimizer(r), est));
    }
    if matches!(allowed.partial, PartialRatio::Free(_)) {
        // Record what the largest partial share would need, for the message.
        let (est, fit) = jm.estimate_checked(Placement::PartialOptimizer(0.99), class);
        tried.0.push((Placement::PartialOptimizer(0.99), est, fit));
    }
    if allowed.whole_optimizer
        && let Some(est) = try_fixed(Placement::Optimizer, &mut tried)
    {
        return Ok(choice(Placement::Optimizer, est));
    }
    // Nothing in fp32 fits: the state in bf16, where the job consented.
    if allowed.bf16_states == Bf16States::Allowed
        && !jm.bf16_states
        && let Ok(c) = fastest(&jm.with_bf16_states(), class, &in_bf16(allowed))
    {
        return Ok(c);
    }
    Err(tried)
}

/// What a job may take with its optimizer state in bf16: offload only (the rung is under
/// offload), and no second bf16 rung.
fn in_bf16(allowed: &Allowed) -> Allowed {
    Allowed {
        no_offload: false,
        bf16_states: Bf16States::Unavailable,
        ..allowed.clone()
    }
}

impl Tried {
    /// What each placement tried needs, in one sentence.
    pub(in crate::decision) fn describe(&self, jm: &JobMemory, class: &ClassMemory) -> String {
        self.0
            .iter()
            .map(|(p, est, fit)| {
                let short = match (fit.gpu, fit.host) {
                    (false, false) => "GPU and host memory too small",
                    (false, true) => "GPU memory too small",
                    (true, false) => "host memory too small",
                    (true, true) => "fits",
                };
                format!("{p} {} ({short})", jm.describe(est, class))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// What would make a job that fits nowhere fit: more GPUs, ZeRO-3, a smaller micro-batch, a
/// larger pod limit, on `class` (the class with the largest GPUs).
pub(in crate::decision) fn advice(
    jm: &JobMemory,
    class: &ClassMemory,
    allowed: &Allowed,
) -> String {
    let mut ideas = Vec::new();
    zero3_advice(jm, class, allowed, &mut ideas);
    megatron_advice(jm, class, allowed, &mut ideas);
    bf16_advice(jm, class, allowed, &mut ideas);
    more_ranks_advice(jm, class, allowed, &mut ideas);
    step_advice(jm, class, allowed, &mut ideas);
    hints_advice(jm, class, allowed, &mut ideas);
    pod_limit_advice(jm, class, allowed, &mut ideas);
    if ideas.is_empty() {
        "no more GPUs, ZeRO stage or micro-batch found that would fit: it needs nodes with more GPU or host memory".to_string()
    } else {
        ideas.join("; ")
    }
}

/// The optimizer state in bf16 under offload, for a job that could take it without consent yet.
fn bf16_advice(jm: &JobMemory, class: &ClassMemory, allowed: &Allowed, ideas: &mut Vec<String>) {
    if allowed.bf16_states != Bf16States::Offered || jm.bf16_states {
        return;
    }
    if let Ok(c) = fastest(&jm.with_bf16_states(), class, &in_bf16(allowed)) {
        ideas.push(format!(
            "the optimizer state in bf16 under offload would fit as {} (spec.deepspeed.bf16OptimizerStates: true, or the profile's allowBf16OptimizerStates: it changes the numerics)",
            c.placement
        ));
    }
}

/// Twice the GPUs, up to the most advised, where that fits.
fn more_ranks_advice(
    jm: &JobMemory,
    class: &ClassMemory,
    allowed: &Allowed,
    ideas: &mut Vec<String>,
) {
    let mut ranks = jm.ranks.saturating_mul(2);
    while ranks <= MAX_ADVISED_RANKS {
        let more = jm.with_ranks(ranks);
        if let Ok(c) = fastest(&more, class, allowed) {
            ideas.push(format!(
                "with {ranks} GPUs in all (replicas × GPUs per pod; {} now) it would fit as {}",
                jm.ranks, c.placement
            ));
            break;
        }
        ranks = ranks.saturating_mul(2);
    }
}

/// Half the micro-batch, or activation checkpointing, where that fits.
fn step_advice(jm: &JobMemory, class: &ClassMemory, allowed: &Allowed, ideas: &mut Vec<String>) {
    if let Some(tokens) = jm.tokens
        && tokens > 1.0
    {
        let smaller = jm.with_tokens((tokens / 2.0).ceil());
        if let Ok(c) = fastest(&smaller, class, allowed) {
            ideas.push(format!(
                "half the micro-batch ({} tokens per GPU instead of {}) would fit as {}",
                (tokens / 2.0).ceil(),
                tokens,
                c.placement
            ));
        }
    }
    if !jm.checkpointing && jm.tokens.is_some() {
        let recomputed = JobMemory {
            checkpointing: true,
            ..jm.clone()
        };
        if let Ok(c) = fastest(&recomputed, class, allowed) {
            ideas.push(format!(
                "activation checkpointing (spec.model.activationCheckpointing) would fit as {}",
                c.placement
            ));
        }
    }
}

/// The other end of what the model's hints allow, where that fits: which hint decides it.
fn hints_advice(jm: &JobMemory, class: &ClassMemory, allowed: &Allowed, ideas: &mut Vec<String>) {
    if let Some(open) = jm.shape.open {
        let other = JobMemory {
            shape: crate::decision::model::shape::ModelShape {
                intermediate: open.other_intermediate,
                kv_heads: open.other_kv_heads,
                open: None,
                ..jm.shape
            },
            ..jm.clone()
        };
        if let Ok(c) = fastest(&other, class, allowed) {
            ideas.push(format!(
                "at the other end of what its hints allow (MLP {}, {} key/value heads) it would fit as {}: {} or the model's config.json (spec.model.configMapRef) decide it",
                open.other_intermediate,
                open.other_kv_heads,
                c.placement,
                open.missing()
            ));
        }
    }
}

/// A larger pod memory limit, where that fits.
fn pod_limit_advice(
    jm: &JobMemory,
    class: &ClassMemory,
    allowed: &Allowed,
    ideas: &mut Vec<String>,
) {
    if let Some(limit) = jm.pod_memory_limit {
        let unlimited = JobMemory {
            pod_memory_limit: None,
            ..jm.clone()
        };
        if let Ok(c) = fastest(&unlimited, class, allowed) {
            #[allow(clippy::cast_precision_loss)]
            ideas.push(format!(
                "a pod memory limit above {} ({} now) would fit as {}",
                gib(c.estimate.host_per_pod),
                gib(limit as f64),
                c.placement
            ));
        }
    }
}

/// Megatron-core's own ways to fit: the offload its version or layout cannot do (and what the
/// job would fit as with it), and twice the tensor-parallel size.
fn megatron_advice(
    jm: &JobMemory,
    class: &ClassMemory,
    allowed: &Allowed,
    ideas: &mut Vec<String>,
) {
    let Sharding::Megatron {
        tensor,
        model_parallel,
        distributed,
        sequence,
        unfused_attention,
        first_copy_freed,
    } = jm.sharding
    else {
        return;
    };
    // The job as Megatron-core would lay it out with other flags.
    let laid_out = |tensor, model_parallel, distributed, sequence| JobMemory {
        sharding: Sharding::Megatron {
            tensor,
            model_parallel,
            distributed,
            sequence,
            unfused_attention,
            first_copy_freed,
        },
        ..jm.clone()
    };
    if let PartialRatio::No(why) = &allowed.partial
        && allowed.offload
        && !allowed.whole_optimizer
    {
        let with = Allowed {
            partial: PartialRatio::Free(MIN_AUTO_RATIO),
            whole_optimizer: true,
            ..allowed.clone()
        };
        let sharded = laid_out(tensor, model_parallel, true, sequence);
        if let Ok(c) = fastest(&sharded, class, &with) {
            ideas.push(format!("{why}; with that it would fit as {}", c.placement));
        }
    }
    if tensor > 1 && !sequence {
        let split = laid_out(tensor, model_parallel, distributed, true);
        if let Ok(c) = fastest(&split, class, allowed) {
            ideas.push(format!(
                "sequence parallelism (--sequence-parallel, declared as spec.megatron.sequenceParallel or annotation offload.dev/megatron-sequence-parallel) would fit it as {}",
                c.placement
            ));
        }
    }
    let wider = tensor.saturating_mul(2);
    let groups = model_parallel.saturating_mul(2);
    if u64::from(groups) <= jm.ranks {
        let split = laid_out(wider, groups, distributed, sequence);
        if let Ok(c) = fastest(&split, class, allowed) {
            ideas.push(format!(
                "tensor-parallel size {wider} ({tensor} now: spec.megatron.tensorParallel, or annotation offload.dev/megatron-tensor-parallel on other kinds) would fit as {}",
                c.placement
            ));
        }
    }
}

/// ZeRO stage 3 for a job at stage 0 to 2: it shards parameters and gradients too.
fn zero3_advice(jm: &JobMemory, class: &ClassMemory, allowed: &Allowed, ideas: &mut Vec<String>) {
    if let Sharding::Zero(stage @ 0..=2) = jm.sharding {
        let z3 = JobMemory {
            sharding: Sharding::Zero(3),
            ..jm.clone()
        };
        let z3_allowed = Allowed {
            partial: match allowed.partial {
                PartialRatio::No(_) if allowed.offload => PartialRatio::Free(MIN_AUTO_RATIO),
                ref p => p.clone(),
            },
            with_params: allowed.offload,
            ..allowed.clone()
        };
        if let Ok(c) = fastest(&z3, class, &z3_allowed) {
            ideas.push(format!(
                "ZeRO stage 3 instead of {stage} shards parameters and gradients too: it would fit as {}",
                c.placement
            ));
        }
    }
}
