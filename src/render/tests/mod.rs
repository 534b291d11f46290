//! Rendering: env vars, DeepSpeed JSON for each version, and pod-template injection.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, EnvVar, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, PodSpec, PodTemplateSpec, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::json;

use super::deepspeed::{merge_config, render_section};
use super::*;
use crate::decision::{
    DeepSpeedConfigError, DeepSpeedRequest, JobRequest, parse_config, resolve_offload, stage_of,
};
use crate::index::{NodeIndex, NodeInfo};
use offload_api::report::NodeReport;
use offload_api::v1alpha1::{Framework, FrameworkSpec, OffloadProfileSpec, OffloadSpec};
use offload_testenv::fixtures;

fn node(name: &str, fixture: &str) -> NodeInfo {
    NodeInfo::from_report(name, &NodeReport::parse(fixture).unwrap())
}

fn job(framework: Framework, version: Option<&str>) -> JobRequest {
    JobRequest {
        offload: OffloadSpec::default(),
        framework: FrameworkSpec {
            name: framework,
            version: version.map(str::to_string),
        },
        deepspeed: DeepSpeedRequest::default(),
        model: None,
        pods: 1,
        gpus_per_pod: 1,
        ..JobRequest::default()
    }
}

fn resolved(framework: Framework, version: Option<&str>, fixture: &str) -> Resolution {
    resolve_offload(
        &job(framework, version),
        "default",
        &OffloadProfileSpec::default(),
        &NodeIndex::new(vec![node("n", fixture)]),
    )
    .unwrap()
}

fn ds_plan(res: &Resolution) -> crate::decision::DeepSpeedPlan {
    match &res.framework {
        FrameworkPlan::DeepSpeed(p) => p.clone(),
        other => panic!("not DeepSpeed: {other:?}"),
    }
}

fn env_map(vars: &[EnvVar]) -> BTreeMap<String, String> {
    vars.iter()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

#[test]
fn env_vars_state_the_whole_decision() {
    let res = resolved(
        Framework::DeepSpeed,
        Some("0.19.8"),
        fixtures::GH200_REFERENCE,
    );
    let env = env_map(&env_vars(&res, Some("/etc/offload/ds_config.json")));
    assert_eq!(env["OFFLOAD_MODE"], "unified-memory");
    assert_eq!(env["OFFLOAD_OVERLAP"], "1");
    assert_eq!(env["OFFLOAD_RATIO"], "1");
    assert_eq!(env["OFFLOAD_PIN_MEMORY"], "1");
    assert_eq!(env["OFFLOAD_PROFILE"], "default");
    assert_eq!(env["OFFLOAD_CONFIG_FILE"], "/etc/offload/ds_config.json");
    assert!(!env.contains_key("FSDP_VERSION"));

    let res = resolved(Framework::Fsdp, Some("2.6.0"), fixtures::HMM_UNPINNED);
    let env = env_map(&env_vars(&res, None));
    assert_eq!(env["OFFLOAD_MODE"], "cpu-copy");
    assert_eq!(env["OFFLOAD_OVERLAP"], "0");
    assert_eq!(env["OFFLOAD_PIN_MEMORY"], "0");
    assert_eq!(env["FSDP_OFFLOAD_PARAMS"], "true");
    assert_eq!(env["FSDP_VERSION"], "2");
    assert!(!env.contains_key("OFFLOAD_CONFIG_FILE"));
}

#[test]
fn deepspeed_section_on_a_coherent_node_is_superoffload() {
    let res = resolved(
        Framework::DeepSpeed,
        Some("0.19.8"),
        fixtures::GH200_REFERENCE,
    );
    let doc = render_section(&res, &ds_plan(&res));
    assert_eq!(
        doc,
        json!({"zero_optimization": {
            "stage": 3,
            "offload_optimizer": {
                "device": "cpu", "pin_memory": true, "ratio": 1.0,
                "super_offload": true, "cpuadam_cores_perc": 0.9
            }
        }})
    );
}

#[test]
fn deepspeed_section_on_a_discrete_node_is_plain_cpu_offload_with_parameters() {
    // ZeRO-3 copy offload: offload_param too, the measured faster choice (decision-h200.md).
    let res = resolved(Framework::DeepSpeed, Some("0.19.8"), fixtures::H200_READING);
    let doc = render_section(&res, &ds_plan(&res));
    assert_eq!(
        doc,
        json!({"zero_optimization": {"stage": 3,
            "offload_optimizer": {"device": "cpu", "pin_memory": true},
            "offload_param": {"device": "cpu", "pin_memory": true}}})
    );
}

#[test]
fn merge_keeps_every_user_key_and_is_idempotent() {
    let user = parse_config(
        r#"{"train_batch_size": 64, "bf16": {"enabled": true},
            "zero_optimization": {"stage": 3, "overlap_comm": true,
              "offload_optimizer": {"device": "nvme", "nvme_path": "/local", "buffer_count": 8, "super_offload": true},
              "offload_param": {"device": "cpu", "max_in_cpu": 1000000000}}}"#,
    )
    .unwrap();
    assert_eq!(stage_of(&user).unwrap(), Some(3));
    let res = resolved(Framework::DeepSpeed, Some("0.19.8"), fixtures::H200_READING);
    let plan = ds_plan(&res);
    let merged = merge_config(&user, &res, &plan).unwrap();
    assert_eq!(merged["train_batch_size"], 64);
    assert_eq!(merged["bf16"]["enabled"], true);
    assert_eq!(merged["zero_optimization"]["overlap_comm"], true);
    let opt = &merged["zero_optimization"]["offload_optimizer"];
    assert_eq!(opt["device"], "cpu");
    assert_eq!(opt["nvme_path"], "/local");
    assert_eq!(opt["buffer_count"], 8);
    assert_eq!(opt["pin_memory"], true);
    assert!(
        opt.get("super_offload").is_none(),
        "the operator decides SuperOffload: off on discrete"
    );
    let param = &merged["zero_optimization"]["offload_param"];
    assert_eq!(
        param["device"], "cpu",
        "offloadParams unset: on for ZeRO-3 copy offload"
    );
    assert_eq!(param["max_in_cpu"], 1_000_000_000);
    assert_eq!(merge_config(&merged, &res, &plan).unwrap(), merged);
}

