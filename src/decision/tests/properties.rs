//! Properties that hold for any job, profile and set of nodes.

use super::*;
use offload_api::v1alpha1::{ModeSetting, NodeClass, OffloadMode, RatioSetting};
use proptest::prelude::*;

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
    let hints = prop::option::of((1u64..100_000_000_000, 1i64..10_000_000));
    (
        mode,
        overlap,
        ratio,
        framework,
        stage,
        prop::option::of(any::<bool>()),
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
                    zen_flow: None,
                    zenflow_in_config: false,
                    ..DeepSpeedRequest::default()
                },
                model: hints
                    .map(|(parameters, tokens_per_step)| super::hints(parameters, tokens_per_step)),
                pods,
                gpus_per_pod: 1,
                ..JobRequest::default()
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
                        let labelled = offload_api::labels::NodeLabels::parse(&n.labels)
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
                // Nothing offloaded is ratio 0; anything offloaded a share in (0, 1].
                let consistent = if res.mode == OffloadMode::Disabled {
                    res.ratio == 0.0 && res.concrete_spec().offload_ratio == RatioSetting::None
                } else {
                    RatioSetting::is_valid_ratio(res.ratio)
                };
                prop_assert!(consistent, "ratio {} with mode {}", res.ratio, res.mode);
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
            // Nothing offloaded, and the user wrote no section: none is added.
            if res.mode == OffloadMode::Disabled {
                prop_assert!(zero.get("offload_optimizer").is_none(), "{}", doc);
                return Ok(());
            }
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
