//! What earlier runs of a job's shape proved about its configurations, on the node class and the
//! GPUs it is decided for, applied over the fastest rung the memory model finds
//! ([`crate::decision::ladder::rungs::fastest`]):
//!
//! - **What trained fits.** A configuration that trained for the shape (its workload succeeded)
//!   is proof: the decision never offloads more than it, whatever the model's figures say after
//!   a later lesson (a failure's lower bound, a margin).
//! - **Back to what ran.** After this job ran out of GPU memory, it goes back to the fastest
//!   configuration that trained, where one is known, rather than to one the model raised past
//!   the failure that never ran.
//! - **A trial of a faster rung.** Where the model's choice is the fastest configuration that
//!   trained, and the runs' own figures — the largest need a run that trained showed, without
//!   the store's smoothing (one run below moves a factor half-way; one above adds a margin; a
//!   failure's lower bound counts as a need) — say a faster rung fits, a TrainingJob may try
//!   it: half-way to the share those figures allow (a partial share; no offload where it fits
//!   whole), keeping the GPU's context and fragmentation share but not the allocator's room
//!   beside the step's logits (a first decision keeps it; only a run tells whether the step's
//!   allocations need it), bounded by the profile's
//!   `fasterTrials` per shape, never a configuration that ran out for the shape nor one faster,
//!   and never after this job ran out of memory. Should it run out, the job goes back to what
//!   trained, and the failure bounds every later trial.
//!
//! - **What stepped faster.** Where the runs' processes timed their steps (the reporter), what
//!   trained is ranked by them rather than by the model's order: a less offloaded configuration
//!   whose steps were more than [`STEP_NOISE`] slower than another's that trained is not what
//!   the decision starts from, and bounds every later trial as a failure does.
//!
//! Evidence counts only where its ranks and GPUs are the decision's: a configuration proven on
//! eight GPUs proves nothing on one.

use offload_api::v1alpha1::MemoryKind;

use super::learned::{LearnedFactors, RanAs, RanRecord};
use crate::decision::ladder::rungs;
use crate::decision::ladder::rungs::Allowed;
use crate::decision::ladder::rungs::MemoryChoice;
use crate::decision::ladder::rungs::PartialRatio;
use crate::decision::ladder::rungs::Trial;
use crate::decision::ladder::rungs::Tried;
use crate::decision::model::memory::ClassMemory;
use crate::decision::model::memory::JobMemory;
use crate::decision::model::memory::Placement;
use crate::decision::model::memory::gib;
use crate::decision::request::JobRequest;

/// A trial's share is at least this much below the share that trained, and above one that ran
/// out: less is not worth a run.
pub const TRIAL_STEP: f64 = 0.02;

/// The records of runs that count for a decision of `jm` on `cm`: its class, its ranks, GPUs of
/// its size.
fn records<'a>(jm: &'a JobMemory, cm: &ClassMemory) -> Vec<&'a RanRecord> {
    let Some(class) = cm.class else {
        return Vec::new();
    };
    jm.ran
        .get(&class)
        .map(|rs| {
            rs.iter()
                .filter(|r| r.ran_as.same_setting(jm.ranks, cm.gpu_bytes))
                .collect()
        })
        .unwrap_or_default()
}

fn placement_of(r: &RanAs) -> Placement {
    Placement::from_state(r.placement, r.ratio)
}

/// A configuration whose steps took this much longer than another's is slower; less is taken
/// as noise between runs and nodes. A rung's gain at the boundary measured 6–7 % (the H100's
/// Gemma-3 and Cohere, `docs/benchmarks/closed-loop-h200.md`), so a slower trial beyond this
/// is one that lost its rung's gain.
pub const STEP_NOISE: f64 = 0.05;

/// The mean of the steps timed for `r`'s configuration among `records`, seconds.
fn step_of(records: &[&RanRecord], r: &RanRecord) -> Option<f64> {
    let steps: Vec<f64> = records
        .iter()
        .filter(|o| o.trained && o.ran_as.same_placement(&r.ran_as))
        .filter_map(|o| o.step_seconds)
        .collect();
    #[allow(clippy::cast_precision_loss)]
    (!steps.is_empty()).then(|| steps.iter().sum::<f64>() / steps.len() as f64)
}

