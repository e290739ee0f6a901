//! One layer's FFN streamed from a flash image on the GPU (paper 3.2.1 and Algorithm 1): the
//! I/O lanes read the layer's blocks (O_DIRECT, `stream::Lanes`) into the weight cache, whose
//! slots are pinned host memory mapped into the GPU ([`CacheMemory`]); each arrival writes the
//! block's slot where the kernel looks it up and then sets the block's arrival flag, and the
//! persistent `stream_ffn` kernel, launched before any read is asked for, computes blocks as
//! their flags come up, in whatever order they land, into one accumulator. The blocks are the
//! image's own bytes (gate rows, up rows, down columns; F16 or Q8_0): nothing is repacked.
//!
//! Stages (Algorithm 1): the layer's blocks, in priority order, are cut into `stages` groups;
//! when a group's last block is summed the kernel copies the accumulator into that stage's
//! snapshot (host memory) and publishes the stage's flag. The CPU, between arrivals, turns
//! each newly published stage into one call of the caller's `on_stage` with the partial output
//! (many block completions, one prediction update), which may re-rank or queue the next
//! layer's reads on the same lanes.
//!
//! Memory models: `Unified` (a Jetson's one memory) has the kernel read the cache slots where
//! the lanes put them; `Discrete` mirrors each slot in device memory, copied from the pinned
//! slot before the block is flagged.
//!
//! Failures: a read that fails for good sets the kernel's error word (naming the block) and the
//! layer ends with the read's error; a flag never set ends the kernel after its time bound with
//! the block named; the host side gives up after twice the bound. Never a hang.
//!
//! After `new`, a layer allocates nothing.

use super::driver::{CudaError, CudaResult, DeviceBuffer, Gpu, KernelArgs, MappedHost, SideStream};
use super::flags::Flags;
use super::stream_ffn::{FfnShape, StreamFfnKernels, THREADS, TY_F16, TY_Q8_0};
use crate::board::MemoryModel;
use crate::model::flash::FlashImage;
use crate::model::ggml::GgmlType;
use crate::stream::{
    BlockId, BlockRead, FileId, Lanes, ReadError, RequestError, Requested, WeightCache,
};
use std::fmt;
use std::time::{Duration, Instant};

/// The weight cache's memory: pinned host memory the GPU reads (mapped), and in the discrete
/// model a device copy of every slot.
pub struct CacheMemory {
    host: MappedHost,
    mirror: Option<DeviceBuffer>,
}

impl CacheMemory {
    /// `bytes` of cache (the board's `ffn_cache` budget) in `model`'s memory.
    pub fn new(gpu: &Gpu, model: MemoryModel, bytes: usize) -> CudaResult<CacheMemory> {
        let mirror = match model {
            MemoryModel::Discrete => Some(gpu.alloc(bytes)?),
            _ => None,
        };
        Ok(CacheMemory {
            host: gpu.alloc_mapped(bytes)?,
            mirror,
        })
    }

    /// The arena the weight cache is carved from (the lanes copy arrivals into it), and where
    /// the kernel finds it.
    pub fn split(&mut self) -> (&mut [u8], CacheView) {
        let view = CacheView {
            kernel_base: self.mirror.as_ref().map_or(self.host.dev, |m| m.ptr),
            mirror: self.mirror.as_ref().map(|m| m.ptr),
        };
        (self.host.as_mut_slice(), view)
    }
}

/// Where the kernel reads the cache's slot 0 (the device copy, or the mapped host memory),
/// and the device copy in the discrete model.
#[derive(Clone, Copy, Debug)]
pub struct CacheView {
    pub kernel_base: u64,
    pub mirror: Option<u64>,
}

/// Why a streamed layer did not finish.
#[derive(Debug)]
pub enum GpuStreamError {
    /// A block's read failed for good.
    Read(ReadError),
    /// A block could not be asked for.
    Request(RequestError),
    /// The lanes' backend failed.
    Io(std::io::Error),
    /// A block's flag was never set within the time bound (global block id).
    Missing {
        block: BlockId,
    },
    /// The image holds rows of a type the kernel does not compute.
    Type {
        layer: usize,
        ty: GgmlType,
    },
    Cuda(CudaError),
}

