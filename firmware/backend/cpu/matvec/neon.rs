//! NEON kernels (aarch64), Q4_0, Q4_1 and Q8_0 (the K-quants' are in `kquant`); the scalar code
//! is their definition. They use
//! vmull_s8 + vpadalq_s16 (baseline NEON); `vdotq_s32` would be faster on cores with dotprod.

use super::*;
use crate::backend::cpu::kernel::neon::mul_acc;
use std::arch::aarch64::*;

pub(super) fn chunk_fn(ty: GgmlType) -> Option<ChunkFn> {
    Some(match ty {
        GgmlType::Q4_0 => chunk::<18, 2, false, true>,
        GgmlType::Q4_1 => chunk::<20, 4, true, true>,
        GgmlType::Q8_0 => chunk::<34, 2, false, false>,
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => super::kquant::neon_chunk_fn(ty),
        _ => return None,
    })
}

/// Blocks of `BYTES` with the f16 scale at 0, quants at `QS`; `MIN`: f16 min at 2 (Q4_1);
/// `NIB`: 16 bytes of nibbles (offset 8 unless MIN), else 32 signed bytes (Q8_0).
#[target_feature(enable = "neon")]
unsafe fn chunk<const BYTES: usize, const QS: usize, const MIN: bool, const NIB: bool>(
    data: &[u8],
    row_bytes: usize,
    stride: usize,
    a: &Act,
    out: &mut [f32],
) {
    for (i, o) in out.iter_mut().enumerate() {
        let row = &data[i * stride..][..row_bytes];
        let mut acc = 0f32;
        for (b, blk) in row.chunks_exact(BYTES).enumerate() {
            let p = blk.as_ptr().add(QS);
            let (w0, w1) = if NIB {
                let v = vld1q_u8(p);
                let lo = vandq_u8(v, vdupq_n_u8(0x0F));
                let hi = vshrq_n_u8(v, 4);
                let off = vdupq_n_s8(if MIN { 0 } else { 8 });
                (
                    vsubq_s8(vreinterpretq_s8_u8(lo), off),
                    vsubq_s8(vreinterpretq_s8_u8(hi), off),
                )
            } else {
                (vld1q_s8(p.cast()), vld1q_s8(p.add(16).cast()))
            };
            let y = a.qs.as_ptr().add(b * QK);
            let i = mul_acc(vdupq_n_s32(0), w0, vld1q_s8(y));
            let i = vaddvq_s32(mul_acc(i, w1, vld1q_s8(y.add(16))));
            acc += f16_to_f32(le16(blk, 0)) * a.d[b] * i as f32;
            if MIN {
                acc += f16_to_f32(le16(blk, 2)) * a.s[b];
            }
        }
        *o = acc;
    }
}
