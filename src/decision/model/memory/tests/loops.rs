//! The closed loop's recorded runs (on an H100: the model types outside the H200 set, the loop
//! run to its end with the allocator reporter, OLMo-2 and StarCoder2) and the H200 runs the
//! issues report, read against the memory model.

use super::*;
use crate::decision::model::shape::tests::model;

/// The H100 80GB HBM3 of the recorded H100 runs (its NVML total), otherwise the H200's class.
pub(super) fn h100() -> ClassMemory {
    ClassMemory {
        gpu_bytes: 85_520_809_984,
        gpu_node: "h100-0".into(),
        ..h200()
    }
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
            crate::decision::model::shape::TypeStanding::Unmeasured
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
            "four norms a layer, norms weighted in fp32, softcapped logits, softcapped attention counted as a fused one"
        ),
        "{said}"
    );
    assert!(!model("llama-8b").describe().contains("norms a layer"));
    assert_eq!(gemma.parameters(), 2_614_341_888.0);
    let plain = crate::decision::model::shape::ModelShape {
        quirks: Default::default(),
        tower: None,
        ..gemma
    };
    // Each layer's two more norms and all four keeping their fp32 normalized value (36 bytes
    // per unit of width and 16 against 16 and 8), the final norm's fp32 value (2 more per
    // unit) and the softcap's 2 bytes per vocabulary entry.
    let per_token = gemma.activation_peak_per_token(false) - plain.activation_peak_per_token(false);
    assert_eq!(
        per_token,
        26.0 * (20.0 * 2304.0 + 8.0) + 2.0 * 2304.0 + 2.0 * 256_000.0
    );
}

/// Runs on the H200 as issues #48 and #49 report them (Qwen3-8B at 1 × 4,096 with a share of
/// its optimizer state offloaded; Phi-3-mini at 4 × 4,096 without offload): the share (none for
/// no offload), the tokens, PyTorch's allocated peak (for a run that ran out, what it held plus
/// what it asked for), and whether it trained. Sub-groups as the operator writes them.
pub(super) const FROM_THE_ISSUES: &[(&str, Option<f64>, f64, f64, bool)] = &[
    ("qwen3-8b", Some(0.25), 4096.0, (136.30 + 2.32) * GIB, false),
    ("qwen3-8b", Some(0.30), 4096.0, 134.1 * GIB, true),
    ("qwen3-8b", Some(0.36), 4096.0, 128.3 * GIB, true),
    ("qwen3-8b", Some(0.45), 4096.0, 118.2 * GIB, true),
    ("phi3-mini", None, 16384.0, (132.3 + 2.0) * GIB, false),
];

pub(super) const GIB: f64 = 1_073_741_824.0;

