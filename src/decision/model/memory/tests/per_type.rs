//! The per-type table (docs/benchmarks/memory-h200.md): one run a model type at its GPU's
//! limit, on the H200 and the H100, the next faster rung beside it where it was run.

use super::loops::{
    CONVERGED_H100, EIGHTH_H100, FROM_THE_ISSUES, GIB, NEW_TYPES_H100, Recorded, h100, read_on,
};
use super::*;

/// One run a model type, the one nearest its GPU's limit, and beside it the next faster rung
/// where it was run: (model, the GPU (`true`: the H200, `false`: the H100), share (none for no
/// offload), sub-group size, tokens, PyTorch's allocated peak (for a run that ran out, what it
/// held and asked for), whether it trained). docs/benchmarks/memory-h200.md, "The per-type
/// table", prints these rows.
type TableRow = (&'static str, bool, Option<f64>, f64, f64, f64, bool);

/// The table's runs recorded nowhere else in this file: as [`TableRow`].
const PER_TYPE_OWN: &[TableRow] = &[
    (
        "llama-8b",
        true,
        None,
        8.1e7,
        2048.0,
        145_934_119_936.0,
        true,
    ),
    (
        "mistral-7b",
        true,
        None,
        7.3e7,
        4096.0,
        144_967_540_224.0,
        true,
    ),
    (
        "qwen-7b",
        true,
        None,
        7.6e7,
        2048.0,
        139_662_472_704.0,
        true,
    ),
    (
        "mixtral-5b",
        true,
        None,
        4.8e7,
        4096.0,
        88_843_604_992.0,
        true,
    ),
    (
        "neox-7b",
        true,
        None,
        6.9e7,
        4096.0,
        132_692_467_200.0,
        true,
    ),
    (
        "phi3-mini",
        false,
        Some(0.26),
        3.9e7,
        4096.0,
        76_814_870_016.0,
        true,
    ),
    (
        "phi3-mini",
        false,
        Some(0.14),
        3.9e7,
        4096.0,
        77.29 * GIB,
        false,
    ),
    (
        "olmo2-7b",
        false,
        Some(0.80),
        7.3e7,
        4096.0,
        (74.80 + 1.53) * GIB,
        false,
    ),
    (
        "starcoder2-7b",
        false,
        Some(0.64),
        7.5e7,
        4096.0,
        80_849_315_840.0,
        true,
    ),
    (
        "starcoder2-7b",
        false,
        Some(0.62),
        7.5e7,
        4096.0,
        (77.19 + 0.75) * GIB,
        false,
    ),
    (
        "starcoder2-7b",
        false,
        Some(0.60),
        7.5e7,
        4096.0,
        (77.42 + 0.035) * GIB,
        false,
    ),
];

/// The H200's tenth call (docs/benchmarks/raw/2026-12-06-h200-tenth/{loop,arch}/): each case's
/// first decision at the H200's boundary, every one trained (Phi-3 at 4 × 4,096 the issue's
/// out-of-memory case, GPT-NeoX at 1 × 6,144, Mistral-7B v0.1 past its window at 1 × 8,192);
/// PyTorch's allocated peak.
const TENTH_H200: &[TableRow] = &[
    (
        "qwen3-8b",
        true,
        Some(0.29),
        8.2e7,
        4096.0,
        145_418_118_656.0,
        true,
    ),
    (
        "starcoder2-7b",
        true,
        None,
        8.2e7,
        4096.0,
        142_391_184_896.0,
        true,
    ),
    (
        "olmo2-7b",
        true,
        Some(0.20),
        7.3e7,
        4096.0,
        145_282_780_672.0,
        true,
    ),
    (
        "neox-7b",
        true,
        None,
        8.2e7,
        6144.0,
        143_639_109_120.0,
        true,
    ),
    (
        "phi3-mini",
        true,
        Some(0.31),
        3.9e7,
        16384.0,
        143_501_370_880.0,
        true,
    ),
    (
        "cohere-8b",
        true,
        Some(0.37),
        8.1e7,
        4096.0,
        141_765_946_880.0,
        true,
    ),
    (
        "qwen-7b",
        true,
        Some(0.18),
        7.7e7,
        4096.0,
        144_277_007_872.0,
        true,
    ),
    (
        "mistral01-7b",
        true,
        Some(0.41),
        7.3e7,
        8192.0,
        145_658_621_440.0,
        true,
    ),
];

/// The H100's eleventh call (docs/benchmarks/raw/2026-12-07-h100-eleventh/{arch,next}/): four
/// first decisions at the H100's boundary, Gemma-3's language model among them (counted since
/// the tenth call, never run at a counted decision before), each trained; beside each, the next
/// faster rung. As [`TableRow`]; the run that ran out holds what it had and asked for.
const ELEVENTH_H100: &[TableRow] = &[
    (
        "gemma3-4b",
        false,
        Some(0.23),
        3.9e7,
        2048.0,
        80_515_904_512.0,
        true,
    ),
    (
        "gemma3-4b",
        false,
        Some(0.21),
        3.9e7,
        2048.0,
        82_026_025_984.0,
        true,
    ),
    (
        "mixtral-5b",
        false,
        Some(0.36),
        4.8e7,
        8192.0,
        81_121_574_400.0,
        true,
    ),
    (
        "mixtral-5b",
        false,
        Some(0.34),
        4.8e7,
        8192.0,
        82_703_219_200.0 + 1000.0 * 1_048_576.0,
        false,
    ),
    (
        "qwen2moe-5b",
        false,
        Some(0.29),
        5.2e7,
        2048.0,
        80_117_169_664.0,
        true,
    ),
    (
        "qwen2moe-5b",
        false,
        Some(0.27),
        5.2e7,
        2048.0,
        82_231_819_776.0,
        true,
    ),
    (
        "cohere-4b",
        false,
        Some(0.27),
        4.6e7,
        2048.0,
        80_581_283_328.0,
        true,
    ),
    (
        "cohere-4b",
        false,
        Some(0.25),
        4.6e7,
        2048.0,
        81_520_807_424.0,
        true,
    ),
];

/// The table's rows in order, the runs recorded in [`CONVERGED_H100`], [`NEW_TYPES_H100`] and
/// [`FROM_THE_ISSUES`] taken from there.
fn per_type() -> Vec<TableRow> {
    let from_the_issues = |name: &str, share: Option<f64>| -> TableRow {
        let &(name, share, tokens, measured, trained) = FROM_THE_ISSUES
            .iter()
            .find(|r| r.0 == name && r.1 == share)
            .unwrap_or_else(|| panic!("{name} at {share:?} in FROM_THE_ISSUES"));
        (name, true, share, 8.2e7, tokens, measured, trained)
    };
    let on_the_h100 = |runs: &[Recorded], name: &str, share: Option<f64>| -> TableRow {
        let &(name, share, group, tokens, measured, trained) = runs
            .iter()
            .find(|r| r.0 == name && r.1 == share)
            .unwrap_or_else(|| panic!("{name} at {share:?} recorded"));
        (name, false, share, group, tokens, measured, trained)
    };
    vec![
        PER_TYPE_OWN[0],
        PER_TYPE_OWN[1],
        on_the_h100(CONVERGED_H100, "mistral-7b", Some(0.66)),
        on_the_h100(CONVERGED_H100, "mistral-7b", Some(0.62)),
        PER_TYPE_OWN[2],
        PER_TYPE_OWN[3],
        PER_TYPE_OWN[4],
        from_the_issues("qwen3-8b", Some(0.30)),
        from_the_issues("qwen3-8b", Some(0.25)),
        on_the_h100(CONVERGED_H100, "qwen3-4b", Some(0.44)),
        on_the_h100(CONVERGED_H100, "qwen3-4b", Some(0.40)),
        PER_TYPE_OWN[5],
        PER_TYPE_OWN[6],
        on_the_h100(CONVERGED_H100, "gemma2-2b", None),
        on_the_h100(NEW_TYPES_H100, "olmo2-7b", Some(0.82)),
        on_the_h100(NEW_TYPES_H100, "olmo2-7b", Some(0.78)),
        PER_TYPE_OWN[7],
        on_the_h100(NEW_TYPES_H100, "starcoder2-7b", Some(0.67)),
        PER_TYPE_OWN[8],
        PER_TYPE_OWN[9],
        PER_TYPE_OWN[10],
        on_the_h100(EIGHTH_H100, "cohere-4b", Some(0.27)),
        on_the_h100(EIGHTH_H100, "qwen2moe-5b", Some(0.31)),
    ]
    .into_iter()
    .chain(TENTH_H200.iter().copied())
    .chain(ELEVENTH_H100.iter().copied())
    .collect()
}

#[test]
fn the_per_type_table_is_never_under_and_nothing_that_fits_ran_out() {
    // Twelve model types (Llama, Mistral, Qwen2, Mixtral, GPT-NeoX counted; Qwen3, Phi-3,
    // Gemma-2, OLMo-2 measured; StarCoder2, Cohere and Qwen2-MoE counted from their runs), each
    // at its run nearest the limit, the H200's tenth call (eight more rows, at its boundary) and
    // the H100's eleventh (Gemma-3's language model the thirteenth type; four first decisions
    // and the next faster rung beside each): every estimate that trained within 1 % over its peak (a measured type's
    // within 5 %), never under; every run that ran
    // out is refused ("does not fit"), so nothing the model says fits ran out (Mistral's 66 %
    // on the H100 trained at the budget's edge, where the loop's lesson placed it, not the
    // model alone). `--nocapture` prints the table's rows.
    for &(name, on_h200, share, group, tokens, measured, trained) in &per_type() {
        let class = if on_h200 { h200() } else { h100() };
        let (j, placement, est, fit) = read_on(&class, name, share, group, tokens);
        let budget = j.gpu_budget(&class);
        let what = format!("{name} {placement:?} {tokens}");
        println!(
            "| {name} | {} | {tokens} | {placement:?} | {} | {:.2} GiB | {:.2} GiB ({:+.1} %) | {:.2} GiB ({:.1} %) | {} |",
            if on_h200 { "H200" } else { "H100" },
            if trained { "✓" } else { "✗" },
            measured / GIB,
            est.gpu / GIB,
            (est.gpu / measured - 1.0) * 100.0,
            budget / GIB,
            measured / budget * 100.0,
            if fit.ok() { "fits" } else { "does not fit" },
        );
        assert!(est.gpu >= measured, "{what}: under");
        if trained {
            // A counted type within 1 %; a measured type's factor is for the peak of the run it
            // was measured on, and keeps the issue's +5 % (Phi-3 at 4 × 4,096 on the H200: +1.7 %).
            let over = match j.shape.standing {
                crate::decision::model::shape::TypeStanding::Measured(..) => 0.05,
                _ => 0.01,
            };
            never_under(&format!("{what}: GPU"), est.gpu, measured, over);
        } else {
            assert!(!fit.ok(), "{what} ran out: it must not fit");
        }
    }
    let names: std::collections::BTreeSet<&str> = per_type().iter().map(|r| r.0).collect();
    assert!(names.len() >= 13, "{names:?}");
}

#[test]
fn at_the_h100s_boundary_each_first_decision_trained_and_the_faster_rung_is_refused_by_the_allocators_room()
 {
    // Each pair in [`ELEVENTH_H100`]: the decision (the first of the pair) fits and trained; the
    // next faster rung does not fit. Where that rung trained (Gemma-3 at 21 %, Qwen2-MoE at
    // 27 %, Cohere at 25 %) its estimate is within 1 % of what it allocated and under the GPU
    // less its context: what refused it is the room kept for the allocator (1.4 × the step's
    // fp32 logits; Qwen2-MoE's need was 99.9 % of its budget). A first decision keeps that
    // room: OLMo-2's 80 % ran out on this GPU with more room than Gemma-3's 21 % trained with,
    // so no threshold on the room alone admits the one and refuses the other (`memory-h200.md`,
    // "At the H100's boundary"). A trial after a run that trained spends it
    // (`tests/loop_replay.rs`: Gemma-3's and Cohere's loops try these rungs next).
    let class = h100();
    let room = |measured: f64| class.gpu_bytes as f64 - CONTEXT_RESERVE_BYTES - measured;
    for pair in ELEVENTH_H100.chunks(2) {
        let [decided, faster] = pair else {
            panic!("ELEVENTH_H100 holds pairs")
        };
        let (j, placement, est, fit) = read_on(&class, decided.0, decided.2, decided.3, decided.4);
        assert!(decided.6 && fit.ok(), "{} {placement:?}", decided.0);
        never_under(
            &format!("{} {placement:?}", decided.0),
            est.gpu,
            decided.5,
            0.01,
        );
        let (_, placement, est, fit) = read_on(&class, faster.0, faster.2, faster.3, faster.4);
        let what = format!("{} {placement:?}", faster.0);
        assert!(!fit.ok(), "{what}: the next faster rung must not fit");
        if faster.6 {
            never_under(&format!("{what}: GPU"), est.gpu, faster.5, 0.01);
            assert!(
                est.gpu < room(0.0),
                "{what}: refused by the room, not the GPU"
            );
            // What the budget keeps beyond the context: the room the rung went without, or
            // (Qwen2-MoE, whose logits are small) a need within 0.5 % of the budget, refused by
            // the estimate's own +0.2 %.
            let budget = j.gpu_budget(&class);
            let kept = room(budget);
            assert!(
                room(faster.5) < kept || faster.5 / budget > 0.995,
                "{what}: trained with {} of room, {} kept",
                gib(room(faster.5)),
                gib(kept)
            );
            println!(
                "{what}: trained with {} of room ({:.2} × its logits), {} kept",
                gib(room(faster.5)),
                room(faster.5) / j.largest_activation(),
                gib(room(j.gpu_budget(&class)))
            );
        }
    }
    let olmo2_ran_out = room((74.80 + 1.53) * GIB);
    let gemma3_trained = room(ELEVENTH_H100[1].5);
    assert!(
        gemma3_trained < olmo2_ran_out,
        "Gemma-3 at 21 % trained with {}, OLMo-2 at 80 % ran out with at most {}",
        gib(gemma3_trained),
        gib(olmo2_ran_out)
    );
}