impl fmt::Display for GpuStreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuStreamError::Read(e) => write!(f, "{e}"),
            GpuStreamError::Request(e) => write!(f, "{e}"),
            GpuStreamError::Io(e) => write!(f, "I/O lanes: {e}"),
            GpuStreamError::Missing { block } => write!(
                f,
                "FFN block {block} never arrived within the GPU's time bound"
            ),
            GpuStreamError::Type { layer, ty } => write!(
                f,
                "layer {layer}'s blocks hold {ty:?} rows; the GPU streams F16 and Q8_0 blocks (flash the image with --precision w8a8)"
            ),
            GpuStreamError::Cuda(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for GpuStreamError {}

impl From<CudaError> for GpuStreamError {
    fn from(e: CudaError) -> Self {
        GpuStreamError::Cuda(e)
    }
}

/// What one layer did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerStats {
    /// Blocks computed.
    pub blocks: usize,
    /// Of them, in the cache when asked for.
    pub hits: usize,
    /// Stages published (and handed to `on_stage`).
    pub stages: usize,
    /// From the layer's start until its last block was in (the controller's T^I).
    pub io: Duration,
}

/// One layer's request: the image, the layer, the blocks to compute in priority order
/// (layer-local indices), and the layer's first global block id in the lanes and cache.
/// `means`: the device address of the layer's dropped-neuron means by image slot (block x
/// per_block + entry), or 0: a kept neuron then counts as itself and the caller adds every
/// neuron's mean contribution (down x means) to the output; a dropped one counts with its mean.
#[derive(Clone, Copy)]
pub struct LayerBlocks<'r> {
    pub image: &'r FlashImage,
    pub file: FileId,
    pub layer: usize,
    pub base: BlockId,
    pub order: &'r [u32],
    pub means: u64,
}

/// Algorithm 1's hook: stage s is summed; the layer's output so far; the lanes and cache, to
/// re-rank or queue the next layer's reads.
pub type OnStage<'f> = dyn FnMut(usize, &[f32], &mut Lanes, &mut WeightCache) + 'f;

/// No bundle of this layer's order waits for this block.
const NONE: u32 = u32::MAX;

/// The GPU side of the streamed FFN: kernel, flags and buffers sized once for the largest layer.
pub struct GpuStreamedFfn {
    kernels: StreamFfnKernels,
    dim: usize,
    max_blocks: usize,
    max_stages: usize,
    /// Per bundle (position in the order): the generation once its block is in its slot.
    arrive: Flags,
    /// Per bundle: the cache slot its block is in (written before its arrival flag).
    slot_of: Flags,
    /// Discrete: the arrival flags, slots and error word in device memory instead (written by
    /// the copy stream behind each copy, so the kernel's spins never cross the bus; `error`
    /// then reports the kernel's timeout to the host).
    device_words: Option<DeviceBuffer>,
    /// Per stage: the generation once its bundles are summed.
    stage_flags: Flags,
    /// Per stage: the accumulator when the stage completed.
    snapshots: MappedHost,
    error: Flags,
    x: DeviceBuffer,
    acc: DeviceBuffer,
    claimed: DeviceBuffer,
    flag_of: DeviceBuffer,
    stage_of: DeviceBuffer,
    stage_size: DeviceBuffer,
    stage_count: DeviceBuffer,
    /// Per bundle: its block in the layer (read by the kernel with `LayerBlocks::means`).
    order: DeviceBuffer,
    generation: u32,
    /// Persistent blocks at most (all resident at once).
    grid: u32,
    /// The controller's compute share: thread blocks a launch may use (0: `grid`).
    pub grid_cap: u32,
    /// Pinned scratch for uploads and the download (a copy from pageable memory may return
    /// before its DMA is done); then host scratch: the order position per layer block, blocks
    /// pinned, the block each device slot holds (+1; discrete), stages handed out.
    staging: MappedHost,
    position: Vec<u32>,
    held: Vec<BlockId>,
    mirror_holds: Vec<u32>,
    stage_seen: Vec<bool>,
    /// The discrete model's copies into the device slots, each followed by its arrival flag.
    copies: SideStream,
    /// Discrete: while the layer's blocks are being asked for, deliveries wait here (bundle,
    /// block, slot) and then go to the device in two copies (slots, flags) from `batch`, pinned:
    /// a stream write per hit costs microseconds, thousands of them a layer.
    batching: bool,
    deferred: Vec<(u32, BlockId, u32)>,
    batch: Option<MappedHost>,
    /// The kernel's wait for a next block, and the host's (twice it).
    pub timeout: Duration,
    /// The kernel starts once every block of the layer is in, instead of computing each as it
    /// lands: the layer-wise schedule of DejaVu-style systems (the figure-11 ablation's
    /// baseline: `gpu-decode-bench --ablation`).
    pub whole_layer_first: bool,
}

