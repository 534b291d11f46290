//! The template's constraints as kube-scheduler reads them.

use super::*;
use k8s_openapi::api::core::v1::{Affinity, NodeAffinity, NodeSelector};

fn node(name: &str, labels: &[(&str, &str)], taints: &[(&str, Option<&str>, &str)]) -> NodeInfo {
    NodeInfo::new(
        name,
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        None,
    )
    .with_taints(
        taints
            .iter()
            .map(|(k, v, e)| NodeTaint {
                key: k.to_string(),
                value: v.map(str::to_string),
                effect: e.to_string(),
            })
            .collect(),
    )
}

fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.into(),
        operator: op.into(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
    }
}

fn with_terms(terms: Vec<Vec<NodeSelectorRequirement>>) -> PodConstraints {
    PodConstraints::of(Some(&PodSpec {
        affinity: Some(Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: terms
                        .into_iter()
                        .map(|e| NodeSelectorTerm {
                            match_expressions: Some(e),
                            match_fields: None,
                        })
                        .collect(),
                }),
                preferred_during_scheduling_ignored_during_execution: None,
            }),
            ..Affinity::default()
        }),
        ..PodSpec::default()
    }))
}

fn toleration(key: &str, op: &str, value: Option<&str>, effect: Option<&str>) -> Toleration {
    Toleration {
        key: (!key.is_empty()).then(|| key.to_string()),
        operator: Some(op.into()),
        value: value.map(str::to_string),
        effect: effect.map(str::to_string),
        toleration_seconds: None,
    }
}

#[test]
fn a_node_selector_needs_every_label() {
    let c = PodConstraints {
        node_selector: BTreeMap::from([("offload.dev/uma".into(), "false".into())]),
        ..PodConstraints::default()
    };
    assert!(
        c.excludes(&node("h", &[("offload.dev/uma", "false")], &[]))
            .is_none()
    );
    let why = c
        .excludes(&node("gh", &[("offload.dev/uma", "true")], &[]))
        .unwrap();
    assert!(why.contains("offload.dev/uma is \"true\""), "{why}");
    let why = c.excludes(&node("bare", &[], &[])).unwrap();
    assert!(why.contains("has no label offload.dev/uma"), "{why}");
}

#[test]
fn required_affinity_terms_are_ored_and_their_expressions_anded() {
    let c = with_terms(vec![
        vec![
            req("pool", "In", &["a", "b"]),
            req("zone", "NotIn", &["z9"]),
        ],
        vec![req("gpu-count", "Gt", &["4"])],
    ]);
    assert!(
        c.excludes(&node("a", &[("pool", "a"), ("zone", "z1")], &[]))
            .is_none()
    );
    assert!(
        c.excludes(&node("a9", &[("pool", "a"), ("zone", "z9")], &[]))
            .is_some()
    );
    assert!(
        c.excludes(&node("big", &[("gpu-count", "8")], &[]))
            .is_none()
    );
    assert!(
        c.excludes(&node("small", &[("gpu-count", "2")], &[]))
            .is_some()
    );
    assert!(
        c.excludes(&node("nan", &[("gpu-count", "eight")], &[]))
            .is_some()
    );
    let exists = with_terms(vec![vec![
        req("pool", "Exists", &[]),
        req("spot", "DoesNotExist", &[]),
    ]]);
    assert!(exists.excludes(&node("p", &[("pool", "x")], &[])).is_none());
    assert!(
        exists
            .excludes(&node("s", &[("pool", "x"), ("spot", "1")], &[]))
            .is_some()
    );
    // An empty term matches nothing; so does an operator the API server would not store.
    assert!(
        with_terms(vec![vec![]])
            .excludes(&node("any", &[], &[]))
            .is_some()
    );
    assert!(
        with_terms(vec![vec![req("pool", "Like", &["a"])]])
            .excludes(&node("p", &[("pool", "a")], &[]))
            .is_some()
    );
}

