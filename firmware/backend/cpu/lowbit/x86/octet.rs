//! The eight-rows-per-register kernels of `lowbit::x86` (the swizzled packing's, one row per
//! 32-bit lane) and the octet pieces `chunk_many` and the AVX-512 kernels share: see the
//! parent module's notes.

use super::*;

/// Rows per register in the eight-row kernels: eight 32-bit lanes, one row each.
pub(super) const OCTET: usize = 8;

/// The 8 x 8 transpose of 32-bit words: register j of the result holds word j of each of
/// the eight inputs, input i in lane i.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn transpose8(a: [__m256i; 8]) -> [__m256i; 8] {
    let t0 = _mm256_unpacklo_epi32(a[0], a[1]);
    let t1 = _mm256_unpackhi_epi32(a[0], a[1]);
    let t2 = _mm256_unpacklo_epi32(a[2], a[3]);
    let t3 = _mm256_unpackhi_epi32(a[2], a[3]);
    let t4 = _mm256_unpacklo_epi32(a[4], a[5]);
    let t5 = _mm256_unpackhi_epi32(a[4], a[5]);
    let t6 = _mm256_unpacklo_epi32(a[6], a[7]);
    let t7 = _mm256_unpackhi_epi32(a[6], a[7]);
    // Words (0, 4), (1, 5), (2, 6), (3, 7) of inputs 0-3 and of inputs 4-7.
    let u0 = _mm256_unpacklo_epi64(t0, t2);
    let u1 = _mm256_unpackhi_epi64(t0, t2);
    let u2 = _mm256_unpacklo_epi64(t1, t3);
    let u3 = _mm256_unpackhi_epi64(t1, t3);
    let u4 = _mm256_unpacklo_epi64(t4, t6);
    let u5 = _mm256_unpackhi_epi64(t4, t6);
    let u6 = _mm256_unpacklo_epi64(t5, t7);
    let u7 = _mm256_unpackhi_epi64(t5, t7);
    [
        _mm256_permute2x128_si256::<0x20>(u0, u4),
        _mm256_permute2x128_si256::<0x20>(u1, u5),
        _mm256_permute2x128_si256::<0x20>(u2, u6),
        _mm256_permute2x128_si256::<0x20>(u3, u7),
        _mm256_permute2x128_si256::<0x31>(u0, u4),
        _mm256_permute2x128_si256::<0x31>(u1, u5),
        _mm256_permute2x128_si256::<0x31>(u2, u6),
        _mm256_permute2x128_si256::<0x31>(u3, u7),
    ]
}

/// Group `g` of rows `r..r + 8` of a swizzled matrix (`r` a multiple of 8, so the eight
/// share a band): in a swizzled tile, word k of 32 rows is 128 contiguous bytes, so one
/// load gives word k of eight rows, a 32-bit lane each. Its low nibbles are elements
/// 8k..8k + 3 of each row and its high nibbles 8k + 4..8k + 7, i.e. bytes 4k..4k + 3 and
/// 16 + 4k.. of the `PERM`-ordered activations. Returns the low and high nibbles of the
/// four words (unsigned, 0..15) and the eight rows' scales as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn octet_group(p: *const u8, ng: usize, r: usize, g: usize) -> ([__m256i; 8], __m256) {
    let (band, lane) = (r / SWIZZLE_ROWS, r % SWIZZLE_ROWS);
    let t = p.add((band * ng + g) * SWIZZLE_TILE_BYTES);
    // The same slice of the tile two groups on.
    let ahead = t.wrapping_add(2 * SWIZZLE_TILE_BYTES);
    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(2 * lane).cast());
    let m = _mm256_set1_epi8(0x0F);
    let mut nib = [_mm256_setzero_si256(); 8];
    for k in 0..4 {
        let at = 64 + 128 * k + 4 * lane;
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(at).cast());
        let v = _mm256_loadu_si256(t.add(at).cast());
        nib[k] = _mm256_and_si256(v, m);
        nib[4 + k] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
    }
    let dw = _mm256_cvtph_ps(_mm_loadu_si128(t.add(2 * lane).cast()));
    (nib, dw)
}

