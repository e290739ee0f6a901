//! The K-quant kernels against ggml's dequantization: on the int8 input they must give the
//! f64 dot of the dequantized weights with the dequantized input up to float rounding; on the
//! f32 input (the old f32 path's arithmetic) they differ by at most the input's int8 rounding.

use super::*;
use crate::backend::cpu::matvec::{
    best_kernel, matvec, ActScales, ActScratch, Kernel, KernelSet, Matrix, WorkerPool,
};
use crate::model::ggml::dequantize_row;

const TYPES: [GgmlType; 3] = [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];

/// Tiny seeded generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn byte(&mut self) -> u8 {
        (self.next() >> 56) as u8
    }
    /// Uniform in [-1, 1).
    fn f(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    /// A positive normal f16 of magnitude 2^-10 .. 2^-3.
    fn f16_scale(&mut self) -> u16 {
        let exp = 5 + (self.next() % 8) as u16;
        (exp << 10) | (self.next() % 1024) as u16
    }
}

/// Valid super-blocks: random quants, scales and mins (every bit pattern is valid), sane
/// positive f16 `d` (and `dmin`), as a quantizer writes them.
fn random_rows(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut data: Vec<u8> = (0..ty.row_bytes(cols).unwrap() * rows)
        .map(|_| rng.byte())
        .collect();
    for b in data.chunks_exact_mut(ty.block_bytes()) {
        let at: &[usize] = if ty == GgmlType::Q6_K {
            &[208]
        } else {
            &[0, 2]
        };
        for &o in at {
            b[o..o + 2].copy_from_slice(&rng.f16_scale().to_le_bytes());
        }
    }
    data
}

/// Per row: the f64 dot of the dequantized weights with `x`, and the sum of |terms|.
fn reference(ty: GgmlType, w: &[u8], rows: usize, x: &[f32]) -> Vec<(f64, f64)> {
    let rb = ty.row_bytes(x.len()).unwrap();
    let mut y = vec![0f32; x.len()];
    (0..rows)
        .map(|r| {
            dequantize_row(ty, &w[r * rb..][..rb], &mut y);
            y.iter().zip(x).fold((0f64, 0f64), |(s, m), (&w, &x)| {
                let t = w as f64 * x as f64;
                (s + t, m + t.abs())
            })
        })
        .collect()
}

/// `x` as the kernels see it when K-quant rows alone read it (one scale per 256 values):
/// each value its int8 times its group's scale.
fn int8_input(x: &[f32]) -> Vec<f32> {
    int8_input_in(x, ActScales::SuperBlock)
}

/// `x` as the kernels see it in the form `scales`.
fn int8_input_in(x: &[f32], scales: ActScales) -> Vec<f32> {
    let mut s = ActScratch::new(x.len());
    let a = s.quantize(x, false, scales);
    (0..x.len()).map(|c| a.d[c / QK] * a.qs[c] as f32).collect()
}

/// Every kernel set this CPU runs: scalar, and AVX2 with and without VNNI.
fn kernel_sets() -> Vec<KernelSet> {
    let mut v = vec![KernelSet::scalar()];
    if best_kernel() != Kernel::Scalar {
        v.push(KernelSet::best());
        v.push(KernelSet {
            vnni: false,
            ..KernelSet::best()
        });
    }
    v
}

fn run(ks: KernelSet, threads: usize, ty: GgmlType, w: &[u8], rows: usize, x: &[f32]) -> Vec<f32> {
    let m = Matrix {
        ty,
        q: None,
        rows,
        cols: x.len(),
        data: w,
    };
    let mut act = ActScratch::new(x.len());
    let mut out = vec![f32::NAN; rows];
    matvec(ks, &WorkerPool::new(threads), &m, x, &mut act, &mut out);
    out
}

