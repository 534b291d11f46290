//! Whole cores near the GPU (a profile's `wholeCores`). The CPU update of offloaded optimizer
//! state copies across the host's memory for every step; on a two-socket node, cores on the
//! other socket than the GPU cross the socket link for each copy. The kubelet places a
//! container on cores of its own only under its `static` CPU manager, for a Guaranteed pod with
//! a whole-core CPU request, and on its GPU's socket only where its topology manager aligns
//! CPUs with devices (`single-numa-node` or `restricted`). The operator asks for that where the
//! nodes can give it and the pod can be Guaranteed, and says which condition is missing
//! otherwise; the start-up guard checks inside the pod what the kubelet really gave.

use crate::decision::resolution::Why;
use offload_api::v1alpha1::OffloadMode;
use offload_api::v1alpha1::ReasonCode;

use super::cpu::NodeCpu;
use crate::decision::ladder::candidates::ClassNodes;
use crate::decision::request::JobRequest;
use crate::decision::resolution::MemoryRequest;

/// What the training container is given to be Guaranteed on cores of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WholeCores {
    /// The training container's index in the pod template.
    pub container: usize,
    /// Its CPU request and limit, whole cores.
    pub cores: u32,
    /// Its memory request and limit, bytes.
    pub memory_bytes: u64,
}

/// The nodes of a class whose kubelet runs no `static` CPU manager policy: how many, and the
/// first few by name.
struct WithoutStatic {
    count: usize,
    first: Vec<String>,
}

/// Nodes (or containers) named in a reason, at most.
const NAMED: usize = 3;

/// Whether `job`'s training container asks for whole cores (the profile asked, `wanted`), and
/// why or why not; `(None, None)` where the profile did not ask.
pub(in crate::decision) fn ask(
    job: &JobRequest,
    wanted: bool,
    mode: OffloadMode,
    chosen: Option<&ClassNodes<'_>>,
    memory_request: Option<MemoryRequest>,
) -> (Option<WholeCores>, Option<Why>) {
    if !wanted {
        return (None, None);
    }
    let asked = || -> Result<(WholeCores, Why), String> {
        if mode == OffloadMode::Disabled {
            return Err("nothing is offloaded, so the CPU updates no optimizer state".into());
        }
        let (container, _) = job
            .training_container
            .ok_or("the pod template has no containers")?;
        let cores = whole_cpu_limit(job)?;
        let class = chosen.ok_or("no node class was chosen")?;
        all_static(class)?;
        if !job.not_guaranteed.is_empty() {
            let more = job.not_guaranteed.len().saturating_sub(NAMED);
            return Err(format!(
                "container(s) {}{} do not set CPU and memory limits equal to their requests, so the pod cannot be Guaranteed, and the kubelet gives cores of their own only to Guaranteed pods",
                job.not_guaranteed
                    .iter()
                    .take(NAMED)
                    .map(|n| format!("{n:?}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            ));
        }
        let (memory_bytes, whose) = memory(job, memory_request)?;
        #[allow(clippy::cast_precision_loss)]
        let memory = crate::decision::model::memory::gib(memory_bytes as f64);
        let why = Why::summed(
            ReasonCode::WholeCoresRequested,
            format!(
                "whole cores near the GPU: {cores} whole cores and {memory} of memory, requests equal to limits, so the pod is Guaranteed on the static CPU manager"
            ),
            format!(
                "whole cores near the GPU: the training container asks for {cores} whole cores and {memory} of memory, requests equal to limits ({whose}), so the pod is Guaranteed and every node of the class ({} in all) runs the static CPU manager, which gives it cores of its own; they lie on its GPU's socket where the kubelet's topologyManagerPolicy is single-numa-node or restricted, which the start-up guard checks in the pod. A Guaranteed pod is killed at its memory limit",
                class.len()
            ),
        );
        Ok((
            WholeCores {
                container,
                cores,
                memory_bytes,
            },
            why,
        ))
    };
    match asked() {
        Ok((whole, why)) => (Some(whole), Some(why)),
        Err(why) => (
            None,
            Some(Why::new(
                ReasonCode::WholeCoresNotAsked,
                format!("whole cores not asked: {why}"),
            )),
        ),
    }
}

/// The training container's own CPU limit as whole cores.
fn whole_cpu_limit(job: &JobRequest) -> Result<u32, String> {
    match &job.cpu_limit {
        Some((c, None)) if c.fract() == 0.0 && *c >= 1.0 && *c <= f64::from(u32::MAX) => {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let whole = *c as u32;
            Ok(whole)
        }
        Some((c, None)) => Err(format!(
            "the training container's CPU limit is {c} cores, not a whole number: the static CPU manager gives cores of their own only to whole-core requests"
        )),
        _ => Err(
            "the training container states no CPU limit of its own (e.g. resources.limits.cpu: \"8\"): the operator does not choose a pod's cores for it".into(),
        ),
    }
}

/// Every node of `class` runs the kubelet's static CPU manager, else which do not.
fn all_static(class: &ClassNodes<'_>) -> Result<(), String> {
    let without = class.fact(|nodes| {
        let mut w = WithoutStatic {
            count: 0,
            first: Vec::new(),
        };
        for n in nodes {
            if !NodeCpu::of(n).static_policy {
                w.count += 1;
                if w.first.len() < NAMED {
                    w.first.push(n.name.clone());
                }
            }
        }
        w
    });
    if without.count == 0 {
        return Ok(());
    }
    let more = without.count.saturating_sub(without.first.len());
    Err(format!(
        "{} node(s) of the class run no static CPU manager policy as the agent read it (the kubelet's cpu_manager_state; chart value agent.cpuManagerState): {}{} — whole cores there would still be a quota the kernel places anywhere",
        without.count,
        without.first.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    ))
}

/// The memory request and limit of a Guaranteed training container, and whose figure it is:
/// its limit stays; without one, the host memory the decision counts on (else its request)
/// becomes both.
fn memory(job: &JobRequest, counted: Option<MemoryRequest>) -> Result<(u64, &'static str), String> {
    let user_request = job.training_container.and_then(|(_, r)| r);
    match (job.training_memory_limit, counted.map(|r| r.bytes), user_request) {
        (Some(limit), _, _) => Ok((limit, "its memory limit")),
        (None, Some(counted), _) => Ok((counted, "the host memory the decision counts on")),
        (None, None, Some(request)) => Ok((request, "its memory request")),
        (None, None, None) => Err(
            "the training container states no memory limit or request, and the decision counts no host memory to make one of (set resources.limits.memory)".into(),
        ),
    }
}
