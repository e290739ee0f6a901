//! Sparse down projection: `out = sum_i h[i] * col(idx[i])`, where each column of the down
//! matrix is stored as one GGML-typed row (a neuron bundle's down part). The chosen neurons are
//! split across the pool's threads in fixed runs of `ROWS_PER_TASK`, each summed into its own
//! partial output, and the partials are added in order: a task reads whole columns, and the
//! result does not depend on the number of threads.
//!
//! Kernels: AVX2+FMA+F16C for Q4_0, Q4_1 and Q8_0 (what bundles of the models we run hold),
//! a scalar path for the other types that bundles may hold (Q5_0, Q5_1, F32, F16, BF16).

use super::matvec::{Kernel, KernelSet, Rows};
use super::pool::WorkerPool;
use super::{prefetch_gathered, sum_partials, OutPtr};
use crate::model::ggml::{dequantize_row, GgmlType, QK};
use crate::sparsity::bundle::column_type_supported;

/// Adds `h * row` to `out` for `out.len()` values (a whole number of 32-value groups) of one
/// row whose bytes start at `src`. Unsafe: the kernel's CPU features must be present.
type AxpyFn = unsafe fn(ty: GgmlType, src: &[u8], h: f32, out: &mut [f32]);

fn axpy_fn(ty: GgmlType, k: Kernel) -> AxpyFn {
    #[cfg(target_arch = "x86_64")]
    if k == Kernel::Avx2 {
        match ty {
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => return x86::axpy,
            _ => {}
        }
    }
    let _ = (ty, k);
    axpy_scalar
}

/// Adds `h[0] * row0 + h[1] * row1 + ...` (four rows, in that order) to `out`: the same sums
/// as four `AxpyFn` calls, with each output group loaded and stored once. Unsafe as `AxpyFn`.
type Axpy4Fn = unsafe fn(ty: GgmlType, src: [&[u8]; 4], h: [f32; 4], out: &mut [f32]);

fn axpy4_fn(ty: GgmlType, k: Kernel) -> Option<Axpy4Fn> {
    #[cfg(target_arch = "x86_64")]
    if k == Kernel::Avx2 && matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0) {
        return Some(x86::axpy4);
    }
    let _ = (ty, k);
    None
}

/// Chosen rows per task: each task adds whole rows (one run of bytes each) into its own
/// partial sum, and there are enough tasks for the pool to balance them when a core is busy
/// with something else. Partial sums are added in task order, so the result does not depend
/// on the number of threads.
pub const ROWS_PER_TASK: usize = 64;

/// Scratch `axpy_rows` needs for up to `max_rows` chosen rows of `cols` values.
pub fn partials_len(max_rows: usize, cols: usize) -> usize {
    max_rows.div_ceil(ROWS_PER_TASK).max(1) * cols
}

