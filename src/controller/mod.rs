//! The controller: resolves each opted-in TrainingJob's offload configuration, patches it in,
//! then creates the workload; keeps OffloadProfile status current.
//!
//! Reflectors for Nodes (metadata only, so memory stays flat on large clusters), OffloadProfiles
//! and TrainingJobs are built once and shared by both controllers through subscriptions.

mod conditions;
mod profile;
mod training_job;
pub mod workload;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, future};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::core::{DeserializeGuard, PartialObjectMeta};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::api::{OffloadProfile, OffloadProfileSpec, TrainingJob};
use crate::decision::NodeInfo;
use crate::metrics::{ErrorLabels, Metrics};
use crate::names;

pub use training_job::{opted_in, profile_name_for};

/// Shared state of the controllers, built once at start-up.
pub struct Context {
    /// The one API client.
    pub client: Client,
    /// Event recorder.
    pub recorder: Recorder,
    /// Metrics registry handles.
    pub metrics: Arc<Metrics>,
    /// OffloadProfiles, kept current by a reflector.
    pub profiles: Store<OffloadProfile>,
    /// The decision's view of the GPU Nodes' metadata (labels and annotations only), parsed
    /// once per change.
    pub node_views: NodeViews,
    /// TrainingJobs, kept current by a reflector. Wrapped in [`DeserializeGuard`] so one object
    /// that does not deserialize is reported and skipped instead of stalling the watch.
    pub jobs: Store<DeserializeGuard<TrainingJob>>,
}

impl Context {
    /// The decision's view of every node in the store (shared until a node changes).
    pub fn node_infos(&self) -> Arc<[NodeInfo]> {
        self.node_views.get()
    }

    /// The named profile, if it exists.
    pub fn profile(&self, name: &str) -> Option<Arc<OffloadProfile>> {
        self.profiles.get(&ObjectRef::new(name))
    }
}

/// The decision's view of the nodes in a metadata store.
pub fn node_infos(nodes: &Store<PartialObjectMeta<Node>>) -> Vec<NodeInfo> {
    nodes
        .state()
        .iter()
        .map(|n| {
            NodeInfo::from_metadata(
                n.name_any(),
                n.metadata.labels.clone().unwrap_or_default(),
                n.metadata.annotations.as_ref().unwrap_or(&BTreeMap::new()),
            )
        })
        .collect()
}

/// The decision's view of the nodes in a metadata store, rebuilt only when the store changed.
///
/// The store replaces an object's `Arc` on every change, so an unchanged list of pointers means
/// unchanged nodes: a caller compares pointers (no parsing, no copies) and shares the last views.
/// On a change only the nodes whose resourceVersion moved are parsed again.
pub struct NodeViews {
    store: Store<PartialObjectMeta<Node>>,
    snapshot: std::sync::Mutex<NodeSnapshot>,
}

#[derive(Default)]
struct NodeSnapshot {
    objects: Vec<Arc<PartialObjectMeta<Node>>>,
    infos: Option<Arc<[NodeInfo]>>,
    /// Parsed views by name, with the resourceVersion they were parsed at.
    parsed: std::collections::HashMap<String, (String, NodeInfo)>,
}

impl NodeViews {
    /// Views over `store`.
    pub fn new(store: Store<PartialObjectMeta<Node>>) -> Self {
        NodeViews {
            store,
            snapshot: Default::default(),
        }
    }

    /// Every node's view, as of now.
    pub fn get(&self) -> Arc<[NodeInfo]> {
        let state = self.store.state();
        let Ok(mut snap) = self.snapshot.lock() else {
            return node_infos(&self.store).into();
        };
        if let Some(infos) = &snap.infos
            && snap.objects.len() == state.len()
            && snap
                .objects
                .iter()
                .zip(&state)
                .all(|(a, b)| Arc::ptr_eq(a, b))
        {
            return infos.clone();
        }
        let mut out = Vec::with_capacity(state.len());
        for node in &state {
            let name = node.name_any();
            let rv = node.metadata.resource_version.clone().unwrap_or_default();
            match snap.parsed.get(&name) {
                Some((cached_rv, info)) if *cached_rv == rv && !rv.is_empty() => {
                    out.push(info.clone())
                }
                _ => {
                    let info = NodeInfo::from_metadata(
                        name.clone(),
                        node.metadata.labels.clone().unwrap_or_default(),
                        node.metadata
                            .annotations
                            .as_ref()
                            .unwrap_or(&BTreeMap::new()),
                    );
                    snap.parsed.insert(name, (rv, info.clone()));
                    out.push(info);
                }
            }
        }
        // Forget nodes that are gone.
        if snap.parsed.len() > state.len() {
            let live: std::collections::HashSet<&str> = state
                .iter()
                .filter_map(|n| n.metadata.name.as_deref())
                .collect();
            snap.parsed.retain(|k, _| live.contains(k.as_str()));
        }
        let infos: Arc<[NodeInfo]> = out.into();
        snap.infos = Some(infos.clone());
        snap.objects = state;
        infos
    }
}

