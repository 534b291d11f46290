//! Mode and node class: which nodes a profile may use and which class a job gets.

use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use offload_api::v1alpha1::{ModeSetting, NodeClass, OffloadMode, RatioSetting};

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

    // No class holds 5 pods at once: a TrainingJob is held, saying what it needs and what
    // each class has (its ranks would never meet otherwise).
    job.pods = 5;
    let err = resolve(&job, &nodes).unwrap_err();
    assert_eq!(err.category(), "InsufficientGPUs");
    assert!(err.depends_on_cluster(), "resolved when nodes arrive");
    let msg = err.to_string();
    assert!(
        msg.contains("5 pods of 1 GPU at once (5 GPUs in all)")
            && msg.contains("Coherent holds 1 such pod")
            && msg.contains("Discrete holds 2 such pods"),
        "{msg}"
    );

    // Another kind's pods are created now: placed on the first class, and they wait.
    job.hold_for_capacity = false;
    let res = resolve(&job, &nodes).unwrap();
    assert_eq!(res.node_class, Some(NodeClass::Coherent));
    assert!(reason(&res, Field::NodeClass).contains("pods wait for capacity"));
}

#[test]
fn pods_of_several_gpus_count_only_nodes_that_hold_a_whole_pod() {
    // Two one-GPU nodes hold two GPUs, but no pod of two GPUs.
    let nodes = [h200("h-a"), h200("h-b")];
    let mut job = deepspeed("0.19.8");
    job.gpus_per_pod = 2;
    let err = resolve(&job, &nodes).unwrap_err();
    assert_eq!(err.category(), "InsufficientGPUs", "{err}");
    assert!(
        err.to_string()
            .contains("Discrete holds 0 such pods (2 GPUs)"),
        "{err}"
    );
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
    assert!(
        msg.contains("set spec.offload.mode to Auto or CPUCopy"),
        "{msg}"
    );
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
    // Nothing offloaded reads as nothing offloaded: ratio 0, `None` in the spec.
    assert_eq!(res.ratio, 0.0);
    assert_eq!(res.concrete_spec().offload_ratio, RatioSetting::None);
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

fn gpu_tainted(n: NodeInfo) -> NodeInfo {
    n.with_taints(vec![crate::index::NodeTaint {
        key: "nvidia.com/gpu".into(),
        value: Some("present".into()),
        effect: "NoSchedule".into(),
    }])
}

fn labelled(n: NodeInfo) -> NodeInfo {
    // What the agent publishes: the memory model label.
    let uma = n
        .parsed_report()
        .map(|r| r.memory_model == offload_api::report::NodeMemoryModel::Coherent);
    let mut n = n;
    n.labels
        .insert(names_uma().into(), uma.unwrap_or(false).to_string());
    n
}

fn names_uma() -> &'static str {
    offload_api::names::LABEL_UMA
}

#[test]
fn the_templates_node_selector_narrows_the_classes_before_one_is_chosen() {
    let nodes = [labelled(gh200("gh-a")), labelled(h200("h-a"))];
    // Coherent comes first in the profile's order; a template that asks for discrete nodes
    // gets them.
    assert_eq!(
        resolve(&deepspeed("0.19.8"), &nodes).unwrap().mode,
        OffloadMode::UnifiedMemory
    );
    let mut job = deepspeed("0.19.8");
    job.constraints.node_selector = [(names_uma().to_string(), "false".to_string())].into();
    let res = resolve(&job, &nodes).unwrap();
    assert_eq!(res.mode, OffloadMode::CpuCopy, "{}", res.summary());
    assert_eq!(res.node_class, Some(NodeClass::Discrete));
    // Required affinity NotIn [true] says the same.
    let mut job = deepspeed("0.19.8");
    job.constraints.required_terms = Some(vec![k8s_openapi::api::core::v1::NodeSelectorTerm {
        match_expressions: Some(vec![k8s_openapi::api::core::v1::NodeSelectorRequirement {
            key: names_uma().into(),
            operator: "NotIn".into(),
            values: Some(vec!["true".into()]),
        }]),
        match_fields: None,
    }]);
    assert_eq!(
        resolve(&job, &nodes).unwrap().node_class,
        Some(NodeClass::Discrete)
    );
}

#[test]
fn a_template_that_leaves_no_node_is_held_with_what_it_leaves_out() {
    let nodes = [gpu_tainted(gh200("gh-a")), gpu_tainted(h200("h-a"))];
    let err = resolve(&deepspeed("0.19.8"), &nodes).unwrap_err();
    assert_eq!(err.category(), "TemplateLeavesNoNodes");
    assert!(err.depends_on_cluster());
    let msg = err.to_string();
    assert!(
        msg.contains("gh-a (its taint nvidia.com/gpu=present:NoSchedule is not tolerated)"),
        "{msg}"
    );
    assert!(msg.contains("no tolerations"), "{msg}");
    // Tolerating it, both classes are there again.
    let mut job = deepspeed("0.19.8");
    job.constraints.tolerations = vec![k8s_openapi::api::core::v1::Toleration {
        key: Some("nvidia.com/gpu".into()),
        operator: Some("Exists".into()),
        ..Default::default()
    }];
    assert_eq!(
        resolve(&job, &nodes).unwrap().mode,
        OffloadMode::UnifiedMemory
    );
    // Only the coherent node tainted: an untolerating job goes to the discrete one.
    let nodes = [gpu_tainted(gh200("gh-a")), h200("h-a")];
    assert_eq!(
        resolve(&deepspeed("0.19.8"), &nodes).unwrap().node_class,
        Some(NodeClass::Discrete)
    );
    // A selector key no node has: held, naming the key.
    let mut job = deepspeed("0.19.8");
    job.constraints.node_selector = [("pool".to_string(), "a".to_string())].into();
    let msg = resolve(&job, &[h200("h-a")]).unwrap_err().to_string();
    assert!(msg.contains("it has no label pool"), "{msg}");
    // UnifiedMemory asked for where the template leaves out the coherent nodes.
    let mut job = deepspeed("0.19.8");
    job.offload.mode = ModeSetting::UnifiedMemory;
    job.constraints.node_selector = [(names_uma().to_string(), "false".to_string())].into();
    let err = resolve(&job, &[labelled(gh200("gh-a")), labelled(h200("h-a"))]).unwrap_err();
    assert_eq!(err.category(), "TemplateLeavesNoNodes");
    assert!(err.to_string().contains("of class Coherent"), "{err}");
}
