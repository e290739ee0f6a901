//! The aarch64 kernels of `lowbit` (NEON, `sdot`): see the parent module's notes.

use super::*;
// Baseline NEON's widening multiply and pairwise add, shared with the classic kernels.
use crate::backend::cpu::kernel::neon::mul_acc;
use std::arch::aarch64::*;

/// Whether this core has `sdot` (checked once by the standard library, cached).
pub(super) fn has_dotprod() -> bool {
    std::arch::is_aarch64_feature_detected!("dotprod")
}

/// `acc + sum of a[i] * b[i]` per group of four bytes, with `sdot`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn dot_sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: `sdot` exists on this core (the caller checked `dotprod`); it reads and writes
    // registers only.
    std::arch::asm!(
        "sdot {0:v}.4s, {1:v}.16b, {2:v}.16b",
        inout(vreg) acc,
        in(vreg) a,
        in(vreg) b,
        options(pure, nomem, nostack)
    );
    acc
}

/// The group's 32 weights as two registers, in the order its activations are stored.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn weights<const F: u8>(p: *const u8, w: [usize; 4]) -> (int8x16_t, int8x16_t) {
    let eight = vdupq_n_s8(8);
    let split = |v: uint8x16_t| {
        let lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
        let hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
        (vsubq_s8(lo, eight), vsubq_s8(hi, eight))
    };
    match F {
        FMT_W8 => (
            vld1q_s8(p.add(w[0]).cast()),
            vld1q_s8(p.add(w[0] + 16).cast()),
        ),
        FMT_W4C => {
            // Byte j holds elements 2j (low nibble) and 2j + 1 (high): zip to natural order.
            let (lo, hi) = split(vld1q_u8(p.add(w[0])));
            (vzip1q_s8(lo, hi), vzip2q_s8(lo, hi))
        }
        FMT_W4I => split(vld1q_u8(p.add(w[0]))),
        _ => {
            // Swizzled: the group's four words lie 128 bytes apart.
            let words = w.map(|o| p.add(o).cast::<u32>().read_unaligned());
            split(vreinterpretq_u8_u32(vld1q_u32(words.as_ptr())))
        }
    }
}

/// `out[r]` for the chunk's rows with `sdot`. Unsafe: the core must have `dotprod`
/// (`has_dotprod`), and `a` must cover the rows' groups.
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn chunk_sdot<const F: u8>(
    data: &[u8],
    row_bytes: usize,
    a: &Act,
    out: &mut [f32],
) {
    chunk::<F, true>(data, row_bytes, a, out)
}

/// `acc + w . y[LANE]` per 32-bit lane: `sdot` by element, the four bytes of lane `LANE`
/// of `y` against each lane's four bytes of `w`.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn dot_sdot_lane<const LANE: i32>(acc: int32x4_t, w: int8x16_t, y: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: as `dot_sdot`; LANE is 0..4, a valid element index.
    std::arch::asm!(
        "sdot {0:v}.4s, {1:v}.16b, {2:v}.4b[{lane}]",
        inout(vreg) acc,
        in(vreg) w,
        in(vreg) y,
        lane = const LANE,
        options(pure, nomem, nostack)
    );
    acc
}

