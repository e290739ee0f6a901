//! The persistent streaming-FFN kernel's launcher (kernels-ptx/stream_ffn.cu; paper 3.2.1).
//!
//! One layer's FFN over `blocks` bundles of `per_block` neurons, each bundle three f16
//! matrices back to back (gate rows, up rows, down columns, all `[per_block][dim]`): the bytes
//! as an I/O lane lands them, so nothing is repacked between the read and the kernel. The
//! kernel starts before the bundles are in; the host (the lanes) writes a bundle and then sets
//! its arrival flag; the kernel computes arrived bundles in arrival order into one f32
//! accumulator and publishes a completion flag per stage (a group of bundles in priority
//! order). A flag never set ends the launch with `StreamFfnError::Missing` naming the first
//! bundle missing, after the time bound: never a hang.
//!
//! Memory models: `Unified` keeps the bundles in mapped pinned host memory the kernel reads (a
//! Jetson's one memory); `Discrete` copies each bundle to device memory before flagging it.

use super::driver::{CudaError, CudaResult, DeviceBuffer, Function, Gpu, KernelArgs, MappedHost};
use super::flags::Flags;
use super::ptx_for;
use crate::board::MemoryModel;
use std::fmt;

/// Threads per block of every kernel here (8 warps: 8 neurons' dots at a time).
pub const THREADS: u32 = 256;

/// The GGML type ids of the rows `stream_ffn` computes over (its TY_F16 and TY_Q8_0).
pub const TY_F16: i32 = 1;
pub const TY_Q8_0: i32 = 8;

/// One layer's shape as the kernel sees it.
#[derive(Clone, Copy, Debug)]
pub struct FfnShape {
    pub dim: usize,
    pub per_block: usize,
    pub blocks: usize,
}

impl FfnShape {
    /// Halves in one bundle.
    pub fn bundle_halves(&self) -> usize {
        3 * self.per_block * self.dim
    }

    pub fn bundle_bytes(&self) -> usize {
        2 * self.bundle_halves()
    }

    /// Dynamic shared memory of a block: the input, the activations and four words (the claim,
    /// whether a stage completed, the slot).
    pub(super) fn shared_bytes(&self) -> u32 {
        (4 * (self.dim + self.per_block) + 16) as u32
    }
}

/// Why a streamed FFN did not finish.
#[derive(Debug, Clone)]
pub enum StreamFfnError {
    /// Bundle `block`'s arrival flag was not set within the time bound.
    Missing {
        block: usize,
    },
    Cuda(CudaError),
}

impl fmt::Display for StreamFfnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamFfnError::Missing { block } => {
                write!(f, "bundle {block} never arrived within the time bound")
            }
            StreamFfnError::Cuda(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for StreamFfnError {}

impl From<CudaError> for StreamFfnError {
    fn from(e: CudaError) -> Self {
        StreamFfnError::Cuda(e)
    }
}

enum Bundles {
    Unified(MappedHost),
    /// Device memory and one bundle of pinned staging: a synchronous copy from pageable
    /// memory may return before its DMA is done, one from pinned memory only once it is.
    Discrete(DeviceBuffer, MappedHost),
}

/// The kernels of stream_ffn.cu.
#[derive(Clone, Copy)]
pub struct StreamFfnKernels {
    pub persistent: Function,
    pub segment: Function,
    pub coop: Function,
}

impl StreamFfnKernels {
    pub fn load(gpu: &Gpu) -> CudaResult<StreamFfnKernels> {
        let ptx = ptx_for("stream_ffn", gpu.compute_capability).expect("stream_ffn PTX embedded");
        // The module stays loaded for the process (kernel handles outlive this call).
        let m = Box::leak(Box::new(gpu.load_module(ptx)?));
        Ok(StreamFfnKernels {
            persistent: m.function("stream_ffn")?,
            segment: m.function("ffn_segment")?,
            coop: m.function("ffn_segments_coop")?,
        })
    }
}

/// A layer's bundles, flags and accumulator, sized once.
pub struct StreamFfn {
    pub shape: FfnShape,
    pub kernels: StreamFfnKernels,
    bundles: Bundles,
    /// One per bundle: set to the launch's generation once the bundle is in.
    pub arrive: Flags,
    /// One per stage: the generation once the stage's sums are in the accumulator.
    pub stages: Flags,
    error: Flags,
    x: DeviceBuffer,
    pub acc: DeviceBuffer,
    claimed: DeviceBuffer,
    flag_of: DeviceBuffer,
    stage_of: DeviceBuffer,
    stage_size: DeviceBuffer,
    stage_count: DeviceBuffer,
    generation: u32,
    /// Persistent blocks launched.
    pub grid: u32,
}

/// The staging bytes as a shared slice (the copy reads them while nothing writes).
fn unsafe_slice(m: &MappedHost) -> &[u8] {
    // SAFETY: `host` spans `bytes` bytes for the life of `m`; the only writer is `put`, which
    // holds `&mut self` and is not writing during the copy.
    unsafe { std::slice::from_raw_parts(m.host, m.bytes) }
}

fn words(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_le_bytes()).collect()
}

