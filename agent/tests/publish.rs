//! The agent's report, written to a real API server's Node, is exactly what the operator's
//! decision engine reads; the agent owns only its own keys and removes them on uninstall.

use offload_testenv::support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use offload_agent::probe::{NvmlSource, RealNvml, RecordedNvml};
use offload_agent::{publish, report};
use offload_api::api::{Framework, FrameworkSpec, OffloadMode, OffloadProfileSpec, OffloadSpec};
use offload_api::names;
use offload_api::report::NodeReport;
use offload_operator::decision::{DeepSpeedRequest, JobRequest, resolve_offload};
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
    let report = report::assemble(&name, source.read(), recorded.selftest.clone());
    publish::publish(&client, &report).await.unwrap();

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

    let job = JobRequest {
        offload: OffloadSpec::default(),
        framework: FrameworkSpec {
            name: Framework::Generic,
            version: None,
        },
        deepspeed: DeepSpeedRequest::default(),
        model: None,
        pods: 1,
        gpus_per_pod: 1,
    };
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
    publish::publish(&client, &report).await.unwrap();
    publish::remove(&client, &name).await.unwrap();
    let after = nodes.get(&name).await.unwrap();
    let labels = after.metadata.labels.unwrap_or_default();
    for key in names::AGENT_LABELS {
        assert!(!labels.contains_key(key), "{key} left behind");
    }
    assert!(
        !after
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(names::ANNOTATION_NODE_REPORT)
    );
    assert_eq!(labels["nvidia.com/gpu.product"], "NVIDIA-GH200-480GB");
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
    let report = report::build(&name, &RealNvml, &Default::default(), Default::default());
    publish::publish(&client, &report).await.unwrap();
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
