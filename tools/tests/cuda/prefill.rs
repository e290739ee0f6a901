//! Batched prefill on the GPU (engine/cuda_prefill.rs) against the same engine prompting token
//! by token, on the parity models.

use super::parity_models;
use leanstream::board::MemoryModel;
use leanstream::engine::cuda::CudaEngine;
use leanstream::engine::cuda_options::{CudaOptions, PrefillProducts};
use leanstream::engine::sample::argmax;
use leanstream::engine::{Arenas, Decoder, EngineError};
use leanstream::model::ModelFile;
use leanstream::quant::Precision;
use leanstream_tools::bench::rel_err;

/// `prefill_run`'s logits after the prompt, greedy tokens, logits after the second turn, and
/// whether any product quantized its input to int8, and the kernels the batch ran.
type PrefillRun = (Vec<f32>, Vec<u32>, Vec<f32>, bool, String);

/// The logits after `prompt` from position 0, the 32 greedy picks after them, and the logits
/// after `more` fed next (a second turn: a prefill that starts past position 0), on a GPU
/// engine whose prompts go `batch` tokens a chunk (1: token by token).
/// `kernels`: the products and whether attention may run on tensor cores. `fed`: the tokens
/// fed after the prompt (the reference's picks, so that both runs' second turns attend over
/// the same history); None: the engine's own picks.
#[allow(clippy::too_many_arguments)]
fn prefill_run(
    file: &ModelFile,
    memory: MemoryModel,
    precision: Precision,
    batch: usize,
    kernels: (PrefillProducts, bool),
    prompt: &[u32],
    more: &[u32],
    fed: Option<&[u32]>,
) -> Result<PrefillRun, EngineError> {
    let mut arenas = Arenas::from_board().unwrap();
    let opts = CudaOptions {
        memory,
        context: 256,
        precision,
        prefill_batch: batch,
        prefill_products: kernels.0,
        prefill_tensor_attention: kernels.1,
        ..CudaOptions::default()
    };
    let mut gpu = CudaEngine::boot(&mut arenas, file, opts)?;
    let used = gpu
        .prefill_kernels()
        .unwrap_or_else(|| "token by token".into());
    // The HIL script installs cuBLAS and says so: a silent fall-back to PTX is a failure there.
    if std::env::var_os("LEANSTREAM_EXPECT_CUBLAS").is_some()
        && batch > 1
        && kernels.0 == PrefillProducts::Blas
    {
        assert!(used.starts_with("cuBLAS"), "cuBLAS was expected: {used}");
    }
    let first = gpu.prefill(prompt, 0).to_vec();
    let mut tokens = Vec::new();
    let mut tok = argmax(&first);
    for i in 0..32 {
        tokens.push(tok);
        let next = fed.map_or(tok, |f| f[i]);
        tok = gpu.forward_greedy(next, prompt.len() + i);
    }
    let second = gpu.prefill(more, prompt.len() + 32).to_vec();
    Ok((first, tokens, second, gpu.int8_activations, used))
}

/// Batched prefill (engine/cuda_prefill.rs) against the same GPU engine prompting token by
/// token, for every parity model in both memory models: prompts of 37 tokens (chunks of 16:
/// 16 + 16 + 4 batched, the last token a decode step) and, after 32 greedy tokens, 21 more
/// from position 69 (attention over a cache the batch did not write); and once with the
/// board's chunk, the whole prompt in one. The batched runs are fed the token-by-token run's
/// 32 picks, so both second turns follow the same history (where int8 activations flip a
/// near-tie, a run's own picks would compare two different conversations); each pick is
/// compared. The batch's products take f16 inputs where decode
/// takes f32 or int8 (kernels-ptx/prefill.cu), so:
/// - at f16 (every kernel float): logits within 1e-2 (relative, L2) and the same 32 greedy
///   picks (so the same greedy text), the "greedy text equal";
/// - where decode quantizes activations to int8 (native on a quantized file, w8a8 with the
///   int8 KV cache): within 5e-2, as the CPU parity gate; greedy agreement printed.
#[test]
fn batched_prefill_matches_token_by_token_prompting() {
    let Some(models) = parity_models() else {
        return;
    };
    for (file, name) in models {
        let vocab = file.hyper().unwrap().vocab_size as u32;
        let prompt: Vec<u32> = (0..37u32).map(|i| (3 + i * 7919) % vocab).collect();
        let more: Vec<u32> = (0..21u32).map(|i| (5 + i * 104729) % vocab).collect();
        for precision in [Precision::F16, Precision::Native, Precision::W8a8] {
            for memory in [MemoryModel::Discrete, MemoryModel::Unified] {
                let what = format!("{name} {memory:?} {precision}");
                let run = |batch, kernels, fed| {
                    prefill_run(
                        &file, memory, precision, batch, kernels, &prompt, &more, fed,
                    )
                };
                let (p1, t1, q1, int8, _) = match run(1, (PrefillProducts::Blas, true), None) {
                    Ok(r) => r,
                    // A model the GPU cannot run at a low-bit precision says why at boot.
                    Err(EngineError::Unsupported(why)) if precision.int8_kv() => {
                        eprintln!("skipped: prefill {what}: {why}");
                        continue;
                    }
                    Err(e) => panic!("{what}: boot failed: {e}"),
                };
                // The default kernels at both chunk sizes, and the PTX products with the
                // scalar attention (what a GPU without cuBLAS or sm_80 runs).
                for (batch, kernels) in [
                    (16, (PrefillProducts::Blas, true)),
                    (
                        leanstream::board::GPU_PREFILL_BATCH,
                        (PrefillProducts::Blas, true),
                    ),
                    (16, (PrefillProducts::Ptx, false)),
                ] {
                    let (p, t, q, _, used) =
                        run(batch, kernels, Some(&t1)).expect("boots as the token-by-token engine");
                    let (e1, e2) = (rel_err(&p, &p1), rel_err(&q, &q1));
                    let agree = t.iter().zip(&t1).filter(|(a, b)| a == b).count();
                    eprintln!(
                        "prefill {what} chunk {batch} ({used}){}: logits rel err {e1:.2e} after the prompt, {e2:.2e} after the second turn; greedy picks identical {agree}/32",
                        if int8 { " (int8 activations)" } else { "" },
                    );
                    let tol = if int8 { 5e-2 } else { 1e-2 };
                    assert!(
                        e1 < tol && e2 < tol,
                        "{what} chunk {batch}: {e1:.3e} / {e2:.3e}"
                    );
                    if !int8 {
                        assert_eq!(t, t1, "{what} chunk {batch}: greedy picks differ");
                    }
                }
            }
        }
    }
}
