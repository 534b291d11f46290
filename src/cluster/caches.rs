//! The operator's caches: one watch per kind — Nodes (metadata and allocatable resources only,
//! so memory stays flat on large clusters), OffloadProfiles and TrainingJobs — built once per
//! process and shared by the
//! webhook (every replica serves it) and the controllers (the leader runs them).
//!
//! A controller that starts late (on winning the lease) subscribes to a cache and receives
//! every object already in it, then every change; a subscriber that falls behind gets the whole
//! cache again instead of stalling the watch, so a slow or absent subscriber never holds up
//! the webhook's view.
//!
//! Why not kube's shared reflector (`reflector::store_shared` and its subscribers): a subscriber
//! there sees only the changes after it subscribed, not the objects already cached, and a
//! subscriber whose buffer is full holds up the dispatch to every other one — the late-starting
//! leader's controllers would miss the cache's contents, and a stalled one would freeze the
//! webhook's view. The fan-out here is a `tokio::sync::broadcast` that replays the store to a
//! subscriber that lags.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use crate::cluster::tolerant::Tolerant;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{LimitRange, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::broadcast;

use crate::cluster::node_views::NodeViews;
use crate::dra::DraOptions;
use crate::dra::api::{ResourceClaimTemplate, ResourceSlice};
use crate::ops::metrics::{KindLabels, Metrics};
use offload_api::v1alpha1::{OffloadProfile, TrainingJob};

/// How many changes a subscriber may fall behind before it is handed the whole cache again.
const SUBSCRIBER_BUFFER: usize = 1024;

/// The names of the objects a cache changed since a reader last took them, for a reader that
/// keeps its own view up to date one object at a time (the node views). Off — nothing kept —
/// until a reader enables it; names only, so for cluster-scoped kinds.
#[derive(Debug, Default)]
pub struct ChangeLog {
    enabled: std::sync::atomic::AtomicBool,
    changed: std::sync::Mutex<Changed>,
}

/// What changed since the last [`ChangeLog::take`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changed {
    /// Objects applied or deleted, by name.
    pub names: std::collections::HashSet<String>,
    /// The whole cache was listed again (a new or resumed watch): every object may differ.
    pub all: bool,
}

impl ChangeLog {
    /// Starts keeping the names; what changed before is seen as everything.
    pub fn enable(&self) {
        self.lock().all = true;
        self.enabled
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether a reader enabled the log.
    pub fn enabled(&self) -> bool {
        self.enabled.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Records a change of `name`, or with `None` a new listing of everything.
    pub fn record(&self, name: Option<&str>) {
        if !self.enabled() {
            return;
        }
        let mut changed = self.lock();
        match name {
            Some(n) if !changed.all => {
                changed.names.insert(n.to_string());
            }
            Some(_) => {}
            None => {
                changed.all = true;
                changed.names.clear();
            }
        }
    }

    /// What changed since the last call, and an empty log.
    pub fn take(&self) -> Changed {
        std::mem::take(&mut *self.lock())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Changed> {
        self.changed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One kind's cache and its change feed.
pub struct Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    changes: broadcast::Sender<Arc<K>>,
    /// Bumped after each change the store has taken in: a reader that saw the same number
    /// before has nothing new to look at.
    generation: Arc<std::sync::atomic::AtomicU64>,
    /// The names changed, recorded before the generation moves (see [`ChangeLog`]).
    log: Arc<ChangeLog>,
}

impl<K> Clone for Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn clone(&self) -> Self {
        Cache {
            store: self.store.clone(),
            changes: self.changes.clone(),
            generation: self.generation.clone(),
            log: self.log.clone(),
        }
    }
}

impl<K> Cache<K>
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    /// The objects as of now.
    pub fn store(&self) -> &Store<K> {
        &self.store
    }

    /// How many changes the store has taken in (see [`Cache`]'s `generation`).
    pub fn generation(&self) -> Arc<std::sync::atomic::AtomicU64> {
        self.generation.clone()
    }

    /// The names of the objects changed, once a reader enables it (see [`ChangeLog`]).
    pub fn change_log(&self) -> Arc<ChangeLog> {
        self.log.clone()
    }

    /// Every object now in the cache, then every change (applied or deleted objects). After
    /// falling more than [`SUBSCRIBER_BUFFER`] changes behind, the whole cache is sent again.
    pub fn subscribe(&self) -> impl Stream<Item = Arc<K>> + Send + 'static {
        // Subscribe before taking the snapshot, so no change falls between the two.
        let receiver = self.changes.subscribe();
        let store = self.store.clone();
        let pending: VecDeque<Arc<K>> = store.state().into();
        futures::stream::unfold(
            (receiver, pending, store),
            |(mut receiver, mut pending, store)| async move {
                loop {
                    if let Some(obj) = pending.pop_front() {
                        return Some((obj, (receiver, pending, store)));
                    }
                    match receiver.recv().await {
                        Ok(obj) => return Some((obj, (receiver, pending, store))),
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            pending = store.state().into();
                        }
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            },
        )
    }
}

/// The annotation `kubectl apply` keeps its last applied manifest in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what no reader of a cached object looks at: who wrote which field, and kubectl's copy
/// of what it applied. Most of the memory an object with several writers takes.
pub(crate) fn strip_for_cache<K: Resource>(obj: &mut K) {
    obj.managed_fields_mut().clear();
    if let Some(a) = obj.meta_mut().annotations.as_mut() {
        a.remove(LAST_APPLIED);
    }
}

/// Keeps of a Node only what the decision reads: metadata (labels, the agent's annotations),
/// `spec.taints` (which pods may land there) and `status.allocatable`. The images a kubelet
/// lists, its conditions and addresses are most of a Node's size and change with every status
/// report.
pub(crate) fn slim_node(node: &mut Node) {
    node.spec = node
        .spec
        .take()
        .map(|spec| k8s_openapi::api::core::v1::NodeSpec {
            taints: spec.taints,
            ..Default::default()
        });
    if let Some(status) = node.status.take() {
        node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            allocatable: status.allocatable,
            // Only the node's memory: what an observed pod's host memory is bounded by.
            capacity: status.capacity.map(|mut c| {
                c.retain(|k, _| k == "memory");
                c
            }),
            ..Default::default()
        });
    }
}

