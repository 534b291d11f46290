//! The controllers: resolve each opted-in TrainingJob's offload configuration, patch it in,
//! then create the workload; keep OffloadProfile status current.
//!
//! They run only on the leader, from the process's shared [`Caches`]: a controller subscribes
//! when it starts and so first sees every object already cached.

mod changes;
pub(crate) mod conditions;
pub mod other_kinds;
pub mod overlap_observed;
mod profile_status;
pub(crate) mod sizer_jobs;
pub mod status;
pub mod training_job;
mod watches;

pub use training_job::{Unresolved, reconcile_job, slim_pod};

use std::sync::Arc;
use std::time::Duration;

use crate::cluster::tolerant::Tolerant;
use crate::ops::events::{Recorder, Reporter};
use futures::{Stream, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::runtime::controller::{self, Action};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::cluster::caches::Caches;
use crate::index::NodeIndex;
use crate::ops::metrics::{ErrorLabels, Metrics};
use offload_api::names;
use offload_api::v1alpha1::{OffloadProfile, TrainingJob};
use watches::{failed_create_cache, job_controller, labelled_cache, profile_controller};

/// Shared state of the controllers, built once when they start.
pub struct Context {
    /// The one API client.
    pub client: Client,
    /// Event recorder.
    pub recorder: Recorder,
    /// Metrics registry handles.
    pub metrics: Arc<Metrics>,
    /// OffloadProfiles, from the shared cache.
    pub profiles: Store<OffloadProfile>,
    /// The decision's view of the cluster (profiles and nodes), shared with the webhook's.
    pub view: crate::cluster::view::StoreView,
    /// TrainingJobs, from the shared cache.
    pub jobs: Store<Tolerant<TrainingJob>>,
    /// What the operator writes beside the decision (the start-up guard's image).
    pub render: crate::render::RenderOptions,
    /// The workload Jobs (the leader's own watch of them, labelled with their TrainingJob);
    /// `None` where no such watch runs (a reconcile then asks the API server).
    pub workloads: Option<Store<Job>>,
    /// The workloads' pods, slimmed to where they run and their init containers' outcome: which
    /// node an observation may speak for. `None` where no such watch runs (then no node's
    /// observation is believed).
    pub pods: Option<Store<Pod>>,
    /// The Job controller's `FailedCreate` Events of Jobs (a pod the API server refused is said
    /// nowhere else); `None` where no such watch runs.
    pub failed_creates: Option<Store<Event>>,
}

/// Whether `pod` is a pod of TrainingJob `job` bound to `node`: bound there, labelled with the
/// job (`offload.dev/training-job`), and owned by the job's workload Job (which has the job's
/// name). Another job's pod on the same node, or a pod that only claims the label, is not.
pub fn pod_of_job(pod: &Pod, node: &str, job: &str) -> bool {
    let on = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| n == node);
    let labelled = pod
        .labels()
        .get(offload_api::names::LABEL_TRAINING_JOB)
        .map(String::as_str)
        == Some(job);
    let owned = pod
        .owner_references()
        .iter()
        .any(|o| o.kind == "Job" && o.name == job);
    on && labelled && owned
}

impl Context {
    /// The controllers' context over the process's caches.
    pub fn new(client: Client, caches: &Caches, metrics: Arc<Metrics>, reporter: &str) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: reporter.to_string(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        Context {
            client,
            recorder,
            metrics,
            profiles: caches.profiles.store().clone(),
            view: crate::cluster::view::StoreView::new(caches),
            jobs: caches.jobs.store().clone(),
            render: crate::render::RenderOptions::default(),
            workloads: None,
            pods: None,
            failed_creates: None,
        }
    }

    /// Whether pod `name` of `namespace` is a pod of TrainingJob `job` running on `node`, as the
    /// pod cache says: bound there, labelled with the job (`offload.dev/training-job`), and owned
    /// by the job's workload Job. A node's observed summary names pods; only this makes one of
    /// them evidence of this job.
    pub fn pod_of_job_on(&self, namespace: &str, name: &str, node: &str, job: &str) -> bool {
        self.pods.as_ref().is_some_and(|pods| {
            pods.get(&ObjectRef::new(name).within(namespace))
                .is_some_and(|p| pod_of_job(&p, node, job))
        })
    }

