//! Table tests for every branch of the decision, and property tests for its invariants.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use proptest::prelude::*;

use super::*;
use crate::api::{Framework, FrameworkSpec, ModeSetting, ModelHints, OffloadProfileSpec};
use crate::index::{NodeIndex, NodeInfo};
use crate::names;
use crate::report::NodeReport;
use offload_testenv::fixtures;

// ---- helpers -------------------------------------------------------------------------------

/// A node carrying a fixture report and the labels the agent derives from it.
fn node_from(name: &str, fixture: &str) -> NodeInfo {
    let mut report = NodeReport::parse(fixture).unwrap();
    report.node = name.to_string();
    let annotations = BTreeMap::from([(
        names::ANNOTATION_NODE_REPORT.to_string(),
        report.to_annotation().unwrap(),
    )]);
    NodeInfo::from_metadata(name, report.labels(), &annotations)
}

fn gh200(name: &str) -> NodeInfo {
    node_from(name, fixtures::GH200_REFERENCE)
}

fn h200(name: &str) -> NodeInfo {
    node_from(name, fixtures::H200_READING)
}

fn hmm(name: &str) -> NodeInfo {
    node_from(name, fixtures::HMM_UNPINNED)
}

/// A node the agent has never labelled.
fn unreported(name: &str) -> NodeInfo {
    NodeInfo::new(
        name,
        BTreeMap::from([("kubernetes.io/hostname".to_string(), name.to_string())]),
        None,
    )
}

/// The node with one more (or one changed) label, its report untouched.
fn with_label(n: NodeInfo, k: &str, v: &str) -> NodeInfo {
    let mut labels = n.labels.clone();
    labels.insert(k.to_string(), v.to_string());
    NodeInfo::new(n.name.clone(), labels, n.report.clone())
}

/// The node re-published by the agent with an edited report (labels follow the report).
fn with_report(n: NodeInfo, edit: impl FnOnce(&mut NodeReport)) -> NodeInfo {
    let mut report = n.parsed_report().cloned().unwrap();
    edit(&mut report);
    let mut labels = n.labels.clone();
    labels.extend(report.labels());
    NodeInfo::new(n.name.clone(), labels, Some(Ok(report)))
}

/// The index of some nodes.
fn idx(nodes: &[NodeInfo]) -> NodeIndex {
    NodeIndex::new(nodes.to_vec())
}

fn deepspeed(version: &str) -> JobRequest {
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
    }
}

fn fsdp(torch: &str) -> JobRequest {
    JobRequest {
        framework: FrameworkSpec {
            name: Framework::Fsdp,
            version: Some(torch.to_string()),
        },
        ..deepspeed("0")
    }
}

fn generic() -> JobRequest {
    JobRequest {
        framework: FrameworkSpec {
            name: Framework::Generic,
            version: None,
        },
        ..deepspeed("0")
    }
}

fn profile() -> OffloadProfileSpec {
    OffloadProfileSpec::default()
}

fn resolve(job: &JobRequest, nodes: &[NodeInfo]) -> Result<Resolution, ResolveError> {
    resolve_offload(job, "default", &profile(), &idx(nodes))
}

fn reason(res: &Resolution, field: Field) -> String {
    res.reasons
        .iter()
        .filter(|r| r.field == field)
        .map(|r| r.message.clone())
        .collect::<Vec<_>>()
        .join(" | ")
}

fn ds_plan(res: &Resolution) -> &DeepSpeedPlan {
    match &res.framework {
        FrameworkPlan::DeepSpeed(p) => p,
        other => panic!("expected a DeepSpeed plan, got {other:?}"),
    }
}

// ---- node classes and mode -------------------------------------------------------------------

#[test]
fn coherent_nodes_get_unified_memory_with_superoffload() {
    let res = resolve(&deepspeed("0.19.8"), &[gh200("gh-a"), gh200("gh-b")]).unwrap();
    assert_eq!(res.mode, OffloadMode::UnifiedMemory);
    assert_eq!(res.node_class, Some(NodeClass::Coherent));
    assert!(res.overlap, "{}", reason(&res, Field::Overlap));
    assert!(reason(&res, Field::Overlap).contains("0.91"));
    assert!(res.pin_memory);
    assert_eq!(res.ratio, 1.0);
    assert!(ds_plan(&res).super_offload);
    assert!(reason(&res, Field::Framework).contains("SuperOffload on"));
}

