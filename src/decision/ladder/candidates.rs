//! The nodes a profile may use, by class: what the profile's selector matches and the pod
//! template's constraints (node selector, required affinity, tolerations) let the job's pods
//! land on. The placement step chooses among them; the memory model sizes against them.
//!
//! A decision's cost must not grow with the cluster: the selection is worked out once per
//! index, profile, selector and constraints ([`NodeIndex::memo`]; every job of a burst shares
//! it), and what the steps need of a class's nodes (its GPUs, its smallest GPU, the lowest
//! overlap efficiency and the node it was measured on, …) is a [`ClassNodes::fact`], worked
//! out from the nodes once and then shared by every later decision against the same index.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kube::core::{Selector, SelectorExt};

use crate::index::{NodeIndex, NodeInfo};
use offload_api::v1alpha1::{NodeClass, OffloadProfileSpec};

use crate::decision::PodConstraints;
use crate::decision::error::ResolveError;

/// Facts about one set of a class's nodes, each worked out once (see [`ClassNodes::fact`]).
#[derive(Default)]
struct Facts(Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>);

/// The candidate nodes of one class that match the profile, sorted by name.
#[derive(Clone)]
pub(in crate::decision) struct ClassNodes<'a> {
    pub(in crate::decision) class: NodeClass,
    index: &'a NodeIndex,
    /// Positions in the index's nodes.
    positions: Arc<[usize]>,
    facts: Arc<Facts>,
}

/// The GPUs of a class's nodes: in all, and how many nodes have each count.
struct GpuCounts {
    total: u64,
    /// (GPUs on a node, nodes with that many), by GPUs.
    by_count: Vec<(u64, u64)>,
}

impl<'a> ClassNodes<'a> {
    fn new(class: NodeClass, index: &'a NodeIndex, positions: Vec<usize>) -> Self {
        ClassNodes {
            class,
            index,
            positions: positions.into(),
            facts: Arc::default(),
        }
    }

    /// The nodes, sorted by name.
    pub(in crate::decision) fn nodes(&self) -> impl Iterator<Item = &'a NodeInfo> + Clone + '_ {
        let index = self.index;
        self.positions.iter().filter_map(move |&p| index.get(p))
    }

    /// How many nodes.
    pub(in crate::decision) fn len(&self) -> usize {
        self.positions.len()
    }

    /// Whether there are none.
    pub(in crate::decision) fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// The nodes of this set that `keep` keeps (a set of its own, whose facts are worked out
    /// again).
    pub(in crate::decision) fn subset(&self, keep: impl Fn(&NodeInfo) -> bool) -> ClassNodes<'a> {
        let index = self.index;
        let positions = self
            .positions
            .iter()
            .copied()
            .filter(|&p| index.get(p).is_some_and(&keep))
            .collect();
        ClassNodes::new(self.class, index, positions)
    }

    /// The fact `T` about these nodes: `build` works it out from them the first time, and
    /// every later caller (this decision's steps, and later decisions against the same index
    /// and selection) gets the same one.
    pub(in crate::decision) fn fact<T: Send + Sync + 'static>(
        &self,
        build: impl FnOnce(&mut dyn Iterator<Item = &'a NodeInfo>) -> T,
    ) -> Arc<T> {
        let found = self
            .facts
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&TypeId::of::<T>())
            .cloned()
            .and_then(|f| f.downcast::<T>().ok());
        if let Some(found) = found {
            return found;
        }
        let built = Arc::new(build(&mut self.nodes()));
        self.facts
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(TypeId::of::<T>(), built.clone());
        built
    }

    fn gpu_counts(&self) -> Arc<GpuCounts> {
        self.fact(|nodes| {
            let mut by_count: std::collections::BTreeMap<u64, u64> = Default::default();
            let mut total = 0u64;
            for n in nodes {
                let g = u64::from(n.gpu_count());
                total = total.saturating_add(g);
                *by_count.entry(g).or_default() += 1;
            }
            GpuCounts {
                total,
                by_count: by_count.into_iter().collect(),
            }
        })
    }

    /// GPUs on these nodes in all.
    pub(in crate::decision) fn gpus(&self) -> u64 {
        self.gpu_counts().total
    }

    /// Pods of `gpus_per_pod` GPUs these nodes hold at once.
    pub(in crate::decision) fn pod_capacity(&self, gpus_per_pod: u32) -> u64 {
        let per = u64::from(gpus_per_pod.max(1));
        self.gpu_counts()
            .by_count
            .iter()
            .map(|&(g, nodes)| (g / per).saturating_mul(nodes))
            .fold(0u64, u64::saturating_add)
    }

    /// The first `n` nodes' names, sorted.
    pub(in crate::decision) fn first_names(&self, n: usize) -> Vec<&'a str> {
        self.nodes().take(n).map(|n| n.name.as_str()).collect()
    }
}

/// One class's selected nodes (positions in the index) and their facts.
type ClassSelection = (Arc<[usize]>, Arc<Facts>);

/// What [`Candidates::select`] works out once per index, profile, selector and constraints:
/// each class's positions and facts (coherent, discrete), and what the constraints left out.
struct Selection {
    classes: [ClassSelection; 2],
    left_out: [Option<String>; 2],
}

