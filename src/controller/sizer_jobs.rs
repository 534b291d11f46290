//! The sizer's Jobs, run for a TrainingJob before its workload ([`super::training_job`]), for
//! the pods of other kinds' jobs as they are created ([`crate::webhook::sizer_wait`]) and for
//! bare Pods after theirs ([`super::other_kinds`]): one step moved on each call —
//! its Job created, read where it ended, another image tried where the job's own cannot build
//! the model, and what it found kept ([`crate::cluster::traces`]).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};

use super::{Error, kube_err};
use crate::cluster::traces::{Scope, TraceStore};
use crate::decision::TraceInput;
use crate::sizer::cluster::{self, Attempt, Outcome, SizerSource, StepArgs};
use offload_api::trace::{ModelTrace, SizerFailure, TraceError};

/// How long past its deadline a sizer Job that still has not ended is given up (its Job
/// controller is behind).
const GRACE: Duration = Duration::from_secs(30);

/// Where a step's sizer stands.
pub(crate) enum Progress {
    /// Its Job was just created, with this name and image.
    Started {
        /// The Job.
        job: String,
        /// Its image.
        image: String,
    },
    /// It runs.
    Running,
    /// It ended; what it found is kept.
    Kept(TraceInput),
    /// It cannot run here (no image to run it from, its Job refused): why.
    Refused(String),
}

/// Moves the sizer of `step` for `source` on by one step (`config_map`/`config_key`: the
/// model's `config.json` in the job's namespace).
pub(crate) async fn advance(
    client: &Client,
    store: &TraceStore,
    source: &SizerSource,
    step: &StepArgs,
    config_map: &str,
    config_key: &str,
) -> Result<Progress, Error> {
    let options = store.options();
    let Some(mut attempt) = cluster::first_attempt(source, options) else {
        return Ok(Progress::Refused(
            "no image to run the sizer from: the job's own image is not allowed (sizer.useJobImage) and no sizer image is set (sizer.image)".into(),
        ));
    };
    let jobs: Api<Job> = Api::namespaced(client.clone(), &source.namespace);
    loop {
        let name = cluster::job_name(&step.key, attempt);
        let Some(job) = jobs
            .get_opt(&name)
            .await
            .map_err(kube_err("reading the sizer Job"))?
        else {
            return start(&jobs, store, source, step, config_map, config_key, attempt).await;
        };
        let pods = pods_of(client, &source.namespace, &name).await?;
        let result = match cluster::outcome(&job, &pods) {
            Outcome::Running if age(&job) <= options.timeout + GRACE => {
                return Ok(Progress::Running);
            }
            Outcome::Running => Err(SizerFailure {
                code: "TimedOut".into(),
                message: format!("no result after {:.0} s", age(&job).as_secs_f64()),
            }),
            Outcome::Traced(trace) => Ok(*trace),
            Outcome::Failed {
                image_lacks: true, ..
            } if attempt == Attempt::JobImage
                && cluster::image_of(source, Attempt::SizerImage, options).is_some() =>
            {
                attempt = Attempt::SizerImage;
                continue;
            }
            Outcome::Failed { code, message, .. } => Err(SizerFailure { code, message }),
        };
        return keep(client, store, source, step, attempt, result).await;
    }
}

/// Creates the sizer Job of `attempt` (one already there is the same).
async fn start(
    jobs: &Api<Job>,
    store: &TraceStore,
    source: &SizerSource,
    step: &StepArgs,
    config_map: &str,
    config_key: &str,
    attempt: Attempt,
) -> Result<Progress, Error> {
    let Some(image) = cluster::image_of(source, attempt, store.options()) else {
        return Ok(Progress::Refused("no image to run the sizer from".into()));
    };
    let job = cluster::sizer_job(
        source,
        step,
        config_map,
        config_key,
        &image,
        attempt,
        store.options(),
    );
    match jobs.create(&PostParams::default(), &job).await {
        Ok(_) => Ok(Progress::Started {
            job: job.name_any(),
            image,
        }),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(Progress::Running),
        // Refused for good (a quota, a policy): the counted model decides, and says why.
        Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 422) => {
            Ok(Progress::Refused(format!(
                "the sizer's Job was refused ({}): the counted model decides",
                offload_api::text::bounded_to(&e.message, 300)
            )))
        }
        Err(e) => Err(kube_err("creating the sizer Job")(e)),
    }
}

/// Keeps what the sizer found: a job image's trace for its namespace, the sizer image's for
/// the cluster.
async fn keep(
    client: &Client,
    store: &TraceStore,
    source: &SizerSource,
    step: &StepArgs,
    attempt: Attempt,
    result: Result<ModelTrace, SizerFailure>,
) -> Result<Progress, Error> {
    let scope = match attempt {
        Attempt::JobImage => Scope::Namespace(&source.namespace),
        Attempt::SizerImage => Scope::Cluster,
    };
    let image = cluster::image_of(source, attempt, store.options()).unwrap_or_default();
    store
        .keep(client, &step.key, scope, &image, &result)
        .await
        .map_err(kube_err("keeping the sizer's trace"))?;
    Ok(Progress::Kept(match result {
        Ok(trace) => TraceInput::Traced(Arc::new(trace)),
        Err(f) => TraceInput::Untraced(TraceError::Sizer(f).to_string()),
    }))
}

/// The sizer Job's pods.
async fn pods_of(client: &Client, ns: &str, job: &str) -> Result<Vec<Pod>, Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    Ok(pods
        .list(&ListParams::default().labels(&format!("job-name={job}")))
        .await
        .map_err(kube_err("listing the sizer's pods"))?
        .items)
}

/// How long ago `job` was created.
fn age(job: &Job) -> Duration {
    job.metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| jiff::Timestamp::now().duration_since(t.0).try_into().ok())
        .unwrap_or_default()
}
