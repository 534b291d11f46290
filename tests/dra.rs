//! Dynamic Resource Allocation against the real API server, controller-manager (which makes
//! each pod's ResourceClaim from its template) and kube-scheduler (which allocates claims from
//! ResourceSlices): a stand-in for NVIDIA's DRA driver publishes slices for simulated (kwok)
//! nodes, some of which also carry a recorded agent report. TrainingJobs claim GPUs through
//! ResourceClaimTemplates; the operator sizes them by their claims and pins them to the
//! decided class with a copy of each template that selects only that class's GPUs.

use offload_testenv::support;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use offload_api::names;
use offload_api::v1alpha1::{OffloadProfile, TrainingJob};
use offload_testenv::deploy;
use offload_testenv::devcluster::ClusterOptions;
use offload_testenv::dra::{self, StandInGpu};
use offload_testenv::fixtures;
use serde_json::json;
use support::controller::{condition_when, wait_for_condition};
use support::*;

const WAIT: Duration = Duration::from_secs(120);

/// A simulated node whose GPUs are handed out by DRA only: no `nvidia.com/gpu` allocatable.
/// With a recorded report (and the agent's labels) when `fixture` is given.
fn dra_node(name: &str, fixture: Option<&str>, pool: &str) -> Node {
    let mut node = match fixture {
        Some(f) => reported_node(name, f, pool),
        None => kwok_node(name, &[("offload.dev/test-pool", pool)], &[]),
    };
    if let Some(status) = node.status.as_mut() {
        for list in [status.allocatable.as_mut(), status.capacity.as_mut()]
            .into_iter()
            .flatten()
        {
            list.remove(names::GPU_RESOURCE);
        }
    }
    node
}

/// `resource.k8s.io/v1` objects of `kind` in `ns`.
fn resource_api(client: &kube::Client, ns: &str, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1", kind);
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

fn templates(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    resource_api(client, ns, "ResourceClaimTemplate")
}

fn claims(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    resource_api(client, ns, "ResourceClaim")
}

/// A ResourceClaimTemplate asking for `count` whole GPUs.
async fn gpu_template(client: &kube::Client, ns: &str, name: &str, count: u32) {
    let t: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpus", "exactly": {"deviceClassName": dra::DRIVER, "count": count}}]}}}
    }))
    .unwrap();
    templates(client, ns)
        .create(&PostParams::default(), &t)
        .await
        .unwrap();
}

/// A one-pod TrainingJob whose GPUs come from template `template`.
fn claiming_job(name: &str, profile: &str, template: &str) -> TrainingJob {
    serde_json::from_value(json!({
        "apiVersion": "offload.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name, "annotations": {names::PROFILE_ANNOTATION: profile}},
        "spec": {"replicas": 1, "framework": {"name": "DeepSpeed", "version": "0.19.8"},
                 // kwok completes Job pods at once unless told to keep them running: the
                 // claim lives as long as the pod.
                 "template": {"metadata": {"annotations": {deploy::KWOK_KEEP_RUNNING: "true"}},
                              "spec": {
                     "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}],
                     "containers": [{"name": "train", "image": "train:1",
                                     "resources": {"claims": [{"name": "gpus"}]}}]}}}
    }))
    .unwrap()
}

/// The node and the pool of every device allocated to the job's pod's claim, once the
/// scheduler has allocated it and bound the pod.
async fn allocation(client: &kube::Client, ns: &str, job: &str) -> (String, Vec<String>) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod = wait_list(
        pods,
        kube::runtime::watcher::Config::default()
            .labels(&format!("{}={job}", names::LABEL_TRAINING_JOB)),
        &format!("the pod of {job} bound"),
        WAIT,
        |pods| {
            pods.iter()
                .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
                .map(|p| Pod::clone(p))
        },
    )
    .await;
    let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
    let claim_name = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.resource_claim_name.clone())
        .expect("the pod's claim");
    let claim = claims(client, ns).get(&claim_name).await.unwrap();
    let pools = claim.data["status"]["allocation"]["devices"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["pool"].as_str().unwrap().to_string())
        .collect();
    (node, pools)
}