/// The swizzled packing four rows per register (`sdot`): word k of a tile is 128 bytes,
/// 4 per row, so one load is word k of four rows, a lane each, and `sdot` by element dots
/// it with the activation word it meets (bytes 4k.. for the low nibbles, 16 + 4k.. for the
/// high). Each lane ends a group with its row's exact int32 dot, no across-lane add; the
/// epilogue is the scalar one per lane, so the results are bit-identical. Rows past the
/// chunk's last (the band's padding) are computed and not stored. Unsafe: the core must
/// have `dotprod`, and `a` must cover the rows' groups.
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn chunk_swizzled_sdot(data: &[u8], row_bytes: usize, a: &Act, out: &mut [f32]) {
    let ng = row_bytes / W4_GROUP_BYTES;
    let rows = out.len();
    assert!(a.qp.len() >= ng * GROUP && a.d.len() >= ng);
    assert!(data.len() >= rows.next_multiple_of(SWIZZLE_ROWS) * row_bytes);
    let p = data.as_ptr();
    let (mask, eight) = (vdupq_n_u8(0x0F), vdupq_n_s8(8));
    for r in (0..rows).step_by(4) {
        let (band, lane) = (r / SWIZZLE_ROWS, r % SWIZZLE_ROWS);
        let mut acc = vdupq_n_f32(0.0);
        for g in 0..ng {
            let t = p.add((band * ng + g) * SWIZZLE_TILE_BYTES);
            let y = a.qp.as_ptr().add(g * GROUP);
            let (y0, y1) = (vld1q_s8(y), vld1q_s8(y.add(16)));
            let word = |k: usize| {
                let v = vld1q_u8(t.add(64 + 128 * k + 4 * lane));
                let lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, mask)), eight);
                let hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), eight);
                (lo, hi)
            };
            let (l0, h0) = word(0);
            let (l1, h1) = word(1);
            let (l2, h2) = word(2);
            let (l3, h3) = word(3);
            let zero = vdupq_n_s32(0);
            let lo = dot_sdot_lane::<3>(
                dot_sdot_lane::<2>(
                    dot_sdot_lane::<1>(dot_sdot_lane::<0>(zero, l0, y0), l1, y0),
                    l2,
                    y0,
                ),
                l3,
                y0,
            );
            let hi = dot_sdot_lane::<3>(
                dot_sdot_lane::<2>(
                    dot_sdot_lane::<1>(dot_sdot_lane::<0>(zero, h0, y1), h1, y1),
                    h2,
                    y1,
                ),
                h3,
                y1,
            );
            let i = vaddq_s32(lo, hi);
            let scale = |k: usize| f16_to_f32(t.add(2 * (lane + k)).cast::<u16>().read_unaligned());
            let dw = [scale(0), scale(1), scale(2), scale(3)];
            let d = vmulq_f32(vld1q_f32(dw.as_ptr()), vdupq_n_f32(a.d[g]));
            acc = vaddq_f32(acc, vmulq_f32(d, vcvtq_f32_s32(i)));
        }
        let mut lanes = [0f32; 4];
        vst1q_f32(lanes.as_mut_ptr(), acc);
        let n = (rows - r).min(4);
        out[r..r + n].copy_from_slice(&lanes[..n]);
    }
}

/// `out[r]` for the chunk's rows with baseline NEON. Unsafe: `a` must cover the rows' groups.
#[target_feature(enable = "neon")]
pub(super) unsafe fn chunk_mull<const F: u8>(
    data: &[u8],
    row_bytes: usize,
    a: &Act,
    out: &mut [f32],
) {
    chunk::<F, false>(data, row_bytes, a, out)
}

/// One row at a time; `DOT`: `sdot` (inlined into `chunk_sdot`, whose features allow it).
#[inline(always)]
unsafe fn chunk<const F: u8, const DOT: bool>(
    data: &[u8],
    row_bytes: usize,
    a: &Act,
    out: &mut [f32],
) {
    let ng = groups::<F>(row_bytes);
    let act = activations::<F>(a);
    assert!(act.len() >= ng * GROUP && a.d.len() >= ng);
    let p = data.as_ptr();
    for (r, o) in out.iter_mut().enumerate() {
        let mut acc = 0f32;
        for g in 0..ng {
            let (s, w) = group_at::<F>(row_bytes, r, g);
            let (w0, w1) = weights::<F>(p, w);
            let y = act.as_ptr().add(g * GROUP);
            let (y0, y1) = (vld1q_s8(y), vld1q_s8(y.add(16)));
            let zero = vdupq_n_s32(0);
            let lanes = if DOT {
                dot_sdot(dot_sdot(zero, w0, y0), w1, y1)
            } else {
                mul_acc(mul_acc(zero, w0, y0), w1, y1)
            };
            let i = vaddvq_s32(lanes);
            let d = f16_to_f32(u16::from_le_bytes([data[s], data[s + 1]])) * a.d[g];
            acc += d * i as f32;
        }
        *o = acc;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both NEON variants (and the `sdot` one only where the core has it) equal the scalar
    /// kernel bit for bit, for every format.
    #[test]
    fn neon_kernels_equal_scalar() {
        fn variants<const F: u8>() -> Vec<(&'static str, ChunkFn)> {
            let mut v: Vec<(&'static str, ChunkFn)> = vec![("smull", chunk_mull::<F>)];
            if has_dotprod() {
                v.push(("sdot", chunk_sdot::<F>));
            }
            v
        }
        check_format::<FMT_W8>(&variants::<FMT_W8>());
        check_format::<FMT_W4C>(&variants::<FMT_W4C>());
        check_format::<FMT_W4I>(&variants::<FMT_W4I>());
        check_format::<FMT_W4S>(&variants::<FMT_W4S>());
        if has_dotprod() {
            check_format::<FMT_W4S>(&[("sdot swizzled", chunk_swizzled_sdot)]);
        }
        assert!(
            has_dotprod(),
            "qemu's default cpu has dotprod: both variants ran"
        );
    }
}
