//! TrainingJob reconcile: validate → decide → patch → build → apply → status.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use kube::core::{DeserializeGuard, PartialObjectMeta};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::conditions::{self, OFFLOAD_RESOLVED, WORKLOAD_CREATED};
use super::status;
use super::workload::{Workload, build_workload};
use super::{Context, Error, kube_err};
use crate::api::{
    ConfigMapKeyRef, DecisionReason, JobPhase, NodeClass, OffloadDecisionStatus, OffloadMode,
    TrainingJob, TrainingJobStatus, WorkloadRef,
};
use crate::decision::{
    AdmittedRequest, JobRequest, ProfileNotFound, Resolution, ResolveError, opted_in,
    profile_name_for, requested_profile, resolve_offload, select_profile,
};
use crate::metrics::DecisionLabels;
use crate::names;
use crate::render::{self, deepspeed};

/// Whether the job still waits for its workload.
fn unresolved(tj: &TrainingJob) -> bool {
    tj.status
        .as_ref()
        .and_then(|s| s.workload.as_ref())
        .is_none()
}

/// The jobs in the cache that deserialized.
fn valid_jobs(ctx: &Context) -> impl Iterator<Item = TrainingJob> {
    ctx.jobs
        .state()
        .into_iter()
        .filter_map(|g| g.0.as_ref().ok().cloned())
}

fn job_ref(tj: &TrainingJob) -> ObjectRef<DeserializeGuard<TrainingJob>> {
    ObjectRef::new(&tj.name_any()).within(&tj.namespace().unwrap_or_default())
}

/// Unresolved jobs that name a profile, for re-triggering when it changes.
pub fn jobs_for_profile(
    ctx: &Context,
    profile: &str,
) -> Vec<ObjectRef<DeserializeGuard<TrainingJob>>> {
    valid_jobs(ctx)
        .filter(|tj| opted_in(tj) && unresolved(tj) && profile_name_for(tj) == profile)
        .map(|tj| job_ref(&tj))
        .collect()
}

/// Unresolved jobs whose profile could use a node (its selector matches, or it has none, or the
/// profile does not exist yet), for re-triggering when the node's labels or report change.
pub fn jobs_for_node(
    ctx: &Context,
    node: &PartialObjectMeta<Node>,
) -> Vec<ObjectRef<DeserializeGuard<TrainingJob>>> {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    valid_jobs(ctx)
        .filter(|tj| opted_in(tj) && unresolved(tj))
        .filter(|tj| {
            let selector = ctx
                .profile(&profile_name_for(tj))
                .and_then(|p| p.spec.node_selector.clone());
            match selector.map(kube::core::Selector::try_from) {
                Some(Ok(sel)) => kube::core::SelectorExt::matches(&sel, &labels),
                _ => true,
            }
        })
        .map(|tj| job_ref(&tj))
        .collect()
}

