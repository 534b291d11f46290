//! The node labels of the agent, typed: one vocabulary of values, written by the agent from its
//! report and read back by the operator, so the two can never spell a value differently.

use std::collections::BTreeMap;

use crate::names;
use crate::report::{AddressingMode, NodeMemoryModel, NodeReport, OverlapVerdict};
use crate::v1alpha1::NodeClass;

/// The agent's four labels on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeLabels {
    /// `offload.dev/uma`: hardware-coherent unified memory (ATS and C2C on every GPU).
    pub uma: bool,
    /// `offload.dev/addressing-mode`: the GPUs' common addressing mode (`none` when unknown or
    /// mixed: only `ats` ever leads to a unified-memory decision).
    pub addressing_mode: AddressingMode,
    /// `offload.dev/c2c`: NVLink-C2C enabled on every GPU.
    pub c2c: bool,
    /// `offload.dev/overlap`: the published verdict of the overlap self-test.
    pub overlap: OverlapVerdict,
}

/// A label value outside the vocabulary.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node label {key}={value:?} is not one of {expected}")]
pub struct LabelError {
    /// The label key.
    pub key: &'static str,
    /// The value found.
    pub value: String,
    /// The values allowed.
    pub expected: String,
}

/// A typed value of one of the agent's labels and its one spelling, derived (strum) from the
/// type's serde names.
pub trait LabelValue:
    Copy + PartialEq + Into<&'static str> + std::str::FromStr + strum::VariantNames + 'static
{
    /// Values of the type that a label never carries.
    const UNPUBLISHED: &'static [Self] = &[];

    /// The value as published.
    fn label_value(self) -> &'static str {
        self.into()
    }

    /// Reads a published value; `None` outside the vocabulary.
    fn from_label(value: &str) -> Option<Self> {
        value
            .parse()
            .ok()
            .filter(|v| !Self::UNPUBLISHED.contains(v))
    }

    /// Every value a label of this type may carry, for messages.
    fn vocabulary() -> String {
        let unpublished: Vec<&str> = Self::UNPUBLISHED.iter().map(|v| (*v).into()).collect();
        Self::VARIANTS
            .iter()
            .filter(|v| !unpublished.contains(v))
            .copied()
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Reads label `key` of `labels`: `default` when absent, an error outside the vocabulary.
    fn read(
        labels: &BTreeMap<String, String>,
        key: &'static str,
        default: Self,
    ) -> Result<Self, LabelError> {
        match labels.get(key) {
            None => Ok(default),
            Some(v) => Self::from_label(v).ok_or_else(|| LabelError {
                key,
                value: v.clone(),
                expected: Self::vocabulary(),
            }),
        }
    }
}

impl LabelValue for OverlapVerdict {}

impl LabelValue for AddressingMode {
    /// `Unknown` is published as `none`: only `ats` ever leads to a unified-memory decision, so
    /// the conservative value is the safe one.
    const UNPUBLISHED: &'static [Self] = &[AddressingMode::Unknown];

    fn label_value(self) -> &'static str {
        match self {
            AddressingMode::Unknown => AddressingMode::None.into(),
            mode => mode.into(),
        }
    }
}

/// The labels the agent publishes for `report`. A node without a GPU, or whose NVML could not
/// be read, gets no memory-model labels at all (not `uma=false`, which would make it match a
/// discrete node's affinity); only `offload.dev/overlap: untested` says the agent runs there.
pub fn published(report: &NodeReport) -> BTreeMap<String, String> {
    match report.memory_model {
        NodeMemoryModel::Unknown | NodeMemoryModel::NoGpu => BTreeMap::from([(
            names::LABEL_OVERLAP.to_string(),
            report.selftest.verdict.label_value().to_string(),
        )]),
        _ => NodeLabels::from_report(report).to_map(),
    }
}

fn bool_label(labels: &BTreeMap<String, String>, key: &'static str) -> Result<bool, LabelError> {
    match labels.get(key).map(String::as_str) {
        Some("true") => Ok(true),
        Some("false") | None => Ok(false),
        Some(other) => Err(LabelError {
            key,
            value: other.to_string(),
            expected: "true, false".to_string(),
        }),
    }
}

impl NodeLabels {
    /// The labels that describe a report.
    pub fn from_report(report: &NodeReport) -> Self {
        let c2c = !report.gpus.is_empty() && report.gpus.iter().all(|g| g.c2c.enabled);
        NodeLabels {
            uma: report.memory_model == NodeMemoryModel::Coherent,
            addressing_mode: report.addressing_mode(),
            c2c,
            overlap: report.selftest.verdict,
        }
    }

