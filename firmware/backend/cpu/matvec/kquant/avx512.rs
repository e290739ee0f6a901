//! The AVX-512 VNNI K-quant kernels (Q4_K, Q6_K), one row at a time, read front to back.
//!
//! On an input in `ActScales::SuperBlock` form (one scale per 256 values: K-quant rows alone
//! read it) a super-block's groups add up in integers under its one scale, llama.cpp's
//! K-quant x Q8_K arithmetic (`row_q45_k_512`, `row_q6_k_512`); on the classic form (a scale
//! per 32 values: the input is shared with classic rows, or the `k-block-scales` ablation)
//! each group's int32 sum is scaled in floats (`row_q4_k_512_blocks`, `row_q6_k_512_blocks`).

use super::*;
use crate::backend::cpu::lowbit::x86::{prefetch_ahead, VNNI_EVEX};
// The classic kernels' horizontal sum and f16 load.
use crate::backend::cpu::kernel::x86::{f16_at, hsum};
use crate::backend::cpu::kernel::MAX_INPUTS;
use std::arch::x86_64::*;

/// Q4_K, Q5_K or Q6_K rows (`T`) on AVX-512 VNNI, one row at a time (`row_q45_k_512`,
/// `row_q6_k_512`) on an input whose 256-value runs share one scale (`ActScales::SuperBlock`,
/// marked by its sums of 16, `hs`), `row_q4_k_512_blocks` and `row_q6_k_512_blocks` on any
/// other (Q5_K: the ymm kernel).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn chunk_512<const T: u8, const PF: bool>(
    data: &[u8],
    row_bytes: usize,
    stride: usize,
    a: &Act,
    out: &mut [f32],
) {
    let nsb = chunk_blocks(data, row_bytes, stride, a, out.len(), block_bytes(T));
    let one_scale = !a.hs.is_empty();
    if T == Q5K && !one_scale {
        // No per-32 zmm kernel for Q5_K: the ymm one, four rows at a time.
        return super::x86::chunk::<Q5K, VNNI_EVEX>(data, row_bytes, stride, a, out);
    }
    let base = data.as_ptr();
    for (r, o) in out.iter_mut().enumerate() {
        // SAFETY: `chunk_blocks` checked that the rows and the input are whole, and (the
        // one-scale form) the input has its sums of 16.
        let row = base.add(r * stride);
        *o = match (T, one_scale) {
            (Q4K, true) => row_q45_k_512::<false, PF>(row, nsb, a),
            (Q4K, false) => row_q4_k_512_blocks::<PF>(row, nsb, a),
            // The one-scale form (checked above).
            (Q5K, _) => row_q45_k_512::<true, PF>(row, nsb, a),
            (_, true) => row_q6_k_512::<PF>(row, nsb, a),
            (_, false) => row_q6_k_512_blocks::<PF>(row, nsb, a),
        };
    }
}

/// Word lanes taking 16-bit value `lo` (first half) and `hi` (second half).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn halves16(lo: i16, hi: i16) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi16(lo)),
        _mm256_set1_epi16(hi),
    )
}

/// A Q4_K or Q5_K super-block's weights as the one-scale kernels read them: group pair j's
/// 64 values (`w[j]`: 2j in the first half, 2j + 1 in the second), each pair's scales per word
/// lane (`s[j]`), the mins as eight int32 lanes, and the f16 `d`, `dmin` as floats.
struct Q45Block {
    w: [__m512i; 4],
    s: [__m512i; 4],
    m: __m256i,
    dd: __m128,
}

/// The registers of constants `q45_block` reads, made once per call.
struct Q45Consts {
    low: __m512i,
    /// Low nibbles in the register's first half, high ones in its second.
    nibble_shift: __m512i,
    /// Group pair j's word lanes take scale 2j (first half) and 2j + 1.
    picks: [__m512i; 4],
    /// Group pair j's fifth bits: bit 2j of each byte (first half), 2j + 1 (second half).
    fifth: [__m512i; 4],
    sixteen: __m512i,
}

impl Q45Consts {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn new() -> Q45Consts {
        Q45Consts {
            low: _mm512_set1_epi8(0x0F),
            nibble_shift: halves16(0, 4),
            picks: [
                halves16(0, 1),
                halves16(2, 3),
                halves16(4, 5),
                halves16(6, 7),
            ],
            fifth: [
                halves16(0x0101, 0x0202),
                halves16(0x0404, 0x0808),
                halves16(0x1010, 0x2020),
                halves16(0x4040, 0x8080u16 as i16),
            ],
            sixteen: _mm512_set1_epi8(16),
        }
    }
}

