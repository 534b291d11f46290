//! The operator's view of the GPU nodes: each node's agent report, cross-checked against its
//! labels ([`NodeInfo`]), grouped by node class ([`NodeIndex`]), and rebuilt from the Node cache
//! only when a node changed ([`NodeViews`](crate::cluster::node_views::NodeViews)). The
//! controllers and the webhook share one.

mod node;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

pub use node::{Allocatable, NodeInfo, NodeTaint, Standing, Witness, cpu_cores};

use offload_api::v1alpha1::NodeClass;

/// Every known node, sorted by name, with the candidates of each class listed apart so a
/// decision looks only at the class it considers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeIndex {
    /// Shared with the parsed cache of the node views
    /// ([`crate::cluster::node_views::NodeViews`]): a rebuild after one node changed copies
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

    /// The nodes as shared views, sorted by name (what a rebuild compares pointers with).
    pub fn shared_nodes(&self) -> &[Arc<NodeInfo>] {
        &self.nodes
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

#[cfg(test)]
pub(crate) mod tests;
