//! Integer-native CPU kernels for w8 and w4 matrices (formats in `crate::quant`): each group of 32
//! weights is unpacked to int8 and dotted with the int8 activations into an exact int32
//! (int8 x int8 -> int32), and only then dequantized, once per group, in an f32 epilogue that is
//! the same in every kernel: `acc += (d_w * d_x) * (i as f32)`, groups in order, no fused
//! multiply-add. So the scalar and AVX2 kernels, and all three w4 packings, give bit-identical
//! results.
//!
//! Kernels: AVX2 (x86-64, `maddubs`/`madd` with the sign trick, four rows at a time sharing each
//! activation group, one horizontal add per group for four rows; where the CPU has VNNI, one
//! `vpdpbusd` replaces the `maddubs`+`madd` pair: AVX-VNNI's VEX form, else AVX512-VNNI's EVEX
//! form on the same 256-bit registers) and NEON (aarch64: `sdot` where the core has the
//! dot-product extension, `smull`/`sadalp` otherwise), chosen at run time by
//! `backend::cpu::matvec`; the scalar code is the definition and the fallback. `vpdpbusd` and
//! `maddubs`+`madd` give the same int32 lanes (the sign trick's products are at most 128 x 127,
//! so `maddubs` never saturates), so every variant is bit-identical to the scalar kernel. The
//! NEON kernels are built and tested here under qemu (`scripts/test-aarch64.sh`); the VNNI ones
//! where the CPU has it (the GPU machine's Xeon; the developer VM has none).

use super::kernel::{Act, Kernel, KernelSet, QChunkFn as ChunkFn, QChunkManyFn as ChunkManyFn};
use crate::model::ggml::f16_to_f32;
use crate::quant::{Packing, QFormat, GROUP, SWIZZLE_ROWS, SWIZZLE_TILE_BYTES, W4_GROUP_BYTES};

/// Register byte `i` of an unpacked lane-interleaved group holds element `PERM[i]`: the low
/// nibbles of the four words (elements 0-3, 8-11, 16-19, 24-27), then the high nibbles.
pub const PERM: [usize; GROUP] = {
    let mut p = [0usize; GROUP];
    let mut i = 0;
    while i < 16 {
        let (k, b) = (i / 4, i % 4);
        p[i] = 8 * k + b;
        p[16 + i] = 8 * k + 4 + b;
        i += 1;
    }
    p
};

/// The activation groups in `PERM` order, made once per matrix-vector call.
pub fn permute_act(qs: &[i8], qp: &mut [i8]) {
    for (src, dst) in qs.chunks_exact(GROUP).zip(qp.chunks_exact_mut(GROUP)) {
        for (d, &p) in dst.iter_mut().zip(PERM.iter()) {
            *d = src[p];
        }
    }
}

/// The kernel of `f` under `ks`.
pub(crate) fn chunk_fn(f: QFormat, ks: KernelSet) -> ChunkFn {
    let k = ks.kernel;
    #[cfg(target_arch = "x86_64")]
    if k == Kernel::Avx2 && !ks.deferred_dequant {
        return match f {
            QFormat::W8 => x86::chunk_eager::<FMT_W8>,
            QFormat::W4(Packing::Contiguous) => x86::chunk_eager::<FMT_W4C>,
            QFormat::W4(Packing::Interleaved) => x86::chunk_eager::<FMT_W4I>,
            QFormat::W4(Packing::Swizzled) => x86::chunk_eager::<FMT_W4S>,
        };
    }
    #[cfg(target_arch = "x86_64")]
    if k == Kernel::Avx2 {
        return match vnni_form(ks) {
            x86::VNNI_VEX => x86::chunk_for::<{ x86::VNNI_VEX }>(f, ks.avx512, ks.prefetch),
            x86::VNNI_EVEX => x86::chunk_for::<{ x86::VNNI_EVEX }>(f, ks.avx512, ks.prefetch),
            _ => x86::chunk_for::<{ x86::VNNI_NONE }>(f, ks.avx512, ks.prefetch),
        };
    }
    #[cfg(target_arch = "aarch64")]
    if k == Kernel::Neon {
        return match (f, neon::has_dotprod()) {
            (QFormat::W8, true) => neon::chunk_sdot::<FMT_W8>,
            (QFormat::W4(Packing::Contiguous), true) => neon::chunk_sdot::<FMT_W4C>,
            (QFormat::W4(Packing::Interleaved), true) => neon::chunk_sdot::<FMT_W4I>,
            (QFormat::W4(Packing::Swizzled), true) => neon::chunk_swizzled_sdot,
            (QFormat::W8, false) => neon::chunk_mull::<FMT_W8>,
            (QFormat::W4(Packing::Contiguous), false) => neon::chunk_mull::<FMT_W4C>,
            (QFormat::W4(Packing::Interleaved), false) => neon::chunk_mull::<FMT_W4I>,
            (QFormat::W4(Packing::Swizzled), false) => neon::chunk_mull::<FMT_W4S>,
        };
    }
    let _ = k;
    match f {
        QFormat::W8 => scalar_chunk::<FMT_W8>,
        QFormat::W4(Packing::Contiguous) => scalar_chunk::<FMT_W4C>,
        QFormat::W4(Packing::Interleaved) => scalar_chunk::<FMT_W4I>,
        QFormat::W4(Packing::Swizzled) => scalar_chunk::<FMT_W4S>,
    }
}

