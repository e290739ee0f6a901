//! Matrix-vector products over weights stored in their GGML type.
//!
//! Classic quant types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) use the llama.cpp approach: the input
//! vector is quantized once per call to int8 blocks of 32 (Q8_1-style: `d = amax / 127`, plus
//! `s = d * sum(q)` for the `_1` types' offset term), and each weight block is dotted in
//! integers (int8 x int8 -> int32) and scaled by `d_w * d_x`. K-quants (Q4_K, Q5_K, Q6_K) dot the
//! same int8 input in their stored super-blocks (`kquant`), on one scale per 256 values where
//! they alone read it (`ActScales`). Float types (F32, F16, BF16) are dotted in f32 with `x`
//! directly.
//!
//! Kernels: AVX2+FMA+F16C (`x86.rs`; x86_64, detected once at run time), NEON (`neon.rs`;
//! aarch64: Q4_0, Q4_1, Q8_0, and the K-quants in `kquant`), and a portable scalar fallback
//! that is always compiled (`scalar.rs`). Every entry point takes the [`KernelSet`] its caller
//! picked at boot (tests and ablations pass another).
//!
//! Rows are split across the pool's threads in chunks of 16-64 rows (a multiple of 4), dealt
//! in one lane of adjacent chunks per thread (`rows_many`).

pub use super::kernel::{best_kernel, kernel_supported, Kernel, KernelSet, MAX_INPUTS};
use super::kernel::{Act, QChunkFn, QChunkManyFn, LANES};
use super::pool::WorkerPool;
use super::{prefetch_gathered, OutPtr};
use crate::model::ggml::{bf16_to_f32, f16_to_f32, GgmlType, QK};
pub use crate::quant::view::{Matrix, Rows, Tile};
use crate::quant::{Packing, QFormat};

mod kquant;
mod row_dot;
pub use row_dot::{GateUpDot, RowDot};

/// Scratch for the int8-quantized input vector, allocated once for the widest input.
pub struct ActScratch {
    qs: Vec<i8>,
    /// `qs` with each group's bytes in the lane-interleaved order (w4 interleaved/swizzled).
    qp: Vec<i8>,
    d: Vec<f32>,
    s: Vec<f32>,
    ls: Vec<i32>,
    gs: Vec<i32>,
    /// Minus the sums of `qs` in runs of 16 (filled with `ActScales::SuperBlock` only).
    hs: Vec<i16>,
    /// The form of the last `fill`.
    scales: ActScales,
}

/// How the input's int8 blocks of 32 are scaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActScales {
    /// Each block of 32 its own scale (`amax / 127` of its values): the classic types' form.
    Block,
    /// The eight blocks of each 256 values share one scale (llama.cpp's Q8_K): what K-quant
    /// rows read when no other int8 row reads the same input. Every kernel computes the same
    /// sums either way (`d` still holds a scale per block); the AVX-512 K-quant kernels add a
    /// super-block's groups in integers under its one scale (`kquant::x86`), and the Q6_K
    /// one reads `hs`.
    SuperBlock,
}

impl ActScales {
    /// The form for an input that rows of these types read: `SuperBlock` when every int8
    /// type among them is a K-quant (and `ks` takes that form), `Block` otherwise.
    pub(crate) fn for_types(ks: KernelSet, types: impl IntoIterator<Item = GgmlType>) -> ActScales {
        let mut q8 = types.into_iter().filter(|&t| uses_q8(t)).peekable();
        if ks.superblock_scales && q8.peek().is_some() && q8.all(is_k_quant) {
            ActScales::SuperBlock
        } else {
            ActScales::Block
        }
    }
}

fn is_k_quant(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K)
}

/// Values under one scale in `ActScales::SuperBlock` form.
const SUPER_BLOCK: usize = 256;

