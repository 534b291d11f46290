//! Every read of one reconcile, in one place: the job as it now is, its workload Job and pods,
//! what Kueue and the Job controller say of them, what the agents observed, the ConfigMaps the
//! job references and its model's trace. The planner ([`super::plan`]) decides from this alone.

use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;

use super::sizing;
use crate::controller::{Context, Error, kube_err, overlap_observed};
use crate::decision::referenced::{Fetched, Reference};
use crate::decision::{ConfigError, ModelConfigError, ModelShape, UserConfig, opted_in};
use offload_api::names;
use offload_api::v1alpha1::{JobPhase, ObservedOverlap, TrainingJob};

/// What one reconcile of a TrainingJob read.
pub(crate) struct Snapshot {
    /// The job: the copy the reconcile was given, or the API server's where that copy may
    /// predate a recorded failure.
    pub job: TrainingJob,
    /// Its workload Job, where one exists.
    pub workload: Option<Job>,
    /// The workload Job's pods (the controller's cache of them).
    pub pods: Vec<Arc<Pod>>,
    /// Kueue's latest word on why a queued workload waits.
    pub kueue_says: Option<String>,
    /// The Job controller's latest `FailedCreate` message, where fewer pods are alive than the
    /// Job wants and it is newer than the newest pod.
    pub refusal: Option<String>,
    /// What the agents observed of the job's pods in their latest windows.
    pub fresh: Option<ObservedOverlap>,
    /// The referenced DeepSpeed config and model `config.json`, where the reconcile may decide
    /// or learn: `None` where they were not needed.
    pub configs: Option<Configs>,
    /// The model's trace of its step, for a job still to be decided.
    pub trace: sizing::Step,
    /// When it was read.
    pub now: jiff::Timestamp,
}

/// The ConfigMaps a job references, each as it was read: the parsed content, nothing
/// referenced, or what is wrong with it.
pub(crate) struct Configs {
    /// The DeepSpeed config (`spec.deepspeed.configMapRef`).
    pub deepspeed: Result<Option<UserConfig>, ConfigError>,
    /// The model's `config.json` (`spec.model.configMapRef`).
    pub model: Result<Option<ModelShape>, ModelConfigError>,
}

impl Configs {
    /// The DeepSpeed config as the decision takes it.
    pub fn deepspeed(&self) -> Result<Option<&UserConfig>, &ConfigError> {
        self.deepspeed.as_ref().map(Option::as_ref)
    }

    /// The model's shape as the decision takes it.
    pub fn model(&self) -> Result<Option<&ModelShape>, &ModelConfigError> {
        self.model.as_ref().map(Option::as_ref)
    }
}

/// Reads what `tj`'s reconcile needs; `None` where the job is gone. For a job still to be
/// decided, observing its trace moves the sizer on by one step (the sizer's own Job and the
/// kept traces are the sizer's objects, [`crate::controller::sizer_jobs`]).
pub(crate) async fn observe(tj: &TrainingJob, ctx: &Context) -> Result<Option<Snapshot>, Error> {
    let (Some(ns), name) = (tj.namespace(), tj.name_any()) else {
        return Ok(None);
    };
    let now = jiff::Timestamp::now();
    if let Some(workload) = existing_workload(ctx, &ns, &name).await? {
        return observe_workload(tj.clone(), ctx, workload, now)
            .await
            .map(Some);
    }
    let Some(job) = latest_copy(tj, ctx, &ns, &name).await? else {
        return Ok(None);
    };
    let (configs, trace) = if opted_in(&job) {
        let configs = read_configs(&job, ctx).await?;
        // Boxed: the sizer's steps are a large future, and a reconcile's must fit a small stack.
        let trace = Box::pin(sizing::trace_step(
            &job,
            ctx,
            configs.deepspeed.as_ref().ok().and_then(Option::as_ref),
            configs.model.as_ref().ok().and_then(Option::as_ref),
        ))
        .await?;
        (Some(configs), trace)
    } else {
        (None, sizing::Step::Decide(None))
    };
    Ok(Some(Snapshot {
        job,
        workload: None,
        pods: Vec::new(),
        kueue_says: None,
        refusal: None,
        fresh: None,
        configs,
        trace,
        now,
    }))
}