#[test]
fn discrete_nodes_get_cpu_copy_and_never_superoffload_by_themselves() {
    let res = resolve(&deepspeed("0.19.8"), &[h200("h-a")]).unwrap();
    assert_eq!(res.mode, OffloadMode::CpuCopy);
    assert_eq!(res.node_class, Some(NodeClass::Discrete));
    assert!(res.overlap);
    assert!(!ds_plan(&res).super_offload);
    assert!(reason(&res, Field::Framework).contains("not SuperOffload"));
}

#[test]
fn hmm_nodes_are_discrete_class_and_unpinnable_memory_turns_pinning_and_overlap_off() {
    let res = resolve(&deepspeed("0.19.8"), &[hmm("p-a")]).unwrap();
    assert_eq!(res.mode, OffloadMode::CpuCopy);
    assert_eq!(res.node_class, Some(NodeClass::Discrete));
    assert!(!res.overlap);
    assert!(reason(&res, Field::Overlap).contains("failed on node p-a"));
    assert!(!res.pin_memory);
    let why = reason(&res, Field::PinMemory);
    assert!(
        why.contains("could not allocate pinned memory on p-a"),
        "{why}"
    );
    assert!(why.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{why}");
}

#[test]
fn explicit_pin_memory_wins_over_an_unpinnable_node() {
    let mut job = deepspeed("0.19.8");
    job.offload.pin_memory = Switch::Enabled;
    let res = resolve(&job, &[hmm("p-a")]).unwrap();
    assert!(res.pin_memory);
    let why = reason(&res, Field::PinMemory);
    assert!(why.contains("pod's memory limit"), "{why}");
}

/// A node's error text reaches every job's status: it is bounded there.
#[test]
fn a_huge_pinned_error_is_cut_in_the_reason() {
    let node = with_report(hmm("p-a"), |r| {
        r.selftest.pinned_error = Some("E".repeat(200_000));
    });
    let res = resolve(&deepspeed("0.19.8"), &[node]).unwrap();
    let why = reason(&res, Field::PinMemory);
    assert!(why.len() < 600, "{} bytes", why.len());
    assert!(why.contains('…'));
}

#[test]
fn unreported_nodes_are_not_candidates() {
    let err = resolve(&deepspeed("0.19.8"), &[unreported("cpu-0")]).unwrap_err();
    assert!(matches!(err, ResolveError::NoReportedNodes { .. }), "{err}");
    assert!(err.to_string().contains("offload-agent"));
    assert!(err.depends_on_cluster());
    assert_eq!(
        resolve(&deepspeed("0.19.8"), &[]).unwrap_err().category(),
        "NoReportedNodes"
    );
}

#[test]
fn hand_labelled_uma_without_ats_is_not_coherent_nor_a_candidate() {
    let fake = with_label(h200("fake"), names::LABEL_UMA, "true");
    assert_eq!(fake.class(), None);
    let err = resolve(&deepspeed("0.19.8"), &[fake]).unwrap_err();
    assert!(matches!(err, ResolveError::NoReportedNodes { .. }));
}

#[test]
fn mixed_cluster_prefers_the_profile_order() {
    let nodes = [h200("h-a"), gh200("gh-a")];
    let res = resolve(&deepspeed("0.19.8"), &nodes).unwrap();
    assert_eq!(res.node_class, Some(NodeClass::Coherent));
    assert!(reason(&res, Field::NodeClass).contains("comes first"));

    let mut discrete_first = profile();
    discrete_first.node_class_order = vec![NodeClass::Discrete, NodeClass::Coherent];
    let res = resolve_offload(&deepspeed("0.19.8"), "p", &discrete_first, &idx(&nodes)).unwrap();
    assert_eq!(res.node_class, Some(NodeClass::Discrete));
    assert_eq!(res.mode, OffloadMode::CpuCopy);
}

#[test]
fn mixed_cluster_falls_back_to_the_class_with_capacity() {
    let nodes = [gh200("gh-a"), h200("h-a"), h200("h-b")];
    let mut job = deepspeed("0.19.8");
    job.pods = 2;
    let res = resolve(&job, &nodes).unwrap();
    assert_eq!(res.node_class, Some(NodeClass::Discrete));
    assert!(
        reason(&res, Field::NodeClass).contains("too few GPUs (1 of 2)"),
        "{}",
        reason(&res, Field::NodeClass)
    );

    job.pods = 5;
    let res = resolve(&job, &nodes).unwrap();
    assert_eq!(
        res.node_class,
        Some(NodeClass::Coherent),
        "no class fits: the first in order wins"
    );
    assert!(reason(&res, Field::NodeClass).contains("pods wait for capacity"));
}

#[test]
fn unified_memory_without_coherent_nodes_is_a_clear_error() {
    let mut job = deepspeed("0.19.8");
    job.offload.mode = ModeSetting::UnifiedMemory;
    let err = resolve(&job, &[h200("h-a"), hmm("p-a")]).unwrap_err();
    assert_eq!(
        err,
        ResolveError::NoCoherentNodes {
            profile: "default".into(),
            discrete: 2
        }
    );
    let msg = err.to_string();
    assert!(msg.contains("set offload.mode to Auto or CPUCopy"), "{msg}");
    assert!(err.depends_on_cluster());
    // ... and resolves once a coherent node appears.
    let res = resolve(&job, &[h200("h-a"), gh200("gh-a")]).unwrap();
    assert_eq!(res.mode, OffloadMode::UnifiedMemory);
    assert!(reason(&res, Field::Mode).contains("requested by the job"));
}

#[test]
fn unified_memory_from_the_profile_says_so() {
    let mut p = profile();
    p.mode = ModeSetting::UnifiedMemory;
    let res = resolve_offload(&deepspeed("0.19.8"), "uma", &p, &idx(&[gh200("gh-a")])).unwrap();
    assert!(reason(&res, Field::Mode).contains("requested by the profile"));
}

#[test]
fn cpu_copy_on_coherent_nodes_needs_the_profile_to_allow_it() {
    let mut job = deepspeed("0.19.8");
    job.offload.mode = ModeSetting::CpuCopy;
    let err = resolve(&job, &[gh200("gh-a")]).unwrap_err();
    assert!(matches!(
        err,
        ResolveError::CopyOnCoherentNotAllowed { coherent: 1, .. }
    ));
    assert!(err.to_string().contains("allowCPUCopyOnCoherentNodes"));

    let mut p = profile();
    p.allow_cpu_copy_on_coherent_nodes = true;
    let res = resolve_offload(&job, "copy", &p, &idx(&[gh200("gh-a")])).unwrap();
    assert_eq!(res.mode, OffloadMode::CpuCopy);
    assert_eq!(res.node_class, Some(NodeClass::Coherent));
    assert!(
        !ds_plan(&res).super_offload,
        "CPUCopy never turns SuperOffload on by itself"
    );
}

#[test]
fn cpu_copy_prefers_discrete_nodes_in_a_mixed_cluster() {
    let mut job = deepspeed("0.19.8");
    job.offload.mode = ModeSetting::CpuCopy;
    let res = resolve(&job, &[gh200("gh-a"), h200("h-a")]).unwrap();
    assert_eq!(res.node_class, Some(NodeClass::Discrete));
}

#[test]
fn disabled_needs_no_node_class() {
    let mut job = deepspeed("0.19.8");
    job.offload.mode = ModeSetting::Disabled;
    let res = resolve(&job, &[]).unwrap();
    assert_eq!(res.mode, OffloadMode::Disabled);
    assert_eq!(res.node_class, None);
    assert!(!res.overlap && !res.pin_memory);
    assert_eq!(res.ratio, 1.0);
    assert!(!ds_plan(&res).super_offload);
}

#[test]
fn profile_selector_narrows_the_candidates() {
    let nodes = [gh200("gh-a"), with_label(h200("h-a"), "pool", "train")];
    let mut p = profile();
    p.node_selector = Some(LabelSelector {
        match_labels: Some(BTreeMap::from([("pool".into(), "train".into())])),
        match_expressions: None,
    });
    let res = resolve_offload(&deepspeed("0.19.8"), "train", &p, &idx(&nodes)).unwrap();
    assert_eq!(res.node_class, Some(NodeClass::Discrete));
    assert_eq!(res.node_selector, p.node_selector);

    p.node_selector = Some(LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "pool".into(),
            operator: "Near".into(),
            values: None,
        }]),
    });
    let err = resolve_offload(&deepspeed("0.19.8"), "train", &p, &idx(&nodes)).unwrap_err();
    assert_eq!(err.category(), "InvalidProfileSelector");
}