impl ActScratch {
    /// Room for inputs of up to `max_cols` values (rounded up to whole blocks of 32).
    pub fn new(max_cols: usize) -> ActScratch {
        let nb = max_cols.div_ceil(QK);
        ActScratch {
            qs: vec![0; nb * QK],
            qp: vec![0; nb * QK],
            d: vec![0.0; nb],
            s: vec![0.0; nb],
            ls: vec![0; nb * LANES],
            gs: vec![0; nb],
            hs: vec![0; nb * 2],
            scales: ActScales::Block,
        }
    }

    pub fn max_cols(&self) -> usize {
        self.qs.len()
    }

    /// Quantizes `x` (a whole number of blocks of 32) and returns the view kernels read.
    fn quantize<'a>(&'a mut self, x: &'a [f32], permuted: bool, scales: ActScales) -> Act<'a> {
        self.fill(x, permuted, scales);
        self.view(x, permuted)
    }

    /// `quantize`'s work, without the view (so several inputs can be filled in parallel).
    fn fill(&mut self, x: &[f32], permuted: bool, scales: ActScales) {
        let run = match scales {
            ActScales::Block => QK,
            ActScales::SuperBlock => SUPER_BLOCK,
        };
        assert!(
            x.len().is_multiple_of(run),
            "input of {} values is not whole runs of {run}",
            x.len()
        );
        assert!(
            !(permuted && scales == ActScales::SuperBlock),
            "the w4 packings read blocks of 32 under their own scales"
        );
        self.scales = scales;
        assert!(
            x.len() <= self.qs.len(),
            "input of {} values is wider than ActScratch ({})",
            x.len(),
            self.qs.len()
        );
        let nb = x.len() / QK;
        let per_scale = run / QK;
        #[cfg(target_arch = "x86_64")]
        let fast = best_kernel() == Kernel::Avx2;
        #[cfg(not(target_arch = "x86_64"))]
        let fast = false;
        if fast {
            #[cfg(target_arch = "x86_64")]
            for (r, xr) in x.chunks_exact(run).enumerate() {
                // SAFETY: AVX2, FMA and F16C are present (`best_kernel`).
                let amax = unsafe { x86::max_abs(xr) };
                for b in r * per_scale..(r + 1) * per_scale {
                    let (xb, qb) = (&x[b * QK..][..QK], &mut self.qs[b * QK..][..QK]);
                    let qpb = permuted.then(|| &mut self.qp[b * QK..][..QK]);
                    let lb = &mut self.ls[b * LANES..][..LANES];
                    // SAFETY: as above.
                    let (d, sum) = unsafe { x86::quantize_block(xb, amax, qb, qpb, lb) };
                    (self.d[b], self.s[b], self.gs[b]) = (d, d * sum as f32, -sum);
                }
            }
        } else {
            quantize_q8(
                x,
                per_scale,
                &mut self.qs[..x.len()],
                &mut self.d[..nb],
                &mut self.s[..nb],
            );
            lane_sums(
                &self.qs[..x.len()],
                &mut self.ls[..nb * LANES],
                &mut self.gs[..nb],
            );
            if permuted {
                crate::backend::cpu::lowbit::permute_act(
                    &self.qs[..x.len()],
                    &mut self.qp[..x.len()],
                );
            }
        }
        if scales == ActScales::SuperBlock {
            for (h, l) in self.hs[..nb * 2].iter_mut().zip(self.ls.chunks_exact(4)) {
                // |sum| <= 16 * 128: an i16.
                *h = l.iter().sum::<i32>() as i16;
            }
        }
    }

    /// The view of `x` as last filled (`fill(x, permuted)`).
    fn view<'a>(&'a self, x: &'a [f32], permuted: bool) -> Act<'a> {
        let nb = x.len() / QK;
        Act {
            x,
            qs: &self.qs[..x.len()],
            qp: &self.qp[..if permuted { x.len() } else { 0 }],
            d: &self.d[..nb],
            s: &self.s[..nb],
            ls: &self.ls[..nb * LANES],
            gs: &self.gs[..nb],
            hs: match self.scales {
                ActScales::Block => &[],
                ActScales::SuperBlock => &self.hs[..nb * 2],
            },
        }
    }
}

