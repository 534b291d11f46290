//! The model as built: the shape a model card (or its `config.json`) gives — width, layers, MLP
//! size, attention and key/value heads, vocabulary, tied embeddings, experts — and what follows
//! from it: the exact parameter count, the bytes autograd keeps per token for backward, and the
//! parameter tensors in the order DeepSpeed groups them.
//!
//! The per-token terms count the tensors the blocks of Hugging Face `transformers` save for
//! backward with SDPA (fused) attention in 16-bit, and were checked on an H200 by counting the
//! saved tensors of a real training step (`hack/gpu/hf_step.py`): within 0.01 % for Llama,
//! Mistral, Qwen2 and Mixtral, 0.2 % for GPT-NeoX (`docs/benchmarks/memory-h200.md`).
//! - Llama-style block (RMSNorm computed in fp32, gated MLP such as SwiGLU, grouped-query
//!   attention): each norm keeps its fp32 input, the normalised value and its output (8 bytes
//!   per unit of width); attention keeps the rotated queries and keys, the values, the output and
//!   the log-sum-exp (4 bytes per query and per key/value unit, 4 per head); the gated MLP keeps
//!   the gate and up projections, the activation and the product (8 bytes per MLP unit). A
//!   mixture-of-experts layer keeps that per expert each token is routed to, plus the routing.
//! - GPT-style block (LayerNorm, plain MLP such as GELU): 16 bytes per unit of width and 4 per
//!   MLP unit (the bench's own GPT decoder, measured within 0.02 %); with rotary position
//!   embeddings 2 more per query and per key/value unit, the rotated copies (GPT-NeoX: 20 per
//!   unit of width in all).
//! - Beyond them, per family ([`Quirks`]): norms weighted in fp32 (Gemma, OLMo-2), extra norms,
//!   query/key norms, a fused projection (Phi-3), a parallel block (Cohere); and a sliding
//!   window the sequence reaches ([`Window`]): each such layer's mask and its keys and values
//!   repeated to the queries' heads. Checked against the H100 runs' counts and, for shapes no
//!   GPU ran, against the same count on the CPU (`hack/saved-bytes.py`).
//! - The logits: the loss keeps the fp32 log-softmax (4 bytes per token per vocabulary entry) and
//!   its backward holds two more fp32 copies at once (8 more): 12 in all at the step's peak.

use std::fmt;

/// Bytes per token per vocabulary entry at the loss's peak: the fp32 log-softmax kept for
/// backward, and the two fp32 gradients its backward holds at once.
pub const LOGIT_PEAK_BYTES: f64 = 12.0;
/// Vocabulary assumed when nothing names one (current LLMs: 32k to 256k).
pub const DEFAULT_VOCAB: f64 = 128_000.0;

/// The size of a walk over the model's tensors.
struct Layout {
    /// Transformer layers.
    layers: usize,
    /// Tensors a layer has at most.
    per_layer: usize,
    /// Layers before the first mixture-of-experts layer (all of them without experts).
    dense: usize,
}

/// One parameter's gradient as the backward completes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gradient {
    /// Elements of the parameter.
    pub numel: f64,
    /// Activation bytes per token freed by then, of those kept when backward starts.
    pub freed: f64,
}

/// How each transformer block is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    /// RMSNorm (computed in fp32) and a gated MLP: Llama, Mistral, Qwen, Gemma, Mixtral, DeepSeek.
    Gated,
    /// LayerNorm and a plain MLP: GPT-2, GPT-NeoX, GPT-J, OPT, Falcon, BLOOM.
    Plain,
}

impl fmt::Display for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Block::Gated => "Llama-style (RMSNorm, gated MLP)",
            Block::Plain => "GPT-style (LayerNorm, plain MLP)",
        })
    }
}

