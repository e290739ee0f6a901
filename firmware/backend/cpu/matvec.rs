//! Matrix-vector products over weights stored in their GGML type.
//!
//! Classic quant types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) use the llama.cpp approach: the input
//! vector is quantized once per call to int8 blocks of 32 (Q8_1-style: `d = amax / 127`, plus
//! `s = d * sum(q)` for the `_1` types' offset term), and each weight block is dotted in
//! integers (int8 x int8 -> int32) and scaled by `d_w * d_x`. K-quants (Q4_K, Q5_K, Q6_K) dot the
//! same int8 input in their stored super-blocks (`kquant`). Float types (F32, F16, BF16) are
//! dotted in f32 with `x` directly.
//!
//! Kernels: AVX2+FMA+F16C (x86_64, detected once at run time), NEON (aarch64; Q4_0, Q4_1,
//! Q8_0 and the K-quants),
//! and a portable scalar fallback that is always compiled. Every entry point takes the
//! [`KernelSet`] its caller picked at boot (tests and ablations pass another).
//!
//! Rows are split across the pool's threads in chunks of 16-64 rows (a multiple of 4).

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
// Scalar kernels: the portable fallback, and the definition the SIMD kernels mirror.

mod scalar {
    use super::*;

    pub(super) fn chunk_fn(ty: GgmlType) -> ChunkFn {
        match ty {
            GgmlType::Q4_0 => chunk::<Q4_0>,
            GgmlType::Q4_1 => chunk::<Q4_1>,
            GgmlType::Q5_0 => chunk::<Q5_0>,
            GgmlType::Q5_1 => chunk::<Q5_1>,
            GgmlType::Q8_0 => chunk::<Q8_0>,
            GgmlType::F32 => chunk::<F32>,
            GgmlType::F16 => chunk::<F16>,
            GgmlType::BF16 => chunk::<Bf16>,
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => super::kquant::scalar_chunk_fn(ty),
        }
    }

    pub(super) trait RowDot {
        fn dot(row: &[u8], a: &Act) -> f32;
    }

    fn chunk<T: RowDot>(data: &[u8], row_bytes: usize, stride: usize, a: &Act, out: &mut [f32]) {
        for (i, o) in out.iter_mut().enumerate() {
            *o = T::dot(&data[i * stride..][..row_bytes], a);
        }
    }

    /// Integer dot of one classic block: weights `w(j)` for j in 0..32 with activations `qa`.
    #[inline(always)]
    fn idot(qa: &[i8], w: impl Fn(usize) -> i32) -> i32 {
        (0..QK).map(|j| w(j) * qa[j] as i32).sum()
    }

    pub(super) struct Q4_0;
    impl RowDot for Q4_0 {
        fn dot(row: &[u8], a: &Act) -> f32 {
            let mut acc = 0f32;
            for (b, blk) in row.chunks_exact(18).enumerate() {
                let qs = &blk[2..18];
                let i = idot(&a.qs[b * QK..], |j| {
                    (qs[j % 16] >> (4 * (j / 16)) & 0xF) as i32 - 8
                });
                acc += f16_to_f32(le16(blk, 0)) * a.d[b] * i as f32;
            }
            acc
        }
    }

    pub(super) struct Q4_1;
    impl RowDot for Q4_1 {
        fn dot(row: &[u8], a: &Act) -> f32 {
            let mut acc = 0f32;
            for (b, blk) in row.chunks_exact(20).enumerate() {
                let qs = &blk[4..20];
                let i = idot(&a.qs[b * QK..], |j| {
                    (qs[j % 16] >> (4 * (j / 16)) & 0xF) as i32
                });
                acc += f16_to_f32(le16(blk, 0)) * a.d[b] * i as f32
                    + f16_to_f32(le16(blk, 2)) * a.s[b];
            }
            acc
        }
    }

    pub(super) struct Q5_0;
    impl RowDot for Q5_0 {
        fn dot(row: &[u8], a: &Act) -> f32 {
            let mut acc = 0f32;
            for (b, blk) in row.chunks_exact(22).enumerate() {
                let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                let qs = &blk[6..22];
                let i = idot(&a.qs[b * QK..], |j| {
                    let lo = (qs[j % 16] >> (4 * (j / 16))) & 0xF;
                    (lo as u32 | ((qh >> j) & 1) << 4) as i32 - 16
                });
                acc += f16_to_f32(le16(blk, 0)) * a.d[b] * i as f32;
            }
            acc
        }
    }

