//! What runs taught the memory model: for each job shape on each node class (under a profile),
//! the ratio of what its runs were observed to need to what the model estimated, kept as two
//! factors that later decisions of the same shape multiply the model's figures by.
//!
//! - **Activations.** The model counts parameters, gradients and optimizer state exactly; what
//!   it cannot know exactly is the rest of the GPU peak (activations as the framework keeps
//!   them, workspaces, a custom layer). A run's factor is what its GPU peak left for that part
//!   over what the model put there, so it carries over to the job's other placements: the same
//!   batch keeps the same activations whether the optimizer state is offloaded or not.
//! - **Host.** The observed host peak over the estimate of the placement that ran; on the host
//!   the model's error scales with what is offloaded, so it is applied as a ratio.
//!
//! Bounded as the Vertical Pod Autoscaler bounds its recommendations: a run's lesson fades with
//! age (its factor moves half-way back to 1 every [`HALF_LIFE_DAYS`], gone after
//! [`MAX_AGE_DAYS`]); growing takes one run (the largest counts, with [`GROWTH_MARGIN`]), but
//! shrinking takes two: a single run below the estimate moves the factor half-way, so one
//! outlier cannot halve a margin; no factor goes below [`MIN_ACTIVATIONS`] (the model's
//! structural part, exact, is never cut) or above [`MAX_FACTOR`]. A run that failed for memory
//! counts as one that needed more than it had.

use serde::{Deserialize, Serialize};

use offload_api::v1alpha1::{NodeClass, StatePlacement};

/// Version of the stored JSON this code writes and reads.
pub const LEARNED_SCHEMA_VERSION: u32 = 1;
/// Most entries kept (shape × class × profile); the least recently updated go first.
pub const MAX_ENTRIES: usize = 1000;
/// Most runs kept per entry; the oldest go first.
pub const MAX_RUNS: usize = 8;
/// Most bytes of stored JSON read (a ConfigMap holds at most 1 MiB).
pub const MAX_LEARNED_BYTES: usize = 900 * 1024;
/// A run's lesson moves half-way back to 1 in this many days.
pub const HALF_LIFE_DAYS: f64 = 14.0;
/// Runs older than this are forgotten.
pub const MAX_AGE_DAYS: f64 = 90.0;
/// How far ahead of the operator's clock a run may be dated (another replica's clock).
pub const CLOCK_SKEW_SECONDS: f64 = 600.0;
/// Margin on a factor learned from runs above the estimate (the VPA adds 15 % to requests; GPU
/// peaks are measured more closely).
pub const GROWTH_MARGIN: f64 = 0.05;
/// Lowest activation factor: the model's structural figures stay, and at least this share of
/// its activations.
pub const MIN_ACTIVATIONS: f64 = 0.25;
/// Lowest host factor.
pub const MIN_HOST: f64 = 0.5;
/// Highest factor of either kind.
pub const MAX_FACTOR: f64 = 16.0;

/// Most data-parallel ranks a recorded configuration may have run on.
pub const MAX_RANKS: u64 = 1 << 20;
/// Most GPU memory a recorded configuration may have run with (any GPU's, bytes).
pub const MAX_GPU_BYTES: u64 = 512 << 30;

/// The configuration a run ran, as far as its memory goes: where its training state was, on
/// how many data-parallel ranks, on GPUs of what size. A later decision of the same shape may
/// take it as proof (it trained) or as a bound (it ran out) only where its ranks and GPUs are
/// the same.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RanAs {
    /// Where the training state was.
    pub placement: StatePlacement,
    /// The share of the optimizer state offloaded, for a partial placement (0 otherwise).
    #[serde(default)]
    pub ratio: f64,
    /// Data-parallel ranks (one per GPU).
    pub ranks: u64,
    /// Memory of each of its GPUs, bytes.
    pub gpu_bytes: u64,
}

impl RanAs {
    /// Whether a decision on `ranks` GPUs of `gpu_bytes` each is the same setting (GPUs of a
    /// model differ by a few MiB between drivers).
    pub fn same_setting(&self, ranks: u64, gpu_bytes: u64) -> bool {
        #[allow(clippy::cast_precision_loss)]
        let (a, b) = (self.gpu_bytes as f64, gpu_bytes as f64);
        self.ranks == ranks && (a - b).abs() <= 0.01 * a.max(b)
    }

    /// Whether `other` is the same configuration (a share within half a percent).
    pub fn same_placement(&self, other: &RanAs) -> bool {
        self.placement == other.placement && (self.ratio - other.ratio).abs() < 0.005
    }

