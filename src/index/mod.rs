//! The operator's view of the GPU nodes: each node's agent report, cross-checked against its
//! labels ([`NodeInfo`]), grouped by node class ([`NodeIndex`]), and rebuilt from the Node cache
//! only when a node changed ([`NodeViews`]). The controllers and the webhook share one.

mod node;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::cluster::tolerant::Tolerant;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::cluster::caches::ChangeLog;

use crate::dra::api::ResourceSlice;

pub use node::{Allocatable, NodeInfo, NodeTaint, Standing, Witness};

use offload_api::v1alpha1::NodeClass;

/// Every known node, sorted by name, with the candidates of each class listed apart so a
/// decision looks only at the class it considers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeIndex {
    /// Shared with the parsed cache of [`NodeViews`]: a rebuild after one node changed copies
    /// pointers, not every node's labels and report.
    nodes: Vec<Arc<NodeInfo>>,
    coherent: Vec<usize>,
    discrete: Vec<usize>,
    /// What callers worked out from these nodes ([`NodeIndex::memo`]).
    memo: Memo,
}

/// Most entries a [`Memo`] keeps; past it, it starts again empty. An entry (a selection of
/// candidates) holds a position per selected node: at 20,000 nodes, 256 entries are at most
/// 40 MiB, and a burst of jobs shares a handful.
pub const MAX_MEMO_ENTRIES: usize = 256;

/// Facts worked out once from an index's nodes and reused by every later caller, as long as
/// the index lives: an index never changes (a changed node makes a new one), so nothing in it
/// goes stale. Keyed by what the caller derived the fact from; bounded by [`MAX_MEMO_ENTRIES`].
/// Not part of the index's identity: a clone starts empty and equality ignores it.
#[derive(Default)]
struct Memo {
    entries: Mutex<HashMap<String, Arc<dyn std::any::Any + Send + Sync>>>,
    /// How many facts were worked out (not found): what a benchmark or test counts.
    built: std::sync::atomic::AtomicU64,
    /// How many times a node was read from the index (its cost, counted).
    visits: std::sync::atomic::AtomicU64,
}

impl Clone for Memo {
    fn clone(&self) -> Self {
        Memo::default()
    }
}

impl PartialEq for Memo {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for Memo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Memo")
    }
}

impl NodeIndex {
    /// Indexes `nodes` (any order; sorted by name here).
    pub fn new(nodes: Vec<NodeInfo>) -> Self {
        NodeIndex::shared(nodes.into_iter().map(Arc::new).collect())
    }

    /// Indexes shared views (any order; sorted by name here).
    pub fn shared(mut nodes: Vec<Arc<NodeInfo>>) -> Self {
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        let mut index = NodeIndex {
            nodes,
            ..NodeIndex::default()
        };
        for (i, node) in index.nodes.iter().enumerate() {
            match node.class() {
                Some(NodeClass::Coherent) => index.coherent.push(i),
                Some(NodeClass::Discrete) => index.discrete.push(i),
                None => {}
            }
        }
        index
    }

