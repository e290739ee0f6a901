//! The x86-64 kernels of `lowbit` (AVX2, VNNI, AVX-512): see the parent module's notes.

use super::*;
use crate::backend::cpu::kernel::MAX_INPUTS;
use std::arch::x86_64::*;

mod avx512;
use avx512::{chunk_many16, chunk_many_swizzled16, chunk_swizzled16};
pub(crate) use avx512::{has_avx512_vnni, prefetch_ahead, prefetch_lines};

mod octet;
use octet::{chunk_many_swizzled, chunk_swizzled, octet_dot, swizzled_args, transpose8, OCTET};

/// The group's 32 int8 weights in register order (natural for w8 and contiguous, `PERM` for
/// the lane-interleaved packings), and whether the activations must be the permuted ones.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weights<const F: u8>(p: *const u8, w: [usize; 4]) -> __m256i {
    let m = _mm_set1_epi8(0x0F);
    match F {
        FMT_W8 => _mm256_loadu_si256(p.add(w[0]).cast()),
        FMT_W4C => {
            // One shift and two masks give the even and odd elements; two unpacks put them
            // back in order (the extra work the contiguous packing costs).
            let v = _mm_loadu_si128(p.add(w[0]).cast());
            let lo = _mm_and_si128(v, m);
            let hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
            let n = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
            _mm256_sub_epi8(n, _mm256_set1_epi8(8))
        }
        _ => {
            let v = if F == FMT_W4S {
                let ld = |o: usize| p.add(o).cast::<i32>().read_unaligned();
                _mm_set_epi32(ld(w[3]), ld(w[2]), ld(w[1]), ld(w[0]))
            } else {
                _mm_loadu_si128(p.add(w[0]).cast())
            };
            // One shift and two masks: dp4a-ready bytes in `PERM` order.
            let lo = _mm_and_si128(v, m);
            let hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
            _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8))
        }
    }
}

pub(crate) const VNNI_NONE: u8 = 0;
/// AVX-VNNI: `vpdpbusd` VEX-encoded (Alder Lake, Sapphire Rapids and later; Zen 5).
pub(crate) const VNNI_VEX: u8 = 1;
/// AVX512-VNNI with AVX512-VL: the EVEX form on ymm registers (Cascade/Ice Lake, Zen 4).
pub(crate) const VNNI_EVEX: u8 = 2;

/// The VNNI form this CPU has (detected once by the standard library, cached).
pub(crate) fn vnni() -> u8 {
    if is_x86_feature_detected!("avxvnni") {
        VNNI_VEX
    } else if is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
        VNNI_EVEX
    } else {
        VNNI_NONE
    }
}

/// Where VNNI is in use (any form: a CPU with both prefers the VEX one for ymm) and the CPU
/// has AVX-512 F, BW, VL and VNNI, the kernels below take sixteen rows per zmm register
/// (they name their own features, whatever form `V` is), unless `avx512` is off (the
/// `no-avx512` ablation).
fn sixteen<const V: u8>(avx512: bool) -> bool {
    V != VNNI_NONE && has_avx512_vnni() && avx512
}

pub(super) fn chunk_for<const V: u8>(f: QFormat, avx512: bool, prefetch: bool) -> ChunkFn {
    let sixteen = || sixteen::<V>(avx512);
    match f {
        QFormat::W8 if prefetch => chunk_rowpair::<FMT_W8, V, true>,
        QFormat::W8 => chunk_rowpair::<FMT_W8, V, false>,
        QFormat::W4(Packing::Contiguous) => chunk::<FMT_W4C, V>,
        QFormat::W4(Packing::Interleaved) => chunk::<FMT_W4I, V>,
        QFormat::W4(Packing::Swizzled) if sixteen() && prefetch => chunk_swizzled16::<true>,
        QFormat::W4(Packing::Swizzled) if sixteen() => chunk_swizzled16::<false>,
        QFormat::W4(Packing::Swizzled) => chunk_swizzled::<V>,
    }
}

