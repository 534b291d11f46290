//! The offload decision: a pure function from (job request, profile, nodes) to a concrete
//! configuration with a reason for every choice.
//!
//! No I/O happens here. The controller, the webhook and `offload-operator explain` all come in
//! through [`decide`] (a TrainingJob) or [`decide_request`] (another kind's request), which
//! build the request one way ([`JobRequest`]), pick the profile ([`selection`]) and call
//! [`resolve_offload`] ([`resolve`]); the same inputs always give the same output, whatever
//! order the nodes come in. It runs as steps, each in its own module, each giving its value and
//! its reason: framework facts ([`framework`]) → the job's [`memory`] model → the nodes the
//! profile may use ([`candidates`]) → placement: mode, node class and what fits ([`placement`],
//! [`fit`]) → [`overlap`] → [`pinning`] → offload [`ratio`] → the framework's keys
//! ([`framework`]). What it gives back is in [`resolution`]; the defaults and bounds every step
//! reads in [`settings`].

mod annotations;
mod candidates;
mod constraints;
pub mod cpu;
mod entry;
mod error;
pub mod evidence;
mod fit;
mod framework;
mod ladder;
pub mod learned;
pub mod lesson;
pub mod limits;
pub mod memory;
pub mod model_config;
mod overlap;
mod pinning;
mod placement;
mod proven;
mod ratio;
pub mod referenced;
mod request;
mod resolution;
mod resolve;
mod resources;
mod selection;
mod settings;
pub mod shape;
pub mod sizer;
mod sizing;
mod user_config;
mod whole_cores;

pub use constraints::PodConstraints;
pub use entry::{
    ClusterView, Unresolved, check_training_job, decide, decide_request, lesson_of, sizer_step,
};
pub use error::ResolveError;
pub use framework::{
    DeepSpeedPlan, FrameworkPlan, FsdpPlan, MANUAL_GC_INTERVAL, MegatronPlan, ZENFLOW_TOPK_RATIO,
    ZENFLOW_UPDATE_INTERVAL,
};
pub use model_config::{MODEL_CONFIG_KEY, ModelConfigError};
pub use request::{AdmittedRequest, DeepSpeedRequest, JobRequest, LearnedView, run_id};
pub use resources::PodResources;
pub use selection::{
    ProfileNotFound, SelectedProfile, builtin_default_profile, explicit_offload, opted_in,
    profile_name, profile_name_for, requested_profile, select_profile,
};
pub use shape::ModelShape;
pub use sizer::{SizerRequest, TraceInput};
pub use user_config::{
    ConfigError, ConfigFacts, DeepSpeedConfigError, Precision, UserConfig, parse_config, stage_of,
};

pub use ladder::Trial;
pub use resolution::{
    Field, MAX_SHORT_CHARS, MemoryEstimate, MemoryRequest, Reason, Resolution, Why, clip, headline,
};
pub use resolve::{class_admits, estimate_placement, resolve_offload};
pub use settings::{
    DEFAULT_ZERO_STAGE, MAX_EXCLUDED_NODES, MIN_AUTO_RATIO, SUPER_OFFLOAD_CPU_SHARE,
};
pub use whole_cores::WholeCores;

#[cfg(test)]
pub(crate) mod tests;
