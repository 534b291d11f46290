//! The Hugging Face decoders measured on the H200.

use super::*;
use crate::decision::shape::tests::model;

/// The H100 80GB HBM3 of the recorded H100 runs (its NVML total), otherwise the H200's class.
fn h100() -> ClassMemory {
    ClassMemory {
        gpu_bytes: 85_520_809_984,
        gpu_node: "h100-0".into(),
        ..h200()
    }
}

/// Every Hugging Face run on the H200 (call1/call2-memory.jsonl of
/// docs/benchmarks/raw/2026-12-01-h200-arch): the model, what was offloaded, tokens per
/// micro-batch, the peak GPU memory allocated, the process's peak RSS, and whether it trained
/// (one ran out of GPU memory).
const MEASURED_HF: &[(&str, Run, f64, f64, f64, bool)] = &[
    (
        "qwen-1.5b",
        Run::None,
        2048.0,
        35_500_068_352.0,
        4_643_328_000.0,
        true,
    ),
    (
        "qwen-1.5b",
        Run::None,
        4096.0,
        45_153_873_408.0,
        4_643_328_000.0,
        true,
    ),
    (
        "llama-3b",
        Run::None,
        2048.0,
        63_199_527_936.0,
        7_981_453_312.0,
        true,
    ),
    (
        "llama-3b",
        Run::None,
        4096.0,
        73_924_304_384.0,
        7_981_453_312.0,
        true,
    ),
    (
        "mistral-7b",
        Run::None,
        2048.0,
        130_951_541_760.0,
        16_040_316_928.0,
        true,
    ),
    (
        "mistral-7b",
        Run::None,
        4096.0,
        144_967_540_224.0,
        16_040_316_928.0,
        true,
    ),
    (
        "llama-8b",
        Run::None,
        1024.0,
        137_742_894_080.0,
        17_617_969_152.0,
        true,
    ),
    (
        "llama-8b",
        Run::None,
        2048.0,
        145_934_119_936.0,
        17_617_969_152.0,
        true,
    ),
    (
        "qwen-7b",
        Run::None,
        1024.0,
        131_297_404_416.0,
        16_787_935_232.0,
        true,
    ),
    (
        "qwen-7b",
        Run::None,
        2048.0,
        139_662_472_704.0,
        16_787_935_232.0,
        true,
    ),
    (
        "neox-7b",
        Run::None,
        2048.0,
        121_746_218_496.0,
        15_271_473_152.0,
        true,
    ),
    (
        "neox-7b",
        Run::None,
        4096.0,
        132_692_467_200.0,
        15_271_473_152.0,
        true,
    ),
    (
        "mixtral-5b",
        Run::None,
        2048.0,
        84_204_004_864.0,
        11_074_564_096.0,
        true,
    ),
    (
        "mixtral-5b",
        Run::None,
        4096.0,
        88_843_604_992.0,
        11_074_564_096.0,
        true,
    ),
    (
        "llama-3b",
        Run::Opt,
        4096.0,
        28_943_269_376.0,
        65_298_993_152.0,
        true,
    ),
    (
        "qwen-1.5b",
        Run::Partial(0.05, 1.6e7),
        4096.0,
        47_581_207_040.0,
        10_469_818_368.0,
        true,
    ),
    (
        "qwen-1.5b",
        Run::Opt,
        4096.0,
        23_542_213_120.0,
        35_638_317_056.0,
        true,
    ),
    (
        "qwen-1.5b",
        Run::OptPar,
        4096.0,
        22_476_204_544.0,
        42_310_828_032.0,
        true,
    ),
    // Ran out of GPU memory at its first step (with 1.61 GiB reserved but unallocated).
    (
        "mistral-7b",
        Run::Partial(0.05, 7.3e7),
        4096.0,
        146_853_287_936.0,
        37_236_183_040.0,
        false,
    ),
    (
        "mistral-7b",
        Run::Partial(0.14, 7.3e7),
        4096.0,
        141_515_779_584.0,
        43_074_977_792.0,
        true,
    ),
    (
        "mistral-7b",
        Run::Partial(0.3, 7.3e7),
        4096.0,
        124_066_819_584.0,
        56_973_045_760.0,
        true,
    ),
    (
        "llama-10b",
        Run::Partial(0.45, 1.08e8),
        2048.0,
        136_855_389_696.0,
        126_135_250_944.0,
        true,
    ),
    // The operator's own choices and smallest shares, rendered by `explain` (call3).
    (
        "mistral-7b",
        Run::Partial(0.11, 7.3e7),
        4096.0,
        145_005_571_584.0,
        41_127_780_352.0,
        true,
    ),
    (
        "llama-8b",
        Run::Partial(0.08, 8.1e7),
        2048.0,
        145_764_331_520.0,
        43_946_786_816.0,
        true,
    ),
    (
        "llama-10b",
        Run::Partial(0.41, 1.08e8),
        2048.0,
        143_834_973_696.0,
        118_216_241_152.0,
        true,
    ),
    (
        "mistral-7b",
        Run::Partial(0.35, 7.3e7),
        8192.0,
        145_118_866_944.0,
        64_353_845_248.0,
        true,
    ),
    (
        "llama-8b",
        Run::Partial(0.23, 8.1e7),
        4096.0,
        143_662_870_016.0,
        56_716_750_848.0,
        true,
    ),
    // Shapes the host model was not fitted on, predicted before they ran
    // (docs/benchmarks/raw/2026-12-02-h200-check/hf-memory.jsonl).
    (
        "qwen-7b",
        Run::Partial(0.2, 7.6e7),
        2048.0,
        126_003_874_816.0,
        56_073_289_728.0,
        true,
    ),
    (
        "mixtral-5b",
        Run::Partial(0.3, 4.8e7),
        4096.0,
        74_593_333_760.0,
        46_527_229_952.0,
        true,
    ),
    // A tied 128k vocabulary at 18,432 tokens a micro-batch: fp32 logits of 8.8 GiB at a time
    // (docs/benchmarks/raw/2026-12-01-h200-loop/truth-partial-memory.jsonl; 2026-12-02-h200-flush).
    (
        "llama-3b",
        Run::Partial(0.2, 3.3e7),
        18432.0,
        132_386_822_656.0,
        23_887_589_376.0,
        false,
    ),
    (
        "llama-3b",
        Run::Partial(0.35, 3.3e7),
        18432.0,
        139_322_367_488.0,
        30_538_514_432.0,
        false,
    ),
    (
        "llama-3b",
        Run::Partial(0.5, 3.3e7),
        18432.0,
        132_879_621_632.0,
        37_518_184_448.0,
        true,
    ),
    // Predicted before they ran, with the gradient flushes modelled
    // (docs/benchmarks/raw/2026-12-02-h200-flush/).
    (
        "llama-3b",
        Run::Partial(0.38, 3.3e7),
        18432.0,
        137_711_656_448.0,
        32_283_742_208.0,
        true,
    ),
    (
        "llama-3b",
        Run::Partial(0.4, 3.3e7),
        18432.0,
        136_906_350_080.0,
        33_198_628_864.0,
        true,
    ),
    (
        "llama-3b",
        Run::Partial(0.45, 3.3e7),
        18432.0,
        134_490_283_520.0,
        35_774_070_784.0,
        true,
    ),
    (
        "mixtral-5b",
        Run::Opt,
        4096.0,
        22_605_591_040.0,
        114_483_736_576.0,
        true,
    ),
    (
        "qwen-7b",
        Run::Partial(0.4, 7.6e7),
        1024.0,
        97_184_941_056.0,
        82_541_842_432.0,
        true,
    ),
    (
        "neox-7b",
        Run::Partial(0.2, 6.9e7),
        4096.0,
        122_680_413_696.0,
        48_045_207_552.0,
        true,
    ),
    (
        "llama-8b",
        Run::Partial(0.3, 8.1e7),
        1024.0,
        114_728_960_000.0,
        64_078_598_144.0,
        true,
    ),
    (
        "mistral-7b",
        Run::Partial(0.4, 7.3e7),
        1024.0,
        92_590_786_048.0,
        69_764_161_536.0,
        true,
    ),
];

