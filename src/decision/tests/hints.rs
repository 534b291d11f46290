//! The model hints: what cannot be true refused with the field named, the shape and the
//! parameter count checked against each other, and partial hints bounded, the hold saying
//! which missing field (or the model's `config.json`) would decide it.

use super::memory::{H200_HOST, placement, trained};
use super::*;
use crate::decision::model::memory::Placement;
use offload_api::v1alpha1::NodeClass;

#[test]
fn hints_that_cannot_be_true_are_refused() {
    let mut job = deepspeed("0.19.8");
    for (edit, expect) in [
        (
            (|h: &mut offload_api::v1alpha1::ModelHints| h.tokens_per_step = Some(0))
                as fn(&mut offload_api::v1alpha1::ModelHints),
            "tokensPerStep 0",
        ),
        (|h| h.tokens_per_step = Some(i64::MAX), "tokensPerStep"),
        (|h| h.hidden_size = Some(-4096), "hiddenSize -4096"),
        (|h| h.layers = Some(10_000_000), "layers 10000000"),
        (|h| h.vocab_size = Some(0), "vocabSize 0"),
    ] {
        let mut hints = bench_hints(1_000_000_000, 2048, 20);
        edit(&mut hints);
        job.model = Some(hints);
        let err = resolve(&job, &[h200("h")]).unwrap_err();
        assert_eq!(err.category(), "InvalidModelHints", "{expect}: {err}");
        assert!(!err.depends_on_cluster());
        assert!(err.to_string().contains(expect), "{expect}: {err}");
    }
}

#[test]
fn the_model_s_shape_and_its_parameter_count_must_agree() {
    let mut job = trained("llama-8b", 2048);
    if let Some(m) = job.model.as_mut() {
        m.parameters = offload_api::quantity::ParameterCount::new(70_000_000_000).ok();
    }
    let err = resolve(&job, &[h200("h")]).unwrap_err();
    assert_eq!(err.category(), "InvalidModelHints");
    assert!(
        err.to_string().contains("disagrees with the 8.03B"),
        "{err}"
    );
    let mut job = trained("llama-8b", 2048);
    if let Some(m) = job.model.as_mut() {
        m.hidden_size = Some(8192);
    }
    let err = resolve(&job, &[h200("h")]).unwrap_err();
    assert!(
        err.to_string()
            .contains("spec.model.hiddenSize 8192 disagrees with the model's config.json (4096)"),
        "{err}"
    );
}

#[test]
fn a_gpt_model_s_rotary_positions_must_agree_with_its_config() {
    let mut job = trained("neox-7b", 2048);
    if let Some(m) = job.model.as_mut() {
        m.rotary_embeddings = Some(false);
    }
    let err = resolve(&job, &[h200("h")]).unwrap_err();
    assert_eq!(err.category(), "InvalidModelHints");
    assert!(
        err.to_string().contains(
            "spec.model.rotaryEmbeddings false disagrees with the model's config.json (its positions are rotary)"
        ),
        "{err}"
    );
    // Saying what the config says changes nothing.
    let mut same = trained("neox-7b", 2048);
    if let Some(m) = same.model.as_mut() {
        m.rotary_embeddings = Some(true);
    }
    assert_eq!(
        resolve(&same, &[h200("h")]).unwrap().memory,
        resolve(&trained("neox-7b", 2048), &[h200("h")])
            .unwrap()
            .memory
    );
}

#[test]
fn the_shape_alone_counts_the_parameters() {
    let mut job = deepspeed("0.19.8");
    job.model = Some(offload_api::v1alpha1::ModelHints {
        hidden_size: Some(4096),
        layers: Some(32),
        intermediate_size: Some(14336),
        attention_heads: Some(32),
        key_value_heads: Some(8),
        vocab_size: Some(128_256),
        tokens_per_step: Some(2048),
        ..Default::default()
    });
    let res = resolve(&job, &[with_host(h200("h"), H200_HOST)]).unwrap();
    assert_eq!(
        placement(&res),
        Some(Placement::NoOffload),
        "{}",
        res.summary()
    );
    assert!(
        reason(&res, Field::Mode).contains("8.03B parameters"),
        "{}",
        res.summary()
    );
}

