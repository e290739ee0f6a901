//! Hardware-in-the-loop tests of the CUDA backend, run on the GPU machine by scripts/hil.sh.
//! Where there is no GPU (CI, the developer machine) each prints a `skipped:` line; the
//! no-GPU refusal itself is tested in tools/tests/cli_errors.rs.
//!
//! Parity models: every file named in $LEANSTREAM_HIL_MODELS (comma-separated paths; a
//! llama2.c checkpoint needs no tokenizer here), in both memory models.

#![cfg(feature = "cuda")]

use leanstream::backend::cuda::driver::{Gpu, KernelArgs};
use leanstream::backend::cuda::flags::Flags;
use leanstream::backend::cuda::probe;
use leanstream::backend::cuda::ptx_for;
use leanstream::board::MemoryModel;
use leanstream::engine::cuda::CudaEngine;
use leanstream::engine::cuda_options::{
    CudaOptions, DependentLaunch, GroupedAttention, InBlockNorm, ProductKernels,
};
use leanstream::engine::sample::argmax;
use leanstream::engine::{Arenas, Decoder, Engine, EngineError, EngineOptions};
use leanstream::kv::{KvChoice, KvPrecision};
use leanstream::model::ModelFile;
use leanstream::quant::Precision;
use leanstream_tools::bench::rel_err;
use std::time::{Duration, Instant};

fn gpu_or_skip() -> Option<Gpu> {
    if let Err(why) = probe() {
        eprintln!("skipped: {why}");
        return None;
    }
    Some(Gpu::open(0).expect("GPU opens"))
}

/// The flags a `flag_echo` kernel works on: what the host sets, what the kernel answers, and
/// the kernel's error word.
struct EchoFlags {
    host: Flags,
    reply: Flags,
    error: Flags,
}

/// Launches `flag_echo` over `n` fresh flags (one thread each), waiting at most `timeout_ns`.
/// `before` may set flags ahead of the launch.
fn launch_echo(gpu: &Gpu, n: usize, timeout_ns: u64, before: impl FnOnce(&Flags)) -> EchoFlags {
    let m = gpu
        .load_module(ptx_for("flags", gpu.compute_capability).unwrap())
        .unwrap();
    let echo = m.function("flag_echo").unwrap();
    let f = EchoFlags {
        host: Flags::new(gpu, n).unwrap(),
        reply: Flags::new(gpu, n).unwrap(),
        error: Flags::new(gpu, 1).unwrap(),
    };
    before(&f.host);
    gpu.launch(
        echo,
        1,
        n as u32,
        KernelArgs::default()
            .ptr(f.host.device_ptr())
            .ptr(f.reply.device_ptr())
            .i32(n as i32)
            .i32(1)
            .u64(timeout_ns)
            .ptr(f.error.device_ptr()),
    )
    .unwrap();
    f
}

/// A kernel waits on flags the host sets later; it answers each, and the host sees every
/// answer. Prints the round-trip latency (host set -> kernel reply seen by the host).
#[test]
fn kernel_waits_for_host_flags_and_answers() {
    let Some(gpu) = gpu_or_skip() else { return };
    let n = 64;
    let EchoFlags { host, reply, error } = launch_echo(&gpu, n, 5_000_000_000, |_| {});
    // The kernel is spinning now; the host sets the flags one by one, later.
    std::thread::sleep(Duration::from_millis(50));
    let mut rtt = Vec::new();
    for i in 0..n {
        let t = Instant::now();
        host.set(i, 1);
        reply
            .wait(i, 1, Duration::from_secs(5))
            .unwrap_or_else(|v| panic!("no reply to flag {i} (saw {v})"));
        rtt.push(t.elapsed().as_secs_f64() * 1e6);
    }
    gpu.sync().unwrap();
    assert_eq!(error.get(0), 0, "the kernel reported a timeout");
    rtt.sort_by(f64::total_cmp);
    eprintln!(
        "flags: {n} host->kernel->host round trips, median {:.1} us, p90 {:.1} us",
        rtt[n / 2],
        rtt[n * 9 / 10]
    );
}