    fn check(&self) -> Result<(), String> {
        if !(self.ratio.is_finite() && (0.0..=1.0).contains(&self.ratio)) {
            return Err(format!("ratio {} (from 0 to 1)", self.ratio));
        }
        if self.placement == StatePlacement::PartialOptimizer && self.ratio <= 0.0 {
            return Err("a partial placement without a share".into());
        }
        if !(1..=MAX_RANKS).contains(&self.ranks) {
            return Err(format!("{} ranks (from 1 to {MAX_RANKS})", self.ranks));
        }
        if !(1..=MAX_GPU_BYTES).contains(&self.gpu_bytes) {
            return Err(format!("GPUs of {} bytes", self.gpu_bytes));
        }
        Ok(())
    }
}

/// One remembered run of a shape as evidence about configurations: what it ran, and how it
/// ended ([`LearnedMemory::evidence`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RanRecord {
    /// What it ran.
    pub ran_as: RanAs,
    /// It finished its training (its workload succeeded): the configuration fits.
    pub trained: bool,
    /// It ran out of memory.
    pub failed: bool,
    /// It was a trial of a configuration faster than any that had trained.
    pub trial: bool,
    /// Its activation factor as the run gave it: neither faded nor given a margin.
    pub activations: f64,
    /// That factor is PyTorch's allocator's own figure (what the run needed).
    pub allocator: bool,
    /// Its median training step, seconds, as its processes timed it (where they reported one).
    pub step_seconds: Option<f64>,
    /// When (RFC 3339).
    pub at: jiff::Timestamp,
}

/// The factors a decision applies for one shape on one class.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LearnedFactors {
    /// On the activation part of every GPU estimate.
    pub activations: f64,
    /// On every host estimate.
    pub host: f64,
    /// Runs behind them.
    pub runs: u32,
    /// For a job without model hints, the model size its runs' peaks show (the largest).
    pub parameters: Option<f64>,
}

impl Default for LearnedFactors {
    fn default() -> Self {
        LearnedFactors {
            activations: 1.0,
            host: 1.0,
            runs: 0,
            parameters: None,
        }
    }
}

impl LearnedFactors {
    /// Whether they change anything.
    pub fn is_neutral(&self) -> bool {
        self.runs == 0 || ((self.activations - 1.0).abs() < 1e-9 && (self.host - 1.0).abs() < 1e-9)
    }

    /// One sentence for reasons.
    pub fn describe(&self, class: NodeClass) -> String {
        match self.parameters {
            Some(p) => format!(
                "learned from {} observed run(s) of this job on {class} nodes: about {:.2}B parameters, activations ×{:.2}, host ×{:.2}",
                self.runs,
                p / 1e9,
                self.activations,
                self.host
            ),
            None => format!(
                "learned from {} run(s) of this job shape on {class} nodes: activations ×{:.2}, host ×{:.2}",
                self.runs, self.activations, self.host
            ),
        }
    }
}

/// One run's lesson.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Run {
    /// The job the run was (`namespace/name/uid`): a job's later windows update its own run.
    pub job: String,
    /// Its activation factor (what the run needed over the model's activations).
    pub activations: f64,
    /// Its host factor, where its host peak was observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<f64>,
    /// It ran out of memory (its factors are what it had, a lower bound of what it needed).
    #[serde(default)]
    pub failed: bool,
    /// For a job without model hints: the model size its peaks show (an upper bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<f64>,
    /// Its activation factor is from PyTorch's allocator's own figure, not the device's (which
    /// counts the allocator's cache: an upper bound). An allocator figure of a job's run
    /// replaces a device figure of the same run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allocator: bool,
    /// The configuration it ran, where known (runs recorded before it was kept have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ran_as: Option<RanAs>,
    /// It finished its training (its workload succeeded), so its configuration fits.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trained: bool,
    /// It tried a configuration faster than any that had trained for its shape.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trial: bool,
    /// Its median training step after the first, seconds, as its slowest process timed it
    /// (the operator's reporter): what ranks configurations that trained where the memory
    /// model's order (less offloaded is faster) is not what ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_seconds: Option<f64>,
    /// When it was last observed (RFC 3339).
    pub at: String,
}

/// What was learned for one shape on one class under one profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Entry {
    /// The profile whose decisions use it.
    pub profile: String,
    /// The node class.
    pub class: NodeClass,
    /// The shape's key ([`crate::decision::model::memory::JobMemory::shape_key`]).
    pub shape: String,
    /// The shape in words, for people reading the store.
    pub described: String,
    /// Its runs, oldest first.
    pub runs: Vec<Run>,
}

