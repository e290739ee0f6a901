//! The sparse FFN's down projection over int8 tiles: `out += sum over kept j of h_j * down_j`.
//!
//! A tile holds the down columns of `TILE_NEURONS` neurons, each of `dim` values, as int8 with
//! one f32 scale per row of the tile (per output, shared by the tile's 32 neurons). Why a scale
//! per row and not per column block (Q8_0 columns): with one scale shared by the tile's
//! columns, a token's kept neurons in a tile add up in integers (int8 weights x int16
//! activations, one activation scale per tile), and the floating-point work is one
//! multiply-add per output row and tile instead of a convert and a multiply-add per weight,
//! which made the sparse down projection cost more per neuron than the dense one
//! (docs/BENCHMARKS.md). In a model whose down rows are group-32 blocks along the neurons
//! (Q8_0, Q4_x), a tile's row is exactly one of the model's blocks, so its scale follows that
//! block's: a Q8_0 block is kept exactly, a 4-bit one on a grid 8 times finer than its own.
//! (One scale per 32 x 32 square, tried first, cost SmolLM2 +0.5% perplexity at sparsity 0.)
//!
//! Bytes of one tile for width `dim` (`tile_bytes`): 32 columns of `dim` int8 (column i at
//! `i * dim`), then `dim` little-endian f32 scales, one per row.
//!
//! Every kernel computes the same integers and the same one fused multiply-add per output, so
//! the scalar, AVX2 and NEON kernels agree bit for bit, and the result does not depend on the
//! thread count (tiles are split into fixed tasks whose partial sums are added in order).

use super::matvec::{kernel, Kernel};
use super::pool::WorkerPool;
use super::{prefetch, sum_partials, OutPtr};
use crate::model::ggml::QK;

/// Neurons per tile (the squares' width).
pub const TILE_NEURONS: usize = 32;

/// Tiles per task of the worker pool: whole tiles per task, and enough tasks for the pool to
/// balance when a core is busy.
pub const TILES_PER_TASK: usize = 4;

/// Bytes of one tile of down columns of `dim` values (`dim` a multiple of 32).
pub fn tile_bytes(dim: usize) -> usize {
    TILE_NEURONS * dim + dim * 4
}

/// Partial sums `axpy_tiles` needs for `n` neurons of width `dim`.
pub fn partials_len(n: usize, dim: usize) -> usize {
    // Per task: its partial output, then its int32 accumulators.
    n.div_ceil(TILE_NEURONS * TILES_PER_TASK).max(1) * 2 * dim
}

/// Quantizes one tile. `cols` holds `m <= 32` down columns of `dim` values back to back (a last
/// tile may be short); the missing columns are zero.
pub fn quantize_tile(cols: &[f32], dim: usize, dst: &mut [u8]) {
    assert!(dim % QK == 0, "rows of {dim} values are not 32-groups");
    assert_eq!(dst.len(), tile_bytes(dim), "tile of {} bytes", dst.len());
    assert!(cols.len() % dim == 0 && cols.len() / dim <= TILE_NEURONS);
    let m = cols.len() / dim;
    dst.fill(0);
    let (q, scales) = dst.split_at_mut(TILE_NEURONS * dim);
    for (r, s) in scales.chunks_exact_mut(4).enumerate() {
        let amax = (0..m).fold(0f32, |a, i| a.max(cols[i * dim + r].abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for i in 0..m {
            q[i * dim + r] = (cols[i * dim + r] * id).round() as i8 as u8;
        }
        s.copy_from_slice(&d.to_le_bytes());
    }
}

/// The value of row `r` of column `i` of a tile (for tests and references).
pub fn tile_value(tile: &[u8], dim: usize, i: usize, r: usize) -> f32 {
    tile[i * dim + r] as i8 as f32 * scale(tile, dim, r)
}

fn scale(tile: &[u8], dim: usize, r: usize) -> f32 {
    scale_at(&tile[TILE_NEURONS * dim..], r)
}

/// One layer's down columns as tiles: tile t starts at `data[t * stride]`.
#[derive(Clone, Copy, Debug)]
pub struct DownTiles<'a> {
    pub data: &'a [u8],
    /// Bytes from one tile to the next (tiles may sit inside larger bundles).
    pub stride: usize,
    /// Neurons (columns).
    pub n: usize,
    /// Values per column (outputs).
    pub dim: usize,
}

impl<'a> DownTiles<'a> {
    pub fn tile(&self, t: usize) -> &'a [u8] {
        &self.data[t * self.stride..][..tile_bytes(self.dim)]
    }
}