/// Builds a cache fed by `events` and returns it with the future that drives it; `slim` drops
/// what no reader looks at before an object is stored.
fn cache<K, S>(
    events: S,
    kind: &'static str,
    metrics: Arc<Metrics>,
    slim: fn(&mut K),
) -> (Cache<K>, impl Future<Output = ()> + Send + 'static)
where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let (changes, _) = broadcast::channel(SUBSCRIBER_BUFFER);
    let events = events.modify(move |obj: &mut K| {
        strip_for_cache(obj);
        slim(obj);
    });
    let generation: Arc<std::sync::atomic::AtomicU64> = Arc::default();
    let log: Arc<ChangeLog> = Arc::default();
    let cache = Cache {
        store: store.clone(),
        changes: changes.clone(),
        generation: generation.clone(),
        log: log.clone(),
    };
    let drive = events.reflect(writer).for_each(move |event| {
        // The store has the change already; the name is logged before the generation moves,
        // so a reader that saw the generation unmoved missed no name.
        let changed = match &event {
            Ok(watcher::Event::Apply(obj) | watcher::Event::Delete(obj)) => {
                log.record(obj.meta().name.as_deref());
                true
            }
            Ok(watcher::Event::InitDone) => {
                log.record(None);
                true
            }
            _ => false,
        };
        if changed {
            generation.fetch_add(1, std::sync::atomic::Ordering::Release);
        }
        match event {
            Ok(watcher::Event::Apply(obj)) => {
                // Hand out the cache's own Arc: subscribers share it instead of a copy.
                let key = ObjectRef::from_obj(&obj);
                let shared = store.get(&key).unwrap_or_else(|| Arc::new(obj));
                let _ = changes.send(shared);
            }
            Ok(watcher::Event::Delete(obj)) => {
                let _ = changes.send(Arc::new(obj));
            }
            Ok(watcher::Event::InitDone) => {
                for obj in store.state() {
                    let _ = changes.send(obj);
                }
            }
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
            Err(e) => {
                // The watcher backs off and retries; a watch error never ends the stream.
                tracing::warn!(kind, error = %e, "watch error");
                metrics
                    .watch_errors
                    .get_or_create(&KindLabels { kind })
                    .inc();
            }
        }
        futures::future::ready(())
    });
    (cache, drive)
}

