//! A thin, checked layer over the CUDA driver API (cudarc's `sys` bindings, loaded at run time:
//! building needs no CUDA). Every call's result is checked and turned into a `CudaError` that
//! names the call. The `unsafe` here is FFI: each block states what the driver needs.

use cudarc::driver::sys::{self, CUdeviceptr, CUresult};
use std::ffi::{c_void, CStr};
use std::fmt;

mod launch;
pub use launch::{Function, Graph, KernelArgs, Module};

/// A failed driver call.
#[derive(Debug, Clone)]
pub struct CudaError {
    pub call: &'static str,
    pub code: String,
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CUDA {} failed: {}", self.call, self.code)
    }
}

impl std::error::Error for CudaError {}

pub type CudaResult<T> = Result<T, CudaError>;

fn check(call: &'static str, r: CUresult) -> CudaResult<()> {
    if r == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string (or leaves it null).
    let code = unsafe {
        if sys::cuGetErrorName(r, &mut name) == CUresult::CUDA_SUCCESS && !name.is_null() {
            CStr::from_ptr(name).to_string_lossy().into_owned()
        } else {
            format!("{r:?}")
        }
    };
    Err(CudaError { call, code })
}

/// Why the GPU cannot be used; each says it in one sentence.
#[derive(Debug, Clone)]
pub enum GpuError {
    /// libcuda.so is not on this machine.
    NoDriver,
    /// `cuInit` failed.
    DriverStart(CudaError),
    /// The driver sees no GPU.
    NoDevice,
    /// Another driver call failed.
    Call(CudaError),
}

impl fmt::Display for GpuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuError::NoDriver => write!(
                f,
                "the CUDA backend needs an NVIDIA GPU and its driver, and this machine has no CUDA driver (libcuda.so was not found)"
            ),
            GpuError::DriverStart(e) => {
                write!(f, "the CUDA driver is present but could not start ({e})")
            }
            GpuError::NoDevice => write!(f, "the CUDA driver is present but sees no GPU"),
            GpuError::Call(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for GpuError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            GpuError::DriverStart(e) | GpuError::Call(e) => Some(e),
            _ => None,
        }
    }
}

impl From<CudaError> for GpuError {
    fn from(e: CudaError) -> Self {
        GpuError::Call(e)
    }
}

/// The CLI's commands report errors as their message: `?` takes this one there.
impl From<GpuError> for String {
    fn from(e: GpuError) -> String {
        e.to_string()
    }
}

/// Whether this machine can run the CUDA backend; `Err` says why not.
pub fn probe() -> Result<(), GpuError> {
    // SAFETY: only tries to dlopen libcuda.
    if !unsafe { sys::is_culib_present() } {
        return Err(GpuError::NoDriver);
    }
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        check("cuInit", sys::cuInit(0)).map_err(GpuError::DriverStart)?;
        let mut n = 0;
        check("cuDeviceGetCount", sys::cuDeviceGetCount(&mut n))?;
        if n == 0 {
            return Err(GpuError::NoDevice);
        }
    }
    Ok(())
}

/// The GPU: its primary context made current on this thread, and one stream.
pub struct Gpu {
    _dev: sys::CUdevice,
    ctx: sys::CUcontext,
    pub stream: sys::CUstream,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub driver_version: i32,
    /// Streaming multiprocessors.
    pub sm_count: i32,
    /// Bytes of L2 cache.
    pub l2_bytes: i32,
    /// Launch every kernel with programmatic stream serialization (sm_90): it may start while
    /// the kernel before it still runs, and waits for it in-kernel (decode.cu's `pdl_wait`).
    pub dependent_launch: bool,
}

// SAFETY: the context is made current by `bind` on any thread that uses the Gpu; the driver
// API is thread-safe.
unsafe impl Send for Gpu {}

impl Gpu {
    pub fn open(ordinal: i32) -> Result<Gpu, GpuError> {
        probe()?;
        Ok(Gpu::open_checked(ordinal)?)
    }