/// Flags the host never sets: the kernel gives up after its time bound and reports, instead of
/// hanging the GPU.
#[test]
fn kernel_gives_up_on_flags_never_set() {
    let Some(gpu) = gpu_or_skip() else { return };
    let n = 32;
    let t = Instant::now();
    // One flag is set before the launch: only that one is answered. 20 ms bound.
    let EchoFlags { reply, error, .. } = launch_echo(&gpu, n, 20_000_000, |host| host.set(3, 1));
    gpu.sync().unwrap();
    let took = t.elapsed();
    let e = error.get(0);
    assert!(
        e >= 1 && e as usize <= n && e != 4,
        "error flag {e}: should name a thread that waited"
    );
    assert_eq!(reply.get(3), 1, "the set flag was answered");
    assert_eq!(
        (0..n).filter(|&i| reply.get(i) != 0).count(),
        1,
        "only the set flag was answered"
    );
    eprintln!(
        "flags: unset flags timed out as asked (20 ms bound, kernel returned after {:.1} ms, error names thread {})",
        took.as_secs_f64() * 1e3,
        e - 1
    );
}

/// Logits of `prompt` and the 64 greedy tokens after it.
fn run_cpu(file: &ModelFile, precision: Precision, prompt: &[u32]) -> (Vec<Vec<f32>>, Vec<u32>) {
    let mut arenas = Arenas::from_board().unwrap();
    let opts = EngineOptions {
        context: 256,
        precision,
        // Its KV cache as the GPU keeps it: int8 at w8a8 and w4a8 where the head allows, else f16.
        kv: leanstream::engine::cuda_options::kv_precision(
            precision,
            KvChoice::Auto,
            file.hyper().unwrap().head_dim,
        )
        .choice(),
        ..EngineOptions::default()
    };
    let mut cpu = Engine::boot(&mut arenas, file, opts).unwrap();
    let mut logits = Vec::new();
    for (pos, &t) in prompt.iter().enumerate() {
        logits.push(cpu.forward(t, pos).to_vec());
    }
    let mut tokens = Vec::new();
    let mut tok = argmax(logits.last().unwrap());
    for i in 0..64 {
        tokens.push(tok);
        tok = argmax(cpu.forward(tok, prompt.len() + i));
    }
    (logits, tokens)
}

/// Logits of the prompt, the 64 greedy tokens after it, whether any product quantized its
/// input to int8, and what the KV cache held.
type GpuRun = (Vec<Vec<f32>>, Vec<u32>, bool, KvPrecision);

fn run_gpu(
    file: &ModelFile,
    memory: MemoryModel,
    products: ProductKernels,
    precision: Precision,
    prompt: &[u32],
) -> Result<GpuRun, EngineError> {
    let mut arenas = Arenas::from_board().unwrap();
    let opts = CudaOptions {
        memory,
        context: 256,
        precision,
        products,
        // The narrow runs also take the tail for the residual's norm, the wide ones norm in
        // each block (the default): both paths checked without doubling the runs.
        in_block_norm: if products == ProductKernels::Wide {
            InBlockNorm::Always
        } else {
            InBlockNorm::Never
        },
        // Likewise attention: one block a head, or split from position 2 on (so the logits
        // compared below already join several slices a head): in discrete memory a block a kv
        // head for all its query heads (grouped), in unified a block a query head, its slices a
        // thread block cluster on sm_90 (the default there).
        attention_slice: if products == ProductKernels::Wide {
            2
        } else {
            0
        },
        grouped_attention: if memory == MemoryModel::Discrete {
            GroupedAttention::Always
        } else {
            GroupedAttention::Never
        },
        cluster_attention: memory == MemoryModel::Unified,
        // And dependent launch (an sm_90 GPU; others run it off): on (the default) in the
        // wide runs, with the weight prefetch in the narrow discrete ones, off in the narrow
        // unified ones.
        dependent_launch: match (products, memory) {
            (ProductKernels::Wide, _) => DependentLaunch::On,
            (_, MemoryModel::Unified) => DependentLaunch::Off,
            _ => DependentLaunch::Prefetch,
        },
        // And the graph: each kernel launched in the narrow discrete runs (where dependent
        // launch is on), so `greedy_run` below launches steps back to back without one, each
        // step's first kernel ordered after the step before (attention reads the position
        // before its wait).
        graph: !(products == ProductKernels::Narrow && memory == MemoryModel::Discrete),
        ..CudaOptions::default()
    };
    let mut gpu = CudaEngine::boot(&mut arenas, file, opts)?;
    let mut logits = Vec::new();
    for (pos, &t) in prompt.iter().enumerate() {
        logits.push(gpu.forward(t, pos).to_vec());
    }
    let mut tokens = Vec::new();
    let mut tok = argmax(logits.last().unwrap());
    for i in 0..64 {
        tokens.push(tok);
        tok = gpu.forward_greedy(tok, prompt.len() + i);
    }
    // The same 64 positions again, steps launched back to back with one synchronization at
    // the end (the device state carries each pick to the next step): the same tokens.
    let mut back_to_back = [0u32; 64];
    gpu.greedy_run(tokens[0], prompt.len(), &mut back_to_back)
        .unwrap_or_else(|e| panic!("greedy_run: {e}"));
    assert_eq!(
        back_to_back[..63],
        tokens[1..],
        "steps launched back to back pick other tokens than one at a time"
    );
    Ok((logits, tokens, gpu.int8_activations, gpu.kv_precision))
}