/// `ls[8b + j] = -(qs[32b + 4j] + ... + qs[32b + 4j + 3])`, and `gs[b]` = minus block b's sum.
/// With these the x86 kernels dot signed weights `w` as unsigned `u = w + k` (k = 8 for 4-bit, 16 for 5-bit, 128 for 8-bit
/// values) without the per-input sign trick: starting each 32-bit lane at `k * ls` gives
/// `sum u * y - k * sum y = sum w * y`, the same exact int32 lanes.
fn lane_sums(qs: &[i8], ls: &mut [i32], gs: &mut [i32]) {
    for (run, l) in qs.chunks_exact(4).zip(ls.iter_mut()) {
        *l = -run.iter().map(|&q| q as i32).sum::<i32>();
    }
    for (block, g) in ls.chunks_exact(LANES).zip(gs.iter_mut()) {
        *g = block.iter().sum();
    }
}

/// Q8_1-style quantization of `x` into blocks of 32 (round half away from zero), each run of
/// `per_scale` blocks under the scale of its largest |value|.
fn quantize_q8(x: &[f32], per_scale: usize, qs: &mut [i8], d: &mut [f32], s: &mut [f32]) {
    let run = per_scale * QK;
    for (r, xr) in x.chunks_exact(run).enumerate() {
        let amax = xr.iter().fold(0f32, |m, v| m.max(v.abs()));
        let dd = amax / 127.0;
        let id = if dd != 0.0 { 1.0 / dd } else { 0.0 };
        for (i, xb) in xr.chunks_exact(QK).enumerate() {
            let b = r * per_scale + i;
            let mut sum = 0i32;
            for (q, &v) in qs[b * QK..][..QK].iter_mut().zip(xb) {
                *q = crate::model::ggml::round_half_away(v * id) as i8;
                sum += *q as i32;
            }
            d[b] = dd;
            s[b] = dd * sum as f32;
        }
    }
}

fn uses_q8(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
    )
}

/// `out[r] = sum_c w[r, c] * x[c]`.
pub fn matvec(
    ks: KernelSet,
    pool: &WorkerPool,
    w: &Matrix,
    x: &[f32],
    act: &mut ActScratch,
    out: &mut [f32],
) {
    matvec_many(ks, pool, &mut [(w, out)], x, act)
}

/// The kernels' safety rests on this: a set naming a kernel this CPU lacks is a fault.
fn assert_supported(ks: KernelSet) {
    assert!(
        kernel_supported(ks.kernel),
        "{:?} kernels are not supported on this CPU",
        ks.kernel
    );
}

/// Most matrices one `matvec_many` call takes.
pub const MAX_JOBS: usize = 8;

/// Several matrices sharing the input `x` (q/k/v; gate/up), in one pool dispatch.
pub fn matvec_many(
    ks: KernelSet,
    pool: &WorkerPool,
    jobs: &mut [(&Matrix, &mut [f32])],
    x: &[f32],
    act: &mut ActScratch,
) {
    matmul_many(ks, pool, jobs, x, std::slice::from_mut(act))
}

