//! The placement step: which mode and node class the job gets on the nodes a profile may use
//! ([`crate::decision::ladder::candidates`]) — from the memory model where the job gives model hints ([`crate::decision::model::fit`]), and
//! only on a class that holds all of the job's pods at once.

use offload_api::v1alpha1::{
    ModeSetting, NodeClass, OffloadMode, OffloadProfileSpec, RatioSetting, UnknownSize,
};

use crate::decision::error::ResolveError;
use crate::decision::frameworks::FrameworkFacts;
use crate::decision::ladder::candidates::Candidates;
use crate::decision::ladder::candidates::ClassNodes;
use crate::decision::ladder::rungs;
use crate::decision::ladder::rungs::Allowed;
use crate::decision::ladder::rungs::MemoryChoice;
use crate::decision::model::fit;
use crate::decision::model::memory::JobMemory;
use crate::decision::model::memory::Placement;
use crate::decision::request::JobRequest;
use crate::decision::resolution::Why;
use crate::decision::resolution::short;
use crate::decision::settings::Source;
use crate::decision::settings::effective;
use offload_api::v1alpha1::ReasonCode;

mod capacity;
mod hintless;
use capacity::{capacity_message, holds, insufficient, shown_nodes};
use hintless::{auto_by_class, try_fastest};

/// The mode and the nodes it was chosen for, with a reason for each.
pub(in crate::decision) struct ModeAndClass<'c, 'a> {
    pub(in crate::decision) mode: OffloadMode,
    /// The class's nodes; `None` when offload is disabled and any GPU node will do.
    pub(in crate::decision) chosen: Option<&'c ClassNodes<'a>>,
    pub(in crate::decision) mode_why: Why,
    pub(in crate::decision) class_why: Why,
    /// What the memory model chose, where the job gives model hints.
    pub(in crate::decision) memory: Option<MemoryChoice>,
    /// For a job without hints on `unknownSize: TryFastest`: the rung of the offload ladder it
    /// is put on.
    pub(in crate::decision) rung: Option<Placement>,
}

impl ModeAndClass<'_, '_> {
    pub(in crate::decision) fn class(&self) -> Option<NodeClass> {
        self.chosen.map(|c| c.class)
    }
}

/// The reason for a configuration the memory model chose: its code from what chose it (the
/// model, what earlier runs proved, a trial), `prefix` (the configuration) and, where the model
/// chose, `reason`, then the deciding figures in brief; beside the whole account.
fn memory_why(
    base: ReasonCode,
    choice: &MemoryChoice,
    prefix: &str,
    reason: &str,
    message: String,
) -> Why {
    let (code, lead) = match (&choice.trial, choice.proven, &choice.stepped) {
        (Some(t), _, _) => (
            ReasonCode::FasterTrial,
            format!(
                "{prefix}: a trial, one rung faster than what trained ({} if it runs out)",
                short(t.fallback)
            ),
        ),
        (None, true, Some(s)) => (
            ReasonCode::ProvenByRuns,
            format!("{prefix}: the fastest that trained ({s})"),
        ),
        (None, true, None) => (
            ReasonCode::ProvenByRuns,
            format!("{prefix}: what runs of its shape proved"),
        ),
        (None, false, _) => (base, format!("{prefix}{reason}")),
    };
    Why::summed(
        code,
        format!("{lead}; {}{}", choice.brief, choice.provenance),
        message,
    )
}

/// The class reason of a job pinned to `class`.
fn pinned(message: String) -> Why {
    Why::new(ReasonCode::PinnedToClass, message)
}

/// The class reason of a job any GPU node can take.
fn any_class(message: &str) -> Why {
    Why::new(ReasonCode::AnyNodeClass, message)
}

/// The mode a class takes when its state is offloaded.
fn offload_mode(class: NodeClass) -> (OffloadMode, &'static str) {
    match class {
        NodeClass::Coherent => (
            OffloadMode::UnifiedMemory,
            "coherent nodes (ATS over NVLink-C2C) keep offloaded state resident in unified memory",
        ),
        NodeClass::Discrete => (
            OffloadMode::CpuCopy,
            "discrete nodes have no hardware-coherent host memory, so offload copies to host memory and back",
        ),
    }
}

/// The job's inputs to placement that do not depend on the class.
pub(in crate::decision) struct PlacementInputs<'j> {
    pub(in crate::decision) job: &'j JobRequest,
    pub(in crate::decision) facts: &'j FrameworkFacts,
    pub(in crate::decision) memory: Option<&'j JobMemory>,
    pub(in crate::decision) profile_name: &'j str,
    pub(in crate::decision) profile: &'j OffloadProfileSpec,
}