/// The parity models of $LEANSTREAM_HIL_MODELS, opened, with their file names; None (and a
/// `skipped:` line) without a GPU or without the list.
fn parity_models() -> Option<Vec<(ModelFile, String)>> {
    if let Err(why) = probe() {
        eprintln!("skipped: {why}");
        return None;
    }
    let Ok(list) = std::env::var("LEANSTREAM_HIL_MODELS") else {
        eprintln!("skipped: LEANSTREAM_HIL_MODELS names no parity models");
        return None;
    };
    let models = list
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|path| {
            let path = std::path::Path::new(path);
            let file = ModelFile::open(path).expect("model opens");
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (file, name)
        })
        .collect();
    Some(models)
}

/// For every parity model in both memory models, with every product kernel narrow and then
/// every one wide (the default mixes the two by size; the wide runs also split attention over
/// blocks: a kv head's query heads a block in discrete memory, a query head in unified), at
/// each precision against the CPU
/// backend at the same precision (the KV cache int8 on both at w8a8 and w4a8, else f32):
/// - where every kernel is float (f16; native on a float file): logits within 1e-2 (relative,
///   L2) and the same 64 greedy tokens;
/// - where both backends quantize activations to int8 (native on a quantized file, w8a8, w4a8:
///   the same requantized weights on both): within 5e-2 (their float sums in another order
///   move these models' logits by ~1e-2 on the CPU alone: docs/HIL.md); greedy agreement is
///   printed.
#[test]
fn cuda_matches_cpu_logits_and_greedy_tokens() {
    let Some(models) = parity_models() else {
        return;
    };
    for (file, name) in models {
        check_parity(
            &file,
            &name,
            &[
                Precision::F16,
                Precision::Native,
                Precision::W8a8,
                Precision::W4a8,
            ],
        );
    }
}

