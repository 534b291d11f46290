//! What the sizer traced of one training step of a model (`sizer/offload_sizer.py`): the model
//! built from its `config.json` by the job's own libraries, its parameters counted exactly, one
//! forward and backward run on fake tensors with the attention kernel a GPU runs, every figure
//! as PyTorch's CUDA allocator counts it.
//!
//! The sizer writes it as JSON (kind `ModelTrace`, or `ModelTraceError` with a code and a
//! message); a pod's termination message carries it compact, or gzip + base64 behind `gz:` where
//! that is longer than the kubelet keeps. [`ModelTrace::parse`] reads either and refuses one that
//! cannot be true: counts that do not add up, bytes past any GPU, more tensors than a model has.

use std::io::Read;

use base64::Engine;
use serde::{Deserialize, Serialize};

/// The schema version this code reads and the sizer writes.
pub const TRACE_VERSION: u32 = 1;
/// The `apiVersion` of a trace.
pub const TRACE_API_VERSION: &str = "offload.dev/v1alpha1";
/// Most bytes of a trace's text (packed or not) and of what a packed one unpacks to.
pub const MAX_TRACE_BYTES: usize = 1 << 20;
/// Most parameter tensors (and gradients) a trace may list once its runs are expanded.
pub const MAX_TRACE_TENSORS: u64 = 1 << 18;
/// Most bytes any figure of a trace may hold: more than the largest GPU has many times over.
pub const MAX_TRACE_FIGURE_BYTES: u64 = 1 << 50;
/// Most tokens a traced micro-batch may hold (the sizer's own bound).
pub const MAX_TRACE_TOKENS: u64 = 1 << 22;
/// Longest text field (model type, class, attention, versions).
const MAX_NAME: usize = 128;

/// A trace of one training step, as the sizer writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelTrace {
    /// `offload.dev/v1alpha1`.
    pub api_version: String,
    /// `ModelTrace`.
    pub kind: String,
    /// [`TRACE_VERSION`].
    pub version: u32,
    /// The operator's key of the step it asked for, where it asked (the sizer echoes
    /// `--key`): a trace is taken only for the step it was made for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The config's `model_type`.
    pub model_type: String,
    /// The class `transformers` built (`LlamaForCausalLM`).
    pub model_class: String,
    /// The attention implementation the model resolved (`sdpa`, `eager`, …).
    pub attention: String,
    /// Fused attention kernels the trace ran, by kind (`flash`, `efficient`, `math`): what a
    /// GPU's dispatcher picks for each call.
    #[serde(default)]
    pub kernels: std::collections::BTreeMap<String, u64>,
    /// Sequences in the traced micro-batch.
    pub micro_batch: u64,
    /// Tokens in each.
    pub sequence: u64,
    /// Activation checkpointing was on.
    pub checkpointing: bool,
    /// The parameters' dtype (`bfloat16`, `float16`, `float32`).
    pub dtype: String,
    /// Parameters, tied ones once, every expert counted.
    pub parameters: u64,
    /// The parameter tensors' element counts in registration order (what DeepSpeed groups),
    /// as runs: `[[n, …], times]`.
    pub tensors: Vec<(Vec<u64>, u64)>,
    /// The largest parameter tensor.
    pub largest_tensor: u64,
    /// Transformer layers found (the longest module list).
    pub layers: u64,
    /// Parameters of the largest layer.
    pub largest_layer: u64,
    /// Bytes allocated beyond the parameters when backward starts: what the step keeps for it.
    pub saved_bytes: u64,
    /// The most allocated beyond the parameters during the forward and the loss.
    pub forward_peak_bytes: u64,
    /// The most allocated beyond the parameters during the whole step.
    pub peak_bytes: u64,
    /// Where that was (`forward`, `backward`).
    pub peak_at: String,
    /// The largest single activation (the loss's fp32 logits, as a rule).
    pub largest_activation_bytes: u64,
    /// The gradients in the order the backward completes them, as runs of `[numel, freed]`:
    /// the first `freed` is the bytes alive when the first gradient arrives, each later one the
    /// bytes freed since the one before (negative: more alive).
    pub gradients: Vec<(Vec<(u64, i64)>, u64)>,
    /// The libraries that built and traced the model.
    pub versions: TraceVersions,
    /// Seconds the sizer took.
    #[serde(default)]
    pub wall_seconds: f64,
    /// The sizer's peak resident memory.
    #[serde(default)]
    pub max_rss_bytes: u64,
}

/// The libraries a trace was made with.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceVersions {
    /// PyTorch (`2.11.0`).
    pub torch: String,
    /// `transformers` (`5.17.0`).
    pub transformers: String,
    /// Python.
    #[serde(default)]
    pub python: String,
}

/// What a sizer says when it could not trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizerFailure {
    /// A code a runbook can name (`UnknownModelType`, `CustomCode`, `TraceFailed`, …).
    pub code: String,
    /// What happened, in one sentence.
    pub message: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Head {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    version: u32,
    #[serde(default)]
    error: Option<SizerFailure>,
}