/// `out[t * rows + r] = row r . xs[t]` for each input `t` of `xs` (one per `acts` entry, `cols`
/// values each: a batch of prompt tokens), several matrices in one pool dispatch. Each task's
/// rows stay in cache while every input passes over them, so the weights stream from memory
/// once per batch instead of once per token. Row for row and input for input it is the same
/// arithmetic as `matvec_many` on that input alone, so the results are bit-identical.
pub fn matmul_many(
    ks: KernelSet,
    pool: &WorkerPool,
    jobs: &mut [(&Matrix, &mut [f32])],
    xs: &[f32],
    acts: &mut [ActScratch],
) {
    let mut rows: [Option<(Rows, &mut [f32])>; MAX_JOBS] = Default::default();
    assert!(
        jobs.len() <= MAX_JOBS,
        "matvec_many takes at most {MAX_JOBS} matrices"
    );
    let n = jobs.len();
    for (slot, (w, out)) in rows.iter_mut().zip(jobs.iter_mut()) {
        *slot = Some((Rows::from(*w), &mut **out));
    }
    rows_many(ks, pool, &mut rows[..n], xs, acts)
}

/// `out[r] = row r . x` for several row sets sharing the input `x`, in one pool dispatch.
pub fn matvec_rows_many(
    ks: KernelSet,
    pool: &WorkerPool,
    jobs: &mut [(Rows, &mut [f32])],
    x: &[f32],
    act: &mut ActScratch,
) {
    let mut slots: [Option<(Rows, &mut [f32])>; MAX_JOBS] = Default::default();
    assert!(
        jobs.len() <= MAX_JOBS,
        "matvec_rows_many takes at most {MAX_JOBS} row sets"
    );
    let n = jobs.len();
    for (slot, (w, out)) in slots.iter_mut().zip(jobs.iter_mut()) {
        *slot = Some((*w, &mut **out));
    }
    rows_many(ks, pool, &mut slots[..n], x, std::slice::from_mut(act))
}

/// `out[i] = row idx[i] . x`: the rows named by `idx`, in the order given.
pub fn matvec_gather(
    ks: KernelSet,
    pool: &WorkerPool,
    w: Rows,
    idx: &[u32],
    x: &[f32],
    act: &mut ActScratch,
    out: &mut [f32],
) {
    assert_supported(ks);
    assert_eq!(
        w.cols,
        x.len(),
        "rows have {} cols, input {} values",
        w.cols,
        x.len()
    );
    assert_eq!(
        out.len(),
        idx.len(),
        "{} indices, {} outputs",
        idx.len(),
        out.len()
    );
    let row_bytes = w.row_bytes();
    if let Some(&m) = idx.iter().max() {
        assert!((m as usize) < w.rows, "row {m} of {}", w.rows);
    }
    assert!(w.q.is_none(), "gathered rows are GGML-typed");
    let a = if uses_q8(w.ty) {
        act.quantize(x, false, ActScales::for_types(ks, [w.ty]))
    } else {
        Act::plain(x)
    };
    let f = chunk_fn(w.ty, ks);
    let f4 = dot4_fn(w.ty, ks);
    let nb = row_bytes / w.ty.block_bytes();
    let n = pool.n_threads();
    let chunk = (idx.len().div_ceil(4 * n)).clamp(8, 64);
    let tasks = idx.len().div_ceil(chunk);
    let outp = OutPtr(out.as_mut_ptr());
    let row = |r: u32| &w.data[w.offset(r as usize)..][..row_bytes];
    pool.run(tasks, &|t| {
        let i0 = t * chunk;
        let i1 = (i0 + chunk).min(idx.len());
        let ids = &idx[i0..i1];
        // SAFETY: tasks write disjoint ranges i0..i1 of `out` (borrowed mutably for the call).
        let o = unsafe { std::slice::from_raw_parts_mut(outp.ptr().add(i0), i1 - i0) };
        // The rows a token needs are scattered: each is prefetched a few rows ahead.
        let prefetch_ahead = |i: usize| prefetch_gathered(ids, i, row);
        let mut i = 0;
        if let Some(f4) = f4 {
            while i + 4 <= ids.len() {
                prefetch_ahead(i);
                let rows = [0, 1, 2, 3].map(|k| row(ids[i + k]).as_ptr());
                // SAFETY: a kernel this CPU supports (asserted above), four whole rows of `nb`
                // blocks, and `a` covers their `cols` values.
                o[i..i + 4].copy_from_slice(&unsafe { f4(rows, nb, 0, &a) });
                i += 4;
            }
        }
        while i < ids.len() {
            prefetch_ahead(i);
            // SAFETY: as in `rows_many_with`: a supported kernel, one whole row, `a` covers it.
            unsafe { f(row(ids[i]), row_bytes, row_bytes, &a, &mut o[i..i + 1]) };
            i += 1;
        }
    });
}

