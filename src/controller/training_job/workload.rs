//! The workload Job and its pods as the controller reads them: the Job's phase, what the
//! controller's caches keep of each, and how a pod's start-up guard ended.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::render;
use offload_api::v1alpha1::JobPhase;

/// How one pod's start-up guard ended.
#[derive(Debug, PartialEq)]
pub enum GuardOutcome {
    /// It passed, on this node.
    Passed(String),
    /// It failed: which pod on which node, and the guard's own message.
    Failed(String),
}

/// The guard's outcome in a pod, from its init container status (the current state, or the last
/// one when the kubelet is already retrying it).
pub fn guard_outcome(pod: &Pod) -> Option<GuardOutcome> {
    let status = pod.status.as_ref()?;
    let guard = status
        .init_container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == render::GUARD_CONTAINER)?;
    let terminated = guard
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .or_else(|| {
            guard
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
        })?;
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_else(|| "unknown".into());
    if terminated.exit_code == 0 {
        return Some(GuardOutcome::Passed(node));
    }
    // The guard's message, bounded (a status condition is not a log).
    let text: String = terminated
        .message
        .as_deref()
        .unwrap_or("the guard exited without a message")
        .trim()
        .chars()
        .take(1024)
        .collect();
    Some(GuardOutcome::Failed(format!(
        "pod {} on node {node}: {text}",
        pod.name_any()
    )))
}

/// Keeps of a workload pod what the controller reads: its metadata, the node it runs on, and
/// its phase and its containers' states (the start-up guard's outcome, a training container
/// that ran out of memory).
pub fn slim_pod(pod: &mut Pod) {
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
        node_name: node,
        ..Default::default()
    });
    if let Some(status) = pod.status.take() {
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: status.phase,
            // Only whether the scheduler placed it (or why not).
            conditions: status.conditions.map(|cs| {
                cs.into_iter()
                    .filter(|c| c.type_ == "PodScheduled")
                    .collect()
            }),
            init_container_statuses: status.init_container_statuses,
            container_statuses: status.container_statuses,
            ..Default::default()
        });
    }
}

/// Phase from the Job: `Queued` while it is suspended (Kueue has not admitted it, or suspended
/// it again), `Running` once a pod is ready (the Job's `active` also counts pods that are still
/// pending).
pub(super) fn phase_of(job: &Job) -> JobPhase {
    let suspended = job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false);
    let Some(status) = job.status.as_ref() else {
        return if suspended {
            JobPhase::Queued
        } else {
            JobPhase::Pending
        };
    };
    let has = |t: &str| {
        status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == t && c.status == "True")
    };
    if has("Complete") {
        JobPhase::Succeeded
    } else if has("Failed") {
        JobPhase::Failed
    } else if suspended {
        JobPhase::Queued
    } else if status.ready.unwrap_or(0) > 0 {
        JobPhase::Running
    } else {
        JobPhase::Pending
    }
}

/// Drops from a workload Job what following it never reads, for the controller's cache of
/// them: the pod template keeps only its init containers' names (is the start-up guard
/// there?) and the rendered-config volume; containers, the template's metadata and the other
/// volumes go. The Job's own metadata and status stay whole.
pub fn slim_workload(job: &mut Job) {
    let Some(spec) = job.spec.as_mut() else {
        return;
    };
    spec.template.metadata = None;
    if let Some(pod) = spec.template.spec.as_mut() {
        let init: Option<Vec<k8s_openapi::api::core::v1::Container>> =
            pod.init_containers.as_ref().map(|cs| {
                cs.iter()
                    .map(|c| k8s_openapi::api::core::v1::Container {
                        name: c.name.clone(),
                        ..Default::default()
                    })
                    .collect()
            });
        let volumes = pod.volumes.take().map(|vs| {
            vs.into_iter()
                .filter(|v| v.name == render::CONFIG_VOLUME)
                .collect::<Vec<_>>()
        });
        *pod = k8s_openapi::api::core::v1::PodSpec {
            init_containers: init,
            volumes,
            ..Default::default()
        };
    }
}