/// The exact int32 dots of one group of eight rows with one input's group `y`: register j
/// holds activation bytes 4j..4j + 3 of each row (lane = row) as unsigned `u = w + 2^SHIFT`
/// (the nibble itself for w4), so each lane gets its row's `sum w * y` as `sum u * y` from
/// the start `-2^SHIFT * sum y`, in two chains (registers 0-3 and 4-7) added at the end.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn octet_dot<const V: u8, const SHIFT: i32>(
    nib: &[__m256i; 8],
    y: *const i8,
    neg_sum: i32,
) -> __m256i {
    let word = |o: usize| _mm256_set1_epi32(y.add(o).cast::<i32>().read_unaligned());
    let mut lo = _mm256_set1_epi32(neg_sum << SHIFT);
    let mut hi = _mm256_setzero_si256();
    for k in 0..4 {
        lo = dpbusd::<V>(lo, nib[k], word(4 * k));
        hi = dpbusd::<V>(hi, nib[4 + k], word(16 + 4 * k));
    }
    _mm256_add_epi32(lo, hi)
}

/// The swizzled packing's matrix-vector kernel: eight rows per register, so each row's
/// group dot is whole in its lane and needs no horizontal add; the epilogue is the other
/// kernels' (`(d_w * d_x) * i` added in group order), eight rows at once, so the results
/// are bit-identical. Rows past the chunk's last (the band's padding) are computed from
/// the padding bytes and not stored.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn chunk_swizzled<const V: u8>(
    data: &[u8],
    row_bytes: usize,
    a: &Act,
    out: &mut [f32],
) {
    let ng = row_bytes / W4_GROUP_BYTES;
    let rows = out.len();
    // Once per chunk: the unchecked reads below stay inside these.
    assert!(a.qp.len() >= ng * GROUP && a.d.len() >= ng && a.gs.len() >= ng);
    assert!(data.len() >= rows.next_multiple_of(SWIZZLE_ROWS) * row_bytes);
    let p = data.as_ptr();
    for r in (0..rows).step_by(OCTET) {
        let mut acc = _mm256_setzero_ps();
        for g in 0..ng {
            let (nib, dw) = octet_group(p, ng, r, g);
            let y = a.qp.as_ptr().add(g * GROUP);
            let i = octet_dot::<V, 3>(&nib, y, *a.gs.get_unchecked(g));
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(*a.d.get_unchecked(g)));
            acc = _mm256_add_ps(acc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(i)));
        }
        store_rows(acc, out.as_mut_ptr().add(r), rows - r);
    }
}

/// The swizzled many-input kernels' argument checks, once per chunk (the unchecked reads
/// stay inside them): groups per row and inputs.
pub(super) fn swizzled_args(
    data: &[u8],
    row_bytes: usize,
    acts: &[Act],
    rows: usize,
) -> (usize, usize) {
    let ng = row_bytes / W4_GROUP_BYTES;
    let n = acts.len();
    assert!(n <= MAX_INPUTS, "{n} inputs");
    for a in acts {
        assert!(a.qp.len() >= ng * GROUP && a.d.len() >= ng && a.gs.len() >= ng);
    }
    assert!(data.len() >= rows.next_multiple_of(SWIZZLE_ROWS) * row_bytes);
    (ng, n)
}

/// `chunk_swizzled` for several inputs: each group of eight rows is loaded and unpacked
/// once, then dotted with every input (bit-identical per input).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn chunk_many_swizzled<const V: u8>(
    data: &[u8],
    row_bytes: usize,
    acts: &[Act],
    out: *mut f32,
    out_stride: usize,
    rows: usize,
) {
    let (ng, n) = swizzled_args(data, row_bytes, acts, rows);
    let p = data.as_ptr();
    let mut acc = [_mm256_setzero_ps(); MAX_INPUTS];
    for r in (0..rows).step_by(OCTET) {
        acc[..n].fill(_mm256_setzero_ps());
        for g in 0..ng {
            let (nib, dw) = octet_group(p, ng, r, g);
            for (a, acc) in acts.iter().zip(acc.iter_mut()) {
                let y = a.qp.as_ptr().add(g * GROUP);
                let i = octet_dot::<V, 3>(&nib, y, *a.gs.get_unchecked(g));
                let d = _mm256_mul_ps(dw, _mm256_set1_ps(*a.d.get_unchecked(g)));
                *acc = _mm256_add_ps(*acc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(i)));
            }
        }
        for (t, acc) in acc[..n].iter().enumerate() {
            store_rows(*acc, out.add(t * out_stride + r), rows - r);
        }
    }
}

/// Stores the first `min(8, left)` lanes of `v` at `o`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store_rows(v: __m256, o: *mut f32, left: usize) {
    if left >= OCTET {
        _mm256_storeu_ps(o, v);
    } else {
        let mut lanes = [0f32; OCTET];
        _mm256_storeu_ps(lanes.as_mut_ptr(), v);
        std::ptr::copy_nonoverlapping(lanes.as_ptr(), o, left);
    }
}