impl StreamFfn {
    /// `stages`: bundles per stage, in priority order (they sum to `shape.blocks`).
    pub fn new(
        gpu: &Gpu,
        shape: FfnShape,
        model: MemoryModel,
        stages: &[usize],
    ) -> CudaResult<StreamFfn> {
        assert!(
            shape.dim.is_multiple_of(8),
            "dim {} must be a multiple of 8",
            shape.dim
        );
        assert_eq!(
            stages.iter().sum::<usize>(),
            shape.blocks,
            "stages cover the bundles"
        );
        let kernels = StreamFfnKernels::load(gpu)?;
        let bytes = shape.blocks * shape.bundle_bytes();
        let bundles = match model {
            MemoryModel::Discrete => {
                Bundles::Discrete(gpu.alloc(bytes)?, gpu.alloc_mapped(shape.bundle_bytes())?)
            }
            _ => Bundles::Unified(gpu.alloc_mapped(bytes)?),
        };
        let n = shape.blocks;
        let mut stage_of = Vec::with_capacity(n);
        for (s, &k) in stages.iter().enumerate() {
            stage_of.extend(std::iter::repeat_n(s as u32, k));
        }
        let sizes: Vec<u32> = stages.iter().map(|&k| k as u32).collect();
        let identity: Vec<u32> = (0..n as u32).collect();
        let upload = |v: &[u32]| -> CudaResult<DeviceBuffer> {
            let b = gpu.alloc(4 * v.len())?;
            gpu.upload(b.ptr, &words(v))?;
            Ok(b)
        };
        let persistent = kernels.persistent;
        persistent.allow_shared(shape.shared_bytes() as usize)?;
        let per_sm = gpu.blocks_per_sm(persistent, THREADS, shape.shared_bytes() as usize)?;
        // Every persistent block resident at once (they spin): at most what fits, at most one
        // per bundle.
        let grid = (per_sm.max(1) * gpu.sm_count as u32).min(n as u32).max(1);
        Ok(StreamFfn {
            shape,
            kernels,
            bundles,
            arrive: Flags::new(gpu, n)?,
            stages: Flags::new(gpu, stages.len())?,
            error: Flags::new(gpu, 1)?,
            x: gpu.alloc(4 * shape.dim)?,
            acc: gpu.alloc(4 * shape.dim)?,
            // The claims, the device mirror of the arrival flags seen set, the claim count.
            claimed: gpu.alloc(8 * n + 4)?,
            flag_of: upload(&identity)?,
            stage_of: upload(&stage_of)?,
            stage_size: upload(&sizes)?,
            stage_count: gpu.alloc(4 * stages.len())?,
            generation: 0,
            grid,
        })
    }

    /// The value flags carry in the current launch.
    pub fn generation(&self) -> u32 {
        self.generation
    }

    /// The device address of bundle 0 (every bundle resident: benchmarks).
    pub fn bundles_ptr(&self) -> u64 {
        match &self.bundles {
            Bundles::Unified(m) => m.dev,
            Bundles::Discrete(d, _) => d.ptr,
        }
    }

    /// Starts the persistent kernel over input `x` (threshold `thr`: neurons with
    /// |silu(g)·u| < thr are dropped); it waits up to `timeout_ns` for each next bundle.
    pub fn start(&mut self, gpu: &Gpu, x: &[f32], thr: f32, timeout_ns: u64) -> CudaResult<()> {
        assert_eq!(x.len(), self.shape.dim);
        self.generation += 1;
        self.error.set(0, 0);
        let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        gpu.upload(self.x.ptr, &xb)?;
        self.launch_persistent(gpu, thr, timeout_ns)
    }

