//! How the operator sees one node: the agent's report, cross-checked against its labels.
//!
//! The report is what the agent measured, so it is the source of truth; the labels are what
//! pods are pinned by, so they must agree with it. A node whose labels contradict its report,
//! or whose report is unreadable or impossible, is ignored with a reason rather than trusted.

use std::collections::BTreeMap;

use crate::dra::slices::{DriverSays, DriverWitness};
use offload_api::labels::{LabelValue, NodeLabels};
use offload_api::names;
use offload_api::observed::{ObservedError, ObservedSummary};
use offload_api::report::{
    AddressingMode, NodeMemoryModel, NodeReport, OverlapVerdict, ReportError,
};
use offload_api::text::bounded;
use offload_api::v1alpha1::NodeClass;

/// Whether a node can take offloaded jobs, and as which class.
#[derive(Clone, Debug, PartialEq)]
pub enum Standing {
    /// A GPU node of this memory model and class, with a readable, believable report whose
    /// labels agree with it.
    Candidate {
        /// Memory model from the report.
        model: NodeMemoryModel,
        /// The class jobs are pinned to.
        class: NodeClass,
    },
    /// The agent has published here, but what it published cannot be used; says why.
    Ignored(String),
    /// No agent label and no report: not a node the agent runs on.
    NotReported,
}

/// What the kubelet says pods may use on a node (`status.allocatable`), where it says so and
/// the quantity reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Allocatable {
    /// Memory, bytes.
    pub memory: Option<u64>,
    /// `nvidia.com/gpu` devices.
    pub gpus: Option<u64>,
    /// CPUs, whole cores (rounded up).
    pub cpus: Option<u64>,
    /// The node's memory (`status.capacity`), bytes: what no pod on it can exceed.
    pub memory_capacity: Option<u64>,
}

/// Most host memory a node may state (64 TiB: the largest machines have 24–48 TB).
pub const MAX_HOST_MEMORY: u64 = 1 << 46;

impl Allocatable {
    /// From a Node's `status.allocatable`; a quantity that does not read counts as absent.
    pub fn of(node: &k8s_openapi::api::core::v1::Node) -> Self {
        let Some(alloc) = node.status.as_ref().and_then(|s| s.allocatable.as_ref()) else {
            return Allocatable::default();
        };
        Allocatable {
            memory: alloc
                .get("memory")
                .and_then(|q| offload_api::quantity::bytes(q).ok()),
            gpus: alloc
                .get(names::GPU_RESOURCE)
                .and_then(|q| offload_api::quantity::device_count(q).ok()),
            cpus: alloc.get("cpu").and_then(|q| cpu_cores(&q.0)),
            memory_capacity: node
                .status
                .as_ref()
                .and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("memory"))
                .and_then(|q| offload_api::quantity::bytes(q).ok()),
        }
    }
}

/// A CPU quantity (`72`, `71500m`) in whole cores, rounded up; `None` where it does not read.
pub fn cpu_cores(q: &str) -> Option<u64> {
    match q.strip_suffix('m') {
        Some(milli) => milli.parse::<u64>().ok().map(|m| m.div_ceil(1000)),
        None => q.parse::<u64>().ok(),
    }
}

/// A node as the decision sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeInfo {
    /// Node name.
    pub name: String,
    /// All labels of the node (a profile's selector may look at any of them).
    pub labels: BTreeMap<String, String>,
    /// The parsed `offload.dev/node-report` annotation: `None` when absent.
    pub report: Option<Result<NodeReport, ReportError>>,
    /// The parsed `offload.dev/observed` annotation (what the agent saw the GPUs of configured
    /// pods do): `None` when absent.
    pub observed: Option<Result<ObservedSummary, ObservedError>>,
    /// What the kubelet says pods may use on the node.
    pub allocatable: Allocatable,
    /// The node's taints (`spec.taints`): which pods may land there.
    pub taints: Vec<NodeTaint>,
    /// What the GPU driver's ResourceSlices say about the node's GPUs (DRA), where it publishes
    /// any.
    pub driver: Option<DriverWitness>,
    standing: Standing,
    overlap_conflict: Option<String>,
    witness: Witness,
    /// The memory model a cluster operator confirmed for the node, as the annotation says it.
    confirmed: Option<String>,
}

