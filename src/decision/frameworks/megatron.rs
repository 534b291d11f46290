//! Megatron-core: what the declared version and layout can take, and its hybrid device
//! optimizer as the decision sets it.

use crate::decision::resolution::Why;
use offload_api::v1alpha1::ReasonCode;
use offload_api::v1alpha1::{ModeSetting, OffloadMode};
use offload_api::version::{self, FrameworkVersion};

use super::{FrameworkFacts, FrameworkPlan, MANUAL_GC_INTERVAL, MegatronPlan, say};
use crate::decision::error::ResolveError;
use crate::decision::request::JobRequest;

/// Why Megatron-core cannot offload a job's optimizer state, and what would let it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::decision) struct Blocker {
    /// What Megatron-core refuses, in its own terms.
    pub(in crate::decision) problem: String,
    /// What to change.
    pub(in crate::decision) change: String,
}

/// Why Megatron-core cannot offload this job's optimizer state, if it cannot, as its
/// `megatron/training/arguments.py` asserts: the hybrid device optimizer came in 0.12.0; it
/// runs through `--use-precision-aware-optimizer`, which takes the distributed optimizer and
/// `--optimizer adam` alone; with `--fp8-param-gather` it needs the delayed FP8 recipe; and it
/// does not run under Megatron-FSDP.
pub(in crate::decision) fn megatron_offload_blocker(
    job: &JobRequest,
    version: Option<&FrameworkVersion>,
) -> Option<Blocker> {
    use offload_api::v1alpha1::{Fp8Recipe, MegatronOptimizer};
    let at = version::deepspeed::show(version::megatron::CPU_OFFLOAD);
    let m = &job.megatron;
    let blocker = |problem: String, change: &str| {
        Some(Blocker {
            problem,
            change: change.to_string(),
        })
    };
    match version {
        None => blocker(
            "the Megatron-core version is unknown".to_string(),
            "declare the image's Megatron-core version (spec.framework.version)",
        ),
        Some(v) if !version::megatron::has(v, version::megatron::CPU_OFFLOAD) => blocker(
            format!("Megatron-core {v} has no optimizer offload (--optimizer-cpu-offload came in {at})"),
            &format!("use Megatron-core {at} or newer"),
        ),
        Some(_) if m.distributed_optimizer == Some(false) => blocker(
            "Megatron-core's optimizer offload needs the distributed optimizer (--use-precision-aware-optimizer, which it requires, refuses anything else), and the job turns it off (spec.megatron.distributedOptimizer, or annotation offload.dev/megatron-distributed-optimizer, is false)".to_string(),
            "run with the distributed optimizer (spec.megatron.distributedOptimizer unset or true)",
        ),
        Some(_) if m.optimizer.is_some_and(|o| o != MegatronOptimizer::Adam) => blocker(
            format!(
                "Megatron-core's optimizer offload runs through --use-precision-aware-optimizer, which takes --optimizer adam alone, and the job's optimizer is {:?} (spec.megatron.optimizer, or annotation offload.dev/megatron-optimizer)",
                m.optimizer.unwrap_or_default()
            ),
            "train with --optimizer adam (spec.megatron.optimizer: Adam)",
        ),
        Some(_) if m.megatron_fsdp == Some(true) => blocker(
            "Megatron-core's hybrid device optimizer does not run under Megatron-FSDP (--use-megatron-fsdp: spec.megatron.megatronFsdp, or annotation offload.dev/megatron-fsdp)".to_string(),
            "train with the distributed optimizer instead of Megatron-FSDP (spec.megatron.megatronFsdp: false)",
        ),
        Some(_)
            if m.fp8_param_gather == Some(true)
                && m.fp8_recipe.is_some_and(|r| r != Fp8Recipe::Delayed) =>
        {
            blocker(
                format!(
                    "Megatron-core's optimizer offload takes --fp8-param-gather only with --fp8-recipe delayed, and the job's recipe is {:?} (spec.megatron.fp8Recipe, or annotation offload.dev/megatron-fp8-recipe)",
                    m.fp8_recipe.unwrap_or_default()
                ),
                "use --fp8-recipe delayed (spec.megatron.fp8Recipe: Delayed) or turn --fp8-param-gather off (spec.megatron.fp8ParamGather: false)",
            )
        }
        Some(_) => None,
    }
}

