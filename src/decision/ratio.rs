//! The offload-ratio step: the share of optimizer state offloaded, fixed by the job or
//! profile, or sized from the node report and the model hints (`Auto`).

use crate::api::{ModelHints, OffloadMode, OffloadProfileSpec, RatioSetting};

use super::error::ResolveError;
use super::framework::{FrameworkFacts, partial_ratio_support};
use super::placement::{ClassNodes, Placement};
use super::request::JobRequest;
use super::{MIN_AUTO_RATIO, Source, effective};

/// The ratio and why.
pub(super) fn decide(
    job: &JobRequest,
    profile: &OffloadProfileSpec,
    facts: &FrameworkFacts,
    placement: &Placement,
) -> Result<(f64, String), ResolveError> {
    if placement.mode == OffloadMode::Disabled {
        return Ok((
            1.0,
            "1: offload is disabled, the ratio has no effect".to_string(),
        ));
    }
    let support = partial_ratio_support(job, facts);
    let (requested, source) = effective(
        job.offload.offload_ratio,
        profile.offload_ratio,
        RatioSetting::Auto,
    );
    if let RatioSetting::Fixed(r) = requested
        && !(r > 0.0 && r <= 1.0)
    {
        return Err(ResolveError::RatioOutOfRange {
            value: r,
            origin: source.to_string(),
        });
    }
    Ok(match requested {
        RatioSetting::Fixed(r) if r < 1.0 => match (&support, source) {
            (Ok(()), _) => (r, format!("{r}: set by {source}")),
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
        RatioSetting::Auto => {
            let (auto, why) = auto_ratio(job.model, placement.chosen);
            match (&support, auto < 1.0) {
                (Err(cannot), true) => (
                    1.0,
                    format!("1: {why}, which would give {auto}, lowered because {cannot}"),
                ),
                _ => (auto, format!("{auto}: {why}")),
            }
        }
    })
}

/// `offloadRatio: Auto`: the share of optimizer state the CPU can update within the GPU's
/// backward time, on the slowest chosen node.
fn auto_ratio(model: Option<ModelHints>, chosen: Option<&ClassNodes>) -> (f64, String) {
    let Some(hints) = model else {
        return (
            1.0,
            "Auto without model hints offloads all optimizer state (set spec.model to size it)"
                .to_string(),
        );
    };
    let Some(class) = chosen else {
        return (
            1.0,
            "Auto without nodes offloads all optimizer state".to_string(),
        );
    };
    let mut worst: Option<(f64, &str)> = None;
    for node in &class.nodes {
        let Some(report) = node.parsed_report() else {
            return (
                1.0,
                format!(
                    "Auto offloads all optimizer state: node {} has no readable report with CPU and GPU rates",
                    node.name
                ),
            );
        };
        let (Some(cpu), Some(gpu)) = (report.selftest.cpu_update_rate, report.selftest.gpu_flops)
        else {
            return (
                1.0,
                format!(
                    "Auto offloads all optimizer state: the report of node {} lacks CPU update or GPU rates",
                    node.name
                ),
            );
        };
        if cpu <= 0.0 || gpu <= 0.0 {
            return (
                1.0,
                format!(
                    "Auto offloads all optimizer state: node {} reports a zero rate",
                    node.name
                ),
            );
        }
        // Backward of a transformer costs about 4 FLOP per parameter per token.
        #[allow(clippy::cast_precision_loss)]
        let t_backward = 4.0 * hints.parameters as f64 * hints.tokens_per_step as f64 / gpu;
        #[allow(clippy::cast_precision_loss)]
        let t_cpu_all = hints.parameters as f64 / cpu;
        let share = t_backward / t_cpu_all;
        if worst.is_none_or(|(w, _)| share < w) {
            worst = Some((share, node.name.as_str()));
        }
    }
    match worst {
        None => (
            1.0,
            "Auto offloads all optimizer state: no chosen node".to_string(),
        ),
        Some((share, _)) if share >= 1.0 => (
            1.0,
            format!(
                "Auto: the CPU updates all optimizer state within the GPU's backward time on every chosen node ({share:.2}× headroom)"
            ),
        ),
        Some((share, node)) => {
            // Round down to two decimals so the CPU share never exceeds what was measured.
            let ratio = ((share * 100.0).floor() / 100.0).max(MIN_AUTO_RATIO);
            (
                ratio,
                format!(
                    "Auto: on {node}, the slowest chosen node, the CPU can update {:.0}% of optimizer state within the GPU's backward time",
                    share * 100.0
                ),
            )
        }
    }
}
