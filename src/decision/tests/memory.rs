//! The decision with the memory model: no offload where the job fits, the fastest offload that
//! fits where it does not, never a configuration that cannot run.

use super::*;
use crate::decision::memory::Placement;
use offload_api::api::{ModeSetting, NodeClass, OffloadMode, RatioSetting};

/// 125 GiB, the lent H200 host.
const H200_HOST: u64 = 125 << 30;

fn with_model(mut job: JobRequest, parameters: u64, layers: i64) -> JobRequest {
    job.model = Some(bench_hints(parameters, 2048, layers));
    job
}

fn placement(res: &Resolution) -> Option<Placement> {
    res.memory.as_ref().map(|m| m.placement)
}

#[test]
fn a_job_that_fits_runs_without_offload_and_says_so_with_the_figures() {
    for (p, layers) in [(1_138_241_536, 20), (3_821_770_752, 32)] {
        let job = with_model(deepspeed("0.19.8"), p, layers);
        let res = resolve(&job, &[with_host(h200("h"), H200_HOST)]).unwrap();
        assert_eq!(res.mode, OffloadMode::Disabled, "{}", res.summary());
        assert_eq!(placement(&res), Some(Placement::NoOffload));
        let why = reason(&res, Field::Mode);
        assert!(
            why.contains("needs about")
                && why.contains("GiB per GPU")
                && why.contains("fits without offload"),
            "{why}"
        );
        // Nothing offloaded: the DeepSpeed plan writes device none.
        let plan = ds_plan(&res);
        assert!(!plan.offload_params && !plan.write_ratio);
        // The only class fits: any GPU node will do.
        assert_eq!(res.node_class, None);
    }
}

#[test]
fn a_job_that_does_not_fit_gets_the_smallest_offload_that_fits() {
    let job = with_model(deepspeed("0.19.8"), 9_122_865_152, 44);
    let res = resolve(&job, &[with_host(h200("h"), H200_HOST)]).unwrap();
    assert_eq!(res.mode, OffloadMode::CpuCopy);
    assert!(matches!(placement(&res), Some(Placement::PartialOptimizer(r)) if r == res.ratio));
    let m = res.memory.as_ref().unwrap();
    assert!(m.gpu_bytes <= m.gpu_budget_bytes);
    assert!(m.host_bytes_per_pod <= m.host_budget_bytes.unwrap());
    assert!(reason(&res, Field::Mode).contains("does not fit in GPU memory without offload"));
}

#[test]
fn past_the_partial_share_that_pays_offloading_parameters_too_is_faster() {
    // 20B on one H200 with 1 TiB of host memory: the share the GPU cannot hold is large, so
    // optimizer state and parameters go to the host together (measured faster above 45%).
    let job = with_model(deepspeed("0.19.8"), 20_000_000_000, 96);
    let res = resolve(&job, &[with_host(h200("h"), 1 << 40)]).unwrap();
    assert_eq!(
        placement(&res),
        Some(Placement::OptimizerAndParams),
        "{}",
        res.summary()
    );
    assert_eq!(res.ratio, 1.0);
    assert!(ds_plan(&res).offload_params);
    // The same job refusing offload_param gets the partial share instead.
    let mut no_params = job.clone();
    no_params.deepspeed.offload_params = Some(false);
    let res = resolve(&no_params, &[with_host(h200("h"), 1 << 40)]).unwrap();
    assert!(matches!(placement(&res), Some(Placement::PartialOptimizer(r)) if r > 0.45));
    assert!(!ds_plan(&res).offload_params);
}

#[test]
fn nothing_that_cannot_run_is_written_and_the_hold_says_what_would_fit() {
    // 13B on one H200 with 125 GiB of host memory: no placement fits GPU and host.
    let job = with_model(deepspeed("0.19.8"), 12_910_000_000, 40);
    let err = resolve(&job, &[with_host(h200("h"), H200_HOST)]).unwrap_err();
    assert_eq!(err.category(), "InsufficientMemory");
    assert!(err.depends_on_cluster());
    let msg = err.to_string();
    assert!(msg.contains("host memory too small"), "{msg}");
    assert!(
        msg.contains("with 2 GPUs in all"),
        "more GPUs would shard it: {msg}"
    );

    // ZeRO-2 keeps the 16-bit parameters whole on each GPU and builds the whole model on the
    // host: 9.1B does not fit one H200 that way, and the advice names ZeRO-3, where it does.
    let mut z2 = with_model(deepspeed("0.19.8"), 9_122_865_152, 44);
    z2.deepspeed.stage_in_spec = Some(2);
    let msg = resolve(&z2, &[with_host(h200("h"), H200_HOST)])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("ZeRO stage 3 instead of 2"), "{msg}");
}

