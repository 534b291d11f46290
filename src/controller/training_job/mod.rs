//! TrainingJob reconcile: validate → decide → patch → build → apply → status. This module
//! decides; [`apply`] creates the workload (and holds a job that cannot be decided), [`follow`]
//! keeps the status in step with a running workload, [`triggers`] maps changes of other objects
//! to the jobs they concern. Every status they write is built and written by
//! [`crate::controller::status`].

pub(crate) mod apply;
mod follow;
pub(crate) mod kueue;
mod learn;
mod pods;
pub mod recovery;
mod sizing;
mod triggers;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use crate::cluster::tolerant::Tolerant;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::{Context, Error, kube_err};
use crate::decision::referenced::{Fetched, Reference};
use crate::decision::{ConfigError, ModelConfigError, ModelShape, UserConfig, decide, opted_in};
use crate::ops::metrics::DecisionLabels;
use crate::render;
use crate::render::workload::build_workload;
use offload_api::names;
use offload_api::v1alpha1::{TrainingJob, TrainingJobStatus};

use apply::{
    class_label, create_workload, existing_conditions, mode_label, publish, publish_to,
    record_unresolved,
};
use follow::follow_workload;
pub use follow::{guard_outcome, slim_pod, slim_workload};
pub use pods::FAILED_CREATE;
pub use triggers::{
    jobs_for_claim_template, jobs_for_config_map, jobs_for_node, jobs_for_observation,
    jobs_for_profile, jobs_for_slices, jobs_in_namespace,
};

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

/// The workload, or `None` once the job is held with the reason it could not be built.
async fn built_or_held<W, E: std::fmt::Display>(
    tj: &TrainingJob,
    ctx: &Context,
    built: Result<W, E>,
) -> Result<Option<W>, Error> {
    match built {
        Ok(w) => Ok(Some(w)),
        Err(e) => {
            record_unresolved(
                tj,
                ctx,
                &Unresolved::Config(ConfigError::NotMergeable(e.to_string())),
            )
            .await?;
            Ok(None)
        }
    }
}

/// Reconciles one TrainingJob as given (which may be a stale copy: every write is safe for that).
pub async fn reconcile_job(tj: &TrainingJob, ctx: &Context) -> Result<Action, Error> {
    let (Some(ns), name) = (tj.namespace(), tj.name_any()) else {
        return Ok(Action::await_change());
    };
    if let Some(job) = existing_workload(ctx, &ns, &name).await? {
        ctx.metrics.set_held(&apply::job_labels(tj), None);
        return follow_workload(tj, ctx, &job).await;
    }
    let Some(latest) = latest_copy(tj, ctx, &ns, &name).await? else {
        return Ok(Action::await_change());
    };
    let tj: &TrainingJob = &latest;

    if !opted_in(tj) {
        return run_without_offload(tj, ctx).await;
    }

    let config = read_deepspeed_config(tj, ctx).await?;
    let model = read_model_config(tj, ctx).await?;
    // Boxed: the sizer's steps are a large future, and a reconcile's must fit a small stack.
    let traced = match Box::pin(sizing::trace_step(
        tj,
        ctx,
        config.as_ref().ok().and_then(Option::as_ref),
        model.as_ref().ok().and_then(Option::as_ref),
    ))
    .await?
    {
        sizing::Step::Wait(action) => return Ok(action),
        sizing::Step::Decide(traced) => traced,
    };
    let with_trace = traced.as_ref().map(|t| sizing::WithTrace {
        view: &ctx.view,
        traced: t,
    });
    let view: &dyn crate::decision::ClusterView = match &with_trace {
        Some(v) => v,
        None => &ctx.view,
    };
    let res = match decide(
        tj,
        config.as_ref().map(Option::as_ref),
        model.as_ref().map(Option::as_ref),
        view,
    ) {
        Ok(res) => {
            ctx.metrics.set_held(&apply::job_labels(tj), None);
            res
        }
        Err(why) => {
            record_unresolved(tj, ctx, &why).await?;
            return Ok(Action::await_change());
        }
    };
    if res.trial.is_some() && !trial_taken(tj, ctx, &res).await? {
        // Another job took the shape's last trial first: decided again, without one.
        return Ok(Action::requeue(std::time::Duration::from_millis(200)));
    }
    let user_config = config.ok().flatten().map(|c| c.json);
    let built =
        build_workload(tj, Some(&res), user_config.as_ref(), &ctx.render).and_then(|mut w| {
            crate::render::workload::pin_claims(&mut w, tj, &res, &|name| {
                crate::decision::ClusterView::claim_template(&ctx.view, &ns, name)
            })?;
            Ok(w)
        });
    let Some(built) = built_or_held(tj, ctx, built).await? else {
        return Ok(Action::await_change());
    };

    let generation = match write_spec(tj, ctx, &res).await? {
        Ok(generation) => generation,
        Err(refused) => {
            // Retrying the same write gets the same answer: the job waits for its spec to
            // change (a new generation is a new reconcile).
            record_unresolved(tj, ctx, &Unresolved::SpecRefused(refused)).await?;
            return Ok(Action::await_change());
        }
    };

    let (mut status, first_resolution) = resolved_status(tj, ctx, &res, generation);
    if let Some(action) = create_workload(tj, ctx, &built, &mut status).await? {
        // Resolved, but the workload could not be created: say what was decided (the
        // failure has its own Event). When it is created, its one Event says both.
        if first_resolution {
            publish(
                ctx,
                tj,
                EventType::Normal,
                names::EVENT_OFFLOAD_RESOLVED,
                &res.summary(),
            )
            .await;
        }
        return Ok(action);
    }
    let summary = render::resolved_summary(&res);
    announce_created(ctx, tj, format!("created Job {name} with {summary}")).await;
    if let Some(trial) = &res.trial {
        let note = offload_api::text::bounded_to(&trial.evidence, 1000);
        publish(ctx, tj, EventType::Normal, names::EVENT_TRIAL, &note).await;
    }
    Ok(Action::await_change())
}

