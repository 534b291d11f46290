//! Before a TrainingJob's workload exists: the trace of its model's step. Where the job gives
//! its model's `config.json` and tokens and no trace of that step is kept, the sizer runs as a
//! Job in the job's namespace ([`crate::sizer::cluster`]); the job waits for it
//! (`OffloadResolved=False`, `Tracing`), bounded by the sizer's time-out, then is decided with
//! the trace — or, where none could be made, with the counted model and the reason why. What
//! the sizer found is kept ([`crate::cluster::traces`]) for every later job of the step.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Client, ResourceExt};

use super::super::{Context, Error, kube_err};
use super::apply::publish;
use crate::cluster::traces::{Scope, TraceStore};
use crate::decision::referenced::Reference;
use crate::decision::{ClusterView, ModelShape, SizerRequest, TraceInput, UserConfig};
use crate::sizer::cluster::{self, Attempt, Outcome};
use offload_api::trace::SizerFailure;
use offload_api::v1alpha1::TrainingJob;

/// How often a job waiting for its trace is looked at again (the sizer Job's end wakes it too).
const POLL: Duration = Duration::from_secs(5);

/// Where a job's trace stands.
pub(super) enum Step {
    /// Decide now: with the trace of the step or why there is none (`Some`), or nothing to
    /// trace (`None`).
    Decide(Option<(SizerRequest, TraceInput)>),
    /// Wait for the sizer.
    Wait(Action),
}

/// Where `tj`'s trace stands, running the sizer where it is still to run.
pub(super) async fn trace_step(
    tj: &TrainingJob,
    ctx: &Context,
    config: Option<&UserConfig>,
    model: Option<&ModelShape>,
) -> Result<Step, Error> {
    let Some(store) = ctx.view.traces.as_ref() else {
        return Ok(Step::Decide(None));
    };
    let Some(step) = crate::decision::sizer_step(tj, config, model, &ctx.view) else {
        return Ok(Step::Decide(None));
    };
    let ns = tj.namespace().unwrap_or_default();
    match ctx.view.model_trace(&ns, &step) {
        TraceInput::None => {}
        known => return Ok(Step::Decide(Some((step, known)))),
    }
    let Some(reference) = Reference::model(tj) else {
        return Ok(Step::Decide(None));
    };
    let options = store.options();
    let Some(first) = cluster::first_attempt(tj, options) else {
        let why = "no image to run the sizer from: the job's own image is not allowed (sizer.useJobImage) and no sizer image is set (sizer.image)";
        return Ok(Step::Decide(Some((step, TraceInput::Untraced(why.into())))));
    };
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    let mut attempt = first;
    loop {
        let name = cluster::job_name(&step, attempt);
        let Some(job) = jobs
            .get_opt(&name)
            .await
            .map_err(kube_err("reading the sizer Job"))?
        else {
            return start(tj, ctx, &step, &reference, attempt).await;
        };
        let pods = pods_of(&ctx.client, &ns, &name).await?;
        match cluster::outcome(&job, &pods) {
            Outcome::Running => {
                let waited = age(&job);
                if waited > options.timeout + POLL * 6 {
                    // The Job's deadline should have ended it: its controller is behind.
                    let failure = SizerFailure {
                        code: "TimedOut".into(),
                        message: format!("no result after {:.0} s", waited.as_secs_f64()),
                    };
                    return kept(tj, ctx, store, &step, attempt, Err(failure)).await;
                }
                return Ok(Step::Wait(Action::requeue(POLL)));
            }
            Outcome::Traced(trace) => {
                return kept(tj, ctx, store, &step, attempt, Ok(*trace)).await;
            }
            Outcome::Failed {
                code,
                message,
                image_lacks,
            } => {
                let sizer_image = cluster::image_of(tj, Attempt::SizerImage, options);
                if attempt == Attempt::JobImage && image_lacks && sizer_image.is_some() {
                    attempt = Attempt::SizerImage;
                    continue;
                }
                let failure = SizerFailure { code, message };
                return kept(tj, ctx, store, &step, attempt, Err(failure)).await;
            }
        }
    }
}

