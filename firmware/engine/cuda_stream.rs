//! The CUDA decoder with its FFN streamed from a flash image (LeanStream paper 3.2.1; the CPU's
//! is `engine::stream_ffn`). Attention, the norms and the logits run as in memory
//! (`record_attention`, `record_head`); each layer's FFN is the persistent kernel of
//! `backend::cuda::stream_layer`, fed by the I/O lanes through the weight cache, whose slots are
//! pinned host memory the GPU reads (a Jetson's one memory) or mirrors (a discrete GPU).
//!
//! A step, per layer, readable top to bottom in [`CudaEngine::streamed_step`]:
//! 1. attention, whose last product leaves the FFN's normed input in `xf`;
//! 2. which blocks: the oracle and `stale` run the resident gate and up rows (the dense
//!    products, SwiGLU into `hf`) and keep the neurons at the layer's threshold; a learned
//!    table ranks blocks from the input (and residual) alone. The host reads back what the
//!    predictor needs (a few KiB) and lists the wanted blocks (in layout order:
//!    [`Prioritization`]);
//! 3. the persistent kernel computes the blocks as the lanes land them (hits at once), each
//!    kept neuron less its dropped mean where the thresholds table has means. With a table
//!    reading the residual after the previous FFN, the next layer's reads are queued ahead:
//!    after each stage of the kernel but the last (paper Algorithm 1: a stage's completions
//!    become one prediction update, from the residual plus the partial output), and once the
//!    FFN is done (the next layer's own prediction, which it then uses as its choice);
//! 4. `add_norm`: the output and the dropped neurons' mean contribution into the residual,
//!    normed for the next product.
//!
//! The same neurons as the CPU's streamed FFN: those at the layer's calibrated threshold among
//! the blocks read, every dropped neuron with its mean. A read that fails for good, or a block
//! that never lands within the kernel's bound, leaves that layer's output partial and is kept
//! for [`take_error`](GpuStream::take_error): the request ends with it.
//!
//! After boot a step allocates nothing.

use super::{cuda, f32_bytes_mut as f32_bytes, upload_f32, CudaEngine, Finish, Input};
use crate::backend::cuda::driver::{CudaResult, DeviceBuffer, KernelArgs};
use crate::backend::cuda::stream_layer::{
    CacheMemory, CacheView, GpuStreamError, GpuStreamedFfn, LayerBlocks,
};
use crate::boot::Carver;
use crate::control::{LayerSample, Lut, LutError};
use crate::engine::cuda_options::ProductRole;
use crate::engine::stream_ffn::{
    refine_stages, remaining_bytes, resident_rows, Control, ReadAhead, StreamParts, StreamedFfn,
};
use crate::engine::{EngineError, StreamOptions, StreamStats};
use crate::model::flash::FlashImage;
use crate::model::ggml::GgmlType;
use crate::model::{Hyper, TensorRef};
use crate::predict::PredictKind;
use crate::sparsity::{FfnMode, FfnOptions, Score};
use crate::stream::{Lanes, ReadError, ReadErrorKind, WeightCache};
use std::time::Instant;

/// What a streamed GPU engine boots from: the streaming options (image, budget, cache policy,
/// predictor) and the sparse FFN's (the thresholds and dropped means of its `oracle` mode).
#[derive(Clone, Copy)]
pub struct StreamedBoot<'o> {
    pub stream: &'o StreamOptions,
    pub ffn: &'o FfnOptions,
}

/// The paper's prioritization (its figure 11), each part switchable for the ablation
/// (`gpu-decode-bench --ablation`). The default is what measured fastest here: compute as the
/// blocks land, reads in layout order. A layer ends only when all its blocks are in (nothing
/// here cuts a layer's reads short or re-ranks them), so asking by priority changes no byte
/// read, and it costs: ascending offsets read 5-30% faster on the GPU machine's disk
/// (docs/STREAMING.md, "The ablation of figure 11").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prioritization {
    /// The persistent kernel computes each block as it lands; off: once the layer's blocks are
    /// all in (a layer-wise schedule).
    pub compute: bool,
    /// Reads are asked for highest priority first; off: in the image's layout order.
    pub loading: bool,
}

impl Default for Prioritization {
    fn default() -> Prioritization {
        Prioritization {
            compute: true,
            loading: false,
        }
    }
}

