//! Sparse down projection: `out = sum_i h[i] * col(idx[i])`, where each column of the down
//! matrix is stored as one GGML-typed row (a neuron bundle's down part). The output is split
//! across the pool's threads by ranges of 32 values; every task walks all chosen neurons in the
//! order given, so the result does not depend on the number of threads.
//!
//! Kernels: AVX2+FMA+F16C for Q4_0, Q4_1 and Q8_0 (what bundles of the models we run hold),
//! a scalar path for the other types that bundles may hold (Q5_0, Q5_1, F32, F16, BF16).

use super::matvec::{kernel, Kernel, Rows};
use super::pool::WorkerPool;
use crate::model::ggml::{dequantize_row, GgmlType, QK};

/// Adds `h * row` to `out` for `out.len()` values (a whole number of 32-value groups) of one
/// row whose bytes start at `src`. Unsafe: the kernel's CPU features must be present.
type AxpyFn = unsafe fn(ty: GgmlType, src: &[u8], h: f32, out: &mut [f32]);

/// Whether bundles may store down columns in `ty` (a column of `n` values in whole 32-groups).
pub fn axpy_supported(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
    )
}

fn axpy_fn(ty: GgmlType, k: Kernel) -> AxpyFn {
    #[cfg(target_arch = "x86_64")]
    if k == Kernel::Avx2 {
        match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => return x86::axpy,
            _ => {}
        }
    }
    let _ = k;
    axpy_scalar
}

/// `out = sum_i h[i] * w.row(idx[i])` (`out.len() == w.cols`), neurons in the order given.
pub fn axpy_rows(pool: &WorkerPool, w: Rows, idx: &[u32], h: &[f32], out: &mut [f32]) {
    axpy_rows_with(kernel(), pool, w, idx, h, out)
}

/// `axpy_rows` with the kernel chosen by the caller.
pub fn axpy_rows_with(
    k: Kernel,
    pool: &WorkerPool,
    w: Rows,
    idx: &[u32],
    h: &[f32],
    out: &mut [f32],
) {
    assert!(axpy_supported(w.ty), "no axpy kernel for {}", w.ty.name());
    assert_eq!(
        out.len(),
        w.cols,
        "output {} values, rows of {}",
        out.len(),
        w.cols
    );
    assert_eq!(
        idx.len(),
        h.len(),
        "{} indices, {} values",
        idx.len(),
        h.len()
    );
    assert!(
        w.cols % QK == 0,
        "rows of {} values are not 32-groups",
        w.cols
    );
    let _ = w.row_bytes();
    if let Some(&m) = idx.iter().max() {
        assert!((m as usize) < w.rows, "row {m} of {}", w.rows);
    }
    let f = axpy_fn(w.ty, k);
    let group_bytes = w.ty.row_bytes(QK).expect("32-groups");
    let groups = w.cols / QK;
    let tasks = pool.n_threads().min(groups).max(1);
    let outp = OutPtr(out.as_mut_ptr());
    pool.run(tasks, &|t| {
        let g0 = groups * t / tasks;
        let g1 = groups * (t + 1) / tasks;
        // SAFETY: tasks own disjoint ranges g0..g1 of 32-groups of `out`.
        let o = unsafe { std::slice::from_raw_parts_mut(outp.ptr().add(g0 * QK), (g1 - g0) * QK) };
        o.fill(0.0);
        let bytes = (g1 - g0) * group_bytes;
        for (&r, &hv) in idx.iter().zip(h) {
            let src = &w.data[r as usize * w.stride + g0 * group_bytes..][..bytes];
            // SAFETY: `axpy_fn` picked a kernel this CPU supports (callers pass `kernel()` or a
            // supported one); `src` holds exactly the groups `o` covers.
            unsafe { f(w.ty, src, hv, o) };
        }
    });
}

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: only used to hand disjoint ranges of one `&mut [f32]` to pool tasks.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    fn ptr(&self) -> *mut f32 {
        self.0
    }
}