#[test]
fn the_optimizer_state_in_bf16_writes_its_two_keys_beside_the_users_bf16_section() {
    let user = json!({"bf16": {"enabled": true, "immediate_grad_update": false},
                      "zero_optimization": {"stage": 3}});
    let res = resolved(Framework::DeepSpeed, Some("0.19.8"), fixtures::H200_READING);
    let plan = crate::decision::DeepSpeedPlan {
        bf16_optimizer_states: true,
        ..ds_plan(&res)
    };
    let merged = merge_config(&user, &res, &plan).unwrap();
    let bf16 = &merged["bf16"];
    assert_eq!(bf16["enabled"], true);
    assert_eq!(bf16["bf16_master_weights_and_grads"], true);
    assert_eq!(bf16["bf16_optimizer_states"], true);
    assert_eq!(bf16["immediate_grad_update"], false);
    assert_eq!(merge_config(&merged, &res, &plan).unwrap(), merged);
    // Without the rung the user's section is left as written.
    let plain = merge_config(&user, &res, &ds_plan(&res)).unwrap();
    assert_eq!(plain["bf16"], user["bf16"]);
}

#[test]
fn merge_rejects_keys_the_declared_version_does_not_know() {
    let user = json!({"zero_optimization": {"offload_optimizer": {"device": "cpu", "turbo": 1}}});
    let res = resolved(Framework::DeepSpeed, Some("0.19.8"), fixtures::H200_READING);
    let err = merge_config(&user, &res, &ds_plan(&res)).unwrap_err();
    assert_eq!(
        err,
        DeepSpeedConfigError::KeyNotAccepted {
            section: "offload_optimizer",
            key: "turbo".into(),
            version: "0.19.8".into()
        }
    );
    // SuperOffload keys in a config for a DeepSpeed that predates them are removed by the
    // operator (it owns them), so the rendered file stays loadable.
    let user = json!({"zero_optimization": {"offload_optimizer": {"super_offload": true, "cpuadam_cores_perc": 0.5}}});
    let res = resolved(
        Framework::DeepSpeed,
        Some("0.17.4"),
        fixtures::GH200_REFERENCE,
    );
    let merged = merge_config(&user, &res, &ds_plan(&res)).unwrap();
    assert_eq!(
        merged["zero_optimization"]["offload_optimizer"],
        json!({"device": "cpu", "pin_memory": true})
    );
}