/// The operator's three caches and the node index built on the Node cache.
#[derive(Clone)]
pub struct Caches {
    /// OffloadProfiles.
    pub profiles: Cache<OffloadProfile>,
    /// Nodes: metadata and allocatable resources ([`slim_node`]).
    pub nodes: Cache<Node>,
    /// TrainingJobs, each wrapped in a [`Tolerant`] so one object that does not
    /// deserialize is carried as an error and skipped instead of stalling the watch.
    pub jobs: Cache<Tolerant<TrainingJob>>,
    /// The decision's view of the Node cache, parsed once per node change.
    pub node_views: Arc<NodeViews>,
    /// The Kubeflow Trainer TrainJob CRD (empty when not installed): which field the installed
    /// version takes per-job pod settings in. Part of readiness, so the webhook never writes
    /// TrainJobs before it knows the installed API.
    pub trainjob_crd: Cache<CustomResourceDefinition>,
    /// The GPU driver's ResourceSlices (DRA), by the driver's name (a field selector); empty
    /// where DRA is off or the cluster does not serve `resource.k8s.io/v1`.
    pub slices: Cache<Tolerant<ResourceSlice>>,
    /// ResourceClaimTemplates of every namespace: what a pod's DRA claims request.
    pub claim_templates: Cache<Tolerant<ResourceClaimTemplate>>,
    /// LimitRanges of every namespace: the memory limit a container that sets none gets, and
    /// the most it may have.
    pub limit_ranges: Cache<LimitRange>,
    /// The DRA options the caches were built with (`None`: DRA off).
    pub dra: Option<DraOptions>,
    /// What runs taught the memory model, where the operator learns (set after
    /// [`Caches::new`]; watched by the operator's run).
    pub learned: Option<crate::cluster::learned::LearnedStore>,
    /// The sizer's traces, where the operator traces models (set after [`Caches::new`];
    /// watched by the operator's run).
    pub traces: Option<crate::cluster::traces::TraceStore>,
    /// Whether the API server runs the `ExtendedResourceToleration` admission plugin, as the
    /// operator was told (set after [`Caches::new`]).
    pub extended_resource_toleration: bool,
}

