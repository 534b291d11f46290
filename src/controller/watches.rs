//! The controllers as they run: the TrainingJob controller and every change that wakes it,
//! the OffloadProfile status controller, and the caches of workload Jobs, their pods and the
//! Job controller's refusals that only the controllers read.

use std::sync::Arc;

use futures::Stream;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod};
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::changes::{
    decision_profile_changes, metadata_changes, observation_changes, spec_changes,
};
use super::{Context, Error, PROFILE_DEBOUNCE, caught, error_policy, profile_status, training_job};
use crate::cluster::caches::Caches;
use crate::cluster::tolerant::Tolerant;
use offload_api::names;
use offload_api::v1alpha1::{OffloadProfile, TrainingJob};

/// What a controller's run yields for each reconcile of a `K`.
pub(super) type Outcome<K> =
    Result<(ObjectRef<K>, Action), controller::Error<Error, watcher::Error>>;

/// A watch of the objects of kind `K` labelled with their TrainingJob, each slimmed by `slim`
/// and stripped of what no reconcile reads before it is cached: the cache and its changes.
pub(super) fn labelled_cache<K>(
    client: &Client,
    slim: fn(&mut K),
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + use<K>,
)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = kube::runtime::reflector::store::<K>();
    let changes = kube::runtime::reflector::reflector(
        writer,
        watcher(
            Api::<K>::all(client.clone()),
            watcher::Config::default().labels(names::LABEL_TRAINING_JOB),
        )
        .default_backoff()
        .modify(move |obj: &mut K| {
            slim(obj);
            crate::cluster::caches::strip_for_cache(obj);
        }),
    )
    .touched_objects();
    (store, changes)
}

/// The TrainingJob of a workload pod whose start-up guard ended, or whose training container
/// ran out of memory: what it found is recorded.
fn job_of_pod(pod: &Pod) -> Option<ObjectRef<Tolerant<TrainingJob>>> {
    // A pod still Pending: whether the scheduler placed it is the job's `PodsScheduled`.
    let pending = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending");
    if !pending
        && training_job::guard_outcome(pod).is_none()
        && training_job::recovery::memory_failure(pod, None).is_none()
    {
        return None;
    }
    let name = pod.labels().get(names::LABEL_TRAINING_JOB)?.clone();
    Some(ObjectRef::new(&name).within(&pod.namespace().unwrap_or_default()))
}

/// The jobs that read a ConfigMap. The operator's own rendered configs (labelled with their
/// job) are never a job's input: they are skipped without looking at the jobs.
fn jobs_for_config_map(
    ctx: &Context,
    cm: &PartialObjectMeta<ConfigMap>,
) -> Vec<ObjectRef<Tolerant<TrainingJob>>> {
    if cm.labels().contains_key(names::LABEL_TRAINING_JOB) {
        return Vec::new();
    }
    training_job::jobs_for_config_map(ctx, &cm.namespace().unwrap_or_default(), &cm.name_any())
}

/// The jobs that name a claim template (never the operator's own copies).
fn jobs_for_claim_template(
    ctx: &Context,
    t: &Tolerant<crate::dra::api::ResourceClaimTemplate>,
) -> Vec<ObjectRef<Tolerant<TrainingJob>>> {
    let Ok(t) = t.0.as_ref() else {
        return Vec::new();
    };
    if t.labels().contains_key(names::LABEL_TRAINING_JOB) {
        return Vec::new();
    }
    training_job::jobs_for_claim_template(ctx, &t.namespace().unwrap_or_default(), &t.name_any())
}

