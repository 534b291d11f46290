//! Following a workload that exists, planned: its phase, its conditions computed in one pass
//! from the snapshot, what its runs teach, and the Events of what changed — never the decision.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use std::sync::Arc;

use super::planned::{Announce, Following, Learned};
use super::snapshot::Snapshot;
use super::workload::{GuardOutcome, guard_outcome, phase_of};
use crate::controller::conditions::{self, ConditionType, Reason};
use crate::controller::overlap_observed;
use crate::controller::status::{self, WorkloadStatus};
use crate::decision::ClusterView;
use crate::render;
use offload_api::names;
use offload_api::v1alpha1::{
    DEFAULT_MIN_OBSERVED_GPU_BUSY, JobPhase, ObservedOverlap, OffloadDecisionStatus, TrainingJob,
    TrainingJobStatus, WorkloadRef,
};

/// What following the snapshot's workload changes.
pub(super) fn plan_follow(snap: &Snapshot, view: &dyn ClusterView) -> Following {
    let tj = &snap.job;
    let mut plan = Following::default();
    let Some(job) = snap.workload.as_ref() else {
        return plan;
    };
    let mut current = tj.status.clone().unwrap_or_default();
    let owned = job
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == tj.metadata.uid.as_ref());
    if !owned {
        return name_conflict(tj, &current);
    }
    // A Job on its way out (recreated after running out of memory): its deletion is the next
    // change.
    if super::recovery::deleting(job) {
        return plan;
    }
    if let Some(restored) = restore_decision(tj, job, &current) {
        current.offload.clone_from(&restored.offload);
        current.observed_generation = restored.observed_generation;
        for c in &restored.conditions {
            conditions::set(&mut current.conditions, c.clone());
        }
        plan.restore = Some(restored);
    }
    // Only a job the operator configured is decided again; one that did not opt in fails as
    // it was written.
    if crate::decision::opted_in(tj)
        && let Some(failed) =
            super::recovery::unrecorded_failure(tj, &snap.pods, &current.memory_failures)
    {
        super::recovery::plan_recovery(snap, view, &current, failed, &mut plan);
        return plan;
    }
    follow_status(snap, view, job, &current, &mut plan);
    plan
}

/// The workload part of the status, the job's gauge, its lessons and the Events of what
/// changed, from the Job, its pods and what the agents observed.
fn follow_status(
    snap: &Snapshot,
    view: &dyn ClusterView,
    job: &Job,
    current: &TrainingJobStatus,
    plan: &mut Following,
) {
    let tj = &snap.job;
    let name = tj.name_any();
    let generation = tj.metadata.generation;
    let phase = phase_of(job);
    let (observed, overlap, headroom, gauge) =
        observation(view, current, snap.fresh.clone(), generation);
    plan.gauge = gauge;
    plan.lessons = lessons_of_run(snap, view, current, observed.as_ref(), phase);
    let queued = tj.labels().contains_key(names::KUEUE_QUEUE_LABEL) && phase == JobPhase::Queued;
    // Kueue's Workloads are watched where Kueue was installed when the operator started
    // (`kueue::workload_changes`); while the Job waits, look again now and then anyway (Kueue
    // installed later, or Workloads this operator may not watch).
    if queued {
        plan.next = Some(Action::requeue(QUEUED_RECHECK));
    }
    let next = WorkloadStatus {
        phase,
        workload: Some(workload_ref(&name, current, job)),
        created: status::created(&current.conditions, &name, generation),
        guard: guard_condition(tj, job, &snap.pods, &current.conditions),
        pods: super::pods::pods_condition(
            &current.conditions,
            generation,
            job,
            &snap.pods,
            snap.refusal.as_deref(),
        ),
        observed,
        overlap,
        headroom,
        admitted: admission(
            tj,
            job,
            &current.conditions,
            generation,
            snap.kueue_says.as_deref(),
        ),
    };
    let unchanged = current.phase == Some(next.phase)
        && current.workload == next.workload
        && current.observed == next.observed
        && next
            .conditions()
            .all(|c| conditions::unchanged(&current.conditions, c));
    if !unchanged {
        plan.events = announce(&current.conditions, &next);
        plan.status = Some(next);
    }
}