    /// Every node, sorted by name.
    pub fn nodes(&self) -> impl ExactSizeIterator<Item = &NodeInfo> + Clone + '_ {
        self.visited(self.nodes.len());
        self.nodes.iter().map(|n| n.as_ref())
    }

    fn visited(&self, n: usize) {
        self.memo.visits.fetch_add(
            u64::try_from(n).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// How many nodes callers have read from this index so far ([`NodeIndex::get`] and
    /// [`NodeIndex::nodes`] count; what a decision's cost is measured by).
    pub fn visits(&self) -> u64 {
        self.memo.visits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The node named `name`.
    pub fn by_name(&self, name: &str) -> Option<&NodeInfo> {
        self.nodes
            .binary_search_by(|n| n.name.as_str().cmp(name))
            .ok()
            .map(|i| self.nodes[i].as_ref())
    }

    /// The node at `position` of [`NodeIndex::nodes`].
    pub fn get(&self, position: usize) -> Option<&NodeInfo> {
        self.visited(1);
        self.nodes.get(position).map(|n| n.as_ref())
    }

    /// The fact `T` under `key`: worked out by `build` the first time it is asked for, then the
    /// same one for every caller as long as this index lives (see [`Memo`]). `build` runs
    /// without the memo's lock held. Where two callers race, both build and one result stays.
    pub fn memo<T, E>(&self, key: &str, build: impl FnOnce() -> Result<T, E>) -> Result<Arc<T>, E>
    where
        T: Send + Sync + 'static,
    {
        let lock = |m: &Memo| {
            m.entries
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get(key)
                .cloned()
        };
        if let Some(found) = lock(&self.memo).and_then(|a| a.downcast::<T>().ok()) {
            return Ok(found);
        }
        let built = Arc::new(build()?);
        self.memo
            .built
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut entries = self
            .memo
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if entries.len() >= MAX_MEMO_ENTRIES {
            entries.clear();
        }
        entries.insert(key.to_string(), built.clone());
        Ok(built)
    }

    /// How many facts [`NodeIndex::memo`] has worked out for this index (not found in it).
    pub fn memo_builds(&self) -> u64 {
        self.memo.built.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Positions (in [`NodeIndex::nodes`]) of the candidates of one class, sorted by name.
    pub fn class_positions(&self, class: NodeClass) -> &[usize] {
        match class {
            NodeClass::Coherent => &self.coherent,
            NodeClass::Discrete => &self.discrete,
        }
    }

    /// The candidates of one class, sorted by name.
    pub fn class(&self, class: NodeClass) -> impl Iterator<Item = &NodeInfo> + '_ {
        let positions = match class {
            NodeClass::Coherent => &self.coherent,
            NodeClass::Discrete => &self.discrete,
        };
        self.visited(positions.len());
        positions.iter().map(|&i| self.nodes[i].as_ref())
    }

    /// Candidates of either class.
    pub fn candidates(&self) -> impl Iterator<Item = &NodeInfo> + '_ {
        self.nodes().filter(|n| n.class().is_some())
    }

    /// Nodes the agent published on whose publication cannot be used, with the reason.
    pub fn ignored(&self) -> impl Iterator<Item = (&NodeInfo, &str)> + '_ {
        self.nodes()
            .filter_map(|n| n.ignored_because().map(|why| (n, why)))
    }
}

impl From<Vec<NodeInfo>> for NodeIndex {
    fn from(nodes: Vec<NodeInfo>) -> Self {
        NodeIndex::new(nodes)
    }
}