/// The `FailedCreate` Events of Jobs, cached, and their changes.
pub(super) fn failed_create_cache(
    client: &Client,
) -> (
    Store<Event>,
    impl Stream<Item = Result<Event, watcher::Error>> + use<>,
) {
    let (store, writer) = kube::runtime::reflector::store::<Event>();
    let changes = kube::runtime::reflector::reflector(
        writer,
        watcher(
            Api::<Event>::all(client.clone()),
            watcher::Config::default().fields(&format!(
                "reason={},involvedObject.kind=Job",
                training_job::FAILED_CREATE
            )),
        )
        .default_backoff()
        .modify(crate::cluster::caches::strip_for_cache),
    )
    .touched_objects();
    (store, changes)
}

/// The TrainingJob controller and every trigger that can change a job's decision or status.
#[allow(clippy::too_many_arguments)]
pub(super) fn job_controller<W, P, R>(
    client: &Client,
    caches: &Caches,
    ctx: &Arc<Context>,
    config: controller::Config,
    workload_changes: W,
    pod_changes: P,
    refusals: R,
    shutdown: &CancellationToken,
) -> impl Stream<Item = Outcome<Tolerant<TrainingJob>>> + use<W, P, R>
where
    W: Stream<Item = Result<Job, watcher::Error>> + Send + 'static,
    P: Stream<Item = Result<Pod, watcher::Error>> + Send + 'static,
    R: Stream<Item = Result<Event, watcher::Error>> + Send + 'static,
{
    let job_ctx_events = ctx.clone();
    // A job's own status writes (ours) do not trigger it again: only what the user or the
    // API server changes (spec, labels, annotations, deletion) does.
    let controller = Controller::for_shared_stream(
        spec_changes(caches.jobs.subscribe(), caches.jobs.store().clone()),
        caches.jobs.store().clone(),
    )
    .with_config(config.clone())
    .owns_stream(workload_changes)
    // A workload pod whose start-up guard ended, or whose training container ran out of
    // memory: record what it found.
    .watches_stream(pod_changes, |pod| job_of_pod(&pod))
    // The Job controller could not create a workload pod (a quota, the LimitRanger, a
    // webhook refused it): said only in an Event on the Job, which has the job's name.
    .watches_stream(refusals, move |e| {
        let job = e.involved_object;
        let key = ObjectRef::new(job.name.as_deref()?).within(job.namespace.as_deref()?);
        job_ctx_events.jobs.get(&key).is_some().then_some(key)
    })
    // A sizer Job that ended (or changed): the job that asked for it is decided at once.
    .watches_stream(
        watcher(
            Api::<Job>::all(client.clone()),
            watcher::Config::default().labels(names::LABEL_SIZER_FOR),
        )
        .default_backoff()
        .touched_objects(),
        |job| {
            let name = job.labels().get(names::LABEL_SIZER_FOR)?.clone();
            Some(ObjectRef::new(&name).within(&job.namespace().unwrap_or_default()))
        },
    );
    with_cluster_triggers(controller, client, caches, ctx)
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(
            training_job::reconcile,
            error_policy::<Tolerant<TrainingJob>>("TrainingJob"),
            ctx.clone(),
        )
}