/// `out = sum_i h[i] * w.row(idx[i])` (`out.len() == w.cols`), neurons in the order given
/// within each run of `ROWS_PER_TASK`, those runs' sums in order. `partials` is scratch of at
/// least `partials_len(idx.len(), w.cols)`.
pub fn axpy_rows(
    ks: KernelSet,
    pool: &WorkerPool,
    w: Rows,
    idx: &[u32],
    h: &[f32],
    partials: &mut [f32],
    out: &mut [f32],
) {
    let k = ks.kernel;
    assert!(
        crate::backend::cpu::kernel::kernel_supported(k),
        "{k:?} kernels are not supported on this CPU"
    );
    assert!(
        column_type_supported(w.ty),
        "no axpy kernel for {}",
        w.ty.name()
    );
    let cols = w.cols;
    assert_eq!(
        out.len(),
        cols,
        "output {} values, rows of {cols}",
        out.len()
    );
    assert_eq!(
        idx.len(),
        h.len(),
        "{} indices, {} values",
        idx.len(),
        h.len()
    );
    assert!(
        cols.is_multiple_of(QK),
        "rows of {cols} values are not 32-groups"
    );
    let tasks = idx.len().div_ceil(ROWS_PER_TASK);
    assert!(
        partials.len() >= partials_len(idx.len(), cols),
        "axpy scratch of {} values, need {}",
        partials.len(),
        partials_len(idx.len(), cols)
    );
    let row_bytes = w.row_bytes();
    if let Some(&m) = idx.iter().max() {
        assert!((m as usize) < w.rows, "row {m} of {}", w.rows);
    }
    let row = |r: u32| &w.data[w.offset(r as usize)..][..row_bytes];
    let pp = OutPtr(partials.as_mut_ptr());
    pool.run(tasks, &|t| {
        let ids = &idx[t * ROWS_PER_TASK..((t + 1) * ROWS_PER_TASK).min(idx.len())];
        let hs = &h[t * ROWS_PER_TASK..][..ids.len()];
        // SAFETY: task t owns partials[t * cols..(t + 1) * cols] (asserted long enough above).
        let o = unsafe { std::slice::from_raw_parts_mut(pp.ptr().add(t * cols), cols) };
        axpy_run(ks, w.ty, ids, &row, hs, o);
    });
    sum_partials(partials, tasks, cols, out);
}

