//! A TrainingJob's status is written in two parts, each by server-side apply under its own
//! field manager, so that writing one part can never drop a field of the other — not even when
//! the writer works from a stale copy of the object:
//!
//! - the **decision** ([`names::OPERATOR_MANAGER`]): `offload`, `observedGeneration`, the
//!   `OffloadResolved` condition; written when the job is resolved (together with the first
//!   view of its workload) or held;
//! - the **workload** ([`names::WORKLOAD_STATUS_MANAGER`]): `phase`, `workload`, `observed`,
//!   the `WorkloadCreated`, `Admitted`, `NodeVerified` and `OverlapObserved` conditions;
//!   written as the Job runs;
//! - the **memory evidence** ([`names::MEMORY_STATUS_MANAGER`]): `memoryFailures` and the
//!   `MemoryRecovery` condition; written when a configuration runs out of memory, kept across
//!   the job's later decisions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::{Error, kube_err};
use offload_api::names;
use offload_api::v1alpha1::{
    JobPhase, ObservedOverlap, TrainingJob, TrainingJobStatus, WorkloadRef,
};

async fn apply(
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

/// Writes the decision part. `status` may also carry the workload part (phase, workload,
/// `WorkloadCreated`) when the decision and the first view of the workload are written in one
/// request; the workload writer takes those fields over later.
pub async fn apply_decision(
    api: &Api<TrainingJob>,
    name: &str,
    status: &TrainingJobStatus,
) -> Result<(), Error> {
    let value =
        serde_json::to_value(status).map_err(|e| Error::Serialize("TrainingJob status", e))?;
    apply(api, name, names::OPERATOR_MANAGER, value).await
}

/// Writes the memory evidence: every failure so far, and the `MemoryRecovery` condition.
pub async fn apply_memory(
    api: &Api<TrainingJob>,
    name: &str,
    failures: &[offload_api::v1alpha1::MemoryFailure],
    condition: &Condition,
) -> Result<(), Error> {
    let value = json!({"memoryFailures": failures, "conditions": [condition]});
    apply(api, name, names::MEMORY_STATUS_MANAGER, value).await
}

/// The workload part of a TrainingJob's status. The workload writer owns every field here, so
/// each write passes all that are set (a field left out would be dropped).
pub struct WorkloadPart<'a> {
    /// Phase, from the Job.
    pub phase: JobPhase,
    /// The workload's objects.
    pub workload: Option<&'a WorkloadRef>,
    /// `WorkloadCreated`.
    pub created: &'a Condition,
    /// `NodeVerified`, once the start-up guard has run.
    pub guard: Option<&'a Condition>,
    /// What the agents observed the job's GPUs doing.
    pub observed: Option<&'a ObservedOverlap>,
    /// `OverlapObserved`, for a job with overlap on that has been observed.
    pub overlap: Option<&'a Condition>,
    /// `GPUMemoryHeadroom`, once a GPU memory peak has been observed.
    pub headroom: Option<&'a Condition>,
    /// `Admitted`, for a job in a Kueue queue.
    pub admitted: Option<&'a Condition>,
}

/// Writes the workload part only; every other status field is left as it is.
pub async fn apply_workload(
    api: &Api<TrainingJob>,
    name: &str,
    part: &WorkloadPart<'_>,
) -> Result<(), Error> {
    let conditions: Vec<&Condition> = std::iter::once(part.created)
        .chain(part.guard)
        .chain(part.overlap)
        .chain(part.headroom)
        .chain(part.admitted)
        .collect();
    let mut value = json!({"phase": part.phase, "conditions": conditions});
    if let Some(w) = part.workload {
        value["workload"] = serde_json::to_value(w)
            .map_err(|e| Error::Serialize("TrainingJob workload reference", e))?;
    }
    if let Some(o) = part.observed {
        value["observed"] =
            serde_json::to_value(o).map_err(|e| Error::Serialize("TrainingJob observation", e))?;
    }
    apply(api, name, names::WORKLOAD_STATUS_MANAGER, value).await
}
