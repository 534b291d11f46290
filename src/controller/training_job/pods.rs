//! Whether the cluster made and placed the workload's pods. A pod refused at creation (a
//! ResourceQuota, the LimitRanger, a webhook) exists nowhere: the Job controller says so only in
//! a `FailedCreate` Event on the Job and tries again with back-off. A pod the scheduler cannot
//! place (an untolerated taint, more than any node has) waits Pending. Either is shown on the
//! TrainingJob as `PodsScheduled=False` with what to change.

use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;

use crate::controller::Context;
use crate::controller::conditions::{self, ConditionType, Reason};

/// The reason the Job controller gives the Events of pods it could not create.
pub const FAILED_CREATE: &str = "FailedCreate";

/// The `PodsScheduled` condition of workload `job` with `pods` (the controller's cache of them)
/// and `refusal` (its latest `FailedCreate`, [`latest_refusal`]): `False` while a pod is refused
/// or unschedulable, `True` once every pod the Job wants is placed, else the condition recorded
/// (a suspended or finished Job, pods on their way).
pub(super) fn pods_condition(
    existing: &[Condition],
    generation: Option<i64>,
    job: &Job,
    pods: &[Arc<Pod>],
    refusal: Option<&str>,
) -> Option<Condition> {
    let recorded = ConditionType::PodsScheduled.find(existing).cloned();
    let Some(want) = wanted(job).filter(|w| *w > 0) else {
        return recorded;
    };
    let alive: Vec<&Pod> = pods.iter().map(Arc::as_ref).filter(|p| alive(p)).collect();
    let placed = |ok, reason: Reason, message: String| {
        Some(conditions::condition(
            existing,
            ConditionType::PodsScheduled,
            ok,
            reason,
            message,
            generation,
        ))
    };
    if let Some(message) = refusal.filter(|_| alive.len() < want) {
        let (reason, change) = refused_because(message);
        return placed(
            false,
            reason,
            format!("the cluster refused the workload's pods: {message}; {change}"),
        );
    }
    if let Some((pod, message)) = alive.iter().find_map(|p| unschedulable(p)) {
        return placed(
            false,
            Reason::PodsUnschedulable,
            format!(
                "the scheduler cannot place pod {pod}: {message}; add the toleration, lower the request or add a node that has it"
            ),
        );
    }
    let scheduled = alive.iter().filter(|p| scheduled(p)).count();
    if scheduled >= want {
        return placed(
            true,
            Reason::PodsScheduled,
            format!("{scheduled} of the workload's pods are created and placed on nodes"),
        );
    }
    recorded
}

/// Whether fewer of the Job's pods are alive than it wants (only then can a refusal matter).
fn wants_more(job: &Job, pods: &[Arc<Pod>]) -> bool {
    wanted(job).is_some_and(|want| pods.iter().filter(|p| alive(p)).count() < want)
}

/// How many pods the Job wants alive now: its parallelism, bounded by the completions still to
/// come; `None` for a suspended or finished Job (it wants none, and what was said stays).
fn wanted(job: &Job) -> Option<usize> {
    let spec = job.spec.as_ref()?;
    if spec.suspend.unwrap_or(false) {
        return None;
    }
    let status = job.status.clone().unwrap_or_default();
    let finished = status
        .conditions
        .iter()
        .flatten()
        .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True");
    if finished {
        return None;
    }
    let parallelism = i64::from(spec.parallelism.unwrap_or(1));
    let remaining = spec.completions.map_or(parallelism, |c| {
        i64::from(c) - i64::from(status.succeeded.unwrap_or(0))
    });
    usize::try_from(parallelism.min(remaining)).ok()
}

