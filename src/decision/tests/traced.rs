//! The decision with the model's own code traced (the sizer, `sizer/offload_sizer.py`): the
//! trace's parameters and activations size the job, the per-type count is its cross-check, and
//! a trace that is not of the job's step, or none, leaves the counted model and says why.
use std::sync::Arc;

use super::memory::{H200_HOST, placement};
use super::*;
use crate::decision::model::memory::Placement;
use crate::decision::model::sizer::TraceInput;
use offload_api::trace::ModelTrace;

/// Nemotron-4-Minitron-4B's shape (squared-ReLU MLP without a gate, LayerNorm1P, a 256k
/// vocabulary): a type the per-type terms do not cover.
pub(crate) const NEMOTRON: &str = "nemotron-4b";

/// Each model's `config.json` and the sizer's trace of it (transformers 5.17, torch 2.11) at
/// one micro-batch of its tokens.
const MODELS: &[(&str, &str, &str)] = &[
    (
        NEMOTRON,
        include_str!("../../../hack/gpu/models/new/nemotron-4b.json"),
        include_str!("../../../tests/fixtures/traces/nemotron-4b-4096.json"),
    ),
    (
        "deepseekv3-4b",
        include_str!("../../../hack/gpu/models/new/deepseekv3-4b.json"),
        include_str!("../../../tests/fixtures/traces/deepseekv3-4b-4096.json"),
    ),
    (
        "llama-8b",
        include_str!("../../../hack/gpu/models/llama-8b.json"),
        include_str!("../../../tests/fixtures/traces/llama-8b-2048.json"),
    ),
    (
        "qwen3-4b",
        include_str!("../../../hack/gpu/models/qwen3-4b.json"),
        include_str!("../../../tests/fixtures/traces/qwen3-4b-4096.json"),
    ),
];

fn entry(model: &str) -> &'static (&'static str, &'static str, &'static str) {
    MODELS.iter().find(|(n, _, _)| *n == model).unwrap()
}

/// The sizer's trace of `model`.
pub(crate) fn trace_of(model: &str) -> ModelTrace {
    ModelTrace::parse(entry(model).2).unwrap()
}

/// A DeepSpeed 0.19.8 ZeRO-3 job that references `model`'s `config.json`, at `tokens` per step
/// (`sequence` tokens a sequence where given), with no trace.
pub(crate) fn job_of(model: &str, tokens: i64, sequence: Option<i64>) -> JobRequest {
    let mut job = deepspeed("0.19.8");
    job.model = Some(offload_api::v1alpha1::ModelHints {
        tokens_per_step: Some(tokens),
        sequence_length: sequence,
        config_map_ref: Some(offload_api::v1alpha1::ConfigMapKeyRef {
            name: model.into(),
            key: None,
        }),
        ..Default::default()
    });
    job.model_config =
        Some(crate::decision::model::model_config::parse(entry(model).1, model).unwrap());
    job
}

/// The job with the sizer's trace of its model.
fn traced(model: &str, tokens: i64) -> JobRequest {
    JobRequest {
        model_trace: TraceInput::Traced(Arc::new(trace_of(model))),
        ..job_of(model, tokens, None)
    }
}

/// The lent H100 80GB node (16 cores, 125 GiB host).
fn h100() -> crate::index::NodeInfo {
    with_host(
        with_report(h200("h100"), |r| {
            r.gpus[0].memory_total_bytes = 85_520_809_984;
            r.gpus[0].name = "NVIDIA H100 80GB HBM3".into();
        }),
        H200_HOST,
    )
}