/// Why a trace was not taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    /// The sizer ran and said why it could not trace.
    #[error("the sizer could not trace the model ({}): {}", .0.code, .0.message)]
    Sizer(SizerFailure),
    /// The text is not a trace the operator can read.
    #[error("not a model trace: {0}")]
    Unreadable(String),
    /// It reads, but cannot be true.
    #[error("the trace cannot be true: {0}")]
    Impossible(String),
}

/// A gradient as the backward completes it: its parameter's elements and the activation bytes
/// still alive when it arrives (itself not counted).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TracedGradient {
    /// Elements of the parameter.
    pub numel: u64,
    /// Bytes alive beyond the parameters.
    pub alive: u64,
}

impl ModelTrace {
    /// Reads a trace from the sizer's output: JSON, or `gz:` and base64 of gzipped JSON. A
    /// `ModelTraceError` is [`TraceError::Sizer`].
    pub fn parse(text: &str) -> Result<ModelTrace, TraceError> {
        let text = text.trim();
        if text.len() > MAX_TRACE_BYTES {
            return Err(TraceError::Unreadable(format!(
                "{} bytes, more than the {MAX_TRACE_BYTES} a trace may have",
                text.len()
            )));
        }
        let unpacked;
        let json = match text.strip_prefix("gz:") {
            Some(packed) => {
                unpacked = unpack(packed)?;
                unpacked.as_str()
            }
            None => text,
        };
        let head: Head = serde_json::from_str(json)
            .map_err(|e| TraceError::Unreadable(format!("not JSON of a trace ({e})")))?;
        if head.api_version != TRACE_API_VERSION {
            return Err(TraceError::Unreadable(format!(
                "apiVersion {:?}, not {TRACE_API_VERSION}",
                crate::text::bounded_to(&head.api_version, 64)
            )));
        }
        if head.version != TRACE_VERSION {
            return Err(TraceError::Unreadable(format!(
                "version {}, this operator reads {TRACE_VERSION}: use the sizer that ships with it",
                head.version
            )));
        }
        match (head.kind.as_str(), head.error) {
            ("ModelTraceError", Some(failure)) => {
                return Err(TraceError::Sizer(SizerFailure {
                    code: crate::text::bounded_to(&failure.code, 64),
                    message: crate::text::bounded_to(&failure.message, 512),
                }));
            }
            ("ModelTrace", _) => {}
            (kind, _) => {
                return Err(TraceError::Unreadable(format!(
                    "kind {:?}, not ModelTrace",
                    crate::text::bounded_to(kind, 64)
                )));
            }
        }
        let de = &mut serde_json::Deserializer::from_str(json);
        let trace: ModelTrace = serde_path_to_error::deserialize(de)
            .map_err(|e| TraceError::Unreadable(format!("{} at {}", e.inner(), e.path())))?;
        trace.check()?;
        Ok(trace)
    }

    /// Tokens in the traced micro-batch.
    pub fn tokens(&self) -> u64 {
        self.micro_batch.saturating_mul(self.sequence)
    }

    /// The parameter tensors in registration order, runs expanded (checked by
    /// [`ModelTrace::parse`] to be at most [`MAX_TRACE_TENSORS`]).
    pub fn tensor_list(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for (items, times) in &self.tensors {
            for _ in 0..*times {
                out.extend_from_slice(items);
            }
        }
        out
    }

    /// The gradients in the order the backward completes them, with the bytes alive at each.
    pub fn gradient_list(&self) -> Vec<TracedGradient> {
        let mut out = Vec::new();
        let mut alive: i128 = 0;
        for (items, times) in &self.gradients {
            for _ in 0..*times {
                for &(numel, freed) in items {
                    alive = if out.is_empty() {
                        i128::from(freed)
                    } else {
                        alive - i128::from(freed)
                    };
                    out.push(TracedGradient {
                        numel,
                        alive: u64::try_from(alive.max(0)).unwrap_or(u64::MAX),
                    });
                }
            }
        }
        out
    }

    /// One line for reasons and `explain`.
    pub fn describe(&self) -> String {
        let kernels = if self.kernels.is_empty() {
            String::new()
        } else {
            let list: Vec<String> = self
                .kernels
                .iter()
                .map(|(k, n)| format!("{k} ×{n}"))
                .collect();
            format!(" ({})", list.join(", "))
        };
        format!(
            "{} ({}) built by transformers {} on torch {}, {:.3}B parameters, {} × {} tokens, {} attention{kernels}",
            self.model_class,
            self.model_type,
            self.versions.transformers,
            self.versions.torch,
            self.parameters as f64 / 1e9,
            self.micro_batch,
            self.sequence,
            self.attention,
        )
    }

