//! `explain` on manifests, offline.
use std::collections::BTreeMap;

use offload_testenv::fixtures;

use super::*;
use crate::cluster::view::MemoryView;
use crate::index::NodeInfo;
use crate::render::RenderOptions;
use offload_api::report::NodeReport;

fn inputs(reports: &[(&str, &str)]) -> Inputs {
    let nodes = reports
        .iter()
        .map(|(name, fixture)| NodeInfo::from_report(*name, &NodeReport::parse(fixture).unwrap()))
        .collect();
    Inputs {
        model_configs: BTreeMap::new(),
        view: MemoryView {
            render: RenderOptions {
                guard_image: Some("agent:1".into()),
                ..Default::default()
            },
            ..MemoryView::new(nodes, profiles_from_files(&[]).unwrap())
        },
        deepspeed_configs: BTreeMap::from([(
            "ds".to_string(),
            r#"{"bf16": {"enabled": true}, "zero_optimization": {"stage": 3}}"#.to_string(),
        )]),
    }
}

const JOB: &str = r#"
apiVersion: offload.dev/v1alpha1
kind: TrainingJob
metadata: {name: j, annotations: {offload.dev/profile: auto}}
spec:
  replicas: 1
  framework: {name: DeepSpeed, version: "0.19.8"}
  deepspeed: {configMapRef: {name: ds}}
  template:
    spec:
      restartPolicy: Never
      containers: [{name: t, image: t, resources: {limits: {nvidia.com/gpu: 1}}}]
"#;

#[test]
fn a_training_job_is_explained_with_every_artefact_and_its_candidates() {
    let manifests = read_manifests(JOB).unwrap();
    let e = explain(
        &manifests[0],
        &inputs(&[("h200-0", fixtures::H200_READING)]),
        true,
    )
    .unwrap();
    assert!(e.resolved, "{}", e.message);
    assert_eq!(e.decision.as_ref().unwrap().mode, "CPUCopy");
    assert!(e.reasons.iter().any(|r| r.field == "framework"));
    assert!(e.env.iter().any(|v| v.name == "OFFLOAD_MODE"));
    assert!(e.node_affinity.is_some());
    assert_eq!(e.init_containers[0].name, render::GUARD_CONTAINER);
    let zero = &e.deepspeed_config.as_ref().unwrap()["zero_optimization"];
    assert_eq!(zero["offload_param"]["device"], "cpu");
    // The choice, no offload, and one candidate per knob; ZenFlow marked as another kind of
    // training. Without model hints there is no memory estimate.
    let labels: Vec<&str> = e.candidates.iter().map(|c| c.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "chosen",
            "no_offload",
            "pin_memory=off",
            "offload_param=off",
            "super_offload=on",
            "zenflow=on"
        ]
    );
    assert!(e.candidates.iter().all(|c| c.memory.is_none()));
    // Nothing offloaded, and the user's config has no offload section: none is added.
    let none = &e.candidates[1];
    let zero = &none.deepspeed_config.as_ref().unwrap()["zero_optimization"];
    assert!(zero.get("offload_optimizer").is_none(), "{zero}");
    let zen = e.candidates.last().unwrap();
    assert!(!zen.same_semantics && zen.refused.is_none());
    assert!(zen.deepspeed_config.as_ref().unwrap()["zero_optimization"]["zenflow"].is_object());
    let text = to_text(&e);
    assert!(
        text.contains("candidates:") && text.contains("needs consent"),
        "{text}"
    );
    // JSON for tools.
    let json = serde_json::to_value(&e).unwrap();
    assert_eq!(json["decision"]["nodeClass"], "Discrete");
}

