//! The controller's plan applied to the streamed FFN, one layer at a time (paper eq. 9): when a
//! layer starts, its remaining load volume R (bytes of its wanted blocks not yet in the cache)
//! is measured, the LUT gives the plan for Q(R), and the plan caps the lanes' reads in flight
//! (lanes and queue depth), the compute units the layer uses (the CPU's worker pool, or the
//! GPU persistent kernel's resident thread blocks) and the read-ahead stages. Plans change
//! timing, never numbers: each run (CPU) or bundle (GPU) is summed as without a plan.
//!
//! [`Control`] is shared by the CPU's streamed FFN and the GPU's (`engine::cuda_stream`): both
//! call [`Control::begin_layer`] and [`Control::end_layer`] around each layer.
//!
//! With profiling on (offline only: it allocates), each layer-step is recorded as a
//! [`LayerSample`] (T^I, T^II, bytes read, R, the plan) for `leanstream controller profile`.

use super::*;
use crate::control::{Clocks, LayerSample, Lut, LutError, PlanCaps};

/// The controller's state inside a streamed FFN.
#[derive(Default)]
pub struct Control {
    lut: Option<Lut>,
    /// The read-ahead stages boot chose (`refine_stages`), in force without a LUT.
    refine_boot: usize,
    /// In force for the current layer: compute units (0: all of them) and read-ahead stages.
    pub(crate) workers: usize,
    pub(crate) refine: usize,
    /// The compute units' whole (pool threads, or the kernel's resident blocks).
    units: usize,
    /// The current layer: its plan index, R, when it started and the bytes read by then.
    plan: u16,
    remaining: u64,
    started: Option<Instant>,
    bytes_before: u64,
    samples: Option<Vec<LayerSample>>,
    /// The board's clock caps, opened once a LUT with a frequency cap is set (`dvfs` boards).
    clocks: Option<Clocks>,
}

/// Bytes of layer `l`'s wanted blocks (priority above 0 in `prio`) not in `cache`: R_n.
pub fn remaining_bytes(
    image: &FlashImage,
    cache: &WeightCache,
    base: BlockId,
    l: usize,
    prio: &[f32],
) -> u64 {
    let mut remaining = 0u64;
    for (b, &p) in prio[..image.blocks(l)].iter().enumerate() {
        if p > 0.0 && cache.slot_of(base + b as BlockId).is_none() {
            remaining += image.block_extent(l, b).1 as u64;
        }
    }
    remaining
}

impl Control {
    pub fn new(refine_boot: usize) -> Control {
        Control {
            refine_boot,
            refine: refine_boot,
            ..Control::default()
        }
    }

    /// Boot: the LUT of `--controller`, if any, read for `image`'s model and checked against
    /// the board and the layers; then in force, with `lanes` at the board's limits until the
    /// first layer.
    pub fn load(
        &mut self,
        opts: &StreamOptions,
        image: &FlashImage,
        lanes: &mut Lanes,
    ) -> Result<(), StreamBootError> {
        let Some(path) = &opts.controller else {
            return Ok(());
        };
        let error = |error| StreamBootError::Controller {
            path: path.clone(),
            error,
        };
        let lut = Lut::read(path, image.header.tables_identity).map_err(error)?;
        self.set(Some(lut), image.layers(), lanes).map_err(error)
    }

    /// Applies `lut` from the next layer on (`None`: the board's maxima and boot's read-ahead).
    /// Refused when it was made for another board or layer count, or a plan exceeds the board.
    pub fn set(
        &mut self,
        lut: Option<Lut>,
        layers: usize,
        lanes: &mut Lanes,
    ) -> Result<(), LutError> {
        if let Some(lut) = &lut {
            lut.check_for(crate::board::NAME, layers, PlanCaps::board())?;
            let caps_clocks = lut.plans().iter().any(|p| p.freq.is_some());
            if caps_clocks && self.clocks.is_none() {
                // check_for refused a cap on a board without dvfs.
                if let Some(opened) = Clocks::board() {
                    self.clocks = Some(opened.map_err(LutError::Clocks)?);
                }
            }
        }
        if let Some(c) = self.clocks.as_mut() {
            // Each layer's plan sets its own cap; until then, the boot caps.
            let _ = c.apply(None);
        }
        self.lut = lut;
        let cfg = lanes.config();
        lanes.set_limits(cfg.lanes, cfg.queue_depth);
        self.workers = 0;
        self.refine = self.refine_boot;
        Ok(())
    }

    pub fn lut(&self) -> Option<&Lut> {
        self.lut.as_ref()
    }

    /// The clock caps the LUT drives (None: no LUT with a cap, or a board without `dvfs`).
    pub fn clocks(&self) -> Option<&Clocks> {
        self.clocks.as_ref()
    }

    /// Whether [`begin_layer`](Self::begin_layer) needs R (a LUT or the profiler is on).
    pub fn wants_remaining(&self) -> bool {
        self.lut.is_some() || self.samples.is_some()
    }

