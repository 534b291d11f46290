//! The writer: applies a [`Plan`] — the trial taken, the spec, the workload, the status parts,
//! the Events, the lessons and the job's metric series — in the order the API needs, and turns
//! a write the API server refuses for good into the job's held status.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::apply::{class_label, create_workload, job_labels, mode_label, publish};
use super::plan;
use super::planned::{Announce, Creation, Following, Held, Learned, Plan, TrialTake};
use super::snapshot::Snapshot;
use crate::cluster::learned::LearnedStore;
use crate::controller::{Context, Error, kube_err, status};
use crate::decision::Unresolved;
use crate::ops::metrics::DecisionLabels;
use offload_api::names;
use offload_api::v1alpha1::TrainingJob;

/// Applies `plan`, made from `snap`; the action is when to look at the job again.
pub(super) async fn apply(ctx: &Context, snap: &Snapshot, plan: Plan) -> Result<Action, Error> {
    let tj = &snap.job;
    match plan {
        Plan::Wait(action) => Ok(action),
        Plan::Hold(held) => {
            hold(ctx, tj, &held).await?;
            Ok(Action::await_change())
        }
        Plan::Tracing(tracing) => {
            announce(ctx, tj, &tracing.announce).await;
            if let Some(status) = &tracing.status {
                status::write_decision(&api(ctx, tj), &tj.name_any(), status).await?;
            }
            Ok(Action::requeue(super::sizing::Step::POLL))
        }
        Plan::Create(creation) => create(ctx, tj, *creation).await,
        Plan::Follow(following) => follow(ctx, tj, *following).await,
    }
}

fn api(ctx: &Context, tj: &TrainingJob) -> Api<TrainingJob> {
    Api::namespaced(ctx.client.clone(), &tj.namespace().unwrap_or_default())
}

/// Holds the job: its metric series, and — where its status does not say it yet — the
/// status, the decision counted and a Warning Event.
async fn hold(ctx: &Context, tj: &TrainingJob, held: &Held) -> Result<(), Error> {
    // Set before the unchanged-status return: a restarted operator reports the jobs it holds.
    ctx.metrics.set_held(&job_labels(tj), Some(held.reason));
    let Some(status) = &held.status else {
        return Ok(());
    };
    status::write_decision(&api(ctx, tj), &tj.name_any(), status).await?;
    ctx.metrics
        .decisions
        .get_or_create(&DecisionLabels {
            mode: held.reason,
            node_class: "none",
        })
        .inc();
    publish(ctx, tj, EventType::Warning, held.reason, &held.message).await;
    Ok(())
}