#[test]
fn gpu_estimates_of_the_hugging_face_decoders_are_never_under_nor_5_percent_over() {
    for &(name, run, tokens, gpu, _, ran) in MEASURED_HF {
        if !ran {
            continue;
        }
        let (_, est, _) = hf_estimate(name, run, tokens);
        never_under(&format!("{name} {run:?} {tokens}: GPU"), est.gpu, gpu, 0.05);
    }
}

#[test]
fn host_estimates_are_never_under_the_measured_peak() {
    for &(name, run, tokens, _, host, ran) in MEASURED_HF {
        if !ran {
            continue;
        }
        let (_, est, _) = hf_estimate(name, run, tokens);
        // Within 2 %: the pinned blocks, the offloaded state and the larger transient, as
        // DeepSpeed allocates them (the issue's goal is 10 %).
        never_under(
            &format!("{name} {run:?}: host"),
            est.host_per_pod,
            host,
            0.02,
        );
    }
}

/// Runs that trained inside the headroom the decision keeps for the allocator to place the
/// step's largest activation: they retried the allocator (docs/benchmarks/raw/2026-12-02-h200-flush/).
const INSIDE_THE_HEADROOM: &[(&str, f64, f64)] =
    &[("llama-3b", 0.38, 18432.0), ("llama-3b", 0.4, 18432.0)];