    /// The label map to publish.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (names::LABEL_UMA.to_string(), self.uma.to_string()),
            (
                names::LABEL_ADDRESSING_MODE.to_string(),
                self.addressing_mode.label_value().to_string(),
            ),
            (names::LABEL_C2C.to_string(), self.c2c.to_string()),
            (
                names::LABEL_OVERLAP.to_string(),
                self.overlap.label_value().to_string(),
            ),
        ])
    }

    /// Reads the agent's labels from a node's labels: `Ok(None)` when the node carries no
    /// `offload.dev/uma` label (the agent has not published there), an error when a value is
    /// outside the vocabulary.
    pub fn parse(labels: &BTreeMap<String, String>) -> Result<Option<NodeLabels>, LabelError> {
        if !labels.contains_key(names::LABEL_UMA) {
            return Ok(None);
        }
        Ok(Some(NodeLabels {
            uma: bool_label(labels, names::LABEL_UMA)?,
            addressing_mode: AddressingMode::read(
                labels,
                names::LABEL_ADDRESSING_MODE,
                AddressingMode::None,
            )?,
            c2c: bool_label(labels, names::LABEL_C2C)?,
            overlap: OverlapVerdict::read(labels, names::LABEL_OVERLAP, OverlapVerdict::Untested)?,
        }))
    }

    /// The node class these labels describe: coherent only when all three agree (uma, ATS,
    /// C2C), discrete when `uma` is false, `None` for a half-labelled node.
    pub fn class(&self) -> Option<NodeClass> {
        match (self.uma, self.addressing_mode, self.c2c) {
            (true, AddressingMode::Ats, true) => Some(NodeClass::Coherent),
            (false, _, _) => Some(NodeClass::Discrete),
            _ => None,
        }
    }
}

/// Node labels that pin a pod to a node class: the exact label values the class is read from.
pub fn class_requirements(class: NodeClass) -> Vec<(String, Vec<String>)> {
    match class {
        NodeClass::Coherent => vec![
            (names::LABEL_UMA.to_string(), vec![true.to_string()]),
            (
                names::LABEL_ADDRESSING_MODE.to_string(),
                vec![AddressingMode::Ats.label_value().to_string()],
            ),
            (names::LABEL_C2C.to_string(), vec![true.to_string()]),
        ],
        NodeClass::Discrete => vec![(names::LABEL_UMA.to_string(), vec![false.to_string()])],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn written_labels_read_back_the_same() {
        for uma in [true, false] {
            for addressing_mode in [
                AddressingMode::Ats,
                AddressingMode::Hmm,
                AddressingMode::None,
            ] {
                for overlap in [
                    OverlapVerdict::Verified,
                    OverlapVerdict::Failed,
                    OverlapVerdict::Untested,
                ] {
                    let labels = NodeLabels {
                        uma,
                        addressing_mode,
                        c2c: uma,
                        overlap,
                    };
                    assert_eq!(NodeLabels::parse(&labels.to_map()), Ok(Some(labels)));
                }
            }
        }
    }

    #[test]
    fn values_outside_the_vocabulary_are_errors_that_name_the_key() {
        let err = NodeLabels::parse(&map(&[
            (names::LABEL_UMA, "true"),
            (names::LABEL_ADDRESSING_MODE, "ATS"),
        ]))
        .unwrap_err();
        assert_eq!(err.key, names::LABEL_ADDRESSING_MODE);
        assert!(err.to_string().contains("\"ATS\""), "{err}");
        assert_eq!(err.expected, "ats, hmm, none");
        // `unknown` is a report's word, never a label's: it is published as `none`.
        assert_eq!(AddressingMode::Unknown.label_value(), "none");
        assert_eq!(AddressingMode::from_label("unknown"), None);
        assert_eq!(OverlapVerdict::vocabulary(), "verified, failed, untested");
        assert!(NodeLabels::parse(&map(&[(names::LABEL_UMA, "yes")])).is_err());
        assert!(
            NodeLabels::parse(&map(&[
                (names::LABEL_UMA, "false"),
                (names::LABEL_OVERLAP, "maybe")
            ]))
            .is_err()
        );
        assert_eq!(NodeLabels::parse(&map(&[("other", "x")])), Ok(None));
    }

    #[test]
    fn a_half_labelled_node_has_no_class_and_requirements_match_the_vocabulary() {
        let half = NodeLabels {
            uma: true,
            addressing_mode: AddressingMode::Hmm,
            c2c: true,
            overlap: OverlapVerdict::Untested,
        };
        assert_eq!(half.class(), None);
        let coherent = NodeLabels {
            addressing_mode: AddressingMode::Ats,
            ..half
        };
        assert_eq!(coherent.class(), Some(NodeClass::Coherent));
        // Every requirement of a class is satisfied by the labels of that class.
        let written = coherent.to_map();
        for (key, values) in class_requirements(NodeClass::Coherent) {
            assert!(values.contains(&written[&key]), "{key}");
        }
    }
}
