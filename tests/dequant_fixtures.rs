//! `dequantize_row`, `quantize_row_q8_0` and `f32_to_f16` against numbers from an independent
//! implementation (gguf-py's numpy code; see scripts/gen-dequant-fixtures.py). Comparisons are
//! bit-exact: numpy performs the same f32 operations in the same order as ggml's reference C.
//! Real-model rows are skipped with a visible line when the model files are absent.

mod common;

use leanstream::model::ggml::{dequantize_row, f32_to_f16, quantize_row_q8_0, GgmlType};
use leanstream::model::gguf::Gguf;
use std::collections::HashMap;

const FIXTURES: &str = include_str!("fixtures/dequant.txt");

fn ty(name: &str) -> GgmlType {
    [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ]
    .into_iter()
    .find(|t| t.name() == name)
    .unwrap_or_else(|| panic!("unknown type {name}"))
}

fn hex_u32(s: &str) -> u32 {
    u32::from_str_radix(s, 16).unwrap()
}

fn hex_bytes(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn lines(kind: &str) -> impl Iterator<Item = Vec<&'static str>> + '_ {
    FIXTURES
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(move |t| t[0] == kind)
}

#[test]
fn synthetic_blocks_bit_exact() {
    let mut seen = HashMap::new();
    for t in lines("synth") {
        let ty = ty(t[1]);
        let n: usize = t[2].parse().unwrap();
        let src = hex_bytes(t[3]);
        let want: Vec<u32> = t[4..].iter().map(|s| hex_u32(s)).collect();
        assert_eq!(want.len(), n);
        let mut got = vec![0f32; n];
        dequantize_row(ty, &src, &mut got);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                *w,
                "{} value {i}: got {g}, want {}",
                ty.name(),
                f32::from_bits(*w)
            );
        }
        *seen.entry(ty.name()).or_insert(0) += 1;
    }
    // Every type is covered.
    assert_eq!(seen.len(), 10, "{seen:?}");
}

#[test]
fn quantize_q8_0_bit_exact() {
    let mut count = 0;
    for t in lines("q8") {
        let n: usize = t[1].parse().unwrap();
        let x: Vec<f32> = t[2..2 + n]
            .iter()
            .map(|s| f32::from_bits(hex_u32(s)))
            .collect();
        let want = hex_bytes(t[2 + n]);
        let mut got = vec![0u8; want.len()];
        quantize_row_q8_0(&x, &mut got);
        assert_eq!(got, want);
        count += 1;
    }
    assert!(count >= 4);
}

#[test]
fn f32_to_f16_matches_numpy() {
    let mut count = 0;
    for t in lines("f16") {
        let x = f32::from_bits(hex_u32(t[1]));
        let want = u16::from_str_radix(t[2], 16).unwrap();
        assert_eq!(f32_to_f16(x), want, "{x:e} ({})", t[1]);
        count += 1;
    }
    assert!(count > 300);
}

#[test]
fn real_model_rows_bit_exact() {
    let mut models: HashMap<&str, Option<Gguf>> = HashMap::new();
    let mut checked = 0;
    for t in lines("real") {
        let g = models.entry(t[1]).or_insert_with(|| {
            common::model(t[1]).map(|p| Gguf::open(&p).unwrap_or_else(|e| panic!("{e}")))
        });
        let Some(g) = g else { continue };
        let info = g
            .tensor(t[2])
            .unwrap_or_else(|| panic!("{}: no tensor {}", t[1], t[2]));
        let ty = ty(t[3]);
        assert_eq!(info.ty, ty, "{}", t[2]);
        let row: usize = t[4].parse().unwrap();
        let ncols: usize = t[5].parse().unwrap();
        assert_eq!(info.dims[0], ncols);
        let rb = ty.row_bytes(ncols).unwrap();
        let data = g.tensor_data(info);
        let mut v = vec![0f32; ncols];
        dequantize_row(ty, &data[row * rb..(row + 1) * rb], &mut v);
        let hash = v.iter().enumerate().fold(0u64, |h, (i, x)| {
            h.wrapping_add((i as u64 + 1).wrapping_mul(x.to_bits() as u64))
        });
        let sum = v.iter().fold(0f64, |s, &x| s + x as f64);
        let what = format!("{} {} row {row}", t[1], t[2]);
        for (i, w) in t[8..].iter().enumerate() {
            assert_eq!(v[i].to_bits(), hex_u32(w), "{what} value {i}");
        }
        assert_eq!(format!("{hash:016x}"), t[6], "{what}: row hash");
        assert_eq!(
            format!("{:016x}", sum.to_bits()),
            t[7],
            "{what}: row sum {sum}"
        );
        checked += 1;
    }
    eprintln!("checked {checked} real-model rows");
}