/// The fastest configuration that trained and never ran out of memory in another run: the
/// least offloaded, unless the steps its runs timed are slower, beyond [`STEP_NOISE`], than
/// another's that trained (then that one, the latest of its runs).
fn proven<'a>(records: &[&'a RanRecord], allowed: &Allowed) -> Option<&'a RanRecord> {
    let trained: Vec<&RanRecord> = records
        .iter()
        .copied()
        .filter(|r| r.trained)
        .filter(|r| {
            !records
                .iter()
                .any(|f| f.failed && f.ran_as.same_placement(&r.ran_as))
        })
        .collect();
    let by_rank = trained
        .iter()
        .copied()
        .min_by_key(|r| allowed.speed_rank(placement_of(&r.ran_as)))?;
    let Some(its) = step_of(records, by_rank) else {
        return Some(by_rank);
    };
    trained
        .iter()
        .filter_map(|r| Some((*r, step_of(records, r)?)))
        .filter(|(_, t)| *t < its * (1.0 - STEP_NOISE))
        .min_by(|a, b| a.1.total_cmp(&b.1).then(b.0.at.cmp(&a.0.at)))
        .map_or(Some(by_rank), |(r, _)| Some(r))
}

/// The configurations that trained, faster by the memory model's order than `best`, whose steps
/// were slower than `best`'s beyond [`STEP_NOISE`]: with their steps, `best`'s, in seconds.
fn measured_slower(
    records: &[&RanRecord],
    allowed: &Allowed,
    best: &RanRecord,
) -> Vec<(Placement, f64, f64)> {
    let Some(its) = step_of(records, best) else {
        return Vec::new();
    };
    let rank = allowed.speed_rank(placement_of(&best.ran_as));
    let mut out: Vec<(Placement, f64, f64)> = Vec::new();
    for r in records.iter().filter(|r| r.trained) {
        let p = placement_of(&r.ran_as);
        if allowed.speed_rank(p) < rank
            && !out.iter().any(|(q, ..)| same(*q, p))
            && let Some(t) = step_of(records, r)
            && t * (1.0 - STEP_NOISE) > its
        {
            out.push((p, t, its));
        }
    }
    out
}

/// `slower` (from [`measured_slower`]) in words.
fn slower_words(ran: Placement, slower: &[(Placement, f64, f64)]) -> String {
    let others = slower
        .iter()
        .map(|(p, t, _)| format!("{p} at {:.0} ms", t * 1000.0))
        .collect::<Vec<_>>()
        .join(", ");
    let its = slower.first().map_or(0.0, |s| s.2);
    format!(
        "{ran} stepped in {:.0} ms, faster than {others}, which trained too (the steps its processes timed, the median after the first)",
        its * 1000.0
    )
}

/// Whether two placements are the same configuration (shares within half a percent).
fn same(a: Placement, b: Placement) -> bool {
    let ((pa, ra), (pb, rb)) = (a.state(), b.state());
    pa == pb && (ra - rb).abs() < 0.005
}

/// Whether `allowed` lets the job take `p`.
fn permits(allowed: &Allowed, p: Placement) -> bool {
    match p {
        Placement::NoOffload => allowed.no_offload,
        Placement::PartialOptimizer(r) => match &allowed.partial {
            PartialRatio::Free(floor) => r >= *floor - 1e-9,
            PartialRatio::Fixed(f) => (r - f).abs() < 0.005,
            PartialRatio::No(_) => false,
        },
        Placement::Optimizer => allowed.whole_optimizer,
        Placement::OptimizerAndParams => allowed.with_params,
    }
}

/// `jm` with `activations` as the learned factor on `cm`'s class.
fn with_activations(jm: &JobMemory, cm: &ClassMemory, activations: f64) -> JobMemory {
    let mut jm = jm.clone();
    if let Some(class) = cm.class {
        let f = jm.learned.get(&class).copied().unwrap_or_default();
        jm.learned.insert(
            class,
            LearnedFactors {
                activations,
                runs: f.runs.max(1),
                ..f
            },
        );
    }
    jm
}

/// The choice of `placement` on `cm`, its figures in a sentence, `note` after them.
fn choice_of(jm: &JobMemory, cm: &ClassMemory, placement: Placement, note: String) -> MemoryChoice {
    let estimate = jm.estimate_checked(placement, cm).0;
    let (brief, provenance) = jm.brief(&estimate, cm);
    MemoryChoice {
        placement,
        figures: format!(
            "{}{}; {note}",
            jm.describe(&estimate, cm),
            rungs::model_note(jm)
        ),
        brief,
        provenance,
        estimate,
        class: cm.clone(),
        proven: true,
        trial: None,
        stepped: None,
        bf16_states: jm.bf16_states,
    }
}

/// What the run of `r` needed of each GPU, as the model gives it with the run's own factor.
fn needed(jm: &JobMemory, cm: &ClassMemory, r: &RanRecord) -> f64 {
    with_activations(jm, cm, r.activations)
        .estimate_checked(placement_of(&r.ran_as), cm)
        .0
        .gpu
}

