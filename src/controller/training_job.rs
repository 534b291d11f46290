//! TrainingJob reconcile: validate → decide → patch → build → apply → status.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use kube::api::{Api, Patch, PatchParams};
use kube::core::{DeserializeGuard, PartialObjectMeta};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::conditions::{self, OFFLOAD_RESOLVED, WORKLOAD_CREATED};
use super::workload::{self, build_workload};
use super::{Context, Error, builtin_default_profile, kube_err};
use crate::api::{
    ConfigMapKeyRef, JobPhase, ModeSetting, OffloadDecisionStatus, OverlapSetting, RatioSetting,
    Switch, TrainingJob, TrainingJobStatus, WorkloadRef,
};
use crate::decision::{JobRequest, Resolution, ResolveError, resolve_offload};
use crate::metrics::DecisionLabels;
use crate::names;
use crate::render::{self, deepspeed};

/// Whether a job opted in: it names a profile, or sets any offload field explicitly.
pub fn opted_in(tj: &TrainingJob) -> bool {
    tj.annotations().contains_key(names::PROFILE_ANNOTATION) || explicit_offload(tj)
}

fn explicit_offload(tj: &TrainingJob) -> bool {
    let o = &tj.spec.offload;
    o.mode != ModeSetting::Auto
        || o.overlap != OverlapSetting::Auto
        || o.offload_ratio != RatioSetting::Auto
        || o.pin_memory != Switch::Auto
}

/// The profile a job names (`auto` → `default`); `default` for jobs that opted in through an
/// explicit `spec.offload` alone.
pub fn profile_name_for(tj: &TrainingJob) -> String {
    match tj
        .annotations()
        .get(names::PROFILE_ANNOTATION)
        .map(String::as_str)
    {
        Some(names::PROFILE_AUTO) | None => names::DEFAULT_PROFILE.to_string(),
        Some(name) => name.to_string(),
    }
}

/// Whether the job still waits for a decision (no workload yet).
fn unresolved(tj: &TrainingJob) -> bool {
    tj.status
        .as_ref()
        .and_then(|s| s.workload.as_ref())
        .is_none()
}

/// The jobs in the store that deserialized.
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

/// Why a job has no decision yet; each carries the condition reason and message.
enum Unresolved {
    Decision(ResolveError),
    ProfileNotFound(String),
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
            Unresolved::ProfileNotFound(name) => format!(
                "OffloadProfile {name:?} does not exist: create it or change the offload.dev/profile annotation"
            ),
            Unresolved::Config(msg) => msg.clone(),
        }
    }

    /// Config problems are retried on a timer (ConfigMaps are not watched); the rest are
    /// re-triggered by profile and node changes or by the job itself.
    fn retry(&self) -> Action {
        match self {
            Unresolved::Config(_) => Action::requeue(Duration::from_secs(30)),
            _ => Action::await_change(),
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
        note: Some(
            format!(
                "the operator cannot read this TrainingJob and skips it: {}",
                invalid.error
            )
            .chars()
            .take(1000)
            .collect(),
        ),
        action: "Reconcile".to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &reference).await {
        tracing::warn!(error = %e, "could not publish an Event");
    }
}

