//! DeepSpeed's gradient-bucket flushes in the backward of a job whose optimizer state is
//! offloaded: what each holds on top of the activations still kept (measured on the H200,
//! docs/benchmarks/memory-h200.md).

use super::{ClassMemory, JobMemory, MAX_TENSORS, Placement, Sharding, as_f64};

/// DeepSpeed's `reduce_bucket_size` default: gradient elements reduced at once.
pub(super) const REDUCE_BUCKET_ELEMENTS: f64 = 5e8;

/// Elements of each fp64 chunk DeepSpeed's gradient norm converts at once
/// (`_constant_buffered_norm2`).
pub(super) const NORM_CHUNK_ELEMENTS: f64 = 2.5e8;

/// A gradient-bucket flush in the backward of a job whose optimizer state is offloaded: the
/// activation bytes still kept at that moment, and the bytes the flush holds on top of them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Flush {
    pub(super) alive: f64,
    pub(super) transient: f64,
}

impl JobMemory {
    /// The gradient-bucket flushes of one backward with the optimizer state offloaded, as
    /// DeepSpeed 0.19.8's ZeRO-3 runs them (`stage3.py`), over the model's gradients in the
    /// order the backward completes them. A bucket is reduced when the next gradient would take
    /// it past `reduce_bucket_size` (5·10⁸ elements), and once more at the end. While it is,
    /// the GPU holds on top of the activations still kept:
    /// - the reduce-scatter's flat copy of the bucket (a tensor larger than the bucket is
    ///   reduced alone, from its own gradient, of the same size): 2 bytes per element;
    /// - for its largest tensor (one at a time, the largest is the most), the rank's gradient
    ///   partition copied back from the pinned host buffer (2 bytes per element), then the
    ///   larger of the gradient norm's fp64 chunks (8 bytes per element, 2.5·10⁸ at a time)
    ///   and the fp32 copy for the optimizer (4 bytes per element);
    /// - the gradient that arrived (2 bytes per element), a tied embedding's gradient until
    ///   the backward completes it, and the activations' gradients in flight (4 bytes per unit
    ///   of width per token).
    ///
    /// Measured on the H200 (`docs/benchmarks/memory-h200.md`): Qwen2.5-7B's 545M-element
    /// output head makes 8 bytes per element of it; the bench's 3.8B GPT decoder 2.0 GB.
    pub(super) fn flushes(&self, class: &ClassMemory) -> Vec<Flush> {
        if let Some(t) = &self.traced {
            return self.traced_flushes(t);
        }
        let b = self.value_bytes;
        let half = b / 2.0;
        let copies = |largest: f64| self.flush_copies(largest);
        let tokens = self.tokens;
        let shape = self.shape_at_tokens();
        let saved = shape.saved_per_token(self.checkpointing);
        // Activations still kept when `freed` bytes per token are gone (the margin whole when
        // the step's tokens are not known).
        let alive = |freed: f64| match tokens {
            Some(t) => t * (saved - freed).max(0.0) * half,
            None => self.activation_bytes(class),
        };
        let in_flight = tokens.map_or(0.0, |t| 4.0 * shape.hidden * t * half);
        let tied = if self.shape.tied {
            b * self.shape.vocab * self.shape.hidden
        } else {
            0.0
        };
        let Some(gradients) = shape.backward_gradients(self.checkpointing, MAX_TENSORS) else {
            let largest = self.shape.largest_tensor();
            return vec![Flush {
                alive: alive(0.0),
                transient: b * REDUCE_BUCKET_ELEMENTS.max(largest)
                    + copies(largest)
                    + b * largest
                    + tied
                    + in_flight,
            }];
        };
        // The input embedding's gradient (the tied matrix's, whole only from there on).
        let embedding = gradients
            .len()
            .saturating_sub(1 + usize::from(self.shape.positions > 0.0));
        let arrivals: Vec<Arrival> = gradients
            .iter()
            .enumerate()
            .map(|(i, g)| Arrival {
                numel: g.numel,
                alive: alive(g.freed),
                held: if i < embedding { tied } else { 0.0 },
            })
            .collect();
        bucket_flushes(&arrivals, b, &copies, in_flight)
    }

    /// What a flush holds for its largest tensor: the rank's gradient partition copied back
    /// from the host, then the larger of the norm's fp64 chunks and the fp32 copy.
    fn flush_copies(&self, largest: f64) -> f64 {
        let part = largest / as_f64(self.ranks.max(1));
        self.value_bytes * part + (8.0 * part.min(NORM_CHUNK_ELEMENTS)).max(4.0 * part)
    }

    /// [`JobMemory::flushes`] over a trace's gradients: what is alive at each is the trace's
    /// (the activations' gradients in flight and a tied matrix's first gradient with it).
    fn traced_flushes(&self, t: &super::Traced) -> Vec<Flush> {
        let b = self.value_bytes;
        let copies = |largest: f64| self.flush_copies(largest);
        let scale = self.tokens.map_or(1.0, |tokens| tokens / t.tokens());
        let arrivals: Vec<Arrival> = t
            .gradients
            .iter()
            .map(|&(numel, alive)| Arrival {
                numel,
                alive: alive * scale,
                held: 0.0,
            })
            .collect();
        bucket_flushes(&arrivals, b, &copies, 0.0)
    }

    /// [`JobMemory::flushes`] where `placement` offloads under ZeRO-3 (none otherwise).
    pub(super) fn flushes_for(&self, placement: Placement, class: &ClassMemory) -> Vec<Flush> {
        if self.sharding == Sharding::Zero(3) && placement != Placement::NoOffload {
            self.flushes(class)
        } else {
            Vec::new()
        }
    }
}

/// A gradient as it arrives in the backward: its elements, the activation bytes alive then and
/// what else it holds until later (a tied matrix's first gradient).
struct Arrival {
    numel: f64,
    alive: f64,
    held: f64,
}

/// DeepSpeed's bucket flushes over `arrivals`: a bucket is reduced when the next gradient would
/// take it past `reduce_bucket_size`, and once more at the end (see [`JobMemory::flushes`]).
fn bucket_flushes(
    arrivals: &[Arrival],
    b: f64,
    copies: &dyn Fn(f64) -> f64,
    in_flight: f64,
) -> Vec<Flush> {
    let mut out = Vec::new();
    let (mut elements, mut largest) = (0.0_f64, 0.0_f64);
    for g in arrivals {
        if elements > 0.0 && elements + g.numel > REDUCE_BUCKET_ELEMENTS {
            out.push(Flush {
                alive: g.alive,
                transient: b * elements + copies(largest) + b * g.numel + g.held + in_flight,
            });
            (elements, largest) = (0.0, 0.0);
        }
        elements += g.numel;
        largest = largest.max(g.numel);
    }
    if elements > 0.0 {
        out.push(Flush {
            alive: arrivals.last().map_or(0.0, |g| g.alive),
            transient: b * elements + copies(largest) + in_flight,
        });
    }
    out
}