/// Creates [`claiming_job`] through `tjs`.
async fn create_claiming(tjs: &Api<TrainingJob>, name: &str, profile: &str, template: &str) {
    tjs.create(
        &PostParams::default(),
        &claiming_job(name, profile, template),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_are_sized_pinned_to_the_class_and_allocated_there_only() {
    let cluster = cluster(ClusterOptions::full());
    let client = client(cluster).await;
    operator(cluster);
    let ns = namespace(&client, "dra").await;
    let node = |suffix: &str| format!("{ns}-{suffix}");
    dra::device_class(&client).await.unwrap();
    five_nodes_as_agent_and_driver_describe_them(&client, &ns).await;

    let profiles: Api<OffloadProfile> = Api::all(client.clone());
    for (name, extra) in [
        (format!("{ns}-any"), json!({})),
        (format!("{ns}-copy"), json!({"mode": "CPUCopy"})),
    ] {
        profiles
            .create(&PostParams::default(), &pool_profile(&name, &ns, extra))
            .await
            .unwrap();
    }
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let bound = a_held_job_resolves_pinned_to_ats_gpus(&client, &ns, &tjs).await;
    the_coherent_nodes_fill_and_the_disagreeing_one_stays_out(&client, &ns, &tjs, &bound).await;

    // A discrete job: its claim lands on the H200 node only.
    create_claiming(&tjs, "discrete", &format!("{ns}-copy"), "four-gpus").await;
    let (on, pools) = allocation(&client, &ns, "discrete").await;
    assert_eq!(on, node("h200"));
    assert!(pools.iter().all(|p| *p == on));

    the_profile_names_the_disagreeing_node(&profiles, &ns).await;

    // Sized by its claims: 16 GPUs a pod fit no node of four.
    gpu_template(&client, &ns, "sixteen-gpus", 16).await;
    create_claiming(&tjs, "too-big", &format!("{ns}-any"), "sixteen-gpus").await;
    let cond = condition_when(&tjs, "too-big", "OffloadResolved", "False").await;
    assert_eq!(cond.reason, "InsufficientGPUs", "{}", cond.message);
    assert!(cond.message.contains("16"), "{}", cond.message);
}

/// A GH200 node (agent and driver agree: ATS), an H200 node (agree: None), a node only the
/// driver describes (ATS, no agent yet), one whose witnesses disagree (the agent measured a
/// discrete H200, the driver says ATS) and one whose slices do not read; four GPUs each.
async fn five_nodes_as_agent_and_driver_describe_them(client: &kube::Client, ns: &str) {
    let node = |suffix: &str| format!("{ns}-{suffix}");
    let nodes: Api<Node> = Api::all(client.clone());
    for (n, fixture) in [
        (node("gh200"), Some(fixtures::GH200_REFERENCE)),
        (node("h200"), Some(fixtures::H200_READING)),
        (node("driver-only"), None),
        (node("disagree"), Some(fixtures::H200_READING)),
        (node("bad"), None),
    ] {
        nodes
            .create(&PostParams::default(), &dra_node(&n, fixture, ns))
            .await
            .unwrap();
    }
    let four = |g: fn() -> StandInGpu| vec![g(); 4];
    dra::publish(client, &node("gh200"), &four(StandInGpu::gh200))
        .await
        .unwrap();
    dra::publish(client, &node("h200"), &four(StandInGpu::h200))
        .await
        .unwrap();
    dra::publish(client, &node("driver-only"), &four(StandInGpu::gh200))
        .await
        .unwrap();
    dra::publish(client, &node("disagree"), &four(StandInGpu::gh200))
        .await
        .unwrap();
    // 300 GPUs with an addressing mode no driver writes: not believed, and nothing else moves.
    let bad = StandInGpu {
        addressing_mode: Some("QUANTUM".into()),
        ..StandInGpu::gh200()
    };
    dra::publish(client, &node("bad"), &vec![bad; 300])
        .await
        .unwrap();
}

/// A job whose template does not exist yet is held, and resolves once it is created; the
/// operator's copy of the template selects only ATS GPUs, the pods name it, and the scheduler
/// allocates the claim on a coherent node. The node it is bound to.
async fn a_held_job_resolves_pinned_to_ats_gpus(
    client: &kube::Client,
    ns: &str,
    tjs: &Api<TrainingJob>,
) -> String {
    let node = |suffix: &str| format!("{ns}-{suffix}");
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    create_claiming(tjs, "early", &format!("{ns}-any"), "four-gpus").await;
    // Held for its missing template (the operator may first see the job before the profile).
    let held = wait(
        "early held for its claim template",
        WAIT,
        kube::runtime::wait::await_condition(tjs.clone(), "early", |tj: Option<&TrainingJob>| {
            tj.and_then(|t| t.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "OffloadResolved" && c.reason == "ClaimTemplateNotFound")
            })
        }),
    )
    .await;
    assert!(held.is_ok());
    gpu_template(client, ns, "four-gpus", 4).await;
    let resolved = wait_for_condition(tjs, "early", "OffloadResolved", "True").await;
    let decision = resolved.status.unwrap().offload.unwrap();
    assert_eq!(
        serde_json::to_value(decision.mode).unwrap(),
        "UnifiedMemory",
        "coherent nodes first"
    );
    let reasons = serde_json::to_string(&decision.reasons).unwrap();
    assert!(reasons.contains("DRA claims"), "{reasons}");
    assert!(
        reasons.contains(&node("disagree")),
        "the excluded node is named: {reasons}"
    );

    // The operator's copy of the template selects only ATS GPUs, and the pods name it.
    let pinned = templates(client, ns).get("early-gpus").await.unwrap();
    let selectors = &pinned.data["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"];
    assert!(
        selectors[0]["cel"]["expression"]
            .as_str()
            .unwrap()
            .contains("== \"ATS\""),
        "{selectors}"
    );
    let job = jobs.get("early").await.unwrap();
    let pod_spec = job.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        pod_spec.resource_claims.unwrap()[0]
            .resource_claim_template_name
            .as_deref(),
        Some("early-gpus")
    );
    let affinity = serde_json::to_string(&pod_spec.affinity).unwrap();
    assert!(
        !affinity.contains(names::LABEL_UMA),
        "no agent labels: the driver-only node has none: {affinity}"
    );

    // The scheduler allocates the claim on a coherent node only.
    let coherent = [node("gh200"), node("driver-only")];
    let (bound, pools) = allocation(client, ns, "early").await;
    assert!(coherent.contains(&bound), "bound to {bound}");
    assert!(pools.iter().all(|p| *p == bound), "{pools:?} on {bound}");

    bound
}

