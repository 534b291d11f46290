//! The offload decision: a pure function from (job request, profile, nodes) to a concrete
//! configuration with a reason for every choice.
//!
//! No I/O happens here. The controller, the webhook and `offload-operator explain` all come in
//! through [`decide`] (a TrainingJob) or [`decide_request`] (another kind's request), which
//! build the request one way ([`JobRequest`]), pick the profile ([`selection`]) and call
//! [`resolve_offload`] ([`resolve`]); the same inputs always give the same output, whatever
//! order the nodes come in. The steps live in rooms by concern, each giving its value and its
//! reason:
//!
//! - [`frameworks`]: what the framework and version can take, and their keys;
//! - [`model`]: the memory model, counted from the model's shape or traced from its code;
//! - [`ladder`]: the nodes a profile may use, the ladder of placements, mode and node class,
//!   overlap, pinning and the offload ratio;
//! - [`runs`]: the loop — what runs teach, what trained, the faster trials;
//! - [`pod`]: the pod as the cluster will run it — where it may land, what it asks for, its
//!   namespace's limits, the CPU it gets.
//!
//! What it gives back is in [`resolution`]; the defaults and bounds every step reads in
//! [`settings`].

mod annotations;
mod entry;
mod error;
pub mod frameworks;
pub mod ladder;
pub mod model;
pub mod pod;
pub mod referenced;
mod request;
mod resolution;
mod resolve;
pub mod runs;
mod selection;
mod settings;

pub use entry::{
    ClusterView, Unresolved, check_training_job, decide, decide_request, lesson_of, sizer_step,
};
pub use error::ResolveError;
pub use frameworks::user_config::{
    ConfigError, ConfigFacts, DeepSpeedConfigError, Precision, UserConfig, parse_config, stage_of,
};
pub use frameworks::{
    DeepSpeedPlan, FrameworkPlan, FsdpPlan, MANUAL_GC_INTERVAL, MegatronPlan, ZENFLOW_TOPK_RATIO,
    ZENFLOW_UPDATE_INTERVAL,
};
pub use model::model_config::{MODEL_CONFIG_KEY, ModelConfigError};
pub use model::shape::ModelShape;
pub use model::sizer::{SizerRequest, TraceInput};
pub use pod::constraints::PodConstraints;
pub use pod::resources::PodResources;
pub use request::{AdmittedRequest, DeepSpeedRequest, JobRequest, LearnedView, run_id};
pub use selection::{
    ProfileNotFound, SelectedProfile, builtin_default_profile, explicit_offload, opted_in,
    profile_name, profile_name_for, requested_profile, select_profile,
};

pub use ladder::rungs::Trial;
pub use pod::whole_cores::WholeCores;
pub use resolution::{
    Field, MAX_SHORT_CHARS, MemoryEstimate, MemoryRequest, Reason, Resolution, Why, clip, headline,
};
pub use resolve::{class_admits, estimate_placement, resolve_offload};
pub use settings::{
    DEFAULT_ZERO_STAGE, MAX_EXCLUDED_NODES, MIN_AUTO_RATIO, SUPER_OFFLOAD_CPU_SHARE,
};

#[cfg(test)]
pub(crate) mod tests;