/// `out = sum over idx of h[i] * down column idx[i]`. `idx` must be ascending (the order the
/// sparse FFN chooses neurons in); `partials` holds `partials_len(w.n, w.dim)` values.
pub fn axpy_tiles(
    pool: &WorkerPool,
    w: DownTiles,
    idx: &[u32],
    h: &[f32],
    partials: &mut [f32],
    out: &mut [f32],
) {
    axpy_tiles_with(kernel(), pool, w, idx, h, partials, out)
}

/// `axpy_tiles` with a chosen kernel (tests compare them).
pub fn axpy_tiles_with(
    k: Kernel,
    pool: &WorkerPool,
    w: DownTiles,
    idx: &[u32],
    h: &[f32],
    partials: &mut [f32],
    out: &mut [f32],
) {
    let dim = w.dim;
    assert!(dim % QK == 0, "rows of {dim} values are not 32-groups");
    assert_eq!(
        out.len(),
        dim,
        "output {} values, columns of {dim}",
        out.len()
    );
    assert_eq!(
        idx.len(),
        h.len(),
        "{} indices, {} values",
        idx.len(),
        h.len()
    );
    assert!(
        idx.windows(2).all(|p| p[0] < p[1]),
        "neuron indices must be ascending and distinct"
    );
    if let Some(&m) = idx.last() {
        assert!((m as usize) < w.n, "neuron {m} of {}", w.n);
    }
    let tiles = w.n.div_ceil(TILE_NEURONS);
    let tasks = tiles.div_ceil(TILES_PER_TASK).max(1);
    assert!(
        partials.len() >= 2 * tasks * dim,
        "down scratch of {} values, need {}",
        partials.len(),
        2 * tasks * dim
    );
    let f = tile_fn(k);
    let pp = OutPtr(partials.as_mut_ptr());
    pool.run(tasks, &|t| {
        // SAFETY: task t alone uses partials[2 * t * dim..][..2 * dim], inside the checked
        // length: its output, then its int32 accumulators (f32 and i32 share size and
        // alignment, and every bit pattern is a valid i32).
        let (o, acc) = unsafe {
            let base = pp.ptr().add(2 * t * dim);
            (
                std::slice::from_raw_parts_mut(base, dim),
                std::slice::from_raw_parts_mut(base.add(dim).cast::<i32>(), dim),
            )
        };
        o.fill(0.0);
        let first = t * TILES_PER_TASK;
        let last = (first + TILES_PER_TASK).min(tiles);
        let at = |tile: usize| idx.partition_point(|&j| (j as usize) < tile * TILE_NEURONS);
        let (lo, hi) = (at(first), at(last));
        // The task's kept columns, in order; the first few are prefetched now, the rest while
        // the columns before them are added.
        let mut cols: [&[u8]; TILES_PER_TASK * TILE_NEURONS] = [&[]; TILES_PER_TASK * TILE_NEURONS];
        for (c, &j) in cols.iter_mut().zip(&idx[lo..hi]) {
            let j = j as usize;
            *c = &w.tile(j / TILE_NEURONS)[(j % TILE_NEURONS) * dim..][..dim];
        }
        let cols = &cols[..hi - lo];
        for c in cols.iter().take(PREFETCH_COLUMNS) {
            prefetch(c);
        }
        let mut from = lo;
        for tile in first..last {
            let to = at(tile + 1);
            let kept = from - lo..to - lo;
            sum_tile(f, w, tile, cols, kept, &h[from..to], acc, o);
            from = to;
        }
    });
    sum_partials(partials, tasks, 2 * dim, out);
}

/// Columns prefetched ahead of the ones being added (4.5 KiB at SmolLM2's width): enough DRAM
/// misses in flight for the scattered columns to stream.
const PREFETCH_COLUMNS: usize = 8;