/// Whether Megatron-core can offload this job's optimizer state.
pub(in crate::decision) fn megatron_can_offload(job: &JobRequest, facts: &FrameworkFacts) -> bool {
    megatron_offload_blocker(job, facts.version.as_ref()).is_none()
}

/// What Megatron-core refuses at start-up in a layout, against the model's shape where the job
/// gives it (its config or its hints): tensor parallelism must divide the attention heads and
/// the key/value heads (its query groups), pipeline parallelism the layers.
fn layout_refused(job: &JobRequest, tensor: u64, pipeline: u64) -> Option<(String, String)> {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let whole = |v: f64| (v.is_finite() && v >= 1.0).then_some(v as u64);
    let from_hints = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok()).filter(|v| *v > 0);
    let hints = job.model.as_ref();
    let shape = job.model_config.as_ref();
    let heads = shape
        .and_then(|s| whole(s.heads))
        .or_else(|| from_hints(hints.and_then(|h| h.attention_heads)));
    let kv_heads = shape
        .and_then(|s| whole(s.kv_heads))
        .or_else(|| from_hints(hints.and_then(|h| h.key_value_heads)))
        .or(heads);
    let layers = shape
        .and_then(|s| whole(s.layers))
        .or_else(|| from_hints(hints.and_then(|h| h.layers)));
    let tensor_change = "choose a tensor-parallel size that divides the model's attention and key/value heads (spec.megatron.tensorParallel, or annotation offload.dev/megatron-tensor-parallel)";
    if let Some(h) = heads.filter(|h| !h.is_multiple_of(tensor)) {
        return Some((
            format!(
                "tensor parallel {tensor} does not divide the model's {h} attention heads: Megatron-core refuses the layout at start-up"
            ),
            tensor_change.to_string(),
        ));
    }
    if let Some(g) = kv_heads.filter(|g| !g.is_multiple_of(tensor)) {
        return Some((
            format!(
                "tensor parallel {tensor} does not divide the model's {g} key/value heads (its query groups): Megatron-core refuses the layout at start-up"
            ),
            tensor_change.to_string(),
        ));
    }
    if let Some(l) = layers.filter(|l| !l.is_multiple_of(pipeline)) {
        return Some((
            format!("pipeline parallel {pipeline} does not divide the model's {l} layers: Megatron-core refuses the layout at start-up"),
            "choose a pipeline-parallel size that divides the model's layers (spec.megatron.pipelineParallel, or annotation offload.dev/megatron-pipeline-parallel)".to_string(),
        ));
    }
    None
}

/// A Megatron job's layout and explicit offload: its GPUs a whole number of model-parallel
/// groups, and an explicit offload mode only where Megatron-core can offload.
pub(super) fn check_megatron(
    job: &JobRequest,
    version: Option<&FrameworkVersion>,
) -> Result<(), ResolveError> {
    let tensor = u64::from(job.megatron.tensor_parallel.unwrap_or(1).max(1));
    let pipeline = u64::from(job.megatron.pipeline_parallel.unwrap_or(1).max(1));
    let gpus = job.gpu_demand().max(1);
    if !gpus.is_multiple_of(tensor * pipeline) {
        return Err(ResolveError::FrameworkCannot {
            problem: format!(
                "the job's {gpus} GPUs are not a whole number of model-parallel groups (tensor {tensor} × pipeline {pipeline})"
            ),
            change: "make replicas × GPUs per pod a multiple of tensor × pipeline parallel (spec.megatron.tensorParallel × pipelineParallel, or annotations offload.dev/megatron-tensor-parallel × offload.dev/megatron-pipeline-parallel)".to_string(),
        });
    }
    if let Some((problem, change)) = layout_refused(job, tensor, pipeline) {
        return Err(ResolveError::FrameworkCannot { problem, change });
    }
    if matches!(
        job.offload.mode,
        ModeSetting::CpuCopy | ModeSetting::UnifiedMemory
    ) && let Some(b) = megatron_offload_blocker(job, version)
    {
        return Err(ResolveError::FrameworkCannot {
            problem: b.problem,
            change: format!(
                "{}, or set offload.mode Disabled (or Auto, which then offloads nothing)",
                b.change
            ),
        });
    }
    Ok(())
}