impl PlacementInputs<'_> {
    /// No GPU node has reported (or none matches the profile).
    fn no_nodes(&self) -> ResolveError {
        ResolveError::NoReportedNodes {
            profile: self.profile_name.to_string(),
        }
    }

    /// A ratio the job or the profile fixes, with where it comes from. A profile's partial
    /// ratio the framework cannot take is lowered to 1 (the ratio step says so); a job's is
    /// refused before placement.
    fn fixed_ratio(&self) -> Option<(f64, Source)> {
        match effective(
            self.job.offload.offload_ratio,
            self.profile.offload_ratio,
            RatioSetting::Auto,
        ) {
            (RatioSetting::Fixed(r), Source::Profile)
                if r < 1.0
                    && crate::decision::frameworks::partial_ratio_support(self.job, self.facts)
                        .is_err() =>
            {
                Some((1.0, Source::Profile))
            }
            (RatioSetting::Fixed(r), source) => Some((r, source)),
            (RatioSetting::Auto | RatioSetting::None, _) => None,
        }
    }

    fn allowed(&self, class: &ClassNodes, no_offload: bool, offload: bool) -> Allowed {
        let fixed = self.fixed_ratio();
        let mut allowed = rungs::allowed(
            self.job,
            self.facts,
            class.class,
            no_offload,
            offload,
            fixed.map(|(r, _)| r),
        );
        // The pod's CPU: fewer cores than the crossover was measured with keep a partial share
        // faster than offloading parameters too for longer.
        let cpus = class.fact(|nodes| {
            NodeCpus({
                let mut distinct: Vec<crate::decision::pod::cpu::NodeCpu> = Vec::new();
                for n in nodes {
                    let cpu = crate::decision::pod::cpu::NodeCpu::of(n);
                    if !distinct.contains(&cpu) {
                        distinct.push(cpu);
                    }
                }
                distinct
            })
        });
        (allowed.partial_before_params, allowed.cpu_note) =
            crate::decision::pod::cpu::partial_before_params(self.job, cpus.0.iter());
        // The profile's consent to the optimizer state in bf16.
        if allowed.bf16_states == rungs::Bf16States::Offered
            && self.profile.allow_bf16_optimizer_states
        {
            allowed.bf16_states = rungs::Bf16States::Allowed;
        }
        // Trials only where a failure is recovered from (a TrainingJob) and the share is the
        // operator's to choose.
        if self.job.identity.is_some() && fixed.is_none() && self.profile.learn_memory {
            allowed.trials = self.profile.faster_trials;
        }
        allowed
    }
}

/// What a class's nodes offer a pod's CPU, each distinct offer once.
struct NodeCpus(Vec<crate::decision::pod::cpu::NodeCpu>);

/// Decides mode and node class.
pub(in crate::decision) fn choose<'c, 'a>(
    cx: &PlacementInputs,
    candidates: &'c Candidates<'a>,
) -> Result<ModeAndClass<'c, 'a>, ResolveError> {
    let job = cx.job;
    let profile = cx.profile;
    let (requested, source) = effective(job.offload.mode, profile.mode, ModeSetting::Auto);
    match requested {
        ModeSetting::Disabled => disabled(cx, candidates, source),
        ModeSetting::UnifiedMemory => unified_requested(cx, candidates, source),
        ModeSetting::CpuCopy => copy_requested(cx, candidates, source),
        ModeSetting::Auto => {
            let classes = candidates.ordered(profile);
            if classes.is_empty() {
                return Err(cx.no_nodes());
            }
            match cx.memory {
                None if cx.profile.unknown_size == UnknownSize::TryFastest => {
                    try_fastest(cx, &classes, source)
                }
                None => auto_by_class(cx, &classes, source),
                Some(jm) => auto_by_memory(cx, jm, &classes, source),
            }
        }
    }
}

