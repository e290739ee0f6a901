//! K-quant rows (Q4_K, Q5_K, Q6_K) dotted in their stored super-blocks, in integers.
//!
//! A super-block holds 256 weights: Q4_K and Q5_K as 8 sub-blocks of 32, each with a 6-bit
//! scale `sc` and min `m` under the block's f16 `d` and `dmin` (weight = `d * sc * q - dmin * m`,
//! q in 0..15, or 0..31 with Q5_K's fifth bits); Q6_K as 16 sub-blocks of 16 with int8 scales
//! under `d` (weight = `d * sc * (q - 32)`, q in 0..63). The input is quantized as for the
//! classic types (`ActScratch`: int8 groups of 32 with scale `d_x` and `s_x = d_x * sum(q_x)`),
//! so each run of 32 weights meets one activation group and is one int8 x int8 -> int32 dot:
//!
//! - Q4_K and Q5_K, group g: `d * sc_g * d_x * sum(q * q_x) - dmin * m_g * s_x`;
//! - Q6_K, group g (halves h of 16): `d * d_x * sum_h sc_h * sum((q - 32) * q_x)`.
//!
//! Where only K-quant rows read an input, its eight groups in each 256 share one `d_x`
//! (`ActScales::SuperBlock`, llama.cpp's Q8_K), so a super-block's groups can add up in
//! integers before one float multiply (the AVX-512 kernels, `avx512.rs`); the formulas above
//! hold either way. The only error against dequantizing to f32 is the int8 input's, and the
//! weights are read as stored: 4.5, 5.5 and 6.56 bits a weight.
//!
//! Kernels: AVX2+FMA+F16C four rows at a time (x86_64; `vpdpbusd` where the CPU has VNNI and
//! `ks.vnni` is on), AVX-512 VNNI one row at a time (Q4_K, Q6_K), NEON (aarch64) and a scalar
//! one. All make the same int32 sums per group (Q6_K: per 16); the AVX2 and AVX-512 ones add
//! the floats in another order, the NEON ones in the scalar order (bit-identical to it).

use super::{le16, ChunkFn};
use crate::backend::cpu::kernel::Act;
use crate::model::ggml::{f16_to_f32, GgmlType, QK};

/// Bytes of one Q4_K super-block: `d`, `dmin`, 12 bytes of scales and mins, 128 of nibbles.
const Q4K_BYTES: usize = 144;
/// Bytes of one Q5_K super-block: Q4_K's, with 32 bytes of fifth bits before the nibbles.
const Q5K_BYTES: usize = 176;
/// Bytes of one Q6_K super-block: 128 of low nibbles, 64 of high bit pairs, 16 scales, `d`.
const Q6K_BYTES: usize = 210;
/// Activation groups of 32 per super-block.
const GROUPS: usize = 8;

/// Q4_K's 12 bytes of packed 6-bit scales and mins, unpacked: byte j of the first word is
/// sub-block j's scale, of the second its min (ggml's `get_scale_min_k4` for all eight at once,
/// in its `kmask` form).
#[inline(always)]
fn q4k_scales_mins(s: &[u8]) -> (u64, u64) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (w0, w1, w2) = (w(0), w(1), w(2));
    let sc_hi = (w2 & LOW4) | (((w0 >> 6) & LOW2) << 4);
    let m_hi = ((w2 >> 4) & LOW4) | (((w1 >> 6) & LOW2) << 4);
    (
        (w0 & LOW6) as u64 | (sc_hi as u64) << 32,
        (w1 & LOW6) as u64 | (m_hi as u64) << 32,
    )
}

