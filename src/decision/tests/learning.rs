//! The closed loop in the decision: lessons from observed runs change later decisions of the
//! same shape (or, without hints, of the same job), within bounds; `unknownSize: TryFastest`
//! climbs the offload ladder one rung per GPU out-of-memory failure.

use std::sync::Arc;

use super::*;
use crate::decision::model::memory::Placement;
use crate::decision::runs::learned::LearnedMemory;
use crate::decision::runs::lesson::Observed;
use crate::decision::runs::lesson::lesson;
use offload_api::v1alpha1::{MemoryFailure, MemoryKind, NodeClass, OffloadMode, UnknownSize};

const H200_HOST: u64 = 125 << 30;
const GIB: u64 = 1 << 30;

fn now() -> jiff::Timestamp {
    "2026-12-01T12:00:00Z".parse().unwrap()
}

fn with_learned(mut job: JobRequest, store: &LearnedMemory) -> JobRequest {
    job.learned = Some(LearnedView {
        memory: Arc::new(store.clone()),
        now: now(),
        namespace: None,
        job: None,
    });
    job
}

fn node() -> NodeInfo {
    with_host(h200("h"), H200_HOST)
}

fn observe(job: &JobRequest, res: &Resolution, gpu_peak: u64, host_peak: Option<u64>) -> Observed {
    let _ = job;
    Observed {
        placement: res.placement,
        class: NodeClass::Discrete,
        gpu_bytes: 150_754_820_096,
        gpu_peak: Some(gpu_peak),
        allocated: None,
        host_peak,
        failed: None,
        trained: false,
        trial: false,
        decided_shape: res.memory.as_ref().map(|m| m.shape.clone()),
        step_seconds: None,
    }
}

fn learn(store: &mut LearnedMemory, job: &JobRequest, obs: &Observed, who: &str) {
    let l = lesson(job, obs).unwrap().expect("a lesson");
    l.record(
        store,
        "default",
        obs.class,
        l.run(who, obs.failed.is_some(), now()),
    )
    .unwrap();
}

#[test]
fn runs_below_the_estimate_shrink_the_offload_and_the_reason_says_what_was_learned() {
    let mut job = deepspeed("0.19.8");
    job.model = Some(bench_hints(9_122_865_152, 2048, 44));
    let first = resolve(&job, &[node()]).unwrap();
    let Placement::PartialOptimizer(r1) = first.placement else {
        panic!("{}", first.summary());
    };
    // Two runs kept a third of the activations the model counts (the context beside them).
    let m = first.memory.as_ref().unwrap();
    let peak = m.gpu_structural_bytes + (m.gpu_bytes - m.gpu_structural_bytes) / 3 + 3 * GIB / 2;
    let mut store = LearnedMemory::default();
    let obs = observe(&job, &first, peak, None);
    learn(&mut store, &job, &obs, "ns/a/1");
    let once = resolve(&with_learned(job.clone(), &store), &[node()]).unwrap();
    learn(&mut store, &job, &obs, "ns/b/2");
    let twice = resolve(&with_learned(job.clone(), &store), &[node()]).unwrap();
    let ratio = |r: &Resolution| match r.placement {
        Placement::PartialOptimizer(r) => r,
        Placement::NoOffload => 0.0,
        other => panic!("{other:?}"),
    };
    // One run goes half-way; two all the way; never below what the runs needed.
    assert!(
        ratio(&once) < r1 && ratio(&twice) < ratio(&once),
        "{r1} {} {}",
        ratio(&once),
        ratio(&twice)
    );
    let why = [Field::Mode, Field::OffloadRatio]
        .map(|f| reason(&twice, f))
        .join(" | ");
    assert!(
        why.contains("learned from 2 run(s)") && why.contains("the model alone counts"),
        "{why}"
    );
    let m = twice.memory.as_ref().unwrap();
    assert_eq!(m.learned.runs, 2);
    assert!(
        m.gpu_bytes as f64 + 1.4 * GIB as f64 >= peak as f64,
        "never under the observed peak"
    );
    // The same runs under another profile, or a shape of another batch, change nothing.
    let mut other = job.clone();
    other.model = Some(bench_hints(9_122_865_152, 1024, 44));
    let plain = resolve(&other, &[node()]).unwrap();
    let learned = resolve(&with_learned(other, &store), &[node()]).unwrap();
    assert_eq!(plain.placement, learned.placement);
}