/// UnifiedMemory, as the job or profile asks: on the coherent nodes, or why there are none.
fn unified_requested<'c, 'a>(
    cx: &PlacementInputs,
    candidates: &'c Candidates<'a>,
    source: Source,
) -> Result<ModeAndClass<'c, 'a>, ResolveError> {
    let coherent = &candidates.coherent;
    if coherent.is_empty() {
        if let Some(detail) = candidates.left_out(NodeClass::Coherent) {
            return Err(ResolveError::TemplateLeavesNoNodes {
                profile: cx.profile_name.to_string(),
                class: " of class Coherent (mode UnifiedMemory)".into(),
                detail: detail.to_string(),
            });
        }
        if candidates.is_empty() {
            return Err(cx.no_nodes());
        }
        return Err(ResolveError::NoCoherentNodes {
            profile: cx.profile_name.to_string(),
            discrete: candidates.discrete.len(),
        });
    }
    explicit(
        cx,
        coherent,
        OffloadMode::UnifiedMemory,
        format!(
            "UnifiedMemory requested by {source}; {} coherent node(s) available",
            coherent.len()
        ),
        format!("mode UnifiedMemory (from {source})"),
    )
}

/// CPUCopy, as the job or profile asks: on the discrete nodes, else on coherent ones where the
/// profile allows it.
fn copy_requested<'c, 'a>(
    cx: &PlacementInputs,
    candidates: &'c Candidates<'a>,
    source: Source,
) -> Result<ModeAndClass<'c, 'a>, ResolveError> {
    let coherent = &candidates.coherent;
    let discrete = &candidates.discrete;
    if !discrete.is_empty() {
        explicit(
            cx,
            discrete,
            OffloadMode::CpuCopy,
            format!(
                "CPUCopy requested by {source}; {} discrete node(s) available",
                discrete.len()
            ),
            format!("mode CPUCopy (from {source})"),
        )
    } else if coherent.is_empty() {
        Err(cx.no_nodes())
    } else if cx.profile.allow_cpu_copy_on_coherent_nodes {
        explicit(
            cx,
            coherent,
            OffloadMode::CpuCopy,
            format!(
                "CPUCopy requested by {source} on coherent nodes, which profile {:?} allows (allowCPUCopyOnCoherentNodes)",
                cx.profile_name
            ),
            format!("mode CPUCopy (from {source})"),
        )
    } else {
        Err(ResolveError::CopyOnCoherentNotAllowed {
            profile: cx.profile_name.to_string(),
            coherent: coherent.len(),
        })
    }
}

/// An offload mode the job or profile asks for, on `class`: the class must hold the job, and
/// with model hints the offload written is the fastest that fits there.
fn explicit<'c, 'a>(
    cx: &PlacementInputs,
    class: &'c ClassNodes<'a>,
    mode: OffloadMode,
    mode_why: String,
    setting: String,
) -> Result<ModeAndClass<'c, 'a>, ResolveError> {
    let mode_why = Why::new(ReasonCode::ModeRequested, mode_why);
    if !holds(class, cx.job) {
        return Err(insufficient(cx.job, &[class]));
    }
    let memory = match cx.memory {
        None => None,
        Some(jm) => {
            let allowed = cx.allowed(class, false, true);
            let Some((cm, outcome)) =
                fit::fastest_by_gpu_size(jm, class, cx.job, &allowed, &|t| holds(t, cx.job))
            else {
                return Err(no_gpu_memory(class));
            };
            match outcome {
                Ok(choice) => Some(choice),
                Err(tried) => {
                    let setting = match cx.fixed_ratio() {
                        Some((r, source)) if r < 1.0 => {
                            format!("{setting} with offloadRatio {r} (from {source})")
                        }
                        _ => setting,
                    };
                    return Err(ResolveError::ConfigurationDoesNotFit {
                        setting,
                        placement: "offload".into(),
                        detail: format!(
                            "on {} nodes, {}; {}",
                            class.class,
                            tried.describe(jm, &cm),
                            rungs::advice(jm, &cm, &allowed)
                        ),
                    });
                }
            }
        }
    };
    Ok(ModeAndClass {
        mode,
        chosen: Some(class),
        mode_why,
        class_why: pinned(capacity_message(class, cx.job)),
        memory,
        rung: None,
    })
}

fn no_gpu_memory(class: &ClassNodes) -> ResolveError {
    ResolveError::DoesNotFit {
        detail: format!(
            "no {} node's report states its GPUs' memory ({}), so the job's fit cannot be judged: check the agent on those nodes",
            class.class,
            shown_nodes(class)
        ),
    }
}

