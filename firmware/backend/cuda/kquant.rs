//! K-quant super-blocks (Q4_K, Q5_K, Q6_K) repacked for the GPU's integer kernels
//! (kernels-ptx/decode.cu, `unit_load`/`unit_dot`): the same bits, the same bytes, in the
//! struct-of-arrays layout of the classic types, so that each block of 32 weights is one unit
//! meeting one int8 activation block (as the CPU's `backend/cpu/matvec/kquant.rs`).
//!
//! A stored super-block holds 8 blocks of 32. Q4_K and Q5_K put blocks 2k and 2k + 1 in the low
//! and high nibbles of the same 32 bytes; here each block's 32 nibbles are 16 bytes in the order
//! of Q4_0 (byte j: value j low, value j + 16 high), so a thread loads only its block. Per
//! matrix, with `blocks` blocks of 32 and `blocks / 8` super-blocks:
//!
//! - Q4_K: `q` 16 bytes a block; `d` the super-block's first 16 stored bytes (f16 d, f16 dmin,
//!   12 bytes of 6-bit scales and mins), unchanged. 144 bytes per 256 weights, as stored.
//! - Q5_K: Q4_K's, and `qh` 4 bytes a block: bit j = value j's fifth bit (Q5_0's order). 176.
//! - Q6_K: `q` 16 bytes a block of low nibbles; `qh` 8 bytes a block, two words of high bit
//!   pairs (word h, byte i, bits 2k..2k+1: value 16h + 4k + i's, so the kernel moves a word's
//!   four pairs into place with one shift and mask); `m` the block's two int8 scales (values
//!   0..15, 16..31); `d` the super-block's f16 d. 210 bytes per 256 weights, as stored.

use crate::model::ggml::GgmlType;
pub use crate::model::ggml::QK_K;

/// Blocks of 32 in a super-block.
pub const GROUPS: usize = QK_K / 32;

/// One block of 32 of a stored super-block, in the image's layout (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KBlock {
    /// The 32 low nibbles in Q4_0's order.
    pub nibbles: [u8; 16],
    /// Q5_K: bit j = value j's fifth bit.
    pub fifth: u32,
    /// Q6_K: the high bit pairs (module docs).
    pub pairs: [u8; 8],
    /// Q6_K: the int8 scales of values 0..15 and 16..31.
    pub scales: [u8; 2],
}

/// Bytes of the image per block of 32 in each array: (q, d per super-block, m, qh).
pub fn array_bytes(ty: GgmlType) -> (usize, usize, usize, usize) {
    match ty {
        GgmlType::Q4_K => (16, 16, 0, 0),
        GgmlType::Q5_K => (16, 16, 0, 4),
        GgmlType::Q6_K => (16, 2, 2, 8),
        _ => panic!("{} is not a K-quant type", ty.name()),
    }
}

/// The stored bytes the `d` array keeps of super-block `sb` (the header of Q4_K/Q5_K, Q6_K's d).
pub fn super_header(ty: GgmlType, sb: &[u8]) -> &[u8] {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => &sb[..16],
        GgmlType::Q6_K => &sb[208..210],
        _ => panic!("{} is not a K-quant type", ty.name()),
    }
}

/// Block `g` (0..8) of the stored super-block `sb` of type `ty`, repacked.
pub fn block(ty: GgmlType, sb: &[u8], g: usize) -> KBlock {
    assert_eq!(sb.len(), ty.block_bytes());
    // The block's 32 low nibbles (value l's in lo[l]) and high bits (hi[l]).
    let mut lo = [0u8; 32];
    let mut hi = [0u8; 32];
    let mut scales = [0u8; 2];
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let qs_at = if ty == GgmlType::Q4_K { 16 } else { 48 };
            let q = &sb[qs_at + 32 * (g / 2)..][..32];
            for l in 0..32 {
                lo[l] = q[l] >> (4 * (g % 2)) & 0xF;
                hi[l] = sb[16 + l] >> g & 1;
            }
        }
        GgmlType::Q6_K => {
            let (n, i) = (g / 4, g % 4);
            let ql = &sb[64 * n + 32 * (i % 2)..][..32];
            let qh = &sb[128 + 32 * n..][..32];
            for l in 0..32 {
                lo[l] = ql[l] >> (4 * (i / 2)) & 0xF;
                hi[l] = qh[l] >> (2 * i) & 3;
            }
            scales.copy_from_slice(&sb[192 + 8 * n + 2 * i..][..2]);
        }
        _ => panic!("{} is not a K-quant type", ty.name()),
    }
    let mut nibbles = [0u8; 16];
    for (j, n) in nibbles.iter_mut().enumerate() {
        *n = lo[j] | lo[j + 16] << 4;
    }
    let fifth = (0..32).fold(0u32, |acc, l| acc | ((hi[l] & 1) as u32) << l);
    let mut pairs = [0u8; 8];
    for (l, &h) in hi.iter().enumerate() {
        let (word, v) = (l / 16, l % 16);
        let (k, i) = (v / 4, v % 4);
        pairs[4 * word + i] |= (h & 3) << (2 * k);
    }
    KBlock {
        nibbles,
        fifth,
        pairs,
        scales,
    }
}

