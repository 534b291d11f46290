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
use offload_operator::decision::model::memory::ClassMemory;
use offload_operator::decision::model::memory::JobMemory;
use offload_operator::decision::model::memory::Placement;
use offload_operator::decision::model::memory::Sharding;
use offload_operator::decision::model::model_config;
use offload_operator::decision::model::shape::Block;
use offload_operator::decision::model::shape::ModelShape;

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
        standing: offload_operator::decision::model::shape::TypeStanding::Counted,
        open: None,
        quirks: offload_operator::decision::model::shape::Quirks::default(),
        tower: None,
        window: None,
        source: None,
    })
}

/// The sizer's trace of `name` at one phase's micro-batch, where `traces` holds one
/// (`NAME-MICROxSEQ.json`, as `hack/sizer/recorded.py --traces` writes them).
fn trace_of(
    traces: Option<&Path>,
    name: &str,
    phase: &Value,
) -> Option<std::sync::Arc<offload_operator::decision::model::memory::Traced>> {
    let micro = phase.get("micro").and_then(Value::as_u64)?;
    let seq = phase.get("seq").and_then(Value::as_u64)?;
    let text = std::fs::read_to_string(traces?.join(format!("{name}-{micro}x{seq}.json"))).ok()?;
    let trace = offload_api::trace::ModelTrace::parse(&text).ok()?;
    Some(std::sync::Arc::new(
        offload_operator::decision::model::memory::Traced::new(std::sync::Arc::new(trace)),
    ))
}

/// The job a bench record ran: one GPU, ZeRO-3, bf16, `tokens` a micro-batch, DeepSpeed's
/// sub-groups of `group` where the record set them.
fn bench_job(shape: ModelShape, tokens: f64, group: Option<f64>) -> JobMemory {
    JobMemory {
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
        reserved_trials: Default::default(),
        traced: None,
        untraced: None,
        counted_parameters: None,
        logits_room: true,
        bf16_states: false,
    }
}

/// The traced model's GPU estimate for the same job, with its error against the measured peak.
fn traced_column(
    job: &JobMemory,
    t: std::sync::Arc<offload_operator::decision::model::memory::Traced>,
    placement: Placement,
    class: &ClassMemory,
    measured: &Measured,
) -> String {
    let job = JobMemory {
        parameters: t.parameters(),
        traced: Some(t),
        ..job.clone()
    };
    let est = job.estimate_checked(placement, class).0;
    format!(
        "{}{}",
        gib(est.gpu),
        if measured.ok && measured.gpu > 0.0 {
            format!(" ({:+.1}%)", (est.gpu / measured.gpu - 1.0) * 100.0)
        } else {
            String::new()
        }
    )
}

/// One row per phase of every run in `runs`, models read from `models` (`NAME.json`), with the
/// traced model's estimate beside the counted one's where `traces` holds the phase's trace.
pub fn run(
    runs: &[PathBuf],
    models: &Path,
    traces: Option<&Path>,
    node: &Node,
) -> Result<(), BenchError> {
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
        "| model | tokens | configuration | estimate GPU / host (GiB) | DeepSpeed's estimator GPU / host | measured GPU allocated / reserved, host (GiB) | error GPU / host | step (median) | allocator retries | model says | ran | traced estimate GPU (error) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for path in runs {
        let text = std::fs::read_to_string(path)?;
        for line in text.lines() {
            let rec: Value = serde_json::from_str(line)?;
            let Some((name, shape)) = model_of(&rec, models)? else {
                continue;
            };
            let zero = rec.get("config").cloned().unwrap_or(Value::Null);
            let (placement, group) = placement_of(&zero);
            for phase in &phases_of(&rec) {
                let tokens = phase.get("tokens").and_then(Value::as_f64).unwrap_or(0.0);
                let job = bench_job(shape, tokens, group);
                let (est, fit) = job.estimate_checked(placement, &class);
                let measured = Measured::of(&rec, phase);
                let traced = trace_of(traces, &name, phase)
                    .map(|t| traced_column(&job, t, placement, &class, &measured));
                let configuration = format!(
                    "{placement}{}{}",
                    est.offloaded_share
                        .map(|s| format!(" (share on the host {:.1}%)", s * 100.0))
                        .unwrap_or_default(),
                    group
                        .map(|g| format!(", sub-groups {g:.0}"))
                        .unwrap_or_default()
                );
                let says = match (fit.gpu, fit.host) {
                    (true, true) => "fits",
                    (false, true) => "GPU too small",
                    (true, false) => "host too small",
                    (false, false) => "GPU and host too small",
                };
                println!(
                    "| {name} | {tokens} | {configuration} | {} / {} | {} | {says} | {} | {} |",
                    gib(est.gpu),
                    gib(est.host_per_pod),
                    measured.columns(est.gpu, est.host_per_pod),
                    measured.ran(),
                    traced.unwrap_or_else(|| "–".into())
                );
            }
        }
    }
    Ok(())
}

