//! Following a workload that exists: phase and the workload reference, never the decision.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::apply::publish;
use crate::controller::conditions::{self, WORKLOAD_CREATED};
use crate::controller::overlap_observed;
use crate::controller::{Context, Error, kube_err, status};
use crate::ops::metrics::JobLabels;
use crate::render;
use offload_api::names;
use offload_api::v1alpha1::{
    DEFAULT_MIN_OBSERVED_GPU_BUSY, JobPhase, ObservedOverlap, OffloadDecisionStatus, TrainingJob,
    TrainingJobStatus, WorkloadRef,
};

/// What a run of the job teaches later decisions of its shape: a new window of its peaks, the
/// end of a workload that succeeded (its configuration fits), and what the training processes
/// reported of PyTorch's own figures at exit (what the run needed, which replaces the device's
/// upper bound, and how long its steps took).
async fn learn_from_run(
    tj: &TrainingJob,
    ctx: &Context,
    job: &Job,
    current: &TrainingJobStatus,
    observed: Option<&ObservedOverlap>,
    phase: JobPhase,
) {
    let (Some(o), Some(d)) = (
        observed.or(current.observed.as_ref()),
        current.offload.as_ref(),
    ) else {
        return;
    };
    let trained = phase == JobPhase::Succeeded;
    let newly_trained = trained && current.phase != Some(JobPhase::Succeeded);
    if (newly_trained || current.observed.as_ref().map(|p| &p.memory) != Some(&o.memory))
        && let Some(obs) = super::learn::observed(ctx, d, o, None, None, trained)
    {
        super::learn::learn(tj, ctx, &obs).await;
    }
    if let Some(report) = super::recovery::reported_allocation(ctx, tj, job)
        && let Some(mut obs) =
            super::learn::observed(ctx, d, o, None, Some(report.allocated), trained)
    {
        obs.step_seconds = report.step_seconds;
        super::learn::learn(tj, ctx, &obs).await;
    }
}

/// Keeps phase and the workload reference in step with the Job; never touches the decision.
pub(super) async fn follow_workload(
    tj: &TrainingJob,
    ctx: &Context,
    job: &Job,
) -> Result<Action, Error> {
    let name = tj.name_any();
    let owned = job
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == tj.metadata.uid.as_ref());
    let api: Api<TrainingJob> =
        Api::namespaced(ctx.client.clone(), &tj.namespace().unwrap_or_default());
    let current = tj.status.clone().unwrap_or_default();
    let generation = tj.metadata.generation;
    if !owned {
        name_conflict(tj, ctx, &api, &current).await?;
        return Ok(Action::await_change());
    }
    // A Job on its way out (recreated after running out of memory): its deletion is the next
    // change.
    if super::recovery::deleting(job) {
        return Ok(Action::await_change());
    }
    let current = restore_decision(tj, &api, job, current).await?;
    // Only a job the operator configured is decided again; one that did not opt in fails as
    // it was written.
    if crate::decision::opted_in(tj)
        && let Some(failed) =
            super::recovery::unrecorded_failure(ctx, tj, job, &current.memory_failures)
    {
        return super::recovery::recover(tj, ctx, &current, failed).await;
    }
    let phase = phase_of(job);
    let workload = workload_ref(&name, &current, job);
    let created = status::created(&current.conditions, &name, generation);
    let guard = guard_condition(tj, ctx, job, &current.conditions).await?;
    let guard_unchanged = guard
        .as_ref()
        .is_none_or(|g| conditions::unchanged(&current.conditions, g));
    let pods = super::pods::pods_condition(tj, ctx, job, &current.conditions).await?;
    let (observed, overlap, headroom) = observe(tj, ctx, &current, generation);
    learn_from_run(tj, ctx, job, &current, observed.as_ref(), phase).await;
    let queued = tj.labels().contains_key(names::KUEUE_QUEUE_LABEL) && phase == JobPhase::Queued;
    let kueue_says = if queued {
        super::kueue::waiting_reason(&ctx.client, job).await
    } else {
        None
    };
    let admitted = admission(
        tj,
        job,
        &current.conditions,
        generation,
        kueue_says.as_deref(),
    );
    // Kueue's Workloads are watched where Kueue was installed when the operator started
    // (`kueue::workload_changes`); while the Job waits, look again now and then anyway (Kueue
    // installed later, or Workloads this operator may not watch).
    let next = if queued {
        Action::requeue(QUEUED_RECHECK)
    } else {
        Action::await_change()
    };
    let unchanged =
        |c: Option<&Condition>| c.is_none_or(|c| conditions::unchanged(&current.conditions, c));
    if current.phase == Some(phase)
        && current.workload.as_ref() == Some(&workload)
        && conditions::unchanged(&current.conditions, &created)
        && guard_unchanged
        && current.observed == observed
        && unchanged(overlap.as_ref())
        && unchanged(headroom.as_ref())
        && unchanged(admitted.as_ref())
        && unchanged(pods.as_ref())
    {
        return Ok(next);
    }
    let part = status::WorkloadPart {
        phase,
        workload: Some(&workload),
        created: &created,
        guard: guard.as_ref(),
        pods: pods.as_ref(),
        observed: observed.as_ref(),
        overlap: overlap.as_ref(),
        headroom: headroom.as_ref(),
        admitted: admitted.as_ref(),
    };
    status::write_workload(&api, &name, &part).await?;
    announce(
        ctx,
        tj,
        &current.conditions,
        admitted.as_ref(),
        [overlap.as_ref(), headroom.as_ref(), pods.as_ref()],
        guard.as_ref().filter(|_| !guard_unchanged),
    )
    .await;
    Ok(next)
}

