//! The AVX-512 VNNI kernels of `lowbit::x86` (sixteen rows per zmm register) and the software
//! prefetch of decode's one-pass kernels: see the parent module's notes.

use super::*;

/// Rows per register in the AVX-512 swizzled kernel: sixteen 32-bit lanes, one row each.
const SIXTEEN: usize = 16;

/// Whether this CPU runs the sixteen-row kernels (AVX-512 F, BW and VL with VNNI).
pub(crate) fn has_avx512_vnni() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

/// `chunk_many_swizzled` sixteen rows per register, for CPUs with AVX-512 VNNI. Word k of
/// the 16 rows `r..r + 16` of a band (r a multiple of 16) is 64 contiguous bytes of the
/// tile, so one zmm load gives it. Per lane it is the eight-row kernel's arithmetic: the
/// same exact int32 group dot (`octet_dot`'s start and chains), the same `(d_w * d_x) * i`
/// added in group order, so the results are bit-identical. Twice the rows per `vpdpbusd`
/// (measured on an Ice Lake Xeon: 1.6x the multiply-adds per second of the ymm form).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn chunk_many_swizzled16(
    data: &[u8],
    row_bytes: usize,
    acts: &[Act],
    out: *mut f32,
    out_stride: usize,
    rows: usize,
) {
    let (ng, n) = swizzled_args(data, row_bytes, acts, rows);
    let p = data.as_ptr();
    let m = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); MAX_INPUTS];
    for r in (0..rows).step_by(SIXTEEN) {
        let (band, lane) = (r / SWIZZLE_ROWS, r % SWIZZLE_ROWS);
        acc[..n].fill(_mm512_setzero_ps());
        for g in 0..ng {
            let t = p.add((band * ng + g) * SWIZZLE_TILE_BYTES);
            // The same slice of the tile two groups on (as `octet_group`).
            let ahead = t.wrapping_add(2 * SWIZZLE_TILE_BYTES);
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(2 * lane).cast());
            let mut nib = [_mm512_setzero_si512(); 8];
            for k in 0..4 {
                let at = 64 + 128 * k + 4 * lane;
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(at).cast());
                let v = _mm512_loadu_si512(t.add(at).cast());
                nib[k] = _mm512_and_si512(v, m);
                nib[4 + k] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m);
            }
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(t.add(2 * lane).cast()));
            for (a, acc) in acts.iter().zip(acc.iter_mut()) {
                *acc = sixteen_step::<3>(*acc, &nib, dw, a.qp, a, g);
            }
        }
        store_sixteen(&acc[..n], out.add(r), out_stride, rows - r);
    }
}

/// One input's step over group `g` of sixteen rows: `u` = the rows' unsigned weights,
/// register j holding word j of each row (lane = row), as `octet_dot` takes them; `y` the
/// activations those words meet. Returns `acc + (d_w * d_x) * i`, `octet_dot`'s int32 and
/// the eight-row kernels' epilogue, lane by lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn sixteen_step<const SHIFT: i32>(
    acc: __m512,
    u: &[__m512i; 8],
    dw: __m512,
    y: &[i8],
    a: &Act,
    g: usize,
) -> __m512 {
    let y = y.as_ptr().add(g * GROUP);
    let word = |o: usize| _mm512_set1_epi32(y.add(o).cast::<i32>().read_unaligned());
    let mut lo = _mm512_set1_epi32(*a.gs.get_unchecked(g) << SHIFT);
    let mut hi = _mm512_setzero_si512();
    for k in 0..4 {
        lo = _mm512_dpbusd_epi32(lo, u[k], word(4 * k));
        hi = _mm512_dpbusd_epi32(hi, u[4 + k], word(16 + 4 * k));
    }
    let i = _mm512_add_epi32(lo, hi);
    let d = _mm512_mul_ps(dw, _mm512_set1_ps(*a.d.get_unchecked(g)));
    _mm512_add_ps(acc, _mm512_mul_ps(d, _mm512_cvtepi32_ps(i)))
}

/// Stores each input's sixteen row sums (the first `min(16, left)` of them) at
/// `out + t * out_stride`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn store_sixteen(acc: &[__m512], out: *mut f32, out_stride: usize, left: usize) {
    let keep = left.min(SIXTEEN);
    let mask: __mmask16 = if keep == SIXTEEN { !0 } else { (1 << keep) - 1 };
    for (t, acc) in acc.iter().enumerate() {
        _mm512_mask_storeu_ps(out.add(t * out_stride), mask, *acc);
    }
}

