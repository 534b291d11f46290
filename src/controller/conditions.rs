//! The status conditions of TrainingJobs and OffloadProfiles in one place: their types (and
//! which status writer owns each), their reasons as a closed set, and how one is built so that
//! repeated reconciles do not churn it. What each condition says is computed by the planner
//! ([`super::training_job`]) in one pass over a snapshot.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use offload_api::names;

/// A condition's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionType {
    /// The offload configuration is resolved (the decision part of the status).
    OffloadResolved,
    /// The workload exists.
    WorkloadCreated,
    /// The cluster created the workload's pods and placed them on nodes (False with the
    /// admission plugin's or the scheduler's words when it refused or could not).
    PodsScheduled,
    /// The start-up guard found the pods' nodes to be what the configuration assumes (False
    /// with the guard's message when one was not).
    NodeVerified,
    /// For a job in a Kueue queue, whether Kueue admitted its workload.
    Admitted,
    /// For a job with overlap on, whether its GPUs stayed busy.
    OverlapObserved,
    /// Whether the job's GPUs kept a margin below their memory.
    GpuMemoryHeadroom,
    /// Whether a configuration that ran out of memory was replaced (the memory evidence part).
    MemoryRecovery,
    /// Of profiles: at least one reported node matches.
    Ready,
}

impl ConditionType {
    /// The type's name in the API.
    pub const fn as_str(self) -> &'static str {
        match self {
            ConditionType::OffloadResolved => "OffloadResolved",
            ConditionType::WorkloadCreated => "WorkloadCreated",
            ConditionType::PodsScheduled => "PodsScheduled",
            ConditionType::NodeVerified => "NodeVerified",
            ConditionType::Admitted => "Admitted",
            ConditionType::OverlapObserved => "OverlapObserved",
            ConditionType::GpuMemoryHeadroom => "GPUMemoryHeadroom",
            ConditionType::MemoryRecovery => names::CONDITION_MEMORY_RECOVERY,
            ConditionType::Ready => "Ready",
        }
    }

    /// Whether `c` is a condition of this type.
    pub fn is(self, c: &Condition) -> bool {
        c.type_ == self.as_str()
    }

    /// The condition of this type in `list`, if any.
    pub fn find(self, list: &[Condition]) -> Option<&Condition> {
        list.iter().find(|c| self.is(c))
    }
}

/// A condition's reason: the closed set the controller writes. A held job's reason is its
/// decision's code (`Held`: the decision's own closed set, `Unresolved::reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// `OffloadResolved=True`: decided.
    Resolved,
    /// `OffloadResolved=False`: the job asks for no offload configuration.
    NotRequested,
    /// `OffloadResolved=False`: the job waits for its model's trace.
    Tracing,
    /// `OffloadResolved=False`: the job cannot be decided; the decision's code.
    Held(&'static str),
    /// `WorkloadCreated=True`.
    Created,
    /// `WorkloadCreated=False`: the workload is recreated after running out of memory.
    Recreating,
    /// `WorkloadCreated=False`: a Job of the job's name is not the job's.
    NameConflict,
    /// `WorkloadCreated=False`: the API server refused a workload object.
    ApplyFailed,
    /// `PodsScheduled=True`.
    PodsScheduled,
    /// `PodsScheduled=False`: a ResourceQuota refused the pods.
    PodsRefusedByQuota,
    /// `PodsScheduled=False`: the LimitRanger refused the pods.
    PodsRefusedByLimitRange,
    /// `PodsScheduled=False`: an admission webhook refused the pods.
    PodsRefusedByWebhook,
    /// `PodsScheduled=False`: the API server refused the pods for another reason.
    PodsRefused,
    /// `PodsScheduled=False`: the scheduler finds no node for a pod.
    PodsUnschedulable,
    /// `NodeVerified=True`.
    StartupGuardPassed,
    /// `NodeVerified=False`.
    StartupGuardFailed,
    /// `Admitted=True`.
    Admitted,
    /// `Admitted=False`: the workload waits in its queue.
    Queued,
    /// `Admitted=False`: Kueue suspended the admitted workload again.
    Suspended,
    /// `OverlapObserved=True`.
    GpusBusy,
    /// `OverlapObserved=False`.
    GpusIdle,
    /// `GPUMemoryHeadroom=True`.
    Headroom,
    /// `GPUMemoryHeadroom=False`.
    NearGpuMemoryLimit,
    /// `MemoryRecovery=True`: decided again and recreated.
    Redeciding,
    /// `MemoryRecovery=False`: past the profile's `maxMemoryRetries`.
    RetriesExhausted,
    /// `Ready=True` (profiles).
    NodesAvailable,
    /// `Ready=False` (profiles): no reported node matches.
    NoMatchingNodes,
    /// `Ready=False` (profiles): the node selector does not parse.
    InvalidSelector,
}