    /// Starts (or stops) recording a [`LayerSample`] per layer-step; drops what was recorded.
    /// Recording allocates: the offline profiler uses it, the serving paths never.
    pub fn set_profiling(&mut self, on: bool) {
        self.samples = on.then(Vec::new);
    }

    /// The layer-steps recorded since profiling started (or the last call).
    pub fn take_samples(&mut self) -> Vec<LayerSample> {
        self.samples
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Layer `l` starts with `remaining` bytes to read (R; only read when
    /// [`wants_remaining`](Self::wants_remaining)), `units` compute units, `bytes_read` read
    /// by the lanes so far. Applies the LUT's plan: the lanes' limits, the compute units
    /// (`workers`) and the read-ahead stages (`refine`, only where the predictor can guess the
    /// next layer during this one: `reads_ahead`).
    pub fn begin_layer(
        &mut self,
        l: usize,
        units: usize,
        remaining: u64,
        reads_ahead: bool,
        lanes: &mut Lanes,
        bytes_read: u64,
    ) {
        self.units = units;
        if !self.wants_remaining() {
            return;
        }
        self.remaining = remaining;
        if let Some(lut) = &self.lut {
            let (index, plan) = lut.plan(l, remaining);
            self.plan = index as u16;
            lanes.set_limits(plan.lanes as usize, plan.queue_depth as usize);
            self.workers = plan.compute_units(units);
            if let Some(c) = self.clocks.as_mut() {
                // A failed write is counted in `Clocks::errors`; the layer runs at the clocks
                // as they are.
                let _ = c.apply(plan.freq);
            }
            self.refine = if reads_ahead {
                plan.prefetch as usize
            } else {
                0
            };
        }
        if self.samples.is_some() {
            self.started = Some(Instant::now());
            self.bytes_before = bytes_read;
        }
    }

    /// Layer `l` is done, having waited `waited` for reads (T^I; the rest of the layer is
    /// T^II) with `bytes_read` read by the lanes by now: its sample, when profiling.
    pub fn end_layer(&mut self, l: usize, waited: std::time::Duration, bytes_read: u64) {
        let (Some(samples), Some(started)) = (self.samples.as_mut(), self.started.take()) else {
            return;
        };
        let total = started.elapsed();
        let workers = match self.workers {
            0 => self.units,
            w => w,
        };
        samples.push(LayerSample {
            layer: l as u16,
            remaining_bytes: self.remaining,
            plan: self.plan,
            io_ns: waited.min(total).as_nanos() as u64,
            compute_ns: total.saturating_sub(waited).as_nanos() as u64,
            bytes_read: bytes_read - self.bytes_before,
            workers: workers as u16,
        });
    }
}

impl StreamedFfn<'_> {
    /// Applies `lut` from the next layer on (`None`: the board's maxima and boot's read-ahead).
    /// Refused when it was made for another board or layer count, or a plan exceeds the board.
    pub fn set_controller(&mut self, lut: Option<Lut>) -> Result<(), LutError> {
        self.control.set(lut, self.image.layers(), &mut self.lanes)
    }

    pub fn controller(&self) -> Option<&Lut> {
        self.control.lut()
    }

    /// Starts (or stops) recording a [`LayerSample`] per layer-step; drops what was recorded.
    /// Recording allocates: the offline profiler uses it, the serving paths never.
    pub fn set_profiling(&mut self, on: bool) {
        self.control.set_profiling(on);
    }

    /// The layer-steps recorded since profiling started (or the last call).
    pub fn take_samples(&mut self) -> Vec<LayerSample> {
        self.control.take_samples()
    }

    /// Layer `l` starts (its wanted blocks are those of priority above 0 in `prio`): measures
    /// R when a LUT or the profiler needs it and applies the LUT's plan.
    pub(super) fn begin_layer(&mut self, l: usize, pool_threads: usize) {
        let remaining = if self.control.wants_remaining() {
            remaining_bytes(&self.image, &self.cache, self.base[l], l, self.prio)
        } else {
            0
        };
        let reads_ahead = self.predictor.reads_ffn_output();
        let bytes = self.cache.stats().bytes_read;
        self.control.begin_layer(
            l,
            pool_threads,
            remaining,
            reads_ahead,
            &mut self.lanes,
            bytes,
        );
    }

    /// Layer `l` is done, having waited `waited` for reads: its sample, when profiling.
    pub(super) fn end_layer(&mut self, l: usize, waited: std::time::Duration) {
        let bytes = self.cache.stats().bytes_read;
        self.control.end_layer(l, waited, bytes);
    }
}

/// `f(i)` for `i` in `0..n` on at most `workers` of the pool's threads (0: all of them): the
/// compute share. Which thread runs a task does not change what it writes.
pub(super) fn run_capped(pool: &WorkerPool, n: usize, workers: usize, f: &(dyn Fn(usize) + Sync)) {
    if workers == 0 || workers >= pool.n_threads() || workers >= n {
        return pool.run(n, f);
    }
    pool.run(workers, &|w| {
        let mut i = w;
        while i < n {
            f(i);
            i += workers;
        }
    });
}