/// With model hints, every placement is a candidate with its estimate beside the node's
/// figures, including those that do not fit (rendered, and marked as not written).
#[test]
fn candidates_show_the_memory_estimate_of_every_placement() {
    let job = JOB.replace(
        "  replicas: 1\n",
        "  replicas: 1\n  model: {parameters: 9.1B, tokensPerStep: 2048, hiddenSize: 4096, layers: 44, vocabSize: 32000}\n",
    );
    let manifests = read_manifests(&job).unwrap();
    let mut i = inputs(&[("h200-0", fixtures::H200_READING)]);
    i.view = MemoryView {
        nodes: std::sync::Arc::new(crate::index::NodeIndex::new(vec![
            NodeInfo::from_report(
                "h200-0",
                &NodeReport::parse(fixtures::H200_READING).unwrap(),
            )
            .with_allocatable(crate::index::Allocatable {
                memory: Some(125 << 30),
                gpus: Some(1),
                cpus: None,
                ..Default::default()
            }),
        ])),
        ..i.view
    };
    let e = explain(&manifests[0], &i, true).unwrap();
    assert!(e.resolved, "{}", e.message);
    let chosen = e.decision.as_ref().unwrap();
    assert_eq!(chosen.mode, "CPUCopy");
    assert!(chosen.memory.as_ref().is_some_and(|m| m.fits));
    let by_label = |l: &str| e.candidates.iter().find(|c| c.label == l).unwrap();
    let none = by_label("no_offload");
    let m = none.memory.as_ref().expect("an estimate");
    assert!(!m.fits && m.gpu_bytes > m.gpu_budget_bytes);
    assert!(
        none.refused
            .as_deref()
            .is_some_and(|r| r.contains("cannot run"))
    );
    assert!(
        none.deepspeed_config.is_some(),
        "rendered anyway, for the benchmark"
    );
    for label in ["offload_optimizer", "offload_optimizer+param"] {
        let c = by_label(label);
        let m = c.memory.as_ref().expect("an estimate");
        assert!(!m.fits, "{label}: the host holds neither");
        assert!(m.host_bytes_per_pod > m.host_budget_bytes.unwrap());
    }
    let text = to_text(&e);
    assert!(
        text.contains("memory: ") && text.contains("does not fit"),
        "{text}"
    );
}

#[test]
fn what_cannot_be_decided_says_why() {
    let manifests = read_manifests(JOB).unwrap();
    // No node at all.
    let e = explain(&manifests[0], &inputs(&[]), false).unwrap();
    assert!(!e.resolved);
    assert_eq!(e.reason.as_deref(), Some("NoReportedNodes"), "{e:?}");
    // The referenced config was not given.
    let mut i = inputs(&[("h200-0", fixtures::H200_READING)]);
    i.deepspeed_configs.clear();
    let e = explain(&manifests[0], &i, false).unwrap();
    assert_eq!(e.reason.as_deref(), Some("InvalidDeepSpeedConfig"));
    assert!(e.message.contains("--deepspeed-config"), "{}", e.message);
}

#[test]
fn pods_and_other_kinds_go_through_the_webhook() {
    let pod = read_manifests(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {offload.dev/profile: auto}}\nspec: {containers: [{name: c, image: i, resources: {limits: {nvidia.com/gpu: 1}}}]}\n",
        )
        .unwrap();
    let e = explain(
        &pod[0],
        &inputs(&[("gh200-0", fixtures::GH200_REFERENCE)]),
        false,
    )
    .unwrap();
    assert!(e.resolved, "{}", e.message);
    assert_eq!(e.decision.unwrap().mode, "UnifiedMemory");
    let obj = e.object.unwrap();
    assert!(obj.pointer("/spec/initContainers/0/name").is_some());
    assert!(
        obj.pointer("/metadata/annotations/offload.dev~1resolved")
            .is_some()
    );
    // Not opted in: unchanged.
    let plain = read_manifests(
            "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec: {template: {spec: {containers: [{name: c, image: i}]}}}\n",
        )
        .unwrap();
    let e = explain(&plain[0], &inputs(&[]), false).unwrap();
    assert_eq!(e.reason.as_deref(), Some("NotOptedIn"));
}

#[test]
fn bad_manifests_get_a_clear_error() {
    assert!(read_manifests("").is_err());
    assert!(read_manifests(": : :\n- [").is_err());
    let i = inputs(&[]);
    for (doc, expect) in [
        ("{}", "no kind"),
        ("{kind: Deployment}", "not a kind the operator configures"),
        (
            "{kind: TrainingJob, apiVersion: offload.dev/v1alpha1, metadata: {name: x}, spec: {replicas: many}}",
            "does not match its schema",
        ),
    ] {
        let m = read_manifests(doc).unwrap();
        let err = explain(&m[0], &i, false).unwrap_err().to_string();
        assert!(err.contains(expect), "{doc}: {err}");
    }
    assert!(node_from_report("/nonexistent.json").is_err());
    assert!(deepspeed_configs_from_files(&["no-equals".into()]).is_err());
}

