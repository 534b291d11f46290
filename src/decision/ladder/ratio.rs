//! The offload-ratio step: the share of optimizer state offloaded — the smallest share that
//! fits where the job gives model hints, fixed by the job or profile, or 1 — and whether the
//! CPU keeps up with it (from the node report's rates and the step's tokens).

use crate::decision::resolution::Why;
use offload_api::v1alpha1::ReasonCode;
use offload_api::v1alpha1::{OffloadMode, OffloadProfileSpec, RatioSetting};

use crate::decision::error::ResolveError;
use crate::decision::frameworks::FrameworkFacts;
use crate::decision::frameworks::partial_ratio_support;
use crate::decision::ladder::candidates::ClassNodes;
use crate::decision::ladder::placement::ModeAndClass;
use crate::decision::ladder::rungs::MemoryChoice;
use crate::decision::model::memory::Placement;
use crate::decision::pod::cpu::NodeCpu;
use crate::decision::pod::cpu::PodCores;
use crate::decision::request::JobRequest;
use crate::decision::settings::Source;
use crate::decision::settings::effective;

/// The ratio and why.
pub(in crate::decision) fn resolve_ratio(
    job: &JobRequest,
    profile: &OffloadProfileSpec,
    facts: &FrameworkFacts,
    placement: &ModeAndClass,
) -> Result<(f64, Why), ResolveError> {
    if placement.mode == OffloadMode::Disabled {
        return Ok((
            0.0,
            Why::new(ReasonCode::NothingOffloaded, "None: nothing is offloaded"),
        ));
    }
    let support = partial_ratio_support(job, facts);
    let (requested, source) = match effective(
        job.offload.offload_ratio,
        profile.offload_ratio,
        RatioSetting::Auto,
    ) {
        // `None` goes only with mode Disabled (the schema's rule); anywhere else it asks for
        // nothing in particular.
        (RatioSetting::None, source) => (RatioSetting::Auto, source),
        other => other,
    };
    if let RatioSetting::Fixed(r) = requested
        && !RatioSetting::is_valid_ratio(r)
    {
        return Err(ResolveError::RatioOutOfRange {
            value: r,
            origin: source.to_string(),
        });
    }
    let cpu = |ratio: f64| cpu_note(job, placement.chosen, ratio);
    // What the memory model placed decides where it placed anything.
    if let Some(choice) = &placement.memory {
        return Ok(by_memory(choice, requested, source, &cpu));
    }
    by_request(job, requested, source, &support, &cpu)
}

/// The ratio where the memory model placed nothing: what the job or profile asks for (a share
/// below 1 only where the framework can offload part), else all of the optimizer state.
fn by_request(
    job: &JobRequest,
    requested: RatioSetting,
    source: Source,
    support: &Result<(), String>,
    cpu: &dyn Fn(f64) -> CpuNote,
) -> Result<(f64, Why), ResolveError> {
    Ok(match requested {
        RatioSetting::Fixed(r) if r < 1.0 => match (&support, source) {
            (Ok(()), _) => (
                r,
                Why::new(
                    ReasonCode::RatioRequested,
                    format!("{r}: set by {source}{}", cpu(r).text),
                ),
            ),
            (Err(why), Source::Job) => {
                return Err(ResolveError::FrameworkCannot {
                    problem: format!(
                        "spec.offload.offloadRatio {r} needs partial offload, but {why}"
                    ),
                    change: "set spec.offload.offloadRatio to 1 or Auto".to_string(),
                });
            }
            (Err(why), Source::Profile) => (
                1.0,
                Why::new(
                    ReasonCode::RatioLowered,
                    format!("1: the profile asks for {r}, lowered because {why}"),
                ),
            ),
        },
        RatioSetting::Fixed(r) => (
            r,
            Why::new(ReasonCode::RatioRequested, format!("{r}: set by {source}")),
        ),
        RatioSetting::Auto | RatioSetting::None => match job.model {
            None => (
                1.0,
                Why::new(
                    ReasonCode::NoModelHints,
                    "1: Auto without model hints offloads all optimizer state (set spec.model.parameters to offload only what does not fit)",
                ),
            ),
            Some(_) => (
                1.0,
                Why::new(
                    ReasonCode::WholeOptimizerState,
                    format!("1: Auto{}", cpu(1.0).text),
                ),
            ),
        },
    })
}

/// The ratio where the memory model placed the state: the share it chose (or what runs proved,
/// or a trial), with the deciding figures and whether the CPU keeps up.
fn by_memory(
    choice: &MemoryChoice,
    requested: RatioSetting,
    source: Source,
    cpu: &dyn Fn(f64) -> CpuNote,
) -> (f64, Why) {
    let figures = &choice.figures;
    let (ratio, code, lead, account) = match (choice.placement, requested) {
        (Placement::PartialOptimizer(r), RatioSetting::Fixed(_)) => (
            r,
            ReasonCode::RatioRequested,
            format!("{r}: set by {source}"),
            format!("{r}: set by {source}; {figures}"),
        ),
        // What earlier runs proved chose the share (what trained, or a trial).
        (Placement::PartialOptimizer(r), RatioSetting::Auto | RatioSetting::None)
            if choice.proven =>
        {
            let code = if choice.trial.is_some() {
                ReasonCode::FasterTrial
            } else {
                ReasonCode::ProvenByRuns
            };
            (
                r,
                code,
                format!("{r}: what runs of its shape showed"),
                format!("{r}: {figures}"),
            )
        }
        (Placement::PartialOptimizer(r), RatioSetting::Auto | RatioSetting::None) => (
            r,
            ReasonCode::SmallestShareThatFits,
            format!("{r}: the smallest share that fits"),
            format!("{r}: the smallest share of optimizer state whose offload fits ({figures})"),
        ),
        (Placement::Optimizer | Placement::OptimizerAndParams, _) => (
            1.0,
            ReasonCode::WholeOptimizerState,
            "1: all optimizer state offloaded".to_string(),
            format!("1: all optimizer state offloaded ({figures})"),
        ),
        (Placement::NoOffload, _) => {
            return (
                1.0,
                Why::new(ReasonCode::NothingOffloaded, "1: nothing is offloaded"),
            );
        }
    };
    let note = cpu(ratio);
    (
        ratio,
        Why::summed(
            code,
            format!("{lead}: {}{}", choice.brief, note.brief()),
            format!("{account}{}", note.text),
        ),
    )
}