/// Everything learned: the stored document.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LearnedMemory {
    /// [`LEARNED_SCHEMA_VERSION`].
    pub schema_version: u32,
    /// The entries, least recently updated first.
    pub entries: Vec<Entry>,
    /// Trials decided whose runs are not known yet (kept beside this document, under their own
    /// key `trials.json`).
    #[serde(skip)]
    pub reservations: Vec<Reservation>,
}

impl Default for LearnedMemory {
    fn default() -> Self {
        LearnedMemory {
            schema_version: LEARNED_SCHEMA_VERSION,
            entries: Vec::new(),
            reservations: Vec::new(),
        }
    }
}

/// A stored document that could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LearnedError {
    /// Larger than [`MAX_LEARNED_BYTES`].
    #[error("learned memory is {0} bytes, more than the {MAX_LEARNED_BYTES} read")]
    TooLarge(usize),
    /// Not JSON of this schema.
    #[error("learned memory is not valid JSON for schema version {LEARNED_SCHEMA_VERSION}: {0}")]
    Malformed(String),
    /// Figures that cannot be a lesson.
    #[error("learned memory cannot be true: {0}")]
    Impossible(String),
}

/// A factor a run may carry: finite and within the bounds.
fn plausible(f: f64, min: f64) -> bool {
    f.is_finite() && (min..=MAX_FACTOR).contains(&f)
}

impl Run {
    /// Rejects a lesson no observation gives.
    pub fn check(&self) -> Result<(), LearnedError> {
        if !plausible(self.activations, MIN_ACTIVATIONS) {
            return Err(LearnedError::Impossible(format!(
                "run of {} has activation factor {} (from {MIN_ACTIVATIONS} to {MAX_FACTOR})",
                self.job, self.activations
            )));
        }
        if let Some(h) = self.host
            && !plausible(h, MIN_HOST)
        {
            return Err(LearnedError::Impossible(format!(
                "run of {} has host factor {h} (from {MIN_HOST} to {MAX_FACTOR})",
                self.job
            )));
        }
        #[allow(clippy::cast_precision_loss)]
        if let Some(p) = self.parameters
            && !(p.is_finite() && (1.0..=offload_api::quantity::MAX_PARAMETERS as f64).contains(&p))
        {
            return Err(LearnedError::Impossible(format!(
                "run of {} shows {p} parameters",
                self.job
            )));
        }
        if let Some(step) = self.step_seconds
            && !offload_api::observed::plausible_step(step)
        {
            return Err(LearnedError::Impossible(format!(
                "run of {} steps in {step} s (from 0 to a day)",
                self.job
            )));
        }
        if self.at.parse::<jiff::Timestamp>().is_err() {
            return Err(LearnedError::Impossible(format!(
                "run of {} has time {:?}",
                self.job, self.at
            )));
        }
        if self.job.len() > 512 {
            return Err(LearnedError::Impossible("a job name over 512 bytes".into()));
        }
        if let Some(r) = &self.ran_as {
            r.check().map_err(|e| {
                LearnedError::Impossible(format!("run of {} ran a configuration of {e}", self.job))
            })?;
        }
        if self.trained && self.failed {
            return Err(LearnedError::Impossible(format!(
                "run of {} both trained and ran out of memory",
                self.job
            )));
        }
        Ok(())
    }

    /// Days since the run; a run dated after now (beyond [`CLOCK_SKEW_SECONDS`]: a clock far
    /// ahead, or a hand-made entry) or not dated is as old as can be — never used, never kept
    /// from fading.
    /// Whether the run's job was in `namespace` (its `job` is `namespace/name/uid`); every run
    /// is where no namespace is asked.
    fn of(&self, namespace: Option<&str>) -> bool {
        namespace.is_none_or(|ns| self.job.split('/').next() == Some(ns))
    }

    fn age_days(&self, now: jiff::Timestamp) -> f64 {
        self.at
            .parse::<jiff::Timestamp>()
            .map_or(f64::INFINITY, |at| {
                let secs = now.duration_since(at).as_secs_f64();
                if secs < -CLOCK_SKEW_SECONDS {
                    f64::INFINITY
                } else {
                    secs.max(0.0) / 86_400.0
                }
            })
    }
}

