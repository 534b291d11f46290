//! [`resolve_offload`]: the decision's steps in order, each giving its value and its reason.

use crate::index::NodeIndex;
use offload_api::report::NodeMemoryModel;
use offload_api::v1alpha1::{NodeClass, OffloadMode, OffloadProfileSpec, RatioSetting};

use super::error::ResolveError;
use super::request::JobRequest;
use super::resolution::{Field, MemoryEstimate, MemoryRequest, Reason, Resolution, Why};
use super::settings::MAX_EXCLUDED_NODES;
use crate::decision::frameworks;
use crate::decision::frameworks::FrameworkPlan;
use crate::decision::ladder::candidates;
use crate::decision::ladder::overlap;
use crate::decision::ladder::pinning;
use crate::decision::ladder::placement;
use crate::decision::ladder::ratio;
use crate::decision::ladder::rungs;
use crate::decision::model::fit;
use crate::decision::model::memory;
use crate::decision::model::sizing;
use offload_api::v1alpha1::ReasonCode;

#[derive(Default)]
struct Reasons(Vec<Reason>);

impl Reasons {
    fn add(&mut self, field: Field, why: Why) {
        self.0.push(Reason {
            field,
            code: why.code,
            message: why.message,
            summary: why.summary,
        });
    }
}

/// Every reason's sentence for status fits [`super::resolution::MAX_SHORT_CHARS`] as
/// written, in every decision the tests make; only sentences that list names (nodes,
/// containers, claims), whose length the cluster sets, may be cut at a clause.
#[cfg(test)]
fn within_bound(reasons: &[Reason]) {
    use super::resolution::MAX_SHORT_CHARS;
    for r in reasons {
        let listing = matches!(
            r.code,
            ReasonCode::WholeCoresNotAsked
                | ReasonCode::PinnedToClass
                | ReasonCode::ClaimsPinned
                | ReasonCode::OverlapNotVerified
                | ReasonCode::PinnedMemoryUnavailable
        );
        let sentence = r.summary.as_deref().unwrap_or(&r.message);
        assert!(
            listing || sentence.chars().count() <= MAX_SHORT_CHARS,
            "{} ({} characters) is over the bound: {sentence}",
            r.code,
            sentence.chars().count()
        );
        assert!(r.short().chars().count() <= MAX_SHORT_CHARS + 1);
    }
}

