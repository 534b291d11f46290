//! The loop: what a training process's own words say it ran out of ([`evidence`]), what one
//! run teaches ([`lesson`]), what runs taught, kept per shape and node class, with the faster
//! trials taken ([`learned`]), and what runs proved about a shape's configurations
//! ([`proven`]).

pub mod evidence;
pub mod learned;
pub mod lesson;
pub(in crate::decision) mod proven;
