//! The node view: what the operator believes about a node, and the shared index.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::core::ObjectMeta;
use kube::runtime::{reflector, watcher};
use offload_testenv::fixtures;

use super::*;
use offload_api::names;
use offload_api::report::{NodeMemoryModel, NodeReport};

/// The report annotation of node `node`: the report text with its `node` field set to it (the
/// agent writes its own node's name), or the text as it is when it is not a JSON object.
fn annotations_of(node: &str, report: &str) -> BTreeMap<String, String> {
    let text = match serde_json::from_str::<serde_json::Value>(report) {
        Ok(mut v) if v.is_object() => {
            v["node"] = node.into();
            v.to_string()
        }
        _ => report.to_string(),
    };
    BTreeMap::from([(names::ANNOTATION_NODE_REPORT.to_string(), text)])
}

fn labels_of(fixture: &str) -> BTreeMap<String, String> {
    offload_api::labels::published(&NodeReport::parse(fixture).unwrap())
}

#[test]
fn a_node_published_by_the_agent_is_a_candidate_of_its_reports_class() {
    let gh = NodeInfo::from_metadata(
        "gh",
        labels_of(fixtures::GH200_REFERENCE),
        &annotations_of("gh", fixtures::GH200_REFERENCE),
    );
    assert_eq!(gh.class(), Some(NodeClass::Coherent));
    assert_eq!(gh.memory_model(), Some(NodeMemoryModel::Coherent));
    assert_eq!(gh.overlap_conflict(), None);
    let hmm = NodeInfo::from_metadata(
        "hmm",
        labels_of(fixtures::HMM_UNPINNED),
        &annotations_of("hmm", fixtures::HMM_UNPINNED),
    );
    assert_eq!(hmm.class(), Some(NodeClass::Discrete));
    assert_eq!(hmm.memory_model(), Some(NodeMemoryModel::Hmm));
}

/// Labels claiming unified memory on a node whose report says discrete H200 must not make it a
/// coherent node (that led to UnifiedMemory on a PCIe node); the node is ignored, with the
/// contradiction in the reason.
#[test]
fn labels_that_contradict_the_report_make_the_node_ignored() {
    let lying = NodeInfo::from_metadata(
        "h200",
        labels_of(fixtures::GH200_REFERENCE),
        &annotations_of("h200", fixtures::H200_READING),
    );
    assert_eq!(lying.class(), None);
    let why = lying.ignored_because().unwrap();
    assert!(why.contains("contradict its report"), "{why}");
    assert!(why.contains("discrete memory"), "{why}");
}

#[test]
fn an_overlap_label_that_contradicts_the_report_is_a_conflict_not_a_verdict() {
    let mut labels = labels_of(fixtures::HMM_UNPINNED);
    labels.insert(names::LABEL_OVERLAP.into(), "verified".into());
    let node = NodeInfo::from_metadata(
        "hmm",
        labels,
        &annotations_of("hmm", fixtures::HMM_UNPINNED),
    );
    assert_eq!(node.class(), Some(NodeClass::Discrete));
    assert_eq!(
        node.overlap_verdict(),
        offload_api::report::OverlapVerdict::Failed,
        "the report is what was measured"
    );
    let conflict = node.overlap_conflict().unwrap();
    assert!(
        conflict.contains("offload.dev/overlap=verified"),
        "{conflict}"
    );
}

