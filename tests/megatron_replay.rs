//! Megatron-core 0.14.0 on an H100, replayed through the operator's own `explain`
//! (docs/benchmarks/megatron-h200.md, raw files in
//! docs/benchmarks/raw/2026-12-06-h100-megatron/ and, for the runs of the operator's later
//! decisions with and without `--manual-gc`, docs/benchmarks/raw/2026-12-06-h100-sixth/ and
//! docs/benchmarks/raw/2026-12-06-h100-seventh/; the 7B on an H200 in
//! docs/benchmarks/raw/2026-12-06-h200-tenth/):
//! every run's estimate beside what PyTorch's allocator held, and the decisions against the
//! fractions that ran. The first calls ran without `--manual-gc`: they are replayed as jobs
//! with `manualGc: false`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn raw(name: &str) -> PathBuf {
    raw_in("2026-12-06-h100-megatron", name)
}

fn raw_in(folder: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/benchmarks/raw")
        .join(folder)
        .join(name)
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// A GPT the bench built: (layers, width, heads), 50,304 tokens of vocabulary, 4,096 tokens a
/// step, Megatron-core's local layers (no Transformer Engine on the device).
fn shape(case: &str) -> (u32, u32, u32) {
    match case {
        "gpt3b" => (24, 3072, 24),
        "gpt3b32" => (32, 3072, 24),
        "gpt5b" => (24, 4096, 32),
        "gpt7b" => (36, 4096, 32),
        other => panic!("no shape for {other}"),
    }
}

/// What `explain -o json` says of the case's TrainingJob, the offload fixed at `fraction`
/// (`Some(0.0)`: none) or decided (`None`), on the recorded H100 report, as the first calls
/// ran it (without `--manual-gc`).
fn explain(case: &str, fraction: Option<f64>) -> serde_json::Value {
    explain_gc(case, fraction, false)
}

/// [`explain`], the job with `--manual-gc` rendered (`manual_gc`, the default) or not.
fn explain_gc(case: &str, fraction: Option<f64>, manual_gc: bool) -> serde_json::Value {
    explain_on(&raw("megatron/node-report.json"), case, fraction, manual_gc)
}

/// [`explain_gc`] against the node report `node`.
fn explain_on(
    node: &Path,
    case: &str,
    fraction: Option<f64>,
    manual_gc: bool,
) -> serde_json::Value {
    let (layers, hidden, heads) = shape(case);
    let gc = if manual_gc { "" } else { ", manualGc: false" };
    let offload = match fraction {
        None => "{mode: Auto, overlap: Auto}".to_string(),
        Some(0.0) => "{mode: Disabled}".to_string(),
        Some(f) => format!("{{mode: CPUCopy, overlap: Auto, offloadRatio: \"{f}\"}}"),
    };
    let yaml = format!(
        r#"apiVersion: offload.dev/v1alpha1
kind: TrainingJob
metadata: {{name: {case}, namespace: bench, annotations: {{offload.dev/profile: default}}}}
spec:
  replicas: 1
  framework: {{name: Megatron, version: "0.14.0"}}
  megatron: {{tensorParallel: 1, sequenceParallel: true, transformerImpl: Local{gc}}}
  model: {{architecture: GPT, hiddenSize: {hidden}, layers: {layers}, attentionHeads: {heads}, vocabSize: 50304, tokensPerStep: 4096}}
  offload: {offload}
  template:
    spec:
      containers:
        - {{name: train, image: bench, resources: {{limits: {{nvidia.com/gpu: 1}}}}}}
"#
    );
    let dir = tempfile::tempdir().expect("a temporary folder");
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, yaml).expect("the job written");
    let out = Command::new(env!("CARGO_BIN_EXE_offload-operator"))
        .arg("explain")
        .arg("-f")
        .arg(&file)
        .arg("--node-report")
        .arg(format!("h200={}", node.display()))
        .args(["--node-memory", "h200=125Gi", "-o", "json"])
        .output()
        .expect("offload-operator runs");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "explain's JSON: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The GPU estimate (bytes) and whether the operator would run it; for a configuration it
/// refuses, the figure its refusal gives.
fn estimate(e: &serde_json::Value) -> (f64, Option<f64>, bool) {
    if e["resolved"] == false {
        let msg = e["message"].as_str().unwrap_or_default();
        let gib: f64 = msg
            .split("needs about ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a figure in the refusal: {msg}"));
        return (gib * GIB, None, false);
    }
    let m = &e["decision"]["memory"];
    (
        m["gpuBytes"].as_f64().expect("gpuBytes"),
        m["hostBytesPerPod"].as_f64(),
        true,
    )
}

