//! The agent's report, written to a real API server's Node, is exactly what the operator's
//! decision engine reads; the agent owns only its own keys and removes them on uninstall.

use offload_testenv::support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use offload_agent::probe::{NvmlSource, RealNvml, RecordedNvml};
use offload_agent::{assemble, daemon};
use offload_api::names;
use offload_api::report::NodeReport;
use offload_api::v1alpha1::{OffloadMode, OffloadProfileSpec};
use offload_operator::decision::{JobRequest, resolve_offload};
use offload_operator::index::{NodeIndex, NodeInfo};
use offload_testenv::devcluster::ClusterOptions;
use offload_testenv::fixtures;

fn plain_node(name: &str, labels: &[(&str, &str)]) -> Node {
    let mut node = Node::default();
    node.metadata.name = Some(name.to_string());
    node.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    node
}

fn view(node: &Node) -> NodeInfo {
    NodeInfo::from_metadata(
        node.metadata.name.clone().unwrap(),
        node.metadata.labels.clone().unwrap_or_default(),
        node.metadata
            .annotations
            .as_ref()
            .unwrap_or(&BTreeMap::new()),
    )
}

#[tokio::test]
async fn a_published_report_is_what_the_decision_reads_and_cleanup_removes_only_ours() {
    let cluster = support::cluster(ClusterOptions::default());
    let client = support::client(cluster).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let name = format!("agent-gh200-{}", std::process::id());
    // A label another component (GPU Feature Discovery) owns.
    nodes
        .create(
            &PostParams::default(),
            &plain_node(&name, &[("nvidia.com/gpu.product", "NVIDIA-GH200-480GB")]),
        )
        .await
        .unwrap();

    // Stand-in for the GH200 this project does not have: the recorded reading plus its self-test.
    let source = RecordedNvml::from_report(fixtures::GH200_REFERENCE).unwrap();
    let recorded = NodeReport::parse(fixtures::GH200_REFERENCE).unwrap();
    let report = assemble::assemble(&name, source.read(), recorded.selftest.clone());
    daemon::publish(&client, &report).await.unwrap();

    let stored = nodes.get(&name).await.unwrap();
    let info = view(&stored);
    assert_eq!(
        info.parsed_report(),
        Some(&report),
        "the operator parses exactly what the agent wrote"
    );
    let labels = stored.metadata.labels.clone().unwrap();
    assert_eq!(labels[names::LABEL_UMA], "true");
    assert_eq!(labels[names::LABEL_OVERLAP], "verified");
    assert_eq!(
        labels["nvidia.com/gpu.product"], "NVIDIA-GH200-480GB",
        "others' labels untouched"
    );

    // One pod of one GPU, framework Generic, everything else left to the operator.
    let job = JobRequest::default();
    let res = resolve_offload(
        &job,
        "default",
        &OffloadProfileSpec::default(),
        &NodeIndex::new(vec![info]),
    )
    .unwrap();
    assert_eq!(res.mode, OffloadMode::UnifiedMemory);
    assert!(res.overlap);

    // Publishing again (a re-run) converges; cleanup removes our keys and nothing else.
    daemon::publish(&client, &report).await.unwrap();
    daemon::remove(&client, &name).await.unwrap();
    let after = nodes.get(&name).await.unwrap();
    offload_testenv::support::assert_agent_left_nothing_on(&after);
    assert_eq!(
        after.metadata.labels.unwrap_or_default()["nvidia.com/gpu.product"],
        "NVIDIA-GH200-480GB"
    );
}

#[tokio::test]
async fn this_machine_is_reported_truthfully_whatever_it_has() {
    let cluster = support::cluster(ClusterOptions::default());
    let client = support::client(cluster).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let name = format!("agent-local-{}", std::process::id());
    nodes
        .create(&PostParams::default(), &plain_node(&name, &[]))
        .await
        .unwrap();
    // The real NVML: on a machine without a driver the report says so and labels are safe.
    let report = assemble::build(&name, &RealNvml, &Default::default(), Default::default());
    daemon::publish(&client, &report).await.unwrap();
    let stored = nodes.get(&name).await.unwrap();
    let info = view(&stored);
    assert_eq!(info.parsed_report(), Some(&report));
    if !report.nvml.available {
        eprintln!(
            "no NVML here: {}",
            report.nvml.error.clone().unwrap_or_default()
        );
        let labels = stored.metadata.labels.unwrap_or_default();
        assert!(!labels.contains_key(names::LABEL_UMA), "{labels:?}");
        assert_eq!(labels[names::LABEL_OVERLAP], "untested");
        // And the operator never takes a node without NVML for a GPU node of either class.
        assert_eq!(info.class(), None);
        let why = info.ignored_because().unwrap();
        assert!(why.contains("NVML could not be read"), "{why}");
    }
}