    pub(super) struct Q5_1;
    impl RowDot for Q5_1 {
        fn dot(row: &[u8], a: &Act) -> f32 {
            let mut acc = 0f32;
            for (b, blk) in row.chunks_exact(24).enumerate() {
                let qh = u32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]);
                let qs = &blk[8..24];
                let i = idot(&a.qs[b * QK..], |j| {
                    let lo = (qs[j % 16] >> (4 * (j / 16))) & 0xF;
                    (lo as u32 | ((qh >> j) & 1) << 4) as i32
                });
                acc += f16_to_f32(le16(blk, 0)) * a.d[b] * i as f32
                    + f16_to_f32(le16(blk, 2)) * a.s[b];
            }
            acc
        }
    }

    pub(super) struct Q8_0;
    impl RowDot for Q8_0 {
        fn dot(row: &[u8], a: &Act) -> f32 {
            let mut acc = 0f32;
            for (b, blk) in row.chunks_exact(34).enumerate() {
                let i = idot(&a.qs[b * QK..], |j| blk[2 + j] as i8 as i32);
                acc += f16_to_f32(le16(blk, 0)) * a.d[b] * i as f32;
            }
            acc
        }
    }

    pub(super) struct F32;
    impl RowDot for F32 {
        fn dot(row: &[u8], a: &Act) -> f32 {
            row.chunks_exact(4)
                .zip(a.x)
                .map(|(w, x)| f32::from_le_bytes([w[0], w[1], w[2], w[3]]) * x)
                .sum()
        }
    }

    pub(super) struct F16;
    impl RowDot for F16 {
        fn dot(row: &[u8], a: &Act) -> f32 {
            row.chunks_exact(2)
                .zip(a.x)
                .map(|(w, x)| f16_to_f32(le16(w, 0)) * x)
                .sum()
        }
    }

    pub(super) struct Bf16;
    impl RowDot for Bf16 {
        fn dot(row: &[u8], a: &Act) -> f32 {
            row.chunks_exact(2)
                .zip(a.x)
                .map(|(w, x)| bf16_to_f32(le16(w, 0)) * x)
                .sum()
        }
    }
}