/// A second coherent job takes the other coherent node; a third waits rather than land on the
/// node whose driver says ATS but whose agent measured a discrete GPU. (One after the other:
/// created together, the third could take the free node first.)
async fn the_coherent_nodes_fill_and_the_disagreeing_one_stays_out(
    client: &kube::Client,
    ns: &str,
    tjs: &Api<TrainingJob>,
    bound: &str,
) {
    let node = |suffix: &str| format!("{ns}-{suffix}");
    let coherent = [node("gh200"), node("driver-only")];
    create_claiming(tjs, "second", &format!("{ns}-any"), "four-gpus").await;
    let (second, _) = allocation(client, ns, "second").await;
    assert!(
        coherent.contains(&second) && second != bound,
        "second on {second}"
    );
    create_claiming(tjs, "third", &format!("{ns}-any"), "four-gpus").await;
    wait_for_condition(tjs, "third", "WorkloadCreated", "True").await;
    let third_pod = wait_list(
        Api::<Pod>::namespaced(client.clone(), ns),
        kube::runtime::watcher::Config::default()
            .labels(&format!("{}=third", names::LABEL_TRAINING_JOB)),
        "the third job's pod unschedulable",
        WAIT,
        |pods| {
            pods.iter()
                .find(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| {
                            c.iter().any(|c| {
                                c.type_ == "PodScheduled"
                                    && c.status == "False"
                                    && c.reason.as_deref() == Some("Unschedulable")
                            })
                        })
                })
                .map(|p| Pod::clone(p))
        },
    )
    .await;
    assert!(
        third_pod.spec.as_ref().unwrap().node_name.is_none(),
        "never on {}",
        node("disagree")
    );
}

/// The profile's status names the node whose witnesses disagree, and why.
async fn the_profile_names_the_disagreeing_node(profiles: &Api<OffloadProfile>, ns: &str) {
    let node = |suffix: &str| format!("{ns}-{suffix}");
    let any = wait(
        "the profile's status to name the disagreeing node",
        WAIT,
        kube::runtime::wait::await_condition(
            profiles.clone(),
            &format!("{ns}-any"),
            |p: Option<&OffloadProfile>| {
                p.and_then(|p| p.status.as_ref())
                    .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
                    .is_some_and(|c| c.message.contains("GPU driver"))
            },
        ),
    )
    .await
    .unwrap()
    .unwrap();
    let ready = any
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert!(
        ready.message.contains(&node("disagree")),
        "{}",
        ready.message
    );
    // The node whose only slices are set aside (300 devices of an unknown mode) is named with
    // the driver's reason, not counted as a node without an agent.
    assert!(
        ready.message.contains(&node("bad")) && ready.message.contains("set aside"),
        "{}",
        ready.message
    );
}

