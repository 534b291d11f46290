use super::*;
use serde_json::json;

/// A slice as NVIDIA's DRA driver publishes one for a node (the shape of its
/// `cmd/gpu-kubelet-plugin/deviceinfo.go`): `gpu-<minor>` devices with `type`, `uuid`,
/// `productName`, `addressingMode` and a `memory` capacity.
fn slice(node: &str, generation: i64, modes: &[Option<&str>]) -> Arc<Tolerant<ResourceSlice>> {
    let devices: Vec<serde_json::Value> = modes
        .iter()
        .enumerate()
        .map(|(i, mode)| {
            let mut attrs = json!({
                "type": {"string": "gpu"},
                "uuid": {"string": format!("GPU-{node}-{i}")},
                "productName": {"string": "NVIDIA GH200 480GB"},
            });
            if let Some(m) = mode {
                attrs["addressingMode"] = json!({"string": m});
            }
            json!({"name": format!("gpu-{i}"), "attributes": attrs,
                   "capacity": {"memory": {"value": "97871Mi"}}})
        })
        .collect();
    let obj = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-gpu.nvidia.com-{generation}")},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                 "devices": devices}
    });
    Arc::new(serde_json::from_value(obj).unwrap())
}

#[test]
fn the_driver_names_each_nodes_mode() {
    let slices = vec![
        slice("gh200", 1, &[Some("ATS"); 4]),
        slice("h200", 1, &[Some("None"), Some("None")]),
        slice("hmm", 1, &[Some("HMM")]),
        slice("old-driver", 1, &[None, None]),
        slice("mixed", 1, &[Some("ATS"), Some("HMM")]),
    ];
    let w = witnesses(&slices, "gpu.nvidia.com");
    assert_eq!(w["gh200"].says(), DriverSays::All(AddressingMode::Ats));
    assert_eq!(w["gh200"].gpus, 4);
    assert_eq!(w["gh200"].memory_model(), Some(NodeMemoryModel::Coherent));
    assert_eq!(w["gh200"].gpu_memory, Some(97871 * 1024 * 1024));
    assert_eq!(w["h200"].memory_model(), Some(NodeMemoryModel::Discrete));
    assert_eq!(w["hmm"].memory_model(), Some(NodeMemoryModel::Hmm));
    assert_eq!(w["old-driver"].says(), DriverSays::Nothing);
    assert_eq!(w["old-driver"].gpus, 2, "counted, though it says no mode");
    assert_eq!(w["mixed"].says(), DriverSays::Mixed);
    assert_eq!(w["mixed"].describe(), "ATS on 1 and HMM on 1 GPUs");
    // Another driver's slices are not read.
    assert!(witnesses(&slices, "example.com").is_empty());
}

#[test]
fn only_the_newest_generation_of_a_pool_counts_and_a_device_once() {
    let mut twice = slice("n", 2, &[Some("ATS"), Some("ATS")]);
    let w = witnesses(
        &[
            slice("n", 1, &[Some("None"); 8]),
            twice.clone(),
            twice.clone(),
        ],
        "gpu.nvidia.com",
    );
    assert_eq!(w["n"].gpus, 2);
    assert_eq!(w["n"].says(), DriverSays::All(AddressingMode::Ats));
    // MIG devices are not whole GPUs.
    if let Ok(s) = Arc::make_mut(&mut twice).0.as_mut() {
        s.spec.devices[1].attributes.insert(
            "type".into(),
            super::super::api::DeviceAttribute {
                string: Some("mig".into()),
                ..Default::default()
            },
        );
    }
    assert_eq!(witnesses(&[twice], "gpu.nvidia.com")["n"].gpus, 1);
}

#[test]
fn what_does_not_read_is_set_aside_and_changes_nothing_else() {
    let bad_mode = slice("bad", 1, &[Some("QUANTUM"), Some("ATS")]);
    let mut bad_memory = slice("mem", 1, &[Some("ATS")]);
    if let Ok(s) = Arc::make_mut(&mut bad_memory).0.as_mut() {
        s.spec.devices[0].capacity.insert(
            "memory".into(),
            super::super::api::DeviceCapacity {
                value: k8s_openapi::apimachinery::pkg::api::resource::Quantity("lots".into()),
            },
        );
    }
    // A slice with 300 devices: more than any node has.
    let huge = slice("huge", 1, &[Some("ATS"); 300]);
    // One that does not deserialize at all.
    let garbage: Arc<Tolerant<ResourceSlice>> = Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "garbage"}, "spec": {"driver": 7}
        }))
        .unwrap(),
    );
    let good = slice("good", 1, &[Some("ATS"); 2]);
    let w = witnesses(
        &[bad_mode, bad_memory, huge, garbage, good],
        "gpu.nvidia.com",
    );
    assert_eq!(
        w["bad"].says(),
        DriverSays::Mixed,
        "an unknown mode is no mode"
    );
    assert!(
        w["bad"].problems[0].contains("QUANTUM"),
        "{:?}",
        w["bad"].problems
    );
    assert_eq!(w["mem"].says(), DriverSays::All(AddressingMode::Ats));
    assert_eq!(w["mem"].gpu_memory, None);
    assert!(w["mem"].problems[0].contains("lots"));
    assert_eq!(w["huge"].gpus, 0);
    assert_eq!(w["huge"].says(), DriverSays::Nothing);
    assert!(w["huge"].problems[0].contains("300"));
    assert_eq!(w["good"].says(), DriverSays::All(AddressingMode::Ats));
    assert_eq!(w.len(), 4);
}

#[test]
fn memory_no_gpu_has_is_not_believed() {
    let with_memory = |node: &str, value: &str| {
        let mut s = slice(node, 1, &[Some("ATS"); 2]);
        if let Ok(s) = Arc::make_mut(&mut s).0.as_mut() {
            s.spec.devices[1].capacity.insert(
                "memory".into(),
                super::super::api::DeviceCapacity {
                    value: k8s_openapi::apimachinery::pkg::api::resource::Quantity(value.into()),
                },
            );
        }
        s
    };
    let w = witnesses(
        &[
            with_memory("peta", "1000000000000000"),
            with_memory("exa", "1Ei"),
            with_memory("fine", "97871Mi"),
        ],
        "gpu.nvidia.com",
    );
    for node in ["peta", "exa"] {
        assert_eq!(w[node].gpus, 0, "{node}: the slices are set aside");
        assert_eq!(w[node].gpu_memory, None);
        let why = &w[node].problems[0];
        assert!(
            why.contains("device gpu-1: memory capacity")
                && why.contains("more than a GH200 has")
                && why.ends_with("not believed"),
            "{why}"
        );
    }
    assert_eq!(w["fine"].gpus, 2);
}
