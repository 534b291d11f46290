//! The CUDA handles the self-test runs on, each owned by a guard that frees it on drop:
//! context, module, device and host buffers, streams, events, and the two kernel launches.

use std::ffi::{CString, c_void};

use cudarc::driver::result::{self, stream::StreamKind};
use cudarc::driver::sys;

use super::{CudaError, PTX, device_count, drv};

/// The primary context of one GPU, current on this thread while alive.
pub(super) struct Context {
    pub(super) dev: sys::CUdevice,
}

impl Context {
    pub(super) fn new(device: usize) -> Result<Self, CudaError> {
        device_count()?;
        let ordinal = i32::try_from(device).map_err(|_| CudaError::NoDevice)?;
        let dev = result::device::get(ordinal).map_err(drv("cuDeviceGet"))?;
        // SAFETY: `dev` came from cuDeviceGet.
        let ctx =
            unsafe { result::primary_ctx::retain(dev) }.map_err(drv("cuDevicePrimaryCtxRetain"))?;
        // SAFETY: `ctx` is a live primary context.
        unsafe { result::ctx::set_current(ctx) }.map_err(drv("cuCtxSetCurrent"))?;
        Ok(Context { dev })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: balanced with the retain in `new`.
        let _ = unsafe { result::primary_ctx::release(self.dev) };
    }
}

pub(super) struct Module {
    pub(super) module: sys::CUmodule,
    pub(super) busy: sys::CUfunction,
    pub(super) copy: sys::CUfunction,
}

impl Module {
    pub(super) fn load() -> Result<Self, CudaError> {
        let ptx = CString::new(PTX).map_err(|_| CudaError::Driver {
            call: "PTX",
            error: "NUL in PTX".into(),
        })?;
        // SAFETY: a NUL-terminated PTX image; the context is current.
        let module = unsafe { result::module::load_data(ptx.as_ptr() as *const c_void) }
            .map_err(drv("cuModuleLoadData"))?;
        let get = |name: &str| {
            let cname = CString::new(name).map_err(|_| CudaError::Driver {
                call: "kernel name",
                error: name.into(),
            })?;
            // SAFETY: `module` is loaded.
            unsafe { result::module::get_function(module, cname) }
                .map_err(drv("cuModuleGetFunction"))
        };
        Ok(Module {
            module,
            busy: get("busy")?,
            copy: get("copy_f32")?,
        })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded in `load`, unloaded once.
        let _ = unsafe { result::module::unload(self.module) };
    }
}

pub(super) struct DeviceBuf {
    pub(super) ptr: sys::CUdeviceptr,
    pub(super) len: usize,
}

impl DeviceBuf {
    pub(super) fn new(len: usize) -> Result<Self, CudaError> {
        // SAFETY: plain allocation in the current context.
        let ptr = unsafe { result::malloc_sync(len * 4) }.map_err(drv("cuMemAlloc"))?;
        // SAFETY: `ptr` is `len * 4` bytes of device memory.
        unsafe { result::memset_d8_sync(ptr, 0, len * 4) }.map_err(drv("cuMemsetD8"))?;
        Ok(DeviceBuf { ptr, len })
    }

    pub(super) fn chunk(&self, i: usize, elems: usize) -> sys::CUdeviceptr {
        self.ptr + (i * elems * 4) as u64
    }
}

