//! TrainingJob reconcile: validate → decide → patch → build → apply → status. This module
//! decides; [`apply`] writes the workload and the status, [`follow`] keeps the status in step
//! with a running workload, [`triggers`] maps changes of other objects to the jobs they concern.

mod apply;
mod follow;
mod triggers;

use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use kube::core::DeserializeGuard;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::conditions::{self, OFFLOAD_RESOLVED};
use super::workload::{build_workload, decision_status};
use super::{Context, Error, kube_err};
use crate::api::{ConfigMapKeyRef, JobPhase, TrainingJob, TrainingJobStatus};
use crate::decision::{
    AdmittedRequest, JobRequest, ProfileNotFound, Resolution, ResolveError, opted_in,
    requested_profile, resolve_offload, select_profile,
};
use crate::metrics::DecisionLabels;
use crate::names;
use crate::render::{self, deepspeed};

use apply::{
    apply_workload, class_label, existing_conditions, mode_label, publish, publish_to,
    record_unresolved,
};
use follow::follow_workload;
pub use follow::{guard_outcome, slim_workload};
pub use triggers::{jobs_for_config_map, jobs_for_node, jobs_for_observation, jobs_for_profile};

/// Why a job has no decision yet; each carries the condition reason and message.
#[derive(Debug)]
pub enum Unresolved {
    /// The decision refused the request.
    Decision(ResolveError),
    /// The named profile does not exist.
    ProfileNotFound(ProfileNotFound),
    /// The user's DeepSpeed config cannot be read or used.
    Config(String),
}

impl Unresolved {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Unresolved::Decision(e) => e.category(),
            Unresolved::ProfileNotFound(_) => "ProfileNotFound",
            Unresolved::Config(_) => "InvalidDeepSpeedConfig",
        }
    }

    /// The condition message: what is wrong and what to change.
    pub fn message(&self) -> String {
        match self {
            Unresolved::Decision(e) => e.to_string(),
            Unresolved::ProfileNotFound(e) => e.to_string(),
            Unresolved::Config(msg) => msg.clone(),
        }
    }
}

/// Reconciles one TrainingJob; one that does not deserialize is reported and skipped.
pub async fn reconcile(
    guard: Arc<DeserializeGuard<TrainingJob>>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let _timer = ctx.metrics.reconcile_timer("TrainingJob");
    match &guard.0 {
        Ok(tj) => reconcile_job(tj, &ctx).await,
        Err(invalid) => {
            report_invalid(&ctx, invalid).await;
            Ok(Action::await_change())
        }
    }
}