/// What a run of the job teaches later decisions of its shape: a new window of its peaks, the
/// end of a workload that succeeded (its configuration fits), and what the training processes
/// reported of PyTorch's own figures at exit (what the run needed, which replaces the device's
/// upper bound, and how long its steps took).
fn lessons_of_run(
    snap: &Snapshot,
    view: &dyn ClusterView,
    current: &TrainingJobStatus,
    observed: Option<&ObservedOverlap>,
    phase: JobPhase,
) -> Vec<Learned> {
    let (Some(o), Some(d)) = (
        observed.or(current.observed.as_ref()),
        current.offload.as_ref(),
    ) else {
        return Vec::new();
    };
    let nodes = view.nodes();
    let trained = phase == JobPhase::Succeeded;
    let newly_trained = trained && current.phase != Some(JobPhase::Succeeded);
    let mut lessons = Vec::new();
    if (newly_trained || current.observed.as_ref().map(|p| &p.memory) != Some(&o.memory))
        && let Some(obs) = super::learn::observed(&nodes, d, o, None, None, trained)
    {
        lessons.extend(super::learn::lesson(snap, view, &obs));
    }
    if let Some(report) = super::recovery::reported_allocation(&snap.job, &snap.pods)
        && let Some(mut obs) =
            super::learn::observed(&nodes, d, o, None, Some(report.allocated), trained)
    {
        obs.step_seconds = report.step_seconds;
        lessons.extend(super::learn::lesson(snap, view, &obs));
    }
    lessons
}

/// A Job of the job's name that it does not own: said once, as a condition and an Event.
fn name_conflict(tj: &TrainingJob, current: &TrainingJobStatus) -> Following {
    let name = tj.name_any();
    let cond = conditions::condition(
        &current.conditions,
        ConditionType::WorkloadCreated,
        false,
        Reason::NameConflict,
        format!(
            "a Job named {name} exists and is not owned by this TrainingJob: delete it or rename the TrainingJob"
        ),
        tj.metadata.generation,
    );
    if conditions::unchanged(&current.conditions, &cond) {
        return Following::default();
    }
    Following {
        status: Some(WorkloadStatus::only(JobPhase::Pending, cond)),
        events: vec![Announce::new(
            EventType::Warning,
            names::EVENT_NAME_CONFLICT,
            "a Job of the same name exists and is not owned by this TrainingJob",
        )],
        ..Following::default()
    }
}

/// The workload the status names: the Job and Service of the job's name and the config map its
/// pods mount (from the status, else from the Job itself).
fn workload_ref(name: &str, current: &TrainingJobStatus, job: &Job) -> WorkloadRef {
    WorkloadRef {
        job: name.to_string(),
        service: name.to_string(),
        config_map: current
            .workload
            .as_ref()
            .and_then(|w| w.config_map.clone())
            .or_else(|| {
                job.spec
                    .as_ref()
                    .and_then(|s| s.template.spec.as_ref())
                    .and_then(|s| s.volumes.as_ref())
                    .and_then(|v| v.iter().find(|v| v.name == render::CONFIG_VOLUME))
                    .and_then(|v| v.config_map.as_ref())
                    .map(|c| c.name.clone())
            }),
    }
}

/// The Events of a status change: Kueue suspending an admitted job again, a flag going up
/// (GPUs idle with overlap on, a GPU near its memory, pods refused or unschedulable), a
/// start-up guard that failed.
fn announce(previous: &[Condition], next: &WorkloadStatus) -> Vec<Announce> {
    let mut events = Vec::new();
    // Kueue suspending an admitted job again (preemption, eviction) is worth an Event.
    let was_admitted = conditions::has(previous, ConditionType::Admitted, "True");
    if was_admitted && let Some(c) = next.admitted.as_ref().filter(|c| c.status == "False") {
        events.push(Announce::new(
            EventType::Normal,
            names::EVENT_SUSPENDED,
            c.message.clone(),
        ));
    }
    // An Event when a flag goes up, not every time the figure in its message moves.
    for c in [&next.overlap, &next.headroom, &next.pods]
        .into_iter()
        .flatten()
    {
        let was_flagged = previous
            .iter()
            .any(|p| p.type_ == c.type_ && p.status == "False");
        if !was_flagged && c.status == "False" {
            events.push(Announce::new(
                EventType::Warning,
                &c.reason,
                c.message.clone(),
            ));
        }
    }
    if let Some(g) = next
        .guard
        .as_ref()
        .filter(|g| g.status == "False" && !conditions::unchanged(previous, g))
    {
        events.push(Announce::new(
            EventType::Warning,
            names::EVENT_STARTUP_GUARD_FAILED,
            g.message.clone(),
        ));
    }
    events
}