/// Mixture of experts in the MLP.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Experts {
    /// Routed experts per MoE layer.
    pub count: f64,
    /// Experts each token is routed to.
    pub per_token: f64,
    /// MLP size of one routed expert.
    pub intermediate: f64,
    /// Shared experts every token goes through (DeepSeek, Qwen-MoE).
    pub shared: f64,
    /// MLP size of one shared expert.
    pub shared_intermediate: f64,
    /// The shared experts' output is gated per token (Qwen-MoE's `shared_expert_gate`, one
    /// weight per unit of width).
    pub shared_gate: bool,
    /// Leading layers with a dense MLP instead (DeepSeek's `first_k_dense_replace`).
    pub dense_layers: f64,
}

impl Experts {
    /// Experts as a job's hints give them: every expert (routed and shared) `size` wide, no
    /// shared gate, every layer a mixture.
    pub fn hinted(count: f64, per_token: f64, shared: f64, size: f64) -> Experts {
        Experts {
            count,
            per_token,
            intermediate: size,
            shared,
            shared_intermediate: size,
            shared_gate: false,
            dense_layers: 0.0,
        }
    }
}

/// Bytes per token a gated shared expert's gate keeps besides the expert's output: the
/// sigmoid's 16-bit output and the product's other factor, one value each.
pub const SHARED_GATE_SAVED_BYTES: f64 = 4.0;

/// The model's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ModelShape {
    /// Block kind.
    pub block: Block,
    /// Width (hidden size).
    pub hidden: f64,
    /// Transformer layers.
    pub layers: f64,
    /// MLP size of a dense layer.
    pub intermediate: f64,
    /// Attention (query) heads.
    pub heads: f64,
    /// Key/value heads (grouped-query attention; `heads` without it).
    pub kv_heads: f64,
    /// Width of one head.
    pub head_dim: f64,
    /// Vocabulary size.
    pub vocab: f64,
    /// Input and output embeddings share one matrix.
    pub tied: bool,
    /// Biases on the query, key and value projections (Qwen2).
    pub attention_bias: bool,
    /// Learned position embeddings (GPT-2: `n_positions`), 0 with rotary positions.
    pub positions: f64,
    /// Rotary position embeddings on the queries and keys. A GPT-style block with them keeps
    /// the rotated queries and keys beside its fused projection's output (GPT-NeoX); the
    /// Llama-style block's count has them already.
    pub rotary: bool,
    /// Experts, for a mixture-of-experts model.
    pub experts: Option<Experts>,
    /// The shape was given (a `config.json` or the hints), not derived from a parameter count.
    pub known: bool,
    /// How well the model knows what this model type's blocks keep for backward.
    pub standing: TypeStanding,
    /// What the hints left open of the shape, where its parameter count fixed the rest.
    pub open: Option<OpenShape>,
    /// What a family builds beyond the Llama-style block (Gemma-2's extra norms and softcapped
    /// logits).
    pub quirks: Quirks,
    /// A vision tower ahead of the language model (a multimodal `config.json`).
    pub tower: Option<VisionTower>,
    /// A sliding attention window, where the layers have one.
    pub window: Option<Window>,
    /// The `config.json` the shape was read from, by digest (what a trace of it is found by).
    pub source: Option<ConfigDigest>,
}

/// A digest of a model's `config.json` as JSON (key order and spacing do not change it): two
/// jobs that reference the same config find the same trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConfigDigest(pub [u8; 16]);

impl ConfigDigest {
    /// The digest of a parsed `config.json`.
    pub fn of(config: &serde_json::Value) -> ConfigDigest {
        use sha2::Digest;
        // serde_json's maps are ordered by key: the text is canonical.
        let digest = sha2::Sha256::digest(config.to_string().as_bytes());
        let mut out = [0; 16];
        out.copy_from_slice(&digest[..16]);
        ConfigDigest(out)
    }
}