    /// The launch alone (the input already uploaded): what a benchmark repeats.
    pub fn launch_persistent(&self, gpu: &Gpu, thr: f32, timeout_ns: u64) -> CudaResult<()> {
        let s = self.shape;
        gpu.zero_async(self.acc.ptr, s.dim)?;
        gpu.zero_async(self.claimed.ptr, 2 * s.blocks + 1)?;
        gpu.zero_async(self.stage_count.ptr, self.stages.len())?;
        gpu.launch_shared(
            self.kernels.persistent,
            self.grid,
            THREADS,
            s.shared_bytes(),
            KernelArgs::default()
                .ptr(self.bundles_ptr())
                .u64(s.bundle_bytes() as u64)
                .ptr(0)
                .i32(s.blocks as i32)
                .i32(s.per_block as i32)
                .i32(s.dim as i32)
                .i32(TY_F16)
                .i32(TY_F16)
                .i32(TY_F16)
                .ptr(self.x.ptr)
                .f32(thr)
                .ptr(self.acc.ptr)
                .ptr(self.arrive.device_ptr())
                .ptr(self.flag_of.ptr)
                .i32(self.generation as i32)
                .ptr(self.claimed.ptr)
                .ptr(self.stage_of.ptr)
                .ptr(self.stage_size.ptr)
                .ptr(self.stage_count.ptr)
                .ptr(self.stages.device_ptr())
                .ptr(0)
                .u64(timeout_ns)
                .ptr(self.error.device_ptr())
                .ptr(0)
                // No dropped-neuron means (the block order is then not read).
                .ptr(0)
                .ptr(0),
        )
    }

    /// Writes bundle `b` where the kernel reads it, then flags it arrived (as an I/O lane will).
    pub fn deliver(&mut self, gpu: &Gpu, b: usize, bytes: &[u8]) -> CudaResult<()> {
        self.put(gpu, b, bytes)?;
        self.arrive.set(b, self.generation);
        Ok(())
    }

    /// Writes bundle `b` without flagging it.
    pub fn put(&mut self, gpu: &Gpu, b: usize, bytes: &[u8]) -> CudaResult<()> {
        let len = self.shape.bundle_bytes();
        assert_eq!(bytes.len(), len, "bundle {b} is {len} bytes");
        match &mut self.bundles {
            Bundles::Unified(m) => m.as_mut_slice()[b * len..][..len].copy_from_slice(bytes),
            // Through pinned staging, a synchronous copy on the legacy stream: the kernel's
            // stream does not wait on it, and it returns only once the bytes are in.
            Bundles::Discrete(d, staging) => {
                staging.as_mut_slice().copy_from_slice(bytes);
                let staged = unsafe_slice(staging);
                gpu.upload(d.ptr + (b * len) as u64, staged)?
            }
        }
        Ok(())
    }

    /// Waits for the kernel and returns the accumulator, or the bundle that never came.
    pub fn finish(&self, gpu: &Gpu, out: &mut [f32]) -> Result<(), StreamFfnError> {
        gpu.sync()?;
        let e = self.error.get(0);
        if e != 0 {
            return Err(StreamFfnError::Missing {
                block: e as usize - 1,
            });
        }
        let mut bytes = vec![0u8; 4 * out.len()];
        gpu.download_async(&mut bytes, self.acc.ptr)?;
        gpu.sync()?;
        for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        Ok(())
    }

    /// Uploads the input for the benchmark kernels (`start` does it for the persistent one).
    pub fn set_input(&self, gpu: &Gpu, x: &[f32]) -> CudaResult<()> {
        let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        gpu.upload(self.x.ptr, &xb)
    }