/// Resolves a job's offload configuration.
///
/// `profile_name` and `profile` are the profile the job uses (see
/// [`select_profile`](super::selection::select_profile)); `nodes` is every node the caller
/// knows (nodes that are not candidates are skipped).
pub fn resolve_offload(
    job: &JobRequest,
    profile_name: &str,
    profile: &OffloadProfileSpec,
    nodes: &NodeIndex,
) -> Result<Resolution, ResolveError> {
    let facts = frameworks::check(job)?;
    partial_ratio_supported(job, &facts)?;
    let memory = sizing::job_memory(job, &facts, profile_name)?;
    let mut reasons = Reasons::default();
    // Nodes whose agent and GPU driver disagree: a claim-pinned job's affinity excludes them
    // by name (its claims' selectors see only the driver's word); past a bound it is pinned by
    // the agent's labels instead.
    let exclude_nodes = disagreeing_nodes(job, nodes);
    let by_claims = job.gpu_claims.is_some() && exclude_nodes.len() <= MAX_EXCLUDED_NODES;
    let candidates =
        candidates::Candidates::select(nodes, profile_name, profile, by_claims, &job.constraints)?;
    let placement = placement::choose(
        &placement::PlacementInputs {
            job,
            facts: &facts,
            memory: memory.as_ref(),
            profile_name,
            profile,
        },
        &candidates,
    )?;
    megatron_can_take(job, &facts, &placement)?;
    reasons.add(Field::Mode, placement.mode_why.clone());
    let (memory_request, whole_cores) = host_side(job, profile, &placement, &mut reasons);

    let settings = Settings::of(job, profile, &facts, &placement, &mut reasons)?;
    let memory_plan = memory_plan(job, &placement, memory.as_ref());
    let (framework, state) = framework_plan(
        job,
        &facts,
        &placement,
        &settings,
        memory_plan,
        whole_cores.is_some(),
        &mut reasons,
    );
    let (gpu_claims, exclude_nodes) =
        claim_pinning(job, &placement, by_claims, exclude_nodes, &mut reasons);
    let chosen = placement.memory.as_ref();
    #[cfg(test)]
    within_bound(&reasons.0);
    Ok(Resolution {
        profile: profile_name.to_string(),
        mode: placement.mode,
        overlap: settings.overlap,
        ratio: settings.ratio,
        pin_memory: settings.pin_memory,
        node_class: placement.class(),
        node_selector: profile.node_selector.clone(),
        overlap_efficiency: settings.overlap_efficiency,
        framework,
        reasons: reasons.0,
        startup_guard: profile.startup_guard,
        report_allocator_peaks: profile.report_allocator_peaks,
        memory: memory_estimate(&placement, memory.as_ref()),
        gpu_claims,
        exclude_nodes,
        gpu_claim_entries: job.gpu_claim_entries.clone(),
        placement: state,
        trial: chosen.and_then(|c| c.trial.clone()),
        memory_why: chosen.map(|c| c.figures.clone()),
        proven: chosen.is_some_and(|c| c.proven && c.trial.is_none()),
        stepped: chosen.and_then(|c| c.stepped.clone()),
        cpu_cores: whole_cores.map_or_else(
            || job.cpu_limit.as_ref().map(|(c, _)| *c),
            |w| Some(f64::from(w.cores)),
        ),
        whole_cores,
        cpu_threads: cpu_threads(job),
        memory_request,
        requested: job.offload.clone(),
        training_container: job.training_container.map(|(i, _)| i),
    })
}

/// The settings of the chosen placement, each with its reason, and whether the profile allows
/// ZenFlow.
struct Settings {
    overlap: bool,
    overlap_efficiency: Option<f64>,
    pin_memory: bool,
    ratio: f64,
    allow_zen_flow: bool,
}

impl Settings {
    fn of(
        job: &JobRequest,
        profile: &OffloadProfileSpec,
        facts: &frameworks::FrameworkFacts,
        placement: &placement::ModeAndClass<'_, '_>,
        reasons: &mut Reasons,
    ) -> Result<Settings, ResolveError> {
        let (overlap, overlap_efficiency, why) = overlap::resolve_overlap(job, profile, placement);
        reasons.add(Field::Overlap, why);
        let (pin_memory, why) = pinning::resolve_pinning(job, profile, placement);
        reasons.add(Field::PinMemory, why);
        let (ratio, why) = ratio::resolve_ratio(job, profile, facts, placement)?;
        reasons.add(Field::OffloadRatio, why);
        Ok(Settings {
            overlap,
            overlap_efficiency,
            pin_memory,
            ratio,
            allow_zen_flow: profile.allow_zen_flow,
        })
    }
}

/// The framework's own settings for the decision, with their reasons (and the threads'), and
/// where the state it keeps is placed.
fn framework_plan(
    job: &JobRequest,
    facts: &frameworks::FrameworkFacts,
    placement: &placement::ModeAndClass<'_, '_>,
    settings: &Settings,
    memory_plan: frameworks::MemoryPlan,
    whole_cores: bool,
    reasons: &mut Reasons,
) -> (FrameworkPlan, memory::Placement) {
    let (framework, whys) = frameworks::plan(
        job,
        facts,
        placement.mode,
        settings.overlap,
        settings.ratio,
        placement.class(),
        settings.allow_zen_flow,
        memory_plan,
    );
    let setup = superoffload_setup(&framework, placement);
    for why in whys
        .into_iter()
        .chain(setup)
        .chain(threads_reason(job, whole_cores))
    {
        reasons.add(Field::Framework, why);
    }
    let state = state_placement(
        placement.mode,
        settings.ratio,
        &framework,
        memory_plan.placement,
    );
    (framework, state)
}

