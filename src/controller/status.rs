//! A TrainingJob's status is written in three parts, each by server-side apply under its own
//! field manager, so that writing one part can never drop a field of the other — not even when
//! the writer works from a stale copy of the object:
//!
//! - the **decision** ([`names::OPERATOR_MANAGER`]): `offload`, `observedGeneration`, the
//!   `OffloadResolved` condition; written when the job is resolved or held (the phase and the
//!   first view of its workload go, in the same call, to the workload writer);
//! - the **workload** ([`names::WORKLOAD_STATUS_MANAGER`]): `phase`, `workload`, `observed`,
//!   the `WorkloadCreated`, `Admitted`, `NodeVerified` and `OverlapObserved` conditions;
//!   written as the Job runs;
//! - the **memory evidence** ([`names::MEMORY_STATUS_MANAGER`]): `memoryFailures` and the
//!   `MemoryRecovery` condition; written when a configuration runs out of memory, kept across
//!   the job's later decisions.
//!
//! Every shape of the decision part is built here, by pure functions ([`resolved`],
//! [`restored`], [`not_requested`], [`held`], with the workload's first view by
//! [`with_workload`] or [`apply_failed`]), and every part is written here ([`write_decision`],
//! [`write_workload`], [`write_memory`]): nothing else in the controller builds or writes a
//! TrainingJob's status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::conditions::{self, ConditionType, Reason};
use super::{Error, kube_err};
use offload_api::names;
use offload_api::v1alpha1::{
    JobPhase, ObservedOverlap, OffloadDecisionStatus, TrainingJob, TrainingJobStatus, WorkloadRef,
};

/// A pending job's decision part over `conditions`, at `generation`.
fn pending(
    offload: Option<OffloadDecisionStatus>,
    conditions: Vec<Condition>,
    generation: Option<i64>,
) -> TrainingJobStatus {
    TrainingJobStatus {
        phase: Some(JobPhase::Pending),
        offload,
        workload: None,
        observed_generation: generation,
        observed: None,
        memory_failures: Vec::new(),
        conditions,
    }
}

/// A job just resolved at `generation`: its decision and `OffloadResolved=True` with the
/// decision's `summary`, over the conditions it had; and whether this is its first resolution
/// (the condition was not already there as it is now).
pub fn resolved(
    existing: Vec<Condition>,
    offload: OffloadDecisionStatus,
    summary: String,
    generation: Option<i64>,
) -> (TrainingJobStatus, bool) {
    let cond = conditions::condition(
        &existing,
        ConditionType::OffloadResolved,
        true,
        Reason::Resolved,
        summary,
        generation,
    );
    let first = !conditions::unchanged(&existing, &cond);
    let mut status = pending(Some(offload), existing, generation);
    conditions::set(&mut status.conditions, cond);
    (status, first)
}

/// The decision part restored from the workload Job's record (`OffloadResolved=True` with the
/// recorded reasons), where the status had lost it; only the fields of that part.
pub fn restored(
    existing: &[Condition],
    offload: OffloadDecisionStatus,
    generation: Option<i64>,
) -> TrainingJobStatus {
    // Statuses recorded before codes existed carry none: their reasons read as they were.
    let summary = match offload.reasons.iter().find(|r| r.code.is_some()) {
        Some(_) => crate::decision::headline(
            offload
                .reasons
                .iter()
                .filter_map(|r| Some((r.field.as_str(), r.code?, r.message.clone()))),
        ),
        None => offload
            .reasons
            .iter()
            .map(|r| format!("{}: {}", r.field, r.message))
            .collect::<Vec<_>>()
            .join("; "),
    };
    let cond = conditions::condition(
        existing,
        ConditionType::OffloadResolved,
        true,
        Reason::Resolved,
        summary,
        generation,
    );
    TrainingJobStatus {
        offload: Some(offload),
        observed_generation: generation,
        conditions: vec![cond],
        ..TrainingJobStatus::default()
    }
}

