//! The controller's plan applied to the streamed FFN, one layer at a time (paper eq. 9): when a
//! layer starts, its remaining load volume R (bytes of its wanted blocks not yet in the cache)
//! is measured, the LUT gives the plan for Q(R), and the plan caps the lanes' reads in flight
//! (lanes and queue depth), the workers the layer's runs use, and the read-ahead stages. Plans
//! change timing, never numbers: each run still writes its own partial, summed in run order.
//!
//! With profiling on (offline only: it allocates), each layer-step is recorded as a
//! [`LayerSample`] (T^I, T^II, bytes read, R, the plan) for `leanstream controller profile`.

use super::*;
use crate::control::{LayerSample, Lut, LutError, PlanCaps};

/// The controller's state inside the streamed FFN.
#[derive(Default)]
pub(super) struct Control {
    lut: Option<Lut>,
    /// The read-ahead stages boot chose (`refine_stages`), in force without a LUT.
    refine_boot: usize,
    /// In force for the current layer: workers (0: the whole pool) and read-ahead stages.
    pub(super) workers: usize,
    pub(super) refine: usize,
    /// The pool's threads (the compute share's whole).
    threads: usize,
    /// The current layer: its plan index, R, when it started and the bytes read by then.
    plan: u16,
    remaining: u64,
    started: Option<Instant>,
    bytes_before: u64,
    samples: Option<Vec<LayerSample>>,
}

impl Control {
    pub(super) fn new(refine_boot: usize) -> Control {
        Control {
            refine_boot,
            refine: refine_boot,
            ..Control::default()
        }
    }
}

impl StreamedFfn<'_> {
    /// Boot: the LUT of `--controller`, if any, read for this image's model and checked
    /// against the board and the layers.
    pub(super) fn load_controller(&mut self, opts: &StreamOptions) -> Result<(), StreamBootError> {
        let Some(path) = &opts.controller else {
            return Ok(());
        };
        let error = |error| StreamBootError::Controller {
            path: path.clone(),
            error,
        };
        let lut = Lut::read(path, self.image.header.tables_identity).map_err(error)?;
        self.set_controller(Some(lut)).map_err(error)
    }

    /// Applies `lut` from the next layer on (`None`: the board's maxima and boot's read-ahead).
    /// Refused when it was made for another board or layer count, or a plan exceeds the board.
    pub fn set_controller(&mut self, lut: Option<Lut>) -> Result<(), LutError> {
        if let Some(lut) = &lut {
            lut.check_for(crate::board::NAME, self.image.layers(), PlanCaps::board())?;
        }
        self.control.lut = lut;
        let cfg = self.lanes.config();
        self.lanes.set_limits(cfg.lanes, cfg.queue_depth);
        self.control.workers = 0;
        self.control.refine = self.control.refine_boot;
        Ok(())
    }

    pub fn controller(&self) -> Option<&Lut> {
        self.control.lut.as_ref()
    }

    /// Starts (or stops) recording a [`LayerSample`] per layer-step; drops what was recorded.
    /// Recording allocates: the offline profiler uses it, the serving paths never.
    pub fn set_profiling(&mut self, on: bool) {
        self.control.samples = on.then(Vec::new);
    }

    /// The layer-steps recorded since profiling started (or the last call).
    pub fn take_samples(&mut self) -> Vec<LayerSample> {
        self.control
            .samples
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Layer `l` starts (its wanted blocks are those of priority above 0 in `prio`): measures
    /// R when a LUT or the profiler needs it and applies the LUT's plan.
    pub(super) fn begin_layer(&mut self, l: usize, pool_threads: usize) {
        let c = &mut self.control;
        c.threads = pool_threads;
        if c.lut.is_none() && c.samples.is_none() {
            return;
        }
        let blocks = self.image.blocks(l);
        let mut remaining = 0u64;
        for b in 0..blocks {
            if self.prio[b] > 0.0 && self.cache.slot_of(self.base[l] + b as BlockId).is_none() {
                remaining += self.image.block_extent(l, b).1 as u64;
            }
        }
        c.remaining = remaining;
        if let Some(lut) = &c.lut {
            let (index, plan) = lut.plan(l, remaining);
            c.plan = index as u16;
            self.lanes
                .set_limits(plan.lanes as usize, plan.queue_depth as usize);
            c.workers = plan.compute_units(pool_threads);
            // Read-ahead only where the predictor can guess the next layer during this one.
            c.refine = if self.predictor.reads_ffn_output() {
                plan.prefetch as usize
            } else {
                0
            };
        }
        if c.samples.is_some() {
            c.started = Some(Instant::now());
            c.bytes_before = self.cache.stats().bytes_read;
        }
    }

    /// Layer `l` is done, having waited `waited` for reads: its sample, when profiling.
    pub(super) fn end_layer(&mut self, l: usize, waited: std::time::Duration) {
        let bytes = self.cache.stats().bytes_read;
        let c = &mut self.control;
        let (Some(samples), Some(started)) = (c.samples.as_mut(), c.started.take()) else {
            return;
        };
        let total = started.elapsed();
        let workers = match c.workers {
            0 => c.threads,
            w => w,
        };
        samples.push(LayerSample {
            layer: l as u16,
            remaining_bytes: c.remaining,
            plan: c.plan,
            io_ns: waited.as_nanos() as u64,
            compute_ns: total.saturating_sub(waited).as_nanos() as u64,
            bytes_read: bytes - c.bytes_before,
            workers: workers as u16,
        });
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