/// A Job of the job's name that it does not own: said once, as a condition and an Event.
async fn name_conflict(
    tj: &TrainingJob,
    ctx: &Context,
    api: &Api<TrainingJob>,
    current: &TrainingJobStatus,
) -> Result<(), Error> {
    let name = tj.name_any();
    let generation = tj.metadata.generation;
    let cond = conditions::condition(
        &current.conditions,
        WORKLOAD_CREATED,
        false,
        "NameConflict",
        format!(
            "a Job named {name} exists and is not owned by this TrainingJob: delete it or rename the TrainingJob"
        ),
        generation,
    );
    if !conditions::unchanged(&current.conditions, &cond) {
        let part = status::WorkloadPart {
            phase: JobPhase::Pending,
            workload: None,
            created: &cond,
            guard: None,
            pods: None,
            observed: None,
            overlap: None,
            headroom: None,
            admitted: None,
        };
        status::write_workload(api, &name, &part).await?;
        publish(
            ctx,
            tj,
            EventType::Warning,
            names::EVENT_NAME_CONFLICT,
            "a Job of the same name exists and is not owned by this TrainingJob",
        )
        .await;
    }
    Ok(())
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

/// The Events of a status change: Kueue suspending an admitted job again, the overlap flag
/// going up, a start-up guard that failed (`guard` only when its condition changed).
async fn announce(
    ctx: &Context,
    tj: &TrainingJob,
    previous: &[Condition],
    admitted: Option<&Condition>,
    flags: [Option<&Condition>; 3],
    guard: Option<&Condition>,
) {
    // Kueue suspending an admitted job again (preemption, eviction) is worth an Event.
    let was_admitted = previous
        .iter()
        .any(|c| c.type_ == conditions::ADMITTED && c.status == "True");
    if was_admitted && let Some(c) = admitted.filter(|c| c.status == "False") {
        publish(
            ctx,
            tj,
            EventType::Normal,
            names::EVENT_SUSPENDED,
            &c.message,
        )
        .await;
    }
    // An Event when a flag goes up (GPUs idle with overlap on, a GPU near its memory, pods
    // refused or unschedulable), not every time the figure in its message moves.
    for c in flags.into_iter().flatten() {
        let was_flagged = previous
            .iter()
            .any(|p| p.type_ == c.type_ && p.status == "False");
        if !was_flagged && c.status == "False" {
            publish(ctx, tj, EventType::Warning, &c.reason, &c.message).await;
        }
    }
    if let Some(g) = guard.filter(|g| g.status == "False") {
        publish(
            ctx,
            tj,
            EventType::Warning,
            names::EVENT_STARTUP_GUARD_FAILED,
            &g.message,
        )
        .await;
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
        c.type_ == conditions::ADMITTED && (c.status == "True" || c.reason == "Suspended")
    });
    let (ok, reason, message) = match (suspended && !finished, was_admitted) {
        (false, _) => (
            true,
            "Admitted",
            format!("Kueue admitted the workload Job from queue {queue}"),
        ),
        (true, false) => (
            false,
            "Queued",
            format!(
                "the workload Job waits in Kueue queue {queue} for admission (quota, or a flavor of the node class it was configured for){because}"
            ),
        ),
        (true, true) => (
            false,
            "Suspended",
            format!(
                "Kueue suspended the workload Job again (preemption or eviction); it waits in queue {queue} and resumes with the same offload configuration{because}"
            ),
        ),
    };
    Some(conditions::condition(
        existing,
        conditions::ADMITTED,
        ok,
        reason,
        message,
        generation,
    ))
}

