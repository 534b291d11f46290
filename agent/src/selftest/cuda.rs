//! The GPU side of the self-test, on the raw CUDA driver API (cudarc, loaded at run time).
//!
//! The raw API is used on purpose: the schedule under test (which stream waits on which event,
//! when the host blocks) must be exactly the one written here, with nothing added for safety
//! bookkeeping. Every handle is owned by a guard that frees it on drop.

use std::time::Instant;

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys;
use offload_api::report::Bandwidths;

use super::adam::{self, Adam};
use super::math::{balance_iters, gbps};
use super::{Measurements, SelfTestOptions};

mod handles;
use handles::*;

/// FLOP per element per kernel iteration: four independent fused multiply-adds.
pub const FLOP_PER_ELEMENT_ITER: f64 = 8.0;

/// Two kernels in PTX, JIT-compiled by the driver for whatever GPU is present:
/// `busy` — a compute-bound, backward-like kernel (4 FMA chains per element, `iters` times);
/// `copy_f32` — a grid-stride copy, used with host pointers to measure direct host access.
const PTX: &str = include_str!("kernels.ptx");

/// Why the GPU part could not run.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// No libcuda on this node (or not mounted into the pod).
    #[error(
        "the CUDA driver library (libcuda.so.1) is not available: the GPU self-test needs the NVIDIA driver mounted into the pod"
    )]
    NoLibrary,
    /// No GPU visible.
    #[error("no CUDA device is visible to the pod")]
    NoDevice,
    /// A driver call failed.
    #[error("{call}: {error}")]
    Driver {
        /// The call.
        call: &'static str,
        /// The driver's error.
        error: String,
    },
    /// Device memory for the test could not be had.
    #[error("not enough GPU memory for the self-test ({need_mib} MiB needed, {free_mib} MiB free)")]
    NoMemory {
        /// Needed.
        need_mib: usize,
        /// Free.
        free_mib: usize,
    },
}

fn drv(call: &'static str) -> impl FnOnce(DriverError) -> CudaError {
    move |e| CudaError::Driver {
        call,
        error: e
            .error_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("{e:?}")),
    }
}

/// GPUs the CUDA driver shows this process (the pod's allocation).
pub fn device_count() -> Result<usize, CudaError> {
    // SAFETY: checking for the library before any call keeps cudarc from panicking.
    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::NoLibrary);
    }
    result::init().map_err(drv("cuInit"))?;
    let n = result::device::get_count().map_err(drv("cuDeviceGetCount"))?;
    match usize::try_from(n) {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(CudaError::NoDevice),
    }
}

/// The PCI address of a GPU (`0000:17:00.0`), as sysfs names it.
pub fn pci_address(device: usize) -> Result<String, CudaError> {
    device_count()?;
    let ordinal = i32::try_from(device).map_err(|_| CudaError::NoDevice)?;
    let dev = result::device::get(ordinal).map_err(drv("cuDeviceGet"))?;
    let attr = |a| {
        // SAFETY: `dev` came from cuDeviceGet.
        unsafe { result::device::get_attribute(dev, a) }.map_err(drv("cuDeviceGetAttribute"))
    };
    use sys::CUdevice_attribute as A;
    let domain = attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?;
    let bus = attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?;
    let slot = attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?;
    Ok(format!("{domain:04x}:{bus:02x}:{slot:02x}.0"))
}

/// Everything one run needs, allocated once.
struct Rig {
    module: Module,
    compute: Stream,
    d2h: Stream,
    h2d: Stream,
    dev_grads: DeviceBuf,
    dev_params: DeviceBuf,
    host_grads: HostBuf,
    host_params: HostBuf,
    m: Vec<f32>,
    v: Vec<f32>,
    chunks: usize,
    elems: usize,
    iters: u32,
}

impl Rig {
    fn chunk_range(&self, i: usize) -> std::ops::Range<usize> {
        i * self.elems..(i + 1) * self.elems
    }

    fn cpu_update(&mut self, i: usize) {
        let r = self.chunk_range(i);
        let grads = &self.host_grads.slice()[r.clone()];
        let params = &mut self.host_params.slice_mut()[r.clone()];
        adam::update(
            &Adam::default(),
            params,
            grads,
            &mut self.m[r.clone()],
            &mut self.v[r],
        );
    }

    /// Queues chunk `i`'s GPU work on the compute stream.
    fn launch_chunk(&self, i: usize) -> Result<(), CudaError> {
        launch_busy(
            &self.module,
            &self.compute,
            self.dev_grads.chunk(i, self.elems),
            self.elems,
            self.iters,
        )
    }