/// The TrainingJob controller woken by the cluster's objects that can change a job's decision
/// or status: profiles, nodes and their observations, ConfigMaps, Kueue's Workloads, the GPU
/// driver's slices and claim templates, LimitRanges.
fn with_cluster_triggers(
    controller: Controller<Tolerant<TrainingJob>>,
    client: &Client,
    caches: &Caches,
    ctx: &Arc<Context>,
) -> Controller<Tolerant<TrainingJob>> {
    let job_ctx = ctx.clone();
    let job_ctx_nodes = ctx.clone();
    let job_ctx_config_maps = ctx.clone();
    let job_ctx_observed = ctx.clone();
    let job_ctx_templates = ctx.clone();
    let job_ctx_slices = ctx.clone();
    let job_ctx_limits = ctx.clone();
    controller
        .watches_shared_stream(caches.profiles.subscribe(), move |profile| {
            training_job::jobs_for_profile(&job_ctx, &profile.name_any())
        })
        // Node changes matter only when labels or annotations change (the agent's output),
        // not on every heartbeat.
        .watches_shared_stream(
            metadata_changes(caches.nodes.subscribe(), caches.nodes.store().clone()),
            move |node| training_job::jobs_for_node(&job_ctx_nodes, &node),
        )
        // A new observation (once a minute per node with configured pods): the running
        // jobs it lists, and nothing else.
        .watches_shared_stream(
            observation_changes(caches.nodes.subscribe(), caches.nodes.store().clone()),
            move |node| training_job::jobs_for_observation(&job_ctx_observed, &node),
        )
        // A held job whose DeepSpeed ConfigMap the user fixes is tried again at once. Metadata
        // is enough to map a ConfigMap to its jobs, and its resourceVersion moves with every
        // edit.
        .watches_stream(
            watcher(
                Api::<PartialObjectMeta<ConfigMap>>::all(client.clone()),
                watcher::Config::default().any_semantic(),
            )
            .default_backoff()
            .touched_objects(),
            move |cm| jobs_for_config_map(&job_ctx_config_maps, &cm),
        )
        // Kueue: what it writes on a queued job's Workload (admitted, waiting, evicted) reaches
        // the job's Admitted condition at once.
        .watches_stream_with(
            training_job::kueue::workload_changes(client),
            |w| {
                let (name, ns) = training_job::kueue::job_of_workload(&w)?;
                Some(ObjectRef::new(&name).within(&ns))
            },
            training_job::kueue::workloads(),
        )
        // DRA: a held job whose claim template appears, or a node the GPU driver now
        // describes, is tried again.
        .watches_shared_stream(caches.claim_templates.subscribe(), move |t| {
            jobs_for_claim_template(&job_ctx_templates, &t)
        })
        .watches_shared_stream(caches.slices.subscribe(), move |_| {
            training_job::jobs_for_slices(&job_ctx_slices)
        })
        // A job held for its namespace's LimitRange is tried again when a range changes.
        .watches_shared_stream(caches.limit_ranges.subscribe(), move |r| {
            training_job::jobs_in_namespace(&job_ctx_limits, &r.namespace().unwrap_or_default())
        })
}

/// The OffloadProfile status controller: nodes per memory model and overlap result, the jobs
/// decided with each profile.
pub(super) fn profile_controller(
    caches: &Caches,
    ctx: Arc<Context>,
    config: controller::Config,
    shutdown: &CancellationToken,
) -> impl Stream<Item = Outcome<OffloadProfile>> + use<> {
    let profiles_for_nodes = caches.profiles.store().clone();
    let profiles_for_slices = caches.profiles.store().clone();
    Controller::for_shared_stream(caches.profiles.subscribe(), caches.profiles.store().clone())
        // A profile's status counts jobs and nodes: during a burst of jobs, one write once
        // the burst settles rather than one per job (the burst itself is not delayed).
        .with_config(config.debounce(PROFILE_DEBOUNCE))
        .watches_shared_stream(
            metadata_changes(caches.nodes.subscribe(), caches.nodes.store().clone()),
            move |_node| {
                profiles_for_nodes
                    .state()
                    .iter()
                    .map(|p| ObjectRef::from(p.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        // The GPU driver's word changes which nodes a profile can use.
        .watches_shared_stream(caches.slices.subscribe(), move |_slice| {
            profiles_for_slices
                .state()
                .iter()
                .map(|p| ObjectRef::from(p.as_ref()))
                .collect::<Vec<_>>()
        })
        // A profile counts the jobs decided with it: only a job's first decision, a change
        // of its profile, or its deletion changes that count.
        .reconcile_on(decision_profile_changes(
            caches.jobs.subscribe(),
            caches.jobs.store().clone(),
        ))
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(
            |profile, ctx| caught(profile_status::reconcile(profile, ctx)),
            error_policy::<OffloadProfile>("OffloadProfile"),
            ctx,
        )
}
