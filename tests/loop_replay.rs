//! The closed loop as it ran on a GPU node, replayed: the runs the agent recorded on an H100
//! (`docs/benchmarks/raw/2026-12-06-h100-loop/`: real NVML readings, PyTorch's own out-of-memory
//! text; `docs/benchmarks/closed-loop-h200.md`) handed to the real `offload-operator explain
//! --observed`, with the same job, profile, DeepSpeed config, model `config.json`, node report
//! and host memory the loop used. Each step decides what the loop decided then, and the loop's
//! rules hold on real evidence: an out-of-memory run moves the next decision to more offload, a
//! run that trained never to more.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn recorded(name: &str) -> PathBuf {
    root()
        .join("docs/benchmarks/raw/2026-12-06-h100-loop")
        .join(name)
}

/// The operator's decision for `model` after the recorded runs `runs` (1-based), as JSON.
fn decide(model: &str, runs: usize) -> serde_json::Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_offload-operator"));
    cmd.arg("explain")
        .arg("-f")
        .arg(recorded(&format!("job-cfg-{model}.yaml")))
        .arg("--node-report")
        .arg(format!("h200={}", recorded("node-report.json").display()))
        // The node's memory as the loop gave it (the H100 host's, as `explain` read it then).
        .args(["--node-memory", "h200=125Gi"])
        .arg("--profile")
        .arg(root().join("hack/gpu/loop/profile-learn.yaml"))
        .arg("--deepspeed-config")
        .arg(format!(
            "loop-ds={}",
            root().join("hack/gpu/loop/ds.json").display()
        ))
        .arg("--model-config")
        .arg(format!(
            "loop-model={}",
            root()
                .join(format!("hack/gpu/models/{model}.json"))
                .display()
        ));
    for k in 1..=runs {
        cmd.arg("--observed")
            .arg(recorded(&format!("cfg-{model}-run-{k}.json")));
    }
    let out = cmd
        .args(["-o", "json"])
        .output()
        .expect("offload-operator runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("explain's JSON")
}

fn ratio(decision: &serde_json::Value) -> f64 {
    let d = &decision["decision"];
    assert_eq!(d["mode"], "CPUCopy", "{decision}");
    d["ratio"].as_f64().expect("a ratio")
}

/// What the loop decided at step `k` (before run `k`), as it recorded it.
fn recorded_ratio(model: &str, k: usize) -> f64 {
    let text = std::fs::read_to_string(recorded(&format!("cfg-{model}-decision-{k}.json")))
        .expect("the recorded decision");
    ratio(&serde_json::from_str(&text).expect("JSON"))
}

#[test]
fn the_recorded_h100_loop_replays_to_the_same_decisions() {
    // Phi-3-mini: 14 % ran out of GPU memory; 26 % trained; the loop stays at 26 %.
    let steps: Vec<f64> = (0..3)
        .map(|runs| ratio(&decide("phi3-mini", runs)))
        .collect();
    for (k, r) in steps.iter().enumerate() {
        assert!(
            (r - recorded_ratio("phi3-mini", k + 1)).abs() < 1e-9,
            "step {}: {r} now, {} then",
            k + 1,
            recorded_ratio("phi3-mini", k + 1)
        );
    }
    assert!(steps[1] > steps[0], "after the out-of-memory: {steps:?}");
    assert!(
        steps[2] <= steps[1] + 1e-9,
        "never more than what trained: {steps:?}"
    );
    let after = decide("phi3-mini", 2);
    let said = after.to_string();
    assert!(said.contains("out of"), "the OOM run is named: {said}");

    // Gemma-2-2B and Qwen3-4B trained at their first decision: the next is no larger.
    for model in ["gemma2-2b", "qwen3-4b"] {
        let first = ratio(&decide(model, 0));
        assert!((first - recorded_ratio(model, 1)).abs() < 1e-9, "{model}");
        let next = ratio(&decide(model, 1));
        assert!(
            (next - recorded_ratio(model, 2)).abs() < 1e-9,
            "{model}: {next}"
        );
        assert!(next <= first + 1e-9, "{model}: {first} then {next}");
    }
}