impl Reason {
    /// The reason's name in the API (an Event of the same change carries the same name).
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Resolved => "Resolved",
            Reason::NotRequested => "NotRequested",
            Reason::Tracing => names::EVENT_TRACING,
            Reason::Held(code) => code,
            Reason::Created => "Created",
            Reason::Recreating => "Recreating",
            Reason::NameConflict => names::EVENT_NAME_CONFLICT,
            Reason::ApplyFailed => names::EVENT_APPLY_FAILED,
            Reason::PodsScheduled => "PodsScheduled",
            Reason::PodsRefusedByQuota => names::EVENT_PODS_REFUSED_BY_QUOTA,
            Reason::PodsRefusedByLimitRange => names::EVENT_PODS_REFUSED_BY_LIMIT_RANGE,
            Reason::PodsRefusedByWebhook => names::EVENT_PODS_REFUSED_BY_WEBHOOK,
            Reason::PodsRefused => names::EVENT_PODS_REFUSED,
            Reason::PodsUnschedulable => names::EVENT_PODS_UNSCHEDULABLE,
            Reason::StartupGuardPassed => "StartupGuardPassed",
            Reason::StartupGuardFailed => names::EVENT_STARTUP_GUARD_FAILED,
            Reason::Admitted => "Admitted",
            Reason::Queued => "Queued",
            Reason::Suspended => names::EVENT_SUSPENDED,
            Reason::GpusBusy => "GPUsBusy",
            Reason::GpusIdle => names::EVENT_GPUS_IDLE,
            Reason::Headroom => "Headroom",
            Reason::NearGpuMemoryLimit => names::EVENT_NEAR_GPU_MEMORY_LIMIT,
            Reason::Redeciding => names::REASON_REDECIDING,
            Reason::RetriesExhausted => "RetriesExhausted",
            Reason::NodesAvailable => "NodesAvailable",
            Reason::NoMatchingNodes => "NoMatchingNodes",
            Reason::InvalidSelector => "InvalidSelector",
        }
    }
}

/// Most characters of a condition's message.
pub const MAX_CONDITION_MESSAGE: usize = 4096;

/// A condition of `kind` with `status`, `reason` and `message` (at most
/// [`MAX_CONDITION_MESSAGE`] characters), keeping its transition time where `existing` has the
/// same status, so repeated reconciles do not churn it.
pub fn condition(
    existing: &[Condition],
    kind: ConditionType,
    status: bool,
    reason: Reason,
    message: impl Into<String>,
    observed_generation: Option<i64>,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_string();
    let last_transition_time = existing
        .iter()
        .find(|c| kind.is(c) && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(jiff::Timestamp::now()));
    Condition {
        type_: kind.as_str().to_string(),
        status,
        reason: reason.as_str().to_string(),
        // What a condition echoes of the job (its labels, its selector) is bounded: the API
        // server allows 32 kB, a reader wants a screen.
        message: offload_api::text::bounded_to(&message.into(), MAX_CONDITION_MESSAGE),
        last_transition_time,
        observed_generation,
    }
}

/// Replaces the condition of the same type in `list`, or appends it.
pub fn set(list: &mut Vec<Condition>, cond: Condition) {
    match list.iter_mut().find(|c| c.type_ == cond.type_) {
        Some(slot) => *slot = cond,
        None => list.push(cond),
    }
}

/// Whether the condition of `type_` is present with the same status, reason and message.
pub fn unchanged(existing: &[Condition], cond: &Condition) -> bool {
    existing.iter().any(|c| {
        c.type_ == cond.type_
            && c.status == cond.status
            && c.reason == cond.reason
            && c.message == cond.message
    })
}

/// Whether `existing` has a condition of `kind` with `status` (`"True"` or `"False"`).
pub fn has(existing: &[Condition], kind: ConditionType, status: &str) -> bool {
    existing.iter().any(|c| kind.is(c) && c.status == status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_keeps_its_transition_time_while_its_status_holds() {
        let first = condition(
            &[],
            ConditionType::Admitted,
            false,
            Reason::Queued,
            "waits",
            Some(1),
        );
        let later = condition(
            std::slice::from_ref(&first),
            ConditionType::Admitted,
            false,
            Reason::Suspended,
            "suspended",
            Some(1),
        );
        assert_eq!(later.last_transition_time, first.last_transition_time);
        assert_eq!(later.reason, "Suspended");
        let long = condition(
            &[],
            ConditionType::Ready,
            true,
            Reason::NodesAvailable,
            "x".repeat(10_000),
            None,
        );
        assert!(long.message.len() <= MAX_CONDITION_MESSAGE + 8);
    }
}
