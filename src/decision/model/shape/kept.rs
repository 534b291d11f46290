//! What one layer keeps for backward per token: its blocks' terms, and what attention keeps
//! beyond the fused kernel's own tensors where the kernel is given an explicit mask, or where
//! the keys and values are repeated to the queries' heads before it.
//!
//! Measured with `transformers` 5.17 and torch 2.11 (SDPA): a layer whose sliding window is not
//! longer than the sequence (`kv_length >= sliding_window`) cannot rely on SDPA's own causal
//! flag; the model builds a boolean mask once, and each layer's SDPA call converts it to a
//! 16-bit additive mask of `batch × sequence × sequence` that its backward keeps (2 bytes per
//! token per unit of sequence, every such layer). With a mask, or with heads wider than 256,
//! `transformers` does not pass grouped key/value heads to SDPA: it repeats the keys and values
//! to the queries' heads first, and the repeated copies are what attention keeps (4 bytes more
//! per unit of the queries' width over the keys' and values'). Phi-3-mini at 1 × 4,096 (window
//! 2,047), Gemma-2-2B at 1 × 5,120 (window 4,096 on every other layer) and StarCoder2 at
//! 1 × 4,096 (window 4,096) on an H100 kept for backward what this counts.

use super::{Block, ModelShape, SHARED_GATE_SAVED_BYTES};

/// A sliding attention window and the sequence the job trains at.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    /// The window (`sliding_window`), in tokens.
    pub size: f64,
    /// Layers that attend through it (`layer_types`' `sliding_attention`, every other layer of
    /// Gemma-2, five of six of Gemma-3, all of them for most types).
    pub layers: f64,
    /// The longest sequence the model takes (`max_position_embeddings`), 0 when not given.
    pub positions: f64,
    /// The sequence counted: the tokens of a micro-batch, at most `positions` (the job gives
    /// tokens, not sequences: one sequence of them is the longest it can hold, so the count is
    /// never under). 0 until the job's tokens are known.
    pub sequence: f64,
}

impl Window {
    /// The sequence reaches the window, so each of its layers gets an explicit mask.
    pub fn masked(&self) -> bool {
        self.sequence > 0.0 && self.sequence >= self.size
    }
}

impl ModelShape {
    /// Bytes one layer keeps for backward per token, in 16-bit.
    pub(super) fn layer_saved(&self, moe: bool) -> f64 {
        let (h, q, kv, heads) = (self.hidden, self.query_width(), self.kv_width(), self.heads);
        match self.block {
            Block::Gated => {
                let mlp = match (moe, self.experts) {
                    (true, Some(e)) => {
                        // A gated shared expert's output, kept for the gate's product (Qwen2-
                        // MoE: within 0.03 % of what its blocks kept, 2.0 % under without).
                        let gate = if e.shared_gate && e.shared > 0.0 {
                            2.0 * h + SHARED_GATE_SAVED_BYTES
                        } else {
                            0.0
                        };
                        e.per_token * (8.0 * e.intermediate + 4.0 * h)
                            + 17.0 * e.count
                            + 8.0 * e.shared * e.shared_intermediate
                            + gate
                    }
                    _ => 8.0 * self.intermediate,
                };
                let query_key = self.quirks.query_key_saved(q, kv, heads + self.kv_heads);
                self.quirks.layer_norms_saved(h)
                    + query_key
                    + 4.0 * q
                    + 4.0 * kv
                    + 4.0 * heads
                    + self.attention_extra(false)
                    + mlp
            }
            Block::Plain => {
                let rotated = if self.rotary && !self.quirks.split_projections {
                    2.0 * q + 2.0 * kv + 256.0
                } else {
                    0.0
                };
                8.0 * h
                    + 4.0 * q
                    + 4.0 * kv
                    + 4.0 * self.intermediate
                    + 4.0 * heads
                    + 16.0
                    + rotated
                    + self.attention_extra(false)
            }
        }
    }

    /// The shape at `tokens` per micro-batch: its window's sequence set (the longest sequence
    /// those tokens can make, at most the model's positions).
    #[must_use]
    pub fn at_tokens(mut self, tokens: f64) -> Self {
        if let Some(w) = self.window.as_mut() {
            w.sequence = if w.positions > 0.0 {
                tokens.min(w.positions)
            } else {
                tokens
            };
        }
        self
    }

    /// The keys and values are repeated to the queries' heads before attention in a layer
    /// (`masked`: one that attends through an explicit mask).
    fn repeated(&self, masked: bool) -> bool {
        self.kv_heads < self.heads && (masked || self.head_dim > 256.0)
    }

    /// Bytes attention keeps per token in a layer beyond the rotated queries and keys, the
    /// values, the output and the log-sum-exp: the repeated keys and values, Phi-3's whole
    /// fused projection (kept through the values' view of it unless they were repeated) and its
    /// output's copy (its rotary concatenates, so the kernel's output is laid out by head).
    pub(super) fn attention_extra(&self, masked: bool) -> f64 {
        let (q, kv) = (self.query_width(), self.kv_width());
        let repeated = self.repeated(masked);
        let mut extra = if repeated { 4.0 * (q - kv) } else { 0.0 };
        if self.quirks.fused_qkv {
            extra += 2.0 * q + if repeated { 0.0 } else { 2.0 * (q + kv) };
        }
        extra
    }

    /// Bytes per token one windowed layer keeps beyond the same layer without a mask: its
    /// 16-bit mask and what the mask changes in its attention (none below the window).
    pub(super) fn masked_layer_extra(&self) -> f64 {
        match self.window {
            Some(w) if w.masked() => {
                2.0 * w.sequence + self.attention_extra(true) - self.attention_extra(false)
            }
            _ => 0.0,
        }
    }

    /// Bytes per token all the windowed layers keep beyond the same layers without a mask.
    pub(super) fn window_extra(&self) -> f64 {
        self.window.map_or(0.0, |w| {
            w.layers.min(self.layers) * self.masked_layer_extra()
        })
    }
}
