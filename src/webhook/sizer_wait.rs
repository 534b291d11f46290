//! The pods of other kinds' jobs (batch Job, JobSet, PyTorchJob) wait for their model's step to
//! be traced. A pod's env is written as it is created and cannot change after, so the webhook
//! leaves the job's template unconfigured and marks it ([`names::ANNOTATION_SIZER_WAIT_UNTIL`]);
//! each of its pods is refused at creation while the sizer runs — the job's own controller
//! creates it again, with back-off — and decided from the trace once it is kept. The wait is
//! bounded twice: by the sizer Job's deadline (a sizer that ends without a trace lets the
//! counted model decide) and by the time on the template.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, Operation};
use offload_api::names;

use crate::cluster::view::AdmissionView;
use crate::controller::sizer_jobs::{self, Progress};
use crate::decision::TraceInput;
use crate::sizer::SizerOptions;
use crate::sizer::cluster::{PendingStep, SizerSource};

/// How long one admission waits for the sizer's state before answering "still waiting" (the
/// API server gives the webhook a few seconds; the pod's controller asks again).
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// What a held pod waits for: its step, until when, and how many pods its job runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Hold {
    /// The step to trace.
    pub pending: PendingStep,
    /// After this time the counted model decides.
    pub until: jiff::Timestamp,
    /// The pods of the job, which each pod is decided for.
    pub pods: u32,
}

impl Hold {
    /// The hold of a job's pods from now: until the sizer's attempts have had their time.
    pub fn from_now(pending: &PendingStep, options: &SizerOptions, pods: u32) -> Hold {
        let until = jiff::SignedDuration::try_from(wait_limit(options))
            .ok()
            .and_then(|d| jiff::Timestamp::now().checked_add(d).ok())
            .unwrap_or_else(jiff::Timestamp::now);
        Hold {
            pending: pending.clone(),
            until,
            pods,
        }
    }
}

/// How long the pods of a job wait at most: the sizer's two attempts (the job's own image, then
/// the sizer image) and a minute for their Jobs and pods to start.
pub fn wait_limit(options: &SizerOptions) -> Duration {
    options.timeout.saturating_mul(2) + Duration::from_secs(60)
}

/// The hold a pod's annotations ask for (`Ok(None)`: none), checked: a pod's annotations are its
/// author's to write, so a time further ahead than the webhook ever writes (`limit` from `now`)
/// is refused, as are a missing step and a pod count that is not one.
pub fn hold_of(
    annotations: &BTreeMap<String, String>,
    now: jiff::Timestamp,
    limit: Duration,
) -> Result<Option<Hold>, String> {
    let Some(until) = annotations.get(names::ANNOTATION_SIZER_WAIT_UNTIL) else {
        return Ok(None);
    };
    let wait = names::ANNOTATION_SIZER_WAIT_UNTIL;
    let until: jiff::Timestamp = until
        .parse()
        .map_err(|_| format!("annotation {wait}: use an RFC 3339 time, as the webhook writes"))?;
    let latest = jiff::SignedDuration::try_from(limit)
        .ok()
        .and_then(|d| now.checked_add(d).ok());
    if latest.is_none_or(|latest| until > latest) {
        return Err(format!(
            "annotation {wait}: {until} is more than {} s ahead, further than the webhook ever writes",
            limit.as_secs()
        ));
    }
    let step = names::ANNOTATION_SIZER_STEP;
    let pending = annotations
        .get(step)
        .ok_or_else(|| format!("annotation {wait} without {step}: remove it, or create the pod from a job the webhook configured"))
        .and_then(|text| {
            PendingStep::parse(text).map_err(|e| format!("annotation {step}: {e}"))
        })?;
    let pods = match annotations.get(names::ANNOTATION_WORKLOAD_PODS) {
        None => 1,
        Some(n) => n.parse::<u32>().ok().filter(|n| *n >= 1).ok_or_else(|| {
            format!(
                "annotation {}: use a pod count from 1 to {}",
                names::ANNOTATION_WORKLOAD_PODS,
                u32::MAX
            )
        })?,
    };
    Ok(Some(Hold {
        pending,
        until,
        pods,
    }))
}

/// Where a held pod's step stands, as the webhook found it before deciding.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum SizerState {
    /// Not asked: the pod is not held, its time is up, or the webhook runs no sizer.
    #[default]
    NotAsked,
    /// The sizer ended and what it found is kept.
    Kept(TraceInput),
    /// The sizer runs (or could not be asked this time): what the pod waits for.
    Waiting(String),
    /// The sizer cannot run here: why (the counted model decides).
    Refused(String),
}