// ---- overlap ---------------------------------------------------------------------------------

#[test]
fn overlap_auto_compares_the_lowest_efficiency_with_the_profile_minimum() {
    let mut strict = profile();
    strict.min_overlap_efficiency = 0.95;
    let res = resolve_offload(
        &deepspeed("0.19.8"),
        "strict",
        &strict,
        &idx(&[gh200("gh-a")]),
    )
    .unwrap();
    assert!(!res.overlap);
    let why = reason(&res, Field::Overlap);
    assert!(why.contains("0.91") && why.contains("0.95"), "{why}");
    assert_eq!(res.overlap_efficiency, Some(0.91));
    assert!(!ds_plan(&res).super_offload, "no overlap, no SuperOffload");

    let slow = with_report(gh200("gh-b"), |r| r.selftest.efficiency = Some(0.82));
    let res = resolve(&deepspeed("0.19.8"), &[gh200("gh-a"), slow]).unwrap();
    assert!(res.overlap);
    assert!(reason(&res, Field::Overlap).contains("0.82 on gh-b"));
}

#[test]
fn overlap_auto_is_off_when_any_chosen_node_is_untested_or_unreadable() {
    let untested = with_report(gh200("gh-b"), |r| {
        r.selftest.verdict = crate::report::OverlapVerdict::Untested;
        r.selftest.efficiency = None;
    });
    let res = resolve(&deepspeed("0.19.8"), &[gh200("gh-a"), untested]).unwrap();
    assert!(!res.overlap);
    assert!(reason(&res, Field::Overlap).contains("gh-b has not run"));

    // A label that contradicts the report is a conflict, not a verdict.
    let conflicting = with_label(gh200("gh-c"), names::LABEL_OVERLAP, "failed");
    let res = resolve(&deepspeed("0.19.8"), &[conflicting]).unwrap();
    assert!(!res.overlap);
    let why = reason(&res, Field::Overlap);
    assert!(why.contains("contradicts its report"), "{why}");

    // An unreadable report makes the node no candidate at all.
    let broken = NodeInfo::new(
        "gh-d",
        gh200("gh-d").labels,
        Some(NodeReport::parse("{\"schemaVersion\": 99}")),
    );
    let err = resolve(&deepspeed("0.19.8"), &[broken]).unwrap_err();
    assert!(matches!(err, ResolveError::NoReportedNodes { .. }), "{err}");
}

