//! The placement step: which nodes a profile may use, and which mode and node class the job
//! gets on them.

use kube::core::{Selector, SelectorExt};

use crate::api::{ModeSetting, NodeClass, OffloadMode, OffloadProfileSpec};
use crate::index::{NodeIndex, NodeInfo};

use super::error::ResolveError;
use super::request::JobRequest;
use super::{Source, effective};

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

/// The nodes a profile may use, by class.
pub(super) struct Candidates<'a> {
    coherent: ClassNodes<'a>,
    discrete: ClassNodes<'a>,
}

impl<'a> Candidates<'a> {
    /// The candidates of each class that the profile's selector matches.
    pub(super) fn select(
        index: &'a NodeIndex,
        profile_name: &str,
        profile: &OffloadProfileSpec,
    ) -> Result<Self, ResolveError> {
        let selector = match &profile.node_selector {
            Some(sel) => Some(Selector::try_from(sel.clone()).map_err(|e| {
                ResolveError::InvalidSelector {
                    profile: profile_name.to_string(),
                    detail: e.to_string(),
                }
            })?),
            None => None,
        };
        let class = |class: NodeClass| ClassNodes {
            class,
            nodes: index
                .class(class)
                .filter(|n| selector.as_ref().is_none_or(|s| s.matches(&n.labels)))
                .collect(),
        };
        Ok(Candidates {
            coherent: class(NodeClass::Coherent),
            discrete: class(NodeClass::Discrete),
        })
    }

    fn of(&self, class: NodeClass) -> &ClassNodes<'a> {
        match class {
            NodeClass::Coherent => &self.coherent,
            NodeClass::Discrete => &self.discrete,
        }
    }

    fn is_empty(&self) -> bool {
        self.coherent.nodes.is_empty() && self.discrete.nodes.is_empty()
    }
}

/// The mode and the nodes it was chosen for, with a reason for each.
pub(super) struct Placement<'c, 'a> {
    pub(super) mode: OffloadMode,
    /// The class's nodes; `None` when offload is disabled (any GPU node will do).
    pub(super) chosen: Option<&'c ClassNodes<'a>>,
    pub(super) mode_why: String,
    pub(super) class_why: String,
}

impl Placement<'_, '_> {
    pub(super) fn class(&self) -> Option<NodeClass> {
        self.chosen.map(|c| c.class)
    }
}