/// Decodes the Q4_K (or Q5_K, `FIVE`) super-block at `q`: each 32 bytes of nibbles, loaded into
/// both register halves, are groups 2j (low nibbles) and 2j + 1 (high nibbles) after one
/// variable shift (Q5_K: plus 16 where bit 2j, or 2j + 1, of the value's byte of fifth bits is
/// set: a bit test and a masked add). Unsafe: `q` must hold a whole super-block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q45_block<const FIVE: bool>(q: *const u8, c: &Q45Consts) -> Q45Block {
    // The nibbles follow Q5_K's 32 bytes of fifth bits.
    let nibbles = if FIVE { 48 } else { 16 };
    let (sc, m) = q4k_scales_mins(std::slice::from_raw_parts(q.add(4), 12));
    // Lanes past the eighth are never picked.
    let sc16 = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
    let qh = if FIVE {
        _mm512_broadcast_i64x4(_mm256_loadu_si256(q.add(16).cast()))
    } else {
        _mm512_setzero_si512()
    };
    let mut blk = Q45Block {
        w: [_mm512_setzero_si512(); 4],
        s: [_mm512_setzero_si512(); 4],
        m: _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(m as i64)),
        dd: _mm_cvtph_ps(_mm_cvtsi32_si128(q.cast::<i32>().read_unaligned())),
    };
    for j in 0..4 {
        let nib = _mm512_broadcast_i64x4(_mm256_loadu_si256(q.add(nibbles + 32 * j).cast()));
        let w = _mm512_and_si512(_mm512_srlv_epi16(nib, c.nibble_shift), c.low);
        blk.w[j] = if FIVE {
            let set = _mm512_test_epi8_mask(qh, c.fifth[j]);
            _mm512_mask_add_epi8(w, set, w, c.sixteen)
        } else {
            w
        };
        blk.s[j] = _mm512_permutexvar_epi16(c.picks[j], sc16);
    }
    blk
}

/// Adds super-block `sb` (`blk`) dotted with input `a` to `acc` and `mins`: the byte products
/// in pairs (`vpmaddubsw`, at most 2 * 31 * 127: exact in int16), in pairs again times the
/// group's 6-bit scale (`vpdpwssd`), so the eight groups add up in integers under one
/// `d * d_x`; the mins' term, `dmin * d_x * sum_g m_g * sum(q_x over g)`, is integers too.
/// Unsafe: `a` must cover super-block `sb` with one scale.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q45_add(blk: &Q45Block, a: &Act, sb: usize, acc: &mut __m512, mins: &mut __m256) {
    // `d * d_x` and `dmin * d_x`.
    let dd = _mm_mul_ps(blk.dd, _mm_set1_ps(*a.d.get_unchecked(GROUPS * sb)));
    let mut isum = _mm512_setzero_si512();
    for j in 0..4 {
        let y = _mm512_loadu_si512(a.qs.as_ptr().add((GROUPS * sb + 2 * j) * QK).cast());
        // Values 0..31 are unsigned operands as they are.
        let pairs = _mm512_maddubs_epi16(blk.w[j], y);
        isum = _mm512_dpwssd_epi32(isum, pairs, blk.s[j]);
    }
    *acc = _mm512_fmadd_ps(_mm512_broadcastss_ps(dd), _mm512_cvtepi32_ps(isum), *acc);
    // `gs` holds minus each group's sum: these are the mins' products, negated.
    let gs = _mm256_loadu_si256(a.gs.as_ptr().add(GROUPS * sb).cast());
    let dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(dd));
    let neg = _mm256_cvtepi32_ps(_mm256_mullo_epi32(blk.m, gs));
    *mins = _mm256_fmadd_ps(dmin, neg, *mins);
}