/// `cuda_matches_cpu_logits_and_greedy_tokens`'s checks of one model at `precisions`.
fn check_parity(file: &ModelFile, name: &str, precisions: &[Precision]) {
    let vocab = file.hyper().unwrap().vocab_size as u32;
    let prompt: Vec<u32> = (0..8u32).map(|i| (1 + i * 7919) % vocab).collect();
    let agree = |a: &[u32], b: &[u32]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let worst = |g: &[Vec<f32>], c: &[Vec<f32>]| {
        g.iter()
            .zip(c)
            .map(|(a, b)| rel_err(a, b))
            .fold(0f64, f64::max)
    };
    for &precision in precisions {
        let (cpu, cpu_tokens) = run_cpu(file, precision, &prompt);
        for memory in [MemoryModel::Discrete, MemoryModel::Unified] {
            for products in [ProductKernels::Narrow, ProductKernels::Wide] {
                let what = format!("{name} {memory:?} {products:?} {precision}");
                let (g, t, int8, kv) = match run_gpu(file, memory, products, precision, &prompt) {
                    Ok(r) => r,
                    // A model the GPU cannot run at a low-bit precision says why at boot.
                    Err(EngineError::Unsupported(why)) if precision.int8_kv() => {
                        eprintln!("skipped: parity {what}: {why}");
                        continue;
                    }
                    Err(e) => panic!("{what}: boot failed: {e}"),
                };
                // The int8 cache wherever w8a8/w4a8 and the head allow one, else f16.
                let head_dim = file.hyper().unwrap().head_dim;
                let int8_kv = precision.int8_kv()
                    && head_dim.is_multiple_of(32)
                    && head_dim <= leanstream::engine::cuda_options::INT8_KV_MAX_HEAD_DIM;
                assert_eq!(
                    kv,
                    if int8_kv {
                        KvPrecision::I8
                    } else {
                        KvPrecision::F16
                    },
                    "{what}: KV cache precision"
                );
                let e = worst(&g, &cpu);
                let tol = if int8 { 5e-2 } else { 1e-2 };
                eprintln!(
                    "parity {what}{} ({} KV): max logits rel err {e:.2e} over {} positions, greedy tokens identical {}/64",
                    if int8 { " (int8 activations)" } else { "" },
                    kv.name(),
                    prompt.len(),
                    agree(&t, &cpu_tokens)
                );
                assert!(e < tol, "{what}: logits rel err {e:.3e} > {tol}");
                if !int8 {
                    assert_eq!(t, cpu_tokens, "{what}: greedy tokens differ");
                }
            }
        }
    }
}

/// The K-quants (Q4_K, Q5_K, Q6_K) and Q5_1 on the GPU at `native`: kept in their stored
/// blocks (the boot report says "kept" for each type and converts nothing; a token reads the
/// stored bytes), multiplied by their own kernels on the int8 input, and equal to the CPU's
/// integer kernels within the parity gate, narrow and wide, in both memory models. The GPU
/// quantizes their input with a scale per 32 values, the CPU with one per 256 (its K-quant
/// form, `KernelSet::superblock_scales`): 2.4e-2 apart on this random model (round 26), where
/// the CPU's two forms are 2.4e-2 apart by the same figure (lowbit.rs); 8.6e-4 when the CPU also took 32.
#[test]
fn cuda_runs_k_quants_in_their_stored_blocks_as_the_cpu() {
    if let Err(why) = probe() {
        eprintln!("skipped: {why}");
        return;
    }
    let file = kquant_model();
    let mut arenas = Arenas::from_board().unwrap();
    let opts = CudaOptions {
        context: 256,
        ..CudaOptions::default()
    };
    let gpu = CudaEngine::boot(&mut arenas, &file, opts).expect("boots");
    let report = gpu.conversions.to_string();
    eprintln!("k-quants: boot report: {report}");
    for ty in ["Q4_K", "Q5_K", "Q6_K", "Q5_1"] {
        assert!(report.contains(&format!("{ty} -> {ty} kept")), "{report}");
    }
    assert!(!report.contains("converted"), "{report}");
    // A token reads every layer matrix and the output head once, at their stored size.
    let h = file.hyper().unwrap();
    let mut stored = file.tensor("output.weight").unwrap().data.len();
    for l in 0..h.n_layers {
        for n in [
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ] {
            stored += file
                .tensor(&format!("blk.{l}.{n}.weight"))
                .unwrap()
                .data
                .len();
        }
    }
    assert_eq!(gpu.weight_bytes_per_token, stored);
    assert!(gpu.int8_activations);
    drop(gpu);
    check_parity(&file, "k-quant model (synthetic)", &[Precision::Native]);
}

// ---- The persistent streaming-FFN kernel (backend/cuda/stream_ffn.rs) ----

#[path = "cuda/prefill.rs"]
mod prefill;

#[path = "cuda/long_attention.rs"]
mod long_attention;

#[path = "cuda/stream_layer.rs"]
mod stream_layer;

#[path = "cuda/stream_engine.rs"]
mod stream_engine;

#[path = "cuda/timeline.rs"]
mod timeline;

#[path = "common/tables.rs"]
mod tables;

#[path = "common/kquant_model.rs"]
mod kquant_model;
use kquant_model::kquant_model;

