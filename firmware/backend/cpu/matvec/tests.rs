use super::*;
use crate::model::ggml::dequantize_row;

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
    /// A random normal-range f16 of magnitude about 2^-10 .. 2^-3, either sign.
    fn f16_small(&mut self) -> u16 {
        let exp = 5 + (self.next() % 8) as u16; // 2^(exp-15)
        let man = (self.next() % 1024) as u16;
        let sign = (self.next() & 1) as u16;
        (sign << 15) | (exp << 10) | man
    }
}

fn kernels() -> Vec<Kernel> {
    let mut k = vec![Kernel::Scalar];
    if best_kernel() != Kernel::Scalar {
        k.push(best_kernel());
    }
    k
}

const ALL: [GgmlType; 11] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Random weights: random quant bytes, sane scale fields.
fn random_matrix(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let rb = ty.row_bytes(cols).unwrap();
    let mut data: Vec<u8> = (0..rb * rows).map(|_| rng.byte()).collect();
    let put = |d: &mut [u8], at: usize, h: u16| d[at..at + 2].copy_from_slice(&h.to_le_bytes());
    match ty {
        GgmlType::F32 => {
            for w in data.chunks_exact_mut(4) {
                w.copy_from_slice(&rng.f().to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for w in data.chunks_exact_mut(2) {
                put(w, 0, rng.f16_small() + (3 << 10));
            }
        }
        GgmlType::BF16 => {
            for w in data.chunks_exact_mut(2) {
                put(w, 0, (rng.f().to_bits() >> 16) as u16);
            }
        }
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => {
            for b in data.chunks_exact_mut(ty.block_bytes()) {
                put(b, 0, rng.f16_small());
            }
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 => {
            for b in data.chunks_exact_mut(ty.block_bytes()) {
                put(b, 0, rng.f16_small() & 0x7fff);
                put(b, 2, rng.f16_small());
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            for b in data.chunks_exact_mut(ty.block_bytes()) {
                put(b, 0, rng.f16_small() & 0x7fff);
                put(b, 2, rng.f16_small() & 0x7fff);
            }
        }
        GgmlType::Q6_K => {
            for b in data.chunks_exact_mut(ty.block_bytes()) {
                put(b, 208, rng.f16_small() & 0x7fff);
            }
        }
    }
    data
}

/// Reference products in f64 and the sum of |terms| (for the tolerance). Int8 types dot the
/// same int8-quantized activations the kernels use; the others dot `x`.
fn reference(ty: GgmlType, w: &[u8], rows: usize, x: &[f32]) -> Vec<(f64, f64)> {
    let cols = x.len();
    let xa: Vec<f32> = if uses_q8(ty) {
        let mut s = ActScratch::new(cols);
        // The form a matrix of `ty` alone takes its input in.
        let a = s.quantize(x, false, ActScales::for_types(KernelSet::best(), [ty]));
        (0..cols).map(|c| a.d[c / 32] * a.qs[c] as f32).collect()
    } else {
        x.to_vec()
    };
    let rb = ty.row_bytes(cols).unwrap();
    let mut y = vec![0f32; cols];
    (0..rows)
        .map(|r| {
            dequantize_row(ty, &w[r * rb..(r + 1) * rb], &mut y);
            y.iter().zip(&xa).fold((0f64, 0f64), |(s, a), (&w, &x)| {
                let t = w as f64 * x as f64;
                (s + t, a + t.abs())
            })
        })
        .collect()
}

fn check(ty: GgmlType, rows: usize, cols: usize, seed: u64) {
    let mut rng = Rng(seed);
    let w = random_matrix(&mut rng, ty, rows, cols);
    let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
    let want = reference(ty, &w, rows, &x);
    let m = Matrix {
        ty,
        q: None,
        rows,
        cols,
        data: &w,
    };
    let mut act = ActScratch::new(cols.next_multiple_of(32));
    for threads in [1, 3] {
        let pool = WorkerPool::new(threads);
        for k in kernels() {
            let mut out = vec![f32::NAN; rows];
            matvec(KernelSet::with(k), &pool, &m, &x, &mut act, &mut out);
            for (r, (&got, &(v, mag))) in out.iter().zip(&want).enumerate() {
                let tol = 1e-5 * mag + 1e-6;
                assert!(
                    (got as f64 - v).abs() <= tol,
                    "{} {k:?} {rows}x{cols} row {r}: got {got}, want {v} (tol {tol})",
                    ty.name()
                );
            }
        }
    }
}

#[test]
fn classic_types_match_reference() {
    for ty in &ALL[..5] {
        for (i, &cols) in [32, 64, 576, 1536, 4864].iter().enumerate() {
            for rows in [1, 7, 33, 100] {
                check(*ty, rows, cols, 1 + i as u64 * 100 + rows as u64);
            }
        }
    }
}

#[test]
fn float_types_match_reference() {
    for ty in &ALL[5..8] {
        for (i, &cols) in [1, 7, 32, 576, 1537].iter().enumerate() {
            for rows in [1, 7, 65] {
                check(*ty, rows, cols, 7 + i as u64 * 100 + rows as u64);
            }
        }
    }
}

#[test]
fn k_types_match_reference() {
    for ty in &ALL[8..] {
        for (i, &cols) in [256, 768, 1536].iter().enumerate() {
            for rows in [1, 7, 65] {
                check(*ty, rows, cols, 11 + i as u64 * 100 + rows as u64);
            }
        }
    }
}

/// With integer inputs whose block maxima are 127 the activation scale is exactly 1, and with
/// weight scales 1/2 (and min -3) every product and partial sum is exact in f32, so all kernels
/// must equal the integer reference exactly.
#[test]
fn classic_integer_dots_exact() {
    for ty in &ALL[..5] {
        for cols in [32, 576, 4864] {
            let rows = 9;
            let mut rng = Rng(99 + cols as u64);
            let mut w = random_matrix(&mut rng, ty.to_owned(), rows, cols);
            for b in w.chunks_exact_mut(ty.block_bytes()) {
                b[0..2].copy_from_slice(&0x3800u16.to_le_bytes()); // 0.5
                if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                    b[2..4].copy_from_slice(&0xC200u16.to_le_bytes()); // -3.0
                }
            }
            let mut x: Vec<f32> = (0..cols)
                .map(|_| (rng.next() % 255) as f32 - 127.0)
                .collect();
            for xb in x.chunks_exact_mut(32) {
                xb[(rng.next() % 32) as usize] = if rng.next() & 1 == 0 { 127.0 } else { -127.0 };
            }
            let want = reference(*ty, &w, rows, &x);
            let m = Matrix {
                ty: *ty,
                q: None,
                rows,
                cols,
                data: &w,
            };
            let mut act = ActScratch::new(cols);
            let pool = WorkerPool::new(2);
            for k in kernels() {
                let mut out = vec![0f32; rows];
                matvec(KernelSet::with(k), &pool, &m, &x, &mut act, &mut out);
                for (got, (v, _)) in out.iter().zip(&want) {
                    assert_eq!(*got as f64, *v, "{} {k:?} cols {cols}", ty.name());
                }
            }
        }
    }
}

#[test]
fn activation_quantization_is_close() {
    let mut rng = Rng(5);
    let x: Vec<f32> = (0..1536).map(|_| rng.f() * 3.0).collect();
    let mut s = ActScratch::new(1536);
    let a = s.quantize(&x, false, ActScales::Block);
    for (c, &v) in x.iter().enumerate() {
        let d = a.d[c / 32];
        assert!((v - d * a.qs[c] as f32).abs() <= d * 0.5 + 1e-7);
    }
    for b in 0..48 {
        let sum: i32 = a.qs[b * 32..b * 32 + 32].iter().map(|&q| q as i32).sum();
        assert_eq!(a.s[b], a.d[b] * sum as f32);
    }
}

#[test]
fn matvec_many_equals_separate() {
    let mut rng = Rng(42);
    let cols = 576;
    let shapes = [
        (GgmlType::Q4_1, 576),
        (GgmlType::Q8_0, 192),
        (GgmlType::F16, 193),
        (GgmlType::Q4_0, 1),
    ];
    let data: Vec<Vec<u8>> = shapes
        .iter()
        .map(|&(ty, rows)| random_matrix(&mut rng, ty, rows, cols))
        .collect();
    let mats: Vec<Matrix> = shapes
        .iter()
        .zip(&data)
        .map(|(&(ty, rows), d)| Matrix {
            ty,
            q: None,
            rows,
            cols,
            data: d,
        })
        .collect();
    let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
    let mut act = ActScratch::new(1536);
    for threads in [1, 2, 4] {
        let pool = WorkerPool::new(threads);
        for k in kernels() {
            let separate: Vec<Vec<f32>> = mats
                .iter()
                .map(|m| {
                    let mut o = vec![0f32; m.rows];
                    matvec(KernelSet::with(k), &pool, m, &x, &mut act, &mut o);
                    o
                })
                .collect();
            let mut outs: Vec<Vec<f32>> = mats.iter().map(|m| vec![f32::NAN; m.rows]).collect();
            let mut jobs: Vec<(&Matrix, &mut [f32])> = mats
                .iter()
                .zip(outs.iter_mut())
                .map(|(m, o)| (m, &mut o[..]))
                .collect();
            matvec_many(KernelSet::with(k), &pool, &mut jobs, &x, &mut act);
            assert_eq!(outs, separate, "{k:?} threads {threads}");
        }
    }
}

/// Chunks are dealt to workers in lanes (`Part::per_lane`): every row is written once, whatever
/// the row count against the pool size (lanes left short, tasks with no chunk), and the
/// results are bit for bit one thread's.
#[test]
fn lanes_cover_every_row_once() {
    let mut rng = Rng(11);
    let cols = 64;
    let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
    let mut act = ActScratch::new(cols);
    let one = WorkerPool::new(1);
    for rows in [1, 15, 16, 17, 63, 100, 257, 1000] {
        let data = random_matrix(&mut rng, GgmlType::Q8_0, rows, cols);
        let m = Matrix {
            ty: GgmlType::Q8_0,
            q: None,
            rows,
            cols,
            data: &data,
        };
        let mut want = vec![f32::NAN; rows];
        matvec(KernelSet::best(), &one, &m, &x, &mut act, &mut want);
        assert!(
            want.iter().all(|v| v.is_finite()),
            "{rows} rows, one thread"
        );
        for threads in [2, 3, 5, 8] {
            let pool = WorkerPool::new(threads);
            let mut got = vec![f32::NAN; rows];
            matvec(KernelSet::best(), &pool, &m, &x, &mut act, &mut got);
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{rows} rows, {threads} threads");
        }
    }
}

/// A batch of inputs through `matmul_many` gives each input bit for bit what `matvec` gives it
/// alone: every type, a row count that is not a whole four, one and two threads, each kernel.
#[test]
fn matmul_many_equals_matvec_per_input() {
    let mut rng = Rng(7);
    let (rows, cols, n) = (67, 256, 5);
    let xs: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
    let mut acts: Vec<ActScratch> = (0..n).map(|_| ActScratch::new(cols)).collect();
    for ty in ALL {
        let data = random_matrix(&mut rng, ty, rows, cols);
        let m = Matrix {
            ty,
            q: None,
            rows,
            cols,
            data: &data,
        };
        for threads in [1, 2] {
            let pool = WorkerPool::new(threads);
            for k in kernels() {
                let mut want = vec![0f32; n * rows];
                for (x, o) in xs.chunks_exact(cols).zip(want.chunks_exact_mut(rows)) {
                    matvec(KernelSet::with(k), &pool, &m, x, &mut acts[0], o);
                }
                let mut got = vec![f32::NAN; n * rows];
                matmul_many(
                    KernelSet::with(k),
                    &pool,
                    &mut [(&m, &mut got[..])],
                    &xs,
                    &mut acts,
                );
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{ty:?} {k:?} threads {threads}");
            }
        }
    }
}

/// The classic kernels give the same int32 lanes, so the same floats bit for bit, under AVX2
/// (sign trick, `maddubs`) and under the VNNI form this CPU has (unsigned weights from the
/// `Act::ls` start, `vpdpbusd`). Random bytes include Q8_0's -128.
#[cfg(target_arch = "x86_64")]
#[test]
fn classic_vnni_equals_avx2() {
    if !kernel_supported(Kernel::Avx2) {
        eprintln!("skipped: this CPU has no AVX2");
        return;
    }
    let (rows, cols) = (37, 256);
    let mut forms_run = 0;
    for (i, ty) in ALL.into_iter().enumerate() {
        let Some(forms) = x86::classic_forms(ty) else {
            continue;
        };
        let mut rng = Rng(0x51ED_2700 + i as u64);
        let w = random_matrix(&mut rng, ty, rows, cols);
        let x: Vec<f32> = (0..cols).map(|_| rng.f() * 3.0).collect();
        let mut s = ActScratch::new(cols);
        let a = s.quantize(&x, false, ActScales::Block);
        let rb = ty.row_bytes(cols).unwrap();
        let outs: Vec<Vec<f32>> = forms
            .iter()
            .map(|(_, f)| {
                let mut out = vec![0f32; rows];
                // SAFETY: `classic_forms` lists only forms this CPU has; `w` holds `rows` rows
                // of `rb` bytes and `a` covers their blocks.
                unsafe { f(&w, rb, rb, &a, &mut out) };
                out
            })
            .collect();
        assert!(outs[0].iter().any(|&v| v != 0.0));
        for (o, (name, _)) in outs.iter().zip(&forms) {
            assert_eq!(o, &outs[0], "{} under {name}", ty.name());
        }
        forms_run = forms.len();
    }
    if forms_run == 1 {
        eprintln!("skipped: this CPU has no AVX-VNNI or AVX512-VNNI (AVX2 alone ran)");
    }
}

/// The AVX2 activation quantizer gives the scalar one's bytes, scales, sums, lane sums and
/// permuted copy, on values that include exact halves after scaling, zeros and a zero block;
/// in the super-block form (no permuted copy), also its sums of 16.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_quantizer_equals_scalar() {
    if best_kernel() != Kernel::Avx2 {
        eprintln!("skipped: this CPU has no AVX2");
        return;
    }
    let mut rng = Rng(0xA11CE);
    let cols = 256 * 5;
    for case in 0..20 {
        let mut x: Vec<f32> = (0..cols).map(|_| rng.f() * (1 + case) as f32).collect();
        // Block 1: zeros; block 2: multiples of amax / 254 (exact halves after scaling);
        // super-block 3: zeros.
        x[32..64].fill(0.0);
        for (j, v) in x[64..96].iter_mut().enumerate() {
            *v = (j as f32 - 16.0) * 0.5;
        }
        x[768..1024].fill(0.0);
        for (scales, per_scale) in [(ActScales::Block, 1), (ActScales::SuperBlock, 8)] {
            let permuted = scales == ActScales::Block;
            let mut fast = ActScratch::new(cols);
            fast.fill(&x, permuted, scales);
            let nb = cols / 32;
            let (mut qs, mut d, mut s) = (vec![0i8; cols], vec![0f32; nb], vec![0f32; nb]);
            quantize_q8(&x, per_scale, &mut qs, &mut d, &mut s);
            let (mut ls, mut gs) = (vec![0i32; nb * LANES], vec![0i32; nb]);
            lane_sums(&qs, &mut ls, &mut gs);
            let what = format!("case {case} {scales:?}");
            if permuted {
                let mut qp = vec![0i8; cols];
                crate::backend::cpu::lowbit::permute_act(&qs, &mut qp);
                assert_eq!(fast.qp, qp, "{what}");
            } else {
                let hs: Vec<i16> = qs
                    .chunks_exact(16)
                    .map(|r| -r.iter().map(|&q| q as i16).sum::<i16>())
                    .collect();
                assert_eq!(fast.hs, hs, "{what}");
                for run in d.chunks_exact(8) {
                    assert!(run.iter().all(|&v| v == run[0]), "{what}: one scale a run");
                }
            }
            assert_eq!(fast.qs, qs, "{what}");
            assert_eq!(fast.d, d, "{what}");
            assert_eq!(fast.s, s, "{what}");
            assert_eq!(fast.ls, ls, "{what}");
            assert_eq!(fast.gs, gs, "{what}");
        }
    }
}

/// An input takes one scale per 256 values only when every int8 row reading it is a K-quant
/// (the classic types keep a scale per 32) and the kernel set allows it; float rows read
/// floats and do not count.
#[test]
fn act_scales_follow_the_row_types() {
    use GgmlType::*;
    let form = |t: &[GgmlType]| ActScales::for_types(KernelSet::best(), t.iter().copied());
    assert_eq!(form(&[Q4_K]), ActScales::SuperBlock);
    assert_eq!(form(&[Q4_K, Q6_K, Q5_K]), ActScales::SuperBlock);
    assert_eq!(form(&[Q4_K, F16]), ActScales::SuperBlock);
    assert_eq!(form(&[Q4_K, Q5_0]), ActScales::Block);
    assert_eq!(form(&[Q8_0, Q6_K]), ActScales::Block);
    assert_eq!(form(&[Q4_0]), ActScales::Block);
    assert_eq!(form(&[F32]), ActScales::Block);
    assert_eq!(form(&[]), ActScales::Block);
    // The `k-block-scales` ablation keeps a scale per 32 for K-quants too.
    let finer = KernelSet {
        superblock_scales: false,
        ..KernelSet::best()
    };
    assert_eq!(ActScales::for_types(finer, [Q4_K]), ActScales::Block);
}
