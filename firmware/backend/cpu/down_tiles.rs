//! The sparse FFN's down projection over tiles of down columns (their format:
//! `crate::sparsity::tiles`): `out += sum over kept j of h_j * down_j`.
//!
//! Every kernel computes the same integers and the same fused multiply-adds per output, so the
//! scalar, AVX2 and NEON kernels agree bit for bit, and the result does not depend on the
//! thread count (tiles are split into fixed tasks whose partial sums are added in order).
use super::matvec::{Kernel, KernelSet};
use super::pool::WorkerPool;
use super::{prefetch, sum_partials, OutPtr};
use crate::model::ggml::QK;
use crate::sparsity::tiles::{f32_at, q4_at, q4_scales_at};
pub use crate::sparsity::tiles::{DownTiles, TileKind, TILE_NEURONS};

/// Tiles per task of the worker pool: whole tiles per task, and enough tasks for the pool to
/// balance when a core is busy.
pub const TILES_PER_TASK: usize = 4;

/// Partial sums `axpy_tiles` needs for `n` neurons of width `dim`.
pub fn partials_len(n: usize, dim: usize) -> usize {
    // Per task: its partial output, then its int32 accumulators.
    n.div_ceil(TILE_NEURONS * TILES_PER_TASK).max(1) * 2 * dim
}

