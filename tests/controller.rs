//! The controller against the real control plane (with controller-manager, scheduler and kwok,
//! so the workload's Pods really exist and land on simulated nodes).
//!
//! Nodes are cluster-wide, so every test uses its own pool label and a profile selecting it.

use offload_testenv::support;

use std::collections::BTreeMap;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::watcher;
use offload_api::names;
use offload_api::v1alpha1::{
    JobPhase, ModeSetting, NodeClass, OffloadMode, OffloadProfile, TrainingJob,
};
use offload_testenv::fixtures;
use serde_json::json;
use support::controller::*;
use support::*;

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
    let user =
        json!({"train_batch_size": 32, "zero_optimization": {"stage": 3, "overlap_comm": true}});
    add_deepspeed_config(&client, &ns, "ds", &user.to_string()).await;

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
    let ds = rendered_deepspeed_config(&client, &ns, "llama").await;
    assert_eq!(ds["train_batch_size"], 32);
    assert_eq!(ds["zero_optimization"]["overlap_comm"], true);
    assert_eq!(
        ds["zero_optimization"]["offload_optimizer"]["super_offload"],
        true
    );

    // Pods: env, config mount and affinity, on the coherent nodes.
    for pod in &pods_of(&client, &ns, "llama", 2).await {
        assert_configured_for_unified_memory(pod, &ns);
    }
    Api::<Service>::namespaced(client.clone(), &ns)
        .get("llama")
        .await
        .unwrap();

    // kubectl describe shows the decision as one Event: the workload, created with it.
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
            "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}",
        ],
    );
    assert!(
        events
            .lines()
            .any(|l| l.starts_with("WorkloadCreated: created Job llama with mode=UnifiedMemory")),
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

/// A pod of the `llama` job as unified-memory offload on the coherent nodes configures it: env,
/// the rendered config mounted, affinity to coherent nodes, placed on one of the pool's GH200s.
fn assert_configured_for_unified_memory(pod: &Pod, ns: &str) {
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
    let terms = required_node_terms(spec);
    let exprs = terms[0].match_expressions.as_ref().unwrap();
    assert!(exprs.iter().any(
        |e| e.key == names::LABEL_UMA && e.values.as_deref() == Some(&["true".to_string()][..])
    ));
    assert!(
        spec.node_name
            .as_ref()
            .unwrap()
            .starts_with(&format!("{ns}-gh200"))
    );
}

#[tokio::test]
async fn discrete_nodes_give_cpu_copy() {
    let (_cluster, client, ns) = setup("pcie").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    create_training_job(
        &api,
        "fsdp",
        &ns,
        json!({"name": "FSDP", "version": "2.7.1"}),
        json!({}),
    )
    .await;
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
async fn a_megatron_job_gets_its_hybrid_optimizer_flags_before_any_pod_starts() {
    let (_cluster, client, ns) = setup("megatron").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_node(&client, &ns, "h200-b", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    // The API server's own rules: spec.megatron only with framework Megatron, and a version.
    let wrong = training_job(
        "wrong",
        &ns,
        json!({"name": "DeepSpeed", "version": "0.19.8"}),
        json!({"megatron": {"tensorParallel": 2}}),
    );
    let err = api
        .create(&PostParams::default(), &wrong)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("spec.megatron is only valid with framework.name Megatron"),
        "{err}"
    );
    let unversioned = training_job("unversioned", &ns, json!({"name": "Megatron"}), json!({}));
    let err = api
        .create(&PostParams::default(), &unversioned)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("Megatron-core version"), "{err}");

    // A 20B GPT, tensor-parallel over the two GPUs: it does not fit an H200 without offload.
    create_training_job(
        &api,
        "gpt",
        &ns,
        json!({"name": "Megatron", "version": "0.14.0"}),
        json!({"megatron": {"tensorParallel": 2},
               "model": {"architecture": "GPT", "hiddenSize": 6144, "layers": 44,
                         "attentionHeads": 48, "vocabSize": 50304, "tokensPerStep": 4096}}),
    )
    .await;
    let done = wait_for_condition(&api, "gpt", "WorkloadCreated", "True").await;
    assert_eq!(done.spec.offload.mode, ModeSetting::CpuCopy);
    let decided = done.status.as_ref().unwrap().offload.as_ref().unwrap();
    let ratio = match done.spec.offload.offload_ratio {
        offload_api::v1alpha1::RatioSetting::Fixed(r) => r,
        other => panic!("a concrete ratio, got {other:?}"),
    };
    assert!(ratio > 0.0 && ratio < 1.0, "{ratio}");
    assert!(
        decided
            .reasons
            .iter()
            .any(|r| r.message.contains("hybrid device optimizer")),
        "{:?}",
        decided.reasons
    );
    for pod in &pods_of(&client, &ns, "gpt", 2).await {
        let env = env_of(pod);
        assert_eq!(env["OFFLOAD_MODE"], "cpu-copy");
        let args = &env["OFFLOAD_MEGATRON_ARGS"];
        assert!(args.starts_with("--use-distributed-optimizer --optimizer-cpu-offload --use-precision-aware-optimizer"), "{args}");
        assert!(
            args.contains(&format!("--optimizer-offload-fraction {ratio}")),
            "{args}"
        );
        assert!(
            env["OFFLOAD_NEMO_OVERRIDES"]
                .contains(&format!("optimizer.optimizer_offload_fraction={ratio}")),
            "{env:?}"
        );
        assert_eq!(env["USER_SETTING"], "kept");
    }
    // The same job trained with SGD: Megatron-core's hybrid optimizer takes Adam alone, so it
    // cannot be offloaded and is held, with the change that would let it run; no workload.
    create_training_job(
        &api,
        "gpt-sgd",
        &ns,
        json!({"name": "Megatron", "version": "0.14.0"}),
        json!({"megatron": {"tensorParallel": 2, "optimizer": "SGD"},
               "model": {"architecture": "GPT", "hiddenSize": 6144, "layers": 44,
                         "attentionHeads": 48, "vocabSize": 50304, "tokensPerStep": 4096}}),
    )
    .await;
    let cond = condition_when(&api, "gpt-sgd", "OffloadResolved", "False").await;
    assert!(
        cond.message.contains("takes --optimizer adam alone")
            && cond.message.contains("spec.megatron.optimizer: Adam"),
        "{}",
        cond.message
    );
    assert!(
        Api::<Job>::namespaced(client.clone(), &ns)
            .get_opt("gpt-sgd")
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
    create_training_job(
        &api,
        "uma",
        &ns,
        json!({"name": "Generic"}),
        json!({"offload": {"mode": "UnifiedMemory"}}),
    )
    .await;
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
        cond.message
            .contains("set spec.offload.mode to Auto or CPUCopy"),
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
    add_profile(&client, &ns).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    create_training_job(&api, "steady", &ns, json!({"name": "Generic"}), json!({})).await;
    let before = wait_for_condition(&api, "steady", "WorkloadCreated", "True").await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let job_before = jobs.get("steady").await.unwrap();

    // The profile now disables offload; the running job must not follow.
    Api::<OffloadProfile>::all(client.clone())
        .patch(
            &ns,
            &PatchParams::apply("offload-tests").force(),
            &Patch::Apply(&pool_profile(&ns, &ns, json!({"mode": "Disabled"}))),
        )
        .await
        .unwrap();
    // A job created after the change does follow it: proof the controller saw the change.
    create_training_job(&api, "after", &ns, json!({"name": "Generic"}), json!({})).await;
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
async fn a_missing_profile_is_reported_and_resolved_once_created() {
    let (_cluster, client, ns) = setup("noprof").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    create_training_job(&api, "later", &ns, json!({"name": "Generic"}), json!({})).await;
    let cond = condition_when(&api, "later", "OffloadResolved", "False").await;
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
    create_training_job(&api, "fine", &ns, json!({"name": "Generic"}), json!({})).await;
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

/// A pod template nested deeper than serde_json's limit (in fields the schema keeps open) is
/// stored by the API server; it once failed every list and watch event of TrainingJobs it was
/// in, so it was never reconciled and, after a relist, no other job was either.
#[tokio::test]
async fn a_job_nested_deeper_than_the_json_limit_is_reconciled_like_any_other() {
    let (cluster, client, ns) = setup("deepobj").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let mut value = json!(1);
    for _ in 0..200 {
        value = json!({ "a": value });
    }
    let mut doc = serde_json::to_value(training_job(
        "deep",
        &ns,
        json!({"name": "Generic"}),
        json!({}),
    ))
    .unwrap();
    doc["spec"]["template"]["spec"]["containers"][0]["x"] = value;
    let (ok, _, err) = kubectl_result(
        cluster,
        &["create", "-n", &ns, "-f", "-"],
        Some(&doc.to_string()),
    );
    assert!(ok, "the API server should store it: {err}");
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    create_training_job(&api, "beside", &ns, json!({"name": "Generic"}), json!({})).await;
    wait_for_condition(&api, "beside", "WorkloadCreated", "True").await;
    // The test's own client cannot read the deep object (serde_json's limit), so its
    // workload stands for its reconcile.
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client.clone(), &ns);
    tokio::time::timeout(
        WAIT,
        kube::runtime::wait::await_condition(
            jobs,
            "deep",
            |j: Option<&k8s_openapi::api::batch::v1::Job>| j.is_some(),
        ),
    )
    .await
    .expect("no workload Job for the deep TrainingJob")
    .unwrap();
}

/// A hostile input: a TrainingJob whose `spec.offload` write the API server
/// refuses (there, the operator's own webhook refused a job nested too deep, stored while it
/// failed open) was retried every 5 s for ever with no status and no Event. Here a
/// ValidatingAdmissionPolicy refuses the write: the job is held with the API server's reason,
/// an Event says it, and a change to its spec tries again.
#[tokio::test]
async fn a_decision_the_api_server_refuses_to_store_holds_the_job_until_its_spec_changes() {
    let (cluster, client, ns) = setup("refused").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let policy = format!("refuse-offload-{ns}");
    let manifests = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": policy},
         "spec": {"failurePolicy": "Fail",
                  "matchConstraints": {"resourceRules": [{"apiGroups": ["offload.dev"], "apiVersions": ["v1alpha1"],
                      "operations": ["UPDATE"], "resources": ["trainingjobs"]}]},
                  "validations": [{"expression": "!has(object.metadata.labels) || !('refuse' in object.metadata.labels) || object.spec.offload == oldObject.spec.offload",
                                   "message": "this job's spec.offload may not change (test policy)"}]}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": policy},
         "spec": {"policyName": policy, "validationActions": ["Deny"],
                  "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}}}
    ]});
    let (ok, _, err) = kubectl_result(cluster, &["apply", "-f", "-"], Some(&manifests.to_string()));
    assert!(ok, "{err}");
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    // The policy is enforced once the API server has loaded it: probe with a dry-run update.
    let mut probe = training_job("probe", &ns, json!({"name": "Generic"}), json!({}));
    probe.metadata.labels = Some([("refuse".to_string(), "yes".to_string())].into());
    api.create(&PostParams::default(), &probe).await.unwrap();
    poll("the test policy enforced", WAIT, || {
        let api = api.clone();
        async move {
            let patch = json!({"spec": {"offload": {"mode": "Disabled"}}});
            let params = PatchParams {
                dry_run: true,
                ..Default::default()
            };
            api.patch("probe", &params, &Patch::Merge(&patch))
                .await
                .err()
                .map(|_| ())
        }
    })
    .await;
    let mut tj = training_job("held", &ns, json!({"name": "Generic"}), json!({}));
    tj.metadata.labels = Some([("refuse".to_string(), "yes".to_string())].into());
    api.create(&PostParams::default(), &tj).await.unwrap();
    let cond = condition_when(&api, "held", "OffloadResolved", "False").await;
    assert_eq!(cond.reason, "SpecPatchRefused", "{}", cond.message);
    assert!(
        cond.message
            .contains("this job's spec.offload may not change (test policy)"),
        "{}",
        cond.message
    );
    assert!(
        cond.message.contains("tried again when its spec changes"),
        "{}",
        cond.message
    );
    let events = wait_list(
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), &ns),
        watcher::Config::default().fields("involvedObject.name=held,reason=SpecPatchRefused"),
        "a SpecPatchRefused Event on TrainingJob held",
        WAIT,
        |events| events.first().and_then(|e| e.message.clone()),
    )
    .await;
    assert!(events.contains("test policy"), "{events}");
    // A change to the job (here: the label that the policy keys on) is a new try, which the
    // API server accepts.
    let unlabel = json!({"metadata": {"labels": {"refuse": null}}, "spec": {"backoffLimit": 1}});
    api.patch("held", &PatchParams::default(), &Patch::Merge(&unlabel))
        .await
        .unwrap();
    wait_for_condition(&api, "held", "WorkloadCreated", "True").await;
}

