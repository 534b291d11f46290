//! Out-of-memory in the pods of other kinds (opted-in Pods, and the pods of batch Jobs,
//! JobSets, PyTorchJobs and TrainJobs the webhook configured, labelled
//! [`names::LABEL_CONFIGURED`]): the operator does not own these
//! objects and never recreates them, but it says what happened where their users look — a
//! Warning `OutOfMemory` Event on the pod and on the object that owns it, naming the
//! configuration that ran out, and on a batch Job the annotation
//! [`names::ANNOTATION_OUT_OF_MEMORY`] — once per pod.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use offload_api::names;
use offload_api::v1alpha1::MemoryKind;
use tokio_util::sync::CancellationToken;

use super::Context;
use super::training_job::recovery::memory_failure;

/// Pods remembered as announced (the oldest are forgotten first).
const REMEMBERED: usize = 10_000;

/// The configuration a pod runs, from the env the webhook wrote into its containers.
fn configuration(pod: &Pod) -> String {
    let env = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.env.iter().flatten())
        .filter(|e| {
            matches!(
                e.name.as_str(),
                "OFFLOAD_MODE" | "OFFLOAD_RATIO" | "OFFLOAD_PROFILE" | "OFFLOAD_PIN_MEMORY"
            )
        })
        .filter_map(|e| Some(format!("{}={}", e.name, e.value.as_deref()?)))
        .collect::<BTreeSet<_>>();
    if env.is_empty() {
        "the configuration the webhook wrote".into()
    } else {
        env.into_iter().collect::<Vec<_>>().join(" ")
    }
}

/// The container the webhook configured (the first with `OFFLOAD_MODE`): the training process,
/// whose failures alone count; `None` where no container carries it.
fn configured_container(pod: &Pod) -> Option<&str> {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .find(|c| c.env.iter().flatten().any(|e| e.name == "OFFLOAD_MODE"))
        .map(|c| c.name.as_str())
}

/// The note: what ran out, with what, and what to do.
fn note(pod: &Pod, kind: MemoryKind, message: &str, owner: Option<&ObjectReference>) -> String {
    let memory = match kind {
        MemoryKind::Gpu => "GPU",
        MemoryKind::Host => "host",
    };
    let what = owner.map_or_else(
        || "the pod".to_string(),
        |o| {
            format!(
                "{} {}",
                o.kind.as_deref().unwrap_or("object"),
                o.name.as_deref().unwrap_or("")
            )
        },
    );
    let last: String = message
        .lines()
        .last()
        .unwrap_or_default()
        .chars()
        .take(300)
        .collect();
    format!(
        "pod {} ran out of {memory} memory with {}: {last}. Only TrainingJobs are decided again and recreated; recreate {what} (the webhook decides again at creation, with more offload if you set spec.model hints or offload.dev annotations), or run it as a TrainingJob",
        pod.name_any(),
        configuration(pod)
    )
}

/// Watches opted-in pods that are not a TrainingJob's until `shutdown`.
pub async fn watch(ctx: Arc<Context>, shutdown: CancellationToken) {
    // Opted-in Pods carry the opt-in label; the pods of configured job templates the label the
    // webhook put on the template.
    let watch_of = |label: &str| {
        let pods: Api<Pod> = Api::all(ctx.client.clone());
        let selector = format!("{label},!{}", names::LABEL_TRAINING_JOB);
        watcher(pods, watcher::Config::default().labels(&selector))
            .default_backoff()
            .applied_objects()
    };
    let stream = futures::stream::select(
        watch_of(names::PROFILE_ANNOTATION),
        watch_of(names::LABEL_CONFIGURED),
    )
    .take_until(shutdown.cancelled_owned());
    futures::pin_mut!(stream);
    let mut announced: (BTreeSet<String>, VecDeque<String>) = Default::default();
    while let Some(item) = stream.next().await {
        let pod = match item {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "watching opted-in pods");
                continue;
            }
        };
        let Some((kind, message)) = memory_failure(&pod, configured_container(&pod)) else {
            continue;
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if !announced.0.insert(uid.clone()) {
            continue;
        }
        announced.1.push_back(uid);
        if announced.1.len() > REMEMBERED
            && let Some(old) = announced.1.pop_front()
        {
            announced.0.remove(&old);
        }
        announce(&ctx, &pod, kind, &message).await;
    }
}

async fn announce(ctx: &Context, pod: &Pod, kind: MemoryKind, message: &str) {
    let ns = pod.namespace().unwrap_or_default();
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| ObjectReference {
            api_version: Some(o.api_version.clone()),
            kind: Some(o.kind.clone()),
            name: Some(o.name.clone()),
            namespace: Some(ns.clone()),
            uid: Some(o.uid.clone()),
            ..ObjectReference::default()
        });
    let note = note(pod, kind, message, owner.as_ref());
    let event = || Event {
        type_: EventType::Warning,
        reason: "OutOfMemory".into(),
        note: Some(note.clone()),
        action: "Observe".into(),
        secondary: None,
    };
    for reference in std::iter::once(pod.object_ref(&())).chain(owner.clone()) {
        super::training_job::apply::publish_to(ctx, &reference, event()).await;
    }
    if let Some(o) = owner.filter(|o| {
        o.kind.as_deref() == Some("Job") && o.api_version.as_deref() == Some("batch/v1")
    }) {
        let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
        let value: String = note.chars().take(1024).collect();
        let patch = serde_json::json!({"metadata": {"annotations": {names::ANNOTATION_OUT_OF_MEMORY: value}}});
        if let Err(e) = jobs
            .patch(
                o.name.as_deref().unwrap_or_default(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            tracing::warn!(error = %e, "could not annotate the Job whose pod ran out of memory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_note_names_the_pod_its_configuration_and_what_to_do() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p-0"},
            "spec": {"containers": [{"name": "t", "env": [
                {"name": "OFFLOAD_MODE", "value": "disabled"}, {"name": "OFFLOAD_RATIO", "value": "0"},
                {"name": "USER", "value": "x"}]}]}
        }))
        .unwrap();
        let owner = ObjectReference {
            kind: Some("JobSet".into()),
            name: Some("js".into()),
            ..ObjectReference::default()
        };
        let n = note(
            &pod,
            MemoryKind::Gpu,
            "Traceback\ntorch.OutOfMemoryError: CUDA out of memory.",
            Some(&owner),
        );
        assert!(n.starts_with("pod p-0 ran out of GPU memory with OFFLOAD_MODE=disabled OFFLOAD_RATIO=0: torch.OutOfMemoryError"), "{n}");
        assert!(
            n.contains("recreate JobSet js") && !n.contains("USER"),
            "{n}"
        );
    }
}
