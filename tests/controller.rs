//! The controller against the real control plane (with controller-manager, scheduler and kwok,
//! so the workload's Pods really exist and land on simulated nodes).
//!
//! Nodes are cluster-wide, so every test uses its own pool label and a profile selecting it.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Service};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::watcher;
use offload_api::names;
use offload_operator::api::{
    JobPhase, ModeSetting, NodeClass, OffloadMode, OffloadProfile, TrainingJob,
};
use offload_testenv::devcluster::ClusterOptions;
use offload_testenv::fixtures;
use serde_json::json;
use support::*;

const OPTIONS: ClusterOptions = ClusterOptions {
    controller_manager: true,
    scheduler: true,
    kwok: true,
};
const WAIT: Duration = Duration::from_secs(90);

async fn setup(
    prefix: &str,
) -> (
    &'static offload_testenv::devcluster::DevCluster,
    Client,
    String,
) {
    let cluster = cluster(OPTIONS);
    operator(cluster);
    let client = client(cluster).await;
    let ns = namespace(&client, prefix).await;
    (cluster, client, ns)
}

/// A reported kwok node `<ns>-<suffix>` in the test's pool.
async fn add_node(client: &Client, ns: &str, suffix: &str, fixture: &str) {
    Api::<Node>::all(client.clone())
        .create(
            &PostParams::default(),
            &reported_node(&format!("{ns}-{suffix}"), fixture, ns),
        )
        .await
        .unwrap();
}

/// The test's profile (named after its namespace), selecting only its pool.
async fn add_profile(client: &Client, ns: &str) {
    Api::<OffloadProfile>::all(client.clone())
        .create(&PostParams::default(), &pool_profile(ns, ns, json!({})))
        .await
        .unwrap();
}