    fn check(&self) -> Result<(), TraceError> {
        let bad = |m: String| Err(TraceError::Impossible(m));
        for (field, text) in [
            ("modelType", &self.model_type),
            ("modelClass", &self.model_class),
            ("attention", &self.attention),
            ("dtype", &self.dtype),
            ("peakAt", &self.peak_at),
            ("versions.torch", &self.versions.torch),
            ("versions.transformers", &self.versions.transformers),
            ("versions.python", &self.versions.python),
            ("key", self.key.as_ref().unwrap_or(&String::new())),
        ] {
            if text.len() > MAX_NAME || text.chars().any(char::is_control) {
                return bad(format!(
                    "{field} is not a name (over {MAX_NAME} characters or control characters)"
                ));
            }
        }
        if !(1..=4096).contains(&self.micro_batch)
            || self.sequence == 0
            || self.tokens() > MAX_TRACE_TOKENS
        {
            return bad(format!(
                "{} × {} tokens is no micro-batch (1 to {MAX_TRACE_TOKENS} tokens)",
                self.micro_batch, self.sequence
            ));
        }
        if self.parameters == 0 || self.parameters > crate::quantity::MAX_PARAMETERS {
            return bad(format!("{} parameters", self.parameters));
        }
        let (count, sum, largest) = tensor_totals(&self.tensors)?;
        if sum != u128::from(self.parameters) {
            return bad(format!(
                "its tensors hold {sum} parameters, not the {} it names",
                self.parameters
            ));
        }
        if largest != self.largest_tensor || self.largest_layer > self.parameters {
            return bad(format!(
                "its largest tensor is {largest}, not {}, or its largest layer is larger than the model",
                self.largest_tensor
            ));
        }
        for (field, v) in [
            ("savedBytes", self.saved_bytes),
            ("forwardPeakBytes", self.forward_peak_bytes),
            ("peakBytes", self.peak_bytes),
            ("largestActivationBytes", self.largest_activation_bytes),
            ("maxRssBytes", self.max_rss_bytes),
        ] {
            if v > MAX_TRACE_FIGURE_BYTES {
                return bad(format!("{field} {v} is more than any GPU holds"));
            }
        }
        if self.saved_bytes > self.forward_peak_bytes
            || self.forward_peak_bytes > self.peak_bytes
            || self.largest_activation_bytes > self.peak_bytes
            || self.peak_bytes == 0
        {
            return bad(format!(
                "kept {} > forward peak {} > peak {} (largest activation {}): a peak is the most",
                self.saved_bytes,
                self.forward_peak_bytes,
                self.peak_bytes,
                self.largest_activation_bytes
            ));
        }
        self.check_gradients(count)
    }

    fn check_gradients(&self, tensors: u64) -> Result<(), TraceError> {
        let bad = |m: String| Err(TraceError::Impossible(m));
        let mut count: u64 = 0;
        let mut numels: u128 = 0;
        let mut alive: i128 = 0;
        let mut first = true;
        for (items, times) in &self.gradients {
            count = count.saturating_add((items.len() as u64).saturating_mul(*times));
            if count > tensors {
                return bad(format!(
                    "more gradients than its {tensors} parameter tensors"
                ));
            }
            for _ in 0..*times {
                for &(numel, freed) in items {
                    numels += u128::from(numel);
                    alive = if first {
                        i128::from(freed)
                    } else {
                        alive - i128::from(freed)
                    };
                    first = false;
                    if alive < 0 || alive > i128::from(self.peak_bytes) {
                        return bad(format!(
                            "{alive} bytes alive at a gradient, outside 0 to the peak {}",
                            self.peak_bytes
                        ));
                    }
                }
            }
        }
        if count == 0 || numels > u128::from(self.parameters) {
            return bad(format!(
                "{count} gradients of {numels} elements for {} parameters",
                self.parameters
            ));
        }
        Ok(())
    }
}

/// Tensors, elements and the largest tensor of runs, checked against [`MAX_TRACE_TENSORS`].
fn tensor_totals(runs: &[(Vec<u64>, u64)]) -> Result<(u64, u128, u64), TraceError> {
    let mut count: u64 = 0;
    let mut sum: u128 = 0;
    let mut largest = 0;
    for (items, times) in runs {
        count = count.saturating_add((items.len() as u64).saturating_mul(*times));
        if count > MAX_TRACE_TENSORS {
            return Err(TraceError::Impossible(format!(
                "more than {MAX_TRACE_TENSORS} parameter tensors"
            )));
        }
        let run: u128 = items.iter().map(|&n| u128::from(n)).sum();
        sum += run * u128::from(*times);
        if *times > 0 {
            largest = items.iter().copied().fold(largest, u64::max);
        }
    }
    if count == 0 {
        return Err(TraceError::Impossible("no parameter tensors".into()));
    }
    Ok((count, sum, largest))
}

/// The JSON behind `gz:`: base64, gunzipped, at most [`MAX_TRACE_BYTES`].
fn unpack(packed: &str) -> Result<String, TraceError> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(packed.trim())
        .map_err(|e| TraceError::Unreadable(format!("gz: is followed by no base64 ({e})")))?;
    let mut out = String::new();
    flate2::read::GzDecoder::new(bytes.as_slice())
        .take(MAX_TRACE_BYTES as u64 + 1)
        .read_to_string(&mut out)
        .map_err(|e| TraceError::Unreadable(format!("gz: holds no gzipped text ({e})")))?;
    if out.len() > MAX_TRACE_BYTES {
        return Err(TraceError::Unreadable(format!(
            "it unpacks to more than {MAX_TRACE_BYTES} bytes"
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