#[test]
fn what_trained_fits_and_what_ran_out_of_memory_does_not() {
    for &(name, run, tokens, _, _, ran) in MEASURED_HF {
        let (j, est, fit) = hf_estimate(name, run, tokens);
        let inside = INSIDE_THE_HEADROOM.iter().any(|&(n, r, t)| {
            n == name && t == tokens && matches!(run, Run::Partial(x, _) if x == r)
        });
        assert_eq!(
            fit.ok(),
            ran && !inside,
            "{name} {run:?} {tokens}: {} of {}",
            gib(est.gpu),
            gib(j.gpu_budget(&h200()))
        );
    }
}

#[test]
fn the_headroom_for_the_largest_activation_keeps_what_ran_out_out_and_what_stepped_fastest_in() {
    // Llama-3.2-3B at 18,432 tokens a micro-batch: the 35 % share ran out, 38 % trained after
    // retrying the allocator in 1,942 ms a step, 44 % without in 2,021 ms, 50 % in 2,310 ms.
    let mut j = job(model("llama-3b"), 18432.0);
    j.sub_group_size = Some(3.3e7);
    let budget = j.gpu_budget(&h200());
    assert!(budget < h200().gpu_budget() - 9e9, "{}", gib(budget));
    let (ratio, est) = j.smallest_ratio(&h200(), 0.01).expect("a share fits");
    assert!((0.39..=0.44).contains(&ratio), "{ratio}: {}", gib(est.gpu));
    // Without tokens nothing is known of the logits: the share of the GPU alone.
    let unknown = JobMemory {
        tokens: None,
        ..j.clone()
    };
    assert_eq!(unknown.gpu_budget(&h200()), h200().gpu_budget());
    // What a DRA selector asks for is the inverse of the budget.
    let asked = crate::decision::memory::gpu_memory_for(est.gpu, j.allocator_room());
    let class = ClassMemory {
        gpu_bytes: asked,
        ..h200()
    };
    assert!(j.gpu_budget(&class) >= est.gpu);
    assert!(
        j.gpu_budget(&ClassMemory {
            gpu_bytes: asked - (64 << 20),
            ..h200()
        }) < est.gpu
    );
}

#[test]
fn a_small_partial_share_costs_more_gpu_memory_than_it_frees() {
    // Mistral-7B at 4096 tokens: no offload needs 135.0 GiB (it trained); 5 % offloaded ran
    // out of memory; 14 % needs about as much as no offload.
    let j = job(model("mistral-7b"), 4096.0);
    let none = j.estimate(Placement::NoOffload, &h200());
    for share in [0.01, 0.05, 0.1] {
        let part = j.estimate(Placement::PartialOptimizer(share), &h200());
        assert!(
            part.gpu > none.gpu,
            "{share}: {} vs {}",
            gib(part.gpu),
            gib(none.gpu)
        );
    }
    // It pays from about an eighth of the state on.
    let eighth = j.estimate(Placement::PartialOptimizer(0.2), &h200());
    assert!(eighth.gpu < none.gpu);
    // The smallest ratio that fits is never one that costs more than no offload.
    let big = job(model("llama-10b"), 2048.0);
    let (r, est) = big
        .smallest_ratio(&h200(), 0.05)
        .expect("a share fits the 10.7B");
    assert!(est.gpu < big.estimate(Placement::NoOffload, &h200()).gpu);
    assert!((0.35..=0.45).contains(&r), "{r}");
}

/// Runs recorded on an H100 (85,520,809,984 bytes of HBM; the closed loop's runs that trained,
/// docs/benchmarks/raw/2026-12-06-h100-loop/): model types outside the H200 set, at the share
/// and sub-group size the operator wrote, tokens per micro-batch, and PyTorch's allocated peak.
const MEASURED_H100: &[(&str, f64, f64, f64, f64)] = &[
    // Gemma-2 (its extra norms and softcapped logits counted, ×1.06 measured on its blocks).
    ("gemma2-2b", 0.32, 2.7e7, 5120.0, 79_645_490_688.0),
    ("qwen3-4b", 0.44, 4.1e7, 4096.0, 80_362_691_072.0),
    ("phi3-mini", 0.26, 3.9e7, 4096.0, 76_814_870_016.0),
];

