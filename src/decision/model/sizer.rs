//! What the sizer is asked to trace for a job, and what it answered, as the decision takes it.
//!
//! The sizer (`sizer/offload_sizer.py`) builds the model from its `config.json` with the job's
//! own libraries and traces one training step at the job's micro-batch (the memory model's
//! [`super::memory::Traced`]). A [`SizerRequest`] names that step exactly — the config by
//! digest, the micro-batch's sequences and tokens, the attention, checkpointing and dtype — so
//! that every job of the same step shares one trace, and a trace made for another step is never
//! taken for this one.

use std::sync::Arc;

use offload_api::trace::{MAX_TRACE_TOKENS, ModelTrace};
use offload_api::v1alpha1::Framework;

use super::shape::ConfigDigest;
use crate::decision::frameworks::user_config::Precision;
use crate::decision::request::JobRequest;

/// The step a job's trace must be of.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SizerRequest {
    /// The model's `config.json`.
    pub config: ConfigDigest,
    /// Sequences per micro-batch.
    pub micro_batch: u64,
    /// Tokens per sequence.
    pub sequence: u64,
    /// The attention implementation the job asks for (`None`: the config's or the library's).
    pub attention: Option<String>,
    /// Activation checkpointing.
    pub checkpointing: bool,
    /// The parameters' dtype as `torch` names it.
    pub dtype: &'static str,
}

/// What the decision has of a job's trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum TraceInput {
    /// None sought: the job cannot be traced (no `config.json`, no tokens, Megatron-core), or
    /// the caller traces nothing.
    #[default]
    None,
    /// The trace of the job's step.
    Traced(Arc<ModelTrace>),
    /// Sought and not had: why, in words (the sizer's code and message, a time-out, sizing off).
    Untraced(String),
}

impl SizerRequest {
    /// The step `job` would be traced at; `None` where it cannot be: no `config.json` read, no
    /// `tokensPerStep`, a micro-batch past the sizer's bound, or Megatron-core (which builds its
    /// own model, not the `transformers` one).
    pub fn of(job: &JobRequest) -> Option<SizerRequest> {
        if job.framework.name == Framework::Megatron {
            return None;
        }
        let config = job.model_config.as_ref()?.source?;
        let hints = job.model.as_ref()?;
        let per_step = u64::try_from(hints.tokens_per_step?).ok()?;
        let accumulation = job.config.gradient_accumulation.unwrap_or(1).max(1);
        let tokens = per_step.div_ceil(accumulation).max(1);
        if tokens > MAX_TRACE_TOKENS {
            return None;
        }
        let sequence = hints
            .sequence_length
            .and_then(|s| u64::try_from(s).ok())
            .filter(|s| *s >= 1)
            .map_or(tokens, |s| s.min(tokens));
        Some(SizerRequest {
            config,
            // Whole sequences: a micro-batch of tokens that do not fill its last one is taken
            // with it full, never under.
            micro_batch: tokens.div_ceil(sequence),
            sequence,
            attention: hints.attention.clone(),
            checkpointing: hints.activation_checkpointing.unwrap_or(false),
            // fp16 and bf16 take the same bytes: both are traced in bf16.
            dtype: match job.config.precision {
                Some(Precision::Fp32) => "float32",
                _ => "bfloat16",
            },
        })
    }

    /// Tokens of the traced micro-batch.
    pub fn tokens(&self) -> u64 {
        self.micro_batch.saturating_mul(self.sequence)
    }

    /// The request's key: a digest of all of it, stable across releases (names the trace's
    /// ConfigMap, and the sizer writes it into the trace).
    pub fn key(&self) -> String {
        use sha2::Digest;
        let text = format!(
            "t1|{}|{}x{}|{}|{}|{}",
            self.config,
            self.micro_batch,
            self.sequence,
            self.attention.as_deref().unwrap_or("auto"),
            self.checkpointing,
            self.dtype
        );
        let digest = sha2::Sha256::digest(text.as_bytes());
        digest.iter().take(10).map(|b| format!("{b:02x}")).collect()
    }

    /// The sizer's arguments for this step, after `--config FILE`.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "--micro-batch".into(),
            self.micro_batch.to_string(),
            "--sequence".into(),
            self.sequence.to_string(),
            "--dtype".into(),
            self.dtype.into(),
            "--key".into(),
            self.key(),
        ];
        if let Some(a) = &self.attention {
            args.extend(["--attention".into(), a.clone()]);
        }
        if self.checkpointing {
            args.push("--checkpointing".into());
        }
        args
    }

    /// `1 × 4096 tokens, sdpa attention` for messages.
    pub fn describe(&self) -> String {
        format!(
            "{} × {} tokens, {} attention{}",
            self.micro_batch,
            self.sequence,
            self.attention.as_deref().unwrap_or("the model's default"),
            if self.checkpointing {
                ", activation checkpointing"
            } else {
                ""
            }
        )
    }

    /// Whether `trace` is of this step; why not where it is not.
    pub fn accepts(&self, trace: &ModelTrace) -> Result<(), String> {
        if let Some(key) = trace.key.as_deref()
            && key != self.key()
        {
            return Err(format!(
                "the trace is of another step (key {key}, this job's {})",
                self.key()
            ));
        }
        if trace.micro_batch != self.micro_batch || trace.sequence != self.sequence {
            return Err(format!(
                "the trace is of {} × {} tokens; the job's micro-batch is {} × {}: trace it at that shape",
                trace.micro_batch, trace.sequence, self.micro_batch, self.sequence
            ));
        }
        if trace.checkpointing != self.checkpointing {
            return Err(format!(
                "the trace was made {} activation checkpointing and the job runs {} it",
                if trace.checkpointing {
                    "with"
                } else {
                    "without"
                },
                if self.checkpointing {
                    "with"
                } else {
                    "without"
                }
            ));
        }
        if trace.dtype != self.dtype {
            return Err(format!(
                "the trace's parameters are {} and the job's {}",
                trace.dtype, self.dtype
            ));
        }
        if let Some(asked) = &self.attention {
            // A FlashAttention package keeps what SDPA's flash kernel keeps: the sizer traces it so.
            let same = trace.attention == *asked
                || (asked.starts_with("flash_attention") && trace.attention == "sdpa");
            if !same {
                return Err(format!(
                    "the trace ran {} attention and the job asks for {asked}",
                    trace.attention
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