impl fmt::Display for ConfigDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl ModelShape {
    /// A typical Llama-style decoder of `parameters`: about 128 times wider than deep, an MLP
    /// of 3.5 × the width (Llama 3), grouped-query attention with 8 key/value heads, and
    /// `vocab` entries. Only a stand-in: its tensors are not used to size partial offload.
    pub fn typical(parameters: f64, hidden: Option<f64>, layers: Option<f64>, vocab: f64) -> Self {
        let hidden = hidden.unwrap_or_else(|| typical_width(parameters));
        let heads = (hidden / 128.0).round().max(1.0);
        let mut shape = ModelShape {
            block: Block::Gated,
            hidden,
            layers: 1.0,
            intermediate: (3.5 * hidden).round(),
            heads,
            kv_heads: heads.min(8.0),
            head_dim: hidden / heads,
            vocab,
            tied: false,
            attention_bias: false,
            positions: 0.0,
            rotary: true,
            experts: None,
            known: false,
            standing: TypeStanding::Counted,
            open: None,
            quirks: Quirks::default(),
            tower: None,
            window: None,
            source: None,
        };
        shape.layers = layers.unwrap_or_else(|| {
            let per_layer = shape.layer_parameters(false).max(1.0);
            ((parameters - shape.embedding_parameters()) / per_layer)
                .round()
                .max(1.0)
        });
        shape
    }

    /// Width of the queries (heads × head width).
    pub fn query_width(&self) -> f64 {
        self.heads * self.head_dim
    }

    /// Width of the keys and of the values.
    pub fn kv_width(&self) -> f64 {
        self.kv_heads * self.head_dim
    }

    fn moe_layers(&self) -> f64 {
        self.experts
            .map_or(0.0, |e| (self.layers - e.dense_layers).max(0.0))
    }

    fn embedding_parameters(&self) -> f64 {
        let h = self.hidden;
        let tables = if self.tied { 1.0 } else { 2.0 };
        let final_norm = match self.block {
            Block::Gated => h,
            Block::Plain => 2.0 * h,
        };
        tables * self.vocab * h + self.positions * h + final_norm
    }

    /// The tensors of one layer, in the order Hugging Face registers them.
    fn layer_tensors(&self, moe: bool, out: &mut Vec<f64>) {
        let (h, q, kv) = (self.hidden, self.query_width(), self.kv_width());
        let f = self.intermediate;
        match self.block {
            Block::Gated => {
                out.push(h * q);
                if self.attention_bias {
                    out.push(q);
                }
                for _ in 0..2 {
                    out.push(h * kv);
                    if self.attention_bias {
                        out.push(kv);
                    }
                }
                out.push(q * h);
                if self.quirks.query_key_norms {
                    out.extend([q, kv]);
                }
                if self.quirks.head_norms {
                    out.extend([self.head_dim, self.head_dim]);
                }
                match (moe, self.experts) {
                    (true, Some(e)) => {
                        out.push(e.count * h);
                        out.push(e.count * 2.0 * e.intermediate * h);
                        out.push(e.count * h * e.intermediate);
                        if e.shared > 0.0 {
                            let fs = e.shared * e.shared_intermediate;
                            out.extend([h * fs, h * fs, fs * h]);
                            if e.shared_gate {
                                out.push(h);
                            }
                        }
                    }
                    _ => out.extend([h * f, h * f, f * h]),
                }
                out.extend(std::iter::repeat_n(h, self.quirks.layer_norms()));
                if self.quirks.sandwich_norms {
                    out.extend([h, h]);
                }
            }
            Block::Plain => {
                out.extend([h, h, h, h]);
                out.extend([h * (q + 2.0 * kv), q + 2.0 * kv, q * h, h]);
                out.extend([h * f, f, f * h, h]);
            }
        }
    }

    fn layer_parameters(&self, moe: bool) -> f64 {
        let mut t = Vec::with_capacity(16);
        self.layer_tensors(moe, &mut t);
        t.iter().sum()
    }

    /// Total parameters, exactly as the model builds them.
    pub fn parameters(&self) -> f64 {
        let moe = self.moe_layers();
        let dense = self.layers - moe;
        self.embedding_parameters()
            + dense * self.layer_parameters(false)
            + moe * self.layer_parameters(true)
            + self.tower.map_or(0.0, |t| t.parameters())
    }