fn training_job(
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

async fn wait_for_condition(
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

async fn pods_of(client: &Client, ns: &str, job: &str, count: usize) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let selector = format!("batch.kubernetes.io/job-name={job}");
    wait_list(
        pods,
        watcher::Config::default().labels(&selector),
        &format!("{count} pods of Job {job} bound to nodes"),
        WAIT,
        |pods| {
            let bound: Vec<Pod> = pods
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
                .map(|p| Pod::clone(p))
                .collect();
            (bound.len() >= count).then_some(bound)
        },
    )
    .await
}

fn env_of(pod: &Pod) -> BTreeMap<String, String> {
    pod.spec.as_ref().unwrap().containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn coherent_nodes_give_unified_memory_and_pods_carry_env_config_and_affinity() {
    let (_cluster, client, ns) = setup("uma").await;
    add_node(&client, &ns, "gh200", fixtures::GH200_REFERENCE).await;
    add_node(&client, &ns, "gh200-b", fixtures::GH200_REFERENCE).await;
    add_profile(&client, &ns).await;
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ds"},
        "data": {"ds_config.json": "{\"train_batch_size\": 32, \"zero_optimization\": {\"stage\": 3, \"overlap_comm\": true}}"}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();

    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let tj = training_job(
        "llama",
        &ns,
        json!({"name": "DeepSpeed", "version": "0.19.8"}),
        json!({"deepspeed": {"configMapRef": {"name": "ds"}}}),
    );
    api.create(&PostParams::default(), &tj).await.unwrap();
    let done = wait_for_condition(&api, "llama", "WorkloadCreated", "True").await;

    // The concrete values are in the spec, the reasons in status.
    assert_eq!(done.spec.offload.mode, ModeSetting::UnifiedMemory);
    let decision = done.status.as_ref().unwrap().offload.clone().unwrap();
    assert_eq!(decision.mode, OffloadMode::UnifiedMemory);
    assert_eq!(decision.node_class, Some(NodeClass::Coherent));
    assert!(decision.overlap, "GH200 fixture verified overlap at 0.91");
    assert!(decision.super_offload);
    assert!(
        decision
            .reasons
            .iter()
            .any(|r| r.field == "overlap" && r.message.contains("0.91"))
    );

    // The rendered config keeps the user's keys and adds SuperOffload.
    let rendered = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get("llama-offload")
        .await
        .unwrap();
    let ds: serde_json::Value =
        serde_json::from_str(&rendered.data.unwrap()["ds_config.json"]).unwrap();
    assert_eq!(ds["train_batch_size"], 32);
    assert_eq!(ds["zero_optimization"]["overlap_comm"], true);
    assert_eq!(
        ds["zero_optimization"]["offload_optimizer"]["super_offload"],
        true
    );

    // Pods: env, config mount and affinity, on the coherent nodes.
    let pods = pods_of(&client, &ns, "llama", 2).await;
    for pod in &pods {
        let env = env_of(pod);
        assert_eq!(env["OFFLOAD_MODE"], "unified-memory");
        assert_eq!(env["OFFLOAD_OVERLAP"], "1");
        assert_eq!(env["OFFLOAD_PROFILE"], ns);
        assert_eq!(env["OFFLOAD_CONFIG_FILE"], "/etc/offload/ds_config.json");
        assert_eq!(env["USER_SETTING"], "kept");
        assert_eq!(env["MASTER_ADDR"], "llama-0.llama");
        let spec = pod.spec.as_ref().unwrap();
        assert!(spec.volumes.iter().flatten().any(|v| {
            v.config_map
                .as_ref()
                .is_some_and(|c| c.name == "llama-offload")
        }));
        let terms = &spec
            .affinity
            .as_ref()
            .unwrap()
            .node_affinity
            .as_ref()
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap()
            .node_selector_terms;
        let exprs = terms[0].match_expressions.as_ref().unwrap();
        assert!(
            exprs.iter().any(|e| e.key == names::LABEL_UMA
                && e.values.as_deref() == Some(&["true".to_string()][..]))
        );
        assert!(
            spec.node_name
                .as_ref()
                .unwrap()
                .starts_with(&format!("{ns}-gh200"))
        );
    }
    Api::<Service>::namespaced(client.clone(), &ns)
        .get("llama")
        .await
        .unwrap();

    // kubectl describe shows the decision as an Event.
    let events = kubectl(
        _cluster,
        &[
            "get",
            "events",
            "-n",
            &ns,
            "--field-selector",
            "involvedObject.name=llama",
            "-o",
            "jsonpath={.items[*].reason}",
        ],
    );
    assert!(
        events.contains("OffloadResolved") && events.contains("WorkloadCreated"),
        "{events}"
    );

    // Phase follows the Job (kwok runs pods to completion).
    wait(
        "TrainingJob llama phase Succeeded",
        WAIT,
        await_condition(api.clone(), "llama", |tj: Option<&TrainingJob>| {
            tj.and_then(|t| t.status.as_ref()).and_then(|s| s.phase) == Some(JobPhase::Succeeded)
        }),
    )
    .await
    .unwrap();

    // The profile's status counts this pool's nodes and the job.
    let profiles: Api<OffloadProfile> = Api::all(client.clone());
    let profile = wait(
        "profile status to count 2 coherent nodes and 1 job",
        WAIT,
        await_condition(profiles.clone(), &ns, |p: Option<&OffloadProfile>| {
            p.and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.nodes.coherent == 2 && s.jobs == 1)
        }),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(profile.status.unwrap().nodes.overlap_verified, 2);
}

#[tokio::test]
async fn discrete_nodes_give_cpu_copy() {
    let (_cluster, client, ns) = setup("pcie").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &training_job(
            "fsdp",
            &ns,
            json!({"name": "FSDP", "version": "2.7.1"}),
            json!({}),
        ),
    )
    .await
    .unwrap();
    let done = wait_for_condition(&api, "fsdp", "WorkloadCreated", "True").await;
    assert_eq!(done.spec.offload.mode, ModeSetting::CpuCopy);
    let pods = pods_of(&client, &ns, "fsdp", 2).await;
    for pod in &pods {
        let env = env_of(pod);
        assert_eq!(env["OFFLOAD_MODE"], "cpu-copy");
        assert_eq!(env["FSDP_OFFLOAD_PARAMS"], "true");
        assert_eq!(env["FSDP_VERSION"], "2");
        assert!(!env.contains_key("OFFLOAD_CONFIG_FILE"));
        assert_eq!(
            pod.spec.as_ref().unwrap().node_name.as_deref(),
            Some(format!("{ns}-h200").as_str())
        );
    }
    assert!(
        Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .get_opt("fsdp-offload")
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn unified_memory_without_coherent_nodes_waits_then_resolves_when_one_appears() {
    let (_cluster, client, ns) = setup("wait").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &training_job(
            "uma",
            &ns,
            json!({"name": "Generic"}),
            json!({"offload": {"mode": "UnifiedMemory"}}),
        ),
    )
    .await
    .unwrap();
    let waiting = wait_for_condition(&api, "uma", "OffloadResolved", "False").await;
    let cond = waiting
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == "OffloadResolved")
        .unwrap()
        .clone();
    assert_eq!(cond.reason, "NoCoherentNodes");
    assert!(
        cond.message.contains("set offload.mode to Auto or CPUCopy"),
        "{}",
        cond.message
    );
    assert!(
        Api::<Job>::namespaced(client.clone(), &ns)
            .get_opt("uma")
            .await
            .unwrap()
            .is_none(),
        "no workload while unresolved"
    );

    // A coherent node appears in the pool: the job resolves without being touched.
    add_node(&client, &ns, "gh200", fixtures::GH200_REFERENCE).await;
    let done = wait_for_condition(&api, "uma", "WorkloadCreated", "True").await;
    assert_eq!(
        done.status.unwrap().offload.unwrap().mode,
        OffloadMode::UnifiedMemory
    );
    let pods = pods_of(&client, &ns, "uma", 2).await;
    assert!(
        pods.iter()
            .all(|p| p.spec.as_ref().unwrap().node_name.as_deref()
                == Some(format!("{ns}-gh200").as_str()))
    );
}

#[tokio::test]
async fn a_running_job_is_never_reconfigured() {
    let (_cluster, client, ns) = setup("frozen").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    let profiles: Api<OffloadProfile> = Api::all(client.clone());
    profiles
        .create(&PostParams::default(), &pool_profile(&ns, &ns, json!({})))
        .await
        .unwrap();
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &training_job("steady", &ns, json!({"name": "Generic"}), json!({})),
    )
    .await
    .unwrap();
    let before = wait_for_condition(&api, "steady", "WorkloadCreated", "True").await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let job_before = jobs.get("steady").await.unwrap();

    // The profile now disables offload; the running job must not follow.
    profiles
        .patch(
            &ns,
            &PatchParams::apply("offload-tests").force(),
            &Patch::Apply(&pool_profile(&ns, &ns, json!({"mode": "Disabled"}))),
        )
        .await
        .unwrap();
    // A job created after the change does follow it: proof the controller saw the change.
    api.create(
        &PostParams::default(),
        &training_job("after", &ns, json!({"name": "Generic"}), json!({})),
    )
    .await
    .unwrap();
    let after = wait_for_condition(&api, "after", "WorkloadCreated", "True").await;
    assert_eq!(after.spec.offload.mode, ModeSetting::Disabled);

    let still = api.get("steady").await.unwrap();
    assert_eq!(still.spec.offload, before.spec.offload);
    assert_eq!(
        still.status.unwrap().offload,
        before.status.unwrap().offload
    );
    let job_after = jobs.get("steady").await.unwrap();
    assert_eq!(
        job_after.spec.unwrap().template,
        job_before.spec.unwrap().template
    );
}

