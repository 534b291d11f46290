//! The overlap self-test: does a chunked CPU optimizer update really overlap GPU work on this
//! node, as the pod sees it?
//!
//! It measures, on the CUDA driver API (loaded at run time, so the binary runs anywhere):
//! host↔device bandwidth (pinned and pageable), the GPU rate of a backward-like kernel, the CPU
//! Adam update rate, and one K-chunk step run serially and pipelined, repeated.
//!
//! The step is shaped like the offload step of a real job: [`SelfTestOptions::chunks`]
//! layer-sized chunks, each with milliseconds of GPU work ([`SelfTestOptions::chunk_ms`]) and a
//! CPU update sized from the Adam rate measured first, so a correct pipeline costs about
//! `max(t_gpu, t_cpu)` plus one chunk, and what is measured is the node, not the test's own
//! per-chunk overheads. On a node with several GPUs every GPU is tested at once, one rank per
//! GPU with its share of the pod's CPUs, as a job runs; the node's figure is its worst GPU.
//!
//! Overlap efficiency is `(t_gpu + t_cpu − t_pipelined) / min(t_gpu, t_cpu)`; the verdict
//! changes a published one only when the new median is clearly across the threshold
//! ([`math::hysteresis`]).

pub mod adam;
mod cuda;
pub mod math;

use std::time::Instant;

use offload_api::report::{Bandwidths, GpuSelfTest, OverlapVerdict, SelfTestReport};

pub use cuda::{CudaError, pin_probe};
pub use math::{efficiency, verdict};

/// How to run the self-test.
#[derive(Clone, Debug)]
pub struct SelfTestOptions {
    /// Efficiency at or above which overlap is `verified`.
    pub threshold: f64,
    /// How far past the threshold a new median must be to change a published verdict (the
    /// spread of the repetitions widens it).
    pub margin: f64,
    /// Number of chunks K (layers of a step).
    pub chunks: u32,
    /// Milliseconds of CPU update (and of GPU work) per chunk; sets the chunk size from the
    /// measured Adam rate.
    pub chunk_ms: f64,
    /// fp32 elements per chunk, overriding [`Self::chunk_ms`].
    pub chunk_elems: Option<usize>,
    /// Timed repetitions of each schedule (the median is kept, the spread reported).
    pub repeats: u32,
    /// Use pageable host memory even when pinned memory is available.
    pub force_pageable: bool,
    /// Run the pipelined measurement with the serial schedule (to show the verdict fails).
    pub force_serial: bool,
    /// GPU kernels may read host memory directly through ATS (coherent nodes): measure with
    /// system-allocated memory instead of mapped pinned memory.
    pub coherent: bool,
    /// Give this GPU's test a single CPU core (to show that a starved update fails).
    pub starve_gpu: Option<usize>,
}

impl Default for SelfTestOptions {
    fn default() -> Self {
        SelfTestOptions {
            threshold: 0.8,
            margin: math::DEFAULT_MARGIN,
            // 16 layer-sized chunks of about 4.5 ms: pipeline fill and drain cost about one
            // chunk (1/16 of the step); per-chunk launch and wake-up costs are small beside
            // 4.5 ms of work, unlike with sub-millisecond chunks.
            chunks: 16,
            chunk_ms: 4.5,
            chunk_elems: None,
            repeats: 5,
            force_pageable: false,
            force_serial: false,
            coherent: false,
            starve_gpu: None,
        }
    }
}

/// Smallest and largest chunk the sizing picks (fp32 elements).
pub const CHUNK_ELEMS: (usize, usize) = (1 << 20, 16 << 20);

/// Raw measurements of one GPU's run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Measurements {
    /// NVML/CUDA index of the GPU.
    pub device: u32,
    /// CPU threads its rank used.
    pub cpu_threads: usize,
    /// Whether pinned host memory was used for the copied buffers.
    pub pinned: bool,
    /// Why pinned allocation failed, if it did.
    pub pinned_error: Option<String>,
    /// Bandwidths, GB/s.
    pub bandwidth: Bandwidths,
    /// Elements updated per chunk.
    pub chunk_elems: usize,
    /// Chunks K.
    pub chunks: u32,
    /// Kernel iterations chosen so GPU and CPU work are comparable.
    pub kernel_iters: u32,
    /// Per repetition: GPU-only time of the K kernels, ms.
    pub t_gpu_ms: Vec<f64>,
    /// Per repetition: CPU-only time of the K updates, ms.
    pub t_cpu_ms: Vec<f64>,
    /// Per repetition: serial step, ms.
    pub t_serial_ms: Vec<f64>,
    /// Per repetition: pipelined step, ms.
    pub t_pipelined_ms: Vec<f64>,
    /// Time of the step's copies in the slower direction at the measured bandwidth, ms.
    pub t_copy_ms: f64,
}