/// The job's observed figures (fresh ones from the agents' summaries, else the last recorded),
/// with the memory its configuration used so far; the `OverlapObserved` condition where there
/// is something to judge, and `GPUMemoryHeadroom` once a GPU peak is known (else the ones
/// recorded, which this writer owns and must repeat). Sets the job's metrics.
fn observe(
    tj: &TrainingJob,
    ctx: &Context,
    current: &TrainingJobStatus,
    generation: Option<i64>,
) -> (
    Option<ObservedOverlap>,
    Option<Condition>,
    Option<Condition>,
) {
    let ns = tj.namespace().unwrap_or_default();
    let name = tj.name_any();
    let bound = |pod: &str, node: &str| ctx.pod_of_job_on(&ns, pod, node, &name);
    let recorded_of = |kind: &str| current.conditions.iter().find(|c| c.type_ == kind).cloned();
    let fresh = overlap_observed::gather(&ctx.nodes(), &ns, &name, jiff::Timestamp::now(), &bound);
    let decision = current.offload.as_ref();
    let observed = match (fresh, decision) {
        (Some(mut o), Some(d)) => {
            let previous = current.observed.as_ref();
            let new_window = previous.is_none_or(|p| p.observed_at != o.observed_at);
            let recorded = previous.and_then(|p| p.memory.as_ref());
            o.memory = match o.memory.as_ref() {
                Some(m) => Some(overlap_observed::merge_memory(
                    recorded,
                    m,
                    new_window,
                    &crate::decision::evidence::configuration(d),
                    d,
                )),
                None => recorded.cloned(),
            };
            Some(o)
        }
        (fresh, _) => fresh.or_else(|| current.observed.clone()),
    };
    let headroom = observed
        .as_ref()
        .and_then(|o| o.memory.as_ref())
        .and_then(overlap_observed::judge_memory)
        .map(|(ok, reason, message)| {
            conditions::condition(
                &current.conditions,
                overlap_observed::GPU_MEMORY_HEADROOM,
                ok,
                reason,
                message,
                generation,
            )
        })
        .or_else(|| recorded_of(overlap_observed::GPU_MEMORY_HEADROOM));
    let recorded = recorded_of(overlap_observed::OVERLAP_OBSERVED);
    let (Some(o), Some(decision)) = (observed.as_ref(), decision) else {
        return (observed, recorded, headroom);
    };
    let labels = JobLabels {
        namespace: ns,
        trainingjob: name,
    };
    let threshold = ctx
        .profile(&decision.profile)
        .map_or(DEFAULT_MIN_OBSERVED_GPU_BUSY, |p| {
            p.spec.min_observed_gpu_busy
        });
    let verdict = overlap_observed::judge(decision, o, threshold);
    ctx.metrics
        .set_job(&labels, o.gpu_busy, verdict.as_ref().map(|(ok, ..)| !ok));
    let Some((ok, reason, message)) = verdict else {
        return (observed, recorded, headroom);
    };
    let cond = conditions::condition(
        &current.conditions,
        overlap_observed::OVERLAP_OBSERVED,
        ok,
        reason,
        message,
        generation,
    );
    (observed, Some(cond), headroom)
}

/// Where the status lost its decision (the operator or the API server died between creating
/// the workload and recording it), writes it back from the record the Job carries, with the
/// `OffloadResolved` condition. Returns the status as it now is. A Job without a readable
/// record leaves the status as it is.
async fn restore_decision(
    tj: &TrainingJob,
    api: &Api<TrainingJob>,
    job: &Job,
    mut current: TrainingJobStatus,
) -> Result<TrainingJobStatus, Error> {
    if current.offload.is_some() {
        return Ok(current);
    }
    let Some(text) = job.annotations().get(names::ANNOTATION_DECISION) else {
        return Ok(current);
    };
    let record: OffloadDecisionStatus = match serde_json::from_str(text) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(job = %tj.name_any(), error = %e, "the workload's decision record does not parse; not restored");
            return Ok(current);
        }
    };
    let generation = tj.metadata.generation;
    let decision = status::restored(&current.conditions, record, generation);
    status::write_decision(api, &tj.name_any(), &decision).await?;
    tracing::info!(job = %tj.name_any(), "decision restored from the workload Job's record");
    current.offload = decision.offload;
    current.observed_generation = generation;
    for c in decision.conditions {
        conditions::set(&mut current.conditions, c);
    }
    Ok(current)
}