/// A synchronous copy of the first `k` bytes of pinned `staging` to `dst`: it returns once the
/// bytes are in.
fn upload_staged(gpu: &Gpu, dst: u64, staging: &MappedHost, k: usize) -> CudaResult<()> {
    assert!(k <= staging.bytes);
    // SAFETY: `host` spans `bytes` >= k bytes for the life of `staging`; nothing writes them
    // during the copy (the caller holds the only handle).
    let src = unsafe { std::slice::from_raw_parts(staging.host, k) };
    gpu.upload(dst, src)
}

fn put_words(dst: &mut [u8], words: impl Iterator<Item = u32>) -> usize {
    let mut n = 0;
    for (c, w) in dst.chunks_exact_mut(4).zip(words) {
        c.copy_from_slice(&w.to_le_bytes());
        n += 4;
    }
    n
}

impl GpuStreamedFfn {
    /// For `model`'s memory, layers of width `dim` with at most `max_blocks` blocks of `max_per_block` bundles,
    /// split into at most `max_stages` stages; `slots` cache slots (discrete mirror tracking).
    pub fn new(
        gpu: &Gpu,
        model: MemoryModel,
        dim: usize,
        max_blocks: usize,
        max_per_block: usize,
        max_stages: usize,
        slots: usize,
    ) -> CudaResult<GpuStreamedFfn> {
        let max_stages = max_stages.max(1);
        let kernels = StreamFfnKernels::load(gpu)?;
        let shape = FfnShape {
            dim,
            per_block: max_per_block,
            blocks: max_blocks,
        };
        let shared = shape.shared_bytes() as usize;
        kernels.persistent.allow_shared(shared)?;
        let per_sm = gpu.blocks_per_sm(kernels.persistent, THREADS, shared)?;
        let identity: Vec<u32> = (0..max_blocks as u32).collect();
        let flag_of = gpu.alloc(4 * max_blocks)?;
        let mut id_bytes = vec![0u8; 4 * max_blocks];
        put_words(&mut id_bytes, identity.into_iter());
        gpu.upload(flag_of.ptr, &id_bytes)?;
        Ok(GpuStreamedFfn {
            kernels,
            dim,
            max_blocks,
            max_stages,
            arrive: Flags::new(gpu, max_blocks)?,
            device_words: match model {
                MemoryModel::Discrete => Some(gpu.alloc(4 * (2 * max_blocks + 1))?),
                _ => None,
            },
            slot_of: Flags::new(gpu, max_blocks)?,
            stage_flags: Flags::new(gpu, max_stages)?,
            snapshots: gpu.alloc_mapped(4 * dim * max_stages)?,
            error: Flags::new(gpu, 1)?,
            x: gpu.alloc(4 * dim)?,
            acc: gpu.alloc(4 * dim)?,
            claimed: gpu.alloc(8 * max_blocks + 4)?,
            flag_of,
            stage_of: gpu.alloc(4 * max_blocks)?,
            stage_size: gpu.alloc(4 * max_stages)?,
            stage_count: gpu.alloc(4 * max_stages)?,
            order: gpu.alloc(4 * max_blocks)?,
            generation: 0,
            whole_layer_first: false,
            grid: (per_sm.max(1) * gpu.sm_count as u32).max(1),
            grid_cap: 0,
            staging: gpu.alloc_mapped(4 * max_blocks.max(dim).max(max_stages))?,
            position: vec![NONE; max_blocks],
            held: Vec::with_capacity(max_blocks),
            mirror_holds: vec![0; slots],
            stage_seen: vec![false; max_stages],
            copies: gpu.side_stream()?,
            batching: false,
            deferred: Vec::with_capacity(max_blocks),
            batch: match model {
                MemoryModel::Discrete => Some(gpu.alloc_mapped(8 * max_blocks)?),
                _ => None,
            },
            timeout: Duration::from_secs(2),
        })
    }