async fn reconcile_job(tj: &TrainingJob, ctx: &Context) -> Result<Action, Error> {
    if !opted_in(tj) {
        // Not ours to touch.
        return Ok(Action::await_change());
    }
    let (Some(ns), name) = (tj.namespace(), tj.name_any()) else {
        return Ok(Action::await_change());
    };
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);

    // Frozen once the workload exists: only phase and the workload reference follow it.
    if let Some(job) = jobs
        .get_opt(&name)
        .await
        .map_err(kube_err("reading the workload Job"))?
    {
        return follow_workload(tj, ctx, &job).await;
    }

    let outcome = decide(tj, ctx).await?;
    let (res, user_config) = match outcome {
        Ok(pair) => pair,
        Err(why) => {
            record_unresolved(tj, ctx, &why).await?;
            return Ok(why.retry());
        }
    };
    let built = match build_workload(tj, &res, user_config.as_ref()) {
        Ok(w) => w,
        Err(e) => {
            let why = Unresolved::Config(e.to_string());
            record_unresolved(tj, ctx, &why).await?;
            return Ok(why.retry());
        }
    };

    // Patch the concrete values into spec.offload (server-side apply, our field manager).
    let api: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), &ns);
    let params = PatchParams::apply(names::OPERATOR_MANAGER).force();
    let concrete = res.concrete_spec();
    if tj.spec.offload != concrete {
        let patch = json!({
            "apiVersion": TrainingJob::api_version(&()),
            "kind": TrainingJob::kind(&()),
            "spec": {"offload": concrete},
        });
        api.patch(&name, &params, &Patch::Apply(&patch))
            .await
            .map_err(kube_err("patching spec.offload"))?;
    }

    // The decision is in spec.offload already (patched above, before any pod can exist); the
    // status with its reasons is written once, together with the workload reference.
    let existing = existing_conditions(tj);
    let generation = tj.metadata.generation;
    let resolved = conditions::condition(
        &existing,
        OFFLOAD_RESOLVED,
        true,
        "Resolved",
        res.summary(),
        generation,
    );
    let first_resolution = !conditions::unchanged(&existing, &resolved);
    let mut status = TrainingJobStatus {
        phase: Some(JobPhase::Pending),
        offload: Some(decision_status(&res)),
        workload: None,
        observed_generation: generation,
        conditions: existing,
    };
    conditions::set(&mut status.conditions, resolved);
    ctx.metrics
        .decisions
        .get_or_create(&DecisionLabels {
            mode: mode_label(&res),
            node_class: class_label(&res),
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

    // Create the workload: deterministic names and server-side apply, so a retry or a restart
    // mid-way converges on exactly one of each.
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
    apply(&jobs, &built.job, "applying the workload Job").await?;

    status.workload = Some(WorkloadRef {
        job: name.clone(),
        service: name.clone(),
        config_map: built
            .config_map
            .as_ref()
            .and_then(|c| c.metadata.name.clone()),
    });
    let created = workload_created(&status.conditions, &name, generation);
    conditions::set(&mut status.conditions, created);
    apply_status(&api, &name, &status).await?;
    publish(
        ctx,
        tj,
        EventType::Normal,
        "WorkloadCreated",
        &format!(
            "created Job {name} with {}",
            workload::resolved_summary(&res)
        ),
    )
    .await;
    Ok(Action::await_change())
}

type Decided = Result<(Resolution, Option<Value>), Unresolved>;

/// Resolves the job against the current profiles and nodes.
async fn decide(tj: &TrainingJob, ctx: &Context) -> Result<Decided, Error> {
    let profile_name = profile_name_for(tj);
    let profile = match ctx.profile(&profile_name) {
        Some(p) => p.spec.clone(),
        // A job that only set spec.offload, with no `default` profile: built-in defaults.
        None if !tj.annotations().contains_key(names::PROFILE_ANNOTATION) => {
            builtin_default_profile()
        }
        None => return Ok(Err(Unresolved::ProfileNotFound(profile_name))),
    };
    let (user_config, stage) = match read_deepspeed_config(tj, ctx).await? {
        Ok(pair) => pair,
        Err(msg) => return Ok(Err(Unresolved::Config(msg))),
    };
    let nodes = ctx.node_infos();
    let gpus = render::gpus_per_pod(tj.spec.template.spec.as_ref());
    let mut request = JobRequest::from_training_job(&tj.spec, gpus, stage);
    // Where the webhook resolved `Auto` at creation, decide (and explain) from what the user
    // asked for; the result is the same, the reasons say why.
    if let Some(requested) = tj
        .annotations()
        .get(names::ANNOTATION_REQUESTED)
        .and_then(|json| serde_json::from_str::<crate::api::OffloadSpec>(json).ok())
    {
        request.offload = requested;
    }
    Ok(resolve_offload(&request, &profile_name, &profile, &nodes)
        .map(|res| (res, user_config))
        .map_err(Unresolved::Decision))
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
            "ConfigMap {name:?} (deepspeed.configMapRef) does not exist in namespace {ns:?}"
        )));
    };
    let Some(text) = cm.data.as_ref().and_then(|d| d.get(&key)) else {
        return Ok(Err(format!(
            "ConfigMap {name:?} has no key {key:?} (deepspeed.configMapRef.key)"
        )));
    };
    let parsed = match deepspeed::parse_config(text) {
        Ok(v) => v,
        Err(e) => return Ok(Err(format!("ConfigMap {name:?} key {key:?}: {e}"))),
    };
    let stage = deepspeed::stage_of(&parsed).ok().flatten();
    Ok(Ok((Some(parsed), stage)))
}

