//! A thin, checked layer over the CUDA driver API (cudarc's `sys` bindings, loaded at run time:
//! building needs no CUDA). Every call's result is checked and turned into a `CudaError` that
//! names the call. The `unsafe` here is FFI: each block states what the driver needs.

use cudarc::driver::sys::{self, CUdeviceptr, CUresult};
use std::ffi::{c_void, CStr, CString};
use std::fmt;

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

    /// Loads a PTX module (JIT-compiled by the driver for this GPU).
    pub fn load_module(&self, ptx: &str) -> CudaResult<Module> {
        let text = CString::new(ptx).expect("PTX has no NUL bytes");
        let mut m = std::ptr::null_mut();
        // SAFETY: `text` is a NUL-terminated PTX image that outlives the call.
        unsafe {
            check(
                "cuModuleLoadData",
                sys::cuModuleLoadData(&mut m, text.as_ptr() as *const c_void),
            )?
        };
        Ok(Module(m))
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

    /// Launches `f` on the stream. `args` are the kernel's parameters in order.
    pub fn launch(
        &self,
        f: Function,
        grid: u32,
        block: u32,
        args: &mut KernelArgs,
    ) -> CudaResult<()> {
        self.launch_shared(f, grid, block, 0, args)
    }

    /// `launch` with `shared` bytes of dynamic shared memory.
    pub fn launch_shared(
        &self,
        f: Function,
        grid: u32,
        block: u32,
        shared: u32,
        args: &mut KernelArgs,
    ) -> CudaResult<()> {
        let mut ptrs = args.pointers();
        if self.dependent_launch {
            return self.launch_ex(f, grid, block, shared, 0, &mut ptrs);
        }
        // SAFETY: every pointer in `ptrs` points at a live 8-byte slot holding the parameter in
        // its first bytes (little-endian), which is how the driver reads parameters of 4 or 8
        // bytes; the kernel's signature is matched by the caller (firmware/backend/cuda/mod.rs).
        unsafe {
            check(
                "cuLaunchKernel",
                sys::cuLaunchKernel(
                    f.0,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    shared,
                    self.stream,
                    ptrs.as_mut_ptr(),
                    std::ptr::null_mut(),
                ),
            )
        }
    }

    /// `launch` as clusters of `cluster` consecutive blocks (sm_90: thread block clusters,
    /// whose blocks run at once and share their shared memory); `grid` is a multiple of it.
    pub fn launch_cluster(
        &self,
        f: Function,
        grid: u32,
        block: u32,
        cluster: u32,
        args: &mut KernelArgs,
    ) -> CudaResult<()> {
        let mut ptrs = args.pointers();
        self.launch_ex(f, grid, block, 0, cluster, &mut ptrs)
    }

    /// Clusters of `cluster` blocks of `f` (`block` threads) the GPU runs at once.
    pub fn max_active_clusters(&self, f: Function, block: u32, cluster: u32) -> CudaResult<u32> {
        let mut attrs = launch_attributes(false, cluster);
        let config = self.launch_config(cluster, block, 0, &mut attrs);
        let mut n = 0;
        // SAFETY: a valid function handle, a config whose attributes live across the call, and
        // an out-pointer.
        unsafe {
            check(
                "cuOccupancyMaxActiveClusters",
                sys::cuOccupancyMaxActiveClusters(&mut n, f.0, &config),
            )?;
        }
        Ok(n.max(0) as u32)
    }

    fn launch_config(
        &self,
        grid: u32,
        block: u32,
        shared: u32,
        attrs: &mut (usize, [sys::CUlaunchAttribute; 2]),
    ) -> sys::CUlaunchConfig {
        sys::CUlaunchConfig {
            gridDimX: grid,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: shared,
            hStream: self.stream,
            attrs: attrs.1.as_mut_ptr(),
            numAttrs: attrs.0 as u32,
        }
    }

    /// `launch_shared` through `cuLaunchKernelEx`: with the programmatic-stream-serialization
    /// attribute where `dependent_launch` is set, and as clusters of `cluster` blocks (0: none).
    /// A path of its own: `cuLaunchKernelEx` came with CUDA 11.8, so the plain launch stays
    /// `cuLaunchKernel`, which older drivers have too (JetPack 5 ships CUDA 11.4).
    fn launch_ex(
        &self,
        f: Function,
        grid: u32,
        block: u32,
        shared: u32,
        cluster: u32,
        ptrs: &mut [*mut c_void; 32],
    ) -> CudaResult<()> {
        let mut attrs = launch_attributes(self.dependent_launch, cluster);
        let config = self.launch_config(grid, block, shared, &mut attrs);
        // SAFETY: as `launch_shared`'s parameters; `config` and the attributes it points at live
        // until the call returns (the driver copies them).
        unsafe {
            check(
                "cuLaunchKernelEx",
                sys::cuLaunchKernelEx(&config, f.0, ptrs.as_mut_ptr(), std::ptr::null_mut()),
            )
        }
    }

    /// A cooperative launch of `f` (every block resident at once, so a grid-wide barrier is
    /// valid); the driver refuses a grid larger than fits.
    pub fn launch_cooperative(
        &self,
        f: Function,
        grid: u32,
        block: u32,
        shared: u32,
        args: &mut KernelArgs,
    ) -> CudaResult<()> {
        let mut ptrs = args.pointers();
        // SAFETY: as `launch_shared`.
        unsafe {
            check(
                "cuLaunchCooperativeKernel",
                sys::cuLaunchCooperativeKernel(
                    f.0,
                    grid,
                    1,
                    1,
                    block,
                    1,
                    1,
                    shared,
                    self.stream,
                    ptrs.as_mut_ptr(),
                ),
            )
        }
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

    /// How many blocks of `block` threads and `shared` dynamic shared bytes of `f` fit on one
    /// multiprocessor at once (registers, shared memory and threads all counted).
    pub fn blocks_per_sm(&self, f: Function, block: u32, shared: usize) -> CudaResult<u32> {
        let mut n = 0;
        // SAFETY: a valid function handle and an out-pointer.
        unsafe {
            check(
                "cuOccupancyMaxActiveBlocksPerMultiprocessor",
                sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, f.0, block as i32, shared),
            )?;
        }
        Ok(n.max(0) as u32)
    }

    /// Records every launch made by `body` on the stream into a graph instead of running it.
    pub fn capture(&self, body: impl FnOnce() -> CudaResult<()>) -> CudaResult<Graph> {
        // SAFETY: the stream is ours; capture is ended on this thread whatever `body` returns.
        unsafe {
            check(
                "cuStreamBeginCapture",
                sys::cuStreamBeginCapture_v2(
                    self.stream,
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                ),
            )?;
            let recorded = body();
            let mut graph = std::ptr::null_mut();
            let ended = check(
                "cuStreamEndCapture",
                sys::cuStreamEndCapture(self.stream, &mut graph),
            );
            recorded?;
            ended?;
            let mut exec = std::ptr::null_mut();
            let made = check(
                "cuGraphInstantiate",
                sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0),
            );
            check("cuGraphDestroy", sys::cuGraphDestroy(graph))?;
            made?;
            Ok(Graph(exec))
        }
    }

    pub fn launch_graph(&self, g: &Graph) -> CudaResult<()> {
        // SAFETY: the graph was instantiated on this context and lives until Drop.
        unsafe { check("cuGraphLaunch", sys::cuGraphLaunch(g.0, self.stream)) }
    }

    /// Milliseconds the stream takes to run `body`'s work (CUDA events around it).
    pub fn time_ms(&self, body: impl FnOnce() -> CudaResult<()>) -> CudaResult<f32> {
        // SAFETY: events are created, recorded on our stream and destroyed here.
        unsafe {
            let (mut a, mut b) = (std::ptr::null_mut(), std::ptr::null_mut());
            check("cuEventCreate", sys::cuEventCreate(&mut a, 0))?;
            check("cuEventCreate", sys::cuEventCreate(&mut b, 0))?;
            check("cuEventRecord", sys::cuEventRecord(a, self.stream))?;
            body()?;
            check("cuEventRecord", sys::cuEventRecord(b, self.stream))?;
            check("cuEventSynchronize", sys::cuEventSynchronize(b))?;
            let mut ms = 0f32;
            check("cuEventElapsedTime", sys::cuEventElapsedTime(&mut ms, a, b))?;
            sys::cuEventDestroy_v2(a);
            sys::cuEventDestroy_v2(b);
            Ok(ms)
        }
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

#[derive(Debug)]
pub struct Module(sys::CUmodule);

// SAFETY: module handles are usable from any thread with the context current.
unsafe impl Send for Module {}

impl Module {
    pub fn function(&self, name: &str) -> CudaResult<Function> {
        let c = CString::new(name).expect("kernel names have no NUL");
        let mut f = std::ptr::null_mut();
        // SAFETY: valid out-pointer and NUL-terminated name.
        unsafe {
            check(
                "cuModuleGetFunction",
                sys::cuModuleGetFunction(&mut f, self.0, c.as_ptr()),
            )
            // A PTX older than its host code lacks a kernel: name it.
            .map_err(|e| CudaError {
                code: format!("{} (kernel {name})", e.code),
                ..e
            })?
        };
        Ok(Function(f))
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Function(sys::CUfunction);

impl Function {
    /// Lets launches of this kernel use up to `bytes` of dynamic shared memory (above the
    /// default 48 KiB the GPU must allow it per kernel).
    pub fn allow_shared(&self, bytes: usize) -> CudaResult<()> {
        // SAFETY: a valid function handle and attribute.
        unsafe {
            check(
                "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
                sys::cuFuncSetAttribute(
                    self.0,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    bytes as i32,
                ),
            )
        }
    }
}

// SAFETY: as Module.
unsafe impl Send for Function {}

pub struct Graph(sys::CUgraphExec);

// SAFETY: as Module.
unsafe impl Send for Graph {}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: instantiated by `capture`, destroyed once.
        unsafe {
            sys::cuGraphExecDestroy(self.0);
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

/// Kernel parameters, each in an 8-byte slot (pointers, u64, and i32/f32 in the low bytes).
#[derive(Default)]
pub struct KernelArgs {
    slots: [u64; 32],
    n: usize,
}

impl KernelArgs {
    fn push(&mut self, v: u64) -> &mut Self {
        assert!(self.n < 32, "more than 32 kernel parameters");
        self.slots[self.n] = v;
        self.n += 1;
        self
    }
    pub fn ptr(&mut self, p: CUdeviceptr) -> &mut Self {
        self.push(p)
    }
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.push(v as u32 as u64)
    }
    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.push(v.to_bits() as u64)
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.push(v)
    }
    /// Ends a chain of pushes and hands back `f` (for `let f = match .. { args.ptr(..).then(f) }`).
    pub fn then(&mut self, f: Function) -> Function {
        f
    }
    fn pointers(&mut self) -> [*mut c_void; 32] {
        let mut p = [std::ptr::null_mut(); 32];
        for (i, slot) in self.slots[..self.n].iter_mut().enumerate() {
            p[i] = slot as *mut u64 as *mut c_void;
        }
        p
    }
}

/// The attributes of a `cuLaunchKernelEx` (how many are set, then them): dependent launch, and
/// a cluster dimension where `cluster` > 0.
fn launch_attributes(dependent: bool, cluster: u32) -> (usize, [sys::CUlaunchAttribute; 2]) {
    // SAFETY: the attribute unions are plain data (zeroed, then one member set).
    let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
    let mut n = 0;
    if dependent {
        attrs[n].id =
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attrs[n].value.programmaticStreamSerializationAllowed = 1;
        n += 1;
    }
    if cluster > 0 {
        attrs[n].id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attrs[n].value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 {
            x: cluster,
            y: 1,
            z: 1,
        };
        n += 1;
    }
    (n, attrs)
}
