//! The FFN streamed from a flash image (LeanStream paper 3.2; DESIGN.md section 6): per token
//! and layer, which neurons are needed ([`PredictKind`]), their blocks requested from the I/O
//! lanes into the weight cache, and the FFN computed over the blocks as they arrive.
//!
//! Which neurons:
//! - `oracle` and `stale`: the sparse FFN's own choice (`SparseFfn::choose`: the calibrated
//!   thresholds, or top-k) over the gate and up rows of a resident copy made at boot from the
//!   image, kept outside the board's budget and not counted. With `oracle` the lanes read
//!   exactly the blocks of the chosen neurons (the upper bound on prediction); with `stale`
//!   the previous token's blocks, and chosen neurons in blocks that were not read are dropped
//!   (they count with their calibrated mean, as every dropped neuron does).
//! - the learned predictors (`hash`, `dejavu`, ...; `stream_predict`): the table picks the
//!   blocks from the layer's input alone, no resident copy exists, and the runs compute the
//!   read neurons' gate and up from the cached rows as their blocks arrive; the neurons at the
//!   calibrated threshold are then summed. A neuron not read counts with its mean.
//!
//! Order-free and exact: the chosen neurons (ascending) are cut into runs of
//! `axpy::ROWS_PER_TASK`, as the in-memory sparse FFN's down projection cuts them; a run is
//! summed (`axpy_run`) as soon as every block it needs has arrived, into its own partial, and
//! the partials are added in run order at the end. So the output is the in-memory FFN's over
//! the same neurons, bit for bit, whatever order the blocks arrive in (with a learned
//! predictor the down runs start once the layer's reads are in: which neurons pass the
//! threshold is known only then).
//!
//! Blocks a layer needs are pinned in the cache from their arrival (or hit) until the layer
//! is done, so no read of the same layer can evict one before its run is summed (the lanes pin
//! each block that arrives until its arrival is handed out); boot refuses a cache smaller than
//! the largest layer plus the reads in flight plus the hot blocks. A read that fails after its retries
//! leaves its neurons out (zero rows), and the first such error is kept for the caller
//! ([`StreamedFfn::take_error`]): the request ends with it.

use super::stream_predict::{BlockPredictor, PredictorBootError};
use super::{Disjoint, StreamBootError, StreamOptions, StreamStats};
use crate::backend::cpu::axpy::{axpy_run, ROWS_PER_TASK};
use crate::backend::cpu::sparse_ffn::SparseFfn;
use crate::backend::cpu::{ActScratch, KernelSet, Rows, Tile, WorkerPool};
use crate::boot::{Carver, Plan};
use crate::model::flash::{FlashError, FlashImage, LayerGeometry};
use crate::model::Hyper;
use crate::ops::silu;
use crate::predict::reuse::ReuseTable;
use crate::predict::PredictKind;
use crate::stream::backend::best_backend;
use crate::stream::fault::FaultBackend;
use crate::stream::{
    flags_from_words, BlockId, BlockRead, CacheBudget, FileId, LaneConfig, Lanes, Policy,
    ReadError, ReadErrorKind, RequestError, Requested, StreamError, WeightCache, FLAG_FAILED,
};
use std::time::Instant;

mod ahead;
mod blocks;
mod boot;
mod control;
mod refine;

pub use ahead::ReadAhead;
pub use boot::{hot_count, most_used, resident_rows, StreamParts};

use control::run_capped;
pub use control::{remaining_bytes, Control};

/// Marks in `mark` (per block of the current layer).
const UNSEEN: u32 = 0;
const SEEN: u32 = 1;
/// A block whose arrival the runs wait for.
const PENDING: u32 = 2;
/// A block this layer pinned (in `pinned`, unpinned when the layer is done).
const HELD: u32 = 3;
/// Not a chosen neuron (`pos_of`).
const NONE: u32 = u32::MAX;