/// Moves the sizer of a held pod's step on by one step (its Job created, read, or its trace
/// kept) and says where it stands. A dry run starts nothing.
pub async fn ask(
    view: &dyn AdmissionView,
    client: Option<&Client>,
    req: &AdmissionRequest<DynamicObject>,
) -> SizerState {
    let (Some(store), Some(client)) = (view.trace_store(), client) else {
        return SizerState::NotAsked;
    };
    // Most pods are held by nothing: their annotations say so before the pod is read.
    let held = req.object.as_ref().is_some_and(|o| {
        o.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(names::ANNOTATION_SIZER_WAIT_UNTIL))
    });
    if req.operation != Operation::Create || !held {
        return SizerState::NotAsked;
    }
    let Some(pod) = req
        .object
        .as_ref()
        .and_then(|o| serde_json::to_value(o).ok())
        .and_then(|v| serde_json::from_value::<Pod>(v).ok())
    else {
        return SizerState::NotAsked;
    };
    let now = jiff::Timestamp::now();
    let empty = BTreeMap::new();
    let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    let Ok(Some(hold)) = hold_of(annotations, now, wait_limit(store.options())) else {
        return SizerState::NotAsked;
    };
    if now >= hold.until {
        return SizerState::NotAsked;
    }
    let namespace = req.namespace.clone().unwrap_or_default();
    let known = store.lookup_key(&namespace, &hold.pending.step.key, now);
    if known != TraceInput::None {
        return SizerState::Kept(known);
    }
    if req.dry_run {
        return SizerState::Waiting("a dry run starts no sizer".into());
    }
    let mut source = SizerSource::of_pod(&pod);
    source.namespace = namespace;
    if source.asked_by.is_empty() {
        source.asked_by = pod.metadata.generate_name.clone().unwrap_or_default();
    }
    let step = &hold.pending;
    match advance(client, store, &source, step).await {
        Ok(Ok(Progress::Started { job, .. })) => {
            SizerState::Waiting(format!("its sizer Job {job} started"))
        }
        Ok(Ok(Progress::Running)) => SizerState::Waiting(format!(
            "its sizer Job (offload-sizer-{}-*) runs",
            step.step.key
        )),
        Ok(Ok(Progress::Kept(input))) => SizerState::Kept(input),
        Ok(Ok(Progress::Refused(why))) => SizerState::Refused(why),
        Ok(Err(e)) => SizerState::Waiting(format!("the sizer could not be asked: {e}")),
        Err(_) => SizerState::Waiting(format!(
            "no answer about the sizer within {} s",
            ASK_TIMEOUT.as_secs()
        )),
    }
}

/// [`sizer_jobs::advance`], bounded by [`ASK_TIMEOUT`].
async fn advance(
    client: &Client,
    store: &crate::cluster::traces::TraceStore,
    source: &SizerSource,
    step: &PendingStep,
) -> Result<Result<Progress, crate::controller::Error>, tokio::time::error::Elapsed> {
    tokio::time::timeout(
        ASK_TIMEOUT,
        sizer_jobs::advance(
            client,
            store,
            source,
            &step.step,
            &step.config_map,
            &step.config_key,
        ),
    )
    .await
}

/// The sizer to start as a held job is admitted, so that its trace is ready, or nearly, when
/// its first pods are created (a queued job's much earlier).
#[derive(Clone, Debug)]
pub struct Start {
    /// Whose pods it is for: the job's template, in its namespace.
    pub source: SizerSource,
    /// The step.
    pub step: PendingStep,
}

/// Starts the sizer of a held job's step (one already started is left as it is); what goes
/// wrong is left to the first pod's admission, which asks again.
pub async fn start(view: &dyn AdmissionView, client: &Client, start: &Start) {
    let Some(store) = view.trace_store() else {
        return;
    };
    match advance(client, store, &start.source, &start.step).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "starting a held job's sizer"),
        Err(_) => tracing::debug!("starting a held job's sizer: no answer in time"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step() -> String {
        PendingStep {
            step: crate::sizer::cluster::StepArgs {
                key: "ab12".into(),
                args: vec!["--sequence".into(), "1024".into()],
            },
            config_map: "model".into(),
            config_key: "config.json".into(),
        }
        .annotation()
    }

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_hold_is_read_from_what_the_webhook_writes_and_nothing_else() {
        let now: jiff::Timestamp = "2026-12-07T12:00:00Z".parse().unwrap();
        let limit = Duration::from_secs(600);
        let step = step();
        let wait = names::ANNOTATION_SIZER_WAIT_UNTIL;
        let pods = names::ANNOTATION_WORKLOAD_PODS;
        let sizer = names::ANNOTATION_SIZER_STEP;
        assert_eq!(hold_of(&annotations(&[]), now, limit), Ok(None));
        let held = hold_of(
            &annotations(&[(wait, "2026-12-07T12:05:00Z"), (sizer, &step), (pods, "8")]),
            now,
            limit,
        )
        .unwrap()
        .unwrap();
        assert_eq!(held.pods, 8);
        assert_eq!(held.pending.step.key, "ab12");
        // The pod count defaults to one.
        let held = hold_of(
            &annotations(&[(wait, "2026-12-07T12:05:00Z"), (sizer, &step)]),
            now,
            limit,
        )
        .unwrap()
        .unwrap();
        assert_eq!(held.pods, 1);
        for (bad, says) in [
            (annotations(&[(wait, "soon"), (sizer, &step)]), "RFC 3339"),
            (
                annotations(&[(wait, "2027-12-07T12:00:00Z"), (sizer, &step)]),
                "further than the webhook ever writes",
            ),
            (
                annotations(&[(wait, "2026-12-07T12:05:00Z")]),
                "without offload.dev/sizer-step",
            ),
            (
                annotations(&[(wait, "2026-12-07T12:05:00Z"), (sizer, "{}")]),
                "annotation offload.dev/sizer-step",
            ),
            (
                annotations(&[(wait, "2026-12-07T12:05:00Z"), (sizer, &step), (pods, "0")]),
                "a pod count from 1",
            ),
            (
                annotations(&[
                    (wait, "2026-12-07T12:05:00Z"),
                    (sizer, &step),
                    (pods, "99999999999"),
                ]),
                "a pod count from 1",
            ),
        ] {
            let err = hold_of(&bad, now, limit).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
    }
}
