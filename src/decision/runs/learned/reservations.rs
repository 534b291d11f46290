//! Trials taken before their runs are known ([`Reservation`]): kept beside the lessons so that
//! a shape's `fasterTrials` bound holds across decisions made at once.

use offload_api::v1alpha1::NodeClass;
use serde::{Deserialize, Serialize};

use super::LearnedMemory;

/// How long a trial taken counts without a run of its job (one whose pods never ran gives its
/// trial back after this).
pub const RESERVATION_HOURS: f64 = 24.0;

/// A trial a decision took, before its run is known: it counts toward its shape's
/// `fasterTrials` at once, so two decisions made together cannot both take the last one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    /// The profile.
    pub profile: String,
    /// The node class.
    pub class: NodeClass,
    /// The job's shape.
    pub shape: String,
    /// The job (`namespace/name/uid`, as its run will be recorded).
    pub job: String,
    /// When it was taken (RFC 3339).
    pub at: String,
}

impl Reservation {
    /// Whether it still counts at `now`, for a decision in `namespace` (`None`: any).
    pub fn counts(&self, now: jiff::Timestamp, namespace: Option<&str>) -> bool {
        let young = self
            .at
            .parse::<jiff::Timestamp>()
            .ok()
            .and_then(|at| now.duration_since(at).try_into().ok())
            .is_some_and(|age: std::time::Duration| {
                age.as_secs_f64() <= RESERVATION_HOURS * 3600.0
            });
        young && namespace.is_none_or(|ns| self.job.split('/').next() == Some(ns))
    }
}

impl LearnedMemory {
    /// Trials taken for `shape` on `class` under `profile` whose runs are not recorded yet (a
    /// run of the job replaces its reservation), in `namespace` (`None`: any), other than
    /// `except`'s (the job being decided).
    pub fn reserved_trials(
        &self,
        profile: &str,
        class: NodeClass,
        shape: &str,
        now: jiff::Timestamp,
        namespace: Option<&str>,
        except: Option<&str>,
    ) -> usize {
        let ran: Vec<&str> = self
            .entries
            .iter()
            .filter(|e| e.profile == profile && e.class == class && e.shape == shape)
            .flat_map(|e| e.runs.iter().map(|r| r.job.as_str()))
            .collect();
        self.reservations
            .iter()
            .filter(|r| r.profile == profile && r.class == class && r.shape == shape)
            .filter(|r| r.counts(now, namespace))
            .filter(|r| Some(r.job.as_str()) != except && !ran.contains(&r.job.as_str()))
            .count()
    }
}
