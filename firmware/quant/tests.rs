use super::*;
use crate::backend::cpu::matvec::{best_kernel, matvec, ActScratch, Kernel, KernelSet, Matrix};
use crate::backend::cpu::WorkerPool;
use crate::model::ggml::f16_to_f32;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Roughly normal-ish in (-1, 1), with occasional outliers.
    fn f(&mut self) -> f32 {
        let u = ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0;
        if self.next().is_multiple_of(50) {
            u * 8.0
        } else {
            u
        }
    }
}

fn kernels() -> Vec<Kernel> {
    let mut k = vec![Kernel::Scalar];
    if best_kernel() != Kernel::Scalar {
        k.push(best_kernel());
    }
    k
}

fn f32_tensor(rng: &mut Rng, rows: usize, cols: usize) -> Vec<u8> {
    (0..rows * cols)
        .flat_map(|_| rng.f().to_le_bytes())
        .collect()
}

#[test]
fn parses_names_and_refuses_unknown() {
    for p in Precision::ALL {
        assert_eq!(Precision::parse(p.name()).unwrap(), p);
    }
    for p in Packing::ALL {
        assert_eq!(Packing::parse(p.name()).unwrap(), p);
    }
    let e = Precision::parse("w2a8").unwrap_err();
    assert_eq!(e, QuantError::UnknownPrecision("w2a8".into()));
    assert!(e.to_string().contains("unknown precision 'w2a8'"), "{e}");
    let e = Packing::parse("zigzag").unwrap_err();
    assert_eq!(e, QuantError::UnknownPacking("zigzag".into()));
    assert!(e.to_string().contains("unknown packing 'zigzag'"), "{e}");
}

#[test]
fn packings_round_trip_every_group() {
    let mut rng = Rng(7);
    let (rows, cols) = (45, 96);
    for p in Packing::ALL {
        let f = QFormat::W4(p);
        let mut data = vec![0xAAu8; f.matrix_bytes(rows, cols)];
        let mut want = Vec::new();
        for r in 0..rows {
            for g in 0..cols / GROUP {
                let d = (rng.next() & 0x7BFF) as u16;
                let mut q = [0u8; GROUP];
                for v in q.iter_mut() {
                    *v = (rng.next() & 0xF) as u8;
                }
                write_w4_group(&mut data, p, cols, r, g, d, &q);
                want.push((d, q));
            }
        }
        let mut i = 0;
        for r in 0..rows {
            for g in 0..cols / GROUP {
                assert_eq!(
                    read_w4_group(&data, p, cols, r, g),
                    want[i],
                    "{p:?} r{r} g{g}"
                );
                i += 1;
            }
        }
    }
}

#[test]
fn interleaved_word_unpacks_with_one_shift_and_two_masks() {
    let q: [u8; GROUP] = std::array::from_fn(|i| (i % 16) as u8 ^ (i / 16) as u8);
    let words = pack_w4_words(Packing::Interleaved, &q);
    for (k, w) in words.iter().enumerate() {
        let w = u32::from_le_bytes(*w);
        assert_eq!((w & 0x0F0F0F0F).to_le_bytes(), q[8 * k..8 * k + 4]);
        assert_eq!(
            ((w >> 4) & 0x0F0F0F0F).to_le_bytes(),
            q[8 * k + 4..8 * k + 8]
        );
    }
}

#[test]
fn q4_0_and_q8_0_import_as_is() {
    let mut rng = Rng(3);
    let (rows, cols) = (33, 64);
    let raw = f32_tensor(&mut rng, rows, cols);
    let f32t = TensorRef {
        ty: GgmlType::F32,
        rows,
        cols,
        data: &raw,
    };
    let mut scratch = Vec::new();
    // A Q4_0 tensor, made with ggml's layout from our own RTN groups.
    let mut q40 = vec![0u8; rows * cols / 32 * 18];
    let x: Vec<f32> = raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    for (gi, blk) in q40.chunks_exact_mut(18).enumerate() {
        let (d, q) = quantize_w4_group(&x[gi * 32..][..32]);
        blk.copy_from_slice(&q4_0_block(d, &q));
    }
    let q40t = TensorRef {
        ty: GgmlType::Q4_0,
        rows,
        cols,
        data: &q40,
    };
    for p in Packing::ALL {
        let tgt = Target::Q(QFormat::W4(p));
        let mut a = vec![0u8; target_bytes(tgt, &q40t)];
        let mut b = vec![0u8; target_bytes(tgt, &f32t)];
        assert_eq!(convert(tgt, &q40t, &mut a, &mut scratch), Conversion::AsIs);
        assert_eq!(
            convert(tgt, &f32t, &mut b, &mut scratch),
            Conversion::Requantized
        );
        assert_eq!(a, b, "{p:?}: Q4_0 import equals RTN requantization");
        let mut ref_row = vec![0f32; cols];
        let mut got = vec![0f32; cols];
        for r in 0..rows {
            dequantize_row(GgmlType::Q4_0, &q40[r * 36..][..36], &mut ref_row);
            dequantize_q_row(QFormat::W4(p), &a, cols, r, &mut got);
            assert_eq!(ref_row, got);
        }
    }
    let mut q80 = vec![0u8; rows * cols / 32 * 34];
    for r in 0..rows {
        quantize_row_q8_0(&x[r * cols..][..cols], &mut q80[r * 68..][..68]);
    }
    let q80t = TensorRef {
        ty: GgmlType::Q8_0,
        rows,
        cols,
        data: &q80,
    };
    let mut a = vec![0u8; q80.len()];
    assert_eq!(
        convert(Target::Q(QFormat::W8), &q80t, &mut a, &mut scratch),
        Conversion::AsIs
    );
    assert_eq!(a, q80);
}