/// The job's observed figures (fresh ones from the agents' summaries, else the last recorded),
/// with the memory its configuration used so far; the `OverlapObserved` condition where there
/// is something to judge, and `GPUMemoryHeadroom` once a GPU peak is known (else the ones
/// recorded, which the workload writer owns and must repeat); the job's GPU-busy gauge.
#[allow(clippy::type_complexity)]
fn observation(
    view: &dyn ClusterView,
    current: &TrainingJobStatus,
    fresh: Option<ObservedOverlap>,
    generation: Option<i64>,
) -> (
    Option<ObservedOverlap>,
    Option<Condition>,
    Option<Condition>,
    Option<(f64, Option<bool>)>,
) {
    let recorded_of = |kind: ConditionType| kind.find(&current.conditions).cloned();
    let decision = current.offload.as_ref();
    let observed = match (fresh, decision) {
        (Some(o), Some(d)) => Some(with_memory(o, current.observed.as_ref(), d)),
        (fresh, _) => fresh.or_else(|| current.observed.clone()),
    };
    let headroom = observed
        .as_ref()
        .and_then(|o| o.memory.as_ref())
        .and_then(overlap_observed::judge_memory)
        .map(|(ok, reason, message)| {
            conditions::condition(
                &current.conditions,
                ConditionType::GpuMemoryHeadroom,
                ok,
                reason,
                message,
                generation,
            )
        })
        .or_else(|| recorded_of(ConditionType::GpuMemoryHeadroom));
    let recorded = recorded_of(ConditionType::OverlapObserved);
    let (Some(o), Some(decision)) = (observed.as_ref(), decision) else {
        return (observed, recorded, headroom, None);
    };
    let threshold = view
        .profile(&decision.profile)
        .map_or(DEFAULT_MIN_OBSERVED_GPU_BUSY, |p| p.min_observed_gpu_busy);
    let verdict = overlap_observed::judge(decision, o, threshold);
    let gauge = Some((o.gpu_busy, verdict.as_ref().map(|(ok, ..)| !ok)));
    let Some((ok, reason, message)) = verdict else {
        return (observed, recorded, headroom, gauge);
    };
    let cond = conditions::condition(
        &current.conditions,
        ConditionType::OverlapObserved,
        ok,
        reason,
        message,
        generation,
    );
    (observed, Some(cond), headroom, gauge)
}

/// A fresh observation with the memory its configuration used so far: its new window merged
/// into what was recorded.
fn with_memory(
    mut o: ObservedOverlap,
    previous: Option<&ObservedOverlap>,
    d: &OffloadDecisionStatus,
) -> ObservedOverlap {
    let new_window = previous.is_none_or(|p| p.observed_at != o.observed_at);
    let recorded = previous.and_then(|p| p.memory.as_ref());
    o.memory = match o.memory.as_ref() {
        Some(m) => Some(overlap_observed::merge_memory(
            recorded,
            m,
            new_window,
            &crate::decision::runs::evidence::configuration(d),
            d,
        )),
        None => recorded.cloned(),
    };
    o
}