/// The image opened and checked before the weights are placed, with the oracle's resident rows.
pub(super) struct Prepared<'o> {
    boot: StreamedBoot<'o>,
    image: FlashImage,
    resident: Vec<u8>,
    resident_at: Vec<(usize, usize)>,
}

fn options(why: String) -> EngineError {
    EngineError::Options(why)
}

impl<'o> Prepared<'o> {
    pub(super) fn new(boot: StreamedBoot<'o>, h: &Hyper) -> Result<Prepared<'o>, EngineError> {
        let (so, ffn) = (boot.stream, boot.ffn);
        if ffn.mode != FfnMode::Oracle || ffn.score != Score::Glu {
            return Err(options(
                "the GPU's streamed FFN keeps the neurons at the calibrated thresholds of |SiLU(gate) * up|: use --ffn oracle with the glu score".into(),
            ));
        }
        let image = StreamedFfn::open_image(so, h).map_err(EngineError::Flash)?;
        for l in 0..image.layers() {
            let Some((g, u, d)) = image.geometry(l).types() else {
                return Err(EngineError::Unsupported(format!(
                    "{}: layer {l}'s FFN blocks hold rows of an unknown type",
                    so.image.display()
                )));
            };
            if let Some(ty) = [g, u, d]
                .into_iter()
                .find(|t| !matches!(t, GgmlType::F16 | GgmlType::Q8_0))
            {
                return Err(EngineError::Unsupported(format!(
                    "{}: layer {l}'s FFN blocks hold {ty:?} rows; the GPU streams F16 and Q8_0 (write the image with `leanstream flash --precision w8a8` or f16)",
                    so.image.display()
                )));
            }
        }
        let (resident, resident_at) = match so.predict {
            PredictKind::Oracle | PredictKind::Stale if so.replay.is_none() => {
                resident_rows(&image)
            }
            _ => (Vec::new(), Vec::new()),
        };
        Ok(Prepared {
            boot,
            image,
            resident,
            resident_at,
        })
    }

    /// Layer `l`'s resident gate and up rows (neuron order), when the predictor needs them.
    pub(super) fn resident_gate_up(&self, l: usize) -> Option<[TensorRef<'_>; 2]> {
        let &(ga, ua) = self.resident_at.get(l)?;
        let g = self.image.geometry(l);
        let (gt, ut, _) = g.types().expect("checked at open");
        let (gb, ub, _) = g.part_bytes().expect("checked at open");
        let n = g.neurons as usize;
        let rows = |ty, at: usize, bytes: usize| TensorRef {
            ty,
            cols: g.dim as usize,
            rows: n,
            data: &self.resident[at..at + n * bytes],
        };
        Some([rows(gt, ga, gb), rows(ut, ua, ub)])
    }

    /// Bytes of the resident rows (outside the board's budgets, as the CPU's copy).
    pub(super) fn resident_bytes(&self) -> usize {
        self.resident.len()
    }
}

/// The streamed FFN's state on a GPU engine. Fields drop in order: the cache, which borrows
/// `memory`'s mapping, goes before it.
pub(super) struct GpuStream<'a> {
    ffn: GpuStreamedFfn,
    parts: StreamParts<'a>,
    view: CacheView,
    /// Per layer: the calibrated threshold of |SiLU(gate) * up|.
    thresholds: Vec<f32>,
    /// Per layer: the dropped-neuron means by image slot (`slot_floats` each), and their
    /// contribution down x means (dim each); None: a dropped neuron counts as zero.
    dropped: Option<(DeviceBuffer, DeviceBuffer)>,
    slot_floats: usize,
    /// The oracle and `stale` choose from every neuron's activation (the resident rows).
    resident: bool,
    // Host scratch, made at boot: the residual and the FFN's input, every neuron's activation
    // (resident), the FFN's output (tables reading it), per block its priority and whether a
    // chosen neuron uses it, the blocks in priority order, the chosen neurons.
    residual: Vec<f32>,
    input: Vec<f32>,
    act: Vec<f32>,
    out: Vec<f32>,
    prio: Vec<f32>,
    used_mark: Vec<bool>,
    used: Vec<u32>,
    order: Vec<u32>,
    idx: Vec<u32>,
    h: Vec<f32>,
    stats: StreamStats,
    error: Option<ReadError>,
    loading_by_priority: bool,
    /// Speculate-and-refine: the stages of each layer after which the next layer's reads are
    /// re-ranked as boot chose them (0: no look-ahead; a LUT's plan may change it per layer),
    /// the reads queued ahead, and the partial residual.
    refine: usize,
    /// The controller's plan in force (lanes, the kernel's share of the GPU, read-ahead
    /// stages) and its profiling: the CPU's `Control`.
    control: Control,
    ahead: ReadAhead<'a>,
    stage_x: Vec<f32>,
    /// The cache's arena; held, not read.
    _memory: CacheMemory,
}