pub(super) fn chunk_many_for<const V: u8>(f: QFormat, avx512: bool) -> ChunkManyFn {
    let sixteen = || sixteen::<V>(avx512);
    match f {
        QFormat::W8 if sixteen() => chunk_many16::<FMT_W8>,
        QFormat::W4(Packing::Contiguous) if sixteen() => chunk_many16::<FMT_W4C>,
        QFormat::W4(Packing::Interleaved) if sixteen() => chunk_many16::<FMT_W4I>,
        QFormat::W8 => chunk_many::<FMT_W8, V>,
        QFormat::W4(Packing::Contiguous) => chunk_many::<FMT_W4C, V>,
        QFormat::W4(Packing::Interleaved) => chunk_many::<FMT_W4I, V>,
        QFormat::W4(Packing::Swizzled) if sixteen() => chunk_many_swizzled16,
        QFormat::W4(Packing::Swizzled) => chunk_many_swizzled::<V>,
    }
}

/// 8 lanes of int32 partial dots of signed `w` with signed `y`: |w| (unsigned) times y
/// with w's sign, four adjacent bytes per lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_lanes<const V: u8>(w: __m256i, y: __m256i) -> __m256i {
    dot_lanes_abs::<V>(_mm256_sign_epi8(w, w), w, y)
}

/// `dot_lanes` with `u = |w|` made by the caller (once for every input that meets `w`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_lanes_abs<const V: u8>(u: __m256i, w: __m256i, y: __m256i) -> __m256i {
    dpbusd::<V>(_mm256_setzero_si256(), u, _mm256_sign_epi8(y, w))
}

/// `acc` plus, in each 32-bit lane, the four products of unsigned bytes `u` with signed
/// bytes `s`. VNNI: one `vpdpbusd`, exact. AVX2: `maddubs` + `madd` + add, exact only where
/// each adjacent pair of products fits an i16 (|u| <= 128 with |s| <= 127, or u <= 31);
/// callers keep to that.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dpbusd<const V: u8>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    let mut acc = acc;
    // SAFETY (both asm blocks): V is a VNNI form only where `vnni()` found it on this CPU
    // (`vnni_form`); the instruction reads and writes registers only.
    match V {
        VNNI_VEX => std::arch::asm!(
            "{{vex}} vpdpbusd {acc}, {u}, {s}",
            acc = inout(ymm_reg) acc,
            u = in(ymm_reg) u,
            s = in(ymm_reg) s,
            options(pure, nomem, nostack, preserves_flags)
        ),
        VNNI_EVEX => std::arch::asm!(
            "{{evex}} vpdpbusd {acc}, {u}, {s}",
            acc = inout(ymm_reg) acc,
            u = in(ymm_reg) u,
            s = in(ymm_reg) s,
            options(pure, nomem, nostack, preserves_flags)
        ),
        _ => {
            let pairs = _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
            acc = _mm256_add_epi32(acc, pairs)
        }
    }
    acc
}

/// Whether format `F` under `V` dots unsigned weights (`offset_weights`) with the
/// activations as they are, starting from `bias` (no per-input sign trick): always with
/// VNNI; without it only for w4, whose unsigned values (0..15) keep `maddubs` exact.
#[inline(always)]
fn unsigned_dot<const F: u8, const V: u8>() -> bool {
    V != VNNI_NONE || F != FMT_W8
}

/// Signed bytes `w` as unsigned `w + 2^SHIFT` (SHIFT 7: the top bit flipped). Shared with
/// the classic kernels (`backend::cpu::matvec`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn offset_unsigned<const SHIFT: i32>(w: __m256i) -> __m256i {
    if SHIFT == 7 {
        _mm256_xor_si256(w, _mm256_set1_epi8(0x80u8 as i8))
    } else {
        _mm256_add_epi8(w, _mm256_set1_epi8(1 << SHIFT))
    }
}

/// The start of an unsigned dot with block `b` of `a`: `-2^SHIFT * y` summed per lane
/// (`Act::ls`), so that `start + sum (w + 2^SHIFT) * y = sum w * y` exactly, lane by lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn offset_start<const SHIFT: i32>(a: &Act, b: usize) -> __m256i {
    debug_assert!(a.ls.len() >= 8 * (b + 1));
    _mm256_slli_epi32::<SHIFT>(_mm256_loadu_si256(a.ls.as_ptr().add(8 * b).cast()))
}