fn fraction_of(e: &serde_json::Value) -> f64 {
    e["env"]
        .as_array()
        .and_then(|env| env.iter().find(|x| x["name"] == "OFFLOAD_RATIO"))
        .and_then(|x| x["value"].as_str())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("OFFLOAD_RATIO in {e}"))
}

/// A run as megatron.jsonl holds it: (case, fraction: 0 for none, PyTorch's allocated peak,
/// the process's peak RSS, trained).
type Run = (String, f64, f64, f64, bool);

/// The third call's runs.
fn third_call() -> Vec<Run> {
    runs(&raw("megatron/megatron.jsonl"))
}

/// The runs of one megatron.jsonl.
fn runs(file: &Path) -> Vec<Run> {
    let text = std::fs::read_to_string(file).expect("the runs");
    text.lines()
        .map(|l| {
            let r: serde_json::Value = serde_json::from_str(l).expect("a run");
            let fraction = match r["fraction"].as_str() {
                Some("decision") => r["args"]
                    .as_str()
                    .and_then(|a| a.split("--optimizer-offload-fraction ").nth(1))
                    .and_then(|f| f.split(' ').next())
                    .map_or(0.0, |f| f.parse().expect("a fraction")),
                Some(f) => f.parse().expect("a fraction"),
                None => panic!("{r}"),
            };
            (
                r["case"].as_str().expect("case").to_string(),
                fraction,
                r["gpu_allocated_peak_bytes"].as_f64().expect("peak"),
                r["host"]["peak_rss_bytes"].as_f64().expect("rss"),
                r["ended"] == "trained",
            )
        })
        .collect()
}

/// Every run of `runs`, replayed as a job with `--manual-gc` rendered or not: the estimate
/// never under what PyTorch's allocator held, a run that ran out refused (past what it held
/// and asked for), and a run that trained within 5 % on the GPU (a partial fraction lands on
/// whole tensors past it: the estimate counts the fraction itself, the most the GPU can keep)
/// and never under on the host.
fn assert_estimated(runs: Vec<Run>, manual_gc: bool) {
    assert_estimated_on(&raw("megatron/node-report.json"), runs, manual_gc);
}

/// [`assert_estimated`] against the node report `node`.
fn assert_estimated_on(node: &Path, runs: Vec<Run>, manual_gc: bool) {
    for (case, f, allocated, rss, trained) in runs {
        let what = format!("{case} at {f}, --manual-gc {manual_gc}");
        let (gpu, host, fits) = estimate(&explain_on(node, &case, Some(f), manual_gc));
        assert!(gpu >= allocated, "{what}: GPU {gpu} < {allocated}");
        if !trained {
            assert!(!fits, "{what} ran out: the operator must not run it");
            assert!(gpu > allocated + GIB, "{what}: {gpu}");
            continue;
        }
        assert!(gpu / allocated - 1.0 <= 0.05, "{what}: {gpu} / {allocated}");
        if let Some(host) = host {
            assert!(host >= rss, "{what}: host {host} < {rss}");
        }
    }
}

#[test]
fn every_run_that_trained_is_never_under_and_within_its_bound() {
    let runs = third_call();
    assert_eq!(runs.len(), 7, "{runs:?}");
    // 59 % of gpt5b ran out (76.15 GiB held, 1 GiB asked): the operator refuses it.
    assert_estimated(runs, false);
}