#[test]
fn bad_user_configs_get_specific_errors() {
    assert!(matches!(
        parse_config("{"),
        Err(DeepSpeedConfigError::NotJson(_))
    ));
    assert_eq!(
        parse_config("[1]").unwrap_err(),
        DeepSpeedConfigError::NotAnObject { path: "top level" }
    );
    assert_eq!(
        parse_config(r#"{"zero_optimization": 3}"#).unwrap_err(),
        DeepSpeedConfigError::NotAnObject {
            path: "zero_optimization"
        }
    );
    assert!(matches!(
        parse_config(r#"{"zero_optimization": {"stage": 7}}"#),
        Err(DeepSpeedConfigError::BadStage(_))
    ));
    let res = resolved(Framework::DeepSpeed, Some("0.19.8"), fixtures::H200_READING);
    let err = merge_config(
        &json!({"zero_optimization": {"offload_optimizer": "cpu"}}),
        &res,
        &ds_plan(&res),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("offload_optimizer must be a JSON object"),
        "{err}"
    );
}

fn template() -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: None,
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "train".into(),
                env: Some(vec![
                    EnvVar {
                        name: "USER_VAR".into(),
                        value: Some("keep".into()),
                        value_from: None,
                    },
                    EnvVar {
                        name: "OFFLOAD_MODE".into(),
                        value: Some("stale".into()),
                        value_from: None,
                    },
                ]),
                resources: Some(ResourceRequirements {
                    limits: Some(BTreeMap::from([(
                        names::GPU_RESOURCE.to_string(),
                        Quantity("4".into()),
                    )])),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            affinity: Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: vec![
                            NodeSelectorTerm {
                                match_expressions: Some(vec![NodeSelectorRequirement {
                                    key: "zone".into(),
                                    operator: "In".into(),
                                    values: Some(vec!["a".into()]),
                                }]),
                                match_fields: None,
                            },
                            NodeSelectorTerm::default(),
                        ],
                    }),
                    preferred_during_scheduling_ignored_during_execution: None,
                }),
                ..Affinity::default()
            }),
            ..PodSpec::default()
        }),
    }
}

#[test]
fn pod_template_gets_env_mount_and_affinity_once() {
    let res = resolved(
        Framework::DeepSpeed,
        Some("0.19.8"),
        fixtures::GH200_REFERENCE,
    );
    let mount = ConfigMount {
        config_map: "job-offload".into(),
        key: "ds_config.json".into(),
        mount_path: "/etc/offload".into(),
    };
    let mut t = template();
    let none = RenderOptions::default();
    apply_to_pod_template(&mut t, &res, Some(&mount), &none);
    let once = t.clone();
    apply_to_pod_template(&mut t, &res, Some(&mount), &none);
    assert_eq!(t, once, "applying twice changes nothing");
    assert!(
        t.spec.as_ref().unwrap().init_containers.is_none(),
        "no guard without an agent image"
    );

    let spec = t.spec.unwrap();
    let c = &spec.containers[0];
    let env = env_map(c.env.as_ref().unwrap());
    assert_eq!(env["USER_VAR"], "keep");
    assert_eq!(env["OFFLOAD_MODE"], "unified-memory");
    assert_eq!(
        c.env
            .as_ref()
            .unwrap()
            .iter()
            .filter(|e| e.name == "OFFLOAD_MODE")
            .count(),
        1
    );
    assert_eq!(env["OFFLOAD_CONFIG_FILE"], "/etc/offload/ds_config.json");
    assert_eq!(c.volume_mounts.as_ref().unwrap().len(), 1);
    assert_eq!(
        spec.volumes.as_ref().unwrap()[0]
            .config_map
            .as_ref()
            .unwrap()
            .name,
        "job-offload"
    );

    let terms = offload_testenv::support::required_node_terms(&spec);
    assert_eq!(
        terms.len(),
        2,
        "the user's terms are kept, each ANDed with the class"
    );
    // The user's empty term matches no node (as kube-scheduler reads it) and stays so: the
    // class's requirements would widen it.
    assert!(
        terms[1]
            .match_expressions
            .as_ref()
            .is_none_or(Vec::is_empty),
        "{:?}",
        terms[1]
    );
    for term in &terms[..1] {
        let exprs = term.match_expressions.as_ref().unwrap();
        assert!(
            exprs
                .iter()
                .any(|e| e.key == names::LABEL_UMA && e.values == Some(vec!["true".into()]))
        );
        assert!(
            exprs
                .iter()
                .any(|e| e.key == names::LABEL_ADDRESSING_MODE
                    && e.values == Some(vec!["ats".into()]))
        );
        assert!(exprs.iter().any(|e| e.key == names::LABEL_C2C));
    }
    assert!(
        terms[0]
            .match_expressions
            .as_ref()
            .unwrap()
            .iter()
            .any(|e| e.key == "zone")
    );
    let resources = crate::decision::PodResources::of(template().spec.as_ref()).unwrap();
    assert_eq!(resources.gpus_per_pod(), 4);
    assert_eq!(
        crate::decision::PodResources::of(None)
            .unwrap()
            .gpus_per_pod(),
        1
    );
}