/// One Q4_K row (or Q5_K, `FIVE`) of `nsb` super-blocks on an input with one scale per
/// super-block, llama.cpp's Q4_K/Q5_K x Q8_K arithmetic (`q45_block`, `q45_add`). Read front
/// to back as `row_q6_k_512` says why.
/// Unsafe: the row must hold `nsb` super-blocks and `a` cover them with one scale each.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn row_q45_k_512<const FIVE: bool, const PF: bool>(
    p: *const u8,
    nsb: usize,
    a: &Act,
) -> f32 {
    let bytes = if FIVE { Q5K_BYTES } else { Q4K_BYTES };
    let c = Q45Consts::new();
    let (mut acc, mut mins) = (_mm512_setzero_ps(), _mm256_setzero_ps());
    for sb in 0..nsb {
        let q = p.add(sb * bytes);
        if PF {
            prefetch_ahead(q, bytes);
        }
        q45_add(&q45_block::<FIVE>(q, &c), a, sb, &mut acc, &mut mins);
    }
    _mm512_reduce_add_ps(acc) + hsum(mins)
}

/// Q4_K, Q5_K or Q6_K rows (`T`) against several inputs (a prompt's tokens): each super-block
/// is decoded once (`q45_block`, `q6_block`) and added to every input's sums (`q45_add`,
/// `q6_add`), each input's in the order the row kernel adds them, so each output is that
/// kernel's bit for bit. On inputs
/// not all in the one-scale form, `chunk_512` once per input. Writes
/// `out[i * out_stride + r]` for input `i` and row `r < rows`.
/// Unsafe: the rows must be whole (`rows` of `row_bytes`, `stride` apart in `data`), the inputs
/// must cover their columns, and `out` must hold those outputs.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn many_512<const T: u8, const PF: bool>(
    data: &[u8],
    row_bytes: usize,
    stride: usize,
    acts: &[Act],
    out: *mut f32,
    out_stride: usize,
    rows: usize,
) {
    let n = acts.len();
    assert!(n <= MAX_INPUTS, "{n} inputs (at most {MAX_INPUTS})");
    if acts.iter().any(|a| a.hs.is_empty()) {
        for (i, a) in acts.iter().enumerate() {
            // SAFETY: the caller's: input i's outputs are `rows` values from `i * out_stride`.
            let o = std::slice::from_raw_parts_mut(out.add(i * out_stride), rows);
            chunk_512::<T, PF>(data, row_bytes, stride, a, o);
        }
        return;
    }
    let mut nsb = 0;
    for a in acts {
        nsb = chunk_blocks(data, row_bytes, stride, a, rows, block_bytes(T));
    }
    if T == Q6K {
        let c = Q6Consts::new();
        let mut acc = [_mm512_setzero_ps(); MAX_INPUTS];
        for r in 0..rows {
            // SAFETY: `chunk_blocks` checked that the rows and the inputs are whole.
            let p = data.as_ptr().add(r * stride);
            acc[..n].fill(_mm512_setzero_ps());
            for sb in 0..nsb {
                let q = p.add(sb * Q6K_BYTES);
                if PF {
                    prefetch_ahead(q, Q6K_BYTES);
                }
                let blk = q6_block(q, &c);
                for (i, a) in acts.iter().enumerate() {
                    q6_add(&blk, a, sb, &mut acc[i]);
                }
            }
            for (i, acc) in acc[..n].iter().enumerate() {
                *out.add(i * out_stride + r) = _mm512_reduce_add_ps(*acc);
            }
        }
        return;
    }
    let c = Q45Consts::new();
    let bytes = block_bytes(T);
    let mut acc = [_mm512_setzero_ps(); MAX_INPUTS];
    let mut mins = [_mm256_setzero_ps(); MAX_INPUTS];
    for r in 0..rows {
        // SAFETY: `chunk_blocks` checked that the rows and the inputs are whole.
        let p = data.as_ptr().add(r * stride);
        acc[..n].fill(_mm512_setzero_ps());
        mins[..n].fill(_mm256_setzero_ps());
        for sb in 0..nsb {
            let q = p.add(sb * bytes);
            if PF {
                prefetch_ahead(q, bytes);
            }
            let blk = if T == Q5K {
                q45_block::<true>(q, &c)
            } else {
                q45_block::<false>(q, &c)
            };
            for (i, a) in acts.iter().enumerate() {
                q45_add(&blk, a, sb, &mut acc[i], &mut mins[i]);
            }
        }
        for i in 0..n {
            *out.add(i * out_stride + r) = _mm512_reduce_add_ps(acc[i]) + hsum(mins[i]);
        }
    }
}

/// A Q6_K super-block as the one-scale kernel reads it: per half n, groups 0 and 1 (`q[2n]`)
/// and 2 and 3 (`q[2n + 1]`) as 64 values 0..63, their scales per word lane (`s`), the 16
/// scales as words (`sc`) and the f16 `d` as a float.
struct Q6Block {
    q: [__m512i; 4],
    s: [__m512i; 4],
    sc: __m256i,
    d: f32,
}