use leanstream::backend::cuda::driver::DeviceBuffer;
use leanstream::backend::cuda::stream_ffn::{reference, FfnShape, StreamFfn, StreamFfnError};
use leanstream::model::ggml::f32_to_f16;

/// xorshift64*: the tests' random numbers, reproducible from a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, (self.next() % (i as u64 + 1)) as usize);
        }
    }
}

/// `shape.blocks` random bundles (f16, scaled like a trained layer's rows) and an input.
fn random_ffn(shape: FfnShape, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let mut rng = Rng(seed);
    let scale = 1.0 / (shape.dim as f32).sqrt();
    let bundles: Vec<u8> = (0..shape.blocks * shape.bundle_halves())
        .flat_map(|_| f32_to_f16(rng.unit() * scale * 2.0).to_le_bytes())
        .collect();
    let x = (0..shape.dim).map(|_| rng.unit()).collect();
    (bundles, x)
}

/// The largest |gpu - cpu| over the largest |cpu|: the parity figure.
fn max_rel(gpu: &[f32], cpu: &[f32]) -> f32 {
    let scale = cpu.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    gpu.iter()
        .zip(cpu)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        / scale
}

/// The kernel starts before any bundle is in; the host delivers them in a random order with
/// random delays (as I/O lanes land them); the sum equals the CPU's over the same set, for
/// several orders, both memory models, and every stage's completion flag is published.
#[test]
fn stream_ffn_matches_cpu_for_any_arrival_order() {
    let Some(gpu) = gpu_or_skip() else { return };
    let shape = FfnShape {
        dim: 256,
        per_block: 16,
        blocks: 24,
    };
    let (bundles, x) = random_ffn(shape, 7);
    let thr = 0.02;
    let all: Vec<usize> = (0..shape.blocks).collect();
    let cpu = reference(shape, &bundles, &all, &x, thr);
    // Stages of 8, 8 and 8 bundles in priority order.
    let stages = [8, 8, 8];
    let len = shape.bundle_bytes();
    for model in [MemoryModel::Unified, MemoryModel::Discrete] {
        let mut ffn = StreamFfn::new(&gpu, shape, model, &stages).unwrap();
        for seed in 1..=4u64 {
            let mut rng = Rng(seed * 977);
            let mut order = all.clone();
            rng.shuffle(&mut order);
            ffn.start(&gpu, &x, thr, 2_000_000_000).unwrap();
            for &b in &order {
                std::thread::sleep(Duration::from_micros(rng.next() % 2000));
                ffn.deliver(&gpu, b, &bundles[b * len..][..len]).unwrap();
            }
            let mut out = vec![0f32; shape.dim];
            ffn.finish(&gpu, &mut out).unwrap();
            let err = max_rel(&out, &cpu);
            eprintln!(
                "stream_ffn {model:?} order {:?}..: max |gpu-cpu|/max|cpu| = {err:.2e}",
                &order[..6]
            );
            assert!(err < 1e-4, "{model:?} seed {seed}: off by {err}");
            for s in 0..stages.len() {
                assert_eq!(ffn.stages.get(s), ffn.generation(), "stage {s} published");
            }
        }
    }
}

/// A bundle whose flag is never set: the launch ends, within a bounded time, with an error
/// naming that bundle (and nothing hangs), in both memory models.
#[test]
fn stream_ffn_names_a_bundle_that_never_arrives() {
    let Some(gpu) = gpu_or_skip() else { return };
    let shape = FfnShape {
        dim: 128,
        per_block: 8,
        blocks: 12,
    };
    let (bundles, x) = random_ffn(shape, 11);
    let len = shape.bundle_bytes();
    for model in [MemoryModel::Unified, MemoryModel::Discrete] {
        let mut ffn = StreamFfn::new(&gpu, shape, model, &[6, 6]).unwrap();
        let t = Instant::now();
        ffn.start(&gpu, &x, 0.0, 50_000_000).unwrap();
        for b in (0..shape.blocks).filter(|&b| b != 5) {
            ffn.deliver(&gpu, b, &bundles[b * len..][..len]).unwrap();
        }
        let mut out = vec![0f32; shape.dim];
        let e = ffn.finish(&gpu, &mut out);
        let took = t.elapsed();
        eprintln!("stream_ffn {model:?}: {e:?} after {took:?}");
        assert!(
            matches!(e, Err(StreamFfnError::Missing { block: 5 })),
            "{model:?}: {e:?}"
        );
        assert!(took < Duration::from_secs(5), "gave up only after {took:?}");
        assert_eq!(
            ffn.stages.get(0),
            0,
            "stage 0 (holding bundle 5) not published"
        );
        assert_eq!(ffn.stages.get(1), ffn.generation(), "stage 1 published");
    }
}

