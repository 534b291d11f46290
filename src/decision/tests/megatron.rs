//! Megatron-core: its hybrid device optimizer decided like DeepSpeed's ratio, within what the
//! declared version and layout can take.

use super::*;
use crate::decision::MegatronPlan;
use offload_api::v1alpha1::{MegatronSpec, ModeSetting, OffloadMode};

fn plan(res: &Resolution) -> &MegatronPlan {
    match &res.framework {
        FrameworkPlan::Megatron(p) => p,
        other => panic!("expected a Megatron plan, got {other:?}"),
    }
}

/// A Megatron GPT of `parameters` with the benchmark decoder's width, 4,096 tokens a GPU, over
/// `gpus` pods of one GPU.
fn sized(version: &str, parameters: u64, layers: i64, gpus: u32) -> JobRequest {
    JobRequest {
        model: Some(bench_hints(parameters, 4096, layers)),
        pods: gpus,
        ..megatron(version)
    }
}

/// Eight H200 nodes of one GPU.
fn h200s() -> Vec<NodeInfo> {
    (0..8).map(|i| h200(&format!("h{i}"))).collect()
}

#[test]
fn a_model_that_fits_runs_without_offload_and_the_distributed_optimizer_is_written() {
    // 8B over 8 H200s: bf16 parameters and fp32 main gradients whole on each GPU (48 GB), the
    // optimizer state sharded eight ways.
    let res = resolve(&sized("0.19.0", 8_000_000_000, 32, 8), &h200s()).unwrap();
    assert_eq!(res.mode, OffloadMode::Disabled, "{:?}", res.reasons);
    let p = plan(&res);
    assert!(!p.cpu_offload);
    assert!(p.distributed_optimizer);
    assert!(reason(&res, Field::Framework).contains("distributed optimizer"));
}

#[test]
fn a_model_that_does_not_fit_gets_the_smallest_fraction_that_does() {
    // 12B on one H200: 72 GB of parameters and gradients, 144 GB of optimizer state.
    let res = resolve(&sized("0.19.0", 12_000_000_000, 40, 1), &h200s()).unwrap();
    assert_eq!(res.mode, OffloadMode::CpuCopy, "{:?}", res.reasons);
    let p = plan(&res);
    assert!(p.cpu_offload);
    assert!(p.fraction > 0.0 && p.fraction < 1.0, "{}", p.fraction);
    assert!((p.fraction - res.ratio).abs() < 1e-9);
    let est = res.memory.as_ref().expect("an estimate");
    assert!(est.gpu_bytes <= est.gpu_budget_bytes, "{est:?}");
    // One hundredth less would not fit: the smallest fraction that does.
    let mut smaller = sized("0.19.0", 12_000_000_000, 40, 1);
    smaller.offload.offload_ratio =
        offload_api::v1alpha1::RatioSetting::Fixed(((p.fraction - 0.02) * 100.0).round() / 100.0);
    smaller.offload.mode = ModeSetting::CpuCopy;
    let err = resolve(&smaller, &h200s()).unwrap_err();
    assert_eq!(err.category(), "ConfigurationDoesNotFit", "{err}");
}

#[test]
fn tensor_and_pipeline_parallel_divide_the_model_per_gpu() {
    // The same 12B over 2 GPUs: data-parallel, the optimizer shard halves, still offloaded.
    let dp = resolve(&sized("0.19.0", 12_000_000_000, 40, 2), &h200s()).unwrap();
    // Tensor-parallel 2: each GPU holds half of the parameters too, and it fits.
    let mut tp = sized("0.19.0", 12_000_000_000, 40, 2);
    tp.megatron = MegatronSpec {
        tensor_parallel: Some(2),
        ..Default::default()
    };
    let tp = resolve(&tp, &h200s()).unwrap();
    assert_eq!(tp.mode, OffloadMode::Disabled, "{:?}", tp.reasons);
    // Data-parallel alone still offloads: only the split model fits whole.
    assert_eq!(dp.mode, OffloadMode::CpuCopy, "{:?}", dp.reasons);
    // GPUs that are not a whole number of model-parallel groups are refused.
    let mut odd = sized("0.19.0", 12_000_000_000, 40, 3);
    odd.megatron.tensor_parallel = Some(2);
    let err = resolve(&odd, &h200s()).unwrap_err();
    assert_eq!(err.category(), "FrameworkCannotTakeConfig");
    assert!(err.to_string().contains("tensor 2"), "{err}");
}