/// Where the status lost its decision (the operator or the API server died between creating
/// the workload and recording it), the decision part written back from the record the Job
/// carries, with the `OffloadResolved` condition. A Job without a readable record restores
/// nothing.
fn restore_decision(
    tj: &TrainingJob,
    job: &Job,
    current: &TrainingJobStatus,
) -> Option<TrainingJobStatus> {
    if current.offload.is_some() {
        return None;
    }
    let text = job.annotations().get(names::ANNOTATION_DECISION)?;
    let record: OffloadDecisionStatus = match serde_json::from_str(text) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(job = %tj.name_any(), error = %e, "the workload's decision record does not parse; not restored");
            return None;
        }
    };
    Some(status::restored(
        &current.conditions,
        record,
        tj.metadata.generation,
    ))
}

/// What the start-up guard said in the workload's pods: `False` with the first failure's
/// message, `True` once a guard passed and none failed, else the condition already recorded (the
/// workload writer owns it and must repeat it). `None` when the workload has no guard or it has
/// not run yet.
fn guard_condition(
    tj: &TrainingJob,
    job: &Job,
    pods: &[Arc<Pod>],
    existing: &[Condition],
) -> Option<Condition> {
    let recorded = ConditionType::NodeVerified.find(existing).cloned();
    let guarded = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.name == render::GUARD_CONTAINER));
    if !guarded {
        return recorded;
    }
    let mut passed = None;
    for pod in pods {
        match guard_outcome(pod) {
            Some(GuardOutcome::Failed(message)) => {
                return Some(conditions::condition(
                    existing,
                    ConditionType::NodeVerified,
                    false,
                    Reason::StartupGuardFailed,
                    message,
                    tj.metadata.generation,
                ));
            }
            Some(GuardOutcome::Passed(node)) => passed = passed.or(Some(node)),
            None => {}
        }
    }
    match passed {
        Some(_) if recorded.as_ref().is_some_and(|r| r.status == "True") => recorded,
        Some(node) => Some(conditions::condition(
            existing,
            ConditionType::NodeVerified,
            true,
            Reason::StartupGuardPassed,
            format!("the start-up guard found node {node} to be what the configuration assumes"),
            tj.metadata.generation,
        )),
        None => recorded,
    }
}

/// How often a queued job's Workload is read again for Kueue's reason where no watch of
/// Workloads tells the operator of a change.
const QUEUED_RECHECK: std::time::Duration = std::time::Duration::from_secs(15);

/// For a job in a Kueue queue, whether Kueue has let its workload run: `True` once the Job is
/// no longer suspended; `False` while it waits (`Queued`) or after Kueue suspended it again
/// (`Suspended`: preemption or eviction; it resumes with the same configuration). `Suspended`
/// stays until Kueue admits the workload again, however many reconciles come in between.
/// `None` outside a queue.
fn admission(
    tj: &TrainingJob,
    job: &Job,
    existing: &[Condition],
    generation: Option<i64>,
    kueue_says: Option<&str>,
) -> Option<Condition> {
    let queue = tj.labels().get(names::KUEUE_QUEUE_LABEL)?;
    let because = kueue_says.map_or_else(String::new, |m| format!("; Kueue: {m}"));
    let suspended = job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false);
    let finished = matches!(phase_of(job), JobPhase::Succeeded | JobPhase::Failed);
    // Admitted once before (now, or suspended since): a preempted job stays `Suspended`.
    let was_admitted = existing.iter().any(|c| {
        ConditionType::Admitted.is(c)
            && (c.status == "True" || c.reason == Reason::Suspended.as_str())
    });
    let (ok, reason, message) = match (suspended && !finished, was_admitted) {
        (false, _) => (
            true,
            Reason::Admitted,
            format!("Kueue admitted the workload Job from queue {queue}"),
        ),
        (true, false) => (
            false,
            Reason::Queued,
            format!(
                "the workload Job waits in Kueue queue {queue} for admission (quota, or a flavor of the node class it was configured for){because}"
            ),
        ),
        (true, true) => (
            false,
            Reason::Suspended,
            format!(
                "Kueue suspended the workload Job again (preemption or eviction); it waits in queue {queue} and resumes with the same offload configuration{because}"
            ),
        ),
    };
    Some(conditions::condition(
        existing,
        ConditionType::Admitted,
        ok,
        reason,
        message,
        generation,
    ))
}

#[cfg(test)]
mod tests;