/// Checks a chunk's bounds once, so that the kernels may read without them: `out.len()` rows
/// of `row_bytes` (whole super-blocks of `bytes`), `stride` apart in `data`, and `a` quantized
/// over at least their columns. Returns the super-blocks per row.
fn chunk_blocks(
    data: &[u8],
    row_bytes: usize,
    stride: usize,
    a: &Act,
    rows: usize,
    bytes: usize,
) -> usize {
    let nsb = row_bytes / bytes;
    assert_eq!(nsb * bytes, row_bytes, "rows of {row_bytes} bytes");
    assert!(
        rows == 0 || data.len() >= (rows - 1) * stride + row_bytes,
        "{rows} rows of {row_bytes} bytes, {stride} apart, in {} bytes",
        data.len()
    );
    assert!(
        a.qs.len() >= nsb * GROUPS * QK
            && a.d.len() >= nsb * GROUPS
            && a.s.len() >= nsb * GROUPS
            && a.ls.len() >= nsb * GROUPS * 8,
        "the input is not quantized over {} columns",
        nsb * GROUPS * QK
    );
    // The one-scale form's sums of 16 (`Act::hs`), where it has them.
    assert!(
        a.hs.is_empty() || a.hs.len() >= nsb * 2 * GROUPS,
        "sums of 16 over {nsb} super-blocks"
    );
    nsb
}

/// The kernels' type parameter.
const Q4K: u8 = 0;
const Q5K: u8 = 1;
const Q6K: u8 = 2;

/// Bytes of a super-block of kernel type `t`.
const fn block_bytes(t: u8) -> usize {
    match t {
        Q4K => Q4K_BYTES,
        Q5K => Q5K_BYTES,
        _ => Q6K_BYTES,
    }
}

/// The scalar kernel of K-quant type `ty`. Panics for any other type (the caller's fault).
pub(super) fn scalar_chunk_fn(ty: GgmlType) -> ChunkFn {
    match ty {
        GgmlType::Q4_K => scalar::chunk::<Q4K>,
        GgmlType::Q5_K => scalar::chunk::<Q5K>,
        GgmlType::Q6_K => scalar::chunk::<Q6K>,
        _ => panic!("{} is not a K-quant type", ty.name()),
    }
}

/// Whether `ks` runs the AVX-512 VNNI K-quant kernels (`avx512.rs`) on this CPU.
#[cfg(target_arch = "x86_64")]
fn zmm_kernels(ks: super::KernelSet) -> bool {
    ks.avx512 && ks.vnni && crate::backend::cpu::lowbit::x86::has_avx512_vnni()
}

/// The AVX2 kernel of K-quant type `ty` in the VNNI form `ks` uses. Panics for any other type.
#[cfg(target_arch = "x86_64")]
pub(super) fn avx2_chunk_fn(ty: GgmlType, ks: super::KernelSet) -> ChunkFn {
    use crate::backend::cpu::lowbit::x86::{VNNI_EVEX, VNNI_NONE, VNNI_VEX};
    macro_rules! by_vnni {
        ($t:expr) => {
            match crate::backend::cpu::lowbit::vnni_form(ks) {
                VNNI_VEX => x86::chunk::<$t, VNNI_VEX>,
                VNNI_EVEX => x86::chunk::<$t, VNNI_EVEX>,
                _ => x86::chunk::<$t, VNNI_NONE>,
            }
        };
    }
    match ty {
        _ if zmm_kernels(ks) => match (ty, ks.prefetch) {
            (GgmlType::Q4_K, true) => avx512::chunk_512::<Q4K, true>,
            (GgmlType::Q4_K, false) => avx512::chunk_512::<Q4K, false>,
            (GgmlType::Q5_K, true) => avx512::chunk_512::<Q5K, true>,
            (GgmlType::Q5_K, false) => avx512::chunk_512::<Q5K, false>,
            (GgmlType::Q6_K, true) => avx512::chunk_512::<Q6K, true>,
            (GgmlType::Q6_K, false) => avx512::chunk_512::<Q6K, false>,
            _ => panic!("{} is not a K-quant type", ty.name()),
        },
        GgmlType::Q4_K => by_vnni!(Q4K),
        GgmlType::Q5_K => by_vnni!(Q5K),
        GgmlType::Q6_K => by_vnni!(Q6K),
        _ => panic!("{} is not a K-quant type", ty.name()),
    }
}

