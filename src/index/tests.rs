//! The node view: what the operator believes about a node, and the shared index.

use std::collections::BTreeMap;

use offload_testenv::fixtures;

use super::*;
use offload_api::names;
use offload_api::report::{NodeMemoryModel, NodeReport};

/// The report annotation of node `node`: the report text with its `node` field set to it (the
/// agent writes its own node's name), or the text as it is when it is not a JSON object.
pub(crate) fn annotations_of(node: &str, report: &str) -> BTreeMap<String, String> {
    let text = match serde_json::from_str::<serde_json::Value>(report) {
        Ok(mut v) if v.is_object() => {
            v["node"] = node.into();
            v.to_string()
        }
        _ => report.to_string(),
    };
    BTreeMap::from([(names::ANNOTATION_NODE_REPORT.to_string(), text)])
}

pub(crate) fn labels_of(fixture: &str) -> BTreeMap<String, String> {
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
    // The cluster operator's confirmation of the agent's word: used as the agent classed it
    // (a witness claim-pinned jobs leave out); a confirmation of anything else leaves the node
    // unused and is named.
    let confirmed = |value: &str| {
        let mut annotations = annotations_of("gh", fixtures::GH200_REFERENCE);
        annotations.insert(
            offload_api::names::ANNOTATION_MEMORY_MODEL_CONFIRMED.to_string(),
            value.to_string(),
        );
        NodeInfo::from_metadata("gh", labels_of(fixtures::GH200_REFERENCE), &annotations)
            .with_driver(driver_says(Some("HMM"), 1))
    };
    let judged = confirmed("coherent");
    assert_eq!(judged.witness(), Witness::Confirmed);
    assert_eq!(judged.class(), Some(NodeClass::Coherent));
    let judged = confirmed("discrete");
    assert_eq!(judged.witness(), Witness::Disagree);
    let why = judged.ignored_because().unwrap();
    assert!(
        why.contains("offload.dev/memory-model-confirmed: coherent")
            && why.contains("\"discrete\""),
        "{why}"
    );
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
