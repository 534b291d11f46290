use super::*;
use k8s_openapi::api::core::v1::PodResourceClaim;
use serde_json::json;

fn template(spec: Value) -> Arc<ResourceClaimTemplate> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "t", "namespace": "ml"},
            "spec": {"spec": spec}
        }))
        .unwrap(),
    )
}

fn gpus(count: Option<u64>) -> Value {
    let mut exactly = json!({"deviceClassName": "gpu.nvidia.com"});
    if let Some(c) = count {
        exactly["count"] = json!(c);
    }
    json!({"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}})
}

fn pod(claims: &[(&str, Option<&str>, Option<&str>)]) -> PodSpec {
    PodSpec {
        resource_claims: Some(
            claims
                .iter()
                .map(|(name, template, claim)| PodResourceClaim {
                    name: name.to_string(),
                    resource_claim_template_name: template.map(str::to_string),
                    resource_claim_name: claim.map(str::to_string),
                })
                .collect(),
        ),
        ..PodSpec::default()
    }
}

fn lookup(
    templates: Vec<(&'static str, Arc<ResourceClaimTemplate>)>,
) -> impl Fn(&str) -> Option<Arc<ResourceClaimTemplate>> {
    move |name| {
        templates
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| t.clone())
    }
}

#[test]
fn claims_are_sized_by_the_gpus_they_request() {
    let opts = DraOptions::default();
    let find = lookup(vec![
        ("four", template(gpus(Some(4)))),
        ("one", template(gpus(None))),
        (
            "nic",
            template(json!({"devices": {"requests": [
            {"name": "nic", "exactly": {"deviceClassName": "rdma.example.com", "count": 2}}]}})),
        ),
        (
            "either",
            template(
                json!({"devices": {"requests": [{"name": "g", "firstAvailable": [
            {"name": "eight", "deviceClassName": "gpu.nvidia.com", "count": 8},
            {"name": "two", "deviceClassName": "gpu.nvidia.com", "count": 2}]}]}}),
            ),
        ),
    ]);
    let got = claimed_gpus(
        &pod(&[("a", Some("four"), None), ("b", Some("one"), None)]),
        &find,
        &opts,
    )
    .unwrap();
    assert_eq!(got.gpus, 5);
    assert_eq!(got.claims.len(), 2);
    let nic = claimed_gpus(&pod(&[("n", Some("nic"), None)]), &find, &opts).unwrap();
    assert_eq!(nic, ClaimedGpus::default(), "other devices are not GPUs");
    let either = claimed_gpus(&pod(&[("g", Some("either"), None)]), &find, &opts).unwrap();
    assert_eq!(either.gpus, 2, "the smallest alternative");
    assert_eq!(
        claimed_gpus(&PodSpec::default(), &find, &opts)
            .unwrap()
            .gpus,
        0
    );
}

#[test]
fn claims_that_cannot_be_sized_say_why() {
    let opts = DraOptions::default();
    let find = lookup(vec![
        (
            "all",
            template(json!({"devices": {"requests": [{"name": "every",
            "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}}]}})),
        ),
        ("zero", template(gpus(Some(0)))),
        ("huge", template(gpus(Some(1 << 40)))),
        ("list", template(json!({"devices": {"requests": "x"}}))),
    ]);
    let err = |claims: &[(&str, Option<&str>, Option<&str>)]| {
        claimed_gpus(&pod(claims), &find, &opts).unwrap_err()
    };
    let missing = err(&[("c", Some("nope"), None)]);
    assert!(missing.depends_on_cluster());
    assert!(missing.to_string().contains("nope"));
    let shared = err(&[("c", None, Some("shared"))]);
    assert!(matches!(shared, ClaimError::SharedClaim { .. }));
    assert!(!shared.depends_on_cluster());
    assert!(matches!(
        err(&[("c", Some("all"), None)]),
        ClaimError::AllDevices { .. }
    ));
    for bad in ["zero", "huge", "list"] {
        let e = err(&[("c", Some(bad), None)]);
        assert!(matches!(e, ClaimError::Invalid { .. }), "{bad}: {e}");
    }
}

#[test]
fn the_pinned_copy_adds_the_class_selector_to_gpu_requests_only() {
    let opts = DraOptions::default();
    let original = template(json!({"devices": {
        "requests": [
            {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2,
                                          "selectors": [{"cel": {"expression": "device.attributes[\"gpu.nvidia.com\"].productName.startsWith(\"NVIDIA\")"}}]}},
            {"name": "nic", "exactly": {"deviceClassName": "rdma.example.com"}},
            {"name": "alt", "firstAvailable": [{"name": "a", "deviceClassName": "gpu.nvidia.com"}]}
        ],
        "constraints": [{"requests": ["gpus"], "matchAttribute": "gpu.nvidia.com/pcieRoot"}]
    }}));
    let owner = OwnerReference {
        api_version: "offload.dev/v1alpha1".into(),
        kind: "TrainingJob".into(),
        name: "j".into(),
        uid: "u".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    let pinned = pinned_template(
        &original,
        &pinned_name("j", "gpus"),
        "ml",
        owner.clone(),
        BTreeMap::new(),
        Pin {
            class: Some(NodeClass::Coherent),
            min_gpu_memory: None,
        },
        &opts,
    );
    let requests = &pinned.spec.spec["devices"]["requests"];
    let gpu = requests[0]["exactly"]["selectors"].as_array().unwrap();
    assert_eq!(gpu.len(), 2, "the user's selector stays");
    assert_eq!(
        gpu[1]["cel"]["expression"],
        "\"addressingMode\" in device.attributes[\"gpu.nvidia.com\"] && device.attributes[\"gpu.nvidia.com\"].addressingMode == \"ATS\""
    );
    assert!(requests[1]["exactly"].get("selectors").is_none());
    assert_eq!(
        requests[2]["firstAvailable"][0]["selectors"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        pinned.spec.spec["devices"]["constraints"],
        original.spec.spec["devices"]["constraints"]
    );
    assert_eq!(pinned.metadata.name.as_deref(), Some("j-gpus"));
    assert!(class_selector(NodeClass::Discrete, "gpu.nvidia.com").starts_with("!("));

    // Sized by memory: each GPU request also selects devices with enough memory capacity.
    let sized = pinned_template(
        &original,
        &pinned_name("j", "gpus"),
        "ml",
        owner,
        BTreeMap::new(),
        Pin {
            class: Some(NodeClass::Discrete),
            min_gpu_memory: Some(100 << 30),
        },
        &opts,
    );
    let gpu = sized.spec.spec["devices"]["requests"][0]["exactly"]["selectors"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(gpu.len(), 3);
    assert_eq!(
        gpu[2]["cel"]["expression"],
        "\"memory\" in device.capacity[\"gpu.nvidia.com\"] && device.capacity[\"gpu.nvidia.com\"].memory.compareTo(quantity(\"107374182400\")) >= 0"
    );
}