/// A taint of a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeTaint {
    /// Taint key.
    pub key: String,
    /// Taint value, if any.
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// Who vouches for a node's class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Witness {
    /// The agent's report (with the driver's slices, where they agree).
    #[default]
    Agent,
    /// Only the driver's slices: no report yet. Its class is good for jobs whose GPU claims
    /// select by the driver's attributes; jobs pinned by the agent's labels cannot land there.
    DriverOnly,
    /// The report and the driver disagree on unified memory: the node is not used.
    Disagree,
    /// The report and the driver disagree, and the cluster operator confirmed the agent's word
    /// ([`names::ANNOTATION_MEMORY_MODEL_CONFIRMED`]): used as the agent classed it, except by
    /// jobs whose GPU claims select by the driver's attributes.
    Confirmed,
}

impl NodeInfo {
    /// Builds the view from a node's labels and annotations.
    pub fn from_metadata(
        name: impl Into<String>,
        labels: BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
    ) -> Self {
        let report = annotations
            .get(names::ANNOTATION_NODE_REPORT)
            .map(|json| NodeReport::parse(json));
        let mut info = NodeInfo::new(name, labels, report);
        info.observed = annotations
            .get(names::ANNOTATION_OBSERVED)
            .map(|json| ObservedSummary::parse(json));
        info.confirmed = annotations
            .get(names::ANNOTATION_MEMORY_MODEL_CONFIRMED)
            .map(|v| bounded(v.trim()));
        info
    }

    /// Builds the view from labels and an already parsed report.
    pub fn new(
        name: impl Into<String>,
        labels: BTreeMap<String, String>,
        report: Option<Result<NodeReport, ReportError>>,
    ) -> Self {
        let name = name.into();
        let (standing, overlap_conflict) = judge(&name, &labels, report.as_ref());
        NodeInfo {
            name,
            labels,
            report,
            observed: None,
            allocatable: Allocatable::default(),
            taints: Vec::new(),
            driver: None,
            standing,
            overlap_conflict,
            witness: Witness::Agent,
            confirmed: None,
        }
    }

    /// A node whose agent published `report` (labels derived from it, as the agent writes them),
    /// its report checked as the operator checks one it reads.
    pub fn from_report(name: impl Into<String>, report: &NodeReport) -> Self {
        let name = name.into();
        let mut report = report.clone();
        report.node.clone_from(&name);
        let checked = report.check().map(|()| report.clone());
        NodeInfo::new(name, offload_api::labels::published(&report), Some(checked))
    }

    /// The same view with the node's allocatable resources. Host memory no node has sets the
    /// node aside with the reason, as an unreadable report does; an observation of a pod using
    /// more CPUs than the node has is not believed.
    pub fn with_allocatable(mut self, allocatable: Allocatable) -> Self {
        self.allocatable = allocatable;
        if let Some(m) = allocatable.memory.filter(|m| *m > MAX_HOST_MEMORY) {
            self.allocatable.memory = None;
            if matches!(self.standing, Standing::Candidate { .. }) {
                self.standing = Standing::Ignored(format!(
                    "its allocatable memory of {m} bytes is more than any node has (at most {} TiB)",
                    MAX_HOST_MEMORY >> 40
                ));
            }
        }
        if let (Some(cpus), Some(Ok(observed))) = (allocatable.cpus, self.observed.as_ref())
            && let Some(p) = observed
                .pods
                .iter()
                .find(|p| p.cpu_cores.is_some_and(|c| c > cpus as f64))
        {
            self.observed = Some(Err(ObservedError::Impossible(format!(
                "pod {}/{} used {:?} CPU cores, more than the node's {cpus}",
                p.namespace, p.name, p.cpu_cores
            ))));
        }
        self.bound_observed_memory();
        self
    }

