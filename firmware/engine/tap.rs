//! The engine's tap: what the FFN saw, per layer, for one token (filled by
//! `Engine::forward` in dense mode, carved from the scratch arena at boot). Calibration
//! (`crate::offline::calibrate`) and traces (`crate::offline::trace`) read it.

use crate::backend::cpu::{matvec, ActScratch, KernelSet, Matrix, WorkerPool};
use crate::boot::{BootError, Carver, Plan};
use crate::ops::silu;

/// What the tap records beyond the activations.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TapOptions {
    /// Stages K of the partial residuals (0: none, activations only, as calibration needs).
    pub stages: usize,
    /// Per-layer glu thresholds of the set the stages split (None: every neuron).
    pub thresholds: Option<Vec<f32>>,
}

/// One token's record, every layer, carved from the scratch arena at boot.
pub struct Tap<'a> {
    pub n_layers: usize,
    pub dim: usize,
    pub hidden: usize,
    pub stages: usize,
    /// `[L][dim]`
    pub residual: &'a mut [f32],
    /// `[L][dim]`
    pub input: &'a mut [f32],
    /// `[L][K][dim]`
    pub stage_priority: &'a mut [f32],
    /// `[L][K][dim]`
    pub stage_index: &'a mut [f32],
    /// `[L][hidden]`
    pub gate_act: &'a mut [f32],
    /// `[L][hidden]`
    pub neuron_act: &'a mut [f32],
    thresholds: &'a mut [f32],
    mask: &'a mut [f32],
    order: &'a mut [u32],
    tmp: &'a mut [f32],
}

impl<'a> Tap<'a> {
    pub fn plan(plan: &mut Plan, n_layers: usize, dim: usize, hidden: usize, stages: usize) {
        plan.add::<f32>(n_layers * dim);
        plan.add::<f32>(n_layers * dim);
        plan.add::<f32>(n_layers * stages * dim);
        plan.add::<f32>(n_layers * stages * dim);
        plan.add::<f32>(n_layers * hidden);
        plan.add::<f32>(n_layers * hidden);
        plan.add::<f32>(n_layers);
        plan.add::<f32>(hidden);
        plan.add::<u32>(hidden);
        plan.add::<f32>(dim);
    }

    pub fn new(
        c: &mut Carver<'a>,
        n_layers: usize,
        dim: usize,
        hidden: usize,
        opts: &TapOptions,
    ) -> Result<Tap<'a>, BootError> {
        let k = opts.stages;
        let tap = Tap {
            n_layers,
            dim,
            hidden,
            stages: k,
            residual: c.take(n_layers * dim)?,
            input: c.take(n_layers * dim)?,
            stage_priority: c.take(n_layers * k * dim)?,
            stage_index: c.take(n_layers * k * dim)?,
            gate_act: c.take(n_layers * hidden)?,
            neuron_act: c.take(n_layers * hidden)?,
            thresholds: c.take(n_layers)?,
            mask: c.take(hidden)?,
            order: c.take(hidden)?,
            tmp: c.take(dim)?,
        };
        if let Some(t) = &opts.thresholds {
            tap.thresholds.copy_from_slice(t);
        }
        Ok(tap)
    }

    /// Records layer `l`: `x` the residual entering the FFN, `xb` the FFN input, `g` and `u` the
    /// raw gate and up products of every neuron; the stages' partial residuals through `down`.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &mut self,
        l: usize,
        x: &[f32],
        xb: &[f32],
        g: &[f32],
        u: &[f32],
        down: &Matrix,
        ks: KernelSet,
        pool: &WorkerPool,
        act: &mut ActScratch,
    ) {
        let (dim, n, k) = (self.dim, self.hidden, self.stages);
        self.residual[l * dim..][..dim].copy_from_slice(x);
        self.input[l * dim..][..dim].copy_from_slice(xb);
        let ga = &mut self.gate_act[l * n..][..n];
        let h = &mut self.neuron_act[l * n..][..n];
        for j in 0..n {
            ga[j] = silu(g[j]);
            h[j] = ga[j] * u[j];
        }
        if k == 0 {
            return;
        }
        let t = self.thresholds[l];
        let mut m = 0;
        for (j, hv) in h.iter().enumerate() {
            if hv.abs() >= t {
                self.order[m] = j as u32;
                m += 1;
            }
        }
        let h = &*h;
        for priority in [false, true] {
            let order = &mut self.order[..m];
            if priority {
                order.sort_unstable_by(|&a, &b| {
                    h[b as usize]
                        .abs()
                        .total_cmp(&h[a as usize].abs())
                        .then(a.cmp(&b))
                });
            }
            let out = if priority {
                &mut self.stage_priority[l * k * dim..][..k * dim]
            } else {
                &mut self.stage_index[l * k * dim..][..k * dim]
            };
            self.mask.fill(0.0);
            let mut at = 0;
            for (s, o) in out.chunks_exact_mut(dim).enumerate() {
                let end = at + m / k + usize::from(s < m % k);
                for &j in &order[at..end] {
                    self.mask[j as usize] = h[j as usize];
                }
                at = end;
                matvec(ks, pool, down, &self.mask[..n], act, self.tmp);
                for ((oi, xi), di) in o.iter_mut().zip(x).zip(self.tmp.iter()) {
                    *oi = xi + di;
                }
            }
        }
    }
}
