//! Placement for jobs without model hints: `unknownSize: TryFastest`'s ladder, one rung per GPU
//! out-of-memory failure, and `mode: Auto`'s first class that holds the job's pods.

use offload_api::v1alpha1::{NodeClass, OffloadMode, ReasonCode};

use crate::decision::error::ResolveError;
use crate::decision::ladder::candidates::ClassNodes;
use crate::decision::ladder::placement::ModeAndClass;
use crate::decision::ladder::placement::PlacementInputs;
use crate::decision::ladder::placement::any_class;
use crate::decision::ladder::placement::capacity::capacity_message;
use crate::decision::ladder::placement::capacity::insufficient;
use crate::decision::ladder::placement::fit;
use crate::decision::ladder::placement::offload_mode;
use crate::decision::ladder::placement::pinned;
use crate::decision::model::memory::Placement;
use crate::decision::resolution::Why;
use crate::decision::settings::Source;

/// `mode: Auto` without model hints on `unknownSize: TryFastest`: the rung of the offload
/// ladder (no offload; all optimizer state; optimizer state and parameters where the framework
/// can offload them) that the job's GPU out-of-memory failures have reached — one rung per
/// failure, from the fastest.
pub(in crate::decision::ladder::placement) fn try_fastest<'c, 'a>(
    cx: &PlacementInputs,
    classes: &[&'c ClassNodes<'a>],
    source: Source,
) -> Result<ModeAndClass<'c, 'a>, ResolveError> {
    let mut ladder = vec![Placement::NoOffload, Placement::Optimizer];
    let params = match cx.job.framework.name {
        offload_api::v1alpha1::Framework::DeepSpeed => cx.facts.stage == 3,
        offload_api::v1alpha1::Framework::Fsdp => true,
        offload_api::v1alpha1::Framework::Megatron | offload_api::v1alpha1::Framework::Generic => {
            false
        }
    };
    // A Megatron-core without the hybrid device optimizer has no rung past the first.
    if cx.job.framework.name == offload_api::v1alpha1::Framework::Megatron
        && !crate::decision::frameworks::megatron_can_offload(cx.job, cx.facts)
    {
        ladder.truncate(1);
    }
    if params {
        ladder.push(Placement::OptimizerAndParams);
    }
    let failed = cx
        .job
        .memory_failures
        .iter()
        .filter(|f| f.kind == offload_api::v1alpha1::MemoryKind::Gpu)
        .count();
    let at = failed.min(ladder.len() - 1);
    let rung = ladder[at];
    let said = match failed {
        0 => "starts without offload, the fastest configuration".to_string(),
        n => format!(
            "ran out of GPU memory {n} time(s), so it is on rung {} of {}: {rung}",
            at + 1,
            ladder.len()
        ),
    };
    let why = format!(
        "Auto (from {source}) without model hints, and profile {:?} has unknownSize TryFastest: the job {said}; each time it runs out of GPU memory it is decided again one rung further (no offload, the optimizer state, then parameters too); set spec.model.parameters to size it instead",
        cx.profile_name
    );
    let brief = format!("Auto without model hints on unknownSize TryFastest: the job {said}");
    if rung == Placement::NoOffload {
        return Ok(ModeAndClass {
            mode: OffloadMode::Disabled,
            chosen: None,
            mode_why: Why::summed(ReasonCode::TryFastest, brief, why),
            class_why: any_class(
                "no node class required: without offload the configuration fits any GPU node",
            ),
            memory: None,
            rung: Some(rung),
        });
    }
    let mut placed = auto_by_class(cx, classes, source)?;
    placed.mode_why = Why::summed(
        ReasonCode::TryFastest,
        brief,
        format!(
            "{why}; {}",
            offload_mode(placed.class().unwrap_or(NodeClass::Discrete)).1
        ),
    );
    placed.rung = Some(rung);
    Ok(placed)
}

/// `mode: Auto` without model hints: the first class in the profile's order that holds the
/// job's pods at once, and the mode that class takes.
pub(in crate::decision::ladder::placement) fn auto_by_class<'c, 'a>(
    cx: &PlacementInputs,
    classes: &[&'c ClassNodes<'a>],
    source: Source,
) -> Result<ModeAndClass<'c, 'a>, ResolveError> {
    let first = classes[0];
    let fits_now =
        |c: &ClassNodes| fit::pod_capacity(c, cx.job.gpus_per_pod) >= u64::from(cx.job.pods.max(1));
    let pick = match classes.iter().copied().find(|c| fits_now(c)) {
        Some(c) => c,
        None if !cx.job.hold_for_capacity => first,
        None => return Err(insufficient(cx.job, classes)),
    };
    let (mode, why_mode) = offload_mode(pick.class);
    let class_why = if classes.len() == 1 {
        format!("only {} nodes match the profile", pick.class)
    } else if std::ptr::eq(pick, first) && fits_now(pick) {
        format!(
            "{} comes first in the profile's nodeClassOrder and has enough GPUs",
            pick.class
        )
    } else if std::ptr::eq(pick, first) {
        format!(
            "no class has {} GPUs; {} comes first in nodeClassOrder",
            cx.job.gpu_demand(),
            pick.class
        )
    } else {
        format!(
            "{} comes earlier in nodeClassOrder but has too few GPUs ({} of {})",
            first.class,
            first.gpus(),
            cx.job.gpu_demand()
        )
    };
    Ok(ModeAndClass {
        mode,
        chosen: Some(pick),
        mode_why: Why::summed(
            ReasonCode::NoModelHints,
            format!(
                "Auto chose {mode} with all optimizer state offloaded: without model hints the job's size is unknown; spec.model lets it offload only what does not fit"
            ),
            format!(
                "Auto (from {source}) chose {mode}: {why_mode}; set spec.model.parameters to let the operator skip offload when the job fits in GPU memory"
            ),
        ),
        class_why: pinned(format!("{class_why}; {}", capacity_message(pick, cx.job))),
        memory: None,
        rung: None,
    })
}