#[test]
fn unusable_publications_are_ignored_with_a_reason() {
    let mut impossible: serde_json::Value = serde_json::from_str(fixtures::H200_READING).unwrap();
    impossible["selftest"]["efficiency"] = 2.0.into();
    let cases = [
        (
            labels_of(fixtures::H200_READING),
            BTreeMap::new(),
            "no offload.dev/node-report annotation",
        ),
        (
            labels_of(fixtures::H200_READING),
            annotations_of("n", &impossible.to_string()),
            "efficiency 2 is outside 0–1",
        ),
        (
            labels_of(fixtures::H200_READING),
            annotations_of("n", "{not json"),
            "not valid JSON",
        ),
        (
            BTreeMap::new(),
            annotations_of("n", fixtures::H200_READING),
            "no offload.dev/uma label",
        ),
    ];
    for (labels, annotations, expected) in cases {
        let node = NodeInfo::from_metadata("n", labels, &annotations);
        assert_eq!(node.class(), None, "{expected}");
        let why = node.ignored_because().unwrap_or_default();
        assert!(why.contains(expected), "{expected}: {why}");
    }
    let plain = NodeInfo::from_metadata("cpu", BTreeMap::new(), &BTreeMap::new());
    assert_eq!(plain.standing(), &Standing::NotReported);
}

/// The views hand every caller the same index until a node changes, and see changes and
/// deletions at once.
#[test]
fn node_views_share_the_index_until_a_node_changes() {
    let meta = |name: &str, rv: &str, fixture: &str| -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                labels: Some(labels_of(fixture)),
                annotations: Some(annotations_of(name, fixture)),
                ..Default::default()
            },
            ..Default::default()
        }
    };
    let (nodes, mut writer) = reflector::store::<Node>();
    writer.apply_watcher_event(&watcher::Event::Apply(meta(
        "gpu-0",
        "1",
        fixtures::H200_READING,
    )));
    writer.apply_watcher_event(&watcher::Event::Apply(meta(
        "gpu-1",
        "1",
        fixtures::H200_READING,
    )));
    let views = NodeViews::new(nodes);

    let first = views.get();
    assert_eq!(first.nodes().len(), 2);
    assert_eq!(first.class(NodeClass::Discrete).count(), 2);
    assert!(
        Arc::ptr_eq(&first, &views.get()),
        "unchanged nodes: the same index is shared"
    );

    // The agent re-publishes gpu-0 as a coherent node.
    writer.apply_watcher_event(&watcher::Event::Apply(meta(
        "gpu-0",
        "2",
        fixtures::GH200_REFERENCE,
    )));
    let changed = views.get();
    assert!(!Arc::ptr_eq(&first, &changed));
    let coherent: Vec<&str> = changed
        .class(NodeClass::Coherent)
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(coherent, ["gpu-0"]);
    assert_eq!(changed.class(NodeClass::Discrete).count(), 1);

    writer.apply_watcher_event(&watcher::Event::Delete(meta(
        "gpu-1",
        "2",
        fixtures::H200_READING,
    )));
    let after_delete = views.get();
    assert_eq!(after_delete.nodes().len(), 1);
    assert_eq!(after_delete.get(0).unwrap().name, "gpu-0");
}