/// The Grace nodes of a class whose kernel lacks MPAM's resctrl: how many, and the first few
/// with what each lacks.
struct SetupLacking {
    count: usize,
    first: Vec<String>,
}

/// Where SuperOffload is written for Grace nodes whose kernel lacks MPAM's resctrl (its setup
/// guidance: resctrl partitions and the CPU optimizer bound to the GPU's NUMA node), which
/// nodes and what they lack: it runs, sharing caches and memory bandwidth with everything else.
fn superoffload_setup(
    framework: &FrameworkPlan,
    placement: &placement::ModeAndClass<'_, '_>,
) -> Option<Why> {
    if !matches!(framework, FrameworkPlan::DeepSpeed(p) if p.super_offload) {
        return None;
    }
    // A fact of the class's nodes, worked out once per index whatever the job.
    // A fact of the class's nodes, worked out once per index whatever the job.
    let lacking = placement.chosen?.fact(|nodes| {
        let all: Vec<String> = nodes
            .filter_map(|n| {
                let report = n.parsed_report()?;
                let grace = report.cpu_architecture.as_deref() == Some("aarch64");
                let lacks = match report.resctrl {
                    Some(r) if !r.supported => "no resctrl in its kernel (MPAM off)",
                    Some(r) if !r.mounted => "resctrl not mounted",
                    _ => return None,
                };
                grace.then(|| format!("{} ({lacks})", n.name))
            })
            .collect();
        SetupLacking {
            count: all.len(),
            first: all.into_iter().take(4).collect(),
        }
    });
    let (count, lacking) = (lacking.count, &lacking.first);
    if lacking.is_empty() {
        return None;
    }
    Some(Why::summed(
        ReasonCode::SuperOffloadSetup,
        format!(
            "SuperOffload without its setup on {count} Grace node(s): no MPAM resctrl partitions, so the CPU optimizer shares caches and memory bandwidth"
        ),
        format!(
            "SuperOffload on nodes whose kernel lacks what its setup guidance on Grace asks for — an MPAM kernel with resctrl partitions and the CPU optimizer bound to the GPU's NUMA node: {}; it runs, with the CPU optimizer sharing caches and memory bandwidth",
            lacking.join(", ")
        ),
    ))
}

/// The memory model's figures for the placement chosen; a trial's budget is the one it was
/// checked against ([`crate::decision::runs::proven`]).
fn memory_estimate(
    placement: &placement::ModeAndClass<'_, '_>,
    memory: Option<&memory::JobMemory>,
) -> Option<MemoryEstimate> {
    match (placement.memory.as_ref(), memory) {
        (Some(c), Some(jm)) => Some(match c.trial {
            Some(_) => MemoryEstimate::of(&jm.as_trial(), &c.estimate, &c.class),
            None => MemoryEstimate::of(jm, &c.estimate, &c.class),
        }),
        _ => None,
    }
}

/// The host side of the decision: the host memory the training container is asked to request
/// for the chosen configuration, and the whole cores the profile asks for where it does, each
/// with its reason (the memory request's under the mode, then the node class's reason, then the
/// cores').
fn host_side(
    job: &JobRequest,
    profile: &OffloadProfileSpec,
    placement: &placement::ModeAndClass<'_, '_>,
    reasons: &mut Reasons,
) -> (
    Option<MemoryRequest>,
    Option<crate::decision::pod::whole_cores::WholeCores>,
) {
    let memory_request = memory_request(job, placement.memory.as_ref());
    if let Some(why) = memory_request.map(|r| memory_request_reason(job, &r)) {
        reasons.add(Field::Mode, why);
    }
    reasons.add(Field::NodeClass, placement.class_why.clone());
    let (whole_cores, why) = crate::decision::pod::whole_cores::ask(
        job,
        profile.whole_cores,
        placement.mode,
        placement.chosen,
        memory_request,
    );
    if let Some(why) = why {
        reasons.add(Field::Mode, why);
    }
    (memory_request, whole_cores)
}