/// The decision of `jm` on `cm` with what runs of its shape proved applied to the model's
/// `choice`.
pub(in crate::decision) fn apply(
    jm: &JobMemory,
    cm: &ClassMemory,
    allowed: &Allowed,
    job: &JobRequest,
    choice: Result<MemoryChoice, Tried>,
) -> Result<MemoryChoice, Tried> {
    let records = records(jm, cm);
    let Some(best) = proven(&records, allowed) else {
        return choice;
    };
    let ran = placement_of(&best.ran_as);
    if !permits(allowed, ran) {
        return choice;
    }
    let when = best.at.strftime("%Y-%m-%d").to_string();
    let slower = match &choice {
        Ok(c) => allowed.speed_rank(c.placement) > allowed.speed_rank(ran),
        Err(_) => true,
    };
    let ran_out = job
        .memory_failures
        .iter()
        .any(|f| f.kind == MemoryKind::Gpu);
    let faster_untried =
        matches!(&choice, Ok(c) if allowed.speed_rank(c.placement) < allowed.speed_rank(ran));
    let need = gib(needed(jm, cm, best));
    if ran_out && (slower || faster_untried) {
        let note = format!(
            "this job ran out of GPU memory; it goes back to {ran}, which trained for its shape on these GPUs ({when}, needing about {need} of each), rather than to a configuration raised past the failure that never ran"
        );
        return where_host_fits(jm, cm, ran, note).map_or(choice, Ok);
    }
    let stepped_slower = measured_slower(&records, allowed, best);
    let choice = if slower {
        let note = format!(
            "{ran} trained for this job shape on these GPUs ({when}, needing about {need} of each): what trained fits, so the decision offloads no more than it, whatever the model's figures say"
        );
        match where_host_fits(jm, cm, ran, note) {
            Some(c) => Ok(c),
            None => return choice,
        }
    } else if faster_untried && !stepped_slower.is_empty() {
        // Less offloaded is not faster here: what ran says so.
        match where_host_fits(jm, cm, ran, keeps_to(ran, &when, &need, &stepped_slower)) {
            Some(c) => Ok(stepped(c, &stepped_slower)),
            None => return choice,
        }
    } else {
        choice
    };
    match choice {
        Ok(c) if !ran_out && same(c.placement, ran) => {
            if let Some(t) = trial(jm, cm, allowed, &records, best, &stepped_slower) {
                Ok(t)
            } else if stepped_slower.is_empty() || c.proven {
                Ok(c)
            } else {
                // The model's own choice, said as what ran: the faster rung trained slower.
                Ok(stepped(
                    choice_of(jm, cm, ran, keeps_to(ran, &when, &need, &stepped_slower)),
                    &stepped_slower,
                ))
            }
        }
        other => other,
    }
}

/// `c` marked as ranked by its steps over `slower`, in short.
fn stepped(mut c: MemoryChoice, slower: &[(Placement, f64, f64)]) -> MemoryChoice {
    c.stepped = slower.first().map(|(p, t, its)| {
        format!(
            "{:.0} ms a step; {} {:.0} ms",
            its * 1000.0,
            crate::decision::resolution::short(*p),
            t * 1000.0
        )
    });
    c
}

/// Why the decision keeps to `ran`, which stepped faster than the less offloaded `slower`.
fn keeps_to(ran: Placement, when: &str, need: &str, slower: &[(Placement, f64, f64)]) -> String {
    format!(
        "{}: the decision keeps to the fastest configuration that ran ({when}, needing about {need} of each GPU), rather than one the model ranks faster",
        slower_words(ran, slower)
    )
}

/// The choice of `ran` (a configuration that trained) with `note`; `None` where its host
/// memory does not fit here (what trained proves the GPU side only).
fn where_host_fits(
    jm: &JobMemory,
    cm: &ClassMemory,
    ran: Placement,
    note: String,
) -> Option<MemoryChoice> {
    jm.estimate_checked(ran, cm)
        .1
        .host
        .then(|| choice_of(jm, cm, ran, note))
}

/// What ran out (or trained slower) bounds a trial: the smallest share it may try (one step
/// past every partial share that failed, never below what the profile allows) and the rungs
/// left, no offload gone where it failed.
fn bounded_by(allowed: &Allowed, failed: &[Placement]) -> (f64, Allowed) {
    let floor = failed
        .iter()
        .filter_map(|p| match p {
            Placement::PartialOptimizer(r) => Some(r + TRIAL_STEP),
            _ => None,
        })
        .fold(
            match allowed.partial {
                PartialRatio::Free(f) => f,
                _ => 1.0,
            },
            f64::max,
        );
    let bounded = Allowed {
        no_offload: allowed.no_offload && !failed.contains(&Placement::NoOffload),
        partial: match allowed.partial {
            PartialRatio::Free(_) if floor < 1.0 => PartialRatio::Free(floor),
            PartialRatio::Free(_) => PartialRatio::No("every smaller share ran out".into()),
            ref p => p.clone(),
        },
        ..allowed.clone()
    };
    (floor, bounded)
}

