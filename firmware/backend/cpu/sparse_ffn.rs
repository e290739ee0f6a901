//! The sparse FFN on the CPU: per token and layer, pick the neurons to compute (oracle
//! thresholds or top-k over the bundles' gate and up rows), compute SwiGLU for them, and add
//! their down columns. The bundles' layout and the options are `crate::sparsity`'s; this file
//! is the kernels' side of it, with every buffer carved from the scratch arena at boot.

use super::axpy::{self, axpy_rows};
use super::down_tiles::{self, axpy_tiles};
use super::matvec::{matvec_gather, matvec_pairs, matvec_rows_many};
use super::{ActScratch, KernelSet, Rows, WorkerPool};
use crate::boot::{BootError, Carver, Plan};
use crate::ops::silu;
use crate::sparsity::bundle::{Bundles, Down};
use crate::sparsity::{FfnMode, FfnOptions, Score, SparsityError};

/// Scratch values the down projection needs for `hidden` neurons of width `dim`.
pub fn partials_len(hidden: usize, dim: usize) -> usize {
    axpy::partials_len(hidden, dim).max(down_tiles::partials_len(hidden, dim))
}

/// `out = sum over idx (in that order) of SiLU(gate_j . x) * (up_j . x) * down_j`, the FFN
/// restricted to the neurons `idx`. `g` and `h` are scratch of at least `idx.len()`,
/// `partials` of `partials_len(n, dim)`. A test and tool entry point: it sorts a copy of
/// `idx` (the int8 tiles add neurons tile by tile), so it allocates.
#[allow(clippy::too_many_arguments)]
pub fn ffn_subset(
    b: &Bundles,
    ks: KernelSet,
    pool: &WorkerPool,
    x: &[f32],
    idx: &[u32],
    act: &mut ActScratch,
    g: &mut [f32],
    h: &mut [f32],
    partials: &mut [f32],
    out: &mut [f32],
) {
    let mut idx = idx.to_vec();
    idx.sort_unstable();
    let k = idx.len();
    matvec_gather(ks, pool, b.gate, &idx, x, act, &mut g[..k]);
    matvec_gather(ks, pool, b.up, &idx, x, act, &mut h[..k]);
    for (hv, gv) in h[..k].iter_mut().zip(&g[..k]) {
        *hv *= silu(*gv);
    }
    down(b, ks, pool, &idx, &h[..k], partials, out);
}

/// `out = sum over idx of h[i] * down column idx[i]`, `idx` ascending.
fn down(
    b: &Bundles,
    ks: KernelSet,
    pool: &WorkerPool,
    idx: &[u32],
    h: &[f32],
    partials: &mut [f32],
    out: &mut [f32],
) {
    match b.down {
        Down::Tiles(t) => axpy_tiles(ks, pool, t, idx, h, partials, out),
        Down::Columns(r) => axpy_rows(ks, pool, r, idx, h, partials, out),
    }
}

/// The sparse FFN's state: its options, per-layer thresholds and per-token buffers, all carved
/// from the scratch arena at boot.
pub struct SparseFfn<'a> {
    mode: FfnMode,
    score: Score,
    sparsity: f32,
    thresholds: &'a mut [f32],
    /// The dropped-neuron means, [layer][neuron], and offsets (down x means), [layer][output]:
    /// zeros when off, which leaves every sum as it is without them.
    dropped_mean: &'a mut [f32],
    dropped_offset: &'a mut [f32],
    g: &'a mut [f32],
    u: &'a mut [f32],
    h: &'a mut [f32],
    mag: &'a mut [f32],
    idx: &'a mut [u32],
    /// The down projection's partial sums (`axpy_rows`).
    partials: &'a mut [f32],
    /// Neurons kept and neurons seen since the last `take_counts`.
    kept: u64,
    seen: u64,
}

impl<'a> SparseFfn<'a> {
    /// What `new` carves, for boot's plan of the scratch arena.
    pub fn plan(plan: &mut Plan, n_layers: usize, hidden: usize, dim: usize) {
        plan.add::<f32>(n_layers);
        plan.add::<f32>(n_layers * hidden);
        plan.add::<f32>(n_layers * dim);
        for _ in 0..4 {
            plan.add::<f32>(hidden);
        }
        plan.add::<u32>(hidden);
        plan.add::<f32>(partials_len(hidden, dim));
    }