#[tokio::test]
async fn a_job_that_runs_out_of_gpu_memory_is_decided_again_once_and_runs() {
    let (_cluster, client, ns) = setup("cudaoom").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &oom_job("mistral", &ns, "GPU", 32, 4096),
    )
    .await
    .unwrap();
    // Without offload (135 of 136 GiB by the model), its pod runs out of GPU memory; the job is
    // decided again with the evidence, and its new workload offloads and keeps running.
    let recovered = wait_for_condition(&api, "mistral", "MemoryRecovery", "True").await;
    let status = recovered.status.clone().unwrap();
    assert_eq!(status.memory_failures.len(), 1);
    let f = &status.memory_failures[0];
    assert_eq!(f.kind, offload_api::v1alpha1::MemoryKind::Gpu);
    assert!(
        f.configuration.starts_with("mode=Disabled"),
        "{}",
        f.configuration
    );
    assert!(f.message.contains("CUDA out of memory"), "{}", f.message);
    assert!(f.estimate_bytes.is_some() && f.budget_bytes.is_some());
    let running = wait_list(
        api.clone(),
        watcher::Config::default().fields("metadata.name=mistral"),
        "mistral running with its second configuration",
        WAIT,
        |jobs| {
            let tj = jobs.first()?;
            let s = tj.status.as_ref()?;
            (s.phase == Some(offload_api::v1alpha1::JobPhase::Running)
                && tj.spec.offload.mode == offload_api::v1alpha1::ModeSetting::CpuCopy)
                .then(|| TrainingJob::clone(tj))
        },
    )
    .await;
    let decision = running.status.unwrap().offload.unwrap();
    assert!(decision.offload_ratio > 0.1, "{}", decision.offload_ratio);
    let events = wait_list(
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), &ns),
        watcher::Config::default().fields("involvedObject.name=mistral,reason=OutOfMemory"),
        "an OutOfMemory Event on mistral",
        WAIT,
        |events| events.first().and_then(|e| e.message.clone()),
    )
    .await;
    assert!(
        events.contains("ran out of GPU memory with mode=Disabled"),
        "{events}"
    );
}