#[test]
fn the_issues_h200_runs_are_never_under_and_what_ran_out_does_not_fit() {
    for &(name, share, tokens, measured, trained) in FROM_THE_ISSUES {
        let (_, placement, est, fit) = read_on(&h200(), name, share, 8.2e7, tokens);
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
pub(super) type Recorded = (&'static str, Option<f64>, f64, f64, f64, bool);

pub(super) const CONVERGED_H100: &[Recorded] = &[
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

/// A recorded H100 run read against the model: its name and placement, the estimate and fit
/// at its share and sub-group size, what it allocated, and whether it trained.
fn read_on_the_h100(run: &Recorded) -> (String, Estimate, Fit, f64, bool) {
    let &(name, share, group, tokens, measured, trained) = run;
    let (_, placement, est, fit) = read_on(&h100(), name, share, group, tokens);
    (format!("{name} {placement:?}"), est, fit, measured, trained)
}

/// `name` at `tokens` with `share` of its optimizer state offloaded (none: no offload) and the
/// sub-group size `group`, read against the model on `class`: the job, its placement, the
/// estimate and the fit.
pub(super) fn read_on(
    class: &ClassMemory,
    name: &str,
    share: Option<f64>,
    group: f64,
    tokens: f64,
) -> (JobMemory, Placement, Estimate, Fit) {
    let mut j = job(model(name), tokens);
    j.sub_group_size = Some(group);
    let placement = share.map_or(Placement::NoOffload, Placement::PartialOptimizer);
    let (est, fit) = j.estimate_checked(placement, class);
    (j, placement, est, fit)
}

#[test]
fn the_converged_h100_loop_is_never_under_and_what_ran_out_does_not_fit() {
    for run in CONVERGED_H100 {
        let (what, est, fit, measured, trained) = read_on_the_h100(run);
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
pub(super) const NEW_TYPES_H100: &[Recorded] = &[
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

/// Cohere and Qwen2-MoE, two types never measured before, followed by the closed loop on an
/// H100 from their first decisions under the margin of a type never measured
/// (docs/benchmarks/raw/2026-12-06-h100-eighth/loop/): every run trained, PyTorch's allocated
/// peak as the reporter gave it.
pub(super) const EIGHTH_H100: &[Recorded] = &[
    (
        "cohere-4b",
        Some(0.37),
        4.6e7,
        2048.0,
        74_541_354_496.0,
        true,
    ),
    (
        "cohere-4b",
        Some(0.31),
        4.6e7,
        2048.0,
        78_031_080_960.0,
        true,
    ),
    (
        "cohere-4b",
        Some(0.27),
        4.6e7,
        2048.0,
        80_581_283_328.0,
        true,
    ),
    (
        "qwen2moe-5b",
        Some(0.33),
        5.2e7,
        2048.0,
        77_079_772_672.0,
        true,
    ),
    (
        "qwen2moe-5b",
        Some(0.31),
        5.2e7,
        2048.0,
        79_194_422_784.0,
        true,
    ),
];

#[test]
fn cohere_and_qwen2_moe_counted_are_never_under_and_within_one_percent() {
    for run in EIGHTH_H100 {
        let (what, est, _fit, measured, trained) = read_on_the_h100(run);
        let j = job(model(run.0), run.3);
        assert_eq!(
            j.shape.standing,
            crate::decision::model::shape::TypeStanding::Counted,
            "{what}"
        );
        assert!(trained, "{what}");
        println!(
            "{what}: {:.2} GiB against {:.2} GiB ({:+.2} %)",
            est.gpu / GIB,
            measured / GIB,
            (est.gpu / measured - 1.0) * 100.0
        );
        never_under(&format!("{what}: GPU"), est.gpu, measured, 0.01);
    }
}

#[test]
fn olmo2_and_starcoder2_counted_are_never_under_and_olmo2s_first_run_would_not_fit() {
    for run in NEW_TYPES_H100 {
        let (what, est, fit, measured, trained) = read_on_the_h100(run);
        let name = run.0;
        let j = job(model(name), run.3);
        if name == "olmo2-7b" {
            // Its query and key norms and its norms weighted in fp32 counted, no factor: within
            // 0.3 % of all three runs (the +25 % margin a type never measured had then was 4 %
            // under the first).
            assert!(j.shape.quirks.query_key_norms, "{what}");
            assert!(j.shape.quirks.fp32_norm_weight, "{what}");
            assert_eq!(
                j.shape.standing,
                crate::decision::model::shape::TypeStanding::Counted,
                "{what}"
            );
            never_under(&format!("{what}: GPU"), est.gpu, measured, 0.01);
        } else {
            // StarCoder2's GPT-style blocks counted as they are (no factor): within 1 % of
            // both runs. The +25 % margin of a type never measured it ran under then was over
            // by 8 % (the loop took that back in one run: 69 % → 67 %).
            assert_eq!(
                j.shape.standing,
                crate::decision::model::shape::TypeStanding::Counted,
                "{what}"
            );
            never_under(&format!("{what}: GPU"), est.gpu, measured, 0.01);
        }
        if !trained {
            assert!(!fit.ok(), "{what} ran out: the model must not fit it");
        }
    }
}
