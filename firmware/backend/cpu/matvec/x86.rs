//! AVX2 + FMA + F16C kernels (ggml's `ggml_vec_dot_*_q8_*` approach).

use super::*;
use crate::backend::cpu::kernel::x86::{f16_at, hsum};
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
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => super::kquant::avx2_chunk_fn(ty, ks),
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
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => {
            return super::kquant::avx2_many_fn(ty, ks)
        }
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
        unsafe fn $name(data: &[u8], row_bytes: usize, stride: usize, a: &Act, out: &mut [f32]) {
            for (i, o) in out.iter_mut().enumerate() {
                *o = $dot(&data[i * stride..][..row_bytes], a);
            }
        }
    };
}
chunk!(chunk_f32, dot_f32);
chunk!(chunk_f16, dot_f16);
chunk!(chunk_bf16, dot_bf16);

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
unsafe fn block_operand<const V: u8, const SHIFT: i32, const FITS: bool>(w: __m256i) -> __m256i {
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
                    *out.add(t * out_stride + r) = $name::<V>(&data[r * stride..][..row_bytes], a);
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
