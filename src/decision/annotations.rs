//! Model hints of another object kind, read from its annotations (a batch Job, JobSet,
//! PyTorchJob, TrainJob or Pod carries no `spec.model`): each annotation as the TrainingJob's
//! field, within the bound of the one table ([`offload_api::hints`]), every message naming the
//! annotation.

use std::collections::BTreeMap;

use offload_api::names;
use offload_api::quantity::ParameterCount;
use offload_api::v1alpha1::ModelHints;
use offload_api::v1alpha1::{Fp8Recipe, MegatronOptimizer, TransformerImpl};

/// Model hints of another object kind, each annotation as the `spec.model` field of a
/// TrainingJob: `offload.dev/model-parameters` (`8B`), `offload.dev/model-config` (a ConfigMap
/// holding the model's `config.json`), `offload.dev/tokens-per-step`, `offload.dev/architecture`,
/// `offload.dev/hidden-size`, `offload.dev/layers`, `offload.dev/intermediate-size`,
/// `offload.dev/attention-heads`, `offload.dev/key-value-heads`, `offload.dev/head-dim`,
/// `offload.dev/vocab-size`, `offload.dev/tied-embeddings`, `offload.dev/rotary-embeddings`,
/// `offload.dev/experts`,
/// `offload.dev/experts-per-token`, `offload.dev/shared-experts`,
/// `offload.dev/expert-intermediate-size`, `offload.dev/activation-checkpointing`. Every
/// message names the annotation.
pub(super) fn model_annotations(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<ModelHints>, String> {
    let get = |key: &str| -> Option<&str> { annotations.get(key).map(String::as_str) };
    use offload_api::hints;
    let parameters = get(names::ANNOTATION_MODEL_PARAMETERS);
    let config = get(names::ANNOTATION_MODEL_CONFIG);
    if !sized(annotations)? {
        return Ok(None);
    }
    let parameters = parameters
        .map(|p| {
            ParameterCount::parse(p)
                .map_err(|e| format!("annotation {}: {e}", names::ANNOTATION_MODEL_PARAMETERS))
        })
        .transpose()?;
    let config_map_ref = config
        .map(|name| {
            offload_api::validation::object_name(name)
                .map(|()| offload_api::v1alpha1::ConfigMapKeyRef {
                    name: name.to_string(),
                    key: None,
                })
                .map_err(|e| format!("annotation {}: {e}", names::ANNOTATION_MODEL_CONFIG))
        })
        .transpose()?;
    let count = |hint: &hints::CountHint| count_annotation(annotations, hint);
    let flag = |key: &str| flag_annotation(annotations, key);
    let architecture = architecture_annotation(annotations)?;
    let experts = expert_annotations(annotations)?;
    Ok(Some(ModelHints {
        parameters,
        config_map_ref,
        tokens_per_step: count(&hints::TOKENS_PER_STEP)?,
        sequence_length: count(&hints::SEQUENCE_LENGTH)?,
        attention: annotations
            .get(names::ANNOTATION_ATTENTION)
            .map(|a| {
                hints::attention_name(a)
                    .map(|()| a.clone())
                    .map_err(|e| format!("annotation {}: {e}", names::ANNOTATION_ATTENTION))
            })
            .transpose()?,
        architecture,
        hidden_size: count(&hints::HIDDEN_SIZE)?,
        layers: count(&hints::LAYERS)?,
        intermediate_size: count(&hints::INTERMEDIATE_SIZE)?,
        attention_heads: count(&hints::ATTENTION_HEADS)?,
        key_value_heads: count(&hints::KEY_VALUE_HEADS)?,
        head_dim: count(&hints::HEAD_DIM)?,
        vocab_size: count(&hints::VOCAB_SIZE)?,
        tied_embeddings: flag(names::ANNOTATION_TIED_EMBEDDINGS)?,
        rotary_embeddings: flag(names::ANNOTATION_ROTARY_EMBEDDINGS)?,
        experts,
        activation_checkpointing: flag(names::ANNOTATION_ACTIVATION_CHECKPOINTING)?,
    }))
}

/// Whether the annotations size a model (its parameters, its config, or its width and layers);
/// a shape hint without any of them is refused, naming what it needs.
fn sized(annotations: &BTreeMap<String, String>) -> Result<bool, String> {
    use offload_api::hints;
    let get = |key: &str| annotations.get(key).map(String::as_str);
    if get(names::ANNOTATION_MODEL_PARAMETERS).is_some()
        || get(names::ANNOTATION_MODEL_CONFIG).is_some()
        || (get(names::ANNOTATION_HIDDEN_SIZE).is_some() && get(names::ANNOTATION_LAYERS).is_some())
    {
        return Ok(true);
    }
    // Every hint's annotation but the ones that size a model alone.
    let sizing = [
        names::ANNOTATION_MODEL_PARAMETERS,
        names::ANNOTATION_MODEL_CONFIG,
    ];
    let shape_key = hints::COUNT_HINTS
        .iter()
        .map(|h| h.annotation)
        .chain(hints::OTHER_HINTS.iter().map(|(_, a)| *a))
        .filter(|a| !sizing.contains(a))
        .find(|k| get(k).is_some());
    match shape_key {
        Some(key) => Err(format!(
            "annotation {key} needs {} (the model's total parameters, e.g. 8B), {} (a ConfigMap with its config.json), or {} and {}",
            names::ANNOTATION_MODEL_PARAMETERS,
            names::ANNOTATION_MODEL_CONFIG,
            names::ANNOTATION_HIDDEN_SIZE,
            names::ANNOTATION_LAYERS
        )),
        None => Ok(false),
    }
}

/// The mixture-of-experts hints: the expert count and the experts per token go together.
fn expert_annotations(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<offload_api::v1alpha1::ExpertHints>, String> {
    use offload_api::hints;
    let count = |hint: &hints::CountHint| count_annotation(annotations, hint);
    match (count(&hints::EXPERTS)?, count(&hints::EXPERTS_PER_TOKEN)?) {
        (None, None) => Ok(None),
        (Some(count_), Some(per_token)) => Ok(Some(offload_api::v1alpha1::ExpertHints {
            count: count_,
            per_token,
            shared: count(&hints::SHARED_EXPERTS)?,
            intermediate_size: count(&hints::EXPERT_INTERMEDIATE_SIZE)?,
        })),
        _ => Err(format!(
            "annotations {} and {} go together",
            names::ANNOTATION_EXPERTS,
            names::ANNOTATION_EXPERTS_PER_TOKEN
        )),
    }
}

/// Megatron-core's layout of another kind's job, from `offload.dev/megatron-tensor-parallel`,
/// `offload.dev/megatron-pipeline-parallel`, `offload.dev/megatron-distributed-optimizer`,
/// `offload.dev/megatron-sequence-parallel`, `offload.dev/megatron-transformer-impl`,
/// `offload.dev/megatron-manual-gc`, `offload.dev/megatron-optimizer`,
/// `offload.dev/megatron-fp8-param-gather`, `offload.dev/megatron-fp8-recipe` and
/// `offload.dev/megatron-fsdp`, as `spec.megatron` of a TrainingJob; refused on a job whose
/// framework is not Megatron.
pub(super) fn megatron_annotations(
    annotations: &BTreeMap<String, String>,
    framework: offload_api::v1alpha1::Framework,
) -> Result<offload_api::v1alpha1::MegatronSpec, String> {
    use offload_api::hints::MAX_MODEL_PARALLEL;
    only_for_megatron(annotations, framework)?;
    let size = |key: &str| -> Result<Option<u32>, String> {
        annotations
            .get(key)
            .map(|v| match v.trim().parse::<u32>() {
                Ok(n) if (1..=MAX_MODEL_PARALLEL).contains(&n) => Ok(n),
                _ => Err(format!(
                    "annotation {key}: {v:?} is not a whole number from 1 to {MAX_MODEL_PARALLEL}"
                )),
            })
            .transpose()
    };
    Ok(offload_api::v1alpha1::MegatronSpec {
        tensor_parallel: size(names::ANNOTATION_MEGATRON_TENSOR_PARALLEL)?,
        pipeline_parallel: size(names::ANNOTATION_MEGATRON_PIPELINE_PARALLEL)?,
        distributed_optimizer: flag_annotation(
            annotations,
            names::ANNOTATION_MEGATRON_DISTRIBUTED_OPTIMIZER,
        )?,
        sequence_parallel: flag_annotation(
            annotations,
            names::ANNOTATION_MEGATRON_SEQUENCE_PARALLEL,
        )?,
        transformer_impl: choice(
            annotations,
            names::ANNOTATION_MEGATRON_TRANSFORMER_IMPL,
            "Megatron-LM's --transformer-impl",
            &[
                ("local", TransformerImpl::Local),
                ("transformer_engine", TransformerImpl::TransformerEngine),
            ],
        )?,
        manual_gc: flag_annotation(annotations, names::ANNOTATION_MEGATRON_MANUAL_GC)?,
        optimizer: choice(
            annotations,
            names::ANNOTATION_MEGATRON_OPTIMIZER,
            "Megatron-LM's --optimizer",
            &[
                ("adam", MegatronOptimizer::Adam),
                ("sgd", MegatronOptimizer::Sgd),
                ("muon", MegatronOptimizer::Muon),
            ],
        )?,
        fp8_param_gather: flag_annotation(
            annotations,
            names::ANNOTATION_MEGATRON_FP8_PARAM_GATHER,
        )?,
        fp8_recipe: choice(
            annotations,
            names::ANNOTATION_MEGATRON_FP8_RECIPE,
            "Megatron-LM's --fp8-recipe",
            &[
                ("delayed", Fp8Recipe::Delayed),
                ("tensorwise", Fp8Recipe::Tensorwise),
                ("blockwise", Fp8Recipe::Blockwise),
                ("mxfp8", Fp8Recipe::Mxfp8),
            ],
        )?,
        megatron_fsdp: flag_annotation(annotations, names::ANNOTATION_MEGATRON_FSDP)?,
    })
}

/// Megatron-core's annotations describe a Megatron job: refused on another framework's.
fn only_for_megatron(
    annotations: &BTreeMap<String, String>,
    framework: offload_api::v1alpha1::Framework,
) -> Result<(), String> {
    let keys = [
        names::ANNOTATION_MEGATRON_TENSOR_PARALLEL,
        names::ANNOTATION_MEGATRON_PIPELINE_PARALLEL,
        names::ANNOTATION_MEGATRON_DISTRIBUTED_OPTIMIZER,
        names::ANNOTATION_MEGATRON_SEQUENCE_PARALLEL,
        names::ANNOTATION_MEGATRON_TRANSFORMER_IMPL,
        names::ANNOTATION_MEGATRON_MANUAL_GC,
        names::ANNOTATION_MEGATRON_OPTIMIZER,
        names::ANNOTATION_MEGATRON_FP8_PARAM_GATHER,
        names::ANNOTATION_MEGATRON_FP8_RECIPE,
        names::ANNOTATION_MEGATRON_FSDP,
    ];
    if framework != offload_api::v1alpha1::Framework::Megatron
        && let Some(key) = keys.iter().find(|k| annotations.contains_key(**k))
    {
        return Err(format!(
            "annotation {key} describes a Megatron-core job: set {}: Megatron (and {}), or remove it",
            names::ANNOTATION_FRAMEWORK,
            names::ANNOTATION_FRAMEWORK_VERSION
        ));
    }
    Ok(())
}

/// One of a closed set of values an annotation takes (the launch line's own spelling).
fn choice<T: Copy>(
    annotations: &BTreeMap<String, String>,
    key: &str,
    what: &str,
    values: &[(&str, T)],
) -> Result<Option<T>, String> {
    let Some(v) = annotations.get(key) else {
        return Ok(None);
    };
    values
        .iter()
        .find(|(name, _)| *name == v.trim())
        .map(|(_, value)| Some(*value))
        .ok_or_else(|| {
            let names: Vec<&str> = values.iter().map(|(name, _)| *name).collect();
            let allowed = match names.as_slice() {
                [a, b] => format!("{a} or {b}"),
                _ => format!("one of {}", names.join(", ")),
            };
            format!("annotation {key}: {v:?} is not {allowed} ({what})")
        })
}

/// A whole-number hint's annotation, within the hint's bounds.
fn count_annotation(
    annotations: &BTreeMap<String, String>,
    hint: &offload_api::hints::CountHint,
) -> Result<Option<i64>, String> {
    let (key, max) = (hint.annotation, hint.max);
    let min = u64::try_from(hint.min).unwrap_or(0);
    annotations
        .get(key)
        .map(|v| match v.trim().parse::<u64>() {
            Ok(n) if n >= min && i64::try_from(n).is_ok_and(|n| n <= max) => {
                Ok(i64::try_from(n).unwrap_or(max))
            }
            Ok(n) if n < min => Err(format!(
                "annotation {key}: use a whole number of at least {min}"
            )),
            Ok(_) => Err(format!(
                "annotation {key}: {v} is too large (at most {max})"
            )),
            Err(e) if matches!(e.kind(), std::num::IntErrorKind::PosOverflow) => Err(format!(
                "annotation {key}: {v} is too large (at most {max})"
            )),
            Err(_) => Err(format!("annotation {key}: {v:?} is not a whole number")),
        })
        .transpose()
}

/// A true-or-false annotation.
fn flag_annotation(
    annotations: &BTreeMap<String, String>,
    key: &str,
) -> Result<Option<bool>, String> {
    match annotations.get(key).map(String::as_str) {
        None => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(v) => Err(format!("annotation {key}: {v:?} is not true or false")),
    }
}

/// The architecture annotation: Llama or GPT.
fn architecture_annotation(
    annotations: &BTreeMap<String, String>,
) -> Result<Option<offload_api::v1alpha1::ModelArchitecture>, String> {
    use offload_api::v1alpha1::ModelArchitecture;
    match annotations
        .get(names::ANNOTATION_ARCHITECTURE)
        .map(String::as_str)
    {
        None => Ok(None),
        Some("Llama") => Ok(Some(ModelArchitecture::Llama)),
        Some("GPT") => Ok(Some(ModelArchitecture::Gpt)),
        Some(v) => Err(format!(
            "annotation {}: {v:?} is neither Llama nor GPT",
            names::ANNOTATION_ARCHITECTURE
        )),
    }
}