    /// Queues the copy of chunk `i`'s gradients to the host on the device-to-host stream.
    fn grads_out(&mut self, i: usize) -> Result<(), CudaError> {
        let r = self.chunk_range(i);
        dtoh(
            &mut self.host_grads.slice_mut()[r],
            self.dev_grads.chunk(i, self.elems),
            &self.d2h,
        )
    }

    /// Queues the copy of chunk `i`'s updated parameters back on the host-to-device stream.
    fn params_back(&self, i: usize) -> Result<(), CudaError> {
        let r = self.chunk_range(i);
        htod(
            self.dev_params.chunk(i, self.elems),
            &self.host_params.slice()[r],
            &self.h2d,
        )
    }

    fn gpu_only(&self) -> Result<f64, CudaError> {
        let (start, end) = (Event::new()?, Event::new()?);
        start.record(&self.compute)?;
        for i in 0..self.chunks {
            self.launch_chunk(i)?;
        }
        end.record(&self.compute)?;
        end.sync()?;
        end.ms_since(&start)
    }

    fn cpu_only(&mut self) -> f64 {
        let t = Instant::now();
        for i in 0..self.chunks {
            self.cpu_update(i);
        }
        t.elapsed().as_secs_f64() * 1e3
    }

    /// GPU work, synchronise, copy all gradients out, CPU update, copy parameters back.
    fn serial(&mut self) -> Result<f64, CudaError> {
        let t = Instant::now();
        for i in 0..self.chunks {
            self.launch_chunk(i)?;
        }
        self.compute.sync()?;
        for i in 0..self.chunks {
            self.grads_out(i)?;
        }
        self.d2h.sync()?;
        for i in 0..self.chunks {
            self.cpu_update(i);
        }
        for i in 0..self.chunks {
            self.params_back(i)?;
        }
        self.h2d.sync()?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }

    /// Each chunk's gradient copied out on its own stream as soon as its kernel ends; the CPU
    /// updates chunk i while the GPU computes chunk i+1; parameters go back on a third stream;
    /// no global synchronise until the step ends.
    fn pipelined(&mut self) -> Result<f64, CudaError> {
        let done: Vec<Event> = (0..self.chunks)
            .map(|_| Event::new())
            .collect::<Result<_, _>>()?;
        let copied: Vec<Event> = (0..self.chunks)
            .map(|_| Event::new())
            .collect::<Result<_, _>>()?;
        let t = Instant::now();
        for i in 0..self.chunks {
            self.launch_chunk(i)?;
            done[i].record(&self.compute)?;
            self.d2h.wait(&done[i])?;
            // With pageable memory this call blocks the host until the copy is done, which is
            // exactly how overlap breaks when pinned memory is refused.
            self.grads_out(i)?;
            copied[i].record(&self.d2h)?;
        }
        for (i, ev) in copied.iter().enumerate() {
            ev.sync()?;
            self.cpu_update(i);
            self.params_back(i)?;
        }
        self.h2d.sync()?;
        self.compute.sync()?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }
}

/// Host-timed copy of `bytes` in one direction, best of three.
fn copy_bandwidth(
    dev: &DeviceBuf,
    host: &mut HostBuf,
    s: &Stream,
    to_device: bool,
) -> Result<Option<f64>, CudaError> {
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        if to_device {
            htod(dev.ptr, &host.slice()[..dev.len], s)?;
        } else {
            let n = dev.len;
            dtoh(&mut host.slice_mut()[..n], dev.ptr, s)?;
        }
        s.sync()?;
        best = best.min(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(gbps(dev.len * 4, best))
}

/// A GPU kernel reading (or writing) host memory directly: system memory through ATS on
/// coherent nodes, mapped pinned memory elsewhere.
fn direct_host(
    m: &Module,
    dev: &DeviceBuf,
    coherent: bool,
    s: &Stream,
) -> Result<(Option<f64>, Option<f64>), CudaError> {
    let n = dev.len;
    let mut system;
    let mapped;
    let host_ptr: u64 = if coherent {
        system = vec![1.0f32; n];
        system.as_mut_ptr() as u64
    } else {
        mapped = HostBuf::pinned(n, sys::CU_MEMHOSTALLOC_DEVICEMAP)?;
        // With unified addressing the host pointer of mapped pinned memory is valid on the GPU.
        mapped.ptr as u64
    };
    let time = |dst: u64, src: u64| -> Result<f64, CudaError> {
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let (a, b) = (Event::new()?, Event::new()?);
            a.record(s)?;
            launch_copy(m, s, dst, src, n)?;
            b.record(s)?;
            b.sync()?;
            best = best.min(b.ms_since(&a)?);
        }
        Ok(best)
    };
    let read = time(dev.ptr, host_ptr)?;
    let write = time(host_ptr, dev.ptr)?;
    Ok((gbps(n * 4, read), gbps(n * 4, write)))
}