/// Megatron-core's plan: its hybrid device optimizer with the decided fraction where offload is
/// on (`--use-precision-aware-optimizer` with it, which the offload requires), the copies
/// overlapped with the CPU step where overlap is on, and the distributed optimizer unless the
/// job turns it off.
pub(super) fn megatron_plan(
    job: &JobRequest,
    version: &FrameworkVersion,
    mode: OffloadMode,
    overlap: bool,
    ratio: f64,
    why: &mut Vec<Why>,
) -> FrameworkPlan {
    let distributed_optimizer = job.megatron.distributed_optimizer != Some(false);
    let cpu_offload =
        mode != OffloadMode::Disabled && megatron_offload_blocker(job, Some(version)).is_none();
    let sharded = if distributed_optimizer {
        "the distributed optimizer shards the optimizer state over the data-parallel ranks"
    } else {
        "the distributed optimizer is off: every data-parallel rank keeps the whole optimizer state"
    };
    let brief = match mode {
        OffloadMode::Disabled => format!("Megatron-core {version} without optimizer offload"),
        _ => format!(
            "Megatron-core {version}: the hybrid device optimizer steps {:.0}% of each rank's optimizer state on the host (--optimizer-offload-fraction {ratio})",
            ratio * 100.0
        ),
    };
    let message = match mode {
        OffloadMode::Disabled => {
            format!("Megatron-core {version} without optimizer offload; {sharded}")
        }
        OffloadMode::CpuCopy => format!(
            "Megatron-core {version}: the hybrid device optimizer (--optimizer-cpu-offload, --use-precision-aware-optimizer) with {:.0}% of each rank's optimizer state stepped on the host (--optimizer-offload-fraction {ratio}); {sharded}",
            ratio * 100.0
        ),
        OffloadMode::UnifiedMemory => format!(
            "Megatron-core {version} has no unified-memory residency switch: its hybrid device optimizer copies {:.0}% of each rank's optimizer state to the host and back, over NVLink-C2C on this coherent node (--optimizer-offload-fraction {ratio}); {sharded}",
            ratio * 100.0
        ),
    };
    why.push(Why::summed(ReasonCode::MegatronOptimizer, brief, message));
    if cpu_offload {
        say(
            why,
            ReasonCode::MegatronOptimizer,
            if overlap {
                "--overlap-cpu-optimizer-d2h-h2d: the gradients' copy to the host and the parameters' copy back overlap the CPU step"
            } else {
                "overlap off: --overlap-cpu-optimizer-d2h-h2d not written"
            },
        );
    }
    let manual_gc = cpu_offload && job.megatron.manual_gc_on();
    if manual_gc {
        why.push(Why::summed(
            ReasonCode::MegatronGarbageCollection,
            format!(
                "--manual-gc --manual-gc-interval {MANUAL_GC_INTERVAL}: collection as training starts frees the hybrid optimizer's first copy of the parameters, counted freed"
            ),
            format!(
                "--manual-gc --manual-gc-interval {MANUAL_GC_INTERVAL}: Megatron-LM collects garbage as training starts, which frees the hybrid device optimizer's first copy of the parameters (4 bytes a parameter) before the first step, and every {MANUAL_GC_INTERVAL} steps after; the estimate counts the copy freed (spec.megatron.manualGc: false, or annotation offload.dev/megatron-manual-gc: \"false\", where the training loop is not Megatron-LM's or Megatron-Bridge's)"
            ),
        ));
    } else if cpu_offload {
        say(
            why,
            ReasonCode::MegatronGarbageCollection,
            "--manual-gc off (spec.megatron.manualGc: false): the hybrid device optimizer's first copy of the parameters is counted as held to the peak",
        );
    }
    FrameworkPlan::Megatron(MegatronPlan {
        version: version.clone(),
        cpu_offload,
        fraction: if cpu_offload { ratio } else { 0.0 },
        overlap: cpu_offload && overlap,
        distributed_optimizer,
        manual_gc,
    })
}
