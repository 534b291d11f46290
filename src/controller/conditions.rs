//! Typed status conditions, built in one place.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition type: the offload configuration is resolved.
pub const OFFLOAD_RESOLVED: &str = "OffloadResolved";
/// Condition type: the workload exists.
pub const WORKLOAD_CREATED: &str = "WorkloadCreated";
/// Condition type: the start-up guard found the pods' nodes to be what the configuration assumes
/// (False with the guard's message when one was not).
pub const NODE_VERIFIED: &str = "NodeVerified";
/// Condition type: the cluster created the workload's pods and placed them on nodes (False with
/// the admission plugin's or the scheduler's words when it refused or could not).
pub const PODS_SCHEDULED: &str = "PodsScheduled";
/// Condition type: for a job in a Kueue queue, whether Kueue admitted its workload.
pub const ADMITTED: &str = "Admitted";
/// Condition type of profiles: at least one reported node matches.
pub const READY: &str = "Ready";

/// Most characters of a condition's message.
pub const MAX_CONDITION_MESSAGE: usize = 4096;

/// A condition of `type_` with `status`, `reason` and `message` (at most
/// [`MAX_CONDITION_MESSAGE`] characters), keeping its transition time where `existing` has the
/// same status, so repeated reconciles do not churn it.
pub fn condition(
    existing: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_string();
    let last_transition_time = existing
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(jiff::Timestamp::now()));
    Condition {
        type_: type_.to_string(),
        status,
        reason: reason.to_string(),
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
