//! The model's `config.json`: read for TrainingJobs (`spec.model.configMapRef`) and other kinds
//! (annotation `offload.dev/model-config`); a config that cannot be read or describes no model
//! is named in the answer.

use super::*;

const LLAMA_8B: &str = include_str!("../../../hack/gpu/models/llama-8b.json");

fn with_configs(configs: &[(&str, &str)]) -> axum::Router {
    app_full(
        vec![node("h200-0", fixtures::H200_READING)],
        Default::default(),
        configs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn job_with_model(model: Value) -> Value {
    let mut tj = training_job(
        json!({"mode": "Auto", "overlap": "Auto", "offloadRatio": "Auto", "pinMemory": "Auto"}),
        json!({"name": "DeepSpeed", "version": "0.19.8"}),
    );
    tj["spec"]["model"] = model;
    tj["spec"]["template"]["spec"]["containers"][0]["resources"] =
        json!({"limits": {"nvidia.com/gpu": "1"}});
    tj
}

#[tokio::test]
async fn a_training_job_is_decided_from_its_models_config() {
    let tj = job_with_model(json!({"configMapRef": {"name": "llama-8b"}, "tokensPerStep": 2048}));
    let r = admit(
        with_configs(&[("llama-8b", LLAMA_8B)]),
        paths::MUTATE_TRAINING_JOB,
        tj_review("CREATE", tj.clone(), None),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");
    let out = patched(&tj, &r);
    assert_eq!(out["spec"]["offload"]["mode"], "Disabled", "{out}");
    // With 8192 tokens it does not fit without offload: a partial share, from the same shape.
    let tj = job_with_model(json!({"configMapRef": {"name": "llama-8b"}, "tokensPerStep": 8192}));
    let r = admit(
        with_configs(&[("llama-8b", LLAMA_8B)]),
        paths::MUTATE_TRAINING_JOB,
        tj_review("CREATE", tj.clone(), None),
    )
    .await;
    let out = patched(&tj, &r);
    assert_eq!(out["spec"]["offload"]["mode"], "CPUCopy", "{out}");
}

#[tokio::test]
async fn a_training_job_whose_model_config_is_missing_or_wrong_waits_with_the_reason() {
    let tj = job_with_model(json!({"configMapRef": {"name": "m"}, "tokensPerStep": 2048}));
    for (configs, expect) in [
        (
            vec![],
            "ConfigMap \"m\" (spec.model.configMapRef) does not exist",
        ),
        (
            vec![("m", r#"{"model_type": "llama", "hidden_size": 4096}"#)],
            "has no num_hidden_layers",
        ),
    ] {
        let r = validate_new(with_configs(&configs), tj.clone()).await;
        // The user may still create or fix the ConfigMap: admitted with a warning, held.
        assert_eq!(r["allowed"], true, "{r}");
        let warning = r["warnings"][0].as_str().unwrap_or_default();
        assert!(warning.contains(expect), "{warning}");
    }
}

#[tokio::test]
async fn another_kind_names_its_model_config_in_an_annotation() {
    let job = |config: &str| {
        json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "j", "namespace": "team-a", "labels": {"offload.dev/profile": "auto"},
            "annotations": {"offload.dev/framework": "Generic", "offload.dev/model-config": config,
                "offload.dev/tokens-per-step": "2048"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "train", "image": "train:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
    };
    let r = admit(
        with_configs(&[("llama-8b", LLAMA_8B)]),
        paths::MUTATE_WORKLOAD,
        review(
            "batch",
            "v1",
            "Job",
            "jobs",
            "CREATE",
            job("llama-8b"),
            None,
        ),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");
    // A missing ConfigMap or one that describes no model: refused, since a pod template's env
    // cannot change after creation; the message names the ConfigMap and the field.
    for (configs, expect) in [
        (
            vec![],
            "ConfigMap \"absent\" (annotation offload.dev/model-config) does not exist",
        ),
        (
            vec![("absent", r#"{"hidden_size": "4096"}"#)],
            "hidden_size is \"4096\", not a whole number",
        ),
    ] {
        let r = admit(
            with_configs(&configs),
            paths::MUTATE_WORKLOAD,
            review("batch", "v1", "Job", "jobs", "CREATE", job("absent"), None),
        )
        .await;
        let msg = denial(&r);
        assert!(msg.contains(expect), "{msg}");
    }
}

#[tokio::test]
async fn model_annotations_are_named_in_every_refusal() {
    let job = |annotations: Value| {
        let mut a = json!({"offload.dev/framework": "Generic"});
        for (k, v) in annotations.as_object().unwrap() {
            a[k] = v.clone();
        }
        json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "j", "namespace": "team-a", "labels": {"offload.dev/profile": "auto"}, "annotations": a},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "train", "image": "train:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
    };
    for (annotations, expect) in [
        (
            json!({"offload.dev/vocab-size": "32000"}),
            "annotation offload.dev/vocab-size needs",
        ),
        (
            json!({"offload.dev/model-parameters": "8B", "offload.dev/vocab-size": "18446744073709551616"}),
            "annotation offload.dev/vocab-size: 18446744073709551616 is too large",
        ),
        (
            json!({"offload.dev/model-parameters": "8B", "offload.dev/key-value-heads": "eight"}),
            "annotation offload.dev/key-value-heads: \"eight\" is not a whole number",
        ),
        (
            json!({"offload.dev/model-parameters": "8B", "offload.dev/architecture": "RNN"}),
            "annotation offload.dev/architecture: \"RNN\" is neither Llama nor GPT",
        ),
        (
            json!({"offload.dev/model-parameters": "8B", "offload.dev/experts": "8"}),
            "offload.dev/experts and offload.dev/experts-per-token go together",
        ),
        (
            json!({"offload.dev/model-config": "Not_A_Name"}),
            "annotation offload.dev/model-config: \"Not_A_Name\" is not a DNS-1123 subdomain",
        ),
    ] {
        let r = admit(
            with_configs(&[]),
            paths::MUTATE_WORKLOAD,
            review(
                "batch",
                "v1",
                "Job",
                "jobs",
                "CREATE",
                job(annotations.clone()),
                None,
            ),
        )
        .await;
        let msg = denial(&r);
        assert!(msg.contains(expect), "{annotations}: {msg}");
    }
}