#[tokio::test]
async fn recovery_is_bounded_and_only_for_memory() {
    let (_cluster, client, ns) = setup("oombound").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    Api::<OffloadProfile>::all(client.clone())
        .create(
            &PostParams::default(),
            &pool_profile(&ns, &ns, json!({"maxMemoryRetries": 0})),
        )
        .await
        .unwrap();
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    // maxMemoryRetries 0: the failure is recorded, nothing is decided again.
    api.create(
        &PostParams::default(),
        &oom_job("bounded", &ns, "GPU", 32, 4096),
    )
    .await
    .unwrap();
    let cond = condition_when(&api, "bounded", "MemoryRecovery", "False").await;
    assert_eq!(cond.reason, "RetriesExhausted", "{}", cond.message);
    let tj = api.get("bounded").await.unwrap();
    assert_eq!(
        tj.spec.offload.mode,
        offload_api::v1alpha1::ModeSetting::Disabled,
        "never re-decided"
    );
    // A pod that fails for any other reason: the job fails as written, never re-decided.
    api.create(
        &PostParams::default(),
        &oom_job("buggy", &ns, "Other", 32, 4096),
    )
    .await
    .unwrap();
    let failed = wait_list(
        api.clone(),
        watcher::Config::default().fields("metadata.name=buggy"),
        "buggy Failed",
        WAIT,
        |jobs| {
            let tj = jobs.first()?;
            (tj.status.as_ref()?.phase == Some(offload_api::v1alpha1::JobPhase::Failed))
                .then(|| TrainingJob::clone(tj))
        },
    )
    .await;
    let status = failed.status.unwrap();
    assert!(status.memory_failures.is_empty());
    assert!(
        !status
            .conditions
            .iter()
            .any(|c| c.type_ == "MemoryRecovery")
    );
    // A TrainingJob that did not opt in (no offload.dev/profile) whose pod dies of CUDA
    // out-of-memory: it fails as it was written; nothing is recorded, decided or recreated.
    let mut plain = oom_job("plain", &ns, "GPUAlways", 32, 4096);
    plain
        .metadata
        .annotations
        .get_or_insert_default()
        .remove(names::PROFILE_ANNOTATION);
    api.create(&PostParams::default(), &plain).await.unwrap();
    let failed = wait_list(
        api.clone(),
        watcher::Config::default().fields("metadata.name=plain"),
        "plain Failed",
        WAIT,
        |jobs| {
            let tj = jobs.first()?;
            (tj.status.as_ref()?.phase == Some(offload_api::v1alpha1::JobPhase::Failed))
                .then(|| TrainingJob::clone(tj))
        },
    )
    .await;
    let status = failed.status.unwrap();
    assert!(status.memory_failures.is_empty(), "{status:?}");
    assert!(
        !status
            .conditions
            .iter()
            .any(|c| c.type_ == "MemoryRecovery"),
        "{status:?}"
    );
    let job = Api::<Job>::namespaced(client.clone(), &ns)
        .get("plain")
        .await
        .unwrap();
    assert!(
        job.metadata.deletion_timestamp.is_none(),
        "not deleted to be recreated"
    );
}

