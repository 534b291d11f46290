//! The model hints that are whole numbers, one row each: the `spec.model` field, the annotation
//! that carries it on other kinds (batch Job, JobSet, PyTorchJob, TrainJob, Pod), and its bound.
//! The CRD schema (through the bounds below), the annotation parser and the decision's checks
//! all read this table: a new hint is added here, once.

use crate::names;

/// One whole-number model hint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CountHint {
    /// Its path under `spec.model` (`tokensPerStep`, `experts.count`).
    pub field: &'static str,
    /// The annotation that carries it on other kinds.
    pub annotation: &'static str,
    /// The smallest value it takes.
    pub min: i64,
    /// The largest value it takes (far above any model built).
    pub max: i64,
}

impl CountHint {
    /// Where it came from, as a message names it: the `spec.model` field or the annotation.
    pub fn named(&self, from_annotations: bool) -> String {
        if from_annotations {
            format!("annotation {}", self.annotation)
        } else {
            format!("spec.model.{}", self.field)
        }
    }
}

/// Bound of `tokensPerStep`.
pub const MAX_TOKENS_PER_STEP: i64 = 1_000_000_000_000;
/// Bound of `sequenceLength`: the most tokens a traced micro-batch holds.
pub const MAX_SEQUENCE_LENGTH: i64 = 1 << 22;
/// Bound of `hiddenSize`.
pub const MAX_HIDDEN_SIZE: i64 = 1_000_000;
/// Bound of `layers`.
pub const MAX_LAYERS: i64 = 100_000;
/// Bound of `intermediateSize` and `experts.intermediateSize`.
pub const MAX_INTERMEDIATE_SIZE: i64 = 10_000_000;
/// Bound of `attentionHeads`, `keyValueHeads` and `headDim`.
pub const MAX_HEADS: i64 = 100_000;
/// Bound of `vocabSize`.
pub const MAX_VOCAB_SIZE: i64 = 100_000_000;
/// Bound of `experts.count`, `experts.perToken` and `experts.shared`.
pub const MAX_EXPERTS: i64 = 1_000_000;

/// The longest attention implementation name (`kernels-community/flash-attn3` and the like).
pub const MAX_ATTENTION_NAME: usize = 64;

/// Whether `name` can be an attention implementation `transformers` takes: letters, digits and
/// `_ - . /`, at most [`MAX_ATTENTION_NAME`] characters.
pub fn attention_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > MAX_ATTENTION_NAME
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
    {
        return Err(format!(
            "{:?} is not an attention implementation: use a name such as sdpa, eager or flash_attention_2 (letters, digits, _ - . /, at most {MAX_ATTENTION_NAME})",
            crate::text::bounded_to(name, 80)
        ));
    }
    Ok(())
}

/// Bound of Megatron-core's tensor- and pipeline-parallel sizes (`spec.megatron` and the
/// `offload.dev/megatron-*` annotations).
pub const MAX_MODEL_PARALLEL: u32 = 1024;