#[test]
fn scales_and_mins_unpack_as_ggml() {
    // ggml's `get_scale_min_k4`, one sub-block at a time.
    let ggml = |j: usize, q: &[u8]| -> (u8, u8) {
        if j < 4 {
            (q[j] & 63, q[j + 4] & 63)
        } else {
            (
                (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
                (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
            )
        }
    };
    let mut rng = Rng(3);
    for _ in 0..1000 {
        let q: Vec<u8> = (0..12).map(|_| rng.byte()).collect();
        let (sc, m) = q4k_scales_mins(&q);
        for j in 0..8 {
            let got = ((sc >> (8 * j)) as u8, (m >> (8 * j)) as u8);
            assert_eq!(got, ggml(j, &q), "sub-block {j} of {q:?}");
        }
    }
}

/// On the int8 input, every kernel gives the dequantized weights' f64 dot up to float rounding
/// (the classic kernels' tolerance), for row counts that are and are not whole chunks of four
/// and whole tasks of the pool.
#[test]
fn kernels_match_dequantized_reference_on_int8_input() {
    for ty in TYPES {
        for (i, cols) in [256, 1536, 2304].into_iter().enumerate() {
            for rows in [1, 3, 4, 7, 67] {
                let mut rng = Rng(17 + 100 * i as u64 + rows as u64);
                let w = random_rows(&mut rng, ty, rows, cols);
                let x: Vec<f32> = (0..cols).map(|_| rng.f() * 2.0).collect();
                let want = reference(ty, &w, rows, &int8_input(&x));
                for threads in [1, 3] {
                    for ks in kernel_sets() {
                        let got = run(ks, threads, ty, &w, rows, &x);
                        for (r, (&g, &(v, mag))) in got.iter().zip(&want).enumerate() {
                            let tol = 1e-5 * mag + 1e-6;
                            assert!(
                                (g as f64 - v).abs() <= tol,
                                "{} {ks:?} {rows}x{cols} row {r}: got {g}, want {v} (tol {tol})",
                                ty.name()
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Against the f32 input (what the f32 path computed, exactly), the difference is bounded by
/// the input's int8 rounding: each value is off by at most half its group's scale, so a row
/// is off by at most `sum |w_c| * d_x / 2` (plus float rounding). On random data the typical
/// error is far below that bound: the rms relative error stays under 1%.
#[test]
fn kernels_are_within_input_rounding_of_the_f32_dot() {
    let cols = 1536;
    let rows = 45;
    for ty in TYPES {
        let mut rng = Rng(0xF32 + ty as u64);
        let w = random_rows(&mut rng, ty, rows, cols);
        let x: Vec<f32> = (0..cols).map(|_| rng.f() * 4.0).collect();
        let want = reference(ty, &w, rows, &x);
        let mut s = ActScratch::new(cols);
        let d = s.quantize(&x, false, ActScales::SuperBlock).d.to_vec();
        let rb = ty.row_bytes(cols).unwrap();
        let mut y = vec![0f32; cols];
        let bounds: Vec<f64> = (0..rows)
            .map(|r| {
                dequantize_row(ty, &w[r * rb..][..rb], &mut y);
                y.iter()
                    .enumerate()
                    .map(|(c, w)| w.abs() as f64 * d[c / QK] as f64 / 2.0)
                    .sum()
            })
            .collect();
        for ks in kernel_sets() {
            let got = run(ks, 2, ty, &w, rows, &x);
            let (mut err2, mut ref2) = (0f64, 0f64);
            for (r, &g) in got.iter().enumerate() {
                let (v, mag) = want[r];
                let tol = bounds[r] + 1e-5 * mag + 1e-6;
                let e = g as f64 - v;
                assert!(
                    e.abs() <= tol,
                    "{} {ks:?} row {r}: got {g}, f32 path {v} (bound {tol})",
                    ty.name()
                );
                (err2, ref2) = (err2 + e * e, ref2 + v * v);
            }
            let rel = (err2 / ref2).sqrt();
            assert!(rel < 0.01, "{} {ks:?}: rms relative error {rel}", ty.name());
        }
    }
}

/// The AVX2 kernels (every VNNI form) and the scalar one make the same int32 sums per group,
/// so they agree to float rounding, on an input in either scale form (as do the AVX-512 Q4_K
/// and Q6_K kernels where the CPU has them: their integer super-block sums on the one-scale
/// form, the ymm kernels on the other); the ymm kernels' VNNI and `maddubs` forms agree bit
/// for bit. Extreme
/// blocks (every quant and scale at its largest, Q6_K scales at -128, inputs at +-127) would
/// show any saturation in the 16-bit `maddubs` pairs.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_agrees_with_scalar() {
    use crate::backend::cpu::lowbit::x86::{vnni, VNNI_NONE};
    if best_kernel() != Kernel::Avx2 {
        eprintln!("skipped: this CPU has no AVX2");
        return;
    }
    let (rows, cols) = (37, 768);
    for ty in TYPES {
        for case in 0..3 {
            let mut rng = Rng(0xA2 + 10 * case + ty as u64);
            let mut w = random_rows(&mut rng, ty, rows, cols);
            let mut x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
            if case == 1 {
                // Quants and scales at their extremes.
                for b in w.chunks_exact_mut(ty.block_bytes()) {
                    match ty {
                        GgmlType::Q4_K | GgmlType::Q5_K => b[4..].fill(0xFF),
                        _ => {
                            b[..192].fill(0xFF);
                            b[192..208].fill(0x80);
                        }
                    }
                }
                for v in x.iter_mut() {
                    *v = if v.is_sign_negative() { -1.0 } else { 1.0 };
                }
            } else if case == 2 {
                // Q6_K's most negative quant (0 - 32) with the largest positive scale.
                for b in w.chunks_exact_mut(ty.block_bytes()) {
                    match ty {
                        GgmlType::Q4_K | GgmlType::Q5_K => b[16..].fill(0),
                        _ => {
                            b[..192].fill(0);
                            b[192..208].fill(0x7F);
                        }
                    }
                }
            }
            for scales in [ActScales::SuperBlock, ActScales::Block] {
                let what = format!("{} case {case} {scales:?}", ty.name());
                let mut s = ActScratch::new(cols);
                let a = s.quantize(&x, false, scales);
                let rb = ty.row_bytes(cols).unwrap();
                let mags = reference(ty, &w, rows, &int8_input_in(&x, scales));
                let call = |f: ChunkFn| {
                    let mut out = vec![f32::NAN; rows];
                    // SAFETY: AVX2 is present (checked above) for the x86 forms, and a VNNI form
                    // only where `vnni_form` found it; `w` holds `rows` rows of `rb` bytes and `a`
                    // covers their columns.
                    unsafe { f(&w, rb, rb, &a, &mut out) };
                    out
                };
                let scalar = call(scalar_chunk_fn(ty));
                let plain = call(avx2_chunk_fn(
                    ty,
                    KernelSet {
                        vnni: false,
                        ..KernelSet::best()
                    },
                ));
                // The ymm kernels in this CPU's VNNI form, and what `best` runs (for Q6_K on a
                // CPU with AVX-512 VNNI, the zmm kernel).
                let vnni_ymm = call(avx2_chunk_fn(
                    ty,
                    KernelSet {
                        avx512: false,
                        ..KernelSet::best()
                    },
                ));
                let best = call(avx2_chunk_fn(ty, KernelSet::best()));
                // Software prefetch (`KernelSet::prefetch`) changes no result.
                let flipped = call(avx2_chunk_fn(
                    ty,
                    KernelSet {
                        prefetch: !KernelSet::best().prefetch,
                        ..KernelSet::best()
                    },
                ));
                assert_eq!(flipped, best, "{what}: prefetch");
                assert!(scalar.iter().any(|&v| v != 0.0), "{what}");
                for r in 0..rows {
                    let (v, mag) = mags[r];
                    let tol = 1e-5 * mag + 1e-6;
                    assert!(
                        (plain[r] as f64 - scalar[r] as f64).abs() <= tol,
                        "{what} row {r}: avx2 {} scalar {} (tol {tol})",
                        plain[r],
                        scalar[r]
                    );
                    assert!(
                        (best[r] as f64 - scalar[r] as f64).abs() <= tol,
                        "{what} row {r}: best {} scalar {} (tol {tol})",
                        best[r],
                        scalar[r]
                    );
                    assert!(
                        (scalar[r] as f64 - v).abs() <= tol,
                        "{what} row {r}: scalar {} reference {v}",
                        scalar[r]
                    );
                }
                assert_eq!(vnni_ymm, plain, "{what}: VNNI form");
            }
        }
    }
    if vnni() == VNNI_NONE {
        eprintln!("skipped: this CPU has no AVX-VNNI or AVX512-VNNI (the maddubs form alone ran)");
    }
}

/// The NEON kernels make the scalar kernels' int32 sums and add the floats in their order, so
/// the results are bit-identical, extreme blocks included.
#[cfg(target_arch = "aarch64")]
#[test]
fn neon_equals_scalar() {
    let (rows, cols) = (13, 768);
    for ty in TYPES {
        for case in 0..2 {
            let mut rng = Rng(0x4E0 + 10 * case + ty as u64);
            let mut w = random_rows(&mut rng, ty, rows, cols);
            if case == 1 {
                for b in w.chunks_exact_mut(ty.block_bytes()) {
                    match ty {
                        GgmlType::Q4_K | GgmlType::Q5_K => b[4..].fill(0xFF),
                        _ => {
                            b[..192].fill(0);
                            b[192..208].fill(0x80);
                        }
                    }
                }
            }
            let x: Vec<f32> = (0..cols).map(|_| rng.f() * 3.0).collect();
            let mut s = ActScratch::new(cols);
            let a = s.quantize(&x, false, ActScales::SuperBlock);
            let rb = ty.row_bytes(cols).unwrap();
            let call = |f: ChunkFn| {
                let mut out = vec![f32::NAN; rows];
                // SAFETY: NEON is baseline on aarch64; `w` holds `rows` rows of `rb` bytes and
                // `a` covers their columns.
                unsafe { f(&w, rb, rb, &a, &mut out) };
                out
            };
            let scalar = call(scalar_chunk_fn(ty));
            assert!(
                scalar.iter().any(|&v| v != 0.0),
                "{} case {case}",
                ty.name()
            );
            assert_eq!(call(neon_chunk_fn(ty)), scalar, "{} case {case}", ty.name());
        }
    }
}