#[test]
fn a_version_without_the_hybrid_optimizer_never_gets_offload() {
    // Auto on 0.11: nothing offloaded where it fits …
    let res = resolve(&sized("0.11.0", 8_000_000_000, 32, 8), &h200s()).unwrap();
    assert_eq!(res.mode, OffloadMode::Disabled);
    // … held where it does not, with what would let it run.
    let err = resolve(&sized("0.11.0", 12_000_000_000, 40, 1), &h200s()).unwrap_err();
    assert!(err.to_string().contains("0.12.0"), "{err}");
    // Asked for explicitly: refused with the version that has it.
    let mut job = megatron("0.11.0");
    job.offload.mode = ModeSetting::CpuCopy;
    let err = resolve(&job, &h200s()).unwrap_err();
    assert_eq!(err.category(), "FrameworkCannotTakeConfig");
    assert!(err.to_string().contains("0.12.0"), "{err}");
    // Older than the oldest supported.
    let err = resolve(&megatron("0.8.0"), &h200s()).unwrap_err();
    assert_eq!(err.category(), "UnsupportedFrameworkVersion");
    // The version is required.
    let mut job = megatron("0.19.0");
    job.framework.version = None;
    assert_eq!(
        resolve(&job, &h200s()).unwrap_err().category(),
        "MissingFrameworkVersion"
    );
}

#[test]
fn offload_needs_the_distributed_optimizer() {
    let mut job = megatron("0.19.0");
    job.megatron.distributed_optimizer = Some(false);
    job.offload.mode = ModeSetting::CpuCopy;
    let err = resolve(&job, &h200s()).unwrap_err();
    assert_eq!(err.category(), "FrameworkCannotTakeConfig");
    assert!(err.to_string().contains("distributed optimizer"), "{err}");
    // Without it the whole optimizer state is on every rank: the 8B over 8 GPUs no longer fits
    // and cannot be offloaded.
    let mut job = sized("0.19.0", 8_000_000_000, 32, 8);
    job.megatron.distributed_optimizer = Some(false);
    let err = resolve(&job, &h200s()).unwrap_err();
    assert!(err.to_string().contains("distributed optimizer"), "{err}");
}

#[test]
fn on_a_coherent_node_the_hybrid_optimizer_copies_over_c2c() {
    let mut job = megatron("0.19.0");
    job.offload.mode = ModeSetting::UnifiedMemory;
    let res = resolve(&job, &[gh200("gh")]).unwrap();
    assert_eq!(res.mode, OffloadMode::UnifiedMemory);
    assert!(plan(&res).cpu_offload);
    assert!(reason(&res, Field::Framework).contains("NVLink-C2C"));
    // Overlap verified on the node: the copies overlap the CPU step.
    assert_eq!(plan(&res).overlap, res.overlap);
}

