//! Following a workload that exists: phase and the workload reference, never the decision.

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::apply::{publish, workload_created};
use crate::api::{JobPhase, TrainingJob, WorkloadRef};
use crate::controller::conditions::{self, WORKLOAD_CREATED};
use crate::controller::{Context, Error, status};
use crate::render;

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
            status::apply_workload(&api, &name, JobPhase::Pending, None, &cond).await?;
            publish(
                ctx,
                tj,
                EventType::Warning,
                "NameConflict",
                "a Job of the same name exists and is not owned by this TrainingJob",
            )
            .await;
        }
        return Ok(Action::await_change());
    }
    let phase = phase_of(job);
    let workload = WorkloadRef {
        job: name.clone(),
        service: name.clone(),
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
    };
    let created = workload_created(&current.conditions, &name, generation);
    if current.phase == Some(phase)
        && current.workload.as_ref() == Some(&workload)
        && conditions::unchanged(&current.conditions, &created)
    {
        return Ok(Action::await_change());
    }
    status::apply_workload(&api, &name, phase, Some(&workload), &created).await?;
    Ok(Action::await_change())
}

/// Phase from the Job's status.
pub(super) fn phase_of(job: &Job) -> JobPhase {
    let Some(status) = job.status.as_ref() else {
        return JobPhase::Pending;
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
    } else if status.active.unwrap_or(0) > 0 || status.ready.unwrap_or(0) > 0 {
        JobPhase::Running
    } else {
        JobPhase::Pending
    }
}
