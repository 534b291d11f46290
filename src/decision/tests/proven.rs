//! What runs proved, in the decision: a configuration that trained is never offloaded past; a
//! job that ran out of GPU memory goes back to what trained; a faster rung is tried only where
//! the runs' own figures say it fits, bounded by the profile's `fasterTrials`, never where a
//! run of the shape ran out, never for another kind, and never on other GPUs or ranks.

use std::sync::Arc;

use super::*;
use crate::decision::model::memory::Placement;
use crate::decision::runs::learned::LearnedMemory;
use crate::decision::runs::lesson::Observed;
use crate::decision::runs::lesson::lesson;
use crate::decision::runs::proven::TRIAL_STEP;
use offload_api::v1alpha1::{MemoryFailure, MemoryKind, NodeClass};

const H200_HOST: u64 = 125 << 30;
const GIB: u64 = 1 << 30;
const H200_GPU: u64 = 150_754_820_096;

fn now() -> jiff::Timestamp {
    "2026-12-01T12:00:00Z".parse().unwrap()
}

fn node() -> NodeInfo {
    with_host(h200("h"), H200_HOST)
}

/// A TrainingJob (it has an identity: it is recreated after running out of memory) of the
/// bench's 9.1B decoder at 2048 tokens: a partial share fits on an H200.
fn job() -> JobRequest {
    let mut job = deepspeed("0.19.8");
    job.model = Some(bench_hints(9_122_865_152, 2048, 44));
    job.identity = Some("ns/train@01".into());
    job
}

fn decide(job: &JobRequest, store: &LearnedMemory, profile: &OffloadProfileSpec) -> Resolution {
    let job = JobRequest {
        learned: Some(LearnedView {
            memory: Arc::new(store.clone()),
            now: now(),
            namespace: None,
            job: None,
        }),
        ..job.clone()
    };
    match resolve_offload(&job, "default", profile, &idx(&[node()])) {
        Ok(r) => r,
        Err(e) => panic!("{e:?}"),
    }
}

fn share(r: &Resolution) -> f64 {
    match r.placement {
        Placement::PartialOptimizer(r) => r,
        Placement::NoOffload => 0.0,
        _ => 1.0,
    }
}

/// A run of `res`'s configuration recorded as the controller records it: `needed`, PyTorch's
/// own figure (what it had plus what it asked for, where it ran out).
fn run(
    store: &mut LearnedMemory,
    job: &JobRequest,
    res: &Resolution,
    needed: u64,
    failed: bool,
    who: &str,
) {
    run_timed(store, job, res, needed, failed, who, None);
}

/// [`run`], its processes having timed its steps at `step_seconds` (the reporter's median).
fn run_timed(
    store: &mut LearnedMemory,
    job: &JobRequest,
    res: &Resolution,
    needed: u64,
    failed: bool,
    who: &str,
    step_seconds: Option<f64>,
) {
    let obs = Observed {
        placement: res.placement,
        class: NodeClass::Discrete,
        gpu_bytes: H200_GPU,
        gpu_peak: Some(if failed { H200_GPU } else { needed + 3 * GIB }),
        allocated: Some(needed),
        host_peak: None,
        failed: failed.then_some(MemoryKind::Gpu),
        trained: !failed,
        trial: res.trial.is_some(),
        decided_shape: res.memory.as_ref().map(|m| m.shape.clone()),
        step_seconds,
    };
    let l = lesson(job, &obs).unwrap().expect("a lesson");
    l.record(store, "default", obs.class, l.run(who, failed, now()))
        .unwrap();
}

/// The failure the controller records for `res` having needed `needed`.
fn failure(res: &Resolution, needed: u64) -> MemoryFailure {
    let m = res.memory.as_ref().unwrap();
    MemoryFailure {
        kind: MemoryKind::Gpu,
        configuration: format!("ratio={}", res.ratio),
        estimate_bytes: Some(m.gpu_bytes as i64),
        budget_bytes: Some(m.gpu_budget_bytes as i64),
        limit_bytes: None,
        needed_bytes: Some(needed as i64),
        pod: "p".into(),
        message: "CUDA out of memory".into(),
        seen_at: "2026-12-01T11:00:00Z".into(),
    }
}