#[test]
fn without_sequence_parallelism_a_third_of_the_activations_stays_whole_on_each_rank() {
    // 12B tensor-parallel over two GPUs: attention's and the MLP's activations split in two;
    // the layer norms' and dropouts' (10 of a layer's 34 units) only with sequence parallelism.
    let job = |tokens: i64, sequence: Option<bool>| JobRequest {
        model: Some(bench_hints(12_000_000_000, tokens, 40)),
        pods: 2,
        megatron: MegatronSpec {
            tensor_parallel: Some(2),
            sequence_parallel: sequence,
            ..Default::default()
        },
        ..megatron("0.14.0")
    };
    let activations = |r: &Resolution| {
        let m = r.memory.as_ref().expect("an estimate");
        (m.gpu_bytes - m.gpu_structural_bytes) as f64
    };
    let off = resolve(&job(4096, None), &h200s()).unwrap();
    let on = resolve(&job(4096, Some(true)), &h200s()).unwrap();
    let ratio = activations(&off) / activations(&on);
    assert!(
        (ratio - 22.0 / 17.0).abs() < 1e-3,
        "(10 + 24/2) / 34 against 1/2 of the activations: {ratio}"
    );
    let shown = |sequence| {
        crate::decision::model::memory::Sharding::Megatron {
            tensor: 2,
            model_parallel: 2,
            distributed: true,
            sequence,
            unfused_attention: false,
            first_copy_freed: true,
        }
        .to_string()
    };
    assert_eq!(
        shown(false),
        "Megatron-core (tensor 2 × pipeline 1, distributed optimizer)"
    );
    assert_eq!(
        shown(true),
        "Megatron-core (tensor 2 × pipeline 1, sequence parallel, distributed optimizer)"
    );
    // A sequence so long that only sequence parallelism fits it: the refusal says so.
    let tokens = (16..=64)
        .map(|k| k * 1024)
        .find(|t| resolve(&job(*t, None), &h200s()).is_err())
        .expect("a sequence too long without sequence parallelism");
    assert!(
        resolve(&job(tokens, Some(true)), &h200s()).is_ok(),
        "{tokens} tokens fit with sequence parallelism"
    );
    let err = resolve(&job(tokens, None), &h200s())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("sequence parallelism (--sequence-parallel"),
        "{err}"
    );
}

#[test]
fn manual_gc_frees_the_first_copy_and_a_smaller_fraction_fits() {
    // 12B on one H200 with offload: with --manual-gc (the default) the hybrid optimizer's first
    // copy (4 bytes a kept parameter on the GPU, 4 an offloaded one on the host) is counted
    // freed; without it, held to the peak, so the same fraction needs more and the decision
    // offloads more.
    let job = |manual_gc: Option<bool>, ratio: Option<f64>| {
        let mut j = sized("0.14.0", 12_000_000_000, 40, 1);
        j.megatron.manual_gc = manual_gc;
        if let Some(r) = ratio {
            j.offload.mode = ModeSetting::CpuCopy;
            j.offload.offload_ratio = offload_api::v1alpha1::RatioSetting::Fixed(r);
        }
        j
    };
    let on = resolve(&job(None, Some(0.9)), &h200s()).unwrap();
    let off = resolve(&job(Some(false), Some(0.9)), &h200s()).unwrap();
    assert!(plan(&on).manual_gc && !plan(&off).manual_gc);
    let (m_on, m_off) = (on.memory.as_ref().unwrap(), off.memory.as_ref().unwrap());
    let kept = 0.1 * 12e9;
    let gpu = (m_off.gpu_bytes - m_on.gpu_bytes) as f64;
    assert!(
        (gpu - 4.0 * kept).abs() < 1e6,
        "the first copy of the kept 10 %: {gpu}"
    );
    assert!(m_off.host_bytes_per_pod > m_on.host_bytes_per_pod);
    assert!(reason(&on, Field::Framework).contains("--manual-gc --manual-gc-interval 100"));
    let fraction = |r: &Resolution| plan(r).fraction;
    let auto_on = resolve(&job(None, None), &h200s()).unwrap();
    let auto_off = resolve(&job(Some(false), None), &h200s()).unwrap();
    assert!(
        fraction(&auto_on) < fraction(&auto_off),
        "{} vs {}",
        fraction(&auto_on),
        fraction(&auto_off)
    );
}