#[test]
fn taints_keep_pods_off_unless_tolerated() {
    let gpu = node(
        "g",
        &[],
        &[("nvidia.com/gpu", Some("present"), "NoSchedule")],
    );
    let soft = node("s", &[], &[("spot", None, "PreferNoSchedule")]);
    let none = PodConstraints::default();
    let why = none.excludes(&gpu).unwrap();
    assert!(
        why.contains("taint nvidia.com/gpu=present:NoSchedule is not tolerated"),
        "{why}"
    );
    assert!(
        none.excludes(&soft).is_none(),
        "PreferNoSchedule keeps no pod off"
    );
    for (tol, ok) in [
        (
            toleration("nvidia.com/gpu", "Exists", None, Some("NoSchedule")),
            true,
        ),
        (toleration("nvidia.com/gpu", "Exists", None, None), true),
        (
            toleration("nvidia.com/gpu", "Equal", Some("present"), None),
            true,
        ),
        (
            toleration("nvidia.com/gpu", "Equal", Some("absent"), None),
            false,
        ),
        (
            toleration("nvidia.com/gpu", "Exists", None, Some("NoExecute")),
            false,
        ),
        (toleration("", "Exists", None, None), true),
        // An empty key with Equal tolerates nothing (the API refuses it on a Pod).
        (toleration("", "Equal", Some("present"), None), false),
    ] {
        let c = PodConstraints {
            tolerations: vec![tol.clone()],
            ..PodConstraints::default()
        };
        assert_eq!(c.excludes(&gpu).is_none(), ok, "{tol:?}");
    }
}

#[test]
fn what_is_left_out_is_named_node_by_node_and_bounded() {
    let c = PodConstraints {
        node_selector: BTreeMap::from([("pool".into(), "a".into())]),
        ..PodConstraints::default()
    };
    let nodes: Vec<NodeInfo> = (0..10)
        .map(|i| node(&format!("n{i}"), &[("pool", "b")], &[]))
        .collect();
    let msg = c.left_out(nodes.iter()).unwrap();
    assert!(msg.starts_with("the pod template's constraints (nodeSelector {pool=a}, no tolerations) leave out 10 node(s): n0 (its label pool is \"b\""), "{msg}");
    assert!(msg.ends_with("; and 6 more"), "{msg}");
    assert!(c.left_out(std::iter::empty()).is_none());
}

