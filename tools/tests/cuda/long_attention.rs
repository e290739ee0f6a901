//! Decode's attention at long context on the GPU: split and grouped against one block a head.

use super::parity_models;
use leanstream::engine::cuda::CudaEngine;
use leanstream::engine::cuda_options::{CudaOptions, GroupedAttention};
use leanstream::engine::{Arenas, Decoder, EngineError};
use leanstream::kv::KvChoice;
use leanstream::model::ModelFile;
use leanstream::quant::Precision;
use leanstream_tools::bench::rel_err;

/// A long context's attention four ways, on the parity models and the files named in
/// $LEANSTREAM_HIL_LONG_MODELS (the benchmarks' shapes written on the GPU machine: heads of
/// 128): one block a query head over all positions (no split: the reference); split into
/// slices per query head, joined through L2 by the last block, or (sm_90) as a thread block
/// cluster joined in shared memory (also with a short split, so that the cluster kernel's own
/// split through L2 takes over within the run); and split per kv head for all its query heads
/// (grouped, forced from the first split: by default it starts where a layer's cache outgrows
/// half the L2), also in the cluster kernel once its clusters give way (sm_90). The logits
/// before the split starts (position 200), where it starts (256) and after several slices (to
/// 699, or the model's context) agree within 1e-3 where every kernel is float (f16), else 5e-2
/// (int8 activations: another float order can move a value over an int8 rounding step), with
/// the f16 cache (f16), the f32 one (f16, asked for) and the int8 one (w8a8, where the head
/// allows). The reference and each mode run in blocks of the threads the engine picks (512
/// for these models but the 1.5B shape's grouped int8 cache), and two modes in blocks of
/// 1,024 (`attention-threads=1024`).
const AUTO: usize = 0;

#[test]
fn split_and_grouped_attention_match_one_block_a_head_at_long_context() {
    let Some(mut models) = parity_models() else {
        return;
    };
    for path in std::env::var("LEANSTREAM_HIL_LONG_MODELS")
        .unwrap_or_default()
        .split(',')
        .filter(|p| !p.is_empty())
    {
        let file = ModelFile::open(std::path::Path::new(path)).expect("model opens");
        models.push((file, path.rsplit('/').next().unwrap_or(path).to_string()));
    }
    const N: usize = 700;
    let checked = [200usize, 256, 300, 511, 699];
    for (file, name) in &models {
        let h = file.hyper().unwrap();
        // stories260K was trained to 512 positions: its context ends there.
        let n = if h.ctx_train > 0 {
            N.min(h.ctx_train)
        } else {
            N
        };
        let checked: Vec<usize> = checked.into_iter().filter(|&p| p < n).collect();
        let tokens: Vec<u32> = (0..n as u32)
            .map(|i| (11 + i * 7919) % h.vocab_size as u32)
            .collect();
        for (precision, kv) in [
            (Precision::F16, KvChoice::Auto),
            (Precision::F16, KvChoice::F32),
            (Precision::W8a8, KvChoice::Auto),
        ] {
            let run = |attention_slice: usize,
                       grouped_attention: GroupedAttention,
                       cluster_attention: bool,
                       attention_threads: usize| {
                let mut arenas = Arenas::from_board().unwrap();
                let opts = CudaOptions {
                    context: n,
                    precision,
                    kv,
                    attention_slice,
                    grouped_attention,
                    cluster_attention,
                    attention_threads,
                    ..CudaOptions::default()
                };
                let mut gpu = CudaEngine::boot(&mut arenas, file, opts)?;
                let mut logits = Vec::new();
                for (pos, &t) in tokens.iter().enumerate() {
                    if checked.contains(&pos) {
                        logits.push(gpu.forward(t, pos).to_vec());
                    } else {
                        gpu.feed(t, pos);
                    }
                }
                let sm90 = gpu.gpu.compute_capability.0 >= 9;
                Ok::<_, EngineError>((logits, gpu.int8_activations, gpu.attention_split(), sm90))
            };
            let what = format!("{name} {precision} {kv:?} KV");
            let (reference, int8, _, _) = match run(0, GroupedAttention::Never, false, AUTO) {
                Ok(r) => r,
                Err(EngineError::Unsupported(why)) if precision.int8_kv() => {
                    eprintln!("skipped: long attention {what}: {why}");
                    continue;
                }
                Err(e) => panic!("{what}: boot failed: {e}"),
            };
            let tol = if int8 { 5e-2 } else { 1e-3 };
            // Blocks too small for a head (under 2 x head_dim threads: a thread for every two
            // items of its rotation) are refused at boot, in a sentence.
            if 2 * h.head_dim > 32 {
                match run(0, GroupedAttention::Never, false, 2 * h.head_dim - 32) {
                    Err(EngineError::Unsupported(why)) => assert!(
                        why.contains("decode attention in blocks of"),
                        "{what}: {why}"
                    ),
                    Err(e) => panic!("{what}: small attention blocks: another error: {e}"),
                    Ok(_) => panic!("{what}: attention blocks too small for a head booted"),
                }
            }
            let slice = leanstream::engine::cuda_options::ATTENTION_SLICE;
            for (label, slice, grouped, cluster, threads) in [
                ("per head, joined through L2", slice, false, false, AUTO),
                ("per head, clusters", slice, false, true, AUTO),
                // Clusters from 8 positions, the split through L2 from max_slices x 32 on
                // (at most 288 for these models): both paths of the cluster kernel.
                ("clusters, then joined through L2", 32, false, true, AUTO),
                ("grouped", slice, true, false, AUTO),
                // Clusters of a query head's slices to 256 positions, then grouped blocks
                // joined through L2 in the cluster kernel (sm_90: what `Auto` runs past
                // `group_from`; elsewhere the same as "grouped").
                ("clusters, then grouped", 32, true, true, AUTO),
                // Blocks of 1,024 threads (`attention-threads=1024`), a thread an item of the
                // rotation where 512 take two.
                (
                    "clusters, then joined through L2, 1024 threads",
                    32,
                    false,
                    true,
                    1024,
                ),
                ("grouped, 1024 threads", slice, true, false, 1024),
            ] {
                let mode = if grouped {
                    GroupedAttention::Always
                } else {
                    GroupedAttention::Never
                };
                let (logits, _, split, sm90) =
                    run(slice, mode, cluster, threads).expect("boots as the reference did");
                let (slices, group_slices) = (split.max_slices, split.max_group_slices);
                if grouped && h.n_heads > h.n_kv_heads {
                    assert!(group_slices > 0, "{what}: grouped attention is off");
                }
                if cluster && sm90 {
                    assert!(split.cluster >= 2, "{what}: no clusters on sm_90");
                }
                if threads != AUTO {
                    assert_eq!(
                        split.threads, threads,
                        "{what} {label}: the option's threads"
                    );
                }
                let errs: Vec<f64> = logits
                    .iter()
                    .zip(&reference)
                    .map(|(a, b)| rel_err(a, b))
                    .collect();
                eprintln!(
                    "long attention {what}{} {label}: blocks of {} threads, up to {slices} slices a head, {group_slices} a kv head, clusters of {}; logits rel err at positions {checked:?}: {}",
                    if int8 { " (int8 activations)" } else { "" },
                    split.threads,
                    split.cluster,
                    errs.iter()
                        .map(|e| format!("{e:.2e}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                for (e, pos) in errs.iter().zip(&checked) {
                    assert!(*e < tol, "{what} {label} at {pos}: {e:.3e} > {tol}");
                }
            }
        }
    }
}