/// A Megatron job whose decision needs offload its Megatron-core cannot do (a profile's mode,
/// an old version, no distributed optimizer) is refused, with what would let it run.
fn megatron_can_take(
    job: &JobRequest,
    facts: &frameworks::FrameworkFacts,
    placement: &placement::ModeAndClass<'_, '_>,
) -> Result<(), ResolveError> {
    if job.framework.name != offload_api::v1alpha1::Framework::Megatron
        || placement.mode == OffloadMode::Disabled
    {
        return Ok(());
    }
    match frameworks::megatron_offload_blocker(job, facts.version.as_ref()) {
        None => Ok(()),
        Some(b) => Err(ResolveError::FrameworkCannot {
            problem: format!(
                "{}; the decision needs offload: {}",
                b.problem, placement.mode_why.message
            ),
            change: format!(
                "{}, or use a profile whose mode lets the job run without offload",
                b.change
            ),
        }),
    }
}

/// Where the framework keeps the state the placement chose, and the sub-group size the
/// operator picks for a job that sets none.
fn memory_plan(
    job: &JobRequest,
    placement: &placement::ModeAndClass<'_, '_>,
    memory: Option<&memory::JobMemory>,
) -> frameworks::MemoryPlan {
    frameworks::MemoryPlan {
        placement: placement
            .memory
            .as_ref()
            .map(|c| c.placement)
            .or(placement.rung),
        rung: placement.memory.is_none() && placement.rung.is_some(),
        bf16_states: placement.memory.as_ref().is_some_and(|c| c.bf16_states),
        sub_group_size: match (memory, job.config.sub_group_size) {
            (Some(jm), None) => Some(memory::operator_sub_group_size(jm.parameters, jm.ranks)),
            _ => None,
        },
    }
}

/// The CPU threads a pod's optimizer step uses: its whole cores, at least one.
fn cpu_threads(job: &JobRequest) -> Option<u32> {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    job.cpu_limit
        .as_ref()
        .map(|(c, _)| (c.floor() as u32).max(1))
}

/// Why the training process gets the threads it does, where its container has a CPU limit:
/// said whether or not anything is offloaded, since the render writes them either way. With
/// whole cores asked (`whole`) the limit is a cpuset of its own, which OpenMP's default counts
/// right already.
fn threads_reason(job: &JobRequest, whole: bool) -> Option<Why> {
    let (cores, whose) = job.cpu_limit.as_ref()?;
    let threads = cpu_threads(job)?;
    if whole {
        return Some(Why::new(
            ReasonCode::CpuThreads,
            format!(
                "CPU threads: OMP_NUM_THREADS={threads} where the training container sets none — its {cores} whole cores of its own"
            ),
        ));
    }
    let whose = whose.as_ref().map_or_else(String::new, |name| {
        format!(", LimitRange {name:?}'s default")
    });
    Some(Why::summed(
        ReasonCode::CpuThreads,
        format!(
            "OMP_NUM_THREADS={threads} where the training container sets none: its CPU limit is {cores} cores{whose}"
        ),
        format!(
            "CPU threads: OMP_NUM_THREADS={threads} where the training container sets none — its CPU limit is {cores} cores{whose}, a CFS quota that a thread per visible core would fight (DeepSpeed's CPU Adam starts one OpenMP thread per core it sees: under a 2-core quota on a 16-core H100 node a step took 9.9 s with that default and 5.5 s with 2 threads)"
        ),
    ))
}

