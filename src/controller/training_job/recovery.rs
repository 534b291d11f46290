//! Recovery from out-of-memory: a training pod that fails from GPU memory (PyTorch's `CUDA out
//! of memory` in its termination message: the operator sets `FallbackToLogsOnError` on the
//! training container, so the kubelet puts the last log lines there) or from host memory
//! (`OOMKilled`) is evidence. It is recorded in the status, the job is decided again with its
//! estimates raised past what failed, and the workload is recreated with the configuration that
//! decision writes — at most the profile's `maxMemoryRetries` times, then the job is held with
//! the figures. A pod that fails for any other reason is never re-decided.

use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::planned::{Announce, Following, Recovery};
use super::snapshot::Snapshot;
use crate::controller::conditions::{self, ConditionType, Reason};
use crate::controller::status::WorkloadStatus;
use crate::decision::ClusterView;
use crate::decision::model::memory::gib;
use offload_api::names;
use offload_api::v1alpha1::{JobPhase, MemoryFailure, MemoryKind, TrainingJob, TrainingJobStatus};

pub use crate::decision::runs::evidence::configuration;
pub use crate::decision::runs::evidence::memory_failure;

/// A pod of the workload (`pods`: the workload Job's) that ran out of memory and is not
/// recorded yet.
pub(super) fn unrecorded_failure(
    tj: &TrainingJob,
    pods: &[Arc<Pod>],
    recorded: &[MemoryFailure],
) -> Option<(String, MemoryKind, String)> {
    let container = training_container(tj);
    pods.iter().find_map(|pod| {
        let pod_name = pod.name_any();
        if recorded.iter().any(|f| f.pod == pod_name) {
            return None;
        }
        memory_failure(pod, container.as_deref()).map(|(kind, message)| (pod_name, kind, message))
    })
}

/// What the training containers of the workload's pods reported at exit (the profile's
/// `reportAllocatorPeaks`), read together: the highest of PyTorch's own figures
/// (`max_memory_allocated`, bytes) and the slowest median step, if any.
pub(super) fn reported_allocation(
    tj: &TrainingJob,
    pods: &[Arc<Pod>],
) -> Option<crate::decision::runs::evidence::AllocatorReport> {
    let container = training_container(tj);
    pods.iter()
        .flat_map(|pod| {
            pod.status
                .iter()
                .flat_map(|s| s.container_statuses.iter().flatten())
                .filter(|c| container.as_deref().is_none_or(|n| c.name == n))
                .filter_map(|c| {
                    let t = c
                        .state
                        .as_ref()
                        .and_then(|s| s.terminated.as_ref())
                        .or_else(|| c.last_state.as_ref().and_then(|s| s.terminated.as_ref()))?;
                    crate::decision::runs::evidence::allocator_report(t.message.as_deref()?)
                })
                .collect::<Vec<_>>()
        })
        .reduce(crate::decision::runs::evidence::AllocatorReport::together)
}

/// The name of the job's training container (the first that asks for GPUs, else the first):
/// the one process whose memory failures are the job's.
pub fn training_container(tj: &TrainingJob) -> Option<String> {
    let spec = tj.spec.template.spec.as_ref()?;
    let at = crate::decision::PodResources::of(Some(spec))
        .ok()
        .and_then(|r| r.training_container)
        .unwrap_or(0);
    spec.containers.get(at).map(|c| c.name.clone())
}

/// How the sentences name the memory that ran out.
fn memory_name(kind: MemoryKind) -> &'static str {
    match kind {
        MemoryKind::Gpu => "GPU",
        MemoryKind::Host => "host",
    }
}

/// The sentence that says which pod ran out of which memory, with what configuration, its
/// estimate against its budget, and whether it was a trial.
fn what_ran_out(
    pod: &str,
    kind: MemoryKind,
    decision: Option<&offload_api::v1alpha1::OffloadDecisionStatus>,
    estimate_bytes: Option<i64>,
    budget_bytes: Option<i64>,
) -> String {
    let memory = memory_name(kind);
    #[allow(clippy::cast_precision_loss)]
    let figures = match (estimate_bytes, budget_bytes) {
        (Some(e), Some(b)) => format!(
            " (estimated {} of the {} it had)",
            gib(e as f64),
            gib(b as f64)
        ),
        _ => String::new(),
    };
    let trial = decision
        .and_then(|d| d.trial.as_ref())
        .map(|t| {
            format!(
                " — a trial of a configuration faster than the fastest that trained; the job goes back to {}, and no later trial of its shape goes as far",
                t.fallback
            )
        })
        .unwrap_or_default();
    format!(
        "pod {pod} ran out of {memory} memory with {}{figures}{trial}",
        decision.map(configuration).unwrap_or_default()
    )
}