/// The VNNI form the x86 integer kernels use: what this CPU has, unless `ks` turns VNNI off
/// (the `no-vnni` ablation). Shared with the classic GGML kernels (`backend::cpu::matvec`).
#[cfg(target_arch = "x86_64")]
pub(crate) fn vnni_form(ks: KernelSet) -> u8 {
    if ks.vnni {
        x86::vnni()
    } else {
        x86::VNNI_NONE
    }
}

/// The many-input kernel of `f` under `k`, where there is one (AVX2 with deferred
/// dequantization); elsewhere the caller runs `chunk_fn` once per input.
pub(crate) fn chunk_many_fn(f: QFormat, ks: KernelSet) -> Option<ChunkManyFn> {
    #[cfg(target_arch = "x86_64")]
    if ks.kernel == Kernel::Avx2 && ks.deferred_dequant {
        return Some(match vnni_form(ks) {
            x86::VNNI_VEX => x86::chunk_many_for::<{ x86::VNNI_VEX }>(f, ks.avx512),
            x86::VNNI_EVEX => x86::chunk_many_for::<{ x86::VNNI_EVEX }>(f, ks.avx512),
            _ => x86::chunk_many_for::<{ x86::VNNI_NONE }>(f, ks.avx512),
        });
    }
    let _ = (f, ks);
    None
}

const FMT_W8: u8 = 0;
const FMT_W4C: u8 = 1;
const FMT_W4I: u8 = 2;
const FMT_W4S: u8 = 3;

/// Groups of 32 in a row of `row_bytes` of format `F`.
#[inline(always)]
fn groups<const F: u8>(row_bytes: usize) -> usize {
    row_bytes / group_bytes::<F>()
}

/// Bytes of one group of 32 weights with its scale in format `F`.
#[inline(always)]
const fn group_bytes<const F: u8>() -> usize {
    if F == FMT_W8 {
        34
    } else {
        W4_GROUP_BYTES
    }
}

/// The activations a kernel of format `F` reads: the permuted copy for the lane-interleaved w4
/// packings (their weights unpack in `PERM` order), the natural ones otherwise.
#[inline(always)]
fn activations<'a, const F: u8>(a: &Act<'a>) -> &'a [i8] {
    if F == FMT_W4I || F == FMT_W4S {
        a.qp
    } else {
        a.qs
    }
}

/// Byte offset of group `g` of (band- or chunk-local) row `r`, its scale and quant words.
#[inline(always)]
fn group_at<const F: u8>(row_bytes: usize, r: usize, g: usize) -> (usize, [usize; 4]) {
    match F {
        FMT_W8 => {
            let b = r * row_bytes + g * 34;
            (b, [b + 2, b + 10, b + 18, b + 26])
        }
        FMT_W4S => {
            let ng = row_bytes / W4_GROUP_BYTES;
            let (band, lane) = (r / SWIZZLE_ROWS, r % SWIZZLE_ROWS);
            let t = (band * ng + g) * SWIZZLE_TILE_BYTES;
            let w = t + 64 + 4 * lane;
            (t + 2 * lane, [w, w + 128, w + 256, w + 384])
        }
        _ => {
            let b = r * row_bytes + g * W4_GROUP_BYTES;
            (b, [b + 2, b + 6, b + 10, b + 14])
        }
    }
}