#[test]
fn what_ran_out_in_the_second_call_does_not_fit_and_what_trained_is_never_under() {
    // call2-log.txt: (case, fraction, allocated (held + asked where it ran out), trained).
    for (case, f, allocated, trained) in [
        ("gpt3b32", 0.0, 75.4 + 0.11, false),
        ("gpt3b32", 0.2, 75.2 + 1.5, false),
        ("gpt5b", 0.5, 75.2 + 1.0, false),
        // 70 % of the 5.3B: 74.3 GiB needed with 1.7 GiB free; the estimate is over it and
        // over the budget, which keeps the allocator's measured reserve free.
        ("gpt5b", 0.7, 72.3 + 2.0, false),
        // These two ran without the hybrid optimizer's first copy (the collector freed it):
        // the estimate counts it, 15-20 % over here.
        ("gpt3b32", 0.27, 73.3, true),
        ("gpt3b32", 0.35, 70.0, true),
    ] {
        let (gpu, _, fits) = estimate(&explain(case, Some(f)));
        assert!(gpu >= allocated * GIB, "{case} at {f}: {gpu}");
        if !trained {
            assert!(!fits, "{case} at {f} ran out: the operator must not run it");
        }
    }
}

#[test]
fn the_decisions_are_the_fastest_of_what_ran_or_past_what_ran_out() {
    // gpt3b: no offload trained fastest (803.9 ms a step; 10 % 932.9 ms, 50 % 1,759.9 ms).
    let d = explain("gpt3b", None);
    assert_eq!(d["decision"]["mode"], "Disabled", "{d}");
    // gpt5b: 59 % (the decision before this model) and 70 % ran out, 85 % trained
    // (4,212.9 ms), 100 % trained (4,759.7 ms): the decision lies past what ran out and no
    // further than the fastest that trained.
    let f = fraction_of(&explain("gpt5b", None));
    assert!(f > 0.70 && f <= 0.85, "gpt5b: {f}");
    // gpt3b32: no offload and 20 % ran out; 27 % and 35 % trained without the first copy,
    // which the model counts: the decision is past what ran out, below half.
    let f = fraction_of(&explain("gpt3b32", None));
    assert!(f > 0.20 && f < 0.5, "gpt3b32: {f}");
}

/// The sixth call's runs (`megatron/`: the operator's decisions of 5.3B and 3.5B without
/// `--manual-gc`, one fraction beside each; `megatron-gc/`: with it), and whether they ran
/// with `--manual-gc`.
fn sixth_call() -> Vec<(Run, bool)> {
    let mut out = Vec::new();
    for (folder, gc) in [("megatron", false), ("megatron-gc", true)] {
        let file = raw_in("2026-12-06-h100-sixth", &format!("{folder}/megatron.jsonl"));
        out.extend(runs(&file).into_iter().map(|r| (r, gc)));
    }
    out
}

#[test]
fn with_manual_gc_every_run_is_estimated_within_five_percent_and_never_under() {
    let runs = sixth_call();
    assert_eq!(runs.len(), 9, "{runs:?}");
    for ((case, f, allocated, rss, trained), gc) in runs {
        let what = format!("{case} at {f}, --manual-gc {gc}");
        assert!(trained, "{what}: every run of this call trained");
        let (gpu, host, _) = estimate(&explain_gc(&case, Some(f), gc));
        assert!(gpu >= allocated, "{what}: GPU {gpu} < {allocated}");
        if let Some(host) = host {
            assert!(host >= rss, "{what}: host {host} < {rss}");
        }
        let over = gpu / allocated - 1.0;
        if gc || case == "gpt5b" {
            // With --manual-gc the first copy is gone and not counted; the 5.3B without it
            // kept the copy, which is counted.
            assert!(over <= 0.05, "{what}: {:.1} % over", over * 100.0);
        } else {
            // Without --manual-gc the 3.5B's collector freed the copy by itself before the
            // peak, as on the first calls: counted, 14-16 % over.
            assert!(
                over > 0.10 && over < 0.20,
                "{what}: {:.1} % over",
                over * 100.0
            );
        }
    }
}