/// Takes the trial `res` decides for `tj` in the learned store, where fewer than the profile's
/// `fasterTrials` of its shape are taken (by any replica); `false` where the last was taken
/// first.
async fn trial_taken(
    tj: &TrainingJob,
    ctx: &Context,
    res: &crate::decision::Resolution,
) -> Result<bool, Error> {
    let store = ctx.view.learned.as_ref();
    let profile = crate::decision::ClusterView::profile(&ctx.view, &res.profile);
    let shape = res.memory.as_ref().map(|m| m.shape.clone());
    let (Some(store), Some(profile), Some(class), Some(shape)) =
        (store, profile, res.node_class, shape)
    else {
        return Ok(true);
    };
    let ns = tj.namespace().unwrap_or_default();
    let namespace = match profile.learning_scope {
        offload_api::v1alpha1::LearningScope::Namespace => Some(ns.as_str()),
        offload_api::v1alpha1::LearningScope::Cluster => None,
    };
    let reservation = crate::decision::learned::Reservation {
        profile: res.profile.clone(),
        class,
        shape,
        job: crate::decision::run_id(tj),
        at: jiff::Timestamp::now().to_string(),
    };
    store
        .take_trial(
            ctx.client.clone(),
            reservation,
            profile.faster_trials,
            namespace,
        )
        .await
        .map_err(kube_err("taking a trial in the learned ConfigMap"))
}

/// The job's workload Job, if it exists. Frozen once the workload exists: only phase and the
/// workload reference follow it. A Job in the cache exists (its deletion would have removed
/// it); one not there yet may have just been created, so absence is asked of the API server,
/// never taken from the cache.
async fn existing_workload(ctx: &Context, ns: &str, name: &str) -> Result<Option<Job>, Error> {
    let cached = ctx
        .workloads
        .as_ref()
        .and_then(|w| w.get(&kube::runtime::reflector::ObjectRef::new(name).within(ns)));
    match cached {
        Some(job) => Ok(Some((*job).clone())),
        None => Api::<Job>::namespaced(ctx.client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(kube_err("reading the workload Job")),
    }
}

/// The copy of the job to decide on; `None` where it is gone. No Job, but the copy says it had
/// one: its Job was deleted to be recreated (after running out of memory), and the copy may be
/// from before the failure was recorded. The decision must see every failure, so the job is
/// read again.
async fn latest_copy<'a>(
    tj: &'a TrainingJob,
    ctx: &Context,
    ns: &str,
    name: &str,
) -> Result<Option<std::borrow::Cow<'a, TrainingJob>>, Error> {
    if tj.status.as_ref().is_none_or(|s| s.workload.is_none()) {
        return Ok(Some(std::borrow::Cow::Borrowed(tj)));
    }
    let api: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), ns);
    Ok(api
        .get_opt(name)
        .await
        .map_err(kube_err("reading the TrainingJob again"))?
        .map(std::borrow::Cow::Owned))
}