/// The 32 int8 weights of a group in natural order (the scalar definition of every format).
#[inline(always)]
fn unpack_natural<const F: u8>(data: &[u8], w: [usize; 4]) -> [i8; GROUP] {
    let mut q = [0i8; GROUP];
    for k in 0..4 {
        for b in 0..4 {
            let byte = data[w[k] + b];
            match F {
                FMT_W8 => {
                    // The w8 "words" are 8 bytes apart; take all 8 of each.
                    q[8 * k + b] = byte as i8;
                    q[8 * k + 4 + b] = data[w[k] + 4 + b] as i8;
                }
                FMT_W4C => {
                    let j = 4 * k + b;
                    q[2 * j] = (byte & 0xF) as i8 - 8;
                    q[2 * j + 1] = (byte >> 4) as i8 - 8;
                }
                _ => {
                    q[8 * k + b] = (byte & 0xF) as i8 - 8;
                    q[8 * k + 4 + b] = (byte >> 4) as i8 - 8;
                }
            }
        }
    }
    q
}

/// The exact int32 dot of one group's weights (natural order) with activations `a`.
#[inline(always)]
pub fn idot(w: &[i8; GROUP], a: &[i8]) -> i32 {
    w.iter().zip(a).map(|(&x, &y)| x as i32 * y as i32).sum()
}

/// Scalar integer dot of group `g` of row `r` (for tests: every kernel must match it exactly).
pub fn group_dot_scalar(
    f: QFormat,
    data: &[u8],
    row_bytes: usize,
    r: usize,
    g: usize,
    a: &[i8],
) -> i32 {
    let w = match f {
        QFormat::W8 => unpack_natural::<FMT_W8>(data, group_at::<FMT_W8>(row_bytes, r, g).1),
        QFormat::W4(Packing::Contiguous) => {
            unpack_natural::<FMT_W4C>(data, group_at::<FMT_W4C>(row_bytes, r, g).1)
        }
        QFormat::W4(Packing::Interleaved) => {
            unpack_natural::<FMT_W4I>(data, group_at::<FMT_W4I>(row_bytes, r, g).1)
        }
        QFormat::W4(Packing::Swizzled) => {
            unpack_natural::<FMT_W4S>(data, group_at::<FMT_W4S>(row_bytes, r, g).1)
        }
    };
    idot(&w, &a[g * GROUP..][..GROUP])
}