/// A Node at resourceVersion `rv` with the labels and report the agent publishes for `fixture`.
fn reported_node(name: &str, rv: &str, fixture: &str) -> Node {
    Node {
        metadata: kube::core::ObjectMeta {
            name: Some(name.into()),
            resource_version: Some(rv.into()),
            labels: Some(offload_api::labels::published(
                &offload_api::report::NodeReport::parse(fixture).unwrap(),
            )),
            annotations: Some(annotations_of(name, fixture)),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Told of each change the cache takes in, the views hand the index out without looking at a
/// node while nothing changed, keep it (and what was worked out from it) through a change that
/// leaves every view as it was (a heartbeat), and rebuild it when a view changes.
#[test]
fn a_heartbeat_keeps_the_index_and_a_new_report_replaces_it() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let meta = reported_node;
    let (nodes, mut writer) = reflector::store::<Node>();
    let generation = Arc::new(AtomicU64::new(0));
    let apply = |writer: &mut reflector::store::Writer<Node>, node: Node| {
        writer.apply_watcher_event(&watcher::Event::Apply(node));
        generation.fetch_add(1, Ordering::Release);
    };
    apply(&mut writer, meta("gpu-0", "1", fixtures::H200_READING));
    let views = NodeViews::new(nodes).with_generations(generation.clone(), None);
    let first = views.get();
    let job_visits = first.visits();
    assert!(Arc::ptr_eq(&first, &views.get()));
    assert_eq!(
        first.visits(),
        job_visits,
        "nothing read while nothing changed"
    );
    // A heartbeat: a new resourceVersion, the same labels and report.
    apply(&mut writer, meta("gpu-0", "2", fixtures::H200_READING));
    assert!(
        Arc::ptr_eq(&first, &views.get()),
        "a change the index does not read keeps it"
    );
    // A new report: a new index.
    apply(&mut writer, meta("gpu-0", "3", fixtures::GH200_REFERENCE));
    let changed = views.get();
    assert!(!Arc::ptr_eq(&first, &changed));
    assert_eq!(changed.class(NodeClass::Coherent).count(), 1);
}

/// What a GPU driver's slices would say: `gpus` GPUs, each of `mode` (`None`: no attribute).
fn driver_says(mode: Option<&'static str>, gpus: u64) -> crate::dra::slices::DriverWitness {
    let mut w = crate::dra::slices::DriverWitness {
        driver: "gpu.nvidia.com".into(),
        gpus,
        gpu_memory: Some(96 << 30),
        ..Default::default()
    };
    match mode {
        Some(m) => {
            w.modes.insert(m, gpus);
        }
        None => w.without_mode = gpus,
    }
    w
}

#[test]
fn the_drivers_word_confirms_contradicts_or_stands_in_for_the_agents() {
    let gh = || {
        NodeInfo::from_metadata(
            "gh",
            labels_of(fixtures::GH200_REFERENCE),
            &annotations_of("gh", fixtures::GH200_REFERENCE),
        )
    };
    let h200 = || {
        NodeInfo::from_metadata(
            "h",
            labels_of(fixtures::H200_READING),
            &annotations_of("h", fixtures::H200_READING),
        )
    };
    // Agreement (and a driver that says nothing) change nothing but the GPU count.
    let agreed = gh().with_driver(driver_says(Some("ATS"), 4));
    assert_eq!(agreed.class(), Some(NodeClass::Coherent));
    assert_eq!(agreed.witness(), Witness::Agent);
    assert_eq!(agreed.known_gpus(), Some(1), "the report lists one GPU");
    assert_eq!(
        h200().with_driver(driver_says(Some("None"), 1)).class(),
        Some(NodeClass::Discrete)
    );
    assert_eq!(
        gh().with_driver(driver_says(None, 1)).class(),
        Some(NodeClass::Coherent)
    );
    // Disagreement on ATS, either way, or a mixed driver under a coherent report: not used,
    // with both witnesses named.
    for (node, w) in [
        (gh(), driver_says(Some("HMM"), 1)),
        (h200(), driver_says(Some("ATS"), 1)),
        (gh(), {
            let mut w = driver_says(Some("ATS"), 2);
            w.modes.insert("None", 2);
            w.gpus = 4;
            w
        }),
    ] {
        let judged = node.with_driver(w);
        assert_eq!(judged.witness(), Witness::Disagree);
        let why = judged.ignored_because().unwrap();
        assert!(
            why.contains("agent") && why.contains("gpu.nvidia.com"),
            "{why}"
        );
    }
    // No report: classed by the driver alone.
    let bare = NodeInfo::from_metadata("bare", BTreeMap::new(), &BTreeMap::new());
    assert_eq!(bare.standing(), &Standing::NotReported);
    let driver_only = bare.clone().with_driver(driver_says(Some("ATS"), 4));
    assert_eq!(driver_only.class(), Some(NodeClass::Coherent));
    assert_eq!(driver_only.witness(), Witness::DriverOnly);
    assert_eq!(driver_only.known_gpus(), Some(4));
    assert_eq!(driver_only.gpu_memory(), Some(96 << 30));
    assert_eq!(
        driver_only.overlap_verdict(),
        offload_api::report::OverlapVerdict::Untested
    );
    // A driver that says nothing classes nothing.
    assert_eq!(
        bare.with_driver(driver_says(None, 4)).standing(),
        &Standing::NotReported
    );
}

/// Told by the node cache which nodes changed, the views read only those: a heartbeat, a new
/// report, a deletion at 2,000 nodes each read one node, and the index they hand out is the
/// one a full read would build. A new listing of the nodes is read whole.
#[test]
fn a_change_is_taken_in_by_reading_the_changed_node_alone() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let node = |name: &str, rv: u64, fixture: &str| reported_node(name, &rv.to_string(), fixture);
    let (nodes, mut writer) = reflector::store::<Node>();
    let generation = Arc::new(AtomicU64::new(0));
    let log = Arc::new(crate::cluster::caches::ChangeLog::default());
    // As the cache's drive does it: the store, then the name, then the generation.
    let apply = |writer: &mut reflector::store::Writer<Node>, event: watcher::Event<Node>| {
        writer.apply_watcher_event(&event);
        match &event {
            watcher::Event::Apply(n) | watcher::Event::Delete(n) => {
                log.record(n.metadata.name.as_deref());
            }
            _ => log.record(None),
        }
        generation.fetch_add(1, Ordering::Release);
    };
    let views = NodeViews::new(nodes.clone())
        .with_generations(generation.clone(), None)
        .with_change_log(log.clone());
    let name = |i: usize| format!("gpu-{i:05}");
    for i in 0..2000 {
        apply(
            &mut writer,
            watcher::Event::Apply(node(&name(i), 1, fixtures::H200_READING)),
        );
    }
    let first = views.get();
    assert_eq!(first.nodes().len(), 2000);
    assert_eq!(views.node_reads(), 2000, "the first read is whole");

    // A heartbeat of one node: one node read, the same index.
    apply(
        &mut writer,
        watcher::Event::Apply(node(&name(7), 2, fixtures::H200_READING)),
    );
    assert!(Arc::ptr_eq(&first, &views.get()));
    assert_eq!(views.node_reads(), 2001);

    // A new report on one node: one node read, a new index that says so.
    apply(
        &mut writer,
        watcher::Event::Apply(node(&name(9), 3, fixtures::GH200_REFERENCE)),
    );
    let changed = views.get();
    assert_eq!(views.node_reads(), 2002);
    assert!(!Arc::ptr_eq(&first, &changed));
    let full = NodeViews::new(nodes.clone()).get();
    assert_eq!(*changed, *full, "the same index as a full read");

    // A deletion: one node read, the node gone.
    apply(
        &mut writer,
        watcher::Event::Delete(node(&name(3), 4, fixtures::H200_READING)),
    );
    let fewer = views.get();
    assert_eq!(views.node_reads(), 2003);
    assert_eq!(fewer.nodes().len(), 1999);
    assert!(fewer.by_name(&name(3)).is_none());
    assert_eq!(*fewer, *NodeViews::new(nodes.clone()).get());

    // Nothing changed: nothing read.
    assert!(Arc::ptr_eq(&fewer, &views.get()));
    assert_eq!(views.node_reads(), 2003);

    // A new listing (a resumed watch): read whole.
    writer.apply_watcher_event(&watcher::Event::Init);
    for i in (0..2000).filter(|i| *i != 3) {
        let fixture = if i == 9 {
            fixtures::GH200_REFERENCE
        } else {
            fixtures::H200_READING
        };
        writer.apply_watcher_event(&watcher::Event::InitApply(node(&name(i), 5, fixture)));
    }
    apply(&mut writer, watcher::Event::InitDone);
    let relisted = views.get();
    assert_eq!(views.node_reads(), 2003 + 1999);
    assert!(Arc::ptr_eq(&fewer, &relisted), "nothing it holds changed");
}