    /// The buffers for a model of `n_layers`, `hidden` neurons per FFN and width `dim`.
    pub fn new(
        c: &mut Carver<'a>,
        n_layers: usize,
        hidden: usize,
        dim: usize,
        opts: &FfnOptions,
    ) -> Result<SparseFfn<'a>, BootError> {
        let mut s = SparseFfn {
            mode: opts.mode,
            score: opts.score,
            sparsity: opts.sparsity,
            thresholds: c.take(n_layers)?,
            dropped_mean: c.take(n_layers * hidden)?,
            dropped_offset: c.take(n_layers * dim)?,
            g: c.take(hidden)?,
            u: c.take(hidden)?,
            h: c.take(hidden)?,
            mag: c.take(hidden)?,
            idx: c.take(hidden)?,
            partials: c.take(partials_len(hidden, dim))?,
            kept: 0,
            seen: 0,
        };
        s.set(opts).expect("options checked before boot");
        Ok(s)
    }

    /// Switches score, sparsity and thresholds (the mode may move between oracle and topk).
    pub fn set(&mut self, opts: &FfnOptions) -> Result<(), SparsityError> {
        opts.check(self.thresholds.len())?;
        if opts.mode == FfnMode::Dense {
            return Err(SparsityError::BootedSparse);
        }
        self.mode = opts.mode;
        self.score = opts.score;
        self.sparsity = opts.sparsity;
        match &opts.dropped {
            Some(d)
                if d.mean.len() != self.dropped_mean.len()
                    || d.offset.len() != self.dropped_offset.len() =>
            {
                return Err(SparsityError::DroppedSize {
                    mean: d.mean.len(),
                    offset: d.offset.len(),
                    want_mean: self.dropped_mean.len(),
                    want_offset: self.dropped_offset.len(),
                });
            }
            Some(d) => {
                self.dropped_mean.copy_from_slice(&d.mean);
                self.dropped_offset.copy_from_slice(&d.offset);
            }
            None => {
                self.dropped_mean.fill(0.0);
                self.dropped_offset.fill(0.0);
            }
        }
        match &opts.thresholds {
            Some(t) => self.thresholds.copy_from_slice(t),
            None => self.thresholds.fill(0.0),
        }
        Ok(())
    }

    pub fn options(&self) -> (FfnMode, Score, f32) {
        (self.mode, self.score, self.sparsity)
    }

    /// (kept, seen) neurons since the last call: the sparsity actually reached is 1 - kept/seen.
    pub fn take_counts(&mut self) -> (u64, u64) {
        let c = (self.kept, self.seen);
        self.kept = 0;
        self.seen = 0;
        c
    }

    /// Layer `l`'s FFN over the neurons this token needs: `x` is the FFN input on entry and the
    /// FFN output on return.
    pub fn forward(
        &mut self,
        l: usize,
        b: &Bundles,
        ks: KernelSet,
        pool: &WorkerPool,
        x: &mut [f32],
        act: &mut ActScratch,
    ) {
        let k = self.choose(l, b.gate, b.up, ks, pool, x, act);
        down(b, ks, pool, &self.idx[..k], &self.h[..k], self.partials, x);
        self.add_dropped_offset(l, x);
    }

    /// Picks layer `l`'s neurons for the FFN input `x` from the gate and up rows of every
    /// neuron (`gate`, `up`: `n` rows each) and computes their activations, less the dropped
    /// means: [`forward`](Self::forward) but the down projection. Returns how many were kept;
    /// [`chosen`](Self::chosen) hands out which (ascending) and their activations.
    #[allow(clippy::too_many_arguments)]
    pub fn choose(
        &mut self,
        l: usize,
        gate: Rows,
        up: Rows,
        ks: KernelSet,
        pool: &WorkerPool,
        x: &[f32],
        act: &mut ActScratch,
    ) -> usize {
        let n = gate.rows;
        let (g, u, h, mag) = (
            &mut self.g[..n],
            &mut self.u[..n],
            &mut self.h[..n],
            &mut self.mag[..n],
        );
        // Score every neuron: SiLU(gate), and for the glu score its activation with up (in `u`,
        // computed by each task of the products on its own rows). The score is the magnitude.
        let score: &[f32] = match self.score {
            Score::Glu => {
                let swiglu = |g: &mut [f32], u: &mut [f32]| {
                    for (gv, uv) in g.iter_mut().zip(u) {
                        *gv = silu(*gv);
                        *uv *= *gv;
                    }
                };
                matvec_pairs(ks, pool, gate, up, x, act, g, u, &swiglu);
                u
            }
            Score::Gate => {
                matvec_rows_many(ks, pool, &mut [(gate, &mut *g)], x, act);
                for gv in g.iter_mut() {
                    *gv = silu(*gv);
                }
                g
            }
        };
        // Choose the neurons, in ascending order.
        let k = match self.mode {
            FfnMode::Oracle => keep_at_least(score, self.thresholds[l], self.idx),
            _ => {
                let keep = n - ((self.sparsity as f64 * n as f64).round() as usize).min(n - 1);
                keep_top(score, keep, mag, self.idx)
            }
        };
        self.kept += k as u64;
        self.seen += n as u64;
        let idx = &self.idx[..k];
        // Their activations (up for the kept neurons only with the gate score), less the
        // dropped-neuron mean: with the offset added after, the dropped neurons count with
        // their mean, `sum over kept (h - mean) down + down mean`.
        let mean = &self.dropped_mean[l * n..][..n];
        match self.score {
            Score::Glu => {
                for (hv, &j) in h[..k].iter_mut().zip(idx) {
                    *hv = u[j as usize] - mean[j as usize];
                }
            }
            Score::Gate => {
                matvec_gather(ks, pool, up, idx, x, act, &mut u[..k]);
                for ((hv, uv), &j) in h[..k].iter_mut().zip(&u[..k]).zip(idx) {
                    *hv = g[j as usize] * uv - mean[j as usize];
                }
            }
        }
        k
    }

    /// The first `k` chosen neurons and activations with layer `l`'s keep rule (the glu
    /// threshold, the dropped-neuron means): what runs that choose for themselves need.
    /// The engine boots learned predictors only with the thresholds' mode on the glu score.
    pub fn run_parts(&mut self, l: usize, k: usize) -> RunParts<'_> {
        let n = self.h.len();
        RunParts {
            idx: &mut self.idx[..k],
            h: &mut self.h[..k],
            acts: &mut self.u[..n],
            threshold: self.thresholds[l],
            mean: &self.dropped_mean[l * n..][..n],
        }
    }

    /// The first `k` chosen neurons (ascending) and their activations, as
    /// [`choose`](Self::choose) left them; a caller may drop some (keeping the order).
    pub fn chosen(&mut self, k: usize) -> (&mut [u32], &mut [f32]) {
        (&mut self.idx[..k], &mut self.h[..k])
    }

    /// Adds layer `l`'s dropped-neuron offset to the down projection's output `x` (zeros when
    /// dropped means are off).
    pub fn add_dropped_offset(&self, l: usize, x: &mut [f32]) {
        let dim = x.len();
        for (y, o) in x.iter_mut().zip(&self.dropped_offset[l * dim..][..dim]) {
            *y += o;
        }
    }
}