/// Keeps phase and the workload reference in step with the Job; never touches the config.
async fn follow_workload(tj: &TrainingJob, ctx: &Context, job: &Job) -> Result<Action, Error> {
    let name = tj.name_any();
    let owned = job
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == tj.metadata.uid.as_ref());
    let api: Api<TrainingJob> =
        Api::namespaced(ctx.client.clone(), &tj.namespace().unwrap_or_default());
    let mut status = tj.status.clone().unwrap_or_default();
    let generation = tj.metadata.generation;
    if !owned {
        let cond = conditions::condition(
            &status.conditions,
            WORKLOAD_CREATED,
            false,
            "NameConflict",
            format!(
                "a Job named {name} exists and is not owned by this TrainingJob: delete it or rename the TrainingJob"
            ),
            generation,
        );
        if !conditions::unchanged(&status.conditions, &cond) {
            conditions::set(&mut status.conditions, cond);
            apply_status(&api, &name, &status).await?;
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
        config_map: status
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
    let created = workload_created(&status.conditions, &name, generation);
    if status.phase == Some(phase)
        && status.workload.as_ref() == Some(&workload)
        && conditions::unchanged(&status.conditions, &created)
    {
        return Ok(Action::await_change());
    }
    status.phase = Some(phase);
    status.workload = Some(workload);
    conditions::set(&mut status.conditions, created);
    apply_status(&api, &name, &status).await?;
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
    let mut status = tj.status.clone().unwrap_or_default();
    let cond = conditions::condition(
        &status.conditions,
        OFFLOAD_RESOLVED,
        false,
        why.reason(),
        why.message(),
        tj.metadata.generation,
    );
    if conditions::unchanged(&status.conditions, &cond) && status.phase == Some(JobPhase::Pending) {
        return Ok(());
    }
    conditions::set(&mut status.conditions, cond);
    status.phase = Some(JobPhase::Pending);
    status.offload = None;
    status.observed_generation = tj.metadata.generation;
    apply_status(&api, &name, &status).await?;
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
fn workload_created(
    existing: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    name: &str,
    generation: Option<i64>,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    conditions::condition(
        existing,
        WORKLOAD_CREATED,
        true,
        "Created",
        format!("created Job {name} and Service {name}"),
        generation,
    )
}

fn existing_conditions(
    tj: &TrainingJob,
) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
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
            .map(|r| crate::api::DecisionReason {
                field: r.field.as_str().to_string(),
                message: r.message.clone(),
            })
            .collect(),
    }
}

fn mode_label(res: &Resolution) -> &'static str {
    match res.mode {
        crate::api::OffloadMode::UnifiedMemory => "UnifiedMemory",
        crate::api::OffloadMode::CpuCopy => "CPUCopy",
        crate::api::OffloadMode::Disabled => "Disabled",
    }
}

fn class_label(res: &Resolution) -> &'static str {
    match res.node_class {
        Some(crate::api::NodeClass::Coherent) => "Coherent",
        Some(crate::api::NodeClass::Discrete) => "Discrete",
        None => "none",
    }
}

async fn apply_status(
    api: &Api<TrainingJob>,
    name: &str,
    status: &TrainingJobStatus,
) -> Result<(), Error> {
    let patch = json!({
        "apiVersion": TrainingJob::api_version(&()),
        "kind": TrainingJob::kind(&()),
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(names::OPERATOR_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(kube_err("writing TrainingJob status"))?;
    Ok(())
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
    // Event notes are capped at 1 kB by the API server.
    let note: String = note.chars().take(1000).collect();
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: "Reconcile".to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &tj.object_ref(&())).await {
        tracing::warn!(error = %e, "could not publish an Event");
    }
}