/// A job that names no profile and sets no offload field: it runs without offload
/// configuration, and `OffloadResolved=False` (`NotRequested`) says why.
pub fn not_requested(existing: Vec<Condition>, generation: Option<i64>) -> TrainingJobStatus {
    let cond = conditions::condition(
        &existing,
        ConditionType::OffloadResolved,
        false,
        Reason::NotRequested,
        format!(
            "the job names no OffloadProfile (annotation {}) and sets no spec.offload field, so it runs without offload configuration",
            names::PROFILE_ANNOTATION
        ),
        generation,
    );
    let mut status = pending(None, existing, generation);
    conditions::set(&mut status.conditions, cond);
    status
}

/// A job held at `generation` (`OffloadResolved=False`, `reason`, `message`): only the
/// decision part, without a decision; `None` when the status already says exactly that.
pub fn held(
    current: &TrainingJobStatus,
    reason: Reason,
    message: String,
    generation: Option<i64>,
) -> Option<TrainingJobStatus> {
    let cond = conditions::condition(
        &current.conditions,
        ConditionType::OffloadResolved,
        false,
        reason,
        message,
        generation,
    );
    let same = conditions::unchanged(&current.conditions, &cond)
        && current.phase == Some(JobPhase::Pending)
        && current.observed_generation == generation
        && current.offload.is_none();
    (!same).then(|| pending(None, vec![cond], generation))
}

/// `WorkloadCreated=True` for the workload `name`: built the same way at creation and as the
/// workload is followed.
pub fn created(existing: &[Condition], name: &str, generation: Option<i64>) -> Condition {
    conditions::condition(
        existing,
        ConditionType::WorkloadCreated,
        true,
        Reason::Created,
        format!("created Job {name} and Service {name}"),
        generation,
    )
}

/// `status` with its workload created: the workload's objects and `WorkloadCreated=True`.
pub fn with_workload(status: &mut TrainingJobStatus, workload: WorkloadRef) {
    let cond = created(
        &status.conditions,
        &workload.job,
        status.observed_generation,
    );
    status.workload = Some(workload);
    conditions::set(&mut status.conditions, cond);
}

/// `status` with its workload refused (`WorkloadCreated=False`, `ApplyFailed`, `message`); whether
/// that changes what `existing` says.
pub fn apply_failed(status: &mut TrainingJobStatus, existing: &[Condition], message: &str) -> bool {
    let cond = conditions::condition(
        &status.conditions,
        ConditionType::WorkloadCreated,
        false,
        Reason::ApplyFailed,
        message,
        status.observed_generation,
    );
    let changed = !conditions::unchanged(existing, &cond);
    conditions::set(&mut status.conditions, cond);
    changed
}

