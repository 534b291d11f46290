//! The model hints of a TrainingJob (`spec.model`): what the operator knows of the model and
//! the step, as the model card or its `config.json` says it. Each whole-number hint's bound is
//! the one table's ([`crate::hints`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ConfigMapKeyRef;
use crate::quantity::ParameterCount;

/// What the operator knows of the model and the step: enough to tell whether the job fits in
/// GPU memory without offload, how much must be offloaded when it does not, and (with
/// `tokensPerStep`) whether the CPU keeps up. Give the model's shape as its model card states it
/// (or its `config.json` through `configMapRef`): the estimate then counts what the blocks as
/// built keep (grouped-query attention, gated MLPs, large vocabularies, experts). Without hints
/// the operator cannot know the job's size, offloads as the node class suggests, and says so.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.parameters) || has(self.configMapRef) || (has(self.hiddenSize) && has(self.layers))", "message": "spec.model needs parameters, a configMapRef to the model's config.json, or hiddenSize and layers"}
]))]
pub struct ModelHints {
    /// Total trainable parameters of the whole model (not per GPU: the operator shards them by
    /// the ZeRO stage or FSDP over replicas × GPUs per pod). A number (`8000000000`) or as
    /// people say it: `8B`, `1.5B`, `350M`, `70e9`. Unset: counted from the shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<ParameterCount>,
    /// A ConfigMap in the job's namespace holding the model's Hugging Face `config.json`
    /// (`kubectl create configmap NAME --from-file=config.json`; key `config.json` unless
    /// `key` says otherwise). Its shape is read (`hidden_size`, `num_hidden_layers`,
    /// `intermediate_size`, `num_attention_heads`, `num_key_value_heads`, `head_dim`,
    /// `vocab_size`, `tie_word_embeddings`, the experts' fields) and the parameters counted
    /// from it; the shape fields below must then agree with it where given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<ConfigMapKeyRef>,
    /// Tokens each GPU processes per optimizer step (micro-batch × sequence length × gradient
    /// accumulation steps). Sizes the activations (divided by the DeepSpeed config's
    /// `gradient_accumulation_steps`) and the CPU check of `offloadRatio: Auto`. Unset: a
    /// margin of GPU memory is kept for activations instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::hints::MAX_TOKENS_PER_STEP))]
    pub tokens_per_step: Option<i64>,
    /// Tokens in one sequence of a micro-batch; with `tokensPerStep` it says how many sequences
    /// a micro-batch holds. The model's trace runs at that shape (an eager attention keeps
    /// sequence² scores, so the split matters). Unset: one sequence of all the micro-batch's
    /// tokens, never under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::hints::MAX_SEQUENCE_LENGTH))]
    pub sequence_length: Option<i64>,
    /// The attention implementation the training code asks `transformers` for (`sdpa`, `eager`,
    /// `flash_attention_2`): the model's trace runs what it keeps. Unset: the `config.json`'s
    /// `attn_implementation`, else the library's default for the model type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[A-Za-z0-9_./-]+$"))]
    pub attention: Option<String>,
    /// How the blocks are built: `Llama` (RMSNorm, gated MLP such as SwiGLU: Llama, Mistral,
    /// Qwen, Gemma, Mixtral, DeepSeek) or `GPT` (LayerNorm, plain MLP: GPT-2, GPT-NeoX, OPT,
    /// Falcon). Unset: `Llama`, or what the `config.json`'s `model_type` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<ModelArchitecture>,
    /// Model width (hidden size). Unset: derived from the parameters for a typical decoder
    /// shape (about 128 times wider than deep).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::hints::MAX_HIDDEN_SIZE))]
    pub hidden_size: Option<i64>,
    /// Transformer layers. Unset: derived from the parameters and the width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::hints::MAX_LAYERS))]
    pub layers: Option<i64>,
    /// MLP (intermediate) size of a dense layer. Unset: 3.5 × the width for `Llama`, 4 × for
    /// `GPT`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::hints::MAX_INTERMEDIATE_SIZE))]
    pub intermediate_size: Option<i64>,
    /// Attention (query) heads. Unset: width / 128.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::hints::MAX_HEADS))]
    pub attention_heads: Option<i64>,
    /// Key/value heads (grouped-query attention). Unset: as many as `attentionHeads` for `GPT`,
    /// at most 8 for `Llama`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::hints::MAX_HEADS))]
    pub key_value_heads: Option<i64>,
    /// Width of one attention head. Unset: width / attention heads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::hints::MAX_HEADS))]
    pub head_dim: Option<i64>,
    /// Vocabulary size, for the embeddings and the logits. Unset: 128000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::hints::MAX_VOCAB_SIZE))]
    pub vocab_size: Option<i64>,
    /// The input and output embeddings share one matrix. Unset: false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tied_embeddings: Option<bool>,
    /// The model applies rotary position embeddings to its queries and keys (GPT-NeoX, GPT-J,
    /// Falcon, Phi); `false` for learned or ALiBi positions (GPT-2, OPT, BLOOM, MPT). A `GPT`
    /// block with them keeps rotated copies of the queries and keys for backward. Unset: true,
    /// or what the `config.json`'s `model_type` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotary_embeddings: Option<bool>,
    /// Mixture of experts in the MLP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts: Option<ExpertHints>,
    /// The training code recomputes activations in backward (activation or gradient
    /// checkpointing), so only each layer's input is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation_checkpointing: Option<bool>,
}

/// How a model's transformer blocks are built, which decides what they keep for backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ModelArchitecture {
    /// RMSNorm and a gated MLP (SwiGLU, GeGLU), usually with grouped-query attention.
    Llama,
    /// LayerNorm and a plain MLP (GELU).
    #[serde(rename = "GPT")]
    Gpt,
}

/// A mixture-of-experts MLP, as the model card states it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExpertHints {
    /// Routed experts per MoE layer (`num_local_experts`, `n_routed_experts`).
    #[schemars(range(min = 1, max = crate::hints::MAX_EXPERTS))]
    pub count: i64,
    /// Experts each token is routed to (`num_experts_per_tok`).
    #[schemars(range(min = 1, max = crate::hints::MAX_EXPERTS))]
    pub per_token: i64,
    /// Shared experts every token goes through (`n_shared_experts`). Unset: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = crate::hints::MAX_EXPERTS))]
    pub shared: Option<i64>,
    /// MLP size of one expert (`moe_intermediate_size`). Unset: `intermediateSize`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::hints::MAX_INTERMEDIATE_SIZE))]
    pub intermediate_size: Option<i64>,
}

impl ModelHints {
    /// Hints that give only the parameter count.
    pub fn parameters(parameters: ParameterCount) -> Self {
        ModelHints {
            parameters: Some(parameters),
            ..ModelHints::default()
        }
    }
}