/// The streamed FFN of every layer: the image, the lanes, the cache, and per-token buffers.
pub struct StreamedFfn<'a> {
    image: FlashImage,
    file: FileId,
    lanes: Lanes<'a>,
    cache: WeightCache<'a>,
    predictor: BlockPredictor<'a>,
    /// Layer l's blocks are global ids `base[l]..base[l + 1]`.
    base: Vec<u32>,
    /// The oracle's resident gate and up rows, neuron order, per layer: (gate at, up at).
    resident: Vec<u8>,
    resident_at: Vec<(usize, usize)>,
    dim: usize,
    // Per-token buffers, carved from the scratch arena.
    prio: &'a mut [f32],
    mark: &'a mut [u32],
    used: &'a mut [u32],
    pinned: &'a mut [u32],
    pos_of: &'a mut [u32],
    pending: &'a mut [u32],
    done: &'a mut [u32],
    ready: &'a mut [u32],
    partials: &'a mut [f32],
    zero_row: &'a [u8],
    /// Speculate-and-refine (`StreamOptions::refine_stages`): after each of this many stages of
    /// a layer's FFN, the next layer's reads are re-ranked from the partial residual (0: off).
    refine_stages: usize,
    /// The controller's plan in force and its profiling (`control`).
    control: Control,
    /// The next layer's reads queued ahead.
    ahead: ReadAhead<'a>,
    /// The partial residual of the stages done so far.
    stage_x: &'a mut [f32],
    /// Per run: its |activation| mass, and the runs in descending mass (the stages' order).
    run_mass: &'a mut [f32],
    run_order: &'a mut [u32],
    error: Option<ReadError>,
    stats: StreamStats,
    /// Each layer-step's requested blocks (global ids), when recording (the bench's Belady
    /// floor): off by default, since it allocates.
    recorded: Option<Vec<Vec<BlockId>>>,
}

/// The geometry every layer of an image shares with the model (checked at boot).
fn max_blocks(image: &FlashImage) -> usize {
    (0..image.layers())
        .map(|l| image.blocks(l))
        .max()
        .unwrap_or(0)
}

/// The read-ahead stages `opts` ask of `predictor` (CPU and GPU alike): K > 0 only with a
/// table reading the residual after the previous FFN; by default 1 with such a table (it
/// guesses the next layer as soon as this one is done: no extra prediction, the reads start
/// earlier), else 0.
pub fn refine_stages(
    opts: &StreamOptions,
    predictor: &BlockPredictor,
) -> Result<usize, PredictorBootError> {
    match opts.refine_stages {
        Some(k) if k > 0 && !predictor.reads_ffn_output() => Err(PredictorBootError::Refine),
        Some(k) => Ok(k),
        None => Ok(usize::from(predictor.reads_ffn_output())),
    }
}

fn runs(hidden: usize) -> usize {
    hidden.div_ceil(ROWS_PER_TASK).max(1)
}

impl<'a> StreamedFfn<'a> {
    /// Opens the image and checks it against the model `h` and this board.
    pub fn open_image(opts: &StreamOptions, h: &Hyper) -> Result<FlashImage, FlashError> {
        let image = FlashImage::open(&opts.image)?;
        image.check_board(crate::board::NAME)?;
        if image.layers() != h.n_layers {
            return Err(FlashError::Geometry {
                layer: image.layers().min(h.n_layers),
                what: "layer count",
            });
        }
        for l in 0..image.layers() {
            let g = image.geometry(l);
            if g.neurons as usize != h.hidden_dim || g.dim as usize != h.dim {
                return Err(FlashError::Geometry {
                    layer: l,
                    what: "FFN shape",
                });
            }
        }
        Ok(image)
    }

    /// Cache slots the budget buys (at least the largest layer's blocks: checked by `new`).
    pub fn slots(image: &FlashImage, budget: CacheBudget) -> (usize, usize) {
        let slot = (0..image.layers())
            .map(|l| image.geometry(l).block_bytes as usize)
            .max()
            .unwrap_or(1);
        let ffn: usize = (0..image.layers())
            .map(|l| image.blocks(l) * image.geometry(l).block_bytes as usize)
            .sum();
        (budget.slots(ffn, slot), slot)
    }

