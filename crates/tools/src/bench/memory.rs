//! `offload-bench memory`: the memory model beside what training measured. Reads the runs the
//! GPU harness recorded (`hack/gpu/hf-bench.sh`: one JSON object per process, with the model's
//! `config.json` name, the DeepSpeed `zero_optimization` it ran and each phase's peaks), works
//! out the operator's estimate of each with the library's own model (the same code the
//! controller, the webhook and `explain` decide with), and prints one Markdown row per phase:
//! estimate, DeepSpeed's estimator, the measured peaks, the error, the step time, and whether
//! the model's answer ("fits" or not on the node) agrees with what happened.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::error::BenchError;
use offload_operator::decision::memory::{ClassMemory, JobMemory, Placement, Sharding};
use offload_operator::decision::model_config;
use offload_operator::decision::shape::{Block, ModelShape};

/// The node the runs were made on.
pub struct Node {
    /// GPU memory (NVML's total).
    pub gpu_bytes: u64,
    /// Host memory a pod can have.
    pub host_bytes: u64,
}

fn gib(b: f64) -> String {
    format!("{:.1}", b / f64::from(1u32 << 30))
}

fn placement_of(zero: &Value) -> (Placement, Option<f64>) {
    let opt = zero.get("offload_optimizer");
    let on_cpu = opt
        .and_then(|o| o.get("device"))
        .and_then(Value::as_str)
        .is_some_and(|d| d == "cpu");
    let params = zero
        .pointer("/offload_param/device")
        .and_then(Value::as_str)
        .is_some_and(|d| d == "cpu");
    let ratio = opt.and_then(|o| o.get("ratio")).and_then(Value::as_f64);
    let group = zero.get("sub_group_size").and_then(Value::as_f64);
    let placement = match (on_cpu, params, ratio) {
        (false, _, _) => Placement::NoOffload,
        (true, true, _) => Placement::OptimizerAndParams,
        (true, false, Some(r)) if r < 1.0 => Placement::PartialOptimizer(r),
        (true, false, _) => Placement::Optimizer,
    };
    (placement, group)
}

/// The bench's own GPT decoder (`hack/gpu/ds_step.py`): LayerNorm, GELU MLP of 4 × the
/// width, 128-wide heads, vocabulary 32000.
fn gpt_decoder(size: &str) -> Option<ModelShape> {
    let (hidden, layers) = match size {
        "small" => (1024.0, 20.0),
        "large" => (2048.0, 40.0),
        "1b" => (2048.0, 20.0),
        "4b" => (3072.0, 32.0),
        "6b" => (4096.0, 32.0),
        "9b" => (4096.0, 44.0),
        "13b" => (5120.0, 40.0),
        _ => return None,
    };
    Some(ModelShape {
        block: Block::Plain,
        hidden,
        layers,
        intermediate: 4.0 * hidden,
        heads: hidden / 128.0,
        kv_heads: hidden / 128.0,
        head_dim: 128.0,
        vocab: 32000.0,
        tied: false,
        attention_bias: true,
        positions: 0.0,
        rotary: false,
        experts: None,
        known: true,
        standing: offload_operator::decision::shape::TypeStanding::Counted,
        open: None,
    })
}

