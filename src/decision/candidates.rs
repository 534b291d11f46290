//! The nodes a profile may use, by class: what the profile's selector matches and the pod
//! template's constraints (node selector, required affinity, tolerations) let the job's pods
//! land on. The placement step chooses among them; the memory model sizes against them.

use kube::core::{Selector, SelectorExt};

use crate::index::{NodeIndex, NodeInfo};
use offload_api::v1alpha1::{NodeClass, OffloadProfileSpec};

use super::PodConstraints;
use super::error::ResolveError;

/// The candidate nodes of one class that match the profile, sorted by name.
pub(super) struct ClassNodes<'a> {
    pub(super) class: NodeClass,
    pub(super) nodes: Vec<&'a NodeInfo>,
}

impl ClassNodes<'_> {
    pub(super) fn gpus(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.gpu_count())).sum()
    }
}

/// The nodes a profile may use, by class, that the pod template lets its pods land on.
pub(super) struct Candidates<'a> {
    pub(super) coherent: ClassNodes<'a>,
    pub(super) discrete: ClassNodes<'a>,
    /// What the template's constraints left out of each class (coherent, discrete), in a
    /// sentence; `None` where they left out nothing.
    left_out: [Option<String>; 2],
}

impl<'a> Candidates<'a> {
    /// The candidates of each class that the profile's selector matches.
    /// Nodes classed by the GPU driver alone (no agent report, so no labels to pin pods by)
    /// count only for a job pinned through its DRA claims (`by_claims`).
    pub(super) fn select(
        index: &'a NodeIndex,
        profile_name: &str,
        profile: &OffloadProfileSpec,
        by_claims: bool,
        constraints: &PodConstraints,
    ) -> Result<Self, ResolveError> {
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
        let profile_nodes = |class: NodeClass| -> Vec<&'a NodeInfo> {
            index
                .class(class)
                .filter(|n| selector.as_ref().is_none_or(|s| s.matches(&n.labels)))
                .filter(|n| by_claims || n.witness() != crate::index::Witness::DriverOnly)
                .collect()
        };
        // Every node is checked, also for a template with no constraints: its taints may keep
        // the pods off.
        let class = |class: NodeClass| -> (ClassNodes<'a>, Option<String>) {
            let all = profile_nodes(class);
            let left_out = constraints.left_out(all.iter().copied());
            let nodes = all
                .into_iter()
                .filter(|n| constraints.excludes(n).is_none())
                .collect();
            (ClassNodes { class, nodes }, left_out)
        };
        let (coherent, coherent_out) = class(NodeClass::Coherent);
        let (discrete, discrete_out) = class(NodeClass::Discrete);
        let candidates = Candidates {
            coherent,
            discrete,
            left_out: [coherent_out, discrete_out],
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

    /// What the template left out of every class, in one sentence.
    fn left_out_sentence(&self) -> Option<String> {
        let parts: Vec<&str> = self.left_out.iter().flatten().map(String::as_str).collect();
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    /// What the template left out of `class`.
    pub(super) fn left_out(&self, class: NodeClass) -> Option<&str> {
        match class {
            NodeClass::Coherent => self.left_out[0].as_deref(),
            NodeClass::Discrete => self.left_out[1].as_deref(),
        }
    }

    pub(super) fn of(&self, class: NodeClass) -> &ClassNodes<'a> {
        match class {
            NodeClass::Coherent => &self.coherent,
            NodeClass::Discrete => &self.discrete,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.coherent.nodes.is_empty() && self.discrete.nodes.is_empty()
    }

    /// The classes with nodes, in the profile's order.
    pub(super) fn ordered(&self, profile: &OffloadProfileSpec) -> Vec<&ClassNodes<'a>> {
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
            if !nodes.nodes.is_empty() && !out.iter().any(|o| o.class == *c) {
                out.push(nodes);
            }
        }
        out
    }
}
