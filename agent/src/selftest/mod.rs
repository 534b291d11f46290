//! The overlap self-test: does a chunked CPU optimizer update really overlap GPU work on this
//! node, as the pod sees it?
//!
//! It measures, on the CUDA driver API (loaded at run time, so the binary runs anywhere):
//! host↔device bandwidth (pinned and pageable), the GPU rate of a backward-like kernel, the CPU
//! Adam update rate on every core of the pod's CPU set, and one K-chunk step run serially and
//! pipelined. Overlap efficiency is `(t_gpu + t_cpu − t_pipelined) / min(t_gpu, t_cpu)`.

pub mod adam;
mod cuda;
pub mod math;

use std::time::Instant;

use offload_api::report::{Bandwidths, SelfTestReport};

pub use math::{efficiency, verdict};

/// How to run the self-test.
#[derive(Clone, Debug)]
pub struct SelfTestOptions {
    /// Efficiency at or above which overlap is `verified`.
    pub threshold: f64,
    /// Number of chunks K.
    pub chunks: u32,
    /// fp32 elements per chunk.
    pub chunk_elems: usize,
    /// Timed repetitions of each schedule (the median is kept).
    pub repeats: u32,
    /// Use pageable host memory even when pinned memory is available (the memlock failure case).
    pub force_pageable: bool,
    /// Run the pipelined measurement with the serial schedule (to show the verdict fails).
    pub force_serial: bool,
    /// GPU kernels may read host memory directly through ATS (coherent nodes): measure with
    /// system-allocated memory instead of mapped pinned memory.
    pub coherent: bool,
}

impl Default for SelfTestOptions {
    fn default() -> Self {
        SelfTestOptions {
            threshold: 0.8,
            // 32 chunks (a layer-by-layer pipeline's depth) × 2 Mi fp32 = 256 MiB of gradients:
            // seconds to run, well under a GiB of GPU memory. With 8 chunks, pipeline fill and
            // drain alone cost about an eighth of the step on a balanced H200 node.
            chunks: 32,
            chunk_elems: 2 << 20,
            repeats: 5,
            force_pageable: false,
            force_serial: false,
            coherent: false,
        }
    }
}

/// Runs the self-test. Never panics: a node without CUDA or a GPU gets an `untested` report
/// with the reason.
pub fn run(options: &SelfTestOptions) -> SelfTestReport {
    let start = Instant::now();
    let mut report = match cuda::measure(options) {
        Ok(m) => m.into_report(options),
        Err(e) => SelfTestReport::untested(options.threshold, e.to_string()),
    };
    report.duration_ms = Some(start.elapsed().as_secs_f64() * 1e3);
    report
}

/// Raw measurements of one run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Measurements {
    /// Whether pinned host memory was used for the copied buffers.
    pub pinned: bool,
    /// Why pinned allocation failed, if it did.
    pub pinned_error: Option<String>,
    /// Bandwidths, GB/s.
    pub bandwidth: Bandwidths,
    /// Elements updated per chunk, and chunks.
    pub chunk_elems: usize,
    /// Chunks K.
    pub chunks: u32,
    /// Kernel iterations chosen so GPU and CPU work are comparable.
    pub kernel_iters: u32,
    /// GPU-only time of the K kernels, ms.
    pub t_gpu_ms: f64,
    /// CPU-only time of the K updates, ms.
    pub t_cpu_ms: f64,
    /// Serial step, ms.
    pub t_serial_ms: f64,
    /// Pipelined step, ms.
    pub t_pipelined_ms: f64,
}

impl Measurements {
    /// Turns measurements into the report's self-test section.
    pub fn into_report(self, options: &SelfTestOptions) -> SelfTestReport {
        let eff = efficiency(self.t_gpu_ms, self.t_cpu_ms, self.t_pipelined_ms);
        #[allow(clippy::cast_precision_loss)]
        let elems = self.chunk_elems as f64 * f64::from(self.chunks);
        let flop = elems * f64::from(self.kernel_iters) * cuda::FLOP_PER_ELEMENT_ITER;
        SelfTestReport {
            verdict: verdict(eff, options.threshold),
            threshold: options.threshold,
            efficiency: eff,
            pinned_memory: self.pinned,
            pinned_error: self.pinned_error,
            bandwidth: self.bandwidth,
            cpu_update_rate: (self.t_cpu_ms > 0.0).then(|| elems / (self.t_cpu_ms / 1e3)),
            gpu_flops: (self.t_gpu_ms > 0.0).then(|| flop / (self.t_gpu_ms / 1e3)),
            t_gpu_ms: Some(self.t_gpu_ms),
            t_cpu_ms: Some(self.t_cpu_ms),
            t_serial_ms: Some(self.t_serial_ms),
            t_pipelined_ms: Some(self.t_pipelined_ms),
            chunks: Some(self.chunks),
            duration_ms: None,
            error: None,
        }
    }
}
