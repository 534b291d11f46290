//! Table tests for every branch of the decision, and property tests for its invariants, one
//! module per step.

mod cpu;
mod framework;
mod hints;
mod learning;
mod megatron;
mod memory;
mod overlap;
mod placement;
mod properties;
mod proven;
mod ratio;
mod scale;
pub(crate) mod traced;

use std::collections::BTreeMap;

use crate::index::{NodeIndex, NodeInfo};
use offload_api::names;
use offload_api::report::NodeReport;
use offload_api::v1alpha1::{
    Framework, FrameworkSpec, OffloadMode, OffloadProfileSpec, OffloadSpec, OverlapSetting, Switch,
};
use offload_testenv::fixtures;

use super::*;

// ---- helpers -------------------------------------------------------------------------------

/// A node carrying a fixture report and the labels the agent derives from it.
pub(super) fn node_from(name: &str, fixture: &str) -> NodeInfo {
    let mut report = NodeReport::parse(fixture).unwrap();
    report.node = name.to_string();
    let annotations = BTreeMap::from([(
        names::ANNOTATION_NODE_REPORT.to_string(),
        report.to_annotation().unwrap(),
    )]);
    NodeInfo::from_metadata(name, offload_api::labels::published(&report), &annotations)
}

pub(super) fn gh200(name: &str) -> NodeInfo {
    node_from(name, fixtures::GH200_REFERENCE)
}

pub(super) fn h200(name: &str) -> NodeInfo {
    node_from(name, fixtures::H200_READING)
}

pub(super) fn hmm(name: &str) -> NodeInfo {
    node_from(name, fixtures::HMM_UNPINNED)
}

/// A node the agent has never labelled.
pub(super) fn unreported(name: &str) -> NodeInfo {
    NodeInfo::new(
        name,
        BTreeMap::from([("kubernetes.io/hostname".to_string(), name.to_string())]),
        None,
    )
}

/// The node with one more (or one changed) label, its report untouched.
pub(super) fn with_label(n: NodeInfo, k: &str, v: &str) -> NodeInfo {
    let mut labels = n.labels.clone();
    labels.insert(k.to_string(), v.to_string());
    NodeInfo::new(n.name.clone(), labels, n.report.clone())
}

/// The node re-published by the agent with an edited report (labels follow the report).
pub(super) fn with_report(n: NodeInfo, edit: impl FnOnce(&mut NodeReport)) -> NodeInfo {
    let mut report = n.parsed_report().cloned().unwrap();
    edit(&mut report);
    let mut labels = n.labels.clone();
    labels.extend(offload_api::labels::published(&report));
    NodeInfo::new(n.name.clone(), labels, Some(Ok(report)))
}

/// The index of some nodes.
pub(super) fn idx(nodes: &[NodeInfo]) -> NodeIndex {
    NodeIndex::new(nodes.to_vec())
}

pub(super) fn deepspeed(version: &str) -> JobRequest {
    JobRequest {
        offload: OffloadSpec::default(),
        framework: FrameworkSpec {
            name: Framework::DeepSpeed,
            version: Some(version.to_string()),
        },
        deepspeed: DeepSpeedRequest::default(),
        model: None,
        pods: 1,
        gpus_per_pod: 1,
        ..JobRequest::default()
    }
}

pub(super) fn fsdp(torch: &str) -> JobRequest {
    JobRequest {
        framework: FrameworkSpec {
            name: Framework::Fsdp,
            version: Some(torch.to_string()),
        },
        ..deepspeed("0")
    }
}

pub(super) fn megatron(version: &str) -> JobRequest {
    JobRequest {
        framework: FrameworkSpec {
            name: Framework::Megatron,
            version: Some(version.to_string()),
        },
        ..deepspeed("0")
    }
}

pub(super) fn generic() -> JobRequest {
    JobRequest {
        framework: FrameworkSpec {
            name: Framework::Generic,
            version: None,
        },
        ..deepspeed("0")
    }
}

pub(super) fn profile() -> OffloadProfileSpec {
    OffloadProfileSpec::default()
}

pub(super) fn resolve(job: &JobRequest, nodes: &[NodeInfo]) -> Result<Resolution, ResolveError> {
    resolve_offload(job, "default", &profile(), &idx(nodes))
}

pub(super) fn reason(res: &Resolution, field: Field) -> String {
    res.reasons
        .iter()
        .filter(|r| r.field == field)
        .map(|r| r.message.clone())
        .collect::<Vec<_>>()
        .join(" | ")
}

pub(super) fn ds_plan(res: &Resolution) -> &DeepSpeedPlan {
    match &res.framework {
        FrameworkPlan::DeepSpeed(p) => p,
        other => panic!("expected a DeepSpeed plan, got {other:?}"),
    }
}

/// Model hints of `parameters` total parameters and `tokens` per step.
pub(super) fn hints(parameters: u64, tokens: i64) -> offload_api::v1alpha1::ModelHints {
    offload_api::v1alpha1::ModelHints {
        tokens_per_step: Some(tokens),
        ..offload_api::v1alpha1::ModelHints::parameters(
            offload_api::quantity::ParameterCount::new(parameters).expect("a valid count"),
        )
    }
}

/// Hints of the benchmark's decoder (`hack/gpu/ds_step.py`): width 4096, vocabulary 32000, and
/// `tokens` per step on each GPU.
pub(super) fn bench_hints(
    parameters: u64,
    tokens: i64,
    layers: i64,
) -> offload_api::v1alpha1::ModelHints {
    offload_api::v1alpha1::ModelHints {
        hidden_size: Some(4096),
        layers: Some(layers),
        vocab_size: Some(32000),
        ..hints(parameters, tokens)
    }
}

/// The node with this much allocatable host memory.
pub(super) fn with_host(n: NodeInfo, bytes: u64) -> NodeInfo {
    n.with_allocatable(crate::index::Allocatable {
        memory: Some(bytes),
        gpus: None,
        cpus: None,
        ..Default::default()
    })
}