/// The registers of constants `q6_block` reads, made once per call.
struct Q6Consts {
    low: __m512i,
    two_bits: __m512i,
    /// Bits 2I, 2I + 1 of `qh` to bits 4, 5: left by 4 and 2 for groups 0 and 1 (the
    /// register's halves), right by 0 and 2 for groups 2 and 3.
    left01: __m512i,
    right23: __m512i,
    /// A register's 64 values are four runs of 16: word lanes 8k..8k + 8 take scale s + k.
    picks: [__m512i; 4],
}

impl Q6Consts {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn new() -> Q6Consts {
        let runs = |s: i32| {
            let w = |k: i32| (s + k) * 0x1_0001;
            let (a, b, c, d) = (w(0), w(1), w(2), w(3));
            _mm512_setr_epi32(a, a, a, a, b, b, b, b, c, c, c, c, d, d, d, d)
        };
        Q6Consts {
            low: _mm512_set1_epi8(0x0F),
            two_bits: _mm512_set1_epi8(0x30),
            left01: halves16(4, 2),
            right23: halves16(0, 2),
            picks: [runs(0), runs(4), runs(8), runs(12)],
        }
    }
}

/// Decodes the Q6_K super-block at `q`: a half-block's 64 bytes of low nibbles are groups 0
/// and 1 (low nibbles) and 2 and 3 (high nibbles), and its 32 bytes of high bit pairs, loaded
/// into both register halves, give each group its two bits by one variable shift.
/// Unsafe: `q` must hold a whole super-block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6_block(q: *const u8, c: &Q6Consts) -> Q6Block {
    let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(q.add(192).cast()));
    let sc512 = _mm512_castsi256_si512(sc);
    let mut blk = Q6Block {
        q: [_mm512_setzero_si512(); 4],
        s: [_mm512_setzero_si512(); 4],
        sc,
        d: f16_at(q.add(208)),
    };
    for n in 0..2 {
        let ql = _mm512_loadu_si512(q.add(64 * n).cast());
        let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(q.add(128 + 32 * n).cast()));
        blk.q[2 * n] = _mm512_or_si512(
            _mm512_and_si512(ql, c.low),
            _mm512_and_si512(_mm512_sllv_epi16(qh, c.left01), c.two_bits),
        );
        blk.q[2 * n + 1] = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16::<4>(ql), c.low),
            _mm512_and_si512(_mm512_srlv_epi16(qh, c.right23), c.two_bits),
        );
        blk.s[2 * n] = _mm512_permutexvar_epi16(c.picks[2 * n], sc512);
        blk.s[2 * n + 1] = _mm512_permutexvar_epi16(c.picks[2 * n + 1], sc512);
    }
    blk
}

/// Adds super-block `sb` (`blk`) dotted with input `a` to `acc`: products added in pairs
/// (`vpmaddubsw`, q <= 63: at most 2 * 63 * 127, exact in int16), then in pairs times each 16
/// values' int8 scale (`vpdpwssd`); the `- 32` of every weight is `-32 * sum_h sc_h *
/// sum(q_x over h)`, from the input's sums of 16 (`hs`), so a super-block adds up in integers
/// under its one `d * d_x`. Unsafe: `a` must cover super-block `sb` with one scale.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6_add(blk: &Q6Block, a: &Act, sb: usize, acc: &mut __m512) {
    let d = blk.d * *a.d.get_unchecked(GROUPS * sb);
    // `hs` holds minus the sums of 16: `32 * sum_h sc_h * (-sum_h)` starts the lanes.
    let hs = _mm256_loadu_si256(a.hs.as_ptr().add(16 * sb).cast());
    let start = _mm256_slli_epi32::<5>(_mm256_madd_epi16(blk.sc, hs));
    let mut isum = _mm512_zextsi256_si512(start);
    for k in 0..4 {
        let y = _mm512_loadu_si512(a.qs.as_ptr().add((GROUPS * sb + 2 * k) * QK).cast());
        // q <= 63: unsigned operands as they are.
        isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(blk.q[k], y), blk.s[k]);
    }
    *acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(isum), *acc);
}