    /// An observation that cannot be true on this node (a pod's GPU the node does not have, a
    /// peak above its GPU or the pod's processes above the device, more host memory than the
    /// node has: [`offload_api::observed::PodObservation::implausible`]) is not believed: the
    /// whole summary is set aside, as for CPU.
    fn bound_observed_memory(&mut self) {
        let Some(Ok(observed)) = self.observed.as_ref() else {
            return;
        };
        let node_memory = self.allocatable.memory_capacity.or(self.allocatable.memory);
        let gpus: Vec<u64> = self
            .parsed_report()
            .map(|r| {
                r.gpus
                    .iter()
                    .map(|g| g.memory_total_bytes)
                    .filter(|b| *b > 0)
                    .collect()
            })
            .filter(|g: &Vec<u64>| !g.is_empty())
            .or_else(|| {
                self.driver
                    .as_ref()
                    .and_then(|w| w.gpu_memory)
                    .map(|g| vec![g])
            })
            .unwrap_or_default();
        let why = observed
            .pods
            .iter()
            .find_map(|p| p.implausible(&gpus, node_memory));
        if let Some(why) = why {
            self.observed = Some(Err(ObservedError::Impossible(why)));
        }
    }

    /// The same view with the node's taints.
    pub fn with_taints(mut self, taints: Vec<NodeTaint>) -> Self {
        self.taints = taints;
        self
    }

    /// The same view with what the GPU driver's ResourceSlices say, cross-checked with the
    /// report: where one says ATS (unified memory) and the other does not, the node is not
    /// trusted for unified memory (nor used at all, since its labels pin it to one class) until
    /// they agree; a node with slices and no report is classed from the slices, its overlap
    /// untested.
    pub fn with_driver(mut self, witness: DriverWitness) -> Self {
        let driver_model = witness.memory_model();
        match (&self.standing, driver_model) {
            (Standing::NotReported, Some(model)) => {
                if let Some(class) = class_of(model) {
                    self.standing = Standing::Candidate { model, class };
                    self.witness = Witness::DriverOnly;
                }
            }
            // The driver's slices are here but set aside, and no agent has reported: say why,
            // rather than blame a missing agent.
            (Standing::NotReported, None) if !witness.problems.is_empty() => {
                self.standing = Standing::Ignored(format!(
                    "GPU driver {}'s ResourceSlices for it are set aside: {}",
                    bounded(&witness.driver),
                    witness.problems.join("; ")
                ));
            }
            (Standing::Candidate { model, .. }, _) => {
                let agent_ats = *model == NodeMemoryModel::Coherent;
                let disagree = match witness.says() {
                    DriverSays::All(mode) => agent_ats != (mode == AddressingMode::Ats),
                    // A driver that names no single mode cannot vouch for unified memory.
                    DriverSays::Mixed => agent_ats,
                    DriverSays::Nothing => false,
                };
                if disagree && self.confirmed.as_deref() == Some(model.to_string().as_str()) {
                    self.witness = Witness::Confirmed;
                } else if disagree {
                    let report_mode = self
                        .parsed_report()
                        .map_or("unknown", |r| r.addressing_mode().label_value());
                    self.standing = Standing::Ignored(format!(
                        "its agent reports {model} memory (addressing mode {report_mode}) but GPU driver {} publishes {} in its ResourceSlices: not trusted for unified memory until the two agree, or until annotation {}: {model} confirms the agent's word{}",
                        bounded(&witness.driver),
                        witness.describe(),
                        names::ANNOTATION_MEMORY_MODEL_CONFIRMED,
                        self.confirmed
                            .as_ref()
                            .map_or(String::new(), |c| format!(" (it says {c:?})"))
                    ));
                    self.witness = Witness::Disagree;
                }
            }
            _ => {}
        }
        self.driver = Some(witness);
        self
    }