#[test]
fn an_explicit_configuration_that_cannot_run_is_refused_with_the_figures() {
    let big = with_model(deepspeed("0.19.8"), 9_122_865_152, 44);
    let mut disabled = big.clone();
    disabled.offload.mode = ModeSetting::Disabled;
    let err = resolve(&disabled, &[with_host(h200("h"), H200_HOST)]).unwrap_err();
    assert_eq!(err.category(), "ConfigurationDoesNotFit");
    let msg = err.to_string();
    assert!(
        msg.starts_with("mode Disabled (from the job) asks for no offload, which cannot run"),
        "{msg}"
    );
    assert!(msg.contains("GPU memory too small"), "{msg}");

    let mut small_ratio = big.clone();
    small_ratio.offload.mode = ModeSetting::CpuCopy;
    small_ratio.offload.offload_ratio = RatioSetting::Fixed(0.05);
    let msg = resolve(&small_ratio, &[with_host(h200("h"), H200_HOST)])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("offloadRatio 0.05 (from the job)"), "{msg}");

    // A ratio that fits is obeyed.
    let mut ok_ratio = big;
    ok_ratio.offload.offload_ratio = RatioSetting::Fixed(0.4);
    let res = resolve(&ok_ratio, &[with_host(h200("h"), H200_HOST)]).unwrap();
    assert_eq!(res.ratio, 0.4);
    assert!(reason(&res, Field::OffloadRatio).starts_with("0.4: set by the job"));
}

#[test]
fn a_class_where_the_job_fits_without_offload_comes_before_one_where_it_needs_offload() {
    // 6.7B fits one H200 (141 GB) without offload but not one GH200 (102 GB).
    let job = with_model(deepspeed("0.19.8"), 6_704_000_000, 32);
    let nodes = [gh200("gh-a"), h200("h-a")];
    let res = resolve(&job, &nodes).unwrap();
    assert_eq!(res.mode, OffloadMode::Disabled, "{}", res.summary());
    assert_eq!(
        res.node_class,
        Some(NodeClass::Discrete),
        "pinned where it fits"
    );
    // Where no class fits it without offload, the profile's order decides: Coherent first,
    // unified memory.
    let bigger = with_model(deepspeed("0.19.8"), 9_122_865_152, 44);
    let res = resolve(&bigger, &nodes).unwrap();
    assert_eq!(res.mode, OffloadMode::UnifiedMemory, "{}", res.summary());
    assert_eq!(res.node_class, Some(NodeClass::Coherent));
}

#[test]
fn more_ranks_shard_the_state_so_a_larger_model_fits() {
    let mut job = with_model(deepspeed("0.19.8"), 12_910_000_000, 40);
    job.pods = 2;
    let nodes = [
        with_host(h200("h-a"), H200_HOST),
        with_host(h200("h-b"), H200_HOST),
    ];
    let res = resolve(&job, &nodes).unwrap();
    assert_ne!(placement(&res), None);
    assert_eq!(
        res.memory
            .as_ref()
            .map(|m| m.gpu_bytes <= m.gpu_budget_bytes),
        Some(true)
    );
}

#[test]
fn the_pod_memory_limit_bounds_the_host_side() {
    let mut job = with_model(deepspeed("0.19.8"), 9_122_865_152, 44);
    job.pod_memory_limit = Some(32 << 30);
    let err = resolve(&job, &[with_host(h200("h"), H200_HOST)]).unwrap_err();
    assert_eq!(err.category(), "InsufficientMemory");
    assert!(err.to_string().contains("pod limit 32.0 GiB"), "{err}");
    assert!(
        err.to_string().contains("a pod memory limit above"),
        "{err}"
    );
}

#[test]
fn hints_that_cannot_be_true_are_refused() {
    let mut job = deepspeed("0.19.8");
    for (edit, expect) in [
        (
            (|h: &mut offload_api::api::ModelHints| h.tokens_per_step = Some(0))
                as fn(&mut offload_api::api::ModelHints),
            "tokensPerStep 0",
        ),
        (|h| h.tokens_per_step = Some(i64::MAX), "tokensPerStep"),
        (|h| h.hidden_size = Some(-4096), "hiddenSize -4096"),
        (|h| h.layers = Some(10_000_000), "layers 10000000"),
        (|h| h.vocab_size = Some(0), "vocabSize 0"),
    ] {
        let mut hints = bench_hints(1_000_000_000, 2048, 20);
        edit(&mut hints);
        job.model = Some(hints);
        let err = resolve(&job, &[h200("h")]).unwrap_err();
        assert_eq!(err.category(), "InvalidModelHints", "{expect}: {err}");
        assert!(!err.depends_on_cluster());
        assert!(err.to_string().contains(expect), "{expect}: {err}");
    }
}

#[test]
fn without_the_steps_tokens_a_margin_of_gpu_memory_is_kept() {
    let mut job = deepspeed("0.19.8");
    job.model = Some(offload_api::api::ModelHints::parameters(
        offload_api::quantity::ParameterCount::new(3_821_770_752).unwrap(),
    ));
    let res = resolve(&job, &[h200("h")]).unwrap();
    assert_eq!(res.mode, OffloadMode::Disabled, "{}", res.summary());
}
