#[test]
fn hostile_reports_are_refused_with_what_is_wrong() {
    let deep = format!("{}1{}", "[".repeat(50_000), "]".repeat(50_000));
    let huge = format!(
        r#"{{"schemaVersion": 2, "pad": "{}"}}"#,
        "x".repeat(MAX_REPORT_BYTES)
    );
    for (case, text, expect) in [
        ("empty", String::new(), "not valid JSON"),
        ("a list", "[]".to_string(), "schemaVersion"),
        (
            "a string version",
            r#"{"schemaVersion": "2"}"#.to_string(),
            "schemaVersion",
        ),
        (
            "a future version",
            r#"{"schemaVersion": 99}"#.to_string(),
            "upgrade",
        ),
        ("nested 50,000 deep", deep, "not valid JSON"),
        ("over 256 KiB", huge, "more than the"),
        (
            "fields of the wrong type",
            r#"{"schemaVersion": 2, "gpus": "many"}"#.to_string(),
            "not valid JSON",
        ),
    ] {
        let err = NodeReport::parse(&text).unwrap_err().to_string();
        assert!(err.contains(expect), "{case}: {err}");
    }
}

use super::*;
use crate::names;

// The recorded readings live with the test environment; read here as plain text.
const GH200_REFERENCE: &str = include_str!("../../../testenv/fixtures/node-report-gh200.json");
const H200_READING: &str = include_str!("../../../testenv/fixtures/node-report-h200.json");
const HMM_UNPINNED: &str = include_str!("../../../testenv/fixtures/node-report-hmm-unpinned.json");

#[test]
fn recorded_reports_parse_and_classify() {
    let gh = NodeReport::parse(GH200_REFERENCE).unwrap();
    assert_eq!(gh.memory_model, NodeMemoryModel::Coherent);
    assert_eq!(
        NodeMemoryModel::classify(&gh.gpus),
        NodeMemoryModel::Coherent
    );
    assert_eq!(crate::labels::published(&gh)[names::LABEL_UMA], "true");
    assert_eq!(
        crate::labels::published(&gh)[names::LABEL_ADDRESSING_MODE],
        "ats"
    );
    let h200 = NodeReport::parse(H200_READING).unwrap();
    assert_eq!(
        NodeMemoryModel::classify(&h200.gpus),
        NodeMemoryModel::Discrete
    );
    assert_eq!(crate::labels::published(&h200)[names::LABEL_UMA], "false");
    assert_eq!(crate::labels::published(&h200)[names::LABEL_C2C], "false");
    let hmm = NodeReport::parse(HMM_UNPINNED).unwrap();
    assert_eq!(NodeMemoryModel::classify(&hmm.gpus), NodeMemoryModel::Hmm);
    assert_eq!(crate::labels::published(&hmm)[names::LABEL_UMA], "false");
    assert_eq!(
        crate::labels::published(&hmm)[names::LABEL_ADDRESSING_MODE],
        "hmm"
    );
}

#[test]
fn report_round_trips() {
    let gh = NodeReport::parse(GH200_REFERENCE).unwrap();
    let again = NodeReport::parse(&gh.to_annotation().unwrap()).unwrap();
    assert_eq!(gh, again);
}

