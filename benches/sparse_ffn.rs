//! One token's FFN over many layers (more bytes than the last-level cache, as in decoding):
//! the dense SwiGLU against the sparse one over neuron bundles, per mode, score and sparsity.
//! SmolLM2-135M's FFN shape (576 -> 1536 -> 576) in Q4_1, random weights.
//! `cargo bench --bench sparse_ffn [-- FILTER]`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use leanstream::backend::cpu::sparse_ffn::SparseFfn;
use leanstream::backend::cpu::{matvec, matvec_many, ActScratch, KernelSet, Matrix, WorkerPool};
use leanstream::boot::{Arena, ArenaKind};
use leanstream::model::ggml::GgmlType;
use leanstream::model::TensorRef;
use leanstream::ops::silu;
use leanstream::sparsity::{BundleDown, Bundles, FfnMode, FfnOptions, Score};
use std::time::Duration;

const LAYERS: usize = 24;
const DIM: usize = 576;
const HIDDEN: usize = 1536;
const TY: GgmlType = GgmlType::Q4_1;

/// Random Q4_1 bytes (xorshift) with sane f16 scales and minimums.
fn weights(rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let mut data: Vec<u8> = (0..TY.row_bytes(cols).unwrap() * rows)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect();
    for b in data.chunks_exact_mut(TY.block_bytes()) {
        b[1] = 0x20 | (b[1] & 0x03); // scale ~2^-7
        b[3] = 0xA0 | (b[3] & 0x03); // min ~ -2^-10
    }
    data
}

fn bench(c: &mut Criterion) {
    let pool = WorkerPool::new(2);
    let mut act = ActScratch::new(HIDDEN);
    let layers: Vec<[Vec<u8>; 3]> = (0..LAYERS as u64)
        .map(|l| {
            [
                weights(HIDDEN, DIM, 3 * l + 1),
                weights(HIDDEN, DIM, 3 * l + 2),
                weights(DIM, HIDDEN, 3 * l + 3),
            ]
        })
        .collect();
    fn mat(data: &[u8], rows: usize, cols: usize) -> Matrix<'_> {
        Matrix {
            ty: TY,
            q: None,
            rows,
            cols,
            data,
        }
    }
    let x: Vec<f32> = (0..DIM)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let dense_bytes: usize = layers.iter().flatten().map(|d| d.len()).sum();

    let mut g = c.benchmark_group("sparse_ffn");
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .throughput(Throughput::BytesDecimal(dense_bytes as u64));

    let (mut hb, mut hb2, mut out) = (vec![0f32; HIDDEN], vec![0f32; HIDDEN], vec![0f32; DIM]);
    g.bench_function("dense", |b| {
        b.iter(|| {
            for [gd, ud, dd] in &layers {
                let (gate, up) = (mat(gd, HIDDEN, DIM), mat(ud, HIDDEN, DIM));
                matvec_many(
                    KernelSet::best(),
                    &pool,
                    &mut [(&gate, &mut hb), (&up, &mut hb2)],
                    &x,
                    &mut act,
                );
                for (g, u) in hb.iter_mut().zip(&hb2) {
                    *g = silu(*g) * u;
                }
                matvec(
                    KernelSet::best(),
                    &pool,
                    &mat(dd, DIM, HIDDEN),
                    &hb,
                    &mut act,
                    &mut out,
                );
            }
        })
    });

    // Bundles of every layer in one arena, as boot builds them.
    fn tensor(data: &[u8], rows: usize, cols: usize) -> TensorRef<'_> {
        TensorRef {
            ty: TY,
            rows,
            cols,
            data,
        }
    }
    let mut arena = Arena::map(ArenaKind::FfnCache, 128 << 20).expect("arena");
    let mut carver = arena.carver();
    let mut scratch = Arena::map(ArenaKind::ActivationScratch, 4 << 20).expect("arena");
    let mut sc = scratch.carver();
    // The default down tiles (4-bit, from these Q4_1 weights), and Q8_0 columns.
    for (down, down_name) in [
        (BundleDown::Tiles, "tiles"),
        (BundleDown::AtLeast8Bit, "q8"),
    ] {
        let bundles: Vec<Bundles> = layers
            .iter()
            .map(|[gd, ud, dd]| {
                Bundles::build(
                    &mut carver,
                    &tensor(gd, HIDDEN, DIM),
                    &tensor(ud, HIDDEN, DIM),
                    &tensor(dd, DIM, HIDDEN),
                    down,
                )
                .expect("bundles")
            })
            .collect();
        for score in [Score::Glu, Score::Gate] {
            for sparsity in [0.5f32, 0.8] {
                let opts = FfnOptions {
                    mode: FfnMode::TopK,
                    score,
                    sparsity,
                    thresholds: None,
                    bundle_down: down,
                    dropped: None,
                };
                let mut ffn =
                    SparseFfn::new(&mut sc, LAYERS, HIDDEN, DIM, &opts).expect("sparse ffn");
                let name = format!("topk-{score:?}-{sparsity}-{down_name}").to_lowercase();
                let mut y = x.clone();
                g.bench_function(name, |b| {
                    b.iter(|| {
                        for (l, bl) in bundles.iter().enumerate() {
                            y.copy_from_slice(&x);
                            ffn.forward(l, bl, KernelSet::best(), &pool, &mut y, &mut act);
                        }
                    })
                });
            }
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