#[tokio::test]
async fn a_job_oom_killed_on_the_host_is_decided_again_with_its_host_figures_raised() {
    let (_cluster, client, ns) = setup("hostoom").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    // The 10.7B: 41 % of its optimizer state offloaded by copy; its pod (no memory limit) is
    // OOMKilled every time (the kwok stand-in). Each re-decision raises its host estimate as the
    // VPA raises a request, +20 % over what the pod had, never past the node's share; after
    // maxMemoryRetries it is held.
    api.create(
        &PostParams::default(),
        &oom_job("big", &ns, "Host", 48, 2048),
    )
    .await
    .unwrap();
    let cond = condition_when(&api, "big", "MemoryRecovery", "False").await;
    assert_eq!(cond.reason, "RetriesExhausted", "{}", cond.message);
    let tj = api.get("big").await.unwrap();
    let status = tj.status.unwrap();
    let f = &status.memory_failures;
    assert_eq!(f.len(), 3, "{f:?}");
    assert!(
        f.iter()
            .all(|f| f.kind == offload_api::v1alpha1::MemoryKind::Host)
    );
    assert!(f[0].message.contains("OOMKilled"), "{}", f[0].message);
    assert_eq!(f[0].limit_bytes, None, "the pod had no limit");
    for pair in f.windows(2) {
        let (before, after) = (
            pair[0].estimate_bytes.unwrap() as f64,
            pair[1].estimate_bytes.unwrap() as f64,
        );
        let share = pair[1].budget_bytes.unwrap() as f64;
        assert!(
            after >= (before * 1.19).min(share * 0.999) && after <= share,
            "{before} then {after} (share {share})"
        );
    }
    assert!(
        status.workload.is_some(),
        "held with its last workload, which ran out"
    );
}

