//! `leanstream calibrate-kv`: a short microbenchmark that fits the cost model's alphas on this
//! board. It times int8 attention over one layer for each layout at several lengths, then fits
//! `seconds = alpha1 * bytes / bandwidth + alpha2 * ops` by least squares (both alphas kept
//! non-negative), with `bandwidth` measured by streaming a buffer larger than the caches.

use leanstream::kv::{CostModel, KvCache, Layout, Policy, Shape, Storage};
use std::time::Instant;

/// One timed configuration.
#[derive(Clone, Copy, Debug)]
pub struct Point {
    pub layout: Layout,
    pub tokens: usize,
    pub seconds: f64,
    pub bytes: f64,
    pub ops: f64,
}

/// Bytes per second read from a 64 MiB buffer (best of 3).
pub fn measure_bandwidth() -> f64 {
    let buf: Vec<u64> = (0..(64 << 20) / 8).map(|i| i as u64).collect();
    let mut best = f64::MAX;
    let mut sink = 0u64;
    for _ in 0..3 {
        let t0 = Instant::now();
        let mut acc = [0u64; 4];
        for c in buf.chunks_exact(4) {
            for j in 0..4 {
                acc[j] = acc[j].wrapping_add(c[j]);
            }
        }
        sink = sink.wrapping_add(acc.iter().sum::<u64>());
        best = best.min(t0.elapsed().as_secs_f64());
    }
    std::hint::black_box(sink);
    (buf.len() * 8) as f64 / best
}

/// Seconds of one attention pass of every KV head over `t` tokens of one layer in `layout`.
pub fn time_attention(shape: Shape, layout: Layout, t: usize, reps: usize) -> f64 {
    let s = Shape {
        n_layers: 1,
        context: t.max(1),
        ..shape
    };
    let kv_dim = s.kv_dim();
    let (mut k, mut v) = (vec![0i8; s.i8_values()], vec![0i8; s.i8_values()]);
    let (mut ks, mut vs) = (vec![0f32; s.i8_scales()], vec![0f32; s.i8_scales()]);
    let (mut kb, mut vb) = (vec![0f32; kv_dim], vec![0f32; kv_dim]);
    let mut cache = KvCache::new(
        s,
        Storage::I8 {
            k: &mut k,
            v: &mut v,
            ks: &mut ks,
            vs: &mut vs,
            kbuf: &mut kb,
            vbuf: &mut vb,
        },
        Policy::Fixed(layout),
    );
    // Time the attention the engine runs by default (its AVX2 build where the CPU has it).
    cache.set_avx2(true);
    let mut x = 0x9E37_79B9u32;
    for pos in 0..t {
        cache.begin_token(pos);
        let (kr, vr) = cache.rows();
        for val in kr.iter_mut().chain(vr.iter_mut()) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *val = (x as f32 / u32::MAX as f32) - 0.5;
        }
        cache.commit(0, pos);
    }
    let q = vec![0.25f32; s.head_dim];
    let mut att = vec![0f32; t];
    let mut out = vec![0f32; s.head_dim];
    let mut best = f64::MAX;
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        for h in 0..s.kv_heads {
            cache.attend(0, h, &q, t - 1, &mut att, &mut out);
        }
        best = best.min(t0.elapsed().as_secs_f64());
    }
    std::hint::black_box(&out);
    best
}

/// Measures and fits the cost model for a model of this shape.
pub fn calibrate(shape: Shape, lens: &[usize]) -> (CostModel, Vec<Point>) {
    let bandwidth = measure_bandwidth();
    let mut points = Vec::new();
    for &t in lens {
        for layout in Layout::ALL {
            let s1 = Shape {
                n_layers: 1,
                ..shape
            };
            points.push(Point {
                layout,
                tokens: t,
                seconds: time_attention(shape, layout, t, 20),
                bytes: CostModel::bytes(layout, &s1, t),
                ops: CostModel::unpack_ops(layout, &s1, t),
            });
        }
    }
    // Least squares in (a1, a2) for y = a1 * x1 + a2 * x2, x1 = bytes / bandwidth, x2 = ops.
    let (mut s11, mut s12, mut s22, mut s1y, mut s2y) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for p in &points {
        let (x1, x2, y) = (p.bytes / bandwidth, p.ops, p.seconds);
        s11 += x1 * x1;
        s12 += x1 * x2;
        s22 += x2 * x2;
        s1y += x1 * y;
        s2y += x2 * y;
    }
    let det = s11 * s22 - s12 * s12;
    let (mut a1, mut a2) = if det.abs() > 0.0 {
        ((s1y * s22 - s2y * s12) / det, (s2y * s11 - s1y * s12) / det)
    } else {
        (0.0, 0.0)
    };
    if a1 < 0.0 {
        a1 = 0.0;
        a2 = if s22 > 0.0 { s2y / s22 } else { 0.0 };
    }
    if a2 < 0.0 {
        a2 = 0.0;
        a1 = if s11 > 0.0 { s1y / s11 } else { 0.0 };
    }
    let model = CostModel {
        alpha1: a1,
        alpha2: a2,
        bandwidth,
        ..CostModel::default()
    };
    (model, points)
}