    /// The layer's FFN over `req.order`'s blocks into `out` (dim values), streamed through
    /// `lanes` into `cache` (whose arena `mem` locates), `stages` stages handed to `on_stage(s,
    /// partial output, lanes, cache)` as they complete. `thr`: neurons with |silu(g)·u| < thr
    /// are dropped. Blocks the layer uses are pinned until it ends.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_layer(
        &mut self,
        gpu: &Gpu,
        mem: CacheView,
        req: LayerBlocks<'_>,
        stages: usize,
        x: &[f32],
        thr: f32,
        lanes: &mut Lanes,
        cache: &mut WeightCache,
        on_stage: &mut OnStage<'_>,
        out: &mut [f32],
    ) -> Result<LayerStats, GpuStreamError> {
        assert_eq!(x.len(), self.dim);
        assert_eq!(out.len(), self.dim);
        let k = put_words(self.staging.as_mut_slice(), x.iter().map(|v| v.to_bits()));
        upload_staged(gpu, self.x.ptr, &self.staging, k)?;
        let x_dev = self.x.ptr;
        let stats = self.run_layer(gpu, mem, req, stages, x_dev, thr, lanes, cache, on_stage)?;
        let k = 4 * self.dim;
        let staged = &mut self.staging.as_mut_slice()[..k];
        gpu.download_async(staged, self.acc.ptr)?;
        gpu.sync()?;
        for (o, c) in out.iter_mut().zip(staged.chunks_exact(4)) {
            *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        Ok(stats)
    }

    /// Thread blocks of the persistent kernel resident at once: the compute units a plan's
    /// share is taken of ([`grid_cap`](Self::grid_cap)).
    pub fn grid(&self) -> u32 {
        self.grid
    }

    /// Stages a layer may be split into (more are taken as this many).
    pub fn max_stages(&self) -> usize {
        self.max_stages
    }

    /// Where [`run_layer`](Self::run_layer) leaves the layer's output (dim floats, device
    /// memory), until the next layer starts.
    pub fn output(&self) -> u64 {
        self.acc.ptr
    }

    /// [`forward_layer`](Self::forward_layer) with its input already on the device at `x` (dim
    /// floats, not written until the layer ends) and its output left at
    /// [`output`](Self::output): the decoder's way, with no copy through the host.
    #[allow(clippy::too_many_arguments)]
    pub fn run_layer(
        &mut self,
        gpu: &Gpu,
        mem: CacheView,
        req: LayerBlocks<'_>,
        stages: usize,
        x: u64,
        thr: f32,
        lanes: &mut Lanes,
        cache: &mut WeightCache,
        on_stage: &mut OnStage<'_>,
    ) -> Result<LayerStats, GpuStreamError> {
        let n = req.order.len();
        assert!(n <= self.max_blocks, "{n} blocks of {}", self.max_blocks);
        assert_eq!(
            mem.mirror.is_some(),
            self.device_words.is_some(),
            "the cache memory and the GPU side were made for different memory models"
        );
        let g = *req.image.geometry(req.layer);
        let (gt, ut, dt) = g.types().expect("an opened image's types");
        let ty_id = |t: GgmlType| match t {
            GgmlType::F16 => Ok(TY_F16),
            GgmlType::Q8_0 => Ok(TY_Q8_0),
            ty => Err(GpuStreamError::Type {
                layer: req.layer,
                ty,
            }),
        };
        let (gi, ui, di) = (ty_id(gt)?, ty_id(ut)?, ty_id(dt)?);
        let started = Instant::now();
        let mut stats = LayerStats::default();
        if n == 0 {
            gpu.zero_async(self.acc.ptr, self.dim)?;
            return Ok(stats);
        }
        let stages = stages.clamp(1, self.max_stages.min(n));
        let dim = self.dim;

        // Per launch: a new generation (flags of earlier launches stay below it).
        self.generation += 1;
        let want = self.generation;
        self.error.set(0, 0);
        if req.means != 0 {
            let k = put_words(self.staging.as_mut_slice(), req.order.iter().copied());
            upload_staged(gpu, self.order.ptr, &self.staging, k)?;
        }
        // Stage s holds the bundles at order positions [s * n / stages, (s + 1) * n / stages).
        let k = put_words(
            self.staging.as_mut_slice(),
            (0..n).map(|i| (i * stages / n) as u32),
        );
        upload_staged(gpu, self.stage_of.ptr, &self.staging, k)?;
        let k = put_words(
            self.staging.as_mut_slice(),
            (0..stages).map(|s| (((s + 1) * n / stages) - (s * n / stages)) as u32),
        );
        upload_staged(gpu, self.stage_size.ptr, &self.staging, k)?;
        self.stage_seen[..stages].fill(false);
        gpu.zero_async(self.acc.ptr, dim)?;
        gpu.zero_async(self.claimed.ptr, 2 * n + 1)?;
        gpu.zero_async(self.stage_count.ptr, stages)?;
        let (arrive, slot_of, error, report) = match &self.device_words {
            Some(w) => {
                let error = w.ptr + 8 * self.max_blocks as u64;
                gpu.zero_async(error, 1)?;
                (
                    w.ptr,
                    w.ptr + 4 * self.max_blocks as u64,
                    error,
                    self.error.device_ptr(),
                )
            }
            None => (
                self.arrive.device_ptr(),
                self.slot_of.device_ptr(),
                self.error.device_ptr(),
                0,
            ),
        };
        let shape = FfnShape {
            dim,
            per_block: g.per_block as usize,
            blocks: n,
        };
        // The launch, now (each block computed as it lands) or once the layer is in.
        let grid = match self.grid_cap {
            0 => self.grid,
            cap => cap.min(self.grid),
        };
        let (persistent, acc, flag_of, claimed) = (
            self.kernels.persistent,
            self.acc.ptr,
            self.flag_of.ptr,
            self.claimed.ptr,
        );
        let (stage_of, stage_size, stage_count, stage_flags, snapshots, order) = (
            self.stage_of.ptr,
            self.stage_size.ptr,
            self.stage_count.ptr,
            self.stage_flags.device_ptr(),
            self.snapshots.dev,
            self.order.ptr,
        );
        let (timeout, slot_stride) = (self.timeout.as_nanos() as u64, cache.slot_stride() as u64);
        let launch = || {
            gpu.launch_shared(
                persistent,
                grid.min(n as u32),
                THREADS,
                shape.shared_bytes(),
                KernelArgs::default()
                    .ptr(mem.kernel_base)
                    .u64(slot_stride)
                    .ptr(slot_of)
                    .i32(n as i32)
                    .i32(g.per_block as i32)
                    .i32(dim as i32)
                    .i32(gi)
                    .i32(ui)
                    .i32(di)
                    .ptr(x)
                    .f32(thr)
                    .ptr(acc)
                    .ptr(arrive)
                    .ptr(flag_of)
                    .i32(want as i32)
                    .ptr(claimed)
                    .ptr(stage_of)
                    .ptr(stage_size)
                    .ptr(stage_count)
                    .ptr(stage_flags)
                    .ptr(snapshots)
                    .u64(timeout)
                    .ptr(error)
                    .ptr(report)
                    .ptr(order)
                    .ptr(req.means),
            )
        };
        if !self.whole_layer_first {
            launch()?;
        }

        // Ask for every block, highest priority first: hits are flagged at once (discrete: in
        // one batch once all are asked for).
        self.batching = self.batch.is_some();
        self.deferred.clear();
        let mut waiting = 0usize;
        let mut failure: Option<GpuStreamError> = None;
        for (i, &b) in req.order.iter().enumerate() {
            let block = req.base + b;
            let (offset, len) = req.image.block_extent(req.layer, b as usize);
            let read = BlockRead {
                file: req.file,
                offset,
                len: len as u32,
                block,
            };
            let priority = (n - i) as f32;
            let asked = loop {
                match lanes.request(read, priority, cache) {
                    // The lanes are full: take in a finished read to make room.
                    Err(RequestError::Full { .. }) => match lanes.wait_next(cache) {
                        Ok(Some(a)) => {
                            waiting -= self.arrived(mem, req.base, a, cache, &mut failure)?
                        }
                        Ok(None) => {
                            break Err(GpuStreamError::Request(RequestError::Full {
                                limit: lanes.config().capacity(),
                            }))
                        }
                        Err(e) => break Err(GpuStreamError::Io(e)),
                    },
                    Err(e) => break Err(GpuStreamError::Request(e)),
                    Ok(r) => break Ok(r),
                }
            };
            match asked {
                Ok(Requested::Cached(slot)) => {
                    stats.hits += 1;
                    cache.pin(block);
                    self.held.push(block);
                    self.deliver(mem, i, block, slot, cache)?;
                }
                Ok(_) => {
                    self.position[b as usize] = i as u32;
                    waiting += 1;
                }
                Err(e) => {
                    failure.get_or_insert(e);
                    self.abort(1 + i as u32)?;
                    break;
                }
            }
        }

        self.flush_batch(mem, n, cache)?;

        // Hand arrivals to the kernel and completed stages to the caller until every block is
        // in (or the layer failed), then until the kernel is done.
        let mut last_progress = Instant::now();
        while waiting > 0 && failure.is_none() {
            self.publish_stages(stages, &mut stats, lanes, cache, on_stage);
            match lanes.poll(cache) {
                Ok(Some(a)) => {
                    waiting -= self.arrived(mem, req.base, a, cache, &mut failure)?;
                    last_progress = Instant::now();
                }
                Ok(None) => {
                    if self.error.get(0) != 0 || last_progress.elapsed() > 2 * self.timeout {
                        break;
                    }
                    std::hint::spin_loop();
                }
                Err(e) => {
                    failure = Some(GpuStreamError::Io(e));
                    self.abort(u32::MAX)?;
                }
            }
        }
        stats.io = started.elapsed();
        if self.whole_layer_first {
            // Every block is in (or the layer failed: the kernel then ends at the first block
            // not in, which the error word names).
            launch()?;
        }
        if waiting > 0 && failure.is_none() && self.error.get(0) == 0 {
            // The host's bound passed with reads still out: end the kernel too.
            self.abort(u32::MAX)?;
        }
        let synced = gpu.sync().and(self.copies.sync());
        self.publish_stages(stages, &mut stats, lanes, cache, on_stage);
        for &b in req.order {
            self.position[b as usize] = NONE;
        }
        for &block in &self.held {
            cache.unpin(block);
        }
        self.held.clear();
        synced?;
        if let Some(e) = failure {
            return Err(e);
        }
        let code = self.error.get(0);
        if code != 0 {
            let i = (code as usize - 1).min(n - 1);
            return Err(GpuStreamError::Missing {
                block: req.base + req.order[i],
            });
        }
        stats.blocks = n;
        Ok(stats)
    }

    /// Takes in one finished read: a block of this layer's order is pinned and flagged; any
    /// other was read ahead for a later layer. How many of the layer's blocks it was
    /// (0 or 1).
    fn arrived(
        &mut self,
        mem: CacheView,
        base: BlockId,
        a: crate::stream::Arrival,
        cache: &mut WeightCache,
        failure: &mut Option<GpuStreamError>,
    ) -> CudaResult<usize> {
        let local = a.block.wrapping_sub(base) as usize;
        let i = self.position.get(local).copied().unwrap_or(NONE);
        match a.result {
            Ok(slot) if i != NONE => {
                self.position[local] = NONE;
                cache.pin(a.block);
                self.held.push(a.block);
                self.deliver(mem, i as usize, a.block, slot, cache)?;
                Ok(1)
            }
            // Read ahead for a later layer: mirrored when that layer asks for it.
            Ok(_) => Ok(0),
            Err(e) if i != NONE => {
                self.position[local] = NONE;
                failure.get_or_insert(GpuStreamError::Read(e));
                // The kernel stops waiting for it (and names it).
                self.abort(1 + i)?;
                Ok(1)
            }
            Err(_) => Ok(0),
        }
    }

    /// Bundle `i`'s block is in `slot`: tell the kernel where, then that it is in. Discrete:
    /// the slot's device copy is queued first (unless it holds the block already), and the
    /// flag is written by the copy stream behind it, so the host does not wait for the copy.
    fn deliver(
        &mut self,
        mem: CacheView,
        i: usize,
        block: BlockId,
        slot: usize,
        cache: &WeightCache,
    ) -> CudaResult<()> {
        if self.batching {
            self.deferred.push((i as u32, block, slot as u32));
            return Ok(());
        }
        let (Some(dev), Some(words)) = (mem.mirror, &self.device_words) else {
            self.slot_of.set(i, slot as u32);
            self.arrive.set(i, self.generation);
            return Ok(());
        };
        let (arrive, slot_of) = (words.ptr, words.ptr + 4 * self.max_blocks as u64);
        self.copies.write_u32(slot_of + 4 * i as u64, slot as u32)?;
        if self.mirror_holds[slot] != block + 1 {
            let bytes = cache.slot(slot);
            // SAFETY: the cache's arena is `CacheMemory`'s pinned mapping; the block is pinned
            // in the cache for the rest of the layer, so its slot is not rewritten before the
            // layer's end, which waits for the copy stream.
            unsafe {
                self.copies.copy_pinned(
                    dev + (slot * cache.slot_stride()) as u64,
                    bytes.as_ptr(),
                    bytes.len(),
                )?
            };
            self.mirror_holds[slot] = block + 1;
        }
        self.copies
            .write_u32(arrive + 4 * i as u64, self.generation)
    }

    /// Discrete: the deliveries held while the layer's blocks were asked for, to the device:
    /// each slot's copy where the mirror lacks it, then bundles 0..n's slots and flags in one
    /// copy each (0 for bundles still out: below any generation), on the copy stream before
    /// any later delivery.
    fn flush_batch(&mut self, mem: CacheView, n: usize, cache: &WeightCache) -> CudaResult<()> {
        if !std::mem::take(&mut self.batching) {
            return Ok(());
        }
        let (Some(dev), Some(words), Some(batch)) =
            (mem.mirror, &self.device_words, &mut self.batch)
        else {
            return Ok(());
        };
        let (arrive, slot_of) = (words.ptr, words.ptr + 4 * self.max_blocks as u64);
        let m = self.max_blocks;
        let staged = batch.as_mut_slice();
        staged[4 * m..4 * (m + n)].fill(0);
        for &(i, block, slot) in &self.deferred {
            let (i, slot_us) = (i as usize, slot as usize);
            if self.mirror_holds[slot_us] != block + 1 {
                let bytes = cache.slot(slot_us);
                // SAFETY: as in `deliver`: pinned cache memory, the block pinned until the
                // layer's end, which waits for the copy stream.
                unsafe {
                    self.copies.copy_pinned(
                        dev + (slot_us * cache.slot_stride()) as u64,
                        bytes.as_ptr(),
                        bytes.len(),
                    )?
                };
                self.mirror_holds[slot_us] = block + 1;
            }
            staged[4 * i..4 * i + 4].copy_from_slice(&slot.to_le_bytes());
            staged[4 * (m + i)..4 * (m + i) + 4].copy_from_slice(&self.generation.to_le_bytes());
        }
        self.deferred.clear();
        // SAFETY: `batch` is pinned and not written again before the layer's end, which waits
        // for the copy stream.
        unsafe {
            self.copies.copy_pinned(slot_of, batch.host, 4 * n)?;
            self.copies
                .copy_pinned(arrive, batch.host.add(4 * m), 4 * n)?;
        }
        Ok(())
    }

    /// Ends the kernel's waits with `code` (1 + the bundle that will not come, or u32::MAX):
    /// the host's copy of the error word, and in the discrete model the device's, written by
    /// the copy stream.
    fn abort(&self, code: u32) -> CudaResult<()> {
        self.error.set(0, code);
        match &self.device_words {
            Some(w) => self
                .copies
                .write_u32(w.ptr + 8 * self.max_blocks as u64, code),
            None => Ok(()),
        }
    }

    /// Each stage newly published since the last look becomes one `on_stage` call.
    fn publish_stages(
        &mut self,
        stages: usize,
        stats: &mut LayerStats,
        lanes: &mut Lanes,
        cache: &mut WeightCache,
        on_stage: &mut OnStage<'_>,
    ) {
        for s in 0..stages {
            if self.stage_seen[s] || self.stage_flags.get(s) != self.generation {
                continue;
            }
            self.stage_seen[s] = true;
            stats.stages += 1;
            // SAFETY: the snapshot of stage s spans dim floats inside the mapping; the kernel
            // wrote it before publishing the flag just read (Acquire) and does not write it
            // again in this launch.
            let partial = unsafe {
                std::slice::from_raw_parts(
                    (self.snapshots.host as *const f32).add(s * self.dim),
                    self.dim,
                )
            };
            on_stage(s, partial, lanes, cache);
        }
    }
}