#[test]
fn a_run_above_the_estimate_or_out_of_memory_grows_it() {
    let mut job = deepspeed("0.19.8");
    job.model = Some(bench_hints(3_821_770_752, 4096, 32));
    let first = resolve(&job, &[node()]).unwrap();
    assert_eq!(first.placement, Placement::NoOffload, "{}", first.summary());
    let mut store = LearnedMemory::default();
    let mut obs = observe(&job, &first, 150_000_000_000, None);
    obs.failed = Some(MemoryKind::Gpu);
    learn(&mut store, &job, &obs, "ns/a/1");
    let after = resolve(&with_learned(job.clone(), &store), &[node()]).unwrap();
    assert_ne!(after.placement, Placement::NoOffload, "{}", after.summary());
}

#[test]
fn a_run_teaches_only_the_shape_it_was_decided_for() {
    // The job's tokens per step were edited under its running workload: the run's peaks are
    // those of the old shape, and teach the new one nothing.
    let mut job = deepspeed("0.19.8");
    job.model = Some(bench_hints(9_122_865_152, 2048, 44));
    let first = resolve(&job, &[node()]).unwrap();
    let peak = first.memory.as_ref().unwrap().gpu_bytes + GIB;
    let obs = observe(&job, &first, peak, None);
    assert!(lesson(&job, &obs).unwrap().is_some());
    let mut edited = job.clone();
    edited.model = Some(bench_hints(9_122_865_152, 4096, 44));
    assert_eq!(lesson(&edited, &obs).unwrap(), None);
    // A decision that sized no shape (no hints) checks nothing.
    let unchecked = Observed {
        decided_shape: None,
        step_seconds: None,
        ..obs
    };
    assert!(lesson(&edited, &unchecked).unwrap().is_some());
}

#[test]
fn impossible_observations_teach_nothing() {
    let mut job = deepspeed("0.19.8");
    job.model = Some(bench_hints(3_821_770_752, 4096, 32));
    let first = resolve(&job, &[node()]).unwrap();
    for peak in [0, 150_754_820_097, u64::MAX] {
        let obs = observe(&job, &first, peak, None);
        assert_eq!(lesson(&job, &obs).unwrap(), None, "{peak}");
    }
    // A GPU peak of 1 GiB for a 3.8B model (below its weights and optimizer state): no step of
    // it, not learned at the floor.
    let obs = observe(&job, &first, 3 * GIB / 2 + GIB, None);
    assert_eq!(lesson(&job, &obs).unwrap(), None);
    // A job without hints and no identity (another kind) is not learned.
    let obs = observe(&job, &first, 20 * GIB, Some(30 * GIB));
    let bare = deepspeed("0.19.8");
    assert_eq!(lesson(&bare, &obs).unwrap(), None);
}

#[test]
fn a_step_faster_than_any_gpu_computes_the_models_tokens_is_no_step() {
    let mut job = deepspeed("0.19.8");
    job.model = Some(bench_hints(3_821_770_752, 4096, 32));
    let first = resolve(&job, &[node()]).unwrap();
    let gpu_peak = first.memory.as_ref().unwrap().gpu_bytes;
    let mut obs = observe(&job, &first, gpu_peak, None);
    obs.trained = true;
    // 3.8B parameters × 4,096 tokens × 6 FLOP: about 94 TFLOP a step, 9.4 ms at 10 PFLOP/s.
    for (seconds, kept) in [
        (1e-12, false),
        (1e-6, false),
        (0.009, false),
        (0.0095, true),
        (1.8, true),
    ] {
        obs.step_seconds = Some(seconds);
        let l = lesson(&job, &obs).unwrap().expect("a lesson");
        assert_eq!(l.step_seconds.is_some(), kept, "{seconds} s");
    }
}

#[test]
fn an_allocator_figure_above_the_gpus_memory_is_not_believed() {
    let mut job = deepspeed("0.19.8");
    job.model = Some(bench_hints(3_821_770_752, 4096, 32));
    let first = resolve(&job, &[node()]).unwrap();
    let gpu_peak = first.memory.as_ref().unwrap().gpu_bytes + GIB;
    let mut obs = observe(&job, &first, gpu_peak, None);
    obs.trained = true;
    // Within the GPU: the allocator's own figure is what the run teaches.
    obs.allocated = Some(gpu_peak - 2 * GIB);
    let believed = lesson(&job, &obs).unwrap().expect("a lesson");
    assert!(believed.allocator, "{}", believed.sentence);
    // The GPU's whole memory and a GiB more: not the allocator's; the device's figure stands.
    obs.allocated = Some(obs.gpu_bytes + GIB);
    let claimed = lesson(&job, &obs)
        .unwrap()
        .expect("a lesson from the device's figure");
    assert!(!claimed.allocator, "{}", claimed.sentence);
    assert!(
        claimed.sentence.contains("the device's figure"),
        "{}",
        claimed.sentence
    );
    // A run out of memory held what it had plus what it asked: that may pass the GPU's memory.
    obs.trained = false;
    obs.failed = Some(MemoryKind::Gpu);
    let failed = lesson(&job, &obs).unwrap().expect("a lesson");
    assert!(failed.allocator, "{}", failed.sentence);
}

