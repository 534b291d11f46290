//! The CPU optimizer update: Adam on fp32 state, on every core of the pod's CPU set.

use rayon::prelude::*;

/// Adam hyper-parameters (the common defaults).
#[derive(Clone, Copy, Debug)]
pub struct Adam {
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator epsilon.
    pub eps: f32,
    /// Step number (for bias correction), from 1.
    pub step: i32,
}

impl Default for Adam {
    fn default() -> Self {
        Adam {
            lr: 1e-4,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            step: 1,
        }
    }
}

/// Elements per parallel task: large enough to amortise scheduling, small enough to balance.
const TASK: usize = 64 * 1024;

/// Updates `params` in place from `grads`, keeping moments in `m` and `v`. The four slices must
/// have the same length; extra elements of longer slices are left alone.
pub fn update(opt: &Adam, params: &mut [f32], grads: &[f32], m: &mut [f32], v: &mut [f32]) {
    let bc1 = 1.0 - opt.beta1.powi(opt.step);
    let bc2 = 1.0 - opt.beta2.powi(opt.step);
    let step_size = opt.lr / bc1;
    let bc2_sqrt = bc2.sqrt();
    params
        .par_chunks_mut(TASK)
        .zip(grads.par_chunks(TASK))
        .zip(m.par_chunks_mut(TASK))
        .zip(v.par_chunks_mut(TASK))
        .for_each(|(((p, g), m), v)| {
            for i in 0..p.len().min(g.len()).min(m.len()).min(v.len()) {
                let gi = g[i];
                m[i] = opt.beta1 * m[i] + (1.0 - opt.beta1) * gi;
                v[i] = opt.beta2 * v[i] + (1.0 - opt.beta2) * gi * gi;
                let denom = v[i].sqrt() / bc2_sqrt + opt.eps;
                p[i] -= step_size * m[i] / denom;
            }
        });
}

/// Threads the update runs on: the pod's CPU set (rayon sizes its pool from the affinity mask).
pub fn threads() -> usize {
    rayon::current_num_threads()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_step_matches_the_formula() {
        let opt = Adam::default();
        let mut p = vec![1.0f32; 3];
        let g = vec![0.5f32, -0.5, 0.0];
        let mut m = vec![0.0f32; 3];
        let mut v = vec![0.0f32; 3];
        update(&opt, &mut p, &g, &mut m, &mut v);
        // First step: m̂ = g, v̂ = g², so the step is lr · sign(g) (for g ≠ 0).
        assert!((p[0] - (1.0 - 1e-4)).abs() < 1e-6, "{}", p[0]);
        assert!((p[1] - (1.0 + 1e-4)).abs() < 1e-6, "{}", p[1]);
        assert_eq!(p[2], 1.0);
    }

    #[test]
    fn parallel_and_serial_agree_on_a_large_buffer() {
        let n = 3 * TASK + 17;
        let g: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 - 48.0) / 100.0).collect();
        let (mut p1, mut m1, mut v1) = (vec![0.5f32; n], vec![0.0f32; n], vec![0.0f32; n]);
        update(&Adam::default(), &mut p1, &g, &mut m1, &mut v1);
        for i in [0, TASK - 1, TASK, n - 1] {
            let (mut p, mut m, mut v) = (vec![0.5f32], vec![0.0f32], vec![0.0f32]);
            update(&Adam::default(), &mut p, &g[i..=i], &mut m, &mut v);
            assert_eq!(p1[i], p[0], "element {i}");
        }
    }
}