#[test]
fn disabled_offload_adds_no_affinity_but_the_profile_selector_still_binds() {
    let mut j = job(Framework::Generic, None);
    j.offload.mode = offload_api::v1alpha1::ModeSetting::Disabled;
    let mut p = OffloadProfileSpec::default();
    let res = resolve_offload(&j, "off", &p, &NodeIndex::default()).unwrap();
    assert!(node_affinity(&res).is_none());
    p.node_selector = Some(
        k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
            match_labels: Some(BTreeMap::from([("pool".into(), "a".into())])),
            match_expressions: None,
        },
    );
    let res = resolve_offload(&j, "off", &p, &NodeIndex::default()).unwrap();
    let reqs = node_requirements(&res);
    assert_eq!(
        reqs,
        vec![NodeSelectorRequirement {
            key: "pool".into(),
            operator: "In".into(),
            values: Some(vec!["a".into()])
        }]
    );
}

#[test]
fn discrete_affinity_pins_to_uma_false() {
    let res = resolved(Framework::Generic, None, fixtures::H200_READING);
    let reqs = node_requirements(&res);
    assert_eq!(
        reqs,
        vec![NodeSelectorRequirement {
            key: names::LABEL_UMA.into(),
            operator: "In".into(),
            values: Some(vec!["false".into()])
        }]
    );
}

#[test]
fn the_start_up_guard_gets_the_pods_gpus_and_the_expectation_once() {
    let res = resolved(
        Framework::DeepSpeed,
        Some("0.19.8"),
        fixtures::GH200_REFERENCE,
    );
    let opts = RenderOptions {
        guard_image: Some("registry/offload-agent:1".into()),
        ..Default::default()
    };
    let mut t = template();
    let spec = t.spec.as_mut().unwrap();
    spec.containers[0].resources = Some(ResourceRequirements {
        limits: Some(BTreeMap::from([(
            "nvidia.com/gpu".to_string(),
            Quantity("4".into()),
        )])),
        ..Default::default()
    });
    spec.init_containers = Some(vec![k8s_openapi::api::core::v1::Container {
        name: "user-init".into(),
        ..Default::default()
    }]);
    apply_to_pod_template(&mut t, &res, None, &opts);
    let once = t.clone();
    apply_to_pod_template(&mut t, &res, None, &opts);
    assert_eq!(t, once, "applying twice changes nothing");
    let inits = t.spec.as_ref().unwrap().init_containers.clone().unwrap();
    assert_eq!(inits.len(), 2);
    assert_eq!(inits[0].name, GUARD_CONTAINER, "the guard runs first");
    assert_eq!(inits[1].name, "user-init");
    let guard = &inits[0];
    assert_eq!(guard.image.as_deref(), Some("registry/offload-agent:1"));
    let args = guard.args.clone().unwrap();
    assert!(
        args.contains(&"--mode=unified-memory".to_string()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--node-class=coherent".to_string()),
        "{args:?}"
    );
    let limits = guard.resources.as_ref().unwrap().limits.clone().unwrap();
    assert_eq!(limits["nvidia.com/gpu"].0, "4", "the same GPUs as the pod");

    // A profile that opts out, or a pod without GPUs: no guard (and a stale one is removed).
    let mut off = res.clone();
    off.startup_guard = false;
    apply_to_pod_template(&mut t, &off, None, &opts);
    let inits = t.spec.as_ref().unwrap().init_containers.clone().unwrap();
    assert_eq!(inits.len(), 1);
    assert_eq!(inits[0].name, "user-init");
    let mut plain = template();
    plain.spec.as_mut().unwrap().containers[0].resources = None;
    apply_to_pod_template(&mut plain, &res, None, &opts);
    assert!(plain.spec.unwrap().init_containers.is_none());
}

/// The guard adds no resource name the pod's containers do not request: a GPU-only pod's guard
/// asks for its GPUs alone (a ClusterQueue covering only `nvidia.com/gpu` admits it), and a pod
/// that requests cpu and memory gets a guard whose small requests its own already cover.
#[test]
fn the_start_up_guard_adds_no_resource_the_pod_does_not_request() {
    let res = resolved(Framework::DeepSpeed, Some("0.19.8"), fixtures::H200_READING);
    assert!(
        res.memory_request.is_none(),
        "a job without hints: no raised request"
    );
    let opts = RenderOptions {
        guard_image: Some("registry/offload-agent:1".into()),
        ..Default::default()
    };
    let guard_of = |resources: ResourceRequirements| {
        let mut t = template();
        t.spec.as_mut().unwrap().containers[0].resources = Some(resources);
        apply_to_pod_template(&mut t, &res, None, &opts);
        let inits = t.spec.unwrap().init_containers.unwrap();
        inits[0].resources.clone().unwrap()
    };
    let keys = |m: &Option<BTreeMap<String, Quantity>>| -> Vec<String> {
        m.iter().flat_map(|m| m.keys().cloned()).collect()
    };
    let gpu_only = guard_of(ResourceRequirements {
        limits: Some(BTreeMap::from([(
            "nvidia.com/gpu".to_string(),
            Quantity("1".into()),
        )])),
        ..Default::default()
    });
    assert_eq!(keys(&gpu_only.requests), ["nvidia.com/gpu"]);
    assert_eq!(keys(&gpu_only.limits), ["nvidia.com/gpu"]);
    let full = guard_of(ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), Quantity("8".into())),
            ("memory".to_string(), Quantity("64Gi".into())),
        ])),
        limits: Some(BTreeMap::from([(
            "nvidia.com/gpu".to_string(),
            Quantity("1".into()),
        )])),
        ..Default::default()
    });
    assert_eq!(keys(&full.requests), ["cpu", "memory", "nvidia.com/gpu"]);
    assert_eq!(keys(&full.limits), ["memory", "nvidia.com/gpu"]);
}