/// Neurons and activations for runs that choose for themselves ([`SparseFfn::run_parts`]).
pub struct RunParts<'s> {
    pub idx: &'s mut [u32],
    pub h: &'s mut [f32],
    /// Per neuron (indexed by neuron): room for activations computed by the runs.
    pub acts: &'s mut [f32],
    /// A neuron is kept when |SiLU(gate) * up| reaches it.
    pub threshold: f32,
    /// Per neuron: the dropped mean its kept activation is taken less.
    pub mean: &'s [f32],
}

/// Indices j with `|score[j]| >= t`, ascending, into `idx` (at least `score.len()` long);
/// returns how many. Without a branch: every index is written and the count moves on only
/// for a kept one, since whether a neuron is kept is a coin toss a branch predictor misses
/// half the time at 50% sparsity.
fn keep_at_least(score: &[f32], t: f32, idx: &mut [u32]) -> usize {
    let idx = &mut idx[..score.len()];
    let mut k = 0;
    for (j, &m) in score.iter().enumerate() {
        idx[k] = j as u32;
        k += (m.abs() >= t) as usize;
    }
    k
}

/// The `keep` indices with the largest `|mag|` (ties to the lower index), ascending, into
/// `idx`; `tmp` is scratch of `mag.len()`. Returns `keep`.
///
/// Magnitudes are non-negative, so their bit patterns sort as the values do: a histogram of the
/// top bits finds the bucket holding the keep-th largest, and only that bucket is sorted (a
/// full `select_nth` per layer and token cost 3% of a token).
fn keep_top(mag: &[f32], keep: usize, tmp: &mut [f32], idx: &mut [u32]) -> usize {
    let n = mag.len();
    if keep >= n {
        for (j, v) in idx[..n].iter_mut().enumerate() {
            *v = j as u32;
        }
        return n;
    }
    // Order key: the bits of |m| (NaN above infinity, as `total_cmp` puts a positive NaN).
    let key = |m: f32| m.abs().to_bits();
    const SHIFT: u32 = 20;
    let mut hist = [0u32; 1 << (31 - SHIFT)];
    for &m in mag {
        hist[(key(m) >> SHIFT) as usize] += 1;
    }
    // The bucket of the keep-th largest, and how many lie in the buckets above it.
    let (mut bucket, mut above) = (hist.len(), 0usize);
    while above + (hist[bucket - 1] as usize) < keep {
        bucket -= 1;
        above += hist[bucket] as usize;
    }
    bucket -= 1;
    let mut c = 0;
    for &m in mag {
        if (key(m) >> SHIFT) as usize == bucket {
            tmp[c] = f32::from_bits(key(m));
            c += 1;
        }
    }
    let need = keep - above;
    let (_, kth, _) = tmp[..c].select_nth_unstable_by(c - need, |a, b| a.total_cmp(b));
    let kth = key(*kth);
    let above = mag.iter().filter(|&&m| key(m) > kth).count();
    let mut ties = keep - above;
    let mut k = 0;
    // Without a branch on the coin toss of keeping (as in `keep_at_least`).
    let idx = &mut idx[..n];
    for (j, &m) in mag.iter().enumerate() {
        let v = key(m);
        let tie = v == kth && ties > 0;
        ties -= tie as usize;
        idx[k] = j as u32;
        k += (v > kth || tie) as usize;
    }
    debug_assert_eq!(k, keep);
    k
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::boot::{Arena, ArenaKind};
    use crate::model::ggml::{dequantize_row, GgmlType};
    use crate::model::TensorRef;
    use crate::sparsity::bundle::quantize_row;
    use crate::sparsity::thresholds::DroppedMean;
    use crate::sparsity::BundleDown;

    struct Rng(u64);
    impl Rng {
        fn f(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
        fn below(&mut self, n: usize) -> usize {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 33) % n as u64) as usize
        }
    }

    fn tensor(ty: GgmlType, rows: usize, cols: usize, vals: &[f32]) -> Vec<u8> {
        let rb = ty.row_bytes(cols).unwrap();
        let mut out = vec![0u8; rows * rb];
        for (r, o) in out.chunks_exact_mut(rb).enumerate() {
            quantize_row(ty, &vals[r * cols..][..cols], o);
        }
        out
    }

    fn dequant(ty: GgmlType, rows: usize, cols: usize, data: &[u8]) -> Vec<f32> {
        let rb = ty.row_bytes(cols).unwrap();
        let mut out = vec![0f32; rows * cols];
        for (r, o) in out.chunks_exact_mut(cols).enumerate() {
            dequantize_row(ty, &data[r * rb..][..rb], o);
        }
        out
    }

    /// A random FFN of `n` neurons and width `dim` in `ty` (values within 0.5 of 0): the gate,
    /// up and down tensors' bytes, and their weights as the model holds them (dequantized).
    struct RandomFfn {
        ty: GgmlType,
        n: usize,
        dim: usize,
        bytes: [Vec<u8>; 3],
        weights: [Vec<f32>; 3],
    }

    impl RandomFfn {
        fn new(ty: GgmlType, n: usize, dim: usize, rng: &mut Rng) -> RandomFfn {
            let mut vals = |len: usize| (0..len).map(|_| rng.f() * 0.5).collect::<Vec<f32>>();
            let (gv, uv, dv) = (vals(n * dim), vals(n * dim), vals(dim * n));
            let bytes = [
                tensor(ty, n, dim, &gv),
                tensor(ty, n, dim, &uv),
                tensor(ty, dim, n, &dv),
            ];
            let weights = [
                dequant(ty, n, dim, &bytes[0]),
                dequant(ty, n, dim, &bytes[1]),
                dequant(ty, dim, n, &bytes[2]),
            ];
            RandomFfn {
                ty,
                n,
                dim,
                bytes,
                weights,
            }
        }

        /// Its bundles, carved from `c`.
        fn bundles<'a>(&self, c: &mut Carver<'a>, how: BundleDown) -> Bundles<'a> {
            let t = |rows, cols, data| TensorRef {
                ty: self.ty,
                rows,
                cols,
                data,
            };
            let (n, dim) = (self.n, self.dim);
            let [g, u, d] = &self.bytes;
            Bundles::build(c, &t(n, dim, g), &t(n, dim, u), &t(dim, n, d), how).unwrap()
        }
    }

    /// The sparse FFN over a random set of neurons, in a random order, equals the dense FFN
    /// restricted to that set, for f32 weights (exact bundles) and Q8_0/Q4_1 ones.
    #[test]
    fn subset_in_any_order_equals_dense_restricted() {
        let (dim, n) = (64, 96);
        let pool = WorkerPool::new(2);
        let mut act = ActScratch::new(n.max(dim));
        let kinds = [GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_1]
            .into_iter()
            .flat_map(|ty| [(ty, BundleDown::Model), (ty, BundleDown::Tiles)]);
        for (ty, how) in kinds {
            let ffn = RandomFfn::new(ty, n, dim, &mut Rng(ty as u64 + 11));
            let mut arena = Arena::map(ArenaKind::FfnCache, 1 << 20).unwrap();
            let mut c = arena.carver();
            let b = ffn.bundles(&mut c, how);
            // The bundle's own down column j.
            let column = |j: usize, col: &mut [f32]| match b.down {
                Down::Columns(r) => {
                    assert_eq!(r.ty, ty);
                    dequantize_row(r.ty, r.row(j), col)
                }
                Down::Tiles(t) => {
                    for (i, v) in col.iter_mut().enumerate() {
                        *v = t.value(j, i);
                    }
                }
            };
            // Dense weights as the model holds them (dequantized), and the bundles' own down.
            let [gw, uw, dw] = &ffn.weights;
            let mut x = vec![0f32; dim];
            let mut rng = Rng(99);
            for v in x.iter_mut() {
                *v = rng.f();
            }
            for trial in 0..6 {
                // A random subset (sometimes all of them), shuffled.
                let mut set: Vec<u32> = (0..n as u32)
                    .filter(|_| trial == 0 || rng.f() > 0.0)
                    .collect();
                for i in (1..set.len()).rev() {
                    set.swap(i, rng.below(i + 1));
                }
                let mut want = vec![0f64; dim];
                let mut want_bundle = vec![0f64; dim];
                let mut col = vec![0f32; dim];
                for &j in &set {
                    let j = j as usize;
                    let dot = |w: &[f32]| {
                        w[j * dim..][..dim]
                            .iter()
                            .zip(&x)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum::<f64>()
                    };
                    let hj = silu(dot(gw) as f32) as f64 * dot(uw);
                    column(j, &mut col);
                    if how == BundleDown::Tiles && ty == GgmlType::Q4_1 {
                        // Q4 tiles hold the model's own values.
                        assert!((0..dim).all(|i| col[i] == dw[i * n + j]), "neuron {j}");
                    }
                    for i in 0..dim {
                        want[i] += hj * dw[i * n + j] as f64;
                        want_bundle[i] += hj * col[i] as f64;
                    }
                }
                let mut out = vec![7f32; dim];
                let (mut g, mut h) = (vec![0f32; n], vec![0f32; n]);
                let mut partials = vec![0f32; partials_len(n, dim)];
                ffn_subset(
                    &b,
                    KernelSet::best(),
                    &pool,
                    &x,
                    &set,
                    &mut act,
                    &mut g,
                    &mut h,
                    &mut partials,
                    &mut out,
                );
                // Another order of the same set gives the same sum.
                let mut rev = set.clone();
                rev.reverse();
                let mut out2 = vec![0f32; dim];
                ffn_subset(
                    &b,
                    KernelSet::best(),
                    &pool,
                    &x,
                    &rev,
                    &mut act,
                    &mut g,
                    &mut h,
                    &mut partials,
                    &mut out2,
                );
                let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-3);
                // Float weights in columns: exact up to rounding. Quantized ones: the int8
                // activations (as in the dense kernels) and, for Q4_1 columns, the second 4-bit
                // rounding; int8 tiles: their int8 rounding of every model type.
                let (tol, tol_model) = match (ty, how) {
                    (GgmlType::F32, BundleDown::Model) => (1e-5, 1e-5),
                    (GgmlType::F32, BundleDown::Tiles) => (1e-5, 1e-5),
                    (_, BundleDown::Tiles) => (2e-2, 3e-2),
                    (GgmlType::Q8_0, _) => (2e-2, 3e-2),
                    _ => (2e-2, 0.15),
                };
                for i in 0..dim {
                    let (o, o2) = (out[i] as f64, out2[i] as f64);
                    assert!(
                        (o - o2).abs() <= 1e-5 * scale,
                        "{ty:?} order changes the sum: {o} vs {o2}"
                    );
                    assert!(
                        (o - want_bundle[i]).abs() <= tol * scale,
                        "{ty:?} trial {trial} [{i}]: {o} vs {}",
                        want_bundle[i]
                    );
                    assert!(
                        (o - want[i]).abs() <= tol_model * scale,
                        "{ty:?} trial {trial} [{i}]: {o} vs model {}",
                        want[i]
                    );
                }
            }
        }
    }

    /// The oracle with dropped-neuron means: the kept neurons' activations plus, for each
    /// dropped neuron, its mean times its down column (as `sum over kept (h - mean) down +
    /// offset`, the offset being down x means); without them, the kept neurons only. On f32
    /// weights (exact bundles) and Q4_1 ones (4-bit tiles).
    #[test]
    fn oracle_counts_dropped_neurons_with_their_mean() {
        let (dim, n) = (64, 96);
        let pool = WorkerPool::new(2);
        let mut act = ActScratch::new(n.max(dim));
        for (ty, how) in [
            (GgmlType::F32, BundleDown::Model),
            (GgmlType::Q4_1, BundleDown::Tiles),
        ] {
            let mut rng = Rng(ty as u64 + 5);
            let ffn = RandomFfn::new(ty, n, dim, &mut rng);
            let mut ffn_arena = Arena::map(ArenaKind::FfnCache, 1 << 20).unwrap();
            let mut c = ffn_arena.carver();
            let b = ffn.bundles(&mut c, how);
            let [gw, uw, dw] = &ffn.weights;
            let x: Vec<f32> = (0..dim).map(|_| rng.f()).collect();
            let dot = |w: &[f32], j: usize| {
                w[j * dim..][..dim]
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>()
            };
            let h: Vec<f64> = (0..n)
                .map(|j| silu(dot(gw, j) as f32) as f64 * dot(uw, j))
                .collect();
            // A threshold in the widest gap near the median, so that rounding cannot move a
            // neuron across it.
            let mut mags: Vec<f64> = h.iter().map(|v| v.abs()).collect();
            mags.sort_by(f64::total_cmp);
            let at = (n / 3..2 * n / 3)
                .max_by(|&a, &b| (mags[a + 1] - mags[a]).total_cmp(&(mags[b + 1] - mags[b])))
                .unwrap();
            let th = ((mags[at] + mags[at + 1]) / 2.0) as f32;
            let mean: Vec<f32> = (0..n).map(|_| rng.f() * 0.3).collect();
            let offset: Vec<f32> = (0..dim)
                .map(|i| {
                    (0..n)
                        .map(|j| dw[i * n + j] as f64 * mean[j] as f64)
                        .sum::<f64>() as f32
                })
                .collect();
            let mut scratch = Arena::map(ArenaKind::ActivationScratch, 1 << 20).unwrap();
            let mut sc = scratch.carver();
            let mut opts = FfnOptions {
                mode: FfnMode::Oracle,
                score: Score::Glu,
                sparsity: 0.5,
                thresholds: Some(vec![th]),
                bundle_down: how,
                dropped: Some(DroppedMean {
                    mean: mean.clone(),
                    offset,
                }),
            };
            let mut ffn = SparseFfn::new(&mut sc, 1, n, dim, &opts).unwrap();
            let mut outs = Vec::new();
            for with_mean in [true, false] {
                if !with_mean {
                    opts.dropped = None;
                    ffn.set(&opts).unwrap();
                }
                let mut y = x.clone();
                ffn.forward(0, &b, KernelSet::best(), &pool, &mut y, &mut act);
                let mut want = vec![0f64; dim];
                for j in 0..n {
                    let hj = if h[j].abs() >= th as f64 {
                        h[j]
                    } else if with_mean {
                        mean[j] as f64
                    } else {
                        continue;
                    };
                    for (i, w) in want.iter_mut().enumerate() {
                        *w += hj * dw[i * n + j] as f64;
                    }
                }
                let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
                // Q4_1: the dense kernels' int8 activations in the gate and up products.
                let tol = if ty == GgmlType::F32 { 1e-4 } else { 3e-2 };
                for (o, w) in y.iter().zip(&want) {
                    assert!(
                        (*o as f64 - w).abs() <= tol * scale,
                        "{ty:?} with mean {with_mean}: {o} vs {w}"
                    );
                }
                outs.push((y, tol * scale));
            }
            // The means move the output well beyond the tolerance (the test can tell).
            let moved = outs[0]
                .0
                .iter()
                .zip(&outs[1].0)
                .fold(0f64, |m, (a, b)| m.max((a - b).abs() as f64));
            assert!(
                moved > 4.0 * outs[0].1,
                "{ty:?}: the means moved the output by {moved}"
            );
        }
    }

    #[test]
    fn keep_top_keeps_the_largest_and_breaks_ties_by_index() {
        let mag = [0.5, 0.1, 0.9, 0.5, 0.5, 0.0];
        let mut tmp = [0f32; 6];
        let mut idx = [0u32; 6];
        assert_eq!(keep_top(&mag, 3, &mut tmp, &mut idx), 3);
        assert_eq!(&idx[..3], &[0, 2, 3]);
        assert_eq!(keep_top(&mag, 6, &mut tmp, &mut idx), 6);
        assert_eq!(keep_at_least(&mag, 0.5, &mut idx), 4);
        assert_eq!(&idx[..4], &[0, 2, 3, 4]);
        // Against a sort, on random magnitudes with repeats and values spread over many powers
        // of two.
        let mut rng = Rng(17);
        let n = 1000;
        let mag: Vec<f32> = (0..n)
            .map(|_| (rng.f().abs() * 8.0).exp2() * ((rng.below(50) as f32) / 7.0))
            .collect();
        let mut tmp = vec![0f32; n];
        let mut idx = vec![0u32; n];
        for keep in [1, 7, 300, 500, 999] {
            let mut order: Vec<usize> = (0..n).collect();
            order.sort_by(|&a, &b| mag[b].total_cmp(&mag[a]).then(a.cmp(&b)));
            let mut want: Vec<u32> = order[..keep].iter().map(|&j| j as u32).collect();
            want.sort_unstable();
            assert_eq!(keep_top(&mag, keep, &mut tmp, &mut idx), keep);
            assert_eq!(&idx[..keep], &want[..], "keep {keep}");
        }
    }

    #[test]
    fn quantizers_round_trip_within_their_step() {
        let mut rng = Rng(5);
        let x: Vec<f32> = (0..64).map(|_| rng.f()).collect();
        for (ty, step) in [
            (GgmlType::Q8_0, 1.0 / 127.0),
            (GgmlType::Q4_0, 2.0 / 8.0),
            (GgmlType::Q4_1, 2.0 / 15.0),
            (GgmlType::Q5_0, 2.0 / 16.0),
            (GgmlType::Q5_1, 2.0 / 31.0),
            (GgmlType::F16, 1e-3),
            (GgmlType::BF16, 1e-2),
        ] {
            let mut q = vec![0u8; ty.row_bytes(64).unwrap()];
            quantize_row(ty, &x, &mut q);
            let mut y = vec![0f32; 64];
            dequantize_row(ty, &q, &mut y);
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() <= step * 0.51 + 1e-6, "{ty:?}: {a} -> {b}");
            }
        }
    }
}