#[test]
fn a_job_with_gpu_claims_is_sized_by_them_and_pinned_through_a_copied_template() {
    let mut inputs = inputs(&[]);
    let gh200 = NodeInfo::new("gh200-dra", BTreeMap::new(), None).with_driver({
        let mut w = crate::dra::slices::DriverWitness {
            driver: "gpu.nvidia.com".into(),
            gpus: 4,
            ..Default::default()
        };
        w.modes.insert("ATS", 4);
        w
    });
    inputs.view.nodes = std::sync::Arc::new(crate::index::NodeIndex::new(vec![gh200]));
    inputs.view.dra = Some(crate::dra::DraOptions::default());
    let template: crate::dra::api::ResourceClaimTemplate =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "gpus4", "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "g", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 4}}]}}}
        }))
        .unwrap();
    inputs.view.claim_templates.insert(
        ("default".into(), "gpus4".into()),
        std::sync::Arc::new(template),
    );
    let job = r#"
apiVersion: offload.dev/v1alpha1
kind: TrainingJob
metadata: {name: c, namespace: default, annotations: {offload.dev/profile: auto}}
spec:
  replicas: 1
  framework: {name: DeepSpeed, version: "0.19.8"}
  template:
    spec:
      resourceClaims: [{name: gpus, resourceClaimTemplateName: gpus4}]
      containers: [{name: t, image: t, resources: {claims: [{name: gpus}]}}]
"#;
    let manifests = read_manifests(job).unwrap();
    let e = explain(&manifests[0], &inputs, false).unwrap();
    assert!(e.resolved, "{}", e.message);
    assert_eq!(e.decision.as_ref().unwrap().mode, "UnifiedMemory");
    assert_eq!(e.claim_templates.len(), 1);
    let expr = e.claim_templates[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]
        ["selectors"][0]["cel"]["expression"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(expr.contains("\"ATS\""), "{expr}");
    // Nodes classed by the driver carry no agent labels: none in the affinity.
    assert!(e.node_affinity.is_none(), "{:?}", e.node_affinity);
    // The start-up guard shares the pod's GPU claim (no device-plugin GPUs to ask for).
    let guard = &e.init_containers[0];
    let resources = guard.resources.as_ref().unwrap();
    assert_eq!(resources.claims.as_ref().unwrap()[0].name, "gpus");
    assert!(
        !resources
            .limits
            .as_ref()
            .unwrap()
            .contains_key(offload_api::names::GPU_RESOURCE)
    );
    let text = super::text::to_text(&e);
    assert!(text.contains("claim template c-gpus"), "{text}");

    // A job pinned by labels cannot use a node only the driver describes.
    let labelled = read_manifests(JOB).unwrap();
    let e = explain(&labelled[0], &inputs, false).unwrap();
    assert!(!e.resolved);
    assert_eq!(
        e.reason.as_deref(),
        Some("NoReportedNodes"),
        "{}",
        e.message
    );
}

#[test]
fn a_model_config_file_sizes_the_job_and_unchecked_host_memory_is_said() {
    let job = JOB.replace(
        "  deepspeed: {configMapRef: {name: ds}}",
        "  deepspeed: {configMapRef: {name: ds}}\n  model: {configMapRef: {name: m}, tokensPerStep: 2048}",
    );
    let manifests = read_manifests(&job).unwrap();
    // Without the model's ConfigMap, explain says which one it needs.
    let e = explain(
        &manifests[0],
        &inputs(&[("h200-0", fixtures::H200_READING)]),
        false,
    )
    .unwrap();
    assert!(!e.resolved);
    assert!(
        e.message
            .contains("ConfigMap \"m\" (spec.model.configMapRef) was not given (--model-config)"),
        "{}",
        e.message
    );
    let mut with_model = inputs(&[("h200-0", fixtures::H200_READING)]);
    with_model.model_configs.insert(
        "m".into(),
        include_str!("../../hack/gpu/models/llama-8b.json").into(),
    );
    let e = explain(&manifests[0], &with_model, false).unwrap();
    assert!(e.resolved, "{}", e.message);
    assert_eq!(e.decision.as_ref().unwrap().mode, "Disabled");
    // The recorded report states no allocatable memory and the pod no limit: host memory is
    // not checked, and the reason says so instead of passing any figure silently.
    let mode = e.reasons.iter().find(|r| r.field == "mode").unwrap();
    assert!(mode.message.contains("not checked"), "{}", mode.message);
    assert!(
        mode.message.contains("8.03B parameters"),
        "{}",
        mode.message
    );
}