/// The factor runs give: each faded toward 1 by its age; the largest with a margin where any ran
/// above the estimate; where all ran below, the largest of them, or half-way to it from one run.
fn combine(faded: &[f64], min: f64) -> Option<f64> {
    let largest = faded.iter().copied().reduce(f64::max)?;
    let f = if largest >= 1.0 {
        largest * (1.0 + GROWTH_MARGIN)
    } else if faded.len() == 1 {
        f64::midpoint(1.0, largest)
    } else {
        largest
    };
    Some(f.clamp(min, MAX_FACTOR))
}

impl LearnedMemory {
    /// Reads the stored document: size, then fields, then every figure.
    pub fn parse(json: &str) -> Result<LearnedMemory, LearnedError> {
        if json.len() > MAX_LEARNED_BYTES {
            return Err(LearnedError::TooLarge(json.len()));
        }
        let doc: LearnedMemory =
            serde_json::from_str(json).map_err(|e| LearnedError::Malformed(e.to_string()))?;
        if doc.schema_version != LEARNED_SCHEMA_VERSION {
            return Err(LearnedError::Malformed(format!(
                "schema version {} (this operator reads {LEARNED_SCHEMA_VERSION})",
                doc.schema_version
            )));
        }
        if doc.entries.len() > MAX_ENTRIES {
            return Err(LearnedError::Impossible(format!(
                "{} entries, more than {MAX_ENTRIES}",
                doc.entries.len()
            )));
        }
        let mut seen = std::collections::BTreeSet::new();
        for e in &doc.entries {
            if !seen.insert((e.profile.as_str(), e.class, e.shape.as_str())) {
                return Err(LearnedError::Impossible(format!(
                    "shape {} on {} nodes of profile {} listed twice",
                    e.shape, e.class, e.profile
                )));
            }
            if e.runs.len() > MAX_RUNS {
                return Err(LearnedError::Impossible(format!(
                    "shape {} has {} runs, more than {MAX_RUNS}",
                    e.shape,
                    e.runs.len()
                )));
            }
            for r in &e.runs {
                r.check()?;
            }
        }
        Ok(doc)
    }

    /// The stored document.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }

    /// The factors for `shape` on `class` under `profile` now; `None` where nothing (still
    /// remembered) was learned.
    pub fn factors(
        &self,
        profile: &str,
        class: NodeClass,
        shape: &str,
        now: jiff::Timestamp,
    ) -> Option<LearnedFactors> {
        self.factors_of(profile, class, shape, now, None)
    }

    /// [`LearnedMemory::factors`] from the runs of jobs in `namespace` alone (`None`: every
    /// namespace's).
    pub fn factors_of(
        &self,
        profile: &str,
        class: NodeClass,
        shape: &str,
        now: jiff::Timestamp,
        namespace: Option<&str>,
    ) -> Option<LearnedFactors> {
        let e = self
            .entries
            .iter()
            .find(|e| e.profile == profile && e.class == class && e.shape == shape)?;
        let fresh: Vec<&Run> = e
            .runs
            .iter()
            .filter(|r| r.age_days(now) <= MAX_AGE_DAYS && r.of(namespace))
            .collect();
        let fade =
            |f: f64, r: &Run| 1.0 + (f - 1.0) * 0.5f64.powf(r.age_days(now) / HALF_LIFE_DAYS);
        let activations: Vec<f64> = fresh.iter().map(|r| fade(r.activations, r)).collect();
        let host: Vec<f64> = fresh
            .iter()
            .filter_map(|r| r.host.map(|h| fade(h, r)))
            .collect();
        Some(LearnedFactors {
            activations: combine(&activations, MIN_ACTIVATIONS)?,
            host: combine(&host, MIN_HOST).unwrap_or(1.0),
            runs: u32::try_from(fresh.len()).unwrap_or(u32::MAX),
            parameters: fresh.iter().filter_map(|r| r.parameters).reduce(f64::max),
        })
    }

    /// The remembered runs of `shape` on `class` under `profile` whose configuration is known,
    /// oldest first: what later decisions take as proof (a configuration that trained) and as
    /// bounds (one that ran out of memory, a trial already made). Runs dated after now (beyond
    /// the clock skew) or older than [`MAX_AGE_DAYS`] are not evidence.
    pub fn evidence(
        &self,
        profile: &str,
        class: NodeClass,
        shape: &str,
        now: jiff::Timestamp,
    ) -> Vec<RanRecord> {
        self.evidence_of(profile, class, shape, now, None)
    }

