//! Decode's matrix-vector products streamed from memory: GB/s of weight bytes over 256 MB of
//! 8960x1536 matrices, more than the last-level cache holds (so every byte comes from DRAM, as
//! in decode), beside a plain read of the same bytes on one and two threads.
//! `cargo bench --bench w4_stream [-- PACKING]`: the w4 packings. Knobs: `W4_TYPE=w8` (or a
//! GGML type, e.g. `q6_k`: its kernel), `W4_ROWS=256 W4_MATS=1` (one matrix, in cache: the
//! kernel's own speed), `W4_COLS`, `W4_THREADS="1 2 8"`, `W4_PREFETCH=0|1`, `W4_AVX2=1` (no
//! VNNI or AVX-512), `W4_SCALES=block` (K-quants: the input on a scale per 32 values). Not a
//! criterion bench: one figure per kernel and pool, the best of five passes.
use leanstream::backend::cpu::{matvec, ActScratch, KernelSet, WorkerPool};
use leanstream::model::ggml::GgmlType;
use leanstream::quant::view::Matrix;
use leanstream::quant::{Packing, QFormat};
use std::time::Instant;

fn main() {
    let filter = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    // W4_ROWS=512 W4_MATS=1: a matrix that stays in L2, the kernel's own speed.
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    // W4_COLS=896: another row length (the 0.5B shape's), a multiple of 32 (256 for K-quants).
    let (rows, cols) = (env("W4_ROWS", 8960), env("W4_COLS", 1536));
    // W4_TYPE=q6_k (or another GGML type): that type's classic kernel instead of the w4 ones.
    // W4_TYPE=w8: the w8 integer kernels (Q8_0 bytes).
    let w8 = std::env::var("W4_TYPE").is_ok_and(|t| t == "w8");
    let ty = std::env::var("W4_TYPE").ok().map(|t| {
        let t = if t == "w8" { "q8_0".to_string() } else { t };
        (0..64)
            .filter_map(GgmlType::from_id)
            .find(|g| g.name().eq_ignore_ascii_case(&t))
            .expect("a GGML type")
    });
    let bytes = match ty {
        Some(t) => rows * t.row_bytes(cols).unwrap(),
        None => rows.next_multiple_of(32) * cols / 32 * 18,
    };
    let n_mats = env("W4_MATS", (256 << 20) / bytes + 1);
    let reps = (256 << 20) / (n_mats * bytes) + 1;
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mats: Vec<Vec<u8>> = (0..n_mats)
        .map(|_| {
            let mut d: Vec<u8> = (0..bytes)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    s as u8
                })
                .collect();
            // Every 18-byte group's (or 576-byte tile's first 64 bytes') scales sane: f16 around 2^-7.
            for b in d.chunks_exact_mut(2) {
                b[1] = (b[1] & 0x83) | 0x20;
            }
            d
        })
        .collect();
    let x: Vec<f32> = (0..cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut out = vec![0f32; rows];
    let mut act = ActScratch::new(cols);
    // W4_AVX2=1: the AVX2 kernels without VNNI or AVX-512 (a CPU without them).
    let ks = if std::env::var("W4_AVX2").is_ok() {
        KernelSet {
            vnni: false,
            avx512: false,
            ..KernelSet::best()
        }
    } else {
        KernelSet::best()
    };
    // W4_PREFETCH=0 or 1: software prefetch off or on (default: this CPU's, `KernelSet::best`).
    let ks = match std::env::var("W4_PREFETCH").as_deref() {
        Ok("0") => KernelSet {
            prefetch: false,
            ..ks
        },
        Ok("1") => KernelSet {
            prefetch: true,
            ..ks
        },
        _ => ks,
    };
    // W4_SCALES=block: K-quant rows read their input with a scale per 32 values (the
    // `k-block-scales` ablation) rather than one per 256.
    let ks = KernelSet {
        superblock_scales: std::env::var("W4_SCALES").as_deref() != Ok("block"),
        ..ks
    };
    // The floor: the same bytes read and folded with 32-byte xors, one thread.
    let mut best = f64::MAX;
    let mut sink = 0u64;
    for _ in 0..5 {
        let t = Instant::now();
        for m in &mats {
            let mut acc = [0u64; 16];
            for c in m.chunks_exact(128) {
                for (a, w) in acc.iter_mut().zip(c.chunks_exact(8)) {
                    *a ^= u64::from_le_bytes(w.try_into().unwrap());
                }
            }
            sink ^= acc.iter().fold(0, |x, y| x ^ y);
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "read 1t: {:.1} GB/s ({sink:x})",
        (n_mats * bytes) as f64 / best / 1e9
    );
    // And on two threads, each its half of every matrix.
    let read = |m: &[u8]| {
        let mut acc = [0u64; 16];
        for c in m.chunks_exact(128) {
            for (a, w) in acc.iter_mut().zip(c.chunks_exact(8)) {
                *a ^= u64::from_le_bytes(w.try_into().unwrap());
            }
        }
        acc.iter().fold(0, |x, y| x ^ y)
    };
    let half = bytes / 256 * 128;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        sink ^= std::thread::scope(|s| {
            let h: Vec<_> = (0..2)
                .map(|i| {
                    let mats = &mats;
                    s.spawn(move || mats.iter().fold(0, |x, m| x ^ read(&m[i * half..][..half])))
                })
                .collect();
            h.into_iter().fold(0, |x, h| x ^ h.join().unwrap())
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "read 2t: {:.1} GB/s ({sink:x})",
        (n_mats * 2 * half) as f64 / best / 1e9
    );
    for packing in [Packing::Swizzled, Packing::Interleaved, Packing::Contiguous] {
        if ty.is_some() && packing != Packing::Swizzled {
            continue;
        }
        if ty.is_none()
            && filter
                .as_deref()
                .is_some_and(|f| !format!("{packing:?}").to_lowercase().contains(f))
        {
            continue;
        }
        // W4_THREADS="1 2 8": the pool sizes to time (default 1 and 2).
        let threads_list: Vec<usize> = std::env::var("W4_THREADS")
            .map(|v| {
                v.split_whitespace()
                    .filter_map(|t| t.parse().ok())
                    .collect()
            })
            .unwrap_or(vec![1, 2]);
        for &threads in &threads_list {
            let pool = WorkerPool::new(threads);
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = Instant::now();
                for m in mats.iter().cycle().take(reps * n_mats) {
                    let w = Matrix {
                        ty: ty.unwrap_or(GgmlType::Q4_0),
                        q: match ty {
                            _ if w8 => Some(QFormat::W8),
                            Some(_) => None,
                            None => Some(QFormat::W4(packing)),
                        },
                        rows,
                        cols,
                        data: m,
                    };
                    matvec(ks, &pool, &w, &x, &mut act, &mut out);
                }
                best = best.min(t.elapsed().as_secs_f64());
            }
            let name = match ty {
                _ if w8 => "w8".to_string(),
                Some(t) => t.name().to_string(),
                None => format!("{packing:?}"),
            };
            println!(
                "{name} {threads}t: {:.1} GB/s ({} matrices of {rows}x{cols})",
                (reps * n_mats * bytes) as f64 / best / 1e9,
                n_mats
            );
        }
    }
}
