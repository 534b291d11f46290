//! The model's own rules: sharding, tokens, the budget, the limits, the written ratio.

use super::*;
use crate::decision::model::shape::tests::model;

#[test]
fn sharding_divides_state_over_the_ranks() {
    let one = job(model("llama-8b"), 2048.0);
    let eight = one.with_ranks(8);
    let c = h200();
    let a = one.estimate(Placement::NoOffload, &c);
    let b = eight.estimate(Placement::NoOffload, &c);
    assert!(b.gpu < a.gpu / 3.0, "{} vs {}", gib(b.gpu), gib(a.gpu));
    // ZeRO-2 keeps the 16-bit parameters whole on every GPU.
    let z2 = JobMemory {
        sharding: Sharding::Zero(2),
        ..eight.clone()
    };
    assert!(z2.estimate(Placement::NoOffload, &c).gpu > b.gpu + 10e9);
    // A pod of 8 GPUs needs 8 ranks' host memory.
    let pod = JobMemory {
        gpus_per_pod: 8,
        ..eight.clone()
    };
    let single = JobMemory {
        gpus_per_pod: 1,
        pods: 8,
        ..eight
    };
    let (e8, e1) = (
        pod.estimate(Placement::Optimizer, &c),
        single.estimate(Placement::Optimizer, &c),
    );
    assert!((e8.host_per_pod - 8.0 * e1.host_per_pod).abs() < 1.0);
}

#[test]
fn activations_grow_with_tokens_and_shrink_with_checkpointing() {
    let c = h200();
    let j = job(model("llama-8b"), 2048.0);
    let base = j.activation_bytes(&c);
    assert!((j.with_tokens(4096.0).activation_bytes(&c) / base - 2.0).abs() < 1e-9);
    let ckpt = JobMemory {
        checkpointing: true,
        ..j.clone()
    };
    assert!(ckpt.activation_bytes(&c) < base / 3.0);
    let unknown = JobMemory { tokens: None, ..j };
    assert!((unknown.activation_bytes(&c) - 0.1 * 150_754_820_096.0).abs() < 1.0);
}

#[test]
fn the_smallest_ratio_grows_with_the_model_and_the_pod_limit_bounds_the_host() {
    let c = h200();
    let mut last = 0.0;
    for layers in [40.0, 44.0, 48.0] {
        let j = job(gpt(4096.0, layers), 2048.0);
        if let Some((r, _)) = j.smallest_ratio(&c, 0.05) {
            assert!(r >= last, "{layers}: {r} < {last}");
            last = r;
        }
    }
    assert!(last > 0.0);
    // A pod limit below what the host state needs: no ratio fits.
    let limited = JobMemory {
        pod_memory_limit: Some(16 << 30),
        ..bench_job(9_122_865_152.0, 4096.0, 44.0)
    };
    assert!(limited.smallest_ratio(&c, 0.05).is_none());
}

#[test]
fn the_budget_is_the_gpu_less_its_context_and_fragmentation() {
    let budget = h200().gpu_budget();
    // 136.2 GiB: above the 135.9 GiB allocated that trained, below the 136.9 GiB that ran out.
    assert!(
        budget > 145_934_119_936.0 && budget < 146_853_287_936.0,
        "{}",
        gib(budget)
    );
    let tiny = ClassMemory {
        gpu_bytes: 1 << 30,
        ..h200()
    };
    assert_eq!(tiny.gpu_budget(), 0.0);
}

#[test]
fn a_choice_close_to_the_limit_says_what_would_widen_the_headroom() {
    let j = job(model("llama-8b"), 2048.0);
    let est = j.estimate(Placement::NoOffload, &h200());
    let note = j
        .close_to_limit(&est, &h200())
        .expect("0.3 GiB left is close");
    assert!(
        note.contains("activation checkpointing") && note.contains("second GPU"),
        "{note}"
    );
    let small = job(model("llama-3b"), 2048.0);
    let est = small.estimate(Placement::NoOffload, &h200());
    assert!(small.close_to_limit(&est, &h200()).is_none());
    assert!(small.describe(&est, &h200()).contains("headroom"));
}

#[test]
fn figures_never_overflow_or_go_negative() {
    let c = ClassMemory {
        gpu_bytes: u64::MAX,
        host_per_pod: Some(u64::MAX),
        ..h200()
    };
    for p in [1.0, 1e15] {
        let j = JobMemory {
            parameters: p,
            ranks: u64::MAX,
            gpus_per_pod: u64::MAX,
            pods: u64::MAX,
            ..job(gpt(1e6, 1e5), 1e12)
        };
        for placement in [
            Placement::NoOffload,
            Placement::PartialOptimizer(0.5),
            Placement::Optimizer,
            Placement::OptimizerAndParams,
        ] {
            let (e, _) = j.estimate_checked(placement, &c);
            for v in [e.gpu, e.host_per_pod] {
                assert!(v.is_finite() && v >= 0.0, "{p} {placement}: {v}");
            }
            let _ = bytes(e.gpu);
        }
    }
    assert_eq!(bytes(f64::MAX), u64::MAX);
    assert_eq!(bytes(-1.0), 0);
}

#[test]
fn the_operator_sub_group_size_is_about_a_hundredth_of_the_shard() {
    assert_eq!(operator_sub_group_size(9.1e9, 1), 91_000_000);
    assert_eq!(operator_sub_group_size(1e8, 1), 10_000_000);
    assert_eq!(operator_sub_group_size(1e12, 1), 1_000_000_000);
}

/// What the decision records for a partial ratio it wrote (its sub-groups walked) against what
/// those rendered configurations measured on the H200 (docs/benchmarks/raw/2026-12-01-h200/
/// call{2,3}-memory.jsonl): never under, never a quarter over.
#[test]
fn the_ratio_written_is_checked_with_its_sub_groups() {
    for (run, p, h, l, ratio, group, gpu, host) in [
        (
            "1b 0.05",
            1_138_241_536.0,
            2048.0,
            20.0,
            0.05,
            12e6,
            23_193_328_640.0,
            8_896_479_232.0,
        ),
        (
            "4b 0.05",
            3_821_770_752.0,
            3072.0,
            32.0,
            0.05,
            39e6,
            72_886_848_512.0,
            21_096_005_632.0,
        ),
        (
            "6b 0.06",
            6_706_307_072.0,
            4096.0,
            32.0,
            0.06,
            68e6,
            124_536_460_288.0,
            36_471_554_048.0,
        ),
        (
            "9b 0.35",
            9_122_865_152.0,
            4096.0,
            44.0,
            0.35,
            92e6,
            127_491_998_720.0,
            96_132_104_192.0,
        ),
        // The operator's choice for 9.1B, trained (raw/2026-12-02-h200-check/gpt-memory.jsonl).
        (
            "9b 0.23",
            9_122_865_152.0,
            4096.0,
            44.0,
            0.23,
            92e6,
            144_676_389_888.0,
            76_403_400_704.0,
        ),
    ] {
        let j = JobMemory {
            sub_group_size: Some(group),
            ..bench_job(p, h, l)
        };
        let (est, _) = j.estimate_checked(Placement::PartialOptimizer(ratio), &h200());
        // The sub-groups walked: the host within the 10 %.
        for (what, e, m, over) in [
            ("GPU", est.gpu, gpu, 1.25),
            ("host", est.host_per_pod, host, 1.10),
        ] {
            never_under(&format!("{run}: {what}"), e, m, over - 1.0);
        }
    }
}