/// The runs the agent recorded on the H200 (`docs/benchmarks/closed-loop-h200.md`).
fn recorded_run(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/docs/benchmarks/raw/2026-12-01-h200-loop/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn with_node_memory(mut i: Inputs) -> Inputs {
    let nodes: Vec<NodeInfo> = i
        .view
        .nodes
        .nodes()
        .map(|n| {
            n.clone().with_allocatable(crate::index::Allocatable {
                memory: Some(125 << 30),
                ..Default::default()
            })
        })
        .collect();
    i.view.nodes = std::sync::Arc::new(crate::index::NodeIndex::new(nodes));
    i
}

#[test]
fn recorded_runs_give_the_next_decision_offline() {
    // A job without hints, everything offloaded first, observed on the H200: sized from its
    // peaks, the next decision offloads nothing.
    let manifests = read_manifests(JOB).unwrap();
    let mut i = with_node_memory(inputs(&[("h200", fixtures::H200_READING)]));
    let first = explain(&manifests[0], &i, false).unwrap();
    assert_eq!(first.decision.as_ref().unwrap().mode, "CPUCopy");
    let run = read_evidence("run-1", &recorded_run("qwen-safe-run-1.json"), "j").unwrap();
    assert_eq!(run.outcome, Outcome::Ran);
    let next = explain_observed(&manifests[0], &mut i, std::slice::from_ref(&run)).unwrap();
    assert_eq!(
        next.decision.as_ref().unwrap().mode,
        "Disabled",
        "{}",
        next.message
    );
    assert!(
        next.closed_loop[0]
            .lesson
            .as_deref()
            .unwrap()
            .contains("1.62B parameters")
    );
    assert!(to_text(&next).contains("next decision, after 1 run(s)"));
    // A run that ran out of GPU memory is told apart from one that ran; one that failed for
    // another reason teaches nothing.
    let oom = read_evidence("run-1", &recorded_run("llama-fast-run-1.json"), "j").unwrap();
    assert!(matches!(
        &oom.outcome,
        Outcome::OutOfMemory(offload_api::v1alpha1::MemoryKind::Gpu, _)
    ));
    let mut other: serde_json::Value =
        serde_json::from_str(&recorded_run("llama-fast-run-1.json")).unwrap();
    other["message"] = "ValueError: bad batch".into();
    let failed = read_evidence("x", &other.to_string(), "j").unwrap();
    assert!(matches!(failed.outcome, Outcome::Failed(_)));
    let mut i = with_node_memory(inputs(&[("h200", fixtures::H200_READING)]));
    let after = explain_observed(&manifests[0], &mut i, &[failed]).unwrap();
    assert!(
        after.closed_loop[0].lesson.is_none()
            && after.closed_loop[0].outcome.contains("teaches nothing")
    );
    assert_eq!(after.decision.as_ref().unwrap().mode, "CPUCopy");
    // Garbage and impossible figures are refused with what is wrong.
    assert!(
        read_evidence("g", "{not json", "j")
            .unwrap_err()
            .contains("neither an observed run")
    );
    // A recorded configuration holds only the rendered variables, each short.
    let mut configured = other.clone();
    configured["configuration"] =
        serde_json::json!({"OFFLOAD_MODE": "cpu-copy", "OFFLOAD_RATIO": "0.5"});
    let read = read_evidence("x", &configured.to_string(), "j").unwrap();
    assert_eq!(read.configuration["OFFLOAD_RATIO"], "0.5");
    configured["configuration"]["LD_PRELOAD"] = "x".into();
    let e = read_evidence("x", &configured.to_string(), "j").unwrap_err();
    assert!(e.contains("a configuration variable \"LD_PRELOAD\""), "{e}");
    configured["configuration"] = serde_json::json!({"OFFLOAD_MODE": "c".repeat(65)});
    let e = read_evidence("x", &configured.to_string(), "j").unwrap_err();
    assert!(e.contains("at most 64 characters"), "{e}");
    // A step no reporter writes.
    let mut stepped = other.clone();
    stepped["pod"]["stepSeconds"] = (-1.5).into();
    let e = read_evidence("x", &stepped.to_string(), "j").unwrap_err();
    assert!(e.contains("steps in -1.5 s (from 0 to a day)"), "{e}");
    other["pod"]["gpuMemoryPeakBytes"] = (200u64 << 30).into();
    assert!(
        read_evidence("x", &other.to_string(), "j")
            .unwrap_err()
            .contains("more than its GPU")
    );
}

#[test]
fn explain_judges_evidence_as_the_controller_does() {
    let manifests = read_manifests(JOB).unwrap();
    let run = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value =
            serde_json::from_str(&recorded_run("qwen-safe-run-1.json")).unwrap();
        edit(&mut v);
        read_evidence("x", &v.to_string(), "j").unwrap()
    };
    // A GPU no node has, a host peak above every node: not evidence, nothing learned, the decision as before.
    let first = {
        let i = with_node_memory(inputs(&[("h200", fixtures::H200_READING)]));
        explain(&manifests[0], &i, false).unwrap()
    };
    for (edit, says) in [
        (
            &(|v: &mut serde_json::Value| {
                v["pod"]["gpuMemoryTotalBytes"] = (300u64 << 30).into();
            }) as &dyn Fn(&mut serde_json::Value),
            "the node's report has",
        ),
        (
            &|v: &mut serde_json::Value| v["pod"]["hostMemoryPeakBytes"] = (10u64 << 40).into(),
            "more than the node's",
        ),
    ] {
        let mut i = with_node_memory(inputs(&[("h200", fixtures::H200_READING)]));
        let after = explain_observed(&manifests[0], &mut i, &[run(edit)]).unwrap();
        let step = &after.closed_loop[0];
        assert!(
            step.outcome.contains("not evidence") && step.outcome.contains(says),
            "{}",
            step.outcome
        );
        assert!(step.lesson.is_none());
        assert_eq!(after.decision, first.decision);
    }
    // The pod's own processes above the whole device: refused as it is read.
    let mut v: serde_json::Value =
        serde_json::from_str(&recorded_run("qwen-safe-run-1.json")).unwrap();
    v["pod"]["processGpuMemoryPeakBytes"] = (40u64 << 30).into();
    v["pod"]["gpuMemoryPeakBytes"] = (30u64 << 30).into();
    let err = read_evidence("x", &v.to_string(), "j").unwrap_err();
    assert!(err.contains("more than the device had"), "{err}");
    // A JVM's heap running out is not the GPU running out.
    let java = run(&|v| {
        v["exitCode"] = 1.into();
        v["message"] =
            "Exception in thread \"main\" java.lang.OutOfMemoryError: Java heap space".into();
    });
    assert!(
        matches!(java.outcome, Outcome::Failed(_)),
        "{:?}",
        java.outcome
    );
    // Twenty recorded out-of-memory runs: after maxMemoryRetries (3 by default) the controller
    // decides no more, and neither does explain.
    let oom = read_evidence("run-1", &recorded_run("llama-fast-run-1.json"), "j").unwrap();
    let mut i = with_node_memory(inputs(&[("h200", fixtures::H200_READING)]));
    let after = explain_observed(&manifests[0], &mut i, &vec![oom; 20]).unwrap();
    let last = after.closed_loop.last().unwrap();
    assert!(
        last.outcome.contains("maxMemoryRetries"),
        "{}",
        last.outcome
    );
    assert!(after.closed_loop.len() <= 5, "{}", after.closed_loop.len());
    // A node's summary whose window ends in year 2999 (it would never go stale): refused as
    // the controller skips it.
    let summary = serde_json::json!({
        "schemaVersion": offload_api::observed::OBSERVED_SCHEMA_VERSION,
        "node": "h200", "observedAt": "2999-01-01T00:00:00Z", "windowSeconds": 60.0,
        "source": "recorded-trace",
        "pods": [{"namespace": "default", "name": "j-0", "trainingJob": "j", "gpus": ["0"],
                  "gpuBusy": 0.9, "samples": 10, "gpuMemoryPeakBytes": 20u64 << 30,
                  "gpuMemoryTotalBytes": 150_754_820_096u64}]
    });
    let err = read_evidence("s", &summary.to_string(), "j").unwrap_err();
    assert!(err.contains("after now"), "{err}");
}

