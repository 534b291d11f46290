//! The manifests in `examples/` parse into the API types and resolve against recorded nodes.

use std::path::Path;

use offload_api::names;
use offload_api::report::NodeReport;
use offload_api::v1alpha1::{
    ModeSetting, NodeClass, OffloadMode, OffloadProfile, RatioSetting, TrainingJob,
};
use offload_operator::cluster::view::MemoryView;
use offload_operator::decision::JobRequest;
use offload_operator::decision::UserConfig;
use offload_operator::decision::model::model_config;
use offload_operator::decision::resolve_offload;
use offload_operator::index::{Allocatable, NodeIndex, NodeInfo};
use offload_testenv::fixtures;

fn read<T: serde::de::DeserializeOwned>(file: &str) -> T {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn node(name: &str, fixture: &str) -> NodeInfo {
    NodeInfo::from_report(name, &NodeReport::parse(fixture).unwrap())
}

/// The user's DeepSpeed config of the examples.
fn ds_config() -> UserConfig {
    let cm: k8s_openapi::api::core::v1::ConfigMap = read("deepspeed-configmap.yaml");
    let text = &cm.data.unwrap()["ds_config.json"];
    UserConfig::parse(text, "example").unwrap()
}

#[test]
fn example_profiles_parse_with_their_defaults() {
    let default: OffloadProfile = read("offloadprofile-default.yaml");
    assert_eq!(
        default.metadata.name.as_deref(),
        Some(names::DEFAULT_PROFILE)
    );
    assert_eq!(default.spec.mode, ModeSetting::Auto);
    assert_eq!(default.spec.offload_ratio, RatioSetting::Auto);
    let pcie: OffloadProfile = read("offloadprofile-pcie-pool.yaml");
    assert_eq!(pcie.spec.offload_ratio, RatioSetting::Fixed(1.0));
    assert!(pcie.spec.pin_memory, "pinMemory defaults to true");
}

/// The demo's cluster: two GH200 and two H200 nodes (recorded reports), 480 GiB of host
/// memory each.
fn mixed_cluster() -> NodeIndex {
    let host = |n: NodeInfo| {
        n.with_allocatable(Allocatable {
            memory: Some(480 << 30),
            gpus: Some(1),
            cpus: None,
            ..Default::default()
        })
    };
    NodeIndex::new(vec![
        host(node("gh200-0", fixtures::GH200_REFERENCE)),
        host(node("gh200-1", fixtures::GH200_REFERENCE)),
        host(node("h200-0", fixtures::H200_READING)),
        host(node("h200-1", fixtures::H200_READING)),
    ])
}

#[test]
fn example_jobs_resolve_on_a_mixed_cluster() {
    let nodes = mixed_cluster();
    let default: OffloadProfile = read("offloadprofile-default.yaml");
    let pcie: OffloadProfile = read("offloadprofile-pcie-pool.yaml");

    // 8B over two GPUs fits an H200 without offload (not a GH200's 96 GB): no offload, pinned
    // to the class where it fits.
    let ds: TrainingJob = read("trainingjob-deepspeed.yaml");
    let model: k8s_openapi::api::core::v1::ConfigMap = read("llama-8b-model-config.yaml");
    let shape =
        model_config::parse(&model.data.unwrap()["config.json"], "example").expect("config.json");
    assert_eq!(shape.parameters(), 8_030_261_248.0);
    let req = JobRequest::for_training_job(
        &ds,
        Some(&ds_config()),
        Some(&shape),
        &MemoryView::default(),
    )
    .unwrap();
    let res = resolve_offload(&req, "default", &default.spec, &nodes).unwrap();
    assert_eq!(res.mode, OffloadMode::Disabled, "{}", res.summary());
    assert_eq!(res.node_class, Some(NodeClass::Discrete));

    // 20.6B over two GPUs fits nowhere without offload: the smallest share that fits, into
    // unified memory on the GH200s (first in the profile's order).
    let large: TrainingJob = read("trainingjob-deepspeed-large.yaml");
    let req =
        JobRequest::for_training_job(&large, Some(&ds_config()), None, &MemoryView::default())
            .unwrap();
    let res = resolve_offload(&req, "default", &default.spec, &nodes).unwrap();
    assert_eq!(res.mode, OffloadMode::UnifiedMemory, "{}", res.summary());
    assert!(res.ratio > 0.05 && res.ratio < 1.0, "{}", res.ratio);
    assert!(res.super_offload());

    // A 20B GPT over two GPUs, tensor-parallel: Megatron-core's hybrid device optimizer steps
    // the smallest fraction that fits on the host, over NVLink-C2C on the GH200s.
    let megatron: TrainingJob = read("trainingjob-megatron.yaml");
    let req = JobRequest::for_training_job(&megatron, None, None, &MemoryView::default()).unwrap();
    assert_eq!(req.megatron.tensor_parallel, Some(2));
    let res = resolve_offload(&req, "default", &default.spec, &nodes).unwrap();
    assert_eq!(res.mode, OffloadMode::UnifiedMemory, "{}", res.summary());
    assert!(res.ratio > 0.05 && res.ratio < 1.0, "{}", res.ratio);
    let env = offload_operator::render::env_vars(&res, None);
    let args = env
        .iter()
        .find(|e| e.name == names::ENV_MEGATRON_ARGS)
        .and_then(|e| e.value.clone())
        .unwrap_or_default();
    assert!(
        args.contains(&format!("--optimizer-offload-fraction {}", res.ratio)),
        "{args}"
    );
    // The launch line expands the flags through a shell.
    let command =
        serde_json::to_string(&megatron.spec.template.spec.unwrap().containers[0]).unwrap();
    assert!(command.contains("$OFFLOAD_MEGATRON_ARGS"), "{command}");

    // No model hints: the profile's CPUCopy, everything offloaded.
    let fsdp: TrainingJob = read("trainingjob-fsdp.yaml");
    let req = JobRequest::for_training_job(&fsdp, None, None, &MemoryView::default()).unwrap();
    let res = resolve_offload(&req, "pcie-pool", &pcie.spec, &nodes).unwrap();
    assert_eq!(res.mode, OffloadMode::CpuCopy);
    assert_eq!(res.ratio, 1.0);
}