/// `mode: Disabled` from the job or profile. With model hints the job must fit without
/// offload: on every class (then any GPU node will do) or on one (then it is pinned there).
fn disabled<'c, 'a>(
    cx: &PlacementInputs,
    candidates: &'c Candidates<'a>,
    source: Source,
) -> Result<ModeAndClass<'c, 'a>, ResolveError> {
    let mode_why = format!("offload disabled by {source}");
    let Some(jm) = cx.memory else {
        return Ok(ModeAndClass {
            mode: OffloadMode::Disabled,
            chosen: None,
            mode_why: Why::new(ReasonCode::ModeRequested, mode_why),
            class_why: any_class(
                "no node class required: without offload the configuration fits any GPU node",
            ),
            memory: None,
            rung: None,
        });
    };
    let classes = candidates.ordered(cx.profile);
    if classes.is_empty() {
        return Err(cx.no_nodes());
    }
    let mut fitting: Vec<(&ClassNodes, MemoryChoice)> = Vec::new();
    let mut failures = Vec::new();
    for class in &classes {
        let Some(cm) = fit::class_memory(class, cx.job) else {
            continue;
        };
        let allowed = cx.allowed(class, true, false);
        match rungs::fastest(jm, &cm, &allowed) {
            Ok(choice) if holds(class, cx.job) => fitting.push((class, choice)),
            Ok(_) => {}
            Err(tried) => failures.push(format!(
                "on {} nodes {}; {}",
                class.class,
                tried.describe(jm, &cm),
                rungs::advice(jm, &cm, &cx.allowed(class, true, true))
            )),
        }
    }
    let Some((first, choice)) = fitting.first() else {
        if failures.is_empty() {
            return Err(insufficient(cx.job, &classes));
        }
        return Err(ResolveError::ConfigurationDoesNotFit {
            setting: format!("mode Disabled (from {source})"),
            placement: "no offload".into(),
            detail: format!(
                "{}; set mode Auto to offload what does not fit",
                failures.join("; ")
            ),
        });
    };
    let everywhere = fitting.len() == classes.len();
    Ok(ModeAndClass {
        mode: OffloadMode::Disabled,
        chosen: (!everywhere).then_some(*first),
        mode_why: memory_why(
            ReasonCode::ModeRequested,
            choice,
            &mode_why,
            "",
            format!("{mode_why}; {}", choice.figures),
        ),
        class_why: if everywhere {
            any_class("no node class required: the job fits without offload on every class")
        } else {
            pinned(format!(
                "it fits without offload only on {} nodes; {}",
                first.class,
                capacity_message(first, cx.job)
            ))
        },
        memory: Some(choice.clone()),
        rung: None,
    })
}

/// The fastest configuration by GPU memory on each class that holds the job, or why there is none.
fn fits_by_class<'c, 'a>(
    cx: &PlacementInputs,
    jm: &JobMemory,
    holding: &[&'c ClassNodes<'a>],
) -> Vec<(&'c ClassNodes<'a>, Result<MemoryChoice, String>)> {
    let mut results: Vec<(&'c ClassNodes<'a>, Result<MemoryChoice, String>)> = Vec::new();
    for class in holding {
        let allowed = cx.allowed(class, true, true);
        let Some((cm, outcome)) =
            fit::fastest_by_gpu_size(jm, class, cx.job, &allowed, &|t| holds(t, cx.job))
        else {
            results.push((class, Err(no_gpu_memory(class).to_string())));
            continue;
        };
        let outcome = outcome.map_err(|tried| {
            format!(
                "on {} nodes {}; {}",
                class.class,
                tried.describe(jm, &cm),
                rungs::advice(jm, &cm, &allowed)
            )
        });
        results.push((class, outcome));
    }
    results
}

/// Disabled, where some class holds the job without offload: that runs several times faster
/// than offloading.
fn without_offload<'c, 'a>(
    cx: &PlacementInputs,
    results: &[(&'c ClassNodes<'a>, Result<MemoryChoice, String>)],
    classes: &[&'c ClassNodes<'a>],
    source: Source,
) -> Option<ModeAndClass<'c, 'a>> {
    let without: Vec<&ClassNodes> = results
        .iter()
        .filter(|(_, r)| matches!(r, Ok(c) if c.placement == Placement::NoOffload))
        .map(|(c, _)| *c)
        .collect();
    let first = without.first()?;
    let choice = results
        .iter()
        .find_map(|(c, r)| (c.class == first.class).then_some(r))
        .and_then(|r| r.as_ref().ok())
        .cloned();
    let everywhere = without.len() == classes.len();
    let figures = choice
        .as_ref()
        .map(|c| c.figures.clone())
        .unwrap_or_default();
    Some(ModeAndClass {
        mode: OffloadMode::Disabled,
        chosen: (!everywhere).then_some(*first),
        mode_why: {
            let message = format!(
                "Auto (from {source}) chose Disabled: {figures}: fits without offload, which runs several times faster than offloading"
            );
            match &choice {
                Some(c) => memory_why(
                    ReasonCode::FitsWithoutOffload,
                    c,
                    "Disabled",
                    ": fits without offload",
                    message,
                ),
                None => Why::new(ReasonCode::FitsWithoutOffload, message),
            }
        },
        class_why: if everywhere {
            any_class("no node class required: the job fits without offload on every class")
        } else {
            pinned(format!(
                "{} nodes hold the job without offload; {}",
                first.class,
                capacity_message(first, cx.job)
            ))
        },
        memory: choice,
        rung: None,
    })
}