/// Errors of a reconcile. Each has a fixed category for metrics and logs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done.
        action: &'static str,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// An object could not be serialised (a bug, never user input).
    #[error("serialising {0}: {1}")]
    Serialize(&'static str, serde_json::Error),
}

impl Error {
    /// Fixed category for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } if s.code == 409 => "Conflict",
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } if s.code == 404 => "NotFound",
            Error::Kube {
                source: kube::Error::Api(_),
                ..
            } => "ApiError",
            Error::Kube { .. } => "ClientError",
            Error::Serialize(..) => "Serialize",
        }
    }
}

/// Adds context to a kube error.
pub(crate) fn kube_err(action: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Kube { action, source }
}

fn error_policy<K>(kind: &'static str) -> impl Fn(Arc<K>, &Error, Arc<Context>) -> Action {
    move |_obj, err, ctx| {
        tracing::warn!(kind, category = err.category(), error = %err, "reconcile failed");
        ctx.metrics
            .reconcile_errors
            .get_or_create(&ErrorLabels {
                kind,
                category: err.category(),
            })
            .inc();
        Action::requeue(Duration::from_secs(5))
    }
}

/// Options of the controllers.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Reporter name in Events.
    pub reporter: String,
    /// Concurrent reconciles per controller.
    pub concurrency: u16,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            reporter: names::OPERATOR_MANAGER.to_string(),
            concurrency: 16,
        }
    }
}

/// Handle to the stores, for readiness checks.
#[derive(Clone)]
pub struct Readiness {
    profiles: Store<OffloadProfile>,
    nodes: Store<PartialObjectMeta<Node>>,
    jobs: Store<DeserializeGuard<TrainingJob>>,
}

impl Readiness {
    /// Waits until every reflector has listed once.
    pub async fn wait(&self) -> bool {
        self.profiles.wait_until_ready().await.is_ok()
            && self.nodes.wait_until_ready().await.is_ok()
            && self.jobs.wait_until_ready().await.is_ok()
    }
}

