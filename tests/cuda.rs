//! Hardware-in-the-loop tests of the CUDA backend, run on the GPU machine by scripts/hil.sh.
//! Where there is no GPU (CI, the developer machine) each prints a `skipped:` line; the
//! no-GPU refusal itself is tested in tests/cli_errors.rs.
//!
//! Parity models: every file named in $LEANSTREAM_HIL_MODELS (comma-separated paths; a
//! llama2.c checkpoint needs no tokenizer here), in both memory models.

use leanstream::backend::cuda::driver::{Gpu, KernelArgs};
use leanstream::backend::cuda::engine::ptx_for;
use leanstream::backend::cuda::flags::Flags;
use leanstream::backend::cuda::{probe, CudaEngine, CudaOptions};
use leanstream::board::MemoryModel;
use leanstream::engine::sample::argmax;
use leanstream::engine::{Arenas, Decoder, Engine, EngineOptions};
use leanstream::model::ModelFile;
use std::time::{Duration, Instant};

fn gpu_or_skip() -> Option<Gpu> {
    if let Err(why) = probe() {
        eprintln!("skipped: {why}");
        return None;
    }
    Some(Gpu::open(0).expect("GPU opens"))
}

/// A kernel waits on flags the host sets later; it answers each, and the host sees every
/// answer. Prints the round-trip latency (host set -> kernel reply seen by the host).
#[test]
fn kernel_waits_for_host_flags_and_answers() {
    let Some(gpu) = gpu_or_skip() else { return };
    let m = gpu
        .load_module(ptx_for("flags", gpu.compute_capability).unwrap())
        .unwrap();
    let echo = m.function("flag_echo").unwrap();
    let n = 64;
    let host = Flags::new(&gpu, n).unwrap();
    let reply = Flags::new(&gpu, n).unwrap();
    let error = Flags::new(&gpu, 1).unwrap();
    gpu.launch(
        echo,
        1,
        n as u32,
        KernelArgs::default()
            .ptr(host.device_ptr())
            .ptr(reply.device_ptr())
            .i32(n as i32)
            .i32(1)
            .u64(5_000_000_000)
            .ptr(error.device_ptr()),
    )
    .unwrap();
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
    let m = gpu
        .load_module(ptx_for("flags", gpu.compute_capability).unwrap())
        .unwrap();
    let echo = m.function("flag_echo").unwrap();
    let n = 32;
    let host = Flags::new(&gpu, n).unwrap();
    let reply = Flags::new(&gpu, n).unwrap();
    let error = Flags::new(&gpu, 1).unwrap();
    host.set(3, 1); // one flag is set: only that one is answered
    let t = Instant::now();
    gpu.launch(
        echo,
        1,
        n as u32,
        KernelArgs::default()
            .ptr(host.device_ptr())
            .ptr(reply.device_ptr())
            .i32(n as i32)
            .i32(1)
            .u64(20_000_000) // 20 ms
            .ptr(error.device_ptr()),
    )
    .unwrap();
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

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let (mut d, mut n) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        d += ((x - y) as f64).powi(2);
        n += (*y as f64).powi(2);
    }
    (d / n.max(1e-30)).sqrt()
}

/// CUDA logits within 1e-2 (relative, L2) of the CPU backend's over a prompt, and the same
/// greedy tokens for 64 steps, for every parity model in both memory models.
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
        let mut cpu_arenas = Arenas::from_board().unwrap();
        let cpu_opts = EngineOptions {
            context: 256,
            ..EngineOptions::default()
        };
        let mut cpu = Engine::boot(&mut cpu_arenas, &file, cpu_opts).unwrap();
        let vocab = cpu.hyper.vocab_size;
        let prompt: Vec<u32> = (0..8)
            .map(|i| (1 + i * 7919) as u32 % vocab as u32)
            .collect();
        let mut cpu_logits = Vec::new();
        for (pos, &t) in prompt.iter().enumerate() {
            cpu_logits.push(cpu.forward(t, pos).to_vec());
        }
        let mut cpu_tokens = Vec::new();
        let mut tok = argmax(cpu_logits.last().unwrap());
        for i in 0..64 {
            cpu_tokens.push(tok);
            tok = argmax(cpu.forward(tok, prompt.len() + i));
        }
        for memory in [MemoryModel::Discrete, MemoryModel::Unified] {
            let mut arenas = Arenas::from_board().unwrap();
            let opts = CudaOptions {
                memory,
                context: 256,
                ..CudaOptions::default()
            };
            let mut gpu = CudaEngine::boot(&mut arenas, &file, opts).unwrap();
            let mut worst = 0f64;
            for (pos, &t) in prompt.iter().enumerate() {
                let e = rel_err(gpu.forward(t, pos), &cpu_logits[pos]);
                worst = worst.max(e);
            }
            let mut gpu_tokens = Vec::new();
            let mut tok = argmax(gpu.forward(prompt[7], 7));
            for i in 0..64 {
                gpu_tokens.push(tok);
                tok = gpu.forward_greedy(tok, prompt.len() + i);
            }
            let same = cpu_tokens
                .iter()
                .zip(&gpu_tokens)
                .take_while(|(a, b)| a == b)
                .count();
            eprintln!(
                "parity {name} {memory:?}: max logits rel err {worst:.2e} over {} positions, greedy tokens identical {same}/64",
                prompt.len()
            );
            assert!(
                worst < 1e-2,
                "{name} {memory:?}: logits rel err {worst:.3e}"
            );
            assert_eq!(
                gpu_tokens, cpu_tokens,
                "{name} {memory:?}: greedy tokens differ from step {same}"
            );
        }
    }
}