    /// The pods of workload Job `job` in `namespace` (owned by it, by uid) in the pod cache.
    pub fn pods_of_job(&self, namespace: &str, job: &Job) -> Vec<Arc<Pod>> {
        let Some(uid) = job.metadata.uid.as_deref() else {
            return Vec::new();
        };
        self.pods.as_ref().map_or_else(Vec::new, |pods| {
            pods.state()
                .into_iter()
                .filter(|p| {
                    p.metadata.namespace.as_deref() == Some(namespace)
                        && p.owner_references().iter().any(|o| o.uid == uid)
                })
                .collect()
        })
    }

    /// The node index as of now (shared until a node changes).
    pub fn nodes(&self) -> Arc<NodeIndex> {
        crate::decision::ClusterView::nodes(&self.view)
    }

    /// The named profile, if it exists.
    pub fn profile(&self, name: &str) -> Option<Arc<OffloadProfile>> {
        self.profiles.get(&ObjectRef::new(name))
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
    /// The reconcile panicked (a bug): caught, so that one object never stops the controller.
    #[error("the reconcile panicked: {0}")]
    Panic(String),
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
            Error::Panic(_) => "Panic",
        }
    }
}

/// Adds context to a kube error.
pub(crate) fn kube_err(action: &'static str) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Kube { action, source }
}

fn error_policy<K: kube::Resource>(
    kind: &'static str,
) -> impl Fn(Arc<K>, &Error, Arc<Context>) -> Action {
    move |obj, err, ctx| {
        let meta = obj.meta();
        tracing::warn!(
            kind,
            namespace = meta.namespace.as_deref().unwrap_or_default(),
            name = meta.name.as_deref().unwrap_or_default(),
            category = err.category(),
            error = %err,
            "reconcile failed"
        );
        ctx.metrics
            .reconcile_errors
            .get_or_create(&ErrorLabels {
                kind,
                category: err.category(),
            })
            .inc();
        // A panic repeats until the object or the operator changes: try now and then, not in a
        // tight loop.
        match err {
            Error::Panic(_) => Action::requeue(Duration::from_secs(300)),
            _ => Action::requeue(Duration::from_secs(5)),
        }
    }
}

/// Runs one reconcile, turning a panic into [`Error::Panic`]: the other objects go on.
pub(crate) async fn caught<F>(fut: F) -> Result<Action, Error>
where
    F: std::future::Future<Output = Result<Action, Error>>,
{
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(fut).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => Err(Error::Panic(
            panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into()),
        )),
    }
}

/// Options of the controllers.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Reporter name in Events.
    pub reporter: String,
    /// Concurrent reconciles per controller.
    pub concurrency: u16,
    /// What the operator writes beside the decision (the start-up guard's image).
    pub render: crate::render::RenderOptions,
    /// Whether the API server runs the `ExtendedResourceToleration` admission plugin (it is
    /// off by default, and the operator cannot see it): only then does a pod that asks for an
    /// extended resource tolerate that resource's `NoSchedule` taint without its own toleration.
    pub extended_resource_toleration: bool,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            reporter: names::OPERATOR_MANAGER.to_string(),
            concurrency: 16,
            render: crate::render::RenderOptions::default(),
            extended_resource_toleration: false,
        }
    }
}