async fn write(
    api: &Api<TrainingJob>,
    name: &str,
    manager: &str,
    status: serde_json::Value,
) -> Result<(), Error> {
    let patch = json!({
        "apiVersion": TrainingJob::api_version(&()),
        "kind": TrainingJob::kind(&()),
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(kube_err("writing TrainingJob status"))?;
    Ok(())
}

/// Writes `status`, each part by its own field manager, so that every status field has exactly
/// one writer: the decision part (`offload`, `observedGeneration`, `OffloadResolved`) by the
/// operator's manager; `phase`, `workload` and `WorkloadCreated`, where `status` carries them
/// (a job resolved with its workload just created, or held), by the workload writer, in one
/// apply that states its whole part. A part `status` does not carry (a decision restored from
/// the workload's record) is left as it is.
///
/// A field owned by two managers cannot be cleared by either one's apply; the recovery from
/// out-of-memory clears `workload` before the re-decision, so it must have one owner.
pub async fn write_decision(
    api: &Api<TrainingJob>,
    name: &str,
    status: &TrainingJobStatus,
) -> Result<(), Error> {
    let (decision, workload) = split(status);
    write(api, name, names::OPERATOR_MANAGER, decision?).await?;
    if let Some(workload) = workload {
        write(api, name, names::WORKLOAD_STATUS_MANAGER, workload?).await?;
    }
    Ok(())
}

/// `status` as the decision part and, where it has a phase, the workload part.
fn split(
    status: &TrainingJobStatus,
) -> (
    Result<serde_json::Value, Error>,
    Option<Result<serde_json::Value, Error>>,
) {
    let (created, decided): (Vec<&Condition>, Vec<&Condition>) = status
        .conditions
        .iter()
        .partition(|c| ConditionType::WorkloadCreated.is(c));
    let mut decision = json!({"conditions": decided});
    if let Some(offload) = &status.offload {
        match serde_json::to_value(offload) {
            Ok(v) => decision["offload"] = v,
            Err(e) => return (Err(Error::Serialize("TrainingJob decision", e)), None),
        }
    }
    if let Some(g) = status.observed_generation {
        decision["observedGeneration"] = json!(g);
    }
    let workload = status.phase.map(|phase| {
        let mut part = json!({"phase": phase, "conditions": created});
        if let Some(w) = &status.workload {
            part["workload"] = serde_json::to_value(w)
                .map_err(|e| Error::Serialize("TrainingJob workload reference", e))?;
        }
        Ok(part)
    });
    (Ok(decision), workload)
}

/// Writes the memory evidence: every failure so far, and the `MemoryRecovery` condition.
pub async fn write_memory(
    api: &Api<TrainingJob>,
    name: &str,
    failures: &[offload_api::v1alpha1::MemoryFailure],
    condition: &Condition,
) -> Result<(), Error> {
    let value = json!({"memoryFailures": failures, "conditions": [condition]});
    write(api, name, names::MEMORY_STATUS_MANAGER, value).await
}

/// The workload part of a TrainingJob's status. The workload writer owns every field here, so
/// each write passes all that are set (a field left out would be dropped).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadStatus {
    /// Phase, from the Job.
    pub phase: JobPhase,
    /// The workload's objects.
    pub workload: Option<WorkloadRef>,
    /// `WorkloadCreated`.
    pub created: Condition,
    /// `NodeVerified`, once the start-up guard has run.
    pub guard: Option<Condition>,
    /// `PodsScheduled`, once the Job wants pods.
    pub pods: Option<Condition>,
    /// What the agents observed the job's GPUs doing.
    pub observed: Option<ObservedOverlap>,
    /// `OverlapObserved`, for a job with overlap on that has been observed.
    pub overlap: Option<Condition>,
    /// `GPUMemoryHeadroom`, once a GPU memory peak has been observed.
    pub headroom: Option<Condition>,
    /// `Admitted`, for a job in a Kueue queue.
    pub admitted: Option<Condition>,
}

impl WorkloadStatus {
    /// Only `phase` and `created`: a workload about to be created again, or not the job's.
    pub fn only(phase: JobPhase, created: Condition) -> Self {
        WorkloadStatus {
            phase,
            workload: None,
            created,
            guard: None,
            pods: None,
            observed: None,
            overlap: None,
            headroom: None,
            admitted: None,
        }
    }

    /// Its conditions, `WorkloadCreated` first.
    pub fn conditions(&self) -> impl Iterator<Item = &Condition> {
        std::iter::once(&self.created)
            .chain(self.guard.as_ref())
            .chain(self.pods.as_ref())
            .chain(self.overlap.as_ref())
            .chain(self.headroom.as_ref())
            .chain(self.admitted.as_ref())
    }
}

/// Writes the workload part only; every other status field is left as it is.
pub async fn write_workload(
    api: &Api<TrainingJob>,
    name: &str,
    part: &WorkloadStatus,
) -> Result<(), Error> {
    let conditions: Vec<&Condition> = part.conditions().collect();
    let mut value = json!({"phase": part.phase, "conditions": conditions});
    if let Some(w) = &part.workload {
        value["workload"] = serde_json::to_value(w)
            .map_err(|e| Error::Serialize("TrainingJob workload reference", e))?;
    }
    if let Some(o) = &part.observed {
        value["observed"] =
            serde_json::to_value(o).map_err(|e| Error::Serialize("TrainingJob observation", e))?;
    }
    write(api, name, names::WORKLOAD_STATUS_MANAGER, value).await
}
