//! DeepSpeed's optimizer sub-groups: how much of the optimizer state a partial ratio really
//! puts on the host (whole sub-groups, the last ones, walked over the model's tensors where its
//! shape is known), and the largest group the optimizer step converts at once.

use super::{JobMemory, as_f64, bytes, shape};

/// Tensors past which the sub-groups are bounded rather than walked.
pub(super) const MAX_TENSORS: usize = 20_000;
/// `sub_group_size`'s default.
const DEFAULT_SUB_GROUP: f64 = 1e9;

/// How a partial ratio maps to the share DeepSpeed really offloads.
#[derive(Clone, Debug)]
pub enum PartialShares {
    /// The model's sub-groups, walked: the share of each ratio is exact.
    Groups(Vec<f64>),
    /// Only a bound: the share lands within this much of the ratio.
    Within(f64),
    /// The share is the ratio or more, by at most this much (whole tensors offloaded until the
    /// ratio is reached: Megatron-core's hybrid device optimizer).
    AtLeast(f64),
}

impl PartialShares {
    /// The share on the GPU side and the share on the host side to check for `ratio`.
    pub fn bounds(&self, ratio: f64) -> (f64, f64) {
        match self {
            PartialShares::Groups(g) => {
                let s = shape::offloaded_share(g, ratio);
                (s, s)
            }
            PartialShares::Within(g) => ((ratio - g).max(0.0), (ratio + g).min(1.0)),
            PartialShares::AtLeast(g) => (ratio, (ratio + g).min(1.0)),
        }
    }
}

impl JobMemory {
    /// The sub-group size in effect: the user's, else DeepSpeed's default, or for a partial
    /// ratio the operator's.
    fn group_size(&self, partial: bool) -> f64 {
        self.sub_group_size.unwrap_or_else(|| {
            if partial {
                as_f64(operator_sub_group_size(self.parameters, self.ranks))
            } else {
                DEFAULT_SUB_GROUP
            }
        })
    }

    /// How partial ratios map to the offloaded share for this job: walked over the model's
    /// tensors when its shape is known, else bounded by a sub-group and the largest tensor.
    pub fn partial_shares(&self) -> PartialShares {
        if let Some(shares) = self.megatron_partial_shares() {
            return shares;
        }
        if let Some(groups) = self.walked_groups(true) {
            return PartialShares::Groups(groups);
        }
        let shard = self.shard().max(1.0);
        PartialShares::Within((self.group_bound(true) / shard).min(1.0))
    }

    /// DeepSpeed's optimizer sub-groups of one rank's partition (parameters in each), walked
    /// over the model's tensors when its shape is known; `partial`: with the sub-group size a
    /// partial ratio is written with.
    pub(super) fn walked_groups(&self, partial: bool) -> Option<Vec<f64>> {
        let ranks = as_f64(self.ranks.max(1));
        let tensors = self.tensor_list(MAX_TENSORS)?;
        let partitions: Vec<f64> = tensors.iter().map(|t| (t / ranks).ceil()).collect();
        Some(shape::sub_groups(&partitions, self.group_size(partial)))
    }

    /// The most parameters one sub-group can hold: it closes at the first tensor that takes it
    /// to the sub-group size.
    pub(super) fn group_bound(&self, partial: bool) -> f64 {
        let largest = self.largest_tensor() / as_f64(self.ranks.max(1));
        (self.group_size(partial) + largest).min(self.shard().max(1.0))
    }

    /// The largest optimizer sub-group without offload (what the step converts to fp32 at once).
    pub(super) fn largest_group(&self) -> f64 {
        let ranks = as_f64(self.ranks.max(1));
        (self.group_size(false) + self.largest_tensor() / ranks).min(self.shard())
    }
}

/// The sub-group size the operator writes with a partial ratio where the user's config has
/// none: about a hundredth of the rank's shard (so the offloaded share lands within a few
/// hundredths of the ratio), between 10⁷ and 10⁹ parameters.
pub fn operator_sub_group_size(parameters: f64, ranks: u64) -> u64 {
    let per_rank = parameters / as_f64(ranks.max(1));
    let group = (per_rank / 100.0 / 1e6).ceil() * 1e6;
    bytes(group.clamp(1e7, 1e9))
}