async fn report_invalid(ctx: &Context, invalid: &kube::core::error_boundary::InvalidObject) {
    let meta = &invalid.metadata;
    tracing::warn!(
        namespace = meta.namespace.as_deref().unwrap_or_default(),
        name = meta.name.as_deref().unwrap_or_default(),
        error = %invalid.error,
        "skipping a TrainingJob that does not deserialize"
    );
    ctx.metrics
        .reconcile_errors
        .get_or_create(&crate::metrics::ErrorLabels {
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
        reason: "InvalidObject".to_string(),
        note: Some(format!(
            "the operator cannot read this TrainingJob and skips it: {}",
            invalid.error
        )),
        action: "Reconcile".to_string(),
        secondary: None,
    };
    publish_to(ctx, &reference, event).await;
}

/// Reconciles one TrainingJob as given (which may be a stale copy: every write is safe for that).
pub async fn reconcile_job(tj: &TrainingJob, ctx: &Context) -> Result<Action, Error> {
    let (Some(ns), name) = (tj.namespace(), tj.name_any()) else {
        return Ok(Action::await_change());
    };
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);

    // Frozen once the workload exists: only phase and the workload reference follow it. A
    // Job in the cache exists (its deletion would have removed it); one not there yet may have
    // just been created, so absence is asked of the API server, never taken from the cache.
    let cached = ctx
        .workloads
        .as_ref()
        .and_then(|w| w.get(&kube::runtime::reflector::ObjectRef::new(&name).within(&ns)));
    let existing = match cached {
        Some(job) => Some((*job).clone()),
        None => jobs
            .get_opt(&name)
            .await
            .map_err(kube_err("reading the workload Job"))?,
    };
    if let Some(job) = existing {
        return follow_workload(tj, ctx, &job).await;
    }

    if !opted_in(tj) {
        return run_without_offload(tj, ctx).await;
    }

    let (res, user_config) = match decide(tj, ctx).await? {
        Ok(pair) => pair,
        Err(why) => {
            record_unresolved(tj, ctx, &why).await?;
            return Ok(Action::await_change());
        }
    };
    let built = match build_workload(tj, Some(&res), user_config.as_ref(), &ctx.render) {
        Ok(w) => w,
        Err(e) => {
            record_unresolved(tj, ctx, &Unresolved::Config(e.to_string())).await?;
            return Ok(Action::await_change());
        }
    };

    // Patch the concrete values into spec.offload before any pod can exist (server-side
    // apply, our field manager). The write moves the generation on: the status records the
    // generation it produced.
    let api: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), &ns);
    let mut generation = tj.metadata.generation;
    let concrete = res.concrete_spec();
    if tj.spec.offload != concrete {
        let patch = json!({
            "apiVersion": TrainingJob::api_version(&()),
            "kind": TrainingJob::kind(&()),
            "spec": {"offload": concrete},
        });
        let patched = api
            .patch(
                &name,
                &PatchParams::apply(names::OPERATOR_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(kube_err("patching spec.offload"))?;
        generation = patched.metadata.generation;
    }

    let existing = existing_conditions(tj);
    let resolved = conditions::condition(
        &existing,
        OFFLOAD_RESOLVED,
        true,
        "Resolved",
        res.summary(),
        generation,
    );
    let first_resolution = !conditions::unchanged(&existing, &resolved);
    ctx.metrics
        .decisions
        .get_or_create(&DecisionLabels {
            mode: mode_label(res.mode),
            node_class: class_label(res.node_class),
        })
        .inc();

    let mut status = TrainingJobStatus {
        phase: Some(JobPhase::Pending),
        offload: Some(decision_status(&res)),
        workload: None,
        observed_generation: generation,
        observed: None,
        conditions: existing,
    };
    conditions::set(&mut status.conditions, resolved);
    if let Some(action) = apply_workload(tj, ctx, &built, &mut status).await? {
        // Resolved, but the workload could not be created: say what was decided (the
        // failure has its own Event). When it is created, its one Event says both.
        if first_resolution {
            publish(
                ctx,
                tj,
                EventType::Normal,
                "OffloadResolved",
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
        "WorkloadCreated",
        &format!("created Job {name} with {}", render::resolved_summary(&res)),
    )
    .await;
    Ok(Action::await_change())
}

/// A TrainingJob that opted out of offload configuration (no profile annotation, no offload
/// field): it is still our kind, so it runs, without offload settings, and its status says so.
async fn run_without_offload(tj: &TrainingJob, ctx: &Context) -> Result<Action, Error> {
    let built = match build_workload(tj, None, None, &ctx.render) {
        Ok(w) => w,
        Err(e) => {
            record_unresolved(tj, ctx, &Unresolved::Config(e.to_string())).await?;
            return Ok(Action::await_change());
        }
    };
    let existing = existing_conditions(tj);
    let not_requested = conditions::condition(
        &existing,
        OFFLOAD_RESOLVED,
        false,
        "NotRequested",
        format!(
            "the job names no OffloadProfile (annotation {}) and sets no spec.offload field, so it runs without offload configuration",
            names::PROFILE_ANNOTATION
        ),
        tj.metadata.generation,
    );
    let mut status = TrainingJobStatus {
        phase: Some(JobPhase::Pending),
        offload: None,
        workload: None,
        observed_generation: tj.metadata.generation,
        observed: None,
        conditions: existing,
    };
    conditions::set(&mut status.conditions, not_requested);
    if let Some(action) = apply_workload(tj, ctx, &built, &mut status).await? {
        return Ok(action);
    }
    publish(
        ctx,
        tj,
        EventType::Normal,
        "WorkloadCreated",
        &format!(
            "created Job {} without offload configuration (none requested)",
            tj.name_any()
        ),
    )
    .await;
    Ok(Action::await_change())
}

/// A decision, or why there is none; with the user's parsed DeepSpeed config.
pub type Decided = Result<(Resolution, Option<Value>), Unresolved>;

/// Resolves the job against the current profiles and nodes.
async fn decide(tj: &TrainingJob, ctx: &Context) -> Result<Decided, Error> {
    let config = read_deepspeed_config(tj, ctx).await?;
    Ok(decide_with(
        tj,
        |name| ctx.profile(name).map(|p| p.spec.clone()),
        config,
        &ctx.nodes(),
    ))
}

/// The decision on given inputs, without the API: the controller's path and
/// `offload-operator explain`'s. `config` is the user's DeepSpeed config as read (or why it
/// could not be), `None` when the job references none.
pub fn decide_with(
    tj: &TrainingJob,
    profiles: impl Fn(&str) -> Option<crate::api::OffloadProfileSpec>,
    config: Result<(Option<Value>, Option<u8>), String>,
    nodes: &crate::index::NodeIndex,
) -> Decided {
    let profile = match select_profile(requested_profile(tj), profiles) {
        Ok(p) => p,
        Err(missing) => return Err(Unresolved::ProfileNotFound(missing)),
    };
    let (user_config, stage) = config.map_err(Unresolved::Config)?;
    let gpus = render::gpus_per_pod(tj.spec.template.spec.as_ref());
    let mut request = JobRequest::from_training_job(&tj.spec, gpus, stage);
    request.deepspeed.zenflow_in_config = user_config
        .as_ref()
        .is_some_and(|c| c.pointer("/zero_optimization/zenflow").is_some());
    // Where the webhook resolved `Auto` at creation and the spec still holds what it wrote,
    // decide (and explain) from what the user asked for; once the user edits spec.offload,
    // the spec is the request.
    if let Some(asked) = AdmittedRequest::original(tj) {
        request.offload = asked;
    }
    resolve_offload(&request, &profile.name, &profile.spec, nodes)
        .map(|res| (res, user_config))
        .map_err(Unresolved::Decision)
}

/// A DeepSpeed config's text as the controller reads it: parsed, with its ZeRO stage, or what is
/// wrong with it (`source` names where it came from, for the message).
pub fn parse_user_config(text: &str, source: &str) -> Result<(Option<Value>, Option<u8>), String> {
    let parsed = deepspeed::parse_config(text).map_err(|e| format!("{source}: {e}"))?;
    let stage = deepspeed::stage_of(&parsed).ok().flatten();
    Ok((Some(parsed), stage))
}

/// Reads the user's DeepSpeed ConfigMap, if referenced: the parsed JSON and its ZeRO stage, or
/// a message saying what is wrong with it.
async fn read_deepspeed_config(
    tj: &TrainingJob,
    ctx: &Context,
) -> Result<Result<(Option<Value>, Option<u8>), String>, Error> {
    let Some(ConfigMapKeyRef { name, key }) = tj
        .spec
        .deepspeed
        .as_ref()
        .and_then(|d| d.config_map_ref.clone())
    else {
        return Ok(Ok((None, None)));
    };
    let key = key.unwrap_or_else(|| deepspeed::CONFIG_FILE_NAME.to_string());
    let ns = tj.namespace().unwrap_or_default();
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(cm) = cms
        .get_opt(&name)
        .await
        .map_err(kube_err("reading the DeepSpeed ConfigMap"))?
    else {
        return Ok(Err(format!(
            "ConfigMap {name:?} (spec.deepspeed.configMapRef) does not exist in namespace {ns:?}"
        )));
    };
    let Some(text) = cm.data.as_ref().and_then(|d| d.get(&key)) else {
        return Ok(Err(format!(
            "ConfigMap {name:?} has no key {key:?} (spec.deepspeed.configMapRef.key)"
        )));
    };
    Ok(parse_user_config(
        text,
        &format!("ConfigMap {name:?} key {key:?}"),
    ))
}
