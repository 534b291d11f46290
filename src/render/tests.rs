//! Rendering: env vars, DeepSpeed JSON for each version, and pod-template injection.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, EnvVar, NodeAffinity, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, PodSpec, PodTemplateSpec, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::json;

use super::deepspeed::{
    DeepSpeedConfigError, merge_config, parse_config, render_section, stage_of,
};
use super::*;
use crate::api::{Framework, FrameworkSpec, OffloadProfileSpec, OffloadSpec};
use crate::decision::{DeepSpeedRequest, JobRequest, resolve_offload};
use crate::index::{NodeIndex, NodeInfo};
use crate::report::NodeReport;
use offload_testenv::fixtures;

fn node(name: &str, fixture: &str) -> NodeInfo {
    let report = NodeReport::parse(fixture).unwrap();
    let ann = BTreeMap::from([(
        names::ANNOTATION_NODE_REPORT.to_string(),
        fixture.to_string(),
    )]);
    NodeInfo::from_metadata(name, report.labels(), &ann)
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
fn deepspeed_section_on_a_discrete_node_is_plain_cpu_offload() {
    let res = resolved(Framework::DeepSpeed, Some("0.19.8"), fixtures::H200_READING);
    let doc = render_section(&res, &ds_plan(&res));
    assert_eq!(
        doc,
        json!({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true}}})
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
    assert_eq!(param["device"], "none", "offloadParams not asked for");
    assert_eq!(param["max_in_cpu"], 1_000_000_000);
    assert_eq!(merge_config(&merged, &res, &plan).unwrap(), merged);
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
    apply_to_pod_template(&mut t, &res, Some(&mount));
    let once = t.clone();
    apply_to_pod_template(&mut t, &res, Some(&mount));
    assert_eq!(t, once, "applying twice changes nothing");

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

    let terms = spec
        .affinity
        .unwrap()
        .node_affinity
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .unwrap()
        .node_selector_terms;
    assert_eq!(
        terms.len(),
        2,
        "the user's terms are kept, each ANDed with the class"
    );
    for term in &terms {
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
    assert_eq!(gpus_per_pod(Some(&template().spec.unwrap())), 4);
    assert_eq!(gpus_per_pod(None), 1);
}

#[test]
fn disabled_offload_adds_no_affinity_but_the_profile_selector_still_binds() {
    let mut j = job(Framework::Generic, None);
    j.offload.mode = crate::api::ModeSetting::Disabled;
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
