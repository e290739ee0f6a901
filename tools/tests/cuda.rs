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
use leanstream::engine::cuda_options::{CudaOptions, DependentLaunch, InBlockNorm, ProductKernels};
use leanstream::engine::sample::argmax;
use leanstream::engine::{Arenas, Decoder, Engine, EngineError, EngineOptions};
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
        // Its KV cache as the GPU keeps it: int8 at w8a8 and w4a8 where the head allows.
        f32_kv: !leanstream::engine::cuda_options::int8_kv(
            precision,
            false,
            file.hyper().unwrap().head_dim,
        ),
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
/// input to int8, and whether the KV cache was int8.
type GpuRun = (Vec<Vec<f32>>, Vec<u32>, bool, bool);

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
        // compared below already join several slices a head).
        attention_slice: if products == ProductKernels::Wide {
            2
        } else {
            0
        },
        // And dependent launch (an sm_90 GPU; others run it off): on (the default) in the
        // wide runs, with the weight prefetch in the narrow discrete ones, off in the narrow
        // unified ones.
        dependent_launch: match (products, memory) {
            (ProductKernels::Wide, _) => DependentLaunch::On,
            (_, MemoryModel::Unified) => DependentLaunch::Off,
            _ => DependentLaunch::Prefetch,
        },
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
    Ok((logits, tokens, gpu.int8_activations, gpu.int8_kv))
}

/// For every parity model in both memory models, with every product kernel narrow and then
/// every one wide (the default mixes the two by size; the wide runs also split each head's
/// attention over blocks), at each precision against the CPU
/// backend at the same precision (the KV cache int8 on both at w8a8 and w4a8, else f32):
/// - where every kernel is float (f16; native on a float file): logits within 1e-2 (relative,
///   L2) and the same 64 greedy tokens;
/// - where both backends quantize activations to int8 (native on a quantized file, w8a8, w4a8:
///   the same requantized weights on both): within 5e-2 (their float sums in another order
///   move these models' logits by ~1e-2 on the CPU alone: docs/HIL.md); greedy agreement is
///   printed.
#[test]
fn cuda_matches_cpu_logits_and_greedy_tokens() {
    if let Err(why) = probe() {
        eprintln!("skipped: {why}");
        return;
    }
    let Ok(list) = std::env::var("LEANSTREAM_HIL_MODELS") else {
        eprintln!("skipped: LEANSTREAM_HIL_MODELS names no parity models");
        return;
    };
    for path in list.split(',').filter(|p| !p.is_empty()) {
        let file = ModelFile::open(std::path::Path::new(path)).expect("model opens");
        let name = std::path::Path::new(path)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let vocab = file.hyper().unwrap().vocab_size as u32;
        let prompt: Vec<u32> = (0..8u32).map(|i| (1 + i * 7919) % vocab).collect();
        let agree = |a: &[u32], b: &[u32]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
        let worst = |g: &[Vec<f32>], c: &[Vec<f32>]| {
            g.iter()
                .zip(c)
                .map(|(a, b)| rel_err(a, b))
                .fold(0f64, f64::max)
        };
        for precision in [
            Precision::F16,
            Precision::Native,
            Precision::W8a8,
            Precision::W4a8,
        ] {
            let (cpu, cpu_tokens) = run_cpu(&file, precision, &prompt);
            for memory in [MemoryModel::Discrete, MemoryModel::Unified] {
                for products in [ProductKernels::Narrow, ProductKernels::Wide] {
                    let what = format!("{name} {memory:?} {products:?} {precision}");
                    let (g, t, int8, int8_kv) =
                        match run_gpu(&file, memory, products, precision, &prompt) {
                            Ok(r) => r,
                            // A model the GPU cannot run at a low-bit precision says why at boot.
                            Err(EngineError::Unsupported(why)) if precision.int8_kv() => {
                                eprintln!("skipped: parity {what}: {why}");
                                continue;
                            }
                            Err(e) => panic!("{what}: boot failed: {e}"),
                        };
                    // The int8 cache wherever w8a8/w4a8 and the head allow one.
                    let head_dim = file.hyper().unwrap().head_dim;
                    assert_eq!(
                        int8_kv,
                        precision.int8_kv()
                            && head_dim.is_multiple_of(32)
                            && head_dim <= leanstream::engine::cuda_options::INT8_KV_MAX_HEAD_DIM,
                        "{what}: KV cache precision"
                    );
                    let e = worst(&g, &cpu);
                    let tol = if int8 { 5e-2 } else { 1e-2 };
                    eprintln!(
                        "parity {what}{}{}: max logits rel err {e:.2e} over {} positions, greedy tokens identical {}/64",
                        if int8 { " (int8 activations)" } else { "" },
                        if int8_kv { " (int8 KV)" } else { "" },
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
}
