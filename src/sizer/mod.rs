//! The sizer: the program that reads a model's own code to size its training step
//! (`sizer/offload_sizer.py`, shipped inside this binary), and how it is run — on this machine
//! for `offload-operator explain --trace` ([`local`]).

pub mod local;

/// The sizer program, as this release ships it.
pub const SCRIPT: &str = include_str!("../../sizer/offload_sizer.py");
