//! The self-test's arithmetic, kept apart so it is unit-tested without a GPU.

use offload_api::report::OverlapVerdict;

/// Overlap efficiency: the share of what a pipeline can hide that it did hide,
/// `(t_serial − t_pipelined) / (t_serial − max(t_gpu, t_cpu, t_copy))`. The serial step costs
/// the sum of GPU work, copies and CPU update; a pipeline that overlaps them all costs only the
/// longest of them. 1 when the pipelined step costs that maximum, 0 when it costs the sum.
/// Clamped to [0, 1] (timing noise can push it slightly outside); `None` for unusable inputs
/// (including a serial step no longer than its longest part, which leaves nothing to hide).
pub fn efficiency(
    t_gpu: f64,
    t_cpu: f64,
    t_copy: f64,
    t_serial: f64,
    t_pipelined: f64,
) -> Option<f64> {
    let all = [t_gpu, t_cpu, t_copy, t_serial, t_pipelined];
    if all.iter().any(|t| !t.is_finite() || *t < 0.0) || t_pipelined <= 0.0 {
        return None;
    }
    let longest = t_gpu.max(t_cpu).max(t_copy);
    let hideable = t_serial - longest;
    if longest <= 0.0 || hideable <= 0.0 {
        return None;
    }
    Some(((t_serial - t_pipelined) / hideable).clamp(0.0, 1.0))
}

/// `verified` at or above the threshold, `failed` below it, `untested` without a figure.
pub fn verdict(efficiency: Option<f64>, threshold: f64) -> OverlapVerdict {
    match efficiency {
        Some(e) if e >= threshold => OverlapVerdict::Verified,
        Some(_) => OverlapVerdict::Failed,
        None => OverlapVerdict::Untested,
    }
}

/// The smallest distance from the threshold at which a new measurement changes a published
/// verdict; the measured spread widens it.
pub const DEFAULT_MARGIN: f64 = 0.05;

/// The verdict to publish, and why: a measurement changes the previous verdict only when it is
/// clearly on the other side of the threshold — by [`DEFAULT_MARGIN`] or by half the spread of
/// its repetitions, whichever is wider. Inside that band the previous verdict stands; without
/// one (the first measurement), the median decides and the basis says it was close.
pub fn hysteresis(
    previous: Option<OverlapVerdict>,
    median: Option<f64>,
    spread: Option<(f64, f64)>,
    threshold: f64,
    margin: f64,
) -> (OverlapVerdict, String) {
    let Some(e) = median else {
        return (
            OverlapVerdict::Untested,
            "no efficiency was measured".to_string(),
        );
    };
    let half_spread = spread.map_or(0.0, |(lo, hi)| (hi - lo).abs() / 2.0);
    let band = margin.max(half_spread);
    let range = spread.map_or_else(String::new, |(lo, hi)| format!(" ({lo:.2}–{hi:.2})"));
    if e >= threshold + band {
        (
            OverlapVerdict::Verified,
            format!("{e:.2}{range} is clear of the threshold {threshold:.2} (±{band:.2})"),
        )
    } else if e < threshold - band {
        (
            OverlapVerdict::Failed,
            format!("{e:.2}{range} is clearly below the threshold {threshold:.2} (±{band:.2})"),
        )
    } else {
        match previous {
            Some(v @ (OverlapVerdict::Verified | OverlapVerdict::Failed)) => (
                v,
                format!(
                    "kept {}: {e:.2}{range} is within ±{band:.2} of the threshold {threshold:.2}, too close to change it",
                    v
                ),
            ),
            _ => {
                let v = verdict(Some(e), threshold);
                (
                    v,
                    format!(
                        "first measurement, {e:.2}{range}, within ±{band:.2} of the threshold {threshold:.2}: {} until a clearer one",
                        v
                    ),
                )
            }
        }
    }
}

/// GB/s for `bytes` moved in `ms` milliseconds.
pub fn gbps(bytes: usize, ms: f64) -> Option<f64> {
    #[allow(clippy::cast_precision_loss)]
    let b = bytes as f64;
    (ms > 0.0 && ms.is_finite()).then(|| b / (ms / 1e3) / 1e9)
}

/// The median of a non-empty set of timings.
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