/// The many-input kernel of K-quant type `ty` under `ks`, where there is one: Q4_K, Q5_K and
/// Q6_K on AVX-512 VNNI (each super-block decoded once for a prompt's tokens).
#[cfg(target_arch = "x86_64")]
pub(super) fn avx2_many_fn(ty: GgmlType, ks: super::KernelSet) -> Option<super::ChunkManyFn> {
    if !zmm_kernels(ks) {
        return None;
    }
    Some(match (ty, ks.prefetch) {
        (GgmlType::Q4_K, true) => avx512::many_512::<Q4K, true>,
        (GgmlType::Q4_K, false) => avx512::many_512::<Q4K, false>,
        (GgmlType::Q5_K, true) => avx512::many_512::<Q5K, true>,
        (GgmlType::Q5_K, false) => avx512::many_512::<Q5K, false>,
        (GgmlType::Q6_K, true) => avx512::many_512::<Q6K, true>,
        (GgmlType::Q6_K, false) => avx512::many_512::<Q6K, false>,
        _ => return None,
    })
}

/// The NEON kernel of K-quant type `ty`. Panics for any other type.
#[cfg(target_arch = "aarch64")]
pub(super) fn neon_chunk_fn(ty: GgmlType) -> ChunkFn {
    match ty {
        GgmlType::Q4_K => neon::chunk::<Q4K>,
        GgmlType::Q5_K => neon::chunk::<Q5K>,
        GgmlType::Q6_K => neon::chunk::<Q6K>,
        _ => panic!("{} is not a K-quant type", ty.name()),
    }
}

// ---------------------------------------------------------------------------------------------
// Scalar kernels: the portable path, and the definition the AVX2 ones mirror.

pub(super) mod scalar {
    use super::*;

    pub(in crate::backend::cpu::matvec) fn chunk<const T: u8>(
        data: &[u8],
        row_bytes: usize,
        stride: usize,
        a: &Act,
        out: &mut [f32],
    ) {
        chunk_blocks(data, row_bytes, stride, a, out.len(), block_bytes(T));
        for (i, o) in out.iter_mut().enumerate() {
            let row = &data[i * stride..][..row_bytes];
            *o = match T {
                Q4K => dot_q45_k::<false>(row, a),
                Q5K => dot_q45_k::<true>(row, a),
                _ => dot_q6_k(row, a),
            };
        }
    }

    /// The int32 sum of `w(l) * y[l]` for l in `range`.
    #[inline(always)]
    fn idot(y: &[i8], range: std::ops::Range<usize>, w: impl Fn(usize) -> i32) -> i32 {
        range.map(|l| w(l) * y[l] as i32).sum()
    }

    /// Q4_K, or with `FIVE` Q5_K (the same but for the fifth bits).
    fn dot_q45_k<const FIVE: bool>(row: &[u8], a: &Act) -> f32 {
        let (bytes, qs_at) = if FIVE {
            (Q5K_BYTES, 48)
        } else {
            (Q4K_BYTES, 16)
        };
        let (mut acc, mut mins) = (0f32, 0f32);
        for (sb, blk) in row.chunks_exact(bytes).enumerate() {
            let (d, dmin) = (f16_to_f32(le16(blk, 0)), f16_to_f32(le16(blk, 2)));
            let (sc, m) = q4k_scales_mins(&blk[4..16]);
            for g in 0..GROUPS {
                let b = GROUPS * sb + g;
                // Groups 2k and 2k + 1 are the low and high nibbles of the same 32 bytes.
                let q = &blk[qs_at + 32 * (g / 2)..][..32];
                let shift = 4 * (g % 2);
                // Q5_K: bit g of byte l of the fifth bits is value l's.
                let qh = &blk[16..48];
                let i = idot(&a.qs[b * QK..][..QK], 0..QK, |l| {
                    let lo = (q[l] >> shift & 0xF) as i32;
                    if FIVE {
                        lo | ((qh[l] >> g & 1) as i32) << 4
                    } else {
                        lo
                    }
                });
                let (scg, mg) = ((sc >> (8 * g)) as u8, (m >> (8 * g)) as u8);
                acc += d * scg as f32 * a.d[b] * i as f32;
                mins += dmin * mg as f32 * a.s[b];
            }
        }
        acc - mins
    }