/// On a cluster of mixed 80 GB and 141 GB GPUs of one class, a job that fits a 141 GB GPU
/// without offload, and an 80 GB one only with offload, is decided without offload and its
/// claims select GPUs by memory: the scheduler allocates only the large GPUs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_are_sized_by_memory_on_mixed_gpus() {
    let cluster = cluster(ClusterOptions::full());
    let client = client(cluster).await;
    operator(cluster);
    let ns = namespace(&client, "dramem").await;
    let node = |suffix: &str| format!("{ns}-{suffix}");
    dra::device_class(&client).await.unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    for (n, gpu) in [("h100", StandInGpu::h100()), ("h200", StandInGpu::h200())] {
        nodes
            .create(&PostParams::default(), &dra_node(&node(n), None, &ns))
            .await
            .unwrap();
        dra::publish(&client, &node(n), &vec![gpu; 2])
            .await
            .unwrap();
    }
    Api::<OffloadProfile>::all(client.clone())
        .create(
            &PostParams::default(),
            &pool_profile(&format!("{ns}-any"), &ns, json!({})),
        )
        .await
        .unwrap();
    gpu_template(&client, &ns, "one-gpu", 1).await;
    // Mistral-7B's shape at 2048 tokens: 122 GiB without offload.
    let mut job = claiming_job("mistral", &format!("{ns}-any"), "one-gpu");
    job.spec.model = Some(
        serde_json::from_value(json!({
            "architecture": "Llama", "hiddenSize": 4096, "layers": 32, "intermediateSize": 14336,
            "attentionHeads": 32, "keyValueHeads": 8, "vocabSize": 32000, "tokensPerStep": 2048
        }))
        .unwrap(),
    );
    let tjs: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    tjs.create(&PostParams::default(), &job).await.unwrap();
    let resolved = wait_for_condition(&tjs, "mistral", "WorkloadCreated", "True").await;
    let decision = resolved.status.unwrap().offload.unwrap();
    assert_eq!(serde_json::to_value(decision.mode).unwrap(), "Disabled");
    let reasons = serde_json::to_string(&decision.reasons).unwrap();
    assert!(reasons.contains("select GPUs by memory"), "{reasons}");
    let pinned = templates(&client, &ns).get("mistral-gpus").await.unwrap();
    let selectors = pinned.data["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
        .as_array()
        .unwrap()
        .clone();
    assert!(
        selectors.iter().any(|s| s["cel"]["expression"]
            .as_str()
            .unwrap_or_default()
            .contains("memory.compareTo")),
        "{selectors:?}"
    );
    let (on, pools) = allocation(&client, &ns, "mistral").await;
    assert_eq!(on, node("h200"), "only a large enough GPU is allocated");
    assert!(pools.iter().all(|p| *p == on));
    // Two more such jobs: one takes the other 141 GB GPU, the other waits — the 80 GB GPUs are
    // never allocated to them (which of the two waits is the scheduler's order).
    for name in ["mistral-2", "mistral-3"] {
        let mut j = job.clone();
        j.metadata.name = Some(name.into());
        tjs.create(&PostParams::default(), &j).await.unwrap();
    }
    let (bound, waiting) = wait_list(
        Api::<Pod>::namespaced(client.clone(), &ns),
        kube::runtime::watcher::Config::default().labels(names::LABEL_TRAINING_JOB),
        "three pods: two on the 141 GB GPUs, one unschedulable",
        WAIT,
        |pods| {
            let bound: Vec<String> = pods
                .iter()
                .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                .collect();
            let waiting = pods
                .iter()
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| {
                            c.iter().any(|c| {
                                c.type_ == "PodScheduled"
                                    && c.reason.as_deref() == Some("Unschedulable")
                            })
                        })
                })
                .count();
            (bound.len() == 2 && waiting == 1).then_some((bound, waiting))
        },
    )
    .await;
    assert!(bound.iter().all(|n| *n == node("h200")), "{bound:?}");
    assert_eq!(waiting, 1);
}