/// Plans the recovery from `failed`: the failure recorded with `MemoryRecovery`, the lesson
/// that it needed more than it had, an `OutOfMemory` Event, and — within the profile's bound —
/// the workload replaced, so the next reconcile decides again with the evidence and creates it
/// anew.
pub(super) fn plan_recovery(
    snap: &Snapshot,
    view: &dyn ClusterView,
    current: &TrainingJobStatus,
    failed: (String, MemoryKind, String),
    plan: &mut Following,
) {
    let tj = &snap.job;
    let (pod, kind, message) = failed;
    let generation = tj.metadata.generation;
    let decision = current.offload.as_ref();
    let max = decision
        .and_then(|d| view.profile(&d.profile))
        .map_or(offload_api::v1alpha1::DEFAULT_MAX_MEMORY_RETRIES, |p| {
            p.max_memory_retries
        });
    let failure = crate::decision::runs::evidence::failure_record(
        tj,
        decision,
        kind,
        &pod,
        &message,
        snap.now.to_string(),
    );
    let (estimate_bytes, budget_bytes) = (failure.estimate_bytes, failure.budget_bytes);
    plan.lessons.extend(lesson_of_failure(
        snap,
        view,
        current,
        kind,
        failure.needed_bytes,
    ));
    let mut failures = current.memory_failures.clone();
    failures.push(failure);
    let n = failures.len();
    let said = what_ran_out(&pod, kind, decision, estimate_bytes, budget_bytes);
    let exhausted = n > max as usize;
    let condition = recovery_condition(current, &said, kind, n, max, generation);
    plan.events.push(Announce::new(
        EventType::Warning,
        names::EVENT_OUT_OF_MEMORY,
        condition.message.clone(),
    ));
    // The workload goes: its reference first (a spec.offload change is refused while the job
    // has a workload), then its Job, pods first.
    let replace = (!exhausted).then(|| {
        let recreating = conditions::condition(
            &current.conditions,
            ConditionType::WorkloadCreated,
            false,
            Reason::Recreating,
            format!("the workload is recreated after {said}"),
            generation,
        );
        WorkloadStatus::only(JobPhase::Pending, recreating)
    });
    plan.recovery = Some(Recovery {
        failures,
        condition,
        exhausted,
        replace,
    });
}

/// `MemoryRecovery` after the `n`th configuration ran out (`said`): replaced and decided
/// again, or — past the profile's `max` — held.
fn recovery_condition(
    current: &TrainingJobStatus,
    said: &str,
    kind: MemoryKind,
    n: usize,
    max: u32,
    generation: Option<i64>,
) -> Condition {
    let memory = memory_name(kind);
    if n > max as usize {
        conditions::condition(
            &current.conditions,
            ConditionType::MemoryRecovery,
            false,
            Reason::RetriesExhausted,
            format!(
                "{said}; {n} configurations ran out of memory, more than the profile's maxMemoryRetries ({max}): the job is not re-decided again (each failure is in status.memoryFailures)"
            ),
            generation,
        )
    } else {
        conditions::condition(
            &current.conditions,
            ConditionType::MemoryRecovery,
            true,
            Reason::Redeciding,
            format!(
                "{said}; its workload is replaced, decided again with its {memory} estimates raised past that (re-decision {n} of at most {max}): OffloadResolved says what that decision is, WorkloadCreated whether it runs"
            ),
            generation,
        )
    }
}

/// What ran out is a lesson for the shape too: it needed more than it had (`needed`, where its
/// own words say). From the agent's window where one shows this configuration, else from the
/// pod's own account, so that no later job of the shape goes as far.
fn lesson_of_failure(
    snap: &Snapshot,
    view: &dyn ClusterView,
    current: &TrainingJobStatus,
    kind: MemoryKind,
    needed: Option<i64>,
) -> Option<super::planned::Learned> {
    let d = current.offload.as_ref()?;
    let needed = needed.and_then(|b| u64::try_from(b).ok());
    let nodes = view.nodes();
    let obs = current
        .observed
        .as_ref()
        .and_then(|o| super::learn::observed(&nodes, d, o, Some(kind), needed, false))
        .or_else(|| super::learn::observed_failure(&nodes, d, kind, needed))?;
    super::learn::lesson(snap, view, &obs)
}

/// Whether the Job is on its way out (deleted, its pods still going).
pub(super) fn deleting(job: &Job) -> bool {
    job.meta().deletion_timestamp.is_some()
}