/// Where the configuration puts the training state: what the model placed (or the rung), else
/// what the mode, the ratio and the framework's keys say.
fn state_placement(
    mode: OffloadMode,
    ratio: f64,
    framework: &FrameworkPlan,
    placed: Option<memory::Placement>,
) -> memory::Placement {
    if let Some(p) = placed {
        return p;
    }
    let params = match framework {
        FrameworkPlan::DeepSpeed(d) => d.offload_params,
        FrameworkPlan::Fsdp(f) => f.offload_params,
        FrameworkPlan::Megatron(_) | FrameworkPlan::Generic => false,
    };
    match mode {
        OffloadMode::Disabled => memory::Placement::NoOffload,
        _ if params => memory::Placement::OptimizerAndParams,
        _ if ratio < 1.0 => memory::Placement::PartialOptimizer(ratio),
        _ => memory::Placement::Optimizer,
    }
}

/// The training container's memory request where the chosen placement's host estimate is more
/// than the user requests (rounded up to MiB); never lower than the user's.
fn memory_request(job: &JobRequest, choice: Option<&rungs::MemoryChoice>) -> Option<MemoryRequest> {
    const MIB: u64 = 1 << 20;
    let (container, requested) = job.training_container?;
    let bytes = memory::bytes(choice?.estimate.host_per_pod)
        .div_ceil(MIB)
        .saturating_mul(MIB);
    if requested.is_some_and(|r| r >= bytes) {
        return None;
    }
    // The LimitRanger refuses a request below its floor, so the written one is never lower.
    let (bytes, at_floor) = match &job.memory_request_floor {
        Some((least, _)) if *least > bytes => (*least, true),
        _ => (bytes, false),
    };
    Some(MemoryRequest {
        container,
        bytes,
        raised_from: requested,
        at_floor,
    })
}

fn memory_request_reason(job: &JobRequest, r: &MemoryRequest) -> Why {
    #[allow(clippy::cast_precision_loss)]
    let gib = |b: u64| memory::gib(b as f64);
    let from = match r.raised_from {
        Some(was) => format!("raised from {}", gib(was)),
        None => "it requested none".to_string(),
    };
    let limit = job
        .pod_memory_limit
        .map(|l| format!(", within its limit of {}", gib(l)))
        .unwrap_or_default();
    // At a LimitRange's floor, the range comes first: the short form keeps what to change.
    if let Some((_, floor)) = job.memory_request_floor.as_ref().filter(|_| r.at_floor) {
        return Why::new(
            ReasonCode::HostMemoryRequested,
            format!(
                "host memory: container {} requests {}: {floor}, above what this configuration counts on ({from}{limit})",
                r.container,
                gib(r.bytes)
            ),
        );
    }
    Why::new(
        ReasonCode::HostMemoryRequested,
        format!(
            "host memory: the training container (the pod template's container {}) requests {} ({from}){limit}: what this configuration counts on, so the scheduler and quota systems (Kueue) see it",
            r.container,
            gib(r.bytes)
        ),
    )
}

/// A fixed partial ratio the framework cannot write is refused, saying what to change.
fn partial_ratio_supported(
    job: &JobRequest,
    facts: &frameworks::FrameworkFacts,
) -> Result<(), ResolveError> {
    if let (RatioSetting::Fixed(r), Err(why)) = (
        job.offload.offload_ratio,
        frameworks::partial_ratio_support(job, facts),
    ) && r < 1.0
    {
        return Err(ResolveError::FrameworkCannot {
            problem: format!("spec.offload.offloadRatio {r} needs partial offload, but {why}"),
            change: "set spec.offload.offloadRatio to 1 or Auto".to_string(),
        });
    }
    Ok(())
}

/// For a job with GPU claims: the nodes whose agent and GPU driver disagree (its affinity
/// excludes them by name, as its claims' selectors see only the driver's word).
fn disagreeing_nodes(job: &JobRequest, nodes: &NodeIndex) -> Vec<String> {
    if job.gpu_claims.is_none() {
        return Vec::new();
    }
    // Worked out once per index (a fact of its nodes, whatever the job).
    let found: Result<_, std::convert::Infallible> = nodes.memo("disagreeing nodes", || {
        Ok(nodes
            .nodes()
            .filter(|n| {
                matches!(
                    n.witness(),
                    crate::index::Witness::Disagree | crate::index::Witness::Confirmed
                )
            })
            .map(|n| n.name.clone())
            .collect::<Vec<String>>())
    });
    match found {
        Ok(names) => names.as_ref().clone(),
        Err(never) => match never {},
    }
}

