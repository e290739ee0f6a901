//! Fixed memory on the GPU: after boot, a batched prompt and the decode steps after it take
//! nothing from the host heap (a counting global allocator watches every thread) and no device
//! memory (the driver's free bytes before and after). Run on the GPU machine by scripts/hil.sh
//! over the models in $LEANSTREAM_HIL_MODELS; elsewhere it prints `skipped:`.
//!
//! Without the libtest harness (`harness = false`): the harness's own threads allocate.
//!
//! What it cannot see: cuBLAS's own host allocations (C's malloc, not Rust's allocator). The
//! device side covers cuBLAS: its workspace is ours, carved at boot, and a product that took
//! more device memory would show in the free bytes.

#[global_allocator]
static ALLOC: leanstream::serve::alloc_count::CountingAllocator =
    leanstream::serve::alloc_count::CountingAllocator;

#[cfg(feature = "cuda")]
fn check_gpu() -> usize {
    use leanstream::backend::cuda::probe;
    use leanstream::engine::cuda::CudaEngine;
    use leanstream::engine::cuda_options::CudaOptions;
    use leanstream::engine::sample::argmax;
    use leanstream::engine::{Arenas, Decoder};
    use leanstream::model::ModelFile;
    use leanstream::quant::Precision;
    use leanstream::serve::alloc_count;

    if let Err(why) = probe() {
        println!("skipped: {why}");
        return 0;
    }
    let Ok(list) = std::env::var("LEANSTREAM_HIL_MODELS") else {
        println!("skipped: LEANSTREAM_HIL_MODELS names no models");
        return 0;
    };
    let ggufs: Vec<&str> = list.split(',').filter(|p| p.ends_with(".gguf")).collect();
    if ggufs.is_empty() {
        // It checks GGUF models only: say so rather than pass having checked none.
        println!("skipped: no GGUF among LEANSTREAM_HIL_MODELS ({list})");
        return 0;
    }
    let mut checked = 0;
    for path in ggufs {
        let file = ModelFile::open(std::path::Path::new(path)).expect("model opens");
        let vocab = file.hyper().unwrap().vocab_size as u32;
        // Two prompts of one length (what a daemon serving one client's turns sees), longer
        // than a chunk of 64 so that a prompt runs as several.
        let prompt =
            |seed: u32| -> Vec<u32> { (0..150u32).map(|i| (seed + i * 7919) % vocab).collect() };
        let (first, second) = (prompt(3), prompt(11));
        for precision in [Precision::F16, Precision::Native] {
            let mut arenas = Arenas::from_board().unwrap();
            let opts = CudaOptions {
                context: 512,
                precision,
                prefill_batch: 64,
                ..CudaOptions::default()
            };
            let mut gpu = CudaEngine::boot(&mut arenas, &file, opts).expect("boots");
            let kernels = gpu.prefill_kernels().expect("a batched prefill");
            let run = |gpu: &mut CudaEngine, p: &[u32]| {
                let mut tok = argmax(gpu.prefill(p, 0));
                for i in 0..32 {
                    tok = gpu.forward_greedy(tok, p.len() + i);
                }
                tok
            };
            // The first prompt once: whatever the driver loads on a kernel's first launch
            // (cuBLAS's kernels load lazily) is loaded here.
            run(&mut gpu, &first);
            let (free_before, _) = gpu.gpu.memory().unwrap();
            alloc_count::reset();
            alloc_count::arm();
            let tok = run(&mut gpu, &second);
            alloc_count::disarm();
            let allocs = alloc_count::count();
            let (free_after, _) = gpu.gpu.memory().unwrap();
            println!(
                "{path} {precision} ({kernels}): {allocs} heap allocations, device free {free_before} -> {free_after} bytes over a 150-token prompt and 32 steps (last token {tok})"
            );
            assert_eq!(allocs, 0, "{path} {precision}: heap allocations");
            assert_eq!(
                free_before, free_after,
                "{path} {precision}: device memory taken after boot"
            );
            checked += 1;
        }
    }
    checked
}

#[cfg(not(feature = "cuda"))]
fn check_gpu() -> usize {
    println!("skipped: built without the cuda feature");
    0
}

fn main() {
    let checked = check_gpu();
    println!("cuda_no_alloc: {checked} configurations checked");
}
