//! What the first hostile corpus did not cover: a poison-pill GPU
//! count, names the workload's objects cannot carry, a config mounted over the root, selector
//! keys the API server refuses, reviews of other versions, objects nested too deep to read.
//! Each was admitted (or crashed the handler) before the fix.

use super::*;

fn job_with_containers(containers: Value) -> Value {
    let mut tj = training_job(json!({}), json!({"name": "Generic"}));
    tj["spec"]["template"]["spec"]["containers"] = containers;
    tj
}

async fn validate(tj: Value) -> Value {
    validate_new(discrete_cluster(), tj).await
}

fn message(r: &Value) -> String {
    r["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_gpu_count_that_overflows_is_denied_with_the_container_named() {
    let r = validate(job_with_containers(json!([
        {"name": "a", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "18446744073709551615"}}},
        {"name": "b", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
    ])))
    .await;
    assert_eq!(r["allowed"], false, "{r}");
    let msg = message(&r);
    assert!(
        msg.contains("container \"a\"") && msg.contains("larger than"),
        "{msg}"
    );
    // The mutating webhook leaves it unchanged (validation says why), and does not crash.
    let m = admit(
        discrete_cluster(),
        paths::MUTATE_TRAINING_JOB,
        tj_review(
            "CREATE",
            job_with_containers(json!([
                {"name": "a", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "18446744073709551615"}}}
            ])),
            None,
        ),
    )
    .await;
    assert_eq!(m["allowed"], true);
    assert!(m.get("patch").is_none_or(Value::is_null), "{m}");
    // Fractions and words are no GPU counts either.
    for q in ["0.5", "two"] {
        let r = validate(job_with_containers(json!([
            {"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": q}}}
        ])))
        .await;
        assert_eq!(r["allowed"], false, "{q}: {r}");
    }
}

#[tokio::test]
async fn a_pod_asking_for_1k_gpus_is_counted_as_a_thousand() {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "labels": {"offload.dev/profile": "auto"}},
        "spec": {"containers": [{"name": "c", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1k"}}}]}});
    let r = admit(
        discrete_cluster(),
        paths::MUTATE_POD,
        review("", "v1", "Pod", "pods", "CREATE", pod, None),
    )
    .await;
    // Configured (its pods wait: a bare pod cannot be held), and placed for 1000 GPUs.
    assert_eq!(r["allowed"], true, "{r}");
}

#[tokio::test]
async fn names_the_workload_cannot_carry_and_mounts_over_the_system_are_denied() {
    for (name, expect) in [
        ("rel.dot", "DNS label"),
        (&"x".repeat(70) as &str, "DNS label"),
    ] {
        let mut tj = training_job(json!({}), json!({"name": "Generic"}));
        tj["metadata"]["name"] = json!(name);
        let r = validate(tj).await;
        assert_eq!(r["allowed"], false, "{name}");
        assert!(message(&r).contains(expect), "{name}: {}", message(&r));
    }
    // Not opted in: still denied, the operator creates its Service either way.
    let mut plain = training_job(json!({}), json!({"name": "Generic"}));
    plain["metadata"]["annotations"] = json!({});
    plain["metadata"]["name"] = json!("rel.dot");
    assert_eq!(validate(plain).await["allowed"], false);

    let mut mounted = training_job(json!({}), json!({"name": "DeepSpeed", "version": "0.19.8"}));
    mounted["spec"]["deepspeed"] = json!({"mountPath": "/"});
    let r = validate(mounted).await;
    assert_eq!(r["allowed"], false);
    assert!(
        message(&r).contains("spec.deepspeed.mountPath"),
        "{}",
        message(&r)
    );
}

#[tokio::test]
async fn a_selector_key_the_api_server_refuses_is_denied() {
    let r = admit(
        discrete_cluster(),
        paths::VALIDATE_PROFILE,
        profile_review(json!({"nodeSelector": {"matchLabels": {"a b": "x"}}})),
    )
    .await;
    assert_eq!(r["allowed"], false, "{r}");
    assert!(message(&r).contains("label key \"a b\""), "{}", message(&r));
}

#[tokio::test]
async fn reviews_of_another_version_are_refused() {
    let mut r = tj_review(
        "CREATE",
        training_job(json!({}), json!({"name": "Generic"})),
        None,
    );
    r["apiVersion"] = json!("foo/v9");
    let (status, body) = post(
        discrete_cluster(),
        paths::VALIDATE_TRAINING_JOB,
        serde_json::to_vec(&r).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["error"].as_str().unwrap().contains("foo/v9"), "{body}");
}

#[tokio::test]
async fn an_object_nested_too_deep_to_read_is_denied_with_its_uid() {
    let mut tj = training_job(json!({}), json!({"name": "Generic"}));
    let mut deep = json!(1);
    for _ in 0..150 {
        deep = json!({ "a": deep });
    }
    tj["spec"]["template"]["metadata"] = json!({"annotations": {}, "x": "DEEP"});
    // Put in by hand: serde_json's writer has no depth limit, its reader does.
    let text = serde_json::to_string(&tj_review("CREATE", tj, None))
        .unwrap()
        .replacen("\"DEEP\"", &serde_json::to_string(&deep).unwrap(), 1);
    let (status, body) = post(
        discrete_cluster(),
        paths::VALIDATE_TRAINING_JOB,
        text.into_bytes(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["response"]["uid"],
        "705ab4f5-6393-11e8-b7cc-42010a800002"
    );
    assert_eq!(body["response"]["allowed"], false);
    assert!(
        body["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("nested deeper"),
        "{body}"
    );
}
