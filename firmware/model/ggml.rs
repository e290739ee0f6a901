//! GGML tensor types: block layouts and dequantization, exactly to their definitions in ggml
//! (`ggml-common.h`, `ggml-quants.c`). Every quantized type stores blocks of `block_elems`
//! values in `block_bytes` bytes, little-endian, with fp16 scales.

/// The tensor types this engine reads. The discriminant is the id GGUF stores.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    BF16 = 30,
}

/// Elements in one K-quant super-block.
pub const QK_K: usize = 256;
/// Elements in one classic quant block (Q4_0 ... Q8_0).
pub const QK: usize = 32;

impl GgmlType {
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            7 => GgmlType::Q5_1,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4_K,
            13 => GgmlType::Q5_K,
            14 => GgmlType::Q6_K,
            30 => GgmlType::BF16,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::BF16 => "BF16",
        }
    }

    /// Values per block (1 for plain float types).
    pub fn block_elems(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => {
                QK
            }
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 2 + 16,
            GgmlType::Q4_1 => 2 + 2 + 16,
            GgmlType::Q5_0 => 2 + 4 + 16,
            GgmlType::Q5_1 => 2 + 2 + 4 + 16,
            GgmlType::Q8_0 => 2 + 32,
            GgmlType::Q4_K => 2 + 2 + 12 + 128,
            GgmlType::Q5_K => 2 + 2 + 12 + 32 + 128,
            GgmlType::Q6_K => 128 + 64 + 16 + 2,
        }
    }

    /// Bytes of a row of `n` values, or None when `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_elems()) {
            return None;
        }
        (n / self.block_elems()).checked_mul(self.block_bytes())
    }
}

/// IEEE half -> f32 (exact; NaN payloads and signs kept).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: value = man * 2^-24, exact in f32.
            let v = man as f32 * f32::from_bits(0x3380_0000);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, _) => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 112) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// f32 -> IEEE half, rounding to nearest even; overflow gives infinity, NaN gives 0x7e00
/// (with the sign). This is ggml's portable `ggml_compute_fp32_to_fp16`, bit for bit.
pub fn f32_to_f16(f: f32) -> u16 {
    let scale_to_inf = f32::from_bits(0x7780_0000); // 2^112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 2^-110
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;
    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let mut bias = shl1_w & 0xff00_0000;
    if bias < 0x7100_0000 {
        bias = 0x7100_0000;
    }
    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let exp_bits = (bits >> 13) & 0x0000_7c00;
    let mantissa_bits = bits & 0x0000_0fff;
    let nonsign = exp_bits + mantissa_bits;
    ((sign >> 16)
        | if shl1_w > 0xff00_0000 {
            0x7e00
        } else {
            nonsign
        }) as u16
}

/// bfloat16 -> f32 (exact).
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