/// `out_a[j] = a.row(j) . x` and `out_b[j] = b.row(j) . x` for every row, where row j of `a`
/// and row j of `b` lie side by side (a neuron bundle's gate and up rows): each task reads the
/// two together, so the pair streams as one run of bytes instead of two strided streams.
/// `then` runs on each task's finished rows of both outputs (the sparse FFN's SwiGLU), so that
/// per-row work after the products is spread over the pool too.
#[allow(clippy::too_many_arguments)]
pub fn matvec_pairs(
    ks: KernelSet,
    pool: &WorkerPool,
    a: Rows,
    b: Rows,
    x: &[f32],
    act: &mut ActScratch,
    out_a: &mut [f32],
    out_b: &mut [f32],
    then: &(dyn Fn(&mut [f32], &mut [f32]) + Sync),
) {
    assert_supported(ks);
    let f4 = dot4_fn(a.ty, ks).filter(|_| a.ty == b.ty && a.q.is_none() && b.q.is_none());
    let Some(f4) = f4 else {
        matvec_rows_many(ks, pool, &mut [(a, &mut *out_a), (b, &mut *out_b)], x, act);
        return then(out_a, out_b);
    };
    assert!(
        a.rows == b.rows && a.cols == b.cols && a.stride == b.stride && a.tile == b.tile,
        "paired row sets differ: {}x{} and {}x{}",
        a.rows,
        a.cols,
        b.rows,
        b.cols
    );
    assert_eq!(
        a.cols,
        x.len(),
        "rows have {} cols, input {}",
        a.cols,
        x.len()
    );
    assert!(
        out_a.len() == a.rows && out_b.len() == b.rows,
        "outputs of {} rows",
        a.rows
    );
    let row_bytes = a.row_bytes();
    let _ = b.row_bytes();
    let nb = row_bytes / a.ty.block_bytes();
    let f = chunk_fn(a.ty, ks);
    let act = act.quantize(x, false, ActScales::for_types(ks, [a.ty, b.ty]));
    let rows = a.rows;
    let chunk = rows
        .div_ceil(4 * pool.n_threads())
        .clamp(16, 64)
        .next_multiple_of(2);
    let (pa, pb) = (OutPtr(out_a.as_mut_ptr()), OutPtr(out_b.as_mut_ptr()));
    pool.run(rows.div_ceil(chunk), &|t| {
        let r0 = t * chunk;
        let r1 = (r0 + chunk).min(rows);
        // SAFETY: tasks write disjoint row ranges r0..r1 of both outputs (borrowed mutably).
        let (oa, ob) = unsafe {
            (
                std::slice::from_raw_parts_mut(pa.ptr().add(r0), r1 - r0),
                std::slice::from_raw_parts_mut(pb.ptr().add(r0), r1 - r0),
            )
        };
        let (da, db) = (a.data.as_ptr(), b.data.as_ptr());
        let mut r = r0;
        while r + 2 <= r1 {
            let (o0, o1) = (a.offset(r), a.offset(r + 1));
            // Within `data`: `row_bytes()` above checked that the last row ends inside it.
            let (a0, b0) = (da.wrapping_add(o0), db.wrapping_add(o0));
            let (a1, b1) = (da.wrapping_add(o1), db.wrapping_add(o1));
            // SAFETY: a kernel this CPU supports (asserted above), whole rows of `nb` blocks, `act`
            // covers their `cols` values; the prefetch 4 rows on is a hint, never a load.
            let o = unsafe { f4([a0, b0, a1, b1], nb, 4 * a.stride, &act) };
            (oa[r - r0], ob[r - r0], oa[r + 1 - r0], ob[r + 1 - r0]) = (o[0], o[1], o[2], o[3]);
            r += 2;
        }
        if r < r1 {
            // SAFETY: as above, one whole row each.
            unsafe {
                f(a.row(r), row_bytes, row_bytes, &act, &mut oa[r - r0..]);
                f(b.row(r), row_bytes, row_bytes, &act, &mut ob[r - r0..]);
            }
        }
        then(oa, ob);
    });
}

