//! DRA on the real node: a stand-in for the kubelet plugin of NVIDIA's DRA driver
//! (`hack/k8s/kube/gpu-dra-standin`, on the pinned `k8s.io/dynamic-resource-allocation`
//! helper the driver uses; the node has no GPU behind it) registers with the real kubelet and
//! publishes the node's ResourceSlice. A TrainingJob claims its GPU through a
//! ResourceClaimTemplate: the operator pins the claim to the decided class (its copy of the
//! template selects by addressing mode and memory), the real scheduler allocates the node's
//! GPU, the real kubelet has the plugin prepare the claim (a CDI spec file) and containerd
//! starts the pod with what it says (the training container prints it); the agent's read of
//! the kubelet's pod-resources API lists the DRA device for the pod. Deleting the job
//! unprepares the claim and frees the GPU for the next job. Then the plugin dies mid-prepare:
//! the pod stays pending with the kubelet's message, nothing in the operator breaks, and a
//! restarted plugin lets the pod start. Last, a slice the operator cannot believe (an
//! addressing mode no driver writes, more GPUs than a node has) sets the node aside.
//!
//! Needs root (a kubelet and containerd run here).

use offload_testenv::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use offload_api::names;
use offload_api::v1alpha1::{OffloadProfile, TrainingJob};
use offload_testenv::deploy;
use offload_testenv::devcluster::node::images;
use offload_testenv::devcluster::{ClusterOptions, DevCluster, REAL_NODE};
use offload_testenv::dra::{self, KubeletPlugin, PluginOptions, StandInGpu};
use serde_json::json;
use support::controller::wait_for_condition;
use support::*;

const WAIT: Duration = Duration::from_secs(120);
/// The kubelet tries a pod whose sync failed (its claims could not be prepared) again after a
/// back-off of up to its one-minute resync interval, and it failed several times while no
/// plugin answered: its next try after the plugin is back can come well over a minute later.
const KUBELET_RETRY: Duration = Duration::from_secs(330);

fn resource_api(client: &kube::Client, ns: Option<&str>, kind: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("resource.k8s.io", "v1", kind));
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// A one-pod TrainingJob on the real node whose GPU comes from template `gpu`; its training
/// container prints the GPUs it was handed and stays up.
fn claiming_job(name: &str) -> TrainingJob {
    serde_json::from_value(json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name, "annotations": {names::PROFILE_ANNOTATION: "real-node-dra"}},
        "spec": {"replicas": 1, "framework": {"name": "DeepSpeed", "version": "0.19.8"},
                 "template": {"spec": {
                     "restartPolicy": "Never",
                     "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "gpu"}],
                     "containers": [{"name": "train", "image": images::reference("offload-pause"),
                                     "imagePullPolicy": "Never",
                                     "command": ["/standin", "devices"],
                                     "resources": {"claims": [{"name": "gpus"}]}}]}}}
    }))
    .unwrap()
}