/// The placement a trial tries, between what the runs' figures allow (`allows`) and what
/// trained (`ran`): half-way between two partial shares (a model off by a little at the
/// boundary costs one trial, not the step's whole gain), in whole percent as the operator writes
/// shares; `None` where that is not a step past what trained or falls below `floor`.
fn halfway(allows: Placement, ran: Placement, floor: f64) -> Option<Placement> {
    match (allows, ran) {
        (Placement::PartialOptimizer(a), Placement::PartialOptimizer(r)) => {
            let share = ((a + r) / 2.0).min(r - TRIAL_STEP).max(floor);
            let share = (share * 100.0).round() / 100.0;
            if share > r - TRIAL_STEP + 1e-9 || share < floor - 1e-9 {
                return None;
            }
            Some(Placement::PartialOptimizer(share))
        }
        (p, _) => Some(p),
    }
}

/// A trial of a rung faster than `best` (the fastest that trained), where the policy and the
/// runs' own figures allow one, never as far as a configuration that ran out or one that
/// trained slower than `best` (`stepped_slower`).
fn trial(
    jm: &JobMemory,
    cm: &ClassMemory,
    allowed: &Allowed,
    records: &[&RanRecord],
    best: &RanRecord,
    stepped_slower: &[(Placement, f64, f64)],
) -> Option<MemoryChoice> {
    // Trials other jobs took that have not run yet count too: two decisions made together
    // cannot both take the last one.
    let reserved = cm
        .class
        .and_then(|c| jm.reserved_trials.get(&c))
        .copied()
        .unwrap_or(0);
    let made = records.iter().filter(|r| r.trial).count() + reserved;
    if allowed.trials == 0 || made >= allowed.trials as usize {
        return None;
    }
    let ran = placement_of(&best.ran_as);
    // What ran out, and what trained slower than `best`, bound how far a trial goes.
    let failed: Vec<Placement> = records
        .iter()
        .filter(|r| r.failed)
        .map(|r| placement_of(&r.ran_as))
        .chain(stepped_slower.iter().map(|s| s.0))
        .collect();
    // The largest need a run that trained showed, as it showed it. A run that ran out shows
    // only a lower bound of its own configuration's need: it bounds how far a trial goes.
    let exact = records
        .iter()
        .filter(|r| r.trained)
        .map(|r| r.activations)
        .fold(best.activations, f64::max);
    // A trial keeps the GPU's fragmentation share but not the room kept beside the step's
    // logits: whether the step's allocations needed it, no job field says; its run does, and
    // should it run out the job goes back to what trained.
    let by_runs = with_activations(jm, cm, exact).as_trial();
    let (floor, bounded) = bounded_by(allowed, &failed);
    let allows = rungs::fastest(&by_runs, cm, &bounded).ok()?.placement;
    let target = halfway(allows, ran, floor)?;
    let rank = allowed.speed_rank(target);
    if rank >= allowed.speed_rank(ran) || failed.iter().any(|f| allowed.speed_rank(*f) >= rank) {
        return None;
    }
    let (est, fit) = by_runs.estimate_checked(target, cm);
    if !fit.ok() {
        return None;
    }
    let when = best.at.strftime("%Y-%m-%d").to_string();
    let kept = jm.gpu_budget(cm);
    let spent = if est.gpu > kept {
        format!(
            " (past the {} a first decision may use: a trial spends the room kept for the allocator beside the step's logits, which only a run tells whether the step needs)",
            gib(kept)
        )
    } else {
        String::new()
    };
    let note = format!(
        "a trial ({} of at most {} for this shape): {ran} trained ({when}, needing about {} of each GPU), and by the largest need its runs showed {target} needs {} of the {} each GPU can hold{spent}; should it run out of GPU memory, the job goes back to {ran}",
        made + 1,
        allowed.trials,
        gib(needed(jm, cm, best)),
        gib(est.gpu),
        gib(by_runs.gpu_budget(cm)),
    );
    let mut c = choice_of(&by_runs, cm, target, note.clone());
    c.trial = Some(Trial {
        fallback: ran,
        evidence: note,
    });
    Some(c)
}