/// The one dispatch behind every product: `acts.len()` inputs of `cols` values in `xs`, each
/// job's `out` holding one row set's results per input (input-major).
fn rows_many(
    ks: KernelSet,
    pool: &WorkerPool,
    jobs: &mut [Option<(Rows, &mut [f32])>],
    xs: &[f32],
    acts: &mut [ActScratch],
) {
    assert_supported(ks);
    assert!(
        jobs.len() <= MAX_JOBS,
        "matvec_many takes at most {MAX_JOBS} matrices"
    );
    let need_q8 = jobs.iter().flatten().any(|(w, _)| uses_q8(w.ty));
    let scales = ActScales::for_types(ks, jobs.iter().flatten().map(|(w, _)| w.ty));
    let permuted = jobs.iter().flatten().any(|(w, _)| {
        matches!(
            w.q,
            Some(QFormat::W4(Packing::Interleaved | Packing::Swizzled))
        )
    });
    let n_in = acts.len();
    assert!(
        (1..=MAX_INPUTS).contains(&n_in),
        "{n_in} inputs (1 to {MAX_INPUTS})"
    );
    assert!(
        xs.len().is_multiple_of(n_in),
        "{} values are not {n_in} inputs",
        xs.len()
    );
    let cols = xs.len() / n_in;
    if need_q8 && n_in > 1 {
        // A batch's inputs are quantized across the pool, not one by one on this thread.
        let scratch = OutPtr(acts.as_mut_ptr());
        pool.run(n_in, &|i| {
            // SAFETY: task i alone touches `acts[i]` (i < n_in = acts.len()), and `acts` is
            // borrowed mutably for this whole call.
            let act = unsafe { &mut *scratch.ptr().add(i) };
            act.fill(&xs[i * cols..][..cols], permuted, scales);
        });
    } else if need_q8 {
        acts[0].fill(xs, permuted, scales);
    }
    let mut inputs: heapless::Vec<Act, MAX_INPUTS> = heapless::Vec::new();
    for (x, act) in xs.chunks_exact(cols).zip(acts.iter()) {
        let a = if need_q8 {
            act.view(x, permuted)
        } else {
            Act::plain(x)
        };
        // Cannot fail: n_in <= MAX_INPUTS, asserted above.
        let _ = inputs.push(a);
    }
    let n = pool.n_threads();
    let mut parts: [Option<Part>; MAX_JOBS] = Default::default();
    let mut n_tasks = 0;
    for (slot, (w, out)) in parts.iter_mut().zip(jobs.iter_mut().flatten()) {
        assert_eq!(
            w.cols, cols,
            "matrix has {} cols, input {} values",
            w.cols, cols
        );
        assert_eq!(
            out.len(),
            w.rows * n_in,
            "matrix has {} rows ({n_in} inputs), output {} values",
            w.rows,
            out.len()
        );
        let row_bytes = w.row_bytes();
        // Swizzled w4 matrices are read in whole bands of 32 rows.
        let banded = w.q == Some(QFormat::W4(Packing::Swizzled));
        let tiled = w.tile != Tile::NONE;
        assert!(
            !tiled || (!banded && w.tile.rows() % 4 == 0),
            "tiles of {} rows",
            w.tile.rows()
        );
        let chunk = if banded {
            (w.rows.div_ceil(4 * n)).clamp(32, 64).next_multiple_of(32)
        } else if tiled {
            // A task's rows must be `stride` apart: one tile each.
            w.tile.rows()
        } else {
            (w.rows.div_ceil(4 * n)).clamp(16, 64).next_multiple_of(4)
        };
        let chunks = w.rows.div_ceil(chunk);
        // Each worker's chunks are adjacent (`Part::per_lane`): `n` lanes of `per_lane` chunks.
        let per_lane = chunks.div_ceil(n);
        let tasks = n * per_lane;
        *slot = Some(Part {
            data: w.data,
            rows: w.rows,
            row_bytes,
            stride: w.stride,
            tile: w.tile,
            chunk,
            chunks,
            per_lane,
            banded,
            first_task: n_tasks,
            f: match w.q {
                Some(f) => {
                    assert_eq!(w.stride, row_bytes, "low-bit rows must be adjacent");
                    PartFn::Low(
                        crate::backend::cpu::lowbit::chunk_fn(f, ks),
                        crate::backend::cpu::lowbit::chunk_many_fn(f, ks),
                    )
                }
                None => PartFn::Ggml(chunk_fn(w.ty, ks), many_fn(w.ty, ks)),
            },
            out: OutPtr(out.as_mut_ptr()),
        });
        n_tasks += tasks;
    }
    let parts = &parts[..jobs.len()];
    pool.run(n_tasks, &|t| {
        let p = parts
            .iter()
            .rev()
            .flatten()
            .find(|p| p.first_task <= t)
            .expect("task index in range");
        // Task `n * k + l` is lane `l`'s chunk `k`: workers claim tasks in turn, so each
        // tends to take the chunk after its last one and streams its lane front to back.
        let local = t - p.first_task;
        let c = (local % n) * p.per_lane + local / n;
        if c >= p.chunks {
            return;
        }
        let r0 = c * p.chunk;
        let r1 = (r0 + p.chunk).min(p.rows);
        let at = |r: usize| p.tile.offset(r, p.stride);
        let data = if p.banded {
            // From the band's start to the end: the last band is padded past `rows`.
            &p.data[r0 * p.stride..]
        } else {
            &p.data[at(r0)..at(r1 - 1) + p.row_bytes]
        };
        if inputs.len() > 1 {
            let out = p.out.0.wrapping_add(r0);
            // SAFETY: as below, for every input at once: input i writes out[i * rows + r0..r1].
            match p.f {
                PartFn::Low(_, Some(f)) => {
                    unsafe { f(data, p.row_bytes, &inputs, out, p.rows, r1 - r0) };
                    return;
                }
                PartFn::Ggml(_, Some(f)) => {
                    unsafe { f(data, p.row_bytes, p.stride, &inputs, out, p.rows, r1 - r0) };
                    return;
                }
                _ => {}
            }
        }
        // Every input over the same rows, which stay in cache after the first.
        for (i, a) in inputs.iter().enumerate() {
            let at = i * p.rows + r0;
            // SAFETY: tasks of one part cover disjoint row ranges of each input's `rows`
            // outputs, parts write distinct `out` slices (borrowed mutably by `jobs` for the
            // whole run), and at + (r1 - r0) <= n_in * rows = out.len() (asserted above).
            let out = unsafe { std::slice::from_raw_parts_mut(p.out.0.add(at), r1 - r0) };
            // SAFETY: `chunk_fn` returned this function for a kernel checked above to be
            // supported, `data` is whole rows of `row_bytes`, and `a` covers `cols` values.
            unsafe {
                match p.f {
                    PartFn::Ggml(f, _) => f(data, p.row_bytes, p.stride, a, out),
                    PartFn::Low(f, _) => f(data, p.row_bytes, a, out),
                }
            };
        }
    });
}