/// Issue #49: a 10.7B decoder given only its parameters, width, depth and vocabulary (no MLP
/// size, no key/value heads) was held ("fits no node class") where its full shape gets 41 %,
/// which trained. The estimate now takes the end of what the count allows that keeps the most
/// for backward — never under either end, nor the model as built — and says what is open.
#[test]
fn partial_hints_are_bounded_by_the_parameter_count_and_say_what_would_decide_it() {
    let nodes = [with_host(h200("h"), H200_HOST)];
    let mut partial = deepspeed("0.19.8");
    partial.model = Some(offload_api::v1alpha1::ModelHints {
        hidden_size: Some(4096),
        layers: Some(48),
        vocab_size: Some(32000),
        ..hints(10_700_000_000, 2048)
    });
    let full = trained("llama-10b", 2048);
    let (p, f) = (
        resolve(&partial, &nodes).unwrap(),
        resolve(&full, &nodes).unwrap(),
    );
    assert_eq!(placement(&p), placement(&f), "{}", p.summary());
    let (pm, fm) = (p.memory.as_ref().unwrap(), f.memory.as_ref().unwrap());
    // Within what the rounded count (10.7B for the 10.73B built) moves it, and above what the
    // configuration used on the H200 (134.0 GiB allocated, docs/benchmarks/memory-h200.md).
    assert!(
        pm.gpu_bytes as f64 >= 0.995 * fm.gpu_bytes as f64,
        "{} vs {}",
        pm.gpu_bytes,
        fm.gpu_bytes
    );
    assert!(pm.gpu_bytes as f64 >= 134.0 * f64::from(1u32 << 30));
    let why = reason(&p, Field::OffloadRatio);
    assert!(
        why.contains("spec.model.intermediateSize and keyValueHeads not given")
            && why.contains("the other end is MLP")
            && why.contains("config.json"),
        "{why}"
    );
    // Where the two ends decide differently, the hold says which fields would decide it, with
    // what the other end would run as.
    let mut jm = crate::decision::model::sizing::unlearned_memory(
        &partial,
        &crate::decision::frameworks::check(&partial).unwrap(),
    )
    .unwrap()
    .unwrap();
    jm.tokens = Some(2048.0);
    let open = jm.shape.open.expect("the shape is open");
    let other = crate::decision::model::memory::JobMemory {
        shape: crate::decision::model::shape::ModelShape {
            intermediate: open.other_intermediate,
            kv_heads: open.other_kv_heads,
            open: None,
            ..jm.shape
        },
        ..jm.clone()
    };
    let class = |gpu: u64| crate::decision::model::memory::ClassMemory {
        gpu_bytes: gpu,
        gpu_node: "h".into(),
        host_per_pod: Some(H200_HOST),
        host_node: "h".into(),
        class: Some(NodeClass::Discrete),
    };
    // A GPU between the two ends' needs without offload: only no offload allowed.
    let probe = class(400 << 30);
    let (most, less) = (
        jm.estimate(Placement::NoOffload, &probe).gpu,
        other.estimate(Placement::NoOffload, &probe).gpu,
    );
    assert!(most > less, "{most} > {less}");
    let between = ((most + less) / 2.0 / 0.98 + 1.4 * f64::from(1u32 << 30)) as u64;
    let cm = class(between);
    let allowed = crate::decision::ladder::rungs::Allowed {
        no_offload: true,
        offload: false,
        partial: crate::decision::ladder::rungs::PartialRatio::No("off".into()),
        whole_optimizer: false,
        with_params: false,
        trials: 0,
        partial_before_params: crate::decision::model::memory::PARTIAL_BEFORE_PARAMS_UP_TO,
        cpu_note: None,
        bf16_states: Default::default(),
    };
    assert!(crate::decision::ladder::rungs::fastest(&jm, &cm, &allowed).is_err());
    let advice = crate::decision::ladder::rungs::advice(&jm, &cm, &allowed);
    assert!(
        advice.contains("at the other end of what its hints allow")
            && advice.contains("would fit as no offload")
            && advice.contains("spec.model.intermediateSize and keyValueHeads"),
        "{advice}"
    );
}