/// `spec.model.tokensPerStep`.
pub const TOKENS_PER_STEP: CountHint = CountHint {
    field: "tokensPerStep",
    annotation: names::ANNOTATION_TOKENS_PER_STEP,
    min: 1,
    max: MAX_TOKENS_PER_STEP,
};
/// `spec.model.sequenceLength`.
pub const SEQUENCE_LENGTH: CountHint = CountHint {
    field: "sequenceLength",
    annotation: names::ANNOTATION_SEQUENCE_LENGTH,
    min: 1,
    max: MAX_SEQUENCE_LENGTH,
};
/// `spec.model.hiddenSize`.
pub const HIDDEN_SIZE: CountHint = CountHint {
    field: "hiddenSize",
    annotation: names::ANNOTATION_HIDDEN_SIZE,
    min: 1,
    max: MAX_HIDDEN_SIZE,
};
/// `spec.model.layers`.
pub const LAYERS: CountHint = CountHint {
    field: "layers",
    annotation: names::ANNOTATION_LAYERS,
    min: 1,
    max: MAX_LAYERS,
};
/// `spec.model.intermediateSize`.
pub const INTERMEDIATE_SIZE: CountHint = CountHint {
    field: "intermediateSize",
    annotation: names::ANNOTATION_INTERMEDIATE_SIZE,
    min: 1,
    max: MAX_INTERMEDIATE_SIZE,
};
/// `spec.model.attentionHeads`.
pub const ATTENTION_HEADS: CountHint = CountHint {
    field: "attentionHeads",
    annotation: names::ANNOTATION_ATTENTION_HEADS,
    min: 1,
    max: MAX_HEADS,
};
/// `spec.model.keyValueHeads`.
pub const KEY_VALUE_HEADS: CountHint = CountHint {
    field: "keyValueHeads",
    annotation: names::ANNOTATION_KEY_VALUE_HEADS,
    min: 1,
    max: MAX_HEADS,
};
/// `spec.model.headDim`.
pub const HEAD_DIM: CountHint = CountHint {
    field: "headDim",
    annotation: names::ANNOTATION_HEAD_DIM,
    min: 1,
    max: MAX_HEADS,
};
/// `spec.model.vocabSize`.
pub const VOCAB_SIZE: CountHint = CountHint {
    field: "vocabSize",
    annotation: names::ANNOTATION_VOCAB_SIZE,
    min: 1,
    max: MAX_VOCAB_SIZE,
};
/// `spec.model.experts.count`.
pub const EXPERTS: CountHint = CountHint {
    field: "experts.count",
    annotation: names::ANNOTATION_EXPERTS,
    min: 1,
    max: MAX_EXPERTS,
};
/// `spec.model.experts.perToken`.
pub const EXPERTS_PER_TOKEN: CountHint = CountHint {
    field: "experts.perToken",
    annotation: names::ANNOTATION_EXPERTS_PER_TOKEN,
    min: 1,
    max: MAX_EXPERTS,
};
/// `spec.model.experts.shared` (0: none).
pub const SHARED_EXPERTS: CountHint = CountHint {
    field: "experts.shared",
    annotation: names::ANNOTATION_SHARED_EXPERTS,
    min: 0,
    max: MAX_EXPERTS,
};
/// `spec.model.experts.intermediateSize`.
pub const EXPERT_INTERMEDIATE_SIZE: CountHint = CountHint {
    field: "experts.intermediateSize",
    annotation: names::ANNOTATION_EXPERT_INTERMEDIATE_SIZE,
    min: 1,
    max: MAX_INTERMEDIATE_SIZE,
};

/// Every whole-number hint.
pub const COUNT_HINTS: [CountHint; 13] = [
    TOKENS_PER_STEP,
    SEQUENCE_LENGTH,
    HIDDEN_SIZE,
    LAYERS,
    INTERMEDIATE_SIZE,
    ATTENTION_HEADS,
    KEY_VALUE_HEADS,
    HEAD_DIM,
    VOCAB_SIZE,
    EXPERTS,
    EXPERTS_PER_TOKEN,
    SHARED_EXPERTS,
    EXPERT_INTERMEDIATE_SIZE,
];

/// The other hints and the annotations that carry them (not whole numbers).
pub const OTHER_HINTS: [(&str, &str); 8] = [
    ("attention", names::ANNOTATION_ATTENTION),
    ("parameters", names::ANNOTATION_MODEL_PARAMETERS),
    ("architecture", names::ANNOTATION_ARCHITECTURE),
    ("configMapRef", names::ANNOTATION_MODEL_CONFIG),
    ("tiedEmbeddings", names::ANNOTATION_TIED_EMBEDDINGS),
    ("rotaryEmbeddings", names::ANNOTATION_ROTARY_EMBEDDINGS),
    (
        "activationCheckpointing",
        names::ANNOTATION_ACTIVATION_CHECKPOINTING,
    ),
    ("experts", names::ANNOTATION_EXPERTS),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hint_has_one_row_and_one_annotation() {
        let mut fields: Vec<&str> = COUNT_HINTS.iter().map(|h| h.field).collect();
        fields.sort_unstable();
        fields.dedup();
        assert_eq!(fields.len(), COUNT_HINTS.len());
        let mut annotations: Vec<&str> = COUNT_HINTS.iter().map(|h| h.annotation).collect();
        annotations.sort_unstable();
        annotations.dedup();
        assert_eq!(annotations.len(), COUNT_HINTS.len());
        assert!(COUNT_HINTS.iter().all(|h| h.min <= h.max && h.min >= 0));
        assert_eq!(TOKENS_PER_STEP.named(false), "spec.model.tokensPerStep");
        assert_eq!(
            TOKENS_PER_STEP.named(true),
            "annotation offload.dev/tokens-per-step"
        );
    }
}