/// Every object of a kind the API serves, watched with the default backoff.
fn every<K>(
    client: &Client,
    config: watcher::Config,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + use<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + serde::de::DeserializeOwned + Send + 'static,
{
    watcher(Api::<K>::all(client.clone()), config).default_backoff()
}

/// Every watch reads from any recent state (the API server's cache), not a quorum read.
fn config() -> watcher::Config {
    watcher::Config::default().any_semantic()
}

/// Objects kept as they came.
fn keep<K>(_: &mut K) {}

/// DRA's caches: the GPU driver's ResourceSlices and the claim templates, each empty where DRA
/// is off or the API server does not serve its kind.
#[allow(clippy::type_complexity)]
fn dra_caches(
    client: &Client,
    metrics: &Arc<Metrics>,
    dra: Option<&DraOptions>,
) -> (
    Cache<Tolerant<ResourceSlice>>,
    Cache<Tolerant<ResourceClaimTemplate>>,
    impl Future<Output = ()> + Send + use<>,
) {
    let slice_config = dra.map(|d| config().fields(&format!("spec.driver={}", d.driver)));
    let (slices, drive_slices) = cache(
        served_or_empty::<Tolerant<ResourceSlice>>(client, slice_config),
        "ResourceSlice",
        metrics.clone(),
        keep,
    );
    let (claim_templates, drive_templates) = cache(
        served_or_empty::<Tolerant<ResourceClaimTemplate>>(client, dra.map(|_| config())),
        "ResourceClaimTemplate",
        metrics.clone(),
        keep,
    );
    let drive = async move {
        tokio::join!(drive_slices, drive_templates);
    };
    (slices, claim_templates, drive)
}

/// The nodes as the decision reads them: from the Node cache alone, or beside the DRA driver's
/// ResourceSlices where DRA is on.
fn node_views(
    nodes: &Cache<Node>,
    slices: &Cache<Tolerant<ResourceSlice>>,
    dra: Option<&DraOptions>,
) -> NodeViews {
    match dra {
        Some(d) => NodeViews::with_slices(
            nodes.store().clone(),
            slices.store().clone(),
            d.driver.clone(),
        )
        .with_generations(nodes.generation(), Some(slices.generation()))
        .with_change_log(nodes.change_log()),
        None => NodeViews::new(nodes.store().clone())
            .with_generations(nodes.generation(), None)
            .with_change_log(nodes.change_log()),
    }
}

impl Caches {
    /// Starts nothing: returns the caches and the future that drives all three watches (it
    /// runs until dropped).
    pub fn new(
        client: &Client,
        metrics: Arc<Metrics>,
        dra: Option<&DraOptions>,
    ) -> (Caches, impl Future<Output = ()> + Send + use<>) {
        let (profiles, drive_profiles) = cache(
            every::<OffloadProfile>(client, config()),
            "OffloadProfile",
            metrics.clone(),
            keep,
        );
        let (nodes, drive_nodes) = cache(
            every::<Node>(client, config()),
            "Node",
            metrics.clone(),
            slim_node,
        );
        let (jobs, drive_jobs) = cache(
            every::<Tolerant<TrainingJob>>(client, config()),
            "TrainingJob",
            metrics.clone(),
            keep,
        );
        let (trainjob_crd, drive_crd) = cache(
            every::<CustomResourceDefinition>(
                client,
                config().fields(&format!(
                    "metadata.name={}",
                    offload_api::names::TRAINJOB_CRD
                )),
            ),
            "CustomResourceDefinition",
            metrics.clone(),
            keep,
        );
        let (slices, claim_templates, drive_dra) = dra_caches(client, &metrics, dra);
        let (limit_ranges, drive_limits) = cache(
            every::<LimitRange>(client, config()),
            "LimitRange",
            metrics.clone(),
            keep,
        );
        let node_views = Arc::new(node_views(&nodes, &slices, dra));
        let drive = async move {
            tokio::join!(
                drive_profiles,
                drive_nodes,
                drive_jobs,
                drive_crd,
                drive_dra,
                drive_limits
            );
        };
        (
            Caches {
                learned: None,
                traces: None,
                extended_resource_toleration: false,
                profiles,
                nodes,
                jobs,
                node_views,
                trainjob_crd,
                slices,
                claim_templates,
                limit_ranges,
                dra: dra.cloned(),
            },
            drive,
        )
    }

    /// Waits until every cache has listed once (and what runs taught has been read, where the
    /// operator learns); `false` if a cache's feed is gone.
    pub async fn wait_synced(&self) -> bool {
        self.profiles.store().wait_until_ready().await.is_ok()
            && self.nodes.store().wait_until_ready().await.is_ok()
            && self.jobs.store().wait_until_ready().await.is_ok()
            && self.trainjob_crd.store().wait_until_ready().await.is_ok()
            && self.slices.store().wait_until_ready().await.is_ok()
            && self.limit_ranges.store().wait_until_ready().await.is_ok()
            && self
                .claim_templates
                .store()
                .wait_until_ready()
                .await
                .is_ok()
            && match &self.learned {
                Some(store) => store.wait_synced().await,
                None => true,
            }
            && match &self.traces {
                Some(store) => store.wait_synced().await,
                None => true,
            }
    }
}

/// A watch of a `resource.k8s.io/v1` kind, or, where DRA is off (`config` is `None`) or the
/// API server does not serve it (clusters before 1.34), an empty list that never changes: the
/// cache is then ready and empty, and DRA plays no part until the operator restarts.
fn served_or_empty<K>(
    client: &Client,
    config: Option<watcher::Config>,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + use<K>
where
    K: Resource<DynamicType = ()>
        + Clone
        + Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let client = client.clone();
    let plural = K::plural(&()).to_string();
    let api_version = K::api_version(&()).to_string();
    futures::stream::once(async move {
        let mut delay = std::time::Duration::from_millis(500);
        let served = loop {
            if config.is_none() {
                break false;
            }
            match client.list_api_group_resources(&api_version).await {
                Ok(list) => break list.resources.iter().any(|r| r.name == plural),
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    tracing::info!(api = %api_version, "not served by this cluster: DRA off");
                    break false;
                }
                // The API server is not reachable yet: ask again, as the watches do.
                Err(e) => {
                    tracing::warn!(api = %api_version, error = %e, "discovery failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(std::time::Duration::from_secs(30));
                }
            }
        };
        match config {
            Some(cfg) if served => watcher(Api::<K>::all(client), cfg)
                .default_backoff()
                .boxed(),
            _ => futures::stream::iter([Ok(watcher::Event::Init), Ok(watcher::Event::InitDone)])
                .chain(futures::stream::pending())
                .boxed(),
        }
    })
    .flatten()
}

#[cfg(test)]
mod tests;