// ---------------------------------------------------------------------------------------------
// AVX2 + FMA + F16C kernels (ggml's `ggml_vec_dot_*_q8_*` approach).

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use crate::backend::cpu::lowbit::vnni_form;
    use crate::backend::cpu::lowbit::x86::{
        dpbusd, offset_start, offset_unsigned, VNNI_EVEX, VNNI_NONE, VNNI_VEX,
    };
    use std::arch::x86_64::*;

    /// `f::<V>` for the VNNI form `V` that `ks` uses on this CPU
    /// (`backend::cpu::lowbit::vnni_form`).
    macro_rules! by_vnni {
        ($f:ident, $ks:expr) => {
            match vnni_form($ks) {
                VNNI_VEX => $f::<VNNI_VEX>,
                VNNI_EVEX => $f::<VNNI_EVEX>,
                _ => $f::<VNNI_NONE>,
            }
        };
    }

    pub(super) fn chunk_fn(ty: GgmlType, ks: KernelSet) -> ChunkFn {
        match ty {
            GgmlType::Q4_0 => by_vnni!(chunk_q4_0, ks),
            GgmlType::Q4_1 => by_vnni!(chunk_q4_1, ks),
            GgmlType::Q5_0 => by_vnni!(chunk_q5_0, ks),
            GgmlType::Q5_1 => by_vnni!(chunk_q5_1, ks),
            GgmlType::Q8_0 => by_vnni!(chunk_q8_0, ks),
            GgmlType::F32 => chunk_f32,
            GgmlType::F16 => chunk_f16,
            GgmlType::BF16 => chunk_bf16,
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
                super::kquant::avx2_chunk_fn(ty, ks)
            }
        }
    }

    /// The largest |value| of `x` (whole blocks of 32), as `quantize_q8`'s fold finds it.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn max_abs(x: &[f32]) -> f32 {
        assert!(x.len().is_multiple_of(QK));
        let abs = |v: __m256| _mm256_andnot_ps(_mm256_set1_ps(-0.0), v);
        let mut m = _mm256_setzero_ps();
        for xb in x.chunks_exact(QK) {
            let v: [__m256; 4] = [0, 8, 16, 24].map(|o| _mm256_loadu_ps(xb.as_ptr().add(o)));
            m = _mm256_max_ps(
                m,
                _mm256_max_ps(
                    _mm256_max_ps(abs(v[0]), abs(v[1])),
                    _mm256_max_ps(abs(v[2]), abs(v[3])),
                ),
            );
        }
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
    }

    /// One block of `quantize_q8` under the scale of `amax` (`max_abs` of its run),
    /// `lane_sums` and (with `qp`) `permute_act`, eight values per register: the same
    /// `x * id`, and `round_half_away`'s truncation and exact fraction test, so the same
    /// bytes. Returns `d` and the block's sum.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn quantize_block(
        x: &[f32],
        amax: f32,
        q: &mut [i8],
        qp: Option<&mut [i8]>,
        ls: &mut [i32],
    ) -> (f32, i32) {
        assert!(x.len() == QK && q.len() == QK && ls.len() == LANES);
        let v: [__m256; 4] = [0, 8, 16, 24].map(|o| _mm256_loadu_ps(x.as_ptr().add(o)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let half = _mm256_set1_ps(0.5);
        let round = |v: __m256| {
            let y = _mm256_mul_ps(v, id);
            let t = _mm256_cvttps_epi32(y);
            let f = _mm256_sub_ps(y, _mm256_cvtepi32_ps(t));
            // Masks are -1 where true: t + (f >= 0.5) - (f <= -0.5).
            let up = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(f, half));
            let down = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(
                f,
                _mm256_sub_ps(_mm256_setzero_ps(), half),
            ));
            _mm256_add_epi32(_mm256_sub_epi32(t, up), down)
        };
        let i = [round(v[0]), round(v[1]), round(v[2]), round(v[3])];
        // Sums of four: lane j of `h` is values 4j..4j + 3 once reordered.
        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(i[0], i[1]), _mm256_hadd_epi32(i[2], i[3]));
        let runs = _mm256_permutevar8x32_epi32(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(
            ls.as_mut_ptr().cast(),
            _mm256_sub_epi32(_mm256_setzero_si256(), runs),
        );
        let s = _mm_add_epi32(
            _mm256_castsi256_si128(runs),
            _mm256_extracti128_si256(runs, 1),
        );
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s)));
        // |values| <= 127: the saturating packs keep them; they interleave the 128-bit halves,
        // which the dword permute puts back in order.
        let w = _mm256_packs_epi16(
            _mm256_packs_epi32(i[0], i[1]),
            _mm256_packs_epi32(i[2], i[3]),
        );
        let bytes = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(q.as_mut_ptr().cast(), bytes);
        if let Some(qp) = qp {
            assert!(qp.len() == QK);
            // `PERM` order: words 0, 2, 4, 6 (values 0-3, 8-11, ...), then 1, 3, 5, 7.
            let p = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
            _mm256_storeu_si256(qp.as_mut_ptr().cast(), p);
        }
        (d, sum)
    }

    /// Every form of the classic kernel of `ty` this CPU runs: AVX2 alone, and the VNNI form
    /// it has (`None` for types without a classic kernel).
    #[cfg(test)]
    pub(super) fn classic_forms(ty: GgmlType) -> Option<Vec<(&'static str, ChunkFn)>> {
        macro_rules! forms {
            ($f:ident) => {{
                let mut v: Vec<(&'static str, ChunkFn)> = vec![("avx2", $f::<VNNI_NONE>)];
                match crate::backend::cpu::lowbit::x86::vnni() {
                    VNNI_VEX => v.push(("avx-vnni", $f::<VNNI_VEX>)),
                    VNNI_EVEX => v.push(("avx512-vnni", $f::<VNNI_EVEX>)),
                    _ => {}
                }
                v
            }};
        }
        Some(match ty {
            GgmlType::Q4_0 => forms!(chunk_q4_0),
            GgmlType::Q4_1 => forms!(chunk_q4_1),
            GgmlType::Q5_0 => forms!(chunk_q5_0),
            GgmlType::Q5_1 => forms!(chunk_q5_1),
            GgmlType::Q8_0 => forms!(chunk_q8_0),
            _ => return None,
        })
    }

    /// The many-input kernel for the 32-value block types (batched prefill).
    pub(super) fn many_fn(ty: GgmlType, ks: KernelSet) -> Option<ChunkManyFn> {
        Some(match ty {
            GgmlType::Q4_0 => by_vnni!(many_q4_0, ks),
            GgmlType::Q4_1 => by_vnni!(many_q4_1, ks),
            GgmlType::Q5_0 => by_vnni!(many_q5_0, ks),
            GgmlType::Q5_1 => by_vnni!(many_q5_1, ks),
            GgmlType::Q8_0 => by_vnni!(many_q8_0, ks),
            _ => return None,
        })
    }

    /// The four-row kernel for the 32-value block types (gathered and paired rows).
    pub(super) fn dot4_fn(ty: GgmlType, ks: KernelSet) -> Option<Dot4Fn> {
        Some(match ty {
            GgmlType::Q4_0 => by_vnni!(dot4_q4_0, ks),
            GgmlType::Q4_1 => by_vnni!(dot4_q4_1, ks),
            GgmlType::Q5_0 => by_vnni!(dot4_q5_0, ks),
            GgmlType::Q5_1 => by_vnni!(dot4_q5_1, ks),
            GgmlType::Q8_0 => by_vnni!(dot4_q8_0, ks),
            _ => return None,
        })
    }

    macro_rules! chunk {
        ($name:ident, $dot:ident) => {
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn $name(
                data: &[u8],
                row_bytes: usize,
                stride: usize,
                a: &Act,
                out: &mut [f32],
            ) {
                for (i, o) in out.iter_mut().enumerate() {
                    *o = $dot(&data[i * stride..][..row_bytes], a);
                }
            }
        };
    }
    chunk!(chunk_f32, dot_f32);
    chunk!(chunk_f16, dot_f16);
    chunk!(chunk_bf16, dot_bf16);

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// The f16 at `p` (unaligned) as f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
        let h = p.cast::<u16>().read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
    }

    /// 16 bytes of packed nibbles to 32 bytes: low nibbles (elements 0..16), then high.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn nibbles(p: *const u8) -> __m256i {
        let t = _mm_loadu_si128(p.cast());
        let hi = _mm_srli_epi16(t, 4);
        _mm256_and_si256(_mm256_set_m128i(hi, t), _mm256_set1_epi8(0x0F))
    }

    /// 32 bits at `p` to 32 bytes, 0xFF where the bit is set.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn bits(p: *const u8) -> __m256i {
        let x = p.cast::<i32>().read_unaligned();
        let shuf = _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0x0000000000000000,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x), shuf);
        let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
        _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
    }

    /// One block's dot as 8 floats, lane j = `sum w * y` over values 4j..4j + 3, exact in
    /// int32 before the conversion. `w`: the block's 32 weights; with `SHIFT` = 0 they are
    /// unsigned (the `_1` types), else signed, and dotted as unsigned `u = w + 2^SHIFT` from
    /// the start `2^SHIFT * ls` (`Act::ls`), which gives the same int32 lanes without the
    /// per-input sign trick, wherever the dot is exact for such `u`: under VNNI, or with
    /// `FITS` (u <= 31 keeps `maddubs` from saturating). Otherwise the sign trick.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block_lanes<const V: u8, const SHIFT: i32, const FITS: bool>(
        w: __m256i,
        y: __m256i,
        a: &Act,
        b: usize,
    ) -> __m256 {
        let u = block_operand::<V, SHIFT, FITS>(w);
        block_dot::<V, SHIFT, FITS>(block_start::<V, SHIFT, FITS>(a, b), u, y)
    }

    /// Whether `block_lanes` dots offset unsigned weights from a start (else: the sign trick,
    /// or no offset at all with `SHIFT` = 0).
    #[inline(always)]
    fn offset_dot<const V: u8, const SHIFT: i32, const FITS: bool>() -> bool {
        SHIFT != 0 && (V != VNNI_NONE || FITS)
    }

    /// The weights in the form `block_dot` takes: `w + 2^SHIFT` for an offset dot, else `w`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block_operand<const V: u8, const SHIFT: i32, const FITS: bool>(
        w: __m256i,
    ) -> __m256i {
        if offset_dot::<V, SHIFT, FITS>() {
            offset_unsigned::<SHIFT>(w)
        } else {
            w
        }
    }

    /// The start of input `a`'s dot with block `b`: `2^SHIFT * ls` for an offset dot, else 0.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block_start<const V: u8, const SHIFT: i32, const FITS: bool>(
        a: &Act,
        b: usize,
    ) -> __m256i {
        if offset_dot::<V, SHIFT, FITS>() {
            offset_start::<SHIFT>(a, b)
        } else {
            _mm256_setzero_si256()
        }
    }

    /// `block_lanes` from its parts (`block_operand` of the weights, `block_start` of the
    /// input), so that a kernel can make each once and use it for several rows or inputs.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block_dot<const V: u8, const SHIFT: i32, const FITS: bool>(
        start: __m256i,
        u: __m256i,
        y: __m256i,
    ) -> __m256 {
        let i = if SHIFT == 0 || offset_dot::<V, SHIFT, FITS>() {
            dpbusd::<V>(start, u, y)
        } else {
            dpbusd::<V>(start, _mm256_sign_epi8(u, u), _mm256_sign_epi8(y, u))
        };
        _mm256_cvtepi32_ps(i)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_qa(a: &Act, b: usize) -> __m256i {
        debug_assert!(a.qs.len() >= (b + 1) * QK);
        _mm256_loadu_si256(a.qs.as_ptr().add(b * QK).cast())
    }

    /// How many rows ahead the 4-row classic kernels prefetch.
    const PF_ROWS: usize = 4;

    /// Classic-type row dot: `weights(blk)` gives the 32 weight bytes of a block, signed
    /// values offset by `2^$shift` to be unsigned, or unsigned ones (0..31) with `$shift` 0
    /// (`block_lanes`; `$fits`: the unsigned values fit `maddubs`), `has_min` adds `m * s`.
    /// Each kernel takes the VNNI form `V` (`by_vnni!`); every form gives the same int32 lanes.
    macro_rules! classic_dot {
        ($name:ident, $dot4:ident, $chunk:ident, $many:ident, $bytes:literal, $has_min:literal, $shift:literal, $fits:literal, |$p:ident| $w:expr) => {
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn $name<const V: u8>(row: &[u8], a: &Act) -> f32 {
                let nb = row.len() / $bytes;
                debug_assert!(a.d.len() >= nb && a.s.len() >= nb);
                let mut acc0 = _mm256_setzero_ps();
                let mut acc1 = _mm256_setzero_ps();
                let mut summs = 0f32;
                let blocks = row.as_ptr();
                let one = |b: usize, acc: __m256, summs: &mut f32| -> __m256 {
                    let $p = blocks.add(b * $bytes);
                    let w: __m256i = $w;
                    let y = load_qa(a, b);
                    let xy = block_lanes::<V, $shift, $fits>(w, y, a, b);
                    if $has_min {
                        *summs += f16_at($p.add(2)) * *a.s.get_unchecked(b);
                    }
                    let d = f16_at($p) * *a.d.get_unchecked(b);
                    _mm256_fmadd_ps(_mm256_set1_ps(d), xy, acc)
                };
                let mut b = 0;
                while b + 2 <= nb {
                    acc0 = one(b, acc0, &mut summs);
                    acc1 = one(b + 1, acc1, &mut summs);
                    b += 2;
                }
                if b < nb {
                    acc0 = one(b, acc0, &mut summs);
                }
                hsum(_mm256_add_ps(acc0, acc1)) + summs
            }

            /// Four rows at any four addresses, sharing each activation block. With `pf` > 0
            /// each block `pf` bytes further on is prefetched too (the next rows' same spot:
            /// the hardware prefetcher alone leaves DRAM streaming latency-bound; past the end
            /// of the data this is a harmless hint, never a load).
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn $dot4<const V: u8>(
                rows: [*const u8; 4],
                nb: usize,
                pf: usize,
                a: &Act,
            ) -> [f32; 4] {
                debug_assert!(a.d.len() >= nb && a.s.len() >= nb);
                let mut acc = [_mm256_setzero_ps(); 4];
                let mut summs = [0f32; 4];
                for b in 0..nb {
                    let y = load_qa(a, b);
                    let da = *a.d.get_unchecked(b);
                    for k in 0..4 {
                        let $p = rows[k].add(b * $bytes);
                        if pf != 0 {
                            _mm_prefetch::<_MM_HINT_T0>($p.wrapping_add(pf).cast());
                        }
                        let w: __m256i = $w;
                        let xy = block_lanes::<V, $shift, $fits>(w, y, a, b);
                        if $has_min {
                            summs[k] += f16_at($p.add(2)) * *a.s.get_unchecked(b);
                        }
                        let d = _mm256_set1_ps(f16_at($p) * da);
                        acc[k] = _mm256_fmadd_ps(d, xy, acc[k]);
                    }
                }
                [
                    hsum(acc[0]) + summs[0],
                    hsum(acc[1]) + summs[1],
                    hsum(acc[2]) + summs[2],
                    hsum(acc[3]) + summs[3],
                ]
            }

            /// Four rows at a time (sharing each activation block), then the rest one by one.
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn $chunk<const V: u8>(
                data: &[u8],
                row_bytes: usize,
                stride: usize,
                a: &Act,
                out: &mut [f32],
            ) {
                let nb = row_bytes / $bytes;
                debug_assert!(
                    a.d.len() >= nb
                        && a.s.len() >= nb
                        && (out.is_empty() || data.len() >= (out.len() - 1) * stride + row_bytes)
                );
                let mut r = 0;
                while r + 4 <= out.len() {
                    let base = data.as_ptr().add(r * stride);
                    let rows = [0, 1, 2, 3].map(|k| base.add(k * stride));
                    let o = $dot4::<V>(rows, nb, PF_ROWS * stride, a);
                    out[r..r + 4].copy_from_slice(&o);
                    r += 4;
                }
                while r < out.len() {
                    out[r] = $name::<V>(&data[r * stride..][..row_bytes], a);
                    r += 1;
                }
            }

            /// `$chunk` for several inputs (a batch of prompt tokens): each block of four rows
            /// is unpacked once and dotted with every input; input `t`'s row `r` goes to
            /// `out[t * out_stride + r]`. Per input it is `$dot4`'s (and the tail's `$name`)
            /// arithmetic in the same order, so the results are bit-identical to `$chunk`'s.
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn $many<const V: u8>(
                data: &[u8],
                row_bytes: usize,
                stride: usize,
                acts: &[Act],
                out: *mut f32,
                out_stride: usize,
                rows: usize,
            ) {
                let nb = row_bytes / $bytes;
                let n = acts.len();
                assert!(n <= MAX_INPUTS, "{n} inputs");
                debug_assert!(rows == 0 || data.len() >= (rows - 1) * stride + row_bytes);
                // Input t's accumulators for the four rows at 4t..4t + 4.
                let mut acc = [_mm256_setzero_ps(); 4 * MAX_INPUTS];
                // Input t's `m * s` sums of the four rows (`_1` types), one lane per row.
                let mut summs = [_mm_setzero_ps(); MAX_INPUTS];
                let mut r = 0;
                while r + 4 <= rows {
                    let base = data.as_ptr().add(r * stride);
                    let rp = [0, 1, 2, 3].map(|k| base.add(k * stride));
                    acc[..4 * n].fill(_mm256_setzero_ps());
                    summs[..n].fill(_mm_setzero_ps());
                    for b in 0..nb {
                        if $has_min {
                            // Lane k: row k's `m * s` for this block, `$dot4`'s product and sum.
                            let m = _mm_set_ps(
                                f16_at(rp[3].add(b * $bytes + 2)),
                                f16_at(rp[2].add(b * $bytes + 2)),
                                f16_at(rp[1].add(b * $bytes + 2)),
                                f16_at(rp[0].add(b * $bytes + 2)),
                            );
                            for (sm, a) in summs.iter_mut().zip(acts) {
                                let s = _mm_set1_ps(*a.s.get_unchecked(b));
                                *sm = _mm_add_ps(*sm, _mm_mul_ps(m, s));
                            }
                        }
                        // The four rows' block, ready for the dot, and their scales.
                        let mut u = [_mm256_setzero_si256(); 4];
                        let mut dw = [_mm256_setzero_ps(); 4];
                        for k in 0..4 {
                            let $p = rp[k].add(b * $bytes);
                            _mm_prefetch::<_MM_HINT_T0>($p.wrapping_add(PF_ROWS * stride).cast());
                            let w: __m256i = $w;
                            u[k] = block_operand::<V, $shift, $fits>(w);
                            dw[k] = _mm256_set1_ps(f16_at($p));
                        }
                        // Each input meets the four rows: its block and start are made once.
                        // `dw * da` in every lane is `$dot4`'s broadcast product, bit for bit.
                        for (t, a) in acts.iter().enumerate() {
                            debug_assert!(a.d.len() >= nb && a.s.len() >= nb);
                            let y = load_qa(a, b);
                            let start = block_start::<V, $shift, $fits>(a, b);
                            let da = _mm256_set1_ps(*a.d.get_unchecked(b));
                            for k in 0..4 {
                                let xy = block_dot::<V, $shift, $fits>(start, u[k], y);
                                let d = _mm256_mul_ps(dw[k], da);
                                let at = acc.get_unchecked_mut(4 * t + k);
                                *at = _mm256_fmadd_ps(d, xy, *at);
                            }
                        }
                    }
                    for t in 0..n {
                        let mut sm = [0f32; 4];
                        _mm_storeu_ps(sm.as_mut_ptr(), summs[t]);
                        for k in 0..4 {
                            *out.add(t * out_stride + r + k) = hsum(acc[4 * t + k]) + sm[k];
                        }
                    }
                    r += 4;
                }
                while r < rows {
                    for (t, a) in acts.iter().enumerate() {
                        *out.add(t * out_stride + r) =
                            $name::<V>(&data[r * stride..][..row_bytes], a);
                    }
                    r += 1;
                }
            }
        };
    }

    classic_dot!(
        dot_q4_0,
        dot4_q4_0,
        chunk_q4_0,
        many_q4_0,
        18,
        false,
        3,
        true,
        |p| { _mm256_sub_epi8(nibbles(p.add(2)), _mm256_set1_epi8(8)) }
    );
    classic_dot!(
        dot_q4_1,
        dot4_q4_1,
        chunk_q4_1,
        many_q4_1,
        20,
        true,
        0,
        true,
        |p| { nibbles(p.add(4)) }
    );
    classic_dot!(
        dot_q5_0,
        dot4_q5_0,
        chunk_q5_0,
        many_q5_0,
        22,
        false,
        4,
        true,
        |p| {
            _mm256_or_si256(
                nibbles(p.add(6)),
                _mm256_andnot_si256(bits(p.add(2)), _mm256_set1_epi8(0xF0u8 as i8)),
            )
        }
    );
    classic_dot!(
        dot_q5_1,
        dot4_q5_1,
        chunk_q5_1,
        many_q5_1,
        24,
        true,
        0,
        true,
        |p| {
            _mm256_or_si256(
                nibbles(p.add(8)),
                _mm256_and_si256(bits(p.add(4)), _mm256_set1_epi8(0x10)),
            )
        }
    );
    classic_dot!(
        dot_q8_0,
        dot4_q8_0,
        chunk_q8_0,
        many_q8_0,
        34,
        false,
        7,
        false,
        |p| { _mm256_loadu_si256(p.add(2).cast()) }
    );

    /// f32 dot of `n` weights produced 8 at a time by `load(i)` (i = 0, 8, 16, ...) with `x`,
    /// the tail (n % 8) by `tail(i)`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot8(
        x: &[f32],
        n: usize,
        load: impl Fn(usize) -> __m256,
        tail: impl Fn(usize) -> f32,
    ) -> f32 {
        debug_assert!(x.len() >= n);
        let xp = x.as_ptr();
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            acc0 = _mm256_fmadd_ps(load(i), _mm256_loadu_ps(xp.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(load(i + 8), _mm256_loadu_ps(xp.add(i + 8)), acc1);
            i += 16;
        }
        if i + 8 <= n {
            acc0 = _mm256_fmadd_ps(load(i), _mm256_loadu_ps(xp.add(i)), acc0);
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(acc0, acc1));
        while i < n {
            s += tail(i) * x[i];
            i += 1;
        }
        s
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_f32(row: &[u8], a: &Act) -> f32 {
        let p = row.as_ptr();
        dot8(
            a.x,
            row.len() / 4,
            |i| _mm256_loadu_ps(p.add(4 * i).cast()),
            |i| f32::from_le_bytes(row[4 * i..4 * i + 4].try_into().unwrap()),
        )
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_f16(row: &[u8], a: &Act) -> f32 {
        let p = row.as_ptr();
        dot8(
            a.x,
            row.len() / 2,
            |i| _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i).cast())),
            |i| f16_to_f32(le16(row, 2 * i)),
        )
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_bf16(row: &[u8], a: &Act) -> f32 {
        let p = row.as_ptr();
        dot8(
            a.x,
            row.len() / 2,
            |i| {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(2 * i).cast()));
                _mm256_castsi256_ps(_mm256_slli_epi32(h, 16))
            },
            |i| bf16_to_f32(le16(row, 2 * i)),
        )
    }
}

