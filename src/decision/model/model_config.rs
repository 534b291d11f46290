//! A model's Hugging Face `config.json` (the file a model card ships; `spec.model.configMapRef`
//! names a ConfigMap holding it), read for the shape the memory model needs. Every field is
//! checked: a value that is not a whole number in range, or a shape no model can have, is an
//! error that names the field.

use serde_json::{Map, Value};

use super::shape::{Block, Experts, ModelShape, TypeStanding, Window};

/// The key of the model's config in its ConfigMap, unless `spec.model.configMapRef.key` names
/// another (`kubectl create configmap NAME --from-file=config.json`).
pub const MODEL_CONFIG_KEY: &str = "config.json";

/// `model_type`s whose blocks are GPT-style (LayerNorm, plain MLP); every other type is read as
/// Llama-style (RMSNorm, gated MLP), the shape of current decoders.
const PLAIN_BLOCKS: &[&str] = &[
    "gpt2",
    "gpt_neox",
    "gptj",
    "gpt_neo",
    "gpt_bigcode",
    "codegen",
    "opt",
    "bloom",
    "falcon",
    "mpt",
    "phi",
    "starcoder2",
];

/// `model_type`s whose activations the blocks' terms count, each checked against what its
/// blocks kept for backward on a GPU (within 0.03 %) and its runs' allocated peaks (the count
/// 0.1–0.2 % over). The runs, per type: `docs/benchmarks/memory-h200.md`, "The per-type
/// table". The multimodal `gemma3` keeps the margin (its vision tower is not counted).
const COUNTED_TYPES: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "mixtral",
    "gpt_neox",
    "starcoder2",
    "cohere",
    "qwen2_moe",
    "qwen3",
    "olmo2",
    "gemma3_text",
];
/// `model_type`s whose blocks' terms count what they keep for backward, whose steps' peaks
/// hold a little more, by the factor measured on the activations (Phi-3's fused projection's
/// gradient assembled from slices, Gemma-2's softcap's own copies of the logits): the runs are
/// in `docs/benchmarks/memory-h200.md`, "The per-type table".
const MEASURED_TYPES: &[(&str, f64)] = &[("phi3", 1.02), ("gemma2", 1.01)];

/// How the memory model knows `model_type`'s activations.
fn standing(model_type: &str) -> TypeStanding {
    if COUNTED_TYPES.contains(&model_type) {
        return TypeStanding::Counted;
    }
    MEASURED_TYPES
        .iter()
        .find(|(t, _)| *t == model_type)
        .map_or(TypeStanding::Unmeasured, |(t, f)| {
            TypeStanding::Measured(t, *f)
        })
}

/// `model_type`s whose configs tie the embeddings unless they say otherwise.
const TIED_BY_DEFAULT: &[&str] = &[
    "gpt2",
    "gemma",
    "gemma2",
    "gemma3_text",
    "falcon",
    "opt",
    "bloom",
    "mpt",
    "gpt_neo",
];

/// `model_type`s whose positions are not rotary (learned, ALiBi); Falcon's are, unless its
/// `alibi` says otherwise.
const NOT_ROTARY: &[&str] = &["gpt2", "opt", "bloom", "mpt", "gpt_bigcode", "gpt_neo"];
/// `model_type`s with biases on the query, key and value projections.
const ATTENTION_BIAS: &[&str] = &["qwen2", "qwen2_moe", "qwen2_vl"];

/// The text a ConfigMap holds under `key`, or what it holds instead (its `data` keys, its
/// `binaryData` keys, or nothing), for a message that says what to change. The one reader of
/// a referenced ConfigMap's file, for the controller and the webhook alike.
pub fn config_map_key(
    cm: &k8s_openapi::api::core::v1::ConfigMap,
    key: &str,
) -> Result<String, String> {
    if let Some(text) = cm.data.as_ref().and_then(|d| d.get(key)) {
        return Ok(text.clone());
    }
    let list = |keys: Vec<&String>| {
        let shown: Vec<String> = keys.iter().take(8).map(|k| format!("{k:?}")).collect();
        let more = keys.len().saturating_sub(8);
        if more > 0 {
            format!("{} and {more} more", shown.join(", "))
        } else {
            shown.join(", ")
        }
    };
    let data: Vec<&String> = cm.data.iter().flat_map(|d| d.keys()).collect();
    let binary: Vec<&String> = cm.binary_data.iter().flat_map(|d| d.keys()).collect();
    Err(match (data.is_empty(), binary.is_empty()) {
        (true, true) => "it holds no data".to_string(),
        _ if binary.iter().any(|k| k.as_str() == key) => format!(
            "{key:?} is under binaryData, not data: the file must be text (kubectl create configmap NAME --from-file={key} puts UTF-8 text in data)"
        ),
        (false, true) => format!("its data has {}", list(data)),
        (true, false) => format!("its binaryData has {} and data nothing", list(binary)),
        (false, false) => format!(
            "its data has {}; its binaryData has {}",
            list(data),
            list(binary)
        ),
    })
}

