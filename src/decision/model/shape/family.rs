//! What a model family builds beyond the Llama-style block, and how well the memory model knows
//! what a `model_type`'s blocks keep for backward.

/// What a model family builds beyond the Llama-style block, read from its `config.json`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quirks {
    /// A norm before and after both attention and the MLP, four a layer (Gemma-2 and -3):
    /// each keeps what a Llama-style norm keeps (8 bytes per unit of width per token), and has
    /// its own weight.
    pub sandwich_norms: bool,
    /// A norm over the whole query and the whole key (OLMo-2's `q_norm` / `k_norm`, after the
    /// projections, before the heads are split): each keeps what a Llama-style norm keeps, 8
    /// bytes per unit of its width per token, and has its own weight.
    pub query_key_norms: bool,
    /// A norm over each head of the query and of the key (Qwen3's and Gemma-3's `q_norm` /
    /// `k_norm`, one head wide): their weights are counted, and what they keep for backward
    /// ([`Quirks::query_key_saved`]).
    pub head_norms: bool,
    /// The final logits softcapped (`final_logit_softcapping`: divided, `tanh`, multiplied
    /// back): `tanh` keeps its 16-bit output for backward, 2 bytes per token per vocabulary
    /// entry beside the loss's fp32 log-softmax.
    pub softcapped_logits: bool,
    /// Attention scores softcapped (`attn_logit_softcapping`): counted as a fused attention
    /// keeps it (SDPA, FlashAttention with softcapping); an eager attention also keeps each
    /// layer's sequence² scores, which the count does not cover and the reasons say.
    pub softcapped_attention: bool,
    /// Multi-head latent attention (DeepSeek-V2/V3's `kv_lora_rank`), counted as full attention
    /// at the queries' and keys' head width: over, never under.
    pub latent_attention: bool,
    /// Attention and the MLP in parallel on one norm's output (Cohere's decoder layer), that
    /// norm a LayerNorm without bias computed in fp32, as is the final norm: each keeps
    /// `x − mean` twice and the normalized value (12 bytes per unit of width per token) and its
    /// 16-bit output, which attention and the MLP share. Measured on an H100 (Cohere, 16 layers
    /// of width 4,096, 1 × 2,048 tokens): what the blocks kept within 0.02 % of this count,
    /// where the Llama-style count was 2.5 % over.
    pub parallel_block: bool,
    /// RMSNorms that multiply their weight in fp32 and cast after (Gemma's `x * (1 + w)`,
    /// OLMo-2's `(w * x).to(dtype)`): each keeps the fp32 normalized value (4 bytes per unit of
    /// its width) where a Llama-style norm keeps its 16-bit cast (2).
    pub fp32_norm_weight: bool,
    /// One fused query/key/value projection split into views (Phi-3's `qkv_proj`): attention
    /// keeps the whole projection through the values' view (2 bytes per unit of the queries'
    /// and the keys' width more), and its rotary concatenates the rotated queries, so the
    /// kernel's output is laid out by head and copied for the output projection (2 bytes per
    /// unit of the queries' width).
    pub fused_qkv: bool,
    /// A GPT-style block with separate query, key and value projections rotated in place
    /// (StarCoder2): no rotated copies kept beside a fused projection's output, as GPT-NeoX
    /// keeps.
    pub split_projections: bool,
}

impl Quirks {
    /// Bytes one RMSNorm of `width` keeps for backward per token without its output: its fp32
    /// input and reciprocal, and the normalized value (16-bit, or fp32 with
    /// [`Quirks::fp32_norm_weight`]).
    fn rms_norm_saved(self, width: f64) -> f64 {
        let normalized = if self.fp32_norm_weight { 4.0 } else { 2.0 };
        (4.0 + normalized) * width + 4.0
    }

    /// Bytes a layer's norms keep for backward per token, with the attention's and the MLP's
    /// 16-bit inputs (2 bytes per unit of width each, a norm's output or, for OLMo-2's norms
    /// after the blocks, the residual stream): two RMSNorms (Llama: 16 bytes per unit of width
    /// and 8 in all), four with [`Quirks::sandwich_norms`], or a parallel block's one
    /// LayerNorm. Measured on an H100 and replicated on the CPU (the same tensors, the same
    /// bytes): Gemma-2 keeps 36 bytes per unit and 16, OLMo-2 20 and 8.
    pub fn layer_norms_saved(self, hidden: f64) -> f64 {
        if self.parallel_block {
            return layer_norm_saved(hidden);
        }
        let norms = if self.sandwich_norms { 4.0 } else { 2.0 };
        norms * self.rms_norm_saved(hidden) + 4.0 * hidden
    }

    /// Bytes the final norm of a Llama-style model keeps per token with its output: an
    /// RMSNorm, or a parallel block's LayerNorm.
    pub fn final_norm_saved(self, hidden: f64) -> f64 {
        if self.parallel_block {
            layer_norm_saved(hidden)
        } else {
            self.rms_norm_saved(hidden) + 2.0 * hidden
        }
    }