/// The reads of a job whose workload exists.
async fn observe_workload(
    job: TrainingJob,
    ctx: &Context,
    workload: Job,
    now: jiff::Timestamp,
) -> Result<Snapshot, Error> {
    let ns = job.namespace().unwrap_or_default();
    let name = job.name_any();
    let pods = ctx.pods_of_job(&ns, &workload);
    let queued = job.labels().contains_key(names::KUEUE_QUEUE_LABEL)
        && super::workload::phase_of(&workload) == JobPhase::Queued;
    let kueue_says = if queued {
        super::kueue::waiting_reason(&ctx.client, &workload).await
    } else {
        None
    };
    let refusal = super::pods::latest_refusal(ctx, &workload, &pods);
    let bound = |pod: &str, node: &str| ctx.pod_of_job_on(&ns, pod, node, &name);
    let fresh = overlap_observed::gather(&ctx.nodes(), &ns, &name, now, &bound);
    // The configs are read only where a run may teach something: a window observed, a pod
    // that ended (a failure, or PyTorch's figures at exit), or the workload finished.
    let may_learn = opted_in(&job)
        && (fresh.is_some()
            || pods.iter().any(|p| ended_container(p))
            || matches!(
                super::workload::phase_of(&workload),
                JobPhase::Succeeded | JobPhase::Failed
            ));
    let configs = if may_learn {
        Some(read_configs(&job, ctx).await?)
    } else {
        None
    };
    Ok(Snapshot {
        job,
        workload: Some(workload),
        pods,
        kueue_says,
        refusal,
        fresh,
        configs,
        trace: sizing::Step::Decide(None),
        now,
    })
}

/// Whether a container of the pod has ended, now or before a restart.
fn ended_container(pod: &Pod) -> bool {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .any(|c| {
            c.state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .is_some()
                || c.last_state
                    .as_ref()
                    .and_then(|s| s.terminated.as_ref())
                    .is_some()
        })
}

/// The job's workload Job, if it exists. A Job in the cache exists (its deletion would have
/// removed it); one not there yet may have just been created, so absence is asked of the API
/// server, never taken from the cache.
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
async fn latest_copy(
    tj: &TrainingJob,
    ctx: &Context,
    ns: &str,
    name: &str,
) -> Result<Option<TrainingJob>, Error> {
    if tj.status.as_ref().is_none_or(|s| s.workload.is_none()) {
        return Ok(Some(tj.clone()));
    }
    Api::<TrainingJob>::namespaced(ctx.client.clone(), ns)
        .get_opt(name)
        .await
        .map_err(kube_err("reading the TrainingJob again"))
}

/// Reads the ConfigMaps the job references.
pub(crate) async fn read_configs(tj: &TrainingJob, ctx: &Context) -> Result<Configs, Error> {
    let ns = tj.namespace().unwrap_or_default();
    let deepspeed = match Reference::deepspeed(tj) {
        Some(r) => {
            let fetched = fetch(ctx, &ns, &r).await?;
            r.user_config(&ns, fetched).map(Some)
        }
        None => Ok(None),
    };
    let model = match Reference::model(tj) {
        Some(r) => {
            let fetched = fetch(ctx, &ns, &r).await?;
            r.model_shape(&ns, fetched).map(Some)
        }
        None => Ok(None),
    };
    Ok(Configs { deepspeed, model })
}

/// Fetches the ConfigMap `r` names in `ns` (an API error is the reconcile's to retry).
async fn fetch(ctx: &Context, ns: &str, r: &Reference) -> Result<Fetched, Error> {
    crate::cluster::referenced::fetch(&ctx.client, ns, r)
        .await
        .map_err(kube_err("reading a ConfigMap the job references"))
}