    fn dot_q6_k(row: &[u8], a: &Act) -> f32 {
        let mut acc = 0f32;
        for (sb, blk) in row.chunks_exact(Q6K_BYTES).enumerate() {
            let d = f16_to_f32(le16(blk, 208));
            for g in 0..GROUPS {
                let b = GROUPS * sb + g;
                // Half n of the block (4 groups) reads 64 bytes of low nibbles and 32 of high
                // bit pairs: group i of the half is nibble i / 2 of byte 32 * (i % 2) + l, and
                // bits 2i, 2i + 1 of byte l of the pairs.
                let (n, i) = (g / 4, g % 4);
                let ql = &blk[64 * n + 32 * (i % 2)..][..32];
                let qh = &blk[128 + 32 * n..][..32];
                let q = |l: usize| {
                    let lo = ql[l] >> (4 * (i / 2)) & 0xF;
                    let hi = qh[l] >> (2 * i) & 3;
                    (lo | hi << 4) as i32 - 32
                };
                let y = &a.qs[b * QK..][..QK];
                let sc = |h: usize| blk[192 + 8 * n + 2 * i + h] as i8 as i32;
                let isum = sc(0) * idot(y, 0..16, q) + sc(1) * idot(y, 16..32, q);
                acc += d * a.d[b] * isum as f32;
            }
        }
        acc
    }
}

// ---------------------------------------------------------------------------------------------
// AVX2 + FMA + F16C kernels: four rows at a time sharing each activation group.