/// One Q6_K row of `nsb` super-blocks on an input with one scale per super-block, llama.cpp's
/// Q6_K x Q8_K arithmetic (`q6_block`, `q6_add`). The row is read front to back: decode
/// streams the output head from DRAM, and rows taken four at a time (each 1,260 bytes at 1,536
/// columns) are four streams too short for the hardware prefetcher.
/// Unsafe: the row must hold `nsb` super-blocks and `a` cover them with one scale each.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn row_q6_k_512<const PF: bool>(p: *const u8, nsb: usize, a: &Act) -> f32 {
    let c = Q6Consts::new();
    let mut acc = _mm512_setzero_ps();
    for sb in 0..nsb {
        let q = p.add(sb * Q6K_BYTES);
        if PF {
            prefetch_ahead(q, Q6K_BYTES);
        }
        q6_add(&q6_block(q, &c), a, sb, &mut acc);
    }
    _mm512_reduce_add_ps(acc)
}

/// One Q4_K row of `nsb` super-blocks, two groups of 32 per zmm register: each 32 bytes
/// of nibbles, loaded into both register halves, are groups 2j (low nibbles) and 2j + 1
/// (high nibbles) after one variable shift, meeting 64 contiguous input bytes. The same
/// int32 sums per group as `rows_q45_k`, read front to back as `row_q6_k_512` says why;
/// the floats are added in another order (within rounding of the scalar kernel).
/// Unsafe: the row must hold `nsb` super-blocks and `a` cover them.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn row_q4_k_512_blocks<const PF: bool>(p: *const u8, nsb: usize, a: &Act) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 2];
    let mut mins = _mm256_setzero_ps();
    let low = _mm512_set1_epi8(0x0F);
    // Low nibbles in the register's first half, high ones in its second.
    let nibble_shift = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(4));
    // Group pair j's lanes take `d * sc * d_x` 2j (first eight) and 2j + 1.
    let pair = |j: i32| {
        let (a, b) = (_mm256_set1_epi32(2 * j), _mm256_set1_epi32(2 * j + 1));
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
    };
    let picks = [pair(0), pair(1), pair(2), pair(3)];
    let bytes_ps = |v: u64| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(v as i64)));
    for sb in 0..nsb {
        let q = p.add(sb * Q4K_BYTES);
        if PF {
            prefetch_ahead(q, Q4K_BYTES);
        }
        let dx = _mm256_loadu_ps(a.d.as_ptr().add(GROUPS * sb));
        let sx = _mm256_loadu_ps(a.s.as_ptr().add(GROUPS * sb));
        let (sc, m) = q4k_scales_mins(std::slice::from_raw_parts(q.add(4), 12));
        let dmin = _mm256_set1_ps(f16_at(q.add(2)));
        mins = _mm256_fmadd_ps(_mm256_mul_ps(dmin, bytes_ps(m)), sx, mins);
        let d = _mm256_set1_ps(f16_at(q));
        let f = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_mul_ps(d, bytes_ps(sc)), dx));
        for (j, pick) in picks.iter().enumerate() {
            let nib = _mm512_broadcast_i64x4(_mm256_loadu_si256(q.add(16 + 32 * j).cast()));
            let w = _mm512_and_si512(_mm512_srlv_epi16(nib, nibble_shift), low);
            let y = _mm512_loadu_si512(a.qs.as_ptr().add((GROUPS * sb + 2 * j) * QK).cast());
            // Values 0..15 are unsigned operands as they are.
            let i = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, y);
            let fj = _mm512_permutexvar_ps(*pick, f);
            acc[j % 2] = _mm512_fmadd_ps(fj, _mm512_cvtepi32_ps(i), acc[j % 2]);
        }
    }
    let m8 = _mm256_add_ps(mins, _mm256_permute2f128_ps::<1>(mins, mins));
    let m4 = _mm256_castps256_ps128(m8);
    let m2 = _mm_add_ps(m4, _mm_movehl_ps(m4, m4));
    let m1 = _mm_add_ss(m2, _mm_shuffle_ps::<1>(m2, m2));
    _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1])) - _mm_cvtss_f32(m1)
}