fn gpu_pod(limits: &[&str]) -> PodSpec {
    use k8s_openapi::api::core::v1::{Container, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    PodSpec {
        containers: vec![Container {
            name: "train".into(),
            resources: Some(ResourceRequirements {
                limits: Some(
                    limits
                        .iter()
                        .map(|r| (r.to_string(), Quantity("1".into())))
                        .collect(),
                ),
                ..ResourceRequirements::default()
            }),
            ..Container::default()
        }],
        ..PodSpec::default()
    }
}

#[test]
fn a_taint_on_a_requested_extended_resource_is_tolerated_as_the_admission_plugin_adds() {
    // Where the operator is told the API server runs ExtendedResourceToleration.
    let c = PodConstraints {
        extended_resource_toleration: true,
        ..PodConstraints::of(Some(&gpu_pod(&["nvidia.com/gpu", "cpu", "memory"])))
    };
    assert_eq!(
        c.extended_resources,
        BTreeSet::from(["nvidia.com/gpu".to_string()])
    );
    let tainted = node(
        "g",
        &[],
        &[("nvidia.com/gpu", Some("present"), "NoSchedule")],
    );
    assert!(c.excludes(&tainted).is_none(), "{:?}", c.excludes(&tainted));
    // The plugin adds NoSchedule only; a NoExecute taint of the same key still keeps pods off,
    // and so does a NoSchedule taint of a resource the pods do not ask for.
    let evicting = node("e", &[], &[("nvidia.com/gpu", None, "NoExecute")]);
    assert!(c.excludes(&evicting).is_some());
    let other = node("o", &[], &[("example.com/fpga", None, "NoSchedule")]);
    assert!(c.excludes(&other).is_some());
    // Without a GPU request there is nothing the cluster adds.
    let plain = PodConstraints {
        extended_resource_toleration: true,
        ..PodConstraints::of(Some(&gpu_pod(&["cpu"])))
    };
    assert!(plain.excludes(&tainted).is_some());
    let described = c.describe();
    assert!(
        described.contains("ExtendedResourceToleration") && described.contains("nvidia.com/gpu"),
        "{described}"
    );
    for (name, extended) in [
        ("nvidia.com/gpu", true),
        ("example.com/fpga", true),
        ("cpu", false),
        ("hugepages-2Mi", false),
        ("kubernetes.io/batch-cpu", false),
        ("node.kubernetes.io/x", false),
        ("requests.nvidia.com/gpu", false),
    ] {
        assert_eq!(is_extended_resource(name), extended, "{name}");
    }
}

/// The plugin is off unless the API server is started with it, and the operator cannot see
/// which: untold, a GPU taint the template does not tolerate leaves the node out, and the
/// message says both ways to fix it.
#[test]
fn the_admission_plugins_toleration_is_never_assumed() {
    let c = PodConstraints::of(Some(&gpu_pod(&["nvidia.com/gpu"])));
    assert!(!c.extended_resource_toleration);
    let tainted = node(
        "g",
        &[],
        &[("nvidia.com/gpu", Some("present"), "NoSchedule")],
    );
    let why = c.excludes(&tainted).unwrap();
    assert!(
        why.contains("taint nvidia.com/gpu=present:NoSchedule is not tolerated")
            && why.contains("operator.extendedResourceToleration"),
        "{why}"
    );
    assert!(!c.describe().contains("ExtendedResourceToleration"));
    // A toleration of another value, or of NoExecute only, tolerates nothing here either.
    for toleration in [
        serde_json::json!({"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent", "effect": "NoSchedule"}),
        serde_json::json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}),
    ] {
        let c = PodConstraints {
            tolerations: vec![serde_json::from_value(toleration.clone()).unwrap()],
            ..PodConstraints::of(Some(&gpu_pod(&["nvidia.com/gpu"])))
        };
        assert!(c.excludes(&tainted).is_some(), "{toleration}");
    }
    // The template's own toleration of it does.
    let c = PodConstraints {
        tolerations: vec![
            serde_json::from_value(serde_json::json!(
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ))
            .unwrap(),
        ],
        ..PodConstraints::of(Some(&gpu_pod(&["nvidia.com/gpu"])))
    };
    assert_eq!(c.excludes(&tainted), None);
}

#[test]
fn a_node_name_is_the_only_node_and_only_no_execute_taints_keep_it_off() {
    let mut spec = gpu_pod(&[]);
    spec.node_name = Some("h200-a".into());
    spec.node_selector = Some(BTreeMap::from([("pool".into(), "a".into())]));
    let c = PodConstraints::of(Some(&spec));
    let why = c.excludes(&node("gh200-b", &[("pool", "a")], &[])).unwrap();
    assert!(why.contains("nodeName is \"h200-a\""), "{why}");
    // Bound without the scheduler: a NoSchedule taint does not stop the kubelet ...
    let cordoned = node(
        "h200-a",
        &[("pool", "a")],
        &[("dedicated", Some("x"), "NoSchedule")],
    );
    assert!(c.excludes(&cordoned).is_none());
    // ... a NoExecute taint evicts, and the kubelet checks the selector.
    let evicting = node(
        "h200-a",
        &[("pool", "a")],
        &[("dedicated", None, "NoExecute")],
    );
    assert!(c.excludes(&evicting).is_some());
    let unlabelled = node("h200-a", &[], &[]);
    assert!(c.excludes(&unlabelled).unwrap().contains("no label pool"));
    assert!(
        c.describe().starts_with("nodeName h200-a, "),
        "{}",
        c.describe()
    );
    // An empty nodeName is no nodeName.
    spec.node_name = Some(String::new());
    assert_eq!(PodConstraints::of(Some(&spec)).node_name, None);
}

#[test]
fn a_huge_selector_is_echoed_bounded() {
    let c = PodConstraints {
        node_selector: (0..3000)
            .map(|i| (format!("label-{i:04}-{}", "k".repeat(300)), "v".repeat(300)))
            .collect(),
        ..PodConstraints::default()
    };
    let described = c.describe();
    assert!(described.contains(", and 2992 more}"), "{described}");
    assert!(described.len() < 8 * 2 * 140 + 200, "{}", described.len());
    let nodes: Vec<NodeInfo> = (0..10).map(|i| node(&format!("n{i}"), &[], &[])).collect();
    let msg = c.left_out(nodes.iter()).unwrap();
    assert!(msg.len() < 8 * 1024, "{}", msg.len());
}