/// Patches the concrete values into `spec.offload` before any pod can exist (server-side apply,
/// the operator's field manager); the generation the write produced (the status records it),
/// or why the API server refused it for good (an admission denial, an invalid object: the same
/// write would be refused again).
async fn write_spec(
    tj: &TrainingJob,
    ctx: &Context,
    res: &crate::decision::Resolution,
) -> Result<Result<Option<i64>, String>, Error> {
    let name = tj.name_any();
    let api: Api<TrainingJob> =
        Api::namespaced(ctx.client.clone(), &tj.namespace().unwrap_or_default());
    let mut generation = tj.metadata.generation;
    let concrete = res.concrete_spec();
    if tj.spec.offload != concrete {
        // The request the decision was made from goes with it, so the next decision (after an
        // out-of-memory) is made from what the user asked, never from what was written here.
        let record = crate::decision::AdmittedRequest {
            requested: res.requested.clone(),
            wrote: concrete.clone(),
        };
        let requested = record
            .annotation()
            .map_err(|e| Error::Serialize("the offload request record", e))?;
        let patch = json!({
            "apiVersion": TrainingJob::api_version(&()),
            "kind": TrainingJob::kind(&()),
            "metadata": {"annotations": {names::ANNOTATION_REQUESTED: requested}},
            "spec": {"offload": concrete},
        });
        let patched = match api
            .patch(
                &name,
                &PatchParams::apply(names::OPERATOR_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
        {
            Ok(p) => p,
            Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 422) => {
                return Ok(Err(offload_api::text::bounded_to(&e.message, 1024)));
            }
            Err(e) => return Err(kube_err("patching spec.offload")(e)),
        };
        generation = patched.metadata.generation;
    }
    Ok(Ok(generation))
}

/// The status of a job just resolved at `generation` (its decision, `OffloadResolved=True`),
/// and whether this is its first resolution; the decision is counted.
fn resolved_status(
    tj: &TrainingJob,
    ctx: &Context,
    res: &crate::decision::Resolution,
    generation: Option<i64>,
) -> (TrainingJobStatus, bool) {
    ctx.metrics
        .decisions
        .get_or_create(&DecisionLabels {
            mode: mode_label(res.mode),
            node_class: class_label(res.node_class),
        })
        .inc();
    super::status::resolved(
        existing_conditions(tj),
        res.status(),
        res.headline(),
        generation,
    )
}

/// The one Event of a workload created.
async fn announce_created(ctx: &Context, tj: &TrainingJob, message: String) {
    publish(
        ctx,
        tj,
        EventType::Normal,
        names::EVENT_WORKLOAD_CREATED,
        &message,
    )
    .await;
}

/// A TrainingJob that opted out of offload configuration (no profile annotation, no offload
/// field): it is still our kind, so it runs, without offload settings, and its status says so.
async fn run_without_offload(tj: &TrainingJob, ctx: &Context) -> Result<Action, Error> {
    if let Err(e) = crate::decision::check_training_job(tj) {
        record_unresolved(tj, ctx, &Unresolved::Decision(e)).await?;
        return Ok(Action::await_change());
    }
    let Some(built) = built_or_held(tj, ctx, build_workload(tj, None, None, &ctx.render)).await?
    else {
        return Ok(Action::await_change());
    };
    let mut status = super::status::not_requested(existing_conditions(tj), tj.metadata.generation);
    if let Some(action) = create_workload(tj, ctx, &built, &mut status).await? {
        return Ok(action);
    }
    let message = format!(
        "created Job {} without offload configuration (none requested)",
        tj.name_any()
    );
    announce_created(ctx, tj, message).await;
    Ok(Action::await_change())
}

/// Fetches the ConfigMap `r` names in the job's namespace (an API error is the reconcile's
/// to retry).
async fn fetch(tj: &TrainingJob, ctx: &Context, r: &Reference) -> Result<(String, Fetched), Error> {
    let ns = tj.namespace().unwrap_or_default();
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    let cm = cms
        .get_opt(&r.name)
        .await
        .map_err(kube_err("reading a ConfigMap the job references"))?;
    Ok((
        ns,
        cm.map_or(Fetched::Absent, |cm| Fetched::Found(Box::new(cm))),
    ))
}

/// Reads the model's `config.json` ConfigMap, if referenced (`spec.model.configMapRef`): its
/// shape, or what is wrong with it.
pub(super) async fn read_model_config(
    tj: &TrainingJob,
    ctx: &Context,
) -> Result<Result<Option<ModelShape>, ModelConfigError>, Error> {
    let Some(r) = Reference::model(tj) else {
        return Ok(Ok(None));
    };
    let (ns, fetched) = fetch(tj, ctx, &r).await?;
    Ok(r.model_shape(&ns, fetched).map(Some))
}

/// Reads the user's DeepSpeed ConfigMap, if referenced: the parsed config, or what is wrong
/// with it.
pub(super) async fn read_deepspeed_config(
    tj: &TrainingJob,
    ctx: &Context,
) -> Result<Result<Option<UserConfig>, ConfigError>, Error> {
    let Some(r) = Reference::deepspeed(tj) else {
        return Ok(Ok(None));
    };
    let (ns, fetched) = fetch(tj, ctx, &r).await?;
    Ok(r.user_config(&ns, fetched).map(Some))
}