    /// Who vouches for the node's class.
    pub fn witness(&self) -> Witness {
        self.witness
    }

    /// The agent's latest observation of the node's configured pods, if present and readable.
    pub fn parsed_observed(&self) -> Option<&ObservedSummary> {
        self.observed.as_ref().and_then(|o| o.as_ref().ok())
    }

    /// Whether and how the node can be used.
    pub fn standing(&self) -> &Standing {
        &self.standing
    }

    /// The memory model, for candidates only.
    pub fn memory_model(&self) -> Option<NodeMemoryModel> {
        match self.standing {
            Standing::Candidate { model, .. } => Some(model),
            _ => None,
        }
    }

    /// The node class, for candidates only.
    pub fn class(&self) -> Option<NodeClass> {
        match self.standing {
            Standing::Candidate { class, .. } => Some(class),
            _ => None,
        }
    }

    /// Why the node is ignored, when it is.
    pub fn ignored_because(&self) -> Option<&str> {
        match &self.standing {
            Standing::Ignored(why) => Some(why),
            _ => None,
        }
    }

    /// The overlap verdict of the report (`untested` without one).
    pub fn overlap_verdict(&self) -> OverlapVerdict {
        self.parsed_report()
            .map_or(OverlapVerdict::Untested, |r| r.selftest.verdict)
    }

    /// Why the overlap verdict cannot be trusted although the node is a candidate: its label
    /// says something else than its report.
    pub fn overlap_conflict(&self) -> Option<&str> {
        self.overlap_conflict.as_deref()
    }

    /// The parsed report, if present and readable.
    pub fn parsed_report(&self) -> Option<&NodeReport> {
        self.report.as_ref().and_then(|r| r.as_ref().ok())
    }

    /// GPUs on the node, where the report or the kubelet says: the report's GPUs (each listed
    /// once: the report's checks refuse one listed twice), no more than the node's allocatable
    /// `nvidia.com/gpu`.
    pub fn known_gpus(&self) -> Option<u64> {
        let reported = self
            .parsed_report()
            .map(|r| u64::try_from(r.gpus.len()).unwrap_or(u64::MAX))
            .filter(|n| *n > 0);
        // GPUs pods can get: the device plugin's (allocatable `nvidia.com/gpu`) or the DRA
        // driver's devices, whichever the node hands out more of.
        let driver = self.driver.as_ref().map(|w| w.gpus).filter(|n| *n > 0);
        let allocatable = match (self.allocatable.gpus, driver) {
            (Some(a), Some(d)) => Some(a.max(d)),
            (a, d) => a.or(d),
        };
        match (reported, allocatable) {
            (Some(r), Some(a)) => Some(r.min(a)),
            (r, a) => r.or(a),
        }
    }

    /// GPUs on the node for placement: [`NodeInfo::known_gpus`], 1 where nothing says.
    pub fn gpu_count(&self) -> u32 {
        u32::try_from(self.known_gpus().unwrap_or(1)).unwrap_or(u32::MAX)
    }

    /// Memory of the node's smallest GPU, bytes, from the report.
    pub fn gpu_memory(&self) -> Option<u64> {
        let reported = self.parsed_report().and_then(|r| {
            r.gpus
                .iter()
                .map(|g| g.memory_total_bytes)
                .filter(|b| *b > 0)
                .min()
        });
        reported.or_else(|| self.driver.as_ref().and_then(|w| w.gpu_memory))
    }
}

fn class_of(model: NodeMemoryModel) -> Option<NodeClass> {
    match model {
        NodeMemoryModel::Coherent => Some(NodeClass::Coherent),
        NodeMemoryModel::Hmm | NodeMemoryModel::Discrete => Some(NodeClass::Discrete),
        NodeMemoryModel::Unknown | NodeMemoryModel::NoGpu => None,
    }
}

