//! Scalar kernels: the portable fallback, and the definition the SIMD kernels mirror.

use super::*;

pub(super) fn chunk_fn(ty: GgmlType) -> ChunkFn {
    match ty {
        GgmlType::Q4_0 => chunk::<Q4_0>,
        GgmlType::Q4_1 => chunk::<Q4_1>,
        GgmlType::Q5_0 => chunk::<Q5_0>,
        GgmlType::Q5_1 => chunk::<Q5_1>,
        GgmlType::Q8_0 => chunk::<Q8_0>,
        GgmlType::F32 => chunk::<F32>,
        GgmlType::F16 => chunk::<F16>,
        GgmlType::BF16 => chunk::<Bf16>,
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => super::kquant::scalar_chunk_fn(ty),
    }
}

pub(super) trait RowDot {
    fn dot(row: &[u8], a: &Act) -> f32;
}

fn chunk<T: RowDot>(data: &[u8], row_bytes: usize, stride: usize, a: &Act, out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = T::dot(&data[i * stride..][..row_bytes], a);
    }
}

/// Integer dot of one classic block: weights `w(j)` for j in 0..32 with activations `qa`.
#[inline(always)]
fn idot(qa: &[i8], w: impl Fn(usize) -> i32) -> i32 {
    (0..QK).map(|j| w(j) * qa[j] as i32).sum()
}

pub(super) struct Q4_0;
impl RowDot for Q4_0 {
    fn dot(row: &[u8], a: &Act) -> f32 {
        let mut acc = 0f32;
        for (b, blk) in row.chunks_exact(18).enumerate() {
            let qs = &blk[2..18];
            let i = idot(&a.qs[b * QK..], |j| {
                (qs[j % 16] >> (4 * (j / 16)) & 0xF) as i32 - 8
            });
            acc += f16_to_f32(le16(blk, 0)) * a.d[b] * i as f32;
        }
        acc
    }
}

pub(super) struct Q4_1;
impl RowDot for Q4_1 {
    fn dot(row: &[u8], a: &Act) -> f32 {
        let mut acc = 0f32;
        for (b, blk) in row.chunks_exact(20).enumerate() {
            let qs = &blk[4..20];
            let i = idot(&a.qs[b * QK..], |j| {
                (qs[j % 16] >> (4 * (j / 16)) & 0xF) as i32
            });
            acc += f16_to_f32(le16(blk, 0)) * a.d[b] * i as f32 + f16_to_f32(le16(blk, 2)) * a.s[b];
        }
        acc
    }
}

pub(super) struct Q5_0;
impl RowDot for Q5_0 {
    fn dot(row: &[u8], a: &Act) -> f32 {
        let mut acc = 0f32;
        for (b, blk) in row.chunks_exact(22).enumerate() {
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            let qs = &blk[6..22];
            let i = idot(&a.qs[b * QK..], |j| {
                let lo = (qs[j % 16] >> (4 * (j / 16))) & 0xF;
                (lo as u32 | ((qh >> j) & 1) << 4) as i32 - 16
            });
            acc += f16_to_f32(le16(blk, 0)) * a.d[b] * i as f32;
        }
        acc
    }
}

pub(super) struct Q5_1;
impl RowDot for Q5_1 {
    fn dot(row: &[u8], a: &Act) -> f32 {
        let mut acc = 0f32;
        for (b, blk) in row.chunks_exact(24).enumerate() {
            let qh = u32::from_le_bytes([blk[4], blk[5], blk[6], blk[7]]);
            let qs = &blk[8..24];
            let i = idot(&a.qs[b * QK..], |j| {
                let lo = (qs[j % 16] >> (4 * (j / 16))) & 0xF;
                (lo as u32 | ((qh >> j) & 1) << 4) as i32
            });
            acc += f16_to_f32(le16(blk, 0)) * a.d[b] * i as f32 + f16_to_f32(le16(blk, 2)) * a.s[b];
        }
        acc
    }
}

pub(super) struct Q8_0;
impl RowDot for Q8_0 {
    fn dot(row: &[u8], a: &Act) -> f32 {
        let mut acc = 0f32;
        for (b, blk) in row.chunks_exact(34).enumerate() {
            let i = idot(&a.qs[b * QK..], |j| blk[2 + j] as i8 as i32);
            acc += f16_to_f32(le16(blk, 0)) * a.d[b] * i as f32;
        }
        acc
    }
}

pub(super) struct F32;
impl RowDot for F32 {
    fn dot(row: &[u8], a: &Act) -> f32 {
        row.chunks_exact(4)
            .zip(a.x)
            .map(|(w, x)| f32::from_le_bytes([w[0], w[1], w[2], w[3]]) * x)
            .sum()
    }
}

pub(super) struct F16;
impl RowDot for F16 {
    fn dot(row: &[u8], a: &Act) -> f32 {
        row.chunks_exact(2)
            .zip(a.x)
            .map(|(w, x)| f16_to_f32(le16(w, 0)) * x)
            .sum()
    }
}

pub(super) struct Bf16;
impl RowDot for Bf16 {
    fn dot(row: &[u8], a: &Act) -> f32 {
        row.chunks_exact(2)
            .zip(a.x)
            .map(|(w, x)| bf16_to_f32(le16(w, 0)) * x)
            .sum()
    }
}
