//! Reading a model's `config.json`: every shape a model card can state, and every way one can
//! be wrong, with the field named.

use super::*;

/// A parameter count at or above the published one and at most `over` times it.
fn never_under_the_published(counted: f64, published: f64, over: f64) {
    assert!(
        counted >= published && counted <= published * over,
        "{counted} against {published}"
    );
}

fn err(text: &str) -> String {
    parse(text, "ConfigMap \"m\" key \"config.json\"")
        .unwrap_err()
        .to_string()
}

#[test]
fn a_llama_config_gives_its_shape() {
    let m = parse(
        include_str!("../../../../hack/gpu/models/llama-3b.json"),
        "m",
    )
    .unwrap();
    assert_eq!(m.block, Block::Gated);
    assert_eq!((m.hidden, m.layers, m.intermediate), (3072.0, 28.0, 8192.0));
    assert_eq!((m.heads, m.kv_heads, m.head_dim), (24.0, 8.0, 128.0));
    assert!(m.tied && m.known && m.experts.is_none());
}

#[test]
fn gpt_configs_have_plain_blocks_and_their_own_names() {
    let m = parse(
        r#"{"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}"#,
        "gpt2",
    )
    .unwrap();
    assert_eq!(m.block, Block::Plain);
    assert_eq!(m.intermediate, 3072.0, "4 × the width when n_inner is null");
    assert!(m.tied, "GPT-2 ties its embeddings by default");
    // GPT-2 small: 124,439,808 parameters.
    assert_eq!(m.parameters(), 124_439_808.0);
}

#[test]
fn rotary_positions_follow_the_model_type() {
    let gpt = |model_type: &str, extra: &str| {
        parse(
            &format!(
                r#"{{"model_type": "{model_type}", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8, "vocab_size": 50000{extra}}}"#
            ),
            model_type,
        )
        .unwrap()
    };
    for learned_or_alibi in ["gpt2", "opt", "bloom", "mpt", "gpt_bigcode", "gpt_neo"] {
        assert!(!gpt(learned_or_alibi, "").rotary, "{learned_or_alibi}");
    }
    for rotary in ["gpt_neox", "gptj", "phi", "starcoder2", "falcon"] {
        assert!(gpt(rotary, "").rotary, "{rotary}");
    }
    assert!(!gpt("falcon", r#", "alibi": true"#).rotary);
    assert!(
        err(r#"{"model_type": "falcon", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10, "alibi": "yes"}"#)
            .contains("alibi")
    );
    // A GPT-NeoX block keeps its rotated queries and keys: more per token than GPT-2's.
    let neox = gpt("gpt_neox", "");
    let plain = ModelShape {
        rotary: false,
        ..neox
    };
    assert!(neox.saved_per_token(false) > plain.saved_per_token(false));
}

#[test]
fn experts_are_read_from_each_family_s_fields() {
    let mixtral = parse(
        include_str!("../../../../hack/gpu/models/mixtral-5b.json"),
        "m",
    )
    .unwrap();
    let e = mixtral.experts.unwrap();
    assert_eq!(
        (e.count, e.per_token, e.intermediate, e.shared),
        (8.0, 2.0, 5632.0, 0.0)
    );
    let deepseek = parse(
        r#"{"model_type": "deepseek_v3", "hidden_size": 2048, "num_hidden_layers": 27, "intermediate_size": 10944,
            "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
            "first_k_dense_replace": 1, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 102400}"#,
        "ds",
    )
    .unwrap();
    let e = deepseek.experts.unwrap();
    assert_eq!(
        (
            e.count,
            e.per_token,
            e.shared,
            e.intermediate,
            e.dense_layers
        ),
        (64.0, 6.0, 2.0, 1408.0, 1.0)
    );
    let qwen_moe = parse(
        r#"{"model_type": "qwen2_moe", "hidden_size": 2048, "num_hidden_layers": 24, "intermediate_size": 5632,
            "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632, "num_experts": 60,
            "num_experts_per_tok": 4, "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 151936}"#,
        "qm",
    )
    .unwrap();
    let e = qwen_moe.experts.unwrap();
    assert_eq!((e.shared, e.shared_intermediate), (1.0, 5632.0));
}

#[test]
fn a_multimodal_config_gives_its_language_model() {
    let m = parse(
        r#"{"model_type": "llava", "text_config": {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
            "intermediate_size": 11008, "num_attention_heads": 32, "vocab_size": 32064}}"#,
        "v",
    )
    .unwrap();
    assert_eq!((m.hidden, m.layers), (4096.0, 32.0));
}