/// A recorded utilization trace (a stand-in for GPUs that are not here): each sample, GPU `i`
/// is `busy[i]` percent busy.
struct RecordedTrace {
    busy: Vec<u32>,
}

impl offload_agent::utilization::UtilizationSource for RecordedTrace {
    fn utilization(&self, devices: &[u32]) -> Result<Vec<(u32, u32)>, String> {
        Ok(devices
            .iter()
            .filter_map(|&i| Some((i, *self.busy.get(i as usize)?)))
            .collect())
    }
}

#[tokio::test]
async fn observations_of_configured_pods_are_published_and_cleared() {
    use k8s_openapi::api::core::v1::Pod;
    use offload_agent::attribution;
    use offload_api::observed::{BusySource, ObservedSummary};
    use std::time::Duration;

    let cluster = support::cluster(ClusterOptions::default());
    let client = support::client(cluster).await;
    let ns = support::namespace(&client, "observe").await;
    let node = format!("agent-observe-{}", std::process::id());
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &plain_node(&node, &[]))
        .await
        .unwrap();
    // Two pods bound to the node: one the operator configured (a TrainingJob's pod), one not.
    let pod = |name: &str, configured: bool| -> Pod {
        let mut meta = serde_json::json!({"name": name, "namespace": ns});
        if configured {
            meta["annotations"] = serde_json::json!({names::ANNOTATION_RESOLVED: "mode=CPUCopy"});
            meta["labels"] = serde_json::json!({names::LABEL_TRAINING_JOB: "llama"});
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}
        }))
        .unwrap()
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for (name, configured) in [("llama-0", true), ("other", false)] {
        pods.create(&PostParams::default(), &pod(name, configured))
            .await
            .unwrap();
    }
    // What the kubelet's pod-resources API would say: both hold GPUs.
    let assigned = BTreeMap::from([
        (
            (ns.clone(), "llama-0".to_string()),
            vec!["GPU-1".to_string(), "GPU-0".to_string()],
        ),
        ((ns.clone(), "other".to_string()), vec!["GPU-2".to_string()]),
    ]);
    let cgroups = tempfile::tempdir().unwrap();
    let found = attribution::configured_pods(&client, &node, &assigned, cgroups.path())
        .await
        .unwrap();
    assert_eq!(found.len(), 1, "only the configured pod: {found:?}");
    assert_eq!(found[0].training_job.as_deref(), Some("llama"));

    let trace = RecordedTrace {
        busy: vec![90, 50, 10],
    };
    let resolve = |id: &str| id.strip_prefix("GPU-")?.parse().ok();
    let summary = attribution::summarize(
        &node,
        &found,
        &trace,
        &resolve,
        Duration::from_millis(50),
        Duration::from_millis(10),
        BusySource::RecordedTrace,
    )
    .unwrap();
    attribution::publish_observed(&client, &summary)
        .await
        .unwrap();
    let published = Api::<Node>::all(client.clone()).get(&node).await.unwrap();
    let text = published.metadata.annotations.as_ref().unwrap()[names::ANNOTATION_OBSERVED].clone();
    let read = ObservedSummary::parse(&text).unwrap();
    assert_eq!(read.pods.len(), 1);
    assert_eq!(read.pods_of(&ns, "llama").count(), 1);
    assert_eq!(read.pods[0].gpu_busy, 0.7, "mean of its two GPUs");
    assert_eq!(read.source, BusySource::RecordedTrace);

    // Its pods gone: an empty window removes the annotation and nothing else.
    let empty = attribution::summarize(
        &node,
        &[],
        &trace,
        &resolve,
        Duration::ZERO,
        Duration::ZERO,
        BusySource::RecordedTrace,
    )
    .unwrap();
    attribution::publish_observed(&client, &empty)
        .await
        .unwrap();
    let cleared = Api::<Node>::all(client.clone()).get(&node).await.unwrap();
    assert!(
        !cleared
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(names::ANNOTATION_OBSERVED)
    );

    // An agent gone mid-job leaves its last summary: the uninstall clean-up removes it too.
    attribution::publish_observed(&client, &summary)
        .await
        .unwrap();
    offload_agent::daemon::remove(&client, &node).await.unwrap();
    let after = Api::<Node>::all(client.clone()).get(&node).await.unwrap();
    assert!(
        !after
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(names::ANNOTATION_OBSERVED),
        "cleanup removes the observation"
    );
}