#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use crate::backend::cpu::lowbit::x86::{dpbusd, offset_start, prefetch_lines};
    // The classic kernels' horizontal sum and f16 load.
    use crate::backend::cpu::kernel::x86::{f16_at, hsum};
    use std::arch::x86_64::*;

    /// How many rows ahead the four-row kernels prefetch (as the classic kernels do).
    const PF_ROWS: usize = 4;

    /// `T`'s rows four at a time, then the rest one by one. `V`: the VNNI form (`dpbusd`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn chunk<const T: u8, const V: u8>(
        data: &[u8],
        row_bytes: usize,
        stride: usize,
        a: &Act,
        out: &mut [f32],
    ) {
        let nsb = chunk_blocks(data, row_bytes, stride, a, out.len(), block_bytes(T));
        let base = data.as_ptr();
        let mut r = 0;
        while r + 4 <= out.len() {
            let rows = [0, 1, 2, 3].map(|k| base.add((r + k) * stride));
            // SAFETY: `chunk_blocks` checked that these rows and the input are whole.
            let pf = PF_ROWS * stride;
            let o = match T {
                Q4K => rows_q45_k::<V, 4, false>(rows, nsb, pf, a),
                Q5K => rows_q45_k::<V, 4, true>(rows, nsb, pf, a),
                _ => rows_q6_k::<V, 4>(rows, nsb, pf, a),
            };
            out[r..r + 4].copy_from_slice(&o);
            r += 4;
        }
        while r < out.len() {
            let row = [base.add(r * stride)];
            // SAFETY: as above.
            out[r] = match T {
                Q4K => rows_q45_k::<V, 1, false>(row, nsb, 0, a)[0],
                Q5K => rows_q45_k::<V, 1, true>(row, nsb, 0, a)[0],
                _ => rows_q6_k::<V, 1>(row, nsb, 0, a)[0],
            };
            r += 1;
        }
    }

    /// Input group `b`'s 32 int8 values.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn group(a: &Act, b: usize) -> __m256i {
        _mm256_loadu_si256(a.qs.as_ptr().add(b * QK).cast())
    }

    /// Hints the cache lines of the `bytes` at `p` (a block `pf` bytes on: rows to come).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prefetch(p: *const u8, bytes: usize) {
        // Past the end of the data these are harmless hints, never loads.
        prefetch_lines(p, bytes);
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(bytes - 1).cast());
    }

    /// `R` Q4_K rows (with `FIVE`, Q5_K rows) of `nsb` super-blocks against `a`. Unsafe: each
    /// row must hold `nsb` super-blocks and `a` cover them (`chunk_blocks`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn rows_q45_k<const V: u8, const R: usize, const FIVE: bool>(
        rows: [*const u8; R],
        nsb: usize,
        pf: usize,
        a: &Act,
    ) -> [f32; R] {
        let (bytes, qs_at) = if FIVE {
            (Q5K_BYTES, 48)
        } else {
            (Q4K_BYTES, 16)
        };
        let low = _mm256_set1_epi8(0x0F);
        let mut acc = [_mm256_setzero_ps(); R];
        let mut mins = [_mm256_setzero_ps(); R];
        // Row k's `d * sc_g * d_x` for the eight groups of the current super-block.
        let mut f = [[0f32; GROUPS]; R];
        for sb in 0..nsb {
            let dx = _mm256_loadu_ps(a.d.as_ptr().add(GROUPS * sb));
            let sx = _mm256_loadu_ps(a.s.as_ptr().add(GROUPS * sb));
            for k in 0..R {
                let p = rows[k].add(sb * bytes);
                if pf != 0 {
                    prefetch(p.wrapping_add(pf), bytes);
                }
                let (sc, m) = q4k_scales_mins(std::slice::from_raw_parts(p.add(4), 12));
                let bytes_ps =
                    |v: u64| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)));
                let dmin = _mm256_set1_ps(f16_at(p.add(2)));
                mins[k] = _mm256_fmadd_ps(_mm256_mul_ps(dmin, bytes_ps(m)), sx, mins[k]);
                let d = _mm256_set1_ps(f16_at(p));
                let fk = _mm256_mul_ps(_mm256_mul_ps(d, bytes_ps(sc)), dx);
                _mm256_storeu_ps(f[k].as_mut_ptr(), fk);
            }
            for j in 0..4 {
                let b = GROUPS * sb + 2 * j;
                let (y0, y1) = (group(a, b), group(a, b + 1));
                // Q5_K: the bits of groups 2j and 2j + 1 in each byte of the fifth bits.
                let (m0, m1) = (
                    _mm256_set1_epi8(1 << (2 * j)),
                    _mm256_set1_epi8(2 << (2 * j)),
                );
                for k in 0..R {
                    let p = rows[k].add(sb * bytes);
                    let q = _mm256_loadu_si256(p.add(qs_at + 32 * j).cast());
                    let mut lo = _mm256_and_si256(q, low);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), low);
                    if FIVE {
                        let qh = _mm256_loadu_si256(p.add(16).cast());
                        let sixteen = _mm256_set1_epi8(16);
                        let bit = |m: __m256i| {
                            let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, m), m);
                            _mm256_and_si256(set, sixteen)
                        };
                        lo = _mm256_or_si256(lo, bit(m0));
                        hi = _mm256_or_si256(hi, bit(m1));
                    }
                    // Values 0..31 are unsigned operands as they are: exact under `maddubs`.
                    let i0 = dpbusd::<V>(_mm256_setzero_si256(), lo, y0);
                    let i1 = dpbusd::<V>(_mm256_setzero_si256(), hi, y1);
                    let f0 = _mm256_set1_ps(f[k][2 * j]);
                    let f1 = _mm256_set1_ps(f[k][2 * j + 1]);
                    acc[k] = _mm256_fmadd_ps(f0, _mm256_cvtepi32_ps(i0), acc[k]);
                    acc[k] = _mm256_fmadd_ps(f1, _mm256_cvtepi32_ps(i1), acc[k]);
                }
            }
        }
        let mut out = [0f32; R];
        for k in 0..R {
            out[k] = hsum(acc[k]) - hsum(mins[k]);
        }
        out
    }

    /// Group `I` (0..4) of a Q6_K half-block as unsigned bytes 0..63: the low nibbles of `ql`
    /// (bytes `32 * (I % 2)..` of the half's 64, nibble `I / 2`) and bits 2I, 2I + 1 of `qh`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q6_group<const I: usize>(ql: *const u8, qh: __m256i) -> __m256i {
        let l = _mm256_loadu_si256(ql.add(32 * (I % 2)).cast());
        let l = if I < 2 { l } else { _mm256_srli_epi16::<4>(l) };
        let l = _mm256_and_si256(l, _mm256_set1_epi8(0x0F));
        // The pair to bits 4 and 5 (no bit crosses a byte: the mask keeps two).
        let h = match I {
            0 => _mm256_slli_epi16::<4>(qh),
            1 => _mm256_slli_epi16::<2>(qh),
            2 => qh,
            _ => _mm256_srli_epi16::<2>(qh),
        };
        _mm256_or_si256(l, _mm256_and_si256(h, _mm256_set1_epi8(0x30)))
    }

    /// `R` Q6_K rows of `nsb` super-blocks against `a`. Unsafe: as `rows_q45_k`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn rows_q6_k<const V: u8, const R: usize>(
        rows: [*const u8; R],
        nsb: usize,
        pf: usize,
        a: &Act,
    ) -> [f32; R] {
        let mut acc = [_mm256_setzero_ps(); R];
        // Row k's `d * sc_h * d_x` for the 16 halves of the current super-block: [k][n] holds
        // half-block n's eight (groups 4n..4n + 4, two halves each).
        let mut f = [[_mm256_setzero_ps(); 2]; R];
        // Which of those a group's eight int32 lanes take: lanes 0-3 its first 16 values.
        let pick = |i: i32| {
            _mm256_setr_epi32(
                2 * i,
                2 * i,
                2 * i,
                2 * i,
                2 * i + 1,
                2 * i + 1,
                2 * i + 1,
                2 * i + 1,
            )
        };
        let picks = [pick(0), pick(1), pick(2), pick(3)];
        for sb in 0..nsb {
            let dx = _mm256_loadu_ps(a.d.as_ptr().add(GROUPS * sb));
            let dx_halves = [
                _mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)),
                _mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7)),
            ];
            for k in 0..R {
                let p = rows[k].add(sb * Q6K_BYTES);
                if pf != 0 {
                    prefetch(p.wrapping_add(pf), Q6K_BYTES);
                }
                let d = _mm256_set1_ps(f16_at(p.add(208)));
                for n in 0..2 {
                    let sc = _mm_loadl_epi64(p.add(192 + 8 * n).cast());
                    let sc = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc));
                    f[k][n] = _mm256_mul_ps(_mm256_mul_ps(d, sc), dx_halves[n]);
                }
            }
            // The two half-blocks (an array, not a range: `n` indexes several things).
            for n in [0, 1] {
                macro_rules! one_group {
                    ($i:literal) => {{
                        let b = GROUPS * sb + 4 * n + $i;
                        let y = group(a, b);
                        // `-32 * y` summed per lane: the start that turns `q` into `q - 32`.
                        let start = offset_start::<5>(a, b);
                        for k in 0..R {
                            let p = rows[k].add(sb * Q6K_BYTES);
                            let qh = _mm256_loadu_si256(p.add(128 + 32 * n).cast());
                            let q = q6_group::<$i>(p.add(64 * n), qh);
                            // q <= 63: exact under `maddubs` too.
                            let i = dpbusd::<V>(start, q, y);
                            let fk = _mm256_permutevar8x32_ps(f[k][n], picks[$i]);
                            acc[k] = _mm256_fmadd_ps(fk, _mm256_cvtepi32_ps(i), acc[k]);
                        }
                    }};
                }
                one_group!(0);
                one_group!(1);
                one_group!(2);
                one_group!(3);
            }
        }
        let mut out = [0f32; R];
        for k in 0..R {
            out[k] = hsum(acc[k]);
        }
        out
    }
}