    fn open_checked(ordinal: i32) -> CudaResult<Gpu> {
        // SAFETY: driver calls with valid out-pointers; the name buffer is 256 bytes as passed.
        unsafe {
            let mut dev = 0;
            check("cuDeviceGet", sys::cuDeviceGet(&mut dev, ordinal))?;
            let mut ctx = std::ptr::null_mut();
            check(
                "cuDevicePrimaryCtxRetain",
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
            )?;
            check("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx))?;
            let mut stream = std::ptr::null_mut();
            check("cuStreamCreate", sys::cuStreamCreate(&mut stream, 1))?;
            let mut buf = [0i8; 256];
            check(
                "cuDeviceGetName",
                sys::cuDeviceGetName(buf.as_mut_ptr() as _, 256, dev),
            )?;
            let name = CStr::from_ptr(buf.as_ptr() as _)
                .to_string_lossy()
                .into_owned();
            let attr = |a| -> CudaResult<i32> {
                let mut v = 0;
                check(
                    "cuDeviceGetAttribute",
                    sys::cuDeviceGetAttribute(&mut v, a, dev),
                )?;
                Ok(v)
            };
            use sys::CUdevice_attribute::*;
            let cc = (
                attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            );
            let sm_count = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
            let l2_bytes = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?;
            let mut driver_version = 0;
            check(
                "cuDriverGetVersion",
                sys::cuDriverGetVersion(&mut driver_version),
            )?;
            Ok(Gpu {
                _dev: dev,
                ctx,
                stream,
                name,
                compute_capability: cc,
                driver_version,
                sm_count,
                l2_bytes,
                dependent_launch: false,
            })
        }
    }

    /// Makes this GPU's context current on the calling thread (the daemon's engine thread).
    pub fn bind(&self) -> CudaResult<()> {
        // SAFETY: the context was retained in `open` and is released only in Drop.
        unsafe { check("cuCtxSetCurrent", sys::cuCtxSetCurrent(self.ctx)) }
    }

    /// Free and total device memory in bytes.
    pub fn memory(&self) -> CudaResult<(usize, usize)> {
        let (mut free, mut total) = (0, 0);
        // SAFETY: valid out-pointers.
        unsafe { check("cuMemGetInfo", sys::cuMemGetInfo_v2(&mut free, &mut total))? };
        Ok((free, total))
    }

    pub fn alloc(&self, bytes: usize) -> CudaResult<DeviceBuffer> {
        let mut ptr = 0;
        // SAFETY: valid out-pointer; a zero-byte request is rounded up (the driver refuses 0).
        unsafe { check("cuMemAlloc", sys::cuMemAlloc_v2(&mut ptr, bytes.max(256)))? };
        let b = DeviceBuffer { ptr, bytes };
        // SAFETY: `ptr` spans at least `bytes`.
        unsafe { check("cuMemsetD8", sys::cuMemsetD8_v2(ptr, 0, bytes.max(256)))? };
        Ok(b)
    }

    /// Pinned host memory that the GPU reads and writes directly (`cuMemHostAlloc` with
    /// DEVICEMAP), zeroed: the Jetson's one memory, or the flags' home on a discrete GPU.
    pub fn alloc_mapped(&self, bytes: usize) -> CudaResult<MappedHost> {
        let bytes_alloc = bytes.max(256);
        let mut host = std::ptr::null_mut();
        let mut dev = 0;
        // SAFETY: valid out-pointers; the host pointer is freed only in Drop.
        unsafe {
            check(
                "cuMemHostAlloc(DEVICEMAP)",
                sys::cuMemHostAlloc(
                    &mut host,
                    bytes_alloc,
                    sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
                ),
            )?;
            std::ptr::write_bytes(host as *mut u8, 0, bytes_alloc);
            check(
                "cuMemHostGetDevicePointer",
                sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0),
            )?;
        }
        Ok(MappedHost {
            host: host as *mut u8,
            dev,
            bytes,
        })
    }

    pub fn upload(&self, dst: CUdeviceptr, src: &[u8]) -> CudaResult<()> {
        // SAFETY: the caller's `dst` spans `src.len()` bytes of device memory.
        unsafe {
            check(
                "cuMemcpyHtoD",
                sys::cuMemcpyHtoD_v2(dst, src.as_ptr() as *const c_void, src.len()),
            )
        }
    }

    /// Queues a small host-to-device copy on the stream (the host buffer must stay put until
    /// the stream has run it: callers pass buffers they own for the engine's lifetime).
    pub fn upload_async(&self, dst: CUdeviceptr, src: &[u8]) -> CudaResult<()> {
        // SAFETY: as `upload`, and `src` outlives the queued copy (see above).
        unsafe {
            check(
                "cuMemcpyHtoDAsync",
                sys::cuMemcpyHtoDAsync_v2(
                    dst,
                    src.as_ptr() as *const c_void,
                    src.len(),
                    self.stream,
                ),
            )
        }
    }

    /// Queues a device-to-host copy; valid after `sync`.
    pub fn download_async(&self, dst: &mut [u8], src: CUdeviceptr) -> CudaResult<()> {
        // SAFETY: `src` spans `dst.len()` bytes; the caller syncs before reading `dst`.
        unsafe {
            check(
                "cuMemcpyDtoHAsync",
                sys::cuMemcpyDtoHAsync_v2(
                    dst.as_mut_ptr() as *mut c_void,
                    src,
                    dst.len(),
                    self.stream,
                ),
            )
        }
    }

