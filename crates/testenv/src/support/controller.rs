//! Helpers of the controller tests (and the others that run the operator in process): the shared cluster with controller-manager, scheduler and
//! kwok, the in-process operator, a pool of reported nodes and a profile per test.

use std::time::Duration;

use super::*;
use crate::devcluster::ClusterOptions;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::wait::await_condition;
use offload_api::names;
use offload_api::v1alpha1::{OffloadProfile, TrainingJob};
use offload_operator::render::deepspeed::CONFIG_FILE_NAME;
use serde_json::json;

/// The controller tests' shared cluster: controller-manager, scheduler and kwok, no real node.
pub const OPTIONS: ClusterOptions = ClusterOptions {
    controller_manager: true,
    scheduler: true,
    kwok: true,
    real_node: false,
};
/// How long a controller test waits for any one condition.
pub const WAIT: Duration = Duration::from_secs(90);

/// The shared cluster with the in-process operator, a client and a fresh namespace named
/// after `prefix`.
pub async fn setup(prefix: &str) -> (&'static crate::devcluster::DevCluster, Client, String) {
    let cluster = cluster(OPTIONS);
    operator(cluster);
    let client = client(cluster).await;
    let ns = namespace(&client, prefix).await;
    (cluster, client, ns)
}

/// A reported kwok node `<ns>-<suffix>` in the test's pool.
pub async fn add_node(client: &Client, ns: &str, suffix: &str, fixture: &str) {
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &reported_node(&format!("{ns}-{suffix}"), fixture, ns),
        )
        .await
        .unwrap();
}

/// The test's profile (named after its namespace), selecting only its pool.
pub async fn add_profile(client: &Client, ns: &str) {
    Api::<OffloadProfile>::all(client.clone())
        .create(&PostParams::default(), &pool_profile(ns, ns, json!({})))
        .await
        .unwrap();
}

/// A TrainingJob of two replicas of one GPU each under `profile`, with `framework` and the
/// fields of `extra` merged into its spec.
pub fn training_job(
    name: &str,
    profile: &str,
    framework: serde_json::Value,
    extra: serde_json::Value,
) -> TrainingJob {
    let mut spec = json!({
        "replicas": 2,
        "framework": framework,
        "template": {"spec": {"containers": [{
            "name": "train", "image": "registry.example.com/train:1",
            "env": [{"name": "USER_SETTING", "value": "kept"}],
            "resources": {"limits": {"nvidia.com/gpu": "1"}}
        }]}}
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name, "annotations": {names::PROFILE_ANNOTATION: profile}},
        "spec": spec
    }))
    .unwrap()
}

/// A one-pod job of Mistral-7B's shape (`layers` of them) at `tokens` per step, whose pods kwok
/// ends as a training process that runs out of memory does (`offload.dev/kwok-out-of-memory`:
/// `GPU` when run without offload, `GPUAlways` in any configuration, `Host` when run with copy
/// offload, `Other` for a failure that is not memory): a stand-in for the training process,
/// named as such.
pub fn oom_job(name: &str, profile: &str, oom: &str, layers: i64, tokens: i64) -> TrainingJob {
    let mut tj = training_job(
        name,
        profile,
        json!({"name": "DeepSpeed", "version": "0.19.8"}),
        json!({"replicas": 1, "backoffLimit": 0, "model": {"architecture": "Llama", "hiddenSize": 4096,
            "layers": layers, "intermediateSize": 14336, "attentionHeads": 32, "keyValueHeads": 8,
            "vocabSize": 32000, "tokensPerStep": tokens}}),
    );
    tj.spec.template.metadata = Some(
        serde_json::from_value(json!({"annotations": {"offload.dev/kwok-out-of-memory": oom}}))
            .unwrap(),
    );
    tj
}

/// Waits until TrainingJob `name` has condition `type_` with `status`; returns the job.
pub async fn wait_for_condition(
    api: &Api<TrainingJob>,
    name: &str,
    type_: &str,
    status: &str,
) -> TrainingJob {
    let what = format!("TrainingJob {name} condition {type_}={status}");
    let want_type = type_.to_string();
    let want_status = status.to_string();
    wait(
        &what,
        WAIT,
        await_condition(api.clone(), name, move |tj: Option<&TrainingJob>| {
            tj.and_then(|t| t.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == want_type && c.status == want_status)
            })
        }),
    )
    .await
    .unwrap()
    .unwrap()
}

/// [`wait_for_condition`], returning the condition itself (its reason and message).
pub async fn condition_when(
    api: &Api<TrainingJob>,
    name: &str,
    type_: &str,
    status: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    let tj = wait_for_condition(api, name, type_, status).await;
    tj.status
        .into_iter()
        .flat_map(|s| s.conditions)
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("{name} has no {type_} condition"))
}

/// Creates [`training_job`] through `api` (its namespace) and returns what was stored.
pub async fn create_training_job(
    api: &Api<TrainingJob>,
    name: &str,
    profile: &str,
    framework: serde_json::Value,
    extra: serde_json::Value,
) -> TrainingJob {
    api.create(
        &PostParams::default(),
        &training_job(name, profile, framework, extra),
    )
    .await
    .unwrap()
}

/// Creates ConfigMap `name` in `ns` holding `config` as the user's DeepSpeed JSON, under the key
/// the operator reads and writes.
pub async fn add_deepspeed_config(client: &Client, ns: &str, name: &str, config: &str) {
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name}, "data": {CONFIG_FILE_NAME: config}
    }))
    .unwrap();
    Api::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
}

/// The DeepSpeed JSON the operator rendered for TrainingJob `job` (its ConfigMap, named as the
/// operator names it).
pub async fn rendered_deepspeed_config(client: &Client, ns: &str, job: &str) -> serde_json::Value {
    let rendered: k8s_openapi::api::core::v1::ConfigMap = Api::namespaced(client.clone(), ns)
        .get(&offload_operator::render::workload::config_map_name(job))
        .await
        .unwrap();
    serde_json::from_str(&rendered.data.unwrap_or_default()[CONFIG_FILE_NAME]).unwrap()
}