/// The Adam rate of this thread pool, in elements per millisecond, on a probe buffer.
fn adam_rate() -> f64 {
    let n = 4 << 20;
    let (mut p, g, mut m, mut v) = (
        vec![0.5f32; n],
        vec![0.01f32; n],
        vec![0.0f32; n],
        vec![0.0f32; n],
    );
    adam::update(&Adam::default(), &mut p, &g, &mut m, &mut v);
    let t = Instant::now();
    for _ in 0..2 {
        adam::update(&Adam::default(), &mut p, &g, &mut m, &mut v);
    }
    #[allow(clippy::cast_precision_loss)]
    let per_ms = (2 * n) as f64 / (t.elapsed().as_secs_f64() * 1e3).max(1e-3);
    per_ms
}

/// Elements per chunk: `chunk_ms` of the measured Adam rate, bounded, a whole number of blocks.
fn chunk_elems(opt: &SelfTestOptions) -> usize {
    let wanted = opt.chunk_elems.unwrap_or_else(|| {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let e = (adam_rate() * opt.chunk_ms.max(0.1)) as usize;
        e
    });
    let (lo, hi) = super::CHUNK_ELEMS;
    let bounded = if opt.chunk_elems.is_some() {
        wanted.max(BLOCK as usize)
    } else {
        wanted.clamp(lo, hi)
    };
    bounded.div_ceil(BLOCK as usize) * BLOCK as usize
}

/// Host buffers for what crosses the bus: pinned unless refused (or forced off), and why not.
fn host_buffers(opt: &SelfTestOptions, total: usize) -> (HostBuf, HostBuf, Option<String>) {
    if opt.force_pageable {
        (
            HostBuf::pageable(total),
            HostBuf::pageable(total),
            Some("pageable memory forced (--force-pageable)".to_string()),
        )
    } else {
        match (HostBuf::pinned(total, 0), HostBuf::pinned(total, 0)) {
            (Ok(g), Ok(p)) => (g, p, None),
            (Err(e), _) | (_, Err(e)) => (
                HostBuf::pageable(total),
                HostBuf::pageable(total),
                Some(e.to_string()),
            ),
        }
    }
}

/// Copy bandwidths, pinned (always measured separately when available) and pageable, and a
/// kernel's direct access to host memory.
fn bandwidths(rig: &Rig, coherent: bool) -> Result<Bandwidths, CudaError> {
    let total = rig.chunks * rig.elems;
    let mut bandwidth = Bandwidths::default();
    let mut pageable = HostBuf::pageable(total);
    bandwidth.h2d_pageable = copy_bandwidth(&rig.dev_grads, &mut pageable, &rig.h2d, true)?;
    bandwidth.d2h_pageable = copy_bandwidth(&rig.dev_grads, &mut pageable, &rig.d2h, false)?;
    drop(pageable);
    if let Ok(mut p) = HostBuf::pinned(total, 0) {
        bandwidth.h2d_pinned = copy_bandwidth(&rig.dev_grads, &mut p, &rig.h2d, true)?;
        bandwidth.d2h_pinned = copy_bandwidth(&rig.dev_grads, &mut p, &rig.d2h, false)?;
    }
    let dev_one = DeviceBuf::new(rig.elems.min(total))?;
    match direct_host(&rig.module, &dev_one, coherent, &rig.compute) {
        Ok((r, w)) => {
            bandwidth.direct_host_read = r;
            bandwidth.direct_host_write = w;
        }
        Err(e) => tracing::warn!(error = %e, "direct host access not measured"),
    }
    drop(dev_one);
    Ok(bandwidth)
}

/// The step's copies in the slower direction, at the bandwidth of the memory used, in ms.
fn copy_ms(bandwidth: &Bandwidths, pinned: bool, total: usize) -> f64 {
    let (d2h, h2d) = if pinned {
        (bandwidth.d2h_pinned, bandwidth.h2d_pinned)
    } else {
        (bandwidth.d2h_pageable, bandwidth.h2d_pageable)
    };
    #[allow(clippy::cast_precision_loss)]
    let bytes = (total * 4) as f64;
    [d2h, h2d]
        .into_iter()
        .flatten()
        .filter(|gbps| *gbps > 0.0)
        .map(|gbps| bytes / (gbps * 1e9) * 1e3)
        .fold(0.0, f64::max)
}