/// `o = sum_i hs[i] * row(ids[i])`, four rows at a time where a kernel allows: one run of
/// [`axpy_rows`] (which calls it per task). A caller whose rows are scattered (the weight
/// cache's slots) sums a run of the same neurons in the same order, and gets the same bits.
/// Each row must hold `o.len()` values of `ty` (a type `column_type_supported` accepts).
pub fn axpy_run<'r>(
    ks: KernelSet,
    ty: GgmlType,
    ids: &[u32],
    row: &dyn Fn(u32) -> &'r [u8],
    hs: &[f32],
    o: &mut [f32],
) {
    let k = ks.kernel;
    assert!(
        crate::backend::cpu::kernel::kernel_supported(k) && column_type_supported(ty),
        "no {k:?} axpy kernel for {} on this CPU",
        ty.name()
    );
    assert_eq!(ids.len(), hs.len(), "one value per row");
    let rb = ty.row_bytes(o.len()).expect("whole 32-groups");
    let f = axpy_fn(ty, k);
    let f4 = axpy4_fn(ty, k);
    let row = |r: u32| {
        let b = row(r);
        assert!(b.len() >= rb, "a row of {} bytes, need {rb}", b.len());
        b
    };
    o.fill(0.0);
    // The rows a token needs are scattered: each is prefetched a few rows ahead.
    let prefetch_ahead = |i: usize| prefetch_gathered(ids, i, row);
    let mut i = 0;
    if let Some(f4) = f4 {
        while i + 4 <= ids.len() {
            prefetch_ahead(i);
            let s = [0, 1, 2, 3].map(|k| row(ids[i + k]));
            // SAFETY: `axpy4_fn` picked a kernel this CPU supports; each `s[k]` holds at least
            // a whole row of `o.len()` values (asserted in `row`).
            unsafe { f4(ty, s, [hs[i], hs[i + 1], hs[i + 2], hs[i + 3]], o) };
            i += 4;
        }
    }
    while i < ids.len() {
        prefetch_ahead(i);
        // SAFETY: `axpy_fn` picked a kernel this CPU supports (asserted above); the row holds
        // the `o.len()` values `o` covers.
        unsafe { f(ty, row(ids[i]), hs[i], o) };
        i += 1;
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

    /// `axpy` of four rows at once: per output group, the accumulators stay in registers
    /// while the four rows are added in order (so the sums are `axpy`'s, bit for bit).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn axpy4(ty: GgmlType, src: [&[u8]; 4], h: [f32; 4], out: &mut [f32]) {
        let nb = out.len() / QK;
        let op = out.as_mut_ptr();
        let sp = src.map(|s| s.as_ptr());
        match ty {
            GgmlType::Q8_0 => {
                debug_assert!(src.iter().all(|s| s.len() >= nb * 34));
                for b in 0..nb {
                    let o = op.add(b * QK);
                    let mut acc = [0, 8, 16, 24].map(|i| _mm256_loadu_ps(o.add(i)));
                    for k in 0..4 {
                        let p = sp[k].add(b * 34);
                        let s = _mm256_set1_ps(h[k] * f16_at(p));
                        for (g, a) in acc.iter_mut().enumerate() {
                            let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(2 + 8 * g).cast()));
                            *a = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(q), *a);
                        }
                    }
                    for (g, a) in acc.iter().enumerate() {
                        _mm256_storeu_ps(o.add(8 * g), *a);
                    }
                }
            }
            GgmlType::Q4_0 | GgmlType::Q4_1 => {
                let (bytes, qs) = if ty == GgmlType::Q4_1 {
                    (20, 4)
                } else {
                    (18, 2)
                };
                debug_assert!(src.iter().all(|s| s.len() >= nb * bytes));
                let mask = _mm_set1_epi8(0x0F);
                for b in 0..nb {
                    let o = op.add(b * QK);
                    let mut acc = [0, 8, 16, 24].map(|i| _mm256_loadu_ps(o.add(i)));
                    for k in 0..4 {
                        let p = sp[k].add(b * bytes);
                        let d = h[k] * f16_at(p);
                        let c = if ty == GgmlType::Q4_1 {
                            h[k] * f16_at(p.add(2))
                        } else {
                            -8.0 * d
                        };
                        let (s, c) = (_mm256_set1_ps(d), _mm256_set1_ps(c));
                        let t = _mm_loadu_si128(p.add(qs).cast());
                        let lo = _mm_and_si128(t, mask);
                        let hi = _mm_and_si128(_mm_srli_epi16(t, 4), mask);
                        let v = [lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)];
                        for (a, v) in acc.iter_mut().zip(v) {
                            let q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
                            *a = _mm256_fmadd_ps(s, q, _mm256_add_ps(*a, c));
                        }
                    }
                    for (g, a) in acc.iter().enumerate() {
                        _mm256_storeu_ps(o.add(8 * g), *a);
                    }
                }
            }
            _ => {
                for (s, h) in src.iter().zip(h) {
                    axpy_scalar(ty, s, h, out);
                }
            }
        }
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
        let (rows, cols) = (160, 96);
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
                tile: crate::backend::cpu::matvec::Tile::NONE,
                data: &data,
            };
            // More than one task's worth of rows, in a scrambled order, one repeated.
            let mut idx: Vec<u32> = (0..150).map(|i| (i * 37 % rows) as u32).collect();
            idx[5] = idx[90];
            let h: Vec<f32> = idx.iter().map(|_| rng(&mut seed)).collect();
            let mut want = vec![0f64; cols];
            let mut y = vec![0f32; cols];
            for (&r, &hv) in idx.iter().zip(&h) {
                dequantize_row(ty, w.row(r as usize), &mut y);
                for (a, b) in want.iter_mut().zip(&y) {
                    *a += hv as f64 * *b as f64;
                }
            }
            let one_thread = WorkerPool::new(1);
            for k in [Kernel::Scalar, crate::backend::cpu::matvec::best_kernel()] {
                let mut out = vec![9f32; cols];
                let mut partials = vec![7f32; partials_len(idx.len(), cols)];
                axpy_rows(
                    KernelSet::with(k),
                    &pool,
                    w,
                    &idx,
                    &h,
                    &mut partials,
                    &mut out,
                );
                let mut out1 = vec![5f32; cols];
                axpy_rows(
                    KernelSet::with(k),
                    &one_thread,
                    w,
                    &idx,
                    &h,
                    &mut partials,
                    &mut out1,
                );
                assert_eq!(out, out1, "{ty:?} {k:?}: 1 and 2 threads differ");
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