impl<'a> GpuStream<'a> {
    /// The stream for engine `e` (booted without one): the cache in pinned memory of the
    /// image's budget, at most `ffn_budget` bytes (the board's `ffn_cache`), the lanes' flags
    /// and buffers from their arenas, the predictor's buffers from `scratch`.
    pub(super) fn boot(
        e: &CudaEngine<'_>,
        p: Prepared<'_>,
        ffn_budget: usize,
        flags: &'a mut [u32],
        staging: &'a mut [u8],
        scratch: &mut Carver<'a>,
    ) -> Result<GpuStream<'a>, EngineError> {
        let Prepared { boot, image, .. } = p;
        let (so, ffn_opts) = (boot.stream, boot.ffn);
        let gpu = &e.gpu;
        let h = &e.hyper;
        let (slots, slot_bytes) = StreamedFfn::slots(&image, so.budget);
        let stride = slot_bytes.div_ceil(crate::boot::SLICE_ALIGN) * crate::boot::SLICE_ALIGN;
        // More than the budget is refused by the cache itself, naming both.
        let bytes = stride.saturating_mul(slots).min(ffn_budget).max(1);
        let mut memory = CacheMemory::new(gpu, e.memory, bytes).map_err(cuda)?;
        let (arena, view) = memory.split();
        // SAFETY: the arena is `memory`'s pinned mapping, which lives as long as the
        // `GpuStream` that owns both and is dropped after `parts` (fields drop in order); no
        // other reference to it is made while `parts.cache` holds this one.
        let arena: &'a mut [u8] =
            unsafe { std::slice::from_raw_parts_mut(arena.as_mut_ptr(), arena.len()) };
        let mut parts = StreamParts::boot(image, so, arena, flags, staging, scratch)
            .map_err(EngineError::Stream)?;
        let refine =
            refine_stages(so, &parts.predictor).map_err(|e| EngineError::Stream(e.into()))?;
        let mut control = Control::new(refine);
        control
            .load(so, &parts.image, &mut parts.lanes)
            .map_err(EngineError::Stream)?;
        let ahead =
            ReadAhead::new(scratch, parts.largest).map_err(|e| EngineError::Stream(e.into()))?;
        let image = &parts.image;
        let per_block = (0..image.layers())
            .map(|l| image.geometry(l).per_block as usize)
            .max()
            .unwrap_or(1);
        let ffn = GpuStreamedFfn::new(
            gpu,
            e.memory,
            h.dim,
            parts.largest,
            per_block,
            refine.max(MAX_PLAN_STAGES),
            parts.cache.slots(),
        )
        .map_err(cuda)?;
        let thresholds = ffn_opts
            .thresholds
            .clone()
            .ok_or_else(|| options("the streamed FFN needs the thresholds table".into()))?;
        let slot_floats = parts.largest * per_block;
        let dropped = match &ffn_opts.dropped {
            None => None,
            Some(d) => {
                let n = h.hidden_dim;
                let mut by_slot = vec![0f32; image.layers() * slot_floats];
                for l in 0..image.layers() {
                    for j in 0..n {
                        let (b, i) = image.slot_of(l, j);
                        let k = image.geometry(l).per_block as usize;
                        by_slot[l * slot_floats + b * k + i] = d.mean[l * n + j];
                    }
                }
                let means = gpu.alloc(4 * by_slot.len()).map_err(cuda)?;
                upload_f32(gpu, means.ptr, &by_slot).map_err(cuda)?;
                let offsets = gpu.alloc(4 * d.offset.len()).map_err(cuda)?;
                upload_f32(gpu, offsets.ptr, &d.offset).map_err(cuda)?;
                Some((means, offsets))
            }
        };
        let blocks = parts.largest;
        Ok(GpuStream {
            ffn,
            view,
            thresholds,
            dropped,
            slot_floats,
            resident: so.replay.is_none()
                && matches!(so.predict, PredictKind::Oracle | PredictKind::Stale),
            residual: vec![0.0; h.dim],
            input: vec![0.0; h.dim],
            act: vec![0.0; h.hidden_dim],
            out: vec![0.0; h.dim],
            prio: vec![0.0; blocks],
            used_mark: vec![false; blocks],
            used: Vec::with_capacity(blocks),
            order: Vec::with_capacity(blocks),
            idx: Vec::with_capacity(h.hidden_dim),
            h: Vec::with_capacity(h.hidden_dim),
            stats: StreamStats::default(),
            error: None,
            loading_by_priority: Prioritization::default().loading,
            refine,
            control,
            ahead,
            stage_x: vec![0.0; h.dim],
            parts,
            _memory: memory,
        })
    }

    pub(super) fn stats(&self) -> StreamStats {
        StreamStats {
            cache: self.parts.cache.stats(),
            ..self.stats
        }
    }

    pub(super) fn take_error(&mut self) -> Option<ReadError> {
        self.error.take()
    }

    pub(super) fn begin_sequence(&mut self) {
        self.parts.predictor.reset();
        self.ahead.forget();
    }

    /// After how many stages of each FFN the next layer's reads are re-ranked (0: no
    /// look-ahead; `StreamOptions::refine_stages`, as on the CPU).
    pub(super) fn refine_stages(&self) -> usize {
        self.refine
    }

    /// Layer `l`'s blocks for the input now in `input`/`residual` (and `act`, resident), into
    /// `order` (highest priority first when loading by priority, else ascending). `first`: the
    /// sequence's first position, where every block is read (the attention sink:
    /// engine/stream_ffn.rs says why).
    fn choose(&mut self, l: usize, first: bool) {
        let image = &self.parts.image;
        let blocks = image.blocks(l);
        let prio = &mut self.prio[..blocks];
        self.idx.clear();
        self.h.clear();
        self.used.clear();
        if self.resident {
            let thr = self.thresholds[l];
            for (j, &a) in self.act.iter().enumerate() {
                if a.abs() >= thr {
                    self.idx.push(j as u32);
                    self.h.push(a);
                    let b = image.block_of(l, j);
                    if !self.used_mark[b] {
                        self.used_mark[b] = true;
                        self.used.push(b as u32);
                    }
                }
            }
            for &b in &self.used {
                self.used_mark[b as usize] = false;
            }
        }
        // Guessed from this very input when the last layer finished, or asked now.
        if !self.ahead.take_last(l, prio) {
            self.parts.predictor.priorities(
                l,
                0,
                &self.input,
                &self.residual,
                (&self.idx, &self.h),
                &self.used,
                image,
                prio,
            );
        }
        self.ahead.forget();
        if first && self.parts.predictor.reads_all_at_first() {
            prio.fill(1.0);
        }
        self.order.clear();
        self.order
            .extend((0..blocks as u32).filter(|&b| prio[b as usize] > 0.0));
        // Highest priority first, ties by block (an unstable sort: no buffer to allocate);
        // without prioritized loading, in layout order as filtered.
        if self.loading_by_priority {
            self.order.sort_unstable_by(|&a, &b| {
                prio[b as usize]
                    .total_cmp(&prio[a as usize])
                    .then(a.cmp(&b))
            });
        }
        if self.resident {
            let missed = self
                .idx
                .iter()
                .filter(|&&j| prio[image.block_of(l, j as usize)] <= 0.0)
                .count();
            self.stats.chosen += self.idx.len() as u64;
            self.stats.missed += missed as u64;
        }
    }

    /// Layer `l` starts with its blocks chosen: the controller's plan for its R (the lanes'
    /// limits, the kernel's grid, the read-ahead stages).
    fn begin_layer(&mut self, l: usize) {
        let p = &mut self.parts;
        let remaining = if self.control.wants_remaining() {
            remaining_bytes(&p.image, &p.cache, p.base[l], l, &self.prio)
        } else {
            0
        };
        let reads_ahead = p.predictor.reads_ffn_output();
        let bytes = p.cache.stats().bytes_read;
        let grid = self.ffn.grid() as usize;
        self.control
            .begin_layer(l, grid, remaining, reads_ahead, &mut p.lanes, bytes);
        self.ffn.grid_cap = self.control.workers as u32;
    }

    /// Keeps the first failure of the request (the step goes on; the request ends with it).
    fn fail(&mut self, e: GpuStreamError) -> CudaResult<()> {
        let err = match e {
            GpuStreamError::Cuda(e) => return Err(e),
            GpuStreamError::Read(r) => r,
            GpuStreamError::Missing { block } => ReadError {
                block,
                file: self.parts.file,
                offset: 0,
                len: 0,
                attempts: 1,
                kind: ReadErrorKind::Stalled,
            },
            GpuStreamError::Io(io) => ReadError {
                block: 0,
                file: self.parts.file,
                offset: 0,
                len: 0,
                attempts: 1,
                kind: ReadErrorKind::Io(io.raw_os_error().unwrap_or(EIO)),
            },
            GpuStreamError::Request(_) => {
                panic!("a checked image's block read was refused: {e}")
            }
            GpuStreamError::Type { .. } => unreachable!("types are checked at boot: {e}"),
        };
        self.error.get_or_insert(err);
        Ok(())
    }
}