impl Rig {
    /// The buffers of `chunks` chunks of `elems` each, on the device and the host, where the
    /// GPU has room for them (256 MiB kept free).
    fn new(
        opt: &SelfTestOptions,
        module: Module,
        chunks: usize,
        elems: usize,
    ) -> Result<(Rig, Option<String>), CudaError> {
        let total = chunks * elems;
        let (free, _) = result::mem_get_info().map_err(drv("cuMemGetInfo"))?;
        let need = total * 4 * 2;
        if need + (256 << 20) > free {
            return Err(CudaError::NoMemory {
                need_mib: need >> 20,
                free_mib: free >> 20,
            });
        }
        let (host_grads, host_params, pinned_error) = host_buffers(opt, total);
        let rig = Rig {
            module,
            compute: Stream::new()?,
            d2h: Stream::new()?,
            h2d: Stream::new()?,
            dev_grads: DeviceBuf::new(total)?,
            dev_params: DeviceBuf::new(total)?,
            host_grads,
            host_params,
            m: vec![0.0; total],
            v: vec![0.0; total],
            chunks,
            elems,
            iters: 256,
        };
        Ok((rig, pinned_error))
    }

    /// The timed repeats after one warm-up of each: GPU alone, CPU alone, serial, pipelined
    /// (serial again where the options force it), in ms.
    #[allow(clippy::type_complexity)]
    fn timed(
        &mut self,
        opt: &SelfTestOptions,
    ) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>), CudaError> {
        let (mut t_gpu, mut t_cpu, mut t_serial, mut t_pipe) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        self.serial()?;
        self.pipelined()?;
        for _ in 0..opt.repeats.max(1) {
            t_gpu.push(self.gpu_only()?);
            t_cpu.push(self.cpu_only());
            t_serial.push(self.serial()?);
            t_pipe.push(if opt.force_serial {
                self.serial()?
            } else {
                self.pipelined()?
            });
        }
        Ok((t_gpu, t_cpu, t_serial, t_pipe))
    }
}

/// Runs every measurement on GPU `device`, with the CPU threads of the current thread pool.
pub fn measure(opt: &SelfTestOptions, device: usize) -> Result<Measurements, CudaError> {
    let _ctx = Context::new(device)?;
    let module = Module::load()?;
    let chunks = opt.chunks.max(1) as usize;
    let elems = chunk_elems(opt);
    let total = chunks * elems;
    let (mut rig, pinned_error) = Rig::new(opt, module, chunks, elems)?;
    let pinned = rig.host_grads.pinned;

    let bandwidth = bandwidths(&rig, opt.coherent)?;

    let t_copy_ms = copy_ms(&bandwidth, pinned, total);

    // Warm up, then balance GPU work against the CPU update.
    rig.cpu_only();
    let t_cpu_probe = rig.cpu_only();
    let probe = rig.gpu_only()? / chunks as f64;
    rig.iters = balance_iters(t_cpu_probe, opt.chunks, rig.iters, probe);

    let (t_gpu, t_cpu, t_serial, t_pipe) = rig.timed(opt)?;
    tracing::info!(
        device,
        threads = adam::threads(),
        chunk_elems = elems,
        iters = rig.iters,
        "self-test measured"
    );
    Ok(Measurements {
        device: u32::try_from(device).unwrap_or(u32::MAX),
        cpu_threads: adam::threads(),
        pinned,
        pinned_error,
        bandwidth,
        chunk_elems: elems,
        chunks: opt.chunks.max(1),
        kernel_iters: rig.iters,
        t_gpu_ms: t_gpu,
        t_cpu_ms: t_cpu,
        t_serial_ms: t_serial,
        t_pipelined_ms: t_pipe,
        t_copy_ms,
    })
}

/// Pins `bytes` of host memory on GPU `device`'s context and frees it: whether the node lets a
/// pod page-lock host memory the way the rendered configuration (`pin_memory: true`) will.
pub fn pin_probe(device: usize, bytes: usize) -> Result<(), CudaError> {
    let _ctx = Context::new(device)?;
    let buf = HostBuf::pinned(bytes.div_ceil(4).max(1), 0)?;
    drop(buf);
    Ok(())
}