/// Runs both controllers until `shutdown` is cancelled. `ready` receives the store handles as
/// soon as they exist, for the readiness probe.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    options: ControllerOptions,
    shutdown: CancellationToken,
    ready: tokio::sync::oneshot::Sender<Readiness>,
) {
    // Shared reflectors.
    let (profiles, profile_writer) = reflector::store_shared::<OffloadProfile>(1024);
    let (nodes, node_writer) = reflector::store_shared::<PartialObjectMeta<Node>>(1024);
    let (jobs, job_writer) = reflector::store_shared::<DeserializeGuard<TrainingJob>>(4096);
    let profile_subs = (profile_writer.subscribe(), profile_writer.subscribe());
    let node_subs = (node_writer.subscribe(), node_writer.subscribe());
    let job_subs = (job_writer.subscribe(), job_writer.subscribe());
    let (Some(profile_a), Some(profile_b)) = profile_subs else {
        return;
    };
    let (Some(node_a), Some(node_b)) = node_subs else {
        return;
    };
    let (Some(job_a), Some(job_b)) = job_subs else {
        return;
    };
    let _ = ready.send(Readiness {
        profiles: profiles.clone(),
        nodes: nodes.clone(),
        jobs: jobs.clone(),
    });

    // Watch errors back off and retry instead of ending the stream; a TrainingJob that does
    // not deserialize is carried as an error value by its guard and skipped by the reconciler.
    let profile_reflector = shared_reflector(
        Api::<OffloadProfile>::all(client.clone()),
        profile_writer,
        "OffloadProfile",
    );
    let node_reflector = shared_reflector(
        Api::<PartialObjectMeta<Node>>::all(client.clone()),
        node_writer,
        "Node",
    );
    let job_reflector = shared_reflector(
        Api::<DeserializeGuard<TrainingJob>>::all(client.clone()),
        job_writer,
        "TrainingJob",
    );

    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: options.reporter.clone(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    let ctx = Arc::new(Context {
        client: client.clone(),
        recorder,
        metrics,
        profiles: profiles.clone(),
        node_views: NodeViews::new(nodes.clone()),
        jobs: jobs.clone(),
    });
    let config = kube::runtime::controller::Config::default().concurrency(options.concurrency);

    // Node changes matter only when labels or annotations change (the agent's output), not on
    // every status heartbeat.
    let node_changes_for_jobs = metadata_changes(node_a);
    let node_changes_for_profiles = metadata_changes(node_b);

    let job_ctx = ctx.clone();
    let job_ctx_nodes = ctx.clone();
    let job_controller = Controller::for_shared_stream(job_a, jobs.clone())
        .with_config(config.clone())
        .owns(
            Api::<Job>::all(client.clone()),
            watcher::Config::default().labels(workload::JOB_LABEL),
        )
        .watches_shared_stream(profile_a, move |profile| {
            training_job::jobs_for_profile(&job_ctx, &profile.name_any())
        })
        .watches_shared_stream(node_changes_for_jobs, move |node| {
            training_job::jobs_for_node(&job_ctx_nodes, &node)
        })
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(
            training_job::reconcile,
            error_policy::<DeserializeGuard<TrainingJob>>("TrainingJob"),
            ctx.clone(),
        )
        .for_each(|_| future::ready(()));

    let profiles_for_nodes = profiles.clone();
    let profile_controller = Controller::for_shared_stream(profile_b, profiles.clone())
        .with_config(config)
        .watches_shared_stream(node_changes_for_profiles, move |_node| {
            profiles_for_nodes
                .state()
                .iter()
                .map(|p| ObjectRef::from(p.as_ref()))
                .collect::<Vec<_>>()
        })
        .watches_shared_stream(job_b, |job| {
            job.0
                .as_ref()
                .ok()
                .and_then(|j| j.status.as_ref())
                .and_then(|s| s.offload.as_ref())
                .map(|o| ObjectRef::new(&o.profile))
        })
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(
            profile::reconcile,
            error_policy::<OffloadProfile>("OffloadProfile"),
            ctx,
        )
        .for_each(|_| future::ready(()));

    let reflectors = async {
        tokio::select! {
            _ = profile_reflector => {},
            _ = node_reflector => {},
            _ = job_reflector => {},
            _ = shutdown.cancelled() => {},
        }
    };
    tokio::join!(
        Box::pin(job_controller),
        Box::pin(profile_controller),
        Box::pin(reflectors)
    );
}

/// Drives a watch into a shared store until the stream ends, logging (not failing on) errors.
fn shared_reflector<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    kind: &'static str,
) -> impl std::future::Future<Output = ()> + Send
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    watcher(api, watcher::Config::default().any_semantic())
        .default_backoff()
        .reflect_shared(writer)
        .for_each(move |r| {
            if let Err(e) = r {
                tracing::warn!(kind, error = %e, "watch error");
            }
            future::ready(())
        })
}

/// Passes a node on only when its labels or annotations changed since it was last seen.
fn metadata_changes(
    nodes: impl futures::Stream<Item = Arc<PartialObjectMeta<Node>>>,
) -> impl futures::Stream<Item = Arc<PartialObjectMeta<Node>>> {
    use std::hash::{Hash, Hasher};
    let mut seen: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    nodes.filter(move |node| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        node.metadata.labels.hash(&mut h);
        node.metadata.annotations.hash(&mut h);
        let digest = h.finish();
        future::ready(seen.insert(node.name_any(), digest) != Some(digest))
    })
}

/// The profile a job resolves with: the named one, or for a job that opted in through an
/// explicit `spec.offload` without naming a profile, the built-in defaults when no `default`
/// profile exists.
pub(crate) fn builtin_default_profile() -> OffloadProfileSpec {
    OffloadProfileSpec::default()
}
