//! Kubeflow Trainer's TrainJobs: the configuration written where the installed Trainer takes it
//! (`spec.runtimePatches` from 2.2, `spec.podTemplateOverrides` before), read from its CRD.

use super::kinds::opted_meta;
use super::*;
use crate::webhook::kinds::{TRAINJOB_PATCH_MANAGER, TrainJobApi};

fn trainjob() -> Value {
    json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": opted_meta("tj"),
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 1, "env": [{"name": "KEEP", "value": "me"}]},
        "runtimePatches": [{"manager": "example.io/platform-team", "trainingRuntimeSpec": {}}]}})
}

async fn admit_trainjob(api: TrainJobApi, tj: &Value) -> Value {
    let app = app_with(
        vec![
            node("gh200-0", fixtures::GH200_REFERENCE),
            node("gh200-1", fixtures::GH200_REFERENCE),
        ],
        ApiFeatures { trainjob: api },
    );
    admit(
        app,
        paths::MUTATE_WORKLOAD,
        review(
            "trainer.kubeflow.org",
            "v1alpha1",
            "TrainJob",
            "trainjobs",
            "CREATE",
            tj.clone(),
            None,
        ),
    )
    .await
}

fn env_names(tj: &Value) -> Vec<&str> {
    tj["spec"]["trainer"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn trainjobs_get_the_field_their_installed_trainer_takes() {
    // Trainer ≥ 2.2: an entry of our own manager in spec.runtimePatches, beside the user's.
    let tj = trainjob();
    let r = admit_trainjob(TrainJobApi::RuntimePatches, &tj).await;
    assert_eq!(r["allowed"], true, "{r}");
    let out = patched(&tj, &r);
    let env = env_names(&out);
    assert!(
        env.contains(&"KEEP") && env.contains(&"OFFLOAD_MODE"),
        "{env:?}"
    );
    let patches = out["spec"]["runtimePatches"].as_array().unwrap();
    assert_eq!(patches.len(), 2, "the user's patch is kept: {patches:?}");
    assert_eq!(patches[0]["manager"], "example.io/platform-team");
    let ours = &patches[1];
    assert_eq!(ours["manager"], TRAINJOB_PATCH_MANAGER);
    let job = &ours["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0];
    assert_eq!(job["name"], "node");
    assert!(
        job["template"]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"].is_object(),
        "{job}"
    );
    assert!(out["spec"].get("podTemplateOverrides").is_none());
    // A second pass (reinvocation) replaces our entry instead of adding one.
    let again = admit_trainjob(TrainJobApi::RuntimePatches, &out).await;
    assert!(
        again.get("patch").is_none_or(Value::is_null),
        "re-invocation adds nothing: {again}"
    );

    // Trainer 2.1: a podTemplateOverrides entry targeting the trainer job.
    let mut tj = trainjob();
    tj["spec"].as_object_mut().unwrap().remove("runtimePatches");
    let r = admit_trainjob(TrainJobApi::PodTemplateOverrides, &tj).await;
    assert_eq!(r["allowed"], true, "{r}");
    let out = patched(&tj, &r);
    let ov = &out["spec"]["podTemplateOverrides"][0];
    assert_eq!(ov["targetJobs"][0]["name"], "node");
    assert!(ov["spec"]["affinity"]["nodeAffinity"].is_object());
    assert!(out["spec"].get("runtimePatches").is_none());

    // A TrainJob API that cannot take affinity: refused, saying what to change.
    let r = admit_trainjob(TrainJobApi::Unsupported, &tj).await;
    assert_eq!(r["allowed"], false, "{r}");
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("spec.runtimePatches") && msg.contains("upgrade Kubeflow Trainer"),
        "{msg}"
    );
}

#[test]
fn the_trainjob_api_is_read_from_the_crd_schema() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crd = |field: &str| -> CustomResourceDefinition {
        serde_json::from_value(json!({
            "metadata": {"name": "trainjobs.trainer.kubeflow.org"},
            "spec": {"group": "trainer.kubeflow.org", "scope": "Namespaced",
                "names": {"kind": "TrainJob", "plural": "trainjobs"},
                "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {field: {"type": "array"}, "trainer": {"type": "object"}}}}}}}]}
        }))
        .unwrap()
    };
    assert_eq!(
        TrainJobApi::from_crd(&crd("runtimePatches")),
        TrainJobApi::RuntimePatches
    );
    assert_eq!(
        TrainJobApi::from_crd(&crd("podTemplateOverrides")),
        TrainJobApi::PodTemplateOverrides
    );
    assert_eq!(
        TrainJobApi::from_crd(&crd("podSpecOverrides")),
        TrainJobApi::Unsupported
    );
}