/// Why a model config cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelConfigError {
    /// The referenced ConfigMap does not exist.
    #[error("ConfigMap {name:?} ({origin}) does not exist in namespace {namespace:?}")]
    MissingConfigMap {
        /// ConfigMap name.
        name: String,
        /// Namespace.
        namespace: String,
        /// What names it: `spec.model.configMapRef` or the annotation.
        origin: &'static str,
    },
    /// The ConfigMap lacks the key.
    #[error(
        "ConfigMap {name:?} has no key {key:?} (spec.model.configMapRef.key, config.json when unset): {found}"
    )]
    MissingKey {
        /// ConfigMap name.
        name: String,
        /// The key.
        key: String,
        /// What the ConfigMap holds instead.
        found: String,
    },
    /// The ConfigMap was not handed to `offload-operator explain`.
    #[error(
        "ConfigMap {name:?} (spec.model.configMapRef) was not given (--model-config) and is not in the cluster"
    )]
    NotGiven {
        /// ConfigMap name.
        name: String,
    },
    /// The ConfigMap could not be read (the API server did not answer in time).
    #[error("ConfigMap {name:?} (the model's config.json) could not be read: {detail}")]
    Unreadable {
        /// ConfigMap name.
        name: String,
        /// What went wrong.
        detail: String,
    },
    /// The text is not a usable model config.
    #[error("{source_name}: {detail}")]
    Invalid {
        /// Where it came from (`ConfigMap "m" key "config.json"`).
        source_name: String,
        /// What is wrong, naming the field.
        detail: String,
    },
}

/// Reads a `config.json`; `source` names where it came from, for messages.
pub fn parse(text: &str, source: &str) -> Result<ModelShape, ModelConfigError> {
    let invalid = |detail: String| ModelConfigError::Invalid {
        source_name: source.to_string(),
        detail,
    };
    let value: Value = serde_json::from_str(text)
        .map_err(|e| invalid(format!("is not JSON ({e}): give the model's config.json")))?;
    let Value::Object(top) = value else {
        return Err(invalid(
            "is not a JSON object: give the model's config.json".into(),
        ));
    };
    // Multimodal configs keep the language model's shape under `text_config`.
    let cfg = match top.get("text_config") {
        Some(Value::Object(text)) if !top.contains_key("hidden_size") => text,
        _ => &top,
    };
    let source = super::shape::ConfigDigest::of(&Value::Object(top.clone()));
    let mut shape = shape_of(cfg, &top).map_err(invalid)?;
    shape.source = Some(source);
    Ok(shape)
}

/// A whole number field: its value where present, `None` where absent or `null`.
fn whole(cfg: &Map<String, Value>, key: &str, max: u64) -> Result<Option<f64>, String> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let n = v
                .as_u64()
                .ok_or_else(|| format!("{key} is {v}, not a whole number"))?;
            if n == 0 || n > max {
                return Err(format!("{key} {n} is out of range: from 1 to {max}"));
            }
            #[allow(clippy::cast_precision_loss)]
            Ok(Some(n as f64))
        }
    }
}

/// The first of `keys` that is present.
fn first(cfg: &Map<String, Value>, keys: &[&str], max: u64) -> Result<Option<f64>, String> {
    for key in keys {
        if let Some(v) = whole(cfg, key, max)? {
            return Ok(Some(v));
        }
    }
    Ok(None)
}

fn required(cfg: &Map<String, Value>, keys: &[&str], max: u64) -> Result<f64, String> {
    first(cfg, keys, max)?.ok_or_else(|| format!("has no {} (the model's shape needs it)", keys[0]))
}