unsafe fn axpy_scalar(ty: GgmlType, src: &[u8], h: f32, out: &mut [f32]) {
    let gb = ty.row_bytes(QK).expect("32-groups");
    let mut y = [0f32; QK];
    for (o, s) in out.chunks_exact_mut(QK).zip(src.chunks_exact(gb)) {
        dequantize_row(ty, s, &mut y);
        for (a, b) in o.iter_mut().zip(&y) {
            *a += h * b;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16_at(p: *const u8) -> f32 {
        let h = p.cast::<u16>().read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
    }

    /// `o[0..8] = s * q + (o[0..8] + c)` for 8 unsigned bytes `q` (the low 8 of `v`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn fma8_u8(o: *mut f32, v: __m128i, s: __m256, c: __m256) {
        let q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
        _mm256_storeu_ps(
            o,
            _mm256_fmadd_ps(s, q, _mm256_add_ps(_mm256_loadu_ps(o), c)),
        );
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn axpy(ty: GgmlType, src: &[u8], h: f32, out: &mut [f32]) {
        let nb = out.len() / QK;
        let op = out.as_mut_ptr();
        let sp = src.as_ptr();
        match ty {
            GgmlType::Q8_0 => {
                debug_assert!(src.len() >= nb * 34);
                for b in 0..nb {
                    let p = sp.add(b * 34);
                    let s = _mm256_set1_ps(h * f16_at(p));
                    for g in 0..4 {
                        let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(2 + 8 * g).cast()));
                        let o = op.add(b * QK + 8 * g);
                        _mm256_storeu_ps(
                            o,
                            _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(q), _mm256_loadu_ps(o)),
                        );
                    }
                }
            }
            GgmlType::Q4_0 | GgmlType::Q4_1 => {
                let (bytes, qs) = if ty == GgmlType::Q4_1 {
                    (20, 4)
                } else {
                    (18, 2)
                };
                debug_assert!(src.len() >= nb * bytes);
                let mask = _mm_set1_epi8(0x0F);
                for b in 0..nb {
                    let p = sp.add(b * bytes);
                    let d = h * f16_at(p);
                    let c = if ty == GgmlType::Q4_1 {
                        h * f16_at(p.add(2))
                    } else {
                        -8.0 * d
                    };
                    let (s, c) = (_mm256_set1_ps(d), _mm256_set1_ps(c));
                    let t = _mm_loadu_si128(p.add(qs).cast());
                    let lo = _mm_and_si128(t, mask);
                    let hi = _mm_and_si128(_mm_srli_epi16(t, 4), mask);
                    let o = op.add(b * QK);
                    fma8_u8(o, lo, s, c);
                    fma8_u8(o.add(8), _mm_srli_si128(lo, 8), s, c);
                    fma8_u8(o.add(16), hi, s, c);
                    fma8_u8(o.add(24), _mm_srli_si128(hi, 8), s, c);
                }
            }
            _ => axpy_scalar(ty, src, h, out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ggml::f32_to_f16;

    fn rng(seed: &mut u64) -> f32 {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    #[test]
    fn kernels_match_dequantized_reference() {
        let pool = WorkerPool::new(2);
        let (rows, cols) = (40, 96);
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::F16,
        ] {
            let rb = ty.row_bytes(cols).unwrap();
            let mut seed = 7u64;
            let mut data = vec![0u8; rows * rb];
            for (i, b) in data.iter_mut().enumerate() {
                *b = (rng(&mut seed) * 127.0) as i8 as u8 ^ (i as u8);
            }
            // Sane scales: every f16 scale/min at the start of a block set to a small value.
            if ty != GgmlType::F16 {
                for blk in data.chunks_exact_mut(ty.block_bytes()) {
                    blk[..2].copy_from_slice(
                        &f32_to_f16(0.01 + rng(&mut seed).abs() * 0.1).to_le_bytes(),
                    );
                    if ty == GgmlType::Q4_1 {
                        blk[2..4].copy_from_slice(&f32_to_f16(rng(&mut seed) * 0.1).to_le_bytes());
                    }
                }
            } else {
                for w in data.chunks_exact_mut(2) {
                    w.copy_from_slice(&f32_to_f16(rng(&mut seed)).to_le_bytes());
                }
            }
            let w = Rows {
                ty,
                q: None,
                rows,
                cols,
                stride: rb,
                data: &data,
            };
            let idx: Vec<u32> = vec![3, 17, 0, 39, 8];
            let h: Vec<f32> = idx.iter().map(|_| rng(&mut seed)).collect();
            let mut want = vec![0f64; cols];
            let mut y = vec![0f32; cols];
            for (&r, &hv) in idx.iter().zip(&h) {
                dequantize_row(ty, w.row(r as usize), &mut y);
                for (a, b) in want.iter_mut().zip(&y) {
                    *a += hv as f64 * *b as f64;
                }
            }
            for k in [Kernel::Scalar, crate::backend::cpu::matvec::best_kernel()] {
                let mut out = vec![9f32; cols];
                axpy_rows_with(k, &pool, w, &idx, &h, &mut out);
                for (a, b) in out.iter().zip(&want) {
                    assert!(
                        (*a as f64 - b).abs() < 1e-4 * (1.0 + b.abs()),
                        "{ty:?} {k:?}: {a} vs {b}"
                    );
                }
            }
        }
    }
}