#[test]
fn every_wrong_config_names_the_field() {
    let base = |extra: &str| {
        format!(
            r#"{{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 14336, "num_attention_heads": 32, "vocab_size": 32000{extra}}}"#
        )
    };
    for (text, expect) in [
        ("not json".to_string(), "is not JSON"),
        ("[1, 2]".to_string(), "is not a JSON object"),
        (r#"{"model_type": "llama"}"#.to_string(), "has no hidden_size"),
        (base(r#", "num_key_value_heads": 64"#), "num_key_value_heads 64 is more than num_attention_heads 32"),
        (base(r#", "num_key_value_heads": 5"#), "not a multiple of num_key_value_heads 5"),
        (base(r#", "num_key_value_heads": "8""#), "num_key_value_heads is \"8\", not a whole number"),
        (base(r#", "num_key_value_heads": -8"#), "num_key_value_heads is -8, not a whole number"),
        (base(r#", "tie_word_embeddings": "yes""#), "tie_word_embeddings is \"yes\", not true or false"),
        (base(r#", "final_logit_softcapping": "30""#), "final_logit_softcapping is \"30\", not a number"),
        (base(r#", "attn_logit_softcapping": [50]"#), "attn_logit_softcapping is [50], not a number"),
        (base(r#", "num_local_experts": 8"#), "has experts but no num_experts_per_tok"),
        (base(r#", "num_local_experts": 8, "num_experts_per_tok": 9"#), "num_experts_per_tok 9 is more than the 8 experts"),
        (
            r#"{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 14336, "num_attention_heads": 32, "vocab_size": 18446744073709551615}"#.to_string(),
            "vocab_size 18446744073709551615 is out of range",
        ),
        (
            r#"{"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32000}"#.to_string(),
            "has no intermediate_size",
        ),
        (
            r#"{"model_type": "llama", "hidden_size": 4095, "num_hidden_layers": 32, "intermediate_size": 1, "num_attention_heads": 32, "vocab_size": 32000}"#.to_string(),
            "hidden_size 4095 is not a multiple of num_attention_heads 32",
        ),
    ] {
        let e = err(&text);
        assert!(e.starts_with("ConfigMap \"m\" key \"config.json\": "), "{e}");
        assert!(e.contains(expect), "{text}: {e}");
    }
}

#[test]
fn a_model_type_never_measured_keeps_a_stated_margin_and_a_measured_one_its_measured_factor() {
    let read = |text: &str| parse(text, "m").unwrap().standing;
    // Phi-3 and Gemma-2: what their blocks keep is counted (within 0.02 %); their steps' peaks
    // hold a little more, measured.
    assert_eq!(
        read(include_str!("../../../../hack/gpu/models/phi3-mini.json")),
        TypeStanding::Measured("phi3", 1.02)
    );
    assert_eq!(
        read(include_str!("../../../../hack/gpu/models/gemma2-2b.json")),
        TypeStanding::Measured("gemma2", 1.01)
    );
    for text in [
        include_str!("../../../../hack/gpu/models/llama-3b.json"),
        include_str!("../../../../hack/gpu/models/olmo2-7b.json"),
        // Gemma-3's language model counted from its H200 run (within 0.03 % of what it kept).
        include_str!("../../../../hack/gpu/models/gemma3-4b.json"),
        // Qwen3's per-head query and key norms are counted: what a 4B kept within 0.01 %.
        include_str!("../../../../hack/gpu/models/qwen3-8b.json"),
        // StarCoder2's GPT-style blocks are counted: two runs on an H100 within 0.6 % of the
        // count.
        include_str!("../../../../hack/gpu/models/starcoder2-7b.json"),
        // Cohere and Qwen2-MoE counted from their H100 loop (within 0.02 % of what their
        // blocks keep, the parallel block and the gate counted).
        include_str!("../../../../hack/gpu/models/cohere-8b.json"),
        include_str!("../../../../hack/gpu/models/qwen2moe-a2.7b.json"),
    ] {
        assert_eq!(read(text), TypeStanding::Counted, "{text}");
    }
    // A type never run: Granite, Cohere's config under another model_type.
    let granite = read(
        &include_str!("../../../../hack/gpu/models/cohere-8b.json")
            .replace("\"cohere\"", "\"granite\""),
    );
    assert_eq!(granite, TypeStanding::Unmeasured);
    assert!((granite.factor() - 1.40).abs() < 1e-12);
    let said = granite.said().unwrap();
    assert!(said.contains("never measured: +40 %"), "{said}");
    assert_eq!(TypeStanding::Counted.said(), None);
    // The margin is above what every measured type needed over the count, and above what
    // OLMo-2 needed over a Llama-style count that did not yet count its query and key norms
    // (×1.36 in three runs on an H100, docs/benchmarks/raw/2026-12-06-h100-olmo2-starcoder2/).
    for (name, f) in MEASURED_TYPES.iter().chain([
        &("olmo2 (norms not counted)", 1.36),
        &("qwen2_moe (gate not counted)", 1.02),
        &("qwen3 (head norms not counted)", 1.16),
        &("phi3 (fused projection not counted)", 1.20),
    ]) {
        assert!(TypeStanding::Unmeasured.factor() > *f, "{name} needed ×{f}");
    }
}

#[test]
fn a_config_map_without_the_key_says_what_it_holds() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let cm = |v: serde_json::Value| -> ConfigMap { serde_json::from_value(v).unwrap() };
    let found = |v| config_map_key(&cm(v), "config.json").unwrap_err();
    assert_eq!(found(serde_json::json!({})), "it holds no data");
    assert!(found(serde_json::json!({"data": {"model.json": "{}"}})).contains("\"model.json\""));
    let binary = found(serde_json::json!({"binaryData": {"config.json": "e30="}}));
    assert!(binary.contains("under binaryData, not data"), "{binary}");
    assert_eq!(
        config_map_key(
            &cm(serde_json::json!({"data": {"config.json": "{}"}})),
            "config.json"
        ),
        Ok("{}".to_string())
    );
    // What a refusal says, with the default key named.
    let e = ModelConfigError::MissingKey {
        name: "m".into(),
        key: "config.json".into(),
        found: found(serde_json::json!({"data": {"model.json": "{}"}})),
    };
    assert!(
        e.to_string()
            .contains("config.json when unset): its data has \"model.json\""),
        "{e}"
    );
}

/// Gemma-3-4B as published (`Gemma3ForConditionalGeneration`: the language model under
/// `text_config`, a SigLIP tower under `vision_config`): 4,300,079,472 parameters.
const GEMMA3_4B: &str = r#"{"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "mm_tokens_per_image": 256,
  "text_config": {"model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240, "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "vocab_size": 262208, "final_logit_softcapping": null, "attn_logit_softcapping": null},
  "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "num_hidden_layers": 27, "intermediate_size": 4304, "num_attention_heads": 16, "image_size": 896, "patch_size": 14}}"#;

/// Qwen2-VL-7B as published (`embed_dim` the tower's width, `hidden_size` its merger's output,
/// images of any size): 8,291,375,616 parameters.
const QWEN2_VL_7B: &str = r#"{"architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": false,
  "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "in_chans": 3, "hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}}"#;

#[test]
fn a_multimodal_models_vision_tower_is_counted_and_its_images_are_said() {
    let gemma = parse(GEMMA3_4B, "gemma3").unwrap();
    let tower = gemma.tower.expect("the vision tower is read");
    assert_eq!(
        (tower.hidden, tower.layers, tower.intermediate),
        (1152.0, 27.0, 4304.0)
    );
    assert_eq!(tower.patches, 4096.0);
    // Never fewer than the published count, and close to it (the projector is counted as up
    // to two layers).
    let published = 4_300_079_472.0;
    let counted = gemma.parameters();
    never_under_the_published(counted, published, 1.005);
    // Without its tower the count would be 0.42B under.
    let text_only = ModelShape {
        tower: None,
        ..gemma
    };
    assert!(published - text_only.parameters() > 0.41e9);
    // Its language model is a counted type; the whole model, whose tower's activations are
    // not counted, keeps the margin of a type never measured.
    assert_eq!(gemma.standing, TypeStanding::Unmeasured);
    let said = gemma.describe();
    assert!(
        said.contains("a vision tower of 27 blocks, width 1152, 0.43B parameters counted")
            && said.contains("about 3.7 GiB an image at 4096 patches, is not counted"),
        "{said}"
    );
    // Its tensors come first, in the order the model registers them, and sum to the count.
    let tensors = gemma.tensors(100_000).unwrap();
    assert_eq!(
        tensors.len(),
        text_only.tensors(100_000).unwrap().len() + tower.tensor_count()
    );
    assert!((tensors.iter().sum::<f64>() - counted).abs() < 1.0);

    let qwen = parse(QWEN2_VL_7B, "qwen2-vl").unwrap();
    let tower = qwen.tower.expect("the vision tower is read");
    assert_eq!(
        (tower.hidden, tower.layers, tower.intermediate),
        (1280.0, 32.0, 5120.0)
    );
    assert_eq!(tower.patches, 0.0, "images of any size");
    let published = 8_291_375_616.0;
    let counted = qwen.parameters();
    never_under_the_published(counted, published, 1.005);
    assert!(
        qwen.describe()
            .contains("depends on each image's size and is not counted"),
        "{}",
        qwen.describe()
    );
}

#[test]
fn a_vision_config_that_cannot_be_counted_is_refused_with_the_field_named() {
    let with = |vision: &str| {
        err(&format!(
            r#"{{"model_type": "llava", "text_config": {{"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32064}}, "vision_config": {vision}}}"#
        ))
    };
    let no_width = with(r#"{"num_hidden_layers": 24, "intermediate_size": 4096}"#);
    assert!(
        no_width.contains("vision_config has no hidden_size (nor embed_dim)"),
        "{no_width}"
    );
    let no_depth = with(r#"{"hidden_size": 1024, "intermediate_size": 4096}"#);
    assert!(
        no_depth.contains("vision_config has no num_hidden_layers"),
        "{no_depth}"
    );
    let bad = with(r#"{"hidden_size": -1, "num_hidden_layers": 24}"#);
    assert!(bad.contains("vision_config.hidden_size is -1"), "{bad}");
    let huge = with(r#"{"hidden_size": 1e300, "num_hidden_layers": 24}"#);
    assert!(huge.contains("not a number from 1 to 10,000,000"), "{huge}");
    let not_object = with("[1, 2]");
    assert!(
        not_object.contains("vision_config is [1,2], not an object"),
        "{not_object}"
    );
    // LLaVA-1.5-7B's CLIP tower (24 blocks of 1024, patch 14 at 336) is read and counted.
    let llava = parse(
        r#"{"model_type": "llava", "text_config": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32064}, "vision_config": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "image_size": 336, "patch_size": 14}}"#,
        "llava",
    )
    .unwrap();
    // LLaVA-1.5-7B: 7,063,427,072 parameters (its tower's last block included).
    let counted = llava.parameters();
    never_under_the_published(counted, 7_063_427_072.0, 1.005);
}

#[test]
fn latent_attention_is_counted_as_full_attention_and_said() {
    // DeepSeek-V2-Lite as published: 15,706,484,224 parameters; its attention compresses keys
    // and values (kv_lora_rank 512). Counted as full attention at the queries' head width
    // (128 + 64): 2 % over, never under.
    let ds = parse(
        r#"{"model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64, "num_experts_per_tok": 6, "first_k_dense_replace": 1, "kv_lora_rank": 512, "q_lora_rank": null, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 102400, "tie_word_embeddings": false}"#,
        "deepseek-v2-lite",
    )
    .unwrap();
    assert_eq!(ds.head_dim, 192.0);
    assert!(ds.quirks.latent_attention);
    let published = 15_706_484_224.0;
    let counted = ds.parameters();
    never_under_the_published(counted, published, 1.03);
    assert!(
        ds.describe()
            .contains("latent attention counted as full attention"),
        "{}",
        ds.describe()
    );
    let missing = err(
        r#"{"model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944, "num_hidden_layers": 27, "num_attention_heads": 16, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "vocab_size": 102400}"#,
    );
    assert!(
        missing.contains("has kv_lora_rank (latent attention) but no qk_nope_head_dim"),
        "{missing}"
    );
}

#[test]
fn a_tiled_vision_tower_counts_its_global_blocks_and_tile_positions() {
    // Llama-3.2-11B-Vision (`mllama`): 32 local and 8 global blocks, images in up to 4 tiles
    // with a position embedding per aspect ratio, tile and patch, a projector from 7,680 (five
    // blocks' outputs side by side): 10,670,220,835 parameters as published.
    let m = parse(
        r#"{"model_type": "mllama", "text_config": {"model_type": "mllama_text_model", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": false, "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38]},
            "vision_config": {"model_type": "mllama_vision_model", "hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32, "num_global_layers": 8, "image_size": 560, "patch_size": 14, "num_channels": 3, "max_num_tiles": 4, "vision_output_dim": 7680, "supported_aspect_ratios": [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]]}}"#,
        "mllama",
    )
    .unwrap();
    let tower = m.tower.expect("the vision tower is read");
    assert_eq!(
        (tower.layers, tower.tiles, tower.patches),
        (40.0, 4.0, 1600.0)
    );
    let published = 10_670_220_835.0;
    let counted = m.parameters();
    never_under_the_published(counted, published, 1.02);
}