/// What the start-up guard said in the workload's pods: `False` with the first failure's
/// message, `True` once a guard passed and none failed, else the condition already recorded (the
/// workload writer owns it and must repeat it). `None` when the workload has no guard or it has
/// not run yet.
async fn guard_condition(
    tj: &TrainingJob,
    ctx: &Context,
    job: &Job,
    existing: &[Condition],
) -> Result<Option<Condition>, Error> {
    let recorded = existing
        .iter()
        .find(|c| c.type_ == conditions::NODE_VERIFIED)
        .cloned();
    let guarded = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.name == render::GUARD_CONTAINER));
    if !guarded {
        return Ok(recorded);
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &tj.namespace().unwrap_or_default());
    let selector = format!("{}={}", names::LABEL_TRAINING_JOB, tj.name_any());
    let list = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(kube_err("listing the workload's pods"))?;
    let mut passed = None;
    for pod in &list.items {
        match guard_outcome(pod) {
            Some(GuardOutcome::Failed(message)) => {
                return Ok(Some(conditions::condition(
                    existing,
                    conditions::NODE_VERIFIED,
                    false,
                    "StartupGuardFailed",
                    message,
                    tj.metadata.generation,
                )));
            }
            Some(GuardOutcome::Passed(node)) => passed = passed.or(Some(node)),
            None => {}
        }
    }
    Ok(match passed {
        Some(_) if recorded.as_ref().is_some_and(|r| r.status == "True") => recorded,
        Some(node) => Some(conditions::condition(
            existing,
            conditions::NODE_VERIFIED,
            true,
            "StartupGuardPassed",
            format!("the start-up guard found node {node} to be what the configuration assumes"),
            tj.metadata.generation,
        )),
        None => recorded,
    })
}

/// How one pod's start-up guard ended.
#[derive(Debug, PartialEq)]
pub enum GuardOutcome {
    /// It passed, on this node.
    Passed(String),
    /// It failed: which pod on which node, and the guard's own message.
    Failed(String),
}

/// The guard's outcome in a pod, from its init container status (the current state, or the last
/// one when the kubelet is already retrying it).
pub fn guard_outcome(pod: &Pod) -> Option<GuardOutcome> {
    let status = pod.status.as_ref()?;
    let guard = status
        .init_container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == render::GUARD_CONTAINER)?;
    let terminated = guard
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .or_else(|| {
            guard
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
        })?;
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_else(|| "unknown".into());
    if terminated.exit_code == 0 {
        return Some(GuardOutcome::Passed(node));
    }
    // The guard's message, bounded (a status condition is not a log).
    let text: String = terminated
        .message
        .as_deref()
        .unwrap_or("the guard exited without a message")
        .trim()
        .chars()
        .take(1024)
        .collect();
    Some(GuardOutcome::Failed(format!(
        "pod {} on node {node}: {text}",
        pod.name_any()
    )))
}

/// Keeps of a workload pod what the controller reads: its metadata, the node it runs on, and
/// its phase and its containers' states (the start-up guard's outcome, a training container
/// that ran out of memory).
pub fn slim_pod(pod: &mut Pod) {
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
        node_name: node,
        ..Default::default()
    });
    if let Some(status) = pod.status.take() {
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: status.phase,
            // Only whether the scheduler placed it (or why not).
            conditions: status.conditions.map(|cs| {
                cs.into_iter()
                    .filter(|c| c.type_ == "PodScheduled")
                    .collect()
            }),
            init_container_statuses: status.init_container_statuses,
            container_statuses: status.container_statuses,
            ..Default::default()
        });
    }
}

/// Phase from the Job: `Queued` while it is suspended (Kueue has not admitted it, or suspended
/// it again), `Running` once a pod is ready (the Job's `active` also counts pods that are still
/// pending).
pub(super) fn phase_of(job: &Job) -> JobPhase {
    let suspended = job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false);
    let Some(status) = job.status.as_ref() else {
        return if suspended {
            JobPhase::Queued
        } else {
            JobPhase::Pending
        };
    };
    let has = |t: &str| {
        status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == t && c.status == "True")
    };
    if has("Complete") {
        JobPhase::Succeeded
    } else if has("Failed") {
        JobPhase::Failed
    } else if suspended {
        JobPhase::Queued
    } else if status.ready.unwrap_or(0) > 0 {
        JobPhase::Running
    } else {
        JobPhase::Pending
    }
}

/// Drops from a workload Job what following it never reads, for the controller's cache of
/// them: the pod template keeps only its init containers' names (is the start-up guard
/// there?) and the rendered-config volume; containers, the template's metadata and the other
/// volumes go. The Job's own metadata and status stay whole.
pub fn slim_workload(job: &mut Job) {
    let Some(spec) = job.spec.as_mut() else {
        return;
    };
    spec.template.metadata = None;
    if let Some(pod) = spec.template.spec.as_mut() {
        let init: Option<Vec<k8s_openapi::api::core::v1::Container>> =
            pod.init_containers.as_ref().map(|cs| {
                cs.iter()
                    .map(|c| k8s_openapi::api::core::v1::Container {
                        name: c.name.clone(),
                        ..Default::default()
                    })
                    .collect()
            });
        let volumes = pod.volumes.take().map(|vs| {
            vs.into_iter()
                .filter(|v| v.name == render::CONFIG_VOLUME)
                .collect::<Vec<_>>()
        });
        *pod = k8s_openapi::api::core::v1::PodSpec {
            init_containers: init,
            volumes,
            ..Default::default()
        };
    }
}

#[cfg(test)]
mod tests;
