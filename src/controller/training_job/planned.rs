//! What a plan holds: the changes of one reconcile of a TrainingJob as data, made by the
//! planner ([`super::plan`], with [`super::follow`] and [`super::recovery`]) and applied by the
//! writer ([`super::write`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use crate::controller::status::{self, WorkloadStatus};
use crate::decision::Resolution;
use crate::decision::runs::learned::{Reservation, Run};
use crate::render::workload::Workload;
use offload_api::v1alpha1::{MemoryFailure, NodeClass, TrainingJob, TrainingJobStatus};

/// What one reconcile changes.
pub(crate) enum Plan {
    /// Nothing to write; look again as the action says.
    Wait(Action),
    /// The job cannot be decided: held with why.
    Hold(Held),
    /// The job waits for its model's trace.
    Tracing(Tracing),
    /// The job is decided (or runs without offload): its spec, its workload, its status.
    Create(Box<Creation>),
    /// Its workload exists: what following it changes.
    Follow(Box<Following>),
}

/// An Event to publish on the job.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Announce {
    /// Normal or Warning.
    pub type_: EventType,
    /// Its reason (one of `names::EVENT_*`, or a condition's reason).
    pub reason: String,
    /// Its note.
    pub note: String,
}

impl Announce {
    /// An Event of `type_` with `reason` and `note`.
    pub fn new(type_: EventType, reason: &str, note: impl Into<String>) -> Self {
        Announce {
            type_,
            reason: reason.to_string(),
            note: note.into(),
        }
    }
}

/// A job held: its reason code, its message, and the decision part of its status where that
/// changes (`None`: the status already says it).
pub(crate) struct Held {
    /// The reason code (`Unresolved::reason`).
    pub reason: &'static str,
    /// What is wrong and what to change.
    pub message: String,
    /// The status to write.
    pub status: Option<TrainingJobStatus>,
}

/// A job whose sizer Job was just started: its status and Event.
pub(crate) struct Tracing {
    /// `OffloadResolved=False` (`Tracing`), where that changes.
    pub status: Option<TrainingJobStatus>,
    /// The `Tracing` Event.
    pub announce: Announce,
}

/// A workload to create, and what the job's spec and status say of it.
pub(crate) struct Creation {
    /// The decision; `None` for a job that did not opt in.
    pub resolution: Option<Resolution>,
    /// The shape's faster trial this decision takes, where it takes one.
    pub trial: Option<TrialTake>,
    /// The `spec.offload` (and request record) to write, where it changes.
    pub spec: Option<serde_json::Value>,
    /// The workload's objects.
    pub workload: Workload,
    /// The conditions the job had.
    pub existing: Vec<Condition>,
    /// The Event of the created workload.
    pub created: String,
}

impl Creation {
    /// The status once the spec was written at `generation`, and whether this is the job's
    /// first resolution.
    pub fn status_at(&self, generation: Option<i64>) -> (TrainingJobStatus, bool) {
        match &self.resolution {
            Some(res) => status::resolved(
                self.existing.clone(),
                res.status(),
                res.headline(),
                generation,
            ),
            None => (
                status::not_requested(self.existing.clone(), generation),
                false,
            ),
        }
    }
}

/// What following an existing workload changes.
#[derive(Default)]
pub(crate) struct Following {
    /// The decision part the status lost, written back from the Job's record.
    pub restore: Option<TrainingJobStatus>,
    /// A pod that ran out of memory: the evidence and what follows.
    pub recovery: Option<Recovery>,
    /// What the job's runs teach later decisions of its shape.
    pub lessons: Vec<Learned>,
    /// The workload part of the status, where it changes.
    pub status: Option<WorkloadStatus>,
    /// The Events of what changed.
    pub events: Vec<Announce>,
    /// The job's GPU-busy gauge and whether its overlap is flagged.
    pub gauge: Option<(f64, Option<bool>)>,
    /// When to look again.
    pub next: Option<Action>,
}

/// A pod out of memory: every failure so far and `MemoryRecovery`, and — within the profile's
/// bound — the workload replaced (its reference cleared with `Recreating`, its Job deleted).
pub(crate) struct Recovery {
    /// Every failure so far.
    pub failures: Vec<MemoryFailure>,
    /// `MemoryRecovery`.
    pub condition: Condition,
    /// Past the profile's `maxMemoryRetries`: held, not replaced.
    pub exhausted: bool,
    /// The workload part that clears the workload, where it is replaced.
    pub replace: Option<WorkloadStatus>,
}

/// A lesson to record: a run of a shape on a class, under a profile.
pub(crate) struct Learned {
    /// The profile.
    pub profile: String,
    /// The node class.
    pub class: NodeClass,
    /// The shape's key.
    pub shape: String,
    /// The shape in words.
    pub described: String,
    /// The run.
    pub run: Run,
    /// The lesson in words, for the log.
    pub sentence: String,
}

/// A trial to take in the learned store before the workload exists.
pub(crate) struct TrialTake {
    /// The trial.
    pub reservation: Reservation,
    /// Where the trials of its shape are counted: its namespace, or the whole cluster (`None`)
    /// where the profile shares what it learns.
    pub namespace: Option<String>,
    /// The profile's `fasterTrials`.
    pub bound: u32,
}

/// The job's conditions as recorded.
pub(crate) fn existing_conditions(tj: &TrainingJob) -> Vec<Condition> {
    tj.status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default()
}
