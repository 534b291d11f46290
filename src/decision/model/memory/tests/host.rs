//! The host's pinned blocks and the backward's gradient flushes.

use super::*;
use crate::decision::model::shape::tests::model;

/// The caching host allocator's blocks: the next power of two, never less than asked.
#[test]
fn pinned_blocks_are_the_next_power_of_two() {
    assert_eq!(pinned_block(0.0), 0.0);
    assert_eq!(pinned_block(1.0), 1.0);
    assert_eq!(pinned_block(1_073_741_824.0), 1_073_741_824.0);
    assert_eq!(pinned_block(1_073_741_825.0), 2_147_483_648.0);
    // Mistral-7B's 16-bit flat gradient buffer: 14.48 GB in a 17.18 GB block.
    assert_eq!(pinned_block(2.0 * 7_241_732_096.0), 17_179_869_184.0);
    assert_eq!(pinned_block(f64::NAN), 0.0);
    assert_eq!(pinned_block(-5.0), 0.0);
    assert!(pinned_block(f64::MAX) >= f64::MAX);
}

/// The pinned bytes of each run on the H200, as PyTorch's host allocator counted them after
/// `deepspeed.initialize` (`torch.cuda.host_memory_stats()["allocated_bytes.current"]`,
/// docs/benchmarks/raw/2026-12-02-h200-host/memory.jsonl): the flat gradient buffer and the
/// sub-groups' gradient blocks as the model walks them: the same bytes (within 0.1 %).
#[test]
fn pinned_blocks_match_what_the_host_allocator_held() {
    for (name, ratio, group, tokens, measured) in [
        ("mistral-7b", 0.11, 7.3e7, 4096.0, 21_474_836_480.0_f64),
        ("mistral-7b", 0.3, 7.3e7, 4096.0, 27_917_287_424.0),
        ("llama-10b", 0.41, 1.08e8, 2048.0, 61_740_154_880.0),
        ("llama-3b", 1.0, 1e9, 4096.0, 22_548_578_304.0),
        ("qwen-1.5b", 0.05, 1.6e7, 4096.0, 5_637_177_344.0),
    ] {
        let mut j = job(model(name), tokens);
        j.sub_group_size = Some(group);
        let groups = j.walked_groups(ratio < 1.0).expect("the shape is known");
        let OnHost::Walked { on_gpu, on_host } = j.groups_on_host(Some(&groups), ratio, ratio)
        else {
            panic!("{name}: the walk adds up to the shard");
        };
        let pinned =
            pinned_block(j.value_bytes * j.shard()) + pinned_gradient_blocks(on_gpu, on_host, 4.0);
        let err = pinned / measured - 1.0;
        assert!(
            err.abs() <= 0.001,
            "{name} {ratio}: pinned {} against {} measured ({:+.2}%)",
            gib(pinned),
            gib(measured),
            err * 100.0
        );
    }
}

/// Where the sub-groups on the GPU have a block size none on the host has, one block of it
/// stays in the allocator's cache; where they share it, the host's blocks reuse it.
#[test]
fn gradient_blocks_of_the_gpus_sub_groups_are_cached_once() {
    let mib = 1_048_576.0;
    // Two sub-groups of 100 M parameters (400 MB → 512 MiB blocks) on the host, three on the
    // GPU of the same size: two blocks.
    assert_eq!(
        pinned_gradient_blocks(&[1e8, 1e8, 1e8], &[1e8, 1e8], 4.0),
        2.0 * 512.0 * mib
    );
    // One sub-group on the GPU of 250 M (1 GB → 1 GiB block) beside them: one more block.
    assert_eq!(
        pinned_gradient_blocks(&[2.5e8, 1e8], &[1e8, 1e8], 4.0),
        2.0 * 512.0 * mib + 1024.0 * mib
    );
    assert_eq!(pinned_gradient_blocks(&[], &[], 4.0), 0.0);
}

#[test]
fn the_gradient_flushes_are_what_the_allocator_history_shows() {
    // docs/benchmarks/raw/2026-12-02-h200-trace/: what was alive at the peak of the second
    // step, grouped by where it was allocated.
    // The bench's 3.8B GPT decoder, optimizer offloaded: the first flush holds the head, the
    // final norm, three layers and the last MLP projection of the fourth (475,920,384
    // elements), when the next projection's gradient arrives.
    let j = bench_job(3_821_770_752.0, 3072.0, 32.0);
    let first = j.flushes(&h200())[0];
    let traced = 951_840_768.0 // the reduce-scatter's flat copy
        + 786_432_000.0 // the head's gradient norm in fp64
        + 196_608_000.0 // the head's gradient partition back from the host
        + 75_497_472.0 // the arriving gradient
        + 2.0 * 12_582_912.0; // activation gradients in flight
    assert!(
        (first.transient - traced).abs() < 1e6,
        "{}",
        first.transient
    );
    let est = j.estimate(Placement::Optimizer, &h200());
    let peak = 16_479_357_952.0;
    let err = est.gpu / peak - 1.0;
    assert!(
        (0.0..0.02).contains(&err),
        "{} against {peak} ({err:+.4})",
        est.gpu
    );
    // The flush, not the loss's backward, is the peak.
    assert!(j.activation_bytes(&h200()) < first.alive + first.transient);

    // Qwen2.5-7B at a 20 % share: its 545M-element output head is larger than the bucket and
    // is reduced alone, from its own gradient: 8 bytes per element with the partition's copy
    // back and the fp32 copy for the optimizer (the fp64 norm chunks are smaller).
    let q = job(model("qwen-7b"), 2048.0);
    let first = q.flushes(&h200())[0];
    let head = 544_997_376.0;
    let traced = 1_089_994_752.0 + 1_089_994_752.0 + 2_179_989_504.0;
    assert_eq!(traced, 8.0 * head);
    assert!(
        first.transient >= traced && first.transient < traced + 0.05e9,
        "{}",
        first.transient
    );
    // What was alive from the step at the peak: 17.33 GB, the flush and the activations
    // left after the head's backward.
    let alive = first.alive + first.transient;
    assert!(
        (alive / 17_330_421_208.0 - 1.0).abs() < 0.005,
        "{alive} against 17330421208"
    );
}