/// Creates a decided job's workload: its trial taken, its spec written, then the workload and
/// its status, then the Events that say so.
async fn create(ctx: &Context, tj: &TrainingJob, c: Creation) -> Result<Action, Error> {
    if c.resolution.is_some() {
        ctx.metrics.set_held(&job_labels(tj), None);
    }
    if let Some(trial) = &c.trial
        && !take_trial(ctx, trial).await?
    {
        // Another job took the shape's last trial first: decided again, without one.
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    let generation = match &c.spec {
        None => tj.metadata.generation,
        Some(patch) => match write_spec(ctx, tj, patch).await? {
            Ok(generation) => generation,
            Err(refused) => {
                // Retrying the same write gets the same answer: the job waits for its spec to
                // change (a new generation is a new reconcile).
                let held = plan::held(tj, &Unresolved::SpecRefused(refused));
                hold(ctx, tj, &held).await?;
                return Ok(Action::await_change());
            }
        },
    };
    let (mut status, first_resolution) = c.status_at(generation);
    if let Some(res) = &c.resolution {
        ctx.metrics
            .decisions
            .get_or_create(&DecisionLabels {
                mode: mode_label(res.mode),
                node_class: class_label(res.node_class),
            })
            .inc();
    }
    if let Some(action) = create_workload(tj, ctx, &c.workload, &mut status).await? {
        // Resolved, but the workload could not be created: say what was decided (the
        // failure has its own Event). When it is created, its one Event says both.
        if let Some(res) = c.resolution.as_ref().filter(|_| first_resolution) {
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
    publish(
        ctx,
        tj,
        EventType::Normal,
        names::EVENT_WORKLOAD_CREATED,
        &c.created,
    )
    .await;
    if let Some(trial) = c.resolution.as_ref().and_then(|r| r.trial.as_ref()) {
        let note = offload_api::text::bounded_to(&trial.evidence, 1000);
        publish(ctx, tj, EventType::Normal, names::EVENT_TRIAL, &note).await;
    }
    Ok(Action::await_change())
}

/// Takes the trial in the learned store, where fewer than the profile's `fasterTrials` of its
/// shape are taken (by any replica); `false` where the last was taken first. Without a store,
/// the trial is the decision's alone.
async fn take_trial(ctx: &Context, trial: &TrialTake) -> Result<bool, Error> {
    let Some(store) = ctx.view.learned.as_ref() else {
        return Ok(true);
    };
    store
        .take_trial(
            ctx.client.clone(),
            trial.reservation.clone(),
            trial.bound,
            trial.namespace.as_deref(),
        )
        .await
        .map_err(kube_err("taking a trial in the learned ConfigMap"))
}

/// Writes `spec.offload` before any pod can exist (server-side apply, the operator's field
/// manager); the generation the write produced (the status records it), or why the API server
/// refused it for good (an admission denial, an invalid object: the same write would be
/// refused again).
async fn write_spec(
    ctx: &Context,
    tj: &TrainingJob,
    patch: &serde_json::Value,
) -> Result<Result<Option<i64>, String>, Error> {
    match api(ctx, tj)
        .patch(
            &tj.name_any(),
            &PatchParams::apply(names::OPERATOR_MANAGER).force(),
            &Patch::Apply(patch),
        )
        .await
    {
        Ok(patched) => Ok(Ok(patched.metadata.generation)),
        Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 422) => {
            Ok(Err(offload_api::text::bounded_to(&e.message, 1024)))
        }
        Err(e) => Err(kube_err("patching spec.offload")(e)),
    }
}

/// Applies what following the workload changes: a restored decision, a recovery from
/// out-of-memory, the lessons, the job's gauge, the workload part of the status and its Events.
async fn follow(ctx: &Context, tj: &TrainingJob, f: Following) -> Result<Action, Error> {
    let name = tj.name_any();
    let api = api(ctx, tj);
    let labels = job_labels(tj);
    ctx.metrics.set_held(&labels, None);
    if let Some(restored) = &f.restore {
        status::write_decision(&api, &name, restored).await?;
        tracing::info!(job = %name, "decision restored from the workload Job's record");
    }
    record(ctx.view.learned.as_ref(), f.lessons);
    if let Some(recovery) = f.recovery {
        if recovery.exhausted {
            ctx.metrics.set_recovery_exhausted(&labels);
        }
        status::write_memory(&api, &name, &recovery.failures, &recovery.condition).await?;
        announce_all(ctx, tj, &f.events).await;
        if let Some(recreating) = &recovery.replace {
            status::write_workload(&api, &name, recreating).await?;
            delete_workload(ctx, tj).await?;
        }
        return Ok(Action::await_change());
    }
    if let Some((busy, flagged)) = f.gauge {
        ctx.metrics.set_job(&labels, busy, flagged);
    }
    if let Some(part) = &f.status {
        status::write_workload(&api, &name, part).await?;
        announce_all(ctx, tj, &f.events).await;
    }
    Ok(f.next.unwrap_or_else(Action::await_change))
}

/// Deletes the workload Job, its pods first; one already gone is gone.
async fn delete_workload(ctx: &Context, tj: &TrainingJob) -> Result<(), Error> {
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &tj.namespace().unwrap_or_default());
    match jobs
        .delete(&tj.name_any(), &DeleteParams::foreground())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(kube_err("deleting the workload Job that ran out of memory")(e)),
    }
}

/// Records the lessons in the learned store (used by decisions at once, written with the
/// store's next batch); without a store, nothing is learned.
pub(super) fn record(store: Option<&LearnedStore>, lessons: Vec<Learned>) {
    let Some(store) = store else {
        return;
    };
    for l in lessons {
        let who = l.run.job.clone();
        match store.record(&l.profile, l.class, &l.shape, &l.described, l.run) {
            Ok(true) => {
                tracing::info!(job = %who, class = %l.class, lesson = %l.sentence, "learned")
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(job = %who, error = %e, "lesson refused"),
        }
    }
}

async fn announce(ctx: &Context, tj: &TrainingJob, a: &Announce) {
    publish(ctx, tj, a.type_, &a.reason, &a.note).await;
}

async fn announce_all(ctx: &Context, tj: &TrainingJob, events: &[Announce]) {
    for a in events {
        announce(ctx, tj, a).await;
    }
}