/// The claim pinning written for a claim-pinned job (and the nodes it excludes), with its
/// reason; none for a job pinned by the agent's labels.
fn claim_pinning(
    job: &JobRequest,
    placement: &placement::ModeAndClass,
    by_claims: bool,
    exclude_nodes: Vec<String>,
    reasons: &mut Reasons,
) -> (Option<crate::dra::claims::ClaimPinning>, Vec<String>) {
    match (placement.class(), &job.gpu_claims) {
        (Some(class), Some(pinning)) if by_claims => {
            let claims = pinning
                .claims
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ");
            let excluded = if exclude_nodes.is_empty() {
                String::new()
            } else {
                format!(
                    "; nodes whose agent and driver disagree are excluded: {}",
                    exclude_nodes.join(", ")
                )
            };
            reasons.add(
                Field::NodeClass,
                Why::summed(
                    ReasonCode::ClaimsPinned,
                    format!("GPUs from DRA claims ({claims}): copies select only {class} GPUs{excluded}"),
                    format!(
                        "GPUs from DRA claims ({claims}): each claim's template is copied with a selector on the GPU driver's addressingMode attribute, so the scheduler allocates only {class} GPUs{excluded}"
                    ),
                ),
            );
            if placement.memory.is_some() {
                reasons.add(
                    Field::NodeClass,
                    Why::new(
                        ReasonCode::ClaimsPinned,
                        "the copies also select GPUs by memory capacity: at least what this configuration needs on each",
                    ),
                );
            }
            (Some(pinning.clone()), exclude_nodes)
        }
        // Any class will do, but the GPUs must hold the configuration: the copies select by
        // memory alone.
        (None, Some(pinning)) if by_claims && placement.memory.is_some() => {
            reasons.add(
                Field::NodeClass,
                Why::new(ReasonCode::ClaimsPinned, format!(
                    "GPUs from DRA claims ({}): each claim's template is copied with a selector on the device's memory capacity, so the scheduler allocates only GPUs this configuration fits on",
                    pinning.claims.keys().cloned().collect::<Vec<_>>().join(", "),
                )),
            );
            (Some(pinning.clone()), exclude_nodes)
        }
        _ => (None, Vec::new()),
    }
}

/// The memory model's figures for `placement` of a job on a class's nodes, and whether it
/// fits there; `None` without model hints or when the class has no node with a report of its
/// GPUs' memory. For `explain --candidates`, which shows every candidate beside the node's
/// figures, also those the decision would not write.
pub fn estimate_placement(
    job: &JobRequest,
    profile_name: &str,
    profile: &OffloadProfileSpec,
    nodes: &NodeIndex,
    class: NodeClass,
    placement: memory::Placement,
) -> Result<Option<(MemoryEstimate, bool)>, ResolveError> {
    let facts = frameworks::check(job)?;
    let Some(jm) = sizing::job_memory(job, &facts, profile_name)? else {
        return Ok(None);
    };
    let candidates = candidates::Candidates::select(
        nodes,
        profile_name,
        profile,
        job.gpu_claims.is_some(),
        &job.constraints,
    )?;
    let Some(cm) = fit::class_memory(candidates.of(class), job) else {
        return Ok(None);
    };
    let (est, fits) = jm.estimate_checked(placement, &cm);
    Ok(Some((MemoryEstimate::of(&jm, &est, &cm), fits.ok())))
}

/// Whether a memory model may host a configuration made for a class: the invariant the
/// affinity enforces, stated once so tests can check it.
pub fn class_admits(class: NodeClass, model: NodeMemoryModel) -> bool {
    match class {
        NodeClass::Coherent => model == NodeMemoryModel::Coherent,
        NodeClass::Discrete => matches!(model, NodeMemoryModel::Hmm | NodeMemoryModel::Discrete),
    }
}
