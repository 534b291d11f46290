//! The offload-ratio step: the share of optimizer state offloaded — the smallest share that
//! fits where the job gives model hints, fixed by the job or profile, or 1 — and whether the
//! CPU keeps up with it (from the node report's rates and the step's tokens).

use offload_api::v1alpha1::{ModelHints, OffloadMode, OffloadProfileSpec, RatioSetting};

use super::candidates::ClassNodes;
use super::error::ResolveError;
use super::framework::{FrameworkFacts, partial_ratio_support};
use super::memory::Placement;
use super::placement::ModeAndClass;
use super::request::JobRequest;
use super::settings::{Source, effective};

/// The ratio and why.
pub(super) fn decide(
    job: &JobRequest,
    profile: &OffloadProfileSpec,
    facts: &FrameworkFacts,
    placement: &ModeAndClass,
) -> Result<(f64, String), ResolveError> {
    if placement.mode == OffloadMode::Disabled {
        return Ok((0.0, "None: nothing is offloaded".to_string()));
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
    let cpu = |ratio: f64| cpu_note(job.model.as_ref(), placement.chosen, ratio);
    // What the memory model placed decides where it placed anything.
    if let Some(choice) = &placement.memory {
        return Ok(match (choice.placement, requested) {
            (Placement::PartialOptimizer(r), RatioSetting::Fixed(_)) => (
                r,
                format!("{r}: set by {source}; {}{}", choice.figures, cpu(r)),
            ),
            // What earlier runs proved chose the share (what trained, or a trial).
            (Placement::PartialOptimizer(r), RatioSetting::Auto | RatioSetting::None)
                if choice.proven =>
            {
                (r, format!("{r}: {}{}", choice.figures, cpu(r)))
            }
            (Placement::PartialOptimizer(r), RatioSetting::Auto | RatioSetting::None) => (
                r,
                format!(
                    "{r}: the smallest share of optimizer state whose offload fits ({}){}",
                    choice.figures,
                    cpu(r)
                ),
            ),
            (Placement::Optimizer | Placement::OptimizerAndParams, _) => (
                1.0,
                format!(
                    "1: all optimizer state offloaded ({}){}",
                    choice.figures,
                    cpu(1.0)
                ),
            ),
            (Placement::NoOffload, _) => (1.0, "1: nothing is offloaded".to_string()),
        });
    }
    Ok(match requested {
        RatioSetting::Fixed(r) if r < 1.0 => match (&support, source) {
            (Ok(()), _) => (r, format!("{r}: set by {source}{}", cpu(r))),
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
                format!("1: the profile asks for {r}, lowered because {why}"),
            ),
        },
        RatioSetting::Fixed(r) => (r, format!("{r}: set by {source}")),
        RatioSetting::Auto | RatioSetting::None => match job.model {
            None => (
                1.0,
                "1: Auto without model hints offloads all optimizer state (set spec.model.parameters to offload only what does not fit)"
                    .to_string(),
            ),
            Some(_) => (1.0, format!("1: Auto{}", cpu(1.0))),
        },
    })
}

/// Whether the CPU keeps up with offloading `ratio` of the optimizer state: the share it can
/// update within the GPU's backward time on the slowest chosen node, from the report's rates
/// and the step's tokens. Empty when that cannot be known.
fn cpu_note(model: Option<&ModelHints>, chosen: Option<&ClassNodes>, ratio: f64) -> String {
    let (Some(hints), Some(class)) = (model, chosen) else {
        return String::new();
    };
    let Some(tokens) = hints.tokens_per_step else {
        return String::new();
    };
    let rates = class.fact(CpuRates::of);
    #[allow(clippy::cast_precision_loss)]
    let tokens = tokens as f64;
    let worst: Option<(f64, &str)> = match &*rates {
        CpuRates::Unknown => return String::new(),
        CpuRates::Known {
            first,
            slowest: (rate, node),
        } => {
            // Backward of a transformer costs about 4 FLOP per parameter per token; the CPU
            // updates the whole model's optimizer state (all ranks share the node's CPUs).
            // (4·P·t / gpu) / (P / cpu): the parameter count cancels. The share grows with
            // cpu/gpu for tokens > 0, so the node of the least cpu/gpu has the least share
            // (without tokens every share is 0, and the first node is named).
            let share = 4.0 * tokens * rate;
            let node = if tokens > 0.0 { node } else { first };
            share.is_finite().then_some((share, node.as_str()))
        }
    };
    match worst {
        None => String::new(),
        Some((share, _)) if share >= 1.0 => format!(
            "; the CPU keeps up: it updates all of the optimizer state within the GPU's backward time on every chosen node ({:.1}× headroom)",
            share.min(999.0)
        ),
        Some((share, node)) if share >= ratio => format!(
            "; the CPU keeps up: on {node}, the slowest chosen node, it updates {:.0}% of the optimizer state within the GPU's backward time, more than the {ratio} offloaded",
            share * 100.0
        ),
        Some((share, node)) => format!(
            "; on {node}, the slowest chosen node, the CPU can update only {:.0}% of optimizer state within the GPU's backward time, so at {ratio} the CPU is the bottleneck of each step",
            share * 100.0
        ),
    }
}

/// What the chosen nodes' reports say of their CPUs' update rate against their GPUs': the node
/// of the least `cpu_update_rate / gpu_flops` (the first by name of equals) and the first node;
/// `Unknown` where a node has no readable report, no rates, or rates that are not positive.
enum CpuRates {
    Unknown,
    Known {
        first: String,
        slowest: (f64, String),
    },
}

impl CpuRates {
    fn of(nodes: &mut dyn Iterator<Item = &crate::index::NodeInfo>) -> CpuRates {
        let mut first: Option<String> = None;
        let mut slowest: Option<(f64, String)> = None;
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
            first.get_or_insert_with(|| node.name.clone());
            let rate = cpu / gpu;
            if slowest.as_ref().is_none_or(|(w, _)| rate < *w) {
                slowest = Some((rate, node.name.clone()));
            }
        }
        match (first, slowest) {
            (Some(first), Some(slowest)) => CpuRates::Known { first, slowest },
            _ => CpuRates::Unknown,
        }
    }
}