#[test]
fn a_job_without_hints_is_sized_from_its_observed_run_and_rerun_at_the_fastest_that_fits() {
    let mut job = deepspeed("0.19.8");
    job.identity = Some("ns/train@0011".into());
    let first = resolve(&job, &[node()]).unwrap();
    assert_eq!(
        first.placement,
        Placement::OptimizerAndParams,
        "{}",
        first.summary()
    );
    // What a 1.1B model used with everything offloaded (docs/benchmarks/memory-h200.md): its
    // host peak, and activations of 6 GiB beside the gathered parameters.
    let host = 6_320_000_000 + 1_138_241_536 * 47 / 2;
    let gpu = 2 * GIB + 6 * GIB + 2_300_000_000 + 3 * GIB / 2;
    let mut store = LearnedMemory::default();
    let obs = observe(&job, &first, gpu, Some(host));
    let l = lesson(&job, &obs).unwrap().unwrap();
    let p = l.parameters.unwrap();
    assert!(
        (1_138_241_536.0..1.3e9).contains(&p),
        "an upper bound, close: {p}"
    );
    learn(&mut store, &job, &obs, "ns/train/1");
    let rerun = resolve(&with_learned(job.clone(), &store), &[node()]).unwrap();
    assert_eq!(rerun.placement, Placement::NoOffload, "{}", rerun.summary());
    assert_eq!(rerun.mode, OffloadMode::Disabled);
    assert!(reason(&rerun, Field::Mode).contains("from the peaks of its observed runs"));
    // Another job (another identity) is not sized by it.
    let mut other = job.clone();
    other.identity = Some("ns/other@0011".into());
    let res = resolve(&with_learned(other, &store), &[node()]).unwrap();
    assert_eq!(res.placement, Placement::OptimizerAndParams);
}

#[test]
fn try_fastest_climbs_one_rung_per_gpu_out_of_memory() {
    let mut profile = profile();
    profile.unknown_size = UnknownSize::TryFastest;
    let failure = |kind| MemoryFailure {
        kind,
        configuration: String::new(),
        estimate_bytes: None,
        budget_bytes: None,
        limit_bytes: None,
        needed_bytes: None,
        pod: "p".into(),
        message: "CUDA out of memory".into(),
        seen_at: "2026-12-01T12:00:00Z".into(),
    };
    let mut job = deepspeed("0.19.8");
    let nodes = idx(&[node()]);
    let decide = |job: &JobRequest| resolve_offload(job, "default", &profile, &nodes).unwrap();
    let first = decide(&job);
    assert_eq!(
        (first.mode, first.placement),
        (OffloadMode::Disabled, Placement::NoOffload)
    );
    assert!(
        reason(&first, Field::Mode).contains("starts without offload"),
        "{}",
        first.summary()
    );
    // A host OOM does not climb (more offload needs more host memory).
    job.memory_failures.push(failure(MemoryKind::Host));
    assert_eq!(decide(&job).placement, Placement::NoOffload);
    job.memory_failures.push(failure(MemoryKind::Gpu));
    let second = decide(&job);
    assert_eq!(
        (second.mode, second.placement),
        (OffloadMode::CpuCopy, Placement::Optimizer)
    );
    assert!(!ds_plan(&second).offload_params);
    job.memory_failures.push(failure(MemoryKind::Gpu));
    let third = decide(&job);
    assert_eq!(third.placement, Placement::OptimizerAndParams);
    assert!(ds_plan(&third).offload_params);
    // The top rung holds.
    job.memory_failures.push(failure(MemoryKind::Gpu));
    assert_eq!(decide(&job).placement, Placement::OptimizerAndParams);
    // Safest, the default, starts at the top.
    assert_eq!(
        resolve(&deepspeed("0.19.8"), &[node()]).unwrap().placement,
        Placement::OptimizerAndParams
    );
}

/// The ratio of a partial placement (0 without offload, 1 for all of the optimizer state).
fn share(r: &Resolution) -> f64 {
    match r.placement {
        Placement::PartialOptimizer(r) => r,
        Placement::NoOffload => 0.0,
        _ => 1.0,
    }
}