fn boolean(cfg: &Map<String, Value>, key: &str) -> Result<Option<bool>, String> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(format!("{key} is {v}, not true or false")),
    }
}

fn shape_of(cfg: &Map<String, Value>, top: &Map<String, Value>) -> Result<ModelShape, String> {
    let model_type = cfg
        .get("model_type")
        .or_else(|| top.get("model_type"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let block = if PLAIN_BLOCKS.contains(&model_type) {
        Block::Plain
    } else {
        Block::Gated
    };
    let hidden = required(cfg, &["hidden_size", "n_embd", "d_model"], 1_000_000)?;
    let layers = required(
        cfg,
        &["num_hidden_layers", "n_layer", "num_layers"],
        100_000,
    )?;
    let heads = required(cfg, &["num_attention_heads", "n_head"], 100_000)?;
    let intermediate = intermediate_of(cfg, block, hidden)?;
    let kv_heads = kv_heads_of(cfg, heads)?;
    let latent = latent_attention_head(cfg)?;
    let head_dim = head_dim_of(cfg, latent, hidden, heads)?;
    let vocab = required(cfg, &["vocab_size", "padded_vocab_size"], 100_000_000)?;
    let tied = boolean(cfg, "tie_word_embeddings")?
        .or(boolean(top, "tie_word_embeddings")?)
        .unwrap_or(TIED_BY_DEFAULT.contains(&model_type));
    let attention_bias = boolean(cfg, "attention_bias")?
        .unwrap_or(ATTENTION_BIAS.contains(&model_type) || block == Block::Plain);
    let positions = if model_type == "gpt2" || model_type == "opt" {
        first(cfg, &["n_positions", "max_position_embeddings"], 10_000_000)?.unwrap_or(0.0)
    } else {
        0.0
    };
    let alibi = model_type == "falcon" && boolean(cfg, "alibi")? == Some(true);
    let rotary = !(NOT_ROTARY.contains(&model_type) || alibi);
    let experts = experts(cfg, intermediate, layers)?;
    Ok(ModelShape {
        block,
        hidden,
        layers,
        intermediate,
        heads,
        kv_heads,
        head_dim,
        vocab,
        tied,
        attention_bias,
        positions,
        rotary,
        experts,
        known: true,
        // A multimodal config is known by its own type (`gemma3`, not its language model's
        // `gemma3_text`): what its vision tower keeps is not counted.
        standing: standing(
            top.get("model_type")
                .and_then(Value::as_str)
                .unwrap_or(model_type),
        ),
        open: None,
        quirks: quirks(cfg, model_type, latent.is_some())?,
        tower: vision_tower(top, hidden)?,
        window: window(cfg, model_type, layers)?,
        source: None,
    })
}

/// The MLP's size (a plain block's is four times the width where the config gives none).
fn intermediate_of(cfg: &Map<String, Value>, block: Block, hidden: f64) -> Result<f64, String> {
    match (
        first(
            cfg,
            &["intermediate_size", "n_inner", "ffn_dim"],
            10_000_000,
        )?,
        block,
    ) {
        (Some(f), _) => Ok(f),
        (None, Block::Plain) => Ok(4.0 * hidden),
        (None, Block::Gated) => Err("has no intermediate_size (the MLP's size)".into()),
    }
}

/// The width of one attention head: latent attention's, the config's `head_dim`, else the
/// width over the heads where it divides.
fn head_dim_of(
    cfg: &Map<String, Value>,
    latent: Option<f64>,
    hidden: f64,
    heads: f64,
) -> Result<f64, String> {
    match latent.or(whole(cfg, "head_dim", 100_000)?) {
        Some(d) => Ok(d),
        None if hidden % heads == 0.0 => Ok(hidden / heads),
        None => Err(format!(
            "hidden_size {hidden} is not a multiple of num_attention_heads {heads} and there is no head_dim"
        )),
    }
}

/// The key/value heads (all heads where the config names none, one for multi-query attention),
/// which must divide the attention heads.
fn kv_heads_of(cfg: &Map<String, Value>, heads: f64) -> Result<f64, String> {
    let kv_heads = match first(cfg, &["num_key_value_heads", "num_kv_heads"], 100_000)? {
        Some(kv) => kv,
        None if boolean(cfg, "multi_query")? == Some(true) => 1.0,
        None => heads,
    };
    if kv_heads > heads {
        return Err(format!(
            "num_key_value_heads {kv_heads} is more than num_attention_heads {heads}"
        ));
    }
    if heads % kv_heads != 0.0 {
        return Err(format!(
            "num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        ));
    }
    Ok(kv_heads)
}

/// What `model_type`'s family builds beyond the Llama-style block (`latent`: multi-head latent
/// attention).
fn quirks(
    cfg: &Map<String, Value>,
    model_type: &str,
    latent: bool,
) -> Result<crate::decision::model::shape::Quirks, String> {
    Ok(crate::decision::model::shape::Quirks {
        sandwich_norms: SANDWICH_NORMS.contains(&model_type),
        query_key_norms: QUERY_KEY_NORMS.contains(&model_type),
        head_norms: HEAD_NORMS.contains(&model_type),
        softcapped_logits: positive(cfg, "final_logit_softcapping")?,
        softcapped_attention: positive(cfg, "attn_logit_softcapping")?,
        latent_attention: latent,
        parallel_block: PARALLEL_BLOCKS.contains(&model_type),
        fp32_norm_weight: FP32_NORM_WEIGHT.contains(&model_type),
        fused_qkv: FUSED_QKV.contains(&model_type),
        split_projections: SPLIT_PROJECTIONS.contains(&model_type),
    })
}

/// The sliding attention window and the layers that attend through it: `layer_types`' count
/// of `sliding_attention` where the config lists them; else every other layer (Gemma-2), all
/// but every `sliding_window_pattern`-th (Gemma-3, Cohere-2), the layers from
/// `max_window_layers` on where `use_sliding_window` is on (the Qwen types, none where it is
/// off), or all of them.
fn window(
    cfg: &Map<String, Value>,
    model_type: &str,
    layers: f64,
) -> Result<Option<Window>, String> {
    let Some(size) = whole(cfg, "sliding_window", 100_000_000)? else {
        return Ok(None);
    };
    let positions = whole(cfg, "max_position_embeddings", 100_000_000)?.unwrap_or(0.0);
    let windowed = if let Some(types) = cfg.get("layer_types") {
        let Value::Array(types) = types else {
            return Err(format!("layer_types is {types}, not a list"));
        };
        let mut sliding = 0.0;
        for t in types {
            match t.as_str() {
                Some("sliding_attention") => sliding += 1.0,
                Some(_) => {}
                None => return Err(format!("layer_types holds {t}, not a layer type's name")),
            }
        }
        sliding
    } else if model_type == "gemma2" {
        (layers / 2.0).ceil()
    } else if let Some(every) = SLIDING_PATTERN
        .iter()
        .find(|(t, _)| *t == model_type)
        .map(|(_, every)| *every)
    {
        let every = whole(cfg, "sliding_window_pattern", 100_000)?.unwrap_or(every);
        layers - (layers / every).floor()
    } else if model_type.starts_with("qwen") {
        if boolean(cfg, "use_sliding_window")? != Some(true) {
            return Ok(None);
        }
        let from = whole(cfg, "max_window_layers", 100_000)?.unwrap_or(0.0);
        (layers - from).max(0.0)
    } else {
        layers
    };
    Ok((windowed > 0.0).then_some(Window {
        size,
        layers: windowed.min(layers),
        positions,
        sequence: 0.0,
    }))
}

/// `model_type`s whose every n-th layer attends to the whole sequence and the rest through the
/// window, with their default n.
const SLIDING_PATTERN: &[(&str, f64)] = &[("gemma3", 6.0), ("gemma3_text", 6.0), ("cohere2", 4.0)];

/// The head width to count a multi-head latent attention with (DeepSeek-V2/V3's
/// `kv_lora_rank`): its queries' and keys' width, `qk_nope_head_dim` + `qk_rope_head_dim`, as
/// full attention — more parameters and activations than the compressed keys and values keep,
/// never fewer; `None` without latent attention.
fn latent_attention_head(cfg: &Map<String, Value>) -> Result<Option<f64>, String> {
    if whole(cfg, "kv_lora_rank", 1_000_000)?.is_none() {
        return Ok(None);
    }
    let nope = whole(cfg, "qk_nope_head_dim", 100_000)?
        .ok_or("has kv_lora_rank (latent attention) but no qk_nope_head_dim")?;
    let rope = whole(cfg, "qk_rope_head_dim", 100_000)?
        .ok_or("has kv_lora_rank (latent attention) but no qk_rope_head_dim")?;
    let v = whole(cfg, "v_head_dim", 100_000)?.unwrap_or(nope);
    Ok(Some((nope + rope).max(v)))
}

/// A multimodal config's vision tower (`vision_config` beside the language model's config),
/// counted with the model: a fine-tune trains it unless the training code freezes it.
fn vision_tower(
    top: &Map<String, Value>,
    text_hidden: f64,
) -> Result<Option<crate::decision::model::shape::VisionTower>, String> {
    match top.get("vision_config") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(vision)) => {
            crate::decision::model::shape::VisionTower::read(vision, text_hidden).map(Some)
        }
        Some(v) => Err(format!("vision_config is {v}, not an object")),
    }
}

/// Whether a number field is present and above zero (absent or `null`: not).
fn positive(cfg: &Map<String, Value>, key: &str) -> Result<bool, String> {
    match cfg.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(v) => v
            .as_f64()
            .filter(|c| c.is_finite())
            .map(|c| c > 0.0)
            .ok_or_else(|| format!("{key} is {v}, not a number")),
    }
}

/// `model_type`s with a norm over the whole query and the whole key (not per head: Qwen3's
/// per-head norms are its measured factor).
const QUERY_KEY_NORMS: &[&str] = &["olmo2"];

/// `model_type`s with a norm over each query and key head.
const HEAD_NORMS: &[&str] = &["qwen3", "qwen3_moe", "gemma3_text", "gemma3"];

/// `model_type`s with a norm before and after both attention and the MLP.
const SANDWICH_NORMS: &[&str] = &["gemma2", "gemma3_text", "gemma3"];
/// `model_type`s whose layers run attention and the MLP in parallel after one LayerNorm.
const PARALLEL_BLOCKS: &[&str] = &["cohere", "cohere2"];
/// `model_type`s whose RMSNorms multiply their weight in fp32.
const FP32_NORM_WEIGHT: &[&str] = &["gemma", "gemma2", "gemma3_text", "gemma3", "olmo2"];
/// `model_type`s with one fused query/key/value projection and a concatenating rotary.
const FUSED_QKV: &[&str] = &["phi3"];
/// GPT-style `model_type`s with separate query, key and value projections rotated in place.
const SPLIT_PROJECTIONS: &[&str] = &["starcoder2"];

fn experts(
    cfg: &Map<String, Value>,
    intermediate: f64,
    layers: f64,
) -> Result<Option<Experts>, String> {
    let Some(count) = first(
        cfg,
        &["num_local_experts", "num_experts", "n_routed_experts"],
        1_000_000,
    )?
    else {
        return Ok(None);
    };
    let per_token = first(cfg, &["num_experts_per_tok", "moe_top_k"], 1_000_000)?
        .ok_or("has experts but no num_experts_per_tok")?;
    if per_token > count {
        return Err(format!(
            "num_experts_per_tok {per_token} is more than the {count} experts"
        ));
    }
    let expert_size = whole(cfg, "moe_intermediate_size", 10_000_000)?.unwrap_or(intermediate);
    let shared_gate = cfg.contains_key("shared_expert_intermediate_size");
    let (shared, shared_intermediate) = match (
        whole(cfg, "n_shared_experts", 1_000_000)?,
        whole(cfg, "shared_expert_intermediate_size", 10_000_000)?,
    ) {
        (Some(n), _) => (n, expert_size),
        (None, Some(size)) => (1.0, size),
        (None, None) => (0.0, 0.0),
    };
    let dense_layers = match cfg.get("first_k_dense_replace") {
        None | Some(Value::Null) => 0.0,
        Some(v) => {
            let n = v
                .as_u64()
                .ok_or_else(|| format!("first_k_dense_replace is {v}, not a whole number"))?;
            #[allow(clippy::cast_precision_loss)]
            let n = n as f64;
            if n > layers {
                return Err(format!(
                    "first_k_dense_replace {n} is more than the {layers} layers"
                ));
            }
            n
        }
    };
    Ok(Some(Experts {
        count,
        per_token,
        intermediate: expert_size,
        shared,
        shared_intermediate,
        shared_gate,
        dense_layers,
    }))
}

#[cfg(test)]
mod tests;
