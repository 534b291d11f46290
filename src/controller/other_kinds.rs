//! Out-of-memory in the pods of other kinds (opted-in Pods, and the pods of batch Jobs,
//! JobSets, PyTorchJobs and TrainJobs the webhook configured, labelled
//! [`names::LABEL_CONFIGURED`]): the operator does not own these
//! objects and never recreates them, but it says what happened where their users look — a
//! Warning `OutOfMemory` Event on the pod and on the object that owns it, naming the
//! configuration that ran out, and on a batch Job the annotation
//! [`names::ANNOTATION_OUT_OF_MEMORY`] — once per pod.
//!
//! And the steps of their models still to be traced where a pod could not wait for the trace (a
//! bare Pod, a TrainJob's, one whose wait ran out): its env was written as it was created, from
//! the counted model, so the sizer traces the step now ([`names::ANNOTATION_SIZER_STEP`],
//! written by the webhook) for the jobs of it that come after.

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
use super::sizer_jobs::Progress;
use super::training_job::recovery::memory_failure;
use crate::sizer::cluster::{PendingStep, SizerSource};

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
    // Steps being traced for the jobs that come after, by namespace and key: each once at a
    // time, inside this future (nothing detached).
    let mut in_flight: BTreeSet<(String, String)> = BTreeSet::new();
    let mut tracers = futures::stream::FuturesUnordered::new();
    loop {
        let item = tokio::select! {
            item = stream.next() => match item {
                Some(item) => item,
                None => return,
            },
            Some(done) = tracers.next(), if !tracers.is_empty() => {
                in_flight.remove(&done);
                continue;
            }
        };
        let pod = match item {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(error = %e, "watching opted-in pods");
                continue;
            }
        };
        if let Some((source, pending)) = to_trace(&ctx, &pod) {
            let at = (source.namespace.clone(), pending.step.key.clone());
            if in_flight.insert(at.clone()) {
                let ctx = ctx.clone();
                tracers.push(async move {
                    trace_for_later(&ctx, &source, &pending).await;
                    at
                });
            }
        }
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

/// A configured pod whose model's step is still to be traced (its pending step, as the webhook
/// wrote it), where the operator traces models and no trace of it is kept.
fn to_trace(ctx: &Context, pod: &Pod) -> Option<(SizerSource, PendingStep)> {
    let store = ctx.view.traces.as_ref()?;
    let text = pod.annotations().get(names::ANNOTATION_SIZER_STEP)?;
    let pending = match PendingStep::parse(text) {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!(pod = %pod.name_any(), error = %e, "a pending step the operator did not write");
            return None;
        }
    };
    let source = SizerSource::of_pod(pod);
    let known = store.lookup_key(&source.namespace, &pending.step.key, jiff::Timestamp::now());
    (known == crate::decision::TraceInput::None).then_some((source, pending))
}

/// Runs the sizer of `pending` for `source` to its end (bounded by the sizer's time-out) and
/// keeps what it found, for the jobs of the step that come after.
async fn trace_for_later(ctx: &Context, source: &SizerSource, pending: &PendingStep) {
    let Some(store) = ctx.view.traces.as_ref() else {
        return;
    };
    let poll = std::time::Duration::from_secs(5);
    let give_up = tokio::time::Instant::now() + store.options().timeout * 2 + poll * 12;
    loop {
        match super::sizer_jobs::advance(
            &ctx.client,
            store,
            source,
            &pending.step,
            &pending.config_map,
            &pending.config_key,
        )
        .await
        {
            Ok(Progress::Started { .. } | Progress::Running) => {}
            Ok(Progress::Kept(_)) => return,
            Ok(Progress::Refused(why)) => {
                tracing::info!(namespace = %source.namespace, step = %pending.step.key, %why, "the sizer cannot run for a step of another kind");
                return;
            }
            Err(e) => tracing::debug!(error = %e, "tracing a step of another kind; tried again"),
        }
        if tokio::time::Instant::now() > give_up {
            return;
        }
        tokio::time::sleep(poll).await;
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
        reason: names::EVENT_OUT_OF_MEMORY.into(),
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