#[test]
fn a_run_that_trained_never_makes_the_next_decision_offload_more() {
    // A 9.1B at 2048 tokens: a partial share fits. It ran, and the device's figure read the
    // whole GPU (the allocator's cache near the limit): an upper bound, which must not push
    // the next decision away from what ran.
    let mut job = deepspeed("0.19.8");
    job.model = Some(bench_hints(9_122_865_152, 2048, 44));
    let first = resolve(&job, &[node()]).unwrap();
    let r1 = share(&first);
    assert!(r1 > 0.0 && r1 < 1.0, "{}", first.summary());
    let mut store = LearnedMemory::default();
    let whole = observe(&job, &first, 150_754_820_096, None);
    let l = lesson(&job, &whole).unwrap().unwrap();
    assert!(l.sentence.contains("an upper bound"), "{}", l.sentence);
    assert!(
        l.sentence.contains("it ran, so the model keeps it fitting"),
        "{}",
        l.sentence
    );
    for who in ["ns/a/1", "ns/b/2", "ns/c/3"] {
        learn(&mut store, &job, &whole, who);
        let next = resolve(&with_learned(job.clone(), &store), &[node()]).unwrap();
        assert!(
            share(&next) <= r1 + 1e-9,
            "{} after {r1}: {}",
            share(&next),
            next.summary()
        );
    }
    // The allocator said it used less than the model counts: the next decision moves toward
    // the fastest.
    let m = first.memory.as_ref().unwrap();
    let mut told = observe(&job, &first, 150_754_820_096, None);
    told.allocated = Some(m.gpu_bytes - (m.gpu_bytes - m.gpu_structural_bytes) / 2);
    let l = lesson(&job, &told).unwrap().unwrap();
    assert!(l.sentence.contains("PyTorch's allocator"), "{}", l.sentence);
    let mut store = LearnedMemory::default();
    learn(&mut store, &job, &told, "ns/d/4");
    let next = resolve(&with_learned(job.clone(), &store), &[node()]).unwrap();
    assert!(share(&next) < r1, "{} after {r1}", share(&next));
}

/// A Megatron-core job goes round the same loop: an out-of-memory failure raises its
/// optimizer offload fraction, a run the allocator says used less lowers it, and a run that
/// trained never makes the next fraction larger than the one that ran.
#[test]
fn a_megatron_job_learns_like_a_deepspeed_job() {
    let mut job = megatron("0.14.0");
    job.model = Some(bench_hints(8_000_000_000, 4096, 36));
    let first = resolve(&job, &[node()]).unwrap();
    let r1 = share(&first);
    assert!(r1 > 0.0 && r1 < 1.0, "{}", first.summary());
    let fraction = |r: &Resolution| match &r.framework {
        FrameworkPlan::Megatron(p) => p.fraction,
        other => panic!("{other:?}"),
    };
    assert!((fraction(&first) - r1).abs() < 1e-9);

    // It ran out of GPU memory: the next decision offloads more.
    let mut failed = observe(&job, &first, 150_000_000_000, None);
    failed.failed = Some(MemoryKind::Gpu);
    let mut store = LearnedMemory::default();
    learn(&mut store, &job, &failed, "ns/a/1");
    let after = resolve(&with_learned(job.clone(), &store), &[node()]).unwrap();
    assert!(fraction(&after) > r1, "{} after {r1}", after.summary());

    // It trained and the device read the whole GPU: an upper bound, never more offload.
    let mut store = LearnedMemory::default();
    let mut whole = observe(&job, &first, 150_754_820_096, None);
    whole.trained = true;
    learn(&mut store, &job, &whole, "ns/b/2");
    let next = resolve(&with_learned(job.clone(), &store), &[node()]).unwrap();
    assert!(
        fraction(&next) <= r1 + 1e-9,
        "{} after {r1}",
        next.summary()
    );

    // The allocator said it used less than the model counts: a smaller fraction next.
    let m = first.memory.as_ref().unwrap();
    let mut told = observe(&job, &first, 150_754_820_096, None);
    told.allocated = Some(m.gpu_bytes - (m.gpu_bytes - m.gpu_structural_bytes) / 2);
    let mut store = LearnedMemory::default();
    learn(&mut store, &job, &told, "ns/c/3");
    let next = resolve(&with_learned(job.clone(), &store), &[node()]).unwrap();
    assert!(fraction(&next) < r1, "{} after {r1}", next.summary());
    assert!(
        reason(&next, Field::OffloadRatio).contains("learned from 1 run(s)"),
        "{}",
        reason(&next, Field::OffloadRatio)
    );
}