/// The nodes a profile may use, by class, that the pod template lets its pods land on.
pub(in crate::decision) struct Candidates<'a> {
    pub(in crate::decision) coherent: ClassNodes<'a>,
    pub(in crate::decision) discrete: ClassNodes<'a>,
    /// What the template's constraints left out of each class (coherent, discrete), in a
    /// sentence; `None` where they left out nothing.
    left_out: [Option<String>; 2],
}

impl<'a> Candidates<'a> {
    /// The candidates of each class that the profile's selector matches.
    /// Nodes classed by the GPU driver alone (no agent report, so no labels to pin pods by)
    /// count only for a job pinned through its DRA claims (`by_claims`).
    pub(in crate::decision) fn select(
        index: &'a NodeIndex,
        profile_name: &str,
        profile: &OffloadProfileSpec,
        by_claims: bool,
        constraints: &PodConstraints,
    ) -> Result<Self, ResolveError> {
        let selector_text = serde_json::to_string(&profile.node_selector).unwrap_or_default();
        let key = format!(
            "candidates\u{0}{profile_name}\u{0}{selector_text}\u{0}{by_claims}\u{0}{constraints:?}"
        );
        let selection = index.memo(&key, || {
            Self::work_out(index, profile_name, profile, by_claims, constraints)
        })?;
        let class = |i: usize, class: NodeClass| {
            let (positions, facts) = &selection.classes[i];
            ClassNodes {
                class,
                index,
                positions: positions.clone(),
                facts: facts.clone(),
            }
        };
        let candidates = Candidates {
            coherent: class(0, NodeClass::Coherent),
            discrete: class(1, NodeClass::Discrete),
            left_out: selection.left_out.clone(),
        };
        if candidates.is_empty()
            && let Some(detail) = candidates.left_out_sentence()
        {
            return Err(ResolveError::TemplateLeavesNoNodes {
                profile: profile_name.to_string(),
                class: String::new(),
                detail,
            });
        }
        Ok(candidates)
    }

    /// The selection itself: every node of each class checked against the profile's selector
    /// and the template's constraints (once per index, see [`Candidates::select`]).
    fn work_out(
        index: &NodeIndex,
        profile_name: &str,
        profile: &OffloadProfileSpec,
        by_claims: bool,
        constraints: &PodConstraints,
    ) -> Result<Selection, ResolveError> {
        let invalid = |detail: String| ResolveError::InvalidSelector {
            profile: profile_name.to_string(),
            detail,
        };
        let selector = match &profile.node_selector {
            Some(sel) => {
                offload_api::validation::label_selector(sel).map_err(invalid)?;
                Some(Selector::try_from(sel.clone()).map_err(|e| invalid(e.to_string()))?)
            }
            None => None,
        };
        // Every node is checked, also for a template with no constraints: its taints may keep
        // the pods off.
        let class = |class: NodeClass| -> (ClassSelection, Option<String>) {
            let profile_nodes: Vec<(usize, &NodeInfo)> = index
                .class_positions(class)
                .iter()
                .filter_map(|&p| index.get(p).map(|n| (p, n)))
                .filter(|(_, n)| selector.as_ref().is_none_or(|s| s.matches(&n.labels)))
                .filter(|(_, n)| by_claims || n.witness() != crate::index::Witness::DriverOnly)
                .collect();
            let left_out = constraints.left_out(profile_nodes.iter().map(|(_, n)| *n));
            let positions: Arc<[usize]> = profile_nodes
                .into_iter()
                .filter(|(_, n)| constraints.excludes(n).is_none())
                .map(|(p, _)| p)
                .collect();
            ((positions, Arc::default()), left_out)
        };
        let (coherent, coherent_out) = class(NodeClass::Coherent);
        let (discrete, discrete_out) = class(NodeClass::Discrete);
        Ok(Selection {
            classes: [coherent, discrete],
            left_out: [coherent_out, discrete_out],
        })
    }

    /// What the template left out of every class, in one sentence.
    fn left_out_sentence(&self) -> Option<String> {
        let parts: Vec<&str> = self.left_out.iter().flatten().map(String::as_str).collect();
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    /// What the template left out of `class`.
    pub(in crate::decision) fn left_out(&self, class: NodeClass) -> Option<&str> {
        match class {
            NodeClass::Coherent => self.left_out[0].as_deref(),
            NodeClass::Discrete => self.left_out[1].as_deref(),
        }
    }

    pub(in crate::decision) fn of(&self, class: NodeClass) -> &ClassNodes<'a> {
        match class {
            NodeClass::Coherent => &self.coherent,
            NodeClass::Discrete => &self.discrete,
        }
    }

    pub(in crate::decision) fn is_empty(&self) -> bool {
        self.coherent.is_empty() && self.discrete.is_empty()
    }

    /// The classes with nodes, in the profile's order.
    pub(in crate::decision) fn ordered(
        &self,
        profile: &OffloadProfileSpec,
    ) -> Vec<&ClassNodes<'a>> {
        let order = if profile.node_class_order.is_empty() {
            vec![NodeClass::Coherent, NodeClass::Discrete]
        } else {
            profile.node_class_order.clone()
        };
        let mut out: Vec<&ClassNodes> = Vec::new();
        for c in order
            .iter()
            .chain(&[NodeClass::Coherent, NodeClass::Discrete])
        {
            let nodes = self.of(*c);
            if !nodes.is_empty() && !out.iter().any(|o| o.class == *c) {
                out.push(nodes);
            }
        }
        out
    }
}