#[tokio::test]
async fn a_job_that_did_not_opt_in_runs_without_offload_and_says_so() {
    let (_cluster, client, ns) = setup("optout").await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let mut tj = training_job("plain", "x", json!({"name": "Generic"}), json!({}));
    tj.metadata.annotations = None;
    api.create(&PostParams::default(), &tj).await.unwrap();
    // Our own kind is never left silent: it runs as written, and its status says why it has no
    // offload configuration.
    wait_for_condition(&api, "plain", "WorkloadCreated", "True").await;
    let plain = api.get("plain").await.unwrap();
    let status = plain.status.unwrap();
    let held = status
        .conditions
        .iter()
        .find(|c| c.type_ == "OffloadResolved")
        .unwrap();
    assert_eq!(
        (held.status.as_str(), held.reason.as_str()),
        ("False", "NotRequested")
    );
    assert!(
        held.message.contains("runs without offload configuration"),
        "{}",
        held.message
    );
    assert!(status.offload.is_none());
    assert_eq!(
        plain.spec.offload.mode,
        ModeSetting::Auto,
        "the spec is not touched"
    );
    let job = Api::<Job>::namespaced(client.clone(), &ns)
        .get("plain")
        .await
        .unwrap();
    let container = &job.spec.unwrap().template.spec.unwrap().containers[0];
    let env: Vec<&str> = container
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    assert!(env.contains(&"USER_SETTING"), "{env:?}");
    assert!(
        !env.iter().any(|e| e.starts_with("OFFLOAD_")),
        "no offload env for a job that asked for none: {env:?}"
    );
}

#[tokio::test]
async fn a_missing_profile_is_reported_and_resolved_once_created() {
    let (_cluster, client, ns) = setup("noprof").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &training_job("later", &ns, json!({"name": "Generic"}), json!({})),
    )
    .await
    .unwrap();
    let waiting = wait_for_condition(&api, "later", "OffloadResolved", "False").await;
    let cond = waiting
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "OffloadResolved")
        .unwrap();
    assert_eq!(cond.reason, "ProfileNotFound");
    add_profile(&client, &ns).await;
    wait_for_condition(&api, "later", "WorkloadCreated", "True").await;
}

