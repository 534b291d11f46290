//! The fit step: the job's memory model against each node class — the class's memory figures
//! for the job, how many of its pods a class holds at once, and the fastest placement of its
//! training state that runs there ([`crate::decision::ladder::rungs`]), as what earlier runs proved allows
//! ([`crate::decision::runs::proven`]).

use super::memory::{ClassMemory, JobMemory, gib};
use crate::decision::ladder::candidates::ClassNodes;
use crate::decision::ladder::rungs;
use crate::decision::ladder::rungs::Allowed;
use crate::decision::ladder::rungs::MemoryChoice;
use crate::decision::ladder::rungs::Tried;
use crate::decision::request::JobRequest;
use crate::decision::runs::proven;

/// The sizes of a class's GPUs, smallest first, each once.
struct GpuSizes {
    sizes: Vec<u64>,
}

/// What a class's nodes have of memory: the smallest GPU (the first node by name with it), and
/// each node's allocatable host memory by its count of GPUs (memory, then name, ascending).
struct NodeMemory {
    smallest_gpu: Option<(String, u64)>,
    host_by_gpus: Vec<(u64, Vec<(u64, String)>)>,
}

impl NodeMemory {
    fn of(nodes: &mut dyn Iterator<Item = &crate::index::NodeInfo>) -> NodeMemory {
        let mut smallest_gpu: Option<(String, u64)> = None;
        let mut by_gpus: std::collections::BTreeMap<u64, Vec<(u64, String)>> = Default::default();
        for n in nodes {
            if let Some(m) = n.gpu_memory()
                && smallest_gpu.as_ref().is_none_or(|(_, s)| m < *s)
            {
                smallest_gpu = Some((n.name.clone(), m));
            }
            if let Some(memory) = n.allocatable.memory {
                by_gpus
                    .entry(u64::from(n.gpu_count()))
                    .or_default()
                    .push((memory, n.name.clone()));
            }
        }
        let host_by_gpus = by_gpus
            .into_iter()
            .map(|(g, mut nodes)| {
                nodes.sort();
                (g, nodes)
            })
            .collect();
        NodeMemory {
            smallest_gpu,
            host_by_gpus,
        }
    }
}

/// Pods of `gpus_per_pod` GPUs the class's nodes hold at once.
pub(in crate::decision) fn pod_capacity(class: &ClassNodes, gpus_per_pod: u32) -> u64 {
    class.pod_capacity(gpus_per_pod)
}

/// The fastest placement that fits on `class` for a job whose GPUs come through DRA claims:
/// its claims can select GPUs by memory, so each size of GPU the class has is tried with the
/// nodes that have at least that much (when they hold the job), and the fastest choice wins —
/// the widest set of nodes where two are as fast. Device-plugin GPUs cannot be chosen by size:
/// the class's smallest GPU sizes the job.
pub(in crate::decision) fn fastest_by_gpu_size(
    jm: &JobMemory,
    class: &ClassNodes,
    job: &JobRequest,
    allowed: &Allowed,
    holds: &dyn Fn(&ClassNodes) -> bool,
) -> Option<(ClassMemory, Result<MemoryChoice, Tried>)> {
    let widest = class_memory(class, job)?;
    let decide =
        |cm: &ClassMemory| proven::apply(jm, cm, allowed, job, rungs::fastest(jm, cm, allowed));
    let first = decide(&widest);
    if job.gpu_claims.is_none() {
        return Some((widest, first));
    }
    let sizes = class.fact(|nodes| GpuSizes {
        sizes: {
            let mut sizes: Vec<u64> = nodes.filter_map(|n| n.gpu_memory()).collect();
            sizes.sort_unstable();
            sizes.dedup();
            sizes
        },
    });
    let mut best = (widest, first);
    for &size in sizes.sizes.iter().skip(1) {
        let tier = class.subset(|n| n.gpu_memory().is_some_and(|m| m >= size));
        if !holds(&tier) {
            break;
        }
        let Some(cm) = class_memory(&tier, job) else {
            continue;
        };
        if let Ok(mut choice) = decide(&cm) {
            let better = match &best.1 {
                Ok(b) => allowed.speed_rank(choice.placement) < allowed.speed_rank(b.placement),
                Err(_) => true,
            };
            if better {
                choice.figures.push_str(&format!(
                    "; on the GPUs of {} or more only ({} of the class's {} nodes): the job's DRA claims select GPUs by memory",
                    gib(as_f64(size)),
                    tier.len(),
                    class.len()
                ));
                choice.brief.push_str(&format!(
                    "; its DRA claims select GPUs by memory ({} or more)",
                    gib(as_f64(size))
                ));
                best = (cm, Ok(choice));
            }
        }
    }
    Some(best)
}

fn as_f64(n: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let v = n as f64;
    v
}

/// The class's memory figures for the job: its smallest GPU, and the least host memory a pod
/// of the job gets on any of its nodes. `None` when no node reports its GPUs' memory.
pub(in crate::decision) fn class_memory(
    class: &ClassNodes,
    job: &JobRequest,
) -> Option<ClassMemory> {
    let memory = class.fact(NodeMemory::of);
    let (gpu_node, gpu_bytes) = memory.smallest_gpu.as_ref()?;
    let (gpu_node, gpu_bytes) = (gpu_node.as_str(), *gpu_bytes);
    let per = u64::from(job.gpus_per_pod.max(1));
    let pods = u64::from(job.pods.max(1));
    // The least host memory a pod gets: per count of GPUs on a node, the nodes' memory sorted,
    // so only the few smallest of each count are looked at; the first node by name of those
    // with the least share, as a walk of every node would find it.
    let host = memory
        .host_by_gpus
        .iter()
        .filter_map(|(gpus, nodes)| {
            let sharing = (*gpus / per).clamp(1, pods);
            let least = nodes.first()?.0 / sharing;
            // Every node of this count whose share is that least share (integer division).
            let bound = least.saturating_add(1).saturating_mul(sharing);
            nodes
                .iter()
                .take_while(|(m, _)| *m < bound)
                .min_by(|a, b| a.1.cmp(&b.1))
                .map(|(m, name)| (name.as_str(), *m, sharing, least))
        })
        .min_by(|a, b| a.3.cmp(&b.3).then_with(|| a.0.cmp(b.0)));
    #[allow(clippy::cast_precision_loss)]
    let (host_per_pod, host_node) = match host {
        Some((name, memory, sharing, share)) => (
            Some(share),
            format!(
                "{name}: {} allocatable for {sharing} pod{}",
                gib(memory as f64),
                if sharing == 1 { "" } else { "s" }
            ),
        ),
        None => (None, String::new()),
    };
    Some(ClassMemory {
        gpu_bytes,
        gpu_node: gpu_node.to_string(),
        host_per_pod,
        host_node,
        class: Some(class.class),
    })
}