    /// Bytes the norms on the query and key keep for backward per token, their widths `q` and
    /// `kv` and `heads` query and key/value heads in all: OLMo-2's whole-width norms
    /// ([`Quirks::query_key_norms`]) or per-head norms ([`Quirks::head_norms`]), each an RMSNorm
    /// without its output (rotary or the kernel keep what follows). Measured for the per-head
    /// norms: Qwen3-4B at 1 × 5,120 tokens on an H100 kept 34,605,240,908 bytes for backward
    /// against 34,602,577,920 counted (−0.01 %; 16.5 % under without them;
    /// docs/benchmarks/raw/2026-12-06-h100-eighth/); for the whole-width ones OLMo-2-7B at
    /// 1 × 4,096 kept 37,000,135,180 (docs/benchmarks/raw/2026-12-06-h100-olmo2-starcoder2/).
    pub fn query_key_saved(self, q: f64, kv: f64, heads: f64) -> f64 {
        let whole = if self.query_key_norms {
            self.rms_norm_saved(q) + self.rms_norm_saved(kv)
        } else {
            0.0
        };
        let per_head = if self.head_norms {
            self.rms_norm_saved(q + kv) - 4.0 + 4.0 * heads
        } else {
            0.0
        };
        whole + per_head
    }

    /// Norms of a layer outside attention (one weight each, a unit of width wide).
    pub fn layer_norms(self) -> usize {
        if self.parallel_block { 1 } else { 2 }
    }

    /// What the quirks are, for reasons (`, four norms a layer, …`).
    pub fn describe(self) -> String {
        let mut said = String::new();
        for (on, what) in [
            (self.sandwich_norms, ", four norms a layer"),
            (self.query_key_norms, ", query and key norms"),
            (self.fp32_norm_weight, ", norms weighted in fp32"),
            (
                self.fused_qkv,
                ", one fused query/key/value projection kept whole",
            ),
            (self.softcapped_logits, ", softcapped logits"),
            (
                self.softcapped_attention,
                ", softcapped attention counted as a fused one (SDPA or FlashAttention) keeps it: an eager attention keeps each layer's sequence² scores too, which this count does not cover",
            ),
            (
                self.latent_attention,
                ", latent attention counted as full attention at its query and key head width (over)",
            ),
        ] {
            if on {
                said.push_str(what);
            }
        }
        said
    }
}

/// Bytes an fp32 LayerNorm without bias keeps for backward per token with its 16-bit output
/// ([`Quirks::parallel_block`]): `x − mean` twice and the normalized value, 4 bytes each per
/// unit of width, the output's 2, and the reciprocal's 4.
fn layer_norm_saved(hidden: f64) -> f64 {
    14.0 * hidden + 4.0
}

/// Bytes per token per vocabulary entry the softcapped logits keep for backward: `tanh`'s
/// 16-bit output.
pub const SOFTCAP_SAVED_BYTES: f64 = 2.0;

/// How the memory model knows what a model type's blocks keep for backward (its activations),
/// from measurements on the H200 (docs/benchmarks/memory-h200.md).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum TypeStanding {
    /// Measured, and its blocks' terms count it (Llama, Mistral, Qwen2, Mixtral, GPT-NeoX, and
    /// shapes given as hints, which describe those blocks).
    Counted,
    /// Measured: its step's peak holds more activations than its blocks' terms count (what the
    /// backward of a fused projection or of softcapped logits holds), by this factor.
    Measured(&'static str, f64),
    /// A `model_type` never measured: [`UNMEASURED_TYPE_MARGIN`] more is kept on the
    /// activations.
    Unmeasured,
}

/// The margin kept on the activations of a `model_type` never measured: above what every type
/// measured so far needed over the Llama-style count of its blocks, so that none of them would
/// have run out with it (the largest, OLMo-2 before its norms were counted, needed +36 %; the
/// types and figures: `docs/benchmarks/memory-h200.md`). It applies only where the step could
/// not be traced.
pub const UNMEASURED_TYPE_MARGIN: f64 = 0.40;

impl TypeStanding {
    /// The factor on the counted activations.
    pub fn factor(self) -> f64 {
        match self {
            TypeStanding::Counted => 1.0,
            TypeStanding::Measured(_, f) => f,
            TypeStanding::Unmeasured => 1.0 + UNMEASURED_TYPE_MARGIN,
        }
    }

    /// What a decision's reason says of it; nothing for a counted type.
    pub fn said(self) -> Option<String> {
        match self {
            TypeStanding::Counted => None,
            TypeStanding::Measured(name, f) => Some(format!(
                "model_type {name} measured: its step's peak holds {:.0} % more activations than its blocks' count, counted",
                (f - 1.0) * 100.0
            )),
            TypeStanding::Unmeasured => Some(format!(
                "its model_type was never measured: +{:.0} % kept on the activations (what runs of it teach replaces this)",
                UNMEASURED_TYPE_MARGIN * 100.0
            )),
        }
    }
}