/// Unresolved jobs in `namespace` whose DeepSpeed config is the ConfigMap `name`, for
/// re-triggering when the user fixes it.
pub fn jobs_for_config_map(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Vec<ObjectRef<DeserializeGuard<TrainingJob>>> {
    valid_jobs(ctx)
        .filter(|tj| tj.namespace().as_deref() == Some(namespace) && unresolved(tj))
        .filter(|tj| {
            tj.spec
                .deepspeed
                .as_ref()
                .and_then(|d| d.config_map_ref.as_ref())
                .is_some_and(|r| r.name == name)
        })
        .map(|tj| job_ref(&tj))
        .collect()
}

/// Why a job has no decision yet; each carries the condition reason and message.
enum Unresolved {
    Decision(ResolveError),
    ProfileNotFound(ProfileNotFound),
    Config(String),
}

impl Unresolved {
    fn reason(&self) -> &'static str {
        match self {
            Unresolved::Decision(e) => e.category(),
            Unresolved::ProfileNotFound(_) => "ProfileNotFound",
            Unresolved::Config(_) => "InvalidDeepSpeedConfig",
        }
    }

    fn message(&self) -> String {
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

    // Frozen once the workload exists (read from the API, never from the cache): only phase
    // and the workload reference follow it.
    if let Some(job) = jobs
        .get_opt(&name)
        .await
        .map_err(kube_err("reading the workload Job"))?
    {
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
    let built = match build_workload(tj, Some(&res), user_config.as_ref()) {
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

    let mut status = TrainingJobStatus {
        phase: Some(JobPhase::Pending),
        offload: Some(decision_status(&res)),
        workload: None,
        observed_generation: generation,
        conditions: existing,
    };
    conditions::set(&mut status.conditions, resolved);
    if let Some(action) = apply_workload(tj, ctx, &built, &mut status).await? {
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
    let built = match build_workload(tj, None, None) {
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

/// Whether an API error will repeat until something changes (the job, the cluster's limits,
/// RBAC), as opposed to a conflict, throttling or an outage that a retry fixes.
fn lasting(e: &kube::Error) -> Option<String> {
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
async fn apply_workload(
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
            apply(
                &Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns),
                cm,
                "applying the config ConfigMap",
            )
            .await?;
        }
        apply(
            &Api::<Service>::namespaced(ctx.client.clone(), &ns),
            &built.service,
            "applying the rendezvous Service",
        )
        .await?;
        apply(
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
        let failed = conditions::condition(
            &status.conditions,
            WORKLOAD_CREATED,
            false,
            "ApplyFailed",
            &message,
            status.observed_generation,
        );
        if !conditions::unchanged(&existing_conditions(tj), &failed) {
            conditions::set(&mut status.conditions, failed);
            status::apply_decision(&api, &name, status).await?;
            publish(ctx, tj, EventType::Warning, "ApplyFailed", &message).await;
        }
        // A change of the job re-triggers sooner; otherwise try again now and then (the cause
        // may be outside the job: RBAC, a quota, an admission policy).
        return Ok(Some(Action::requeue(Duration::from_secs(300))));
    }
    status.workload = Some(WorkloadRef {
        job: name.clone(),
        service: name.clone(),
        config_map: built
            .config_map
            .as_ref()
            .and_then(|c| c.metadata.name.clone()),
    });
    let created = workload_created(&status.conditions, &name, status.observed_generation);
    conditions::set(&mut status.conditions, created);
    status::apply_decision(&api, &name, status).await?;
    Ok(None)
}

type Decided = Result<(Resolution, Option<Value>), Unresolved>;

/// Resolves the job against the current profiles and nodes.
async fn decide(tj: &TrainingJob, ctx: &Context) -> Result<Decided, Error> {
    let profile = match select_profile(requested_profile(tj), |name| {
        ctx.profile(name).map(|p| p.spec.clone())
    }) {
        Ok(p) => p,
        Err(missing) => return Ok(Err(Unresolved::ProfileNotFound(missing))),
    };
    let (user_config, stage) = match read_deepspeed_config(tj, ctx).await? {
        Ok(pair) => pair,
        Err(msg) => return Ok(Err(Unresolved::Config(msg))),
    };
    let gpus = render::gpus_per_pod(tj.spec.template.spec.as_ref());
    let mut request = JobRequest::from_training_job(&tj.spec, gpus, stage);
    // Where the webhook resolved `Auto` at creation and the spec still holds what it wrote,
    // decide (and explain) from what the user asked for; once the user edits spec.offload,
    // the spec is the request.
    if let Some(asked) = AdmittedRequest::original(tj) {
        request.offload = asked;
    }
    Ok(
        resolve_offload(&request, &profile.name, &profile.spec, &ctx.nodes())
            .map(|res| (res, user_config))
            .map_err(Unresolved::Decision),
    )
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
    let parsed = match deepspeed::parse_config(text) {
        Ok(v) => v,
        Err(e) => return Ok(Err(format!("ConfigMap {name:?} key {key:?}: {e}"))),
    };
    let stage = deepspeed::stage_of(&parsed).ok().flatten();
    Ok(Ok((Some(parsed), stage)))
}

/// Keeps phase and the workload reference in step with the Job; never touches the decision.
async fn follow_workload(tj: &TrainingJob, ctx: &Context, job: &Job) -> Result<Action, Error> {
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
pub fn phase_of(job: &Job) -> JobPhase {
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

async fn record_unresolved(tj: &TrainingJob, ctx: &Context, why: &Unresolved) -> Result<(), Error> {
    let name = tj.name_any();
    let api: Api<TrainingJob> =
        Api::namespaced(ctx.client.clone(), &tj.namespace().unwrap_or_default());
    let current = tj.status.clone().unwrap_or_default();
    let generation = tj.metadata.generation;
    let cond = conditions::condition(
        &current.conditions,
        OFFLOAD_RESOLVED,
        false,
        why.reason(),
        why.message(),
        generation,
    );
    if conditions::unchanged(&current.conditions, &cond)
        && current.phase == Some(JobPhase::Pending)
        && current.observed_generation == generation
        && current.offload.is_none()
    {
        return Ok(());
    }
    // Only the decision part: no offload (it is not resolved), the held condition.
    let status = TrainingJobStatus {
        phase: Some(JobPhase::Pending),
        offload: None,
        workload: None,
        observed_generation: generation,
        conditions: vec![cond],
    };
    status::apply_decision(&api, &name, &status).await?;
    ctx.metrics
        .decisions
        .get_or_create(&DecisionLabels {
            mode: why.reason(),
            node_class: "none",
        })
        .inc();
    publish(ctx, tj, EventType::Warning, why.reason(), &why.message()).await;
    Ok(())
}

/// The `WorkloadCreated=True` condition, built the same way by creation and by follow-up.
fn workload_created(existing: &[Condition], name: &str, generation: Option<i64>) -> Condition {
    conditions::condition(
        existing,
        WORKLOAD_CREATED,
        true,
        "Created",
        format!("created Job {name} and Service {name}"),
        generation,
    )
}

fn existing_conditions(tj: &TrainingJob) -> Vec<Condition> {
    tj.status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default()
}

fn decision_status(res: &Resolution) -> OffloadDecisionStatus {
    OffloadDecisionStatus {
        mode: res.mode,
        overlap: res.overlap,
        offload_ratio: res.ratio,
        pin_memory: res.pin_memory,
        node_class: res.node_class,
        profile: res.profile.clone(),
        overlap_efficiency: res.overlap_efficiency,
        super_offload: res.super_offload(),
        reasons: res
            .reasons
            .iter()
            .map(|r| DecisionReason {
                field: r.field.as_str().to_string(),
                message: r.message.clone(),
            })
            .collect(),
    }
}

fn mode_label(mode: OffloadMode) -> &'static str {
    match mode {
        OffloadMode::UnifiedMemory => "UnifiedMemory",
        OffloadMode::CpuCopy => "CPUCopy",
        OffloadMode::Disabled => "Disabled",
    }
}

fn class_label(class: Option<NodeClass>) -> &'static str {
    match class {
        Some(NodeClass::Coherent) => "Coherent",
        Some(NodeClass::Discrete) => "Discrete",
        None => "none",
    }
}

async fn apply<K>(api: &Api<K>, obj: &K, action: &'static str) -> Result<(), Error>
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

async fn publish(ctx: &Context, tj: &TrainingJob, type_: EventType, reason: &str, note: &str) {
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note.to_string()),
        action: "Reconcile".to_string(),
        secondary: None,
    };
    publish_to(ctx, &tj.object_ref(&()), event).await;
}

async fn publish_to(
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