// ---------------------------------------------------------------------------------------------
// NEON kernels (aarch64): the scalar kernels with each group's int32 sum made 16 bytes at a time
// (`vmull_s8` + `vpadalq_s16`, exact), the float arithmetic theirs, in their order.

#[cfg(target_arch = "aarch64")]
mod neon {
    use super::*;
    use crate::backend::cpu::kernel::neon::mul_acc;
    use std::arch::aarch64::*;

    #[target_feature(enable = "neon")]
    pub(super) unsafe fn chunk<const T: u8>(
        data: &[u8],
        row_bytes: usize,
        stride: usize,
        a: &Act,
        out: &mut [f32],
    ) {
        chunk_blocks(data, row_bytes, stride, a, out.len(), block_bytes(T));
        for (i, o) in out.iter_mut().enumerate() {
            let row = &data[i * stride..][..row_bytes];
            *o = match T {
                Q4K => dot_q45_k::<false>(row, a),
                Q5K => dot_q45_k::<true>(row, a),
                _ => dot_q6_k(row, a),
            };
        }
    }

    /// The int32 dot of 16 signed weights with the 16 input values at `y`.
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn dot16(w: int8x16_t, y: *const i8) -> i32 {
        vaddvq_s32(mul_acc(vdupq_n_s32(0), w, vld1q_s8(y)))
    }

