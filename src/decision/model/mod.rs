//! The memory model: what a job's training state and activations hold on each GPU and on the
//! host, for each placement — counted from the model's shape ([`shape`], from its `config.json`
//! ([`model_config`]) or hints) or traced from its own code by the sizer ([`sizer`]); the job
//! sized from either ([`sizing`]), its figures ([`memory`]) and what fits a node class ([`fit`]).

pub(in crate::decision) mod fit;
pub mod memory;
pub mod model_config;
pub mod shape;
pub mod sizer;
pub(in crate::decision) mod sizing;