/// Kernel iterations that make the K GPU kernels take about as long as the CPU update, given
/// the time one calibration run of `probe_iters` took. Bounded so a broken timing never asks
/// for an absurd kernel.
pub fn balance_iters(t_cpu_ms: f64, chunks: u32, probe_iters: u32, probe_ms_per_chunk: f64) -> u32 {
    if probe_ms_per_chunk <= 0.0 || !probe_ms_per_chunk.is_finite() || t_cpu_ms <= 0.0 {
        return probe_iters;
    }
    let per_iter = probe_ms_per_chunk / f64::from(probe_iters);
    let want = t_cpu_ms / f64::from(chunks.max(1)) / per_iter;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let iters = want.round().clamp(16.0, f64::from(1u32 << 22)) as u32;
    iters
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perfect_overlap_is_one_and_none_is_zero() {
        // GPU 100, CPU 80, copies 20: serial 200, the longest part 100.
        assert_eq!(efficiency(100.0, 80.0, 20.0, 200.0, 100.0), Some(1.0));
        assert_eq!(efficiency(100.0, 80.0, 20.0, 200.0, 200.0), Some(0.0));
        let half = efficiency(100.0, 80.0, 20.0, 200.0, 150.0).unwrap();
        assert!((half - 0.5).abs() < 1e-12);
        // The H200 shape (medians of a recorded run): serial 152.5, pipelined 74.5.
        let h200 = efficiency(55.2, 58.3, 19.5, 152.5, 74.5).unwrap();
        assert!((h200 - 0.828).abs() < 0.005, "{h200}");
        // Copies longer than either side: the pipeline can do no better than the copies.
        assert_eq!(efficiency(10.0, 10.0, 50.0, 70.0, 50.0), Some(1.0));
    }

    #[test]
    fn noise_is_clamped_and_nonsense_is_none() {
        assert_eq!(efficiency(100.0, 80.0, 20.0, 200.0, 95.0), Some(1.0));
        assert_eq!(efficiency(100.0, 80.0, 20.0, 200.0, 250.0), Some(0.0));
        assert_eq!(efficiency(0.0, 0.0, 0.0, 80.0, 80.0), None);
        assert_eq!(efficiency(100.0, f64::NAN, 0.0, 200.0, 80.0), None);
        assert_eq!(efficiency(100.0, 80.0, 0.0, 200.0, 0.0), None);
        assert_eq!(
            efficiency(100.0, 80.0, 0.0, 90.0, 95.0),
            None,
            "nothing to hide"
        );
    }

    #[test]
    fn verdict_compares_with_the_threshold() {
        assert_eq!(verdict(Some(0.8), 0.8), OverlapVerdict::Verified);
        assert_eq!(verdict(Some(0.79), 0.8), OverlapVerdict::Failed);
        assert_eq!(verdict(None, 0.8), OverlapVerdict::Untested);
    }

    /// A verdict changes only on a measurement clearly across the threshold.
    #[test]
    fn hysteresis_keeps_the_verdict_near_the_threshold() {
        use OverlapVerdict::*;
        let t = 0.8;
        let m = DEFAULT_MARGIN;
        // (previous, median, spread) → verdict
        let cases = [
            (None, Some(0.92), Some((0.90, 0.94)), Verified),
            (None, Some(0.70), Some((0.68, 0.72)), Failed),
            (Some(Failed), Some(0.81), Some((0.79, 0.83)), Failed),
            (Some(Verified), Some(0.78), Some((0.76, 0.80)), Verified),
            (Some(Verified), Some(0.74), Some((0.73, 0.75)), Failed),
            (Some(Failed), Some(0.86), Some((0.85, 0.87)), Verified),
            // A wide spread widens the band: 0.88 with 0.70–1.00 is not clear of 0.80.
            (Some(Failed), Some(0.88), Some((0.70, 1.00)), Failed),
            (None, Some(0.81), None, Verified),
            (Some(Untested), Some(0.79), None, Failed),
            (Some(Verified), None, None, Untested),
        ];
        for (previous, median, spread, want) in cases {
            let (got, basis) = hysteresis(previous, median, spread, t, m);
            assert_eq!(got, want, "{previous:?} {median:?} {spread:?}: {basis}");
            assert!(!basis.is_empty());
        }
        let (_, basis) = hysteresis(Some(Verified), Some(0.78), None, t, m);
        assert!(basis.starts_with("kept verified"), "{basis}");
    }

    #[test]
    fn helpers() {
        assert_eq!(gbps(1_000_000_000, 1000.0), Some(1.0));
        assert_eq!(gbps(1, 0.0), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        // 8 chunks, CPU 80 ms → 10 ms a chunk; the probe ran 1000 iterations in 2 ms.
        assert_eq!(balance_iters(80.0, 8, 1000, 2.0), 5000);
        assert_eq!(balance_iters(80.0, 8, 1000, 0.0), 1000);
        assert_eq!(balance_iters(1e12, 8, 1, 1.0), 1 << 22);
    }
}