/// The group's weights made unsigned: `w + 128` (w8), `w + 8` (w4; the nibble itself).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn offset_weights<const F: u8>(q: __m256i) -> __m256i {
    if F == FMT_W8 {
        offset_unsigned::<7>(q)
    } else {
        offset_unsigned::<3>(q)
    }
}

/// `offset_start` of group `g` for format `F`'s offset. Any split of the group's sum over
/// the lanes would do here, since these kernels add a group's eight lanes together.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bias<const F: u8>(a: &Act, g: usize) -> __m256i {
    if F == FMT_W8 {
        offset_start::<7>(a, g)
    } else {
        offset_start::<3>(a, g)
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_hadd_epi32(s, s);
    let s = _mm_hadd_epi32(s, s);
    _mm_cvtsi128_si32(s)
}

/// The one-input kernels' argument checks, once per chunk (the unchecked reads stay inside
/// them): groups per row and the activations format `F` reads.
fn one_args<'a, const F: u8>(row_bytes: usize, a: &Act<'a>) -> (usize, &'a [i8]) {
    let ng = groups::<F>(row_bytes);
    let act = activations::<F>(a);
    assert!(act.len() >= ng * GROUP && a.d.len() >= ng && a.ls.len() >= 8 * ng && a.gs.len() >= ng);
    (ng, act)
}

/// Group `g`'s exact int32 dot of weights `q` (register order) with `y`, per lane: `dpbusd`
/// on the unsigned weights from the group's bias where the form has it, `dot_lanes` else.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_dot<const F: u8, const V: u8>(
    a: &Act,
    g: usize,
    q: __m256i,
    y: __m256i,
) -> __m256i {
    if unsigned_dot::<F, V>() {
        dpbusd::<V>(bias::<F>(a, g), offset_weights::<F>(q), y)
    } else {
        dot_lanes::<V>(q, y)
    }
}

/// The lane sums of four int32 vectors, in order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn four_sums(m: [__m256i; 4]) -> __m128i {
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(m[0], m[1]), _mm256_hadd_epi32(m[2], m[3]));
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn chunk<const F: u8, const V: u8>(
    data: &[u8],
    row_bytes: usize,
    a: &Act,
    out: &mut [f32],
) {
    let (ng, act) = one_args::<F>(row_bytes, a);
    let p = data.as_ptr();
    let mut r = 0;
    while r + 4 <= out.len() {
        let mut acc = _mm_setzero_ps();
        for g in 0..ng {
            let y = _mm256_loadu_si256(act.as_ptr().add(g * GROUP).cast());
            let (q, dw) = four_rows::<F>(p, row_bytes, r, g);
            if V == VNNI_NONE && F != FMT_W8 {
                let i4 = four_w4_dots(q, y, *a.gs.get_unchecked(g));
                let d = _mm_mul_ps(dw, _mm_set1_ps(*a.d.get_unchecked(g)));
                acc = _mm_add_ps(acc, _mm_mul_ps(d, _mm_cvtepi32_ps(i4)));
                continue;
            }
            // Four exact int32 group dots, one per row.
            // (Not `q.map`: a closure does not take this function's target features.)
            let i4 = four_sums([
                group_dot::<F, V>(a, g, q[0], y),
                group_dot::<F, V>(a, g, q[1], y),
                group_dot::<F, V>(a, g, q[2], y),
                group_dot::<F, V>(a, g, q[3], y),
            ]);
            // The epilogue, once per group: (d_w * d_x) * i, added in group order.
            let d = _mm_mul_ps(dw, _mm_set1_ps(*a.d.get_unchecked(g)));
            acc = _mm_add_ps(acc, _mm_mul_ps(d, _mm_cvtepi32_ps(i4)));
        }
        _mm_storeu_ps(out.as_mut_ptr().add(r), acc);
        r += 4;
    }
    while r < out.len() {
        out[r] = row_alone::<F, V>(p, row_bytes, r, a, 0, 0.0);
        r += 1;
    }
}