    /// What [`new`](Self::new) carves from the scratch arena.
    pub fn plan_scratch(plan: &mut Plan, image: &FlashImage, h: &Hyper, predict: PredictKind) {
        let blocks = max_blocks(image);
        plan.add::<f32>(blocks);
        for _ in 0..3 {
            plan.add::<u32>(blocks);
        }
        plan.add::<u32>(h.hidden_dim);
        for _ in 0..3 {
            plan.add::<u32>(runs(h.hidden_dim));
        }
        plan.add::<f32>(runs(h.hidden_dim) * h.dim);
        plan.add::<u8>(Self::down_row_bytes(image));
        plan.add::<f32>(blocks);
        plan.add::<f32>(blocks);
        plan.add::<f32>(h.dim);
        plan.add::<f32>(runs(h.hidden_dim));
        plan.add::<u32>(runs(h.hidden_dim));
        BlockPredictor::plan(plan, predict, image.layers(), blocks, (h.dim, h.hidden_dim));
    }

    fn down_row_bytes(image: &FlashImage) -> usize {
        (0..image.layers())
            .filter_map(|l| image.geometry(l).part_bytes().map(|p| p.2))
            .max()
            .unwrap_or(0)
    }

    /// The streamed FFN over `image`: its cache in `ffn` (from `budget.ffn_cache`), one flag per
    /// block in `flags`, the lanes' buffers in `staging`, per-token buffers from `scratch`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        image: FlashImage,
        opts: &StreamOptions,
        ffn: &'a mut [u8],
        flags: &'a mut [u32],
        staging: &'a mut [u8],
        scratch: &mut Carver<'a>,
    ) -> Result<StreamedFfn<'a>, StreamBootError> {
        let StreamParts {
            image,
            file,
            lanes,
            cache,
            predictor,
            base,
            largest,
        } = StreamParts::boot(image, opts, ffn, flags, staging, scratch)?;
        let (resident, resident_at) = if opts.predict.needs_table() || opts.replay.is_some() {
            (Vec::new(), Vec::new())
        } else {
            resident_rows(&image)
        };
        let dim = image.geometry(0).dim as usize;
        let hidden = image.geometry(0).neurons as usize;
        let zero_row = scratch.take::<u8>(Self::down_row_bytes(&image))?;
        zero_row.fill(0);
        let refine_stages = refine_stages(opts, &predictor)?;
        let mut s = StreamedFfn {
            file,
            lanes,
            cache,
            predictor,
            base,
            resident,
            resident_at,
            dim,
            prio: scratch.take(largest)?,
            mark: scratch.take(largest)?,
            used: scratch.take(largest)?,
            pinned: scratch.take(largest)?,
            pos_of: scratch.take(hidden)?,
            pending: scratch.take(runs(hidden))?,
            done: scratch.take(runs(hidden))?,
            ready: scratch.take(runs(hidden))?,
            partials: scratch.take(runs(hidden) * dim)?,
            zero_row,
            refine_stages,
            control: Control::new(refine_stages),
            ahead: ReadAhead::new(scratch, largest)?,
            stage_x: scratch.take(dim)?,
            run_mass: scratch.take(runs(hidden))?,
            run_order: scratch.take(runs(hidden))?,
            error: None,
            stats: StreamStats::default(),
            recorded: None,
            image,
        };
        s.prio.fill(0.0);
        s.mark.fill(UNSEEN);
        s.pos_of.fill(NONE);
        s.control.load(opts, &s.image, &mut s.lanes)?;
        Ok(s)
    }

    /// Layer `l`'s block `b` as the lanes and the cache number it.
    pub fn block_id(&self, l: usize, b: usize) -> BlockId {
        self.base[l] + b as BlockId
    }

    pub fn image(&self) -> &FlashImage {
        &self.image
    }

    pub fn cache_slots(&self) -> (usize, usize) {
        (self.cache.slots(), self.cache.slot_bytes())
    }

    /// Whether the lanes read the image with O_DIRECT (the page cache cannot serve them).
    pub fn direct(&self) -> bool {
        self.lanes.is_direct(self.file)
    }

    pub fn backend_name(&self) -> &'static str {
        self.lanes.backend_name()
    }

    pub fn stats(&self) -> StreamStats {
        StreamStats {
            cache: self.cache.stats(),
            ..self.stats
        }
    }

    pub fn reset_stats(&mut self) {
        self.cache.reset_stats();
        self.stats = StreamStats::default();
    }

    /// Starts (or stops) recording each layer-step's requested blocks; what was recorded so far
    /// is dropped. Recording allocates: the bench uses it, the serving paths never.
    pub fn set_recording(&mut self, on: bool) {
        self.recorded = on.then(Vec::new);
    }

    /// Layer-steps recorded so far.
    pub fn recorded_steps(&self) -> usize {
        self.recorded.as_ref().map_or(0, Vec::len)
    }

    /// The layer-steps recorded since recording started (or the last call).
    pub fn take_recorded(&mut self) -> Vec<Vec<BlockId>> {
        self.recorded
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The first read that failed since the last call (the request it happened in ends).
    pub fn take_error(&mut self) -> Option<ReadError> {
        self.error.take()
    }

    /// A new sequence: the stale predictor forgets the last token.
    pub fn reset_sequence(&mut self) {
        self.predictor.reset();
        self.ahead.forget();
    }

    /// After how many stages of each FFN the next layer's reads are re-ranked (0: no look-ahead).
    pub fn refine_stages(&self) -> usize {
        self.refine_stages
    }

    /// Counts `n` tokens run through every layer.
    pub fn end_tokens(&mut self, n: usize) {
        self.stats.tokens += n as u64;
    }

    /// Layer `l`'s resident gate and up rows (the oracle's copy).
    fn score_rows(&self, l: usize) -> (Rows<'_>, Rows<'_>) {
        let g: &LayerGeometry = self.image.geometry(l);
        let (gt, ut, _) = g.types().expect("checked geometry");
        let (gb, ub, _) = g.part_bytes().expect("checked geometry");
        let n = g.neurons as usize;
        let (ga, ua) = self.resident_at[l];
        let rows = |ty, stride, at: usize| Rows {
            ty,
            q: None,
            rows: n,
            cols: self.dim,
            stride,
            tile: Tile::NONE,
            data: &self.resident[at..at + n * stride],
        };
        (rows(gt, gb, ga), rows(ut, ub, ua))
    }

    fn read(&self, l: usize, b: usize) -> BlockRead {
        let (offset, len) = self.image.block_extent(l, b);
        BlockRead {
            file: self.file,
            offset,
            len: len as u32,
            block: self.block_id(l, b),
        }
    }

    /// Layer `l`'s FFN for the input `x` (the normed `residual`), into `x`; `t` is the token's
    /// row in a prefill batch (0 when decoding), `first` whether it is at the sequence's first
    /// position. `ahead`: one token runs through the layers (a decode step), so the next
    /// layer's reads may be queued while this one runs (speculate-and-refine, with a table
    /// reading the residual after the previous FFN).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_layer(
        &mut self,
        l: usize,
        t: usize,
        first: bool,
        residual: &[f32],
        ahead: bool,
        sparse: &mut SparseFfn,
        ks: KernelSet,
        pool: &WorkerPool,
        x: &mut [f32],
        act: &mut ActScratch,
    ) {
        let blocks = self.image.blocks(l);
        if self.predictor.is_learned() {
            // A learned predictor picks the blocks from x alone: every neuron of a wanted
            // block is read, and the runs compute their gate and up once the block is in.
            let prio = &mut self.prio[..blocks];
            // Guessed from this very input when the last layer finished, or asked now.
            if !self.ahead.take_last(l, prio) {
                self.predictor
                    .priorities(l, t, x, residual, (&[], &[]), &[], &self.image, prio);
            }
            if first && self.predictor.reads_all_at_first() {
                // The first position is the attention sink: a few neurons fire there by the
                // hundreds and almost nowhere else (Qwen2.5-0.5B: 110-284 at layers 2, 3 and
                // 21, under 1 at every other position), once per sequence, too rare for a
                // table to learn, and missing one ruins the sequence (perplexity x5). So it
                // reads every block and keeps what the thresholds keep, as the oracle does.
                prio.fill(1.0);
            }
            self.ahead.forget();
            let n = self.image.geometry(l).neurons as usize;
            let (idx, _) = sparse.chosen(n);
            let mut k = 0;
            for j in 0..n {
                if prio[self.image.block_of(l, j)] > 0.0 {
                    idx[k] = j as u32;
                    k += 1;
                }
            }
            self.record(l);
            let refine =
                (ahead && self.predictor.reads_ffn_output() && l + 1 < self.image.layers())
                    .then_some(residual);
            self.stream_runs(l, k, refine, sparse, ks, pool, x, act);
            self.predictor.after_ffn(t, residual, x);
            if ahead && self.control.refine > 0 && l + 1 < self.image.layers() {
                let n = self.image.blocks(l + 1);
                self.predictor
                    .priorities_after(l, t, &self.image, &mut self.ahead.guess[..n]);
                self.submit_ahead(l + 1, true);
            }
            return;
        }
        let (gate, up) = self.score_rows(l);
        let k = sparse.choose(l, gate, up, ks, pool, x, act);
        let (idx, h) = sparse.chosen(k);

        // The blocks this token really uses, and what the predictor wants read.
        let mut used_n = 0;
        for &n in idx.iter() {
            let b = self.image.block_of(l, n as usize);
            if self.mark[b] == UNSEEN {
                self.mark[b] = SEEN;
                self.used[used_n] = b as u32;
                used_n += 1;
            }
        }
        let prio = &mut self.prio[..blocks];
        self.predictor.priorities(
            l,
            t,
            x,
            residual,
            (&idx[..k], &h[..k]),
            &self.used[..used_n],
            &self.image,
            prio,
        );
        for &b in &self.used[..used_n] {
            self.mark[b as usize] = UNSEEN;
        }

        self.record(l);
        // Neurons whose blocks will not be read are dropped (kept order).
        let mut k2 = 0;
        for i in 0..k {
            if self.prio[self.image.block_of(l, idx[i] as usize)] > 0.0 {
                idx[k2] = idx[i];
                h[k2] = h[i];
                k2 += 1;
            }
        }
        self.stats.chosen += k as u64;
        self.stats.missed += (k - k2) as u64;
        self.stream_runs(l, k2, None, sparse, ks, pool, x, act);
    }

    /// The down projection over the `k2` neurons `sparse.chosen` holds (ascending), in runs
    /// of `ROWS_PER_TASK` each summed as soon as its blocks are in, then the partials in run
    /// order. With a learned predictor the neurons are those read: each run computes their
    /// gate and up from the cached rows as soon as its blocks are in (with the in-memory
    /// kernel's pairing, so the values are its own), and once all are in, the neurons at the
    /// layer's threshold are summed in runs as the in-memory FFN cuts them: the same output,
    /// bit for bit, as the oracle's when the read set holds every neuron it would choose.
    #[allow(clippy::too_many_arguments)]
    fn stream_runs(
        &mut self,
        l: usize,
        k2: usize,
        refine: Option<&[f32]>,
        sparse: &mut SparseFfn,
        ks: KernelSet,
        pool: &WorkerPool,
        x: &mut [f32],
        act: &mut ActScratch,
    ) {
        let learned = self.predictor.is_learned();
        let blocks = self.image.blocks(l);
        let parts = sparse.run_parts(l, k2);
        let (idx, h, acts, thr, mean) = (
            &mut parts.idx[..k2],
            &mut parts.h[..k2],
            parts.acts,
            parts.threshold,
            parts.mean,
        );
        for (i, &n) in idx.iter().enumerate() {
            self.pos_of[n as usize] = i as u32;
        }

        self.begin_layer(l, pool.n_threads());
        let workers = self.control.workers;
        // Request every wanted block; hits are pinned at once, misses when they arrive.
        let mut pinned_n = 0;
        let mut waited = std::time::Duration::ZERO;
        for b in 0..blocks {
            if self.prio[b] <= 0.0 {
                continue;
            }
            let read = self.read(l, b);
            loop {
                match self.lanes.request(read, self.prio[b], &mut self.cache) {
                    Ok(Requested::Cached(_)) => {
                        self.hold(l, b, &mut pinned_n);
                        break;
                    }
                    Ok(_) => break,
                    Err(RequestError::Full { .. }) => {
                        // The queue is full: take in a finished read to make room.
                        let w = Instant::now();
                        let a = self.lanes.wait_next(&mut self.cache);
                        waited += w.elapsed();
                        self.arrived(l, a, &mut pinned_n, false);
                    }
                    Err(e) => panic!("a checked image's block read was refused: {e}"),
                }
            }
        }

        // Runs of ROWS_PER_TASK chosen neurons: each waits for the blocks of its neurons.
        let runs = k2.div_ceil(ROWS_PER_TASK);
        self.pending[..runs].fill(0);
        self.done[..runs].fill(0);
        for (i, &n) in idx.iter().enumerate() {
            let b = self.image.block_of(l, n as usize);
            let gid = self.block_id(l, b);
            if self.cache.slot_of(gid).is_none() && self.cache.flag(gid) != FLAG_FAILED {
                self.pending[i / ROWS_PER_TASK] += 1;
                self.mark[b] = PENDING;
            }
        }
        let mut left = runs;
        let down_ty = self.image.geometry(l).types().expect("checked").2;
        let (gb, ub, _) = self.image.geometry(l).part_bytes().expect("checked");
        let per_block = self.image.geometry(l).per_block as usize;
        let dim = self.dim;
        let (gate_ty, up_ty, _) = self.image.geometry(l).types().expect("checked");
        // The input quantized once for the runs' gate and up dots (learned predictors only).
        let dots = learned.then(|| act.gate_up_dot(ks, gate_ty, up_ty, x));
        while left > 0 {
            let mut r = 0;
            for t in 0..runs {
                if self.done[t] == 0 && self.pending[t] == 0 {
                    self.done[t] = 1;
                    self.ready[r] = t as u32;
                    r += 1;
                }
            }
            if r > 0 {
                let (image, cache) = (&self.image, &self.cache);
                let base = self.base[l];
                let cols = DownColumns::new(image, cache, self.zero_row, base, l);
                let row = |n: u32| cols.get(n);
                let ready = &self.ready[..r];
                let out = Disjoint::new(&mut self.partials[..runs * dim]);
                let (ids_all, hs_all) = (&*idx, &*h);
                let acts_out = Disjoint::new(&mut *acts);
                run_capped(pool, r, workers, &|i| {
                    let t = ready[i] as usize;
                    let ids = &ids_all[t * ROWS_PER_TASK..((t + 1) * ROWS_PER_TASK).min(k2)];
                    let Some(dots) = &dots else {
                        let hs = &hs_all[t * ROWS_PER_TASK..][..ids.len()];
                        // SAFETY: each ready run appears once in `ready`, and run t writes
                        // only its own partial.
                        let o = unsafe { out.slice(t * dim, dim) };
                        return axpy_run(ks, down_ty, ids, &row, hs, o);
                    };
                    // The read neurons' activations from their cached rows, two at a time as
                    // the in-memory FFN pairs them; a failed block's neurons get NaN (never
                    // kept).
                    let (lo, hi) = (ids[0] as usize, ids[ids.len() - 1] as usize);
                    // SAFETY: runs are ascending, disjoint chunks of the read neurons, so their
                    // index ranges lo..=hi do not overlap.
                    let a = unsafe { acts_out.slice(lo, hi + 1 - lo) };
                    let rows = |j: u32| {
                        let (b, i) = image.slot_of(l, j as usize);
                        cache.get(base + b as u32).map(|bytes| {
                            (
                                &bytes[i * gb..][..gb],
                                &bytes[per_block * gb + i * ub..][..ub],
                            )
                        })
                    };
                    for pair in ids.chunks(2) {
                        let (j0, j1) = (pair[0], pair[pair.len() - 1]);
                        let [g0, u0, g1, u1] = match (rows(j0), rows(j1)) {
                            (Some(r0), Some(r1)) => dots.two(r0, r1),
                            (r0, r1) => {
                                let one = |r: Option<(&[u8], &[u8])>| {
                                    r.map_or([f32::NAN; 2], |r| {
                                        let v = dots.two(r, r);
                                        [v[0], v[1]]
                                    })
                                };
                                let ([g0, u0], [g1, u1]) = (one(r0), one(r1));
                                [g0, u0, g1, u1]
                            }
                        };
                        a[j0 as usize - lo] = silu(g0) * u0;
                        a[j1 as usize - lo] = silu(g1) * u1;
                    }
                });
                left -= r;
                continue;
            }
            let w = Instant::now();
            let a = self.lanes.wait_next(&mut self.cache);
            waited += w.elapsed();
            if !self.arrived(l, a, &mut pinned_n, true) {
                // Nothing in flight, yet runs wait: their blocks can never come (the ring
                // failed); they are summed without them and the request ends.
                self.error.get_or_insert(ReadError {
                    block: self.base[l],
                    file: self.file,
                    offset: 0,
                    len: 0,
                    attempts: 0,
                    kind: ReadErrorKind::Io(nix::libc::EIO),
                });
                self.pending[..runs].fill(0);
            }
        }
        // Queued reads of this layer that no run needs are dropped: the layer is done.
        for b in 0..blocks {
            if self.prio[b] > 0.0 {
                self.lanes.cancel(self.block_id(l, b));
                self.mark[b] = UNSEEN;
            }
        }
        self.stats.io_wait_ns += waited.as_nanos() as u64;
        for &n in idx.iter() {
            self.pos_of[n as usize] = NONE;
        }
        let runs = if learned {
            // The read neurons at the threshold, ascending, as the in-memory FFN keeps them,
            // summed in its runs (every block is in and pinned).
            let mut k = 0;
            for i in 0..k2 {
                let j = idx[i] as usize;
                if acts[j].abs() >= thr {
                    idx[k] = j as u32;
                    h[k] = acts[j] - mean[j];
                    k += 1;
                }
            }
            self.stats.chosen += k as u64;
            self.staged_down(l, (&idx[..k], &h[..k]), down_ty, refine, ks, pool)
        } else {
            runs
        };

        // The runs' partials in run order: the in-memory down projection's sum.
        x.fill(0.0);
        for p in self.partials[..runs * dim].chunks_exact(dim) {
            for (o, v) in x.iter_mut().zip(p) {
                *o += v;
            }
        }
        for &b in &self.pinned[..pinned_n] {
            self.cache.unpin(b);
        }
        sparse.add_dropped_offset(l, x);
        self.end_layer(l, waited);
    }
}

/// Layer `l`'s down columns where their blocks sit in the cache (a zero column for a block
/// whose read failed): what the down runs read.
struct DownColumns<'c> {
    image: &'c FlashImage,
    cache: &'c WeightCache<'c>,
    zero: &'c [u8],
    base: u32,
    l: usize,
    /// Where the down columns start in a block, and the bytes of one.
    at: usize,
    bytes: usize,
}

impl<'c> DownColumns<'c> {
    fn new(
        image: &'c FlashImage,
        cache: &'c WeightCache<'c>,
        zero: &'c [u8],
        base: u32,
        l: usize,
    ) -> DownColumns<'c> {
        let g = image.geometry(l);
        let (gb, ub, db) = g.part_bytes().expect("checked geometry");
        DownColumns {
            image,
            cache,
            zero,
            base,
            l,
            at: g.per_block as usize * (gb + ub),
            bytes: db,
        }
    }

    fn get(&self, n: u32) -> &'c [u8] {
        let (b, i) = self.image.slot_of(self.l, n as usize);
        match self.cache.get(self.base + b as u32) {
            Some(bytes) => &bytes[self.at + i * self.bytes..][..self.bytes],
            None => self.zero,
        }
    }
}
