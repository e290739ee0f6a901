//! Decode's attention on the CPU, one thread: ns per (query head, position) for a head over a
//! long f32 cache (SmolLM2-135M's heads: 9 query heads on 3 KV heads of 64). The cache of one
//! layer (3 MB at 2,048 positions) stays in L2/L3, as a layer's does between tokens.
//! `cargo bench --bench attention`; `ATT_POS=4096` (positions); `ATT_SHAPE=qwen1.5b` (12 query
//! heads on 2 KV heads of 128); `ATT_SUB=N`: N query heads of a KV head a call
//! (`KvCache::attend_heads`, each row read once for them; default 1, a call a head);
//! `ATT_KV=f16`: the f16 cache (the default for float engines) rather than f32; `ATT_KV=i8`:
//! the int8 cache (w8a8, w4a8), written through `commit`.
use leanstream::kv::{KvCache, Layout, Policy, Shape, Storage};
use leanstream::model::ggml::f32_to_f16;
use std::time::Instant;

fn main() {
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let pos = env("ATT_POS", 2048);
    let (heads, kv_heads, head_dim): (usize, usize, usize) =
        match std::env::var("ATT_SHAPE").as_deref() {
            Ok("qwen1.5b") => (12, 2, 128),
            _ => (9, 3, 64),
        };
    let sub = env("ATT_SUB", 1);
    assert!(
        (heads / kv_heads).is_multiple_of(sub),
        "ATT_SUB={sub} does not divide {} heads a KV head",
        heads / kv_heads
    );
    // ATT_LAYERS=28: a model's worth of layers, each attended in turn, so the rows come from
    // DRAM as in decode (one layer's stay in L2/L3).
    let layers = env("ATT_LAYERS", 1);
    let s = Shape {
        n_layers: layers,
        kv_heads,
        head_dim,
        context: pos,
    };
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let n = layers * pos * s.kv_dim();
    let (mut k, mut v): (Vec<f32>, Vec<f32>) = (
        (0..n).map(|_| next()).collect(),
        (0..n).map(|_| next()).collect(),
    );
    let q: Vec<f32> = (0..heads * head_dim).map(|_| next()).collect();
    let (mut kbuf, mut vbuf) = (vec![0f32; s.kv_dim()], vec![0f32; s.kv_dim()]);
    let half = std::env::var("ATT_KV").as_deref() == Ok("f16");
    let int8 = std::env::var("ATT_KV").as_deref() == Ok("i8");
    let (mut ki, mut vi, mut ksc, mut vsc) = if int8 {
        (
            vec![0i8; s.i8_values()],
            vec![0i8; s.i8_values()],
            vec![0f32; s.i8_scales()],
            vec![0f32; s.i8_scales()],
        )
    } else {
        (Vec::new(), Vec::new(), Vec::new(), Vec::new())
    };
    let (mut kh, mut vh): (Vec<u16>, Vec<u16>) = if half {
        (
            k.iter().map(|&x| f32_to_f16(x)).collect(),
            v.iter().map(|&x| f32_to_f16(x)).collect(),
        )
    } else {
        (Vec::new(), Vec::new())
    };
    let store = if int8 {
        Storage::I8 {
            k: &mut ki,
            v: &mut vi,
            ks: &mut ksc,
            vs: &mut vsc,
            kbuf: &mut kbuf,
            vbuf: &mut vbuf,
        }
    } else if half {
        Storage::F16 {
            k: &mut kh,
            v: &mut vh,
            kbuf: &mut kbuf,
            vbuf: &mut vbuf,
        }
    } else {
        Storage::F32 {
            k: &mut k,
            v: &mut v,
            kbuf: &mut kbuf,
            vbuf: &mut vbuf,
        }
    };
    let mut kv = KvCache::new(s, store, Policy::Fixed(Layout::TokenMajor));
    if int8 {
        // The int8 cache is written through `commit` (quantized per group of 32), a position at
        // a time, from random rows as the float caches'.
        for p in 0..pos {
            kv.begin_token(p);
            for l in 0..layers {
                let (kr, vr) = kv.rows();
                kr.iter_mut().chain(vr.iter_mut()).for_each(|x| *x = next());
                kv.commit(l, p);
            }
        }
    }
    // The AVX2 build of the loops where the CPU has it, as the engine boots it.
    kv.set_avx2(true);
    let mut att = vec![0f32; sub * pos];
    let mut out = vec![0f32; sub * head_dim];
    let mut sink = 0f32;
    let reps = (1 << 26) / (layers * pos * heads) + 1;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..reps {
            for (l, h) in (0..layers).flat_map(|l| (0..heads).step_by(sub).map(move |h| (l, h))) {
                kv.attend_heads(
                    l,
                    h / (heads / kv_heads),
                    &q[h * head_dim..][..sub * head_dim],
                    pos - 1,
                    &mut att,
                    pos,
                    &mut out,
                );
                sink += out[0];
            }
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "attention {}, {layers} layers of {pos} positions, {heads} heads on {kv_heads} of {head_dim}, {sub} a call: {:.2} ns per head and position ({sink:.1})",
        if int8 {
            "int8"
        } else if half {
            "f16"
        } else {
            "f32"
        },
        best * 1e9 / (reps * layers * heads * pos) as f64
    );
}
