//! TrainingJob validation and mutation.

use super::*;

// ---- TrainingJob -----------------------------------------------------------------------------

#[tokio::test]
async fn a_valid_training_job_is_admitted() {
    let tj = training_job(
        json!({"mode": "Auto"}),
        json!({"name": "DeepSpeed", "version": "0.19.8"}),
    );
    let r = validate_new(coherent_cluster(), tj).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert!(r.get("warnings").is_none_or(Value::is_null));
}

#[tokio::test]
async fn a_framework_that_cannot_take_the_request_is_denied_with_what_to_change() {
    let tj = training_job(
        json!({"offloadRatio": "0.5"}),
        json!({"name": "FSDP", "version": "2.7.1"}),
    );
    let r = validate_new(discrete_cluster(), tj).await;
    let msg = denial(&r);
    assert!(
        msg.contains("FSDP has no partial-offload switch")
            && msg.contains("set spec.offload.offloadRatio to 1 or Auto"),
        "{msg}"
    );

    let tj = training_job(json!({}), json!({"name": "DeepSpeed", "version": "0.9.0"}));
    let r = validate_new(discrete_cluster(), tj).await;
    assert_eq!(r["allowed"], false);
    assert!(r["status"]["message"].as_str().unwrap().contains("0.10.0"));
}

#[tokio::test]
async fn unified_memory_without_coherent_nodes_is_admitted_with_a_warning() {
    let tj = training_job(json!({"mode": "UnifiedMemory"}), json!({"name": "Generic"}));
    let r = validate_new(discrete_cluster(), tj).await;
    assert_eq!(r["allowed"], true);
    let warning = r["warnings"][0].as_str().unwrap();
    assert!(
        warning.contains("needs a hardware-coherent node"),
        "{warning}"
    );
}

#[tokio::test]
async fn a_running_job_cannot_be_reconfigured() {
    let mut old = training_job(
        json!({"mode": "CPUCopy", "overlap": "Enabled", "offloadRatio": "1", "pinMemory": "Enabled"}),
        json!({"name": "Generic"}),
    );
    old["status"] = json!({"workload": {"job": "llama", "service": "llama"}});
    let mut new = old.clone();
    new["spec"]["offload"]["mode"] = json!("Disabled");
    let r = admit(
        discrete_cluster(),
        paths::VALIDATE_TRAINING_JOB,
        tj_review("UPDATE", new, Some(old.clone())),
    )
    .await;
    assert!(
        denial(&r).contains("spec.offload cannot change once the workload exists"),
        "{r}"
    );
    // Metadata-only changes pass.
    let mut labelled = old.clone();
    labelled["metadata"]["labels"] = json!({"team": "a"});
    let r = admit(
        discrete_cluster(),
        paths::VALIDATE_TRAINING_JOB,
        tj_review("UPDATE", labelled, Some(old)),
    )
    .await;
    assert_eq!(r["allowed"], true);
}

#[tokio::test]
async fn mutation_resolves_auto_at_creation_and_keeps_the_request() {
    let tj = training_job(
        json!({"mode": "Auto", "overlap": "Auto", "offloadRatio": "Auto", "pinMemory": "Auto"}),
        json!({"name": "DeepSpeed", "version": "0.19.8"}),
    );
    let r = admit(
        coherent_cluster(),
        paths::MUTATE_TRAINING_JOB,
        tj_review("CREATE", tj.clone(), None),
    )
    .await;
    assert_eq!(r["allowed"], true);
    for op in patch_of(&r) {
        let path = op["path"].as_str().unwrap();
        assert!(
            path.starts_with("/spec/offload") || path.starts_with("/metadata/annotations"),
            "{op}"
        );
    }
    let out = patched(&tj, &r);
    assert_eq!(
        out["spec"]["offload"],
        json!({"mode": "UnifiedMemory", "overlap": "Enabled", "offloadRatio": "1", "pinMemory": "Enabled"})
    );
    // The original request is kept, beside what was written, so the controller explains the
    // decision from it for as long as the spec holds what the webhook wrote.
    let record: Value = serde_json::from_str(
        out["metadata"]["annotations"][names::ANNOTATION_REQUESTED]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(record["requested"]["mode"], "Auto");
    assert_eq!(record["wrote"], out["spec"]["offload"]);
    // Re-invocation on the mutated object changes nothing.
    let again = admit(
        coherent_cluster(),
        paths::MUTATE_TRAINING_JOB,
        tj_review("CREATE", out, None),
    )
    .await;
    assert!(again.get("patch").is_none_or(Value::is_null), "{again}");
}

#[tokio::test]
async fn a_zero_stage_in_the_config_map_gets_the_same_answer_as_one_in_the_spec() {
    let ds = json!({"name": "DeepSpeed", "version": "0.19.8"});
    // Stage 2 in the spec, a partial ratio: refused with what to change.
    let mut in_spec = training_job(json!({"offloadRatio": "0.5"}), ds.clone());
    in_spec["spec"]["deepspeed"] = json!({"zeroStage": 2});
    let spec_answer = validate_new(discrete_cluster(), in_spec).await;
    assert_eq!(spec_answer["allowed"], false, "{spec_answer}");
    // Stage 2 in the referenced ConfigMap: the same refusal, the same words.
    let mut in_config = training_job(json!({"offloadRatio": "0.5"}), ds);
    in_config["spec"]["deepspeed"] = json!({"configMapRef": {"name": "ds"}});
    let app = app_full(
        vec![node("h200-0", fixtures::H200_READING)],
        ApiFeatures::default(),
        BTreeMap::from([(
            "ds".to_string(),
            r#"{"zero_optimization": {"stage": 2}}"#.to_string(),
        )]),
    );
    let config_answer = validate_new(app, in_config.clone()).await;
    assert_eq!(config_answer["allowed"], false, "{config_answer}");
    assert_eq!(
        config_answer["status"]["message"], spec_answer["status"]["message"],
        "the same answer"
    );
    assert!(
        spec_answer["status"]["message"]
            .as_str()
            .unwrap()
            .contains("stage 2"),
        "{spec_answer}"
    );
    // A ConfigMap the webhook could not read: admitted, the controller holds it with the reason.
    let r = validate_new(discrete_cluster(), in_config).await;
    assert_eq!(r["allowed"], true, "{r}");
}