/// A Megatron-core job's candidates carry the flags each would write, as the pod's
/// OFFLOAD_MEGATRON_ARGS has them: the choice's fraction, the whole optimizer state's, and no
/// offload's distributed optimizer alone.
#[test]
fn megatron_candidates_show_their_flags() {
    let job = r#"
apiVersion: offload.dev/v1alpha1
kind: TrainingJob
metadata: {name: m, annotations: {offload.dev/profile: auto}}
spec:
  replicas: 1
  framework: {name: Megatron, version: "0.14.0"}
  model: {architecture: GPT, hiddenSize: 4096, layers: 36, attentionHeads: 32, vocabSize: 50304, tokensPerStep: 4096}
  template:
    spec:
      restartPolicy: Never
      containers: [{name: t, image: t, resources: {limits: {nvidia.com/gpu: 1}}}]
"#;
    let manifests = read_manifests(job).unwrap();
    let e = explain(
        &manifests[0],
        &with_node_memory(inputs(&[("h200-0", fixtures::H200_READING)])),
        true,
    )
    .unwrap();
    assert!(e.resolved, "{}", e.message);
    let ratio = e.decision.as_ref().unwrap().ratio;
    assert!(ratio > 0.0 && ratio < 1.0, "{ratio}");
    let args = |label: &str| {
        e.candidates
            .iter()
            .find(|c| c.label == label)
            .and_then(|c| c.megatron_args.clone())
            .unwrap_or_else(|| panic!("{label}: {:?}", e.candidates))
    };
    let env = e
        .env
        .iter()
        .find(|v| v.name == "OFFLOAD_MEGATRON_ARGS")
        .and_then(|v| v.value.clone())
        .unwrap();
    assert_eq!(args("chosen"), env);
    assert!(
        env.contains(&format!("--optimizer-offload-fraction {ratio}")),
        "{env}"
    );
    assert!(args("offload_optimizer").contains("--optimizer-offload-fraction 1"));
    assert_eq!(args("no_offload"), "--use-distributed-optimizer");
    let text = to_text(&e);
    assert!(
        text.contains(
            "chosen                   --use-distributed-optimizer --optimizer-cpu-offload"
        ),
        "{text}"
    );
}

