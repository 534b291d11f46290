//! How the decision sees a node: its agent labels and report, nothing else.

use std::collections::BTreeMap;

use crate::api::NodeClass;
use crate::names;
use crate::report::{NodeMemoryModel, NodeReport, OverlapVerdict, ReportError};

/// A candidate node as the decision sees it: the metadata the agent wrote on it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeInfo {
    /// Node name.
    pub name: String,
    /// All labels of the node (the profile's selector may look at any of them).
    pub labels: BTreeMap<String, String>,
    /// The parsed `offload.dev/node-report` annotation: `None` when absent.
    pub report: Option<Result<NodeReport, ReportError>>,
}

impl NodeInfo {
    /// Builds the view from a node's labels and annotations.
    pub fn from_metadata(
        name: impl Into<String>,
        labels: BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
    ) -> Self {
        NodeInfo {
            name: name.into(),
            labels,
            report: annotations
                .get(names::ANNOTATION_NODE_REPORT)
                .map(|json| NodeReport::parse(json)),
        }
    }

    /// The memory model as published in the agent's labels, or `None` for a node the agent has
    /// not reported on or whose labels contradict each other. Coherent needs all three labels to
    /// agree (uma, ATS, C2C): a node half-labelled by hand is never treated as unified memory,
    /// and is not a candidate for either class.
    pub fn memory_model(&self) -> Option<NodeMemoryModel> {
        let uma = self.labels.get(names::LABEL_UMA)?;
        let mode = self
            .labels
            .get(names::LABEL_ADDRESSING_MODE)
            .map(String::as_str);
        let c2c = self.labels.get(names::LABEL_C2C).map(String::as_str);
        match (uma.as_str(), mode, c2c) {
            ("true", Some("ats"), Some("true")) => Some(NodeMemoryModel::Coherent),
            ("false", Some("hmm"), _) => Some(NodeMemoryModel::Hmm),
            ("false", _, _) => Some(NodeMemoryModel::Discrete),
            _ => None,
        }
    }

    /// The node class, or `None` for unreported nodes.
    pub fn class(&self) -> Option<NodeClass> {
        self.memory_model().map(|m| match m {
            NodeMemoryModel::Coherent => NodeClass::Coherent,
            _ => NodeClass::Discrete,
        })
    }

    /// The overlap verdict label (`untested` when missing or unknown).
    pub fn overlap_verdict(&self) -> OverlapVerdict {
        match self.labels.get(names::LABEL_OVERLAP).map(String::as_str) {
            Some("verified") => OverlapVerdict::Verified,
            Some("failed") => OverlapVerdict::Failed,
            _ => OverlapVerdict::Untested,
        }
    }

    /// The parsed report, if present and readable.
    pub fn parsed_report(&self) -> Option<&NodeReport> {
        self.report.as_ref().and_then(|r| r.as_ref().ok())
    }

    /// GPUs on the node: from the report, or 1 when the report is missing or unreadable.
    pub fn gpu_count(&self) -> u32 {
        self.parsed_report()
            .map(|r| u32::try_from(r.gpus.len()).unwrap_or(u32::MAX))
            .filter(|n| *n > 0)
            .unwrap_or(1)
    }
}

/// Node labels that pin a pod to a node class: the exact label values the class was decided from.
pub fn class_requirements(class: NodeClass) -> Vec<(String, Vec<String>)> {
    match class {
        NodeClass::Coherent => vec![
            (names::LABEL_UMA.to_string(), vec!["true".to_string()]),
            (
                names::LABEL_ADDRESSING_MODE.to_string(),
                vec!["ats".to_string()],
            ),
            (names::LABEL_C2C.to_string(), vec!["true".to_string()]),
        ],
        NodeClass::Discrete => vec![(names::LABEL_UMA.to_string(), vec!["false".to_string()])],
    }
}