/// `out = sum over idx of h[i] * down column idx[i]`. `idx` must be ascending (the order the
/// sparse FFN chooses neurons in); `partials` holds `partials_len(w.n, w.dim)` values.
pub fn axpy_tiles(
    ks: KernelSet,
    pool: &WorkerPool,
    w: DownTiles,
    idx: &[u32],
    h: &[f32],
    partials: &mut [f32],
    out: &mut [f32],
) {
    let k = ks.kernel;
    assert!(
        crate::backend::cpu::kernel::kernel_supported(k),
        "{k:?} kernels are not supported on this CPU"
    );
    let dim = w.dim;
    assert!(
        dim.is_multiple_of(QK),
        "rows of {dim} values are not 32-groups"
    );
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
    let f = tile_fn(k, w.kind);
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
            *c = w.column(j as usize);
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
    let scales = &w.tile(tile)[TILE_NEURONS * w.kind.column_bytes(w.dim)..];
    let ahead = &cols[kept.start..];
    // SAFETY: `tile_fn` returned a kernel this CPU runs for tiles of this kind; every column
    // holds `column_bytes(dim)` bytes, the scales `4 * dim` bytes, and `acc` and `o` `dim`
    // values.
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
/// tile's row `scales`. `ahead` starts at `cols[0]` and runs on past the tile: the columns
/// `PREFETCH_COLUMNS` after the current one are prefetched.
type TileFn = unsafe fn(&[&[u8]], &[&[u8]], &[i16], &[u8], f32, &mut [i32], &mut [f32]);

const INT8: bool = false;
const Q4: bool = true;

fn tile_fn(k: Kernel, kind: TileKind) -> TileFn {
    match (k, kind) {
        #[cfg(target_arch = "x86_64")]
        (Kernel::Avx2, TileKind::Int8) => x86::tile::<INT8>,
        #[cfg(target_arch = "x86_64")]
        (Kernel::Avx2, TileKind::Q4) => x86::tile::<Q4>,
        #[cfg(target_arch = "aarch64")]
        (Kernel::Neon, TileKind::Int8) => neon::tile::<INT8>,
        #[cfg(target_arch = "aarch64")]
        (Kernel::Neon, TileKind::Q4) => neon::tile::<Q4>,
        (_, TileKind::Int8) => tile_scalar::<INT8>,
        (_, TileKind::Q4) => tile_scalar::<Q4>,
    }
}

/// The sum of a tile's kept activations, for the Q4 mins (exact in f32: at most 32 x 32767).
fn sum_hq(hq: &[i16]) -> f32 {
    hq.iter().map(|&q| q as i32).sum::<i32>() as f32
}

/// Bytes of one column per 32 rows, and so how often (in blocks) a new cache line starts.
fn blocks_per_line<const IS_Q4: bool>() -> usize {
    if IS_Q4 {
        4
    } else {
        2
    }
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

/// The reference: for each 32 rows, the integer sum over kept columns, then per output row
/// one fused multiply-add (int8: `y += (s step) acc`), or two (Q4:
/// `y = (m step) sum(hq) + ((d step) acc + y)`).
unsafe fn tile_scalar<const IS_Q4: bool>(
    cols: &[&[u8]],
    _ahead: &[&[u8]],
    hq: &[i16],
    scales: &[u8],
    step: f32,
    _acc: &mut [i32],
    o: &mut [f32],
) {
    let dim = o.len();
    let sq = sum_hq(hq);
    for (b, y) in o.chunks_exact_mut(QK).enumerate() {
        let mut acc = [0i32; QK];
        for (col, &q) in cols.iter().zip(hq) {
            for (r, a) in acc.iter_mut().enumerate() {
                let v = if IS_Q4 {
                    q4_at(col, b * QK + r) as i32
                } else {
                    col[b * QK + r] as i8 as i32
                };
                *a += v * q as i32;
            }
        }
        for (r, (y, a)) in y.iter_mut().zip(acc).enumerate() {
            if IS_Q4 {
                let (d, m) = q4_scales_at(scales, dim, b * QK + r);
                *y = (m * step).mul_add(sq, (d * step).mul_add(a as f32, *y));
            } else {
                *y = (f32_at(scales, b * QK + r) * step).mul_add(a as f32, *y);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// Rows 0-15 and 16-31 of a column's block `b`, as int16 (int8: sign-extended; Q4: the low
    /// and high nibbles of the block's 16 bytes).
    #[inline(always)]
    unsafe fn load<const IS_Q4: bool>(p: *const u8, b: usize) -> (__m256i, __m256i) {
        if IS_Q4 {
            let x = _mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(b * 16).cast()));
            (
                _mm256_and_si256(x, _mm256_set1_epi16(15)),
                _mm256_srli_epi16::<4>(x),
            )
        } else {
            (
                _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(b * QK).cast())),
                _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(b * QK + 16).cast())),
            )
        }
    }

    /// Two columns at a time, each read start to end (the hardware prefetchers follow a column;
    /// they lose track of 32-byte steps across many): their rows widened to int16 and
    /// interleaved, so one `vpmaddwd` with the pair's two activations gives each row's int32
    /// contribution, added to `acc` (rows in the unpack order: 0-3, 8-11, 4-7, 12-15 per 16).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tile<const IS_Q4: bool>(
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
        let per_line = blocks_per_line::<IS_Q4>();
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
                if b % per_line == 0 {
                    prefetch_ahead(ahead, i, b / per_line);
                    prefetch_ahead(ahead, i + 1, b / per_line);
                }
                let (a0, a1) = load::<IS_Q4>(pa, b);
                let (b0, b1) = load::<IS_Q4>(pb, b);
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
        let st = _mm256_set1_ps(step);
        let sq = _mm256_set1_ps(sum_hq(hq));
        for b in 0..dim / QK {
            let a = [0, 1, 2, 3].map(|g| _mm256_loadu_si256(ap.add(4 * b + g)));
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
                let r0 = b * QK + 8 * g;
                let r = if IS_Q4 {
                    let sp = scales.as_ptr();
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(sp.add(2 * r0).cast()));
                    let m = _mm256_cvtph_ps(_mm_loadu_si128(sp.add(2 * dim + 2 * r0).cast()));
                    let y = _mm256_fmadd_ps(
                        _mm256_mul_ps(d, st),
                        _mm256_cvtepi32_ps(v),
                        _mm256_loadu_ps(yp),
                    );
                    _mm256_fmadd_ps(_mm256_mul_ps(m, st), sq, y)
                } else {
                    let s = _mm256_loadu_ps(scales.as_ptr().cast::<f32>().add(r0));
                    _mm256_fmadd_ps(
                        _mm256_mul_ps(s, st),
                        _mm256_cvtepi32_ps(v),
                        _mm256_loadu_ps(yp),
                    )
                };
                _mm256_storeu_ps(yp, r);
            }
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use std::arch::aarch64::*;

    /// Rows 0-7, 8-15, 16-23 and 24-31 of a column's block `b`, as int16.
    #[inline(always)]
    unsafe fn load<const IS_Q4: bool>(p: *const u8, b: usize) -> [int16x8_t; 4] {
        if IS_Q4 {
            let v = vld1q_u8(p.add(b * 16));
            let lo = vandq_u8(v, vdupq_n_u8(15));
            let hi = vshrq_n_u8::<4>(v);
            let w = |x: uint8x16_t| {
                [
                    vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(x))),
                    vreinterpretq_s16_u16(vmovl_high_u8(x)),
                ]
            };
            let (l, h) = (w(lo), w(hi));
            [l[0], l[1], h[0], h[1]]
        } else {
            let p = p.cast::<i8>().add(b * QK);
            let (v0, v1) = (vld1q_s8(p), vld1q_s8(p.add(16)));
            [
                vmovl_s8(vget_low_s8(v0)),
                vmovl_high_s8(v0),
                vmovl_s8(vget_low_s8(v1)),
                vmovl_high_s8(v1),
            ]
        }
    }

    /// Four f16 at `p` as f32, exactly for every finite value: the f16's exponent and mantissa
    /// bits moved into an f32's place give the value times 2^-112 (subnormals included), so one
    /// multiply by 2^112 rescales it (stable Rust has no f16 vector type for `fcvtl`).
    #[inline(always)]
    unsafe fn f16x4(p: *const u8) -> float32x4_t {
        let h = vmovl_u16(vld1_u16(p.cast()));
        let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
        let mag = vshlq_n_u32::<13>(vandq_u32(h, vdupq_n_u32(0x7fff)));
        let v = vmulq_f32(
            vreinterpretq_f32_u32(mag),
            vdupq_n_f32(f32::from_bits(0x7780_0000)),
        );
        vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(v), sign))
    }

    /// 32 rows at a time, each column's rows widened to int16 and multiply-accumulated into
    /// int32 lanes held in registers.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn tile<const IS_Q4: bool>(
        cols: &[&[u8]],
        ahead: &[&[u8]],
        hq: &[i16],
        scales: &[u8],
        step: f32,
        _acc: &mut [i32],
        o: &mut [f32],
    ) {
        let dim = o.len();
        let m = cols.len();
        let per_line = blocks_per_line::<IS_Q4>();
        let st = vdupq_n_f32(step);
        let sq = vdupq_n_f32(sum_hq(hq));
        for (b, y) in o.chunks_exact_mut(QK).enumerate() {
            if b % per_line == 0 {
                for c in m..m + PREFETCH_COLUMNS {
                    prefetch_ahead(ahead, c - PREFETCH_COLUMNS, b / per_line);
                }
            }
            let mut acc = [vdupq_n_s32(0); 8];
            for (col, &q) in cols.iter().zip(hq) {
                let rows = load::<IS_Q4>(col.as_ptr(), b);
                for (g, r) in rows.into_iter().enumerate() {
                    acc[2 * g] = vmlal_n_s16(acc[2 * g], vget_low_s16(r), q);
                    acc[2 * g + 1] = vmlal_high_n_s16(acc[2 * g + 1], r, q);
                }
            }
            let yp = y.as_mut_ptr();
            for (g, a) in acc.into_iter().enumerate() {
                let p = yp.add(4 * g);
                let r0 = b * QK + 4 * g;
                let r = if IS_Q4 {
                    let d = f16x4(scales.as_ptr().add(2 * r0));
                    let mn = f16x4(scales.as_ptr().add(2 * dim + 2 * r0));
                    let y = vfmaq_f32(vld1q_f32(p), vmulq_f32(d, st), vcvtq_f32_s32(a));
                    vfmaq_f32(y, vmulq_f32(mn, st), sq)
                } else {
                    let s = vmulq_f32(vld1q_f32(scales.as_ptr().cast::<f32>().add(r0)), st);
                    vfmaq_f32(vld1q_f32(p), s, vcvtq_f32_s32(a))
                };
                vst1q_f32(p, r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ggml::GgmlType;
    use crate::sparsity::tiles::{q4_tile_from_blocks, quantize_tile};

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

    /// Random down matrices of `n` neurons x `dim` as tiles of each kind (int8 quantized from
    /// f32 columns, the last tile short; Q4 copied from Q4_0 and Q4_1 blocks), with the value
    /// each tile holds checked: int8 within half a step of the column, Q4 equal to the model's
    /// dequantized weight.
    fn tiles_of_each_kind(
        rng: &mut Rng,
        dim: usize,
        n: usize,
        stride: usize,
    ) -> Vec<(TileKind, Vec<u8>)> {
        use crate::model::ggml::dequantize_row;
        use crate::sparsity::bundle::quantize_row;
        let mut out = Vec::new();
        let w: Vec<f32> = (0..n * dim).map(|_| rng.f() * 0.3).collect();
        let mut data = vec![0u8; n.div_ceil(TILE_NEURONS) * stride];
        let tb = TileKind::Int8.tile_bytes(dim);
        for t in 0..n.div_ceil(TILE_NEURONS) {
            let cols = &w[t * TILE_NEURONS * dim..((t + 1) * TILE_NEURONS).min(n) * dim];
            quantize_tile(cols, dim, &mut data[t * stride..][..tb]);
        }
        let tiles = DownTiles {
            kind: TileKind::Int8,
            data: &data,
            stride,
            n,
            dim,
        };
        for j in 0..n {
            for r in 0..dim {
                let v = tiles.value(j, r);
                assert!((v - w[j * dim + r]).abs() <= 0.3 / 127.0 * 0.51 + 1e-7);
            }
        }
        out.push((TileKind::Int8, data));
        let n4 = n / TILE_NEURONS * TILE_NEURONS;
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1] {
            // The model's down matrix: `dim` rows of `n4` neurons.
            let rb = ty.row_bytes(n4).unwrap();
            let mut down = vec![0u8; dim * rb];
            let mut model = vec![0f32; dim * n4];
            for r in 0..dim {
                let row: Vec<f32> = (0..n4).map(|_| rng.f() * 0.3 + 0.05).collect();
                quantize_row(ty, &row, &mut down[r * rb..][..rb]);
                dequantize_row(ty, &down[r * rb..][..rb], &mut model[r * n4..][..n4]);
            }
            let mut data = vec![0u8; n4 / TILE_NEURONS * stride];
            let tb = TileKind::Q4.tile_bytes(dim);
            for t in 0..n4 / TILE_NEURONS {
                q4_tile_from_blocks(ty, &down, n4, dim, t, &mut data[t * stride..][..tb]);
            }
            let tiles = DownTiles {
                kind: TileKind::Q4,
                data: &data,
                stride,
                n: n4,
                dim,
            };
            for j in 0..n4 {
                for r in 0..dim {
                    assert_eq!(
                        tiles.value(j, r),
                        model[r * n4 + j],
                        "{ty:?} neuron {j} row {r}"
                    );
                }
            }
            out.push((TileKind::Q4, data));
        }
        out
    }

    /// Random kept sets over tiles of each kind: every kernel gives the same bits, with 1 and 3
    /// threads, and the sum is within the int16 rounding of the activations of the float sum
    /// over the tiles' own values.
    #[test]
    fn kernels_agree_bit_for_bit_and_match_the_float_sum() {
        let (dim, n) = (96, 80);
        let stride = TileKind::Int8.tile_bytes(dim) + 40; // tiles inside larger bundles
        let mut rng = Rng(3);
        for (kind, data) in tiles_of_each_kind(&mut rng, dim, n, stride) {
            let n = if kind == TileKind::Q4 { 64 } else { n };
            let tiles = DownTiles {
                kind,
                data: &data,
                stride,
                n,
                dim,
            };
            let mut partials = vec![0f32; partials_len(n, dim)];
            for trial in 0..5 {
                let idx: Vec<u32> = (0..n as u32)
                    .filter(|_| trial == 0 || rng.f() > 0.2 * trial as f32 - 0.5)
                    .collect();
                let h: Vec<f32> = idx.iter().map(|_| rng.f() * 4.0).collect();
                let mut want = vec![0f64; dim];
                for (&j, &hv) in idx.iter().zip(&h) {
                    for (r, y) in want.iter_mut().enumerate() {
                        *y += hv as f64 * tiles.value(j as usize, r) as f64;
                    }
                }
                let mut first: Option<Vec<f32>> = None;
                for threads in [1, 3] {
                    let pool = WorkerPool::new(threads);
                    for &k in &kernels() {
                        let mut out = vec![9f32; dim];
                        axpy_tiles(
                            KernelSet::with(k),
                            &pool,
                            tiles,
                            &idx,
                            &h,
                            &mut partials,
                            &mut out,
                        );
                        for (a, b) in out.iter().zip(&want) {
                            assert!(
                                (*a as f64 - b).abs() < 1e-3 * (1.0 + b.abs()),
                                "{kind:?}: {a} vs {b}"
                            );
                        }
                        match &first {
                            None => first = Some(out),
                            Some(f) => assert!(
                                f.iter().zip(&out).all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{kind:?}: {k:?} with {threads} threads differs from the scalar kernel"
                            ),
                        }
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "ascending")]
    fn unsorted_indices_are_refused() {
        let dim = 32;
        let data = vec![0u8; TileKind::Int8.tile_bytes(dim)];
        let tiles = DownTiles {
            kind: TileKind::Int8,
            data: &data,
            stride: TileKind::Int8.tile_bytes(dim),
            n: 32,
            dim,
        };
        let mut partials = vec![0f32; partials_len(32, dim)];
        let mut out = vec![0f32; dim];
        let pool = WorkerPool::new(1);
        axpy_tiles(
            KernelSet::best(),
            &pool,
            tiles,
            &[3, 1],
            &[1.0, 1.0],
            &mut partials,
            &mut out,
        );
    }
}