#[test]
fn overlap_enabled_or_disabled_by_the_job_wins() {
    let mut job = deepspeed("0.19.8");
    job.offload.overlap = OverlapSetting::Enabled;
    let res = resolve(&job, &[hmm("p-a")]).unwrap();
    assert!(res.overlap);
    assert!(reason(&res, Field::Overlap).contains("0.12"));
    job.offload.overlap = OverlapSetting::Disabled;
    let res = resolve(&job, &[gh200("gh-a")]).unwrap();
    assert!(!res.overlap);
    assert!(!ds_plan(&res).super_offload);
}

// ---- framework versions ----------------------------------------------------------------------

#[test]
fn superoffload_is_lowered_on_deepspeed_without_it() {
    let res = resolve(&deepspeed("0.17.4"), &[gh200("gh-a")]).unwrap();
    assert!(res.overlap);
    assert!(!ds_plan(&res).super_offload);
    assert!(reason(&res, Field::Framework).contains("lowered"));
}

#[test]
fn superoffload_before_its_fixes_comes_with_a_warning() {
    let res = resolve(&deepspeed("0.18.2"), &[gh200("gh-a")]).unwrap();
    assert!(ds_plan(&res).super_offload);
    assert!(reason(&res, Field::Framework).contains("0.18.9"));
}

#[test]
fn explicit_superoffload_needs_a_version_that_has_it() {
    let mut job = deepspeed("0.17.4");
    job.deepspeed.super_offload = Some(true);
    let err = resolve(&job, &[gh200("gh-a")]).unwrap_err();
    assert_eq!(err.category(), "FrameworkCannotTakeConfig");
    assert!(err.to_string().contains("0.18.0"), "{err}");
    assert!(!err.depends_on_cluster());

    let mut job = deepspeed("0.19.8");
    job.deepspeed.super_offload = Some(true);
    let res = resolve(&job, &[h200("h-a")]).unwrap();
    assert!(
        ds_plan(&res).super_offload,
        "explicitly asked for, even on discrete nodes"
    );
    assert!(reason(&res, Field::Framework).contains("slower"));
}