/// One Q6_K row of `nsb` super-blocks, two groups of 32 per zmm register: a half-block's
/// 64 bytes of low nibbles are groups 0 and 1 (low nibbles) and 2 and 3 (high nibbles),
/// each pair meeting 64 contiguous input bytes, and its 32 bytes of high bit pairs,
/// loaded into both register halves, give each group its two bits by one variable shift.
/// The same int32 sums per group of 16 as `rows_q6_k`, in half its instructions, and the
/// row read front to back: decode streams the output head from DRAM, and rows taken four
/// at a time (each 1,260 bytes at 1,536 columns) are four streams too short for the
/// hardware prefetcher. Four accumulators (half-block, group pair) keep the adds apart;
/// the floats are added in another order than the scalar kernel (within its rounding).
/// Unsafe: the row must hold `nsb` super-blocks and `a` cover them.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn row_q6_k_512_blocks<const PF: bool>(p: *const u8, nsb: usize, a: &Act) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 4];
    let low = _mm512_set1_epi8(0x0F);
    let two_bits = _mm512_set1_epi8(0x30);
    // Bits 2I, 2I + 1 of `qh` to bits 4, 5: left by 4 and 2 for groups 0 and 1 (the
    // register's halves), right by 0 and 2 for groups 2 and 3.
    let half_shift = |lo: i16, hi: i16| {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set1_epi16(lo)),
            _mm256_set1_epi16(hi),
        )
    };
    let (left01, right23) = (half_shift(4, 2), half_shift(0, 2));
    // A group pair's int32 lanes take `d * sc * d_x` 0-3 (groups 0, 1) or 4-7 (groups 2,
    // 3) of the half's eight: four lanes (16 values) each.
    let lane_scale = |j: i32| {
        _mm512_setr_epi32(
            j,
            j,
            j,
            j,
            j + 1,
            j + 1,
            j + 1,
            j + 1,
            j + 2,
            j + 2,
            j + 2,
            j + 2,
            j + 3,
            j + 3,
            j + 3,
            j + 3,
        )
    };
    let (pick01, pick23) = (lane_scale(0), lane_scale(4));
    // Input group g's 8 scales, each twice (its two halves of 16), as `rows_q6_k`.
    let dx_pairs = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    for sb in 0..nsb {
        let q = p.add(sb * Q6K_BYTES);
        if PF {
            prefetch_ahead(q, Q6K_BYTES);
        }
        let dx = _mm512_permutexvar_ps(
            dx_pairs,
            _mm512_castps256_ps512(_mm256_loadu_ps(a.d.as_ptr().add(GROUPS * sb))),
        );
        let d = _mm512_set1_ps(f16_at(q.add(208)));
        let sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q.add(192).cast())));
        // `d * sc_j * d_x` for the 16 groups of 16, half-block n's at 8n..8n + 8.
        let f = _mm512_mul_ps(_mm512_mul_ps(d, sc), dx);
        for n in 0..2 {
            let b = GROUPS * sb + 4 * n;
            let y01 = _mm512_loadu_si512(a.qs.as_ptr().add(b * QK).cast());
            let y23 = _mm512_loadu_si512(a.qs.as_ptr().add((b + 2) * QK).cast());
            // `-32 * y` summed per lane (`offset_start`): the start that makes `q` `q - 32`.
            let start = |g: usize| {
                _mm512_slli_epi32::<5>(_mm512_loadu_si512(a.ls.as_ptr().add(8 * g).cast()))
            };
            let ql = _mm512_loadu_si512(q.add(64 * n).cast());
            let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(q.add(128 + 32 * n).cast()));
            let q01 = _mm512_or_si512(
                _mm512_and_si512(ql, low),
                _mm512_and_si512(_mm512_sllv_epi16(qh, left01), two_bits),
            );
            let q23 = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low),
                _mm512_and_si512(_mm512_srlv_epi16(qh, right23), two_bits),
            );
            // q <= 63: unsigned operands as they are.
            let i01 = _mm512_dpbusd_epi32(start(b), q01, y01);
            let i23 = _mm512_dpbusd_epi32(start(b + 2), q23, y23);
            let off = _mm512_set1_epi32(8 * n as i32);
            let f01 = _mm512_permutexvar_ps(_mm512_add_epi32(pick01, off), f);
            let f23 = _mm512_permutexvar_ps(_mm512_add_epi32(pick23, off), f);
            acc[2 * n] = _mm512_fmadd_ps(f01, _mm512_cvtepi32_ps(i01), acc[2 * n]);
            acc[2 * n + 1] = _mm512_fmadd_ps(f23, _mm512_cvtepi32_ps(i23), acc[2 * n + 1]);
        }
    }
    let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    _mm512_reduce_add_ps(sum)
}
