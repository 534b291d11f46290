//! The closed loop as it ran on a GPU node, replayed: the runs the agent recorded on an H100
//! (`docs/benchmarks/raw/2026-12-06-h100-loop/`: real NVML readings, PyTorch's own out-of-memory
//! text; `docs/benchmarks/closed-loop-h200.md`) handed to the real `offload-operator explain
//! --observed`, with the same job, profile, DeepSpeed config, model `config.json`, node report
//! and host memory the loop used. `explain --observed` takes each run as one of the
//! configuration it decides at that point, so a replay is exact only while the memory model
//! decides for a type what it decided then (Qwen3 here); where the model has learned from these
//! very runs since (Phi-3's factor), its first decision must now lie between the share that
//! ran out and the one that trained. The second loop (`2026-12-06-h100-converge/`) ran with
//! the allocator reporter on, every case to its end: its replay is exact.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// The first recorded loop (the Phi-3 factor learned from it since).
const FIRST: &str = "2026-12-06-h100-loop";
/// The loop with the allocator reporter, run to its end (`closed-loop-h200.md`, "converges").
const CONVERGE: &str = "2026-12-06-h100-converge/loop";

fn recorded_in(folder: &str, name: &str) -> PathBuf {
    root().join("docs/benchmarks/raw").join(folder).join(name)
}

/// The operator's decision for `model` after the recorded runs `runs` (1-based), as JSON.
fn decide(model: &str, runs: usize) -> serde_json::Value {
    decide_in(FIRST, model, runs)
}

/// [`decide`] for the loop recorded in `folder`.
fn decide_in(folder: &str, model: &str, runs: usize) -> serde_json::Value {
    let recorded = |name: &str| recorded_in(folder, name);
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

/// The share of the optimizer state a decision offloads: 0 for no offload.
fn share(decision: &serde_json::Value) -> f64 {
    match decision["decision"]["mode"].as_str() {
        Some("Disabled") => 0.0,
        _ => ratio(decision),
    }
}

/// What the loop recorded in `folder` decided at step `k` (before run `k`).
fn recorded_decision_in(folder: &str, model: &str, k: usize) -> serde_json::Value {
    let text = std::fs::read_to_string(recorded_in(
        folder,
        &format!("cfg-{model}-decision-{k}.json"),
    ))
    .expect("the recorded decision");
    serde_json::from_str(&text).expect("JSON")
}

/// What the first loop decided at step `k` (before run `k`), as it recorded it.
fn recorded_ratio(model: &str, k: usize) -> f64 {
    ratio(&recorded_decision_in(FIRST, model, k))
}

/// Whether recorded run `k` of `model` in `folder` trained (the agent's `observe` exit code).
fn trained(folder: &str, model: &str, k: usize) -> bool {
    let text = std::fs::read_to_string(recorded_in(folder, &format!("cfg-{model}-run-{k}.json")))
        .expect("the recorded run");
    let run: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    run["exitCode"] == 0
}

#[test]
fn the_recorded_h100_loop_replays_and_the_model_now_foresees_its_out_of_memory() {
    // Qwen3-4B: 44 % trained at the first decision; the next is the same, never more.
    let first = ratio(&decide("qwen3-4b", 0));
    assert!(
        (first - recorded_ratio("qwen3-4b", 1)).abs() < 1e-9,
        "{first}"
    );
    let next = ratio(&decide("qwen3-4b", 1));
    assert!(
        (next - recorded_ratio("qwen3-4b", 2)).abs() < 1e-9,
        "{next}"
    );
    assert!(next <= first + 1e-9, "{first} then {next}");

    // Phi-3-mini: the loop's first decision, 14 %, ran out of GPU memory; 26 % trained. The
    // model counts Phi-3's blocks from those runs now: its first decision offloads more than
    // the share that ran out and no more than the one that trained.
    let (ran_out, trained) = (
        recorded_ratio("phi3-mini", 1),
        recorded_ratio("phi3-mini", 2),
    );
    let now = ratio(&decide("phi3-mini", 0));
    assert!(
        ran_out < now && now <= trained + 1e-9,
        "{now}: between {ran_out} (ran out) and {trained} (trained)"
    );
    // A run that ran out moves the next decision to more offload.
    let after = decide("phi3-mini", 1);
    assert!(ratio(&after) > now, "{after}");
    assert!(
        after.to_string().contains("out of"),
        "the OOM run is named: {after}"
    );
}

#[test]
fn the_loop_with_the_allocator_reporter_moves_only_toward_less_offload_and_stops() {
    // Each case as the loop ran it on the H100 with the reporter on, every run trained:
    // Gemma-2 2B 30 % → 21 % → no offload (the fastest of all); Mistral 7B 67 % → 66 % (62 % ran
    // out in the sweep beside it); Qwen3-4B 44 % (40 % ran out). Replayed: the same decisions,
    // each no more offload than the one before, and the last one repeated (the loop is done).
    for (model, runs) in [("mistral-7b", 2), ("qwen3-4b", 1)] {
        let mut before = f64::INFINITY;
        for k in 0..=runs {
            let now = decide_in(CONVERGE, model, k);
            let got = share(&now);
            if k < runs {
                let then = share(&recorded_decision_in(CONVERGE, model, k + 1));
                assert!(
                    (got - then).abs() < 1e-9,
                    "{model} decision {}: {got}, recorded {then}",
                    k + 1
                );
                assert!(
                    trained(CONVERGE, model, k + 1),
                    "{model} run {} trained",
                    k + 1
                );
            }
            assert!(
                got <= before + 1e-9,
                "{model}: {before} then {got}: a run that trained never raises the share"
            );
            before = got;
        }
        // The last decision is the one the last run trained with.
        let last = share(&recorded_decision_in(CONVERGE, model, runs));
        assert!(
            (before - last).abs() < 1e-9,
            "{model}: {before} after the loop, {last} trained last"
        );
    }
}

#[test]
fn gemma2_counted_from_these_runs_starts_where_its_loop_ended() {
    // Gemma-2's blocks are counted from these runs now (×1.06 over the Llama-style count, no
    // margin of a type never measured): its first decision is the one its loop converged to in
    // three runs, no offload (455.7 ms a step against 961.5 ms at the first decision's 30 %),
    // and the recorded runs keep it there.
    let runs = 3;
    assert_eq!(
        share(&recorded_decision_in(CONVERGE, "gemma2-2b", runs)),
        0.0
    );
    assert!(trained(CONVERGE, "gemma2-2b", runs));
    for k in 0..=runs {
        let now = decide_in(CONVERGE, "gemma2-2b", k);
        assert_eq!(share(&now), 0.0, "after {k} run(s): {now}");
        if k == 0 {
            let text = now.to_string();
            assert!(
                text.contains("model_type gemma2 measured") && !text.contains("never measured"),
                "{text}"
            );
        }
    }
}