#[test]
fn with_manual_gc_the_decisions_offload_less_and_what_trained_without_it_stays_decided() {
    // Without --manual-gc: 5.3B at 72 % trained (3,456.9 ms a step; 70 % ran out, 80 %
    // trained at 3,700.8 ms): the fastest that runs; 3.5B at 48 % (2,148.8 ms).
    let f = fraction_of(&explain_gc("gpt5b", None, false));
    assert!((f - 0.72).abs() < 1e-9, "gpt5b without --manual-gc: {f}");
    let f = fraction_of(&explain_gc("gpt3b32", None, false));
    assert!((f - 0.48).abs() < 1e-9, "gpt3b32 without --manual-gc: {f}");
    // With it: 3.5B at 27 % trained (1,686.6 ms, 73.3 GiB held, over the 73.75 GiB budget):
    // the decision lies just past it, well below the 48 % without.
    let f = fraction_of(&explain_gc("gpt3b32", None, true));
    assert!(f > 0.27 && f <= 0.32, "gpt3b32 with --manual-gc: {f}");
    // 5.3B: less offload than the 72 % that held the copy; with --manual-gc its 62 % trained
    // and 60 % ran out (the seventh call): the decision is the boundary.
    let f = fraction_of(&explain_gc("gpt5b", None, true));
    assert!(f < 0.72, "gpt5b with --manual-gc: {f}");
    // 3.0B: no offload, with or without.
    assert_eq!(
        explain_gc("gpt3b", None, true)["decision"]["mode"],
        "Disabled"
    );
}

/// The seventh call's runs (`megatron-gc/`, all with `--manual-gc`): the operator's decisions
/// of the 5.3B (62 %) and the 3.5B (30 %), and one fraction below each.
fn seventh_call() -> Vec<Run> {
    runs(&raw_in(
        "2026-12-06-h100-seventh",
        "megatron-gc/megatron.jsonl",
    ))
}

#[test]
fn the_manual_gc_decisions_trained_within_five_percent_and_what_ran_out_is_refused() {
    let runs = seventh_call();
    assert_eq!(runs.len(), 4, "{runs:?}");
    // 60 % of the 5.3B ran out (72.5 GiB held, 2.0 GiB asked, 2.9 GiB reserved but
    // unallocated): the operator refuses it.
    assert_estimated(runs, true);
    // The decisions are the runs that trained: 62 % (3,520.3 ms) beside 60 % that ran out;
    // 30 % (1,889.4 ms) beside 27 % that trained 7.5 % faster (73.3 GiB held, over the
    // budget of 73.7 GiB the estimate's +2.2 % leaves it): within 10 %, not the fastest.
    assert!((fraction_of(&explain_gc("gpt5b", None, true)) - 0.62).abs() < 1e-9);
    assert!((fraction_of(&explain_gc("gpt3b32", None, true)) - 0.30).abs() < 1e-9);
}

#[test]
fn on_the_h200_the_7b_decision_trained_within_five_percent_and_is_the_fastest_that_ran() {
    // The H200's call (docs/benchmarks/raw/2026-12-06-h200-tenth/megatron/, `--manual-gc`
    // rendered): the 7B GPT at the operator's decision, 27 % (133.4 GiB held, 2,824.3 ms a
    // step), and at 35 % and 45 % (3,338.7 and 4,170.8 ms). Each estimate is never under and
    // within 5 %; the decision is the least offload of the three, and the fastest.
    let node = raw_in("2026-12-06-h200-tenth", "megatron/node-report.json");
    let file = raw_in("2026-12-06-h200-tenth", "megatron/megatron.jsonl");
    let runs = runs(&file);
    assert_eq!(runs.len(), 3, "{runs:?}");
    assert!(runs.iter().all(|r| r.4), "every run trained: {runs:?}");
    let decided = fraction_of(&explain_on(&node, "gpt7b", None, true));
    assert!((decided - 0.27).abs() < 1e-9, "{decided}");
    let least = runs.iter().map(|r| r.1).fold(f64::INFINITY, f64::min);
    assert!((least - decided).abs() < 1e-9);
    // Each run's median step, in the order of `runs`.
    let steps: Vec<f64> = std::fs::read_to_string(&file)
        .expect("the runs")
        .lines()
        .map(|l| {
            let r: serde_json::Value = serde_json::from_str(l).expect("a run");
            r["step_ms_median"].as_f64().expect("a step time")
        })
        .collect();
    let decided_step = runs
        .iter()
        .zip(&steps)
        .find(|(r, _)| (r.1 - decided).abs() < 1e-9)
        .map(|(_, &ms)| ms)
        .expect("the decision ran");
    assert!(steps.iter().all(|&ms| decided_step <= ms), "{steps:?}");
    assert_estimated_on(&node, runs, true);
}
