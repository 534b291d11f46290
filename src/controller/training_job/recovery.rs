//! Recovery from out-of-memory: a training pod that fails from GPU memory (PyTorch's `CUDA out
//! of memory` in its termination message: the operator sets `FallbackToLogsOnError` on the
//! training container, so the kubelet puts the last log lines there) or from host memory
//! (`OOMKilled`) is evidence. It is recorded in the status, the job is decided again with its
//! estimates raised past what failed, and the workload is recreated with the configuration that
//! decision writes — at most the profile's `maxMemoryRetries` times, then the job is held with
//! the figures. A pod that fails for any other reason is never re-decided.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::apply::publish;
use crate::controller::conditions::{self, WORKLOAD_CREATED};
use crate::controller::{Context, Error, kube_err, status};
use crate::decision::memory::gib;
use offload_api::names;
use offload_api::v1alpha1::{
    JobPhase, MemoryFailure, MemoryKind, OffloadDecisionStatus, TrainingJob, TrainingJobStatus,
};

/// The condition saying whether a configuration that ran out of memory was replaced.
pub const MEMORY_RECOVERY: &str = "MemoryRecovery";

/// What PyTorch and CUDA libraries print when a GPU allocation fails.
pub const GPU_OOM_TEXT: &[&str] = &[
    "CUDA out of memory",
    "OutOfMemoryError",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDA error: out of memory",
    "cudaErrorMemoryAllocation",
];

/// Whether a failed process's last words are a GPU allocation failing.
pub fn says_gpu_out_of_memory(message: &str) -> bool {
    GPU_OOM_TEXT.iter().any(|t| message.contains(t))
}

/// Most characters of a pod's message kept as evidence.
const MAX_MESSAGE: usize = 1024;

/// How a container ran out of memory, from its terminated state (the current one, or the last
/// where the kubelet restarted it); `None` for anything else.
pub fn memory_failure(pod: &Pod) -> Option<(MemoryKind, String)> {
    let status = pod.status.as_ref()?;
    status.container_statuses.iter().flatten().find_map(|c| {
        let terminated = c
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .or_else(|| c.last_state.as_ref().and_then(|s| s.terminated.as_ref()))?;
        let message: String = terminated
            .message
            .as_deref()
            .unwrap_or_default()
            .trim()
            .chars()
            .rev()
            .take(MAX_MESSAGE)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        if terminated.reason.as_deref() == Some("OOMKilled") {
            let said = if message.is_empty() {
                format!(
                    "container {} was OOMKilled (exit {})",
                    c.name, terminated.exit_code
                )
            } else {
                message
            };
            return Some((
                MemoryKind::Host,
                offload_api::text::bounded_to(&said, MAX_MESSAGE),
            ));
        }
        (terminated.exit_code != 0 && says_gpu_out_of_memory(&message)).then(|| {
            (
                MemoryKind::Gpu,
                offload_api::text::bounded_to(&message, MAX_MESSAGE),
            )
        })
    })
}

/// A pod of `job` (the workload Job, by uid) that ran out of memory and is not recorded yet.
pub(super) fn unrecorded_failure(
    ctx: &Context,
    tj: &TrainingJob,
    job: &Job,
    recorded: &[MemoryFailure],
) -> Option<(String, MemoryKind, String)> {
    let store = ctx.pods.as_ref()?;
    let uid = job.metadata.uid.as_deref()?;
    let ns = tj.namespace().unwrap_or_default();
    let name = tj.name_any();
    store.state().iter().find_map(|pod| {
        let ours = pod.namespace().as_deref() == Some(ns.as_str())
            && pod.labels().get(names::LABEL_TRAINING_JOB) == Some(&name)
            && pod.owner_references().iter().any(|o| o.uid == uid);
        let pod_name = pod.name_any();
        if !ours || recorded.iter().any(|f| f.pod == pod_name) {
            return None;
        }
        memory_failure(pod).map(|(kind, message)| (pod_name, kind, message))
    })
}

/// The configuration a decision wrote, in the annotation's words.
pub fn configuration(d: &OffloadDecisionStatus) -> String {
    format!(
        "mode={} overlap={} ratio={} pinMemory={} nodeClass={} profile={}",
        d.mode,
        d.overlap,
        d.offload_ratio,
        d.pin_memory,
        d.node_class.map_or("none".to_string(), |c| c.to_string()),
        d.profile
    )
}