#[test]
fn versions_are_required_parsed_and_bounded() {
    let mut job = deepspeed("0.19.8");
    job.framework.version = None;
    assert_eq!(
        resolve(&job, &[h200("h")]).unwrap_err().category(),
        "MissingFrameworkVersion"
    );
    let err = resolve(&deepspeed("latest"), &[h200("h")]).unwrap_err();
    assert_eq!(err.category(), "InvalidFrameworkVersion");
    assert!(err.to_string().contains("latest"));
    let err = resolve(&deepspeed("0.9.5"), &[h200("h")]).unwrap_err();
    assert_eq!(err.category(), "UnsupportedFrameworkVersion");
    assert!(err.to_string().contains("0.10.0"), "{err}");
    assert_eq!(
        resolve(&fsdp("1.10"), &[h200("h")]).unwrap_err().category(),
        "UnsupportedFrameworkVersion"
    );
    // Generic needs no version.
    assert!(resolve(&generic(), &[h200("h")]).is_ok());
}

#[test]
fn zero_stage_comes_from_spec_or_config_and_must_agree() {
    let mut job = deepspeed("0.19.8");
    job.deepspeed.stage_in_spec = Some(2);
    job.deepspeed.stage_in_config = Some(3);
    assert_eq!(
        resolve(&job, &[h200("h")]).unwrap_err().category(),
        "ZeroStageConflict"
    );
    job.deepspeed.stage_in_spec = None;
    let res = resolve(&job, &[h200("h")]).unwrap();
    assert_eq!(ds_plan(&res).stage, 3);
    assert!(!ds_plan(&res).write_stage);
    let res = resolve(&deepspeed("0.19.8"), &[h200("h")]).unwrap();
    assert!(ds_plan(&res).write_stage);
    assert!(reason(&res, Field::Framework).contains("assumed"));
}

#[test]
fn offload_params_needs_stage_three() {
    let mut job = deepspeed("0.19.8");
    job.deepspeed.offload_params = true;
    job.deepspeed.stage_in_spec = Some(2);
    let err = resolve(&job, &[h200("h")]).unwrap_err();
    assert!(err.to_string().contains("stage 3"), "{err}");
    job.deepspeed.stage_in_spec = Some(3);
    assert!(ds_plan(&resolve(&job, &[h200("h")]).unwrap()).offload_params);
}

// ---- ratio -----------------------------------------------------------------------------------

#[test]
fn a_job_ratio_the_framework_cannot_take_is_rejected_with_what_to_change() {
    let mut job = deepspeed("0.19.8");
    job.offload.offload_ratio = RatioSetting::Fixed(0.5);
    job.deepspeed.stage_in_spec = Some(2);
    let err = resolve(&job, &[h200("h")]).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("stage 3") && msg.contains("set offload.offloadRatio to 1 or Auto"),
        "{msg}"
    );

    let mut old = deepspeed("0.12.2");
    old.offload.offload_ratio = RatioSetting::Fixed(0.5);
    let msg = resolve(&old, &[h200("h")]).unwrap_err().to_string();
    assert!(msg.contains("0.12.3"), "{msg}");

    let mut f = fsdp("2.6.0");
    f.offload.offload_ratio = RatioSetting::Fixed(0.5);
    assert!(
        resolve(&f, &[h200("h")])
            .unwrap_err()
            .to_string()
            .contains("FSDP has no partial-offload")
    );
}

#[test]
fn a_profile_ratio_the_framework_cannot_take_is_lowered() {
    let mut p = profile();
    p.offload_ratio = RatioSetting::Fixed(0.5);
    let res = resolve_offload(&fsdp("2.6.0"), "half", &p, &idx(&[h200("h")])).unwrap();
    assert_eq!(res.ratio, 1.0);
    assert!(reason(&res, Field::OffloadRatio).contains("lowered"));
    let res = resolve_offload(&deepspeed("0.19.8"), "half", &p, &idx(&[h200("h")])).unwrap();
    assert_eq!(res.ratio, 0.5);
    assert!(ds_plan(&res).write_ratio);
}