/// How far in the future a report may be dated (clocks of nodes and the operator differ).
const CLOCK_SKEW: jiff::SignedDuration = jiff::SignedDuration::from_hours(1);

/// The node's standing, and a conflict on the overlap label if there is one.
fn judge(
    name: &str,
    labels: &BTreeMap<String, String>,
    report: Option<&Result<NodeReport, ReportError>>,
) -> (Standing, Option<String>) {
    let published = NodeLabels::parse(labels);
    let report = match (report, &published) {
        (None, Ok(None)) => return (Standing::NotReported, None),
        (None, _) => {
            return (
                Standing::Ignored(format!(
                    "it carries offload.dev labels but no {} annotation",
                    names::ANNOTATION_NODE_REPORT
                )),
                None,
            );
        }
        (Some(Err(e)), _) => return (Standing::Ignored(bounded(&e.to_string())), None),
        (Some(Ok(r)), _) => r,
    };
    let checked = own_report(name, report).and_then(|()| {
        let class = class_of_report(report)?;
        let labels = match published {
            Ok(Some(l)) => l,
            Ok(None) => return Err(format!("it has a report but no {} label", names::LABEL_UMA)),
            Err(e) => return Err(e.to_string()),
        };
        labels_agree(&labels, class, report)?;
        Ok((class, labels))
    });
    let (class, labels) = match checked {
        Ok(found) => found,
        Err(why) => return (Standing::Ignored(why), None),
    };
    let conflict = (labels.overlap != report.selftest.verdict).then(|| {
        format!(
            "its label {}={} contradicts its report ({})",
            names::LABEL_OVERLAP,
            labels.overlap.label_value(),
            report.selftest.verdict.label_value()
        )
    });
    (
        Standing::Candidate {
            model: report.memory_model,
            class,
        },
        conflict,
    )
}

/// Each agent writes only its own node's report (the chart's admission policy enforces it): a
/// report naming another node, or dated in the future, was not written by this node's agent now.
fn own_report(name: &str, report: &NodeReport) -> Result<(), String> {
    if report.node != name {
        return Err(format!(
            "its report was written for node {:?}",
            bounded(&report.node)
        ));
    }
    if let Ok(at) = report.generated_at.parse::<jiff::Timestamp>()
        && at.duration_since(jiff::Timestamp::now()) > CLOCK_SKEW
    {
        return Err(format!(
            "its report is dated {}, in the future",
            bounded(&report.generated_at)
        ));
    }
    Ok(())
}

/// The node's class from its report, or why it has none.
fn class_of_report(report: &NodeReport) -> Result<NodeClass, String> {
    class_of(report.memory_model).ok_or_else(|| match report.memory_model {
        NodeMemoryModel::NoGpu => "its report says it has no GPU".to_string(),
        _ => match &report.nvml.error {
            Some(e) => format!("its report says NVML could not be read ({})", bounded(e)),
            None => "its report says the GPUs' memory model is unknown".to_string(),
        },
    })
}

/// The node's published labels say what its report says (the overlap label aside: a conflict
/// there is reported, not disqualifying).
fn labels_agree(labels: &NodeLabels, class: NodeClass, report: &NodeReport) -> Result<(), String> {
    let expected = NodeLabels::from_report(report);
    if labels.class() != Some(class)
        || labels.uma != expected.uma
        || labels.addressing_mode != expected.addressing_mode
        || labels.c2c != expected.c2c
    {
        return Err(format!(
            "its labels (uma={}, addressing-mode={}, c2c={}) contradict its report ({} memory, uma={}, addressing-mode={}, c2c={})",
            labels.uma,
            labels.addressing_mode.label_value(),
            labels.c2c,
            report.memory_model,
            expected.uma,
            expected.addressing_mode.label_value(),
            expected.c2c
        ));
    }
    Ok(())
}