/// The loop of issue #48 up to its first run that trained: a first job's choice ran out
/// (PyTorch needed 10 GiB more than the GPU's budget); the next job of the shape, decided from
/// that lesson, trained needing 5 GiB less than its estimate. Gives the store and both
/// decisions.
fn ran_out_then_trained(profile: &OffloadProfileSpec) -> (LearnedMemory, Resolution, Resolution) {
    let mut store = LearnedMemory::default();
    let first = decide(&new_job(0), &store, profile);
    let r1 = share(&first);
    assert!(r1 > 0.0 && r1 < 1.0, "{}", first.summary());
    let budget = first.memory.as_ref().unwrap().gpu_budget_bytes;
    run(
        &mut store,
        &job(),
        &first,
        budget + 6 * GIB,
        true,
        "ns/train/0",
    );
    let second = decide(&new_job(1), &store, profile);
    assert!(share(&second) > r1, "{}", second.summary());
    assert!(second.trial.is_none());
    let needed = second.memory.as_ref().unwrap().gpu_bytes - 5 * GIB;
    run(&mut store, &job(), &second, needed, false, "ns/train/1");
    (store, first, second)
}

fn new_job(n: u32) -> JobRequest {
    JobRequest {
        identity: Some(format!("ns/train@{n:02}")),
        ..job()
    }
}

/// The loop of issue #48, as the decision sees it: after a failure and a run that trained, the
/// next job of the shape tries a faster share between the two, which runs out; the job goes
/// back to what trained; later jobs never go past what trained again, and never try a share
/// that ran out.
#[test]
fn the_loop_moves_toward_the_fastest_that_runs_and_never_away_from_what_trained() {
    let profile = profile();
    let (mut store, first, second) = ran_out_then_trained(&profile);
    let (r1, r2) = (share(&first), share(&second));
    let budget = first.memory.as_ref().unwrap().gpu_budget_bytes;

    // A new job of the shape: a trial between what ran out and what trained.
    let mut next = new_job(2);
    let third = decide(&next, &store, &profile);
    let r3 = share(&third);
    let trial = third.trial.as_ref().expect("a trial");
    assert_eq!(trial.fallback, second.placement);
    assert!(
        r3 > r1 + TRIAL_STEP - 1e-9 && r3 <= r2 - TRIAL_STEP + 1e-9,
        "{r1} < {r3} < {r2}: {}",
        third.summary()
    );
    let why = reason(&third, Field::OffloadRatio);
    assert!(
        why.contains("a trial (1 of at most 2") && why.contains("goes back to"),
        "{why}"
    );
    assert!(third.learned_summary().unwrap().contains("trial"));
    // It ran out: the job goes back to what trained, not to a share raised past the failure.
    run(&mut store, &next, &third, budget + GIB, true, "ns/train/3");
    next.memory_failures.push(failure(&third, budget + GIB));
    let back = decide(&next, &store, &profile);
    assert_eq!(back.placement, second.placement, "{}", back.summary());
    assert!(back.trial.is_none());
    assert!(
        reason(&back, Field::OffloadRatio).contains("goes back to"),
        "{}",
        back.summary()
    );

    // The next job: a second trial above the share that ran out, or none.
    let later = new_job(3);
    let fourth = decide(&later, &store, &profile);
    let r4 = share(&fourth);
    assert!(r4 <= r2 + 1e-9, "never past what trained: {r4} > {r2}");
    assert!(
        r4 >= r3 + TRIAL_STEP - 1e-9,
        "never as far as what ran out: {r4} after {r3}"
    );
    assert!(
        fourth.trial.is_none(),
        "no room above what ran out: {}",
        fourth.summary()
    );
}

/// A trial that trains is what later jobs start from, and no later job goes past it.
#[test]
fn a_trial_that_trains_is_kept() {
    let profile = profile();
    let (mut store, _, second) = ran_out_then_trained(&profile);
    let mut last = second;
    let mut trials = 0;
    for n in 2..6 {
        let next = decide(&new_job(n), &store, &profile);
        assert!(
            share(&next) <= share(&last) + 1e-9,
            "{} after {}: {}",
            share(&next),
            share(&last),
            next.summary()
        );
        trials += usize::from(next.trial.is_some());
        // It needed 1 GiB less than its estimate, or than the GPU's budget where the estimate
        // (a configuration that trained, over the model's figures) is above it.
        let m = next.memory.as_ref().unwrap();
        let needed = m.gpu_bytes.min(m.gpu_budget_bytes) - GIB;
        run(
            &mut store,
            &job(),
            &next,
            needed,
            false,
            &format!("ns/train/{n}"),
        );
        last = next;
    }
    assert!(
        trials >= 1,
        "the first job after the runs tries a faster share"
    );
}

