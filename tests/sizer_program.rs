//! The sizer program (`sizer/offload_sizer.py`) run for real on this CPU, with the Python the
//! test command installs (torch 2.11, transformers 5.17: `OFFLOAD_SIZER_PYTHON`): it reproduces
//! the committed traces figure for figure, refuses what it cannot trace with a code, and
//! `offload-operator explain --trace` decides a job with it. Where no such Python is given the
//! tests say so and pass, unless `OFFLOAD_SIZER_REQUIRED=1` (the test command sets it).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Python with torch and transformers, or `None` (and why) where there is none.
fn python() -> Option<String> {
    let required = std::env::var("OFFLOAD_SIZER_REQUIRED").is_ok_and(|v| v == "1");
    let python = std::env::var("OFFLOAD_SIZER_PYTHON").ok();
    let usable = python.as_deref().is_some_and(|p| {
        Command::new(p)
            .args(["-c", "import torch, transformers"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if usable {
        return python;
    }
    let why =
        "no Python with torch and transformers (OFFLOAD_SIZER_PYTHON; hack/test.sh installs one)";
    assert!(!required, "{why}, and OFFLOAD_SIZER_REQUIRED=1");
    eprintln!("skipped: {why}");
    None
}

/// Runs the sizer on `config` with `args`: its exit code and its JSON.
fn size(python: &str, config: &Path, args: &[&str]) -> (i32, Value) {
    let out = Command::new(python)
        .arg(root().join("sizer/offload_sizer.py"))
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    let json = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap_or(-1), json)
}

/// A trace without what differs from run to run (time, memory, the interpreter's version).
fn figures(mut trace: Value) -> Value {
    let obj = trace.as_object_mut().unwrap();
    for k in ["wallSeconds", "maxRssBytes"] {
        obj.remove(k);
    }
    obj["versions"].as_object_mut().unwrap().remove("python");
    trace
}

#[test]
fn the_sizer_reproduces_the_committed_traces_figure_for_figure() {
    let Some(python) = python() else { return };
    let cases = [
        // A Llama of two layers (Llama-3.2-3B's), SDPA's flash kernel.
        ("tests/fixtures/traces/llama-2layers-512.json", None, "512"),
        // A squared-ReLU MLP without a gate and a 256k vocabulary.
        (
            "tests/fixtures/traces/nemotron-4b-4096.json",
            Some("hack/gpu/models/new/nemotron-4b.json"),
            "4096",
        ),
        // Latent attention, routed and shared experts: the memory-efficient kernel.
        (
            "tests/fixtures/traces/deepseekv3-4b-4096.json",
            Some("hack/gpu/models/new/deepseekv3-4b.json"),
            "4096",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (fixture, config, sequence) in cases {
        let config = match config {
            Some(c) => root().join(c),
            None => {
                // Llama-3.2-3B's config.json with two of its layers.
                let mut c: Value = serde_json::from_str(
                    &std::fs::read_to_string(root().join("hack/gpu/models/llama-3b.json")).unwrap(),
                )
                .unwrap();
                c["num_hidden_layers"] = 2.into();
                let path = dir.path().join("llama-2.json");
                std::fs::write(&path, c.to_string()).unwrap();
                path
            }
        };
        let (code, trace) = size(&python, &config, &["--sequence", sequence]);
        assert_eq!(code, 0, "{trace}");
        let committed: Value =
            serde_json::from_str(&std::fs::read_to_string(root().join(fixture)).unwrap()).unwrap();
        if trace["versions"] != committed["versions"]
            && trace["versions"]["torch"] != committed["versions"]["torch"]
        {
            eprintln!(
                "note: {fixture} was traced with other libraries: {}",
                committed["versions"]
            );
        }
        assert_eq!(figures(trace), figures(committed), "{fixture}");
    }
}

#[test]
fn what_the_sizer_cannot_trace_it_refuses_with_a_code() {
    let Some(python) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let cases = [
        ("not-json.json", "{model_type: llama", 2, "ConfigNotJson"),
        ("no-type.json", r#"{"hidden_size": 8}"#, 2, "NoModelType"),
        (
            "unknown.json",
            r#"{"model_type": "no-such-model-9000"}"#,
            3,
            "UnknownModelType",
        ),
        (
            "custom.json",
            r#"{"model_type": "llama", "auto_map": {"AutoModelForCausalLM": "modeling_x.X"}}"#,
            3,
            "CustomCode",
        ),
    ];
    for (name, text, exit, code) in cases {
        let (got, out) = size(&python, &write(name, text), &["--sequence", "16"]);
        assert_eq!(got, exit, "{name}: {out}");
        assert_eq!(out["kind"], "ModelTraceError", "{name}");
        assert_eq!(out["error"]["code"], code, "{name}: {out}");
    }
    // A micro-batch past the bound is refused before anything is built.
    let (got, out) = size(
        &python,
        &write("tiny.json", r#"{"model_type": "llama"}"#),
        &["--micro-batch", "4096", "--sequence", "4096"],
    );
    assert_eq!((got, &out["error"]["code"]), (2, &Value::from("BadShape")));
}

#[test]
fn explain_traces_the_model_before_a_job_is_submitted() {
    let Some(python) = python() else { return };
    let job = r#"
apiVersion: offload.dev/v1alpha1
kind: TrainingJob
metadata: {name: nemotron, annotations: {offload.dev/profile: auto}}
spec:
  replicas: 1
  framework: {name: DeepSpeed, version: "0.19.8"}
  model: {configMapRef: {name: model}, tokensPerStep: 4096}
  template:
    spec:
      containers: [{name: t, image: t, resources: {limits: {nvidia.com/gpu: 1}}}]
"#;
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("job.yaml");
    std::fs::write(&manifest, job).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_offload-operator"))
        .arg("explain")
        .arg("-f")
        .arg(&manifest)
        .arg("--node-report")
        .arg(root().join("crates/testenv/fixtures/node-report-h200.json"))
        .arg("--model-config")
        .arg(format!(
            "model={}",
            root()
                .join("hack/gpu/models/new/nemotron-4b.json")
                .display()
        ))
        .args(["--trace", "--python", &python])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("traced from the model's code (NemotronForCausalLM (nemotron)"),
        "{text}"
    );
}