    /// The largest single parameter tensor.
    pub fn largest_tensor(&self) -> f64 {
        let mut t = Vec::with_capacity(16);
        self.layer_tensors(self.experts.is_some(), &mut t);
        self.layer_tensors(false, &mut t);
        t.into_iter().fold(
            self.tower
                .map_or(0.0, |tower| tower.largest_tensor())
                .max(self.vocab * self.hidden),
            f64::max,
        )
    }

    /// Parameters of the largest layer (what ZeRO-3 gathers at once for it).
    pub fn largest_layer(&self) -> f64 {
        self.layer_parameters(self.experts.is_some())
            .max(self.layer_parameters(false))
    }

    /// How many layers and tensors a walk over the model visits; `None` when more than `max`
    /// tensors.
    fn layout(&self, max: usize) -> Option<Layout> {
        let per_layer = match self.block {
            Block::Gated => 21,
            Block::Plain => 12,
        };
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let layers = self.layers.max(0.0) as usize;
        let tower = self.tower.map_or(0, |t| t.tensor_count());
        if layers
            .saturating_mul(per_layer)
            .saturating_add(4)
            .saturating_add(tower)
            > max
        {
            return None;
        }
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let dense = self
            .experts
            .map_or(layers, |e| (e.dense_layers.max(0.0) as usize).min(layers));
        Some(Layout {
            layers,
            per_layer,
            dense,
        })
    }

    /// The parameter tensors in registration order (embeddings, each layer, final norm, output
    /// head) — the order DeepSpeed fills its optimizer sub-groups in. `None` when there are more
    /// than `max` of them (the caller then bounds the grouping instead of walking it).
    pub fn tensors(&self, max: usize) -> Option<Vec<f64>> {
        let Layout {
            layers,
            per_layer,
            dense,
        } = self.layout(max)?;
        let h = self.hidden;
        let mut out = Vec::with_capacity(layers * per_layer + 4);
        // A multimodal model registers its vision tower (and projector) first.
        if let Some(tower) = self.tower {
            tower.tensors(&mut out);
        }
        out.push(self.vocab * h);
        if self.positions > 0.0 {
            out.push(self.positions * h);
        }
        for i in 0..layers {
            self.layer_tensors(i >= dense, &mut out);
        }
        match self.block {
            Block::Gated => out.push(h),
            Block::Plain => out.extend([h, h]),
        }
        if !self.tied {
            out.push(self.vocab * h);
        }
        Some(out)
    }

    /// The tensors of one layer in the order the backward completes their gradients: the MLP
    /// from its output projection back (shared experts, the experts, the router), the second
    /// norm, attention from its output projection back to the queries, the first norm; each
    /// weight before its bias.
    fn layer_backward(&self, moe: bool, out: &mut Vec<f64>) {
        let (h, q, kv) = (self.hidden, self.query_width(), self.kv_width());
        let f = self.intermediate;
        match self.block {
            Block::Gated => {
                match (moe, self.experts) {
                    (true, Some(e)) => {
                        if e.shared > 0.0 {
                            if e.shared_gate {
                                out.push(h);
                            }
                            let fs = e.shared * e.shared_intermediate;
                            out.extend([fs * h, h * fs, h * fs]);
                        }
                        out.push(e.count * h * e.intermediate);
                        out.push(e.count * 2.0 * e.intermediate * h);
                        out.push(e.count * h);
                    }
                    _ => out.extend([f * h, h * f, h * f]),
                }
                if self.quirks.sandwich_norms {
                    out.extend([h, h]);
                }
                if self.quirks.query_key_norms {
                    out.extend([kv, q]);
                }
                if self.quirks.head_norms {
                    out.extend([self.head_dim, self.head_dim]);
                }
                // The norm after attention (none in a parallel block), then its output.
                out.extend(std::iter::repeat_n(h, self.quirks.layer_norms() - 1));
                out.push(q * h);
                for _ in 0..2 {
                    out.push(h * kv);
                    if self.attention_bias {
                        out.push(kv);
                    }
                }
                out.push(h * q);
                if self.attention_bias {
                    out.push(q);
                }
                out.push(h);
            }
            Block::Plain => {
                out.extend([f * h, h, h * f, f, h, h]);
                out.extend([q * h, h, h * (q + 2.0 * kv), q + 2.0 * kv, h, h]);
            }
        }
    }