#[test]
fn quantization_error_within_bounds() {
    let mut rng = Rng(11);
    let (mut err4, mut n) = (0f64, 0);
    for _ in 0..500 {
        let x: Vec<f32> = (0..32).map(|_| rng.f()).collect();
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        // w4: |x - d(q-8)| <= |d| / 2, except where the positive end clips at 15 (<= |d|).
        let (d, q) = quantize_w4_group(&x);
        let d = f16_to_f32(d);
        for (&v, &qi) in x.iter().zip(&q) {
            let err = (v - d * (qi as f32 - 8.0)).abs();
            let bound = if qi == 15 { 1.0 } else { 0.5 };
            assert!(
                err <= d.abs() * bound * 1.01 + 1e-6,
                "w4 {v} -> {qi} (d {d})"
            );
            if d != 0.0 {
                err4 += (err as f64 / d.abs() as f64).powi(2);
            }
            n += 1;
        }
        // w8: |x - d q| <= d / 2 (+ the f16 rounding of d), d = amax / 127.
        let mut blk = [0u8; 34];
        quantize_row_q8_0(&x, &mut blk);
        let d8 = f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
        for (j, &v) in x.iter().enumerate() {
            let err = (v - d8 * (blk[2 + j] as i8) as f32).abs();
            assert!(err <= amax / 127.0 * 0.5 + amax * 2e-3, "w8 {v}");
        }
    }
    // Rounding to nearest: rms error about one step / sqrt(12) = 0.29 steps.
    let rms4 = (err4 / n as f64).sqrt();
    assert!(rms4 < 0.35, "w4 rms error {rms4} steps");
}

/// Every kernel and packing: int32 group dots equal the scalar reference, and the products are
/// bit-identical across kernels and packings.
#[test]
fn integer_kernels_match_scalar_reference_exactly() {
    let mut rng = Rng(5);
    let pool = WorkerPool::new(2);
    for (rows, cols) in [(37, 96), (64, 32), (131, 256), (5, 576)] {
        let raw = f32_tensor(&mut rng, rows, cols);
        let t = TensorRef {
            ty: GgmlType::F32,
            rows,
            cols,
            data: &raw,
        };
        let x: Vec<f32> = (0..cols).map(|_| rng.f()).collect();
        let mut act = ActScratch::new(cols);
        let mut scratch = Vec::new();
        let mut w4_results: Vec<Vec<f32>> = Vec::new();
        for f in [
            QFormat::W8,
            QFormat::W4(Packing::Contiguous),
            QFormat::W4(Packing::Interleaved),
            QFormat::W4(Packing::Swizzled),
        ] {
            let mut data = vec![0u8; f.matrix_bytes(rows, cols)];
            convert(Target::Q(f), &t, &mut data, &mut scratch);
            let m = Matrix {
                ty: f.ggml_type(),
                q: Some(f),
                rows,
                cols,
                data: &data,
            };
            // The scalar reference: exact int32 per group, scaled in group order.
            let mut qs = vec![0i8; cols];
            let mut dx = vec![0f32; cols / 32];
            for (g, xb) in x.chunks_exact(32).enumerate() {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                for (j, &v) in xb.iter().enumerate() {
                    qs[g * 32 + j] = (v * id).round() as i8;
                }
                dx[g] = d;
            }
            let rb = f.ggml_type().row_bytes(cols).unwrap();
            let want: Vec<f32> = (0..rows)
                .map(|r| {
                    let mut acc = 0f32;
                    for (g, &dxg) in dx.iter().enumerate() {
                        let i =
                            crate::backend::cpu::lowbit::group_dot_scalar(f, &data, rb, r, g, &qs);
                        let s = match f {
                            QFormat::W8 => r * rb + g * 34,
                            QFormat::W4(p) => w4_offsets(p, cols, r, g).0,
                        };
                        let d = f16_to_f32(u16::from_le_bytes([data[s], data[s + 1]])) * dxg;
                        acc += d * i as f32;
                    }
                    acc
                })
                .collect();
            for k in kernels() {
                let mut out = vec![0f32; rows];
                matvec(KernelSet::with(k), &pool, &m, &x, &mut act, &mut out);
                assert_eq!(out, want, "{} {k:?} {rows}x{cols}", f.name());
            }
            if f != QFormat::W8 {
                w4_results.push(want);
            }
        }
        assert!(
            w4_results.windows(2).all(|w| w[0] == w[1]),
            "packings differ"
        );
    }
}

