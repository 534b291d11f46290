use super::*;

#[test]
fn cpus_are_shared_out_evenly_and_never_left_empty() {
    let cpus: Vec<usize> = (0..16).collect();
    let shares = split_cpus(&cpus, 2);
    assert_eq!(shares, vec![(0..8).collect::<Vec<_>>(), (8..16).collect()]);
    let shares = split_cpus(&(0..5).collect::<Vec<_>>(), 2);
    assert_eq!(shares, vec![vec![0, 1, 2], vec![3, 4]]);
    // More GPUs than CPUs: every rank still gets a CPU.
    let shares = split_cpus(&[0, 1], 4);
    assert!(shares.iter().all(|s| !s.is_empty()), "{shares:?}");
    assert_eq!(split_cpus(&[0, 1, 2], 1), vec![vec![0, 1, 2]]);
}

#[test]
fn cpu_lists_read_as_the_kernel_writes_them() {
    assert_eq!(
        parse_cpulist("0-3,8,10-11\n"),
        Some(vec![0, 1, 2, 3, 8, 10, 11])
    );
    assert_eq!(parse_cpulist(""), Some(vec![]));
    for bad in ["3-1", "a", "0-", "1,,x", "0-99999999999999999999", "5000"] {
        assert_eq!(parse_cpulist(bad), None, "{bad}");
    }
}

#[test]
fn gpus_get_the_cpus_of_their_own_numa_node() {
    let allowed: Vec<usize> = (0..32).collect();
    let node0: Vec<usize> = (0..16).collect();
    let node1: Vec<usize> = (16..32).collect();
    // Two GPUs on each of two NUMA nodes, listed interleaved.
    let shares = split_by_locality(
        &allowed,
        &[
            Some(node0.clone()),
            Some(node1.clone()),
            Some(node0.clone()),
            Some(node1.clone()),
        ],
    );
    assert_eq!(
        shares,
        vec![
            (0..8).collect::<Vec<_>>(),
            (16..24).collect(),
            (8..16).collect(),
            (24..32).collect()
        ]
    );
    // One NUMA node (or the same list for every GPU): the even split.
    let same = split_by_locality(&allowed, &[Some(allowed.clone()), Some(allowed.clone())]);
    assert_eq!(same, split_cpus(&allowed, 2));
    // Unknown locality: the even split of everything.
    assert_eq!(
        split_by_locality(&allowed, &[None, None]),
        split_cpus(&allowed, 2)
    );
    // The pod may use only part of a node: only its allowed CPUs count, and a GPU whose
    // node has none of them shares what the others left.
    let pod: Vec<usize> = (4..20).collect();
    let shares = split_by_locality(&pod, &[Some(node0.clone()), Some(node1.clone())]);
    assert_eq!(
        shares,
        vec![(4..16).collect::<Vec<_>>(), (16..20).collect()]
    );
    let shares = split_by_locality(&(0..8).collect::<Vec<_>>(), &[Some(node0), Some(node1)]);
    assert_eq!(shares[0], (0..8).collect::<Vec<_>>());
    assert!(!shares[1].is_empty(), "{shares:?}");
    // Shares never overlap while there are CPUs enough.
    let mixed = split_by_locality(&allowed, &[Some((0..16).collect()), None, None]);
    let mut all: Vec<usize> = mixed.concat();
    let total = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), total, "{mixed:?}");
    assert!(mixed.iter().all(|s| !s.is_empty()));
}

fn measured(device: u32, pipelined: &[f64]) -> Measurements {
    Measurements {
        device,
        cpu_threads: 8,
        pinned: true,
        chunk_elems: 1 << 20,
        chunks: 16,
        kernel_iters: 100,
        t_gpu_ms: vec![80.0; pipelined.len()],
        t_cpu_ms: vec![80.0; pipelined.len()],
        t_serial_ms: vec![170.0; pipelined.len()],
        t_pipelined_ms: pipelined.to_vec(),
        t_copy_ms: 10.0,
        ..Measurements::default()
    }
}

#[test]
fn the_node_is_its_worst_gpu_and_reports_each_one() {
    let opts = SelfTestOptions::default();
    let report = combine(
        &opts,
        None,
        vec![
            Ok(measured(0, &[85.0, 86.0, 84.0])),
            Ok(measured(1, &[120.0, 118.0, 121.0])),
        ],
    );
    assert_eq!(report.per_gpu.len(), 2);
    assert_eq!(report.per_gpu[0].verdict, Some(OverlapVerdict::Verified));
    assert_eq!(report.per_gpu[1].verdict, Some(OverlapVerdict::Failed));
    assert!(report.per_gpu[1].efficiency_min <= report.per_gpu[1].efficiency_max);
    // GPU 1: (170 − 120) / (170 − 80) = 0.56 at the median.
    assert!((report.efficiency.unwrap() - 50.0 / 90.0).abs() < 1e-9);
    assert_eq!(report.verdict, OverlapVerdict::Failed);
    assert_eq!(report.runs, Some(3));
    assert!(report.pipelined_over_max.unwrap() > 1.4);
    let broken = combine(
        &opts,
        None,
        vec![Ok(measured(0, &[85.0])), Err("out of memory".into())],
    );
    assert_eq!(broken.verdict, OverlapVerdict::Untested);
    assert!(broken.error.unwrap().contains("GPU 1: out of memory"));
}

#[test]
fn the_node_plans_with_its_slowest_cpu_share() {
    // GPU 1 overlaps as well as GPU 0 but its share of cores updates four times slower
    // (the starved case): the node's verdict stays, its CPU rate is GPU 1's.
    let fast = measured(0, &[85.0, 86.0, 84.0]);
    let mut starved = measured(1, &[85.0, 86.0, 84.0]);
    starved.cpu_threads = 1;
    starved.t_cpu_ms = vec![320.0; 3];
    starved.t_serial_ms = vec![410.0; 3];
    starved.t_pipelined_ms = vec![325.0; 3];
    let report = combine(
        &SelfTestOptions::default(),
        None,
        vec![Ok(fast), Ok(starved)],
    );
    let rates: Vec<f64> = report
        .per_gpu
        .iter()
        .map(|g| g.cpu_update_rate.unwrap())
        .collect();
    assert!((rates[0] / rates[1] - 4.0).abs() < 1e-9, "{rates:?}");
    assert_eq!(report.cpu_update_rate, Some(rates[1]));
    assert_eq!(report.per_gpu[1].cpu_threads, Some(1));
    let elems = f64::from(16u32 * (1 << 20));
    assert!((rates[1] - elems / 0.320).abs() < 1.0);
}
