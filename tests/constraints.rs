//! The pod's constraints and the scheduler's view agree with the decision, against the real
//! API server, controller-manager and kube-scheduler (simulated kwok nodes): the template's
//! nodeSelector, required affinity and tolerations narrow the candidates, and the host memory
//! the decision counts on is a request kube-scheduler sees.

use offload_testenv::support;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use offload_api::names;
use offload_api::v1alpha1::TrainingJob;
use offload_testenv::fixtures;
use serde_json::json;
use support::controller::*;
use support::*;

/// The pods of TrainingJob `job`, once `check` accepts them.
async fn pods_of<T>(
    client: &kube::Client,
    ns: &str,
    job: &str,
    what: &str,
    check: impl Fn(&[std::sync::Arc<Pod>]) -> Option<T>,
) -> T {
    wait_list(
        Api::<Pod>::namespaced(client.clone(), ns),
        kube::runtime::watcher::Config::default()
            .labels(&format!("{}={job}", names::LABEL_TRAINING_JOB)),
        what,
        WAIT,
        check,
    )
    .await
}

fn bound_nodes(pods: &[std::sync::Arc<Pod>]) -> Vec<String> {
    pods.iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect()
}

fn one_pod(mut tj: TrainingJob) -> TrainingJob {
    tj.spec.replicas = 1;
    tj.spec.template.metadata = Some(
        serde_json::from_value(
            json!({"annotations": {offload_testenv::deploy::KWOK_KEEP_RUNNING: "true"}}),
        )
        .unwrap(),
    );
    tj
}

#[tokio::test]
async fn the_templates_constraints_choose_the_class_and_the_pods_land_there() {
    let (_cluster, client, ns) = setup("constraints").await;
    add_node(&client, &ns, "gh200", fixtures::GH200_REFERENCE).await;
    add_node(&client, &ns, "h200", fixtures::H200_READING).await;
    add_profile(&client, &ns).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let ds = json!({"name": "DeepSpeed", "version": "0.19.8"});
    let forms = [
        (
            "selector",
            json!({"nodeSelector": {names::LABEL_UMA: "false"}}),
        ),
        (
            "notin",
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": names::LABEL_UMA, "operator": "NotIn", "values": ["true"]}]}]}}}}),
        ),
        (
            "in",
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [format!("{ns}-h200")]}]}]}}}}),
        ),
    ];
    for (name, pod_fields) in forms {
        let mut tj = one_pod(training_job(name, &ns, ds.clone(), json!({})));
        let spec = tj.spec.template.spec.as_mut().unwrap();
        let mut value = serde_json::to_value(&*spec).unwrap();
        for (k, v) in pod_fields.as_object().unwrap() {
            value[k] = v.clone();
        }
        *spec = serde_json::from_value(value).unwrap();
        api.create(&PostParams::default(), &tj).await.unwrap();
        let resolved = wait_for_condition(&api, name, "WorkloadCreated", "True").await;
        assert_eq!(
            resolved.spec.offload.mode,
            offload_api::v1alpha1::ModeSetting::CpuCopy,
            "{name}"
        );
        let on = pods_of(&client, &ns, name, &format!("{name}'s pod bound"), |pods| {
            let n = bound_nodes(pods);
            (!n.is_empty()).then_some(n)
        })
        .await;
        assert_eq!(on, vec![format!("{ns}-h200")], "{name}");
    }

    // A taint the template does not tolerate on the only node it selects: held, naming it.
    let tainted: Api<Node> = Api::all(client.clone());
    let mut node = reported_node(&format!("{ns}-h200b"), fixtures::H200_READING, &ns);
    node.spec = Some(
        serde_json::from_value(json!({"taints": [
        {"key": "team", "value": "ml", "effect": "NoSchedule"}]}))
        .unwrap(),
    );
    node.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("pool".into(), "b".into());
    tainted.create(&PostParams::default(), &node).await.unwrap();
    let mut tj = one_pod(training_job("untolerated", &ns, ds.clone(), json!({})));
    tj.spec.template.spec.as_mut().unwrap().node_selector =
        Some([("pool".to_string(), "b".to_string())].into());
    api.create(&PostParams::default(), &tj).await.unwrap();
    let cond = condition_when(&api, "untolerated", "OffloadResolved", "False").await;
    assert_eq!(cond.reason, "TemplateLeavesNoNodes", "{}", cond.message);
    assert!(
        cond.message
            .contains("taint team=ml:NoSchedule is not tolerated"),
        "{}",
        cond.message
    );
    assert!(
        cond.message.contains("has no label pool"),
        "{}",
        cond.message
    );

    // GPU nodes tainted nvidia.com/gpu=present:NoSchedule, on an API server that does not run
    // ExtendedResourceToleration (this one): a template without the toleration is held, naming
    // the taint and both fixes, not counted on a toleration nothing adds.
    let mut node = reported_node(&format!("{ns}-h200g"), fixtures::H200_READING, &ns);
    node.spec = Some(
        serde_json::from_value(json!({"taints": [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}))
        .unwrap(),
    );
    node.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("pool".into(), "g".into());
    tainted.create(&PostParams::default(), &node).await.unwrap();
    let mut tj = one_pod(training_job("gpu-taint", &ns, ds.clone(), json!({})));
    tj.spec.template.spec.as_mut().unwrap().node_selector =
        Some([("pool".to_string(), "g".to_string())].into());
    api.create(&PostParams::default(), &tj).await.unwrap();
    let cond = condition_when(&api, "gpu-taint", "OffloadResolved", "False").await;
    assert_eq!(cond.reason, "TemplateLeavesNoNodes", "{}", cond.message);
    assert!(
        cond.message
            .contains("taint nvidia.com/gpu=present:NoSchedule is not tolerated")
            && cond.message.contains("operator.extendedResourceToleration"),
        "{}",
        cond.message
    );
}