/// The model a record ran: a Hugging Face `config.json` under `models`, or a GPT decoder size
/// (`None`: a record of neither).
fn model_of(rec: &Value, models: &Path) -> Result<Option<(String, ModelShape)>, BenchError> {
    match (
        rec.get("model").and_then(Value::as_str),
        rec.get("size").and_then(Value::as_str),
    ) {
        (Some(model), _) => {
            let name = model.trim_end_matches(".json").to_string();
            let shape = model_config::parse(&std::fs::read_to_string(models.join(model))?, &name)
                .map_err(|e| BenchError::Command {
                what: format!("reading {model}"),
                detail: e.to_string(),
            })?;
            Ok(Some((name, shape)))
        }
        (None, Some(size)) => Ok(gpt_decoder(size).map(|shape| (format!("GPT {size}"), shape))),
        _ => Ok(None),
    }
}

/// A record's phases. The GPT decoder's runs (`hack/gpu/ds_step.py`) had one phase of 4 × 512
/// tokens; a run that failed at its first step: its one phase from its name.
fn phases_of(rec: &Value) -> Vec<Value> {
    let mut phases: Vec<Value> = rec
        .get("phases")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if phases.is_empty() {
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
    phases
}

/// What one phase of a run measured.
struct Measured<'a> {
    ok: bool,
    gpu: f64,
    reserved: f64,
    host: f64,
    ds_gpu: Option<f64>,
    ds_cpu: Option<f64>,
    median_ms: Option<f64>,
    retries: Option<u64>,
    error: Option<&'a str>,
}

impl<'a> Measured<'a> {
    fn of(rec: &'a Value, phase: &'a Value) -> Self {
        let f = |k: &str| phase.get(k).and_then(Value::as_f64);
        let ds = rec.get("deepspeedEstimate");
        Self {
            ok: rec.get("ok").and_then(Value::as_bool).unwrap_or(false),
            gpu: f("peakGpuBytes").unwrap_or(0.0),
            reserved: f("peakGpuReservedBytes").unwrap_or(0.0),
            host: rec
                .get("peakHostRssBytes")
                .and_then(Value::as_f64)
                .unwrap_or(0.0),
            ds_gpu: ds.and_then(|d| d.get("gpuBytes")).and_then(Value::as_f64),
            ds_cpu: ds.and_then(|d| d.get("cpuBytes")).and_then(Value::as_f64),
            median_ms: f("medianMs"),
            retries: phase.get("allocRetries").and_then(Value::as_u64),
            error: rec.get("error").and_then(Value::as_str),
        }
    }

    /// DeepSpeed's estimator, the measured figures, the estimate's error, the step and the
    /// allocator's retries, as table columns.
    fn columns(&self, est_gpu: f64, est_host: f64) -> String {
        let pct = |e: f64, m: f64| {
            if m > 0.0 {
                format!("{:+.1}%", (e / m - 1.0) * 100.0)
            } else {
                "–".into()
            }
        };
        let dash = || "–".to_string();
        format!(
            "{} / {} | {} / {}, {} | {} / {} | {} | {}",
            self.ds_gpu.map_or_else(dash, gib),
            self.ds_cpu.map_or_else(dash, gib),
            if self.ok {
                gib(self.gpu)
            } else {
                format!("{} at the failure", gib(self.gpu))
            },
            gib(self.reserved),
            if self.ok { gib(self.host) } else { dash() },
            if self.ok {
                pct(est_gpu, self.gpu)
            } else {
                dash()
            },
            if self.ok {
                pct(est_host, self.host)
            } else {
                dash()
            },
            self.median_ms.map_or_else(dash, |m| format!("{m:.0} ms")),
            self.retries.map_or_else(dash, |r| r.to_string()),
        )
    }

    /// How the run ended.
    fn ran(&self) -> &'static str {
        match (self.ok, self.error) {
            (true, _) => "trained",
            (false, Some(e)) if e.contains("CUDA out of memory") => "**CUDA out of memory**",
            (false, _) => "failed",
        }
    }
}
