//! The memory model against what was measured on the H200 and against DeepSpeed's own
//! estimator, one file per family of runs: the Hugging Face decoders ([`huggingface`]), the
//! bench's own GPT decoder and DeepSpeed's estimator ([`gpt`]), the closed loop's recorded runs
//! ([`loops`]), the per-type table at each GPU's limit ([`per_type`]), the model's own rules
//! ([`rules`]) and the host's pinned blocks and the backward's gradient flushes ([`host`]).
//! Measured: `docs/benchmarks/raw/2026-12-01-h200-arch/` (Hugging Face decoders,
//! `hack/gpu/hf-bench.sh`) and `docs/benchmarks/raw/2026-12-01-h200/` (the bench's own GPT
//! decoder, `hack/gpu/memory-bench.sh`).

use super::host::{OnHost, pinned_block, pinned_gradient_blocks};
use super::*;
use crate::decision::model::shape::ModelShape;
use crate::decision::model::shape::tests::model;

mod gpt;
mod host;
mod huggingface;
mod loops;
mod per_type;
mod rules;

/// The H200 of the measurements: 150,754,820,096 bytes of HBM (NVML), 125 GiB of host memory.
pub(super) fn h200() -> ClassMemory {
    ClassMemory {
        gpu_bytes: 150_754_820_096,
        gpu_node: "h200-0".into(),
        host_per_pod: Some(134_217_728_000),
        host_node: "h200-0: 125.0 GiB allocatable for 1 pod".into(),
        class: None,
    }
}

/// Asserts that an estimate is never under what was measured, and at most `over` (a share of
/// it) above; `what` names the run in the message.
pub(super) fn never_under(what: &str, estimate: f64, measured: f64, over: f64) {
    let err = estimate / measured - 1.0;
    assert!(
        (0.0..=over).contains(&err),
        "{what}: estimate {} against {} measured ({:+.1}%)",
        gib(estimate),
        gib(measured),
        err * 100.0
    );
}

pub(super) fn job(shape: ModelShape, tokens: f64) -> JobMemory {
    JobMemory {
        parameters: shape.parameters(),
        shape,
        tokens: Some(tokens),
        checkpointing: false,
        ranks: 1,
        gpus_per_pod: 1,
        pods: 1,
        sharding: Sharding::Zero(3),
        value_bytes: 2.0,
        pod_memory_limit: None,
        pod_memory_limit_source: None,
        sub_group_size: None,
        corrections: Corrections::default(),
        shape_key: String::new(),
        learned: Default::default(),
        inferred: false,
        ran: Default::default(),
        reserved_trials: Default::default(),
        traced: None,
        untraced: None,
        counted_parameters: None,
        logits_room: true,
        bf16_states: false,
    }
}

/// The bench's GPT decoder (`hack/gpu/ds_step.py`): LayerNorm, GELU MLP of 4 × the width,
/// 128-wide heads, vocabulary 32000, micro-batch 4 × 512.
pub(super) fn gpt(hidden: f64, layers: f64) -> ModelShape {
    crate::decision::model::shape::tests::bench_gpt(hidden, layers)
}

pub(super) fn bench_job(parameters: f64, hidden: f64, layers: f64) -> JobMemory {
    let mut j = job(gpt(hidden, layers), 2048.0);
    assert!(
        (j.parameters - parameters).abs() < 1.0,
        "{} {parameters}",
        j.parameters
    );
    j.parameters = parameters;
    j
}

/// What was placed on the host: the share DeepSpeed offloaded, from the ratio and sub-group
/// size written (its whole sub-groups, [`crate::decision::model::shape::offloaded_share`]).
#[derive(Clone, Copy, Debug)]
pub(super) enum Run {
    None,
    Partial(f64, f64),
    Opt,
    OptPar,
}

pub(super) fn hf_estimate(name: &str, run: Run, tokens: f64) -> (JobMemory, Estimate, Fit) {
    let mut j = job(model(name), tokens);
    let (placement, est) = match run {
        Run::None => (Placement::NoOffload, None),
        Run::Opt => (Placement::Optimizer, None),
        Run::OptPar => (Placement::OptimizerAndParams, None),
        Run::Partial(r, g) => {
            j.sub_group_size = Some(g);
            (Placement::PartialOptimizer(r), Some(()))
        }
    };
    let (e, f) = if est.is_some() {
        j.estimate_checked(placement, &h200())
    } else {
        let e = j.estimate(placement, &h200());
        let f = j.fits(&e, &h200());
        (e, f)
    };
    (j, e, f)
}