/// Records the failure, and — within the profile's bound — clears the workload and deletes its
/// Job, so the next reconcile decides again with the evidence and creates it anew.
pub(super) async fn recover(
    tj: &TrainingJob,
    ctx: &Context,
    current: &TrainingJobStatus,
    failed: (String, MemoryKind, String),
) -> Result<Action, Error> {
    let (pod, kind, message) = failed;
    let name = tj.name_any();
    let ns = tj.namespace().unwrap_or_default();
    let api: Api<TrainingJob> = Api::namespaced(ctx.client.clone(), &ns);
    let decision = current.offload.as_ref();
    let max = decision
        .and_then(|d| crate::decision::ClusterView::profile(&ctx.view, &d.profile))
        .map_or(offload_api::v1alpha1::DEFAULT_MAX_MEMORY_RETRIES, |p| {
            p.max_memory_retries
        });
    let estimate = decision.and_then(|d| d.estimate.clone());
    let (estimate_bytes, budget_bytes) = match (kind, estimate) {
        (MemoryKind::Gpu, Some(e)) => (Some(e.gpu_bytes), Some(e.gpu_budget_bytes)),
        (MemoryKind::Host, Some(e)) => (Some(e.host_bytes), e.host_budget_bytes),
        (_, None) => (None, None),
    };
    let failure = MemoryFailure {
        kind,
        configuration: decision.map(configuration).unwrap_or_default(),
        estimate_bytes,
        budget_bytes,
        pod: pod.clone(),
        message: message.clone(),
        seen_at: jiff::Timestamp::now().to_string(),
    };
    // What ran out is a lesson for the shape too: it needed more than it had.
    if let (Some(d), Some(o)) = (decision, current.observed.as_ref())
        && let Some(obs) = super::learn::observed(ctx, d, o, Some(kind))
    {
        super::learn::learn(tj, ctx, &obs).await;
    }
    let mut failures = current.memory_failures.clone();
    failures.push(failure);
    let n = failures.len();
    let memory = match kind {
        MemoryKind::Gpu => "GPU",
        MemoryKind::Host => "host",
    };
    #[allow(clippy::cast_precision_loss)]
    let figures = match (estimate_bytes, budget_bytes) {
        (Some(e), Some(b)) => format!(
            " (estimated {} of the {} it had)",
            gib(e as f64),
            gib(b as f64)
        ),
        _ => String::new(),
    };
    let said = format!(
        "pod {pod} ran out of {memory} memory with {}{figures}",
        decision.map(configuration).unwrap_or_default()
    );
    let exhausted = n > max as usize;
    let condition = if exhausted {
        conditions::condition(
            &current.conditions,
            MEMORY_RECOVERY,
            false,
            "RetriesExhausted",
            format!(
                "{said}; {n} configurations ran out of memory, more than the profile's maxMemoryRetries ({max}): the job is not re-decided again (each failure is in status.memoryFailures)"
            ),
            tj.metadata.generation,
        )
    } else {
        conditions::condition(
            &current.conditions,
            MEMORY_RECOVERY,
            true,
            "Redeciding",
            format!(
                "{said}; decided again with its {memory} estimates raised past that and recreated (re-decision {n} of at most {max})"
            ),
            tj.metadata.generation,
        )
    };
    status::write_memory(&api, &name, &failures, &condition).await?;
    publish(
        ctx,
        tj,
        EventType::Warning,
        "OutOfMemory",
        &condition.message,
    )
    .await;
    if exhausted {
        return Ok(Action::await_change());
    }
    // The workload goes: its reference first (a spec.offload change is refused while the job
    // has a workload), then its Job, pods first.
    let recreating = conditions::condition(
        &current.conditions,
        WORKLOAD_CREATED,
        false,
        "Recreating",
        format!("the workload is recreated after {said}"),
        tj.metadata.generation,
    );
    let part = status::WorkloadPart {
        phase: JobPhase::Pending,
        workload: None,
        created: &recreating,
        guard: None,
        observed: None,
        overlap: None,
        headroom: None,
        admitted: None,
    };
    status::write_workload(&api, &name, &part).await?;
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    match jobs.delete(&name, &DeleteParams::foreground()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(kube_err("deleting the workload Job that ran out of memory")(e)),
    }
    Ok(Action::await_change())
}

/// Whether the Job is on its way out (deleted, its pods still going).
pub(super) fn deleting(job: &Job) -> bool {
    job.meta().deletion_timestamp.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(containers: serde_json::Value) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "p"}, "status": {"containerStatuses": containers}}),
        )
        .unwrap()
    }

    #[test]
    fn a_cuda_oom_and_an_oom_kill_are_told_from_any_other_failure() {
        let gpu = pod(
            json!([{"name": "train", "image": "t", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "reason": "Error",
                "message": "Traceback (most recent call last):\n  ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.99 GiB. GPU 0 has a total capacity of 139.80 GiB"}}}]),
        );
        let (kind, message) = memory_failure(&gpu).unwrap();
        assert_eq!(kind, MemoryKind::Gpu);
        assert!(message.contains("Tried to allocate 3.99 GiB"), "{message}");
        let host = pod(
            json!([{"name": "train", "image": "t", "ready": false, "restartCount": 1,
            "state": {"running": {}},
            "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]),
        );
        let (kind, message) = memory_failure(&host).unwrap();
        assert_eq!(kind, MemoryKind::Host);
        assert!(message.contains("OOMKilled (exit 137)"), "{message}");
        for other in [
            json!([{"name": "train", "image": "t", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "ValueError: bad batch"}}}]),
            // The text, but the process succeeded (it printed a handled warning).
            json!([{"name": "train", "image": "t", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": "retrying after CUDA out of memory"}}}]),
            json!([{"name": "train", "image": "t", "ready": true, "restartCount": 0, "state": {"running": {}}}]),
        ] {
            assert_eq!(memory_failure(&pod(other.clone())), None, "{other}");
        }
        // A huge message is bounded, keeping its end (where PyTorch's error is).
        let long = format!("{}CUDA out of memory.", "x".repeat(100_000));
        let huge = pod(
            json!([{"name": "train", "image": "t", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "message": long}}}]),
        );
        let (_, message) = memory_failure(&huge).unwrap();
        assert!(message.chars().count() <= MAX_MESSAGE && message.ends_with("CUDA out of memory."));
    }
}