/// Computes `out[r]` for the chunk's rows. Safe in itself; `unsafe` only to be a `ChunkFn`.
unsafe fn scalar_chunk<const F: u8>(data: &[u8], row_bytes: usize, a: &Act, out: &mut [f32]) {
    let ng = groups::<F>(row_bytes);
    for (r, o) in out.iter_mut().enumerate() {
        let mut acc = 0f32;
        for g in 0..ng {
            let (s, w) = group_at::<F>(row_bytes, r, g);
            let i = idot(&unpack_natural::<F>(data, w), &a.qs[g * GROUP..][..GROUP]);
            let d = f16_to_f32(u16::from_le_bytes([data[s], data[s + 1]])) * a.d[g];
            acc += d * i as f32;
        }
        *o = acc;
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

/// NEON kernels (aarch64): each group unpacked to two int8x16 registers in the order the x86
/// kernels use (natural for w8 and contiguous w4, `PERM` for the lane-interleaved packings, whose
/// activations are the permuted copy), then an exact int32 dot: `sdot` where the core has the
/// dot-product extension (the Jetson Orin's Cortex-A78AE does), `smull` + `sadalp` otherwise.
/// The f32 epilogue is the scalar one, so the results are bit-identical to it.
#[cfg(target_arch = "aarch64")]
mod neon;

/// A test matrix of format `F` (`TEST_ROWS` x `TEST_COLS`, row bytes returned): random weight
/// bytes (w8 values -128..=127 included) with sane scales.
#[cfg(test)]
fn test_matrix<const F: u8>(next: &mut impl FnMut() -> u64) -> (Vec<u8>, usize) {
    let ng = TEST_COLS / GROUP;
    let rb = ng * if F == FMT_W8 { 34 } else { W4_GROUP_BYTES };
    let bands = TEST_ROWS.next_multiple_of(SWIZZLE_ROWS);
    let mut data: Vec<u8> = (0..bands * rb).map(|_| next() as u8).collect();
    // Sane scales (2^-5 to 2^-4) that differ by row and group, so that a kernel pairing a
    // row's sums with another row's scale fails.
    for r in 0..TEST_ROWS {
        for g in 0..ng {
            let s = group_at::<F>(rb, r, g).0;
            let d = 0x2800u16 | ((r * 37 + g * 11) % 1024) as u16;
            data[s..s + 2].copy_from_slice(&d.to_le_bytes());
        }
    }
    (data, rb)
}

/// Random quantized activations (`TEST_COLS`): int8 values, their permuted copy, group scales.
#[cfg(test)]
fn test_act(next: &mut impl FnMut() -> u64) -> TestAct {
    let ng = TEST_COLS / GROUP;
    // Activations are quantized to -127..=127 (`quantize_q8`), never -128.
    let qs: Vec<i8> = (0..TEST_COLS)
        .map(|_| ((next() % 255) as i16 - 127) as i8)
        .collect();
    let mut qp = vec![0i8; TEST_COLS];
    permute_act(&qs, &mut qp);
    let k = (next() % 7) as f32;
    let d: Vec<f32> = (0..ng)
        .map(|g| 0.01 + g as f32 * 0.003 + k * 0.001)
        .collect();
    let ls: Vec<i32> = qs
        .chunks_exact(4)
        .map(|run| -run.iter().map(|&q| q as i32).sum::<i32>())
        .collect();
    let gs = ls.chunks_exact(8).map(|b| b.iter().sum()).collect();
    TestAct { qs, qp, d, ls, gs }
}

/// Activations as `Act` borrows them (see `test_act`).
#[cfg(test)]
struct TestAct {
    qs: Vec<i8>,
    qp: Vec<i8>,
    d: Vec<f32>,
    ls: Vec<i32>,
    gs: Vec<i32>,
}

#[cfg(test)]
impl TestAct {
    fn act(&self) -> Act<'_> {
        Act {
            x: &[],
            qs: &self.qs,
            qp: &self.qp,
            d: &self.d,
            s: &[],
            ls: &self.ls,
            gs: &self.gs,
            hs: &[],
        }
    }
}

#[cfg(test)]
const TEST_ROWS: usize = 71;
/// Nine groups: the one-pass kernels' four-group loop twice, then a group alone.
#[cfg(test)]
const TEST_COLS: usize = 288;

#[cfg(test)]
fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut seed = seed;
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// The many-input kernel gives each of five inputs bit for bit what the one-input kernel gives
/// it alone, on a matrix of 71 rows: eight octets, one group of four, and three rows alone.
#[cfg(all(test, target_arch = "x86_64"))]
fn check_many<const F: u8>(one: ChunkFn, many: ChunkManyFn) {
    let mut next = xorshift(0x9E37_79B9_7F4A_7C15 ^ F as u64);
    let (data, rb) = test_matrix::<F>(&mut next);
    let inputs: Vec<_> = (0..5).map(|_| test_act(&mut next)).collect();
    let acts: Vec<Act> = inputs.iter().map(TestAct::act).collect();
    let mut got = vec![0f32; acts.len() * TEST_ROWS];
    // SAFETY: AVX2 was checked by the caller; `got` holds every input's rows.
    unsafe { many(&data, rb, &acts, got.as_mut_ptr(), TEST_ROWS, TEST_ROWS) };
    for (t, a) in acts.iter().enumerate() {
        let mut want = vec![0f32; TEST_ROWS];
        // SAFETY: as above.
        unsafe { one(&data, rb, a, &mut want) };
        assert!(want.iter().any(|&x| x != 0.0));
        assert_eq!(
            &got[t * TEST_ROWS..][..TEST_ROWS],
            &want[..],
            "format {F}, input {t}"
        );
    }
}

/// Every `variants` kernel equals the scalar kernel bit for bit on one matrix of format `F`:
/// random weight bytes (w8 values -128..=127 included) with sane scales, random activations.
#[cfg(test)]
fn check_format<const F: u8>(variants: &[(&'static str, ChunkFn)]) {
    let mut next = xorshift(0x2545_F491_4F6C_DD1Du64 ^ F as u64);
    let (data, rb) = test_matrix::<F>(&mut next);
    let input = test_act(&mut next);
    let a = input.act();
    let rows = TEST_ROWS;
    let mut want = vec![0f32; rows];
    // SAFETY: the scalar kernel needs no CPU feature; `data` and `a` cover every group.
    unsafe { scalar_chunk::<F>(&data, rb, &a, &mut want) };
    assert!(want.iter().any(|&x| x != 0.0));
    for (name, kernel) in variants {
        let mut got = vec![0f32; rows];
        // SAFETY: callers list only kernels whose CPU features are present.
        unsafe { kernel(&data, rb, &a, &mut got) };
        assert_eq!(got, want, "format {F}, kernel {name}");
    }
}
