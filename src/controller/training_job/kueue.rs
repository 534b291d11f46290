//! What Kueue says about a queued workload Job: the message of its Workload's `QuotaReserved`
//! (why it waits: quota, or no flavor whose nodes the Job's node affinity allows) or `Evicted`
//! condition, so that the TrainingJob's `Admitted` condition says it too.
//!
//! Kueue is optional: where its API is not installed, or the operator may not read Workloads,
//! the condition keeps its own message. Where Kueue is served when the operator starts, its
//! Workloads are watched ([`workload_changes`]), so what Kueue writes reaches the job's
//! condition within a reconcile, not on the next timed look.

use futures::{Stream, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;

/// Kueue's label on a Workload: the uid of the Job it stands for.
const JOB_UID_LABEL: &str = "kueue.x-k8s.io/job-uid";

/// The Workload API this reads (served by Kueue 0.15 and later).
pub(crate) fn workloads() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        "kueue.x-k8s.io",
        "v1beta2",
        "Workload",
    ))
}

/// Changes of Kueue's Workloads (their metadata: each change moves the resourceVersion), where
/// Kueue serves its API when the operator starts; an empty stream that never ends where it does
/// not (Kueue installed later is seen on the timed look, and by the watch after a restart).
pub(crate) fn workload_changes(
    client: &kube::Client,
) -> impl Stream<Item = Result<PartialObjectMeta<DynamicObject>, watcher::Error>> + Send + 'static {
    let client = client.clone();
    futures::stream::once(async move {
        let ar = workloads();
        let served = match client.list_api_group_resources(&ar.api_version).await {
            Ok(list) => list.resources.iter().any(|r| r.name == ar.plural),
            Err(e) => {
                tracing::info!(api = %ar.api_version, error = %e, "Kueue's Workloads are not served: not watched (queued jobs are looked at every 15 s)");
                false
            }
        };
        if served {
            let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(client, &ar);
            watcher(api, watcher::Config::default().any_semantic())
                .default_backoff()
                .touched_objects()
                .boxed()
        } else {
            futures::stream::pending().boxed()
        }
    })
    .flatten()
}

/// The TrainingJob a Workload stands for: Kueue makes the workload Job its owner, and the
/// workload Job has its TrainingJob's name.
pub(crate) fn job_of_workload(w: &PartialObjectMeta<DynamicObject>) -> Option<(String, String)> {
    let owner = w
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.kind == "Job" && o.api_version == "batch/v1")?;
    Some((owner.name.clone(), w.namespace()?))
}

/// Kueue's latest word on why the Job's Workload is not running, if it has one.
pub(super) async fn waiting_reason(client: &kube::Client, job: &Job) -> Option<String> {
    let uid = job.metadata.uid.as_deref()?;
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &job.namespace().unwrap_or_default(),
        &workloads(),
    );
    let list = match api
        .list(&ListParams::default().labels(&format!("{JOB_UID_LABEL}={uid}")))
        .await
    {
        Ok(list) => list,
        Err(e) => {
            tracing::debug!(error = %e, "reading Kueue Workloads (is Kueue installed?)");
            return None;
        }
    };
    list.items.iter().find_map(|w| reason_of(&w.data))
}

/// From a Workload's status: the message of `Evicted` (true) or `QuotaReserved` (false), cut
/// to a length fit for a condition.
pub(super) fn reason_of(workload: &serde_json::Value) -> Option<String> {
    let conditions = workload.pointer("/status/conditions")?.as_array()?;
    let find = |kind: &str, status: &str| {
        conditions.iter().find_map(|c| {
            (c.get("type")?.as_str()? == kind && c.get("status")?.as_str()? == status)
                .then(|| c.get("message")?.as_str())
                .flatten()
                .filter(|m| !m.is_empty())
        })
    };
    let message = find("Evicted", "True").or_else(|| find("QuotaReserved", "False"))?;
    Some(offload_api::text::bounded_to(message, 512))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_reason_is_quota_reserved_false_or_evicted() {
        let waiting = json!({"status": {"conditions": [
            {"type": "QuotaReserved", "status": "False", "reason": "Pending",
             "message": "couldn't assign flavors to pod set main: flavor offload-discrete doesn't match node affinity"}
        ]}});
        assert_eq!(
            reason_of(&waiting).as_deref(),
            Some(
                "couldn't assign flavors to pod set main: flavor offload-discrete doesn't match node affinity"
            )
        );
        let evicted = json!({"status": {"conditions": [
            {"type": "QuotaReserved", "status": "False", "message": "waiting"},
            {"type": "Evicted", "status": "True", "message": "Preempted to accommodate a workload"}
        ]}});
        assert_eq!(
            reason_of(&evicted).as_deref(),
            Some("Preempted to accommodate a workload")
        );
        let admitted = json!({"status": {"conditions": [
            {"type": "QuotaReserved", "status": "True", "message": "Quota reserved"}
        ]}});
        assert_eq!(reason_of(&admitted), None);
        for garbage in [
            json!(null),
            json!({"status": "x"}),
            json!({"status": {"conditions": [1, {"type": 2}]}}),
        ] {
            assert_eq!(reason_of(&garbage), None);
        }
    }

    #[test]
    fn a_long_message_is_cut() {
        let long = "x".repeat(5000);
        let w = json!({"status": {"conditions": [
            {"type": "QuotaReserved", "status": "False", "message": long}
        ]}});
        assert!(reason_of(&w).is_some_and(|m| m.len() <= 520));
    }
}