/// One row per phase of every run in `runs`, models read from `models` (`NAME.json`).
pub fn run(runs: &[PathBuf], models: &Path, node: &Node) -> Result<(), BenchError> {
    let class = ClassMemory {
        gpu_bytes: node.gpu_bytes,
        gpu_node: "the GPU".into(),
        host_per_pod: Some(node.host_bytes),
        host_node: "the node".into(),
        class: None,
    };
    println!(
        "GPU budget: {} GiB of {} GiB; host: {} GiB\n",
        gib(class.gpu_budget()),
        gib(node.gpu_bytes as f64),
        gib(node.host_bytes as f64)
    );
    println!(
        "| model | tokens | configuration | estimate GPU / host (GiB) | DeepSpeed's estimator GPU / host | measured GPU allocated / reserved, host (GiB) | error GPU / host | step (median) | allocator retries | model says | ran |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for path in runs {
        let text = std::fs::read_to_string(path)?;
        for line in text.lines() {
            let rec: Value = serde_json::from_str(line)?;
            let (name, shape) = match (
                rec.get("model").and_then(Value::as_str),
                rec.get("size").and_then(Value::as_str),
            ) {
                (Some(model), _) => {
                    let name = model.trim_end_matches(".json").to_string();
                    let shape =
                        model_config::parse(&std::fs::read_to_string(models.join(model))?, &name)
                            .map_err(|e| BenchError::Command {
                            what: format!("reading {model}"),
                            detail: e.to_string(),
                        })?;
                    (name, shape)
                }
                (None, Some(size)) => match gpt_decoder(size) {
                    Some(shape) => (format!("GPT {size}"), shape),
                    None => continue,
                },
                _ => continue,
            };
            let zero = rec.get("config").cloned().unwrap_or(Value::Null);
            let (placement, group) = placement_of(&zero);
            let ok = rec.get("ok").and_then(Value::as_bool).unwrap_or(false);
            let mut phases: Vec<Value> = rec
                .get("phases")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if phases.is_empty() {
                // The GPT decoder's runs (`hack/gpu/ds_step.py`) had one phase of 4 × 512
                // tokens; a run that failed at its first step: its one phase from its name.
                let from_name = rec
                    .get("run")
                    .and_then(Value::as_str)
                    .and_then(|r| r.split(':').nth(2))
                    .and_then(|p| {
                        let (m, s) = p.split(',').next()?.split_once('x')?;
                        Some(m.parse::<f64>().ok()? * s.parse::<f64>().ok()?)
                    });
                let tokens = if rec.get("size").is_some() {
                    2048.0
                } else {
                    from_name.unwrap_or(2048.0)
                };
                phases.push(serde_json::json!({"tokens": tokens, "medianMs": rec.get("medianMs"),
                    "peakGpuBytes": rec.get("peakGpuBytes"), "peakGpuReservedBytes": rec.get("peakGpuReservedBytes")}));
            }
            for phase in &phases {
                let tokens = phase.get("tokens").and_then(Value::as_f64).unwrap_or(0.0);
                let job = JobMemory {
                    parameters: shape.parameters(),
                    shape,
                    tokens: Some(tokens),
                    checkpointing: false,
                    ranks: 1,
                    gpus_per_pod: 1,
                    pods: 1,
                    sharding: Sharding::Zero(3),
                    value_bytes: 2.0,
                    pod_memory_limit: None,
                    pod_memory_limit_source: None,
                    sub_group_size: group,
                    corrections: Default::default(),
                    shape_key: String::new(),
                    learned: Default::default(),
                    inferred: false,
                    ran: Default::default(),
                };
                let (est, fit) = job.estimate_checked(placement, &class);
                let f = |k: &str| phase.get(k).and_then(Value::as_f64);
                let gpu = f("peakGpuBytes").unwrap_or(0.0);
                let reserved = f("peakGpuReservedBytes").unwrap_or(0.0);
                let host = rec
                    .get("peakHostRssBytes")
                    .and_then(Value::as_f64)
                    .unwrap_or(0.0);
                let ds = rec.get("deepspeedEstimate");
                let ds_gpu = ds.and_then(|d| d.get("gpuBytes")).and_then(Value::as_f64);
                let ds_cpu = ds.and_then(|d| d.get("cpuBytes")).and_then(Value::as_f64);
                let share = est
                    .offloaded_share
                    .map(|s| format!(" (share on the host {:.1}%)", s * 100.0))
                    .unwrap_or_default();
                let pct = |e: f64, m: f64| {
                    if m > 0.0 {
                        format!("{:+.1}%", (e / m - 1.0) * 100.0)
                    } else {
                        "–".into()
                    }
                };
                println!(
                    "| {name} | {tokens} | {placement}{share}{} | {} / {} | {} / {} | {} / {}, {} | {} / {} | {} | {} | {} | {} |",
                    group
                        .map(|g| format!(", sub-groups {g:.0}"))
                        .unwrap_or_default(),
                    gib(est.gpu),
                    gib(est.host_per_pod),
                    ds_gpu.map_or("–".into(), gib),
                    ds_cpu.map_or("–".into(), gib),
                    if ok {
                        gib(gpu)
                    } else {
                        format!("{} at the failure", gib(gpu))
                    },
                    gib(reserved),
                    if ok { gib(host) } else { "–".into() },
                    if ok { pct(est.gpu, gpu) } else { "–".into() },
                    if ok {
                        pct(est.host_per_pod, host)
                    } else {
                        "–".into()
                    },
                    phase
                        .get("medianMs")
                        .and_then(Value::as_f64)
                        .map_or("–".into(), |m| format!("{m:.0} ms")),
                    phase
                        .get("allocRetries")
                        .and_then(Value::as_u64)
                        .map_or("–".into(), |r| r.to_string()),
                    match (fit.gpu, fit.host) {
                        (true, true) => "fits",
                        (false, true) => "GPU too small",
                        (true, false) => "host too small",
                        (false, false) => "GPU and host too small",
                    },
                    if ok {
                        "trained"
                    } else {
                        rec.get("error")
                            .and_then(Value::as_str)
                            .map_or("failed", |e| {
                                if e.contains("CUDA out of memory") {
                                    "**CUDA out of memory**"
                                } else {
                                    "failed"
                                }
                            })
                    }
                );
            }
        }
    }
    Ok(())
}