// ---------------------------------------------------------------------------------------------
// NEON kernels (aarch64), Q4_0, Q4_1 and Q8_0 (the K-quants' are in `kquant`); the scalar code
// is their definition. They use
// vmull_s8 + vpadalq_s16 (baseline NEON); `vdotq_s32` would be faster on cores with dotprod.

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use crate::backend::cpu::kernel::neon::mul_acc;
    use std::arch::aarch64::*;

    pub(super) fn chunk_fn(ty: GgmlType) -> Option<ChunkFn> {
        Some(match ty {
            GgmlType::Q4_0 => chunk::<18, 2, false, true>,
            GgmlType::Q4_1 => chunk::<20, 4, true, true>,
            GgmlType::Q8_0 => chunk::<34, 2, false, false>,
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => super::kquant::neon_chunk_fn(ty),
            _ => return None,
        })
    }

    /// Blocks of `BYTES` with the f16 scale at 0, quants at `QS`; `MIN`: f16 min at 2 (Q4_1);
    /// `NIB`: 16 bytes of nibbles (offset 8 unless MIN), else 32 signed bytes (Q8_0).
    #[target_feature(enable = "neon")]
    unsafe fn chunk<const BYTES: usize, const QS: usize, const MIN: bool, const NIB: bool>(
        data: &[u8],
        row_bytes: usize,
        stride: usize,
        a: &Act,
        out: &mut [f32],
    ) {
        for (i, o) in out.iter_mut().enumerate() {
            let row = &data[i * stride..][..row_bytes];
            let mut acc = 0f32;
            for (b, blk) in row.chunks_exact(BYTES).enumerate() {
                let p = blk.as_ptr().add(QS);
                let (w0, w1) = if NIB {
                    let v = vld1q_u8(p);
                    let lo = vandq_u8(v, vdupq_n_u8(0x0F));
                    let hi = vshrq_n_u8(v, 4);
                    let off = vdupq_n_s8(if MIN { 0 } else { 8 });
                    (
                        vsubq_s8(vreinterpretq_s8_u8(lo), off),
                        vsubq_s8(vreinterpretq_s8_u8(hi), off),
                    )
                } else {
                    (vld1q_s8(p.cast()), vld1q_s8(p.add(16).cast()))
                };
                let y = a.qs.as_ptr().add(b * QK);
                let i = mul_acc(vdupq_n_s32(0), w0, vld1q_s8(y));
                let i = vaddvq_s32(mul_acc(i, w1, vld1q_s8(y.add(16))));
                acc += f16_to_f32(le16(blk, 0)) * a.d[b] * i as f32;
                if MIN {
                    acc += f16_to_f32(le16(blk, 2)) * a.s[b];
                }
            }
            *o = acc;
        }
    }
}

#[cfg(test)]
mod tests;
