//! The planner: what one reconcile of a TrainingJob changes, as data, from its
//! [`Snapshot`] and the cluster's view alone — no API call, no clock but the snapshot's. The
//! writer ([`super::write`]) applies a plan; everything the reconcile decides is here and in the
//! pure functions it calls ([`super::follow`] for a workload that exists,
//! [`super::recovery`] for a pod out of memory).

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::planned::{Announce, Creation, Held, Plan, Tracing, TrialTake, existing_conditions};
use super::sizing::{Step, WithTrace};
use super::snapshot::Snapshot;
use crate::controller::conditions::Reason;
use crate::controller::status;
use crate::decision::runs::learned::Reservation;
use crate::decision::{ClusterView, Resolution, Unresolved, decide, opted_in};
use crate::render::workload::{build_workload, pin_claims};
use crate::render::{RenderOptions, resolved_summary};
use offload_api::names;
use offload_api::v1alpha1::{LearningScope, TrainingJob};

/// What one reconcile changes, from `snap` and `view` (the cluster's view: nodes, profiles,
/// what was learned, kept traces).
pub(crate) fn plan(snap: &Snapshot, view: &dyn ClusterView, render: &RenderOptions) -> Plan {
    if snap.workload.is_some() {
        return Plan::Follow(Box::new(super::follow::plan_follow(snap, view)));
    }
    let tj = &snap.job;
    if !opted_in(tj) {
        return without_offload(tj, render);
    }
    let Some(configs) = snap.configs.as_ref() else {
        return Plan::Wait(Action::await_change());
    };
    let traced = match &snap.trace {
        Step::Decide(traced) => traced.as_ref(),
        Step::Wait => return Plan::Wait(Action::requeue(Step::POLL)),
        Step::Started {
            job,
            image,
            step,
            timeout,
        } => return tracing(tj, job, image, step, *timeout),
    };
    let with_trace = traced.map(|traced| WithTrace { view, traced });
    let view: &dyn ClusterView = match &with_trace {
        Some(v) => v,
        None => view,
    };
    match decide(tj, configs.deepspeed(), configs.model(), view) {
        Ok(res) => create(tj, res, configs, view, render, snap.now),
        Err(why) => hold(tj, &why),
    }
}

/// The job held with `why`.
pub(crate) fn hold(tj: &TrainingJob, why: &Unresolved) -> Plan {
    Plan::Hold(held(tj, why))
}

/// What holding the job with `why` writes.
pub(crate) fn held(tj: &TrainingJob, why: &Unresolved) -> Held {
    let current = tj.status.clone().unwrap_or_default();
    Held {
        reason: why.reason(),
        message: why.message(),
        status: status::held(
            &current,
            Reason::Held(why.reason()),
            why.message(),
            tj.metadata.generation,
        ),
    }
}

/// A job whose sizer just started: it waits, and says for what.
fn tracing(tj: &TrainingJob, job: &str, image: &str, step: &str, timeout: u64) -> Plan {
    let current = tj.status.clone().unwrap_or_default();
    let message = format!(
        "waiting for the sizer to trace the model's step ({step}) in Job {job}: the workload is created once it has, or after {timeout} s with the counted model"
    );
    Plan::Tracing(Tracing {
        status: status::held(&current, Reason::Tracing, message, tj.metadata.generation),
        announce: Announce::new(
            EventType::Normal,
            names::EVENT_TRACING,
            format!(
                "tracing the model's step ({step}) with the sizer in Job {job} from {image}: the workload is created once it has, within {timeout} s"
            ),
        ),
    })
}