    /// [`LearnedMemory::evidence`] from the runs of jobs in `namespace` alone (`None`: every
    /// namespace's).
    pub fn evidence_of(
        &self,
        profile: &str,
        class: NodeClass,
        shape: &str,
        now: jiff::Timestamp,
        namespace: Option<&str>,
    ) -> Vec<RanRecord> {
        let Some(e) = self
            .entries
            .iter()
            .find(|e| e.profile == profile && e.class == class && e.shape == shape)
        else {
            return Vec::new();
        };
        e.runs
            .iter()
            .filter(|r| r.age_days(now) <= MAX_AGE_DAYS && r.of(namespace))
            .filter_map(|r| {
                Some(RanRecord {
                    ran_as: r.ran_as?,
                    trained: r.trained && !r.failed,
                    failed: r.failed,
                    trial: r.trial,
                    activations: r.activations,
                    allocator: r.allocator,
                    step_seconds: r.step_seconds,
                    at: r.at.parse().ok()?,
                })
            })
            .collect()
    }

    /// Records a run (replacing the same job's earlier one), keeping the bounds; whether the
    /// store changed enough to be written (a new run, a factor moved by more than 1 %, a
    /// failure).
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &mut self,
        profile: &str,
        class: NodeClass,
        shape: &str,
        described: &str,
        run: Run,
    ) -> Result<bool, LearnedError> {
        run.check()?;
        let at = self
            .entries
            .iter()
            .position(|e| e.profile == profile && e.class == class && e.shape == shape);
        let mut entry = match at {
            Some(i) => self.entries.remove(i),
            None => Entry {
                profile: profile.to_string(),
                class,
                shape: shape.to_string(),
                described: described.chars().take(200).collect(),
                runs: Vec::new(),
            },
        };
        let changed = match entry.runs.iter().position(|r| r.job == run.job) {
            Some(i) => {
                let old = entry.runs.remove(i);
                let changed = old.differs_from(&run);
                entry.runs.push(old.merged_with(run));
                changed
            }
            None => {
                entry.runs.push(run);
                true
            }
        };
        if entry.runs.len() > MAX_RUNS {
            entry.runs.remove(0);
        }
        self.entries.push(entry);
        if self.entries.len() > MAX_ENTRIES {
            self.entries.remove(0);
        }
        Ok(changed)
    }

    /// Shapes and runs learned under `profile`.
    pub fn summary(&self, profile: &str) -> (usize, usize) {
        let mine = self.entries.iter().filter(|e| e.profile == profile);
        let shapes = mine.clone().count();
        let runs = mine.map(|e| e.runs.len()).sum();
        (shapes, runs)
    }
}

impl Run {
    /// Whether a later window of the same job says something new: a figure moved by more than
    /// 1 %, or how it ended, what it ran or its step changed.
    fn differs_from(&self, run: &Run) -> bool {
        let old = self;
        let moved = |a: f64, b: f64| (a - b).abs() > 0.01 * b.abs().max(1e-9);
        moved(old.activations, run.activations)
            || match (old.host, run.host) {
                (Some(a), Some(b)) => moved(a, b),
                (a, b) => a.is_some() != b.is_some(),
            }
            || old.failed != run.failed
            || old.trained != run.trained
            || old.ran_as != run.ran_as
            || old.step_seconds != run.step_seconds && run.step_seconds.is_some()
    }

    /// The same job's run after a later window. Its figures only rise over the run: the higher
    /// is kept; but the allocator's own figure is what the run needed, and replaces the
    /// device's upper bound (never the other way round).
    fn merged_with(self, run: Run) -> Run {
        let old = self;
        let activations = match (old.allocator, run.allocator) {
            (false, true) => run.activations,
            (true, false) => old.activations,
            _ => old.activations.max(run.activations),
        };
        Run {
            activations,
            allocator: old.allocator || run.allocator,
            host: match (old.host, run.host) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
            failed: old.failed || run.failed,
            // A run that ran out of memory did not train, whatever an earlier window of it
            // showed.
            trained: (old.trained || run.trained) && !(old.failed || run.failed),
            trial: old.trial || run.trial,
            ran_as: run.ran_as.or(old.ran_as),
            // A later window without the reporter's figures keeps the run's step.
            step_seconds: run.step_seconds.or(old.step_seconds),
            parameters: match (old.parameters, run.parameters) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
            ..run
        }
    }
}

mod reservations;
pub use reservations::{RESERVATION_HOURS, Reservation};

#[cfg(test)]
mod tests;