fn plural(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

fn capacity_message(class: &ClassNodes, demand: u64) -> String {
    let gpus = class.gpus();
    let names: Vec<&str> = class.nodes.iter().map(|n| n.name.as_str()).collect();
    let shown = if names.len() > 3 {
        format!("{}, … ({} nodes)", names[..3].join(", "), names.len())
    } else {
        names.join(", ")
    };
    let have = plural(gpus, "GPU", "GPUs");
    if gpus >= demand {
        format!(
            "pods pinned to {} nodes ({shown}: {have} for {demand} requested)",
            class.class
        )
    } else {
        format!(
            "pods pinned to {} nodes ({shown}: {have} for {demand} requested, so pods wait for capacity)",
            class.class
        )
    }
}

/// Decides mode and node class.
pub(super) fn choose<'c, 'a>(
    job: &JobRequest,
    profile_name: &str,
    profile: &OffloadProfileSpec,
    candidates: &'c Candidates<'a>,
) -> Result<Placement<'c, 'a>, ResolveError> {
    let demand = job.gpu_demand();
    let coherent = &candidates.coherent;
    let discrete = &candidates.discrete;
    let (requested, source) = effective(job.offload.mode, profile.mode, ModeSetting::Auto);
    let no_nodes = || ResolveError::NoReportedNodes {
        profile: profile_name.to_string(),
    };
    match requested {
        ModeSetting::Disabled => Ok(Placement {
            mode: OffloadMode::Disabled,
            chosen: None,
            mode_why: format!("offload disabled by {source}"),
            class_why:
                "no node class required: without offload the configuration fits any GPU node"
                    .to_string(),
        }),
        ModeSetting::UnifiedMemory => {
            if coherent.nodes.is_empty() {
                if candidates.is_empty() {
                    return Err(no_nodes());
                }
                return Err(ResolveError::NoCoherentNodes {
                    profile: profile_name.to_string(),
                    discrete: discrete.nodes.len(),
                });
            }
            Ok(Placement {
                mode: OffloadMode::UnifiedMemory,
                chosen: Some(coherent),
                mode_why: format!(
                    "UnifiedMemory requested by {source}; {} coherent node(s) available",
                    coherent.nodes.len()
                ),
                class_why: capacity_message(coherent, demand),
            })
        }
        ModeSetting::CpuCopy => {
            if !discrete.nodes.is_empty() {
                Ok(Placement {
                    mode: OffloadMode::CpuCopy,
                    chosen: Some(discrete),
                    mode_why: format!(
                        "CPUCopy requested by {source}; {} discrete node(s) available",
                        discrete.nodes.len()
                    ),
                    class_why: capacity_message(discrete, demand),
                })
            } else if coherent.nodes.is_empty() {
                Err(no_nodes())
            } else if profile.allow_cpu_copy_on_coherent_nodes {
                Ok(Placement {
                    mode: OffloadMode::CpuCopy,
                    chosen: Some(coherent),
                    mode_why: format!(
                        "CPUCopy requested by {source} on coherent nodes, which profile {profile_name:?} allows (allowCPUCopyOnCoherentNodes)"
                    ),
                    class_why: capacity_message(coherent, demand),
                })
            } else {
                Err(ResolveError::CopyOnCoherentNotAllowed {
                    profile: profile_name.to_string(),
                    coherent: coherent.nodes.len(),
                })
            }
        }
        ModeSetting::Auto => auto(profile, candidates, source, demand).ok_or_else(no_nodes),
    }
}

/// `mode: Auto`: the first class in the profile's order with enough GPUs (else the first with
/// any nodes), and the mode that class takes.
fn auto<'c, 'a>(
    profile: &OffloadProfileSpec,
    candidates: &'c Candidates<'a>,
    source: Source,
    demand: u64,
) -> Option<Placement<'c, 'a>> {
    let order = if profile.node_class_order.is_empty() {
        vec![NodeClass::Coherent, NodeClass::Discrete]
    } else {
        profile.node_class_order.clone()
    };
    let available: Vec<&ClassNodes> = order
        .iter()
        .map(|c| candidates.of(*c))
        .filter(|c| !c.nodes.is_empty())
        .collect();
    let first = available.first().copied()?;
    let fitting = available.iter().copied().find(|c| c.gpus() >= demand);
    let pick = fitting.unwrap_or(first);
    let (mode, why_mode) = match pick.class {
        NodeClass::Coherent => (
            OffloadMode::UnifiedMemory,
            "coherent nodes (ATS over NVLink-C2C) keep offloaded state resident in unified memory",
        ),
        NodeClass::Discrete => (
            OffloadMode::CpuCopy,
            "discrete nodes have no hardware-coherent host memory, so offload copies to host memory and back",
        ),
    };
    let class_why = match (available.len(), fitting.is_some()) {
        (1, _) => format!("only {} nodes match the profile", pick.class),
        (_, true) if std::ptr::eq(pick, first) => format!(
            "{} comes first in the profile's nodeClassOrder and has enough GPUs",
            pick.class
        ),
        (_, true) => format!(
            "{} comes earlier in nodeClassOrder but has too few GPUs ({} of {demand})",
            first.class,
            first.gpus()
        ),
        (_, false) => format!(
            "no class has {demand} GPUs; {} comes first in nodeClassOrder",
            pick.class
        ),
    };
    Some(Placement {
        mode,
        chosen: Some(pick),
        mode_why: format!("Auto (from {source}) chose {mode}: {why_mode}"),
        class_why: format!("{class_why}; {}", capacity_message(pick, demand)),
    })
}