struct Part<'a> {
    data: &'a [u8],
    rows: usize,
    row_bytes: usize,
    stride: usize,
    tile: Tile,
    chunk: usize,
    /// Chunks of `chunk` rows: `rows` rounded up.
    chunks: usize,
    /// Chunks per lane: lane `l` is chunks `l * per_lane..(l + 1) * per_lane`, adjacent rows.
    per_lane: usize,
    banded: bool,
    first_task: usize,
    f: PartFn,
    out: OutPtr,
}

/// Computes `out[i]` for the rows of `data` (`out.len()` rows of `row_bytes`, row `i` at
/// `i * stride`). Unsafe: the kernel's CPU features must be present, and `act` must cover the
/// rows' columns.
type ChunkFn = unsafe fn(data: &[u8], row_bytes: usize, stride: usize, act: &Act, out: &mut [f32]);

/// `ChunkFn` for several inputs: input `t`'s result for row `r` (of `rows`, `stride` apart) goes
/// to `out[t * out_stride + r]`. Unsafe: as `ChunkFn`, and `out` must be valid for every index
/// written.
type ChunkManyFn = unsafe fn(
    data: &[u8],
    row_bytes: usize,
    stride: usize,
    acts: &[Act],
    out: *mut f32,
    out_stride: usize,
    rows: usize,
);