/// Runs both controllers until `shutdown` is cancelled.
pub async fn run(
    client: Client,
    caches: &Caches,
    metrics: Arc<Metrics>,
    options: ControllerOptions,
    shutdown: CancellationToken,
) {
    // The workload Jobs, cached: a job's reconcile follows its Job from here instead of
    // asking the API server each time (what the cache does not have yet, it asks for).
    let (workloads, workload_changes) = labelled_cache(&client, training_job::slim_workload);
    // The workloads' pods: where each runs (observations are believed only from there) and
    // how its start-up guard ended (a trigger).
    let (pods, pod_changes) = labelled_cache(&client, training_job::slim_pod);
    // The Job controller's refusals of workload pods, cached: few, and read by every reconcile
    // of a workload that has fewer pods than it wants.
    let (failed_creates, refusals) = failed_create_cache(&client);
    let ctx = Arc::new(Context {
        render: options.render.clone(),
        workloads: Some(workloads),
        pods: Some(pods),
        failed_creates: Some(failed_creates),
        ..Context::new(client.clone(), caches, metrics.clone(), &options.reporter)
    });
    let config = controller::Config::default().concurrency(options.concurrency);
    let jobs = job_controller(
        &client,
        caches,
        &ctx,
        config.clone(),
        workload_changes,
        pod_changes,
        refusals,
        &shutdown,
    );
    let others = other_kinds::watch(ctx.clone(), shutdown.clone());
    let profiles = profile_controller(caches, ctx, config, &shutdown);
    tokio::join!(
        Box::pin(log_outcomes(jobs, "TrainingJob", metrics.clone())),
        Box::pin(log_outcomes(profiles, "OffloadProfile", metrics)),
        Box::pin(others),
    );
}

/// Drains a controller's outcome stream: reconcile failures are already counted by the error
/// policy; everything else the stream reports (an object that vanished from the cache, a
/// trigger watch failing) is logged and counted here instead of being thrown away.
async fn log_outcomes<K, E, W>(
    outcomes: impl Stream<Item = Result<(ObjectRef<K>, Action), controller::Error<E, W>>>,
    kind: &'static str,
    metrics: Arc<Metrics>,
) where
    K: kube::Resource,
    E: std::error::Error + 'static,
    W: std::error::Error + 'static,
{
    outcomes
        .for_each(|outcome| {
            if let Err(e) = outcome {
                let category = match &e {
                    controller::Error::ReconcilerFailed(..) => None,
                    // A trigger for an object deleted since: expected, not worth a warning.
                    controller::Error::ObjectNotFound(obj) => {
                        tracing::debug!(kind, object = %obj, "triggered for an object that is gone");
                        None
                    }
                    controller::Error::QueueError(_) => Some("TriggerWatch"),
                    controller::Error::RunnerError(_) => Some("Runner"),
                };
                if let Some(category) = category {
                    tracing::warn!(kind, category, error = %e, "controller");
                    metrics
                        .reconcile_errors
                        .get_or_create(&ErrorLabels { kind, category })
                        .inc();
                }
            }
            futures::future::ready(())
        })
        .await;
}

/// Quiet time before a profile's status is recomputed after a change of its jobs or nodes.
pub const PROFILE_DEBOUNCE: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(node: &str, label: Option<&str>, owner: Option<&str>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "p", "namespace": "ns",
                "labels": label.map(|l| serde_json::json!({offload_api::names::LABEL_TRAINING_JOB: l})),
                "ownerReferences": owner.map(|o| serde_json::json!([{
                    "apiVersion": "batch/v1", "kind": "Job", "name": o, "uid": "u"}])),
            },
            "spec": {"nodeName": node, "containers": []}
        }))
        .unwrap()
    }

    /// Hostile input, fourth pass: a node's summary may list any pod bound to it under any
    /// TrainingJob's name; only the job's own pods are its evidence.
    #[test]
    fn a_pod_is_a_jobs_evidence_only_when_it_is_the_jobs() {
        assert!(pod_of_job(&pod("n", Some("a"), Some("a")), "n", "a"));
        // Another job's pod on the same node, listed under this job's name.
        assert!(!pod_of_job(&pod("n", Some("b"), Some("b")), "n", "a"));
        // A pod that claims the label but is not the job's workload's.
        assert!(!pod_of_job(&pod("n", Some("a"), None), "n", "a"));
        assert!(!pod_of_job(&pod("n", Some("a"), Some("b")), "n", "a"));
        // The job's pod, on another node than the summary's.
        assert!(!pod_of_job(&pod("m", Some("a"), Some("a")), "n", "a"));
    }
}