    /// Table 3, kernel boundaries: one launch per segment (`seg_start`: segments + 1 bundle
    /// indices), each over the whole GPU.
    pub fn launch_segments(&self, gpu: &Gpu, seg_start: &[u32], thr: f32) -> CudaResult<()> {
        let s = self.shape;
        gpu.zero_async(self.acc.ptr, s.dim)?;
        for w in seg_start.windows(2) {
            let count = w[1] - w[0];
            gpu.launch_shared(
                self.kernels.segment,
                count.min(self.grid).max(1),
                THREADS,
                s.shared_bytes(),
                KernelArgs::default()
                    .ptr(self.bundles_ptr())
                    .u64(s.bundle_halves() as u64)
                    .i32(w[0] as i32)
                    .i32(count as i32)
                    .i32(s.per_block as i32)
                    .i32(s.dim as i32)
                    .ptr(self.x.ptr)
                    .f32(thr)
                    .ptr(self.acc.ptr),
            )?;
        }
        Ok(())
    }

    /// Table 3, grid sync: one cooperative launch, a grid-wide barrier after each segment.
    /// `seg` holds the segment starts (uploaded), `bar` two zeroed words.
    pub fn launch_coop(
        &self,
        gpu: &Gpu,
        seg: &DeviceBuffer,
        segments: usize,
        bar: &DeviceBuffer,
        thr: f32,
    ) -> CudaResult<()> {
        let s = self.shape;
        gpu.zero_async(self.acc.ptr, s.dim)?;
        gpu.zero_async(bar.ptr, 2)?;
        self.kernels.coop.allow_shared(s.shared_bytes() as usize)?;
        let per_sm = gpu.blocks_per_sm(self.kernels.coop, THREADS, s.shared_bytes() as usize)?;
        let grid = (per_sm.max(1) * gpu.sm_count as u32).min(s.blocks as u32);
        gpu.launch_cooperative(
            self.kernels.coop,
            grid,
            THREADS,
            s.shared_bytes(),
            KernelArgs::default()
                .ptr(self.bundles_ptr())
                .u64(s.bundle_halves() as u64)
                .ptr(seg.ptr)
                .i32(segments as i32)
                .i32(s.per_block as i32)
                .i32(s.dim as i32)
                .ptr(self.x.ptr)
                .f32(thr)
                .ptr(self.acc.ptr)
                .ptr(bar.ptr),
        )
    }

    /// Table 3, flags: makes the persistent launch wait on one flag per segment (all
    /// set: the weights are in, so what is measured is the synchronization itself).
    pub fn prepare_flagged_segments(&mut self, gpu: &Gpu, seg_start: &[u32]) -> CudaResult<()> {
        let mut flag_of = vec![0u32; self.shape.blocks];
        for (s, w) in seg_start.windows(2).enumerate() {
            flag_of[w[0] as usize..w[1] as usize].fill(s as u32);
        }
        gpu.upload(self.flag_of.ptr, &words(&flag_of))?;
        self.generation += 1;
        self.error.set(0, 0);
        for s in 0..seg_start.len() - 1 {
            self.arrive.set(s, self.generation);
        }
        Ok(())
    }

    /// Sets flag_of back to one flag per bundle.
    pub fn reset_flag_map(&self, gpu: &Gpu) -> CudaResult<()> {
        let identity: Vec<u32> = (0..self.shape.blocks as u32).collect();
        gpu.upload(self.flag_of.ptr, &words(&identity))
    }

    /// The error word after a launch (0: none).
    pub fn error_code(&self) -> u32 {
        self.error.get(0)
    }
}

/// The CPU's sum over the same bundles (f16 weights, f32 arithmetic): the parity reference.
/// `bundles` holds `shape.blocks` bundles back to back; only bundles in `set` count.
pub fn reference(shape: FfnShape, bundles: &[u8], set: &[usize], x: &[f32], thr: f32) -> Vec<f32> {
    let (p, dim) = (shape.per_block, shape.dim);
    let h = |bytes: &[u8], i: usize| {
        crate::model::ggml::f16_to_f32(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]))
    };
    let mut out = vec![0f32; dim];
    for &b in set {
        let bundle = &bundles[b * shape.bundle_bytes()..][..shape.bundle_bytes()];
        for n in 0..p {
            let (mut g, mut u) = (0f32, 0f32);
            for (i, xi) in x.iter().enumerate() {
                g += h(bundle, n * dim + i) * xi;
                u += h(bundle, (p + n) * dim + i) * xi;
            }
            let a = g / (1.0 + (-g).exp()) * u;
            if a.abs() < thr {
                continue;
            }
            for (i, o) in out.iter_mut().enumerate() {
                *o += a * h(bundle, (2 * p + n) * dim + i);
            }
        }
    }
    out
}