    /// The parameters' gradients in the order the backward completes them — the output head
    /// (untied), the final norm, the layers from the last to the first, the embeddings (a tied
    /// matrix's gradient is complete only there) — each with the activation bytes per token
    /// ([`ModelShape::saved_per_token`]'s) already freed when it arrives: the loss's
    /// log-softmax once the head's backward is done, the final norm's and each layer's saved
    /// tensors once the layer before them in backward is done. `None` when there are more than
    /// `max` tensors.
    pub fn backward_gradients(&self, checkpointing: bool, max: usize) -> Option<Vec<Gradient>> {
        let Layout {
            layers,
            per_layer,
            dense,
        } = self.layout(max)?;
        let h = self.hidden;
        let mut out = Vec::with_capacity(layers * per_layer + 4);
        let mut push = |numels: &[f64], freed: f64| {
            out.extend(numels.iter().map(|&numel| Gradient { numel, freed }));
        };
        if !self.tied {
            push(&[self.vocab * h], 0.0);
        }
        let mut freed = 4.0 * self.vocab;
        match self.block {
            Block::Gated => push(&[h], freed),
            Block::Plain => push(&[h, h], freed),
        }
        freed += self.final_norm_saved();
        let mut tensors = Vec::with_capacity(per_layer);
        // A windowed layer's mask counted evenly over the layers.
        let window = self.window_extra() / self.layers.max(1.0);
        for i in (0..layers).rev() {
            let moe = i >= dense;
            tensors.clear();
            self.layer_backward(moe, &mut tensors);
            push(&tensors, freed);
            freed += if checkpointing {
                2.0 * h
            } else {
                self.layer_saved(moe) + window
            };
        }
        push(&[self.vocab * h], freed);
        if self.positions > 0.0 {
            push(&[self.positions * h], freed);
        }
        // The vision tower's gradients complete last (what it keeps is not counted).
        if let Some(tower) = self.tower {
            let mut tensors = Vec::with_capacity(tower.tensor_count());
            tower.tensors(&mut tensors);
            tensors.reverse();
            push(&tensors, freed);
        }
        Some(out)
    }

    /// Bytes the final norm keeps for backward per token.
    fn final_norm_saved(&self) -> f64 {
        match self.block {
            Block::Gated => self.quirks.final_norm_saved(self.hidden),
            Block::Plain => 4.0 * self.hidden + 8.0,
        }
    }

    /// Bytes kept for backward per token when backward starts, in 16-bit: the layers' saved
    /// tensors, the final norm's and the loss's fp32 log-softmax (the activation peak less
    /// what the loss's backward holds on top).
    pub fn saved_per_token(&self, checkpointing: bool) -> f64 {
        self.activation_peak_per_token(checkpointing) - (LOGIT_PEAK_BYTES - 4.0) * self.vocab
    }

    /// Bytes kept for backward per token at the start of backward, in 16-bit: every layer's
    /// saved tensors (with activation checkpointing, each layer's input and one layer's saved
    /// tensors recomputed at a time), the final norm, and the loss's fp32 log-softmax; plus what
    /// the loss's backward holds on top at the peak.
    pub fn activation_peak_per_token(&self, checkpointing: bool) -> f64 {
        let moe = self.moe_layers();
        let dense = self.layers - moe;
        let blocks = if checkpointing {
            // The one layer recomputed at a time, a windowed one where there are.
            2.0 * self.hidden * self.layers
                + self.layer_saved(moe > 0.0).max(self.layer_saved(false))
                + self.masked_layer_extra()
        } else {
            dense * self.layer_saved(false) + moe * self.layer_saved(true) + self.window_extra()
        };
        let softcap = if self.quirks.softcapped_logits {
            SOFTCAP_SAVED_BYTES
        } else {
            0.0
        };
        blocks + self.final_norm_saved() + 8.0 + (LOGIT_PEAK_BYTES + softcap) * self.vocab
    }

