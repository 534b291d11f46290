use super::*;
use crate::decision::tests::traced::{NEMOTRON, job_of, trace_of};

#[test]
fn the_step_is_the_micro_batch_the_job_runs() {
    let job = job_of(NEMOTRON, 8192, None);
    let step = SizerRequest::of(&job).unwrap();
    assert_eq!((step.micro_batch, step.sequence), (1, 8192));
    assert_eq!(step.dtype, "bfloat16");
    assert!(!step.checkpointing);
    // Sequences of 2,048: four of them a micro-batch.
    let step = SizerRequest::of(&job_of(NEMOTRON, 8192, Some(2048))).unwrap();
    assert_eq!((step.micro_batch, step.sequence), (4, 2048));
    // Tokens that do not fill the last sequence: a whole one more, never under.
    let step = SizerRequest::of(&job_of(NEMOTRON, 5000, Some(2048))).unwrap();
    assert_eq!((step.micro_batch, step.sequence), (3, 2048));
    // A sequence longer than the micro-batch's tokens is the micro-batch.
    let step = SizerRequest::of(&job_of(NEMOTRON, 1024, Some(4096))).unwrap();
    assert_eq!((step.micro_batch, step.sequence), (1, 1024));
    // Gradient accumulation divides the step's tokens into micro-batches.
    let mut job = job_of(NEMOTRON, 8192, None);
    job.config.gradient_accumulation = Some(4);
    assert_eq!(SizerRequest::of(&job).unwrap().tokens(), 2048);
}

#[test]
fn a_job_that_cannot_be_traced_asks_for_no_trace() {
    // No config.json: nothing to build the model from.
    let mut job = job_of(NEMOTRON, 4096, None);
    job.model_config = None;
    assert_eq!(SizerRequest::of(&job), None);
    // No tokens: no step to trace.
    let mut job = job_of(NEMOTRON, 4096, None);
    job.model.as_mut().unwrap().tokens_per_step = None;
    assert_eq!(SizerRequest::of(&job), None);
    // Megatron-core builds its own model, not the transformers one.
    let mut job = job_of(NEMOTRON, 4096, None);
    job.framework.name = offload_api::v1alpha1::Framework::Megatron;
    assert_eq!(SizerRequest::of(&job), None);
    // A micro-batch past what the sizer traces.
    let job = job_of(NEMOTRON, 1 << 23, None);
    assert_eq!(SizerRequest::of(&job), None);
}

#[test]
fn every_part_of_the_step_changes_its_key_and_nothing_else_does() {
    let base = SizerRequest::of(&job_of(NEMOTRON, 4096, None)).unwrap();
    assert_eq!(base.key().len(), 20);
    assert_eq!(base.key(), base.clone().key());
    let variants = [
        SizerRequest {
            micro_batch: 2,
            sequence: 2048,
            ..base.clone()
        },
        SizerRequest {
            attention: Some("eager".into()),
            ..base.clone()
        },
        SizerRequest {
            checkpointing: true,
            ..base.clone()
        },
        SizerRequest {
            dtype: "float32",
            ..base.clone()
        },
        SizerRequest {
            config: crate::decision::model::shape::ConfigDigest([7; 16]),
            ..base.clone()
        },
    ];
    let mut keys: Vec<String> = variants.iter().map(SizerRequest::key).collect();
    keys.push(base.key());
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), variants.len() + 1);
    // The sizer is told the key, so its trace carries it back.
    let args = base.args();
    let at = args.iter().position(|a| a == "--key").unwrap();
    assert_eq!(args[at + 1], base.key());
}

#[test]
fn a_config_json_written_differently_is_the_same_model() {
    let a: serde_json::Value =
        serde_json::from_str(r#"{"model_type": "llama", "hidden_size": 8}"#).unwrap();
    let b: serde_json::Value =
        serde_json::from_str("{\n  \"hidden_size\":8,\"model_type\":\"llama\"}").unwrap();
    let c: serde_json::Value =
        serde_json::from_str(r#"{"model_type": "llama", "hidden_size": 16}"#).unwrap();
    use crate::decision::model::shape::ConfigDigest;
    assert_eq!(ConfigDigest::of(&a), ConfigDigest::of(&b));
    assert_ne!(ConfigDigest::of(&a), ConfigDigest::of(&c));
}

#[test]
fn a_trace_of_another_step_is_refused_with_what_differs() {
    let step = SizerRequest::of(&job_of(NEMOTRON, 4096, None)).unwrap();
    let trace = trace_of(NEMOTRON);
    // The fixture was made without a key, at the step: it fits.
    assert_eq!(step.accepts(&trace), Ok(()));
    let other = |edit: &dyn Fn(&mut ModelTrace)| {
        let mut t = trace.clone();
        edit(&mut t);
        step.accepts(&t).unwrap_err()
    };
    assert!(other(&|t| t.key = Some("0123".into())).contains("another step"));
    assert!(other(&|t| t.sequence = 2048).contains("1 × 2048 tokens"));
    assert!(other(&|t| t.checkpointing = true).contains("activation checkpointing"));
    assert!(other(&|t| t.dtype = "float32".into()).contains("float32"));
    // Asked for eager attention, traced with SDPA.
    let eager = SizerRequest {
        attention: Some("eager".into()),
        ..step.clone()
    };
    assert!(eager.accepts(&trace).unwrap_err().contains("eager"));
    // A FlashAttention package keeps what SDPA's flash kernel keeps.
    let flash = SizerRequest {
        attention: Some("flash_attention_2".into()),
        ..step.clone()
    };
    assert_eq!(flash.accepts(&trace), Ok(()));
}