#[inline]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) of a Q4_K block.
#[inline]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Dequantizes one row of `dst.len()` values of type `ty` from `src`, exactly as ggml's
/// `dequantize_row_*` reference functions (same operations in the same order, no fused
/// multiply-add), so results are bit-identical to ggml's scalar code.
///
/// # Panics
/// When `dst.len()` is not a whole number of blocks of `ty`, or `src.len()` is not exactly
/// `ty.row_bytes(dst.len())`. Both are programmer errors: GGUF tensors are validated at parse
/// time so that every row satisfies them.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    let need = ty.row_bytes(dst.len()).unwrap_or_else(|| {
        panic!(
            "dequantize_row: {} values is not a whole number of {} blocks",
            dst.len(),
            ty.name()
        )
    });
    assert_eq!(
        src.len(),
        need,
        "dequantize_row: {} source bytes for {} {} values",
        src.len(),
        dst.len(),
        ty.name()
    );
    let blocks = src
        .chunks_exact(ty.block_bytes())
        .zip(dst.chunks_exact_mut(ty.block_elems()));
    match ty {
        GgmlType::F32 => {
            for (b, y) in blocks {
                y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (b, y) in blocks {
                y[0] = f16_at(b, 0);
            }
        }
        GgmlType::BF16 => {
            for (b, y) in blocks {
                y[0] = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        GgmlType::Q4_0 => {
            for (b, y) in blocks {
                let d = f16_at(b, 0);
                let qs = &b[2..18];
                for j in 0..16 {
                    let x0 = (qs[j] & 0x0f) as i32 - 8;
                    let x1 = (qs[j] >> 4) as i32 - 8;
                    y[j] = x0 as f32 * d;
                    y[j + 16] = x1 as f32 * d;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (b, y) in blocks {
                let d = f16_at(b, 0);
                let m = f16_at(b, 2);
                let qs = &b[4..20];
                for j in 0..16 {
                    let x0 = (qs[j] & 0x0f) as i32;
                    let x1 = (qs[j] >> 4) as i32;
                    y[j] = x0 as f32 * d + m;
                    y[j + 16] = x1 as f32 * d + m;
                }
            }
        }
        GgmlType::Q5_0 => {
            for (b, y) in blocks {
                let d = f16_at(b, 0);
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let qs = &b[6..22];
                for j in 0..16 {
                    let xh0 = ((qh >> j) << 4) & 0x10;
                    let xh1 = (qh >> (j + 12)) & 0x10;
                    let x0 = ((qs[j] as u32 & 0x0f) | xh0) as i32 - 16;
                    let x1 = ((qs[j] as u32 >> 4) | xh1) as i32 - 16;
                    y[j] = x0 as f32 * d;
                    y[j + 16] = x1 as f32 * d;
                }
            }
        }
        GgmlType::Q5_1 => {
            for (b, y) in blocks {
                let d = f16_at(b, 0);
                let m = f16_at(b, 2);
                let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
                let qs = &b[8..24];
                for j in 0..16 {
                    let xh0 = ((qh >> j) << 4) & 0x10;
                    let xh1 = (qh >> (j + 12)) & 0x10;
                    let x0 = (qs[j] as u32 & 0x0f) | xh0;
                    let x1 = (qs[j] as u32 >> 4) | xh1;
                    y[j] = x0 as f32 * d + m;
                    y[j + 16] = x1 as f32 * d + m;
                }
            }
        }
        GgmlType::Q8_0 => {
            for (b, y) in blocks {
                let d = f16_at(b, 0);
                for j in 0..32 {
                    y[j] = b[2 + j] as i8 as f32 * d;
                }
            }
        }
        GgmlType::Q4_K => {
            for (b, y) in blocks {
                let d = f16_at(b, 0);
                let min = f16_at(b, 2);
                let scales = &b[4..16];
                let qs = &b[16..144];
                for (k, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
                    let (sc, m) = scale_min_k4(2 * k, scales);
                    let (d1, m1) = (d * sc as f32, min * m as f32);
                    let (sc, m) = scale_min_k4(2 * k + 1, scales);
                    let (d2, m2) = (d * sc as f32, min * m as f32);
                    for l in 0..32 {
                        y[l] = d1 * (q[l] & 0xf) as f32 - m1;
                        y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
                    }
                }
            }
        }
        GgmlType::Q5_K => {
            for (b, y) in blocks {
                let d = f16_at(b, 0);
                let min = f16_at(b, 2);
                let scales = &b[4..16];
                let qh = &b[16..48];
                let qs = &b[48..176];
                for (k, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
                    let (sc, m) = scale_min_k4(2 * k, scales);
                    let (d1, m1) = (d * sc as f32, min * m as f32);
                    let (sc, m) = scale_min_k4(2 * k + 1, scales);
                    let (d2, m2) = (d * sc as f32, min * m as f32);
                    // The fifth bit of sub-block j's values: bit j of qh[l].
                    let (u1, u2) = (1u8 << (2 * k), 2u8 << (2 * k));
                    for l in 0..32 {
                        let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                        let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                        y[l] = d1 * ((q[l] & 0xf) + h1) as f32 - m1;
                        y[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
                    }
                }
            }
        }
        GgmlType::Q6_K => {
            for (b, y) in blocks {
                let d = f16_at(b, 208);
                for n in 0..2 {
                    let ql = &b[64 * n..64 * n + 64];
                    let qh = &b[128 + 32 * n..128 + 32 * n + 32];
                    let sc = &b[192 + 8 * n..192 + 8 * n + 8];
                    let y = &mut y[128 * n..128 * n + 128];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                        y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                        y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                        y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                    }
                }
            }
        }
    }
}

/// `y.round()` (half away from zero) for |y| < 2^23, without the libm call `round` is on
/// baseline x86-64: the truncation `t` is exact, and so is the fraction `y - t`.
#[inline(always)]
pub fn round_half_away(y: f32) -> i32 {
    let t = y as i32;
    let f = y - t as f32;
    t + (f >= 0.5) as i32 - (f <= -0.5) as i32
}

/// Quantizes `src` (a whole number of 32-value blocks) to Q8_0 into `dst`
/// (`GgmlType::Q8_0.row_bytes(src.len())` bytes), as ggml's `quantize_row_q8_0_ref`:
/// `d = amax / 127`, `q = round(x * (1/d))` (rounding half away from zero), d stored as f16.
///
/// # Panics
/// On the same length mismatches as [`dequantize_row`].
pub fn quantize_row_q8_0(src: &[f32], dst: &mut [u8]) {
    let need = GgmlType::Q8_0.row_bytes(src.len()).unwrap_or_else(|| {
        panic!(
            "quantize_row_q8_0: {} values is not a whole number of blocks",
            src.len()
        )
    });
    assert_eq!(
        dst.len(),
        need,
        "quantize_row_q8_0: {} destination bytes for {} values",
        dst.len(),
        src.len()
    );
    for (x, y) in src
        .chunks_exact(QK)
        .zip(dst.chunks_exact_mut(GgmlType::Q8_0.block_bytes()))
    {
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        y[..2].copy_from_slice(&f32_to_f16(d).to_le_bytes());
        for j in 0..QK {
            y[2 + j] = round_half_away(x[j] * id) as i8 as u8;
        }
    }
}

#[cfg(test)]
mod round_tests {
    use super::round_half_away;

    /// Equals `f32::round` on every float in -130..130 around the halves and on a dense grid.
    #[test]
    fn round_half_away_equals_round() {
        let mut ys = vec![0.0f32, -0.0, 0.5, -0.5, 1.5, -1.5, 126.5, -126.5, 127.49999];
        for i in -1300..1300 {
            let y = i as f32 / 10.0;
            ys.extend([
                y,
                f32::from_bits(y.to_bits() + 1),
                f32::from_bits(y.to_bits().wrapping_sub(1)),
            ]);
        }
        for k in -130..130 {
            let h = k as f32 + 0.5;
            ys.extend([
                h,
                f32::from_bits(h.to_bits() + 1),
                f32::from_bits(h.to_bits() - 1),
            ]);
        }
        for y in ys {
            assert_eq!(round_half_away(y), y.round() as i32, "{y:e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trip_all() {
        for h in 0..=u16::MAX {
            let f = f16_to_f32(h);
            if f.is_nan() {
                assert_eq!(f32_to_f16(f) & 0x7c00, 0x7c00);
                continue;
            }
            assert_eq!(f32_to_f16(f), h, "{h:#06x} -> {f}");
        }
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0x0001), 5.960_464_5e-8);
        assert_eq!(f16_to_f32(0x8001), -5.960_464_5e-8);
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
    }

    #[test]
    fn f32_to_f16_rounds_to_nearest_even() {
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
        assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0), 0x3c00);
        // 1 + 3*2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9 (even).
        assert_eq!(f32_to_f16(1.0 + 3.0 / 2048.0), 0x3c02);
        assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0 + 1e-7), 0x3c01);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(65519.0), 0x7bff);
        assert_eq!(f32_to_f16(1e-9), 0);
        assert_eq!(f32_to_f16(-0.0), 0x8000);
        assert_eq!(f32_to_f16(f32::NAN) & 0x7fff, 0x7e00);
    }

    #[test]
    fn bf16() {
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        assert_eq!(bf16_to_f32(0xc000), -2.0);
    }

    #[test]
    fn q8_0_round_trip() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 64) as f32 - 31.5) / 7.0)
            .collect();
        let mut q = vec![0u8; GgmlType::Q8_0.row_bytes(64).unwrap()];
        quantize_row_q8_0(&x, &mut q);
        let mut y = vec![0f32; 64];
        dequantize_row(GgmlType::Q8_0, &q, &mut y);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() <= 0.5 * 4.5 / 127.0 + 4.5 / 1024.0, "{a} {b}");
        }
        // An all-zero block quantizes to d = 0, q = 0.
        let mut q = vec![0xffu8; 34];
        quantize_row_q8_0(&[0.0; 32], &mut q);
        assert!(q.iter().all(|&b| b == 0));
    }

    #[test]
    fn q4_0_by_hand() {
        // d = 0.5, nibbles: low = j % 16, high = 15 - j % 16.
        let mut b = f32_to_f16(0.5).to_le_bytes().to_vec();
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut y = [0f32; 32];
        dequantize_row(GgmlType::Q4_0, &b, &mut y);
        for j in 0..16 {
            assert_eq!(y[j], (j as f32 - 8.0) * 0.5);
            assert_eq!(y[j + 16], (7.0 - j as f32) * 0.5);
        }
    }

    /// Q5_K by ggml's layout (no fixture from ggml has this type): `d`, `dmin`, 12 bytes of
    /// 6-bit scales and mins, 32 bytes of fifth bits (bit j of byte l: value l of sub-block j),
    /// 128 bytes of nibbles (byte l of run k: value l of sub-blocks 2k (low) and 2k + 1 (high)).
    #[test]
    fn q5_k_by_hand() {
        let mut b = f32_to_f16(0.5).to_le_bytes().to_vec();
        b.extend(f32_to_f16(0.25).to_le_bytes());
        // Sub-blocks 0-3: scales 1-4, mins 5-8 (6 bits each, top bits of these bytes clear);
        // 4-7: scales 1, 3, 5, 7 and mins 2, 4, 6, 8 from the last four bytes' nibbles.
        b.extend([1, 2, 3, 4, 5, 6, 7, 8, 0x21, 0x43, 0x65, 0x87]);
        b.extend((0..32u8).map(|l| l.wrapping_mul(37)));
        for _ in 0..4 {
            b.extend((0..32u8).map(|l| (l % 16) | ((15 - l % 16) << 4)));
        }
        assert_eq!(b.len(), GgmlType::Q5_K.block_bytes());
        let (sc, m) = ([1, 2, 3, 4, 1, 3, 5, 7], [5, 6, 7, 8, 2, 4, 6, 8]);
        let mut y = [0f32; QK_K];
        dequantize_row(GgmlType::Q5_K, &b, &mut y);
        for (j, y) in y.chunks_exact(32).enumerate() {
            for (l, &v) in y.iter().enumerate() {
                let nibble = if j % 2 == 0 { l % 16 } else { 15 - l % 16 };
                let fifth = ((l as u8).wrapping_mul(37) >> j) & 1;
                let q = (nibble + 16 * fifth as usize) as f32;
                assert_eq!(v, 0.5 * sc[j] as f32 * q - 0.25 * m[j] as f32, "{j} {l}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "source bytes")]
    fn dequantize_wrong_length_panics() {
        dequantize_row(GgmlType::Q4_0, &[0; 17], &mut [0.0; 32]);
    }
}
