//! The manifests in `examples/` parse into the API types and resolve against recorded nodes.

use std::collections::BTreeMap;
use std::path::Path;

use offload_api::names;
use offload_api::report::NodeReport;
use offload_operator::api::{ModeSetting, OffloadMode, OffloadProfile, RatioSetting, TrainingJob};
use offload_operator::decision::{JobRequest, resolve_offload};
use offload_operator::index::{NodeIndex, NodeInfo};
use offload_testenv::fixtures;

fn read<T: serde::de::DeserializeOwned>(file: &str) -> T {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn node(name: &str, fixture: &str) -> NodeInfo {
    let report = NodeReport::parse(fixture).unwrap();
    let ann = BTreeMap::from([(
        names::ANNOTATION_NODE_REPORT.to_string(),
        fixture.to_string(),
    )]);
    NodeInfo::from_metadata(name, report.labels(), &ann)
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

#[test]
fn example_jobs_resolve_on_a_mixed_cluster() {
    let nodes = NodeIndex::new(vec![
        node("gh200-0", fixtures::GH200_REFERENCE),
        node("h200-0", fixtures::H200_READING),
        node("h200-1", fixtures::H200_READING),
    ]);
    let default: OffloadProfile = read("offloadprofile-default.yaml");
    let pcie: OffloadProfile = read("offloadprofile-pcie-pool.yaml");

    let ds: TrainingJob = read("trainingjob-deepspeed.yaml");
    let req = JobRequest::from_training_job(&ds.spec, 1, Some(3));
    let res = resolve_offload(&req, "default", &default.spec, &nodes).unwrap();
    // Two pods, one coherent GPU: the discrete class has room for the whole job.
    assert_eq!(res.mode, OffloadMode::CpuCopy, "{}", res.summary());

    let fsdp: TrainingJob = read("trainingjob-fsdp.yaml");
    let req = JobRequest::from_training_job(&fsdp.spec, 1, None);
    let res = resolve_offload(&req, "pcie-pool", &pcie.spec, &nodes).unwrap();
    assert_eq!(res.mode, OffloadMode::CpuCopy);
    assert_eq!(res.ratio, 1.0);
}