#[test]
fn auto_ratio_uses_model_hints_and_the_slowest_node() {
    let mut job = deepspeed("0.19.8");
    job.model = Some(ModelHints {
        parameters: 1_000_000_000,
        tokens_per_step: 4096,
    });
    // H200 reading: 1.2e9 params/s CPU, 3e14 FLOP/s GPU.
    // t_backward = 4 * 1e9 * 4096 / 3e14 = 54.6 ms; t_cpu = 1e9 / 1.2e9 = 833 ms; share 6.55 %.
    let res = resolve(&job, &[h200("h-a")]).unwrap();
    assert_eq!(res.ratio, 0.06);
    assert!(
        reason(&res, Field::OffloadRatio).contains("7%"),
        "{}",
        reason(&res, Field::OffloadRatio)
    );

    let slower = with_report(h200("h-b"), |r| r.selftest.cpu_update_rate = Some(0.6e9));
    let res = resolve(&job, &[h200("h-a"), slower]).unwrap();
    assert_eq!(
        res.ratio, 0.05,
        "half the CPU rate halves the share, floored at the minimum"
    );
    assert!(reason(&res, Field::OffloadRatio).contains("h-b"));

    job.model = Some(ModelHints {
        parameters: 1_000_000_000,
        tokens_per_step: 1_000_000,
    });
    let res = resolve(&job, &[h200("h-a")]).unwrap();
    assert_eq!(res.ratio, 1.0);
    assert!(reason(&res, Field::OffloadRatio).contains("headroom"));
}

#[test]
fn auto_ratio_without_hints_or_rates_is_one_and_says_why() {
    let res = resolve(&deepspeed("0.19.8"), &[h200("h")]).unwrap();
    assert_eq!(res.ratio, 1.0);
    assert!(reason(&res, Field::OffloadRatio).contains("without model hints"));

    let mut job = deepspeed("0.19.8");
    job.model = Some(ModelHints {
        parameters: 1,
        tokens_per_step: 1,
    });
    let no_rates = with_report(h200("h"), |r| r.selftest.cpu_update_rate = None);
    let res = resolve(&job, &[no_rates]).unwrap();
    assert_eq!(res.ratio, 1.0);
    assert!(reason(&res, Field::OffloadRatio).contains("lacks"));
}

#[test]
fn auto_ratio_is_lowered_where_the_framework_cannot_take_it() {
    let mut job = fsdp("2.6.0");
    job.model = Some(ModelHints {
        parameters: 1_000_000_000,
        tokens_per_step: 4096,
    });
    let res = resolve(&job, &[h200("h")]).unwrap();
    assert_eq!(res.ratio, 1.0);
    assert!(reason(&res, Field::OffloadRatio).contains("lowered because FSDP"));
}

// ---- FSDP and Generic ------------------------------------------------------------------------

#[test]
fn fsdp_gets_its_generation_and_param_offload_only_for_cpu_copy() {
    let res = resolve(&fsdp("2.6.0+cu124"), &[h200("h")]).unwrap();
    assert_eq!(
        res.framework,
        FrameworkPlan::Fsdp(FsdpPlan {
            fsdp_version: 2,
            offload_params: true
        })
    );
    let res = resolve(&fsdp("2.5.1"), &[gh200("gh")]).unwrap();
    assert_eq!(res.mode, OffloadMode::UnifiedMemory);
    assert_eq!(
        res.framework,
        FrameworkPlan::Fsdp(FsdpPlan {
            fsdp_version: 1,
            offload_params: false
        })
    );
    assert!(reason(&res, Field::Framework).contains("no unified-memory switch"));
}

#[test]
fn generic_jobs_get_env_only() {
    let res = resolve(&generic(), &[gh200("gh")]).unwrap();
    assert_eq!(res.framework, FrameworkPlan::Generic);
    assert!(reason(&res, Field::Framework).contains("env vars only"));
}

#[test]
fn concrete_spec_has_no_auto_left() {
    let res = resolve(&deepspeed("0.19.8"), &[gh200("gh")]).unwrap();
    let spec = res.concrete_spec();
    assert!(spec.is_concrete());
    assert_eq!(spec.mode, ModeSetting::UnifiedMemory);
    assert_eq!(spec.overlap, OverlapSetting::Enabled);
}

// ---- properties ------------------------------------------------------------------------------