#[test]
fn hostile_deepspeed_configs_get_a_clear_error_and_never_a_panic() {
    let res = resolved(Framework::DeepSpeed, Some("0.19.8"), fixtures::H200_READING);
    let plan = ds_plan(&res);
    let deep = format!("{}{}", "{\"a\":".repeat(100_000), "}".repeat(100_000));
    let huge_array = format!(
        r#"{{"zero_optimization": {{"stage": 3}}, "pad": [{}]}}"#,
        vec!["1"; 2_000_000].join(",")
    );
    for (case, text, expect) in [
        ("not an object", "[]".to_string(), Err("top level")),
        ("a number", "1".to_string(), Err("top level")),
        (
            "truncated",
            "{\"zero_optimization\": {".to_string(),
            Err("not valid JSON"),
        ),
        ("nested 100,000 deep", deep, Err("not valid JSON")),
        (
            "zero_optimization not an object",
            r#"{"zero_optimization": 5}"#.to_string(),
            Err("zero_optimization must be a JSON object"),
        ),
        (
            "a stage that is a word",
            r#"{"zero_optimization": {"stage": "three"}}"#.to_string(),
            Err("integer from 0 to 3"),
        ),
        (
            "a stage out of range",
            r#"{"zero_optimization": {"stage": 7}}"#.to_string(),
            Err("integer from 0 to 3"),
        ),
        ("megabytes of other keys", huge_array, Ok(())),
    ] {
        match (parse_config(&text), expect) {
            (Ok(user), Ok(())) => {
                merge_config(&user, &res, &plan).unwrap();
            }
            (Err(e), Err(want)) => {
                assert!(e.to_string().contains(want), "{case}: {e}");
            }
            (got, want) => panic!("{case}: got {got:?}, expected {want:?}"),
        }
    }
    // Readable, but the sections the operator writes into are of the wrong type.
    for (case, user, want) in [
        (
            "offload_optimizer a list",
            json!({"zero_optimization": {"offload_optimizer": []}}),
            "offload_optimizer must be a JSON object",
        ),
        (
            "offload_param a string",
            json!({"zero_optimization": {"stage": 3, "offload_param": "cpu"}}),
            "offload_param must be a JSON object",
        ),
    ] {
        let err = merge_config(&user, &res, &plan).unwrap_err().to_string();
        assert!(err.contains(want), "{case}: {err}");
    }
}

mod resources;