/// Decode's w8 kernel (one input): `chunk`'s arithmetic, two rows at a time. The chunk's
/// first half of rows and its second half are each read front to back (two long streams,
/// which the hardware prefetcher follows; `chunk`'s four rows of one group are four short
/// interleaved streams it does not: w8 at 1,536 columns, one Zen 4 thread, 12 GB/s against a
/// 24 GB/s read floor), row i of the one beside row i of the other. Four groups of a row make
/// one horizontal-add tree and their `(d_w * d_x) * i` are added to the row's sum in group
/// order. That sum is a chain of adds, one add's latency a group: one row at a time (the
/// kernel before this one) the chain bound it where the weights were in cache, so each row
/// here keeps its sum in one lane of a register and the two chains run side by side (the GPU
/// machine's Xeon: 1.15-1.46x the GB/s from DRAM, docs/BENCHMARKS.md). Bit-identical to `chunk`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn chunk_rowpair<const F: u8, const V: u8, const PF: bool>(
    data: &[u8],
    row_bytes: usize,
    a: &Act,
    out: &mut [f32],
) {
    let (ng, act) = one_args::<F>(row_bytes, a);
    assert!(data.len() >= out.len() * row_bytes);
    let p = data.as_ptr();
    let scale = |s: usize| p.add(s).cast::<u16>().read_unaligned() as i16;
    let rows = out.len();
    let half = rows / 2;
    for i in 0..half {
        let rr = [i, half + i];
        // Lane 0: row rr[0]'s sum, lane 1: row rr[1]'s (lanes 2 and 3 carry partial sums
        // that are never read).
        let mut acc = _mm_setzero_ps();
        let mut g = 0;
        while g + 4 <= ng {
            // The four groups' inputs, which both rows meet.
            // (Not `array::from_fn`: a closure does not take this function's target features.)
            let ld = |j: usize| act.as_ptr().add((g + j) * GROUP).cast();
            let y = [
                _mm256_loadu_si256(ld(0)),
                _mm256_loadu_si256(ld(1)),
                _mm256_loadu_si256(ld(2)),
                _mm256_loadu_si256(ld(3)),
            ];
            let mut m = [[_mm256_setzero_si256(); 4]; 2];
            let mut sc = [[0i16; 4]; 2];
            for (r, (m, sc)) in rr.iter().zip(m.iter_mut().zip(sc.iter_mut())) {
                if PF {
                    let (_, w) = group_at::<F>(row_bytes, *r, g);
                    // The four groups' bytes (136 at w8: three lines; two would leave one
                    // line in seventeen to a demand miss).
                    prefetch_ahead(p.add(w[0]), 4 * group_bytes::<F>());
                }
                for (j, (m, sc)) in m.iter_mut().zip(sc.iter_mut()).enumerate() {
                    let (s, w) = group_at::<F>(row_bytes, *r, g + j);
                    *sc = scale(s);
                    *m = group_dot::<F, V>(a, g + j, weights::<F>(p, w), y[j]);
                }
            }
            // Each row's four exact int32 group dots, in group order.
            let (ia, ib) = (four_sums(m[0]), four_sums(m[1]));
            let dx = _mm_loadu_ps(a.d.as_ptr().add(g));
            let dw = |s: [i16; 4]| _mm_cvtph_ps(_mm_set_epi16(0, 0, 0, 0, s[3], s[2], s[1], s[0]));
            let va = _mm_mul_ps(_mm_mul_ps(dw(sc[0]), dx), _mm_cvtepi32_ps(ia));
            let vb = _mm_mul_ps(_mm_mul_ps(dw(sc[1]), dx), _mm_cvtepi32_ps(ib));
            // [a0, b0, a1, b1] and [a2, b2, a3, b3]: each group's two terms side by side,
            // added one group at a time.
            let lo = _mm_unpacklo_ps(va, vb);
            let hi = _mm_unpackhi_ps(va, vb);
            acc = _mm_add_ps(acc, lo);
            acc = _mm_add_ps(acc, _mm_movehl_ps(lo, lo));
            acc = _mm_add_ps(acc, hi);
            acc = _mm_add_ps(acc, _mm_movehl_ps(hi, hi));
            g += 4;
        }
        let mut sums = [0f32; 4];
        _mm_storeu_ps(sums.as_mut_ptr(), acc);
        for (lane, r) in rr.into_iter().enumerate() {
            out[r] = row_alone::<F, V>(p, row_bytes, r, a, g, sums[lane]);
        }
    }
    if rows % 2 == 1 {
        out[rows - 1] = row_alone::<F, V>(p, row_bytes, rows - 1, a, 0, 0.0);
    }
}