/// w4a8's policy by name: 8 bits for embeddings/head, attention's q/k/v and the FFN's down
/// projection everywhere, and every matrix of the first and the last layer; 4 bits otherwise.
#[test]
fn roles_keep_sensitive_matrices_and_edge_layers_in_w8() {
    let n = 30;
    assert_eq!(Role::of("token_embd.weight", n), Role::EmbedOrOutput);
    assert_eq!(Role::of("output.weight", n), Role::EmbedOrOutput);
    for name in ["attn_q", "attn_k", "attn_v", "ffn_down"] {
        assert_eq!(
            Role::of(&format!("blk.7.{name}.weight"), n),
            Role::Sensitive
        );
    }
    for name in ["attn_output", "ffn_gate", "ffn_up"] {
        assert_eq!(Role::of(&format!("blk.7.{name}.weight"), n), Role::Block);
        assert_eq!(Role::of(&format!("blk.1.{name}.weight"), n), Role::Block);
        assert_eq!(Role::of(&format!("blk.28.{name}.weight"), n), Role::Block);
        assert_eq!(
            Role::of(&format!("blk.0.{name}.weight"), n),
            Role::Sensitive
        );
        assert_eq!(
            Role::of(&format!("blk.29.{name}.weight"), n),
            Role::Sensitive
        );
    }
    assert_eq!(layer_of("blk.12.ffn_up.weight"), Some(12));
    assert_eq!(layer_of("output_norm.weight"), None);
    let q4 = GgmlType::Q4_0;
    assert_eq!(
        target(Precision::W4a8, Packing::Interleaved, Role::Block, q4, 64),
        Target::Q(QFormat::W4(Packing::Interleaved))
    );
    assert_eq!(
        target(
            Precision::W4a8,
            Packing::Interleaved,
            Role::Sensitive,
            q4,
            64
        ),
        Target::Q(QFormat::W8)
    );
    // Native imports the two group-32 types into the integer kernels' formats, as they are,
    // whatever the role, and keeps every other type (and rows that are not whole groups).
    let native = |ty, cols| {
        target(
            Precision::Native,
            Packing::Swizzled,
            Role::Sensitive,
            ty,
            cols,
        )
    };
    assert_eq!(native(q4, 64), Target::Q(QFormat::W4(Packing::Swizzled)));
    assert_eq!(native(GgmlType::Q8_0, 64), Target::Q(QFormat::W8));
    assert_eq!(native(GgmlType::Q4_1, 64), Target::Keep);
    assert_eq!(native(GgmlType::F16, 48), Target::Keep);
}

/// A matrix imported into a low-bit format (native's Q8_0 -> w8 and Q4_0 -> w4, every packing,
/// a swizzled one with a partial band) gives back each row's values for an embedding lookup
/// (`Matrix::row_f32`) exactly as the file's GGML row dequantizes; so does a kept matrix.
#[test]
fn imported_rows_read_back_as_the_file_stores_them() {
    let (rows, cols) = (40, 64);
    let mut seed = 0x51u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_1] {
        let rb = ty.row_bytes(cols).unwrap();
        let mut data: Vec<u8> = (0..rows * rb).map(|_| next() as u8).collect();
        // Sane fp16 scales (and Q4_1 mins) at the start of every block.
        let block = rb / (cols / GROUP);
        for b in data.chunks_exact_mut(block) {
            b[0] = (next() % 256) as u8;
            b[1] = 0x28 | (next() % 4) as u8;
            if ty == GgmlType::Q4_1 {
                b[2] = (next() % 256) as u8;
                b[3] = 0xA8;
            }
        }
        let t = TensorRef {
            ty,
            cols,
            rows,
            data: &data,
        };
        for packing in [Packing::Contiguous, Packing::Interleaved, Packing::Swizzled] {
            let tg = target(Precision::Native, packing, Role::EmbedOrOutput, ty, cols);
            let mut out = vec![0u8; target_bytes(tg, &t)];
            convert(tg, &t, &mut out, &mut Vec::new());
            let m = Matrix {
                ty: match tg {
                    Target::Q(f) => f.ggml_type(),
                    _ => ty,
                },
                q: match tg {
                    Target::Q(f) => Some(f),
                    _ => None,
                },
                rows,
                cols,
                data: &out,
            };
            let (mut got, mut want) = (vec![0f32; cols], vec![0f32; cols]);
            for r in 0..rows {
                m.row_f32(r, &mut got);
                dequantize_row(ty, &data[r * rb..][..rb], &mut want);
                assert_eq!(got, want, "{} as {tg:?}, row {r}", ty.name());
            }
        }
    }
}
