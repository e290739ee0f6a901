//! Kernels: PTX modules loaded, their functions launched (plain, dependent, as clusters,
//! cooperative), occupancy asked, launches captured into graphs and timed. The `unsafe`
//! here is FFI, as in the parent: each block states what the driver needs.

use super::{check, CudaError, CudaResult, Gpu};
use cudarc::driver::sys::{self, CUdeviceptr};
use std::ffi::{c_void, CString};

impl Gpu {
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
            let attrs = launch_attributes(true, 0);
            return self.launch_ex(f, grid, block, shared, attrs, &mut ptrs);
        }
        self.launch_plain(f, grid, block, shared, &mut ptrs)
    }

    /// `launch`, but `f` (`dims`: grid and block) starts only once all work before it on the
    /// stream has finished, even where dependent launch is on (a decode step's first kernel:
    /// the kernels after it may then read the step's state before their wait, common.cuh's
    /// `pdl_wait`): the plain launch, which never asks for programmatic serialization.
    pub fn launch_ordered(
        &self,
        f: Function,
        (grid, block): (u32, u32),
        args: &mut KernelArgs,
    ) -> CudaResult<()> {
        self.launch_plain(f, grid, block, 0, &mut args.pointers())
    }

    /// `cuLaunchKernel`: no launch attributes, so `f` starts after the work before it.
    fn launch_plain(
        &self,
        f: Function,
        grid: u32,
        block: u32,
        shared: u32,
        ptrs: &mut [*mut c_void; 32],
    ) -> CudaResult<()> {
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

    /// `launch_shared` as clusters of `cluster` consecutive blocks (sm_90: thread block
    /// clusters, whose blocks run at once and share their shared memory); `grid` is a
    /// multiple of it.
    pub fn launch_cluster(
        &self,
        f: Function,
        (grid, block, cluster): (u32, u32, u32),
        shared: u32,
        args: &mut KernelArgs,
    ) -> CudaResult<()> {
        let mut ptrs = args.pointers();
        let attrs = launch_attributes(self.dependent_launch, cluster);
        self.launch_ex(f, grid, block, shared, attrs, &mut ptrs)
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

    /// `launch_shared` through `cuLaunchKernelEx` with `attrs` (`launch_attributes`: dependent
    /// launch, clusters).
    /// A path of its own: `cuLaunchKernelEx` came with CUDA 11.8, so the plain launch stays
    /// `cuLaunchKernel`, which older drivers have too (JetPack 5 ships CUDA 11.4).
    fn launch_ex(
        &self,
        f: Function,
        grid: u32,
        block: u32,
        shared: u32,
        mut attrs: (usize, [sys::CUlaunchAttribute; 2]),
        ptrs: &mut [*mut c_void; 32],
    ) -> CudaResult<()> {
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

/// Kernel parameters, each in an 8-byte slot (pointers, u64, and i32/f32 in the low bytes).
#[derive(Clone, Default)]
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