/// A pod that counts toward the Job's parallelism: not on its way out, not ended.
fn alive(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// Whether the pod is bound to a node.
fn scheduled(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .is_some()
}

/// The pod's name and the scheduler's message, where it found no node for it.
fn unschedulable(pod: &Pod) -> Option<(String, String)> {
    if scheduled(pod) {
        return None;
    }
    let c = pod
        .status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
    (c.reason.as_deref() == Some("Unschedulable")).then(|| {
        let said = c.message.clone().unwrap_or_default();
        (pod.name_any(), said.trim_end_matches('.').to_string())
    })
}

/// The message of the Job's latest `FailedCreate` Event (the controller's cache of them),
/// where fewer of its pods are alive than it wants and the Event is newer than the newest of
/// them (a refusal the cluster has since stopped making is not one).
pub(super) fn latest_refusal(ctx: &Context, job: &Job, pods: &[Arc<Pod>]) -> Option<String> {
    let uid = job
        .metadata
        .uid
        .as_deref()
        .filter(|_| wants_more(job, pods))?;
    let events = ctx.failed_creates.as_ref()?;
    let newest_pod = pods
        .iter()
        .filter_map(|p| p.metadata.creation_timestamp.as_ref())
        .map(|t| t.0)
        .max();
    events
        .state()
        .into_iter()
        .filter(|e| {
            e.involved_object.uid.as_deref() == Some(uid)
                && e.reason.as_deref() == Some(FAILED_CREATE)
        })
        .filter_map(|e| Some((last_seen(&e)?, e.message.clone()?)))
        .filter(|(at, _)| newest_pod.is_none_or(|p| *at >= p))
        .max_by_key(|(at, _)| *at)
        .map(|(_, message)| refusal_text(&message))
}

/// When an Event last happened: its series, its last timestamp, its event time, its creation.
fn last_seen(e: &Event) -> Option<jiff::Timestamp> {
    e.series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref())
        .map(|t| t.0)
        .or_else(|| e.last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// The API server's words without the Job controller's "Error creating: " and the final period.
fn refusal_text(message: &str) -> String {
    message
        .trim()
        .trim_start_matches("Error creating: ")
        .trim_end_matches('.')
        .to_string()
}

/// The condition's reason for a refusal and what to change, from the API server's message.
/// The messages are the admission plugins' own (`exceeded quota`, the LimitRanger's `per
/// Container` bounds, a webhook's name).
pub fn refused_because(message: &str) -> (Reason, &'static str) {
    if message.contains("exceeded quota") || message.contains("for quota") {
        (
            Reason::PodsRefusedByQuota,
            "raise the namespace's ResourceQuota or lower what the job asks for; the Job creates them once the quota allows",
        )
    } else if ["per Container", "per Pod", "limit to request ratio"]
        .iter()
        .any(|s| message.contains(s))
    {
        (
            Reason::PodsRefusedByLimitRange,
            "change the namespace's LimitRange or the job's resources to agree",
        )
    } else if message.contains("admission webhook") {
        (
            Reason::PodsRefusedByWebhook,
            "change what the named webhook refuses, or its policy",
        )
    } else {
        (
            Reason::PodsRefused,
            "change what the message names; the Job creates them once the cluster allows",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_named_by_the_plugin_that_made_them() {
        let quota = "Error creating: pods \"a-x\" is forbidden: exceeded quota: gpu-team, requested: requests.memory=120Gi, used: requests.memory=0, limited: requests.memory=64Gi";
        assert_eq!(refused_because(quota).0, Reason::PodsRefusedByQuota);
        assert!(refusal_text(quota).starts_with("pods \"a-x\" is forbidden"));
        let range = "pods \"a-x\" is forbidden: maximum memory usage per Container is 16Gi, but limit is 100Gi";
        assert_eq!(refused_because(range).0, Reason::PodsRefusedByLimitRange);
        let hook =
            "admission webhook \"policy.example.com\" denied the request: no GPUs on Sundays";
        assert_eq!(refused_because(hook).0, Reason::PodsRefusedByWebhook);
        assert_eq!(
            refused_because("pods is forbidden: violates PodSecurity").0,
            Reason::PodsRefused
        );
    }

    fn job(spec: serde_json::Value, status: serde_json::Value) -> Job {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "j"}, "spec": spec, "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_job_wants_its_parallelism_up_to_the_completions_left() {
        let template = serde_json::json!({"spec": {"containers": []}});
        let spec = |p: i32, c: Option<i32>, suspend: bool| serde_json::json!({"parallelism": p, "completions": c, "suspend": suspend, "template": template});
        assert_eq!(
            wanted(&job(spec(4, None, false), serde_json::json!({}))),
            Some(4)
        );
        assert_eq!(
            wanted(&job(
                spec(4, Some(5), false),
                serde_json::json!({"succeeded": 3})
            )),
            Some(2)
        );
        assert_eq!(
            wanted(&job(spec(4, None, true), serde_json::json!({}))),
            None
        );
        let done = serde_json::json!({"conditions": [{"type": "Complete", "status": "True"}]});
        assert_eq!(wanted(&job(spec(1, None, false), done)), None);
        // More succeeded than completions (a hostile status) wants none, never wraps.
        assert_eq!(
            wanted(&job(
                spec(2, Some(1), false),
                serde_json::json!({"succeeded": 9})
            )),
            None
        );
    }

    #[test]
    fn an_unschedulable_pod_gives_the_schedulers_words() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
              "reason": "Unschedulable",
              "message": "0/3 nodes are available: 3 node(s) had untolerated taint {nvidia.com/gpu: present}."}]}
        }))
        .unwrap();
        let (name, said) = unschedulable(&pod).unwrap();
        assert_eq!(name, "p");
        assert!(said.ends_with("present}"), "{said}");
    }
}