/// Trials of a shape stop at the profile's `fasterTrials`, whatever they ended with.
#[test]
fn trials_are_bounded_by_the_profile() {
    let (mut store, _, second) = ran_out_then_trained(&profile());
    // A trial made earlier, of a share slower than the one that trained (so it neither proves
    // a faster share nor bounds one): it counts against the bound all the same.
    let mut earlier = second.clone();
    earlier.placement = Placement::PartialOptimizer(share(&second) + 0.1);
    earlier.trial = Some(crate::decision::Trial {
        fallback: Placement::Optimizer,
        evidence: String::new(),
    });
    // Ten points more of the share on the host free about 13.6 GiB of this model's GPU figure:
    // the run needed less than that share's estimate.
    let needed = second.memory.as_ref().unwrap().gpu_bytes - 20 * GIB;
    run(&mut store, &job(), &earlier, needed, false, "ns/trial/1");
    for (bound, tried) in [(1, false), (2, true), (0, false)] {
        let p = OffloadProfileSpec {
            faster_trials: bound,
            ..profile()
        };
        let next = decide(&new_job(9), &store, &p);
        assert_eq!(
            next.trial.is_some(),
            tried,
            "fasterTrials {bound}: {}",
            next.summary()
        );
    }
}

#[test]
fn a_configuration_that_trained_is_never_offloaded_past_whatever_a_later_failure_teaches() {
    let no_trials = OffloadProfileSpec {
        faster_trials: 0,
        ..profile()
    };
    let (mut store, _, second) = ran_out_then_trained(&no_trials);
    // Another job of the shape ran out at the share that trained, far above the GPU: its
    // lesson lifts the model's figures past that share (and it no longer counts as proof);
    // a share above it that trained still stands.
    let mut above = second.clone();
    above.placement = Placement::PartialOptimizer(share(&second) + 0.05);
    let needed = above.memory.as_ref().unwrap().gpu_bytes - 6 * GIB;
    run(&mut store, &job(), &above, needed, false, "ns/c/3");
    let budget = second.memory.as_ref().unwrap().gpu_budget_bytes;
    run(
        &mut store,
        &job(),
        &second,
        budget + 30 * GIB,
        true,
        "ns/b/4",
    );
    let next = decide(&new_job(5), &store, &no_trials);
    assert!(
        share(&next) <= share(&above) + 1e-9,
        "{} after {}: {}",
        share(&next),
        share(&above),
        next.summary()
    );
    assert_eq!(next.placement, above.placement, "{}", next.summary());
    assert!(next.proven);
    assert!(
        reason(&next, Field::OffloadRatio).contains("trained for this job shape"),
        "{}",
        next.summary()
    );
    assert!(next.learned_summary().unwrap().contains("trained"));
}

#[test]
fn no_trial_for_another_kind_a_fixed_share_no_learning_or_other_gpus() {
    let profile = profile();
    let (store, _, second) = ran_out_then_trained(&profile);
    let job = new_job(6);
    assert!(decide(&job, &store, &profile).trial.is_some());
    // Another kind (no identity: nothing recreates it after an out-of-memory).
    let other = JobRequest {
        identity: None,
        ..job.clone()
    };
    assert!(decide(&other, &store, &profile).trial.is_none());
    // A job that fixes its share.
    let mut fixed = job.clone();
    fixed.offload.offload_ratio = offload_api::v1alpha1::RatioSetting::Fixed(share(&second));
    assert!(decide(&fixed, &store, &profile).trial.is_none());
    // A profile without trials, or without learning.
    let off = OffloadProfileSpec {
        faster_trials: 0,
        ..profile.clone()
    };
    assert!(decide(&job, &store, &off).trial.is_none());
    let unlearned = OffloadProfileSpec {
        learn_memory: false,
        ..profile.clone()
    };
    let plain = decide(&job, &store, &unlearned);
    assert!(plain.trial.is_none() && !plain.proven);
    // The same shape on GPUs of another size: the runs prove nothing there.
    let h100 = with_host(
        with_report(h200("h100"), |r| {
            r.gpus[0].memory_total_bytes = 85_520_809_984;
            r.gpus[0].name = "NVIDIA H100 80GB HBM3".into();
        }),
        H200_HOST,
    );
    let small = resolve_offload(
        &JobRequest {
            learned: Some(LearnedView {
                memory: Arc::new(store.clone()),
                now: now(),
                namespace: None,
                job: None,
            }),
            ..job.clone()
        },
        "default",
        &profile,
        &idx(&[h100]),
    );
    if let Ok(small) = small {
        assert!(
            small.trial.is_none() && !small.proven,
            "{}",
            small.summary()
        );
    }
}