/// Layouts Megatron-core refuses at start-up are refused here, saying what to change: tensor
/// parallelism must divide the attention and key/value heads, pipeline parallelism the layers.
#[test]
fn layouts_megatron_core_refuses_are_refused_with_what_to_change() {
    let layout = |tensor: u32, pipeline: u32, heads: i64, kv: i64, layers: i64| {
        let mut job = sized("0.14.0", 8_000_000_000, layers, tensor * pipeline);
        job.megatron = MegatronSpec {
            tensor_parallel: Some(tensor),
            pipeline_parallel: Some(pipeline),
            ..MegatronSpec::default()
        };
        if let Some(m) = job.model.as_mut() {
            m.attention_heads = Some(heads);
            m.key_value_heads = Some(kv);
        }
        job
    };
    let nodes: Vec<NodeInfo> = (0..64).map(|i| h200(&format!("h{i}"))).collect();
    for (job, says) in [
        (
            layout(5, 1, 48, 48, 44),
            "tensor parallel 5 does not divide the model's 48 attention heads",
        ),
        (
            layout(16, 1, 64, 8, 44),
            "tensor parallel 16 does not divide the model's 8 key/value heads",
        ),
        (
            layout(1, 64, 48, 8, 44),
            "pipeline parallel 64 does not divide the model's 44 layers",
        ),
    ] {
        let err = resolve(&job, &nodes).unwrap_err();
        assert_eq!(err.category(), "FrameworkCannotTakeConfig", "{err}");
        assert!(err.to_string().contains(says), "{err}");
    }
    // A layout that divides them all is decided.
    resolve(&layout(8, 4, 64, 8, 44), &nodes).unwrap();
}

#[test]
fn what_megatron_cores_arguments_assert_for_the_hybrid_optimizer_is_refused_with_what_to_change() {
    use offload_api::v1alpha1::{Fp8Recipe, MegatronOptimizer};
    // Each setting Megatron-core's arguments.py refuses beside --optimizer-cpu-offload, with
    // the change that lets it run.
    type Case = (fn(&mut MegatronSpec), &'static str, &'static str);
    let cases: [Case; 4] = [
        (
            |m| m.optimizer = Some(MegatronOptimizer::Sgd),
            "takes --optimizer adam alone, and the job's optimizer is Sgd",
            "spec.megatron.optimizer: Adam",
        ),
        (
            |m| m.optimizer = Some(MegatronOptimizer::Muon),
            "the job's optimizer is Muon",
            "--optimizer adam",
        ),
        (
            |m| m.megatron_fsdp = Some(true),
            "does not run under Megatron-FSDP",
            "spec.megatron.megatronFsdp: false",
        ),
        (
            |m| {
                m.fp8_param_gather = Some(true);
                m.fp8_recipe = Some(Fp8Recipe::Mxfp8);
            },
            "--fp8-param-gather only with --fp8-recipe delayed, and the job's recipe is Mxfp8",
            "spec.megatron.fp8Recipe: Delayed",
        ),
    ];
    for (edit, problem, change) in cases {
        // Asked for explicitly: refused before anything else is decided.
        let mut job = megatron("0.19.0");
        edit(&mut job.megatron);
        job.offload.mode = ModeSetting::CpuCopy;
        let err = resolve(&job, &h200s()).unwrap_err();
        assert_eq!(err.category(), "FrameworkCannotTakeConfig", "{err}");
        let said = err.to_string();
        assert!(said.contains(problem) && said.contains(change), "{said}");
        // Decided: a job that fits runs without offload, flags without the hybrid optimizer …
        let mut fits = sized("0.19.0", 8_000_000_000, 32, 8);
        edit(&mut fits.megatron);
        let res = resolve(&fits, &h200s()).unwrap();
        assert_eq!(res.mode, OffloadMode::Disabled);
        assert!(!plan(&res).cpu_offload);
        // … one that needs offload is held, naming the change that would let it fit.
        let mut needs = sized("0.19.0", 12_000_000_000, 40, 1);
        edit(&mut needs.megatron);
        let err = resolve(&needs, &h200s()).unwrap_err();
        assert_eq!(err.category(), "InsufficientMemory", "{err}");
        let said = err.to_string();
        assert!(
            said.contains(change) && said.contains("with that it would fit as"),
            "{said}"
        );
    }
    // Adam, the delayed recipe with FP8 gathers, and no Megatron-FSDP: offloaded as ever.
    let mut job = sized("0.19.0", 12_000_000_000, 40, 1);
    job.megatron.optimizer = Some(MegatronOptimizer::Adam);
    job.megatron.fp8_param_gather = Some(true);
    job.megatron.fp8_recipe = Some(Fp8Recipe::Delayed);
    job.megatron.megatron_fsdp = Some(false);
    let res = resolve(&job, &h200s()).unwrap();
    assert_eq!(res.mode, OffloadMode::CpuCopy, "{:?}", res.reasons);
    assert!(plan(&res).cpu_offload);
}