#[tokio::test]
async fn the_host_memory_counted_on_is_a_request_the_scheduler_sees() {
    let (_cluster, client, ns) = setup("hostmem").await;
    // One H200 node of 2 GPUs and 200 GiB: one offloaded 10.7B pod fits, two do not.
    let mut node = reported_node(&format!("{ns}-h200"), fixtures::H200_READING, &ns);
    let status = node.status.as_mut().unwrap();
    for list in [status.allocatable.as_mut(), status.capacity.as_mut()]
        .into_iter()
        .flatten()
    {
        list.insert(
            "memory".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("200Gi".into()),
        );
        list.insert(
            names::GPU_RESOURCE.into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("2".into()),
        );
    }
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    add_profile(&client, &ns).await;
    let api: Api<TrainingJob> = Api::namespaced(client.clone(), &ns);
    let model = json!({"model": {"architecture": "Llama", "hiddenSize": 4096, "layers": 48,
        "intermediateSize": 14336, "attentionHeads": 32, "keyValueHeads": 8, "vocabSize": 32000,
        "tokensPerStep": 2048}});
    for name in ["first", "second"] {
        let tj = one_pod(training_job(
            name,
            &ns,
            json!({"name": "DeepSpeed", "version": "0.19.8"}),
            model.clone(),
        ));
        api.create(&PostParams::default(), &tj).await.unwrap();
        wait_for_condition(&api, name, "WorkloadCreated", "True").await;
    }
    let first = wait_for_condition(&api, "first", "WorkloadCreated", "True").await;
    let reasons = serde_json::to_string(&first.status.unwrap().offload.unwrap().reasons).unwrap();
    assert!(reasons.contains("the training container"), "{reasons}");
    // The request is on the pod's container, as written by the operator.
    let request = pods_of(&client, &ns, "first", "first's pod", |pods| {
        pods.first().and_then(|p| {
            p.spec.as_ref()?.containers[0]
                .resources
                .as_ref()?
                .requests
                .as_ref()?
                .get("memory")
                .cloned()
        })
    })
    .await;
    let bytes = offload_api::quantity::bytes(&request).unwrap();
    assert!(bytes > 100 << 30 && bytes < 200 << 30, "{request:?}");
    // One pod runs, the other waits: the scheduler counts the memory.
    let (bound, waiting) = wait_list(
        Api::<Pod>::namespaced(client.clone(), &ns),
        kube::runtime::watcher::Config::default().labels(names::LABEL_TRAINING_JOB),
        "one pod bound and one unschedulable for memory",
        WAIT,
        |pods| {
            let bound = pods
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
                .count();
            let waiting: Vec<String> = pods
                .iter()
                .filter_map(|p| {
                    p.status
                        .as_ref()?
                        .conditions
                        .as_ref()?
                        .iter()
                        .find(|c| {
                            c.type_ == "PodScheduled"
                                && c.reason.as_deref() == Some("Unschedulable")
                        })?
                        .message
                        .clone()
                })
                .collect();
            (bound == 1 && waiting.len() == 1).then_some((bound, waiting))
        },
    )
    .await;
    assert_eq!(bound, 1);
    assert!(waiting[0].contains("Insufficient memory"), "{waiting:?}");
}