/// Table 3 (paper 4.3.1): one FFN layer of the 1.5B shape (dim 1536, hidden 8960, f16, every
/// bundle resident) split into 1..16 segments, ordered by kernel boundaries, by a grid-wide
/// barrier in one cooperative launch, and by per-segment flags in the persistent kernel:
/// microseconds per layer (median of 200). Prints a Markdown table; checks that the three
/// give the same sum.
#[test]
fn stream_ffn_sync_overhead_table() {
    let Some(gpu) = gpu_or_skip() else { return };
    let (dim, hidden, per_block) = (1536, 8960, 8);
    let shape = FfnShape {
        dim,
        per_block,
        blocks: hidden / per_block,
    };
    let (bundles, x) = random_ffn(shape, 3);
    let mut ffn = StreamFfn::new(&gpu, shape, MemoryModel::Discrete, &[shape.blocks]).unwrap();
    let len = shape.bundle_bytes();
    for b in 0..shape.blocks {
        ffn.put(&gpu, b, &bundles[b * len..][..len]).unwrap();
    }
    ffn.set_input(&gpu, &x).unwrap();
    let seg_buf = gpu.alloc(4 * 17).unwrap();
    let bar: DeviceBuffer = gpu.alloc(8).unwrap();
    let read_acc = |ffn: &StreamFfn| {
        let mut bytes = vec![0u8; 4 * dim];
        gpu.download_async(&mut bytes, ffn.acc.ptr).unwrap();
        gpu.sync().unwrap();
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect::<Vec<f32>>()
    };
    let median_us = |f: &mut dyn FnMut()| {
        for _ in 0..20 {
            f();
        }
        gpu.sync().unwrap();
        let mut t: Vec<f32> = (0..200)
            .map(|_| {
                gpu.time_ms(|| {
                    f();
                    Ok(())
                })
                .unwrap()
                    * 1000.0
            })
            .collect();
        t.sort_by(f32::total_cmp);
        t[100]
    };
    println!(
        "\n| segments | kernel boundaries (us) | cooperative grid sync (us) | flags (us) |\n|---:|---:|---:|---:|"
    );
    for segments in [1usize, 2, 4, 8, 16] {
        let seg: Vec<u32> = (0..=segments)
            .map(|s| (s * shape.blocks / segments) as u32)
            .collect();
        let seg_bytes: Vec<u8> = seg.iter().flat_map(|w| w.to_le_bytes()).collect();
        gpu.upload(seg_buf.ptr, &seg_bytes).unwrap();
        let kb = median_us(&mut || ffn.launch_segments(&gpu, &seg, 0.0).unwrap());
        let kb_out = read_acc(&ffn);
        let coop = median_us(&mut || {
            ffn.launch_coop(&gpu, &seg_buf, segments, &bar, 0.0)
                .unwrap()
        });
        let coop_out = read_acc(&ffn);
        ffn.prepare_flagged_segments(&gpu, &seg).unwrap();
        let flags = median_us(&mut || ffn.launch_persistent(&gpu, 0.0, 1_000_000_000).unwrap());
        assert_eq!(ffn.error_code(), 0);
        let flag_out = read_acc(&ffn);
        assert!(max_rel(&coop_out, &kb_out) < 1e-4 && max_rel(&flag_out, &kb_out) < 1e-4);
        println!("| {segments} | {kb:.1} | {coop:.1} | {flags:.1} |");
    }
    println!(
        "({}; {} bundles of {per_block} neurons, persistent grid {})",
        gpu.name, shape.blocks, ffn.grid
    );
}