/// Value `j` (0..32) of a repacked block as the integer the kernels dot: Q4_K 0..15, Q5_K
/// 0..31, Q6_K -32..31 (before its scale).
pub fn value(ty: GgmlType, b: &KBlock, j: usize) -> i32 {
    let nib = (b.nibbles[j % 16] >> (4 * (j / 16)) & 0xF) as i32;
    match ty {
        GgmlType::Q4_K => nib,
        GgmlType::Q5_K => nib | ((b.fifth >> j & 1) as i32) << 4,
        _ => {
            let (word, v) = (j / 16, j % 16);
            let pair = (b.pairs[4 * word + v % 4] >> (2 * (v / 4)) & 3) as i32;
            (nib | pair << 4) - 32
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ggml::{dequantize_row, f16_to_f32, f32_to_f16};

    /// A super-block of random-looking bytes with a sane f16 d (and dmin).
    fn super_block(ty: GgmlType, seed: usize) -> Vec<u8> {
        let mut b: Vec<u8> = (0..ty.block_bytes())
            .map(|i| ((i * 131 + seed * 7919) % 251) as u8)
            .collect();
        let (d_at, dmin_at) = if ty == GgmlType::Q6_K {
            (208, None)
        } else {
            (0, Some(2))
        };
        b[d_at..d_at + 2].copy_from_slice(&f32_to_f16(0.01).to_le_bytes());
        if let Some(at) = dmin_at {
            b[at..at + 2].copy_from_slice(&f32_to_f16(0.02).to_le_bytes());
        }
        b
    }

    /// The repacked blocks hold the stored values: dequantized from them with the stored
    /// scales (ggml's formulas, in ggml's order), every one of the 256 weights equals ggml's
    /// dequantization of the stored super-block, bit for bit.
    #[test]
    fn repacked_blocks_dequantize_as_stored() {
        for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
            for seed in 0..4 {
                let sb = super_block(ty, seed);
                let mut want = [0f32; QK_K];
                dequantize_row(ty, &sb, &mut want);
                let hd = super_header(ty, &sb);
                for g in 0..GROUPS {
                    let b = block(ty, &sb, g);
                    for j in 0..32 {
                        let q = value(ty, &b, j) as f32;
                        let got = if ty == GgmlType::Q6_K {
                            let d = f16_to_f32(u16::from_le_bytes([hd[0], hd[1]]));
                            d * (b.scales[j / 16] as i8) as f32 * q
                        } else {
                            let d = f16_to_f32(u16::from_le_bytes([hd[0], hd[1]]));
                            let dmin = f16_to_f32(u16::from_le_bytes([hd[2], hd[3]]));
                            let (sc, m) = scale_min(&hd[4..16], g);
                            d * sc as f32 * q - dmin * m as f32
                        };
                        assert_eq!(
                            got.to_bits(),
                            want[32 * g + j].to_bits(),
                            "{} seed {seed} block {g} value {j}",
                            ty.name()
                        );
                    }
                }
            }
        }
    }

    /// decode.cu's `k4_scale_min`, word-wise as the kernel does it.
    fn scale_min(s: &[u8], g: usize) -> (u32, u32) {
        let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
        let sh = 8 * (g & 3);
        let (a, b, c) = (w(0) >> sh & 0xff, w(1) >> sh & 0xff, w(2) >> sh & 0xff);
        if g < 4 {
            (a & 63, b & 63)
        } else {
            ((c & 15) | (a >> 6) << 4, (c >> 4) | (b >> 6) << 4)
        }
    }

    /// The arrays take the stored bytes: 144, 176 and 210 per super-block.
    #[test]
    fn arrays_take_the_stored_bytes() {
        for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
            let (q, d, m, qh) = array_bytes(ty);
            assert_eq!(GROUPS * (q + m + qh) + d, ty.block_bytes(), "{}", ty.name());
        }
    }
}