/// Quantizes a tile's kept activations to int16 (one scale for the tile) and adds its kept
/// columns, `cols[kept]`, into `o`. `cols` after `kept` are prefetched on the way.
#[allow(clippy::too_many_arguments)]
fn sum_tile(
    f: TileFn,
    w: DownTiles,
    tile: usize,
    cols: &[&[u8]],
    kept: std::ops::Range<usize>,
    hs: &[f32],
    acc: &mut [i32],
    o: &mut [f32],
) {
    let amax = hs.iter().fold(0f32, |a, v| a.max(v.abs()));
    if kept.is_empty() || amax == 0.0 || !amax.is_finite() {
        return;
    }
    let step = amax / 32767.0;
    let inv = 32767.0 / amax;
    let mut hq = [0i16; TILE_NEURONS];
    for (q, &h) in hq.iter_mut().zip(hs) {
        // Round half away from zero without a libm call (`f32::round` is one on baseline x86-64).
        let v = h * inv;
        *q = (v + 0.5f32.copysign(v)).clamp(-32767.0, 32767.0) as i16;
    }
    let scales = &w.tile(tile)[TILE_NEURONS * w.dim..];
    let ahead = &cols[kept.start..];
    // SAFETY: `tile_fn` returned a kernel this CPU runs; every column holds `dim` bytes, the
    // scales `dim / 32` f32 and `acc` and `o` `dim` values.
    unsafe {
        f(
            &cols[kept.clone()],
            ahead,
            &hq[..kept.len()],
            scales,
            step,
            acc,
            o,
        )
    };
}

/// Adds columns `cols` times activations `hq` (the tile's `step` apart) into `o`, with the
/// tile's square `scales`. `ahead` starts at `cols[0]` and runs on past the tile: the
/// columns `PREFETCH_COLUMNS` after the current one are prefetched.
type TileFn = unsafe fn(&[&[u8]], &[&[u8]], &[i16], &[u8], f32, &mut [i32], &mut [f32]);

fn tile_fn(k: Kernel) -> TileFn {
    match k {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => x86::tile,
        #[cfg(target_arch = "aarch64")]
        Kernel::Neon => neon::tile,
        _ => tile_scalar,
    }
}

fn scale_at(scales: &[u8], r: usize) -> f32 {
    f32::from_le_bytes(scales[4 * r..4 * r + 4].try_into().expect("4 bytes"))
}

/// Prefetches line `line` (64 bytes) of the column `PREFETCH_COLUMNS` after column `c`.
#[inline]
fn prefetch_ahead(ahead: &[&[u8]], c: usize, line: usize) {
    if let Some(col) = ahead.get(c + PREFETCH_COLUMNS) {
        if let Some(b) = col.get(line * 64..line * 64 + 1) {
            prefetch(b);
        }
    }
}