/// Without VNNI, four rows' exact w4 group dots with one `madd` instead of four: the
/// offset weights `w + 8` (0..15) against int8 inputs (|y| <= 127) give `maddubs` pairs of
/// at most 3,810, so the two `hadd`s that gather the four rows still hold each sum of 8
/// products in an i16 (<= 15,240), and the `madd` that follows widens them. `neg_sum`: the
/// group's `Act::gs`, the start `-8 * sum y`. The same int32s as `dpbusd` and the
/// `hadd_epi32`s of the other path: bit-identical.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn four_w4_dots(q: [__m256i; 4], y: __m256i, neg_sum: i32) -> __m128i {
    let p = |w: __m256i| _mm256_maddubs_epi16(offset_unsigned::<3>(w), y);
    let h01 = _mm256_hadd_epi16(p(q[0]), p(q[1]));
    let h23 = _mm256_hadd_epi16(p(q[2]), p(q[3]));
    // Per 128-bit half: rows 0..3's sums, two i16 each; then one i32 each.
    let m = _mm256_madd_epi16(_mm256_hadd_epi16(h01, h23), _mm256_set1_epi16(1));
    let i4 = _mm_add_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    _mm_add_epi32(i4, _mm_set1_epi32(neg_sum << 3))
}

/// Group `g` of rows `r..r + 4`: each row's 32 weights in register order (`weights`) and
/// the four scales as f32. It also prefetches the same group four rows on (two tiles on,
/// swizzled): streaming DRAM is latency-bound on the hardware prefetcher alone.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn four_rows<const F: u8>(
    p: *const u8,
    row_bytes: usize,
    r: usize,
    g: usize,
) -> ([__m256i; 4], __m128) {
    let (s0, w0) = group_at::<F>(row_bytes, r, g);
    let (s1, w1) = group_at::<F>(row_bytes, r + 1, g);
    let (s2, w2) = group_at::<F>(row_bytes, r + 2, g);
    let (s3, w3) = group_at::<F>(row_bytes, r + 3, g);
    let ahead = if F == FMT_W4S {
        2 * SWIZZLE_TILE_BYTES
    } else {
        4 * row_bytes
    };
    for o in [w0[0], w1[0], w2[0], w3[0]] {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(o + ahead).cast());
    }
    let scale = |s: usize| p.add(s).cast::<u16>().read_unaligned() as i16;
    let dw = _mm_cvtph_ps(_mm_set_epi16(
        0,
        0,
        0,
        0,
        scale(s3),
        scale(s2),
        scale(s1),
        scale(s0),
    ));
    let q = [
        weights::<F>(p, w0),
        weights::<F>(p, w1),
        weights::<F>(p, w2),
        weights::<F>(p, w3),
    ];
    (q, dw)
}

/// Row `r`'s groups from `from` on, one at a time, added to `acc` (a chunk's last rows, past
/// its last four, from group 0; `chunk_rowpair`'s last groups, past its last four): the same
/// group order and epilogue as the four-row loop, one lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_alone<const F: u8, const V: u8>(
    p: *const u8,
    row_bytes: usize,
    r: usize,
    a: &Act,
    from: usize,
    mut acc: f32,
) -> f32 {
    let act = activations::<F>(a);
    let scale = |s: usize| p.add(s).cast::<u16>().read_unaligned();
    for g in from..groups::<F>(row_bytes) {
        let y = _mm256_loadu_si256(act.as_ptr().add(g * GROUP).cast());
        let (s, w) = group_at::<F>(row_bytes, r, g);
        let i = hsum_i32(dot_lanes::<V>(weights::<F>(p, w), y));
        let d = f16_to_f32(scale(s)) * *a.d.get_unchecked(g);
        acc += d * i as f32;
    }
    acc
}