    /// One line for reasons: `Llama-style (RMSNorm, gated MLP), width 4096 × 32 layers, MLP
    /// 14336, 32 heads (8 key/value), vocabulary 128256`.
    pub fn describe(&self) -> String {
        let experts = self
            .experts
            .map(|e| {
                format!(
                    ", {} experts ({} per token{})",
                    e.count,
                    e.per_token,
                    if e.shared > 0.0 {
                        format!(", {} shared", e.shared)
                    } else {
                        String::new()
                    }
                )
            })
            .unwrap_or_default();
        let mut quirks = self.quirks.describe();
        if let Some(tower) = self.tower {
            quirks.push_str(", ");
            quirks.push_str(&tower.describe());
        }
        let block = if self.quirks.parallel_block {
            "Cohere-style (one LayerNorm, attention and a gated MLP in parallel)".to_string()
        } else {
            self.block.to_string()
        };
        format!(
            "{block}, width {} × {} layers, MLP {}, {} heads ({} key/value), vocabulary {}{}{}{experts}{quirks}",
            self.hidden,
            self.layers,
            self.intermediate,
            self.heads,
            self.kv_heads,
            self.vocab,
            if self.tied { " (tied)" } else { "" },
            if self.block == Block::Plain && !self.rotary {
                ", positions not rotary"
            } else {
                ""
            },
        )
    }
}

/// A typical decoder's width for a parameter count: about 128 times wider than deep, 12 ×
/// width² parameters per layer.
pub fn typical_width(parameters: f64) -> f64 {
    // A width is a whole number.
    (128.0 * parameters / 12.0).cbrt().max(64.0).round()
}

/// DeepSpeed's optimizer sub-groups over `tensors` (each a parameter's numel in the rank's
/// partition): a group closes once it holds at least `group` parameters, or at the last tensor
/// (`stage3.py`'s `_create_fp16_sub_groups`).
pub fn sub_groups(tensors: &[f64], group: f64) -> Vec<f64> {
    let total: f64 = tensors.iter().sum();
    if group >= total {
        return vec![total];
    }
    let mut out = Vec::new();
    let mut current = 0.0;
    for (i, t) in tensors.iter().enumerate() {
        current += t;
        if current >= group || i + 1 == tensors.len() {
            out.push(current);
            current = 0.0;
        }
    }
    out
}

/// The share of parameters whose optimizer state DeepSpeed puts on the host for `ratio`: it
/// counts sub-groups, not parameters — the last `n − ⌊(1 − ratio)·n⌋` of the `n` groups
/// (`stage3.py`, "Assign portion of subgroup to cpu").
pub fn offloaded_share(groups: &[f64], ratio: f64) -> f64 {
    let total: f64 = groups.iter().sum();
    if groups.is_empty() || total <= 0.0 {
        return 0.0;
    }
    groups[first_on_host(groups.len(), ratio)..]
        .iter()
        .sum::<f64>()
        / total
}

/// The first of `groups` sub-groups whose optimizer state DeepSpeed puts on the host for
/// `ratio`: `⌊(1 − ratio)·n⌋`, at most `n`.
pub fn first_on_host(groups: usize, ratio: f64) -> usize {
    #[allow(clippy::cast_precision_loss)]
    let n = groups as f64;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let first = ((1.0 - ratio.clamp(0.0, 1.0)) * n).floor() as usize;
    first.min(groups)
}

mod family;
mod kept;
mod open;
mod tower;
pub use family::{Quirks, SOFTCAP_SAVED_BYTES, TypeStanding, UNMEASURED_TYPE_MARGIN};
pub use kept::Window;
pub use open::OpenShape;
pub use tower::VisionTower;

#[cfg(test)]
pub(crate) mod tests;
