//! The decision's view of the Node cache: the node index, rebuilt only when the cache changed,
//! one changed node at a time where the cache logs which ([`crate::cluster::caches::ChangeLog`]).
//! It wraps the reflector stores, so it lives with the cluster view; the index it builds
//! ([`crate::index`]) stays pure.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::cluster::caches::ChangeLog;
use crate::cluster::tolerant::Tolerant;
use crate::dra::api::ResourceSlice;
use crate::index::{NodeIndex, NodeInfo, node_info};

/// The node index of the Node cache, rebuilt only when the cache changed.
///
/// The cache replaces an object's `Arc` on every change, so an unchanged list of pointers means
/// unchanged nodes: a caller compares pointers (no parsing, no copies) and shares the last
/// index. On a change only the nodes whose resourceVersion moved are parsed again.
pub struct NodeViews {
    store: Store<Node>,
    slices: Option<(Store<Tolerant<ResourceSlice>>, String)>,
    snapshot: Mutex<Snapshot>,
    /// The last index handed out and the caches' generations it is current for: what a caller
    /// gets while another one is checking or rebuilding the snapshot, where nothing moved since
    /// (never waiting behind a scan of every node for an index it already has).
    published: Mutex<Option<(Generations, Arc<NodeIndex>)>>,
    /// How many changes the node (and slice) caches have taken in, where known: while neither
    /// moved, the index is handed out without looking at a node.
    generations: Option<(Arc<AtomicU64>, Option<Arc<AtomicU64>>)>,
    /// The names of the nodes changed, where the node cache keeps them: a change is then
    /// taken in by reading those nodes alone, never the whole cache.
    log: Option<Arc<ChangeLog>>,
    /// Nodes read from the store so far (a full read reads all of them).
    reads: AtomicU64,
}

/// How many changes the node cache (and the slice cache, where read) had taken in.
type Generations = (u64, Option<u64>);

#[derive(Default)]
struct Snapshot {
    /// The caches' generations the index was checked at.
    generations: Option<Generations>,
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

impl Snapshot {
    /// Whether the snapshot was built from exactly these objects (the same `Arc`s: nothing the
    /// reflectors hold changed since).
    fn holds(&self, nodes: &[Arc<Node>], slices: &[Arc<Tolerant<ResourceSlice>>]) -> bool {
        self.objects.len() == nodes.len()
            && self
                .objects
                .iter()
                .zip(nodes)
                .all(|(a, b)| Arc::ptr_eq(a, b))
            && self.slices.len() == slices.len()
            && self
                .slices
                .iter()
                .zip(slices)
                .all(|(a, b)| Arc::ptr_eq(a, b))
    }

    /// Each node's view: parsed again only where its resourceVersion moved, the driver's word
    /// on top of it, and nodes that are gone forgotten.
    fn parse(
        &mut self,
        nodes: &[Arc<Node>],
        witnesses: &BTreeMap<String, crate::dra::slices::DriverWitness>,
    ) -> Vec<Arc<NodeInfo>> {
        let mut out = Vec::with_capacity(nodes.len());
        for node in nodes {
            let name = node.name_any();
            let rv = node.metadata.resource_version.clone().unwrap_or_default();
            match self.parsed.get(&name) {
                Some((cached_rv, info)) if *cached_rv == rv && !rv.is_empty() => {
                    out.push(info.clone());
                }
                _ => {
                    let info = Arc::new(node_info(node));
                    self.parsed.insert(name, (rv, info.clone()));
                    out.push(info);
                }
            }
        }
        for info in &mut out {
            if let Some(w) = witnesses.get(&info.name) {
                *info = Arc::new(NodeInfo::clone(info).with_driver(w.clone()));
            }
        }
        if self.parsed.len() > nodes.len() {
            let live: HashSet<&str> = nodes
                .iter()
                .filter_map(|n| n.metadata.name.as_deref())
                .collect();
            self.parsed.retain(|k, _| live.contains(k.as_str()));
        }
        out
    }
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
        let mut snap = match self.lock_snapshot(now) {
            Ok(snap) => snap,
            Err(last) => return last,
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
            self.publish(Some(now), &index);
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
            && snap.holds(&state, &slices)
        {
            let index = index.clone();
            snap.generations = now;
            self.publish(now, &index);
            return index;
        }
        let index = self.rebuild(&mut snap, state, slices);
        snap.generations = now;
        self.publish(now, &index);
        index
    }

    /// The index from the stores' whole state (`snap` holds what the last one was built from):
    /// each node parsed again only where it changed, the old index kept where none did.
    fn rebuild(
        &self,
        snap: &mut Snapshot,
        state: Vec<Arc<Node>>,
        slices: Vec<Arc<Tolerant<ResourceSlice>>>,
    ) -> Arc<NodeIndex> {
        let witnesses = match &self.slices {
            Some((_, driver)) if !slices.is_empty() => {
                crate::dra::slices::witnesses(&slices, driver)
            }
            _ => BTreeMap::new(),
        };
        let mut out = snap.parse(&state, &witnesses);
        // Nothing the index holds changed (a heartbeat, a status it does not read): keep it,
        // and what was worked out from it.
        out.sort_by(|a, b| a.name.cmp(&b.name));
        let same = snap.index.as_ref().filter(|old| {
            old.shared_nodes().len() == out.len()
                && old
                    .shared_nodes()
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
        index
    }

    /// The snapshot, held; or, while another caller is checking or rebuilding it, the last
    /// index handed out where it is current for the generations `now` (nothing changed since it
    /// was built). A caller woken by a change always waits for an index that holds it: a
    /// reconcile that read an index older than its own event would not be woken again.
    fn lock_snapshot(
        &self,
        now: Option<Generations>,
    ) -> Result<std::sync::MutexGuard<'_, Snapshot>, Arc<NodeIndex>> {
        match self.snapshot.try_lock() {
            Ok(s) => Ok(s),
            Err(std::sync::TryLockError::WouldBlock) => match self.published_for(now) {
                Some(index) => Err(index),
                None => Ok(self
                    .snapshot
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)),
            },
            // A panic while holding the lock leaves a snapshot that is at worst stale; the
            // pointer comparison in `get` rebuilds it.
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Ok(poisoned.into_inner()),
        }
    }

    /// The last index handed out, where it is current for the generations `now`.
    fn published_for(&self, now: Option<Generations>) -> Option<Arc<NodeIndex>> {
        let now = now?;
        self.published
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .filter(|(at, _)| *at == now)
            .map(|(_, index)| index.clone())
    }

    /// Makes `index` what a caller gets while another one holds the snapshot, for as long as
    /// the caches stay at `generations` (never, where they are not counted).
    fn publish(&self, generations: Option<Generations>, index: &Arc<NodeIndex>) {
        let mut published = self
            .published
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *published = generations.map(|g| (g, index.clone()));
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