/// A pod as the kubelet leaves it when its training container dies of CUDA out of memory.
fn failed_status(message: &str) -> serde_json::Value {
    json!({"status": {"phase": "Failed", "containerStatuses": [{
        "name": "train", "image": "train:1", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": message}}}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_kinds_that_run_out_of_memory_get_an_event_and_a_note_and_are_not_recreated() {
    let (cluster, client, ns) = setup("otheroom").await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // An opted-in batch Job (suspended: its pods are made here) whose template the webhook
    // labelled as configured, and its pod that ran out of GPU memory.
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "batch", "labels": {names::PROFILE_ANNOTATION: "auto"}},
        "spec": {"suspend": true, "template": {
            "metadata": {"labels": {names::LABEL_CONFIGURED: "true"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "train", "image": "train:1"}]}}}
    }))
    .unwrap();
    let job = jobs.create(&PostParams::default(), &job).await.unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "batch-0", "labels": {names::LABEL_CONFIGURED: "true"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "batch",
                "uid": job.metadata.uid.clone().unwrap(), "controller": true}]},
        "spec": {"containers": [{"name": "train", "image": "train:1",
            "env": [{"name": "OFFLOAD_MODE", "value": "disabled"}]}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods.patch_status(
        "batch-0",
        &PatchParams::default(),
        &Patch::Merge(failed_status(
            "Traceback\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        )),
    )
    .await
    .unwrap();
    let note = wait_list(
        jobs.clone(),
        watcher::Config::default().fields("metadata.name=batch"),
        "the Job annotated with what ran out",
        WAIT,
        |jobs| {
            jobs.first()?
                .metadata
                .annotations
                .as_ref()?
                .get(names::ANNOTATION_OUT_OF_MEMORY)
                .cloned()
        },
    )
    .await;
    assert!(
        note.starts_with("pod batch-0 ran out of GPU memory with OFFLOAD_MODE=disabled")
            && note.contains("Only TrainingJobs are decided again"),
        "{note}"
    );
    let events = poll("the OutOfMemory Events", WAIT, || async {
        let e = events_with_reason(cluster, &ns, "OutOfMemory");
        (e.lines().count() >= 2).then_some(e)
    })
    .await;
    assert!(!events.is_empty());
    // Not recreated: the pod and the Job are as they were (the Job still suspended).
    let job = jobs.get("batch").await.unwrap();
    assert_eq!(job.spec.unwrap().suspend, Some(true));
    assert!(pods.get("batch-0").await.is_ok());
    // A pod that failed for another reason is left alone.
    let mut other = pod.clone();
    other.metadata.name = Some("batch-1".into());
    pods.create(&PostParams::default(), &other).await.unwrap();
    pods.patch_status(
        "batch-1",
        &PatchParams::default(),
        &Patch::Merge(failed_status("ValueError: bad batch")),
    )
    .await
    .unwrap();
    // The first pod's Events are there; the second's never come (checked after a pod whose
    // failure is announced: a third pod, out of memory, is announced after the second's turn).
    let mut third = pod.clone();
    third.metadata.name = Some("batch-2".into());
    pods.create(&PostParams::default(), &third).await.unwrap();
    pods.patch_status(
        "batch-2",
        &PatchParams::default(),
        &Patch::Merge(failed_status("CUDA out of memory")),
    )
    .await
    .unwrap();
    poll("the third pod's Event", WAIT, || async {
        let e = kubectl(
            cluster,
            &[
                "get",
                "events",
                "-n",
                &ns,
                "--field-selector",
                "reason=OutOfMemory,involvedObject.name=batch-2",
                "-o",
                "name",
            ],
        );
        (!e.trim().is_empty()).then_some(())
    })
    .await;
    let second = kubectl(
        cluster,
        &[
            "get",
            "events",
            "-n",
            &ns,
            "--field-selector",
            "reason=OutOfMemory,involvedObject.name=batch-1",
            "-o",
            "name",
        ],
    );
    assert!(second.trim().is_empty(), "{second}");
}

/// Hostile input, fourth pass: a namespace LimitRange whose default memory limit (16Gi) is
/// below what the decision counts on. Its pods could never be created (the memory request the
/// operator writes would be above the limit the LimitRanger gives them); the job is held with
/// the figures and the LimitRange named, and no workload is made.
#[tokio::test]
async fn a_limit_range_below_the_host_estimate_holds_the_job_with_the_figures() {
    let (_cluster, client, ns) = setup("limitrange").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let range: k8s_openapi::api::core::v1::LimitRange = serde_json::from_value(json!({
        "metadata": {"name": "team-defaults", "namespace": ns},
        "spec": {"limits": [{"type": "Container", "default": {"memory": "16Gi"}}]}
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::LimitRange>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &range)
        .await
        .unwrap();
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    // Partial offload on an H200: tens of GiB of host memory.
    api.create(
        &PostParams::default(),
        &oom_job("limited", &ns, "None", 40, 4096),
    )
    .await
    .unwrap();
    let cond = condition_when(&api, "limited", "OffloadResolved", "False").await;
    assert!(
        cond.message.contains("LimitRange \"team-defaults\"") && cond.message.contains("16.0 GiB"),
        "{}",
        cond.message
    );
    assert!(
        cond.message.contains("a pod memory limit above"),
        "says what would fit: {}",
        cond.message
    );
    assert!(
        Api::<Job>::namespaced(client.clone(), &ns)
            .get_opt("limited")
            .await
            .unwrap()
            .is_none(),
        "no workload whose pods would never be created"
    );
    // The namespace's owner raises the default: the held job is decided again at once, and
    // its workload made.
    let raised =
        json!({"spec": {"limits": [{"type": "Container", "default": {"memory": "512Gi"}}]}});
    Api::<k8s_openapi::api::core::v1::LimitRange>::namespaced(client.clone(), &ns)
        .patch(
            "team-defaults",
            &PatchParams::default(),
            &Patch::Merge(&raised),
        )
        .await
        .unwrap();
    wait_for_condition(&api, "limited", "WorkloadCreated", "True").await;
}

/// The LimitRanger refuses a container whose memory request is below the range's `min`, or
/// whose limit is more than `maxLimitRequestRatio` times its request: a request the decision
/// writes is raised to that floor, so the workload's pods are created (not refused at every
/// try), and the reason says why the request is more than the configuration counts on.
#[tokio::test]
async fn a_limit_ranges_min_and_ratio_raise_the_request_written() {
    let (_cluster, client, ns) = setup("limitfloor").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let ranges = Api::<k8s_openapi::api::core::v1::LimitRange>::namespaced(client.clone(), &ns);
    let range: k8s_openapi::api::core::v1::LimitRange = serde_json::from_value(json!({
        "metadata": {"name": "strict", "namespace": ns},
        "spec": {"limits": [{"type": "Container", "default": {"memory": "100Gi"},
                             "maxLimitRequestRatio": {"memory": "1"}}]}
    }))
    .unwrap();
    ranges.create(&PostParams::default(), &range).await.unwrap();
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let request_of = |pod: &Pod| {
        pod.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("memory"))
            .map(|q| offload_api::quantity::bytes(q).unwrap())
    };
    // Partial offload on an H200: tens of GiB of host memory counted, under the 100 GiB limit.
    api.create(
        &PostParams::default(),
        &oom_job("ratio", &ns, "None", 40, 4096),
    )
    .await
    .unwrap();
    let pods = pods_of(&client, &ns, "ratio", 1).await;
    assert_eq!(request_of(&pods[0]), Some(100 << 30));
    let tj = api.get("ratio").await.unwrap();
    let reasons = tj.status.unwrap().offload.unwrap().reasons;
    assert!(
        reasons.iter().any(|r| r
            .message
            .contains("maxLimitRequestRatio 1 of LimitRange \"strict\"")),
        "{reasons:?}"
    );
    // A min above the host estimate: the request is the min.
    let min = json!({"spec": {"limits": [{"type": "Container", "default": {"memory": "200Gi"},
                                          "min": {"memory": "120Gi"}}]}});
    ranges
        .patch("strict", &PatchParams::default(), &Patch::Merge(&min))
        .await
        .unwrap();
    api.create(
        &PostParams::default(),
        &oom_job("minimum", &ns, "None", 40, 4096),
    )
    .await
    .unwrap();
    let pods = pods_of(&client, &ns, "minimum", 1).await;
    assert_eq!(request_of(&pods[0]), Some(120 << 30));
}

/// Hostile input, fifth pass: a ResourceQuota the workload's pods exceed. The Job controller
/// says so only in a `FailedCreate` Event on the Job; the TrainingJob shows it as
/// `PodsScheduled=False` with the quota's words and what to change, and as a Warning Event, and
/// says `True` once the quota allows the pods. A pod the scheduler cannot place (its claim does
/// not exist) is shown the same way with the scheduler's words.
#[tokio::test]
async fn pods_the_cluster_refuses_or_cannot_place_are_shown_on_the_job() {
    let (cluster, client, ns) = setup("refused").await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let quotas = Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(client.clone(), &ns);
    let quota = serde_json::from_value(json!({
        "metadata": {"name": "team", "namespace": ns},
        "spec": {"hard": {"requests.memory": "1Gi"}}
    }))
    .unwrap();
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    // The quota admits nothing until the quota controller has counted what the namespace uses.
    wait(
        "the quota counted",
        WAIT,
        await_condition(
            quotas.clone(),
            "team",
            |q: Option<&k8s_openapi::api::core::v1::ResourceQuota>| {
                q.and_then(|q| q.status.as_ref())
                    .is_some_and(|s| s.hard.is_some())
            },
        ),
    )
    .await
    .unwrap();
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    api.create(
        &PostParams::default(),
        &oom_job("quota", &ns, "None", 40, 4096),
    )
    .await
    .unwrap();
    let cond = condition_when(&api, "quota", "PodsScheduled", "False").await;
    assert_eq!(cond.reason, "PodsRefusedByQuota");
    assert!(
        cond.message.contains("exceeded quota: team")
            && cond.message.contains("raise the namespace's ResourceQuota"),
        "{}",
        cond.message
    );
    poll("a PodsRefusedByQuota Event", WAIT, || async {
        (!events_with_reason(cluster, &ns, "PodsRefusedByQuota").is_empty()).then_some(())
    })
    .await;
    // The namespace's owner lifts the quota: the Job creates the pod, the job says so.
    quotas.delete("team", &Default::default()).await.unwrap();
    pods_of(&client, &ns, "quota", 1).await;
    let cond = condition_when(&api, "quota", "PodsScheduled", "True").await;
    assert_eq!(cond.reason, "PodsScheduled");

    // A pod whose claim does not exist waits for a node no scheduler will find.
    let mut tj = oom_job("unplaced", &ns, "None", 40, 4096);
    let pod = tj.spec.template.spec.as_mut().unwrap();
    pod.volumes = Some(vec![
        serde_json::from_value(json!({"name": "data",
            "persistentVolumeClaim": {"claimName": "no-such-claim"}}))
        .unwrap(),
    ]);
    api.create(&PostParams::default(), &tj).await.unwrap();
    let cond = condition_when(&api, "unplaced", "PodsScheduled", "False").await;
    assert_eq!(cond.reason, "PodsUnschedulable");
    assert!(cond.message.contains("no-such-claim"), "{}", cond.message);
}