/// Creates the sizer Job of `attempt` (one already there is the same) and has the job wait.
async fn start(
    tj: &TrainingJob,
    ctx: &Context,
    step: &SizerRequest,
    reference: &Reference,
    attempt: Attempt,
) -> Result<Step, Error> {
    let Some(store) = ctx.view.traces.as_ref() else {
        return Ok(Step::Decide(None));
    };
    let options = store.options();
    let Some(image) = cluster::image_of(tj, attempt, options) else {
        return Ok(Step::Decide(None));
    };
    let ns = tj.namespace().unwrap_or_default();
    let job = cluster::sizer_job(
        tj,
        step,
        &reference.name,
        &reference.key,
        &image,
        attempt,
        options,
    );
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), &ns);
    match jobs.create(&PostParams::default(), &job).await {
        Ok(_) => {
            publish(
                ctx,
                tj,
                EventType::Normal,
                "Tracing",
                &format!(
                    "tracing the model's step ({}) with the sizer in Job {} from {image}: the workload is created once it has, within {} s",
                    step.describe(),
                    job.name_any(),
                    options.timeout.as_secs()
                ),
            )
            .await;
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(kube::Error::Api(e)) if matches!(e.code, 400 | 403 | 422) => {
            // Refused for good (a quota, a policy): the counted model decides, and says why.
            let why = format!(
                "the sizer's Job was refused ({}): the counted model decides",
                offload_api::text::bounded_to(&e.message, 300)
            );
            return Ok(Step::Decide(Some((
                step.clone(),
                TraceInput::Untraced(why),
            ))));
        }
        Err(e) => return Err(kube_err("creating the sizer Job")(e)),
    }
    let message = format!(
        "waiting for the sizer to trace the model's step ({}) in Job {}: the workload is created once it has, or after {} s with the counted model",
        step.describe(),
        job.name_any(),
        options.timeout.as_secs()
    );
    super::apply::record_tracing(tj, ctx, &message).await?;
    Ok(Step::Wait(Action::requeue(POLL)))
}

/// Keeps what the sizer found and decides with it.
async fn kept(
    tj: &TrainingJob,
    ctx: &Context,
    store: &TraceStore,
    step: &SizerRequest,
    attempt: Attempt,
    result: Result<offload_api::trace::ModelTrace, SizerFailure>,
) -> Result<Step, Error> {
    let ns = tj.namespace().unwrap_or_default();
    let scope = match attempt {
        Attempt::JobImage => Scope::Namespace(&ns),
        Attempt::SizerImage => Scope::Cluster,
    };
    let image = cluster::image_of(tj, attempt, store.options()).unwrap_or_default();
    store
        .keep(&ctx.client, step, scope, &image, &result)
        .await
        .map_err(kube_err("keeping the sizer's trace"))?;
    let input = match result {
        Ok(trace) => TraceInput::Traced(Arc::new(trace)),
        Err(f) => TraceInput::Untraced(offload_api::trace::TraceError::Sizer(f).to_string()),
    };
    Ok(Step::Decide(Some((step.clone(), input))))
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

/// The view with one step's trace as the sizer just found it (the store's watch may not have
/// it yet): the decision sees what the reconcile saw.
pub(super) struct WithTrace<'a> {
    /// The cluster's view.
    pub view: &'a dyn ClusterView,
    /// The step and its trace.
    pub traced: &'a (SizerRequest, TraceInput),
}

impl ClusterView for WithTrace<'_> {
    fn profile(&self, name: &str) -> Option<offload_api::v1alpha1::OffloadProfileSpec> {
        self.view.profile(name)
    }
    fn nodes(&self) -> Arc<crate::index::NodeIndex> {
        self.view.nodes()
    }
    fn dra(&self) -> Option<crate::dra::DraOptions> {
        self.view.dra()
    }
    fn claim_template(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<crate::dra::api::ResourceClaimTemplate>> {
        self.view.claim_template(namespace, name)
    }
    fn learned(&self) -> Option<crate::decision::LearnedView> {
        self.view.learned()
    }
    fn model_trace(&self, namespace: &str, step: &SizerRequest) -> TraceInput {
        if *step == self.traced.0 {
            return self.traced.1.clone();
        }
        self.view.model_trace(namespace, step)
    }
    fn namespace_limits(&self, namespace: &str) -> crate::decision::limits::NamespaceLimits {
        self.view.namespace_limits(namespace)
    }
}