/// The CPU check's account, and its verdict where it could be made.
pub(in crate::decision) struct CpuNote {
    /// The account, `; …` to append to a reason (empty where no verdict).
    text: String,
    /// Whether the CPU updates the offloaded share within the GPU's backward time.
    keeps_up: Option<bool>,
}

impl CpuNote {
    fn none() -> Self {
        CpuNote {
            text: String::new(),
            keeps_up: None,
        }
    }

    /// The verdict in a few words, for a reason's sentence.
    fn brief(&self) -> &'static str {
        match self.keeps_up {
            Some(true) => "; the CPU keeps up",
            Some(false) => "; the CPU is the bottleneck of each step",
            None => "",
        }
    }
}

/// Whether the CPU keeps up with offloading `ratio` of the optimizer state: the share the
/// training container's own cores ([`crate::decision::pod::cpu`]) can update within the GPU's backward time
/// on the slowest chosen node, from the report's rates and the step's tokens. Empty when that
/// cannot be known.
pub(in crate::decision) fn cpu_note(
    job: &JobRequest,
    chosen: Option<&ClassNodes>,
    ratio: f64,
) -> CpuNote {
    let (Some(hints), Some(class)) = (job.model.as_ref(), chosen) else {
        return CpuNote::none();
    };
    let Some(tokens) = hints.tokens_per_step else {
        return CpuNote::none();
    };
    let rates = class.fact(CpuRates::of);
    let CpuRates::Known(nodes) = &*rates else {
        return CpuNote::none();
    };
    #[allow(clippy::cast_precision_loss)]
    let tokens = tokens as f64;
    // Backward of a transformer costs about 4 FLOP per parameter per token; the CPU updates
    // the whole model's optimizer state. (4·P·t / gpu) / (P / cpu): the parameter count
    // cancels. The node of the least share for this job's cores counts.
    let Some((share, node, cores)) = nodes
        .iter()
        .map(|n| {
            let cores = PodCores::of(job, &n.cpu);
            let scale = match (&cores, n.cpu.threads) {
                (Some(c), Some(t)) => c.share_of(t),
                _ => 1.0,
            };
            (4.0 * tokens * n.rate * scale, n, cores)
        })
        .filter(|(s, _, _)| s.is_finite())
        .min_by(|a, b| a.0.total_cmp(&b.0))
    else {
        return CpuNote::none();
    };
    let whose = match (&cores, node.cpu.threads) {
        (Some(c), Some(t)) if c.share_of(t) < 1.0 => format!(
            " with {} of the {t:.0} threads its self-test measured",
            c.describe()
        ),
        (Some(c), _) => format!(" with {}", c.describe()),
        (None, _) => String::new(),
    };
    let keeps_up = share >= ratio;
    let text = if share >= 1.0 {
        format!(
            "; the CPU keeps up: it updates all of the optimizer state within the GPU's backward time on every chosen node{whose} ({:.1}× headroom)",
            share.min(999.0)
        )
    } else if share >= ratio {
        format!(
            "; the CPU keeps up: on {}, the slowest chosen node{whose}, it updates {:.0}% of the optimizer state within the GPU's backward time, more than the {ratio} offloaded",
            node.name,
            share * 100.0
        )
    } else {
        format!(
            "; on {}, the slowest chosen node{whose}, the CPU can update only {:.0}% of optimizer state within the GPU's backward time, so at {ratio} the CPU is the bottleneck of each step",
            node.name,
            share * 100.0
        )
    };
    CpuNote {
        text,
        keeps_up: Some(keeps_up),
    }
}

/// One distinct node of a class as the CPU check sees it: its CPU rate over its GPU rate and
/// what it offers a pod's CPU (nodes alike are kept once, the first by name).
struct RatedNode {
    name: String,
    rate: f64,
    cpu: NodeCpu,
}

/// What the chosen nodes' reports say of their CPUs' update rate against their GPUs', each
/// distinct node once; `Unknown` where a node has no readable report, no rates, or rates that
/// are not positive.
enum CpuRates {
    Unknown,
    Known(Vec<RatedNode>),
}

impl CpuRates {
    fn of(nodes: &mut dyn Iterator<Item = &crate::index::NodeInfo>) -> CpuRates {
        let mut out: Vec<RatedNode> = Vec::new();
        for node in nodes {
            let Some(report) = node.parsed_report() else {
                return CpuRates::Unknown;
            };
            let (Some(cpu), Some(gpu)) =
                (report.selftest.cpu_update_rate, report.selftest.gpu_flops)
            else {
                return CpuRates::Unknown;
            };
            if !(cpu > 0.0 && gpu > 0.0) {
                return CpuRates::Unknown;
            }
            let rated = RatedNode {
                name: node.name.clone(),
                rate: cpu / gpu,
                cpu: NodeCpu::of(node),
            };
            if !out
                .iter()
                .any(|o| o.rate.to_bits() == rated.rate.to_bits() && o.cpu == rated.cpu)
            {
                out.push(rated);
            }
        }
        if out.is_empty() {
            CpuRates::Unknown
        } else {
            CpuRates::Known(out)
        }
    }
}