impl Measurements {
    fn median(xs: &[f64]) -> f64 {
        math::median(xs.to_vec())
    }

    /// Efficiency of each repetition.
    pub fn efficiencies(&self) -> Vec<f64> {
        self.t_gpu_ms
            .iter()
            .zip(&self.t_cpu_ms)
            .zip(&self.t_serial_ms)
            .zip(&self.t_pipelined_ms)
            .filter_map(|(((g, c), s), p)| efficiency(*g, *c, self.t_copy_ms, *s, *p))
            .collect()
    }

    /// Median efficiency over the repetitions.
    pub fn efficiency(&self) -> Option<f64> {
        let e = self.efficiencies();
        (!e.is_empty()).then(|| math::median(e))
    }

    /// Lowest and highest efficiency of one repetition.
    pub fn spread(&self) -> Option<(f64, f64)> {
        let e = self.efficiencies();
        let lo = e.iter().copied().reduce(f64::min)?;
        let hi = e.iter().copied().reduce(f64::max)?;
        Some((lo, hi))
    }

    /// Optimizer elements per second the CPU updated (the median CPU-only step).
    fn cpu_update_rate(&self) -> Option<f64> {
        let t_cpu = Self::median(&self.t_cpu_ms);
        #[allow(clippy::cast_precision_loss)]
        let elems = self.chunk_elems as f64 * f64::from(self.chunks);
        (t_cpu > 0.0).then(|| elems / (t_cpu / 1e3))
    }

    fn gpu_entry(&self, threshold: f64) -> GpuSelfTest {
        let spread = self.spread();
        GpuSelfTest {
            index: self.device,
            efficiency: self.efficiency(),
            verdict: Some(math::verdict(self.efficiency(), threshold)),
            efficiency_min: spread.map(|s| s.0),
            efficiency_max: spread.map(|s| s.1),
            t_gpu_ms: Some(Self::median(&self.t_gpu_ms)),
            t_cpu_ms: Some(Self::median(&self.t_cpu_ms)),
            t_pipelined_ms: Some(Self::median(&self.t_pipelined_ms)),
            t_serial_ms: Some(Self::median(&self.t_serial_ms)),
            cpu_threads: u32::try_from(self.cpu_threads).ok(),
            cpu_update_rate: self.cpu_update_rate(),
            error: None,
        }
    }