/// `mode: Auto` with model hints: a class where the job fits without offload comes first,
/// then the first in the profile's order where some offload fits; only classes that hold the
/// job's pods at once count.
fn auto_by_memory<'c, 'a>(
    cx: &PlacementInputs,
    jm: &JobMemory,
    classes: &[&'c ClassNodes<'a>],
    source: Source,
) -> Result<ModeAndClass<'c, 'a>, ResolveError> {
    let holding: Vec<&ClassNodes> = classes
        .iter()
        .copied()
        .filter(|c| holds(c, cx.job))
        .collect();
    if holding.is_empty() {
        return Err(insufficient(cx.job, classes));
    }
    let results = fits_by_class(cx, jm, &holding);
    if let Some(disabled) = without_offload(cx, &results, classes, source) {
        return Ok(disabled);
    }
    let Some((pick, choice)) = results
        .iter()
        .find_map(|(c, r)| r.as_ref().ok().map(|choice| (*c, choice.clone())))
    else {
        let failures: Vec<&str> = results
            .iter()
            .filter_map(|(_, r)| r.as_ref().err().map(String::as_str))
            .collect();
        return Err(ResolveError::DoesNotFit {
            detail: format!(
                "the job's training state fits no node class matching the profile, with or without offload: {}",
                failures.join("; ")
            ),
        });
    };
    let (mode, why_mode) = offload_mode(pick.class);
    let earlier: Vec<String> = results
        .iter()
        .take_while(|(c, _)| c.class != pick.class)
        .map(|(c, _)| format!("{} nodes cannot hold it", c.class))
        .collect();
    let class_why = if earlier.is_empty() {
        capacity_message(pick, cx.job)
    } else {
        format!("{}; {}", earlier.join(", "), capacity_message(pick, cx.job))
    };
    let without = fit::class_memory(pick, cx.job)
        .map(|cm| jm.estimate_checked(Placement::NoOffload, &cm).0.gpu)
        .map_or_else(String::new, |gpu| {
            format!(
                " ({}/GPU without)",
                crate::decision::model::memory::gib(gpu)
            )
        });
    let what = match choice.placement {
        Placement::NoOffload => "nothing".to_string(),
        Placement::PartialOptimizer(r) => format!("{:.0}% of optimizer state", r * 100.0),
        Placement::Optimizer => "the optimizer state".to_string(),
        Placement::OptimizerAndParams => "optimizer and parameters".to_string(),
    };
    let message = format!(
        "Auto (from {source}) chose {mode}: the job does not fit in GPU memory without offload ({}), so {}; {why_mode}",
        no_offload_figures(jm, cx, pick),
        choice.placement,
    );
    Ok(ModeAndClass {
        mode,
        chosen: Some(pick),
        mode_why: memory_why(
            ReasonCode::SmallestOffloadThatFits,
            &choice,
            &format!("{mode}, {what} offloaded"),
            &without,
            message,
        ),
        class_why: pinned(class_why),
        memory: Some(choice),
        rung: None,
    })
}

/// What the job would need on the class without offload, GPU side.
fn no_offload_figures(jm: &JobMemory, cx: &PlacementInputs, class: &ClassNodes) -> String {
    match fit::class_memory(class, cx.job) {
        Some(cm) => {
            let (est, _) = jm.estimate_checked(Placement::NoOffload, &cm);
            format!(
                "it needs about {} per GPU, more than the {} usable on {}",
                crate::decision::model::memory::gib(est.gpu),
                crate::decision::model::memory::gib(jm.gpu_budget(&cm)),
                cm.gpu_node
            )
        }
        None => String::new(),
    }
}