/// `chunk_many` sixteen rows per register for the row-major formats (w8, w4 contiguous
/// and interleaved), for CPUs with AVX-512 VNNI: each sixteen rows' groups are unpacked
/// and made unsigned once, transposed in registers (two 8 x 8 transposes, joined), and
/// then dotted with every input as in `chunk_many_swizzled16`. The rows past the last
/// sixteen take `chunk_many`'s EVEX form. Bit-identical to `chunk_many` and `chunk`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn chunk_many16<const F: u8>(
    data: &[u8],
    row_bytes: usize,
    acts: &[Act],
    out: *mut f32,
    out_stride: usize,
    rows: usize,
) {
    assert!(F != FMT_W4S, "swizzled rows take chunk_many_swizzled16");
    let (ng, n) = many_args::<F>(row_bytes, acts);
    assert!(data.len() >= rows * row_bytes);
    let p = data.as_ptr();
    let mut acc = [_mm512_setzero_ps(); MAX_INPUTS];
    let mut r = 0;
    while r + SIXTEEN <= rows {
        acc[..n].fill(_mm512_setzero_ps());
        for g in 0..ng {
            let mut half = [[_mm256_setzero_si256(); 8]; 2];
            let mut dw = [_mm_setzero_ps(); 4];
            for (h, half) in half.iter_mut().enumerate() {
                let (q0, dw0) = four_rows::<F>(p, row_bytes, r + 8 * h, g);
                let (q1, dw1) = four_rows::<F>(p, row_bytes, r + 8 * h + 4, g);
                (dw[2 * h], dw[2 * h + 1]) = (dw0, dw1);
                *half = transpose8([
                    offset_weights::<F>(q0[0]),
                    offset_weights::<F>(q0[1]),
                    offset_weights::<F>(q0[2]),
                    offset_weights::<F>(q0[3]),
                    offset_weights::<F>(q1[0]),
                    offset_weights::<F>(q1[1]),
                    offset_weights::<F>(q1[2]),
                    offset_weights::<F>(q1[3]),
                ]);
            }
            let u: [__m512i; 8] = std::array::from_fn(|j| {
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(half[0][j]), half[1][j])
            });
            // (Joined as 64-bit halves: `insertf32x8` would need AVX-512 DQ.)
            let half_ps = |a: __m128, b: __m128| {
                _mm256_castps_pd(_mm256_insertf128_ps::<1>(_mm256_castps128_ps256(a), b))
            };
            let dw = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
                _mm512_castpd256_pd512(half_ps(dw[0], dw[1])),
                half_ps(dw[2], dw[3]),
            ));
            for (a, acc) in acts.iter().zip(acc.iter_mut()) {
                *acc = if F == FMT_W8 {
                    sixteen_step::<7>(*acc, &u, dw, activations::<F>(a), a, g)
                } else {
                    sixteen_step::<3>(*acc, &u, dw, activations::<F>(a), a, g)
                };
            }
        }
        store_sixteen(&acc[..n], out.add(r), out_stride, SIXTEEN);
        r += SIXTEEN;
    }
    if r < rows {
        chunk_many::<F, VNNI_EVEX>(
            &data[r * row_bytes..],
            row_bytes,
            acts,
            out.add(r),
            out_stride,
            rows - r,
        );
    }
}

/// How far ahead of their reads the `PF` kernels prefetch (`KernelSet::prefetch`): eight
/// swizzled tiles. The best of 4, 8 and 16 tiles on the GPU machine's Xeon, 2 and 8 threads.
pub(crate) const PREFETCH_AHEAD: usize = 8 * SWIZZLE_TILE_BYTES;

/// Hints the lines of the `bytes` at `p + PREFETCH_AHEAD` into L1.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn prefetch_ahead(p: *const u8, bytes: usize) {
    prefetch_lines(p.wrapping_add(PREFETCH_AHEAD), bytes);
}

/// Hints a line every 64 bytes of the `bytes` at `p` into L1. Past the end of the data it is
/// a harmless hint, never a load.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn prefetch_lines(p: *const u8, bytes: usize) {
    let mut o = 0;
    while o < bytes {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(o).cast());
        o += 64;
    }
}

/// `chunk_swizzled` (one input, decode) on sixteen-row registers, a whole band of 32 rows
/// at a time: each tile is read front to back (its scale line, then words 0-3 of lanes 0-15
/// and 16-31, line after line), where `chunk_many_swizzled16` passes over a band twice, each
/// time reading every other line. Decode streams its weights from DRAM, and the one pass is
/// what the hardware prefetcher follows. Per lane the arithmetic is `sixteen_step`'s, in the
/// same order, so the results are bit-identical.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn chunk_swizzled16<const PF: bool>(
    data: &[u8],
    row_bytes: usize,
    a: &Act,
    out: &mut [f32],
) {
    let rows = out.len();
    let ng = row_bytes / W4_GROUP_BYTES;
    // Once per chunk: the unchecked reads below stay inside these.
    assert!(a.qp.len() >= ng * GROUP && a.d.len() >= ng && a.gs.len() >= ng);
    assert!(data.len() >= rows.next_multiple_of(SWIZZLE_ROWS) * row_bytes);
    let p = data.as_ptr();
    let m = _mm512_set1_epi8(0x0F);
    for r in (0..rows).step_by(SWIZZLE_ROWS) {
        let band = r / SWIZZLE_ROWS;
        let mut acc = [_mm512_setzero_ps(); 2];
        for g in 0..ng {
            let t = p.add((band * ng + g) * SWIZZLE_TILE_BYTES);
            if PF {
                prefetch_ahead(t, SWIZZLE_TILE_BYTES);
            }
            let mut u = [[_mm512_setzero_si512(); 8]; 2];
            for k in 0..4 {
                for (h, u) in u.iter_mut().enumerate() {
                    let v = _mm512_loadu_si512(t.add(64 + 128 * k + 64 * h).cast());
                    u[k] = _mm512_and_si512(v, m);
                    u[4 + k] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m);
                }
            }
            for (h, acc) in acc.iter_mut().enumerate() {
                let dw = _mm512_cvtph_ps(_mm256_loadu_si256(t.add(32 * h).cast()));
                *acc = sixteen_step::<3>(*acc, &u[h], dw, a.qp, a, g);
            }
        }
        let left = rows - r;
        store_sixteen(&acc[..1], out.as_mut_ptr().add(r), 0, left);
        if left > SIXTEEN {
            store_sixteen(
                &acc[1..],
                out.as_mut_ptr().add(r + SIXTEEN),
                0,
                left - SIXTEEN,
            );
        }
    }
}