/// The row-major many-input kernels' argument checks, once per chunk (the unchecked reads
/// stay inside them): groups per row and inputs.
fn many_args<const F: u8>(row_bytes: usize, acts: &[Act]) -> (usize, usize) {
    let ng = groups::<F>(row_bytes);
    let n = acts.len();
    assert!(n <= MAX_INPUTS, "{n} inputs");
    for a in acts {
        assert!(activations::<F>(a).len() >= ng * GROUP && a.d.len() >= ng);
        assert!(a.ls.len() >= 8 * ng && a.gs.len() >= ng);
    }
    (ng, n)
}

/// `chunk` for several inputs at once (a batch of prompt tokens): each group of four rows
/// is loaded, unpacked and made unsigned once, its scales converted once, and then dotted
/// with every input. Input `t`'s row `r` goes to `out[t * out_stride + r]`. For each input
/// the arithmetic is `chunk`'s, in the same order, so the results are bit-identical.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn chunk_many<const F: u8, const V: u8>(
    data: &[u8],
    row_bytes: usize,
    acts: &[Act],
    out: *mut f32,
    out_stride: usize,
    rows: usize,
) {
    let (ng, n) = many_args::<F>(row_bytes, acts);
    let p = data.as_ptr();
    let mut r = 0;
    if unsigned_dot::<F, V>() && F != FMT_W4S {
        // Eight rows at a time: the rows' groups are transposed in registers once, so that
        // every input's dot leaves each row's exact group sum in its own lane (no
        // horizontal add). Same epilogue, eight rows wide: bit-identical.
        let shift = if F == FMT_W8 { 7 } else { 3 };
        let mut acc = [_mm256_setzero_ps(); MAX_INPUTS];
        while r + OCTET <= rows {
            acc[..n].fill(_mm256_setzero_ps());
            for g in 0..ng {
                let (q0, dw0) = four_rows::<F>(p, row_bytes, r, g);
                let (q1, dw1) = four_rows::<F>(p, row_bytes, r + 4, g);
                let u = transpose8([
                    offset_weights::<F>(q0[0]),
                    offset_weights::<F>(q0[1]),
                    offset_weights::<F>(q0[2]),
                    offset_weights::<F>(q0[3]),
                    offset_weights::<F>(q1[0]),
                    offset_weights::<F>(q1[1]),
                    offset_weights::<F>(q1[2]),
                    offset_weights::<F>(q1[3]),
                ]);
                let dw = _mm256_set_m128(dw1, dw0);
                for (a, acc) in acts.iter().zip(acc.iter_mut()) {
                    let y = activations::<F>(a).as_ptr().add(g * GROUP);
                    let gs = *a.gs.get_unchecked(g);
                    let i = if shift == 7 {
                        octet_dot::<V, 7>(&u, y, gs)
                    } else {
                        octet_dot::<V, 3>(&u, y, gs)
                    };
                    let d = _mm256_mul_ps(dw, _mm256_set1_ps(*a.d.get_unchecked(g)));
                    *acc = _mm256_add_ps(*acc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(i)));
                }
            }
            for (t, acc) in acc[..n].iter().enumerate() {
                _mm256_storeu_ps(out.add(t * out_stride + r), *acc);
            }
            r += OCTET;
        }
    }
    // Each input's four running sums, in memory across the group loop.
    let mut acc = [_mm_setzero_ps(); MAX_INPUTS];
    while r + 4 <= rows {
        acc[..n].fill(_mm_setzero_ps());
        for g in 0..ng {
            let (q, dw) = four_rows::<F>(p, row_bytes, r, g);
            // Unsigned weights (`unsigned_dot`), else |w| for the sign trick.
            let u = if unsigned_dot::<F, V>() {
                [
                    offset_weights::<F>(q[0]),
                    offset_weights::<F>(q[1]),
                    offset_weights::<F>(q[2]),
                    offset_weights::<F>(q[3]),
                ]
            } else {
                [
                    _mm256_sign_epi8(q[0], q[0]),
                    _mm256_sign_epi8(q[1], q[1]),
                    _mm256_sign_epi8(q[2], q[2]),
                    _mm256_sign_epi8(q[3], q[3]),
                ]
            };
            for (a, acc) in acts.iter().zip(acc.iter_mut()) {
                let y = _mm256_loadu_si256(activations::<F>(a).as_ptr().add(g * GROUP).cast());
                let [m0, m1, m2, m3] = if unsigned_dot::<F, V>() {
                    let b = bias::<F>(a, g);
                    [
                        dpbusd::<V>(b, u[0], y),
                        dpbusd::<V>(b, u[1], y),
                        dpbusd::<V>(b, u[2], y),
                        dpbusd::<V>(b, u[3], y),
                    ]
                } else {
                    [
                        dot_lanes_abs::<V>(u[0], q[0], y),
                        dot_lanes_abs::<V>(u[1], q[1], y),
                        dot_lanes_abs::<V>(u[2], q[2], y),
                        dot_lanes_abs::<V>(u[3], q[3], y),
                    ]
                };
                let h = _mm256_hadd_epi32(_mm256_hadd_epi32(m0, m1), _mm256_hadd_epi32(m2, m3));
                let i4 = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
                let d = _mm_mul_ps(dw, _mm_set1_ps(*a.d.get_unchecked(g)));
                *acc = _mm_add_ps(*acc, _mm_mul_ps(d, _mm_cvtepi32_ps(i4)));
            }
        }
        for (t, acc) in acc[..n].iter().enumerate() {
            _mm_storeu_ps(out.add(t * out_stride + r), *acc);
        }
        r += 4;
    }
    while r < rows {
        for (t, a) in acts.iter().enumerate() {
            *out.add(t * out_stride + r) = row_alone::<F, V>(p, row_bytes, r, a, 0, 0.0);
        }
        r += 1;
    }
}