/// Any combination of agent labels, including contradictory hand-made ones.
fn arb_node() -> impl Strategy<Value = NodeInfo> {
    let uma = prop::option::of(prop::sample::select(vec!["true", "false", "yes"]));
    let mode = prop::option::of(prop::sample::select(vec!["ats", "hmm", "none"]));
    let c2c = prop::option::of(prop::sample::select(vec!["true", "false"]));
    let overlap = prop::option::of(prop::sample::select(vec!["verified", "failed", "untested"]));
    let fixture = prop::sample::select(vec![
        Some(fixtures::GH200_REFERENCE),
        Some(fixtures::H200_READING),
        Some(fixtures::HMM_UNPINNED),
        None,
    ]);
    let efficiency = prop::option::of(0.0f64..1.0);
    (0u32..1000, uma, mode, c2c, overlap, fixture, efficiency).prop_map(
        |(id, uma, mode, c2c, overlap, fixture, efficiency)| {
            let name = format!("node-{id}");
            let mut labels = BTreeMap::new();
            for (k, v) in [
                (names::LABEL_UMA, uma),
                (names::LABEL_ADDRESSING_MODE, mode),
                (names::LABEL_C2C, c2c),
                (names::LABEL_OVERLAP, overlap),
            ] {
                if let Some(v) = v {
                    labels.insert(k.to_string(), v.to_string());
                }
            }
            let report = fixture.map(|f| {
                let mut r = NodeReport::parse(f).unwrap();
                r.selftest.efficiency = efficiency;
                Ok(r)
            });
            NodeInfo::new(name, labels, report)
        },
    )
}

/// Up to 8 nodes with unique names, as in a real cluster.
fn arb_nodes() -> impl Strategy<Value = Vec<NodeInfo>> {
    prop::collection::vec(arb_node(), 0..8).prop_map(|mut nodes| {
        for (i, n) in nodes.iter_mut().enumerate() {
            n.name = format!("node-{i}");
        }
        nodes
    })
}

fn arb_job() -> impl Strategy<Value = JobRequest> {
    let mode = prop::sample::select(vec![
        ModeSetting::Auto,
        ModeSetting::UnifiedMemory,
        ModeSetting::CpuCopy,
        ModeSetting::Disabled,
    ]);
    let overlap = prop::sample::select(vec![
        OverlapSetting::Auto,
        OverlapSetting::Enabled,
        OverlapSetting::Disabled,
    ]);
    let ratio = prop_oneof![
        Just(RatioSetting::Auto),
        (0.01f64..=1.0).prop_map(RatioSetting::Fixed)
    ];
    let framework = prop::sample::select(vec![
        (Framework::DeepSpeed, Some("0.10.0")),
        (Framework::DeepSpeed, Some("0.12.3")),
        (Framework::DeepSpeed, Some("0.17.4")),
        (Framework::DeepSpeed, Some("0.18.0")),
        (Framework::DeepSpeed, Some("0.18.9")),
        (Framework::DeepSpeed, Some("0.19.8")),
        (Framework::Fsdp, Some("2.4.0")),
        (Framework::Fsdp, Some("2.7.1")),
        (Framework::Generic, None),
    ]);
    let stage = prop::option::of(0u8..=3);
    let hints = prop::option::of((1i64..100_000_000_000, 1i64..10_000_000));
    (
        mode,
        overlap,
        ratio,
        framework,
        stage,
        any::<bool>(),
        prop::option::of(any::<bool>()),
        hints,
        1u32..16,
    )
        .prop_map(
            |(mode, overlap, ratio, (fw, v), stage, params, sup, hints, pods)| JobRequest {
                offload: OffloadSpec {
                    mode,
                    overlap,
                    offload_ratio: ratio,
                    pin_memory: Switch::Auto,
                },
                framework: FrameworkSpec {
                    name: fw,
                    version: v.map(str::to_string),
                },
                deepspeed: DeepSpeedRequest {
                    stage_in_config: None,
                    stage_in_spec: stage,
                    offload_params: params,
                    super_offload: sup,
                },
                model: hints.map(|(parameters, tokens_per_step)| ModelHints {
                    parameters,
                    tokens_per_step,
                }),
                pods,
                gpus_per_pod: 1,
            },
        )
}

fn arb_profile() -> impl Strategy<Value = OffloadProfileSpec> {
    let order = prop::sample::select(vec![
        vec![NodeClass::Coherent, NodeClass::Discrete],
        vec![NodeClass::Discrete, NodeClass::Coherent],
        vec![NodeClass::Discrete],
    ]);
    (0.0f64..=1.0, order, any::<bool>(), any::<bool>()).prop_map(|(min, order, allow, pin)| {
        OffloadProfileSpec {
            min_overlap_efficiency: min,
            node_class_order: order,
            allow_cpu_copy_on_coherent_nodes: allow,
            pin_memory: pin,
            ..OffloadProfileSpec::default()
        }
    })
}

