//! The ladder of placements and the steps that choose on it: the nodes a profile may use
//! ([`candidates`]), the rungs fastest first ([`rungs`]), the mode and node class
//! ([`placement`]), then [`overlap`], [`pinning`] and the offload [`ratio`].

pub(in crate::decision) mod candidates;
pub(in crate::decision) mod overlap;
pub(in crate::decision) mod pinning;
pub(in crate::decision) mod placement;
pub(in crate::decision) mod ratio;
pub(in crate::decision) mod rungs;