#[test]
fn recorded_h100_runs_of_the_newer_model_types_are_never_under() {
    let h100 = h100();
    for &(name, share, group, tokens, measured) in MEASURED_H100 {
        let mut j = job(model(name), tokens);
        j.sub_group_size = Some(group);
        let (est, _) = j.estimate_checked(Placement::PartialOptimizer(share), &h100);
        // Measured types within +5 %; a type never measured keeps its stated margin on top.
        let max = if matches!(
            j.shape.standing,
            crate::decision::shape::TypeStanding::Unmeasured
        ) {
            0.10
        } else {
            0.05
        };
        never_under(&format!("{name} at {share}: GPU"), est.gpu, measured, max);
    }
    // Gemma-2 as built: four norms a layer (each with its weight: the count is exact) and the
    // softcapped logits' tanh output kept for backward.
    let gemma = model("gemma2-2b");
    assert!(
        gemma.quirks.sandwich_norms
            && gemma.quirks.softcapped_logits
            && gemma.quirks.softcapped_attention
    );
    let said = gemma.describe();
    assert!(
        said.contains(
            "four norms a layer, softcapped logits, softcapped attention counted as a fused one"
        ),
        "{said}"
    );
    assert!(!model("llama-8b").describe().contains("norms a layer"));
    assert_eq!(gemma.parameters(), 2_614_341_888.0);
    let plain = crate::decision::shape::ModelShape {
        quirks: Default::default(),
        ..gemma
    };
    let per_token = gemma.activation_peak_per_token(false) - plain.activation_peak_per_token(false);
    assert_eq!(per_token, 26.0 * 16.0 * 2304.0 + 2.0 * 256_000.0);
}

/// Runs on the H200 as issues #48 and #49 report them (Qwen3-8B at 1 × 4,096 with a share of
/// its optimizer state offloaded; Phi-3-mini at 4 × 4,096 without offload): the share (none for
/// no offload), the tokens, PyTorch's allocated peak (for a run that ran out, what it held plus
/// what it asked for), and whether it trained. Sub-groups as the operator writes them.
const FROM_THE_ISSUES: &[(&str, Option<f64>, f64, f64, bool)] = &[
    ("qwen3-8b", Some(0.25), 4096.0, (136.30 + 2.32) * GIB, false),
    ("qwen3-8b", Some(0.30), 4096.0, 134.1 * GIB, true),
    ("qwen3-8b", Some(0.36), 4096.0, 128.3 * GIB, true),
    ("qwen3-8b", Some(0.45), 4096.0, 118.2 * GIB, true),
    ("phi3-mini", None, 16384.0, (132.3 + 2.0) * GIB, false),
];

const GIB: f64 = 1_073_741_824.0;

#[test]
fn the_issues_h200_runs_are_never_under_and_what_ran_out_does_not_fit() {
    for &(name, share, tokens, measured, trained) in FROM_THE_ISSUES {
        let mut j = job(model(name), tokens);
        j.sub_group_size = Some(8.2e7);
        let placement = share.map_or(Placement::NoOffload, Placement::PartialOptimizer);
        let (est, fit) = j.estimate_checked(placement, &h200());
        assert!(
            est.gpu >= measured,
            "{name} {placement:?}: {} against {} needed",
            gib(est.gpu),
            gib(measured)
        );
        assert_eq!(fit.ok(), trained, "{name} {placement:?}: {}", gib(est.gpu));
        if trained {
            assert!(est.gpu / measured - 1.0 <= 0.05, "{name} {placement:?}");
        }
    }
}