/// Whether a node's labels satisfy node-selector requirements (In / NotIn / Exists).
fn admits(
    reqs: &[k8s_openapi::api::core::v1::NodeSelectorRequirement],
    labels: &BTreeMap<String, String>,
) -> bool {
    reqs.iter().all(|r| {
        let v = labels.get(&r.key);
        let vals = r.values.clone().unwrap_or_default();
        match r.operator.as_str() {
            "In" => v.is_some_and(|v| vals.contains(v)),
            "NotIn" => v.is_none_or(|v| !vals.contains(v)),
            "Exists" => v.is_some(),
            "DoesNotExist" => v.is_none(),
            _ => false,
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// A unified-memory configuration is never bound to a node class without ATS+C2C, and the
    /// affinity it renders admits only coherent nodes.
    #[test]
    fn unified_memory_only_ever_lands_on_coherent_nodes(
        job in arb_job(), p in arb_profile(), nodes in arb_nodes()
    ) {
        if let Ok(res) = resolve_offload(&job, "p", &p, &idx(&nodes)) {
            let reqs = crate::render::node_requirements(&res);
            if res.mode == OffloadMode::UnifiedMemory {
                prop_assert_eq!(res.node_class, Some(NodeClass::Coherent));
            }
            if let Some(class) = res.node_class {
                // Scheduling admits only nodes whose labels state the class; the nodes the
                // decision counted for it are of that class by their reports. (A node whose
                // labels lie about its report is never counted; the start-up guard stops a pod
                // that lands on one.)
                for n in &nodes {
                    if admits(&reqs, &n.labels) {
                        let labelled = crate::labels::NodeLabels::parse(&n.labels)
                            .ok()
                            .flatten()
                            .and_then(|l| l.class());
                        prop_assert_eq!(labelled, Some(class),
                            "{} admitted for {:?} with labels {:?}", &n.name, class, &n.labels);
                    }
                }
                for n in idx(&nodes).class(class) {
                    prop_assert!(n.memory_model().is_some_and(|m| class_admits(class, m)),
                        "{} counted for {:?}", &n.name, class);
                }
            }
        }
    }

    /// Resolving twice, or with the nodes in another order, gives the same result.
    #[test]
    fn resolution_is_deterministic(
        job in arb_job(), p in arb_profile(), nodes in arb_nodes()
    ) {
        let first = resolve_offload(&job, "p", &p, &idx(&nodes));
        prop_assert_eq!(&first, &resolve_offload(&job, "p", &p, &idx(&nodes)));
        let mut reversed = nodes.clone();
        reversed.reverse();
        prop_assert_eq!(&first, &resolve_offload(&job, "p", &p, &idx(&reversed)));
    }

    /// Every output carries a reason for every field; every error says what to change.
    #[test]
    fn every_outcome_is_explained(
        job in arb_job(), p in arb_profile(), nodes in arb_nodes()
    ) {
        match resolve_offload(&job, "p", &p, &idx(&nodes)) {
            Ok(res) => {
                for field in Field::ALL {
                    prop_assert!(res.reasons.iter().any(|r| r.field == field && !r.message.is_empty()),
                        "no reason for {:?}: {:?}", field, res.reasons);
                }
                prop_assert!(RatioSetting::is_valid_ratio(res.ratio));
            }
            Err(err) => prop_assert!(err.to_string().contains(':'), "{}", err),
        }
    }

    /// The rendered DeepSpeed JSON contains only keys the declared version accepts.
    #[test]
    fn rendered_deepspeed_only_has_accepted_keys(
        job in arb_job(), p in arb_profile(), nodes in arb_nodes()
    ) {
        if let Ok(res) = resolve_offload(&job, "p", &p, &idx(&nodes))
            && let FrameworkPlan::DeepSpeed(plan) = &res.framework
        {
            let doc = crate::render::deepspeed::render_section(&res, plan);
            let zero = &doc["zero_optimization"];
            let accepted = crate::render::deepspeed::accepted_offload_optimizer_keys(&plan.version, plan.stage);
            for key in zero["offload_optimizer"].as_object().unwrap().keys() {
                prop_assert!(accepted.contains(key.as_str()), "{} not accepted by {} stage {}", key, plan.version, plan.stage);
            }
            if let Some(param) = zero.get("offload_param") {
                prop_assert_eq!(plan.stage, 3);
                let accepted = crate::render::deepspeed::accepted_offload_param_keys();
                for key in param.as_object().unwrap().keys() {
                    prop_assert!(accepted.contains(key.as_str()));
                }
            }
            prop_assert!(zero["offload_optimizer"].get("pin_memory").is_some(), "pin_memory always explicit");
        }
    }
}
