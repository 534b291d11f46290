//! Before a TrainingJob's workload exists: the trace of its model's step. Where the job gives
//! its model's `config.json` and tokens and no trace of that step is kept, the sizer runs as a
//! Job in the job's namespace ([`crate::sizer::cluster`]); the job waits for it
//! (`OffloadResolved=False`, `Tracing`), bounded by the sizer's time-out, then is decided with
//! the trace — or, where none could be made, with the counted model and the reason why. What
//! the sizer found is kept ([`crate::cluster::traces`]) for every later job of the step.

use std::sync::Arc;
use std::time::Duration;

use super::super::sizer_jobs::{Progress, advance};
use super::super::{Context, Error};
use crate::decision::referenced::Reference;
use crate::decision::{ClusterView, ModelShape, SizerRequest, TraceInput, UserConfig};
use crate::sizer::cluster::{SizerSource, StepArgs};
use offload_api::v1alpha1::TrainingJob;

/// How often a job waiting for its trace is looked at again (the sizer Job's end wakes it too).
const POLL: Duration = Duration::from_secs(5);

/// Where a job's trace stands.
pub(crate) enum Step {
    /// Decide now: with the trace of the step or why there is none (`Some`), or nothing to
    /// trace (`None`).
    Decide(Option<(SizerRequest, TraceInput)>),
    /// The sizer's Job was just created: the job waits for it, and says so.
    Started {
        /// The sizer's Job.
        job: String,
        /// The image it runs.
        image: String,
        /// The step it traces, in words.
        step: String,
        /// How long the job waits for it, in seconds.
        timeout: u64,
    },
    /// The sizer runs: wait for it.
    Wait,
}

impl Step {
    /// How often a job waiting for its trace is looked at again (the sizer Job's end wakes it
    /// too).
    pub const POLL: Duration = POLL;
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
    let Some((step, known)) = crate::decision::sizer_step(tj, config, model, &ctx.view) else {
        return Ok(Step::Decide(None));
    };
    if known != TraceInput::None {
        return Ok(Step::Decide(Some((step, known))));
    }
    let Some(reference) = Reference::model(tj) else {
        return Ok(Step::Decide(None));
    };
    let source = SizerSource::of_training_job(tj);
    let args = StepArgs::from(&step);
    let progress = advance(
        &ctx.client,
        store,
        &source,
        &args,
        &reference.name,
        &reference.key,
    )
    .await?;
    Ok(match progress {
        Progress::Started { job, image } => Step::Started {
            job,
            image,
            step: step.describe(),
            timeout: store.options().timeout.as_secs(),
        },
        Progress::Running => Step::Wait,
        Progress::Kept(input) => Step::Decide(Some((step, input))),
        Progress::Refused(why) => Step::Decide(Some((step, TraceInput::Untraced(why)))),
    })
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
    fn namespace_limits(&self, namespace: &str) -> crate::decision::pod::limits::NamespaceLimits {
        self.view.namespace_limits(namespace)
    }
}