    /// Queues a device-to-device copy on the stream.
    pub fn copy_d2d_async(
        &self,
        dst: CUdeviceptr,
        src: CUdeviceptr,
        bytes: usize,
    ) -> CudaResult<()> {
        // SAFETY: both ranges are device allocations of at least `bytes`.
        unsafe {
            check(
                "cuMemcpyDtoDAsync",
                sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.stream),
            )
        }
    }

    pub fn sync(&self) -> CudaResult<()> {
        // SAFETY: the stream lives as long as the Gpu.
        unsafe { check("cuStreamSynchronize", sys::cuStreamSynchronize(self.stream)) }
    }

    /// Queues zeroing `words` 32-bit words at `dst` on the stream.
    pub fn zero_async(&self, dst: CUdeviceptr, words: usize) -> CudaResult<()> {
        // SAFETY: the caller's `dst` spans `words` words of device memory.
        unsafe {
            check(
                "cuMemsetD32Async",
                sys::cuMemsetD32Async(dst, 0, words, self.stream),
            )
        }
    }

    /// A second stream, independent of the kernels' one (copies that feed a running kernel).
    pub fn side_stream(&self) -> CudaResult<SideStream> {
        let mut stream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the context is current (`open`/`bind`).
        unsafe { check("cuStreamCreate", sys::cuStreamCreate(&mut stream, 1))? };
        Ok(SideStream { stream })
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // The primary context stays retained for the life of the process: releasing it would
        // tear it down under anything else still using it (another engine, a bench run).
        // SAFETY: the stream is ours and nothing queued on it remains (callers sync).
        unsafe {
            sys::cuStreamSynchronize(self.stream);
            sys::cuStreamDestroy_v2(self.stream);
        }
    }
}

/// A non-blocking stream beside the kernels' one: a copy queued here does not wait for a
/// running kernel, and a flag written after it (`write_u32`) reaches memory only once the copy
/// is in, so the host never waits for the copy.
pub struct SideStream {
    stream: sys::CUstream,
}

// SAFETY: as Gpu's stream: used from one thread at a time, with the context made current there.
unsafe impl Send for SideStream {}

impl SideStream {
    /// Queues a copy of `len` bytes from pinned host memory at `src` to `dst`.
    ///
    /// # Safety
    /// `src` must be pinned (cuMemHostAlloc) and its `len` bytes must stay unchanged until the
    /// stream has run the copy (`sync`).
    pub unsafe fn copy_pinned(
        &self,
        dst: CUdeviceptr,
        src: *const u8,
        len: usize,
    ) -> CudaResult<()> {
        // SAFETY: the caller's contract above; `dst` spans `len` bytes of device memory.
        unsafe {
            check(
                "cuMemcpyHtoDAsync",
                sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, len, self.stream),
            )
        }
    }

    /// Queues a 32-bit store of `value` to `addr` (device or mapped host memory), after what is
    /// queued before it and behind a memory barrier.
    pub fn write_u32(&self, addr: CUdeviceptr, value: u32) -> CudaResult<()> {
        // SAFETY: the caller's `addr` is a 4-byte aligned word the GPU can write.
        unsafe {
            check(
                "cuStreamWriteValue32",
                sys::cuStreamWriteValue32_v2(self.stream, addr, value, 0),
            )
        }
    }

    pub fn sync(&self) -> CudaResult<()> {
        // SAFETY: the stream lives as long as self.
        unsafe { check("cuStreamSynchronize", sys::cuStreamSynchronize(self.stream)) }
    }
}

impl Drop for SideStream {
    fn drop(&mut self) {
        // SAFETY: the stream is ours; what is queued on it is finished first.
        unsafe {
            sys::cuStreamSynchronize(self.stream);
            sys::cuStreamDestroy_v2(self.stream);
        }
    }
}

/// Device memory, freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer {
    pub ptr: CUdeviceptr,
    pub bytes: usize,
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc, freed once.
        unsafe {
            sys::cuMemFree_v2(self.ptr);
        }
    }
}

/// Pinned, device-mapped host memory: `host` for the CPU, `dev` for kernels; freed on drop.
#[derive(Debug)]
pub struct MappedHost {
    pub host: *mut u8,
    pub dev: CUdeviceptr,
    pub bytes: usize,
}

// SAFETY: plain memory; concurrent access is governed by the users (flags use atomics).
unsafe impl Send for MappedHost {}
unsafe impl Sync for MappedHost {}

impl MappedHost {
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `host` spans `bytes` bytes for the life of self; &mut self gives exclusivity
        // on the CPU side (a kernel must not be writing while the slice is used).
        unsafe { std::slice::from_raw_parts_mut(self.host, self.bytes) }
    }
}

impl Drop for MappedHost {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc, freed once.
        unsafe {
            sys::cuMemFreeHost(self.host as *mut c_void);
        }
    }
}