/// A shape whose step holds large fp32 logits (a 256k vocabulary at 8,192 tokens): the room a
/// first decision keeps for the allocator beside them is several GiB more than the GPU's
/// fragmentation share. A trial spends that room (only a run tells whether the step's
/// allocations need it, `memory-h200.md` "At the H100's boundary"); should it run out there,
/// the job goes back to what trained and no later trial goes as far.
#[test]
fn a_trial_spends_the_allocators_room_and_a_failure_there_bounds_every_later_trial() {
    let profile = profile();
    let logits_job = |n: u32| {
        let mut j = new_job(n);
        j.model = Some(offload_api::v1alpha1::ModelHints {
            vocab_size: Some(256_000),
            ..bench_hints(8_000_000_000, 4096, 36)
        });
        j
    };
    let mut store = LearnedMemory::default();
    let first = decide(&logits_job(0), &store, &profile);
    let r1 = share(&first);
    assert!(r1 > 0.0 && r1 < 1.0, "{}", first.summary());
    let m1 = first.memory.clone().unwrap();
    let room = m1.gpu_allocator_room_bytes;
    assert!(
        room as f64 > 0.02 * H200_GPU as f64 + 2.0 * GIB as f64,
        "the logits' room: {room}"
    );
    // It trained needing what the model counted: no lesson of "less".
    run(
        &mut store,
        &logits_job(0),
        &first,
        m1.gpu_bytes,
        false,
        "ns/l/0",
    );

    let next = logits_job(1);
    let second = decide(&next, &store, &profile);
    let r2 = share(&second);
    let trial = second.trial.as_ref().expect("a trial");
    assert_eq!(trial.fallback, first.placement);
    let m2 = second.memory.clone().unwrap();
    assert!(
        r2 <= r1 - TRIAL_STEP + 1e-9 && m2.gpu_bytes > m1.gpu_budget_bytes,
        "{r2} after {r1}: a trial past the {} a first decision may use: {}",
        m1.gpu_budget_bytes,
        second.summary()
    );
    // It keeps the context and the fragmentation share all the same, and its status shows the
    // budget it was checked against.
    let without_room = H200_GPU as f64 * 0.98 - 1.4 * GIB as f64;
    assert!(m2.gpu_bytes as f64 <= without_room, "{}", second.summary());
    assert!(
        m2.gpu_bytes <= m2.gpu_budget_bytes && m2.gpu_budget_bytes > m1.gpu_budget_bytes,
        "{m2:?}"
    );
    let why = reason(&second, Field::OffloadRatio);
    assert!(
        why.contains("a trial spends the room kept for the allocator"),
        "{why}"
    );

    // It ran out on the allocator's fragmentation: back to what trained.
    let mut failed = next.clone();
    run(
        &mut store,
        &failed,
        &second,
        m2.gpu_bytes + GIB,
        true,
        "ns/l/1",
    );
    failed
        .memory_failures
        .push(failure(&second, m2.gpu_bytes + GIB));
    let back = decide(&failed, &store, &profile);
    assert_eq!(back.placement, first.placement, "{}", back.summary());
    assert!(back.trial.is_none());

    // Later jobs: never as far as the trial that ran out again.
    let later = decide(&logits_job(2), &store, &profile);
    let r3 = share(&later);
    assert!(
        r3 >= r2 + TRIAL_STEP - 1e-9 && r3 <= r1 + 1e-9,
        "{r3} after {r2} ran out and {r1} trained: {}",
        later.summary()
    );
}