impl Drop for DeviceBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`, freed once.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// Host memory: page-locked (pinned, from the driver) or ordinary pageable memory.
pub(super) struct HostBuf {
    pub(super) ptr: *mut f32,
    pub(super) len: usize,
    pub(super) pinned: bool,
    pub(super) _pageable: Option<Vec<f32>>,
}

impl HostBuf {
    pub(super) fn pinned(len: usize, flags: u32) -> Result<Self, CudaError> {
        // SAFETY: allocation of `len * 4` bytes of page-locked memory.
        let ptr = unsafe { result::malloc_host(len * 4, flags) }.map_err(drv("cuMemHostAlloc"))?
            as *mut f32;
        // SAFETY: the allocation is `len` f32s long and exclusively ours.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(HostBuf {
            ptr,
            len,
            pinned: true,
            _pageable: None,
        })
    }

    pub(super) fn pageable(len: usize) -> Self {
        let mut v = vec![0.0f32; len];
        HostBuf {
            ptr: v.as_mut_ptr(),
            len,
            pinned: false,
            _pageable: Some(v),
        }
    }

    pub(super) fn slice(&self) -> &[f32] {
        // SAFETY: `ptr` points to `len` initialised f32s owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub(super) fn slice_mut(&mut self) -> &mut [f32] {
        // SAFETY: as above, and `&mut self` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        if self.pinned {
            // SAFETY: allocated with cuMemHostAlloc, freed once.
            let _ = unsafe { result::free_host(self.ptr as *mut c_void) };
        }
    }
}

pub(super) struct Stream(pub(super) sys::CUstream);

impl Stream {
    pub(super) fn new() -> Result<Self, CudaError> {
        result::stream::create(StreamKind::NonBlocking)
            .map(Stream)
            .map_err(drv("cuStreamCreate"))
    }

    pub(super) fn sync(&self) -> Result<(), CudaError> {
        // SAFETY: live stream.
        unsafe { result::stream::synchronize(self.0) }.map_err(drv("cuStreamSynchronize"))
    }

    pub(super) fn wait(&self, ev: &Event) -> Result<(), CudaError> {
        // SAFETY: live stream and event.
        unsafe {
            result::stream::wait_event(self.0, ev.0, sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT)
        }
        .map_err(drv("cuStreamWaitEvent"))
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { result::stream::destroy(self.0) };
    }
}

pub(super) struct Event(pub(super) sys::CUevent);

impl Event {
    pub(super) fn new() -> Result<Self, CudaError> {
        result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map(Event)
            .map_err(drv("cuEventCreate"))
    }

    pub(super) fn record(&self, s: &Stream) -> Result<(), CudaError> {
        // SAFETY: live event and stream.
        unsafe { result::event::record(self.0, s.0) }.map_err(drv("cuEventRecord"))
    }

    pub(super) fn sync(&self) -> Result<(), CudaError> {
        // SAFETY: live event.
        unsafe { result::event::synchronize(self.0) }.map_err(drv("cuEventSynchronize"))
    }

    pub(super) fn ms_since(&self, start: &Event) -> Result<f64, CudaError> {
        // SAFETY: both events recorded and complete.
        unsafe { result::event::elapsed(start.0, self.0) }
            .map(f64::from)
            .map_err(drv("cuEventElapsedTime"))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { result::event::destroy(self.0) };
    }
}

pub(super) const BLOCK: u32 = 256;

pub(super) fn grid(n: usize) -> u32 {
    u32::try_from(n.div_ceil(BLOCK as usize)).unwrap_or(u32::MAX)
}

pub(super) fn launch_busy(
    m: &Module,
    s: &Stream,
    ptr: sys::CUdeviceptr,
    n: usize,
    iters: u32,
) -> Result<(), CudaError> {
    let mut p = ptr;
    let mut n32 = u32::try_from(n).unwrap_or(u32::MAX);
    let mut it = iters;
    let mut params: [*mut c_void; 3] = [
        (&raw mut p).cast(),
        (&raw mut n32).cast(),
        (&raw mut it).cast(),
    ];
    // SAFETY: parameters match the kernel's signature; `ptr` holds `n` f32s.
    unsafe { result::launch_kernel(m.busy, (grid(n), 1, 1), (BLOCK, 1, 1), 0, s.0, &mut params) }
        .map_err(drv("cuLaunchKernel(busy)"))
}

pub(super) fn launch_copy(
    m: &Module,
    s: &Stream,
    dst: u64,
    src: u64,
    n: usize,
) -> Result<(), CudaError> {
    let (mut d, mut sp, mut n64) = (dst, src, n as u64);
    let mut params: [*mut c_void; 3] = [
        (&raw mut d).cast(),
        (&raw mut sp).cast(),
        (&raw mut n64).cast(),
    ];
    // SAFETY: parameters match the kernel; both pointers address `n` f32s the GPU can reach.
    unsafe { result::launch_kernel(m.copy, (1024, 1, 1), (BLOCK, 1, 1), 0, s.0, &mut params) }
        .map_err(drv("cuLaunchKernel(copy_f32)"))
}

pub(super) fn htod(dst: sys::CUdeviceptr, src: &[f32], s: &Stream) -> Result<(), CudaError> {
    // SAFETY: `dst` holds at least `src.len()` f32s; `src` outlives the stream's use of it
    // because every caller synchronises before the host buffer is dropped.
    unsafe { result::memcpy_htod_async(dst, src, s.0) }.map_err(drv("cuMemcpyHtoDAsync"))
}

pub(super) fn dtoh(dst: &mut [f32], src: sys::CUdeviceptr, s: &Stream) -> Result<(), CudaError> {
    // SAFETY: as above, in the other direction.
    unsafe { result::memcpy_dtoh_async(dst, src, s.0) }.map_err(drv("cuMemcpyDtoHAsync"))
}