/// A decided job's creation: the spec it writes, the trial it takes, its workload.
fn create(
    tj: &TrainingJob,
    res: Resolution,
    configs: &super::snapshot::Configs,
    view: &dyn ClusterView,
    render: &RenderOptions,
    now: jiff::Timestamp,
) -> Plan {
    let ns = tj.namespace().unwrap_or_default();
    let user_config = configs
        .deepspeed
        .as_ref()
        .ok()
        .and_then(Option::as_ref)
        .map(|c| &c.json);
    let built = build_workload(tj, Some(&res), user_config, render).and_then(|mut w| {
        pin_claims(&mut w, tj, &res, &|name| view.claim_template(&ns, name))?;
        Ok(w)
    });
    let workload = match built {
        Ok(w) => w,
        Err(e) => return not_mergeable(tj, &e),
    };
    let spec = match spec_write(tj, &res) {
        Ok(spec) => spec,
        Err(e) => return not_mergeable(tj, &e),
    };
    let trial = reservation(tj, &res, view, now);
    let created = format!(
        "created Job {} with {}",
        tj.name_any(),
        resolved_summary(&res)
    );
    Plan::Create(Box::new(Creation {
        resolution: Some(res),
        trial,
        spec,
        workload,
        existing: existing_conditions(tj),
        created,
    }))
}

/// A job that opted out of offload configuration: it is still our kind, so it runs, without
/// offload settings, and its status says so.
fn without_offload(tj: &TrainingJob, render: &RenderOptions) -> Plan {
    if let Err(e) = crate::decision::check_training_job(tj) {
        return hold(tj, &Unresolved::Decision(e));
    }
    match build_workload(tj, None, None, render) {
        Ok(workload) => Plan::Create(Box::new(Creation {
            resolution: None,
            trial: None,
            spec: None,
            workload,
            existing: existing_conditions(tj),
            created: format!(
                "created Job {} without offload configuration (none requested)",
                tj.name_any()
            ),
        })),
        Err(e) => not_mergeable(tj, &e),
    }
}

/// Held: the workload cannot be built from the job and its configs.
fn not_mergeable(tj: &TrainingJob, e: &dyn std::fmt::Display) -> Plan {
    hold(
        tj,
        &Unresolved::Config(crate::decision::ConfigError::NotMergeable(e.to_string())),
    )
}

/// The server-side apply of `spec.offload` where it changes, with the request it was decided
/// from: the next decision (after an out-of-memory) is made from what the user asked, never
/// from what was written here.
fn spec_write(
    tj: &TrainingJob,
    res: &Resolution,
) -> Result<Option<serde_json::Value>, serde_json::Error> {
    let concrete = res.concrete_spec();
    if tj.spec.offload == concrete {
        return Ok(None);
    }
    let record = crate::decision::AdmittedRequest {
        requested: res.requested.clone(),
        wrote: concrete.clone(),
    };
    let requested = record.annotation()?;
    Ok(Some(serde_json::json!({
        "apiVersion": <TrainingJob as kube::Resource>::api_version(&()),
        "kind": <TrainingJob as kube::Resource>::kind(&()),
        "metadata": {"annotations": {names::ANNOTATION_REQUESTED: requested}},
        "spec": {"offload": concrete},
    })))
}

/// The trial `res` takes, as the learned store records it; `None` where `res` is no trial or
/// its profile, class or shape is not known.
fn reservation(
    tj: &TrainingJob,
    res: &Resolution,
    view: &dyn ClusterView,
    now: jiff::Timestamp,
) -> Option<TrialTake> {
    res.trial.as_ref()?;
    let profile = view.profile(&res.profile)?;
    let namespace = match profile.learning_scope {
        LearningScope::Namespace => Some(tj.namespace().unwrap_or_default()),
        LearningScope::Cluster => None,
    };
    Some(TrialTake {
        reservation: Reservation {
            profile: res.profile.clone(),
            class: res.node_class?,
            shape: res.memory.as_ref()?.shape.clone(),
            job: crate::decision::run_id(tj),
            at: now.to_string(),
        },
        namespace,
        bound: profile.faster_trials,
    })
}

#[cfg(test)]
#[path = "plan/tests.rs"]
mod tests;
