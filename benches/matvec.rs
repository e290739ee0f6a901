//! Matrix-vector product throughput, in GB/s of weight bytes read; and the batched prefill
//! product (`matmul_many`, 16 inputs, one thread: the kernels' own speed), in weight values
//! times inputs per second.
//!
//! Shapes are SmolLM2-135M's: 1536x576 (ffn gate/up), 576x1536 (ffn down), 49152x576 (output);
//! the K-quants (and Q4_0 beside them) run Qwen2.5-1.5B's: 8960x1536 (ffn gate/up), 1536x8960
//! (ffn down), as their columns must be whole super-blocks of 256.
//! `cargo bench --bench matvec [-- FILTER]`, e.g. `-- matmul16` for the batched group alone.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use leanstream::backend::cpu::{matmul_many, matvec, ActScratch, KernelSet, Matrix, WorkerPool};
use leanstream::model::ggml::GgmlType;
use leanstream::quant::{Packing, QFormat};
use std::time::Duration;

/// Random bytes (xorshift), with every f16 scale / value set to a sane normal number.
fn weights(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut data: Vec<u8> = (0..ty.row_bytes(cols).unwrap() * rows)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect();
    let scale_offsets: &[usize] = match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::F16 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        _ => &[],
    };
    for b in data.chunks_exact_mut(ty.block_bytes()) {
        for &o in scale_offsets {
            b[o + 1] = 0x20 | (b[o + 1] & 0x83); // sign and low bits random, exponent ~2^-7
        }
    }
    data
}

fn bench(c: &mut Criterion) {
    let pools = [WorkerPool::new(1), WorkerPool::new(2)];
    let mut act = ActScratch::new(8960);
    let small = [(1536, 576), (576, 1536), (49152, 576)];
    let wide = [(8960, 1536), (1536, 8960)];
    for (group, ty, shapes) in [
        ("matvec", GgmlType::Q4_1, &small[..]),
        ("matvec", GgmlType::Q8_0, &small[..]),
        ("matvec", GgmlType::Q4_0, &small[..]),
        ("matvec", GgmlType::F16, &small[..]),
        ("matvec_wide", GgmlType::Q4_K, &wide[..]),
        ("matvec_wide", GgmlType::Q6_K, &wide[..]),
        ("matvec_wide", GgmlType::Q4_0, &wide[..]),
    ] {
        let mut g = c.benchmark_group(format!("{group}_{}", ty.name()));
        g.warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_millis(1200))
            .sample_size(20);
        for &(rows, cols) in shapes {
            let data = weights(ty, rows, cols);
            let w = Matrix {
                ty,
                q: None,
                rows,
                cols,
                data: &data,
            };
            let x: Vec<f32> = (0..cols)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let mut out = vec![0f32; rows];
            g.throughput(Throughput::BytesDecimal(data.len() as u64));
            for pool in &pools {
                let id =
                    BenchmarkId::new(format!("{rows}x{cols}"), format!("{}t", pool.n_threads()));
                g.bench_function(id, |b| {
                    b.iter(|| matvec(KernelSet::best(), pool, &w, &x, &mut act, &mut out))
                });
            }
        }
        g.finish();
    }
    matmul16(c);
}

/// `matmul_many` over 16 inputs (a prefill batch) on the gate/up shape, one thread, for the
/// classic types and the low-bit formats (w8 over Q8_0-shaped bytes, w4 over Q4_0-shaped ones).
fn matmul16(c: &mut Criterion) {
    const N: usize = 16;
    let (rows, cols) = (1536, 576);
    let pool = WorkerPool::new(1);
    let mut acts: Vec<ActScratch> = (0..N).map(|_| ActScratch::new(cols)).collect();
    let xs: Vec<f32> = (0..N * cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut out = vec![0f32; N * rows];
    let mut g = c.benchmark_group("matmul16");
    g.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1500))
        .sample_size(20)
        .throughput(Throughput::Elements((N * rows * cols) as u64));
    let cases = [
        ("q8_0", GgmlType::Q8_0, None),
        ("q4_0", GgmlType::Q4_0, None),
        ("q4_1", GgmlType::Q4_1, None),
        ("w8", GgmlType::Q8_0, Some(QFormat::W8)),
        (
            "w4-interleaved",
            GgmlType::Q4_0,
            Some(QFormat::W4(Packing::Interleaved)),
        ),
        (
            "w4-swizzled",
            GgmlType::Q4_0,
            Some(QFormat::W4(Packing::Swizzled)),
        ),
    ];
    for (name, ty, q) in cases {
        let data = weights(ty, rows, cols);
        let w = Matrix {
            ty,
            q,
            rows,
            cols,
            data: &data,
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                matmul_many(
                    KernelSet::best(),
                    &pool,
                    &mut [(&w, &mut out[..])],
                    &xs,
                    &mut acts,
                )
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
