//! Hostile input, third pass: refusals that name the field, labels that cannot be a queue,
//! annotations named as what they are.

use super::*;

fn ds_job() -> Value {
    training_job(
        json!({"mode": "Auto", "overlap": "Auto", "offloadRatio": "Auto", "pinMemory": "Auto"}),
        json!({"name": "DeepSpeed", "version": "0.19.8"}),
    )
}

#[tokio::test]
async fn a_value_of_the_wrong_type_is_refused_naming_its_field() {
    for (edit, expect) in [
        (
            json!({"model": {"parameters": "8B", "activationCheckpointing": "true"}}),
            "spec.model.activationCheckpointing: invalid type: string \"true\", expected a boolean",
        ),
        (
            json!({"model": {"parameters": "8B", "layers": "32"}}),
            "spec.model.layers: invalid type: string \"32\", expected i64",
        ),
        (
            json!({"replicas": "two"}),
            "spec.replicas: invalid type: string \"two\"",
        ),
    ] {
        let mut tj = ds_job();
        for (k, v) in edit.as_object().unwrap() {
            tj["spec"][k] = v.clone();
        }
        let r = validate_new(discrete_cluster(), tj).await;
        let msg = denial(&r);
        assert!(msg.contains(expect), "{msg}");
    }
}

#[tokio::test]
async fn a_queue_label_kueue_would_refuse_is_refused_with_its_rule() {
    for queue in ["", "Team_A", "-a", &"q".repeat(254)] {
        let mut tj = ds_job();
        tj["metadata"]["labels"] = json!({names::KUEUE_QUEUE_LABEL: queue});
        let r = validate_new(discrete_cluster(), tj).await;
        let msg = denial(&r);
        assert!(
            msg.contains("metadata.labels[kueue.x-k8s.io/queue-name]")
                && msg.contains("DNS-1123 subdomain"),
            "{queue:?}: {msg}"
        );
    }
    let mut tj = ds_job();
    tj["metadata"]["labels"] = json!({names::KUEUE_QUEUE_LABEL: "team-a"});
    assert_eq!(validate_new(discrete_cluster(), tj).await["allowed"], true);
}

#[tokio::test]
async fn hints_in_annotations_are_named_as_annotations() {
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
    let r = admit(
        discrete_cluster(),
        paths::MUTATE_WORKLOAD,
        review(
            "batch",
            "v1",
            "Job",
            "jobs",
            "CREATE",
            job(json!({
                "offload.dev/model-parameters": "8B",
                "offload.dev/attention-heads": "32",
                "offload.dev/key-value-heads": "5",
                "offload.dev/hidden-size": "4096",
                "offload.dev/layers": "32"
            })),
            None,
        ),
    )
    .await;
    let msg = denial(&r);
    assert!(msg.contains("annotation offload.dev/key-value-heads 5 must divide annotation offload.dev/attention-heads 32"), "{msg}");
    assert!(!msg.contains("spec.model"), "{msg}");
}