/// The job's pod, once `check` holds for it.
async fn job_pod(
    client: &kube::Client,
    ns: &str,
    job: &str,
    what: &str,
    timeout: Duration,
    check: impl Fn(&Pod) -> bool,
) -> Pod {
    wait_list(
        Api::<Pod>::namespaced(client.clone(), ns),
        kube::runtime::watcher::Config::default()
            .labels(&format!("{}={job}", names::LABEL_TRAINING_JOB)),
        what,
        timeout,
        |pods| pods.iter().find(|p| check(p)).map(|p| Pod::clone(p)),
    )
    .await
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

fn is_running(pod: &Pod) -> bool {
    phase(pod) == Some("Running")
}

/// The name of the pod's (one) generated ResourceClaim.
fn claim_of(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .resource_claim_statuses
        .as_ref()?
        .first()?
        .resource_claim_name
        .clone()
}

/// What the agent's own read of the kubelet's pod-resources API attributes to `pod`.
async fn agent_sees(cluster: &DevCluster, ns: &str, pod: &str) -> Option<Vec<String>> {
    use offload_agent::attribution::{devices_by_pod, list_pod_resources};
    use offload_agent::devices::{DRA_DRIVER, GPU_RESOURCE};
    let socket = cluster
        .kubelet_dir()
        .unwrap()
        .join("pod-resources/kubelet.sock");
    let pods = list_pod_resources(&socket, Duration::from_secs(10))
        .await
        .unwrap();
    devices_by_pod(&pods, GPU_RESOURCE, Some(DRA_DRIVER)).remove(&(ns.to_string(), pod.to_string()))
}

/// The agent's labels on the real node.
async fn node_labels(client: &kube::Client) -> Vec<String> {
    let node = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(REAL_NODE)
        .await
        .unwrap();
    node.metadata
        .labels
        .unwrap_or_default()
        .into_keys()
        .filter(|k| k.starts_with("offload.dev/"))
        .collect()
}

/// Prints how long the test has run at each step (for `docs/benchmarks/dra-node.md`).
struct Steps(std::time::Instant);

impl Steps {
    fn done(&self, what: &str) {
        eprintln!("step: {what} at {:.1} s", self.0.elapsed().as_secs_f64());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_prepared_by_the_kubelet_plugin_and_the_pod_runs_with_its_gpu() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: a real node needs root (kubelet, containerd, cgroups, iptables)");
        return;
    }
    let cluster = cluster(ClusterOptions::with_real_node());
    let steps = Steps(std::time::Instant::now());
    let client = client(cluster).await;
    apply_crds(&client).await;
    deploy::prepare_real_node(&client).await.unwrap();
    dra::device_class(&client).await.unwrap();
    // The agent's report of a PCIe H200 (recorded: the node has no GPU), written by the agent.
    let agent = workspace_binary("offload-agent");
    deploy::replay_report(cluster, &agent, REAL_NODE, "node-report-h200.json").unwrap();
    let profile: OffloadProfile = serde_json::from_value(json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "OffloadProfile",
        "metadata": {"name": "real-node-dra"},
        "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": REAL_NODE}}}
    }))
    .unwrap();
    let profiles: Api<OffloadProfile> = Api::all(client.clone());
    profiles
        .create(&PostParams::default(), &profile)
        .await
        .unwrap();
    let token = tokio_util::sync::CancellationToken::new();
    let operator = tokio::spawn(offload_operator::operator::run(
        client.clone(),
        operator_options(),
        token.clone(),
    ));

    // One GPU: a second job can run only once the first one's claim has freed it.
    let mut plugin = KubeletPlugin::start(
        cluster,
        "gpu-dra-standin",
        &PluginOptions {
            gpus: 1,
            ..PluginOptions::default()
        },
    )
    .unwrap();
    plugin.wait_for_line(&["registered"], WAIT).await.unwrap();
    steps.done("the plugin registered with the kubelet");
    let slices = resource_api(&client, None, "ResourceSlice");
    poll("the plugin's ResourceSlice of the real node", WAIT, || {
        let slices = slices.clone();
        async move {
            let list = slices.list(&ListParams::default()).await.ok()?;
            list.items.iter().find(|s| {
                s.data["spec"]["nodeName"] == REAL_NODE
                    && s.data["spec"]["driver"] == dra::DRIVER
                    && s.data["spec"]["devices"][0]["attributes"]["addressingMode"]["string"]
                        == "None"
            })?;
            Some(())
        }
    })
    .await;

    let ns = namespace(&client, "dra-node").await;
    let t: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpu", "namespace": ns},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpus", "exactly": {"deviceClassName": dra::DRIVER, "count": 1}}]}}}
    }))
    .unwrap();
    resource_api(&client, Some(&ns), "ResourceClaimTemplate")
        .create(&PostParams::default(), &t)
        .await
        .unwrap();
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);

    // The first job: decided for the discrete class, its claim pinned there.
    tjs.create(&PostParams::default(), &claiming_job("first"))
        .await
        .unwrap();
    let tj = wait_for_condition(&tjs, "first", "WorkloadCreated", "True").await;
    let decision = tj.status.unwrap().offload.unwrap();
    assert_eq!(
        serde_json::to_value(decision.mode).unwrap(),
        "CPUCopy",
        "{decision:?}"
    );
    let pinned = resource_api(&client, Some(&ns), "ResourceClaimTemplate")
        .get("first-gpus")
        .await
        .unwrap();
    let cel =
        pinned.data["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"].to_string();
    assert!(cel.contains("addressingMode"), "{cel}");

    // The kubelet has the plugin prepare the claim; the pod runs with what it prepared.
    let pod = job_pod(
        &client,
        &ns,
        "first",
        "the first job's pod Running",
        WAIT,
        is_running,
    )
    .await;
    steps.done("the first pod Running with its prepared claim");
    let pod_name = pod.metadata.name.clone().unwrap();
    let claim_name = claim_of(&pod).expect("the pod's generated claim");
    let claim = resource_api(&client, Some(&ns), "ResourceClaim")
        .get(&claim_name)
        .await
        .unwrap();
    let claim_uid = claim.metadata.uid.clone().unwrap();
    let result = &claim.data["status"]["allocation"]["devices"]["results"][0];
    assert_eq!(result["pool"], REAL_NODE, "{claim:?}");
    assert_eq!(result["device"], "gpu-0", "{claim:?}");
    let prepared = plugin
        .wait_for_line(
            &[
                "prepare ",
                &format!("claim={ns}/{claim_name}"),
                "devices=gpu-0",
            ],
            WAIT,
        )
        .await
        .unwrap();
    eprintln!("plugin: {prepared}");
    let spec_file = cluster
        .cdi_dir()
        .unwrap()
        .join(format!("gpu-dra-standin-{claim_uid}.json"));
    assert!(spec_file.is_file(), "{} is missing", spec_file.display());
    let printed = poll("the container's output", WAIT, || {
        let out = kubectl(cluster, &["-n", &ns, "logs", &pod_name]);
        async move { out.contains("GPU_DRA_STANDIN_CLAIM=").then_some(out) }
    })
    .await;
    assert!(
        printed.contains(&format!("NVIDIA_VISIBLE_DEVICES=GPU-{REAL_NODE}-0"))
            && printed.contains(&format!("GPU_DRA_STANDIN_CLAIM={claim_uid}")),
        "the container sees what the plugin prepared: {printed}"
    );
    // The agent's own pod-resources read attributes the DRA device to the pod.
    let seen = poll("the agent's pod-resources read of the pod", WAIT, || {
        agent_sees(cluster, &ns, &pod_name)
    })
    .await;
    assert_eq!(seen, vec!["gpu-0".to_string()]);
    steps.done("the agent's pod-resources read lists gpu-0 for the pod");

    // Deleting the job unprepares the claim and frees the GPU.
    tjs.delete("first", &DeleteParams::foreground())
        .await
        .unwrap();
    plugin
        .wait_for_line(&["unprepare ", &format!("uid={claim_uid}")], WAIT)
        .await
        .unwrap();
    assert!(!spec_file.exists(), "{} is left", spec_file.display());
    steps.done("the first claim unprepared");
    let claims = resource_api(&client, Some(&ns), "ResourceClaim");
    poll("the first claim deleted", WAIT, || {
        let claims = claims.clone();
        let name = claim_name.clone();
        async move { claims.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await;
    tjs.create(&PostParams::default(), &claiming_job("second"))
        .await
        .unwrap();
    let second = job_pod(
        &client,
        &ns,
        "second",
        "the second job's pod Running on the freed GPU",
        WAIT,
        is_running,
    )
    .await;
    let second_claim = claim_of(&second).unwrap();
    steps.done("the second pod Running on the freed GPU");
    plugin
        .wait_for_line(
            &[
                "prepare ",
                &format!("claim={ns}/{second_claim}"),
                "devices=gpu-0",
            ],
            WAIT,
        )
        .await
        .unwrap();
    tjs.delete("second", &DeleteParams::foreground())
        .await
        .unwrap();
    plugin
        .wait_for_line(&["unprepare ", &format!("claim={ns}/{second_claim}")], WAIT)
        .await
        .unwrap();

    // The plugin dies mid-prepare: the pod stays pending with the kubelet's message.
    plugin.kill();
    let mut hanging = KubeletPlugin::start(
        cluster,
        "gpu-dra-standin-hanging",
        &PluginOptions {
            gpus: 1,
            hang_on_prepare: true,
            ..PluginOptions::default()
        },
    )
    .unwrap();
    hanging.wait_for_line(&["registered"], WAIT).await.unwrap();
    tjs.create(&PostParams::default(), &claiming_job("third"))
        .await
        .unwrap();
    hanging
        .wait_for_line(
            &["prepare ", &format!("claim={ns}/third-"), "hanging"],
            WAIT,
        )
        .await
        .unwrap();
    hanging.kill();
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let message = poll(
        "the kubelet's FailedPrepareDynamicResources Event",
        WAIT,
        || {
            let events = events.clone();
            async move {
                let list = events.list(&ListParams::default()).await.ok()?;
                list.items
                    .into_iter()
                    .find(|e| e.reason.as_deref() == Some("FailedPrepareDynamicResources"))
                    .and_then(|e| e.message)
            }
        },
    )
    .await;
    eprintln!("kubelet: {message}");
    steps.done("the kubelet's FailedPrepareDynamicResources after the plugin died");
    assert!(message.contains("prepare dynamic resources"), "{message}");
    let third = job_pod(&client, &ns, "third", "the third job's pod", WAIT, |p| {
        claim_of(p).is_some()
    })
    .await;
    assert_eq!(phase(&third), Some("Pending"), "{:?}", third.status);
    // A plugin that comes back prepares the claim, and the pod starts.
    let mut plugin = KubeletPlugin::start(
        cluster,
        "gpu-dra-standin-again",
        &PluginOptions {
            gpus: 1,
            ..PluginOptions::default()
        },
    )
    .unwrap();
    plugin.wait_for_line(&["registered"], WAIT).await.unwrap();
    // Nothing in the operator broke meanwhile: it still decides, and the job's status is as
    // it was.
    let tj = wait_for_condition(&tjs, "third", "WorkloadCreated", "True").await;
    assert!(tj.status.unwrap().offload.is_some());
    tjs.create(&PostParams::default(), &claiming_job("fourth"))
        .await
        .unwrap();
    wait_for_condition(&tjs, "fourth", "OffloadResolved", "True").await;
    tjs.delete("fourth", &DeleteParams::background())
        .await
        .unwrap();
    job_pod(
        &client,
        &ns,
        "third",
        "the third job's pod Running once the plugin is back",
        KUBELET_RETRY,
        is_running,
    )
    .await;
    steps.done("the third pod Running once the plugin is back");
    tjs.delete("third", &DeleteParams::foreground())
        .await
        .unwrap();
    plugin
        .wait_for_line(&["unprepare ", &format!("claim={ns}/third-")], WAIT)
        .await
        .unwrap();
    plugin.kill();

    // A slice the operator cannot believe: 300 GPUs of an addressing mode no driver writes.
    // Without the agent's report (as where no agent runs), the slices alone would speak for
    // the node: they are set aside, and the profile says why.
    let mut forget = serde_json::Map::new();
    for key in node_labels(&client).await {
        forget.insert(key, serde_json::Value::Null);
    }
    Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .patch(
            REAL_NODE,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"metadata": {
                "labels": forget,
                "annotations": {names::ANNOTATION_NODE_REPORT: null}}})),
        )
        .await
        .unwrap();
    let mut bad = KubeletPlugin::start(
        cluster,
        "gpu-dra-standin-bad",
        &PluginOptions {
            gpus: 300,
            gpu: StandInGpu {
                addressing_mode: Some("QUANTUM".into()),
                ..StandInGpu::h200()
            },
            hang_on_prepare: false,
        },
    )
    .unwrap();
    bad.wait_for_line(&["published", "devices=300"], WAIT)
        .await
        .unwrap();
    let message = poll("the profile to set the real node aside", WAIT, || {
        let profiles = profiles.clone();
        async move {
            let p = profiles.get("real-node-dra").await.ok()?;
            let ready = p
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            (ready.message.contains(REAL_NODE) && ready.message.contains("set aside"))
                .then_some(ready.message)
        }
    })
    .await;
    eprintln!("profile: {message}");
    steps.done("the unbelievable slices set aside");
    bad.kill();

    token.cancel();
    operator.await.unwrap().unwrap();
}
