//! Learning from what a TrainingJob's configuration used: each new window of its observed
//! peaks (and each out-of-memory failure) is a lesson for later decisions of the same shape on
//! the same node class ([`crate::decision::runs::lesson`]), planned here and kept by the operator's
//! [`crate::cluster::learned::LearnedStore`]. A lesson that cannot be drawn changes nothing.

use kube::ResourceExt;
use offload_api::v1alpha1::{MemoryKind, NodeClass, ObservedOverlap, OffloadDecisionStatus};

use super::planned::Learned;
use super::snapshot::Snapshot;
use crate::decision::ClusterView;
use crate::decision::model::memory::Placement;
use crate::decision::runs::lesson::Observed;
use crate::index::NodeIndex;

/// The placement a recorded decision wrote.
fn placement(d: &OffloadDecisionStatus) -> Option<Placement> {
    Some(Placement::from_state(d.placement?, d.offload_ratio))
}

/// The class the job ran on: the decision's, else the class of a node it was observed on.
fn class(
    nodes: &NodeIndex,
    d: &OffloadDecisionStatus,
    observed: &ObservedOverlap,
) -> Option<NodeClass> {
    d.node_class.or_else(|| {
        observed.nodes.iter().find_map(|n| {
            nodes
                .by_name(&n.node)
                .and_then(crate::index::NodeInfo::class)
        })
    })
}

/// What the job's configuration was observed to use (or ran out of), as a lesson's input;
/// `allocated` is what PyTorch's allocator said it needed, where known; `trained`: the workload
/// succeeded.
pub(super) fn observed(
    nodes: &NodeIndex,
    d: &OffloadDecisionStatus,
    observed: &ObservedOverlap,
    failed: Option<MemoryKind>,
    allocated: Option<u64>,
    trained: bool,
) -> Option<Observed> {
    let m = observed.memory.as_ref()?;
    if m.configuration != crate::decision::runs::evidence::configuration(d) {
        return None;
    }
    let as_u64 = |v: Option<i64>| v.and_then(|b| u64::try_from(b).ok());
    let gpu_bytes = as_u64(m.gpu_total_bytes)?;
    Some(Observed {
        placement: placement(d)?,
        class: class(nodes, d, observed)?,
        gpu_bytes,
        gpu_peak: match failed {
            // It needed at least all of it.
            Some(MemoryKind::Gpu) => Some(gpu_bytes),
            _ => as_u64(m.gpu_peak_bytes),
        },
        allocated,
        host_peak: as_u64(m.host_peak_bytes),
        failed,
        trained: trained && failed.is_none(),
        trial: d.trial.is_some(),
        decided_shape: d.estimate.as_ref().and_then(|e| e.shape.clone()),
        step_seconds: None,
    })
}

/// A GPU out-of-memory no agent window shows (the pod ran out before one was published, or no
/// agent watches its node), as a lesson's input: it needed at least all the memory of its
/// class's GPUs; `allocated` is what its own termination message said PyTorch needed, where it
/// did. A host kill without a window shows no figure, so it teaches nothing.
pub(super) fn observed_failure(
    nodes: &NodeIndex,
    d: &OffloadDecisionStatus,
    kind: MemoryKind,
    allocated: Option<u64>,
) -> Option<Observed> {
    if kind != MemoryKind::Gpu {
        return None;
    }
    let class = d.node_class?;
    let gpu_bytes = nodes
        .class(class)
        .filter_map(crate::index::NodeInfo::gpu_memory)
        .min()?;
    Some(Observed {
        placement: placement(d)?,
        class,
        gpu_bytes,
        gpu_peak: Some(gpu_bytes),
        allocated: allocated.filter(|a| *a > 0),
        host_peak: None,
        failed: Some(kind),
        trained: false,
        trial: d.trial.is_some(),
        decided_shape: d.estimate.as_ref().and_then(|e| e.shape.clone()),
        step_seconds: None,
    })
}

/// The lesson of `obs` for the snapshot's job, drawn with the configs it read; `None` where
/// none can be drawn (its configs were not read or are wrong, the profile does not learn).
pub(super) fn lesson(snap: &Snapshot, view: &dyn ClusterView, obs: &Observed) -> Option<Learned> {
    let tj = &snap.job;
    let Some(configs) = snap.configs.as_ref() else {
        tracing::debug!(job = %tj.name_any(), "not learned: its configs were not read");
        return None;
    };
    let lesson = crate::decision::lesson_of(tj, configs.deepspeed(), configs.model(), view, obs);
    let (profile, lesson) = match lesson {
        Ok(Some(pair)) => pair,
        Ok(None) => return None,
        Err(e) => {
            tracing::debug!(job = %tj.name_any(), reason = %e.message(), "not learned");
            return None;
        }
    };
    let who = crate::decision::run_id(tj);
    Some(Learned {
        profile,
        class: obs.class,
        run: lesson.run(&who, obs.failed.is_some(), snap.now),
        shape: lesson.shape,
        described: lesson.described,
        sentence: lesson.sentence,
    })
}