/// `--node-cpus` gives an offline node its allocatable CPUs, read as a Node's are; what does not
/// read, or names no node given, is refused with the argument.
#[test]
fn node_cpus_are_given_offline_and_bad_ones_refused() {
    let nodes = || {
        vec![NodeInfo::from_report(
            "h200",
            &NodeReport::parse(fixtures::H200_READING).unwrap(),
        )]
    };
    let given = with_node_cpus(nodes(), &["h200=15500m".into()]).unwrap();
    assert_eq!(given[0].allocatable.cpus, Some(16));
    for (arg, expected) in [
        ("h200", "use NAME=QUANTITY"),
        ("h200=lots", "\"lots\" is not a CPU quantity"),
        ("gpu-9=4", "no --node-report names node \"gpu-9\""),
    ] {
        let e = with_node_cpus(nodes(), &[arg.into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains(expected), "{arg}: {e}");
    }
}

#[test]
fn a_trace_given_as_a_file_sizes_the_job_for_every_kind_and_one_of_another_step_is_said() {
    let config = include_str!("../../hack/gpu/models/new/nemotron-4b.json");
    let trace = include_str!("../../tests/fixtures/traces/nemotron-4b-4096.json");
    let mut with_trace = inputs(&[("h200-0", fixtures::H200_READING)]);
    with_trace.model_configs.insert("m".into(), config.into());
    with_trace.view.traces.add(trace).unwrap();
    let traced = |e: &Explanation| {
        e.reasons.iter().any(|r| {
            r.message
                .contains("traced from the model's code (NemotronForCausalLM")
        })
    };
    // A TrainingJob at the traced step.
    let job = JOB.replace(
        "  deepspeed: {configMapRef: {name: ds}}",
        "  deepspeed: {configMapRef: {name: ds}}\n  model: {configMapRef: {name: m}, tokensPerStep: 4096}",
    );
    let e = explain(&read_manifests(&job).unwrap()[0], &with_trace, false).unwrap();
    assert!(e.resolved, "{}", e.message);
    assert!(traced(&e), "{:?}", e.reasons);
    // A batch Job that names the same model and step by its annotations: the webhook's path.
    let batch = r#"
apiVersion: batch/v1
kind: Job
metadata:
  name: b
  labels: {offload.dev/profile: auto}
  annotations:
    offload.dev/framework: DeepSpeed
    offload.dev/framework-version: "0.19.8"
    offload.dev/model-config: m
    offload.dev/tokens-per-step: "4096"
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: t, image: t, resources: {limits: {nvidia.com/gpu: 1}}}]
"#;
    let e = explain(&read_manifests(batch).unwrap()[0], &with_trace, false).unwrap();
    assert!(e.resolved, "{}", e.message);
    assert!(traced(&e), "{:?}", e.reasons);
    // At another step the trace is not used, and the reasons say why.
    let other = job.replace("tokensPerStep: 4096", "tokensPerStep: 2048");
    let e = explain(&read_manifests(&other).unwrap()[0], &with_trace, false).unwrap();
    assert!(!traced(&e), "{:?}", e.reasons);
    assert!(
        e.reasons.iter().any(|r| r
            .message
            .contains("not traced: the trace is of 1 × 4096 tokens")),
        "{:?}",
        e.reasons
    );
}