/// The reference: for each square, the integer sum over kept columns, then one fused
/// multiply-add per output row.
unsafe fn tile_scalar(
    cols: &[&[u8]],
    _ahead: &[&[u8]],
    hq: &[i16],
    scales: &[u8],
    step: f32,
    _acc: &mut [i32],
    o: &mut [f32],
) {
    for (b, y) in o.chunks_exact_mut(QK).enumerate() {
        let mut acc = [0i32; QK];
        for (col, &q) in cols.iter().zip(hq) {
            for (a, &v) in acc.iter_mut().zip(&col[b * QK..][..QK]) {
                *a += v as i8 as i32 * q as i32;
            }
        }
        for (r, (y, a)) in y.iter_mut().zip(acc).enumerate() {
            let s = scale_at(scales, b * QK + r) * step;
            *y = s.mul_add(a as f32, *y);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// Two columns at a time, each read start to end (the hardware prefetchers follow a column;
    /// they lose track of 32-byte steps across many): their int8 rows widened to int16 and
    /// interleaved, so one `vpmaddwd` with the pair's two activations gives each row's int32
    /// contribution, added to `acc` (rows in the unpack order: 0-3, 8-11, 4-7, 12-15 per 16).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile(
        cols: &[&[u8]],
        ahead: &[&[u8]],
        hq: &[i16],
        scales: &[u8],
        step: f32,
        acc: &mut [i32],
        o: &mut [f32],
    ) {
        let dim = o.len();
        let m = cols.len();
        let ap = acc.as_mut_ptr().cast::<__m256i>();
        let mut i = 0;
        while i < m {
            // An odd last column is paired with itself at activation 0.
            let (pa, ha) = (cols[i].as_ptr(), hq[i]);
            let (pb, hb) = if i + 1 < m {
                (cols[i + 1].as_ptr(), hq[i + 1])
            } else {
                (pa, 0)
            };
            let hh = _mm256_set1_epi32(((hb as u16 as u32) << 16 | ha as u16 as u32) as i32);
            for b in 0..dim / QK {
                if b % 2 == 0 {
                    prefetch_ahead(ahead, i, b / 2);
                    prefetch_ahead(ahead, i + 1, b / 2);
                }
                let a0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(pa.add(b * QK).cast()));
                let a1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(pa.add(b * QK + 16).cast()));
                let b0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(pb.add(b * QK).cast()));
                let b1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(pb.add(b * QK + 16).cast()));
                let v = [
                    _mm256_madd_epi16(_mm256_unpacklo_epi16(a0, b0), hh),
                    _mm256_madd_epi16(_mm256_unpackhi_epi16(a0, b0), hh),
                    _mm256_madd_epi16(_mm256_unpacklo_epi16(a1, b1), hh),
                    _mm256_madd_epi16(_mm256_unpackhi_epi16(a1, b1), hh),
                ];
                for (g, v) in v.into_iter().enumerate() {
                    let p = ap.add(4 * b + g);
                    // The first pair writes, the others add.
                    let sum = if i == 0 {
                        v
                    } else {
                        _mm256_add_epi32(_mm256_loadu_si256(p), v)
                    };
                    _mm256_storeu_si256(p, sum);
                }
            }
            i += 2;
        }
        for b in 0..dim / QK {
            let a = [0, 1, 2, 3].map(|g| _mm256_loadu_si256(ap.add(4 * b + g)));
            let st = _mm256_set1_ps(step);
            let sp = scales.as_ptr().cast::<f32>().add(b * QK);
            // Back to row order: rows 0-7, 8-15, 16-23, 24-31.
            let rows = [
                _mm256_permute2x128_si256::<0x20>(a[0], a[1]),
                _mm256_permute2x128_si256::<0x31>(a[0], a[1]),
                _mm256_permute2x128_si256::<0x20>(a[2], a[3]),
                _mm256_permute2x128_si256::<0x31>(a[2], a[3]),
            ];
            let y = o.as_mut_ptr().add(b * QK);
            for (g, v) in rows.into_iter().enumerate() {
                let yp = y.add(8 * g);
                let s = _mm256_mul_ps(_mm256_loadu_ps(sp.add(8 * g)), st);
                let r = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(v), _mm256_loadu_ps(yp));
                _mm256_storeu_ps(yp, r);
            }
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use std::arch::aarch64::*;

    /// Square by square, each column's int8 rows widened to int16 and multiply-accumulated
    /// into int32 lanes held in registers.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn tile(
        cols: &[&[u8]],
        ahead: &[&[u8]],
        hq: &[i16],
        scales: &[u8],
        step: f32,
        _acc: &mut [i32],
        o: &mut [f32],
    ) {
        let m = cols.len();
        for (b, y) in o.chunks_exact_mut(QK).enumerate() {
            if b % 2 == 0 {
                for c in m..m + PREFETCH_COLUMNS {
                    prefetch_ahead(ahead, c - PREFETCH_COLUMNS, b / 2);
                }
            }
            let mut acc = [vdupq_n_s32(0); 8];
            for (col, &q) in cols.iter().zip(hq) {
                let p = col.as_ptr().add(b * QK).cast::<i8>();
                for half in 0..2 {
                    let v = vld1q_s8(p.add(16 * half));
                    let lo = vmovl_s8(vget_low_s8(v));
                    let hi = vmovl_high_s8(v);
                    let a = &mut acc[4 * half..];
                    a[0] = vmlal_n_s16(a[0], vget_low_s16(lo), q);
                    a[1] = vmlal_high_n_s16(a[1], lo, q);
                    a[2] = vmlal_n_s16(a[2], vget_low_s16(hi), q);
                    a[3] = vmlal_high_n_s16(a[3], hi, q);
                }
            }
            let st = vdupq_n_f32(step);
            let sp = scales.as_ptr().cast::<f32>().add(b * QK);
            let yp = y.as_mut_ptr();
            for (g, a) in acc.into_iter().enumerate() {
                let p = yp.add(4 * g);
                let s = vmulq_f32(vld1q_f32(sp.add(4 * g)), st);
                vst1q_f32(p, vfmaq_f32(vld1q_f32(p), s, vcvtq_f32_s32(a)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn f(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    fn kernels() -> Vec<Kernel> {
        let mut k = vec![Kernel::Scalar];
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            k.push(Kernel::Avx2);
        }
        #[cfg(target_arch = "aarch64")]
        k.push(Kernel::Neon);
        k
    }

    /// Tiles of random columns (the last one short), and random kept sets: every kernel gives
    /// the same bits, with 1 and 3 threads, and the sum is within the int8/int16 rounding of
    /// the float sum over the tiles' own values.
    #[test]
    fn kernels_agree_bit_for_bit_and_match_the_float_sum() {
        let (dim, n) = (96, 80);
        let tb = tile_bytes(dim);
        let stride = tb + 40; // tiles inside larger bundles
        let mut rng = Rng(3);
        let w: Vec<f32> = (0..n * dim).map(|_| rng.f() * 0.3).collect();
        let mut data = vec![0u8; n.div_ceil(TILE_NEURONS) * stride];
        for t in 0..n.div_ceil(TILE_NEURONS) {
            let cols = &w[t * TILE_NEURONS * dim..((t + 1) * TILE_NEURONS).min(n) * dim];
            quantize_tile(cols, dim, &mut data[t * stride..][..tb]);
        }
        let tiles = DownTiles {
            data: &data,
            stride,
            n,
            dim,
        };
        // Quantization error: within half a step of each row's scale.
        for j in 0..n {
            for r in 0..dim {
                let t = tiles.tile(j / TILE_NEURONS);
                let v = tile_value(t, dim, j % TILE_NEURONS, r);
                assert!((v - w[j * dim + r]).abs() <= 0.3 / 127.0 * 0.51 + 1e-7);
            }
        }
        let mut partials = vec![0f32; partials_len(n, dim)];
        for trial in 0..5 {
            let idx: Vec<u32> = (0..n as u32)
                .filter(|_| trial == 0 || rng.f() > 0.2 * trial as f32 - 0.5)
                .collect();
            let h: Vec<f32> = idx.iter().map(|_| rng.f() * 4.0).collect();
            let mut want = vec![0f64; dim];
            for (&j, &hv) in idx.iter().zip(&h) {
                let t = tiles.tile(j as usize / TILE_NEURONS);
                for (r, y) in want.iter_mut().enumerate() {
                    *y += hv as f64 * tile_value(t, dim, j as usize % TILE_NEURONS, r) as f64;
                }
            }
            let mut first: Option<Vec<f32>> = None;
            for threads in [1, 3] {
                let pool = WorkerPool::new(threads);
                for &k in &kernels() {
                    let mut out = vec![9f32; dim];
                    axpy_tiles_with(k, &pool, tiles, &idx, &h, &mut partials, &mut out);
                    for (a, b) in out.iter().zip(&want) {
                        assert!((*a as f64 - b).abs() < 1e-3 * (1.0 + b.abs()), "{a} vs {b}");
                    }
                    match &first {
                        None => first = Some(out),
                        Some(f) => assert!(
                            f.iter().zip(&out).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{k:?} with {threads} threads differs from the scalar kernel"
                        ),
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "ascending")]
    fn unsorted_indices_are_refused() {
        let dim = 32;
        let data = vec![0u8; tile_bytes(dim)];
        let tiles = DownTiles {
            data: &data,
            stride: tile_bytes(dim),
            n: 32,
            dim,
        };
        let mut partials = vec![0f32; partials_len(32, dim)];
        let mut out = vec![0f32; dim];
        let pool = WorkerPool::new(1);
        axpy_tiles(&pool, tiles, &[3, 1], &[1.0, 1.0], &mut partials, &mut out);
    }
}