/// The H100 loop with the allocator reporter run to its end, and the sweep beside it
/// (docs/benchmarks/raw/2026-12-06-h100-converge/): the share (none for no offload), the
/// operator's sub-group size, the tokens, PyTorch's allocated peak as the reporter gave it (for
/// a run that ran out, what it held plus what it asked for), and whether it trained.
/// (model, share, sub-group size, tokens, allocated peak, trained)
type Recorded = (&'static str, Option<f64>, f64, f64, f64, bool);

const CONVERGED_H100: &[Recorded] = &[
    (
        "gemma2-2b",
        Some(0.30),
        2.7e7,
        4096.0,
        71_616_568_832.0,
        true,
    ),
    (
        "gemma2-2b",
        Some(0.21),
        2.7e7,
        4096.0,
        74_678_705_664.0,
        true,
    ),
    ("gemma2-2b", None, 2.7e7, 4096.0, 76_331_873_280.0, true),
    (
        "mistral-7b",
        Some(0.67),
        7.3e7,
        4096.0,
        80_579_620_352.0,
        true,
    ),
    (
        "mistral-7b",
        Some(0.66),
        7.3e7,
        4096.0,
        82_190_364_160.0,
        true,
    ),
    (
        "mistral-7b",
        Some(0.62),
        7.3e7,
        4096.0,
        (77.42 + 0.11) * GIB,
        false,
    ),
    (
        "qwen3-4b",
        Some(0.44),
        4.1e7,
        4096.0,
        80_362_691_072.0,
        true,
    ),
    (
        "qwen3-4b",
        Some(0.40),
        4.1e7,
        4096.0,
        (74.80 + 2.32) * GIB,
        false,
    ),
];

#[test]
fn the_converged_h100_loop_is_never_under_and_what_ran_out_does_not_fit() {
    let h100 = h100();
    for &(name, share, group, tokens, measured, trained) in CONVERGED_H100 {
        let mut j = job(model(name), tokens);
        j.sub_group_size = Some(group);
        let placement = share.map_or(Placement::NoOffload, Placement::PartialOptimizer);
        let (est, fit) = j.estimate_checked(placement, &h100);
        let what = format!("{name} {placement:?}");
        if trained {
            // Gemma-2 counted as measured (×1.06): within 0.5 % here, where the margin of a
            // type never measured kept 8–9 % more and offloaded 30 % that did not need it.
            never_under(&format!("{what}: GPU"), est.gpu, measured, 0.05);
        } else {
            assert!(
                est.gpu >= measured,
                "{what}: {} < {}",
                gib(est.gpu),
                gib(measured)
            );
            assert!(!fit.ok(), "{what} ran out: the model must not fit it");
        }
    }
}

/// The H100 loop for two model types never measured before (OLMo-2 7B, StarCoder2 7B, 1 ×
/// 4,096 tokens; docs/benchmarks/raw/2026-12-06-h100-olmo2-starcoder2/): as [`Recorded`].
const NEW_TYPES_H100: &[Recorded] = &[
    (
        "olmo2-7b",
        Some(0.78),
        7.3e7,
        4096.0,
        (76.47 + 1.53) * GIB,
        false,
    ),
    (
        "olmo2-7b",
        Some(0.88),
        7.3e7,
        4096.0,
        72_245_530_112.0,
        true,
    ),
    (
        "olmo2-7b",
        Some(0.82),
        7.3e7,
        4096.0,
        78_722_059_776.0,
        true,
    ),
    (
        "starcoder2-7b",
        Some(0.69),
        7.5e7,
        4096.0,
        76_016_355_328.0,
        true,
    ),
    (
        "starcoder2-7b",
        Some(0.67),
        7.5e7,
        4096.0,
        77_375_604_736.0,
        true,
    ),
];

#[test]
fn olmo2_and_starcoder2_counted_are_never_under_and_olmo2s_first_run_would_not_fit() {
    let h100 = h100();
    for &(name, share, group, tokens, measured, trained) in NEW_TYPES_H100 {
        let mut j = job(model(name), tokens);
        j.sub_group_size = Some(group);
        let placement = share.map_or(Placement::NoOffload, Placement::PartialOptimizer);
        let (est, fit) = j.estimate_checked(placement, &h100);
        let what = format!("{name} {placement:?}");
        if name == "olmo2-7b" {
            // Its query and key norms counted and ×1.06 measured: within 0.5 % of all three
            // runs (the +25 % margin a type never measured had then was 4 % under the first).
            assert!(j.shape.quirks.query_key_norms, "{what}");
            assert_eq!(j.shape.standing.factor(), 1.06, "{what}");
            never_under(&format!("{what}: GPU"), est.gpu, measured, 0.01);
        } else {
            // StarCoder2's GPT-style blocks counted as they are (no factor): within 1 % of
            // both runs. The +25 % margin of a type never measured it ran under then was over
            // by 8 % (the loop took that back in one run: 69 % → 67 %).
            assert_eq!(
                j.shape.standing,
                crate::decision::shape::TypeStanding::Counted,
                "{what}"
            );
            never_under(&format!("{what}: GPU"), est.gpu, measured, 0.01);
        }
        if !trained {
            assert!(!fit.ok(), "{what} ran out: the model must not fit it");
        }
    }
}