/// A part's kernel: a GGML kernel over strided rows, or a low-bit one over adjacent rows, each
/// with its many-input form where there is one.
#[derive(Clone, Copy)]
enum PartFn {
    Ggml(ChunkFn, Option<ChunkManyFn>),
    Low(QChunkFn, Option<QChunkManyFn>),
}

/// Four rows at any four addresses (`nb` blocks each) against one activation vector; `pf` > 0
/// prefetches `pf` bytes past every block read. Unsafe: the kernel's CPU features must be
/// present, each address must hold `nb` blocks, and `act` must cover them.
type Dot4Fn = unsafe fn(rows: [*const u8; 4], nb: usize, pf: usize, act: &Act) -> [f32; 4];

/// The four-row kernel of `ty` under `ks`, where there is one (AVX2, 32-value block types).
fn dot4_fn(ty: GgmlType, ks: KernelSet) -> Option<Dot4Fn> {
    #[cfg(target_arch = "x86_64")]
    if ks.kernel == Kernel::Avx2 {
        return x86::dot4_fn(ty, ks);
    }
    let _ = (ty, ks);
    None
}

/// The many-input kernel of `ty` under `ks`, where there is one (AVX2, 32-value block types);
/// elsewhere each input runs `chunk_fn`'s kernel in turn.
fn many_fn(ty: GgmlType, ks: KernelSet) -> Option<ChunkManyFn> {
    #[cfg(target_arch = "x86_64")]
    if ks.kernel == Kernel::Avx2 {
        return x86::many_fn(ty, ks);
    }
    let _ = (ty, ks);
    None
}

fn chunk_fn(ty: GgmlType, ks: KernelSet) -> ChunkFn {
    #[cfg(target_arch = "x86_64")]
    if ks.kernel == Kernel::Avx2 {
        return x86::chunk_fn(ty, ks);
    }
    #[cfg(target_arch = "aarch64")]
    if ks.kernel == Kernel::Neon {
        if let Some(f) = neon::chunk_fn(ty) {
            return f;
        }
    }
    let _ = ks;
    scalar::chunk_fn(ty)
}

// ---------------------------------------------------------------------------------------------
// Block decoding shared by all kernels.

#[inline(always)]
fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

// ---------------------------------------------------------------------------------------------
// The kernels, one file per instruction set: `scalar.rs` (the portable fallback and the
// definition the others mirror), `x86.rs` (AVX2 + FMA + F16C, VNNI) and `neon.rs`; the
// K-quants' are in `kquant`.

mod scalar;

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(target_arch = "aarch64")]
mod neon;

#[cfg(test)]
mod tests;
