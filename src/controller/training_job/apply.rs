//! Creating the workload: its objects by server-side apply under the operator's field manager
//! ([`create_workload`]); refusals that last become conditions. Events are published here; the
//! statuses themselves come from [`crate::controller::status`].

use std::time::Duration;

use crate::dra::api::ResourceClaimTemplate;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::controller::{Context, Error, kube_err, status};
use crate::render::workload::Workload;
use offload_api::names;
use offload_api::v1alpha1::{NodeClass, OffloadMode, TrainingJob, TrainingJobStatus, WorkloadRef};

/// Whether an API error will repeat until something changes (the job, the cluster's limits,
/// RBAC), as opposed to a conflict, throttling or an outage that a retry fixes.
pub(super) fn lasting(e: &kube::Error) -> Option<String> {
    match e {
        kube::Error::Api(s) if matches!(s.code, 400 | 403 | 413 | 422) => {
            Some(format!("{} ({})", s.message, s.code))
        }
        _ => None,
    }
}

/// Creates the workload (deterministic names and server-side apply, so a retry or a restart
/// mid-way converges on exactly one of each), then writes `status` with the workload in it.
/// An apply the API server refuses for a lasting reason is written into `status` as
/// `WorkloadCreated=False` with the server's message, and an action is returned.
pub(super) async fn create_workload(
    tj: &TrainingJob,
    ctx: &Context,
    built: &Workload,
    status: &mut TrainingJobStatus,
) -> Result<Option<Action>, Error> {
    let name = tj.name_any();
    let ns = tj.namespace().unwrap_or_default();
    let api: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), &ns);
    let applied = async {
        if let Some(cm) = &built.config_map {
            apply_object(
                &Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns),
                cm,
                "applying the config ConfigMap",
            )
            .await?;
        }
        apply_object(
            &Api::<Service>::namespaced(ctx.client.clone(), &ns),
            &built.service,
            "applying the rendezvous Service",
        )
        .await?;
        // The pods' claim templates before the Job whose pods name them.
        for t in &built.claim_templates {
            apply_object(
                &Api::<ResourceClaimTemplate>::namespaced(ctx.client.clone(), &ns),
                t,
                "applying a pinned ResourceClaimTemplate",
            )
            .await?;
        }
        apply_object(
            &Api::<Job>::namespaced(ctx.client.clone(), &ns),
            &built.job,
            "applying the workload Job",
        )
        .await
    }
    .await;
    if let Err(err) = applied {
        let Error::Kube { action, source } = &err else {
            return Err(err);
        };
        let Some(detail) = lasting(source) else {
            return Err(err);
        };
        let message = format!("{action} failed: {detail}");
        if status::apply_failed(status, &super::planned::existing_conditions(tj), &message) {
            status::write_decision(&api, &name, status).await?;
            publish(
                ctx,
                tj,
                EventType::Warning,
                names::EVENT_APPLY_FAILED,
                &message,
            )
            .await;
        }
        // A change of the job re-triggers sooner; otherwise try again now and then (the cause
        // may be outside the job: RBAC, a quota, an admission policy).
        return Ok(Some(Action::requeue(Duration::from_secs(300))));
    }
    status::with_workload(
        status,
        WorkloadRef {
            job: name.clone(),
            service: name.clone(),
            config_map: built
                .config_map
                .as_ref()
                .and_then(|c| c.metadata.name.clone()),
        },
    );
    status::write_decision(&api, &name, status).await?;
    Ok(None)
}

/// The labels of a job's own metric series.
pub(super) fn job_labels(tj: &TrainingJob) -> crate::ops::metrics::JobLabels {
    crate::ops::metrics::JobLabels {
        namespace: tj.namespace().unwrap_or_default(),
        trainingjob: tj.name_any(),
    }
}

pub(super) fn mode_label(mode: OffloadMode) -> &'static str {
    match mode {
        OffloadMode::UnifiedMemory => "UnifiedMemory",
        OffloadMode::CpuCopy => "CPUCopy",
        OffloadMode::Disabled => "Disabled",
    }
}

pub(super) fn class_label(class: Option<NodeClass>) -> &'static str {
    match class {
        Some(NodeClass::Coherent) => "Coherent",
        Some(NodeClass::Discrete) => "Discrete",
        None => "none",
    }
}

pub(super) async fn apply_object<K>(
    api: &Api<K>,
    obj: &K,
    action: &'static str,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    let mut value = serde_json::to_value(obj).map_err(|e| Error::Serialize(action, e))?;
    value["apiVersion"] = json!(K::api_version(&()));
    value["kind"] = json!(K::kind(&()));
    api.patch(
        &name,
        &PatchParams::apply(names::OPERATOR_MANAGER).force(),
        &Patch::Apply(&value),
    )
    .await
    .map_err(kube_err(action))?;
    Ok(())
}

pub(super) async fn publish(
    ctx: &Context,
    tj: &TrainingJob,
    type_: EventType,
    reason: &str,
    note: &str,
) {
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note.to_string()),
        action: "Reconcile".to_string(),
        secondary: None,
    };
    publish_to(ctx, &tj.object_ref(&()), event).await;
}

pub(crate) async fn publish_to(
    ctx: &Context,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
    mut event: Event,
) {
    // Event notes are capped at 1 kB by the API server.
    event.note = event.note.map(|n| n.chars().take(1000).collect());
    if let Err(e) = ctx.recorder.publish(&event, reference).await {
        tracing::warn!(error = %e, "could not publish an Event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_refusals_that_repeat_become_conditions() {
        let api = |code: u16| {
            kube::Error::Api(
                kube::core::Status::failure("refused", "Reason")
                    .with_code(code)
                    .boxed(),
            )
        };
        for code in [400, 403, 413, 422] {
            assert!(lasting(&api(code)).is_some(), "{code}");
        }
        for code in [409, 429, 500, 503] {
            assert!(lasting(&api(code)).is_none(), "{code}");
        }
    }
}