    /// `scalar::dot_q45_k`.
    #[target_feature(enable = "neon")]
    unsafe fn dot_q45_k<const FIVE: bool>(row: &[u8], a: &Act) -> f32 {
        let (bytes, qs_at) = if FIVE {
            (Q5K_BYTES, 48)
        } else {
            (Q4K_BYTES, 16)
        };
        let (mut acc, mut mins) = (0f32, 0f32);
        for (sb, blk) in row.chunks_exact(bytes).enumerate() {
            let (d, dmin) = (f16_to_f32(le16(blk, 0)), f16_to_f32(le16(blk, 2)));
            let (sc, m) = q4k_scales_mins(&blk[4..16]);
            let p = blk.as_ptr();
            for g in 0..GROUPS {
                let b = GROUPS * sb + g;
                let y = a.qs[b * QK..][..QK].as_ptr();
                let q = p.add(qs_at + 32 * (g / 2));
                let half = |h: usize| {
                    let v = vld1q_u8(q.add(16 * h));
                    let v = if g % 2 == 0 {
                        vandq_u8(v, vdupq_n_u8(0x0F))
                    } else {
                        vshrq_n_u8(v, 4)
                    };
                    let v = if FIVE {
                        let set = vtstq_u8(vld1q_u8(p.add(16 + 16 * h)), vdupq_n_u8(1 << g));
                        vorrq_u8(v, vandq_u8(set, vdupq_n_u8(16)))
                    } else {
                        v
                    };
                    vreinterpretq_s8_u8(v)
                };
                let i = dot16(half(0), y) + dot16(half(1), y.add(16));
                let (scg, mg) = ((sc >> (8 * g)) as u8, (m >> (8 * g)) as u8);
                acc += d * scg as f32 * a.d[b] * i as f32;
                mins += dmin * mg as f32 * a.s[b];
            }
        }
        acc - mins
    }

    /// `scalar::dot_q6_k`.
    #[target_feature(enable = "neon")]
    unsafe fn dot_q6_k(row: &[u8], a: &Act) -> f32 {
        let mut acc = 0f32;
        for (sb, blk) in row.chunks_exact(Q6K_BYTES).enumerate() {
            let d = f16_to_f32(le16(blk, 208));
            let p = blk.as_ptr();
            for g in 0..GROUPS {
                let b = GROUPS * sb + g;
                let y = a.qs[b * QK..][..QK].as_ptr();
                let (n, i) = (g / 4, g % 4);
                let (ql, qh) = (p.add(64 * n + 32 * (i % 2)), p.add(128 + 32 * n));
                // Bits 2i and 2i + 1 of the high pairs to bits 4 and 5 (a negative count
                // shifts right).
                let up = vdupq_n_s8(4 - 2 * i as i8);
                let half = |h: usize| {
                    let l = vld1q_u8(ql.add(16 * h));
                    let l = if i < 2 {
                        vandq_u8(l, vdupq_n_u8(0x0F))
                    } else {
                        vshrq_n_u8(l, 4)
                    };
                    let hi = vandq_u8(vshlq_u8(vld1q_u8(qh.add(16 * h)), up), vdupq_n_u8(0x30));
                    vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(l, hi)), vdupq_n_s8(32))
                };
                let sc = |h: usize| blk[192 + 8 * n + 2 * i + h] as i8 as i32;
                let isum = sc(0) * dot16(half(0), y) + sc(1) * dot16(half(1), y.add(16));
                acc += d * a.d[b] * isum as f32;
            }
        }
        acc
    }
}

#[cfg(test)]
mod tests;
