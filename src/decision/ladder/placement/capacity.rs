//! How much of a job a class holds at once, and the messages that say so.

use crate::decision::error::ResolveError;
use crate::decision::ladder::placement::ClassNodes;
use crate::decision::request::JobRequest;

fn plural(n: u64, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

pub(in crate::decision::ladder::placement) fn shown_nodes(class: &ClassNodes) -> String {
    let names = class.first_names(3);
    if class.len() > 3 {
        format!("{}, … ({} nodes)", names.join(", "), class.len())
    } else {
        names.join(", ")
    }
}

pub(in crate::decision::ladder::placement) fn capacity_message(
    class: &ClassNodes,
    job: &JobRequest,
) -> String {
    let wait = if class.pod_capacity(job.gpus_per_pod) >= u64::from(job.pods.max(1)) {
        ""
    } else {
        ", so pods wait for capacity"
    };
    format!(
        "pods pinned to {} nodes ({}: {} for {} requested{wait})",
        class.class,
        shown_nodes(class),
        plural(class.gpus(), "GPU", "GPUs"),
        job.gpu_demand()
    )
}

/// Whether the class holds all of the job's pods at once (or the job's pods may wait for
/// capacity: see [`JobRequest::hold_for_capacity`]).
pub(in crate::decision::ladder::placement) fn holds(class: &ClassNodes, job: &JobRequest) -> bool {
    !job.hold_for_capacity || class.pod_capacity(job.gpus_per_pod) >= u64::from(job.pods.max(1))
}

/// The error for a job no class can hold at once.
pub(in crate::decision::ladder::placement) fn insufficient(
    job: &JobRequest,
    classes: &[&ClassNodes],
) -> ResolveError {
    let have: Vec<String> = classes
        .iter()
        .map(|c| {
            format!(
                "{} holds {} ({})",
                c.class,
                plural(c.pod_capacity(job.gpus_per_pod), "such pod", "such pods"),
                plural(c.gpus(), "GPU", "GPUs")
            )
        })
        .collect();
    ResolveError::InsufficientGpus {
        detail: format!(
            "the job needs {} of {} at once ({} in all), so that its ranks meet; no node class matching the profile holds them: {}. It waits until nodes arrive; or lower spec.replicas or the GPUs per pod",
            plural(u64::from(job.pods), "pod", "pods"),
            plural(u64::from(job.gpus_per_pod), "GPU", "GPUs"),
            plural(job.gpu_demand(), "GPU", "GPUs"),
            if have.is_empty() {
                "none has nodes".to_string()
            } else {
                have.join(", ")
            }
        ),
    }
}