/// Every reason of `res`, one after another.
fn all_reasons(res: &Resolution) -> String {
    res.reasons.iter().map(|r| r.message.as_str()).collect()
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

#[test]
fn a_model_the_per_type_terms_do_not_cover_is_sized_by_its_own_code_not_a_margin() {
    let counted = resolve(&job_of(NEMOTRON, 4096, None), &[h100()]).unwrap();
    let res = resolve(&traced(NEMOTRON, 4096), &[h100()]).unwrap();
    // The count takes the MLP for a gated one (5.10B for a model that builds 4.19B) and keeps
    // +40 % on the activations: it offloads everything, parameters too. The trace, a partial
    // share: several times faster a step on the H100.
    assert_eq!(placement(&counted), Some(Placement::OptimizerAndParams));
    let Some(Placement::PartialOptimizer(r)) = placement(&res) else {
        panic!("{}", res.summary());
    };
    assert!((0.15..0.35).contains(&r), "{}", res.summary());
    let why = reason(&res, Field::OffloadRatio);
    assert!(why.contains("traced from the model's code"), "{why}");
    assert!(why.contains("NemotronForCausalLM (nemotron)"), "{why}");
    assert!(why.contains("the per-type count has 5.096B"), "{why}");
    assert!(!why.contains("never measured"), "{why}");
    // The activations are the trace's step peak, not the count's with its margin.
    let peak = trace_of(NEMOTRON).peak_bytes;
    assert!(
        why.contains(&format!("{:.1} GiB at the step's peak", gib(peak))),
        "{why}"
    );
}

#[test]
fn where_the_per_type_terms_are_exact_the_trace_agrees_with_them() {
    // Llama-3.1-8B and Qwen3-4B: types the terms count to within 0.01 % of what H100 and H200
    // runs kept. Traced, the estimate of each placement lands within 0.2 % of the counted one
    // (the count adds the activations' gradients in flight at a flush on its own; in a trace
    // they are among what is alive).
    for (model, tokens) in [("llama-8b", 2048), ("qwen3-4b", 4096)] {
        let counted = job_of(model, tokens, None);
        let with_trace = traced(model, tokens);
        for p in [
            Placement::NoOffload,
            Placement::PartialOptimizer(0.3),
            Placement::Optimizer,
        ] {
            let estimate = |job: &JobRequest| {
                crate::decision::estimate_placement(
                    job,
                    "default",
                    &profile(),
                    &idx(&[h100()]),
                    offload_api::v1alpha1::NodeClass::Discrete,
                    p,
                )
                .unwrap()
                .unwrap()
                .0
            };
            let (a, b) = (estimate(&counted), estimate(&with_trace));
            let d = (b.gpu_bytes as f64 - a.gpu_bytes as f64) / a.gpu_bytes as f64;
            assert!(
                d.abs() < 0.002,
                "{model} {p:?}: counted {a:?}, traced {b:?}"
            );
        }
    }
}

#[test]
fn a_trace_of_another_step_is_not_used_and_the_reason_says_why() {
    // The trace is of 1 × 4,096 tokens; the job's micro-batch has 2,048.
    let job = JobRequest {
        model_trace: TraceInput::Traced(Arc::new(trace_of(NEMOTRON))),
        ..job_of(NEMOTRON, 2048, None)
    };
    let res = resolve(&job, &[h100()]).unwrap();
    let counted = resolve(&job_of(NEMOTRON, 2048, None), &[h100()]).unwrap();
    assert_eq!(res.ratio, counted.ratio);
    let why = all_reasons(&res);
    assert!(
        why.contains(
            "not traced: the trace is of 1 × 4096 tokens; the job's micro-batch is 1 × 2048"
        ),
        "{why}"
    );
    assert!(why.contains("never measured"), "{why}");
}

#[test]
fn where_the_sizer_could_not_trace_the_counted_model_decides_with_its_margin_and_says_why() {
    let why = "the sizer could not trace the model (CustomCode): model_type nemotron is built by the model's own code (auto_map), which the sizer does not run";
    let job = JobRequest {
        model_trace: TraceInput::Untraced(why.into()),
        ..job_of(NEMOTRON, 4096, None)
    };
    let res = resolve(&job, &[h100()]).unwrap();
    let counted = resolve(&job_of(NEMOTRON, 4096, None), &[h100()]).unwrap();
    assert_eq!(res.ratio, counted.ratio);
    assert_eq!(placement(&res), placement(&counted));
    let said = all_reasons(&res);
    assert!(
        said.contains("not traced: the sizer could not trace the model (CustomCode)"),
        "{said}"
    );
}

#[test]
fn the_trace_counts_every_expert_and_the_latent_attention_as_built() {
    // DeepSeek-V3's blocks: latent attention (keys and values through a 512-wide latent),
    // routed and shared experts, a dense first layer. The count takes the attention as full
    // heads; the trace has what the model builds.
    let job = traced("deepseekv3-4b", 4096);
    let res = resolve(&job, &[h100()]).unwrap();
    let t = trace_of("deepseekv3-4b");
    assert_eq!(t.parameters, 4_907_789_824);
    // The memory-efficient kernel runs it (values narrower than queries and keys): no
    // sequence² scores kept.
    assert_eq!(t.kernels.get("efficient"), Some(&27));
    let why = reason(&res, Field::OffloadRatio);
    assert!(why.contains("4.908B parameters"), "{why}");
    let m = res.memory.as_ref().unwrap();
    assert!(m.gpu_bytes <= m.gpu_budget_bytes, "{}", res.summary());
}

/// A DeepSpeed run on the H100 as the agent and the reporter see it: `placement` trained with
/// `allocated` bytes at PyTorch's allocator's peak.
fn trained_run(res: &Resolution, allocated: u64) -> crate::decision::runs::lesson::Observed {
    crate::decision::runs::lesson::Observed {
        placement: res.placement,
        class: offload_api::v1alpha1::NodeClass::Discrete,
        gpu_bytes: 85_520_809_984,
        gpu_peak: Some(allocated + (4 << 30)),
        allocated: Some(allocated),
        host_peak: None,
        failed: None,
        trained: true,
        trial: false,
        decided_shape: res.memory.as_ref().map(|m| m.shape.clone()),
        step_seconds: Some(1.962),
    }
}

#[test]
fn a_run_below_the_counted_floor_corrects_the_count_and_the_next_job_goes_faster() {
    use crate::decision::runs::learned::LearnedMemory;
    use crate::decision::runs::lesson::lesson;
    // Nemotron at 1 × 2,048 tokens, counted: 37 % (the count builds 5.10B parameters for a
    // model of 4.19B). The H100 trained it at 55.9 GiB allocated, below what the count holds
    // for weights, gradients and optimizer state at 37 % alone.
    let job = job_of(NEMOTRON, 2048, None);
    let first = resolve(&job, &[h100()]).unwrap();
    let Placement::PartialOptimizer(r1) = first.placement else {
        panic!("{}", first.summary());
    };
    assert!((0.3..0.45).contains(&r1), "{}", first.summary());
    let obs = trained_run(&first, 60_021_000_000);
    let l = lesson(&job, &obs)
        .unwrap()
        .expect("the run teaches, not discarded");
    let p = l.parameters.expect("the count corrected");
    assert!((4.0e9..5.0e9).contains(&p), "{p}");
    assert!(
        l.sentence.contains("where the count has 5.10B"),
        "{}",
        l.sentence
    );
    let mut store = LearnedMemory::default();
    let now: jiff::Timestamp = "2026-12-07T12:00:00Z".parse().unwrap();
    l.record(
        &mut store,
        "default",
        obs.class,
        l.run("ns/a/1", false, now),
    )
    .unwrap();
    let next = resolve(
        &JobRequest {
            learned: Some(LearnedView {
                memory: Arc::new(store),
                now,
                namespace: None,
                job: None,
            }),
            ..job.clone()
        },
        &[h100()],
    )
    .unwrap();
    // Less offloaded than what trained: a trial of the faster share, or the share the
    // corrected model finds, never the same 37 % again.
    let r2 = match next.placement {
        Placement::PartialOptimizer(r) => r,
        Placement::NoOffload => 0.0,
        other => panic!("{other:?}: {}", next.summary()),
    };
    assert!(r2 < r1 - 0.01, "{r1} then {r2}: {}", next.summary());
    let said = all_reasons(&next);
    assert!(said.contains("showed at most"), "{said}");
    // A traced model's parameters are the model's own: a run below its floor corrects nothing.
    let traced_job = traced(NEMOTRON, 4096);
    let traced_first = resolve(&traced_job, &[h100()]).unwrap();
    let tiny = trained_run(&traced_first, 20 << 30);
    assert_eq!(lesson(&traced_job, &tiny).unwrap(), None);
    // Nor does a figure past any per-type term's error (less than half the count's floor).
    assert_eq!(lesson(&job, &trained_run(&first, 8 << 30)).unwrap(), None);
}