#[test]
fn bad_reports_get_specific_errors() {
    assert!(matches!(
        NodeReport::parse("{not json"),
        Err(ReportError::Malformed(_))
    ));
    assert!(matches!(
        NodeReport::parse(r#"{"schemaVersion": 7}"#),
        Err(ReportError::UnsupportedVersion { found: 7 })
    ));
    let err = NodeReport::parse(r#"{"agentVersion": "1"}"#).unwrap_err();
    assert!(err.to_string().contains("schemaVersion"), "{err}");
    let err = NodeReport::parse(r#"{"schemaVersion": 1, "node": 3}"#).unwrap_err();
    assert!(matches!(err, ReportError::Malformed(_)), "{err}");
}

/// Each edit makes the H200 reading impossible in one way; each is refused with a message
/// that names the field.
#[test]
fn impossible_reports_are_refused_with_the_field_named() {
    let base: serde_json::Value = serde_json::from_str(H200_READING).unwrap();
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit); 16] = [
        ("efficiency 2", |r| r["selftest"]["efficiency"] = 2.0.into()),
        ("threshold -0.5", |r| {
            r["selftest"]["threshold"] = (-0.5).into()
        }),
        ("verdict is verified without an efficiency", |r| {
            r["selftest"].as_object_mut().unwrap().remove("efficiency");
        }),
        ("cpuUpdateRate -1", |r| {
            r["selftest"]["cpuUpdateRate"] = (-1.0).into()
        }),
        ("bandwidth.h2dPinned -55", |r| {
            r["selftest"]["bandwidth"]["h2dPinned"] = (-55.0).into()
        }),
        (
            "memoryModel is coherent but its GPUs make the node discrete",
            |r| r["memoryModel"] = "coherent".into(),
        ),
        ("65 GPUs listed", |r| {
            let gpu = r["gpus"][0].clone();
            r["gpus"] = serde_json::Value::Array(vec![gpu; 65]);
        }),
        // A hostile input: one GPU listed 8 times, rates that give inf×
        // headroom or NaN %, reports dated "yesterday".
        ("listed twice", |r| {
            let gpu = r["gpus"][0].clone();
            r["gpus"] = serde_json::Value::Array(vec![gpu; 8]);
        }),
        ("selftest.cpuUpdateRate 1e308", |r| {
            r["selftest"]["cpuUpdateRate"] = 1e308.into()
        }),
        ("selftest.perGpu[1].cpuUpdateRate 1e308", |r| {
            r["selftest"]["perGpu"] = serde_json::json!([
                {"index": 0, "efficiency": 0.9, "cpuUpdateRate": 4e9},
                {"index": 1, "efficiency": 0.9, "cpuUpdateRate": 1e308}
            ])
        }),
        ("selftest.gpuFlops 1e-300", |r| {
            r["selftest"]["gpuFlops"] = 1e-300.into()
        }),
        ("generatedAt \"yesterday\"", |r| {
            r["generatedAt"] = "yesterday".into()
        }),
        ("reports 0 bytes of memory, less than any GPU has", |r| {
            r["gpus"][0]["memoryTotalBytes"] = 0.into()
        }),
        ("more than a H200 has (at most 155 GB)", |r| {
            r["gpus"][0]["memoryTotalBytes"] = u64::MAX.into()
        }),
        // 70 TB: under the old 64 TiB cap, far over what an H200 (or any GPU) has.
        (
            "reports 70000000000000 bytes of memory, more than a H200 has",
            |r| r["gpus"][0]["memoryTotalBytes"] = 70_000_000_000_000u64.into(),
        ),
        ("more than any GPU has (at most 512 GiB)", |r| {
            r["gpus"][0]["name"] = "Acme Accelerator 9000".into();
            r["gpus"][0]["memoryTotalBytes"] = 700_000_000_000u64.into()
        }),
    ];
    for (expected, edit) in cases {
        let mut report = base.clone();
        edit(&mut report);
        let err = NodeReport::parse(&report.to_string()).unwrap_err();
        assert!(
            matches!(err, ReportError::Impossible(_)),
            "{expected}: {err}"
        );
        assert!(err.to_string().contains(expected), "{expected}: {err}");
    }
}

#[test]
fn a_mixed_node_is_not_coherent() {
    let gh = NodeReport::parse(GH200_REFERENCE).unwrap();
    let h200 = NodeReport::parse(H200_READING).unwrap();
    let mixed = vec![gh.gpus[0].clone(), h200.gpus[0].clone()];
    assert_eq!(NodeMemoryModel::classify(&mixed), NodeMemoryModel::Unknown);
    assert_eq!(NodeMemoryModel::classify(&[]), NodeMemoryModel::NoGpu);
}

/// The agent's own probe on real H100 and H200 nodes (2026-12-06, release binaries, real NVML
/// and sysfs): each GPU's local CPUs from its PCI device, the node's NUMA nodes from the kernel.
#[test]
fn a_real_probe_names_its_gpus_local_cores() {
    for (text, name, memory) in [
        (
            include_str!(
                "../../../../docs/benchmarks/raw/2026-12-06-h100-converge/loop/node-report.json"
            ),
            "NVIDIA H100 80GB HBM3",
            None,
        ),
        (
            include_str!("../../../../docs/benchmarks/raw/2026-12-06-h200-tenth/probe.json"),
            "NVIDIA H200",
            Some(150_754_820_096),
        ),
    ] {
        let r = NodeReport::parse(text).unwrap();
        assert_eq!(r.memory_model, NodeMemoryModel::Discrete, "{name}");
        assert_eq!(r.os_numa_nodes, Some(1), "{name}");
        let gpu = &r.gpus[0];
        assert_eq!(gpu.name, name);
        if let Some(bytes) = memory {
            assert_eq!(gpu.memory_total_bytes, bytes);
        }
        assert_eq!(
            (gpu.local_cpus.as_deref(), gpu.local_cpu_count),
            (Some("0-15"), Some(16)),
            "{name}"
        );
    }
}

#[test]
fn the_memory_models_witnesses_are_read_and_checked() {
    let numa = NodeReport::parse(include_str!(
        "../../../testenv/fixtures/node-report-gh200-numa.json"
    ))
    .unwrap();
    let w = numa.memory_witnesses.as_ref().unwrap();
    assert_eq!(w.kernel, Some(KernelGpuMemory::NumaNodes));
    let cdmm = NodeReport::parse(include_str!(
        "../../../testenv/fixtures/node-report-gb200-cdmm.json"
    ))
    .unwrap();
    assert_eq!(cdmm.memory_model, NodeMemoryModel::Coherent);
    assert_eq!(cdmm.gpus.len(), 4);
    // The kernel never makes a node unified: a model that is not NVML's word is refused, as
    // are an unbounded list and sentence.
    let mut forged = serde_json::to_value(&cdmm).unwrap();
    forged["memoryWitnesses"]["nvml"] = serde_json::json!("discrete");
    let err = NodeReport::parse(&forged.to_string()).unwrap_err();
    assert!(
        err.to_string().contains("the model is NVML's word"),
        "{err}"
    );
    let mut long = serde_json::to_value(&cdmm).unwrap();
    long["memoryWitnesses"]["used"] = serde_json::json!("x".repeat(MAX_WITNESS_SENTENCE + 1));
    assert!(NodeReport::parse(&long.to_string()).is_err());
    let mut many = serde_json::to_value(&numa).unwrap();
    many["memoryWitnesses"]["memoryOnlyNodes"] = serde_json::json!(
        (0..=MAX_MEMORY_ONLY_NODES)
            .map(|n| serde_json::json!({"node": n, "bytes": 1}))
            .collect::<Vec<_>>()
    );
    let err = NodeReport::parse(&many.to_string()).unwrap_err();
    assert!(err.to_string().contains("memory-only NUMA nodes"), "{err}");
}