/// The "no deferred dequantization" ablation: each group is unpacked, converted to f32 and
/// scaled first, then dotted in f32 with the f32 activations (one row at a time).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn chunk_eager<const F: u8>(
    data: &[u8],
    row_bytes: usize,
    a: &Act,
    out: &mut [f32],
) {
    let ng = groups::<F>(row_bytes);
    // Where each 8-byte run of the unpacked register starts in the row (two runs of 4).
    let runs: [(usize, usize); 4] = if F == FMT_W4I || F == FMT_W4S {
        [(0, 8), (16, 24), (4, 12), (20, 28)]
    } else {
        [(0, 4), (8, 12), (16, 20), (24, 28)]
    };
    let p = data.as_ptr();
    let x = a.x.as_ptr();
    for (r, o) in out.iter_mut().enumerate() {
        let mut acc = _mm256_setzero_ps();
        for g in 0..ng {
            let (s, w) = group_at::<F>(row_bytes, r, g);
            let wv = weights::<F>(p, w);
            let d = _mm256_set1_ps(f16_to_f32(p.add(s).cast::<u16>().read_unaligned()));
            let mut bytes = [0i8; GROUP];
            _mm256_storeu_si256(bytes.as_mut_ptr().cast(), wv);
            for (c, &(lo, hi)) in runs.iter().enumerate() {
                let q = _mm_loadl_epi64(bytes.as_ptr().add(8 * c).cast());
                let wf = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
                let xg = x.add(g * GROUP);
                let xv = _mm256_set_m128(_mm_loadu_ps(xg.add(hi)), _mm_loadu_ps(xg.add(lo)));
                acc = _mm256_fmadd_ps(wf, xv, acc);
            }
        }
        let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        *o = _mm_cvtss_f32(s);
    }
}

#[cfg(test)]
mod tests;
