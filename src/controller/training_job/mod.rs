//! TrainingJob reconcile: observe → plan → write. [`snapshot`] reads everything one reconcile
//! needs (the job, its workload and pods, what Kueue and the Job controller say, what the
//! agents observed, the referenced ConfigMaps, the model's trace); [`plan`] decides from that
//! alone what changes (the decision, the workload, the status computed in one pass, the Events,
//! the lessons), with [`follow`] for a workload that exists and [`recovery`] for a pod out of
//! memory; [`write`](mod@write) applies the plan. [`triggers`] maps changes of other objects to the jobs
//! they concern. Every status part is built and written by [`crate::controller::status`].

pub(crate) mod apply;
mod follow;
pub(crate) mod kueue;
mod learn;
mod plan;
mod planned;
mod pods;
pub mod recovery;
mod sizing;
mod snapshot;
mod triggers;
mod workload;
mod write;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use crate::cluster::tolerant::Tolerant;
use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};

use super::{Context, Error};
use offload_api::names;
use offload_api::v1alpha1::TrainingJob;

use apply::publish_to;
pub use pods::FAILED_CREATE;
pub use triggers::{
    jobs_for_claim_template, jobs_for_config_map, jobs_for_node, jobs_for_observation,
    jobs_for_profile, jobs_for_slices, jobs_in_namespace,
};
pub use workload::{guard_outcome, slim_pod, slim_workload};

pub use crate::decision::Unresolved;

/// Reconciles one TrainingJob; one that does not deserialize is reported and skipped.
pub async fn reconcile(
    guard: Arc<Tolerant<TrainingJob>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer("TrainingJob");
    match &guard.0 {
        Ok(tj) => super::caught(reconcile_job(tj, &ctx)).await,
        Err(invalid) => {
            report_invalid(&ctx, invalid).await;
            Ok(Action::await_change())
        }
    }
}

async fn report_invalid(ctx: &Context, invalid: &crate::cluster::tolerant::InvalidObject) {
    let meta = &invalid.metadata;
    tracing::warn!(
        namespace = meta.namespace.as_deref().unwrap_or_default(),
        name = meta.name.as_deref().unwrap_or_default(),
        error = %invalid.error,
        "skipping a TrainingJob that does not deserialize"
    );
    ctx.metrics
        .reconcile_errors
        .get_or_create(&crate::ops::metrics::ErrorLabels {
            kind: "TrainingJob",
            category: "InvalidObject",
        })
        .inc();
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(TrainingJob::api_version(&()).to_string()),
        kind: Some(TrainingJob::kind(&()).to_string()),
        name: meta.name.clone(),
        namespace: meta.namespace.clone(),
        uid: meta.uid.clone(),
        ..Default::default()
    };
    let event = Event {
        type_: EventType::Warning,
        reason: names::EVENT_INVALID_OBJECT.to_string(),
        note: Some(format!(
            "the operator cannot read this TrainingJob and skips it: {}",
            invalid.error
        )),
        action: "Reconcile".to_string(),
        secondary: None,
    };
    publish_to(ctx, &reference, event).await;
}

/// Reconciles one TrainingJob as given (which may be a stale copy: every write is safe for
/// that): every read into a snapshot, a plan made from it alone, the plan written.
pub async fn reconcile_job(tj: &TrainingJob, ctx: &Context) -> Result<Action, Error> {
    let Some(snapshot) = snapshot::observe(tj, ctx).await? else {
        return Ok(Action::await_change());
    };
    let plan = plan::plan(&snapshot, &ctx.view, &ctx.render);
    write::apply(ctx, &snapshot, plan).await
}