/// The node view of one Node: its labels, the agent's annotations and its allocatable
/// resources.
pub fn node_info(node: &Node) -> NodeInfo {
    NodeInfo::from_metadata(
        node.name_any(),
        node.metadata.labels.clone().unwrap_or_default(),
        node.metadata
            .annotations
            .as_ref()
            .unwrap_or(&BTreeMap::new()),
    )
    .with_allocatable(Allocatable::of(node))
    .with_taints(
        node.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .map(|t| {
                t.iter()
                    .map(|t| NodeTaint {
                        key: t.key.clone(),
                        value: t.value.clone(),
                        effect: t.effect.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
    )
}

/// The node index of the Node cache, rebuilt only when the cache changed.
///
/// The cache replaces an object's `Arc` on every change, so an unchanged list of pointers means
/// unchanged nodes: a caller compares pointers (no parsing, no copies) and shares the last
/// index. On a change only the nodes whose resourceVersion moved are parsed again.
pub struct NodeViews {
    store: Store<Node>,
    slices: Option<(Store<Tolerant<ResourceSlice>>, String)>,
    snapshot: Mutex<Snapshot>,
    /// The last index handed out: what a caller gets while another one is checking or
    /// rebuilding the snapshot (never waiting behind a scan of every node).
    published: Mutex<Option<Arc<NodeIndex>>>,
    /// How many changes the node (and slice) caches have taken in, where known: while neither
    /// moved, the index is handed out without looking at a node.
    generations: Option<(Arc<AtomicU64>, Option<Arc<AtomicU64>>)>,
    /// The names of the nodes changed, where the node cache keeps them: a change is then
    /// taken in by reading those nodes alone, never the whole cache.
    log: Option<Arc<ChangeLog>>,
    /// Nodes read from the store so far (a full read reads all of them).
    reads: AtomicU64,
}

#[derive(Default)]
struct Snapshot {
    /// The caches' generations the index was checked at.
    generations: Option<(u64, Option<u64>)>,
    objects: Vec<Arc<Node>>,
    slices: Vec<Arc<Tolerant<ResourceSlice>>>,
    index: Option<Arc<NodeIndex>>,
    /// Parsed views by name, with the resourceVersion they were parsed at.
    parsed: HashMap<String, (String, Arc<NodeInfo>)>,
    /// The views the index holds, by name (the driver's word on top): what a change of one
    /// node is applied to. Kept by a full read, then changed one node at a time.
    views: BTreeMap<String, Arc<NodeInfo>>,
    /// The driver's word on each node, as of the last full read.
    witnesses: BTreeMap<String, crate::dra::slices::DriverWitness>,
}

impl NodeViews {
    /// Views over `store`.
    pub fn new(store: Store<Node>) -> Self {
        NodeViews {
            store,
            slices: None,
            snapshot: Mutex::default(),
            published: Mutex::default(),
            generations: None,
            log: None,
            reads: AtomicU64::new(0),
        }
    }

    /// The same views, told of each change the caches take in (`nodes`, and `slices` where
    /// slices are read): the index is then handed out at once while nothing changed, and a
    /// change that leaves every node's view as it was (a heartbeat, a status the index does not
    /// read) keeps the index — and what decisions worked out from it ([`NodeIndex::memo`]).
    pub fn with_generations(
        mut self,
        nodes: Arc<AtomicU64>,
        slices: Option<Arc<AtomicU64>>,
    ) -> Self {
        self.generations = Some((nodes, slices));
        self
    }

    /// The same views, told by the node cache which nodes changed (with
    /// [`NodeViews::with_generations`]): a change is taken in by reading those nodes alone —
    /// the cost of a heartbeat does not grow with the cluster. A new listing of the nodes, or a
    /// change of the slices, is read whole.
    pub fn with_change_log(mut self, log: Arc<ChangeLog>) -> Self {
        log.enable();
        self.log = Some(log);
        self
    }

    /// Views that also read `driver`'s ResourceSlices from `slices` (DRA's second witness).
    pub fn with_slices(
        store: Store<Node>,
        slices: Store<Tolerant<ResourceSlice>>,
        driver: String,
    ) -> Self {
        NodeViews {
            store,
            slices: Some((slices, driver)),
            snapshot: Mutex::default(),
            published: Mutex::default(),
            generations: None,
            log: None,
            reads: AtomicU64::new(0),
        }
    }

    /// How many nodes the views have read from the store so far: what taking in changes costs
    /// (for tests and benchmarks).
    pub fn node_reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// The index as of now.
    pub fn get(&self) -> Arc<NodeIndex> {
        // The generations first, then the stores: a change between the two is seen again on
        // the next call (never a store older than the generation recorded with it).
        let now = self.generations.as_ref().map(|(n, s)| {
            (
                n.load(Ordering::Acquire),
                s.as_ref().map(|s| s.load(Ordering::Acquire)),
            )
        });
        let mut snap = match self.snapshot.try_lock() {
            Ok(s) => s,
            // Another caller is checking or rebuilding: the last index handed out is at most
            // that one change old, and the next call sees it.
            Err(std::sync::TryLockError::WouldBlock) => {
                let last = self
                    .published
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone();
                match last {
                    Some(index) => return index,
                    None => self
                        .snapshot
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner),
                }
            }
            // A panic while holding the lock leaves a snapshot that is at worst stale; the
            // pointer comparison below rebuilds it.
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        };
        if let (Some(index), Some(now)) = (&snap.index, now)
            && snap.generations == Some(now)
        {
            return index.clone();
        }
        // The log is taken before the store is read: a change after it is logged again and
        // moves the generation, so the next call takes it in.
        let changed = self.log.as_ref().map(|log| log.take());
        if let (Some(changed), Some(now), Some(seen)) = (&changed, now, snap.generations)
            && snap.index.is_some()
            && !changed.all
            && now.1 == seen.1
        {
            let index = self.apply_changes(&mut snap, &changed.names);
            snap.generations = Some(now);
            self.publish(&index);
            return index;
        }
        let state = self.store.state();
        self.reads.fetch_add(
            u64::try_from(state.len()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        let slices = self
            .slices
            .as_ref()
            .map(|(s, _)| s.state())
            .unwrap_or_default();
        if let Some(index) = &snap.index
            && snap.objects.len() == state.len()
            && snap
                .objects
                .iter()
                .zip(&state)
                .all(|(a, b)| Arc::ptr_eq(a, b))
            && snap.slices.len() == slices.len()
            && snap
                .slices
                .iter()
                .zip(&slices)
                .all(|(a, b)| Arc::ptr_eq(a, b))
        {
            let index = index.clone();
            snap.generations = now;
            return index;
        }
        let witnesses = match &self.slices {
            Some((_, driver)) if !slices.is_empty() => {
                crate::dra::slices::witnesses(&slices, driver)
            }
            _ => BTreeMap::new(),
        };
        let mut out = Vec::with_capacity(state.len());
        for node in &state {
            let name = node.name_any();
            let rv = node.metadata.resource_version.clone().unwrap_or_default();
            match snap.parsed.get(&name) {
                Some((cached_rv, info)) if *cached_rv == rv && !rv.is_empty() => {
                    out.push(info.clone());
                }
                _ => {
                    let info = Arc::new(node_info(node));
                    snap.parsed.insert(name, (rv, info.clone()));
                    out.push(info);
                }
            }
        }
        // The driver's word on each node it publishes for, on top of the parsed view.
        if !witnesses.is_empty() {
            for info in &mut out {
                if let Some(w) = witnesses.get(&info.name) {
                    *info = Arc::new(NodeInfo::clone(info).with_driver(w.clone()));
                }
            }
        }
        // Forget nodes that are gone.
        if snap.parsed.len() > state.len() {
            let live: HashSet<&str> = state
                .iter()
                .filter_map(|n| n.metadata.name.as_deref())
                .collect();
            snap.parsed.retain(|k, _| live.contains(k.as_str()));
        }
        // Nothing the index holds changed (a heartbeat, a status it does not read): keep it,
        // and what was worked out from it.
        out.sort_by(|a, b| a.name.cmp(&b.name));
        let same = snap.index.as_ref().filter(|old| {
            old.nodes.len() == out.len()
                && old
                    .nodes
                    .iter()
                    .zip(&out)
                    .all(|(a, b)| Arc::ptr_eq(a, b) || a == b)
        });
        let views: BTreeMap<String, Arc<NodeInfo>> = match self.log {
            Some(_) => out.iter().map(|v| (v.name.clone(), v.clone())).collect(),
            None => BTreeMap::new(),
        };
        let index = match same {
            Some(old) => old.clone(),
            None => Arc::new(NodeIndex::shared(out)),
        };
        snap.views = views;
        snap.witnesses = witnesses;
        snap.index = Some(index.clone());
        snap.objects = state;
        snap.slices = slices;
        snap.generations = now;
        self.publish(&index);
        index
    }

    /// Makes `index` what a caller gets while another one holds the snapshot.
    fn publish(&self, index: &Arc<NodeIndex>) {
        *self
            .published
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(index.clone());
    }
}

impl NodeViews {
    /// Takes in the change of the nodes `names` (read from the store, parsed where their
    /// resourceVersion moved): the same index where no view changed (a heartbeat), else one
    /// built from the views kept.
    fn apply_changes(&self, snap: &mut Snapshot, names: &HashSet<String>) -> Arc<NodeIndex> {
        // The objects of the last full read are no longer what the index holds.
        snap.objects.clear();
        let mut changed = false;
        self.reads.fetch_add(
            u64::try_from(names.len()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        for name in names {
            match self.store.get(&ObjectRef::new(name)) {
                Some(node) => {
                    let rv = node.metadata.resource_version.clone().unwrap_or_default();
                    if !rv.is_empty() && snap.parsed.get(name).is_some_and(|(seen, _)| *seen == rv)
                    {
                        continue;
                    }
                    let info = Arc::new(node_info(&node));
                    snap.parsed.insert(name.clone(), (rv, info.clone()));
                    let view = match snap.witnesses.get(name) {
                        Some(w) => Arc::new(NodeInfo::clone(&info).with_driver(w.clone())),
                        None => info,
                    };
                    if snap.views.get(name).is_none_or(|old| **old != *view) {
                        snap.views.insert(name.clone(), view);
                        changed = true;
                    }
                }
                None => {
                    snap.parsed.remove(name);
                    changed |= snap.views.remove(name).is_some();
                }
            }
        }
        match (&snap.index, changed) {
            (Some(index), false) => index.clone(),
            _ => {
                let index = Arc::new(NodeIndex::shared(snap.views.values().cloned().collect()));
                snap.index = Some(index.clone());
                index
            }
        }
    }
}

#[cfg(test)]
mod tests;