/// Stages the kernel is made for beside boot's `refine_stages`, so that a controller's plan can
/// read ahead after up to this many (a plan asking for more gets this many).
const MAX_PLAN_STAGES: usize = 8;

/// EIO, for a backend failure that carries no errno.
const EIO: i32 = 5;

impl CudaEngine<'_> {
    /// One step at `pos` with the FFN streamed (the token is in the device state).
    pub(super) fn streamed_step(&mut self, pos: usize) -> CudaResult<()> {
        let mut s = self.stream.take().expect("a streamed engine");
        let done = self.streamed_layers(&mut s, pos);
        s.stats.tokens += 1;
        self.stream = Some(s);
        done
    }

    fn streamed_layers(&self, s: &mut GpuStream<'_>, pos: usize) -> CudaResult<()> {
        let (g, a, h) = (&self.gpu, &self.a, &self.hyper);
        self.timeline_restart();
        self.record_embed()?;
        for (l, w) in self.layers.iter().enumerate() {
            // 1. Attention; its last product leaves the FFN's normed input in xf.
            self.record_attention(l, w)?;

            // 2. Which blocks.
            if s.resident {
                for (i, &(m, off)) in w.gate_up.iter().enumerate() {
                    let fin = if w.gate_up_tiled {
                        Finish::SwiGluTiles
                    } else if i + 1 == w.gate_up.len() {
                        Finish::SwiGlu
                    } else {
                        Finish::None
                    };
                    self.matvec(
                        &m,
                        Input::Prepared,
                        a.gu + off as u64 * 4,
                        0,
                        false,
                        fin,
                        None,
                        (ProductRole::GateUp, Some(l)),
                    )?;
                }
                g.download_async(f32_bytes(&mut s.act), a.hf)?;
            }
            g.download_async(f32_bytes(&mut s.input), a.xf)?;
            // The residual only for a table that reads the previous FFN's output.
            if s.parts.predictor.reads_ffn_output() {
                g.download_async(f32_bytes(&mut s.residual), a.x)?;
            }
            g.sync()?;
            s.choose(l, pos == 0);
            s.begin_layer(l);

            // 3. The blocks, computed as they land. Speculate-and-refine: after each stage
            // but the last, layer l + 1's reads are re-ranked from the residual plus the output
            // so far (Algorithm 1).
            let ahead = s.control.refine > 0 && l + 1 < self.layers.len();
            let stages = if ahead { s.control.refine } else { 1 };
            let started = Instant::now();
            let GpuStream {
                ffn,
                parts,
                view,
                thresholds,
                dropped,
                slot_floats,
                order,
                ahead: read_ahead,
                stage_x,
                residual,
                stats,
                ..
            } = &mut *s;
            let StreamParts {
                image,
                file,
                lanes,
                cache,
                predictor,
                base,
                ..
            } = parts;
            let (image, file, base) = (&*image, *file, &*base);
            let req = LayerBlocks {
                image,
                file,
                layer: l,
                base: base[l],
                order,
                means: dropped
                    .as_ref()
                    .map_or(0, |(m, _)| m.ptr + (4 * l * *slot_floats) as u64),
            };
            let mut on_stage =
                |stage: usize, out: &[f32], lanes: &mut Lanes, cache: &mut WeightCache| {
                    if !ahead || stage + 1 >= stages {
                        return;
                    }
                    for ((x, r), o) in stage_x.iter_mut().zip(residual.iter()).zip(out) {
                        *x = r + o;
                    }
                    let n = image.blocks(l + 1);
                    predictor.priorities_from(l + 1, stage_x, image, &mut read_ahead.guess[..n]);
                    // Not started here: this layer's run polls the lanes and takes its own
                    // arrivals.
                    stats.ahead +=
                        read_ahead.submit(l + 1, false, image, file, base[l + 1], lanes, cache);
                };
            let ran = ffn.run_layer(
                g,
                *view,
                req,
                stages,
                a.xf,
                thresholds[l],
                lanes,
                cache,
                &mut on_stage,
            );
            s.stats.io_wait_ns += started.elapsed().as_nanos() as u64;
            let io = ran.as_ref().map_or_else(|_| started.elapsed(), |st| st.io);
            if let Err(e) = ran {
                s.fail(e)?;
            }
            if s.parts.predictor.reads_ffn_output() {
                g.download_async(f32_bytes(&mut s.out), s.ffn.output())?;
                g.sync()?;
                s.parts.predictor.after_ffn(0, &s.residual, &s.out);
            }
            if ahead {
                // The next layer's own prediction (its table reads this very residual): queued
                // now, and taken as its choice.
                let p = &mut s.parts;
                let n = p.image.blocks(l + 1);
                p.predictor
                    .priorities_after(l, 0, &p.image, &mut s.ahead.guess[..n]);
                s.stats.ahead += s.ahead.submit(
                    l + 1,
                    true,
                    &p.image,
                    p.file,
                    p.base[l + 1],
                    &mut p.lanes,
                    &mut p.cache,
                );
                // This layer is done: nothing waits for an arrival taken in here.
                ReadAhead::start(&mut p.lanes, &mut p.cache);
            }
            let bytes = s.parts.cache.stats().bytes_read;
            s.control.end_layer(l, io, bytes);

            // 4. Into the residual, normed for the next product.
            let next_norm = self
                .layers
                .get(l + 1)
                .map_or(self.output_norm, |n| n.attn_norm);
            let offset = s
                .dropped
                .as_ref()
                .map_or(0, |(_, o)| o.ptr + (4 * l * h.dim) as u64);
            g.launch(
                self.k.add_norm,
                1,
                1024,
                KernelArgs::default()
                    .ptr(a.x)
                    .ptr(s.ffn.output())
                    .ptr(offset)
                    .i32(h.dim as i32)
                    .ptr(next_norm)
                    .f32(h.norm_eps)
                    .ptr(a.xf)
                    .ptr(a.xq),
            )?;
        }
        self.record_head()
    }

    /// What the streamed FFN has done since boot or the last reset (None: the FFN is in
    /// memory).
    pub fn stream_stats(&self) -> Option<StreamStats> {
        self.stream.as_ref().map(GpuStream::stats)
    }

    /// After how many stages of each FFN the next layer's reads are re-ranked (None: the FFN
    /// is in memory; 0: no look-ahead).
    pub fn refine_stages(&self) -> Option<usize> {
        self.stream.as_ref().map(GpuStream::refine_stages)
    }

    /// Applies `lut` from the next layer on (`None`: the board's maxima and boot's read-ahead),
    /// as `--controller` does at boot. Refused for another board or layer count, or a plan
    /// beyond the board; nothing when the FFN is in memory.
    pub fn set_controller(&mut self, lut: Option<Lut>) -> Result<(), LutError> {
        match self.stream.as_mut() {
            Some(s) => {
                let layers = s.parts.image.layers();
                s.control.set(lut, layers, &mut s.parts.lanes)?;
                s.ffn.grid_cap = 0;
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Starts (or stops) recording a [`LayerSample`] per layer-step (offline: it allocates).
    pub fn set_stream_profiling(&mut self, on: bool) {
        if let Some(s) = self.stream.as_mut() {
            s.control.set_profiling(on);
        }
    }

    /// The layer-steps recorded since profiling started (or the last call).
    pub fn take_stream_samples(&mut self) -> Vec<LayerSample> {
        self.stream
            .as_mut()
            .map(|s| s.control.take_samples())
            .unwrap_or_default()
    }

    /// Switches the prioritization's parts (the ablation); nothing when the FFN is in memory.
    pub fn set_prioritization(&mut self, p: Prioritization) {
        if let Some(s) = self.stream.as_mut() {
            s.ffn.whole_layer_first = !p.compute;
            s.loading_by_priority = p.loading;
        }
    }

    /// Starts the streamed FFN's counts again (a benchmark's warm-up is over).
    pub fn reset_stream_stats(&mut self) {
        if let Some(s) = self.stream.as_mut() {
            s.parts.cache.reset_stats();
            s.stats = StreamStats::default();
        }
    }
}