#[tokio::test]
async fn an_object_that_does_not_deserialize_is_reported_and_skipped() {
    let (cluster, client, ns) = setup("badobj").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    // The schema keeps the pod template open, so a wrongly typed container field is stored but
    // cannot be read into a PodTemplateSpec.
    let bad = format!(
        "apiVersion: offload.dev/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: broken\n  annotations: {{offload.dev/profile: {ns}}}\nspec:\n  framework: {{name: Generic}}\n  template: {{spec: {{containers: [{{name: t, image: 5}}]}}}}\n"
    );
    let (ok, _, err) = kubectl_result(cluster, &["apply", "-n", &ns, "-f", "-"], Some(&bad));
    assert!(ok, "the API server should store it: {err}");
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &training_job("fine", &ns, json!({"name": "Generic"}), json!({})),
    )
    .await
    .unwrap();
    wait_for_condition(&api, "fine", "WorkloadCreated", "True").await;
    let events = wait_list(
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), &ns),
        watcher::Config::default().fields("involvedObject.name=broken,reason=InvalidObject"),
        "an InvalidObject Event on TrainingJob broken",
        WAIT,
        |events| events.first().and_then(|e| e.message.clone()),
    )
    .await;
    assert!(events.contains("cannot read this TrainingJob"), "{events}");
}

/// A second reconcile working from a stale cached copy (the job as created, no status yet)
/// must not drop the decision another write just recorded: 7 of 187 jobs lost
/// `status.offload` and `OffloadResolved` that way when one writer applied the whole status.
#[tokio::test]
async fn a_stale_copy_never_drops_the_recorded_decision() {
    let (_cluster, client, ns) = setup("stale").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let stale = api
        .create(
            &PostParams::default(),
            &training_job("late", &ns, json!({"name": "Generic"}), json!({})),
        )
        .await
        .unwrap();
    let resolved = wait_for_condition(&api, "late", "WorkloadCreated", "True").await;
    assert!(resolved.status.as_ref().unwrap().offload.is_some());

    // The reconcile a stale cache would run: it finds the workload and follows it.
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = offload_operator::metrics::Metrics::new(&mut registry);
    let (caches, _not_driven) = offload_operator::caches::Caches::new(&client, metrics.clone());
    let ctx = offload_operator::controller::Context::new(client.clone(), &caches, metrics, "test");
    offload_operator::controller::reconcile_job(&stale, &ctx)
        .await
        .unwrap();

    let after = api.get("late").await.unwrap();
    let status = after.status.unwrap();
    assert!(
        status.offload.is_some(),
        "status.offload dropped: {status:?}"
    );
    for (kind, want) in [("OffloadResolved", "True"), ("WorkloadCreated", "True")] {
        assert!(
            status
                .conditions
                .iter()
                .any(|c| c.type_ == kind && c.status == want),
            "{kind} lost: {:?}",
            status.conditions
        );
    }
}

/// A legal DeepSpeed config of 680 KB (compact) fits a ConfigMap once merged: it was
/// pretty-printed to over 3 MiB, refused by the API server every few seconds, and the job's
/// status stayed empty.
#[tokio::test]
async fn a_large_deepspeed_config_is_merged_compactly() {
    let (_cluster, client, ns) = setup("bigds").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let partition = vec![1u8; 340_000];
    let user = json!({"zero_optimization": {"stage": 3}, "pipeline": {"partition": partition}});
    let text = user.to_string();
    assert!(text.len() > 600_000, "{} bytes", text.len());
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "big-ds"}, "data": {"ds_config.json": text}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &training_job(
            "big",
            &ns,
            json!({"name": "DeepSpeed", "version": "0.19.8"}),
            json!({"deepspeed": {"configMapRef": {"name": "big-ds"}}}),
        ),
    )
    .await
    .unwrap();
    wait_for_condition(&api, "big", "WorkloadCreated", "True").await;
    let rendered = Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .get("big-offload")
        .await
        .unwrap();
    let merged: serde_json::Value =
        serde_json::from_str(&rendered.data.unwrap()["ds_config.json"]).unwrap();
    assert_eq!(
        merged["pipeline"]["partition"].as_array().unwrap().len(),
        340_000
    );
    assert_eq!(
        merged["zero_optimization"]["offload_optimizer"]["device"],
        "cpu"
    );
}

/// A workload the API server refuses for a reason that will not pass on its own (here a
/// container without an image) is shown on the TrainingJob, with the server's message.
#[tokio::test]
async fn a_refused_workload_is_a_condition_with_the_servers_message() {
    let (_cluster, client, ns) = setup("refused").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let mut tj = training_job("noimage", &ns, json!({"name": "Generic"}), json!({}));
    if let Some(spec) = tj.spec.template.spec.as_mut() {
        spec.containers[0].image = None;
    }
    api.create(&PostParams::default(), &tj).await.unwrap();
    let held = wait_for_condition(&api, "noimage", "WorkloadCreated", "False").await;
    let status = held.status.unwrap();
    let cond = status
        .conditions
        .iter()
        .find(|c| c.type_ == "WorkloadCreated")
        .unwrap();
    assert_eq!(cond.reason, "ApplyFailed");
    assert!(
        cond.message.contains("applying the workload Job failed") && cond.message.contains("image"),
        "{}",
        cond.message
    );
    assert!(status.offload.is_some(), "the decision itself stands");
}