    /// Turns one GPU's measurements into the report's self-test section, the verdict decided
    /// with the previous published one (hysteresis).
    pub fn into_report(
        self,
        options: &SelfTestOptions,
        previous: Option<OverlapVerdict>,
    ) -> SelfTestReport {
        let eff = self.efficiency();
        let spread = self.spread();
        let (t_gpu, t_cpu) = (Self::median(&self.t_gpu_ms), Self::median(&self.t_cpu_ms));
        let (t_serial, t_pipe) = (
            Self::median(&self.t_serial_ms),
            Self::median(&self.t_pipelined_ms),
        );
        #[allow(clippy::cast_precision_loss)]
        let elems = self.chunk_elems as f64 * f64::from(self.chunks);
        let flop = elems * f64::from(self.kernel_iters) * cuda::FLOP_PER_ELEMENT_ITER;
        let (verdict, basis) =
            math::hysteresis(previous, eff, spread, options.threshold, options.margin);
        let longer = t_gpu.max(t_cpu).max(self.t_copy_ms);
        let cpu_update_rate = self.cpu_update_rate();
        SelfTestReport {
            verdict,
            threshold: options.threshold,
            efficiency: eff,
            pinned_memory: self.pinned,
            pinned_error: self.pinned_error,
            bandwidth: self.bandwidth,
            cpu_update_rate,
            cpu_threads: u32::try_from(self.cpu_threads).ok(),
            gpu_flops: (t_gpu > 0.0).then(|| flop / (t_gpu / 1e3)),
            t_gpu_ms: Some(t_gpu),
            t_cpu_ms: Some(t_cpu),
            t_serial_ms: Some(t_serial),
            t_pipelined_ms: Some(t_pipe),
            chunks: Some(self.chunks),
            chunk_elems: u64::try_from(self.chunk_elems).ok(),
            t_copy_ms: (self.t_copy_ms > 0.0).then_some(self.t_copy_ms),
            duration_ms: None,
            error: None,
            runs: u32::try_from(self.t_pipelined_ms.len()).ok(),
            efficiency_min: spread.map(|s| s.0),
            efficiency_max: spread.map(|s| s.1),
            pipelined_over_max: (longer > 0.0 && t_pipe > 0.0).then(|| t_pipe / longer),
            serial_over_pipelined: (t_pipe > 0.0).then(|| t_serial / t_pipe),
            verdict_basis: Some(basis),
            measured_at: Some(jiff::Timestamp::now().to_string()),
            postponed: None,
            per_gpu: Vec::new(),
        }
    }
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is this thread; the size matches the set.
    let ok =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if ok != 0 {
        return (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: reading a bit of an initialised set.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// Splits CPUs into `n` contiguous shares, one per GPU rank (the larger shares first).
pub fn split_cpus(cpus: &[usize], n: usize) -> Vec<Vec<usize>> {
    let n = n.max(1);
    let base = cpus.len() / n;
    let extra = cpus.len() % n;
    let mut out = Vec::with_capacity(n);
    let mut at = 0;
    for i in 0..n {
        let take = (base + usize::from(i < extra))
            .max(1)
            .min(cpus.len().saturating_sub(at).max(1));
        let end = (at + take).min(cpus.len());
        let share = if at < end {
            cpus[at..end].to_vec()
        } else {
            cpus.last().map(|c| vec![*c]).unwrap_or_default()
        };
        out.push(share);
        at = end;
    }
    out
}

/// Reads a kernel CPU list (`0-15,32-47`, sysfs `local_cpulist`); `None` when malformed.
pub fn parse_cpulist(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<usize>().ok()?, hi.parse::<usize>().ok()?),
            None => {
                let c = part.parse::<usize>().ok()?;
                (c, c)
            }
        };
        // A CPU number past the kernel's set size is not a CPU.
        if lo > hi || hi >= libc::CPU_SETSIZE as usize {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// The CPUs local to each GPU (its NUMA node's, from sysfs), where the driver and sysfs say.
pub fn gpu_local_cpus(gpus: usize) -> Vec<Option<Vec<usize>>> {
    (0..gpus)
        .map(|d| {
            let address = cuda::pci_address(d).ok()?;
            let text =
                std::fs::read_to_string(format!("/sys/bus/pci/devices/{address}/local_cpulist"))
                    .ok()?;
            parse_cpulist(&text)
        })
        .collect()
}

/// One share of `allowed` per GPU, as a pod on each GPU would get them: GPUs of one NUMA node
/// split that node's allowed CPUs between them; GPUs whose locality is unknown, or whose node
/// has none of the allowed CPUs, split what no NUMA node claimed (all of `allowed` when nothing
/// is left). On a node of one NUMA node every GPU reports the same set and this is the even
/// split. Shares never overlap unless there are more GPUs than CPUs.
pub fn split_by_locality(allowed: &[usize], local: &[Option<Vec<usize>>]) -> Vec<Vec<usize>> {
    let n = local.len();
    let mut shares: Vec<Vec<usize>> = vec![Vec::new(); n];
    // GPUs grouped by their local CPUs (restricted to the allowed ones).
    let mut groups: Vec<(Vec<usize>, Vec<usize>)> = Vec::new();
    let mut unplaced = Vec::new();
    for (gpu, cpus) in local.iter().enumerate() {
        let mine: Vec<usize> = cpus
            .as_ref()
            .map(|c| c.iter().copied().filter(|c| allowed.contains(c)).collect())
            .unwrap_or_default();
        if mine.is_empty() {
            unplaced.push(gpu);
        } else if let Some(g) = groups.iter_mut().find(|(set, _)| *set == mine) {
            g.1.push(gpu);
        } else {
            groups.push((mine, vec![gpu]));
        }
    }
    let mut claimed: Vec<usize> = Vec::new();
    for (set, gpus) in &groups {
        // Sets of different nodes do not overlap; should they, the later GPUs take what is
        // left of theirs.
        let free: Vec<usize> = set
            .iter()
            .copied()
            .filter(|c| !claimed.contains(c))
            .collect();
        let set = if free.is_empty() { set.clone() } else { free };
        for (gpu, share) in gpus.iter().zip(split_cpus(&set, gpus.len())) {
            shares[*gpu] = share;
        }
        claimed.extend(set);
    }
    if !unplaced.is_empty() {
        let rest: Vec<usize> = allowed
            .iter()
            .copied()
            .filter(|c| !claimed.contains(c))
            .collect();
        let rest = if rest.is_empty() {
            allowed.to_vec()
        } else {
            rest
        };
        for (gpu, share) in unplaced.iter().zip(split_cpus(&rest, unplaced.len())) {
            shares[*gpu] = share;
        }
    }
    shares
}

/// A thread pool of `cpus.len()` workers, each pinned to those CPUs.
fn pinned_pool(cpus: &[usize]) -> Result<rayon::ThreadPool, String> {
    let set = cpus.to_vec();
    rayon::ThreadPoolBuilder::new()
        .num_threads(cpus.len().max(1))
        .start_handler(move |_| {
            // SAFETY: building a set from CPU numbers and applying it to this thread.
            unsafe {
                let mut s: libc::cpu_set_t = std::mem::zeroed();
                for &c in &set {
                    libc::CPU_SET(c, &mut s);
                }
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &s);
            }
        })
        .build()
        .map_err(|e| format!("CPU thread pool: {e}"))
}

/// Runs the self-test on every GPU at once. Never panics: a node without CUDA or a GPU gets an
/// `untested` report with the reason.
pub fn run(options: &SelfTestOptions, previous: Option<OverlapVerdict>) -> SelfTestReport {
    let start = Instant::now();
    let mut report = match cuda::device_count() {
        Err(e) => SelfTestReport::untested(options.threshold, e.to_string()),
        Ok(n) => {
            let mut shares = split_by_locality(&allowed_cpus(), &gpu_local_cpus(n));
            if let Some(share) = options.starve_gpu.and_then(|g| shares.get_mut(g)) {
                share.truncate(1);
            }
            let results: Vec<Result<Measurements, String>> = std::thread::scope(|scope| {
                let handles: Vec<_> = shares
                    .iter()
                    .enumerate()
                    .map(|(device, cpus)| {
                        scope.spawn(move || {
                            let pool = pinned_pool(cpus)?;
                            pool.install(|| cuda::measure(options, device))
                                .map_err(|e| e.to_string())
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err("the test thread panicked".into()))
                    })
                    .collect()
            });
            combine(options, previous, results)
        }
    };
    report.duration_ms = Some(start.elapsed().as_secs_f64() * 1e3);
    report
}

/// The node's report from each GPU's result: the worst GPU's figures (a GPU that could not be
/// tested makes the node untested, with the reason).
fn combine(
    options: &SelfTestOptions,
    previous: Option<OverlapVerdict>,
    results: Vec<Result<Measurements, String>>,
) -> SelfTestReport {
    let n = results.len();
    let mut per_gpu = Vec::with_capacity(n);
    let mut worst: Option<Measurements> = None;
    let mut failed = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(m) => {
                per_gpu.push(m.gpu_entry(options.threshold));
                let lower = m.efficiency().unwrap_or(0.0)
                    < worst
                        .as_ref()
                        .and_then(Measurements::efficiency)
                        .unwrap_or(f64::INFINITY);
                if worst.is_none() || lower {
                    worst = Some(m);
                }
            }
            Err(e) => {
                per_gpu.push(GpuSelfTest {
                    index: u32::try_from(i).unwrap_or(u32::MAX),
                    efficiency: None,
                    verdict: Some(OverlapVerdict::Untested),
                    efficiency_min: None,
                    efficiency_max: None,
                    t_gpu_ms: None,
                    t_cpu_ms: None,
                    t_pipelined_ms: None,
                    t_serial_ms: None,
                    cpu_threads: None,
                    cpu_update_rate: None,
                    error: Some(e.clone()),
                });
                failed.push(format!("GPU {i}: {e}"));
            }
        }
    }
    let mut report = match (worst, failed.is_empty()) {
        (Some(m), true) => m.into_report(options, previous),
        (_, false) => SelfTestReport::untested(options.threshold, failed.join("; ")),
        (None, true) => SelfTestReport::untested(options.threshold, "no GPU was tested"),
    };
    if n > 1 {
        // A pod may land on any GPU: the rate the decision plans with is the slowest one's
        // (a GPU whose pod gets fewer cores updates less within the same GPU time).
        if report.error.is_none()
            && let Some(slowest) = per_gpu
                .iter()
                .filter_map(|g| g.cpu_update_rate.map(|r| (r, g)))
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .map(|(_, g)| g)
        {
            report.cpu_update_rate = slowest.cpu_update_rate;
            report.cpu_threads = slowest.cpu_threads;
        }
        report.per_gpu = per_gpu;
    }
    report
}

#[cfg(test)]
mod tests;