/// A pod whose CPU request (a limit where it sets none, as the API server defaults it) is more
/// than a node's allocatable cores never lands there: 100 cores, 2Ki or a million on a 64-core
/// node stay Pending, so such a node is left out with the figures.
#[test]
fn a_cpu_request_above_a_nodes_cores_leaves_it_out() {
    use k8s_openapi::api::core::v1::{Container, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let spec = |requests: &[(&str, &str)], limits: &[(&str, &str)]| PodSpec {
        containers: vec![Container {
            name: "train".into(),
            resources: Some(ResourceRequirements {
                requests: Some(
                    requests
                        .iter()
                        .map(|(k, v)| ((*k).to_string(), Quantity((*v).into())))
                        .collect(),
                ),
                limits: Some(
                    limits
                        .iter()
                        .map(|(k, v)| ((*k).to_string(), Quantity((*v).into())))
                        .collect(),
                ),
                claims: None,
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let n64 = node("n", &[], &[]).with_allocatable(crate::index::Allocatable {
        cpus: Some(64),
        ..Default::default()
    });
    for limit in ["100", "2Ki", "1048576"] {
        let c = PodConstraints::of(Some(&spec(&[], &[("cpu", limit)])));
        let why = c
            .excludes(&n64)
            .unwrap_or_else(|| panic!("{limit} admitted"));
        assert!(why.contains("it has 64 allocatable CPU cores"), "{why}");
    }
    // A request within the node's cores lands, whatever the limit; a node that states no cores
    // is not judged.
    let c = PodConstraints::of(Some(&spec(&[("cpu", "8")], &[("cpu", "100")])));
    assert_eq!(c.excludes(&n64), None);
    let c = PodConstraints::of(Some(&spec(&[], &[("cpu", "100")])));
    assert_eq!(c.excludes(&node("unknown", &[], &[])), None);
    // A limit of 0 asks for nothing.
    let c = PodConstraints::of(Some(&spec(&[], &[("cpu", "0")])));
    assert_eq!(c.cpu_request, None);
}

/// A container that sets no CPU gets the namespace's LimitRange default request (the default
/// limit where the range sets no default request): a default of `1k` cores leaves a 64-core
/// node out; one of 4 does not, nor does it count for a container that sets its own.
#[test]
fn a_limit_range_default_cpu_counts_as_the_request() {
    let range = |default: serde_json::Value| {
        let r: k8s_openapi::api::core::v1::LimitRange = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cpu", "namespace": "ns"},
            "spec": {"limits": [{"type": "Container", "default": default}]}
        }))
        .unwrap();
        crate::decision::pod::limits::NamespaceLimits::of(&[r])
            .cpu_default_request
            .map(|d| d.0)
    };
    let n64 = node("n", &[], &[]).with_allocatable(crate::index::Allocatable {
        cpus: Some(64),
        ..Default::default()
    });
    let bare: PodSpec = serde_json::from_value(serde_json::json!({
        "containers": [{"name": "train", "image": "i"}]
    }))
    .unwrap();
    let c = PodConstraints::of(Some(&bare))
        .in_namespace(Some(&bare), range(serde_json::json!({"cpu": "1k"})));
    assert_eq!(c.cpu_request, Some(1000.0));
    let why = c.excludes(&n64).unwrap();
    assert!(why.contains("LimitRange default"), "{why}");
    let c = PodConstraints::of(Some(&bare))
        .in_namespace(Some(&bare), range(serde_json::json!({"cpu": "4"})));
    assert_eq!(c.excludes(&n64), None);
    let own: PodSpec = serde_json::from_value(serde_json::json!({
        "containers": [{"name": "train", "image": "i", "resources": {"requests": {"cpu": "8"}}}]
    }))
    .unwrap();
    let c = PodConstraints::of(Some(&own))
        .in_namespace(Some(&own), range(serde_json::json!({"cpu": "1k"})));
    assert_eq!(c.cpu_request, Some(8.0));
}