/// A trial that trains but steps slower than the configuration it left (beyond the noise) is
/// not what later jobs start from: they go back to the faster one, say why with both steps, and
/// no later trial goes as far. One within the noise (5 %), or faster, is kept.
#[test]
fn a_trial_that_trains_slower_is_left_and_bounds_every_later_trial() {
    let profile = profile();
    let (base, _, second) = ran_out_then_trained(&profile);
    let r2 = share(&second);
    let needed = second.memory.as_ref().unwrap().gpu_bytes - 5 * GIB;
    let mut timed = base.clone();
    // The run that trained, its steps timed this time (the same job's run: its figures merge).
    run_timed(
        &mut timed,
        &job(),
        &second,
        needed,
        false,
        "ns/train/1",
        Some(2.0),
    );
    let third = decide(&new_job(2), &timed, &profile);
    let r3 = share(&third);
    assert!(third.trial.is_some() && r3 < r2, "{}", third.summary());
    let trial_needed = {
        let m = third.memory.as_ref().unwrap();
        m.gpu_bytes.min(m.gpu_budget_bytes) - GIB
    };

    for (step, kept) in [(2.3, false), (2.08, true), (1.9, true)] {
        let mut store = timed.clone();
        run_timed(
            &mut store,
            &job(),
            &third,
            trial_needed,
            false,
            "ns/train/2",
            Some(step),
        );
        // One trial allowed: none is left, so the decision is what ran fastest.
        let one = OffloadProfileSpec {
            faster_trials: 1,
            ..profile.clone()
        };
        let next = decide(&new_job(3), &store, &one);
        assert!(next.trial.is_none(), "{}", next.summary());
        let expected = if kept { r3 } else { r2 };
        assert!(
            (share(&next) - expected).abs() < 1e-9,
            "trial step {step}: {} (expected {expected}): {}",
            share(&next),
            next.summary()
        );
        let why = reason(&next, Field::OffloadRatio);
        assert_eq!(
            why.contains("stepped in 2000 ms, faster than") && why.contains("2300 ms"),
            !kept,
            "{why}"
        );
        // `kubectl get tj`'s LEARNED says it in short.
        let learned = next.learned_summary().unwrap_or_default();
        assert_eq!(
            learned.contains("trained, 2000 ms a step; ") && learned.ends_with(" 2300 ms"),
            !kept,
            "{learned}"
        );
        // With trials left, a later one stays short of the share that stepped slower.
        let later = decide(&new_job(4), &store, &profile);
        if !kept {
            assert!(
                share(&later) >= r3 + TRIAL_STEP - 1e-9 && share(&later) <= r2 + 1e-9,
                "{r3} < {} <= {r2}: {}",
                share(&later),
                later.summary()
            );
        }
    }
}

/// What one namespace's runs taught reaches another namespace's jobs only where the profile
/// says the namespaces share what they learn: by default a job elsewhere is decided as if
/// nothing had run.
#[test]
fn another_namespaces_runs_count_only_where_the_profile_shares_them() {
    use offload_api::v1alpha1::LearningScope;
    let profile = profile();
    // Every run of the story is a job of namespace "ns".
    let (store, first, _) = ran_out_then_trained(&profile);
    let in_namespace = |ns: &str, p: &OffloadProfileSpec| {
        let view = LearnedView {
            memory: Arc::new(store.clone()),
            now: now(),
            namespace: None,
            job: None,
        }
        .for_job(p.learning_scope, ns);
        let job = JobRequest {
            learned: Some(view),
            ..new_job(2)
        };
        resolve_offload(&job, "default", p, &idx(&[node()])).unwrap()
    };
    let learned = decide(&new_job(2), &store, &profile);
    assert!(learned.trial.is_some(), "{}", learned.summary());
    let own = in_namespace("ns", &profile);
    assert_eq!(
        (own.placement, own.trial.is_some()),
        (learned.placement, true)
    );
    let other = in_namespace("other", &profile);
    assert_eq!(other.placement, first.placement, "{}", other.summary());
    assert!(other.trial.is_none() && other.learned_summary().is_none());
    let shared = OffloadProfileSpec {
        learning_scope: LearningScope::Cluster,
        ..profile.clone()
    };
    let across = in_namespace("other", &shared);
    assert_eq!(across.placement, learned.placement, "{}", across.summary());
}
